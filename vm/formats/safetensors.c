/* safetensors reading and writing. The header is parsed against the format's
 * schema by a small strict JSON reader of our own, so any malformed byte ends
 * in a message naming the file, never a crash or a silently odd tensor.
 * Tensor data never sits in memory as a whole file: reads go from the open
 * file through one bounded buffer into the caller's memory, and saves from
 * each tensor's source through another into the file. */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64 /* offsets past 2 GiB on 32-bit systems too */
#define _GNU_SOURCE /* O_PATH */
#include "formats/safetensors.h"
#include "formats/json.h"
#include "util/atomic.h"
#include "util/budget.h"
#include "util/memory.h"
#include "util/text.h"
#include "../../ops/bf16.h"
#include "../../ops/fp8.h"
#include "../../ops/fp16.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; size_t size; } dtypes[CK_ST_DTYPE_COUNT] = {
    [CK_ST_F64] = {"F64", 8},  [CK_ST_F32] = {"F32", 4}, [CK_ST_F16] = {"F16", 2},
    [CK_ST_BF16] = {"BF16", 2}, [CK_ST_I64] = {"I64", 8}, [CK_ST_I32] = {"I32", 4},
    [CK_ST_I16] = {"I16", 2},  [CK_ST_I8] = {"I8", 1},   [CK_ST_U8] = {"U8", 1},
    [CK_ST_BOOL] = {"BOOL", 1}, [CK_ST_F8_E4M3] = {"F8_E4M3", 1}, [CK_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *ck_st_dtype_name(ck_st_dtype d)
{
    return (unsigned)d < CK_ST_DTYPE_COUNT ? dtypes[d].name : "?";
}

size_t ck_st_dtype_size(ck_st_dtype d)
{
    return (unsigned)d < CK_ST_DTYPE_COUNT ? dtypes[d].size : 0;
}

static int is_float_dtype(ck_st_dtype d)
{
    return d == CK_ST_F32 || d == CK_ST_F16 || d == CK_ST_BF16;
}

/* Messages */

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ck_verrf_at(err, errlen, path ? path : "(no path)", fmt, ap);
    va_end(ap);
    return -1;
}

/* Names come from untrusted files: show at most ~60 bytes, cut on a UTF-8
 * boundary, with control bytes replaced so a message stays one line. */
typedef struct shown { char s[72]; } shown;

static shown show(const char *name)
{
    shown o;
    size_t n = strlen(name), cut = n, k = 0;
    if (n > 60) {
        cut = 60;
        while (cut > 0 && ((unsigned char)name[cut] & 0xC0) == 0x80) cut--;
    }
    for (size_t i = 0; i < cut; i++) {
        unsigned char c = (unsigned char)name[i];
        o.s[k++] = (c < 0x20 || c == 0x7F) ? '?' : (char)c;
    }
    if (cut < n) { memcpy(o.s + k, "...", 3); k += 3; }
    o.s[k] = 0;
    return o;
}

/* Scalar conversions */

static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* fp16 is the executor's own conversion (ops/fp16.h), so a saved fp16 tensor
 * holds the bits fp16 storage holds */
uint16_t ck_st_f32_to_f16(float x) { return ck_f16_from_f32(x); }

float ck_st_f16_to_f32(uint16_t h) { return ck_f32_from_f16(h); }

/* bf16 is the kernels' own conversion (ops/bf16.h), so a saved bf16 tensor
 * holds the bits the executor stores */
uint16_t ck_st_f32_to_bf16(float x) { return ck_bf16_from_f32(x); }

float ck_st_bf16_to_f32(uint16_t h) { return ck_f32_from_bf16(h); }

/* The file */

typedef struct entry {
    ck_st_tensor pub;
    uint64_t begin, end;
} entry;

typedef struct meta { const char *key, *value; } meta;

struct ck_st_file {
    char *path;
    int fd;               /* the open file; -1 for one opened from memory */
    unsigned char *buf;   /* from memory: a copy of the bytes; else NULL */
    uint64_t size;        /* of the file, as it was at open */
    unsigned char *stage; /* the read buffer, allocated on the first read */
    size_t stage_bytes;   /* its size: the largest tensor, at most CK_ST_IO_BUFFER */
    char *arena;          /* decoded strings; never larger than the header */
    entry *t;
    int n, capt;
    const entry **by_name;
    meta *m;
    int nm, capm;
    ck_st_charge charge; /* take NULL: charged to nothing; poll NULL: never stopped */
    size_t charged;
};

/* charges n bytes of f's memory for what (a phrase with its size): 0, or -1
 * with err naming the file */
static int take(ck_st_file *f, size_t n, const char *what, char *err, size_t errlen)
{
    if (!f->charge.take) return 0;
    char msg[400];
    if (f->charge.take(f->charge.ud, n, what, msg, sizeof msg)) {
        snprintf(err, errlen, "%s: %s", f->path, msg);
        return -1;
    }
    f->charged += n;
    return 0;
}

/* Reports work to the caller's poll: 0 to go on, or -1 with err when it
 * asked to stop. */
static int poll_work(ck_st_file *f, long long work, char *err, size_t errlen)
{
    if (!f->charge.poll || !f->charge.poll(f->charge.poll_ud, work)) return 0;
    snprintf(err, errlen, "%s: stopped while reading its header (the caller asked)", f->path);
    return -1;
}

static void give(ck_st_file *f, size_t n)
{
    if (!f->charge.take) return;
    n = n < f->charged ? n : f->charged;
    f->charge.give(f->charge.ud, n);
    f->charged -= n;
}

typedef struct parser {
    ck_st_file *f;
    char *err;
    size_t errlen;
    const unsigned char *s; /* header JSON */
    size_t n, pos;
    size_t used;            /* bytes of f->arena taken */
    uint64_t datasize;
    size_t polled;          /* p->pos at the last poll */
} parser;

static int bad(parser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ck_verrf_at(p->err, p->errlen, p->f->path ? p->f->path : "(no path)", fmt, ap);
    va_end(ap);
    return -1;
}

static int syntax(parser *p, const char *expected)
{
    if (p->pos >= p->n)
        return bad(p, "invalid JSON header: expected %s at byte %zu, found the end of the header",
                   expected, p->pos);
    unsigned c = p->s[p->pos];
    if (c > 0x20 && c < 0x7F)
        return bad(p, "invalid JSON header: expected %s at byte %zu, found '%c'", expected, p->pos, c);
    return bad(p, "invalid JSON header: expected %s at byte %zu, found byte 0x%02x", expected, p->pos, c);
}

