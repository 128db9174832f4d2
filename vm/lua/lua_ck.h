/* Internal to the Lua binding: what vm/lua/lua_ck.c shares with the other
 * binding files (vm/lua/lua_*.c). */
#ifndef CK_LUA_CK_H
#define CK_LUA_CK_H

#include "guard/runlimits.h"
#include "guard/sandbox.h"
#include "plan/policy.h"
#include "run/program.h"
#include "util/where.h"

#include <lua.h>

/* vm/lua/lua_handles.c: the handles the binding files share. A tensor
 * handle (uservalue 1: its graph) and a program handle. A binding that runs
 * Lua code while it uses a program (a metamethod of its options, a
 * __tostring) pins it: a close meanwhile (a `<close>` variable of the
 * program, in that Lua code) is deferred until the last pin goes, and the
 * program reads as closed from then on. */
#define CK_TENSOR_MT "ck.tensor"
#define CK_PROGRAM_MT "ck.program"
#define CK_PIN_MT "ck.program_pin"
typedef struct ck_lua_tensor {
    int id;
} ck_lua_tensor;
typedef struct ck_lua_prog {
    ck_program *p;
    int pins;    /* bindings using p now */
    int closing; /* closed while pinned: freed when the last pin goes */
} ck_lua_prog;
/* The tensor handle at stack index i (raises if it is not one), and its id. */
ck_lua_tensor *ck_lua_check_tensor(lua_State *L, int i);
int ck_lua_tensor_id(lua_State *L, int i);
/* The program handle at stack index i (raises if it is not one or is closed). */
ck_lua_prog *ck_lua_check_program(lua_State *L, int i);
/* Pins the program at index i until the calling binding returns or raises
 * (see ck_lua_program_pinned). */
ck_lua_prog *ck_lua_pin_program(lua_State *L, int i, int nargs);
/* The pins' metatable. */
void ck_lua_handles_register(lua_State *L);
/* The program at stack index i (raises if it is not one or is closed). */
ck_program *ck_lua_program(lua_State *L, int i);
/* vm/lua/lua_ck.c: the module's core, for the registrar (vm/lua/lua_init.c):
 * open leaves the module table (its index returned), then the program
 * metatable and its method table, on the stack; close finishes and pops the
 * metatable and sets the module's graph, device and version fields. */
int ck_lua_core_open(lua_State *L);
void ck_lua_core_close(lua_State *L, int lib);
/* The same, pinned until the calling binding returns or raises: for bindings
 * that run Lua code (a metamethod, a collection step) while they use the
 * program. A close meanwhile is deferred to then. Cuts the stack to the
 * binding's nargs arguments and pushes the pin (a to-be-closed value) above
 * them: the binding must leave it there. */
ck_program *ck_lua_program_pinned(lua_State *L, int i, int nargs);
/* A tensor handle or a name at index i, as a tensor id of program p. */
int ck_lua_program_tensor(lua_State *L, ck_program *p, int i);
/* vm/lua/lua_st.c: adds safetensors functions to the module table at index lib and
 * methods to the program method table at index methods. */
void ck_lua_st_register(lua_State *L, int lib, int methods);
/* vm/lua/lua_policy.c: the checkpoint policy of a compile table. */
typedef struct ck_lua_policy {
    lua_State *L;
    int fn;                    /* stack index of a function policy, 0 if none */
    char defined[300];         /* "defined at file:line" of a function policy */
    ck_policy pol;
    const char *patterns[64];  /* blocks: strings held by the policy table (compile copies them before a
                                * policy function can run) */
} ck_lua_policy;
/* Reads the policy at stack index idx (nil, a policy table or a function) into
 * lp and sets o->decide; raises on a malformed policy. The value must stay on
 * the stack until the compile is done. */
int ck_lua_policy_opts(lua_State *L, int idx, ck_lua_policy *lp, ck_compile_opts *o);
/* vm/lua/lua_log.c: ck.log_open, ck.read_events, ck.crc32c, ck.wall_time, ck.rss
 * in the module table at index lib; p:enable_stats and p:profile in the program methods at
 * index methods. ck_lua_log_step: p:step with its options table at index 2
 * (stats, guard, measure); returns loss, info as every p:step does. */
