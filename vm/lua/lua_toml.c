/* ck.read_toml and ck.toml_decode: TOML (kohya's --config-file and
 * --dataset-config) read by toml++ (vm/formats/toml_shim.h) into Lua tables.
 * A file opens through the sandbox's door and is read a piece at a time,
 * charged to the memory budget before it is read; the text is measured
 * (size, depth, counts) before toml++ sees it, toml++'s memory is charged
 * before it parses, and the reading, the parse and the tables' making poll
 * the VM's limits, so Ctrl-C and the callback budget stop each. What a raise
 * must not leak is held by a box that a raise leaves to the collector. */
#include "lua/lua_ck.h"

#include "formats/toml_scan.h"
#include "formats/toml_shim.h"
#include "text/text_file.h"

#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BOX_MT "ck.toml_box"

typedef struct box {
    int fd; /* a file being read, or -1 */
    ck_text_buf file;
    ck_toml_doc doc;
    ck_text_guard g;
    lua_State *L;
    int stopped;
} box;

static void box_free(box *b)
{
    if (b->fd >= 0) close(b->fd);
    b->fd = -1;
    ck_text_buf_free(&b->g, &b->file);
    ck_toml_doc_free(&b->g, &b->doc);
}

static int box_gc(lua_State *L)
{
    box_free(luaL_checkudata(L, 1, BOX_MT));
    return 0;
}

static int guard_poll(void *ud, long long work)
{
    box *b = ud;
    if (!b->stopped && ck_lua_limits_stop(b->L, work)) b->stopped = 1;
    return b->stopped;
}

static box *new_box(lua_State *L)
{
    box *b = lua_newuserdatauv(L, sizeof *b, 0);
    memset(b, 0, sizeof *b);
    b->fd = -1;
    b->L = L;
    ck_mem_budget *budget = ck_mem_budget_of(L);
    b->g = (ck_text_guard){budget ? ck_mem_take_ud : NULL, budget ? ck_mem_give_ud : NULL, budget, guard_poll, b};
    luaL_setmetatable(L, BOX_MT);
    return b;
}

/* Raises "fn: 'name': err" (or "fn: err" without a name), or, when a poll
 * stopped the work, what stopped it (the interrupt, the callback budget),
 * once the box has let go of all it held. */
static int fail(lua_State *L, box *b, const char *fn, const char *name, const char *err)
{
    if (b->stopped) {
        box_free(b);
        ck_lua_limits_raise(L);
    }
    box_free(b);
    if (name) return ck_lua_raise(L, "%s: '%s': %s", fn, name, err);
    return ck_lua_raise(L, "%s: %s", fn, err);
}

/* Pushes item i of d (with all it holds) as a Lua value; returns the index
 * after it. where (a stack index, or 0): where[t] = {order = {keys in the
 * text's order}, line = {key = L}, col = {key = C}} for every table t, and
 * {line = {i = L}, col = {i = C}} for every array. */
