/* Lua patterns matched by a backtracking matcher of ckrun's own, written from
 * the manual (section 6.4.1), that counts its steps and charges them to the
 * VM's limits every CHARGE_EVERY steps: a pattern such as ".-.-.-.-b" on a
 * long subject runs for hours in Lua's C matcher, out of the count hook's
 * sight. The string builders (string.rep, string.format, table.concat) refuse
 * a result past the Lua heap limit before building it and charge long builds;
 * table.sort of big tables charges as it sorts; the rest of Lua's functions
 * that do a lot in one call charge it first. Errors raise at the calling
 * script line, like Lua's. */
#define _GNU_SOURCE /* memmem */
#include "guard/strlimits.h"
#include "guard/runlimits.h"
#include "ck.h"

#include <lauxlib.h>
#include <lualib.h>

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#define MAX_CAPTURES 32
/* nested calls of the matcher (captures, quantifiers trying what follows);
 * beyond it "pattern too complex", as in Lua */
#define MAX_DEPTH 200
/* steps (one matcher call, one character tried) between two charges */
#define CHARGE_EVERY 4096
/* bytes a builder copies per unit of work charged, and per check */
#define BYTES_PER_UNIT 16
#define BUILD_CHUNK ((size_t)1 << 20)

enum { CAP_OPEN = -1, CAP_POSITION = -2 };

typedef struct matcher {
    lua_State *L;
    const char *src, *src_end; /* the subject; *src_end is its terminating 0 */
    const char *pat, *pat_end;
    int depth; /* calls left before "pattern too complex" */
    int ncap;
    long long steps; /* not yet charged */
    struct {
        const char *at;
        ptrdiff_t len; /* or CAP_OPEN, CAP_POSITION */
    } cap[MAX_CAPTURES];
} matcher;

static void charge(matcher *m)
{
    long long n = m->steps;
    m->steps = 0;
    ck_limits_charge(m->L, n);
}

static inline void step(matcher *m)
{
    if (++m->steps >= CHARGE_EVERY) charge(m);
}

static void matcher_init(matcher *m, lua_State *L, const char *s, size_t ls, const char *p, size_t lp)
{
    m->L = L;
    m->src = s;
    m->src_end = s + ls;
    m->pat = p;
    m->pat_end = p + lp;
    m->steps = 0;
}

/* whether byte c is in class letter cl (%a, %d, ...; upper case: the
 * complement); any other character stands for itself */
static int in_class(unsigned char c, unsigned char cl)
{
    int r;
    switch (tolower(cl)) {
    case 'a': r = isalpha(c); break;
    case 'c': r = iscntrl(c); break;
    case 'd': r = isdigit(c); break;
    case 'g': r = isgraph(c); break;
    case 'l': r = islower(c); break;
    case 'p': r = ispunct(c); break;
    case 's': r = isspace(c); break;
    case 'u': r = isupper(c); break;
    case 'w': r = isalnum(c); break;
    case 'x': r = isxdigit(c); break;
    case 'z': r = c == 0; break; /* still accepted by Lua 5.4, undocumented */
    default: return cl == c;
    }
    r = r != 0;
    return isupper(cl) ? !r : r;
}

/* whether c is in the set that opens with '[' at p and closes with ']' at close */
static int in_set(unsigned char c, const char *p, const char *close)
{
    int want = 1;
    p++;
    if (*p == '^') {
        want = 0;
        p++;
    }
    while (p < close) {
        if (*p == '%') {
            if (in_class(c, (unsigned char)p[1])) return want;
            p += 2;
        } else if (p[1] == '-' && p + 2 < close) {
            if ((unsigned char)p[0] <= c && c <= (unsigned char)p[2]) return want;
            p += 3;
        } else {
            if ((unsigned char)*p == c) return want;
            p++;
        }
    }
    return !want;
}

/* the end of the single-character class at p (p < pat_end) */
static const char *class_end(matcher *m, const char *p)
{
    char c = *p++;
    if (c == '%') {
        if (p >= m->pat_end) luaL_error(m->L, "malformed pattern (ends with '%%')");
        return p + 1;
    }
    if (c != '[') return p;
    if (p < m->pat_end && *p == '^') p++;
    /* the first item is part of the set even when it is ']' */
    for (;;) {
        if (p >= m->pat_end) break;
        p += *p == '%' ? 2 : 1;
        if (p >= m->pat_end) break;
        if (*p == ']') return p + 1;
    }
    luaL_error(m->L, "malformed pattern (missing ']')");
    return NULL;
}

