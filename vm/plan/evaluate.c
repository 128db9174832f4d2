/* What a checkpoint decision costs, for searches that try many: the peak and
 * the recompute FLOPs of the op list the scheduler would make, found without
 * making it. The evaluator walks the list in the scheduler's order
 * (vm/plan/schedule.c: forward entries, then each later entry after the
 * recomputations it needs), recording each buffer's first and last position
 * as the memory plan's liveness would (vm/plan/memplan.c), and then sweeps
 * the live bytes, or places the buffers (vm/plan/place.c) for the exact peak.
 * Workspaces and FLOPs are taken once per node; nothing is allocated per
 * evaluation. Lists whose optimizer entries move (fused updates, overlapped
 * data parallel) are scheduled and planned in full. */
#include "plan/evaluate.h"
#include "plan/place.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 64

struct ck_evaluator {
    const ck_decide_ctx *c;
    int nt, cap;        /* graph tensors; ids a list can use (tensors and copies) */
    int64_t *bytes;     /* per graph tensor; 0 for persistent ones (outside the sweep) */
    size_t *ws;         /* per graph node in the list: its entry's workspace */
    double *flops;      /* per graph node in the list */
    int *first, *last, *root, *origin, *copy; /* per id; copy per graph tensor */
    int64_t *delta;     /* per position */
    int *at;            /* per position: the node its entry runs */
    ck_place_buf *bufs;
    int maxpos;         /* positions a list can have: every entry recomputed once */
    int fallback;       /* optimizer entries move: schedule and plan in full */
    /* one walk's state */
    const unsigned char *mark;
    int pos, ids;
    double rflops;
};

static int marked(const ck_evaluator *e, int t)
{
    const ck_graph *g = e->c->g;
    return e->mark && t < e->nt && e->mark[t] && g->t[t].node >= 0 && g->n[g->t[t].node].phase == CK_PHASE_FORWARD;
}

static void touch(ck_evaluator *e, int id)
{
    const int r = e->root[id];
    if (e->first[r] < 0) e->first[r] = e->pos;
    e->last[r] = e->pos;
}

/* one entry of node v at the current position, reading ins and writing outs */
static void entry(ck_evaluator *e, int v, const int *ins, const int *outs)
{
    const ck_node *nd = &e->c->g->n[v];
    if (nd->op == CK_OP_RESHAPE && outs[0] >= 0) e->root[outs[0]] = e->root[ins[0]];
    for (int j = 0; j < nd->nin; j++) touch(e, ins[j]);
    for (int k = 0; k < nd->nout; k++)
        if (outs[k] >= 0) touch(e, outs[k]);
    e->at[e->pos++] = v;
}

/* the copy of marked tensor t, recomputing its producer (and first its
 * marked inputs) where the scheduler would */
static int materialize(ck_evaluator *e, int t)
{
    if (e->copy[t] >= 0) return e->copy[t];
    const int v = e->c->g->t[t].node;
    const ck_node *nd = &e->c->g->n[v];
    int ins[CK_MAX_IN], outs[CK_MAX_OUT];
    for (int j = 0; j < nd->nin; j++) ins[j] = marked(e, nd->in[j]) ? materialize(e, nd->in[j]) : nd->in[j];
    for (int k = 0; k < nd->nout; k++) {
        outs[k] = -1;
        if (nd->out[k] < 0) continue;
        const int id = e->ids++;
        e->origin[id] = nd->out[k];
        e->root[id] = id;
        e->first[id] = e->last[id] = -1;
        e->copy[nd->out[k]] = outs[k] = id;
    }
    entry(e, v, ins, outs);
    e->rflops += e->flops[v];
    return e->copy[t];
}

