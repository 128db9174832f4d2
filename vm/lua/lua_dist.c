/* The communicator for scripts (vm/dist/dist.h): ck.rank, ck.world_size,
 * ck.local_rank, ck.local_size, the collectives on a ck.array (in place where
 * the result has the input's size) or on a Lua list of numbers (a new list),
 * ck.same_on_all_ranks, and the timeout, step and wait-time controls.
 *
 * Before each collective the ranks allgather what they are about to do (which
 * collective, how many values, from which root), so that a rank calling a
 * different collective or passing a different count gets one clear error on
 * every rank instead of a hang or a corrupted buffer. Collectives open no
 * file by name: a sandboxed script may call them. A wait polls the VM's
 * interrupt, so Ctrl-C or SIGTERM stops a rank that waits. */
#include "dist/dist.h"
#include "lua/lua_ck.h"

#include <lauxlib.h>

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

enum { K_ALLREDUCE = 1, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_BARRIER, K_SAME };

static const char *const kind_name[] = {
    "?", "ck.allreduce", "ck.broadcast", "ck.allgather", "ck.reduce_scatter", "ck.barrier", "ck.same_on_all_ranks",
};

#define ARRAY_MT "ck.array"
#define MAX_DIMS 8

/* starts MPI on first use when a launcher started the process (the CLI has
 * already); raises when it cannot */
static void ensure(lua_State *L)
{
    char err[300];
    if (ck_dist_init(err, sizeof err)) ck_lua_raise(L, "%s", err);
}

/* the wait's poll: stop when the VM's interrupt is raised */
static int poll_interrupt(void *ud)
{
    ck_limits *lim = ck_limits_of((lua_State *)ud);
    return lim && atomic_load(&lim->interrupt);
}

/* what a collective's return code means for the script: raises the
 * interrupt that stopped it (the rank must end: the others cannot finish the
 * collective without it), or a count MPI cannot carry */
static void check_rc(lua_State *L, int rc, int kind)
{
    if (rc == 0) return;
    if (rc == CK_DIST_STOPPED) {
        ck_limits_charge(L, 0);
        ck_lua_raise(L, "%s: interrupted", kind_name[kind]);
    }
    ck_lua_raise(L, "%s: more values than MPI carries in one call (at most 2147483647)", kind_name[kind]);
}

/* Every rank says what it is about to do ({kind, count, root}); raises the
 * same error on every rank when they differ. */
static void agree(lua_State *L, int kind, int64_t count, int64_t root)
{
    const int size = ck_dist_size();
    if (size == 1) return;
    int64_t mine[3] = {kind, count, root};
    ck_mem_check(L, size, sizeof mine, "%d ranks' collective headers", size);
    int64_t *all = lua_newuserdatauv(L, sizeof mine * (size_t)size, 0);
    check_rc(L, ck_dist_allgather_i64(mine, all, 3, poll_interrupt, L), kind);
    char msg[400];
    msg[0] = 0;
    for (int r = 1; r < size && !msg[0]; r++) {
        const int64_t *a = all, *b = all + 3 * r;
        if (a[0] != b[0]) {
            const int ka = a[0] >= 1 && a[0] <= K_SAME ? (int)a[0] : 0, kb = b[0] >= 1 && b[0] <= K_SAME ? (int)b[0] : 0;
            snprintf(msg, sizeof msg,
                     "%s on rank 0 meets %s on rank %d: every rank must call the same collectives in the same order",
                     kind_name[ka], kind_name[kb], r);
        } else if (a[1] != b[1]) {
            snprintf(msg, sizeof msg,
                     "%s: every rank must pass the same count, but rank 0 passes %lld value%s and rank %d %lld",
                     kind_name[kind], (long long)a[1], a[1] == 1 ? "" : "s", r, (long long)b[1]);
        } else if (a[2] != b[2]) {
            snprintf(msg, sizeof msg, "%s: every rank must name the same root, but rank 0 names %lld and rank %d %lld",
                     kind_name[kind], (long long)a[2], r, (long long)b[2]);
        }
    }
    lua_pop(L, 1);
    if (msg[0]) ck_lua_raise(L, "%s", msg);
}

