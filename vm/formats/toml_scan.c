/* A TOML text measured before toml++ parses it (vm/formats/toml_scan.h):
 * one pass over its strings, comments, keys and brackets that counts how
 * deep each value sits and how many keys, tables and values it makes. */
#include "formats/toml_scan.h"

#include "formats/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define POLL_EVERY ((size_t)64 << 10)
#define STACK (CK_TOML_MAX_DEPTH + 2)

/* What toml++ 3.3.0 holds at most while it parses, per key part, per value
 * and per byte of text (its peak, with malloc's headers, is 70 to 240 bytes
 * per key part, 70 to 125 per value and 3 per byte of a long string; tests/c/
 * toml_charge.cc checks these against what it allocates) */
#define PER_KEY 384
#define PER_VALUE 192
#define PER_BYTE 4
#define BASE_CHARGE ((size_t)64 << 10)

typedef struct sc {
    const char *s;
    size_t n, i;
    int (*poll)(void *, long long);
    void *ud;
    size_t polled;
    ck_toml_scan *o;
    char *err;
    size_t errlen;
    /* the arrays ('[') and inline tables ('{') open around the value being
     * read, each with its depth */
    char kind[STACK];
    int at[STACK];
    int sp;
    int base; /* the depth of the table the last header named */
} sc;

void ck_toml_position(const char *s, size_t off, unsigned *line, unsigned *col)
{
    unsigned l = 1, c = 1;
    for (size_t i = 0; i < off; i++) {
        if (s[i] == '\n') l++, c = 1;
        else if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    }
    *line = l;
    *col = c;
}