/* whether the subject's byte at s (s < src_end) is in the class p..ep */
static int one(const char *s, const char *p, const char *ep)
{
    unsigned char c = (unsigned char)*s;
    switch (*p) {
    case '.': return 1;
    case '%': return in_class(c, (unsigned char)p[1]);
    case '[': return in_set(c, p, ep - 1);
    default: return (unsigned char)*p == c;
    }
}

static const char *match(matcher *m, const char *s, const char *p);

static const char *sub_match(matcher *m, const char *s, const char *p)
{
    if (m->depth-- == 0) luaL_error(m->L, "pattern too complex");
    const char *r = match(m, s, p);
    m->depth++;
    return r;
}

/* the longest run of the class p..ep from s, then shorter ones, each
 * followed by the rest of the pattern */
static const char *longest(matcher *m, const char *s, const char *p, const char *ep)
{
    ptrdiff_t n = 0;
    while (s + n < m->src_end && one(s + n, p, ep)) {
        n++;
        step(m);
    }
    for (; n >= 0; n--) {
        const char *r = sub_match(m, s + n, ep + 1);
        if (r) return r;
    }
    return NULL;
}

/* the shortest run first, one more character of the class at a time */
static const char *shortest(matcher *m, const char *s, const char *p, const char *ep)
{
    for (;;) {
        const char *r = sub_match(m, s, ep + 1);
        if (r) return r;
        if (s < m->src_end && one(s, p, ep))
            s++;
        else
            return NULL;
    }
}

static const char *open_capture(matcher *m, const char *s, const char *p, ptrdiff_t what)
{
    if (m->ncap >= MAX_CAPTURES) luaL_error(m->L, "too many captures");
    m->cap[m->ncap].at = s;
    m->cap[m->ncap].len = what;
    m->ncap++;
    const char *r = sub_match(m, s, p);
    if (!r) m->ncap--;
    return r;
}

static const char *close_capture(matcher *m, const char *s, const char *p)
{
    int k = m->ncap - 1;
    while (k >= 0 && m->cap[k].len != CAP_OPEN) k--;
    if (k < 0) luaL_error(m->L, "invalid pattern capture");
    m->cap[k].len = s - m->cap[k].at;
    const char *r = sub_match(m, s, p);
    if (!r) m->cap[k].len = CAP_OPEN;
    return r;
}

/* %bxy at s; p points past "%b" */
static const char *balanced(matcher *m, const char *s, const char *p)
{
    if (m->pat_end - p < 2) luaL_error(m->L, "malformed pattern (missing arguments to '%%b')");
    if (s >= m->src_end || *s != p[0]) return NULL;
    int depth = 1;
    while (++s < m->src_end) {
        step(m);
        if (*s == p[1]) {
            if (--depth == 0) return s + 1;
        } else if (*s == p[0]) {
            depth++;
        }
    }
    return NULL;
}

/* %1-%9 at s: the text of that closed capture again */
static const char *back_reference(matcher *m, const char *s, char digit)
{
    int k = digit - '1';
    if (k < 0 || k >= m->ncap || m->cap[k].len == CAP_OPEN)
        luaL_error(m->L, "invalid capture index %%%d", k + 1);
    ptrdiff_t len = m->cap[k].len;
    if (len == CAP_POSITION) return NULL; /* Lua's never matches either */
    m->steps += len / BYTES_PER_UNIT;
    if (m->src_end - s >= len && memcmp(m->cap[k].at, s, (size_t)len) == 0) return s + len;
    return NULL;
}

/* the end of a match of p..pat_end at s, or NULL; items that need no
 * backtracking loop here, the others recurse through sub_match */
static const char *match(matcher *m, const char *s, const char *p)
{
    for (;;) {
        step(m);
        if (p == m->pat_end) return s;
        switch (*p) {
        case '(':
            if (p + 1 < m->pat_end && p[1] == ')') return open_capture(m, s, p + 2, CAP_POSITION);
            return open_capture(m, s, p + 1, CAP_OPEN);
        case ')':
            return close_capture(m, s, p + 1);
        case '$':
            if (p + 1 == m->pat_end) return s == m->src_end ? s : NULL;
            break;
        case '%':
            if (p + 1 == m->pat_end) break; /* class_end reports it */
            if (p[1] == 'b') {
                s = balanced(m, s, p + 2);
                if (!s) return NULL;
                p += 4;
                continue;
            }
            if (p[1] == 'f') {
                p += 2;
                if (p == m->pat_end || *p != '[') luaL_error(m->L, "missing '[' after '%%f' in pattern");
                const char *ep = class_end(m, p);
                unsigned char before = s == m->src ? 0 : (unsigned char)s[-1];
                unsigned char here = s < m->src_end ? (unsigned char)*s : 0;
                if (in_set(before, p, ep - 1) || !in_set(here, p, ep - 1)) return NULL;
                p = ep;
                continue;
            }
            if (isdigit((unsigned char)p[1])) {
                s = back_reference(m, s, p[1]);
                if (!s) return NULL;
                p += 2;
                continue;
            }
            break;
        }
        const char *ep = class_end(m, p);
        int hit = s < m->src_end && one(s, p, ep);
        char q = ep < m->pat_end ? *ep : 0;
        if (q == '?') {
            if (hit) {
                const char *r = sub_match(m, s + 1, ep + 1);
                if (r) return r;
            }
            p = ep + 1;
        } else if (q == '+') {
            return hit ? longest(m, s + 1, p, ep) : NULL;
        } else if (q == '*') {
            return longest(m, s, p, ep);
        } else if (q == '-') {
            return shortest(m, s, p, ep);
        } else {
            if (!hit) return NULL;
            s++;
            p = ep;
        }
    }
}

