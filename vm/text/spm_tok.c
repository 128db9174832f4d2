/* The T5 tokenizer's vocabulary, special tokens and text pipeline around the
 * unigram model (vm/text/spm_tok.h): built from an spiece.model or a
 * tokenizer.json, then steps 1 to 4 of a caption. */
#include "text/spm_tok.h"
#include "util/text.h"
#include "util/hash.h"

#include <unicode/ubrk.h>
#include <unicode/utext.h>

#include <math.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define META "\xE2\x96\x81" /* U+2581, tokenizers' Metaspace replacement */

/* ---- memory, charged before it is made */

static int take(const ck_spm_charge *c, size_t *charged, size_t n, const char *what, char *err, size_t errlen)
{
    if (!c || !c->take) return 0;
    if (c->take(c->ud, n, what, err, errlen)) return -1;
    *charged += n;
    return 0;
}

static void give(const ck_spm_charge *c, size_t *charged, size_t n)
{
    if (!c || !c->give || !n) return;
    c->give(c->ud, n);
    *charged -= n;
}

/* *p grown to hold need elements of size each (doubling), the difference
 * charged first. 0, or -1 with err. */
static int grow(const ck_spm_charge *c, size_t *charged, void **p, size_t *cap, size_t need, size_t each,
                const char *what, char *err, size_t errlen)
{
    if (need <= *cap) return 0;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / each) return ck_errf(err, errlen, "%s: too large", what);
        ncap *= 2;
    }
    if (take(c, charged, (ncap - *cap) * each, what, err, errlen)) return -1;
    void *q = realloc(*p, ncap * each);
    if (!q) {
        give(c, charged, (ncap - *cap) * each);
        return ck_errf(err, errlen, "out of memory for %s", what);
    }
    *p = q;
    *cap = ncap;
    return 0;
}

/* ---- the vocabulary */

static uint64_t hash_of(const char *s, size_t n)
{
    return ck_fnv1a(CK_FNV_OFFSET, s, n);
}

int32_t ck_spm_tok_id(const ck_spm_tok *t, const char *s, size_t n)
{
    if (!t->hcap) return -1;
    for (size_t i = hash_of(s, n) & (t->hcap - 1);; i = (i + 1) & (t->hcap - 1)) {
        const int32_t id = t->hash[i];
        if (id < 0) return -1;
        if (t->e[id].len == n && memcmp(t->str + t->e[id].off, s, n) == 0) return id;
    }
}

/* room for count entries of bytes bytes of text in all, and their index */
static int reserve(ck_spm_tok *t, size_t count, size_t bytes, char *err, size_t errlen)
{
    void *p = t->e;
    if (grow(t->charge, &t->charged, &p, &t->cap, count, sizeof(ck_spm_entry), "the vocabulary's entries", err, errlen))
        return -1;
    t->e = p;
    p = t->str;
    if (grow(t->charge, &t->charged, &p, &t->str_cap, bytes, 1, "the vocabulary's strings", err, errlen)) return -1;
    t->str = p;
    size_t hcap = t->hcap ? t->hcap : 16;
    while (hcap < 2 * count + 2) hcap *= 2;
    if (hcap == t->hcap) return 0;
    if (take(t->charge, &t->charged, (hcap - t->hcap) * sizeof(int32_t), "the vocabulary's index", err, errlen)) return -1;
    int32_t *h = malloc(hcap * sizeof *h);
    if (!h) return ck_errf(err, errlen, "out of memory for the vocabulary's index");
    memset(h, 0xFF, hcap * sizeof *h);
    for (int i = 0; i < t->n; i++) {
        size_t k = hash_of(t->str + t->e[i].off, t->e[i].len) & (hcap - 1);
        while (h[k] >= 0) k = (k + 1) & (hcap - 1);
        h[k] = i;
    }
    free(t->hash);
    t->hash = h;
    t->hcap = hcap;
    return 0;
}

/* appends an entry; its id, or -1 with err (among others when the
 * vocabulary already holds it) */
static int32_t add(ck_spm_tok *t, const char *s, size_t n, float score, char *err, size_t errlen)
{
    if (reserve(t, (size_t)t->n + 1, t->str_len + n, err, errlen)) return -1;
    const int32_t dup = ck_spm_tok_id(t, s, n);
    char q[200];
    if (dup >= 0) return ck_errf(err, errlen, "entry %d '%s' is entry %d again", t->n, ck_spm_quote(q, sizeof q, s, n), (int)dup);
    const int32_t id = t->n++;
    memcpy(t->str + t->str_len, s, n);
    t->e[id] = (ck_spm_entry){(uint32_t)t->str_len, (uint32_t)n, score};
    t->str_len += n;
    size_t k = hash_of(s, n) & (t->hcap - 1);
    while (t->hash[k] >= 0) k = (k + 1) & (t->hcap - 1);
    t->hash[k] = id;
    return id;
}

