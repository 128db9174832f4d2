/* The one registry key that carries a VM's host state (vm/guard/host.h). */
#include "guard/host.h"

#define HOST_KEY "ck.host"

void ck_host_install(lua_State *L, ck_host *h)
{
    lua_pushlightuserdata(L, h);
    lua_setfield(L, LUA_REGISTRYINDEX, HOST_KEY);
}

ck_host *ck_host_of(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, HOST_KEY);
    ck_host *h = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return h;
}