static void ws(parser *p)
{
    while (p->pos < p->n) {
        unsigned c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int peek(parser *p)
{
    return p->pos < p->n ? p->s[p->pos] : -1;
}

static int expect(parser *p, int c, const char *what)
{
    ws(p);
    if (peek(p) != c) return syntax(p, what);
    p->pos++;
    return 0;
}

static int hex4(parser *p, uint32_t *out)
{
    uint32_t v = 0;
    if (p->n - p->pos < 4) return bad(p, "invalid JSON header: truncated \\u escape at byte %zu", p->pos);
    for (int i = 0; i < 4; i++) {
        unsigned c = p->s[p->pos + (size_t)i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return bad(p, "invalid JSON header: bad hex digit in \\u escape at byte %zu", p->pos + (size_t)i);
        v = v << 4 | d;
    }
    p->pos += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *d, uint32_t cp)
{
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | cp >> 6);
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | cp >> 12);
        d[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | cp >> 18);
    d[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    d[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes a string into the arena. A decoded string plus its NUL is never
 * longer than its quoted source, so an arena of header size + 1 suffices. */
static int parse_string(parser *p, char **out)
{
    ws(p);
    if (peek(p) != '"') return syntax(p, "a string");
    p->pos++;
    char *d = p->f->arena + p->used;
    size_t k = 0;
    for (;;) {
        if (p->pos >= p->n) return bad(p, "invalid JSON header: unterminated string");
        unsigned c = p->s[p->pos++];
        if (c == '"') break;
        if (c < 0x20)
            return bad(p, "invalid JSON header: unescaped control byte 0x%02x in a string at byte %zu",
                       c, p->pos - 1);
        if (c != '\\') { d[k++] = (char)c; continue; }
        if (p->pos >= p->n) return bad(p, "invalid JSON header: unterminated string");
        c = p->s[p->pos++];
        switch (c) {
        case '"': case '\\': case '/': d[k++] = (char)c; break;
        case 'b': d[k++] = '\b'; break;
        case 'f': d[k++] = '\f'; break;
        case 'n': d[k++] = '\n'; break;
        case 'r': d[k++] = '\r'; break;
        case 't': d[k++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            size_t at = p->pos - 2;
            if (hex4(p, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->n - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return bad(p, "invalid JSON header: high surrogate \\u%04X at byte %zu "
                               "is not followed by a low surrogate", (unsigned)cp, at);
                p->pos += 2;
                if (hex4(p, &lo)) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return bad(p, "invalid JSON header: high surrogate \\u%04X at byte %zu "
                               "is not followed by a low surrogate", (unsigned)cp, at);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return bad(p, "invalid JSON header: lone low surrogate \\u%04X at byte %zu",
                           (unsigned)cp, at);
            } else if (cp == 0) {
                /* Names are C strings: an embedded NUL would alias another name. */
                return bad(p, "\\u0000 in a header string (byte %zu) is not supported", at);
            }
            k += put_utf8(d + k, cp);
            break;
        }
        default:
            return bad(p, "invalid JSON header: bad escape '\\%c' at byte %zu",
                       (c > 0x20 && c < 0x7F) ? (int)c : '?', p->pos - 2);
        }
    }
    d[k] = 0;
    p->used += k + 1;
    *out = d;
    return 0;
}

static int parse_uint(parser *p, const char *tname, const char *field, uint64_t *out)
{
    ws(p);
    int c = peek(p);
    if (c == '-')
        return bad(p, "tensor '%s': %s holds a negative number (header byte %zu)",
                   show(tname).s, field, p->pos);
    if (c < '0' || c > '9') return syntax(p, "an integer");
    size_t start = p->pos;
    uint64_t v = 0;
    while (p->pos < p->n && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        unsigned d = p->s[p->pos] - '0';
        if (v > ((uint64_t)INT64_MAX - d) / 10)
            return bad(p, "tensor '%s': %s holds a number too large (header byte %zu)",
                       show(tname).s, field, start);
        v = v * 10 + d;
        p->pos++;
    }
    if (p->s[start] == '0' && p->pos - start > 1)
        return bad(p, "invalid JSON header: number with a leading zero at byte %zu", start);
    if (p->pos < p->n && (p->s[p->pos] == '.' || p->s[p->pos] == 'e' || p->s[p->pos] == 'E'))
        return bad(p, "tensor '%s': %s must hold integers, found a fraction or exponent (header byte %zu)",
                   show(tname).s, field, start);
    *out = v;
    return 0;
}

static int parse_uints(parser *p, const char *tname, const char *field, uint64_t *out, int max, int *count)
{
    int k = 0;
    if (expect(p, '[', "'['")) return -1;
    ws(p);
    if (peek(p) == ']') { p->pos++; *count = 0; return 0; }
    for (;;) {
        if (k == max)
            return bad(p, "tensor '%s': %s has more than %d entries", show(tname).s, field, max);
        if (parse_uint(p, tname, field, &out[k++])) return -1;
        ws(p);
        int c = peek(p);
        if (c == ',') { p->pos++; continue; }
        if (c == ']') { p->pos++; break; }
        return syntax(p, "',' or ']'");
    }
    *count = k;
    return 0;
}

static void fmt_shape(char *b, size_t len, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(b, len, "[");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(b + k, len - k, i ? ",%" PRId64 : "%" PRId64, shape[i]);
    if (k < len) snprintf(b + k, len - k, "]");
}

/* Checks that need only the entry itself; contiguity is checked later. */
/* Charges n more bytes of a table the parse grows to cap entries of what,
 * before it grows: a header of a million tiny tensors makes tables larger
 * than itself. */
static int grow_charge(parser *p, size_t n, const char *what, int cap)
{
    char w[160], words[64];
    ck_mem_text(n, words, sizeof words);
    snprintf(w, sizeof w, "the table of its %s grown to %d entries (%s more)", what, cap, words);
    return take(p->f, n, w, p->err, p->errlen);
}

/* between entries: the bytes parsed since the last poll, and the entries */
static int parse_poll(parser *p)
{
    const long long work = (long long)((p->pos - p->polled) / 16) + 4096;
    p->polled = p->pos;
    return poll_work(p->f, work, p->err, p->errlen);
}

static int check_entry(parser *p, entry *e)
{
    shown name = show(e->pub.name);
    size_t esize = dtypes[e->pub.dtype].size;
    uint64_t numel = 1, nonzero = 1;
    char sh[200];
    fmt_shape(sh, sizeof sh, e->pub.ndim, e->pub.shape);
    if (e->begin > e->end)
        return bad(p, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                   name.s, e->begin, e->end);
    for (int i = 0; i < e->pub.ndim; i++) {
        uint64_t d = (uint64_t)e->pub.shape[i];
        if (d == 0) { numel = 0; continue; }
        if (nonzero > (uint64_t)INT64_MAX / d)
            return bad(p, "tensor '%s': shape %s has too many elements", name.s, sh);
        nonzero *= d;
    }
    if (numel) numel = nonzero;
    if (numel > (uint64_t)INT64_MAX / esize)
        return bad(p, "tensor '%s': shape %s %s is too large", name.s, sh, dtypes[e->pub.dtype].name);
    uint64_t nbytes = numel * esize;
    if (nbytes != e->end - e->begin)
        return bad(p, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] do not match shape %s %s (%"
                   PRIu64 " bytes)", name.s, e->begin, e->end, sh, dtypes[e->pub.dtype].name, nbytes);
    if (e->end > p->datasize)
        return bad(p, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the "
                   "data (%" PRIu64 " bytes; file truncated?)", name.s, e->begin, e->end, p->datasize);
    e->pub.numel = (int64_t)numel;
    e->pub.nbytes = (int64_t)nbytes;
    return 0;
}

static int parse_tensor(parser *p, char *name)
{
    enum { F_DTYPE = 1, F_SHAPE = 2, F_OFFSETS = 4 };
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    ck_st_file *f = p->f;
    entry e;
    memset(&e, 0, sizeof e);
    e.pub.name = name;
    ws(p);
    if (peek(p) != '{')
        return bad(p, "tensor '%s': entry must be a JSON object with dtype, shape and data_offsets "
                   "(header byte %zu)", show(name).s, p->pos);
    p->pos++;
    unsigned seen = 0;
    ws(p);
    if (peek(p) == '}') p->pos++;
    else for (;;) {
        size_t mark = p->used;
        char *key;
        unsigned bit = 0;
        if (parse_string(p, &key)) return -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(key, fields[i])) bit = 1u << i;
        if (!bit) return bad(p, "tensor '%s': unknown field '%s'", show(name).s, show(key).s);
        if (seen & bit) return bad(p, "tensor '%s': duplicate key '%s'", show(name).s, show(key).s);
        seen |= bit;
        p->used = mark; /* field names are not kept */
        if (expect(p, ':', "':'")) return -1;
        if (bit == F_DTYPE) {
            char *ds;
            int found = -1;
            ws(p);
            if (peek(p) != '"') return bad(p, "tensor '%s': dtype must be a string", show(name).s);
            if (parse_string(p, &ds)) return -1;
            for (int i = 0; i < CK_ST_DTYPE_COUNT; i++)
                if (!strcmp(ds, dtypes[i].name)) found = i;
            if (found < 0) return bad(p, "tensor '%s': unknown dtype '%s'", show(name).s, show(ds).s);
            e.pub.dtype = (ck_st_dtype)found;
            p->used = mark;
        } else if (bit == F_SHAPE) {
            uint64_t dims[CK_ST_MAX_DIMS];
            int nd;
            if (parse_uints(p, name, "shape", dims, CK_ST_MAX_DIMS, &nd)) return -1;
            e.pub.ndim = nd;
            for (int i = 0; i < nd; i++) e.pub.shape[i] = (int64_t)dims[i];
        } else {
            uint64_t off[2];
            int no;
            if (parse_uints(p, name, "data_offsets", off, 2, &no)) return -1;
            if (no != 2)
                return bad(p, "tensor '%s': data_offsets must be [begin, end]", show(name).s);
            e.begin = off[0];
            e.end = off[1];
        }
        ws(p);
        int c = peek(p);
        if (c == ',') { p->pos++; continue; }
        if (c == '}') { p->pos++; break; }
        return syntax(p, "',' or '}'");
    }
    for (int i = 0; i < 3; i++)
        if (!(seen & 1u << i)) return bad(p, "tensor '%s': missing '%s'", show(name).s, fields[i]);
    if (check_entry(p, &e)) return -1;
    if (f->n == f->capt) {
        int cap = f->capt ? f->capt * 2 : 64;
        if (grow_charge(p, sizeof *f->t * (size_t)(cap - f->capt), "tensors", cap)) return -1;
        entry *t = realloc(f->t, sizeof *t * (size_t)cap);
        if (!t) return bad(p, "out of memory reading the header");
        f->t = t;
        f->capt = cap;
    }
    f->t[f->n++] = e;
    return (f->n & 4095) ? 0 : parse_poll(p);
}

static int parse_meta(parser *p)
{
    ck_st_file *f = p->f;
    ws(p);
    if (peek(p) != '{') return bad(p, "__metadata__ must be an object mapping strings to strings");
    p->pos++;
    ws(p);
    if (peek(p) == '}') { p->pos++; return 0; }
    for (;;) {
        char *k, *v;
        if (parse_string(p, &k)) return -1;
        if (expect(p, ':', "':'")) return -1;
        ws(p);
        if (peek(p) != '"')
            return bad(p, "__metadata__ value for '%s' must be a string (header byte %zu)", show(k).s, p->pos);
        if (parse_string(p, &v)) return -1;
        if (f->nm == f->capm) {
            int cap = f->capm ? f->capm * 2 : 16;
            if (grow_charge(p, sizeof *f->m * (size_t)(cap - f->capm), "__metadata__ entries", cap)) return -1;
            meta *m = realloc(f->m, sizeof *m * (size_t)cap);
            if (!m) return bad(p, "out of memory reading the header");
            f->m = m;
            f->capm = cap;
        }
        f->m[f->nm].key = k;
        f->m[f->nm++].value = v;
        if (!(f->nm & 4095) && parse_poll(p)) return -1;
        ws(p);
        int c = peek(p);
        if (c == ',') { p->pos++; continue; }
        if (c == '}') { p->pos++; return 0; }
        return syntax(p, "',' or '}'");
    }
}

static int parse_header(parser *p)
{
    int seen_meta = 0;
    size_t badu = ck_json_utf8_valid((const char *)p->s, p->n);
    if (badu < p->n) return bad(p, "header is not valid UTF-8 (byte %zu)", badu);
    if (p->n == 0 || p->s[0] != '{') return bad(p, "header is not a JSON object (it must start with '{')");
    p->pos = 1;
    ws(p);
    if (peek(p) == '}') p->pos++;
    else for (;;) {
        char *key;
        if (parse_string(p, &key)) return -1;
        if (expect(p, ':', "':'")) return -1;
        if (!strcmp(key, "__metadata__")) {
            if (seen_meta) return bad(p, "duplicate key '__metadata__'");
            seen_meta = 1;
            if (parse_meta(p)) return -1;
        } else if (parse_tensor(p, key)) {
            return -1;
        }
        ws(p);
        int c = peek(p);
        if (c == ',') { p->pos++; continue; }
        if (c == '}') { p->pos++; break; }
        return syntax(p, "',' or '}'");
    }
    ws(p);
    if (p->pos != p->n)
        return bad(p, "invalid JSON header: unexpected bytes after the JSON object at byte %zu", p->pos);
    return 0;
}

static int cmp_offsets(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->pub.name, y->pub.name);
}

static int cmp_names(const void *a, const void *b)
{
    const entry *const *x = a, *const *y = b;
    return strcmp((*x)->pub.name, (*y)->pub.name);
}

static int cmp_meta(const void *a, const void *b)
{
    return strcmp(((const meta *)a)->key, ((const meta *)b)->key);
}

/* Sorted by begin, the tensors must tile [0, datasize) exactly. */
static int check_layout(parser *p)
{
    ck_st_file *f = p->f;
    uint64_t at = 0;
    for (int i = 0; i < f->n; i++) {
        const entry *e = &f->t[i];
        if (e->begin > at && i == 0)
            return bad(p, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] leave a gap at the "
                       "start of the data (the first tensor must begin at 0)", show(e->pub.name).s, e->begin, e->end);
        if (e->begin > at)
            return bad(p, "gap of %" PRIu64 " bytes in the data between tensor '%s' (ends at %" PRIu64
                       ") and tensor '%s' (begins at %" PRIu64 ")", e->begin - at,
                       show(f->t[i - 1].pub.name).s, at, show(e->pub.name).s, e->begin);
        if (e->begin < at)
            return bad(p, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor '%s' [%"
                       PRIu64 ", %" PRIu64 "]", show(e->pub.name).s, e->begin, e->end,
                       show(f->t[i - 1].pub.name).s, f->t[i - 1].begin, f->t[i - 1].end);
        at = e->end;
    }
    if (at != p->datasize)
        return bad(p, "%" PRIu64 " trailing bytes after the last tensor's data", p->datasize - at);
    return 0;
}

static int build(parser *p)
{
    ck_st_file *f = p->f;
    if (parse_header(p)) return -1;
    /* the sorts cannot be polled inside: a million entries sort in about a
     * tenth of a second each */
    if (parse_poll(p)) return -1;
    if (f->n) qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_offsets);
    if (poll_work(f, f->n, p->err, p->errlen)) return -1;
    if (grow_charge(p, sizeof *f->by_name * (size_t)(f->n ? f->n : 1), "names", f->n)) return -1;
    f->by_name = malloc(sizeof *f->by_name * (size_t)(f->n ? f->n : 1));
    if (!f->by_name) return bad(p, "out of memory reading the header");
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
    if (f->n) qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_names);
    if (poll_work(f, f->n, p->err, p->errlen)) return -1;
    /* Before the layout check: a repeated name would otherwise be reported
     * as an overlap, which hides the real cause. */
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->by_name[i - 1]->pub.name, f->by_name[i]->pub.name))
            return bad(p, "duplicate key '%s' (two tensors of that name)", show(f->by_name[i]->pub.name).s);
    if (f->nm) qsort(f->m, (size_t)f->nm, sizeof *f->m, cmp_meta);
    for (int i = 1; i < f->nm; i++)
        if (!strcmp(f->m[i - 1].key, f->m[i].key))
            return bad(p, "duplicate key '%s' in __metadata__", show(f->m[i].key).s);
    if (check_layout(p)) return -1;
    uint64_t data = 8 + (uint64_t)p->n, largest = 0;
    for (int i = 0; i < f->n; i++) {
        f->t[i].pub.offset = (int64_t)(data + f->t[i].begin);
        f->t[i].pub.file = f->path;
        f->t[i].pub.src = f;
        if ((uint64_t)f->t[i].pub.nbytes > largest) largest = (uint64_t)f->t[i].pub.nbytes;
    }
    f->stage_bytes = largest < CK_ST_IO_BUFFER ? (size_t)largest : CK_ST_IO_BUFFER;
    return 0;
}