void ck_spm_tok_free(ck_spm_tok *t)
{
    free(t->str);
    free(t->e);
    free(t->hash);
    free(t->blob);
    free(t->sp);
    give(t->charge, &t->charged, t->charged);
    const ck_spm_charge *c = t->charge;
    memset(t, 0, sizeof *t);
    t->charge = c;
}

/* ---- special tokens */

static int cmp_special(const void *a, const void *b)
{
    const ck_spm_special *x = a, *y = b;
    if (x->b0 != y->b0) return x->b0 < y->b0 ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int add_special(ck_spm_tok *t, int32_t id, size_t *cap, char *err, size_t errlen)
{
    for (int i = 0; i < t->nsp; i++)
        if (t->sp[i].id == id) return 0;
    if (t->nsp >= CK_SPM_MAX_SPECIALS) return ck_errf(err, errlen, "more than %d special tokens", CK_SPM_MAX_SPECIALS);
    if (t->e[id].len > CK_SPM_MAX_SPECIAL_BYTES)
        return ck_errf(err, errlen, "special token %d is %u bytes long (at most %d)", (int)id, t->e[id].len, CK_SPM_MAX_SPECIAL_BYTES);
    void *p = t->sp;
    if (grow(t->charge, &t->charged, &p, cap, (size_t)t->nsp + 1, sizeof(ck_spm_special), "the special tokens", err, errlen))
        return -1;
    t->sp = p;
    t->sp[t->nsp++] = (ck_spm_special){t->e[id].off, t->e[id].len, id, (unsigned char)t->str[t->e[id].off]};
    return 0;
}

static void index_specials(ck_spm_tok *t)
{
    qsort(t->sp, (size_t)t->nsp, sizeof *t->sp, cmp_special);
    int k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < t->nsp && t->sp[k].b0 < b) k++;
        t->first[b] = k;
    }
}

/* the id of a named token (pad, eos, unk), which the vocabulary must hold */
static int named(ck_spm_tok *t, const char *name, const char *dflt, const char *role, int32_t *id, char *err, size_t errlen)
{
    const char *s = name ? name : dflt;
    *id = ck_spm_tok_id(t, s, strlen(s));
    char q[200];
    if (*id < 0) return ck_errf(err, errlen, "the %s token '%s' is not in the vocabulary", role, ck_spm_quote(q, sizeof q, s, strlen(s)));
    return 0;
}

/* pad, eos and unk: named, and special tokens */
static int finish(ck_spm_tok *t, const ck_spm_config *cfg, size_t *spcap, char *err, size_t errlen)
{
    int32_t unk_named;
    if (named(t, cfg ? cfg->pad : NULL, "<pad>", "pad", &t->pad, err, errlen) ||
        named(t, cfg ? cfg->eos : NULL, "</s>", "eos", &t->eos, err, errlen) ||
        named(t, cfg ? cfg->unk : NULL, "<unk>", "unk", &unk_named, err, errlen))
        return -1;
    if (add_special(t, t->pad, spcap, err, errlen) || add_special(t, t->eos, spcap, err, errlen) ||
        add_special(t, unk_named, spcap, err, errlen))
        return -1;
    index_specials(t);
    return 0;
}

/* ---- from an spiece.model */

static int copy_map(ck_spm_tok *t, const uint8_t *blob, size_t len, ck_spm_poll poll, void *ud, char *err, size_t errlen)
{
    if (!len) return 0;
    if (len > CK_SPM_MAX_CHARSMAP)
        return ck_errf(err, errlen, "the character map is %zu bytes (at most %zu)", len, CK_SPM_MAX_CHARSMAP);
    if (take(t->charge, &t->charged, len, "the character map", err, errlen)) return -1;
    t->blob = malloc(len);
    if (!t->blob) return ck_errf(err, errlen, "out of memory for the character map");
    memcpy(t->blob, blob, len);
    if (ck_spm_charsmap_check(&t->map, t->blob, len, poll, ud, err, errlen)) return -1;
    t->has_map = 1;
    return 0;
}