/* one attempt at s with fresh captures */
static const char *match_at(matcher *m, const char *s, const char *p)
{
    m->ncap = 0;
    m->depth = MAX_DEPTH;
    return sub_match(m, s, p);
}

/* pushes capture k of the match s..e (the whole match when there are none) */
static void push_capture(matcher *m, int k, const char *s, const char *e)
{
    if (k >= m->ncap) {
        if (k != 0) luaL_error(m->L, "invalid capture index %%%d", k + 1);
        lua_pushlstring(m->L, s, (size_t)(e - s));
    } else if (m->cap[k].len == CAP_OPEN) {
        luaL_error(m->L, "unfinished capture");
    } else if (m->cap[k].len == CAP_POSITION) {
        lua_pushinteger(m->L, m->cap[k].at - m->src + 1);
    } else {
        lua_pushlstring(m->L, m->cap[k].at, (size_t)m->cap[k].len);
    }
}

/* pushes the captures, or the whole match s..e when there are none and s is
 * given; returns how many */
static int push_captures(matcher *m, const char *s, const char *e)
{
    int n = m->ncap == 0 && s ? 1 : m->ncap;
    luaL_checkstack(m->L, n, "too many captures");
    for (int k = 0; k < n; k++) push_capture(m, k, s, e);
    return n;
}

/* a 1-based position, negative from the end, as an offset from the start */
static size_t start_offset(lua_Integer pos, size_t len)
{
    if (pos > 0) return (size_t)pos - 1;
    if (pos == 0 || pos < -(lua_Integer)len) return 0;
    return len + (size_t)pos;
}

static int has_specials(const char *p, size_t lp)
{
    for (size_t k = 0; k < lp; k++)
        if (p[k] && strchr("^$*+?.([%-", p[k])) return 1;
    return 0;
}

/* the first occurrence of needle in hay, searched a window at a time so that
 * the limits are charged between windows */
static const char *plain_find(lua_State *L, const char *hay, size_t lh, const char *needle, size_t ln)
{
    if (ln == 0) return hay;
    if (ln > lh) return NULL;
    size_t window = ln > BUILD_CHUNK ? ln : BUILD_CHUNK;
    for (size_t at = 0; at + ln <= lh; at += window) {
        size_t span = lh - at < window + ln - 1 ? lh - at : window + ln - 1;
        const char *r = memmem(hay + at, span, needle, ln);
        if (r) return r;
        ck_limits_charge(L, (long long)(span / BYTES_PER_UNIT));
    }
    return NULL;
}

static int find_or_match(lua_State *L, int find)
{
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_offset(luaL_optinteger(L, 3, 1), ls);
    if (init > ls) {
        luaL_pushfail(L);
        return 1;
    }
    if (find && (lua_toboolean(L, 4) || !has_specials(p, lp))) {
        const char *at = plain_find(L, s + init, ls - init, p, lp);
        if (!at) {
            luaL_pushfail(L);
            return 1;
        }
        lua_pushinteger(L, at - s + 1);
        lua_pushinteger(L, (lua_Integer)(at - s + lp));
        return 2;
    }
    int anchored = lp > 0 && *p == '^';
    if (anchored) {
        p++;
        lp--;
    }
    matcher m;
    matcher_init(&m, L, s, ls, p, lp);
    const char *t = s + init;
    do {
        const char *e = match_at(&m, t, p);
        if (e) {
            if (!find) return push_captures(&m, t, e);
            lua_pushinteger(L, t - s + 1);
            lua_pushinteger(L, e - s);
            return push_captures(&m, NULL, NULL) + 2;
        }
        t++;
    } while (t <= m.src_end && !anchored);
    luaL_pushfail(L);
    return 1;
}

