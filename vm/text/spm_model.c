/* sentencepiece's ModelProto read strictly, its character map checked, and
 * the model written for libsentencepiece (vm/text/spm_model.h). The wire
 * format: a message is a run of fields, each a varint tag (field number << 3
 * | wire type) then a varint (0), 8 bytes (1), a varint length and that many
 * bytes (2) or 4 bytes (5). */
#include "text/spm_model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { W_VARINT = 0, W_I64 = 1, W_LEN = 2, W_SGROUP = 3, W_EGROUP = 4, W_I32 = 5 };

size_t ck_spm_utf8_check(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t min;
        if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
        else return i;
        if (n - i < (size_t)len) return i;
        uint32_t cp = c & (0x3Fu >> (len - 1));
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += (size_t)len;
    }
    return n;
}

const char *ck_spm_quote(char *out, size_t outlen, const char *s, size_t n)
{
    size_t o = 0, i = 0;
    if (!outlen) return out;
    while (i < n && i < 48) {
        const unsigned char c = (unsigned char)s[i];
        size_t k = 1;
        if (c >= 0x80) {
            /* a whole valid character, else one escaped byte */
            k = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            if (k > n - i || ck_spm_utf8_check((const uint8_t *)s + i, k) != k) k = 0;
        }
        if (c < 0x20 || c == 0x7F || c == '\\' || k == 0) {
            if (o + 5 > outlen) break;
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02X", c);
            i++;
            continue;
        }
        if (o + k + 1 > outlen) break;
        memcpy(out + o, s + i, k);
        o += k;
        i += k;
    }
    if (i < n && o + 4 <= outlen) memcpy(out + o, "...", 3), o += 3;
    out[o] = 0;
    return out;
}

/* ---- reading */

typedef struct rd {
    const uint8_t *base; /* the file, for offsets in messages */
    const uint8_t *p, *end;
    ck_spm_poll poll;
    void *poll_ud;
    long long work;
    char *err;
    size_t errlen;
    const char *msg; /* the message being read, for errors */
    size_t tag_at;   /* where the last field read starts */
} rd;