int ck_spm_tok_from_model(ck_spm_tok *t, const ck_spm_model *m, const ck_spm_config *cfg, const ck_spm_charge *c,
                          ck_spm_poll poll, void *poll_ud, char *err, size_t errlen)
{
    t->charge = c;
    t->unk = 2;
    static const char *const types[] = {"", "NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"};
    if (m->model_type != CK_SPM_UNIGRAM)
        return ck_errf(err, errlen, "a %s model, where T5's tokenizer is a unigram model",
                    m->model_type == CK_SPM_BPE ? "BPE" : m->model_type == CK_SPM_WORD ? "word" : "character");
    if (m->byte_fallback) return ck_errf(err, errlen, "byte_fallback is on, which T5's tokenizer never uses");
    if (m->npieces < 3 || m->pieces[2].type != CK_SPM_UNKNOWN)
        return ck_errf(err, errlen, "piece 2 is not the unknown piece (T5's tokenizer takes id 2 for unknown text)");
    const int extra = cfg && cfg->extra_ids >= 0 ? cfg->extra_ids : 100;
    if (extra > CK_SPM_MAX_EXTRA_IDS) return ck_errf(err, errlen, "extra_ids is %d (at most %d)", extra, CK_SPM_MAX_EXTRA_IDS);
    size_t bytes = (size_t)extra * 16;
    for (int i = 0; i < m->npieces; i++) {
        const int ty = m->pieces[i].type;
        if (ty == CK_SPM_USER_DEFINED || ty == CK_SPM_BYTE || ty == CK_SPM_UNUSED)
        {
            char q[200];
            return ck_errf(err, errlen, "piece %d '%s' is of type %s, which T5's tokenizer has none of", i,
                        ck_spm_quote(q, sizeof q, (const char *)m->buf + m->pieces[i].off, m->pieces[i].len), types[ty]);
        }
        if (i > 2 && ty == CK_SPM_UNKNOWN) return ck_errf(err, errlen, "piece %d is a second unknown piece", i);
        bytes += m->pieces[i].len;
    }
    if (reserve(t, (size_t)m->npieces + (size_t)extra, bytes, err, errlen)) return -1;
    for (int i = 0; i < m->npieces; i++) {
        if (poll && (i & 4095) == 4095) poll(poll_ud, 4096);
        if (add(t, (const char *)m->buf + m->pieces[i].off, m->pieces[i].len, m->pieces[i].score, err, errlen) < 0) return -1;
    }
    size_t spcap = 0;
    /* the extra ids, <extra_id_{E-1}> first, as transformers appends them */
    for (int i = extra - 1; i >= 0; i--) {
        char name[32];
        const int k = snprintf(name, sizeof name, "<extra_id_%d>", i);
        const int32_t id = add(t, name, (size_t)k, 0.0f, err, errlen);
        if (id < 0 || add_special(t, id, &spcap, err, errlen)) return -1;
    }
    if (copy_map(t, m->charsmap, m->charsmap_len, poll, poll_ud, err, errlen)) return -1;
    return finish(t, cfg, &spcap, err, errlen);
}

/* ---- from tokenizer.json */

static int b64(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* the character map in its base64 text (standard alphabet, padded) into
 * t->blob, then checked */
static int map_from_base64(ck_spm_tok *t, const char *s, size_t n, ck_spm_poll poll, void *ud, char *err, size_t errlen)
{
    if (n == 0) return 0;
    if (n % 4) return ck_errf(err, errlen, "the Precompiled normalizer's precompiled_charsmap is not base64 (%zu characters)", n);
    size_t pad = (s[n - 1] == '=') + (n > 1 && s[n - 2] == '=');
    const size_t len = n / 4 * 3 - pad;
    if (len > CK_SPM_MAX_CHARSMAP)
        return ck_errf(err, errlen, "the character map is %zu bytes (at most %zu)", len, CK_SPM_MAX_CHARSMAP);
    if (take(t->charge, &t->charged, len, "the character map", err, errlen)) return -1;
    t->blob = malloc(len ? len : 1);
    if (!t->blob) return ck_errf(err, errlen, "out of memory for the character map");
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        if (poll && (i & 0xFFFF) == 0xFFFC) poll(ud, 4096);
        int v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = b64((unsigned char)s[i + k]);
            if (v[k] < 0 && !(s[i + k] == '=' && i + 4 == n && k >= 4 - (int)pad))
                return ck_errf(err, errlen, "the Precompiled normalizer's precompiled_charsmap is not base64 (character %zu)", i + k + 1);
        }
        const uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)(v[2] < 0 ? 0 : v[2]) << 6 |
                           (uint32_t)(v[3] < 0 ? 0 : v[3]);
        const uint8_t b[3] = {(uint8_t)(x >> 16), (uint8_t)(x >> 8), (uint8_t)x};
        for (int k = 0; k < 3 && o < len; k++) t->blob[o++] = b[k];
    }
    if (ck_spm_charsmap_check(&t->map, t->blob, len, poll, ud, err, errlen)) return -1;
    t->has_map = 1;
    return 0;
}

