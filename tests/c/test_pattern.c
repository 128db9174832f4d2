/* ckrun's pattern matcher (vm/guard/strlimits.c) against Lua's own: two
 * states, one with the stock string library and one with ckrun's find,
 * match, gmatch and gsub installed, run the same calls (a hand list of edge
 * cases, then generated patterns, subjects, init positions and replacements)
 * and every result must be the same: each value with its type, or the same
 * error message. */
#include "guard/strlimits.h"

#include <lauxlib.h>
#include <lualib.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_MAX 8192

typedef struct out {
    char s[OUT_MAX];
    size_t n;
} out;

static void put(out *o, const char *p, size_t len)
{
    for (size_t k = 0; k < len && o->n + 4 < OUT_MAX; k++) {
        unsigned char c = (unsigned char)p[k];
        if (c >= 32 && c < 127 && c != '\\')
            o->s[o->n++] = (char)c;
        else
            o->n += (size_t)snprintf(o->s + o->n, OUT_MAX - o->n, "\\%02x", c);
    }
    o->s[o->n] = 0;
}

static void puts_(out *o, const char *p) { put(o, p, strlen(p)); }

/* the values from index `from` to the top, each as type:value */
static void put_values(lua_State *L, int from, out *o)
{
    for (int k = from; k <= lua_gettop(L); k++) {
        char num[64];
        switch (lua_type(L, k)) {
        case LUA_TSTRING: {
            size_t len;
            const char *s = lua_tolstring(L, k, &len);
            puts_(o, " s:");
            put(o, s, len);
            break;
        }
        case LUA_TNUMBER:
            if (lua_isinteger(L, k))
                snprintf(num, sizeof num, " i:%lld", (long long)lua_tointeger(L, k));
            else
                snprintf(num, sizeof num, " f:%.17g", lua_tonumber(L, k));
            puts_(o, num);
            break;
        default:
            puts_(o, " ");
            puts_(o, luaL_typename(L, k));
        }
    }
}

static lua_State *new_state(int ours)
{
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    if (ours) ck_strlimits_install(L);
    /* the replacement function and table gsub is tried with, and a helper
     * that runs a gmatch loop to the end (at most 64 rounds) */
    const char *setup =
        "repl_fn = function(a, ...) if a == 'b' or a == 2 then return nil end "
        "  if a == 'c' then return false end if a == '1' then return 7 end "
        "  if a == '(' then return {} end return '<' .. tostring(a) .. select('#', ...) .. '>' end\n"
        "repl_t = { a = 'A', b = false, ['1'] = 1.5, [1] = 'one', [3] = 3, c = {}, ['('] = 'P' }\n"
        "function all(s, p, init) local r, n = {}, 0 "
        "  for a, b, c in string.gmatch(s, p, init) do n = n + 1 if n > 64 then break end "
        "    r[#r + 1] = tostring(a) .. '|' .. tostring(b) .. '|' .. tostring(c) .. '|' .. tostring(math.type(a)) end "
        "  return n, table.unpack(r) end";
    if (luaL_dostring(L, setup) != LUA_OK) {
        fprintf(stderr, "setup: %s\n", lua_tostring(L, -1));
        exit(2);
    }
    return L;
}

enum { FIND, MATCH, GMATCH, GSUB_STR, GSUB_FN, GSUB_TABLE, KINDS };
static const char *const kind_name[] = {"find", "match", "gmatch", "gsub", "gsub(fn)", "gsub(table)"};

typedef struct call {
    int kind;
    const char *s, *p, *repl;
    size_t ls, lp, lrepl;
    int has_init;
    long long init;
    int plain; /* find: 4th argument, gsub: 4th argument (n) when has_n */
    int has_n;
    long long n;
} call;

static int errors_seen, values_seen;