/* A file with its path copied in, or NULL (with a message) when out of memory. */
static ck_st_file *new_file(const char *path, char *err, size_t errlen)
{
    ck_st_file *f = calloc(1, sizeof *f);
    size_t plen = strlen(path) + 1;
    if (!f || !(f->path = malloc(plen))) {
        free(f);
        fail(err, errlen, path, "out of memory");
        return NULL;
    }
    memcpy(f->path, path, plen);
    f->fd = -1;
    return f;
}

/* Bytes [off, off + n) of the file into dst: the one place the two kinds of
 * file differ. The size was checked at open, so a short read means the file
 * shrank since; what names the bytes in messages. */
static int read_raw(ck_st_file *f, uint64_t off, void *dst, size_t n, const char *what, char *err, size_t errlen)
{
    const uint64_t end = f->buf ? f->size : UINT64_MAX;
    if (off > end || n > end - off)
        return fail(err, errlen, f->path, "%s is cut short: the data ends at byte %" PRIu64 " (truncated?)", what, end);
    if (f->buf) {
        if (n) memcpy(dst, f->buf + off, n);
        return 0;
    }
    unsigned char *d = dst;
    while (n) {
        size_t ask = n < ((size_t)1 << 30) ? n : (size_t)1 << 30;
        ssize_t k = pread(f->fd, d, ask, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return fail(err, errlen, f->path, "cannot read %s: %s", what, strerror(errno));
        if (k == 0)
            return fail(err, errlen, f->path, "cannot read %s: the file has shrunk since it was opened (%" PRIu64
                        " bytes then, %" PRIu64 " or fewer now; truncated?)", what, f->size, off);
        d += k;
        off += (uint64_t)k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reads and validates the length and the header of f (f->size bytes long);
 * both ways of opening end here. */
static int parse_file(ck_st_file *f, char *err, size_t errlen)
{
    const char *path = f->path;
    if (f->size < 8)
        return fail(err, errlen, path, "file is %" PRIu64 " bytes, too short for the 8-byte header length (truncated?)",
                    f->size);
    unsigned char len8[8];
    if (read_raw(f, 0, len8, 8, "the header length", err, errlen)) return -1;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen > CK_ST_MAX_HEADER)
        return fail(err, errlen, path, "header length %" PRIu64 " is too large (limit %d)", hlen, CK_ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return fail(err, errlen, path, "header length %" PRIu64 " reaches beyond the end of the file "
                    "(only %" PRIu64 " bytes follow it; truncated?)", hlen, f->size - 8);
    /* the header's own bytes are needed only while it is parsed */
    char what[160], words[64];
    ck_mem_text(2 * ((size_t)hlen + 1), words, sizeof words);
    snprintf(what, sizeof what, "its header of %" PRIu64 " bytes (%s to parse)", hlen, words);
    if (take(f, 2 * ((size_t)hlen + 1), what, err, errlen)) return -1;
    unsigned char *h = malloc((size_t)hlen + 1);
    f->arena = malloc((size_t)hlen + 1);
    if (!h || !f->arena) {
        free(h);
        return fail(err, errlen, path, "out of memory reading the header");
    }
    /* read a chunk at a time: JSON holds no zero byte, so a length over a
     * hole (a sparse file's zeros) or over anything but an object stops at
     * the first chunk, and the parser names what is wrong there */
    size_t got = 0;
    int rc = 0;
    while (got < hlen && !rc) {
        const size_t k = hlen - got < ((size_t)1 << 20) ? (size_t)hlen - got : (size_t)1 << 20;
        rc = poll_work(f, (long long)(k / 16), err, errlen);
        if (!rc) rc = read_raw(f, 8 + got, h + got, k, "the header", err, errlen);
        if (!rc && (h[0] != '{' || memchr(h + got, 0, k))) {
            got += k;
            break;
        }
        got += k;
    }
    if (!rc) {
        parser p = {
            .f = f, .err = err, .errlen = errlen, .s = h, .n = got,
            .datasize = f->size - 8 - hlen,
        };
        rc = build(&p);
        if (!rc && got < hlen) rc = fail(err, errlen, path, "header holds a zero byte (it is not JSON)");
    }
    free(h);
    give(f, (size_t)hlen + 1);
    return rc;
}

ck_st_file *ck_st_open(const char *path, char *err, size_t errlen)
{
    return ck_st_open_fd(path ? open(path, O_RDONLY | O_CLOEXEC) : -1, path, NULL, err, errlen);
}

ck_st_file *ck_st_open_fd(int fd, const char *path, const ck_st_charge *c, char *err, size_t errlen)
{
    int e = errno;
    if (err && errlen) err[0] = 0;
    if (!path) {
        if (fd >= 0) close(fd);
        fail(err, errlen, NULL, "no path given");
        return NULL;
    }
    if (fd < 0) {
        fail(err, errlen, path, "cannot open: %s", strerror(e));
        errno = e; /* EMFILE tells a caller that closing files would help */
        return NULL;
    }
    ck_st_file *f = new_file(path, err, errlen);
    if (!f) {
        close(fd);
        return NULL;
    }
    f->fd = fd;
    if (c && c->take && c->give) {
        f->charge.take = c->take;
        f->charge.give = c->give;
        f->charge.ud = c->ud;
    }
    if (c && c->poll) {
        f->charge.poll = c->poll;
        f->charge.poll_ud = c->poll_ud;
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        fail(err, errlen, path, "cannot stat: %s", strerror(errno));
        goto bail;
    }
    if (!S_ISREG(st.st_mode)) {
        fail(err, errlen, path, "not a regular file");
        goto bail;
    }
    f->size = (uint64_t)st.st_size;
    if (parse_file(f, err, errlen)) goto bail;
    return f;
bail:
    ck_st_close(f);
    return NULL;
}

ck_st_file *ck_st_open_memory(const void *buf, size_t len, const char *name, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!name) name = "(memory)";
    if (!buf && len) { fail(err, errlen, name, "no buffer given"); return NULL; }
    ck_st_file *f = new_file(name, err, errlen);
    if (!f) return NULL;
    /* A copy, so that tensors live until ck_st_close whatever the caller
     * does with its buffer. */
    f->size = len;
    f->buf = malloc(len ? len : 1);
    if (!f->buf) {
        fail(err, errlen, name, "out of memory reading %zu bytes", len);
        goto bail;
    }
    if (len) memcpy(f->buf, buf, len);
    if (parse_file(f, err, errlen)) goto bail;
    return f;
bail:
    ck_st_close(f);
    return NULL;
}

void ck_st_close(ck_st_file *f)
{
    if (!f) return;
    give(f, f->charged);
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->buf);
    free(f->stage);
    free(f->arena);
    free(f->t);
    free(f->by_name);
    free(f->m);
    free(f);
}

int ck_st_count(const ck_st_file *f)
{
    return f ? f->n : 0;
}

const ck_st_tensor *ck_st_get(const ck_st_file *f, int i)
{
    return f && i >= 0 && i < f->n ? &f->t[i].pub : NULL;
}

const ck_st_tensor *ck_st_find(const ck_st_file *f, const char *name)
{
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(name, f->by_name[mid]->pub.name);
        if (!c) return &f->by_name[mid]->pub;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *ck_st_meta(const ck_st_file *f, const char *key)
{
    if (!f || !key) return NULL;
    int lo = 0, hi = f->nm - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(key, f->m[mid].key);
        if (!c) return f->m[mid].value;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

int ck_st_meta_count(const ck_st_file *f)
{
    return f ? f->nm : 0;
}

int ck_st_meta_at(const ck_st_file *f, int i, const char **key, const char **value)
{
    if (!f || i < 0 || i >= f->nm) return -1;
    if (key) *key = f->m[i].key;
    if (value) *value = f->m[i].value;
    return 0;
}

/* n values of dtype d (one that converts) from little-endian bytes s. Bytes
 * are assembled explicitly: compilers turn these loops into plain loads. */
static void decode(ck_st_dtype d, const unsigned char *s, float *dst, int64_t n)
{
    switch (d) {
    case CK_ST_F32:
        for (int64_t i = 0; i < n; i++, s += 4)
            dst[i] = bits_f32((uint32_t)s[0] | (uint32_t)s[1] << 8 | (uint32_t)s[2] << 16 | (uint32_t)s[3] << 24);
        return;
    case CK_ST_F16:
        for (int64_t i = 0; i < n; i++, s += 2) dst[i] = ck_st_f16_to_f32((uint16_t)(s[0] | s[1] << 8));
        return;
    case CK_ST_BF16:
        for (int64_t i = 0; i < n; i++, s += 2) dst[i] = ck_st_bf16_to_f32((uint16_t)(s[0] | s[1] << 8));
        return;
    case CK_ST_F8_E4M3: /* torch.float8_e4m3fn */
        for (int64_t i = 0; i < n; i++) dst[i] = ck_f8e4m3_decode(s[i]);
        return;
    case CK_ST_F8_E5M2: /* the high byte of an fp16 */
        for (int64_t i = 0; i < n; i++) dst[i] = ck_st_f16_to_f32((uint16_t)(s[i] << 8));
        return;
    default: /* U8: bytes, exactly (8-bit optimizer codes) */
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
        return;
    }
}

int ck_st_read_f32(const ck_st_tensor *t, float *dst, int64_t n, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!t) return fail(err, errlen, NULL, "no tensor given");
    shown name = show(t->name ? t->name : "");
    if (n != t->numel)
        return fail(err, errlen, t->file, "tensor '%s': destination holds %" PRId64 " floats but the "
                    "tensor has %" PRId64 " elements", name.s, n, t->numel);
    if (n > 0 && !dst) return fail(err, errlen, t->file, "tensor '%s': no destination buffer", name.s);
    if (!is_float_dtype(t->dtype) && t->dtype != CK_ST_F8_E4M3 && t->dtype != CK_ST_F8_E5M2 && t->dtype != CK_ST_U8)
        return fail(err, errlen, t->file, "tensor '%s': dtype %s cannot be read as fp32 "
                    "(only F32, F16, BF16, F8_E4M3, F8_E5M2 and U8 can)", name.s, ck_st_dtype_name(t->dtype));
    if (!n) return 0;
    ck_st_file *f = t->src;
    if (!f) return fail(err, errlen, t->file, "tensor '%s': not from an open file", name.s);
    if (!f->stage) {
        char what[96], words[64];
        ck_mem_text(f->stage_bytes, words, sizeof words);
        snprintf(what, sizeof what, "its read buffer (%s)", words);
        if (take(f, f->stage_bytes, what, err, errlen)) return -1;
        if (!(f->stage = malloc(f->stage_bytes))) {
            give(f, f->stage_bytes);
            return fail(err, errlen, f->path, "out of memory for a read buffer of %zu bytes", f->stage_bytes);
        }
    }
    char what[96];
    snprintf(what, sizeof what, "tensor '%s'", name.s);
    const size_t esize = dtypes[t->dtype].size;
    const int64_t per = (int64_t)(f->stage_bytes / esize);
    for (int64_t i = 0; i < n; i += per) {
        const int64_t k = n - i < per ? n - i : per;
        if (read_raw(f, (uint64_t)t->offset + (uint64_t)i * esize, f->stage, (size_t)k * esize, what, err, errlen))
            return -1;
        decode(t->dtype, f->stage, dst + i, k);
    }
    return 0;
}

int ck_st_read_bytes(const ck_st_tensor *t, int64_t at, void *dst, int64_t n, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (!t) return fail(err, errlen, NULL, "no tensor given");
    shown name = show(t->name ? t->name : "");
    if (at < 0 || n < 0 || at > t->nbytes || n > t->nbytes - at)
        return fail(err, errlen, t->file, "tensor '%s': bytes [%" PRId64 ", %" PRId64 ") lie outside its %" PRId64
                    " bytes", name.s, at, at + n, t->nbytes);
    if (!n) return 0;
    if (!dst) return fail(err, errlen, t->file, "tensor '%s': no destination buffer", name.s);
    if (!t->src) return fail(err, errlen, t->file, "tensor '%s': not from an open file", name.s);
    char what[96];
    snprintf(what, sizeof what, "tensor '%s'", name.s);
    return read_raw(t->src, (uint64_t)(t->offset + at), dst, (size_t)n, what, err, errlen);
}

/* The writer */

typedef struct wtensor {
    char *name;
    ck_st_dtype dtype;
    int ndim;
    int64_t shape[CK_ST_MAX_DIMS];
    int64_t numel, nbytes;
    ck_st_source get; /* asked for the values at save time */
    void *ud;
    int index;
    float *copy;      /* ck_st_writer_add's copy of the values (get's ud), else NULL */
} wtensor;

typedef struct wmeta { char *key, *value; } wmeta;

struct ck_st_writer {
    wtensor *t;
    int n;
    size_t capt;
    wmeta *m;
    int nm;
    size_t capm;
    char failed[256]; /* first bad add or meta call; empty if none */
};

static int werr(ck_st_writer *w, const char *fmt, ...)
{
    if (w->failed[0]) return -1; /* the first mistake is usually the cause */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->failed, sizeof w->failed, fmt, ap);
    va_end(ap);
    return -1;
}

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int valid_utf8(const char *s)
{
    size_t n = strlen(s);
    return ck_json_utf8_valid(s, n) == n;
}

ck_st_writer *ck_st_writer_new(void)
{
    return calloc(1, sizeof(ck_st_writer));
}

void ck_st_writer_free(ck_st_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].copy);
    }
    for (int i = 0; i < w->nm; i++) {
        free(w->m[i].key);
        free(w->m[i].value);
    }
    free(w->t);
    free(w->m);
    free(w);
}

