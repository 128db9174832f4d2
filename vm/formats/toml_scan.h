/* What a TOML text holds, measured and checked before toml++
 * (vm/formats/toml_shim.h) sees it: its size, NUL bytes and UTF-8, how deep
 * its tables and arrays nest and how many values and tables it makes.
 * toml++ 3.3.0 bounds nested arrays and inline tables but not tables made by
 * dotted keys or headers, whose depth its recursion follows until the stack
 * runs out, and it searches its lists of tables linearly; so both are
 * bounded here first. It also breaks its own checks (an abort, or undefined
 * behaviour in a build with NDEBUG) on some texts it should refuse, found by
 * tests/fuzz/fuzz_toml.c: a header with no key after its bracket, a '}'
 * where an array holds a value, a value that has no value's shape, and a
 * character past ASCII where it looks for whitespace (outside strings and
 * comments, and after a backslash in a multi-line string); those are refused
 * here, in one line with their place.
 *
 * The scan follows TOML's strings, comments, keys, headers and brackets
 * exactly on valid text. On invalid text it goes on as best it can: toml++
 * stops at the first error, so it never builds anything past the point
 * where the scan and the grammar part. Knows nothing of Lua. */
#ifndef CK_TOML_SCAN_H
#define CK_TOML_SCAN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the most a TOML text may hold (kohya's configs: a few KiB) */
#define CK_TOML_MAX_BYTES ((size_t)1 << 20)
/* how deep a value may sit: tables, arrays and inline tables around it */
#define CK_TOML_MAX_DEPTH 32
/* the most tables headers and dotted keys may make (toml++ searches its
 * lists of them linearly: quadratic time past a few thousand) */
#define CK_TOML_MAX_TABLES 10000

typedef struct ck_toml_scan {
    size_t keys;    /* key parts, of headers and of dotted keys */
    size_t tables;  /* tables headers and dotted keys may make */
    size_t values;  /* values, arrays and inline tables among them */
    int depth;      /* the deepest a value sits */
    size_t charge;  /* an upper bound of what toml++ allocates for the text */
} ck_toml_scan;

/* Scans s[0..n). poll (NULL: none) is called with the bytes scanned since
 * its last call, every 64 KiB, and stops the scan when it returns nonzero.
 * 0; -1 with "line L, column C: what" (columns count characters) or "N
 * bytes: ..." in err; -2 when poll stopped it. */
int ck_toml_scan_text(const char *s, size_t n, int (*poll)(void *ud, long long work), void *ud, ck_toml_scan *out,
                      char *err, size_t errlen);

/* the line and column (1-based, columns in characters) of byte off of s */
void ck_toml_position(const char *s, size_t off, unsigned *line, unsigned *col);

#ifdef __cplusplus
}
#endif

#endif
