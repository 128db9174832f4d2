/* A TOML text measured before toml++ parses it (vm/formats/toml_scan.h):
 * one pass over its strings, comments, keys and brackets that counts how
 * deep each value sits and how many keys, tables and values it makes. */
#include "formats/toml_scan.h"

#include "formats/json.h"

#include <stdarg.h>
#include <stdint.h>
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
    /* the first byte past ASCII where toml++ 3.3.0 would ask its whitespace
     * table about it (see wide()), or SIZE_MAX; why: in words */
    size_t wide;
    const char *why;
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

/* spaces and tabs: TOML's whitespace (a carriage return is one only before a newline) */
static void skip_ws(sc *c)
{
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t')) c->i++;
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
        if (ch == '\n' || ch == '\r') c->i++;
        else if (ch == '#') skip_to_eol(c);
        else return;
    }
}

/* Notes a byte past ASCII at a place where toml++ 3.3.0 asks its whitespace
 * table about the character: the table reaches a point it marks unreachable
 * (undefined behaviour) for most characters from U+00A1 to U+FEFE, Latin,
 * Greek and Cyrillic letters among them. wide(): at c->i, outside strings and
 * comments, where TOML holds none. */
static void wide_at(sc *c, size_t at, const char *why)
{
    if (at < c->n && (unsigned char)c->s[at] >= 0x80 && at < c->wide) c->wide = at, c->why = why;
}

static void wide(sc *c)
{
    wide_at(c, c->i, "a character past ASCII outside a string or a comment (TOML allows them only in quoted keys, "
            "strings and comments)");
}

/* After a backslash in a multi-line basic string (c->i past it). toml++
 * 3.3.0 asks its whitespace table about the byte after it, and after a
 * line-ending backslash about the first byte past the whitespace it trims;
 * past ASCII there its table fails (see wide()). */
static void escaped(sc *c)
{
    static const char *const why = "a character past ASCII right after a backslash, or after the spaces and lines a "
                                   "line-ending backslash trims, in a multi-line string (toml++ 3.3.0 cannot read it: "
                                   "put the backslash's trim elsewhere or escape the character as \\uXXXX)";
    wide_at(c, c->i, why);
    if (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\r' || c->s[c->i] == '\n')) {
        while (c->i < c->n && strchr(" \t\r\n", c->s[c->i])) c->i++;
        wide_at(c, c->i, why);
        return;
    }
    if (c->i < c->n) c->i++;
}

/* A string at c->i (its opening quote): basic or literal, on one line or
 * several, as TOML ends each. One that never ends stops at its line's end
 * (one line) or the text's: toml++ refuses it there. */
