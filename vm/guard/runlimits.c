/* Limits on one VM's scripts: the Lua heap cap (an allocator that refuses
 * growth past it, so Lua raises a clean "not enough memory"), the instruction
 * budget of callbacks and the interrupt flag (a count hook). Errors of the
 * last two cannot be swallowed: once raised, the hook raises them again at the
 * next instruction until the call returns to the host. */
#include "guard/runlimits.h"
#include "guard/host.h"
#include "ck.h"
#include "util/where.h"
#include "util/text.h"

#include <lauxlib.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void hook(lua_State *L, lua_Debug *ar);

/* growth of at least this much is a big build (a string `..` makes, a table
 * resize): see ck_limits_alloc */
#define CK_BIG_GROWTH ((size_t)1 << 20)

void *ck_limits_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    ck_limits *lim = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        lim->alloc(lim->alloc_ud, ptr, osize, 0);
        lim->heap_used -= old;
        return NULL;
    }
    /* One instruction can copy a gigabyte (a loop of `..` on big strings),
     * and the count hook sees every 1000th: with an interrupt pending, the
     * first big build makes the main thread's hook run at its next
     * instruction; big builds still asked for 250 ms later come from a thread
     * whose hook still counts to 1000 (a coroutine) and are refused, so it
     * fails at once and reaches a hook within a few instructions (an error
     * such a refusal ends the call with is the interrupt's: see
     * interrupt_refused). The grace lets one C function's own growing buffer
     * (string.pack's) finish while the hook waits for the next instruction. */
    if (nsize > old && nsize - old >= CK_BIG_GROWTH && lim->interrupt) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        const long long ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
        if (!lim->interrupt_seen_ms) {
            lim->interrupt_seen_ms = ms;
            if (lim->main) lua_sethook(lim->main, hook, LUA_MASKCOUNT, 1);
        } else if (ms - lim->interrupt_seen_ms >= 250) {
            lim->interrupt_refused = 1;
            return NULL;
        }
    }
    if (nsize > old && lim->heap_limit && lim->heap_used - old + nsize > lim->heap_limit) {
        lim->heap_refused = 1;
        return NULL;
    }
    if (nsize > old && lim->mem.limit && (nsize - old > lim->mem.limit ||
                                          lim->heap_used + lim->mem.used > lim->mem.limit - (nsize - old))) {
        lim->heap_refused = lim->mem_refused = 1;
        return NULL;
    }
    void *p = lim->alloc(lim->alloc_ud, ptr, osize, nsize);
    if (p) {
        lim->heap_used = lim->heap_used - old + nsize;
        if (lim->heap_used > lim->heap_peak) lim->heap_peak = lim->heap_used;
    } else {
        lim->heap_refused = 1;
    }
    return p;
}

ck_limits *ck_limits_of(lua_State *L)
{
    ck_host *h = ck_host_of(L);
    return h ? &h->lim : NULL;
}

void ck_limits_note(lua_State *L, int code)
{
    ck_limits *lim = ck_limits_of(L);
    if (!lim) return;
    const char *s = lua_tostring(L, -1);
    snprintf(lim->noted, sizeof lim->noted, "%s", s ? s : "");
    lim->noted_code = code;
}

int ck_limits_code_of(const ck_limits *lim, const char *msg)
{
    if (!lim || !lim->noted_code || !msg) return 0;
    size_t n = strlen(lim->noted);
    if (strncmp(msg, lim->noted, n) != 0) return 0;
    return msg[n] == 0 || n == sizeof lim->noted - 1 ? lim->noted_code : 0;
}

ck_mem_budget *ck_mem_budget_of(lua_State *L)
{
    ck_limits *lim = ck_limits_of(L);
    return lim ? &lim->mem : NULL;
}