/* the scheduler's list walked: first and last positions by buffer, the node at each position */
static void walk(ck_evaluator *e, const unsigned char *mark)
{
    const ck_decide_ctx *c = e->c;
    const ck_graph *g = c->g;
    e->mark = mark;
    e->pos = 0;
    e->ids = e->nt;
    e->rflops = 0;
    for (int t = 0; t < e->nt; t++) {
        e->first[t] = e->last[t] = -1;
        e->root[t] = t;
        e->copy[t] = -1;
    }
    for (int i = 0; i < c->n; i++) {
        const ck_node *nd = &g->n[c->nodes[i]];
        if (nd->phase == CK_PHASE_FORWARD) entry(e, c->nodes[i], nd->in, nd->out);
    }
    for (int i = 0; i < c->n; i++) {
        const ck_node *nd = &g->n[c->nodes[i]];
        if (nd->phase == CK_PHASE_FORWARD) continue;
        int ins[CK_MAX_IN];
        for (int j = 0; j < nd->nin; j++) ins[j] = marked(e, nd->in[j]) ? materialize(e, nd->in[j]) : nd->in[j];
        entry(e, c->nodes[i], ins, nd->out);
    }
    if (c->retain)
        for (int t = 0; t < e->nt; t++)
            if (c->retain[t] && e->first[e->root[t]] >= 0) e->last[e->root[t]] = e->pos;
}

static int64_t bytes_of(const ck_evaluator *e, int id) { return e->bytes[id < e->nt ? id : e->origin[id]]; }

static int is_persistent(const ck_evaluator *e, int id)
{
    return id < e->nt && ck_is_persistent(e->c->g->t[id].kind);
}

/* the most bytes live at once, above the persistent ones */
static int64_t sweep(ck_evaluator *e)
{
    memset(e->delta, 0, sizeof *e->delta * (size_t)(e->pos + 1));
    for (int id = 0; id < e->ids; id++) {
        if (e->first[id] < 0 || is_persistent(e, id)) continue;
        const int64_t b = bytes_of(e, id);
        e->delta[e->first[id]] += b;
        e->delta[e->last[id] + 1] -= b;
    }
    int64_t live = 0, best = 0;
    for (int i = 0; i < e->pos; i++) {
        live += e->delta[i];
        const int64_t here = live + (int64_t)e->ws[e->at[i]];
        if (here > best) best = here;
    }
    return best;
}

/* the arena's high-water mark above the persistent region, as ck_plan_memory
 * places the same list (the same buffers, ids and order) */
static int64_t place(ck_evaluator *e)
{
    int nb = 0;
    for (int id = 0; id < e->ids; id++) {
        if (e->first[id] < 0 || is_persistent(e, id)) continue;
        e->bufs[nb++] = (ck_place_buf){bytes_of(e, id), 0, e->first[id], e->last[id], id, 0};
    }
    for (int i = 0; i < e->pos; i++)
        if (e->ws[e->at[i]]) e->bufs[nb++] = (ck_place_buf){(int64_t)e->ws[e->at[i]], 0, i, i, -1, 0};
    return ck_place(e->bufs, nb, e->pos + 1, ALIGN);
}

/* the old way, for lists whose optimizer entries move */
static int evaluate_listed(const ck_decide_ctx *c, const unsigned char *mark, int exact, size_t *peak, double *flops)
{
    ck_plan pl;
    if (ck_schedule(&pl, c->g, c->nodes, c->n, mark)) return -1;
    int rc = 0;
    if (exact) {
        rc = ck_plan_memory(&pl, c->g, c->poff, c->persistent, c->retain, c->be);
        *peak = pl.peak;
        *flops = pl.recompute_flops;
    } else {
        *peak = ck_plan_live_peak(&pl, c->g, c->persistent, c->retain, c->be);
        *flops = 0;
        for (int i = 0; i < pl.n; i++)
            if (pl.ops[i].phase == CK_PHASE_RECOMPUTE) *flops += ck_plan_op_flops(&pl, c->g, i);
    }
    ck_plan_free(&pl);
    return rc;
}