static void string(sc *c)
{
    const char q = c->s[c->i];
    const int multi = c->n - c->i >= 3 && c->s[c->i + 1] == q && c->s[c->i + 2] == q;
    c->i += multi ? 3 : 1;
    while (c->i < c->n) {
        const char ch = c->s[c->i];
        if (ch == '\\' && q == '"') {
            c->i++; /* an escape: the next byte (a quote, a backslash, a newline) is its own */
            if (multi) escaped(c);
            else c->i++;
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

/* the rest of a line after a header or a value: a comment, or what toml++
 * refuses (its bytes past ASCII noted) */
static void rest_of_line(sc *c)
{
    while (c->i < c->n && c->s[c->i] != '\n') {
        if (c->s[c->i] == '#') {
            skip_to_eol(c);
            return;
        }
        if (c->s[c->i] == '"' || c->s[c->i] == '\'') {
            string(c);
            continue;
        }
        wide(c);
        c->i++;
    }
}

/* a byte of a bare key as TOML spells one */
static int bare(int ch)
{
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
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
            string(c); /* a multi-line one too: toml++ reads it, then refuses it */
        } else if (!delimiter(ch)) {
            while (!delimiter(peek(c))) wide(c), c->i++;
        } else {
            return parts;
        }
        parts++;
        skip_ws(c);
        if (peek(c) != '.') return parts;
        c->i++;
    }
}

static int digits(const char *s, const char *pattern)
{
    for (; *pattern; s++, pattern++)
        if (*pattern == 'd' ? !(*s >= '0' && *s <= '9') : *s != *pattern) return 0;
    return 1;
}

/* ---- TOML 1.0's scalars, as its ABNF spells them: toml++ 3.3.0 guesses a
 * value's type from its first characters and asserts what it guessed (an
 * abort on "1979-05-27T-inf"), so a value it is given has the shape of one */

typedef struct cur {
    const char *s;
    size_t n, i;
} cur;

static int is_digit(int ch) { return ch >= '0' && ch <= '9'; }
static int next_is(const cur *u, int ch) { return u->i < u->n && u->s[u->i] == ch; }
static int take_ch(cur *u, const char *set)
{
    if (u->i < u->n && u->s[u->i] && strchr(set, u->s[u->i])) return ++u->i, 1;
    return 0;
}

/* 1*digit with single underscores between digits; digit(ch) says what a digit is */
static int digit_run(cur *u, int (*digit)(int))
{
    if (u->i >= u->n || !digit((unsigned char)u->s[u->i])) return 0;
    u->i++;
    for (;;) {
        if (u->i < u->n && digit((unsigned char)u->s[u->i])) u->i++;
        else if (next_is(u, '_') && u->i + 1 < u->n && digit((unsigned char)u->s[u->i + 1])) u->i += 2;
        else return 1;
    }
}

static int is_hex(int ch) { return is_digit(ch) || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F'); }
static int is_oct(int ch) { return ch >= '0' && ch <= '7'; }
static int is_bin(int ch) { return ch == '0' || ch == '1'; }

/* dd:dd:dd[.d+] */
static int partial_time(cur *u)
{
    if (u->n - u->i < 8 || !digits(u->s + u->i, "dd:dd:dd")) return 0;
    u->i += 8;
    if (next_is(u, '.')) {
        u->i++;
        if (u->i >= u->n || !is_digit((unsigned char)u->s[u->i])) return 0;
        while (u->i < u->n && is_digit((unsigned char)u->s[u->i])) u->i++;
    }
    return 1;
}

static int toml_scalar(const char *t, size_t n)
{
    cur u = {t, n, 0};
    if ((n == 4 && memcmp(t, "true", 4) == 0) || (n == 5 && memcmp(t, "false", 5) == 0)) return 1;
    if (n >= 10 && digits(t, "dddd-dd-dd")) { /* a date, and its time */
        u.i = 10;
        if (u.i == n) return 1;
        if (!take_ch(&u, "Tt ") || !partial_time(&u)) return 0;
        if (u.i == n) return 1;
        if (take_ch(&u, "Zz")) return u.i == n;
        return take_ch(&u, "+-") && u.n - u.i == 5 && digits(t + u.i, "dd:dd");
    }
    if (n >= 8 && digits(t, "dd:dd:dd")) return partial_time(&u) && u.i == n;
    if (n > 2 && t[0] == '0' && strchr("xob", t[1])) {
        u.i = 2;
        return digit_run(&u, t[1] == 'x' ? is_hex : t[1] == 'o' ? is_oct : is_bin) && u.i == n;
    }
    take_ch(&u, "+-");
    if (n - u.i == 3 && (memcmp(t + u.i, "inf", 3) == 0 || memcmp(t + u.i, "nan", 3) == 0)) return 1;
    if (next_is(&u, '0')) u.i++; /* an integer part of 0 has no more digits */
    else if (!digit_run(&u, is_digit)) return 0;
    if (u.i == n) return 1;
    if (next_is(&u, '.')) {
        u.i++;
        if (!digit_run(&u, is_digit)) return 0;
    }
    if (take_ch(&u, "eE")) {
        take_ch(&u, "+-");
        if (!digit_run(&u, is_digit)) return 0;
    }
    return u.i == n;
}

/* where toml++ ends a value it reads ahead in: whitespace, ']', '}', ',', '#' */
static int value_end(int ch) { return ch < 0 || (ch > 0 && strchr(" \t\n\v\f\r]},#", ch) != NULL); }

/* A scalar (a number, a boolean, a date and its time). value: where a value
 * stands, read as far as toml++ reads ahead in one (to a value_end; what it
 * meets on the way, a bracket or a quote, is part of it) and checked to be
 * one; else up to a delimiter, as what toml++ refuses anyway. */
static int scalar(sc *c, int value)
{
    const size_t from = c->i;
    while (c->i < c->n) {
        const int ch = peek(c);
        if (value ? !value_end(ch) : ch == '.' || !delimiter(ch)) wide(c), c->i++;
        else break;
    }
    if (c->i == from) { /* a stray byte: toml++ refuses it; step over */
        if (c->i < c->n) c->i++;
        return 0;
    }
    /* a date, a space and a digit: a date-time, whose time must be whole
     * (toml++ 3.3.0 breaks its own check on one lone digit there: an abort) */
    if (c->i - from == 10 && digits(c->s + from, "dddd-dd-dd") && c->n - c->i >= 2 && c->s[c->i] == ' ' &&
        c->s[c->i + 1] >= '0' && c->s[c->i + 1] <= '9') {
        c->i++;
        if (c->n - c->i < 8 || !digits(c->s + c->i, "dd:dd:dd"))
            return fail_at(c, c->i, "a date's time after its space must be HH:MM:SS");
        while (c->i < c->n && !value_end((unsigned char)c->s[c->i])) wide(c), c->i++;
    }
    if (value && c->wide == SIZE_MAX && !toml_scalar(c->s + from, c->i - from)) {
        const size_t k = c->i - from;
        return fail_at(c, from, "'%.*s%s' is not a TOML value (a string needs quotes)", k > 40 ? 40 : (int)k, c->s + from,
                       k > 40 ? "..." : "");
    }
    return 0;
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

static int past_ascii(sc *c) { return fail_at(c, c->wide, "%s", c->why); }

enum { VALUE, AFTER, KEY };

/* The value of a key, at depth d, with all it holds; then back at the top
 * level (the caller skips the rest of its line). */
static int value(sc *c, int d)
{
    int st = VALUE, vd = d, rc;
    c->sp = 0;
    for (;;) {
        if ((rc = polled(c))) return rc;
        if (c->wide != SIZE_MAX) return past_ascii(c);
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
            if (c->sp && ch == '}' && c->kind[c->sp - 1] == '[')
                /* toml++ 3.3.0 asserts that no value starts with it (an abort) */
                return fail_at(c, at, "'}' where an array holds a value");
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
            if (ch == '"' || ch == '\'') string(c);
            else if ((rc = scalar(c, 1))) return rc;
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
                string(c); /* toml++ refuses a value without a comma before it */
            } else if ((rc = scalar(c, 0))) { /* what toml++ refuses */
                return rc;
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
                if ((rc = scalar(c, 0))) return rc;
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
    sc c = {.s = s, .n = n, .poll = poll, .ud = ud, .o = out, .err = err, .errlen = errlen, .wide = SIZE_MAX, .why = ""};
    if (n > CK_TOML_MAX_BYTES) {
        snprintf(err, errlen, "%zu bytes: more than the %zu KiB a TOML file may hold", n, CK_TOML_MAX_BYTES >> 10);
        return -1;
    }
    const char *nul = memchr(s, 0, n);
    if (nul) return fail_at(&c, (size_t)(nul - s), "a NUL byte (TOML text holds none)");
    const size_t ok = ck_json_utf8_valid(s, n);
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
            /* toml++ 3.3.0 asserts that a header's first key starts here
             * (an abort, or with NDEBUG an assumption the optimizer trusts):
             * what else it would meet is refused first */
            skip_ws(&c);
            const int first = peek(&c);
            if (first >= 0 && first != ']' && !bare(first) && first != '"' && first != '\'')
                return fail_at(&c, c.i, "a table header's key must start here, not with '%c'",
                               first >= 0x20 && first < 0x7F ? first : '?');
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
        rest_of_line(&c);
        if (c.wide != SIZE_MAX) return past_ascii(&c);
    }
    out->charge = out->keys * PER_KEY + out->values * PER_VALUE + n * PER_BYTE + BASE_CHARGE;
    return 0;
}