int ck_st_writer_meta(ck_st_writer *w, const char *key, const char *value)
{
    if (!w) return -1;
    if (!key || !value) return werr(w, "__metadata__ key or value is NULL");
    if (!valid_utf8(key) || !valid_utf8(value))
        return werr(w, "__metadata__ entry '%s' is not valid UTF-8", show(key).s);
    if (ck_grow(&w->m, &w->capm, (size_t)w->nm + 1, sizeof *w->m, 16))
        return werr(w, "out of memory adding __metadata__ '%s'", show(key).s);
    wmeta e = {dupstr(key), dupstr(value)};
    if (!e.key || !e.value) {
        free(e.key);
        free(e.value);
        return werr(w, "out of memory adding __metadata__ '%s'", show(key).s);
    }
    w->m[w->nm++] = e;
    return 0;
}

/* Checks a tensor's name, dtype and shape and fills e with them (name not yet
 * copied); -1, kept as the writer's failure, if any is wrong. */
static int describe(ck_st_writer *w, const char *name, ck_st_dtype dtype, int ndim, const int64_t *shape, wtensor *e)
{
    if (!name) return werr(w, "tensor name is NULL");
    shown sn = show(name);
    if (!valid_utf8(name)) return werr(w, "tensor name '%s' is not valid UTF-8", sn.s);
    if (!strcmp(name, "__metadata__")) return werr(w, "'__metadata__' cannot name a tensor");
    if (!is_float_dtype(dtype) && dtype != CK_ST_U8)
        return werr(w, "tensor '%s': cannot write dtype %s from fp32 data (only F32, F16, BF16, U8)",
                    sn.s, ck_st_dtype_name(dtype));
    if (ndim < 0 || ndim > CK_ST_MAX_DIMS)
        return werr(w, "tensor '%s': %d dims (0 to %d allowed)", sn.s, ndim, CK_ST_MAX_DIMS);
    if (ndim > 0 && !shape) return werr(w, "tensor '%s': shape is NULL", sn.s);
    size_t esize = dtypes[dtype].size;
    int64_t numel = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return werr(w, "tensor '%s': negative dim %" PRId64, sn.s, shape[i]);
        if (shape[i] == 0) { zero = 1; continue; }
        if (numel > INT64_MAX / shape[i] / (int64_t)esize)
            return werr(w, "tensor '%s': too many elements", sn.s);
        numel *= shape[i];
    }
    if (zero) numel = 0;
    if ((uint64_t)numel * sizeof(float) > SIZE_MAX) return werr(w, "tensor '%s': too large for memory", sn.s);
    memset(e, 0, sizeof *e);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->numel = numel;
    e->nbytes = numel * (int64_t)esize;
    return 0;
}