static int s_find(lua_State *L) { return find_or_match(L, 1); }
static int s_match(lua_State *L) { return find_or_match(L, 0); }

typedef struct gmatch_state {
    const char *next; /* where the next search starts */
    const char *last; /* the end of the last match: an empty match there is skipped */
    matcher m;
} gmatch_state;

static int gmatch_next(lua_State *L)
{
    gmatch_state *g = lua_touserdata(L, lua_upvalueindex(3));
    g->m.L = L; /* the iterator may run in another coroutine than gmatch did */
    for (const char *t = g->next; t <= g->m.src_end; t++) {
        const char *e = match_at(&g->m, t, g->m.pat);
        if (e && e != g->last) {
            g->next = g->last = e;
            return push_captures(&g->m, t, e);
        }
    }
    return 0;
}

/* string.gmatch(s, pattern [, init]); '^' is no anchor here, as in Lua 5.4 */
static int s_gmatch(lua_State *L)
{
    size_t ls, lp;
    const char *s = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    size_t init = start_offset(luaL_optinteger(L, 3, 1), ls);
    if (init > ls) init = ls + 1;
    lua_settop(L, 2);
    gmatch_state *g = lua_newuserdatauv(L, sizeof *g, 0);
    matcher_init(&g->m, L, s, ls, p, lp);
    g->next = s + init;
    g->last = NULL;
    lua_pushcclosure(L, gmatch_next, 3);
    return 1;
}

/* appends repl with %0-%9 and %% replaced for the match s..e */
static void add_replacement(matcher *m, luaL_Buffer *b, const char *s, const char *e, int repl)
{
    lua_State *L = m->L;
    size_t lr;
    const char *r = lua_tolstring(L, repl, &lr);
    const char *end = r + lr;
    m->steps += (long long)(lr / BYTES_PER_UNIT);
    while (r < end) {
        const char *pc = memchr(r, '%', (size_t)(end - r));
        if (!pc) {
            luaL_addlstring(b, r, (size_t)(end - r));
            return;
        }
        luaL_addlstring(b, r, (size_t)(pc - r));
        char c = pc + 1 < end ? pc[1] : 0;
        if (c == '%') {
            luaL_addchar(b, '%');
        } else if (c == '0') {
            luaL_addlstring(b, s, (size_t)(e - s));
        } else if (isdigit((unsigned char)c)) {
            push_capture(m, c - '1', s, e);
            luaL_tolstring(L, -1, NULL);
            lua_remove(L, -2);
            luaL_addvalue(b);
        } else {
            luaL_error(L, "invalid use of '%%' in replacement string");
        }
        r = pc + 2;
    }
}

/* appends what replaces the match s..e; returns whether it differs from it */
static int add_value(matcher *m, luaL_Buffer *b, const char *s, const char *e, int how)
{
    lua_State *L = m->L;
    if (how == LUA_TFUNCTION) {
        lua_pushvalue(L, 3);
        int n = push_captures(m, s, e);
        lua_call(L, n, 1);
    } else if (how == LUA_TTABLE) {
        push_capture(m, 0, s, e);
        lua_gettable(L, 3);
    } else {
        add_replacement(m, b, s, e, 3);
        return 1;
    }
    if (!lua_toboolean(L, -1)) {
        lua_pop(L, 1);
        luaL_addlstring(b, s, (size_t)(e - s));
        return 0;
    }
    if (!lua_isstring(L, -1)) return luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    luaL_addvalue(b);
    return 1;
}

static int s_gsub(lua_State *L)
{
    size_t ls, lp;
    const char *src = luaL_checklstring(L, 1, &ls);
    const char *p = luaL_checklstring(L, 2, &lp);
    int how = lua_type(L, 3);
    lua_Integer most = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
    luaL_argexpected(L, how == LUA_TNUMBER || how == LUA_TSTRING || how == LUA_TFUNCTION || how == LUA_TTABLE, 3,
                     "string/function/table");
    int anchored = lp > 0 && *p == '^';
    if (anchored) {
        p++;
        lp--;
    }
    matcher m;
    matcher_init(&m, L, src, ls, p, lp);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    const char *s = src, *last = NULL;
    lua_Integer n = 0;
    int changed = 0;
    while (n < most) {
        const char *e = match_at(&m, s, p);
        if (e && e != last) {
            n++;
            changed |= add_value(&m, &b, s, e, how);
            s = last = e;
        } else if (s < m.src_end) {
            luaL_addchar(&b, *s++);
        } else {
            break;
        }
        if (anchored) break;
    }
    if (!changed) {
        lua_pushvalue(L, 1);
    } else {
        luaL_addlstring(&b, s, (size_t)(m.src_end - s));
        luaL_pushresult(&b);
    }
    lua_pushinteger(L, n);
    return 2;
}

