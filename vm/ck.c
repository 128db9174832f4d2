/* The public API of vm/ck.h: a VM is one Lua state with the ck module
 * preloaded, the stdlib on its path, and the last error kept as one line. */
#include "ck.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CK_STDLIB_DIR
#define CK_STDLIB_DIR "stdlib"
#endif

int luaopen_ck(lua_State *L);

struct ck_vm {
    lua_State *L;
    ck_options opt;
    char err[1024];
};

const char *ck_version(void) { return CK_VERSION; }

static int l_print(lua_State *L)
{
    ck_vm *vm = lua_touserdata(L, lua_upvalueindex(1));
    int n = lua_gettop(L);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 1; i <= n; i++) {
        if (i > 1) luaL_addchar(&b, '\t');
        luaL_tolstring(L, i, NULL);
        luaL_addvalue(&b);
    }
    luaL_addchar(&b, '\n');
    luaL_pushresult(&b);
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    vm->opt.log(vm->opt.log_ud, s, len);
    return 0;
}

ck_vm *ck_open(const ck_options *opt)
{
    ck_vm *vm = calloc(1, sizeof *vm);
    if (!vm) return NULL;
    if (opt) vm->opt = *opt;
    vm->L = luaL_newstate();
    if (!vm->L) {
        free(vm);
        return NULL;
    }
    lua_State *L = vm->L;
    luaL_openlibs(L);
    lua_pushboolean(L, vm->opt.plan_only);
    lua_setfield(L, LUA_REGISTRYINDEX, "ck.plan_mode");
    lua_pushboolean(L, vm->opt.json);
    lua_setfield(L, LUA_REGISTRYINDEX, "ck.json");
    lua_pushstring(L, vm->opt.plan_policies);
    lua_setfield(L, LUA_REGISTRYINDEX, "ck.plan_policies");
    lua_pushstring(L, vm->opt.plan_svg);
    lua_setfield(L, LUA_REGISTRYINDEX, "ck.plan_svg");
    if (vm->opt.plan_max_batch > 0) lua_pushnumber(L, vm->opt.plan_max_batch);
    else lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, "ck.plan_max_batch");
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
    lua_pushcfunction(L, luaopen_ck);
    lua_setfield(L, -2, "ck");
    lua_pop(L, 1);
    /* the stdlib first on package.path */
    const char *dir = vm->opt.stdlib_dir ? vm->opt.stdlib_dir : CK_STDLIB_DIR;
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "path");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
    lua_setfield(L, -3, "path");
    lua_pop(L, 2);
    if (vm->opt.log) {
        lua_pushlightuserdata(L, vm);
        lua_pushcclosure(L, l_print, 1);
        lua_setglobal(L, "print");
    }
    return vm;
}

void ck_close(ck_vm *vm)
{
    if (!vm) return;
    lua_close(vm->L);
    free(vm);
}

const char *ck_error(const ck_vm *vm) { return vm ? vm->err : "no VM"; }

static int set_error(ck_vm *vm, int code, const char *msg)
{
    snprintf(vm->err, sizeof vm->err, "%s", msg ? msg : "unknown error");
    /* one line: the first line of a traceback-free message */
    char *nl = strchr(vm->err, '\n');
    if (nl) *nl = 0;
    return code;
}

static int traceback_free(lua_State *L)
{
    /* keep the message as is; error objects that are not strings get a name */
    if (!lua_isstring(L, 1)) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    return 1;
}

static int call_chunk(ck_vm *vm, int nargs)
{
    lua_State *L = vm->L;
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, traceback_free);
    lua_insert(L, base);
    int st = lua_pcall(L, nargs, 0, base);
    int code = CK_OK;
    if (st != LUA_OK) {
        code = st == LUA_ERRMEM ? CK_EMEM : CK_ERUN;
        set_error(vm, code, lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    lua_remove(L, base);
    return code;
}

static void push_arg_value(lua_State *L, const char *v)
{
    if (lua_stringtonumber(L, v) == 0) lua_pushstring(L, v);
}

int ck_run_file(ck_vm *vm, const char *path, int argc, const char *const *argv)
{
    if (!vm || !path) return CK_EARG;
    lua_State *L = vm->L;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(vm->err, sizeof vm->err, "cannot open script '%s'", path);
        return CK_EFILE;
    }
    fclose(f);
    int st = luaL_loadfilex(L, path, "t");
    if (st != LUA_OK) {
        int code = st == LUA_ERRSYNTAX ? CK_ESYNTAX : st == LUA_ERRMEM ? CK_EMEM : CK_EFILE;
        set_error(vm, code, lua_tostring(L, -1));
        lua_pop(L, 1);
        return code;
    }
    /* args table: --key value pairs and positional words */
    lua_newtable(L);
    int pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] == '-' && a[1] == '-' && a[2]) {
            const char *key = a + 2, *eq = strchr(key, '=');
            if (eq) {
                lua_pushlstring(L, key, (size_t)(eq - key));
                push_arg_value(L, eq + 1);
            } else if (i + 1 < argc && !(argv[i + 1][0] == '-' && argv[i + 1][1] == '-')) {
                lua_pushstring(L, key);
                push_arg_value(L, argv[++i]);
            } else {
                lua_pushstring(L, key);
                lua_pushboolean(L, 1);
            }
            lua_settable(L, -3);
        } else {
            push_arg_value(L, a);
            lua_rawseti(L, -2, ++pos);
        }
    }
    lua_pushstring(L, path);
    lua_setfield(L, -2, "script");
    lua_pushvalue(L, -1);
    lua_setglobal(L, "args");
    return call_chunk(vm, 1);
}

int ck_run_string(ck_vm *vm, const char *code, const char *chunkname)
{
    if (!vm || !code) return CK_EARG;
    lua_State *L = vm->L;
    char name[256];
    snprintf(name, sizeof name, "=%s", chunkname ? chunkname : "string");
    int st = luaL_loadbufferx(L, code, strlen(code), name, "t");
    if (st != LUA_OK) {
        int c = st == LUA_ERRSYNTAX ? CK_ESYNTAX : CK_EMEM;
        set_error(vm, c, lua_tostring(L, -1));
        lua_pop(L, 1);
        return c;
    }
    return call_chunk(vm, 0);
}
