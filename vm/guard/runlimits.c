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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *ck_limits_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    ck_limits *lim = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        lim->alloc(lim->alloc_ud, ptr, osize, 0);
        lim->heap_used -= old;
        return NULL;
    }
    if (nsize > old && lim->heap_limit && lim->heap_used - old + nsize > lim->heap_limit) {
        lim->heap_refused = 1;
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

static void hook(lua_State *L, lua_Debug *ar);

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
    /* the hook's own way to lim, a load instead of a registry lookup every
     * 1000 instructions; new threads copy it */
    *(ck_limits **)lua_getextraspace(L) = lim;
    lua_sethook(L, hook, LUA_MASKCOUNT, CK_HOOK_EVERY);
}

void ck_limits_reset(ck_limits *lim)
{
    if (lim->tripped) lua_sethook(lim->main, hook, LUA_MASKCOUNT, CK_HOOK_EVERY);
    lim->tripped = 0;
    lim->depth = 0;
    lim->used = 0;
    lim->heap_refused = 0;
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
