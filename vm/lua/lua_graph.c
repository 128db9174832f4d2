/* p:graph(): the training op list as plain Lua tables, for an external solver
 * (plan.export_graph writes it as JSON): each entry with its op, scope, line,
 * phase, FLOPs and output bytes; each tensor with its bytes, kind, producers
 * and consumers. Ids are 0-based, as in the file. */
#include "lua/lua_ck.h"

#include <lauxlib.h>

#include <stdlib.h>

static const char *const dtype_names[] = {"f32", "bf16", "f16", "f8e4m3", "u8"};

static void set_int(lua_State *L, const char *k, lua_Integer v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
    if (!v) return;
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

static void set_ids(lua_State *L, const char *k, const int *ids, int n)
{
    lua_createtable(L, n, 0);
    int j = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0) continue;
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, ++j);
    }
    lua_setfield(L, -2, k);
}

/* per tensor, the list positions that write (w) or read (r) it: CSR arrays */
typedef struct uses {
    int *start, *pos;
} uses;

static int index_uses(const ck_plan *pl, int nt, int reads, uses *u)
{
    u->start = calloc((size_t)nt + 1, sizeof *u->start);
    int total = 0;
    for (int i = 0; i < pl->n; i++) total += reads ? pl->ops[i].nin : pl->ops[i].nout;
    u->pos = malloc(sizeof *u->pos * (size_t)(total ? total : 1));
    int *fill = calloc((size_t)nt + 1, sizeof *fill);
    if (!u->start || !u->pos || !fill) {
        free(fill);
        return -1;
    }
    for (int i = 0; i < pl->n; i++) {
        const int *ids = reads ? pl->ops[i].in : pl->ops[i].out;
        int m = reads ? pl->ops[i].nin : pl->ops[i].nout;
        for (int k = 0; k < m; k++)
            if (ids[k] >= 0) u->start[ids[k] + 1]++;
    }
    for (int t = 0; t < nt; t++) u->start[t + 1] += u->start[t];
    for (int i = 0; i < pl->n; i++) {
        const int *ids = reads ? pl->ops[i].in : pl->ops[i].out;
        int m = reads ? pl->ops[i].nin : pl->ops[i].nout;
        for (int k = 0; k < m; k++) {
            int t = ids[k];
            if (t < 0) continue;
            /* one entry per op, even when an op reads a tensor twice */
            int s = u->start[t], e = s + fill[t];
            if (e > s && u->pos[e - 1] == i) continue;
            u->pos[e] = i;
            fill[t]++;
        }
    }
    /* close the gaps left by ops that read a tensor twice */
    int w = 0;
    for (int t = 0; t < nt; t++) {
        int s = u->start[t];
        u->start[t] = w;
        for (int k = 0; k < fill[t]; k++) u->pos[w++] = u->pos[s + k];
    }
    u->start[nt] = w;
    free(fill);
    return 0;
}

static void free_uses(uses *u)
{
    free(u->start);
    free(u->pos);
}

/* p:graph() -> {ops = {...}, tensors = {...}, recomputed = {graph tensor ids},
 * peak, live_peak, persistent, activation_bytes, step_flops, recompute_flops}
 * of the training list (the forward list when nothing trains) */
