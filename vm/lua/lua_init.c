/* The ck module's registrar, as Lua's linit.c: it opens the core (graphs,
 * tensors, programs: vm/lua/lua_ck.c) and has each binding file add its
 * functions and program methods. Every binding file is below it, and none
 * calls it. */
#include "guard/host.h"
#include "lua/lua_ck.h"

#include <lauxlib.h>

__attribute__((visibility("default"))) int luaopen_ck(lua_State *L)
{
    const int lib = ck_lua_core_open(L);
    const int methods = lua_gettop(L); /* the program method table */
    ck_lua_st_register(L, lib, methods);
    ck_lua_text_register(L, lib);
    ck_lua_spm_register(L, lib);
    ck_lua_toml_register(L, lib);
    ck_lua_log_register(L, lib, methods);
    ck_lua_graph_register(L, methods);
    ck_lua_array_register(L, lib, methods);
    ck_lua_core_close(L, lib);
    ck_lua_handles_register(L);
    ck_lua_fs_register(L, lib);
    ck_lua_lock_register(L, lib);
    ck_lua_json_register(L, lib);
    ck_lua_hash_register(L, lib);
    ck_lua_image_register(L, lib);
    ck_lua_dist_register(L, lib);
    /* the host's plan request (ckrun --plan ...); nil without one */
    const ck_host *host = ck_host_of(L);
    if (host && host->planning) {
        lua_pushboolean(L, host->plan_only);
        lua_setfield(L, lib, "plan_mode");
        lua_pushboolean(L, host->json);
        lua_setfield(L, lib, "json");
        lua_pushstring(L, host->plan_policies);
        lua_setfield(L, lib, "plan_policies");
        lua_pushstring(L, host->plan_svg);
        lua_setfield(L, lib, "plan_svg");
        lua_pushstring(L, host->plan_export_graph);
        lua_setfield(L, lib, "plan_export_graph");
        if (host->plan_max_batch > 0) {
            lua_pushnumber(L, host->plan_max_batch);
            lua_setfield(L, lib, "plan_max_batch");
        }
        if (host->plan_world_size > 0) {
            lua_pushinteger(L, host->plan_world_size);
            lua_setfield(L, lib, "plan_world_size");
        }
    }
    return 1;
}