void ck_lua_log_register(lua_State *L, int lib, int methods);
int ck_lua_log_step(lua_State *L, ck_program *p);
/* The statistics table {grads = bool, acts = bool, blocks = {patterns}} at
 * stack index idx (read raw; both groups default to on) into o->stats and the
 * block patterns (at most 64, into pats, strings held by the table, which must
 * stay on the stack until they are used). nil or false: none. Raises on a
 * malformed table. */
void ck_lua_stats_request(lua_State *L, int idx, ck_compile_opts *o, const char **pats);
/* vm/lua/lua_fs.c: ck.listdir, ck.mkdir, ck.isatty, ck.now */
void ck_lua_fs_register(lua_State *L, int lib);
/* vm/lua/lua_lock.c: ck.lock */
void ck_lua_lock_register(lua_State *L, int lib);
/* vm/lua/lua_json.c: ck.json_encode, ck.json_decode, ck.json_object, ck.json_null */
void ck_lua_json_register(lua_State *L, int lib);
/* jansson's allocations in this thread charged to L's memory budget from
 * begin to end, a parse between the two (no Lua may run there): a text can
 * decode to tens of times its bytes, which the Lua heap does not see. A
 * charge the budget refuses fails that allocation, so the parse fails, and
 * sets refused, with the message in err. Blocks freed during the parse stay
 * charged; ck_lua_json_give returns all of it once the values are freed. */
typedef struct ck_json_charge {
    ck_mem_budget *budget;
    size_t charged;
    int refused, refusing;
    struct ck_json_charge *prev;
    char err[256];
} ck_json_charge;
void ck_lua_json_charge_begin(lua_State *L, ck_json_charge *c);
void ck_lua_json_charge_end(ck_json_charge *c);
void ck_lua_json_give(ck_json_charge *c);
/* For C code that must not be unwound (a library's parse, a builder that
 * holds memory): 1 when ck_limits_charge(L, work) would raise now (an
 * interrupt, a tripped limit, work past the callback budget, which is
 * charged), 0 to go on. The caller stops, lets go of what it holds, then
 * calls ck_lua_limits_raise, which raises that error. */
int ck_lua_limits_stop(lua_State *L, long long work);
void ck_lua_limits_raise(lua_State *L);
/* vm/lua/lua_hash.c: ck.sha256, ck.file_sha256 */
void ck_lua_hash_register(lua_State *L, int lib);
/* vm/lua/lua_graph.c: p:graph() in the program methods at index methods */
void ck_lua_graph_register(lua_State *L, int methods);
/* vm/lua/lua_text.c: ck.clip_tokenizer */
void ck_lua_text_register(lua_State *L, int lib);
/* vm/lua/lua_spm.c: ck.t5_tokenizer */
void ck_lua_spm_register(lua_State *L, int lib);
/* vm/lua/lua_toml.c: ck.read_toml, ck.toml_decode */
void ck_lua_toml_register(lua_State *L, int lib);
/* vm/lua/lua_array.c: ck.array in the module table at index lib, p:array in the program methods at index methods */
void ck_lua_array_register(lua_State *L, int lib, int methods);
/* The values of the ck.array at idx (valid while it is reachable), its shape into *shape; NULL when idx is not an
 * array. Raises for an array of more dims than a ck_shape holds. */
float *ck_lua_toarray(lua_State *L, int idx, ck_shape *shape);
/* The same with only the element count (any number of dims), into *numel */
float *ck_lua_toarray_numel(lua_State *L, int idx, int64_t *numel);
/* Pushes a new ck.array of shape d[0..ndim) (at most 8 dims; values unset), checked against the memory limit */
float *ck_lua_newarray(lua_State *L, int ndim, const int64_t *d);
/* vm/lua/lua_image.c: ck.image_info, ck.image_load, ck.write_png in the module table at index lib */
void ck_lua_image_register(lua_State *L, int lib);
/* vm/lua/lua_dist.c: ck.rank, ck.world_size, the collectives (after ck_lua_hash_register) */
void ck_lua_dist_register(lua_State *L, int lib);


#endif