int ck_evaluate(ck_evaluator *e, const unsigned char *mark, int exact, size_t *peak, double *flops)
{
    if (e->fallback) return evaluate_listed(e->c, mark, exact, peak, flops);
    walk(e, mark);
    *flops = e->rflops;
    if (!exact) {
        *peak = e->c->persistent + (size_t)sweep(e);
        return 0;
    }
    const int64_t top = place(e);
    if (top < 0) return -1;
    /* as ck_plan_memory: the transient region starts aligned above the persistent one */
    const size_t base = (e->c->persistent + ALIGN - 1) / ALIGN * ALIGN;
    *peak = top > 0 || e->pos ? base + (size_t)top : e->c->persistent;
    return 0;
}

void ck_evaluator_free(ck_evaluator *e)
{
    if (!e) return;
    free(e->bytes);
    free(e->ws);
    free(e->flops);
    free(e->first);
    free(e->last);
    free(e->root);
    free(e->origin);
    free(e->copy);
    free(e->delta);
    free(e->at);
    free(e->bufs);
    free(e);
}

ck_evaluator *ck_evaluator_new(const ck_decide_ctx *c)
{
    ck_evaluator *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    const ck_graph *g = c->g;
    e->c = c;
    e->nt = g->nt;
    e->fallback = g->fused_updates || g->comm_overlap;
    if (e->fallback) return e;
    /* a list holds each node once and each forward node at most once more,
     * recomputed, with a copy of each of its outputs */
    int nfwd = 0, nout = 0;
    for (int i = 0; i < c->n; i++) {
        const ck_node *nd = &g->n[c->nodes[i]];
        if (nd->phase != CK_PHASE_FORWARD) continue;
        nfwd++;
        nout += nd->nout;
    }
    e->maxpos = c->n + nfwd;
    e->cap = g->nt + nout;
    const size_t nt = (size_t)(g->nt ? g->nt : 1), nn = (size_t)(g->nn ? g->nn : 1), cap = (size_t)(e->cap ? e->cap : 1);
    e->bytes = malloc(sizeof *e->bytes * nt);
    e->ws = calloc(nn, sizeof *e->ws);
    e->flops = calloc(nn, sizeof *e->flops);
    e->first = malloc(sizeof(int) * cap);
    e->last = malloc(sizeof(int) * cap);
    e->root = malloc(sizeof(int) * cap);
    e->origin = malloc(sizeof(int) * cap);
    e->copy = malloc(sizeof(int) * nt);
    e->delta = malloc(sizeof *e->delta * (size_t)(e->maxpos + 2));
    e->at = malloc(sizeof(int) * (size_t)(e->maxpos + 1));
    e->bufs = malloc(sizeof *e->bufs * (cap + (size_t)e->maxpos));
    if (!e->bytes || !e->ws || !e->flops || !e->first || !e->last || !e->root || !e->origin || !e->copy || !e->delta ||
        !e->at || !e->bufs) {
        ck_evaluator_free(e);
        return NULL;
    }
    for (int t = 0; t < g->nt; t++) e->bytes[t] = (int64_t)ck_tensor_bytes(&g->t[t]);
    /* an entry's workspace and FLOPs depend on its node alone (a recomputed
     * copy has its origin's shape and type): each is taken once, from a list
     * of that node's entry */
    ck_plan one = {0};
    ck_op_ref ref;
    one.n = 1;
    one.ops = &ref;
    one.ntensors = g->nt;
    one.origin = e->copy; /* the identity, for the graph's own ids */
    for (int t = 0; t < g->nt; t++) e->copy[t] = t;
    for (int i = 0; i < c->n; i++) {
        const int v = c->nodes[i];
        const ck_node *nd = &g->n[v];
        ref = (ck_op_ref){.node = v, .phase = nd->phase, .nin = nd->nin, .nout = nd->nout};
        memcpy(ref.in, nd->in, sizeof ref.in);
        memcpy(ref.out, nd->out, sizeof ref.out);
        e->ws[v] = ck_plan_entry_workspace(&one, g, 0, c->be);
        e->flops[v] = ck_plan_op_flops(&one, g, 0);
    }
    return e;
}