void ck_mem_check(lua_State *L, int64_t count, size_t each, const char *fmt, ...)
{
    ck_mem_budget *b = ck_mem_budget_of(L);
    if (!b || !b->limit) return;
    const size_t n = count <= 0 ? 0 : (uint64_t)count > SIZE_MAX / each ? SIZE_MAX : (size_t)count * each;
    char what[300], size[64], err[400];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ck_mem_text(n, size, sizeof size);
    if (k >= 0 && (size_t)k < sizeof what) snprintf(what + k, sizeof what - (size_t)k, " (%s)", size);
    /* a charge and its return: the heap's own growth is what counts */
    if (ck_mem_take(b, n, what, err, sizeof err) == 0) {
        ck_mem_give(b, n);
        return;
    }
    char w[256];
    ck_lua_where_from(L, 1, w, sizeof w);
    lua_pushfstring(L, "%s: %s", w, err);
    ck_limits_note(L, CK_EMEM);
    lua_error(L);
}

int ck_mem_take_ud(void *budget, size_t n, const char *what, char *err, size_t errlen)
{
    return ck_mem_take(budget, n, what, err, errlen);
}

void ck_mem_give_ud(void *budget, size_t n) { ck_mem_give(budget, n); }

/* the memory budget's reclaim: what dropped graphs and programs hold comes
 * back when they are collected */
static void collect(void *ud) { lua_gc((lua_State *)ud, LUA_GCCOLLECT); }

/* bytes of the memory limit within which the count hook fails the heap's
 * growth by name: 1/32 of it, at most 4 MiB */
static size_t mem_margin(const ck_limits *lim)
{
    size_t m = lim->mem.limit / 32;
    return m > ((size_t)4 << 20) ? (size_t)4 << 20 : m;
}

/* the cap less 1/8 of it, or less 16 MiB for caps above 128 MiB */
static size_t soft_limit(const ck_limits *lim)
{
    size_t margin = lim->heap_limit / 8;
    if (margin > ((size_t)16 << 20)) margin = (size_t)16 << 20;
    return lim->heap_limit - margin;
}

/* raises msg (at the current line) as an error pcall cannot keep: every thread
 * that runs Lua again raises it at its next instruction */
static int trip(lua_State *L, ck_limits *lim, int code, const char *msg)
{
    char w[256];
    ck_lua_where_from(L, 0, w, sizeof w);
    lua_pushfstring(L, "%s: %s", w, msg);
    ck_limits_note(L, code);
    lim->tripped = code;
    lua_sethook(L, hook, LUA_MASKCOUNT, 1);
    if (lim->main != L) lua_sethook(lim->main, hook, LUA_MASKCOUNT, 1);
    return lua_error(L);
}

static void hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    ck_limits *lim = *(ck_limits **)lua_getextraspace(L);
    if (!lim) return;
    if (lim->tripped) {
        lua_pushstring(L, lim->noted);
        lua_error(L);
    }
    if (lim->interrupt) trip(L, lim, CK_EINTR, "interrupted");
    if (lim->depth > 0 && lim->budget >= 0) {
        lim->used += CK_HOOK_EVERY;
        if (lim->used > lim->budget) {
            char msg[128];
            snprintf(msg, sizeof msg, "callback ran past its instruction budget of %lld instructions", lim->budget);
            trip(L, lim, CK_ELIMIT, msg);
        }
    }
    /* near the cap, a full collection; still near it, an error that names
     * the line (the allocator's refusal cannot) */
    if (lim->heap_limit && lim->heap_used > soft_limit(lim)) {
        lua_gc(L, LUA_GCCOLLECT, 0);
        if (lim->heap_used > soft_limit(lim)) {
            char w[256], size[64];
            ck_lua_where_from(L, 0, w, sizeof w);
            ck_bytes_text(lim->heap_limit, size, sizeof size);
            lua_pushfstring(L, "%s: out of memory (the Lua heap limit of %s is reached)", w, size);
            ck_limits_note(L, CK_EMEM);
            lua_error(L);
        }
    }
    if (lim->mem.limit && lim->heap_used + lim->mem.used > lim->mem.limit - mem_margin(lim)) {
        lua_gc(L, LUA_GCCOLLECT, 0);
        if (lim->heap_used + lim->mem.used > lim->mem.limit - mem_margin(lim)) {
            char w[256], size[64], heap[64], rest[64];
            ck_lua_where_from(L, 0, w, sizeof w);
            ck_mem_text(lim->mem.limit, size, sizeof size);
            ck_mem_text(lim->heap_used, heap, sizeof heap);
            ck_mem_text(lim->mem.used, rest, sizeof rest);
            lua_pushfstring(L, "%s: out of memory (the memory limit of %s is reached: %s of Lua heap, %s of graphs, "
                            "programs and buffers; --max-memory allows more)", w, size, heap, rest);
            ck_limits_note(L, CK_EMEM);
            lua_error(L);
        }
    }
}

