/* jansson with the runtime's conventions: reals as short as they read back
 * (ck_json_digits), strings made valid UTF-8 before jansson sees them, and dumps appended to a caller's buffer so
 * a record or a header is one contiguous write. */
#include "formats/json.h"
#include "util/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t ck_json_utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return i;
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

/* s with each byte that starts no valid sequence replaced by U+FFFD */
static char *repair(const char *s, size_t n, size_t *out_len)
{
    char *d = malloc(3 * n + 1);
    if (!d) return NULL;
    size_t o = 0;
    while (n) {
        size_t ok = ck_json_utf8_valid(s, n);
        memcpy(d + o, s, ok);
        o += ok;
        if (ok == n) break;
        memcpy(d + o, "\xEF\xBF\xBD", 3);
        o += 3;
        s += ok + 1;
        n -= ok + 1;
    }
    d[o] = 0;
    *out_len = o;
    return d;
}

json_t *ck_json_text(const char *s, size_t n)
{
    if (ck_json_utf8_valid(s, n) == n) return json_stringn_nocheck(s, n);
    size_t m;
    char *d = repair(s, n, &m);
    if (!d) return NULL;
    json_t *v = json_stringn_nocheck(d, m);
    free(d);
    return v;
}

int ck_json_set(json_t *obj, const char *key, size_t klen, json_t *v)
{
    if (!v) return -1;
    if (ck_json_utf8_valid(key, klen) == klen) return json_object_setn_new_nocheck(obj, key, klen, v);
    size_t m;
    char *d = repair(key, klen, &m);
    if (!d) {
        json_decref(v);
        return -1;
    }
    int rc = json_object_setn_new_nocheck(obj, d, m, v);
    free(d);
    return rc;
}

int ck_json_put(const char *s, size_t n, char **out, size_t *len, size_t *cap)
{
    if (!*out) *cap = 0;
    if (ck_grow(out, cap, *len + n + 1, 1, 1024)) return -1;
    memcpy(*out + *len, s, n);
    *len += n;
    (*out)[*len] = 0;
    return 0;
}

typedef struct sink {
    char **p;
    size_t *len, *cap;
} sink;

static int put(const char *s, size_t n, void *ud)
{
    sink *b = ud;
    return ck_json_put(s, n, b->p, b->len, b->cap);
}

int ck_json_append(const json_t *v, size_t flags, char **out, size_t *len, size_t *cap)
{
    sink b = {out, len, cap};
    if (ck_json_put("", 0, out, len, cap)) return -1; /* a buffer even for nothing written */
    return json_dump_callback(v, put, &b, flags) ? -1 : 0;
}

int ck_json_digits(double v)
{
    char t[32];
    snprintf(t, sizeof t, "%.15g", v);
    return strtod(t, NULL) == v ? 15 : 17;
}