/* ---- the builders ---- */

static void size_text(double n, char *buf, size_t len)
{
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (n >= 1023.95 && u < 6) { /* 1023.99 GiB reads 1.0 TiB */
        n /= 1024;
        u++;
    }
    if (u == 0 || n == (double)(long long)n)
        snprintf(buf, len, "%.0f %s", n, unit[u]);
    else
        snprintf(buf, len, "%.1f %s", n, unit[u]);
}

/* raises "file:line: what: out of memory: a result of ..." with the status
 * of a memory error (CK_EMEM for the host) */
static void refuse(lua_State *L, const char *what, const char *detail)
{
    luaL_where(L, 1);
    lua_pushfstring(L, "%s: out of memory: %s", what, detail);
    lua_concat(L, 2);
    ck_limits_note(L, CK_EMEM);
    lua_error(L);
}

/* refuses a result of size bytes (a double: it may pass SIZE_MAX) that the
 * heap limit cannot hold, counting `copies` of it alive at once while it is
 * built (a buffer and the string made from it) */
static void check_result(lua_State *L, const char *what, double size, int copies)
{
    ck_limits *lim = ck_limits_of(L);
    char a[64], c[64], msg[400];
    size_text(size, a, sizeof a);
    if (!lim || !lim->heap_limit) {
        if (size >= (double)(LUA_MAXINTEGER < (lua_Integer)(~(size_t)0 / 2) ? LUA_MAXINTEGER : ~(size_t)0 / 2)) {
            snprintf(msg, sizeof msg, "a result of %s is too large", a);
            refuse(L, what, msg);
        }
        return;
    }
    double limit = (double)lim->heap_limit;
    size_text(limit, c, sizeof c);
    if (size > limit) {
        snprintf(msg, sizeof msg, "a result of %s passes the Lua heap limit of %s", a, c);
        refuse(L, what, msg);
    }
    double need = size * copies;
    if ((double)lim->heap_used + need <= limit) return;
    lua_gc(L, LUA_GCCOLLECT, 0);
    if ((double)lim->heap_used + need <= limit) return;
    char u[64], nd[64];
    size_text((double)lim->heap_used, u, sizeof u);
    size_text(need, nd, sizeof nd);
    snprintf(msg, sizeof msg, "a result of %s needs %s to build, which passes the Lua heap limit of %s (%s in use)",
             a, nd, c, u);
    refuse(L, what, msg);
}

/* string.rep(s, n [, sep]): the first s..sep is written once, the rest
 * copied from what is already built, a chunk at a time */