/* The values at stack index i: a ck.array's own (*arr = 1) or a flat list's
 * numbers copied into a new userdata left on the stack (*arr = 0). */
static float *values_arg(lua_State *L, int i, int64_t *n, int *arr, int kind)
{
    float *x = ck_lua_toarray_numel(L, i, n);
    if (x) {
        *arr = 1;
        return x;
    }
    if (lua_type(L, i) != LUA_TTABLE)
        ck_lua_raise(L, "%s wants a ck.array or a list of numbers, got a %s", kind_name[kind], luaL_typename(L, i));
    *arr = 0;
    const lua_Unsigned len = lua_rawlen(L, i);
    ck_mem_check(L, (int64_t)len, sizeof(float), "%s of %lld values", kind_name[kind], (long long)len);
    x = lua_newuserdatauv(L, sizeof(float) * (len ? (size_t)len : 1), 0);
    for (lua_Unsigned j = 1; j <= len; j++) {
        if ((j & 4095) == 0) ck_limits_charge(L, 4096);
        if (lua_rawgeti(L, i, (lua_Integer)j) != LUA_TNUMBER)
            ck_lua_raise(L, "%s: value %I is a %s, not a number", kind_name[kind], (lua_Integer)j, luaL_typename(L, -1));
        x[j - 1] = (float)lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    *n = (int64_t)len;
    return x;
}

/* pushes a new list of x[0..n) */
static void push_list(lua_State *L, const float *x, int64_t n, int kind)
{
    ck_mem_check(L, n, 16, "%s's list of %lld values", kind_name[kind], (long long)n);
    if (n > INT32_MAX) ck_lua_raise(L, "%s: %I values are more than a Lua list holds", kind_name[kind], (lua_Integer)n);
    lua_createtable(L, (int)n, 0);
    for (int64_t j = 0; j < n; j++) {
        if ((j & 4095) == 4095) ck_limits_charge(L, 4096);
        lua_pushnumber(L, x[j]);
        lua_rawseti(L, -2, j + 1);
    }
}

/* the shape of the ck.array at index i (its dims into d), via its shape field */
static int array_shape(lua_State *L, int i, int64_t *d)
{
    lua_getfield(L, i, "shape"); /* the array's own __index: a fresh list */
    const int nd = (int)lua_rawlen(L, -1);
    for (int k = 0; k < nd && k < MAX_DIMS; k++) {
        lua_rawgeti(L, -1, k + 1);
        d[k] = (int64_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return nd < MAX_DIMS ? nd : MAX_DIMS;
}

/* ck.rank() -> this process's rank (0-based; 0 outside MPI) */
static int l_rank(lua_State *L)
{
    ensure(L);
    lua_pushinteger(L, ck_dist_rank());
    return 1;
}

/* ck.world_size() -> the number of ranks in the job (1 outside MPI) */
static int l_world_size(lua_State *L)
{
    ensure(L);
    lua_pushinteger(L, ck_dist_size());
    return 1;
}

/* ck.local_rank() -> the rank among this machine's ranks: the CUDA device a
 * rank takes */
static int l_local_rank(lua_State *L)
{
    ensure(L);
    lua_pushinteger(L, ck_dist_local_rank());
    return 1;
}

/* ck.local_size() -> how many ranks run on this machine */
static int l_local_size(lua_State *L)
{
    ensure(L);
    lua_pushinteger(L, ck_dist_local_size());
    return 1;
}

/* ck.barrier(): returns when every rank has called it */
static int l_barrier(lua_State *L)
{
    ensure(L);
    agree(L, K_BARRIER, 0, 0);
    check_rc(L, ck_dist_barrier(poll_interrupt, L), K_BARRIER);
    return 0;
}

/* ck.allreduce(x) -> the elementwise sum over ranks: x itself (summed in
 * place) for a ck.array, a new list for a list */
static int l_allreduce(lua_State *L)
{
    ensure(L);
    lua_settop(L, 1);
    int64_t n;
    int arr;
    float *x = values_arg(L, 1, &n, &arr, K_ALLREDUCE);
    agree(L, K_ALLREDUCE, n, 0);
    check_rc(L, ck_dist_allreduce(x, n, poll_interrupt, L), K_ALLREDUCE);
    if (arr) lua_pushvalue(L, 1);
    else push_list(L, x, n, K_ALLREDUCE);
    return 1;
}

/* ck.broadcast(x [, root = 0]) -> root's values on every rank: x itself (in
 * place) for a ck.array, a new list for a list */
static int l_broadcast(lua_State *L)
{
    ensure(L);
    lua_settop(L, 2);
    const lua_Integer root = luaL_optinteger(L, 2, 0);
    int64_t n;
    int arr;
    float *x = values_arg(L, 1, &n, &arr, K_BROADCAST);
    /* agreed first, so that a root out of range is refused on every rank */
    agree(L, K_BROADCAST, n, (int64_t)root);
    if (root < 0 || root >= ck_dist_size())
        return ck_lua_raise(L, "ck.broadcast: root %I is not a rank (0..%d)", root, ck_dist_size() - 1);
    check_rc(L, ck_dist_broadcast(x, n, (int)root, poll_interrupt, L), K_BROADCAST);
    if (arr) lua_pushvalue(L, 1);
    else push_list(L, x, n, K_BROADCAST);
    return 1;
}

/* ck.allgather(x) -> every rank's values in rank order: for a ck.array of
 * shape {d1, ...} a new array {world * d1, ...} ({world} for a 0-dim array),
 * for a list of n numbers a new list of world * n */
static int l_allgather(lua_State *L)
{
    ensure(L);
    lua_settop(L, 1);
    const int size = ck_dist_size();
    int64_t n;
    int arr;
    float *x = values_arg(L, 1, &n, &arr, K_ALLGATHER);
    agree(L, K_ALLGATHER, n, 0);
    if (n > INT32_MAX) check_rc(L, CK_DIST_EINVAL, K_ALLGATHER);
    float *out;
    if (arr) {
        int64_t d[MAX_DIMS];
        int nd = array_shape(L, 1, d);
        if (nd == 0) d[nd++] = 1;
        d[0] *= size;
        out = ck_lua_newarray(L, nd, d);
    } else {
        ck_mem_check(L, n * size, sizeof(float), "ck.allgather of %lld values", (long long)(n * size));
        out = lua_newuserdatauv(L, sizeof(float) * (n ? (size_t)(n * size) : 1), 0);
    }
    check_rc(L, ck_dist_allgather(x, out, n, poll_interrupt, L), K_ALLGATHER);
    if (!arr) push_list(L, out, n * size, K_ALLGATHER);
    return 1;
}

/* ck.reduce_scatter(x) -> this rank's block of the sum over ranks: x holds
 * world * m values, and rank r gets the sum of every rank's values r*m+1 ..
 * (r+1)*m. A ck.array of shape {d1, ...} with d1 a multiple of world gives
 * {d1 / world, ...}, any other a flat {m}; a list gives a list. */
static int l_reduce_scatter(lua_State *L)
{
    ensure(L);
    lua_settop(L, 1);
    const int size = ck_dist_size();
    int64_t n;
    int arr;
    float *x = values_arg(L, 1, &n, &arr, K_REDUCE_SCATTER);
    agree(L, K_REDUCE_SCATTER, n, 0);
    if (n % size)
        return ck_lua_raise(L, "ck.reduce_scatter: %I values do not split into %d equal blocks, one per rank",
                            (lua_Integer)n, size);
    const int64_t m = n / size;
    float *out;
    if (arr) {
        int64_t d[MAX_DIMS];
        int nd = array_shape(L, 1, d);
        if (nd > 0 && d[0] % size == 0) {
            d[0] /= size;
        } else {
            nd = 1;
            d[0] = m;
        }
        out = ck_lua_newarray(L, nd, d);
    } else {
        out = lua_newuserdatauv(L, sizeof(float) * (m ? (size_t)m : 1), 0);
    }
    check_rc(L, ck_dist_reduce_scatter(x, out, m, poll_interrupt, L), K_REDUCE_SCATTER);
    if (!arr) push_list(L, out, m, K_REDUCE_SCATTER);
    return 1;
}

/* ck.same_on_all_ranks(str) -> true when every rank passed a string of the
 * same SHA-256, else false and the first rank whose hash differs from rank
 * 0's (every rank gets the same answer) */
static int l_same_on_all_ranks(lua_State *L)
{
    ensure(L);
    luaL_checkstring(L, 1);
    lua_settop(L, 1);
    const int size = ck_dist_size();
    agree(L, K_SAME, 0, 0);
    /* the hash from ck.sha256 as it was when the module opened */
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    size_t hl;
    const char *hex = lua_tolstring(L, -1, &hl);
    int64_t mine[8];
    if (!hex || hl != sizeof mine) return ck_lua_raise(L, "ck.same_on_all_ranks: ck.sha256 gave no hash");
    memcpy(mine, hex, sizeof mine);
    ck_mem_check(L, size, sizeof mine, "%d ranks' hashes", size);
    int64_t *all = lua_newuserdatauv(L, sizeof mine * (size_t)size, 0);
    check_rc(L, ck_dist_allgather_i64(mine, all, 8, poll_interrupt, L), K_SAME);
    for (int r = 1; r < size; r++)
        if (memcmp(all, all + 8 * r, sizeof mine)) {
            lua_pushboolean(L, 0);
            lua_pushinteger(L, r);
            return 2;
        }
    lua_pushboolean(L, 1);
    return 1;
}

/* ck.dist_step(k): the step the timeout line names; ck.dist_step() -> it */
static int l_dist_step(lua_State *L)
{
    if (lua_isnoneornil(L, 1)) {
        lua_pushinteger(L, ck_dist_step());
        return 1;
    }
    ck_dist_set_step((long long)luaL_checkinteger(L, 1));
    return 0;
}

/* ck.comm_time() -> seconds waited in collectives since the last call (and
 * starts the count again) */
static int l_comm_time(lua_State *L)
{
    lua_pushnumber(L, ck_dist_comm_time(1));
    return 1;
}

/* ck.dist_timeout(seconds): how long one collective may wait for the other
 * ranks before the job ends; ck.dist_timeout() -> it */
static int l_dist_timeout(lua_State *L)
{
    ensure(L);
    if (lua_isnoneornil(L, 1)) {
        lua_pushnumber(L, ck_dist_timeout());
        return 1;
    }
    const lua_Number s = luaL_checknumber(L, 1);
    if (!(s > 0) || s > 1e9) return ck_lua_raise(L, "ck.dist_timeout wants seconds > 0, got %f", s);
    ck_dist_set_timeout(s);
    return 0;
}

void ck_lua_dist_register(lua_State *L, int lib)
{
    static const luaL_Reg fns[] = {
        {"rank", l_rank},
        {"world_size", l_world_size},
        {"local_rank", l_local_rank},
        {"local_size", l_local_size},
        {"barrier", l_barrier},
        {"allreduce", l_allreduce},
        {"broadcast", l_broadcast},
        {"allgather", l_allgather},
        {"reduce_scatter", l_reduce_scatter},
        {"dist_step", l_dist_step},
        {"comm_time", l_comm_time},
        {"dist_timeout", l_dist_timeout},
        {NULL, NULL},
    };
    lib = lua_absindex(L, lib);
    for (const luaL_Reg *f = fns; f->name; f++) {
        lua_pushcfunction(L, f->func);
        lua_setfield(L, lib, f->name);
    }
    lua_pushliteral(L, "sha256");
    lua_rawget(L, lib);
    if (lua_isnil(L, -1)) luaL_error(L, "ck.same_on_all_ranks needs ck.sha256 registered first");
    lua_pushcclosure(L, l_same_on_all_ranks, 1);
    lua_setfield(L, lib, "same_on_all_ranks");
}