/* Appends e with its name copied; on failure e's copy is freed. */
static int push(ck_st_writer *w, const char *name, wtensor *e)
{
    if (ck_grow(&w->t, &w->capt, (size_t)w->n + 1, sizeof *w->t, 64)) {
        free(e->copy);
        return werr(w, "out of memory adding tensor '%s'", show(name).s);
    }
    if (!(e->name = dupstr(name))) {
        free(e->copy);
        return werr(w, "out of memory adding tensor '%s'", show(name).s);
    }
    w->t[w->n++] = *e;
    return 0;
}

/* The index of the first of n values that U8 cannot hold, or -1. */
static int64_t not_a_byte(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(x[i] >= 0.0f && x[i] <= 255.0f && x[i] == floorf(x[i]))) return i;
    return -1;
}

int ck_st_writer_add_source(ck_st_writer *w, const char *name, ck_st_dtype dtype, int ndim,
                            const int64_t *shape, ck_st_source get, void *ud, int index)
{
    if (!w) return -1;
    wtensor e;
    if (describe(w, name, dtype, ndim, shape, &e)) return -1;
    if (!get) return werr(w, "tensor '%s': no source", show(name).s);
    e.get = get;
    e.ud = ud;
    e.index = index;
    return push(w, name, &e);
}

static const float *copied(void *ud, int index, char *err, size_t errlen)
{
    (void)index;
    (void)err;
    (void)errlen;
    return ud;
}

