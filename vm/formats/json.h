/* The JSON the runtime writes, on jansson: what metrics.jsonl, safetensors
 * headers and ck.json_encode share (the number precision, text that is always
 * valid UTF-8, output appended to a growing buffer). Knows nothing of Lua. */
#ifndef CK_JSON_H
#define CK_JSON_H

#include <jansson.h>

#include <stddef.h>
#include <stdint.h>

/* one line, no spaces: what files hold (the header's reals, if any, in 17
 * digits: every double reads back as itself) */
#define CK_JSON_COMPACT (JSON_COMPACT | JSON_REAL_PRECISION(17))

/* The significant digits that write double v so that it reads back as
 * itself: 15 when those do, else 17. jansson writes every real of one dump at
 * one precision; a dump at the most digits any of its reals needs writes
 * each as short as it can be (%g drops the zeros past a value's own). */
int ck_json_digits(double v);

/* A string from n bytes; invalid UTF-8 sequences become U+FFFD (jansson
 * holds only valid UTF-8). NULL when out of memory. */
json_t *ck_json_text(const char *s, size_t n);
/* obj[key] = v for a key of klen bytes (made valid UTF-8 as above); steals v.
 * -1 when out of memory or v is NULL. */
int ck_json_set(json_t *obj, const char *key, size_t klen, json_t *v);
/* The length of the valid UTF-8 prefix of s[0..n): n when all of it is. */
size_t ck_json_utf8_valid(const char *s, size_t n);
/* n bytes appended to *out (malloc'd, grown; NUL-terminated after *len).
 * 0, or -1 when out of memory. */
int ck_json_put(const char *s, size_t n, char **out, size_t *len, size_t *cap);
/* v as text appended to *out (malloc'd, grown; NUL-terminated after *len).
 * 0, or -1 when out of memory. */
int ck_json_append(const json_t *v, size_t flags, char **out, size_t *len, size_t *cap);

#endif