static int l_program_graph(lua_State *L)
{
    /* pinned: a collection step while the tables are built may run Lua */
    ck_program *p = ck_lua_program_pinned(L, 1, 1);
    const ck_plan *pl = p->train.n ? &p->train : &p->eval;
    const ck_graph *g = p->g;
    int nt = pl->ntensors;
    uses wr = {0}, rd = {0};
    if (index_uses(pl, nt, 0, &wr) || index_uses(pl, nt, 1, &rd)) {
        free_uses(&wr);
        free_uses(&rd);
        return luaL_error(L, "graph: out of memory");
    }
    /* the arrays are copied into tables below; a Lua error there (out of
     * memory) would leak them, so they go into userdata first */
    size_t bytes = sizeof(int) * ((size_t)(nt + 1) * 2 + (size_t)wr.start[nt] + (size_t)rd.start[nt] + 1);
    int *held = lua_newuserdatauv(L, bytes, 0);
    int *ws = held, *rs = ws + nt + 1, *wp = rs + nt + 1, *rp = wp + wr.start[nt];
    for (int t = 0; t <= nt; t++) {
        ws[t] = wr.start[t];
        rs[t] = rd.start[t];
    }
    for (int k = 0; k < wr.start[nt]; k++) wp[k] = wr.pos[k];
    for (int k = 0; k < rd.start[nt]; k++) rp[k] = rd.pos[k];
    free_uses(&wr);
    free_uses(&rd);

    lua_newtable(L);
    set_int(L, "peak", (lua_Integer)pl->peak);
    set_int(L, "live_peak", (lua_Integer)pl->live_peak);
    set_int(L, "persistent", (lua_Integer)p->persistent);
    set_int(L, "activation_bytes", (lua_Integer)pl->activation_bytes);
    lua_pushnumber(L, pl->step_flops);
    lua_setfield(L, -2, "step_flops");
    lua_pushnumber(L, pl->recompute_flops);
    lua_setfield(L, -2, "recompute_flops");

    lua_createtable(L, pl->n, 0);
    for (int i = 0; i < pl->n; i++) {
        if ((i & 1023) == 1023) ck_limits_charge(L, 4096); /* a poll: about 4 instructions' work per field */
        const ck_op_ref *r = &pl->ops[i];
        const ck_node *nd = &g->n[r->node];
        lua_createtable(L, 0, 12);
        set_int(L, "index", i);
        set_int(L, "node", r->node);
        set_str(L, "op", ck_op_name(nd->op));
        set_str(L, "scope", nd->scope ? nd->scope : "");
        set_str(L, "where", nd->where);
        set_str(L, "phase", ck_graph_phase_name(r->phase));
        lua_pushnumber(L, ck_plan_op_flops(pl, g, i));
        lua_setfield(L, -2, "flops");
        size_t out_bytes = 0;
        for (int k = 0; k < r->nout; k++)
            if (r->out[k] >= 0) out_bytes += ck_plan_tensor_bytes(pl, g, r->out[k]);
        set_int(L, "out_bytes", (lua_Integer)out_bytes);
        set_int(L, "workspace_bytes", pl->ws_bytes ? (lua_Integer)pl->ws_bytes[i] : 0);
        set_ids(L, "inputs", r->in, r->nin);
        set_ids(L, "outputs", r->out, r->nout);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "ops");

    /* the tensors the list touches, by id; a reshape's output shares its input's buffer */
    lua_newtable(L);
    int k = 0;
    for (int t = 0; t < nt; t++) {
        if ((t & 1023) == 1023) ck_limits_charge(L, 4096);
        if (ws[t] == ws[t + 1] && rs[t] == rs[t + 1]) continue;
        int o = pl->origin[t];
        const ck_tensor *tt = &g->t[o];
        lua_createtable(L, 0, 14);
        set_int(L, "id", t);
        if (t >= g->nt) set_int(L, "origin", o);
        set_str(L, "kind", t >= g->nt ? "recomputed" : ck_graph_kind_name(tt->kind));
        set_str(L, "category", ck_plan_cat_names[ck_plan_tensor_cat(pl, g, t)]);
        set_int(L, "bytes", (lua_Integer)ck_plan_tensor_bytes(pl, g, t));
        lua_pushboolean(L, t < g->nt && ck_plan_is_persistent(tt->kind));
        lua_setfield(L, -2, "persistent");
        lua_pushboolean(L, p->retain && t < g->nt && p->retain[t]);
        lua_setfield(L, -2, "retained");
        lua_createtable(L, tt->shape.ndim, 0);
        for (int d = 0; d < tt->shape.ndim; d++) {
            lua_pushinteger(L, tt->shape.d[d]);
            lua_rawseti(L, -2, d + 1);
        }
        lua_setfield(L, -2, "shape");
        set_str(L, "dtype", (unsigned)tt->dtype < sizeof dtype_names / sizeof *dtype_names ? dtype_names[tt->dtype] : "?");
        set_str(L, "name", tt->name);
        set_str(L, "scope", tt->scope ? tt->scope : "");
        set_str(L, "where", tt->where);
        set_ids(L, "producers", wp + ws[t], ws[t + 1] - ws[t]);
        set_ids(L, "consumers", rp + rs[t], rs[t + 1] - rs[t]);
        if (ws[t + 1] > ws[t]) {
            const ck_op_ref *r = &pl->ops[wp[ws[t]]];
            if (g->n[r->node].op == CK_OP_RESHAPE && r->out[0] == t) set_int(L, "alias_of", r->in[0]);
        }
        lua_rawseti(L, -2, ++k);
    }
    lua_setfield(L, -2, "tensors");

    /* what this list recomputes: the graph tensors its copies remake */
    unsigned char *mark = lua_newuserdatauv(L, (size_t)g->nt + 1, 0);
    for (int t = 0; t < g->nt; t++) mark[t] = 0;
    for (int t = g->nt; t < nt; t++) mark[pl->origin[t]] = 1;
    lua_newtable(L);
    k = 0;
    for (int t = 0; t < g->nt; t++) {
        if (!mark[t]) continue;
        lua_pushinteger(L, t);
        lua_rawseti(L, -2, ++k);
    }
    lua_setfield(L, -3, "recomputed");
    lua_pop(L, 1);
    return 1;
}

void ck_lua_graph_register(lua_State *L, int methods)
{
    lua_pushcfunction(L, l_program_graph);
    lua_setfield(L, methods, "graph");
}