/* the first Precompiled normalizer (as transformers 5 takes it): the
 * normalizer itself, or one of a Sequence's */
static const json_t *precompiled(const json_t *norm)
{
    if (!json_is_object(norm)) return NULL;
    const char *type = json_string_value(json_object_get(norm, "type"));
    if (type && !strcmp(type, "Precompiled")) return norm;
    if (type && !strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(norm, "normalizers");
        for (size_t i = 0; i < json_array_size(list); i++) {
            const json_t *x = json_array_get(list, i);
            const char *tx = json_string_value(json_object_get(x, "type"));
            if (tx && !strcmp(tx, "Precompiled")) return x;
        }
    }
    return NULL;
}

int ck_spm_tok_from_json(ck_spm_tok *t, const json_t *root, const ck_spm_config *cfg, const ck_spm_charge *c,
                         ck_spm_poll poll, void *poll_ud, char *err, size_t errlen)
{
    t->charge = c;
    t->unk = 2;
    if (!json_is_object(root)) return ck_errf(err, errlen, "not a JSON object");
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return ck_errf(err, errlen, "no \"model\" object");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (json_object_get(model, "type") && (!type || strcmp(type, "Unigram")))
        return ck_errf(err, errlen, "model.type is %s%s%s, where T5's tokenizer is a \"Unigram\" model", type ? "\"" : "",
                    type ? type : "not a string", type ? "\"" : "");
    const json_t *unk = json_object_get(model, "unk_id");
    if (unk && !json_is_null(unk) && !(json_is_integer(unk) && json_integer_value(unk) == 2))
        return ck_errf(err, errlen, "model.unk_id is not 2 (T5's tokenizer takes id 2 for unknown text)");
    const json_t *bf = json_object_get(model, "byte_fallback");
    if (bf && !json_is_false(bf) && !json_is_null(bf))
        return ck_errf(err, errlen, "model.byte_fallback is on, which T5's tokenizer never uses");
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_array(vocab)) return ck_errf(err, errlen, "model.vocab is not a list of [piece, score] pairs");
    const size_t n = json_array_size(vocab);
    if (n < 3) return ck_errf(err, errlen, "model.vocab holds %zu entries (T5's unknown piece is entry 2)", n);
    if (n > CK_SPM_MAX_PIECES) return ck_errf(err, errlen, "model.vocab holds %zu entries (at most %d)", n, CK_SPM_MAX_PIECES);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(vocab, i);
        const json_t *p = json_array_get(e, 0), *sc = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(p) || !json_is_number(sc))
            return ck_errf(err, errlen, "model.vocab entry %zu is not a [piece, score] pair", i);
        const size_t len = json_string_length(p);
        if (len == 0 || len > CK_SPM_MAX_PIECE_BYTES)
            return ck_errf(err, errlen, "model.vocab entry %zu is %zu bytes long (1 to %d)", i, len, CK_SPM_MAX_PIECE_BYTES);
        if (memchr(json_string_value(p), 0, len)) return ck_errf(err, errlen, "model.vocab entry %zu holds a NUL character", i);
        const double d = json_number_value(sc);
        if (!isfinite(d) || fabs(d) > 3.0e38) return ck_errf(err, errlen, "model.vocab entry %zu has a score that is not a finite float", i);
        bytes += len;
        if (poll && (i & 4095) == 4095) poll(poll_ud, 4096);
    }
    if (reserve(t, n, bytes, err, errlen)) return -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(vocab, i);
        const json_t *p = json_array_get(e, 0);
        if (add(t, json_string_value(p), json_string_length(p), (float)json_number_value(json_array_get(e, 1)), err, errlen) < 0)
            return -1;
        if (poll && (i & 4095) == 4095) poll(poll_ud, 4096);
    }
    const json_t *pre = precompiled(json_object_get(root, "normalizer"));
    if (pre) {
        const json_t *map = json_object_get(pre, "precompiled_charsmap");
        if (map && !json_is_null(map)) {
            if (!json_is_string(map)) return ck_errf(err, errlen, "the Precompiled normalizer's precompiled_charsmap is not a string");
            if (map_from_base64(t, json_string_value(map), json_string_length(map), poll, poll_ud, err, errlen)) return -1;
        }
    }
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) return ck_errf(err, errlen, "added_tokens is not a list");
    size_t spcap = 0;
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(id) || !json_is_string(content))
            return ck_errf(err, errlen, "added_tokens entry %zu lacks an integer id or a string content", i);
        const json_int_t k = json_integer_value(id);
        const char *s = json_string_value(content);
        const size_t len = json_string_length(content);
        char q[200];
        ck_spm_quote(q, sizeof q, s, len);
        if (k < 0 || k >= t->n || t->e[k].len != len || memcmp(t->str + t->e[k].off, s, len))
            return ck_errf(err, errlen, "added token '%s' (id %lld) is not vocabulary entry %lld", q, (long long)k, (long long)k);
        static const char *const flags[] = {"lstrip", "rstrip", "single_word", "normalized"};
        for (int f = 0; f < 4; f++)
            if (json_is_true(json_object_get(a, flags[f])))
                return ck_errf(err, errlen, "added token '%s' has %s set, which T5's tokenizer never does", q, flags[f]);
        if (add_special(t, (int32_t)k, &spcap, err, errlen)) return -1;
    }
    return finish(t, cfg, &spcap, err, errlen);
}