static size_t push(lua_State *L, const ck_toml_doc *d, size_t i, int where, long long *work)
{
    const ck_toml_item *it = &d->items[i];
    if ((++*work & 4095) == 0) ck_limits_charge(L, 4096); /* the box frees the items if this raises */
    switch (it->type) {
    case CK_TOML_TABLE:
    case CK_TOML_ARRAY: {
        const int table = it->type == CK_TOML_TABLE;
        const int n = it->v.count < (1u << 30) ? (int)it->v.count : 0;
        luaL_checkstack(L, 12, "toml: nested too deep");
        lua_createtable(L, table ? 0 : n, table ? n : 0);
        const int t = lua_gettop(L);
        int order = 0, line = 0, col = 0;
        if (where) {
            lua_createtable(L, 0, 3);
            if (table) {
                lua_createtable(L, n, 0);
                lua_pushvalue(L, -1);
                lua_setfield(L, -3, "order");
                order = lua_gettop(L);
            }
            lua_createtable(L, table ? 0 : n, table ? n : 0);
            lua_pushvalue(L, -1);
            lua_setfield(L, t + 1, "line");
            line = lua_gettop(L);
            lua_createtable(L, table ? 0 : n, table ? n : 0);
            lua_pushvalue(L, -1);
            lua_setfield(L, t + 1, "col");
            col = lua_gettop(L);
        }
        size_t j = i + 1;
        for (uint32_t k = 0; k < it->v.count; k++) {
            const ck_toml_item *c = &d->items[j];
            if (table) lua_pushlstring(L, c->key, c->klen);
            j = push(L, d, j, where, work);
            if (table) lua_rawset(L, t);
            else lua_rawseti(L, t, (lua_Integer)k + 1);
            if (where) {
                if (table) {
                    lua_pushlstring(L, c->key, c->klen);
                    lua_rawseti(L, order, (lua_Integer)k + 1);
                    lua_pushlstring(L, c->key, c->klen);
                    lua_pushinteger(L, c->line);
                    lua_rawset(L, line);
                    lua_pushlstring(L, c->key, c->klen);
                    lua_pushinteger(L, c->col);
                    lua_rawset(L, col);
                } else {
                    lua_pushinteger(L, c->line);
                    lua_rawseti(L, line, (lua_Integer)k + 1);
                    lua_pushinteger(L, c->col);
                    lua_rawseti(L, col, (lua_Integer)k + 1);
                }
            }
        }
        if (where) {
            lua_pushvalue(L, t);
            lua_pushvalue(L, t + 1);
            lua_rawset(L, where);
        }
        lua_settop(L, t);
        return j;
    }
    case CK_TOML_STRING:
    case CK_TOML_DATE: lua_pushlstring(L, it->str, it->len); break;
    case CK_TOML_INTEGER: lua_pushinteger(L, (lua_Integer)it->v.i); break;
    case CK_TOML_FLOAT: lua_pushnumber(L, it->v.f); break;
    case CK_TOML_BOOLEAN: lua_pushboolean(L, it->v.b); break;
    default: lua_pushnil(L); break;
    }
    return i + 1;
}

/* opts (a table or nil at index idx): whether it asks for where = true */
static int want_where(lua_State *L, int idx, const char *fn)
{
    if (lua_isnoneornil(L, idx)) return 0;
    if (!lua_istable(L, idx)) return ck_lua_raise(L, "%s: options must be a table, got %s", fn, luaL_typename(L, idx));
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "where"))
            return ck_lua_raise(L, "%s: unknown option '%s' (it takes where = true)", fn, luaL_tolstring(L, -1, NULL));
    }
    lua_getfield(L, idx, "where");
    const int w = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return w;
}

/* The text s[0..n) decoded: pushes the root table and, when wanted, the
 * where table; returns their count. Raises naming fn and name. */
static int decode(lua_State *L, box *b, const char *fn, const char *name, const char *s, size_t n, int where)
{
    char err[512];
    if (ck_toml_parse(s, n, &b->g, &b->doc, err, sizeof err)) return fail(L, b, fn, name, err);
    int w = 0;
    if (where) {
        lua_newtable(L);
        w = lua_gettop(L);
    }
    long long work = 0;
    push(L, &b->doc, 0, w, &work);
    box_free(b);
    if (where) lua_insert(L, -2); /* the value, then where */
    return where ? 2 : 1;
}

/* ck.toml_decode(text [, name [, opts]]) -> value [, where] */
static int l_toml_decode(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    const char *name = luaL_optstring(L, 2, NULL);
    const int where = want_where(L, 3, "toml_decode");
    lua_settop(L, 3);
    box *b = new_box(L);
    return decode(L, b, "toml_decode", name, s, n, where);
}

/* ck.read_toml(path [, opts]) -> value [, where] */
static int l_read_toml(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    const int where = want_where(L, 2, "read_toml");
    lua_settop(L, 2);
    box *b = new_box(L);
    b->fd = ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0);
    if (b->fd < 0) return ck_lua_raise(L, "read_toml: cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(b->fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > CK_TOML_MAX_BYTES) {
        char err[160];
        snprintf(err, sizeof err, "%lld bytes: more than the %zu KiB a TOML file may hold", (long long)st.st_size,
                 CK_TOML_MAX_BYTES >> 10);
        return fail(L, b, "read_toml", path, err);
    }
    char err[256];
    if (ck_text_read_fd(b->fd, CK_TOML_MAX_BYTES, &b->g, &b->file, err, sizeof err))
        return fail(L, b, "read_toml", path, err);
    close(b->fd);
    b->fd = -1;
    return decode(L, b, "read_toml", path, b->file.p, b->file.len, where);
}

void ck_lua_toml_register(lua_State *L, int lib)
{
    lib = lua_absindex(L, lib);
    luaL_newmetatable(L, BOX_MT);
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {{"read_toml", l_read_toml}, {"toml_decode", l_toml_decode}, {NULL, NULL}};
    lua_pushvalue(L, lib);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}