static int fail_at(sc *c, size_t off, const char *fmt, ...)
{
    unsigned line, col;
    ck_toml_position(c->s, off, &line, &col);
    int k = snprintf(c->err, c->errlen, "line %u, column %u: ", line, col);
    if (k >= 0 && (size_t)k < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int peek(const sc *c) { return c->i < c->n ? (unsigned char)c->s[c->i] : -1; }

/* the poll, every POLL_EVERY bytes: -2 when it says stop */
static int polled(sc *c)
{
    if (!c->poll || c->i - c->polled < POLL_EVERY) return 0;
    const long long work = (long long)(c->i - c->polled);
    c->polled = c->i;
    return c->poll(c->ud, work) ? -2 : 0;
}

static void skip_ws(sc *c)
{
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\r')) c->i++;
}

static void skip_to_eol(sc *c)
{
    const char *nl = memchr(c->s + c->i, '\n', c->n - c->i);
    c->i = nl ? (size_t)(nl - c->s) : c->n;
}

/* spaces, newlines and comments (between the values of an array) */
static void skip_blank(sc *c)
{
    for (;;) {
        skip_ws(c);
        const int ch = peek(c);
        if (ch == '\n') c->i++;
        else if (ch == '#') skip_to_eol(c);
        else return;
    }
}

/* A string at c->i (its opening quote): basic or literal, on one line or
 * several, as TOML ends each. One that never ends stops at its line's end
 * (one line) or the text's: toml++ refuses it there. */
static void string(sc *c, int multi_ok)
{
    const char q = c->s[c->i];
    const int multi = multi_ok && c->n - c->i >= 3 && c->s[c->i + 1] == q && c->s[c->i + 2] == q;
    c->i += multi ? 3 : 1;
    while (c->i < c->n) {
        const char ch = c->s[c->i];
        if (ch == '\\' && q == '"') {
            c->i += 2; /* an escape: the next byte (a quote, a backslash, a newline) is its own */
        } else if (ch == q) {
            if (!multi) {
                c->i++;
                return;
            }
            /* three to five quotes end a multi-line string: up to two of them are its own */
            size_t run = 0;
            while (c->i + run < c->n && c->s[c->i + run] == q) run++;
            if (run >= 3) {
                c->i += run < 5 ? run : 5;
                return;
            }
            c->i += run;
        } else if (ch == '\n' && !multi) {
            return;
        } else {
            c->i++;
        }
    }
    if (c->i > c->n) c->i = c->n;
}

/* a byte that ends a bare key or a scalar */
static int delimiter(int ch)
{
    return ch < 0 || strchr(" \t\r\n.=[]{},#\"'", ch) != NULL;
}

/* A dotted key at c->i: its parts, each bare or quoted. A bare part is any
 * run of bytes up to a delimiter, wider than TOML's A-Za-z0-9_-, so that a
 * key toml++ might read is never counted short. 0: no key here. */
static int key(sc *c)
{
    int parts = 0;
    for (;;) {
        skip_ws(c);
        const int ch = peek(c);
        if (ch == '"' || ch == '\'') {
            string(c, 0);
        } else if (!delimiter(ch)) {
            while (!delimiter(peek(c))) c->i++;
        } else {
            return parts;
        }
        parts++;
        skip_ws(c);
        if (peek(c) != '.') return parts;
        c->i++;
    }
}

/* a scalar (a number, a boolean, a date): up to a delimiter (a date's
 * space before its time ends it: what follows is read as more of it) */
static void scalar(sc *c)
{
    const size_t from = c->i;
    while (c->i < c->n) {
        const int ch = peek(c);
        if (ch == '.' || !delimiter(ch)) c->i++;
        else break;
    }
    if (c->i == from && c->i < c->n) c->i++; /* a stray byte: toml++ refuses it; step over */
}

static int deeper(sc *c, size_t off, int depth)
{
    const int header = c->base > 0;
    if (depth > c->o->depth) c->o->depth = depth;
    if (depth <= CK_TOML_MAX_DEPTH) return 0;
    return fail_at(c, off, "tables and arrays nest %d levels deep here, past the %d ckrun reads%s", depth,
                   CK_TOML_MAX_DEPTH, header ? " (a header's keys count two levels each: each may step through an "
                   "array of tables)" : "");
}

/* keys made k more parts and t more tables: refused past the cap */
static int count_keys(sc *c, size_t off, int k, int t)
{
    c->o->keys += (size_t)k;
    c->o->tables += (size_t)t;
    if (c->o->tables > CK_TOML_MAX_TABLES)
        return fail_at(c, off, "headers and dotted keys make more than %d tables, past what a config holds",
                       CK_TOML_MAX_TABLES);
    return 0;
}

enum { VALUE, AFTER, KEY };

/* The value of a key, at depth d, with all it holds; then back at the top
 * level (the caller skips the rest of its line). */
static int value(sc *c, int d)
{
    int st = VALUE, vd = d, rc;
    c->sp = 0;
    for (;;) {
        if ((rc = polled(c))) return rc;
        if (st == VALUE) {
            if (c->sp) skip_blank(c);
            else skip_ws(c);
            const int ch = peek(c);
            const size_t at = c->i;
            if (ch < 0 || (ch == '\n' && !c->sp)) return 0; /* no value: toml++ refuses it */
            if (c->sp && ((ch == ']' && c->kind[c->sp - 1] == '[') || (ch == '}' && c->kind[c->sp - 1] == '{'))) {
                c->sp--; /* an empty array, or one after a trailing comma */
                c->i++;
                st = AFTER;
                continue;
            }
            c->o->values++;
            if (ch == '[' || ch == '{') {
                if ((rc = deeper(c, at, vd))) return rc;
                c->kind[c->sp] = (char)ch;
                c->at[c->sp++] = vd;
                c->i++;
                st = ch == '[' ? VALUE : KEY;
                if (ch == '[') vd = c->at[c->sp - 1] + 1;
                continue;
            }
            if (ch == '"' || ch == '\'') string(c, 1);
            else scalar(c);
            st = AFTER;
        } else if (st == AFTER) {
            if (!c->sp) return 0;
            skip_blank(c);
            const int ch = peek(c);
            if (ch < 0) return 0;
            const char open = c->kind[c->sp - 1];
            if (ch == ',') {
                c->i++;
                st = open == '[' ? VALUE : KEY;
                if (open == '[') vd = c->at[c->sp - 1] + 1;
            } else if ((ch == ']' && open == '[') || (ch == '}' && open == '{')) {
                c->sp--;
                c->i++;
            } else if (ch == '"' || ch == '\'') {
                string(c, 1); /* toml++ refuses a value without a comma before it */
            } else {
                scalar(c); /* a date's time after its space, or what toml++ refuses */
            }
        } else { /* KEY: in an inline table, after '{' or ',' */
            skip_blank(c);
            const int ch = peek(c);
            if (ch < 0) return 0;
            if (ch == '}') {
                c->sp--;
                c->i++;
                st = AFTER;
                continue;
            }
            const size_t at = c->i;
            const int parts = key(c);
            if (!parts) {
                scalar(c);
                continue;
            }
            vd = c->at[c->sp - 1] + parts;
            if ((rc = deeper(c, at, vd))) return rc;
            if ((rc = count_keys(c, at, parts, parts - 1))) return rc;
            skip_ws(c);
            if (peek(c) == '=') c->i++;
            st = VALUE;
        }
    }
}

int ck_toml_scan_text(const char *s, size_t n, int (*poll)(void *ud, long long work), void *ud, ck_toml_scan *out,
                      char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    sc c = {.s = s, .n = n, .poll = poll, .ud = ud, .o = out, .err = err, .errlen = errlen};
    if (n > CK_TOML_MAX_BYTES) {
        snprintf(err, errlen, "%zu bytes: more than the %zu KiB a TOML file may hold", n, CK_TOML_MAX_BYTES >> 10);
        return -1;
    }
    const char *nul = memchr(s, 0, n);
    if (nul) return fail_at(&c, (size_t)(nul - s), "a NUL byte (TOML text holds none)");
    const size_t ok = ck_utf8_valid(s, n);
    if (ok < n) return fail_at(&c, ok, "not valid UTF-8 (byte 0x%02X)", (unsigned char)s[ok]);
    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) c.i = 3; /* a byte order mark, which toml++ skips */
    int rc;
    for (;;) {
        if ((rc = polled(&c))) return rc;
        skip_blank(&c);
        const int ch = peek(&c);
        if (ch < 0) break;
        const size_t at = c.i;
        if (ch == '[') {
            c.i++;
            const int aot = peek(&c) == '[';
            if (aot) c.i++;
            const int parts = key(&c);
            c.base = 2 * parts + aot;
            if ((rc = deeper(&c, at, c.base))) return rc;
            if ((rc = count_keys(&c, at, parts, parts))) return rc;
        } else {
            const int parts = key(&c);
            if (parts) {
                if ((rc = deeper(&c, at, c.base + parts))) return rc;
                if ((rc = count_keys(&c, at, parts, parts - 1))) return rc;
                skip_ws(&c);
                if (peek(&c) == '=') c.i++;
                if ((rc = value(&c, c.base + parts))) return rc;
            }
        }
        /* the rest of the line: a comment, or what toml++ refuses */
        if (peek(&c) == '"' || peek(&c) == '\'') string(&c, 1);
        skip_to_eol(&c);
    }
    out->charge = out->keys * PER_KEY + out->values * PER_VALUE + n * PER_BYTE + BASE_CHARGE;
    return 0;
}