int ck_st_writer_add(ck_st_writer *w, const char *name, ck_st_dtype dtype, int ndim,
                     const int64_t *shape, const float *data)
{
    if (!w) return -1;
    wtensor e;
    if (describe(w, name, dtype, ndim, shape, &e)) return -1;
    if (e.numel > 0 && !data) return werr(w, "tensor '%s': data is NULL", show(name).s);
    int64_t bad = dtype == CK_ST_U8 ? not_a_byte(data, e.numel) : -1;
    if (bad >= 0)
        return werr(w, "tensor '%s': %g at element %" PRId64 " is not a byte (U8 holds 0 to 255)", show(name).s,
                    (double)data[bad], bad);
    e.copy = malloc(e.numel ? (size_t)e.numel * sizeof(float) : 1);
    if (!e.copy) return werr(w, "out of memory adding tensor '%s'", show(name).s);
    if (e.numel) memcpy(e.copy, data, (size_t)e.numel * sizeof(float));
    e.get = copied;
    e.ud = e.copy;
    return push(w, name, &e);
}

static int cmp_wtensor(const void *a, const void *b)
{
    return strcmp(((const wtensor *)a)->name, ((const wtensor *)b)->name);
}

static int cmp_wmeta(const void *a, const void *b)
{
    return strcmp(((const wmeta *)a)->key, ((const wmeta *)b)->key);
}