static int fail(rd *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static size_t at(const rd *r) { return (size_t)(r->p - r->base); }

static void tick(rd *r)
{
    if ((++r->work & 4095) == 0 && r->poll) r->poll(r->poll_ud, 4096);
}

static int varint(rd *r, uint64_t *v)
{
    const size_t start = at(r);
    uint64_t x = 0;
    for (int i = 0; i < 10; i++) {
        if (r->p == r->end) return fail(r, "a varint at byte %zu is cut off by the end of its %s", start, r->msg);
        const unsigned b = *r->p++;
        /* the tenth byte holds bit 63 alone, and ends the varint */
        if (i == 9 && b > 1) return fail(r, "a varint at byte %zu runs past 64 bits", start);
        x |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1; /* not reached: the tenth byte ends it or fails */
}

/* the next field's tag; 0 at the end of the message */
static int tag(rd *r, uint32_t *field, int *wire)
{
    const size_t start = at(r);
    uint64_t t;
    r->tag_at = start;
    if (varint(r, &t)) return -1;
    *wire = (int)(t & 7);
    if ((t >> 3) == 0 || (t >> 3) > 0x1FFFFFFF)
        return fail(r, "a field of %s at byte %zu has number %llu (protobuf's are 1 to 2^29-1)", r->msg, start,
                    (unsigned long long)(t >> 3));
    *field = (uint32_t)(t >> 3);
    if (*wire == W_SGROUP || *wire == W_EGROUP)
        return fail(r, "%s field %u at byte %zu is a group (wire type %d), which sentencepiece models never hold", r->msg, *field,
                    start, *wire);
    if (*wire > W_I32) return fail(r, "%s field %u at byte %zu has wire type %d (protobuf's are 0 to 5)", r->msg, *field, start, *wire);
    tick(r);
    return 0;
}

static const char *describe(const rd *r, uint32_t f, char *buf, size_t len);

/* a length-delimited field's bytes: [*s, *s + *n), within its message */
static int bytes(rd *r, const uint8_t **s, size_t *n, uint32_t field)
{
    uint64_t len = 0;
    *s = NULL;
    *n = 0;
    if (varint(r, &len)) return -1;
    if (len > (uint64_t)(r->end - r->p))
    {
        char d[96];
        return fail(r, "%s at byte %zu declares %llu bytes where %zu remain in its message", describe(r, field, d, sizeof d),
                    r->tag_at, (unsigned long long)len, (size_t)(r->end - r->p));
    }
    *s = r->p;
    *n = (size_t)len;
    r->p += len;
    return 0;
}

static int skip(rd *r, uint32_t field, int wire)
{
    uint64_t v;
    const uint8_t *s;
    size_t n;
    switch (wire) {
    case W_VARINT: return varint(r, &v);
    case W_I64:
    case W_I32: {
        const size_t k = wire == W_I64 ? 8 : 4;
        if ((size_t)(r->end - r->p) < k) {
            char d[96];
            return fail(r, "%s at byte %zu is cut off by the end of its message", describe(r, field, d, sizeof d), r->tag_at);
        }
        r->p += k;
        return 0;
    }
    default: return bytes(r, &s, &n, field);
    }
}

/* "NormalizerSpec.precompiled_charsmap (field 2)" or "TrainerSpec field 17" */
static const char *describe(const rd *r, uint32_t f, char *buf, size_t len)
{
    static const struct {
        const char *msg;
        uint32_t f;
        const char *name;
    } names[] = {
        {"ModelProto", 1, "pieces"}, {"ModelProto", 2, "trainer_spec"}, {"ModelProto", 3, "normalizer_spec"},
        {"ModelProto", 4, "self_test_data"}, {"ModelProto", 5, "denormalizer_spec"}, {"SentencePiece", 1, "piece"},
        {"SentencePiece", 2, "score"}, {"SentencePiece", 3, "type"}, {"TrainerSpec", 3, "model_type"},
        {"TrainerSpec", 35, "byte_fallback"}, {"NormalizerSpec", 1, "name"}, {"NormalizerSpec", 2, "precompiled_charsmap"},
        {"NormalizerSpec", 3, "add_dummy_prefix"}, {"NormalizerSpec", 4, "remove_extra_whitespaces"},
        {"NormalizerSpec", 5, "escape_whitespaces"}, {"NormalizerSpec", 6, "normalization_rule_tsv"},
        {"SelfTestData", 1, "samples"}, {"SelfTestData.Sample", 1, "input"}, {"SelfTestData.Sample", 2, "expected"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].f == f && !strcmp(names[i].msg, r->msg)) {
            snprintf(buf, len, "%s.%s (field %u)", r->msg, names[i].name, f);
            return buf;
        }
    snprintf(buf, len, "%s field %u", r->msg, f);
    return buf;
}

static int want(rd *r, uint32_t field, int wire, int expect)
{
    static const char *const wires[] = {"a varint", "8 bytes", "length-delimited", "a group", "a group end", "4 bytes"};
    if (wire == expect) return 0;
    char d[96];
    return fail(r, "%s at byte %zu is %s, not %s", describe(r, field, d, sizeof d), r->tag_at, wires[wire], wires[expect]);
}

/* a sub-message's reader over [s, s + n) */
static rd sub(const rd *r, const uint8_t *s, size_t n, const char *msg)
{
    rd q = *r;
    q.p = s;
    q.end = s + n;
    q.msg = msg;
    return q;
}

static void join(rd *r, const rd *q) { r->work = q->work; }

/* ModelProto.SentencePiece */
static int read_piece(rd *r, int index, ck_spm_piece *out)
{
    const uint8_t *str = NULL;
    size_t slen = 0;
    int has = 0;
    out->type = CK_SPM_NORMAL;
    out->score = 0;
    while (r->p < r->end) {
        uint32_t f;
        int w;
        if (tag(r, &f, &w)) return -1;
        if (f == 1) {
            if (want(r, f, w, W_LEN) || bytes(r, &str, &slen, f)) return -1;
            has = 1;
        } else if (f == 2) {
            if (want(r, f, w, W_I32)) return -1;
            if (r->end - r->p < 4) return fail(r, "piece %d's score at byte %zu is cut off", index, r->tag_at);
            uint32_t u = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
            memcpy(&out->score, &u, 4);
            r->p += 4;
        } else if (f == 3) {
            uint64_t v;
            if (want(r, f, w, W_VARINT) || varint(r, &v)) return -1;
            if (v < CK_SPM_NORMAL || v > CK_SPM_BYTE)
                return fail(r, "piece %d has type %llu (sentencepiece's are 1 to 6)", index, (unsigned long long)v);
            out->type = (int)v;
        } else if (skip(r, f, w)) {
            return -1;
        }
    }
    if (!has || slen == 0) return fail(r, "piece %d is empty", index);
    if (slen > CK_SPM_MAX_PIECE_BYTES) return fail(r, "piece %d is %zu bytes long (at most %d)", index, slen, CK_SPM_MAX_PIECE_BYTES);
    const size_t bad = ck_spm_utf8_check(str, slen);
    if (bad != slen) return fail(r, "piece %d is not valid UTF-8 (its byte %zu)", index, bad + 1);
    if (memchr(str, 0, slen)) return fail(r, "piece %d holds a NUL byte", index);
    if (!isfinite(out->score)) return fail(r, "piece %d has a score that is not a finite number", index);
    out->off = (uint32_t)(str - r->base);
    out->len = (uint32_t)slen;
    return 0;
}

/* The wire type of each TrainerSpec field sentencepiece 0.1.97 defines (its
 * sentencepiece_model.proto); 0 for others, which are skipped. */
static int trainer_wire(uint32_t f)
{
    switch (f) {
    case 1: case 2: case 5: case 7: case 30: case 31: case 36: case 44: case 45: case 46: case 47: case 48: return W_LEN;
    case 10: case 15: case 51: return W_I32;
    case 3: case 4: case 6: case 11: case 12: case 13: case 14: case 16: case 17: case 18: case 19: case 20: case 21:
    case 22: case 23: case 24: case 25: case 26: case 32: case 33: case 34: case 35: case 40: case 41: case 42: case 43:
    case 49: case 50: case 52: return W_VARINT;
    default: return -1;
    }
}

static int read_trainer(rd *r, ck_spm_model *m)
{
    while (r->p < r->end) {
        uint32_t f;
        int w;
        if (tag(r, &f, &w)) return -1;
        const int expect = trainer_wire(f);
        if (expect >= 0 && want(r, f, w, expect)) return -1;
        if (f == 3 || f == 35) {
            uint64_t v;
            if (varint(r, &v)) return -1;
            if (f == 3) {
                if (v < CK_SPM_UNIGRAM || v > CK_SPM_CHAR)
                    return fail(r, "trainer_spec.model_type is %llu (sentencepiece's are 1 to 4)", (unsigned long long)v);
                m->model_type = (int)v;
            } else {
                m->byte_fallback = v != 0;
            }
        } else if (skip(r, f, w)) {
            return -1;
        }
    }
    return 0;
}

static int read_normalizer(rd *r, ck_spm_model *m, int keep, const char *name)
{
    while (r->p < r->end) {
        uint32_t f;
        int w;
        if (tag(r, &f, &w)) return -1;
        if (f == 1 || f == 2 || f == 6) {
            const uint8_t *s;
            size_t n;
            if (want(r, f, w, W_LEN) || bytes(r, &s, &n, f)) return -1;
            if (f == 2 && n > CK_SPM_MAX_CHARSMAP)
                return fail(r, "%s.precompiled_charsmap is %zu bytes (at most %zu)", name, n, CK_SPM_MAX_CHARSMAP);
            if (f == 2 && keep) m->charsmap = n ? s : NULL, m->charsmap_len = n;
        } else if (f >= 3 && f <= 5) {
            uint64_t v;
            if (want(r, f, w, W_VARINT) || varint(r, &v)) return -1;
            if (keep) *(f == 3 ? &m->add_dummy_prefix : f == 4 ? &m->remove_extra_whitespaces : &m->escape_whitespaces) = v != 0;
        } else if (skip(r, f, w)) {
            return -1;
        }
    }
    return 0;
}

/* SelfTestData and its samples: checked as messages, never used (the
 * library would run them at load, and ckrun never gives it this file) */
static int read_selftest(rd *r)
{
    while (r->p < r->end) {
        uint32_t f;
        int w;
        if (tag(r, &f, &w)) return -1;
        if (f == 1) {
            const uint8_t *s;
            size_t n;
            if (want(r, f, w, W_LEN) || bytes(r, &s, &n, f)) return -1;
            rd q = sub(r, s, n, "SelfTestData.Sample");
            while (q.p < q.end) {
                uint32_t g;
                int x;
                if (tag(&q, &g, &x)) return -1;
                if ((g == 1 || g == 2) && want(&q, g, x, W_LEN)) return -1;
                if (skip(&q, g, x)) return -1;
            }
            join(r, &q);
        } else if (skip(r, f, w)) {
            return -1;
        }
    }
    return 0;
}

int ck_spm_model_read(ck_spm_model *m, const uint8_t *buf, size_t len, const ck_spm_charge *c, ck_spm_poll poll,
                      void *poll_ud, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    m->buf = buf;
    m->len = len;
    m->model_type = CK_SPM_UNIGRAM;
    m->add_dummy_prefix = m->remove_extra_whitespaces = m->escape_whitespaces = 1;
    m->charge = c;
    rd r = {buf, buf, buf + len, poll, poll_ud, 0, err, errlen, "ModelProto", 0};
    if (len == 0) return fail(&r, "the file is empty");
    if (len > CK_SPM_MAX_FILE) return fail(&r, "the file is %zu bytes (a sentencepiece model is at most %zu)", len, CK_SPM_MAX_FILE);

    /* first the top level alone: the pieces counted before their array is
     * charged and made */
    size_t count = 0;
    int seen[6] = {0};
    while (r.p < r.end) {
        uint32_t f;
        int w;
        if (tag(&r, &f, &w)) return -1;
        if (f >= 1 && f <= 5) {
            static const char *const names[] = {"", "pieces", "trainer_spec", "normalizer_spec", "self_test_data", "denormalizer_spec"};
            if (want(&r, f, w, W_LEN)) return -1;
            if (f > 1 && seen[f]++) return fail(&r, "ModelProto.%s appears twice (at byte %zu)", names[f], r.tag_at);
            if (f == 1 && ++count > CK_SPM_MAX_PIECES)
                return fail(&r, "the model holds more than %d pieces", CK_SPM_MAX_PIECES);
        }
        if (skip(&r, f, w)) return -1;
    }
    if (count == 0) return fail(&r, "the model holds no pieces");
    const size_t need = count * sizeof(ck_spm_piece);
    if (c && c->take) {
        char what[96];
        snprintf(what, sizeof what, "the table of %zu pieces", count);
        if (c->take(c->ud, need, what, err, errlen)) return -1;
        m->charged = need;
    }
    m->pieces = malloc(need);
    if (!m->pieces) return fail(&r, "out of memory for %zu pieces", count);

    r.p = buf;
    while (r.p < r.end) {
        uint32_t f;
        int w;
        if (tag(&r, &f, &w)) return -1;
        if (f < 1 || f > 5) {
            if (skip(&r, f, w)) return -1;
            continue;
        }
        const uint8_t *s;
        size_t n;
        if (bytes(&r, &s, &n, f)) return -1;
        static const char *const msgs[] = {"", "SentencePiece", "TrainerSpec", "NormalizerSpec", "SelfTestData", "NormalizerSpec"};
        rd q = sub(&r, s, n, msgs[f]);
        int rc;
        if (f == 1) {
            rc = read_piece(&q, m->npieces, &m->pieces[m->npieces]);
            m->npieces += rc == 0;
        } else if (f == 2) {
            rc = read_trainer(&q, m);
        } else if (f == 3 || f == 5) {
            rc = read_normalizer(&q, m, f == 3, f == 3 ? "normalizer_spec" : "denormalizer_spec");
        } else {
            rc = read_selftest(&q);
        }
        join(&r, &q);
        if (rc) return -1;
    }
    return 0;
}

void ck_spm_model_free(ck_spm_model *m)
{
    free(m->pieces);
    if (m->charged && m->charge && m->charge->give) m->charge->give(m->charge->ud, m->charged);
    m->pieces = NULL;
    m->charged = 0;
    m->npieces = 0;
}

/* ---- the character map */

static uint32_t unit(const uint8_t *trie, size_t i)
{
    const uint8_t *u = trie + 4 * i;
    return (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
}

/* darts-clone's unit fields */
static int has_leaf(uint32_t u) { return (u >> 8) & 1; }
static int is_leaf(uint32_t u) { return (u >> 31) & 1; }
static uint32_t value_of(uint32_t u) { return u & 0x7FFFFFFFu; }
static uint32_t label_of(uint32_t u) { return u & (0x80000000u | 0xFFu); }
static size_t offset_of(uint32_t u) { return (size_t)(u >> 10) << ((u & (1u << 9)) >> 6); }

int ck_spm_charsmap_check(ck_spm_charsmap *cm, const uint8_t *blob, size_t len, ck_spm_poll poll, void *poll_ud,
                          char *err, size_t errlen)
{
    memset(cm, 0, sizeof *cm);
    rd r = {blob, blob, blob + len, poll, poll_ud, 0, err, errlen, "character map", 0};
    if (len > CK_SPM_MAX_CHARSMAP) return fail(&r, "the character map is %zu bytes (at most %zu)", len, CK_SPM_MAX_CHARSMAP);
    if (len < 4) return fail(&r, "the character map is %zu bytes, too short for its trie's size", len);
    const size_t tsize = unit(blob, 0);
    if (tsize % 4) return fail(&r, "the character map's trie is %zu bytes, not a whole number of 4-byte units", tsize);
    if (tsize > len - 4)
        return fail(&r, "the character map's trie declares %zu bytes where %zu follow", tsize, len - 4);
    const size_t nunits = tsize / 4;
    if (nunits < 256) return fail(&r, "the character map's trie has %zu units, less than one block of 256", nunits);
    const uint8_t *trie = blob + 4;
    const char *norm = (const char *)trie + tsize;
    const size_t nlen = len - 4 - tsize;

    /* the normalized strings: valid UTF-8, each ending in NUL */
    size_t longest = 0;
    for (size_t i = 0; i < nlen;) {
        const char *z = memchr(norm + i, 0, nlen - i);
        if (!z) return fail(&r, "the character map's normalized string at byte %zu does not end in NUL", i);
        const size_t k = (size_t)(z - (norm + i));
        const size_t bad = ck_spm_utf8_check((const uint8_t *)norm + i, k);
        if (bad != k) return fail(&r, "the character map's normalized string at byte %zu is not valid UTF-8", i + bad);
        if (k > longest) longest = k;
        i += k + 1;
        if (poll && (i >> 16) != ((i - k - 1) >> 16)) poll(poll_ud, 4096);
    }

    /* every unit a lookup can take for a node: the root (unit 0, whatever
     * its bits), and every other unit but leaves (a leaf's label has bit 31
     * set, so no byte matches it) */
    for (size_t p = 0; p < nunits; p++) {
        if (poll && (p & 0xFFFF) == 0xFFFF) poll(poll_ud, 4096);
        const uint32_t u = unit(trie, p);
        if (p > 0 && is_leaf(u)) continue;
        const size_t base = p ^ offset_of(u);
        if ((base | 0xFF) >= nunits)
            return fail(&r, "the character map's trie unit %zu points to unit %zu, past its %zu units", p, base, nunits);
        if (!has_leaf(u)) continue;
        const uint32_t leaf = unit(trie, base);
        if (!is_leaf(leaf)) return fail(&r, "the character map's trie unit %zu has a leaf at unit %zu that is not one", p, base);
        const size_t v = value_of(leaf);
        if (v >= nlen)
            return fail(&r, "the character map's trie unit %zu maps to byte %zu of %zu bytes of normalized strings", p, v, nlen);
        if ((norm[v] & 0xC0) == 0x80)
            return fail(&r, "the character map's trie unit %zu maps into the middle of a character (byte %zu)", p, v);
    }
    cm->trie = trie;
    cm->nunits = nunits;
    cm->normalized = norm;
    cm->nlen = nlen;
    cm->max_replacement = longest;
    return 0;
}

const char *ck_spm_charsmap_first(const ck_spm_charsmap *cm, const uint8_t *key, size_t n, size_t *rlen)
{
    size_t p = offset_of(unit(cm->trie, 0));
    for (size_t i = 0; i < n && key[i]; i++) {
        p ^= key[i];
        const uint32_t u = unit(cm->trie, p);
        if (label_of(u) != key[i]) return NULL;
        p ^= offset_of(u);
        if (has_leaf(u)) {
            const char *s = cm->normalized + value_of(unit(cm->trie, p));
            *rlen = strlen(s); /* ends in NUL within the strings: checked */
            return s;
        }
    }
    return NULL;
}

/* ---- writing */

static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

typedef struct wr {
    uint8_t *p, *end;
    size_t n;
} wr;

static void put(wr *w, const void *s, size_t n)
{
    if (w->p && (size_t)(w->end - w->p) >= n) {
        memcpy(w->p, s, n);
        w->p += n;
    } else {
        w->p = w->end = NULL; /* too small: count only */
    }
    w->n += n;
}

static void put_varint(wr *w, uint64_t v)
{
    uint8_t b[10];
    size_t k = 0;
    while (v >= 0x80) b[k++] = (uint8_t)(v | 0x80), v >>= 7;
    b[k++] = (uint8_t)v;
    put(w, b, k);
}

size_t ck_spm_write(int n, ck_spm_get get, void *ud, uint8_t *out, size_t cap)
{
    wr w = {out, out ? out + cap : NULL, 0};
    for (int i = 0; i < n; i++) {
        const char *s;
        uint32_t len;
        float score;
        int type;
        get(ud, i, &s, &len, &score, &type);
        const int typed = type != CK_SPM_NORMAL;
        put_varint(&w, 1 << 3 | W_LEN);
        put_varint(&w, 1 + vlen(len) + len + 1 + 4 + (typed ? 2 : 0));
        put_varint(&w, 1 << 3 | W_LEN);
        put_varint(&w, len);
        put(&w, s, len);
        put_varint(&w, 2 << 3 | W_I32);
        uint32_t u;
        memcpy(&u, &score, 4);
        const uint8_t le[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
        put(&w, le, 4);
        if (typed) {
            put_varint(&w, 3 << 3 | W_VARINT);
            put_varint(&w, (uint64_t)type);
        }
    }
    /* trainer_spec {model_type: UNIGRAM} */
    put_varint(&w, 2 << 3 | W_LEN);
    put_varint(&w, 2);
    put_varint(&w, 3 << 3 | W_VARINT);
    put_varint(&w, CK_SPM_UNIGRAM);
    /* normalizer_spec {name: "identity", add_dummy_prefix: false,
     * remove_extra_whitespaces: false, escape_whitespaces: false} */
    put_varint(&w, 3 << 3 | W_LEN);
    put_varint(&w, 2 + 8 + 6);
    put_varint(&w, 1 << 3 | W_LEN);
    put_varint(&w, 8);
    put(&w, "identity", 8);
    for (int f = 3; f <= 5; f++) {
        put_varint(&w, (uint64_t)f << 3 | W_VARINT);
        put_varint(&w, 0);
    }
    return w.n;
}
