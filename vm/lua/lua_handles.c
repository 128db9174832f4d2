/* The handles the binding files share (vm/lua/lua_ck.h): tensor handles,
 * and program handles with their pins. A leaf of the bindings: it calls
 * none of the other binding files. */
#include "lua/lua_ck.h"

#include <lauxlib.h>

ck_lua_tensor *ck_lua_check_tensor(lua_State *L, int i) { return luaL_checkudata(L, i, CK_TENSOR_MT); }

int ck_lua_tensor_id(lua_State *L, int i) { return ck_lua_check_tensor(L, i)->id; }

ck_lua_prog *ck_lua_check_program(lua_State *L, int i)
{
    ck_lua_prog *lp = luaL_checkudata(L, i, CK_PROGRAM_MT);
    if (!lp->p || lp->closing) luaL_error(L, "program is closed");
    return lp;
}

ck_program *ck_lua_program(lua_State *L, int i) { return ck_lua_check_program(L, i)->p; }

/* The pin's __close: runs when the binding that pinned returns or raises. */
static int l_pin_release(lua_State *L)
{
    ck_lua_prog **slot = luaL_checkudata(L, 1, CK_PIN_MT);
    ck_lua_prog *lp = *slot;
    *slot = NULL;
    if (lp && --lp->pins == 0 && lp->closing) {
        ck_program_free(lp->p);
        lp->p = NULL;
        lp->closing = 0;
    }
    return 0;
}

/* Pins the program at index i until the calling binding returns or raises:
 * the stack is cut (or padded with nils) to the binding's nargs arguments and
 * the pin, a to-be-closed value that refers to the program, goes above them
 * (so the binding must not pop it). */
ck_lua_prog *ck_lua_pin_program(lua_State *L, int i, int nargs)
{
    i = lua_absindex(L, i);
    ck_lua_prog *lp = ck_lua_check_program(L, i);
    lua_settop(L, nargs);
    ck_lua_prog **slot = lua_newuserdatauv(L, sizeof *slot, 1);
    *slot = NULL;
    luaL_setmetatable(L, CK_PIN_MT);
    lua_pushvalue(L, i);
    lua_setiuservalue(L, -2, 1);
    lua_toclose(L, -1);
    *slot = lp;
    lp->pins++;
    return lp;
}

ck_program *ck_lua_program_pinned(lua_State *L, int i, int nargs) { return ck_lua_pin_program(L, i, nargs)->p; }

/* a tensor handle or a name */
int ck_lua_program_tensor(lua_State *L, ck_program *p, int i)
{
    if (lua_type(L, i) == LUA_TSTRING) {
        int id = ck_graph_find(p->g, lua_tostring(L, i));
        if (id < 0) luaL_error(L, "no tensor named '%s'", lua_tostring(L, i));
        return id;
    }
    int id = ck_lua_tensor_id(L, i);
    if (id >= p->g->nt) luaL_error(L, "tensor is not part of this program");
    return id;
}

void ck_lua_handles_register(lua_State *L)
{
    luaL_newmetatable(L, CK_PIN_MT);
    lua_pushcfunction(L, l_pin_release);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
}
