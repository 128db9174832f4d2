/* Internal to the Lua binding: what vm/lua_ck.c shares with the other
 * binding files (vm/lua_st.c). */
#ifndef CK_LUA_CK_H
#define CK_LUA_CK_H

#include "policy.h"
#include "program.h"

#include <lua.h>

/* "file:line" of the user's script line (frames in the shipped stdlib skipped). */
void ck_lua_where(lua_State *L, char *buf, size_t len);
/* Raises "file:line: message" with the user's line. */
int ck_lua_raise(lua_State *L, const char *fmt, ...);
/* The program at stack index i (raises if it is not one or is closed). */
ck_program *ck_lua_program(lua_State *L, int i);
/* A tensor handle or a name at index i, as a tensor id of program p. */
int ck_lua_program_tensor(lua_State *L, ck_program *p, int i);
/* vm/lua_st.c: adds safetensors functions to the module table at index lib and
 * methods to the program method table at index methods. */
void ck_lua_st_register(lua_State *L, int lib, int methods);
/* vm/lua_policy.c: the checkpoint policy of a compile table. */
typedef struct ck_lua_policy {
    lua_State *L;
    int fn;                    /* stack index of a function policy, 0 if none */
    char defined[300];         /* "defined at file:line" of a function policy */
    ck_policy pol;
    const char *patterns[64];  /* blocks: strings held by the policy table */
} ck_lua_policy;
/* Reads the policy at stack index idx (nil, a policy table or a function) into
 * lp and sets o->decide; raises on a malformed policy. The value must stay on
 * the stack until the compile is done. */
int ck_lua_policy_opts(lua_State *L, int idx, ck_lua_policy *lp, ck_compile_opts *o);
/* vm/lua_log.c: ck.log_open, ck.read_events, ck.crc32c, ck.wall_time, ck.rss
 * in the module table at index lib; p:enable_stats and p:profile in the program methods at
 * index methods. ck_lua_log_step: p:step with stats or guard set in
 * the options table at index 2 (returns loss, info). */
void ck_lua_log_register(lua_State *L, int lib, int methods);
int ck_lua_log_step(lua_State *L, ck_program *p);
/* vm/lua_fs.c: ck.listdir, ck.mkdir, ck.isatty, ck.now */
void ck_lua_fs_register(lua_State *L, int lib);

/* vm/runlimits.c: calls the function below the nargs arguments on top of the
 * stack like lua_call, under the VM's instruction budget for callbacks (use it
 * for every script function the runtime calls while compiling: policies,
 * cadences). Past the budget it raises "file:line: callback ran past its
 * instruction budget ..." naming the callback's line, an error pcall in the
 * script cannot swallow. Returns the number of results (nres, or all of them
 * with LUA_MULTRET). Outside a VM (a stock lua5.4) it is lua_call. */
int ck_lua_call_limited(lua_State *L, int nargs, int nres);
/* The same for C code that must not be unwound: returns lua_pcall's status,
 * with the error message on top. A budget error still reaches the host: the
 * next Lua instruction anywhere in the VM raises it again. */
int ck_lua_pcall_limited(lua_State *L, int nargs, int nres);
/* ck.call_limited(fn, ...): the same from Lua */
void ck_lua_limits_register(lua_State *L, int lib);
/* vm/sandbox.c: raises "file:line: reading 'path' is denied ... (--allow-read
 * DIR allows it)" unless the VM's sandbox is off or allows the access; every
 * function that opens a file by name calls it first. DIR: the path is a
 * directory (the hint names it rather than its parent). */
#define CK_ACCESS_READ 1
#define CK_ACCESS_WRITE 2
#define CK_ACCESS_DIR 4
void ck_lua_check_path(lua_State *L, const char *path, int access);

#endif