/* runs c in L and writes what came back (or the error) to o */
static void run(lua_State *L, const call *c, out *o)
{
    o->n = 0;
    o->s[0] = 0;
    lua_settop(L, 0);
    int nargs = 2;
    if (c->kind == GMATCH) {
        lua_getglobal(L, "all");
    } else {
        lua_getglobal(L, "string");
        lua_getfield(L, -1, c->kind == FIND ? "find" : c->kind == MATCH ? "match" : "gsub");
        lua_remove(L, -2);
    }
    lua_pushlstring(L, c->s, c->ls);
    lua_pushlstring(L, c->p, c->lp);
    if (c->kind >= GSUB_STR) {
        if (c->kind == GSUB_STR)
            lua_pushlstring(L, c->repl, c->lrepl);
        else
            lua_getglobal(L, c->kind == GSUB_FN ? "repl_fn" : "repl_t");
        nargs++;
        if (c->has_n) {
            lua_pushinteger(L, c->n);
            nargs++;
        }
    } else if (c->has_init || c->plain) {
        if (c->has_init)
            lua_pushinteger(L, c->init);
        else
            lua_pushnil(L);
        nargs++;
        if (c->kind == FIND && c->plain) {
            lua_pushboolean(L, 1);
            nargs++;
        }
    }
    if (lua_pcall(L, nargs, LUA_MULTRET, 0) != LUA_OK) {
        puts_(o, "error: ");
        puts_(o, lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
        errors_seen++;
        return;
    }
    put_values(L, 1, o);
    values_seen++;
}

static int cases, mismatches;

static void compare(lua_State *stock, lua_State *ours, const call *c)
{
    static out a, b;
    run(stock, c, &a);
    run(ours, c, &b);
    cases++;
    if (strcmp(a.s, b.s) == 0) return;
    if (++mismatches <= 20) {
        out d = {{0}, 0};
        put(&d, c->s, c->ls);
        fprintf(stderr, "MISMATCH %s subject '%s' ", kind_name[c->kind], d.s);
        d.n = 0;
        put(&d, c->p, c->lp);
        fprintf(stderr, "pattern '%s'", d.s);
        if (c->has_init) fprintf(stderr, " init %lld", c->init);
        if (c->plain) fprintf(stderr, " plain");
        if (c->kind == GSUB_STR) {
            d.n = 0;
            put(&d, c->repl, c->lrepl);
            fprintf(stderr, " repl '%s'", d.s);
        }
        if (c->has_n) fprintf(stderr, " n %lld", c->n);
        fprintf(stderr, "\n  stock:%s\n  ours: %s\n", a.s, b.s);
    }
}

/* every kind of call on subject s and pattern p, with and without init */
static void all_kinds(lua_State *stock, lua_State *ours, const char *s, size_t ls, const char *p, size_t lp)
{
    static const long long inits[] = {1, 0, 2, -1, -3, 4, 100, -100};
    for (int kind = 0; kind < KINDS; kind++) {
        call c = {kind, s, p, "[%0|%1]", ls, lp, 7, 0, 0, 0, 0, 0};
        compare(stock, ours, &c);
        if (kind <= GMATCH) {
            for (size_t k = 0; k < sizeof inits / sizeof *inits; k++) {
                c.has_init = 1;
                c.init = inits[k];
                compare(stock, ours, &c);
            }
        } else {
            c.has_n = 1;
            c.n = 1;
            compare(stock, ours, &c);
        }
        if (kind == FIND) {
            c.has_init = 0;
            c.plain = 1;
            compare(stock, ours, &c);
        }
    }
}

static const char *const edge_patterns[] = {
    "", "^", "$", "^$", "%", "a%", "[", "[]", "[]]", "[^]]", "[^]", "[a-", "[a-]", "[%", "[%]", "[%a-z]", "[a-%%]",
    "[a-c-e]", "%b", "%ba", "%bab", "%b()", "%bxx", "%f", "%fa", "%f[a", "%f[%w]", "%f[^%w]", "%f[%z]", "%f[]",
    "(", ")", "()", "(()", "(())", "(()())", "%1", "(a)%1", "(a%1)", "(a)(b)%2%1", "()%1", "%0", "(a)%2", "a$b",
    "$a", "a$", "^a", "^^a", "a^", "%z", "%Z+", "%a+", "%A+", "%c", "%C", "%d+", "%D", "%g", "%G", "%l", "%L",
    "%p", "%P", "%s*", "%S+", "%u", "%U", "%w+", "%W", "%x+", "%X", "%.", "%%", "%]", "%-", ".-", ".-$", "a-b",
    "a*", "a+", "a?", "a??", "a*?", "a-?", "[ab]*c", "[^ab]+", "(a*(.)%w(%s*))", "(h)(e)(l)(l)(o)", "a.-b.-c",
    "((a)(b)(c))", "%d%d?%d?", "[%d_]+", "x*$", "()a()", "(.-)%1", ".*%f[%d]", "%b)(", "a%bb", "*", "+a", "?",
    "-", "a**", "[^%a%d]", "[%a-]", "[-a]", "[a%-z]", "\\0", "%", "([a-z]+)=([a-z]+)", "%s*$", "^%s*(.-)%s*$",
};

static const char *const edge_subjects[] = {
    "", "a", "aaa", "ab", "abc", "aabbcc", "hello world", "  trim me  ", "k=v, x=y", "(a(b)c)", "((()", "a.b%c",
    "123abc456", "THE (quick) fox", "\t\n\v\f\r ", "a]b[c", "-a-b-", "^a$", "xxxxx", "ba", "abab", "]]]",
};

static void edge_cases(lua_State *stock, lua_State *ours)
{
    for (size_t i = 0; i < sizeof edge_patterns / sizeof *edge_patterns; i++)
        for (size_t j = 0; j < sizeof edge_subjects / sizeof *edge_subjects; j++)
            all_kinds(stock, ours, edge_subjects[j], strlen(edge_subjects[j]), edge_patterns[i],
                      strlen(edge_patterns[i]));
    /* embedded zeros in the subject and the pattern */
    all_kinds(stock, ours, "a\0b\0c", 5, "%z", 2);
    all_kinds(stock, ours, "a\0b\0c", 5, "\0b", 2);
    all_kinds(stock, ours, "a\0b\0c", 5, "[\0]", 3);
    all_kinds(stock, ours, "a\0b\0c", 5, "%f[%z]", 6);
    all_kinds(stock, ours, "a\0b\0c", 5, "(.)\0", 4);
    all_kinds(stock, ours, "\0\0", 2, "%b\0\0", 4);
    /* 33 captures: too many; nesting past the matcher's depth: too complex */
    char deep[1024], subject[512];
    memset(subject, 'a', 300);
    for (int n = 31; n <= 33; n++) {
        size_t k = 0;
        for (int i = 0; i < n; i++) deep[k++] = '(';
        deep[k++] = 'a';
        for (int i = 0; i < n; i++) deep[k++] = ')';
        all_kinds(stock, ours, subject, 10, deep, k);
    }
    for (int n = 150; n <= 250; n += 10) {
        for (int i = 0; i < n; i++) {
            deep[2 * i] = 'a';
            deep[2 * i + 1] = '?';
        }
        all_kinds(stock, ours, subject, 300, deep, 2 * (size_t)n);
        all_kinds(stock, ours, subject, (size_t)n - 5, deep, 2 * (size_t)n);
    }
    /* replacement strings */
    static const char *const repls[] = {"", "%", "%%", "x%", "%0", "%1", "%2", "%9", "%a", "<%1%1>", "%%1", "a%0b"};
    static const char *const pats[] = {"a", "(a)", "()", "(a)(b)", "", "a*", "(b)()"};
    for (size_t i = 0; i < sizeof repls / sizeof *repls; i++)
        for (size_t j = 0; j < sizeof pats / sizeof *pats; j++)
            for (long long n = -1; n <= 3; n++) {
                call c = {GSUB_STR, "abab", pats[j], repls[i], 4, strlen(pats[j]), strlen(repls[i]), 0, 0, 0, n >= 0,
                          n};
                compare(stock, ours, &c);
            }
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

/* a pattern from pieces that cover every item of the syntax, sometimes broken */
static size_t gen_pattern(char *p, size_t cap)
{
    static const char *const atoms[] = {
        "a", "b", "c", ".", "%a", "%d", "%s", "%w", "%x", "%p", "%u", "%l", "%c", "%g", "%A", "%D", "%S", "%W",
        "[ab]", "[^a-c]", "[%d_]", "[]]", "[a-]", "[%a%s]", "%(", "%.", "%%", " ", "1", "(", ")", "()", "%1",
        "%2", "%b()", "%bab", "%f[%w]", "%f[^a]", "%f[%z]", "x", "-", "$", "^"};
    static const char *const quants[] = {"", "", "", "*", "+", "-", "?"};
    size_t n = 0;
    if (rnd(4) == 0) p[n++] = '^';
    int items = (int)rnd(7);
    for (int i = 0; i < items && n + 16 < cap; i++) {
        const char *a = atoms[rnd(sizeof atoms / sizeof *atoms)];
        size_t la = strlen(a);
        memcpy(p + n, a, la);
        n += la;
        if (la == 1 && strchr("()$^", a[0])) continue;
        if (a[0] == '%' && strchr("bf12", a[1])) continue;
        const char *q = quants[rnd(sizeof quants / sizeof *quants)];
        memcpy(p + n, q, strlen(q));
        n += strlen(q);
    }
    if (rnd(5) == 0) p[n++] = '$';
    if (rnd(30) == 0) p[n++] = "%[()"[rnd(4)]; /* a dangling character */
    if (rnd(40) == 0 && n) n = rnd((unsigned)n); /* cut anywhere */
    return n;
}

static size_t gen_subject(char *s, size_t cap)
{
    static const char alphabet[] = "aaabbbccc  ()1_A.%x-";
    size_t n = rnd(24);
    if (n > cap) n = cap;
    for (size_t k = 0; k < n; k++) s[k] = rnd(50) == 0 ? '\0' : alphabet[rnd(sizeof alphabet - 1)];
    return n;
}

static void generated(lua_State *stock, lua_State *ours, int count)
{
    static const char *const repls[] = {"%0", "%1", "<%1|%2>", "x", "%%", "%", "%3", ""};
    char p[128], s[32];
    for (int i = 0; i < count; i++) {
        call c = {0};
        c.kind = (int)rnd(KINDS);
        c.lp = gen_pattern(p, sizeof p);
        c.ls = gen_subject(s, sizeof s);
        c.p = p;
        c.s = s;
        c.repl = repls[rnd(sizeof repls / sizeof *repls)];
        c.lrepl = strlen(c.repl);
        if (rnd(2)) {
            c.has_init = 1;
            c.init = (long long)rnd(60) - 30;
        }
        c.plain = c.kind == FIND && rnd(6) == 0;
        if (rnd(3) == 0) {
            c.has_n = 1;
            c.n = (long long)rnd(5) - 1;
        }
        compare(stock, ours, &c);
    }
}

int main(int argc, char **argv)
{
    int count = argc > 1 ? atoi(argv[1]) : 30000;
    lua_State *stock = new_state(0), *ours = new_state(1);
    static const char *const names[] = {"find", "match", "gmatch", "gsub"};
    for (int k = 0; k < 4; k++) {
        lua_getglobal(stock, "string");
        lua_getfield(stock, -1, names[k]);
        lua_getglobal(ours, "string");
        lua_getfield(ours, -1, names[k]);
        if (lua_tocfunction(stock, -1) == lua_tocfunction(ours, -1)) {
            fprintf(stderr, "string.%s is Lua's own in both states\n", names[k]);
            return 1;
        }
        lua_settop(stock, 0);
        lua_settop(ours, 0);
    }
    edge_cases(stock, ours);
    int hand = cases;
    generated(stock, ours, count);
    printf("%d cases (%d by hand, %d generated): %d gave values, %d errors, %d mismatches\n", cases, hand,
           cases - hand, values_seen / 2, errors_seen / 2, mismatches);
    /* a differential test that compares nothing would pass: require both kinds */
    int ok = mismatches == 0 && values_seen > cases && errors_seen > 200;
    lua_close(stock);
    lua_close(ours);
    return ok ? 0 : 1;
}