static int s_rep(lua_State *L)
{
    size_t l, lsep;
    const char *s = luaL_checklstring(L, 1, &l);
    lua_Integer n = luaL_checkinteger(L, 2);
    const char *sep = luaL_optlstring(L, 3, "", &lsep);
    if (n <= 0 || l + lsep == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    double want = (double)n * (double)l + (double)(n - 1) * (double)lsep;
    check_result(L, "string.rep", want, 2);
    size_t total = (size_t)n * l + (size_t)(n - 1) * lsep;
    luaL_Buffer b;
    char *out = luaL_buffinitsize(L, &b, total);
    size_t period = l + lsep;
    memcpy(out, s, l);
    size_t have = l;
    if (n > 1) {
        memcpy(out + l, sep, lsep);
        have = period < total ? period : total;
    }
    /* the result is periodic: out[i] == out[i - d] for d a multiple of period */
    while (have < total) {
        size_t d = have / period * period;
        size_t k = total - have;
        if (k > d) k = d;
        if (k > BUILD_CHUNK) k = BUILD_CHUNK;
        memcpy(out + have, out + have - d, k);
        have += k;
        ck_limits_charge(L, (long long)(k / BYTES_PER_UNIT));
    }
    luaL_pushresultsize(&b, total);
    return 1;
}

/* string.format: a lower bound on the result from the format and the string
 * arguments is checked against the heap limit, then Lua's own format runs in
 * this call's frame (so its errors name the script line and string.format) */
static int s_format(lua_State *L)
{
    size_t lf;
    const char *f = luaL_checklstring(L, 1, &lf);
    const char *end = f + lf;
    int arg = 1, top = lua_gettop(L);
    double least = 0;
    while (f < end) {
        if (*f != '%') {
            least++;
            f++;
            continue;
        }
        if (++f >= end) break;
        if (*f == '%') {
            least++;
            f++;
            continue;
        }
        arg++;
        while (f < end && strchr("-+ #0", *f)) f++;
        double width = 0, precision = -1;
        while (f < end && isdigit((unsigned char)*f)) width = width * 10 + (*f++ - '0');
        if (f < end && *f == '.') {
            f++;
            precision = 0;
            while (f < end && isdigit((unsigned char)*f)) precision = precision * 10 + (*f++ - '0');
        }
        if (f >= end) break;
        char conv = *f++;
        double item = 1;
        if (arg <= top && lua_type(L, arg) == LUA_TSTRING && (conv == 's' || conv == 'q')) {
            item = (double)lua_rawlen(L, arg);
            if (conv == 'q') item += 2;
            else if (precision >= 0 && precision < item) item = precision;
        }
        least += width > item ? width : item;
    }
    if (least > (double)BUILD_CHUNK) {
        check_result(L, "string.format", least, 2);
        ck_limits_charge(L, (long long)(least / BYTES_PER_UNIT));
    }
    lua_CFunction stock = lua_tocfunction(L, lua_upvalueindex(1));
    return stock(L);
}

/* table.concat(list [, sep [, i [, j]]]), reading list[k] as Lua does
 * (through __index). A list without a metatable is measured first, without
 * running any Lua code, and refused before anything is built when the result
 * passes the heap limit; others are refused as soon as what is built does. */
static int t_concat(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TTABLE) { /* a proxy with __index and __len will do */
        int ok = 0;
        if (lua_getmetatable(L, 1)) {
            lua_pushliteral(L, "__index");
            ok = lua_rawget(L, -2) != LUA_TNIL;
            lua_pushliteral(L, "__len");
            ok = lua_rawget(L, -3) != LUA_TNIL && ok;
            lua_pop(L, 3);
        }
        if (!ok) luaL_checktype(L, 1, LUA_TTABLE);
    }
    lua_Integer last = luaL_len(L, 1);
    size_t lsep;
    const char *sep = luaL_optlstring(L, 2, "", &lsep);
    lua_Integer first = luaL_optinteger(L, 3, 1);
    last = luaL_optinteger(L, 4, last);
    luaL_Buffer b;
    if (first > last) {
        lua_pushliteral(L, "");
        return 1;
    }
    double size = 0;
    int raw = lua_type(L, 1) == LUA_TTABLE;
    if (raw && lua_getmetatable(L, 1)) {
        lua_pop(L, 1);
        raw = 0;
    }
    if (raw) {
        long long work = 0;
        for (lua_Integer k = first;; k++) {
            lua_rawgeti(L, 1, k);
            size_t len;
            if (!lua_isstring(L, -1)) {
                lua_pop(L, 1);
                break; /* the build below reports it at its index */
            }
            lua_tolstring(L, -1, &len);
            lua_pop(L, 1);
            size += (double)len + (k < last ? (double)lsep : 0);
            if (++work % CHARGE_EVERY == 0) {
                ck_limits_charge(L, CHARGE_EVERY);
                if (size > (double)BUILD_CHUNK) check_result(L, "table.concat", size, 2);
            }
            if (k == last) break;
        }
        check_result(L, "table.concat", size, 2);
    }
    if (raw && size <= (double)~(size_t)0)
        luaL_buffinitsize(L, &b, (size_t)size);
    else
        luaL_buffinit(L, &b);
    double built = 0;
    long long pending = 0;
    for (lua_Integer k = first;; k++) {
        lua_geti(L, 1, k);
        if (!lua_isstring(L, -1))
            return luaL_error(L, "invalid value (at index %I) in table for 'concat'", (LUAI_UACINT)k);
        size_t len;
        lua_tolstring(L, -1, &len);
        built += (double)len + (k < last ? (double)lsep : 0);
        pending += 1 + (long long)(len / BYTES_PER_UNIT);
        /* the buffer is in the heap already: one more copy, the string */
        if (!raw && built > (double)BUILD_CHUNK) check_result(L, "table.concat", built, 1);
        luaL_addvalue(&b);
        if (k == last) break;
        luaL_addlstring(&b, sep, lsep);
        if (pending >= CHARGE_EVERY) {
            ck_limits_charge(L, pending);
            pending = 0;
        }
    }
    luaL_pushresult(&b);
    return 1;
}

/* Functions of Lua's that build or move a lot in one C call, which the count
 * hook sees as one instruction: a loop of them on big strings or tables would
 * run hundreds of calls between two hooks. Each charges what it is about to
 * do, then Lua's own function runs in this call's frame (its errors name the
 * script line as before). */