/* ---- the model for the library */

static void proto_get(void *ud, int i, const char **s, uint32_t *len, float *score, int *type)
{
    const ck_spm_tok *t = ud;
    const ck_spm_entry *e = &t->e[i == t->n ? t->unk : i];
    *s = t->str + e->off;
    *len = e->len;
    *score = e->score;
    *type = i == t->unk ? CK_SPM_UNKNOWN : CK_SPM_NORMAL;
}

size_t ck_spm_tok_proto(const ck_spm_tok *t, uint8_t *out, size_t cap)
{
    return ck_spm_write(t->n + 1, proto_get, (void *)t, out, cap);
}

/* ---- a caption, steps 1 to 4 */

void ck_spm_scratch_free(ck_spm_scratch *s)
{
    for (int i = 0; i < 2; i++) free(s->buf[i]);
    if (s->brk) ubrk_close(s->brk);
    if (s->ut) utext_close(s->ut);
    give(s->charge, &s->charged, s->charged);
    const ck_spm_charge *c = s->charge;
    memset(s, 0, sizeof *s);
    s->charge = c;
}

/* the length of the UTF-8 character at s (valid text) */
static size_t clen(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static uint32_t decode(const unsigned char *s, size_t k)
{
    if (k == 1) return s[0];
    uint32_t cp = s[0] & (0x7Fu >> k);
    for (size_t i = 1; i < k; i++) cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

/* Unicode White_Space, as Rust's char::is_whitespace */
static int is_space(uint32_t c)
{
    return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

typedef struct splitter {
    const ck_spm_tok *t;
    ck_spm_scratch *s;
    const ck_spm_sink *sink;
    ck_spm_poll poll;
    void *poll_ud;
    long long work;
    char *err;
    size_t errlen;
} splitter;

static void work(splitter *x, long long k)
{
    x->work += k;
    if (x->work >= 4096) {
        if (x->poll) x->poll(x->poll_ud, x->work);
        x->work = 0;
    }
}

static int room(splitter *x, int b, size_t need)
{
    ck_spm_scratch *s = x->s;
    void *p = s->buf[b];
    if (grow(s->charge, &s->charged, &p, &s->cap[b], need, 1, "the caption's buffers", x->err, x->errlen)) return -1;
    s->buf[b] = p;
    return 0;
}

static int append(splitter *x, int b, size_t *len, const char *src, size_t n)
{
    if (room(x, b, *len + n)) return -1;
    memcpy(x->s->buf[b] + *len, src, n);
    *len += n;
    return 0;
}

/* step 2: text[0..n) through the character map into buffer 0 */
static int normalize(splitter *x, const char *text, size_t n, size_t *outlen)
{
    const ck_spm_charsmap *cm = &x->t->map;
    *outlen = 0;
    if (n > INT32_MAX) return ck_errf(x->err, x->errlen, "a piece of text of %zu bytes between special tokens (at most 2 GiB)", n);
    if (room(x, 0, n + 1)) return -1;
    UErrorCode st = U_ZERO_ERROR;
    if (x->s->brk == NULL) {
        x->s->brk = ubrk_open(UBRK_CHARACTER, "", NULL, 0, &st);
        if (U_FAILURE(st)) {
            x->s->brk = NULL;
            return ck_errf(x->err, x->errlen, "ICU's grapheme iterator failed to open: %s", u_errorName(st));
        }
    }
    /* the UText lives in the scratch: a jump out of the poll below leaves
     * nothing open on this stack */
    x->s->ut = utext_openUTF8(x->s->ut, text, (int64_t)n, &st);
    ubrk_setUText(x->s->brk, x->s->ut, &st);
    if (U_FAILURE(st)) return ck_errf(x->err, x->errlen, "ICU's grapheme iterator failed: %s", u_errorName(st));
    int32_t a = ubrk_first(x->s->brk), b;
    int rc = 0;
    while (rc == 0 && (b = ubrk_next(x->s->brk)) != UBRK_DONE) {
        const unsigned char *g = (const unsigned char *)text + a;
        const size_t glen = (size_t)(b - a);
        size_t rlen;
        const char *r = glen < 6 ? ck_spm_charsmap_first(cm, g, glen, &rlen) : NULL;
        if (r) {
            rc = append(x, 0, outlen, r, rlen);
        } else {
            for (size_t i = 0; i < glen && rc == 0;) {
                const size_t k = clen(g[i]);
                r = ck_spm_charsmap_first(cm, g + i, k, &rlen);
                rc = r ? append(x, 0, outlen, r, rlen) : append(x, 0, outlen, (const char *)g + i, k);
                i += k;
            }
        }
        a = b;
        work(x, (long long)glen + 8);
    }
    return rc;
}

/* steps 3 and 4 over s[0..n): words, each with U+2581 in front, cut before
 * each U+2581; pieces to the sink. 1 when the sink stopped. */
static int words(splitter *x, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = clen((unsigned char)s[i]);
        if (is_space(decode((const unsigned char *)s + i, k))) {
            i += k;
            continue;
        }
        size_t j = i;
        while (j < n) {
            k = clen((unsigned char)s[j]);
            if (is_space(decode((const unsigned char *)s + j, k))) break;
            j += k;
        }
        /* the word s[i..j) with its U+2581 in buffer 1 */
        size_t len = 0;
        if ((j - i < 3 || memcmp(s + i, META, 3)) && append(x, 1, &len, META, 3)) return -1;
        if (append(x, 1, &len, s + i, j - i)) return -1;
        const char *w = x->s->buf[1];
        size_t start = 0;
        for (size_t p = 3; p + 3 <= len; p++) {
            if (memcmp(w + p, META, 3) == 0) {
                if (x->sink->piece(x->sink->ud, w + start, p - start)) return 1;
                start = p;
                p += 2;
            }
        }
        if (x->sink->piece(x->sink->ud, w + start, len - start)) return 1;
        work(x, (long long)(j - i) + 16);
        i = j;
    }
    return 0;
}

static int segment(splitter *x, const char *text, size_t n)
{
    if (n == 0) return 0;
    if (!x->t->has_map) return words(x, text, n);
    size_t len;
    if (normalize(x, text, n, &len)) return -1;
    return words(x, x->s->buf[0], len);
}

int ck_spm_tok_split(const ck_spm_tok *t, const char *text, size_t n, ck_spm_scratch *s, const ck_spm_sink *sink,
                     ck_spm_poll poll, void *poll_ud, char *err, size_t errlen)
{
    splitter x = {t, s, sink, poll, poll_ud, 0, err, errlen};
    size_t seg = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char b = (unsigned char)text[i];
        int hit = -1;
        for (int k = t->first[b]; k < t->first[b + 1]; k++) {
            const ck_spm_special *sp = &t->sp[k];
            if (sp->len <= n - i && memcmp(text + i, t->str + sp->off, sp->len) == 0) {
                hit = k;
                break;
            }
        }
        work(&x, 1 + (t->first[b + 1] - t->first[b]));
        if (hit < 0) {
            i++;
            continue;
        }
        int rc = segment(&x, text + seg, i - seg);
        if (rc) return rc;
        if (sink->special(sink->ud, t->sp[hit].id)) return 1;
        i += t->sp[hit].len;
        seg = i;
    }
    return segment(&x, text + seg, n - seg);
}