void ck_limits_charge(lua_State *L, long long work)
{
    ck_limits *lim = ck_limits_of(L);
    if (!lim) return;
    if (lim->tripped) {
        lua_pushstring(L, lim->noted);
        lua_error(L);
    }
    if (lim->interrupt) trip(L, lim, CK_EINTR, "interrupted");
    if (lim->depth > 0 && lim->budget >= 0 && work > 0) {
        lim->used += work;
        if (lim->used > lim->budget) {
            char msg[128];
            snprintf(msg, sizeof msg, "callback ran past its instruction budget of %lld instructions", lim->budget);
            trip(L, lim, CK_ELIMIT, msg);
        }
    }
}

void ck_limits_install(lua_State *L, ck_limits *lim)
{
    lim->main = L;
    lim->mem.heap = &lim->heap_used;
    lim->mem.reclaim = collect;
    lim->mem.reclaim_ud = L;
    /* the hook's own way to lim, a load instead of a registry lookup every
     * 1000 instructions; new threads copy it */
    *(ck_limits **)lua_getextraspace(L) = lim;
    lua_sethook(L, hook, LUA_MASKCOUNT, CK_HOOK_EVERY);
}

void ck_limits_reset(ck_limits *lim)
{
    if (lim->tripped || lim->interrupt_seen_ms) lua_sethook(lim->main, hook, LUA_MASKCOUNT, CK_HOOK_EVERY);
    lim->tripped = 0;
    lim->interrupt_seen_ms = 0;
    lim->interrupt_refused = 0;
    lim->depth = 0;
    lim->used = 0;
    lim->heap_refused = 0;
    lim->mem_refused = 0;
    lim->mem.refused = 0;
    lim->noted_code = 0;
    lim->noted[0] = 0;
}

int ck_lua_pcall_limited(lua_State *L, int nargs, int nres)
{
    ck_limits *lim = ck_limits_of(L);
    if (!lim) return lua_pcall(L, nargs, nres, 0);
    if (lim->depth++ == 0) lim->used = 0; /* nested callbacks share the outer budget */
    int st = lua_pcall(L, nargs, nres, 0);
    lim->depth--;
    if (st != LUA_OK && lim->tripped) {
        lua_pop(L, 1);
        lua_pushstring(L, lim->noted);
    }
    return st;
}

int ck_lua_call_limited(lua_State *L, int nargs, int nres)
{
    int base = lua_gettop(L) - nargs; /* the function */
    if (ck_lua_pcall_limited(L, nargs, nres) != LUA_OK) return lua_error(L);
    return lua_gettop(L) - base + 1;
}

/* ck.call_limited(fn, ...) -> what fn returns, under the callback budget */
static int l_call_limited(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TFUNCTION);
    return ck_lua_call_limited(L, lua_gettop(L) - 1, LUA_MULTRET);
}

void ck_lua_limits_register(lua_State *L, int lib)
{
    lua_pushcfunction(L, l_call_limited);
    lua_setfield(L, lib, "call_limited");
}