enum cost {
    COST_STRING,  /* string.upper, lower, reverse: the length of s */
    COST_SUB,     /* string.sub(s, i, j): the bytes it copies */
    COST_BYTE,    /* string.byte(s, i, j): the values it pushes */
    COST_ARGS,    /* string.char, utf8.char: one per argument */
    COST_PACK,    /* string.pack: the sizes its format names, its string arguments */
    COST_UNPACK,  /* table.unpack(t, i, j): the values it pushes */
    COST_INSERT,  /* table.insert(t, pos, v): the elements moved up */
    COST_REMOVE,  /* table.remove(t, pos): the elements moved down */
    COST_MOVE,    /* table.move(a1, f, e, t): the elements moved */
};

/* j as an end position in a string of length l (1-based, negative from the end) */
static size_t end_position(lua_Integer j, size_t l)
{
    if (j > (lua_Integer)l) return l;
    if (j >= 0) return (size_t)j;
    if (j < -(lua_Integer)l) return 0;
    return l + (size_t)j + 1;
}

/* argument a as an integer (floats with an integral value too), or dflt */
static lua_Integer int_or(lua_State *L, int a, lua_Integer dflt)
{
    int is;
    lua_Integer v = lua_tointegerx(L, a, &is);
    return is && lua_type(L, a) == LUA_TNUMBER ? v : dflt;
}

/* the work of the call on the stack as cost kind k; reads no metamethods */
static double cost_of(lua_State *L, int k)
{
    size_t l = 0;
    int top = lua_gettop(L);
    if (k <= COST_BYTE) {
        if (lua_type(L, 1) != LUA_TSTRING) return 0; /* numbers are short; the function reports the rest */
        lua_tolstring(L, 1, &l);
    }
    switch (k) {
    case COST_STRING:
        return (double)l / BYTES_PER_UNIT;
    case COST_SUB:
    case COST_BYTE: {
        lua_Integer i = int_or(L, 2, 1);
        size_t from = start_offset(i, l);
        size_t to = end_position(int_or(L, 3, k == COST_SUB ? -1 : i), l);
        double n = to > from ? (double)(to - from) : 0;
        return k == COST_SUB ? n / BYTES_PER_UNIT : n;
    }
    case COST_ARGS:
        return top;
    case COST_PACK: {
        double n = top;
        size_t lf;
        const char *f = lua_type(L, 1) == LUA_TSTRING ? lua_tolstring(L, 1, &lf) : NULL;
        for (size_t at = 0; f && at < lf; at++) {
            double v = 0;
            while (at < lf && isdigit((unsigned char)f[at])) v = v * 10 + (f[at++] - '0');
            n += v;
        }
        for (int a = 2; a <= top; a++)
            if (lua_type(L, a) == LUA_TSTRING) n += (double)lua_rawlen(L, a);
        return n / BYTES_PER_UNIT;
    }
    case COST_UNPACK: {
        lua_Integer i = int_or(L, 2, 1);
        lua_Integer j = int_or(L, 3, lua_type(L, 1) == LUA_TTABLE ? (lua_Integer)lua_rawlen(L, 1) : i);
        return j >= i ? (double)j - (double)i + 1 : 0;
    }
    case COST_INSERT:
    case COST_REMOVE: {
        /* insert(t, v) and remove(t) move nothing */
        if (lua_type(L, 1) != LUA_TTABLE || top < (k == COST_INSERT ? 3 : 2)) return 0;
        double n = (double)lua_rawlen(L, 1) - (double)int_or(L, 2, LUA_MAXINTEGER);
        return n > 0 ? n : 0;
    }
    case COST_MOVE: {
        double n = (double)int_or(L, 3, 0) - (double)int_or(L, 2, 1) + 1;
        return n > 0 ? n : 0;
    }
    }
    return 0;
}

static int charged(lua_State *L)
{
    double units = cost_of(L, (int)lua_tointeger(L, lua_upvalueindex(2)));
    if (units >= 1024) ck_limits_charge(L, units > 1e15 ? (long long)1e15 : (long long)units);
    lua_CFunction stock = lua_tocfunction(L, lua_upvalueindex(1));
    return stock(L);
}