typedef struct hbuf { char *p; size_t n, cap; } hbuf;

static json_t *tensor_entry(const wtensor *t, uint64_t off)
{
    json_t *e = json_object(), *shape = json_array();
    int bad = !e || !shape;
    for (int d = 0; !bad && d < t->ndim; d++) bad = json_array_append_new(shape, json_integer(t->shape[d]));
    bad = bad || json_object_set_new(e, "dtype", json_string(dtypes[t->dtype].name));
    bad = bad || json_object_set(e, "shape", shape);
    bad = bad || json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off,
                                                                 (json_int_t)(off + (uint64_t)t->nbytes)));
    json_decref(shape);
    if (bad) {
        json_decref(e);
        return NULL;
    }
    return e;
}

/* JSON header: __metadata__ first, then tensors by name, laid out in the same
 * order (jansson keeps insertion order); padded with spaces so the data
 * starts 8-byte aligned. */
static int build_header(ck_st_writer *w, hbuf *b, const char *path, char *err, size_t errlen)
{
    uint64_t off = 0;
    json_t *h = json_object();
    int bad = !h;
    if (!bad && w->nm) {
        json_t *m = json_object();
        bad = !m || json_object_set_new_nocheck(h, "__metadata__", m);
        for (int i = 0; !bad && i < w->nm; i++) bad = json_object_set_new(m, w->m[i].key, json_string(w->m[i].value));
    }
    for (int i = 0; !bad && i < w->n; i++) {
        const wtensor *t = &w->t[i];
        bad = json_object_set_new(h, t->name, tensor_entry(t, off));
        off += (uint64_t)t->nbytes;
    }
    bad = bad || ck_json_append(h, CK_JSON_COMPACT, &b->p, &b->n, &b->cap);
    json_decref(h);
    while (!bad && b->n % 8) bad = ck_json_put(" ", 1, &b->p, &b->n, &b->cap);
    if (bad) return fail(err, errlen, path, "out of memory building the header");
    if (b->n > CK_ST_MAX_HEADER)
        return fail(err, errlen, path, "header would be %zu bytes, over the limit of %d readers accept",
                    b->n, CK_ST_MAX_HEADER);
    return 0;
}

