/* Checkpoint policies from Lua: g:compile{checkpoint = ...} takes a policy
 * table built by stdlib/ck/policy.lua, or a Lua function called once per
 * candidate activation with {op, scope, shape, bytes, flops, block} that
 * returns "save" or "recompute". */
#include "lua/lua_ck.h"
#include "plan/policy.h"

#include <lauxlib.h>

#include <stdio.h>
#include <string.h>

#define MAX_PATTERNS 64

static int op_by_name(const char *name)
{
    for (int op = 1; op < CK_OP_COUNT; op++)
        if (strcmp(ck_op_name((enum ck_op)op), name) == 0) return op;
    return -1;
}

/* the Lua function policy, called for every candidate */
static int decide_function(void *ud, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen)
{
    ck_lua_policy *lp = ud;
    lua_State *L = lp->L;
    const ck_graph *g = c->g;
    for (int k = 0; k < c->ncand; k++) {
        int t = c->cand[k];
        const ck_tensor *x = &g->t[t];
        const ck_node *nd = &g->n[x->node];
        ck_shape ins[CK_MAX_IN];
        for (int j = 0; j < nd->nin; j++) ins[j] = g->t[nd->in[j]].shape;
        char block[512];
        lua_pushvalue(L, lp->fn);
        lua_createtable(L, 0, 7);
        lua_pushstring(L, ck_op_name(nd->op));
        lua_setfield(L, -2, "op");
        lua_pushstring(L, x->scope);
        lua_setfield(L, -2, "scope");
        lua_createtable(L, x->shape.ndim, 0);
        for (int d = 0; d < x->shape.ndim; d++) {
            lua_pushinteger(L, x->shape.d[d]);
            lua_rawseti(L, -2, d + 1);
        }
        lua_setfield(L, -2, "shape");
        lua_pushinteger(L, (lua_Integer)ck_tensor_bytes(x));
        lua_setfield(L, -2, "bytes");
        lua_pushnumber(L, ck_op_flops(nd->op, &nd->p, ins, nd->nin, &x->shape));
        lua_setfield(L, -2, "flops");
        lua_pushstring(L, ck_policy_block_of(x->scope, block, sizeof block));
        lua_setfield(L, -2, "block");
        lua_pushstring(L, x->where);
        lua_setfield(L, -2, "where");
        if (ck_lua_pcall_limited(L, 1, 1) != LUA_OK) { /* under the callback instruction budget */
            const char *msg = lua_isstring(L, -1) ? lua_tostring(L, -1) : NULL; /* not error({}) */
            snprintf(err, errlen, "checkpoint policy: %s", msg ? msg : luaL_typename(L, -1));
            lua_pop(L, 1);
            return -1;
        }
        const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (s && strcmp(s, "save") == 0) recompute[t] = 0;
        else if (s && strcmp(s, "recompute") == 0) recompute[t] = 1;
        else {
            snprintf(err, errlen,
                     "checkpoint policy function (%s) returned %s%s%s for %s in %s; expected \"save\" or \"recompute\"",
                     lp->defined, s ? "\"" : "", s ? s : luaL_typename(L, -1), s ? "\"" : "", ck_op_name(nd->op),
                     x->scope[0] ? x->scope : "(top)");
            lua_pop(L, 1);
            return -1;
        }
        lua_pop(L, 1);
    }
    return 0;
}

static int decide_builtin(void *ud, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen)
{
    ck_lua_policy *lp = ud;
    return ck_policy_decide(&lp->pol, c, recompute, err, errlen);
}

/* the policy table is read raw: compile holds pointers while it reads */
static int raw_field(lua_State *L, int t, const char *k)
{
    lua_pushstring(L, k);
    return lua_rawget(L, t);
}

static double num_field(lua_State *L, int t, const char *k, double def)
{
    raw_field(L, t, k);
    double v = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : def;
    lua_pop(L, 1);
    return v;
}

