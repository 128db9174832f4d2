/* TOML read by toml++ (Debian's libtomlplusplus-dev 3.3.0, compiled in
 * header-only: vm/formats/toml_shim.cc) behind C functions: the text is
 * measured first (vm/formats/toml_scan.h: its size, depth and counts), the
 * parser's memory is charged before it runs, the text reaches it a piece at
 * a time with a poll between pieces, and its tree comes back as one flat
 * list of items that holds no C++ type. No exception crosses this header.
 * Knows nothing of Lua: the binding (vm/lua/lua_toml.c) gives the budget and
 * the poll, and names the file. */
#ifndef CK_TOML_SHIM_H
#define CK_TOML_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "text/text_file.h" /* ck_text_guard: a C header without C++ guards of its own */

typedef enum ck_toml_type {
    CK_TOML_TABLE = 1,
    CK_TOML_ARRAY,
    CK_TOML_STRING,
    CK_TOML_INTEGER,
    CK_TOML_FLOAT,
    CK_TOML_BOOLEAN,
    CK_TOML_DATE, /* a date, a time or a date-time, as RFC 3339 text (str, len) */
} ck_toml_type;

/* One value. A table or an array is followed by its count items (each with
 * all it holds) in document order: a table's entries in the order their
 * keys first appear, an array's in its order. */
typedef struct ck_toml_item {
    const char *key;  /* an entry of a table: its key (klen bytes, not NUL-terminated); else NULL */
    size_t klen;
    const char *str;  /* STRING, DATE: the text (len bytes, NUL-terminated; a STRING may hold NULs) */
    size_t len;
    union {
        int64_t i;      /* INTEGER */
        double f;       /* FLOAT */
        int b;          /* BOOLEAN */
        uint32_t count; /* TABLE, ARRAY */
    } v;
    uint32_t line, col; /* where the entry's key (in a table) or the value (in an array) starts */
    uint8_t type;       /* ck_toml_type */
} ck_toml_item;

/* The parsed text: items[0] is the root table. */
typedef struct ck_toml_doc {
    ck_toml_item *items;
    size_t n;
    char *text; /* the keys' and strings' bytes the items point into: ntext of them */
    size_t ntext;
    size_t charged;
} ck_toml_doc;

/* ck_toml_parse's statuses besides 0 */
#define CK_TOML_BAD (-1)     /* the text is refused: err says where and why */
#define CK_TOML_STOPPED (-2) /* g's poll stopped the work */
#define CK_TOML_MEMORY (-3)  /* g's take refused a charge: err holds its message */

/* s[0..n) parsed into out. What toml++ allocates is charged to g before it
 * runs (from the scan's counts) and given back once its tree is gone; out's
 * items and text are charged as they are made, and stay so until
 * ck_toml_doc_free. err: "line L, column C: what" for text refused by the
 * scan or by toml++, else what stopped the work. g may be NULL. */
int ck_toml_parse(const char *s, size_t n, const ck_text_guard *g, ck_toml_doc *out, char *err, size_t errlen);
void ck_toml_doc_free(const ck_text_guard *g, ck_toml_doc *d);

#ifdef __cplusplus
}
#endif

#endif