static void wrap_charged(lua_State *L, const char *name, int cost)
{
    lua_getfield(L, -1, name);
    if (!lua_tocfunction(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_pushinteger(L, cost);
    lua_pushcclosure(L, charged, 2);
    lua_setfield(L, -2, name);
}

/* table.sort: Lua's own below SORT_STOCK_MAX elements (charged before it
 * runs: n log n), which takes milliseconds; above, a heap sort of ckrun's own
 * that charges as it goes (Lua's takes 10 s for 10M numbers, out of the
 * hook's sight). Lua's order of equal elements is already unspecified there:
 * it picks pivots at random past 100 elements. */
#define SORT_STOCK_MAX ((lua_Integer)1 << 16)

/* whether the value at a sorts before the one at b */
static int sort_less(lua_State *L, int a, int b)
{
    a = lua_absindex(L, a);
    b = lua_absindex(L, b);
    if (lua_isnil(L, 2)) {
        int ta = lua_type(L, a), tb = lua_type(L, b), top = lua_gettop(L);
        if (!(ta == tb && (ta == LUA_TNUMBER || ta == LUA_TSTRING))) {
            int ordered = luaL_getmetafield(L, a, "__lt") != LUA_TNIL || luaL_getmetafield(L, b, "__lt") != LUA_TNIL;
            lua_settop(L, top);
            /* Lua's own message for values without an order has no script line */
            if (!ordered) return luaL_error(L, "attempt to compare %s with %s", luaL_typename(L, a), luaL_typename(L, b));
        }
        return lua_compare(L, a, b, LUA_OPLT);
    }
    lua_pushvalue(L, 2);
    lua_pushvalue(L, a);
    lua_pushvalue(L, b);
    lua_call(L, 2, 1);
    int r = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return r;
}

/* moves t[root] down the heap t[1..end] to where it belongs */
static void sift_down(lua_State *L, lua_Integer root, lua_Integer end, long long *work)
{
    lua_geti(L, 1, root); /* v */
    for (;;) {
        lua_Integer child = 2 * root;
        if (child > end) break;
        lua_geti(L, 1, child);
        if (child < end) {
            lua_geti(L, 1, child + 1);
            if (sort_less(L, -2, -1)) {
                lua_remove(L, -2);
                child++;
            } else {
                lua_pop(L, 1);
            }
        }
        if (!sort_less(L, -2, -1)) { /* v, the larger child */
            lua_pop(L, 1);
            break;
        }
        lua_seti(L, 1, root);
        root = child;
        if (++*work >= CHARGE_EVERY) {
            ck_limits_charge(L, *work);
            *work = 0;
        }
    }
    lua_seti(L, 1, root);
}

static int t_sort(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TTABLE) return lua_tocfunction(L, lua_upvalueindex(1))(L);
    lua_Integer n = luaL_len(L, 1);
    if (n <= SORT_STOCK_MAX) {
        if (n > 1024) ck_limits_charge(L, (long long)n * 17);
        lua_CFunction stock = lua_tocfunction(L, lua_upvalueindex(1));
        return stock(L);
    }
    luaL_argcheck(L, n < INT_MAX, 1, "array too big");
    if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    long long work = 0;
    for (lua_Integer i = n / 2; i >= 1; i--) sift_down(L, i, n, &work);
    for (lua_Integer end = n; end > 1; end--) {
        lua_geti(L, 1, 1);
        lua_geti(L, 1, end);
        lua_seti(L, 1, 1);
        lua_seti(L, 1, end);
        sift_down(L, 1, end - 1, &work);
    }
    return 0;
}

static void set_fn(lua_State *L, const char *name, lua_CFunction fn, int keep_stock)
{
    if (keep_stock) lua_getfield(L, -1, name);
    lua_pushcclosure(L, fn, keep_stock);
    lua_setfield(L, -2, name);
}

void ck_strlimits_install(lua_State *L)
{
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    if (lua_getfield(L, -1, LUA_STRLIBNAME) == LUA_TTABLE) {
        set_fn(L, "find", s_find, 0);
        set_fn(L, "match", s_match, 0);
        set_fn(L, "gmatch", s_gmatch, 0);
        set_fn(L, "gsub", s_gsub, 0);
        set_fn(L, "rep", s_rep, 0);
        lua_getfield(L, -1, "format");
        int stock = lua_tocfunction(L, -1) != NULL;
        lua_pop(L, 1);
        if (stock) set_fn(L, "format", s_format, 1);
        wrap_charged(L, "upper", COST_STRING);
        wrap_charged(L, "lower", COST_STRING);
        wrap_charged(L, "reverse", COST_STRING);
        wrap_charged(L, "sub", COST_SUB);
        wrap_charged(L, "byte", COST_BYTE);
        wrap_charged(L, "char", COST_ARGS);
        wrap_charged(L, "pack", COST_PACK);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, -1, LUA_TABLIBNAME) == LUA_TTABLE) {
        set_fn(L, "concat", t_concat, 0);
        wrap_charged(L, "unpack", COST_UNPACK);
        wrap_charged(L, "insert", COST_INSERT);
        wrap_charged(L, "remove", COST_REMOVE);
        wrap_charged(L, "move", COST_MOVE);
        set_fn(L, "sort", t_sort, 1);
    }
    lua_pop(L, 1);
    if (lua_getfield(L, -1, LUA_UTF8LIBNAME) == LUA_TTABLE) wrap_charged(L, "char", COST_ARGS);
    lua_pop(L, 2);
}