/* 0, or the errno of the failed write */
static int write_all(int fd, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n) {
        ssize_t k = write(fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return errno ? errno : EIO;
        if (k == 0) return EIO;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* n fp32 values as little-endian dtype d (a writable one) into out */
static void encode(ck_st_dtype d, const float *x, int64_t n, unsigned char *out)
{
    for (int64_t i = 0; i < n; i++) {
        if (d == CK_ST_U8) {
            *out++ = (unsigned char)x[i];
        } else if (d == CK_ST_F32) {
            uint32_t u = f32_bits(x[i]);
            *out++ = (unsigned char)u; *out++ = (unsigned char)(u >> 8);
            *out++ = (unsigned char)(u >> 16); *out++ = (unsigned char)(u >> 24);
        } else {
            uint16_t h = d == CK_ST_F16 ? ck_st_f32_to_f16(x[i]) : ck_st_f32_to_bf16(x[i]);
            *out++ = (unsigned char)h; *out++ = (unsigned char)(h >> 8);
        }
    }
}

/* Asks t's source for its values and writes them through buf (cap bytes),
 * converted chunk by chunk. 0; -1 with a message in msg when the values are
 * wrong or missing; or the errno of a failed write. */
static int write_tensor(const wtensor *t, int fd, unsigned char *buf, size_t cap, char *msg, size_t len)
{
    if (!t->numel) return 0;
    msg[0] = 0;
    const float *x = t->get(t->ud, t->index, msg, len);
    if (!x) {
        if (!msg[0]) snprintf(msg, len, "its source gave no values");
        return -1;
    }
    const size_t esize = dtypes[t->dtype].size;
    const int64_t per = (int64_t)(cap / esize);
    for (int64_t i = 0; i < t->numel; i += per) {
        const int64_t k = t->numel - i < per ? t->numel - i : per;
        const int64_t bad = t->dtype == CK_ST_U8 ? not_a_byte(x + i, k) : -1;
        if (bad >= 0) {
            snprintf(msg, len, "%g at element %" PRId64 " is not a byte (U8 holds 0 to 255)", (double)x[i + bad],
                     i + bad);
            return -1;
        }
        encode(t->dtype, x + i, k, buf);
        int e = write_all(fd, buf, (size_t)k * esize);
        if (e) return e;
    }
    return 0;
}

int ck_st_writer_save(ck_st_writer *w, const char *path, char *err, size_t errlen)
{
    if (!path) return fail(err, errlen, NULL, "no path given");
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    char *dir = malloc(b + 2), *name = malloc(n - b + 1);
    if (!dir || !name) {
        free(dir);
        free(name);
        return fail(err, errlen, path, "out of memory");
    }
    if (b == 0) strcpy(dir, ".");
    else {
        memcpy(dir, path, b);
        dir[b] = 0;
    }
    memcpy(name, path + b, n - b);
    name[n - b] = 0;
    int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int rc = ck_st_writer_save_at(w, dfd, name, path, err, errlen);
    if (dfd >= 0) close(dfd);
    free(dir);
    free(name);
    return rc;
}

int ck_st_writer_save_at(ck_st_writer *w, int dirfd, const char *name, const char *path, char *err, size_t errlen)
{
    int open_errno = errno;
    if (err && errlen) err[0] = 0;
    if (!path) return fail(err, errlen, NULL, "no path given");
    if (!w) return fail(err, errlen, path, "no writer given");
    if (w->failed[0]) return fail(err, errlen, path, "%s", w->failed);
    if (w->n) qsort(w->t, (size_t)w->n, sizeof *w->t, cmp_wtensor);
    for (int i = 1; i < w->n; i++)
        if (!strcmp(w->t[i - 1].name, w->t[i].name))
            return fail(err, errlen, path, "duplicate tensor name '%s'", show(w->t[i].name).s);
    if (w->nm) qsort(w->m, (size_t)w->nm, sizeof *w->m, cmp_wmeta);
    for (int i = 1; i < w->nm; i++)
        if (!strcmp(w->m[i - 1].key, w->m[i].key))
            return fail(err, errlen, path, "duplicate __metadata__ key '%s'", show(w->m[i].key).s);

    hbuf hb = {0};
    if (build_header(w, &hb, path, err, errlen)) {
        free(hb.p);
        return -1;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hb.n >> (8 * i));
    /* the data's buffer: the largest tensor, at most CK_ST_IO_BUFFER */
    size_t cap = 1;
    for (int i = 0; i < w->n; i++)
        if ((uint64_t)w->t[i].nbytes > cap) cap = (size_t)w->t[i].nbytes;
    if (cap > CK_ST_IO_BUFFER) cap = CK_ST_IO_BUFFER;

    unsigned char *buf = malloc(cap);
    if (!buf) {
        free(hb.p);
        return fail(err, errlen, path, "out of memory");
    }
    ck_atomic_file af;
    if (ck_atomic_begin(&af, dirfd, open_errno, name, path, err, errlen)) {
        free(buf);
        free(hb.p);
        return -1;
    }
    int e = 0, bad = -1; /* bad: the tensor whose values failed */
    char msg[256];
    if ((e = write_all(af.fd, len8, 8)) || (e = write_all(af.fd, hb.p, hb.n))) goto bail;
    for (int i = 0; i < w->n; i++) {
        int rc = write_tensor(&w->t[i], af.fd, buf, cap, msg, sizeof msg);
        if (rc < 0) bad = i;
        if (rc) {
            e = rc > 0 ? rc : 0;
            goto bail;
        }
    }
    free(buf);
    free(hb.p);
    return ck_atomic_commit(&af, path, err, errlen);
bail:
    if (bad >= 0)
        fail(err, errlen, path, "tensor '%s': %s", show(w->t[bad].name).s, msg);
    else
        fail(err, errlen, path, "write of temp file %s failed: %s", af.tmp, e ? strerror(e) : "unknown error");
    ck_atomic_abort(&af);
    free(buf);
    free(hb.p);
    return -1;
}
