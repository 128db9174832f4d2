/* The `ck` Lua module: graphs, tensors and programs as userdata over vm/graph
 * and vm/program. Op functions only record nodes; errors raised while building
 * name the script line of the user's call, the op and its scope. */
#include "ck.h"
#include "graph/graph.h"
#include "formats/safetensors.h"
#include "guard/host.h"
#include "lua/lua_ck.h"
#include "run/program.h"
#include "plan/offload.h"
#include "util/hash.h"
#include "util/text.h"

#include <lauxlib.h>
#include <lua.h>

#include "../../ops/rng.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GRAPH_MT "ck.graph"

typedef struct lgraph {
    ck_graph *g;
    int nscope;
    char scopes[32][128];
} lgraph;




/* C loops the count hook cannot see: a poll of interrupts and limits every
 * CHARGE_EVERY iterations */
#define CHARGE_EVERY 4096
#define POLL(L, i) \
    do { \
        if (((i) & (CHARGE_EVERY - 1)) == CHARGE_EVERY - 1) ck_limits_charge((L), CHARGE_EVERY); \
    } while (0)

static int build_error(lua_State *L, const ck_graph *g) { return ck_lua_raise(L, "%s", g->err); }

/* ---- graph */

static lgraph *check_graph(lua_State *L, int i) { return luaL_checkudata(L, i, GRAPH_MT); }

static void scope_string(const lgraph *lg, char *buf, size_t len)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < lg->nscope && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ".%s" : "%s", lg->scopes[i]);
}

static void sync_scope(lgraph *lg)
{
    char s[1024];
    scope_string(lg, s, sizeof s);
    ck_graph_set_scope(lg->g, s);
}

/* pushes a tensor handle for id, whose graph userdata is at graph_idx */
static void push_tensor(lua_State *L, int graph_idx, int id)
{
    graph_idx = lua_absindex(L, graph_idx);
    ck_lua_tensor *t = lua_newuserdatauv(L, sizeof *t, 1);
    t->id = id;
    luaL_setmetatable(L, CK_TENSOR_MT);
    lua_pushvalue(L, graph_idx);
    lua_setiuservalue(L, -2, 1);
}

/* the graph of the tensor at index i, pushed on the stack */
static lgraph *tensor_graph(lua_State *L, int i)
{
    lua_getiuservalue(L, i, 1);
    return lua_touserdata(L, -1);
}

static int l_graph_new(lua_State *L)
{
    lgraph *lg = lua_newuserdatauv(L, sizeof *lg, 0);
    memset(lg, 0, sizeof *lg);
    lg->g = ck_graph_new();
    if (!lg->g) return luaL_error(L, "out of memory");
    lg->g->budget = ck_mem_budget_of(L); /* its programs charge it too */
    luaL_setmetatable(L, GRAPH_MT);
    return 1;
}

static int l_graph_gc(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    ck_graph_free(lg->g);
    lg->g = NULL;
    return 0;
}

static void read_shape(lua_State *L, int i, ck_shape *s)
{
    luaL_checktype(L, i, LUA_TTABLE);
    lua_Unsigned n = lua_rawlen(L, i); /* a __len metamethod could claim anything */
    luaL_argcheck(L, n <= CK_MAX_DIMS, i, "too many dims");
    s->ndim = (int)n;
    for (int d = 0; d < s->ndim; d++) {
        lua_rawgeti(L, i, d + 1);
        int ok;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok || v < 0) {
            ck_lua_raise(L, "shape entry %d is not a non-negative integer", d + 1);
        }
        s->d[d] = v;
        lua_pop(L, 1);
    }
}

static int leaf(lua_State *L, ck_kind kind)
{
    lgraph *lg = check_graph(L, 1);
    const char *name = luaL_checkstring(L, 2);
    ck_shape s;
    char full[1024], scope[1024], w[256];
    read_shape(L, 3, &s);
    scope_string(lg, scope, sizeof scope);
    snprintf(full, sizeof full, scope[0] ? "%s.%s" : "%s%s", scope, name);
    ck_lua_where(L, w, sizeof w);
    int id = ck_graph_leaf(lg->g, kind, full, &s, w);
    if (id < 0) return build_error(L, lg->g);
    push_tensor(L, 1, id);
    return 1;
}

static int l_input(lua_State *L) { return leaf(L, CK_KIND_INPUT); }

/* the field k of the table at absolute index t, read raw (no __index), pushed */
static int rawfield(lua_State *L, int t, const char *k)
{
    lua_pushstring(L, k);
    return lua_rawget(L, t);
}

/* g:param(name, shape, {trainable=true, init="kaiming"|"zeros"|"ones"|"normal"|"uniform", std, mean, a, b,
 *                        lr_scale=1 (the optimizer's learning rate times this, for this parameter)})
 * The options are read raw and in full before the tensor is made: no Lua code
 * runs between making it and setting its fields. */