int ck_lua_policy_opts(lua_State *L, int idx, ck_lua_policy *lp, ck_compile_opts *o)
{
    idx = lua_absindex(L, idx);
    memset(lp, 0, sizeof *lp);
    lp->L = L;
    if (lua_isnoneornil(L, idx)) return 0;
    if (lua_isfunction(L, idx)) {
        lua_Debug ar;
        lua_pushvalue(L, idx);
        lua_getinfo(L, ">S", &ar);
        snprintf(lp->defined, sizeof lp->defined, "defined at %s:%d", ar.short_src, ar.linedefined);
        lp->fn = idx;
        o->decide = decide_function;
        o->decide_ud = lp;
        return 0;
    }
    if (!lua_istable(L, idx)) return ck_lua_raise(L, "checkpoint must be a policy (see ck.policy) or a function, got %s",
                                                  luaL_typename(L, idx));
    const char *kind = raw_field(L, idx, "kind") == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    lua_pop(L, 1); /* the string stays alive in the table */
    if (!kind) return ck_lua_raise(L, "checkpoint policy table has no kind");
    ck_policy *pol = &lp->pol;
    if (!strcmp(kind, "none")) pol->kind = CK_POLICY_NONE;
    else if (!strcmp(kind, "blocks")) {
        pol->kind = CK_POLICY_BLOCKS;
        const lua_Unsigned n = raw_field(L, idx, "patterns") == LUA_TTABLE ? lua_rawlen(L, -1) : 0;
        if (n < 1 || n > MAX_PATTERNS) return ck_lua_raise(L, "blocks: give 1 to %d scope patterns", MAX_PATTERNS);
        for (int i = 0; i < (int)n; i++) {
            /* strings only: lua_tostring would turn a number in the table into one */
            lp->patterns[i] = lua_rawgeti(L, -1, i + 1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            lua_pop(L, 1); /* held by the table; compile copies them before any Lua code runs */
            if (!lp->patterns[i]) return ck_lua_raise(L, "blocks: pattern %d is not a string", i + 1);
        }
        lua_pop(L, 1);
        pol->patterns = lp->patterns;
        pol->npatterns = (int)n;
        pol->any_pattern = raw_field(L, idx, "any") == LUA_TBOOLEAN && lua_toboolean(L, -1);
        lua_pop(L, 1);
    } else if (!strcmp(kind, "every_n")) {
        pol->kind = CK_POLICY_EVERY_N;
        const double n = num_field(L, idx, "n", 0);
        if (!(n >= 1 && n <= 1e6 && n == (double)(int)n)) return ck_lua_raise(L, "every_n: n must be a positive integer");
        pol->n = (int)n;
    } else if (!strcmp(kind, "sqrt_n")) pol->kind = CK_POLICY_SQRT_N;
    else if (!strcmp(kind, "selective")) {
        pol->kind = CK_POLICY_SELECTIVE;
        raw_field(L, idx, "recompute");
        if (lua_isnil(L, -1)) ck_policy_selective_default(pol->ops);
        else {
            if (!lua_istable(L, -1)) return ck_lua_raise(L, "selective: recompute must be a list of op kinds");
            const lua_Unsigned n = lua_rawlen(L, -1);
            for (lua_Unsigned i = 0; i < n; i++) {
                if ((i & 4095) == 4095) ck_limits_charge(L, 4096);
                const char *name = lua_rawgeti(L, -1, (lua_Integer)i + 1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
                int op = name ? op_by_name(name) : -1;
                if (op < 0) return ck_lua_raise(L, "selective: unknown op kind '%s'", name ? name : "?");
                pol->ops[op] = 1;
                lua_pop(L, 1);
            }
        }
        lua_pop(L, 1);
    } else if (!strcmp(kind, "budget")) {
        pol->kind = CK_POLICY_BUDGET;
        pol->budget = num_field(L, idx, "bytes", 0);
        pol->budget_fraction = num_field(L, idx, "fraction", 0);
        if (pol->budget <= 0 && pol->budget_fraction <= 0) return ck_lua_raise(L, "budget: give bytes or a fraction");
    } else if (!strcmp(kind, "optimal")) {
        pol->kind = CK_POLICY_OPTIMAL;
        pol->budget = num_field(L, idx, "bytes", 0);
        pol->budget_fraction = num_field(L, idx, "fraction", 0);
        pol->seconds = num_field(L, idx, "seconds", 0);
        if (pol->budget <= 0 && pol->budget_fraction <= 0) return ck_lua_raise(L, "optimal: give bytes or a fraction");
        if (!(pol->seconds >= 0 && pol->seconds <= 86400)) return ck_lua_raise(L, "optimal: seconds must be in (0, 86400]");
    } else if (!strcmp(kind, "auto")) {
        pol->kind = CK_POLICY_AUTO;
        pol->device = num_field(L, idx, "device", 0);
        pol->headroom = num_field(L, idx, "headroom", 0.1);
        if (pol->device <= 0)
            return ck_lua_raise(L, "auto: compile needs device = its size; without one, ck.fit.choose reads the "
                                   "device's free memory and chooses the policy (and the batch) to compile with");
        if (pol->headroom < 0 || pol->headroom >= 1) return ck_lua_raise(L, "auto: headroom must be in [0, 1)");
    } else return ck_lua_raise(L, "unknown checkpoint policy '%s'", kind);
    if (pol->kind != CK_POLICY_NONE) {
        o->decide = decide_builtin;
        o->decide_ud = lp;
    }
    return 0;
}