static int l_param(lua_State *L)
{
    enum { ZEROS, ONES, NORMAL, UNIFORM, KAIMING, DEFAULT } init = DEFAULT;
    int trainable = 1;
    float a = 0, b = 1, lr_scale = 1;
    int has_lr_scale = 0;
    const int opts = lua_istable(L, 4);
    if (opts) {
        if (rawfield(L, 4, "trainable") != LUA_TNIL) trainable = lua_toboolean(L, -1);
        lua_pop(L, 1);
        if (rawfield(L, 4, "lr_scale") != LUA_TNIL) {
            const lua_Number v = luaL_checknumber(L, -1);
            if (!(v >= 0 && v <= 1e6)) return ck_lua_raise(L, "param: lr_scale must be in [0, 1e6], got %f", (double)v);
            lr_scale = (float)v;
            has_lr_scale = 1;
        }
        lua_pop(L, 1);
        if (rawfield(L, 4, "init") == LUA_TSTRING || lua_type(L, -1) == LUA_TNUMBER) {
            static const char *const names[] = {"zeros", "ones", "normal", "uniform", "kaiming", NULL};
            const char *s = lua_tostring(L, -1);
            int k = 0;
            while (names[k] && strcmp(names[k], s)) k++;
            if (!names[k]) return ck_lua_raise(L, "unknown init '%s' (zeros, ones, normal, uniform, kaiming)", s);
            init = k;
        }
        lua_pop(L, 1);
        const char *keys[] = {"mean", "std", "a", "b"};
        for (int k = 0; k < 4; k++) {
            rawfield(L, 4, keys[k]);
            if (lua_isnumber(L, -1)) {
                if (k == 0 || k == 2) a = (float)lua_tonumber(L, -1);
                else b = (float)lua_tonumber(L, -1);
            }
            lua_pop(L, 1);
        }
    }
    leaf(L, trainable ? CK_KIND_PARAM : CK_KIND_FROZEN);
    lgraph *lg = check_graph(L, 1);
    ck_tensor *t = &lg->g->t[lg->g->nt - 1];
    if (has_lr_scale) t->lr_scale = lr_scale;
    if (init == DEFAULT) init = t->shape.ndim >= 2 ? KAIMING : ZEROS;
    if (init == ZEROS) t->init = CK_INIT_ZEROS;
    else if (init == ONES) t->init = CK_INIT_ONES;
    else if (init == NORMAL || init == UNIFORM) {
        t->init = init == NORMAL ? CK_INIT_NORMAL : CK_INIT_UNIFORM;
        t->init_a = a;
        t->init_b = b;
    } else {
        /* torch's default for Linear and Conv weights: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
        int64_t fan_in = 1;
        for (int d = 1; d < t->shape.ndim; d++) fan_in *= t->shape.d[d];
        float bound = t->shape.ndim >= 2 && fan_in > 0 ? 1.0f / sqrtf((float)fan_in) : 1.0f;
        t->init = CK_INIT_UNIFORM;
        t->init_a = -bound;
        t->init_b = bound;
    }
    return 1;
}

static int l_push_scope(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    const char *s = luaL_checkstring(L, 2);
    luaL_argcheck(L, lg->nscope < 32, 2, "scopes nested too deep");
    luaL_argcheck(L, strlen(s) < sizeof lg->scopes[0], 2, "scope name too long");
    strcpy(lg->scopes[lg->nscope++], s);
    sync_scope(lg);
    return 0;
}

static int l_pop_scope(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    if (lg->nscope > 0) lg->nscope--;
    sync_scope(lg);
    return 0;
}

/* g:scope(name, fn, ...) runs fn inside the scope and returns what it returns */
static int l_scope(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    luaL_checktype(L, 3, LUA_TFUNCTION);
    int depth = lg->nscope;
    lua_pushcfunction(L, l_push_scope);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 2);
    lua_call(L, 2, 0);
    int base = lua_gettop(L);
    lua_pushvalue(L, 3);
    for (int i = 4; i <= base; i++) lua_pushvalue(L, i);
    int status = lua_pcall(L, base - 3, LUA_MULTRET, 0);
    lg->nscope = depth;
    sync_scope(lg);
    if (status != LUA_OK) return lua_error(L);
    return lua_gettop(L) - base;
}

static int l_current_scope(lua_State *L)
{
    char s[1024];
    scope_string(check_graph(L, 1), s, sizeof s);
    lua_pushstring(L, s);
    return 1;
}

static int l_graph_get(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    int id = ck_graph_find(lg->g, luaL_checkstring(L, 2));
    if (id < 0) return 0;
    push_tensor(L, 1, id);
    return 1;
}

/* g:params() -> list of parameter tensors (trainable and frozen), graph order */
static int l_params(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    lua_newtable(L);
    int k = 0;
    for (int i = 0; i < lg->g->nt; i++) {
        POLL(L, i);
        ck_kind kind = lg->g->t[i].kind;
        if (kind != CK_KIND_PARAM && kind != CK_KIND_FROZEN) continue;
        push_tensor(L, 1, i);
        lua_rawseti(L, -2, ++k);
    }
    return 1;
}

static int l_param_count(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    lua_Integer all = 0, train = 0;
    for (int i = 0; i < lg->g->nt; i++) {
        ck_kind kind = lg->g->t[i].kind;
        if (kind == CK_KIND_PARAM) train += ck_shape_numel(&lg->g->t[i].shape);
        if (kind == CK_KIND_PARAM || kind == CK_KIND_FROZEN) all += ck_shape_numel(&lg->g->t[i].shape);
    }
    lua_pushinteger(L, all);
    lua_pushinteger(L, train);
    return 2;
}

static int l_node_count(lua_State *L)
{
    lua_pushinteger(L, check_graph(L, 1)->g->nn);
    return 1;
}

/* ---- ops: each records one node */

static int record(lua_State *L, enum ck_op op, const int *argidx, int nin, const ck_op_params *p, const ck_shape *preset)
{
    int in[CK_MAX_IN];
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    lgraph *lg = NULL;
    int gidx = 0;
    for (int i = 0; i < nin; i++) {
        ck_lua_tensor *t = ck_lua_check_tensor(L, argidx[i]);
        lgraph *o = tensor_graph(L, argidx[i]);
        if (!lg) {
            lg = o;
            gidx = lua_gettop(L);
        } else {
            lua_pop(L, 1);
            if (o != lg) {
                return ck_lua_raise(L, "%s: inputs belong to different graphs", ck_op_name(op));
            }
        }
        in[i] = t->id;
    }
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (preset) outs[0] = *preset;
    char w[256];
    ck_lua_where(L, w, sizeof w);
    if (ck_graph_node(lg->g, op, in, nin, p, outs, NULL, ids, w) < 0) return build_error(L, lg->g);
    push_tensor(L, gidx, ids[0]);
    return 1;
}

static const ck_op_params NOPARAMS;

static int unary(lua_State *L, enum ck_op op)
{
    int a[1] = {1};
    return record(L, op, a, 1, &NOPARAMS, NULL);
}

static int binary(lua_State *L, enum ck_op op)
{
    int a[2] = {1, 2};
    return record(L, op, a, 2, &NOPARAMS, NULL);
}

static int l_mse_loss(lua_State *L) { return binary(L, CK_OP_MSE_LOSS); }

static int approx_arg(lua_State *L, int i)
{
    const char *s = luaL_optstring(L, i, "none");
    if (strcmp(s, "none") == 0 || strcmp(s, "erf") == 0) return 0;
    if (strcmp(s, "tanh") == 0) return 1;
    return luaL_argerror(L, i, "approximation must be 'none' or 'tanh'");
}

static int l_gelu(lua_State *L)
{
    ck_op_params p = {0};
    int a[1] = {1};
    p.i[0] = approx_arg(L, 2);
    return record(L, CK_OP_GELU, a, 1, &p, NULL);
}

static int l_geglu(lua_State *L)
{
    ck_op_params p = {0};
    int a[1] = {1};
    p.i[0] = approx_arg(L, 2);
    return record(L, CK_OP_GEGLU, a, 1, &p, NULL);
}

static float num_or_tensor(lua_State *L, int i) { return (float)lua_tonumber(L, i); }

static int scale_of(lua_State *L, int t, float s)
{
    ck_op_params p = {0};
    int a[1] = {t};
    p.f[0] = s;
    return record(L, CK_OP_SCALE, a, 1, &p, NULL);
}

static int l_scale(lua_State *L) { return scale_of(L, 1, (float)luaL_checknumber(L, 2)); }

/* a + b, a - b, a * b where either may be a number */
static int arith(lua_State *L, enum ck_op op)
{
    int an = lua_isnumber(L, 1), bn = lua_isnumber(L, 2);
    if (!an && !bn) return binary(L, op);
    if (an && bn) return luaL_error(L, "two numbers");
    if (op == CK_OP_MUL) return scale_of(L, an ? 2 : 1, num_or_tensor(L, an ? 1 : 2));
    return ck_lua_raise(L, "%s: adding a number to a tensor is not supported; use a tensor", ck_op_name(op));
}

static int l_add(lua_State *L) { return arith(L, CK_OP_ADD); }
static int l_sub(lua_State *L) { return arith(L, CK_OP_SUB); }
static int l_mul(lua_State *L) { return arith(L, CK_OP_MUL); }
static int l_unm(lua_State *L) { return scale_of(L, 1, -1.0f); }

/* options tables are read raw: a metamethod could run anything, and the
 * bindings hold pointers into graphs and programs while they read */
static int opt_int(lua_State *L, int t, const char *k, int def)
{
    if (!lua_istable(L, t)) return def;
    rawfield(L, lua_absindex(L, t), k);
    int v = lua_isnil(L, -1) ? def : (int)luaL_checkinteger(L, -1);
    lua_pop(L, 1);
    return v;
}

static double opt_num(lua_State *L, int t, const char *k, double def)
{
    if (!lua_istable(L, t)) return def;
    rawfield(L, lua_absindex(L, t), k);
    double v = lua_isnil(L, -1) ? def : luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

static int opt_bool(lua_State *L, int t, const char *k, int def)
{
    if (!lua_istable(L, t)) return def;
    rawfield(L, lua_absindex(L, t), k);
    int v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* matmul(a, b [, {trans_a=, trans_b=}]) */
static int l_matmul(lua_State *L)
{
    ck_op_params p = {0};
    int a[2] = {1, 2};
    p.i[0] = opt_bool(L, 3, "trans_a", 0);
    p.i[1] = opt_bool(L, 3, "trans_b", 0);
    return record(L, CK_OP_MATMUL, a, 2, &p, NULL);
}

/* linear(x, w [, b]) */
static int l_linear(lua_State *L)
{
    int a[3] = {1, 2, 3};
    return record(L, CK_OP_LINEAR, a, lua_isnoneornil(L, 3) ? 2 : 3, &NOPARAMS, NULL);
}

/* linear_geglu(x, w [, b] [, approximate]): geglu(linear(x, w, b)) as one op */
static int l_linear_geglu(lua_State *L)
{
    ck_op_params p = {0};
    int a[3] = {1, 2, 3};
    const int has_b = luaL_testudata(L, 3, CK_TENSOR_MT) != NULL;
    p.i[0] = approx_arg(L, lua_type(L, 3) == LUA_TSTRING ? 3 : 4);
    return record(L, CK_OP_LINEAR_GEGLU, a, has_b ? 3 : 2, &p, NULL);
}

/* conv2d(x, w [, b] [, {stride=1, padding=0}]) */
static int l_conv2d(lua_State *L)
{
    ck_op_params p = {0};
    int a[3] = {1, 2, 3};
    int has_b = luaL_testudata(L, 3, CK_TENSOR_MT) != NULL;
    int o = lua_istable(L, 3) ? 3 : 4; /* the bias may be nil or left out */
    int stride = opt_int(L, o, "stride", 1), pad = opt_int(L, o, "padding", 0);
    p.i[0] = p.i[1] = stride;
    p.i[2] = p.i[3] = pad;
    return record(L, CK_OP_CONV2D, a, has_b ? 3 : 2, &p, NULL);
}

static int group_norm_op(lua_State *L, enum ck_op op)
{
    ck_op_params p = {0};
    int a[3] = {1, 3, 4};
    p.i[0] = luaL_checkinteger(L, 2);
    p.f[0] = (float)luaL_optnumber(L, 5, 1e-5);
    return record(L, op, a, 3, &p, NULL);
}

/* group_norm(x, groups, gamma, beta [, eps=1e-5]) */
static int l_group_norm(lua_State *L) { return group_norm_op(L, CK_OP_GROUP_NORM); }

/* group_norm_silu(x, groups, gamma, beta [, eps=1e-5]): silu(group_norm(...)) as one op */
static int l_group_norm_silu(lua_State *L) { return group_norm_op(L, CK_OP_GROUP_NORM_SILU); }

/* whether argument i is a tensor; nil (or none) is not, anything else is an error */
static int opt_tensor(lua_State *L, int i)
{
    if (lua_isnoneornil(L, i)) return 0;
    luaL_argexpected(L, luaL_testudata(L, i, CK_TENSOR_MT) != NULL, i, "tensor or nil");
    return 1;
}

/* layer_norm(x [, gamma [, beta]] [, eps=1e-5]): gamma and beta nil: no affine
 * (elementwise_affine=False); beta nil: no bias */
static int l_layer_norm(lua_State *L)
{
    ck_op_params p = {0};
    int a[3] = {1, 2, 3};
    const int has_g = opt_tensor(L, 2), has_b = opt_tensor(L, 3);
    if (has_b && !has_g)
        return ck_lua_raise(L, "layer_norm: a bias needs a weight (give both, the weight alone, or neither)");
    p.f[0] = (float)luaL_optnumber(L, 4, 1e-5);
    return record(L, CK_OP_LAYER_NORM, a, 1 + has_g + has_b, &p, NULL);
}

/* rms_norm(x [, weight] [, eps=1e-6]): x / sqrt(mean(x^2) + eps) * weight over the last dim */
static int l_rms_norm(lua_State *L)
{
    ck_op_params p = {0};
    int a[2] = {1, 2};
    const int has_w = opt_tensor(L, 2);
    p.f[0] = (float)luaL_optnumber(L, 3, 1e-6);
    return record(L, CK_OP_RMS_NORM, a, 1 + has_w, &p, NULL);
}

/* rope(x, table [, {inverse=false}]): x [.., L, F] rotated pairwise by the
 * cosines and sines of table [L, D] (nn.rope_table), a graph input: inputs
 * stay fp32 under mixed precision, as the op's contract wants of its table */
static int l_rope(lua_State *L)
{
    ck_op_params p = {0};
    int a[2] = {1, 2};
    const ck_lua_tensor *t = ck_lua_check_tensor(L, 2);
    const lgraph *lg = tensor_graph(L, 2);
    const ck_kind k = lg->g->t[t->id].kind;
    lua_pop(L, 1);
    if (k != CK_KIND_INPUT)
        return ck_lua_raise(L, "rope: the table must be a graph input (g:input), which stays fp32 under mixed "
                            "precision; this one is of kind '%s'", ck_graph_kind_name(k));
    p.i[0] = opt_bool(L, 3, "inverse", 0);
    return record(L, CK_OP_ROPE, a, 2, &p, NULL);
}

/* modulate(x, shift, scale): (1 + scale) * x + shift, shift and scale [B, C] over x [B, .., C] */
static int l_modulate(lua_State *L)
{
    int a[3] = {1, 2, 3};
    return record(L, CK_OP_MODULATE, a, 3, &NOPARAMS, NULL);
}

/* gate(x, gate, y): x + gate * y, gate [B, C] over x and y [B, .., C] */
static int l_gate(lua_State *L)
{
    int a[3] = {1, 2, 3};
    return record(L, CK_OP_GATE, a, 3, &NOPARAMS, NULL);
}

/* attention(q, k, v, heads [, scale]) */
static int l_attention(lua_State *L)
{
    ck_op_params p = {0};
    int a[3] = {1, 2, 3};
    p.i[0] = luaL_checkinteger(L, 4);
    p.f[0] = (float)luaL_optnumber(L, 5, 0.0);
    return record(L, CK_OP_ATTENTION, a, 3, &p, NULL);
}

/* dims are 0-based as in PyTorch; negative counts from the end */
static int64_t norm_dim(lua_State *L, lua_Integer d, int ndim, int arg)
{
    if (d < 0) d += ndim;
    luaL_argcheck(L, d >= 0 && d < ndim, arg, "dim out of range");
    return d;
}

static const ck_shape *shape_of(lua_State *L, int i)
{
    ck_lua_tensor *t = ck_lua_check_tensor(L, i);
    lgraph *lg = tensor_graph(L, i);
    lua_pop(L, 1);
    return &lg->g->t[t->id].shape;
}

/* concat(a, b [, dim=1]) */
static int l_concat(lua_State *L)
{
    ck_op_params p = {0};
    int a[2] = {1, 2};
    p.i[0] = norm_dim(L, luaL_optinteger(L, 3, 1), shape_of(L, 1)->ndim, 3);
    return record(L, CK_OP_CONCAT, a, 2, &p, NULL);
}

/* slice(x, dim, start, length), start 0-based */
static int l_slice(lua_State *L)
{
    ck_op_params p = {0};
    int a[1] = {1};
    p.i[0] = norm_dim(L, luaL_checkinteger(L, 2), shape_of(L, 1)->ndim, 2);
    p.i[1] = luaL_checkinteger(L, 3);
    p.i[2] = luaL_checkinteger(L, 4);
    return record(L, CK_OP_SLICE, a, 1, &p, NULL);
}

/* reshape(x, {dims}) with at most one -1 */
static int l_reshape(lua_State *L)
{
    const int64_t numel = ck_shape_numel(shape_of(L, 1));
    ck_shape s;
    int a[1] = {1}, infer = -1;
    luaL_checktype(L, 2, LUA_TTABLE);
    const lua_Unsigned nd = lua_rawlen(L, 2);
    luaL_argcheck(L, nd <= CK_MAX_DIMS, 2, "too many dims");
    s.ndim = (int)nd;
    int64_t known = 1;
    for (int d = 0; d < s.ndim; d++) {
        lua_rawgeti(L, 2, d + 1);
        s.d[d] = luaL_checkinteger(L, -1);
        lua_pop(L, 1);
        if (s.d[d] == -1) {
            luaL_argcheck(L, infer < 0, 2, "more than one -1");
            infer = d;
        } else {
            luaL_argcheck(L, s.d[d] >= 0, 2, "negative dim");
            luaL_argcheck(L, s.d[d] == 0 || known <= INT64_MAX / s.d[d], 2, "more elements than a tensor can hold");
            known *= s.d[d];
        }
    }
    if (infer >= 0) s.d[infer] = known ? numel / known : 0;
    return record(L, CK_OP_RESHAPE, a, 1, &NOPARAMS, &s);
}

/* permute(x, {dims}) with 0-based dims */
static int l_permute(lua_State *L)
{
    ck_op_params p = {0};
    int a[1] = {1};
    luaL_checktype(L, 2, LUA_TTABLE);
    const lua_Unsigned n = lua_rawlen(L, 2);
    luaL_argcheck(L, n == (lua_Unsigned)shape_of(L, 1)->ndim, 2, "permutation length differs from the rank");
    for (int d = 0; d < (int)n; d++) {
        lua_rawgeti(L, 2, d + 1);
        p.i[d] = luaL_checkinteger(L, -1);
        lua_pop(L, 1);
    }
    return record(L, CK_OP_PERMUTE, a, 1, &p, NULL);
}

/* timestep_embedding(t, dim [, {flip_sin_to_cos=false, shift=1, max_period=10000, scale=1}]) */
static int l_timestep_embedding(lua_State *L)
{
    ck_op_params p = {0};
    int a[1] = {1};
    p.i[0] = luaL_checkinteger(L, 2);
    p.i[1] = opt_bool(L, 3, "flip_sin_to_cos", 0);
    p.f[0] = (float)opt_num(L, 3, "shift", 1.0);
    p.f[1] = (float)opt_num(L, 3, "max_period", 10000.0);
    p.f[2] = (float)opt_num(L, 3, "scale", 1.0);
    return record(L, CK_OP_TIMESTEP_EMBEDDING, a, 1, &p, NULL);
}

/* embedding(ids, table): the rows of table [V, D] that ids (whole numbers
 * stored as floats) name; out [ids.., D] */
static int l_embedding(lua_State *L) { return binary(L, CK_OP_EMBEDDING); }

/* dropout(x, p): each call site gets its own key, so replays draw the same mask */
static int l_dropout(lua_State *L)
{
    ck_op_params p = {0};
    int a[1] = {1};
    p.f[0] = (float)luaL_checknumber(L, 2);
    lgraph *lg = tensor_graph(L, 1);
    lua_pop(L, 1);
    p.i[0] = lg->g->nn + 1;
    return record(L, CK_OP_DROPOUT, a, 1, &p, NULL);
}

/* ---- tensor fields */

static int l_tensor_index(lua_State *L)
{
    ck_lua_tensor *lt = ck_lua_check_tensor(L, 1);
    const char *k = luaL_checkstring(L, 2);
    lgraph *lg = tensor_graph(L, 1);
    const ck_tensor *t = &lg->g->t[lt->id];
    if (strcmp(k, "shape") == 0) {
        const ck_shape shape = t->shape; /* a collection step in createtable could grow the graph */
        lua_createtable(L, shape.ndim, 0);
        for (int d = 0; d < shape.ndim; d++) {
            lua_pushinteger(L, shape.d[d]);
            lua_rawseti(L, -2, d + 1);
        }
    } else if (strcmp(k, "ndim") == 0) lua_pushinteger(L, t->shape.ndim);
    else if (strcmp(k, "numel") == 0) lua_pushinteger(L, ck_shape_numel(&t->shape));
    else if (strcmp(k, "name") == 0) lua_pushstring(L, t->name);
    else if (strcmp(k, "scope") == 0) lua_pushstring(L, t->scope);
    else if (strcmp(k, "where") == 0) lua_pushstring(L, t->where);
    else if (strcmp(k, "kind") == 0) lua_pushstring(L, ck_graph_kind_name(t->kind));
    else if (strcmp(k, "id") == 0) lua_pushinteger(L, lt->id);
    else if (strcmp(k, "graph") == 0) lua_pushvalue(L, -1 - 0);
    else {
        /* methods: the ck functions */
        lua_getfield(L, lua_upvalueindex(1), k);
    }
    return 1;
}

static int l_tensor_tostring(lua_State *L)
{
    ck_lua_tensor *lt = ck_lua_check_tensor(L, 1);
    lgraph *lg = tensor_graph(L, 1);
    const ck_tensor *t = &lg->g->t[lt->id];
    char s[128];
    lua_pushfstring(L, "ck.tensor(%s %s, %s)", t->name ? t->name : "#", ck_shape_str(&t->shape, s, sizeof s),
                    ck_graph_kind_name(t->kind));
    return 1;
}

static void set_kind(lua_State *L, ck_kind from, ck_kind to)
{
    ck_lua_tensor *lt = ck_lua_check_tensor(L, 1);
    lgraph *lg = tensor_graph(L, 1);
    ck_tensor *t = &lg->g->t[lt->id];
    if (t->kind != from && t->kind != to) luaL_error(L, "only parameters can be frozen or trained");
    if (t->kind != to) {
        for (int i = 0; i < lg->g->nn; i++)
            for (int j = 0; j < lg->g->n[i].nin; j++)
                if (lg->g->n[i].in[j] == lt->id) luaL_error(L, "'%s' is already used by an op; freeze it before use", t->name);
    }
    t->kind = to;
    t->needs_grad = to == CK_KIND_PARAM;
}

static int l_freeze(lua_State *L)
{
    set_kind(L, CK_KIND_PARAM, CK_KIND_FROZEN);
    lua_settop(L, 1);
    return 1;
}

static int l_train(lua_State *L)
{
    set_kind(L, CK_KIND_FROZEN, CK_KIND_PARAM);
    lua_settop(L, 1);
    return 1;
}

/* ---- compile and run */







/* Copies the strings a and b point at into one userdata left on the stack,
 * and points them at the copies. */
static void keep_patterns(lua_State *L, const char **a, int na, const char **b, int nb)
{
    size_t bytes = 1;
    for (int i = 0; i < na; i++) bytes += strlen(a[i]) + 1;
    for (int i = 0; i < nb; i++) bytes += strlen(b[i]) + 1;
    char *at = lua_newuserdatauv(L, bytes, 0);
    for (int k = 0; k < 2; k++) {
        const char **s = k ? b : a;
        for (int i = 0; i < (k ? nb : na); i++) {
            const size_t n = strlen(s[i]) + 1;
            memcpy(at, s[i], n);
            s[i] = at;
            at += n;
        }
    }
}


/* The decision's figures into the policy table's `report` table, when it
 * has one (ck.fit weighs budgets by them): none_peak, and when nothing fits
 * floor, floor_without and floor_offload (see plan.h's ck_decide_report);
 * a figure not known is left out. */
static void report_out(lua_State *L, const ck_decide_report *rep)
{
    rawfield(L, 2, "checkpoint");
    if (lua_istable(L, -1)) {
        lua_pushliteral(L, "report");
        lua_rawget(L, -2);
        if (lua_istable(L, -1)) {
            const struct { const char *k; size_t v; } f[] = {{"none_peak", rep->none_peak}, {"floor", rep->floor},
                {"floor_without", rep->floor_without}, {"floor_offload", rep->floor_offload}};
            for (size_t k = 0; k < sizeof f / sizeof *f; k++) {
                if (!f[k].v) continue;
                lua_pushstring(L, f[k].k);
                lua_pushinteger(L, (lua_Integer)f[k].v);
                lua_rawset(L, -3);
            }
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* g:compile{loss=, outputs={...}, optimizer="adamw"|"adamw8bit"|"lion"|"sgd"|"none", lr=, betas={b1,b2}, eps=,
 *           weight_decay=,
 *           max_grad_norm=, accumulate=, fused_backward=, world_size=, bucket_mb=,
 *           seed=, keep_grads=, cuda_graph=, plan_only=, precision="no"|"bf16"|"fp16" (or storage="fp32"|"bf16"|"fp16"),
 *           loss_scale={init=, growth_factor=, backoff_factor=, growth_interval=}|true|false,
 *           frozen="fp8"|"bf16", checkpoint=, device="cpu"|"cuda"|"auto",
 *           offload="none"|"activations"|"auto", prefetch=N, gpu=NAME (the cost model's device: vm/plan/cost.c),
 *           stream={block names} (their frozen weights streamed from pinned host memory: vm/plan/offload.c),
 *           stream_trainable= (their trainable weights and optimizer state too),
 *           offload_optimizer= (every optimizer state in pinned host memory, brought in for its update),
 *           stats={grads=, acts=, blocks={patterns}} (what logging steps compute, planned into the one arena),
 *           share=program (weights, optimizer state, counters and arena shared with that program's group)} */
static int l_compile(lua_State *L)
{
    lgraph *lg = check_graph(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    ck_compile_opts o = {0};
    lua_settop(L, 2);
    /* share = a program: this one's weights, optimizer state, counters and
     * arena are that program's group's (ck_group); pinned while this compiles */
    if (rawfield(L, 2, "share") != LUA_TNIL) { /* at index 3 */
        if (!luaL_testudata(L, 3, CK_PROGRAM_MT)) return ck_lua_raise(L, "compile: share must be a program");
        o.share = ck_lua_pin_program(L, 3, 3)->p;
    } else {
        lua_pop(L, 1);
    }
    int outs[256];
    o.loss = -1;
    if (rawfield(L, 2, "loss") != LUA_TNIL) o.loss = ck_lua_tensor_id(L, -1);
    lua_pop(L, 1);
    if (rawfield(L, 2, "outputs") == LUA_TTABLE) {
        const lua_Unsigned n = lua_rawlen(L, -1);
        luaL_argcheck(L, n <= 256, 2, "too many outputs");
        for (int i = 0; i < (int)n; i++) {
            lua_rawgeti(L, -1, i + 1);
            outs[o.noutputs++] = ck_lua_tensor_id(L, -1);
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    o.outputs = outs;
    rawfield(L, 2, "optimizer");
    const char *opt = luaL_optstring(L, -1, "adamw");
    if (strcmp(opt, "adamw") == 0) o.optim = CK_OPTIM_ADAMW;
    else if (strcmp(opt, "sgd") == 0) o.optim = CK_OPTIM_SGD;
    else if (strcmp(opt, "lion") == 0) o.optim = CK_OPTIM_LION;
    else if (strcmp(opt, "adamw8bit") == 0) o.optim = CK_OPTIM_ADAMW8;
    else if (strcmp(opt, "none") == 0) o.optim = CK_OPTIM_NONE;
    else return luaL_error(L, "unknown optimizer '%s' (adamw, adamw8bit, lion, sgd, none)", opt);
    lua_pop(L, 1);
    o.lr = (float)opt_num(L, 2, "lr", 1e-3);
    o.eps = (float)opt_num(L, 2, "eps", 1e-8);
    o.weight_decay = (float)opt_num(L, 2, "weight_decay", o.optim == CK_OPTIM_ADAMW || o.optim == CK_OPTIM_ADAMW8 ? 1e-2 : 0.0);
    o.max_grad_norm = (float)opt_num(L, 2, "max_grad_norm", 0.0);
    const double acc = opt_num(L, 2, "accumulate", 1);
    if (!(acc >= 1 && acc <= 1e6 && acc == (double)(int)acc))
        return ck_lua_raise(L, "compile: accumulate must be a whole number of steps >= 1, got %f", acc);
    o.accumulate = (int)acc;
    if (o.optim == CK_OPTIM_NONE && (o.accumulate > 1 || o.max_grad_norm > 0))
        return ck_lua_raise(L, "compile: %s needs an optimizer (optimizer = \"none\" here)",
                            o.accumulate > 1 ? "accumulate" : "max_grad_norm");
    if (!(o.max_grad_norm >= 0.0f))
        return ck_lua_raise(L, "compile: max_grad_norm must be a positive norm (or 0: no clipping), got %f",
                            (double)o.max_grad_norm);
    o.fused_backward = opt_bool(L, 2, "fused_backward", 0);
    /* data parallel: the job's ranks (default 1: this process alone), and the
     * buckets' size cap in MiB (DDP's bucket_cap_mb, 25) */
    const double world = opt_num(L, 2, "world_size", 1);
    if (!(world >= 1 && world <= 65536 && world == (double)(int)world))
        return ck_lua_raise(L, "compile: world_size must be a whole number of ranks >= 1, got %f", world);
    o.world = (int)world;
    const double bucket_mb = opt_num(L, 2, "bucket_mb", 25);
    if (!(bucket_mb > 0 && bucket_mb <= 1 << 20))
        return ck_lua_raise(L, "compile: bucket_mb must be a size in MiB > 0, got %f", bucket_mb);
    o.bucket_bytes = (size_t)(bucket_mb * 1048576.0);
    /* ZeRO-1: the optimizer state split over the ranks; rank: the one a
     * plan-only program plans (a runnable one is this process's) */
    o.shard = opt_bool(L, 2, "shard_optimizer", 0);
    const double prank = opt_num(L, 2, "rank", 0);
    if (!(prank >= 0 && prank < world && prank == (double)(int)prank))
        return ck_lua_raise(L, "compile: rank must be a whole number from 0 to world_size - 1, got %f", prank);
    o.rank = (int)prank;
    if (o.shard && o.world < 2)
        return ck_lua_raise(L, "compile: shard_optimizer splits the optimizer state over the ranks: give world_size > 1");
    if (o.fused_backward && (o.optim == CK_OPTIM_NONE || o.accumulate > 1 || o.max_grad_norm > 0))
        return ck_lua_raise(L, "compile: fused_backward updates each parameter as soon as its gradient is complete, "
                            "so it cannot %s", o.optim == CK_OPTIM_NONE ? "go without an optimizer"
                            : o.accumulate > 1 ? "accumulate gradients" : "clip by the norm of all gradients");
    o.beta1 = 0.9f;
    o.beta2 = o.optim == CK_OPTIM_LION ? 0.99f : 0.999f; /* torch's AdamW, lion-pytorch's Lion */
    if (rawfield(L, 2, "betas") == LUA_TTABLE) {
        lua_rawgeti(L, -1, 1);
        o.beta1 = (float)luaL_checknumber(L, -1);
        lua_rawgeti(L, -2, 2);
        o.beta2 = (float)luaL_checknumber(L, -1);
        lua_pop(L, 2);
    }
    lua_pop(L, 1);
    rawfield(L, 2, "seed");
    int whole = 1;
    const lua_Integer seed = lua_isnil(L, -1) ? 0 : lua_tointegerx(L, -1, &whole);
    if (!whole) /* no luaL_tolstring: a __tostring would run */
        return ck_lua_raise(L, "compile: seed must be a whole number of at most 64 bits, got %s",
                            lua_type(L, -1) == LUA_TNUMBER || lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                                                              : luaL_typename(L, -1));
    o.seed = (uint64_t)seed;
    lua_pop(L, 1);
    o.keep_grads = opt_bool(L, 2, "keep_grads", 0);
    o.no_cuda_graph = !opt_bool(L, 2, "cuda_graph", 1);
    const ck_host *host = ck_host_of(L);
    o.plan_only = opt_bool(L, 2, "plan_only", host && host->plan_only);
    /* precision: the storage choice by the name kohya's and diffusers'
     * --mixed_precision give it ("no" is fp32); storage: the same choice */
    o.storage = CK_F32;
    int chosen = 0;
    const char *chose = NULL;
    for (int k = 0; k < 2; k++) {
        const char *key = k ? "precision" : "storage";
        if (rawfield(L, 2, key) != LUA_TNIL) {
            const char *v = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            ck_dtype d = CK_F32;
            if (v && !strcmp(v, "bf16")) d = CK_BF16;
            else if (v && !strcmp(v, "fp16")) d = CK_F16;
            else if (!(v && (!strcmp(v, "fp32") || (k && !strcmp(v, "no")))))
                return ck_lua_raise(L, "compile: %s must be %s, got %s%s%s", key,
                                    k ? "no (fp32), bf16 or fp16" : "fp32, bf16 or fp16", v ? "'" : "",
                                    v ? v : luaL_typename(L, -1), v ? "'" : "");
            if (chosen && d != o.storage)
                return ck_lua_raise(L, "compile: precision = '%s' and storage = '%s' differ (they name one choice: "
                                    "give one)", v, chose);
            o.storage = d;
            chosen = 1;
            chose = v;
        }
        lua_pop(L, 1);
    }
    /* loss scaling: on by default with fp16 (its gradients underflow
     * without), off otherwise; false: off; a table: GradScaler's settings */
    o.scaler = (ck_loss_scale){o.storage == CK_F16, 65536.0f, 2.0f, 0.5f, 2000};
    const int ls = rawfield(L, 2, "loss_scale");
    if (ls == LUA_TBOOLEAN) o.scaler.on = lua_toboolean(L, -1);
    else if (ls == LUA_TTABLE) {
        static const char *const keys[] = {"init", "growth_factor", "backoff_factor", "growth_interval", NULL};
        const int t = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, t)) {
            int known = 0;
            for (int i = 0; keys[i] && !known; i++) known = lua_type(L, -2) == LUA_TSTRING && !strcmp(lua_tostring(L, -2), keys[i]);
            if (!known)
                return ck_lua_raise(L, "compile: loss_scale takes init, growth_factor, backoff_factor and "
                                    "growth_interval, got '%s'", lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?");
            lua_pop(L, 1);
        }
        const double init = opt_num(L, t, "init", 65536.0), grow = opt_num(L, t, "growth_factor", 2.0),
                     back = opt_num(L, t, "backoff_factor", 0.5), every = opt_num(L, t, "growth_interval", 2000);
        if (!(init > 0 && init <= 3.0e38))
            return ck_lua_raise(L, "compile: loss_scale.init must be a finite number > 0, got %f", init);
        if (!(grow > 1 && grow <= 1e6))
            return ck_lua_raise(L, "compile: loss_scale.growth_factor must be > 1, got %f", grow);
        if (!(back > 0 && back < 1))
            return ck_lua_raise(L, "compile: loss_scale.backoff_factor must be between 0 and 1, got %f", back);
        if (!(every >= 1 && every <= 16777216 && every == (double)(int)every))
            return ck_lua_raise(L, "compile: loss_scale.growth_interval must be a whole number of updates from 1 to "
                                "2^24, got %f", every);
        o.scaler = (ck_loss_scale){1, (float)init, (float)grow, (float)back, (int)every};
    } else if (ls != LUA_TNIL)
        return ck_lua_raise(L, "compile: loss_scale must be a table of GradScaler's settings, true or false, got %s",
                            luaL_typename(L, -1));
    lua_pop(L, 1);
    /* frozen weights narrower than storage: fp8 (e4m3, kohya's --fp8_base) or bf16 */
    rawfield(L, 2, "frozen");
    if (!lua_isnil(L, -1)) {
        const char *fz = lua_tostring(L, -1);
        if (fz && !strcmp(fz, "fp8")) o.frozen = CK_F8E4M3;
        else if (fz && !strcmp(fz, "bf16")) o.frozen = CK_BF16;
        else return ck_lua_raise(L, "compile: frozen must be fp8 or bf16 (frozen weights' storage), got '%s'",
                                 fz ? fz : luaL_typename(L, -1));
    }
    lua_pop(L, 1);
    /* the device: compile{device=}, else the VM's (--device), else auto */
    rawfield(L, 2, "device");
    const char *device = luaL_optstring(L, -1, host ? host->device : "auto");
    char derr[512];
    o.be = ck_program_backend_find(device, o.plan_only, derr, sizeof derr);
    if (!o.be) return ck_lua_raise(L, "compile: %s", derr);
    lua_pop(L, 1);
    /* what logging steps will compute: planned now, so the arena is sized once */
    const char *stat_blocks[64];
    rawfield(L, 2, "stats");
    ck_lua_stats_request(L, -1, &o, stat_blocks);
    rawfield(L, 2, "checkpoint");
    ck_lua_policy policy;
    ck_lua_policy_opts(L, -1, &policy, &o);
    /* offload: saved activations to host memory and back (vm/plan/offload.c);
     * gpu: the device whose speeds predict step times (vm/plan/cost.c) */
    rawfield(L, 2, "offload");
    const char *off = lua_isnil(L, -1) ? "none" : lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (off && !strcmp(off, "none")) o.offload = CK_OFFLOAD_NONE;
    else if (off && !strcmp(off, "activations")) o.offload = CK_OFFLOAD_ACTIVATIONS;
    else if (off && !strcmp(off, "auto")) o.offload = CK_OFFLOAD_AUTO;
    else return ck_lua_raise(L, "compile: offload must be none, activations or auto, got %s%s%s", off ? "'" : "",
                             off ? off : luaL_typename(L, -1), off ? "'" : "");
    lua_pop(L, 1);
    const double prefetch = opt_num(L, 2, "prefetch", 0);
    if (!(prefetch >= 0 && prefetch <= 1e6 && prefetch == (double)(int)prefetch))
        return ck_lua_raise(L, "compile: prefetch must be a whole number of entries >= 0 (0: the default, %d), got %g",
                            CK_PREFETCH_DEFAULT, prefetch);
    o.prefetch = (int)prefetch;
    /* stream: the blocks whose frozen weights live in pinned host memory and
     * are brought in per use (kohya's --blocks_to_swap): copied into one
     * userdata left on the stack, which a policy function cannot drop */
    if (rawfield(L, 2, "stream") != LUA_TNIL) {
        if (!lua_istable(L, -1)) return ck_lua_raise(L, "compile: stream must be a list of block names, got %s",
                                                     luaL_typename(L, -1));
        const lua_Unsigned ns = lua_rawlen(L, -1);
        if (ns > 65536) return ck_lua_raise(L, "compile: stream: at most 65536 block names, got %d", (int)ns);
        size_t bytes = sizeof(char *) * (size_t)(ns ? ns : 1);
        for (lua_Unsigned i = 1; i <= ns; i++) {
            if (lua_rawgeti(L, -1, (lua_Integer)i) != LUA_TSTRING)
                return ck_lua_raise(L, "compile: stream[%d] must be a block name (a string), got %s", (int)i,
                                    luaL_typename(L, -1));
            bytes += lua_rawlen(L, -1) + 1;
            lua_pop(L, 1);
        }
        const char **names = lua_newuserdatauv(L, bytes, 0);
        char *at = (char *)(names + (ns ? ns : 1));
        for (lua_Unsigned i = 1; i <= ns; i++) {
            lua_rawgeti(L, -2, (lua_Integer)i);
            size_t len;
            const char *name = lua_tolstring(L, -1, &len);
            memcpy(at, name, len + 1);
            names[i - 1] = at;
            at += len + 1;
            lua_pop(L, 1);
        }
        o.stream = names;
        o.nstream = (int)ns;
        lua_remove(L, -2); /* the copy stays on the stack until compile returns */
    } else {
        lua_pop(L, 1);
    }
    /* stream_trainable: the streamed blocks' trainable weights and their
     * optimizer state too; offload_optimizer: every optimizer state in
     * pinned host memory, brought in for its update */
    o.stream_trainable = opt_bool(L, 2, "stream_trainable", 0);
    o.offload_optimizer = opt_bool(L, 2, "offload_optimizer", 0);
    if (o.stream_trainable && !o.nstream)
        return ck_lua_raise(L, "compile: stream_trainable streams the trainable weights of the blocks stream names: "
                            "give stream");
    if (o.offload_optimizer && o.optim == CK_OPTIM_NONE)
        return ck_lua_raise(L, "compile: offload_optimizer moves the optimizer's state to host memory: it needs an "
                            "optimizer (optimizer = \"none\" here)");
    rawfield(L, 2, "gpu");
    if (!lua_isnil(L, -1)) {
        const char *gpu = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (!gpu || !(o.speed = ck_cost_device_find(gpu))) {
            char names[512] = "";
            for (const ck_device_speed *d = ck_cost_device_table(); d->name; d++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "", d->name);
            return ck_lua_raise(L, "compile: gpu '%s' is not in the cost model's table (%s)", gpu ? gpu : "?", names);
        }
    }
    lua_pop(L, 1);
    /* a policy function runs while the program compiles: it could drop the
     * tables these patterns live in, so the compile reads copies */
    keep_patterns(L, stat_blocks, o.nstat_blocks, policy.patterns, policy.pol.npatterns);
    char err[512];
    ck_lua_prog *lp = lua_newuserdatauv(L, sizeof *lp, 1);
    lp->p = NULL;
    lp->pins = lp->closing = 0;
    luaL_setmetatable(L, CK_PROGRAM_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    ck_decide_report rep = {0};
    o.report = &rep;
    lp->p = ck_compile(lg->g, &o, err, sizeof err);
    report_out(L, &rep);
    if (!lp->p) {
        return ck_lua_raise(L, "compile: %s", err);
    }
    /* a host that embeds the VM may stop runs through this flag (vm/embed/ck.c) */
    lp->p->interrupt = host ? &host->lim.interrupt : NULL;
    return 1;
}

/* Unreachable, so no binding holds it (a pin refers to it). */
static int l_program_gc(lua_State *L)
{
    ck_lua_prog *lp = luaL_checkudata(L, 1, CK_PROGRAM_MT);
    ck_program_free(lp->p);
    lp->p = NULL;
    return 0;
}

/* A `<close>` variable of a program: deferred while a binding has it pinned
 * (the binding finishes on the program, which reads as closed already). */
static int l_program_close(lua_State *L)
{
    ck_lua_prog *lp = luaL_checkudata(L, 1, CK_PROGRAM_MT);
    if (lp->pins > 0) {
        lp->closing = 1;
        return 0;
    }
    ck_program_free(lp->p);
    lp->p = NULL;
    return 0;
}


/* Values are read raw (no __index or __len: Lua code there could close the
 * program or free the buffer being filled). Polls by the entries visited at
 * every level, so nested short lists cannot hide a long loop. */
typedef struct flat {
    float *dst;
    int64_t n, k;      /* room in dst, values seen */
    long long visited; /* entries, tables included */
} flat;

static void flatten(lua_State *L, int t, flat *f, int depth)
{
    if (depth > CK_MAX_DIMS + 1) luaL_error(L, "values nested too deep (deeper than any tensor)");
    luaL_checkstack(L, 4, "values nested too deep");
    const lua_Unsigned len = lua_rawlen(L, t);
    for (lua_Unsigned i = 1; i <= len; i++) {
        POLL(L, f->visited);
        f->visited++;
        if (lua_rawgeti(L, t, (lua_Integer)i) == LUA_TTABLE) flatten(L, lua_gettop(L), f, depth + 1);
        else {
            int ok;
            lua_Number v = lua_tonumberx(L, -1, &ok);
            if (!ok) luaL_error(L, "values must be numbers");
            if (f->k < f->n) f->dst[f->k] = (float)v;
            f->k++;
        }
        lua_pop(L, 1);
    }
}

/* p:set(tensor|name, values [, index]): a number fills; a (nested) table gives
 * every element; with index, only that entry of the batch (the first dim).
 * The values are read raw into a buffer first, the program pinned; nothing
 * points into the program's graph while Lua allocates (a collection step). */
static int l_set(lua_State *L)
{
    ck_program *p = ck_lua_pin_program(L, 1, 4)->p;
    int id = ck_lua_program_tensor(L, p, 2);
    const ck_shape shape = p->g->t[id].shape;
    if (p->poff[id] < 0)
        return luaL_error(L, "'%s' is not an input or parameter", p->g->t[id].name ? p->g->t[id].name : "tensor");
    if (!ck_program_data(p, id)) return luaL_error(L, "set: a plan-only program holds no values");
    int64_t n = ck_shape_numel(&shape), at = 0;
    int entry = !lua_isnoneornil(L, 4);
    if (entry) { /* one entry of the batch (first dim), 1-based */
        lua_Integer b = luaL_checkinteger(L, 4);
        luaL_argcheck(L, shape.ndim >= 1 && b >= 1 && b <= shape.d[0], 4, "index out of the batch");
        n /= shape.d[0];
        at = (b - 1) * n;
    }
    int64_t an = 0;
    float *tmp = ck_lua_toarray_numel(L, 3, &an);
    if (tmp && an != n) {
        char s[128];
        const char *name = p->g->t[id].name;
        return luaL_error(L, "'%s' %s%s has %I elements, got an array of %I", name ? name : "tensor",
                          ck_shape_str(&shape, s, sizeof s), entry ? " entry" : "", (lua_Integer)n, (lua_Integer)an);
    }
    if (!tmp && !lua_isnumber(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        tmp = lua_newuserdatauv(L, sizeof(float) * (size_t)(n ? n : 1), 0);
        flat f = {tmp, n, 0, 0};
        flatten(L, 3, &f, 0);
        const int64_t k = f.k;
        if (k != n) {
            char s[128];
            const char *name = p->g->t[id].name;
            return luaL_error(L, "'%s' %s%s has %d elements, got %d values", name ? name : "tensor",
                              ck_shape_str(&shape, s, sizeof s), entry ? " entry" : "", (int)n, (int)k);
        }
    }
    const float v = tmp ? 0.0f : (float)lua_tonumber(L, 3);
    float *x = ck_program_write_begin(p, id, entry);
    if (!x) return luaL_error(L, "set: %s", p->err);
    /* the copy polls too: a stop leaves the tensor part written */
    for (int64_t i = 0; i < n; i += 1 << 16) {
        const int64_t m = n - i < 1 << 16 ? n - i : 1 << 16;
        if (tmp) memcpy(x + at + i, tmp + i, sizeof(float) * (size_t)m);
        else
            for (int64_t j = 0; j < m; j++) x[at + i + j] = v;
        if (i) ck_limits_charge(L, m >> 4);
    }
    if (ck_program_write_end(p, id)) return luaL_error(L, "set: %s", p->err);
    return 0;
}

static const float *readable(lua_State *L, ck_program *p, int id)
{
    const float *x = ck_program_read(p, id);
    if (!x && p->err[0]) luaL_error(L, "%s", p->err);
    if (!x) {
        const ck_tensor *t = &p->g->t[id];
        luaL_error(L, "%s: tensor from this line was not kept by the last run; list it in compile{outputs=...}",
                   t->where);
    }
    return x;
}

/* p:get(tensor|name) -> flat table of numbers */
static int l_get(lua_State *L)
{
    ck_program *p = ck_lua_pin_program(L, 1, 2)->p;
    int id = ck_lua_program_tensor(L, p, 2);
    const float *x = readable(L, p, id);
    int64_t n = ck_shape_numel(&p->g->t[id].shape);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        POLL(L, i);
        lua_pushnumber(L, x[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* p:scalar(tensor|name [, index]) -> number */
static int l_scalar(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    int id = ck_lua_program_tensor(L, p, 2);
    lua_Integer i = luaL_optinteger(L, 3, 1);
    luaL_argcheck(L, i >= 1 && i <= ck_shape_numel(&p->g->t[id].shape), 3, "index out of range");
    lua_pushnumber(L, readable(L, p, id)[i - 1]);
    return 1;
}

/* p:grad(param) -> flat table; needs compile{keep_grads=true} */
static int l_grad(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    int id = ck_lua_program_tensor(L, p, 2);
    int gid = p->g->t[id].grad;
    if (gid < 0) return luaL_error(L, "'%s' has no gradient", p->g->t[id].name ? p->g->t[id].name : "tensor");
    ck_lua_pin_program(L, 1, 1);
    const float *x = ck_program_read(p, gid);
    if (!x) return luaL_error(L, "%s", p->err[0] ? p->err : "gradients are not kept; compile with keep_grads = true");
    int64_t n = ck_shape_numel(&p->g->t[gid].shape);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        POLL(L, i);
        lua_pushnumber(L, x[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int push_loss(lua_State *L, ck_program *p)
{
    const float *x = p->loss >= 0 ? ck_program_read(p, p->loss) : NULL;
    if (!x && p->loss >= 0 && p->err[0]) return luaL_error(L, "%s", p->err);
    if (!x) return 0;
    lua_pushnumber(L, x[0]);
    return 1;
}

/* p:step([{lr=, stats=, guard=, measure=}]) -> loss, info: always both, the
 * loss first (nil without one) and a table of what the step measured
 * (vm/lua/lua_log.c). measure = true adds info.high_water, the arena's
 * measured high-water mark (bytes), found by scanning a sentinel fill. */
static int l_step(lua_State *L)
{
    /* pinned: the options' metamethods (read by ck_lua_log_step) may run Lua */
    ck_program *p = ck_lua_pin_program(L, 1, 2)->p;
    if (lua_istable(L, 2)) p->opt.lr = (float)opt_num(L, 2, "lr", p->opt.lr);
    return ck_lua_log_step(L, p);
}

/* p:checksum(tensor|name [, "grad"]) -> hex digest of the bytes (FNV-1a 64) of a
 * tensor or of its gradient (compile with keep_grads): bitwise comparisons
 * without copying values into Lua */
static int l_checksum(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    int id = ck_lua_program_tensor(L, p, 2);
    if (lua_isstring(L, 3) && strcmp(lua_tostring(L, 3), "grad") == 0) {
        id = p->g->t[id].grad;
        if (id < 0) return luaL_error(L, "no gradient");
    }
    const unsigned char *x = (const unsigned char *)ck_program_read(p, id);
    if (!x) return luaL_error(L, "%s", p->err[0] ? p->err : "tensor is not readable now");
    size_t n = (size_t)ck_shape_numel(&p->g->t[id].shape) * sizeof(float);
    uint64_t h = CK_FNV_OFFSET;
    for (size_t i = 0; i < n; i += 0x10000) {
        ck_limits_charge(L, 4096);
        h = ck_fnv1a(h, x + i, n - i < 0x10000 ? n - i : 0x10000);
    }
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
    lua_pushstring(L, buf);
    return 1;
}

static int l_forward(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    if (ck_program_forward(p)) return luaL_error(L, "%s", p->err);
    return push_loss(L, p);
}

/* p:init_own(): the tensors only p holds in its group (its own frozen
 * weights and inputs) back to their compiled initial values */
static int l_init_own(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    if (ck_program_init_own(p)) return luaL_error(L, "%s", p->err);
    return 0;
}

static void set_int(lua_State *L, const char *k, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* p:plan() -> the plan of the training list (the forward list when nothing
 * trains): peak (the arena's high-water mark), live_peak, persistent,
 * transient, workspace, arena, device_bytes (the device memory the program
 * takes: the arena in the allocator's pages, and the backend's fixed bytes),
 * ops, recompute_ops, activation_bytes,
 * step_flops, recompute_flops, conv_workspace and conv_workspace_max (the
 * workspace of the list's convolutions, summed and the largest: on cuda the
 * algorithms chosen per shape), conv_rule (how those were sized: "chosen"
 * on a CUDA device, "stated" for cuda without one (ops/rules.c), "cpu"), at_peak = {category = bytes live at the peak},
 * decide_seconds and plan_seconds (this thread's CPU time for the checkpoint
 * policy's decision and for the training list's plan, placement included),
 * none_peak (where an auto or percentage-budget decision placed the list with
 * no recompute: that peak),
 * and layout_digest: 16 hex digits over every list of the program (training,
 * forward, logging), their entries and every offset, equal for two programs
 * planned the same to the byte */
static int l_plan(lua_State *L)
{
    ck_program *p = ck_lua_pin_program(L, 1, 1)->p;
    const ck_plan *pl = p->train.n ? &p->train : &p->eval;
    int nrec = 0;
    size_t conv_ws = 0, conv_ws_max = 0;
    for (int i = 0; i < pl->n; i++) {
        nrec += pl->ops[i].phase == CK_PHASE_RECOMPUTE;
        if (pl->ops[i].xfer) continue;
        const enum ck_op op = p->g->n[pl->ops[i].node].op;
        if (pl->ws_bytes && (op == CK_OP_CONV2D || op == CK_OP_CONV2D_BWD_DATA || op == CK_OP_CONV2D_BWD_FILTER)) {
            conv_ws += pl->ws_bytes[i];
            if (pl->ws_bytes[i] > conv_ws_max) conv_ws_max = pl->ws_bytes[i];
        }
    }
    lua_newtable(L);
    set_int(L, "peak", (lua_Integer)pl->peak);
    set_int(L, "live_peak", (lua_Integer)pl->live_peak);
    set_int(L, "persistent", (lua_Integer)p->persistent);
    set_int(L, "transient", (lua_Integer)pl->transient);
    set_int(L, "workspace", (lua_Integer)pl->workspace);
    set_int(L, "arena", (lua_Integer)p->arena_bytes);
    /* programs that share weights (compile{share=}): their one arena, and the bytes of it they share */
    set_int(L, "group_arena", (lua_Integer)p->grp->need);
    set_int(L, "world_size", (lua_Integer)(p->opt.world > 1 ? p->opt.world : 1));
    set_int(L, "buckets", (lua_Integer)p->nbuckets);
    set_int(L, "bucket_bytes", (lua_Integer)p->bucket_total);
    set_int(L, "shared", (lua_Integer)p->grp->shared);
    set_int(L, "group_id", (lua_Integer)(uintptr_t)p->grp); /* equal for the members of one group */
    set_int(L, "device_bytes", (lua_Integer)ck_program_device_bytes(p->be, p->grp->need)); /* the group's one arena */
    set_int(L, "ops", pl->n);
    set_int(L, "recompute_ops", nrec);
    set_int(L, "conv_workspace", (lua_Integer)conv_ws);
    set_int(L, "conv_workspace_max", (lua_Integer)conv_ws_max);
    lua_pushstring(L, p->be->host ? "cpu" : p->be == ck_backend_cuda_plan() ? "stated" : "chosen");
    lua_setfield(L, -2, "conv_rule");
    set_int(L, "activation_bytes", (lua_Integer)pl->activation_bytes);
    set_num(L, "step_flops", pl->step_flops);
    set_num(L, "recompute_flops", pl->recompute_flops);
    lua_newtable(L);
    for (int c = 0; c < CK_CAT_COUNT; c++) set_int(L, ck_plan_cat_names[c], (lua_Integer)pl->at_peak[c]);
    lua_setfield(L, -2, "at_peak");
    set_num(L, "decide_seconds", p->decide_seconds);
    set_num(L, "plan_seconds", p->plan_seconds);
    if (p->none_peak) set_int(L, "none_peak", (lua_Integer)p->none_peak);
    /* offload: the host region's bytes, the bytes a step moves each way, the
     * transfers, the prefetch distance; and what the joint search said */
    set_int(L, "host_bytes", (lua_Integer)pl->host_peak);
    /* streamed weights and optimizer state: their pinned bytes (the group's;
     * of them, the trained weights' and the optimizer state's) and the bytes
     * a run brings in */
    set_int(L, "weights_host_bytes", (lua_Integer)p->grp->weight_bytes);
    size_t trained = 0, state = 0;
    for (int t = 0; p->streamed && t < p->g->nt; t++) {
        const size_t b = p->streamed[t] ? (ck_tensor_bytes(&p->g->t[t]) + 63) / 64 * 64 : 0;
        if (p->g->t[t].kind == CK_KIND_PARAM) trained += b;
        if (p->g->t[t].kind == CK_KIND_OPTSTATE) state += b;
    }
    set_int(L, "streamed_trained_bytes", (lua_Integer)trained);
    set_int(L, "streamed_state_bytes", (lua_Integer)state);
    set_int(L, "stream_bytes", (lua_Integer)pl->stream_bytes);
    set_int(L, "offload_bytes", (lua_Integer)pl->offload_bytes);
    set_int(L, "transfers", pl->nslots);
    set_int(L, "prefetch", pl->prefetch);
    if (p->offload_why[0]) {
        lua_pushstring(L, p->offload_why);
        lua_setfield(L, -2, "decision");
    }
    /* the cost model's step time for the device it was given (gpu=, or the
     * CPU's figures; a GPU not named is taken as an H100, as the joint search takes it) */
    const ck_device_speed *dev = p->opt.speed ? p->opt.speed : ck_cost_backend_speed(p->be);
    if (!dev) {
        dev = ck_cost_device_find("H100");
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "speed_assumed");
    }
    if (dev) {
        ck_step_time st;
        ck_plan_step_time(pl, p->g, dev, &st);
        lua_pushstring(L, dev->name);
        lua_setfield(L, -2, "speed_of");
        set_num(L, "predicted_step_seconds", st.step);
        set_num(L, "predicted_compute_seconds", st.compute);
        set_num(L, "predicted_recompute_seconds", st.recompute);
        set_num(L, "predicted_copy_seconds", st.copies);
        set_num(L, "predicted_stall_seconds", st.stalled);
    }
    uint64_t h = ck_plan_digest(&p->eval, ck_plan_digest(&p->train, CK_FNV_OFFSET));
    for (int k = 0; k <= CK_STATS_ALL; k++) h = ck_plan_digest(&p->logplan[k], h);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    lua_pushstring(L, hex);
    lua_setfield(L, -2, "layout_digest");
    return 1;
}

/* p:outside_plan() -> what the process holds beside the program's arena, in
 * bytes: graph (the graph the program was compiled from, its differentiated
 * copy and every op list), stage (the host copy of the largest tensor a read or
 * write can need: 0 on the CPU with fp32 tensors), device_fixed (device memory
 * the backend holds outside every plan), file_buffer (safetensors' buffers:
 * one file read and one written at once), lua_heap, lua_heap_peak and
 * lua_heap_limit (0: none), libraries (the code and data mapped from the
 * executable and its libraries now: RssFile) and threads (the CPU's worker
 * threads; 1 on a device) */
static int l_outside_plan(lua_State *L)
{
    ck_lua_prog *lp = ck_lua_pin_program(L, 1, 1);
    ck_program *p = lp->p;
    size_t graph = ck_program_host_bytes(p);
    lua_getiuservalue(L, 1, 1);
    const lgraph *lg = luaL_testudata(L, -1, GRAPH_MT);
    if (lg && lg->g) graph += ck_graph_host_bytes(lg->g);
    lua_pop(L, 1);
    const ck_host *host = ck_host_of(L);
    lua_newtable(L);
    set_int(L, "graph", (lua_Integer)graph);
    set_int(L, "stage", (lua_Integer)ck_program_stage_bound(p));
    set_int(L, "device_fixed", (lua_Integer)p->be->fixed_bytes);
    /* one file read and one written at a time, as the stdlib does */
    set_int(L, "file_buffer", (lua_Integer)(2 * (size_t)CK_ST_IO_BUFFER));
    set_int(L, "lua_heap", (lua_Integer)(host ? host->lim.heap_used : (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024));
    set_int(L, "lua_heap_peak", (lua_Integer)(host ? host->lim.heap_peak : 0));
    set_int(L, "lua_heap_limit", (lua_Integer)(host ? host->lim.heap_limit : 0));
    const long long libraries = ck_proc_kb_field("/proc/self/status", "RssFile");
    set_int(L, "libraries", libraries > 0 ? (lua_Integer)libraries : 0);
    set_int(L, "threads", p->be->nthreads > 0 ? p->be->nthreads : 1);
    return 1;
}

/* p:timeline() -> {phase = {"forward"|"recompute"|"backward"|"optimizer", ...},
 * <category> = {live bytes at each op, ...}, ...} of the training list */
static int l_timeline(lua_State *L)
{
    ck_program *p = ck_lua_pin_program(L, 1, 1)->p;
    const ck_plan *pl = p->train.n ? &p->train : &p->eval;
    size_t *cat = ck_plan_timeline(pl, p->g, p->persistent, p->retain, p->be);
    if (!cat) return luaL_error(L, "out of memory");
    /* held by a userdata, so a raise below (memory, a poll) cannot leak it */
    const size_t bytes = sizeof *cat * (size_t)(pl->n ? pl->n : 1) * CK_CAT_COUNT;
    size_t *held = lua_newuserdatauv(L, bytes, 0);
    memcpy(held, cat, bytes);
    free(cat);
    cat = held;
    lua_newtable(L);
    lua_createtable(L, pl->n, 0);
    for (int i = 0; i < pl->n; i++) {
        POLL(L, i);
        lua_pushstring(L, ck_graph_phase_name(pl->ops[i].phase));
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "phase");
    for (int c = 0; c < CK_CAT_COUNT; c++) {
        lua_createtable(L, pl->n, 0);
        for (int i = 0; i < pl->n; i++) {
            POLL(L, i);
            lua_pushinteger(L, (lua_Integer)cat[(size_t)i * CK_CAT_COUNT + c]);
            lua_rawseti(L, -2, i + 1);
        }
        lua_setfield(L, -2, ck_plan_cat_names[c]);
    }
    return 1;
}

/* p:state_tensors() -> names of what a training state holds: trainable
 * parameters and optimizer state, in graph order */
static int l_state_tensors(lua_State *L)
{
    ck_program *p = ck_lua_pin_program(L, 1, 1)->p;
    lua_newtable(L);
    int k = 0;
    for (int t = 0; t < p->g->nt; t++) {
        POLL(L, t);
        ck_kind kind = p->g->t[t].kind;
        if ((kind == CK_KIND_PARAM || kind == CK_KIND_OPTSTATE) && p->g->t[t].name) {
            lua_pushstring(L, p->g->t[t].name);
            lua_rawseti(L, -2, ++k);
        }
    }
    return 1;
}

static int l_program_index(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    const char *k = luaL_checkstring(L, 2);
    if (strcmp(k, "steps") == 0) lua_pushinteger(L, p->grp->step);
    else if (strcmp(k, "updates") == 0) lua_pushinteger(L, p->grp->updates);
    else if (strcmp(k, "micro") == 0) lua_pushinteger(L, p->grp->micro);
    else if (strcmp(k, "accumulate") == 0) lua_pushinteger(L, p->opt.accumulate > 1 ? p->opt.accumulate : 1);
    else if (strcmp(k, "lr") == 0) lua_pushnumber(L, p->opt.lr);
    else if (strcmp(k, "training") == 0) lua_pushboolean(L, !p->eval_mode);
    else if (strcmp(k, "loss_scale") == 0) { /* the scale the next step uses; nil without loss scaling */
        const float *x = p->scale_t >= 0 ? ck_program_read(p, p->scale_t) : NULL;
        if (p->scale_t >= 0 && !x) return luaL_error(L, "%s", p->err[0] ? p->err : "a plan-only program holds no values");
        if (x) lua_pushnumber(L, x[0]);
        else lua_pushnil(L);
    }
    else lua_getfield(L, lua_upvalueindex(1), k);
    return 1;
}

static int l_program_newindex(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    const char *k = luaL_checkstring(L, 2);
    if (strcmp(k, "lr") == 0) p->opt.lr = (float)luaL_checknumber(L, 3);
    else if (strcmp(k, "training") == 0) { /* torch's train()/eval(): whether forward passes apply dropout */
        luaL_checktype(L, 3, LUA_TBOOLEAN);
        p->eval_mode = !lua_toboolean(L, 3);
    }
    else if (strcmp(k, "steps") == 0 || strcmp(k, "updates") == 0) { /* restoring a saved training state */
        lua_Integer n = luaL_checkinteger(L, 3);
        /* below 2^53: the step after it, and its double in a log record, stay exact */
        luaL_argcheck(L, n >= 0 && n < ((lua_Integer)1 << 53), 3, "steps and updates must be from 0 to 2^53 - 1");
        if (k[0] == 's') p->grp->step = n;
        else p->grp->updates = n;
    } else if (strcmp(k, "micro") == 0) { /* likewise: the steps summed since the last update */
        lua_Integer n = luaL_checkinteger(L, 3);
        luaL_argcheck(L, n >= 0 && n < (p->opt.accumulate > 1 ? p->opt.accumulate : 1), 3,
                      "micro must be >= 0 and below the program's accumulate");
        p->grp->micro = n;
    }
    else return luaL_error(L, "cannot set '%s' on a program", k);
    return 0;
}

/* ck.random(seed, step, key, index) -> uniform in [0, 1) from the counter-based generator */
static int l_random(lua_State *L)
{
    uint64_t stream = ck_rng_key((uint64_t)luaL_checkinteger(L, 1), (uint64_t)luaL_checkinteger(L, 2),
                                 (uint64_t)luaL_checkinteger(L, 3));
    lua_pushnumber(L, ck_rng_uniform(stream, (uint64_t)luaL_checkinteger(L, 4)));
    return 1;
}

/* ck.randn(seed, step, key, index) -> standard normal */
static int l_randn(lua_State *L)
{
    uint64_t stream = ck_rng_key((uint64_t)luaL_checkinteger(L, 1), (uint64_t)luaL_checkinteger(L, 2),
                                 (uint64_t)luaL_checkinteger(L, 3));
    lua_pushnumber(L, ck_rng_normal(stream, (uint64_t)luaL_checkinteger(L, 4)));
    return 1;
}

/* p:randn(tensor, key [, scale [, step [, rows]]]) fills an input with normal
 * numbers keyed by (seed, step, key) and each element's index; the step
 * defaults to the one the next p:step() runs. rows: for each row of the
 * tensor (its first dimension), the row of a larger batch whose numbers it
 * takes (0-based): a data-parallel rank's share of the global batch gets the
 * numbers one process gives those samples. */
static int l_fill_randn(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    int id = ck_lua_program_tensor(L, p, 2);
    uint64_t key = (uint64_t)luaL_checkinteger(L, 3);
    float scale = (float)luaL_optnumber(L, 4, 1.0);
    if (p->poff[id] < 0 || !p->grp->arena) return luaL_error(L, "randn: not an input or parameter, or a plan-only program");
    int64_t n = ck_shape_numel(&p->g->t[id].shape);
    lua_Integer step = luaL_optinteger(L, 5, p->grp->step + 1);
    const ck_shape *sh = &p->g->t[id].shape;
    const int64_t nrows = sh->ndim > 0 ? sh->d[0] : 1, per = nrows > 0 ? n / nrows : 0;
    int have_rows = !lua_isnoneornil(L, 6);
    if (have_rows) {
        luaL_checktype(L, 6, LUA_TTABLE);
        if ((int64_t)lua_rawlen(L, 6) != nrows)
            return luaL_error(L, "randn: rows lists %d rows, the tensor has %d", (int)lua_rawlen(L, 6), (int)nrows);
        for (int64_t r = 0; r < nrows; r++) {
            lua_rawgeti(L, 6, r + 1);
            int whole = 0;
            const lua_Integer v = lua_tointegerx(L, -1, &whole);
            lua_pop(L, 1);
            if (!whole || v < 0 || v > ((lua_Integer)1 << 40))
                return luaL_error(L, "randn: rows[%d] must be a row number >= 0", (int)r + 1);
        }
    }
    uint64_t stream = ck_rng_key(p->opt.seed, (uint64_t)step, key);
    float *x = ck_program_write_begin(p, id, 0);
    if (!x) return luaL_error(L, "randn: %s", p->err);
    for (int64_t r = 0, i = 0; r < nrows; r++) {
        uint64_t from = (uint64_t)(r * per);
        if (have_rows) {
            lua_rawgeti(L, 6, r + 1);
            from = (uint64_t)lua_tointeger(L, -1) * (uint64_t)per;
            lua_pop(L, 1);
        }
        for (int64_t j = 0; j < per; j++, i++) {
            POLL(L, i);
            x[i] = scale * ck_rng_normal(stream, from + (uint64_t)j);
        }
    }
    if (ck_program_write_end(p, id)) return luaL_error(L, "randn: %s", p->err);
    return 0;
}

/* The op constructors, ck.<id>, from ops.def's lua column: custom ones are
 * l_<id> above; unary ones (x -> op(x), no parameters) are made here. */
#define LUA_FN_no(E, id)
#define LUA_FN_custom(E, id)
#define LUA_FN_unary(E, id) \
    static int l_##id(lua_State *L) { return unary(L, CK_OP_##E); }
#define CK_OP(E, id, lo, hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) LUA_FN_##lua(E, id)
#include "../../ops/ops.def"

#define LUA_REG_no(id)
#define LUA_REG_custom(id) {#id, l_##id},
#define LUA_REG_unary(id) {#id, l_##id},
static const luaL_Reg op_funcs[] = {
#define CK_OP(E, id, lo, hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) LUA_REG_##lua(id)
#include "../../ops/ops.def"
    {"freeze", l_freeze},
    {"random", l_random},
    {"randn", l_randn},
    {"train", l_train},
    {NULL, NULL},
};

static const luaL_Reg graph_methods[] = {
    {"input", l_input},
    {"param", l_param},
    {"scope", l_scope},
    {"push_scope", l_push_scope},
    {"pop_scope", l_pop_scope},
    {"current_scope", l_current_scope},
    {"get", l_graph_get},
    {"params", l_params},
    {"param_count", l_param_count},
    {"node_count", l_node_count},
    {"compile", l_compile},
    {NULL, NULL},
};

/* p:device() -> the backend's name ("cpu", "cuda"), the bytes of device
 * memory it holds outside every plan (library workspaces; 0 on the CPU), and
 * its allocator's page (2 MiB on CUDA; 1 on the CPU) */
/* ck.device_layout([name]) -> device, fixed bytes, granule: how a program's
 * arena becomes device bytes on that device (default ck.device; plan-only
 * figures where it has no device), as p:device() says after a compile */
static int l_device_layout(lua_State *L)
{
    const ck_host *host = ck_host_of(L);
    const char *name = luaL_optstring(L, 1, host ? host->device : "auto");
    char err[512];
    const ck_backend *be = ck_program_backend_find(name, 1, err, sizeof err);
    if (!be) return ck_lua_raise(L, "device_layout: %s", err);
    lua_pushstring(L, be->name);
    lua_pushinteger(L, (lua_Integer)be->fixed_bytes);
    lua_pushinteger(L, (lua_Integer)(be->granule > 1 ? be->granule : 1));
    return 3;
}

static int l_program_device(lua_State *L)
{
    ck_program *p = ck_lua_check_program(L, 1)->p;
    lua_pushstring(L, p->be->name);
    lua_pushinteger(L, (lua_Integer)p->be->fixed_bytes);
    lua_pushinteger(L, (lua_Integer)(p->be->granule > 1 ? p->be->granule : 1));
    return 3;
}

/* p:graphs() -> {captures =, launches =, op_by_op =}: the ranges of p's lists
 * captured as CUDA graphs, the graph launches since, and the runs of a range
 * that went op by op with replay on (profiling, collectives, read-backs);
 * all 0 where lists are not captured (the CPU, compile{cuda_graph = false}) */
static int l_program_graphs(lua_State *L)
{
    const ck_program *p = ck_lua_check_program(L, 1)->p;
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, (lua_Integer)p->graphs.captures);
    lua_setfield(L, -2, "captures");
    lua_pushinteger(L, (lua_Integer)p->graphs.launches);
    lua_setfield(L, -2, "launches");
    lua_pushinteger(L, (lua_Integer)p->graphs.op_by_op);
    lua_setfield(L, -2, "op_by_op");
    return 1;
}

/* ck.devices() -> the names of the devices this process can run on, e.g. {"cpu", "cuda"} */
static int l_devices(lua_State *L)
{
    lua_createtable(L, 2, 0);
    lua_pushstring(L, "cpu");
    lua_rawseti(L, -2, 1);
    if (!strcmp(ck_program_default_device(), "cuda")) {
        lua_pushstring(L, "cuda");
        lua_rawseti(L, -2, 2);
    }
    return 1;
}

/* ck.device_memory() -> free, total bytes of the CUDA device (cudaMemGetInfo),
 * opening it first when needed; nothing where there is none */
static int l_device_memory(lua_State *L)
{
    size_t f, t;
    char err[256];
    if (ck_cuda_devices() == 0 || !ck_backend_cuda(err, sizeof err) || ck_cuda_memory(&f, &t)) return 0;
    lua_pushinteger(L, (lua_Integer)f);
    lua_pushinteger(L, (lua_Integer)t);
    return 2;
}

/* ck.cuda_options{deterministic = true|false, tf32 = true|false}: how the
 * CUDA backend picks algorithms for the programs run from now on */
static int l_cuda_options(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    rawfield(L, 1, "deterministic");
    int det = lua_isnil(L, -1) ? -1 : lua_toboolean(L, -1);
    rawfield(L, 1, "tf32");
    int tf32 = lua_isnil(L, -1) ? -1 : lua_toboolean(L, -1);
    char err[512];
    if (ck_cuda_configure(det, tf32, err, sizeof err)) return ck_lua_raise(L, "cuda_options: %s", err);
    return 0;
}

static const luaL_Reg program_methods[] = {
    {"device", l_program_device},
    {"graphs", l_program_graphs},
    {"set", l_set},
    {"get", l_get},
    {"scalar", l_scalar},
    {"grad", l_grad},
    {"step", l_step},
    {"forward", l_forward},
    {"init_own", l_init_own},
    {"plan", l_plan},
    {"outside_plan", l_outside_plan},
    {"randn", l_fill_randn},
    {"checksum", l_checksum},
    {"timeline", l_timeline},
    {"state_tensors", l_state_tensors},
    {NULL, NULL},
};

/* the one name ck.so exports (libck.so hides it: cmake/libck.map) */
/* The module's core (vm/lua/lua_init.c calls these): the module table with
 * the op constructors, the graph and tensor metatables, then the program
 * metatable with its method table left on the stack for the other binding
 * files to add to; its index is returned. */
int ck_lua_core_open(lua_State *L)
{
    luaL_newlib(L, op_funcs);
    int lib = lua_gettop(L);

    luaL_newmetatable(L, GRAPH_MT);
    luaL_newlib(L, graph_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_graph_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);

    luaL_newmetatable(L, CK_TENSOR_MT);
    lua_pushvalue(L, lib);
    lua_pushcclosure(L, l_tensor_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_tensor_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushcfunction(L, l_add);
    lua_setfield(L, -2, "__add");
    lua_pushcfunction(L, l_sub);
    lua_setfield(L, -2, "__sub");
    lua_pushcfunction(L, l_mul);
    lua_setfield(L, -2, "__mul");
    lua_pushcfunction(L, l_unm);
    lua_setfield(L, -2, "__unm");
    lua_pop(L, 1);

    luaL_newmetatable(L, CK_PROGRAM_MT);
    luaL_newlib(L, program_methods);
    return lib;
}

/* The program metatable finished (its method table, on the stack, as its
 * __index's upvalue) and popped; the graph, device and version fields of the
 * module table at lib. */
void ck_lua_core_close(lua_State *L, int lib)
{
    lua_pushcclosure(L, l_program_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_program_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, l_program_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_program_close);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);

    lua_pushcfunction(L, l_graph_new);
    lua_setfield(L, lib, "graph");
    lua_pushcfunction(L, l_devices);
    lua_setfield(L, lib, "devices");
    lua_pushcfunction(L, l_device_memory);
    lua_setfield(L, lib, "device_memory");
    lua_pushcfunction(L, l_device_layout);
    lua_setfield(L, lib, "device_layout");
    lua_pushcfunction(L, l_cuda_options);
    lua_setfield(L, lib, "cuda_options");
    /* ck.device: where programs compile to by default (--device; in a stock
     * lua5.4, cuda when a device is present, else cpu) */
    const ck_host *host = ck_host_of(L);
    lua_pushstring(L, host ? host->device : ck_program_default_device());
    lua_setfield(L, lib, "device");
    lua_pushstring(L, CK_VERSION);
    lua_setfield(L, lib, "version");
}
