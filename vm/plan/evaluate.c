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
#include "plan/evaluate_int.h"

#include "util/memory.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 64

static int marked(const ck_evaluator *e, int t) { return e->mark && t < e->nt && e->mark[t] && e->markable[t]; }

static void touch(ck_evaluator *e, int id)
{
    const int r = e->root[id];
    if (e->first[r] < 0) e->first[r] = e->pos;
    e->last[r] = e->pos;
}

/* one entry of node v at the current position, reading ins and writing outs */
static void entry(ck_evaluator *e, int v, const int *ins, const int *outs)
{
    const ck_pnode *nd = &e->nodes[v];
    if (nd->reshape && outs[0] >= 0) e->root[outs[0]] = e->root[ins[0]];
    for (int j = 0; j < nd->nin; j++) touch(e, ins[j]);
    for (int k = 0; k < nd->nout; k++)
        if (outs[k] >= 0) touch(e, outs[k]);
    e->at[e->pos++] = v;
}

/* the recompute entry of node v, its inputs resolved: its outputs' copies made */
static void recompute(ck_evaluator *e, int v, const int *ins)
{
    const ck_pnode *nd = &e->nodes[v];
    int outs[CK_MAX_OUT];
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
}

/* the copy of marked tensor t, recomputing its producer (and first, depth
 * first in slot order, its marked inputs not yet recomputed) where the
 * scheduler would; iterative, as chains of marked tensors can be long */
static int materialize(ck_evaluator *e, int t)
{
    if (e->copy[t] >= 0) return e->copy[t];
    int sp = 0;
    e->stack[sp++] = (ck_frame){e->c->g->t[t].node, 0, {0}};
    while (sp) {
        ck_frame *f = &e->stack[sp - 1];
        const ck_pnode *nd = &e->nodes[f->v];
        if (f->j == nd->nin) {
            recompute(e, f->v, f->ins);
            sp--;
            continue;
        }
        const int u = nd->in[f->j];
        if (!marked(e, u)) {
            f->ins[f->j++] = u;
        } else if (e->copy[u] >= 0) {
            f->ins[f->j++] = e->copy[u];
        } else {
            e->stack[sp++] = (ck_frame){e->c->g->t[u].node, 0, {0}};
        }
    }
    return e->copy[t];
}

/* a walk's scratch, made again after ck_evaluator_rest gave it back */
static int scratch(ck_evaluator *e)
{
    if (e->first) return 0;
    const size_t cap = (size_t)(e->cap ? e->cap : 1), nt = (size_t)(e->nt ? e->nt : 1);
    e->first = ck_big_alloc(sizeof(int) * cap);
    e->last = ck_big_alloc(sizeof(int) * cap);
    e->root = ck_big_alloc(sizeof(int) * cap);
    e->origin = ck_big_alloc(sizeof(int) * cap);
    e->copy = ck_big_alloc(sizeof(int) * nt);
    e->delta = ck_big_alloc(sizeof *e->delta * (size_t)(e->maxpos + 2));
    e->stack = ck_big_alloc(sizeof *e->stack * (size_t)(e->nfwd ? e->nfwd : 1));
    if (e->first && e->last && e->root && e->origin && e->copy && e->delta && e->stack) return 0;
    ck_evaluator_rest(e);
    return -1;
}

void ck_evaluator_rest(ck_evaluator *e)
{
    /* at stays: its forward part is laid once, at the evaluator's making; the
     * turn's buffers go for good (only the searches' starts read the turn) */
    void **arrays[] = {(void **)&e->first, (void **)&e->last, (void **)&e->root, (void **)&e->origin,
                       (void **)&e->copy, (void **)&e->delta, (void **)&e->stack, (void **)&e->turn_root,
                       (void **)&e->turn_start, (void **)&e->turn_t};
    e->nturn = 0;
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) {
        ck_big_free(*arrays[i]);
        *arrays[i] = NULL;
    }
}

/* the scheduler's list walked: first and last positions by buffer, the node
 * at each position; the forward entries' part is the same for every decision */
static void walk(ck_evaluator *e, const unsigned char *mark)
{
    const ck_decide_ctx *c = e->c;
    e->mark = mark;
    e->ids = e->nt;
    e->rflops = 0;
    const size_t nt = sizeof(int) * (size_t)e->nt;
    memcpy(e->first, e->first0, nt);
    memcpy(e->last, e->last0, nt);
    memcpy(e->root, e->root0, nt);
    memset(e->copy, 0xff, nt);
    e->pos = e->pos0;
    for (int i = 0; i < c->n; i++) {
        const int v = c->nodes[i];
        const ck_pnode *nd = &e->nodes[v];
        if (c->g->n[v].phase == CK_PHASE_FORWARD) continue;
        int ins[CK_MAX_IN];
        for (int j = 0; j < nd->nin; j++) ins[j] = marked(e, nd->in[j]) ? materialize(e, nd->in[j]) : nd->in[j];
        entry(e, v, ins, nd->out);
    }
    if (c->retain)
        for (int t = 0; t < e->nt; t++)
            if (c->retain[t] && e->first[e->root[t]] >= 0) e->last[e->root[t]] = e->pos;
}

static int64_t bytes_of(const ck_evaluator *e, int id) { return e->bytes[id < e->nt ? id : e->origin[id]]; }

static int is_persistent(const ck_evaluator *e, int id) { return id < e->nt && e->persistent[id]; }

void ck_evaluator_free(ck_evaluator *e);

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

static void digest_add(uint64_t d[2], int64_t size, int first, int last, int id)
{
    const uint64_t v[4] = {(uint64_t)size, (uint64_t)(uint32_t)first, (uint64_t)(uint32_t)last, (uint64_t)(uint32_t)id};
    for (int i = 0; i < 4; i++) {
        d[0] = (d[0] ^ v[i]) * 0x100000001b3ull;
        d[1] = (d[1] + v[i] + (d[1] << 7)) * 0x9e3779b97f4a7c15ull;
        d[1] ^= d[1] >> 31;
    }
}

/* the digest of the buffers place() would lay out (size, range and id), in its order */
static void digest_of(const ck_evaluator *e, uint64_t d[2])
{
    d[0] = 0xcbf29ce484222325ull ^ (uint64_t)e->pos;
    d[1] = 0x243f6a8885a308d3ull;
    for (int id = 0; id < e->ids; id++)
        if (e->first[id] >= 0 && !is_persistent(e, id)) digest_add(d, bytes_of(e, id), e->first[id], e->last[id], id);
    for (int i = 0; i < e->pos; i++)
        if (e->ws[e->at[i]]) digest_add(d, (int64_t)e->ws[e->at[i]], i, i, -1);
}

static void drop_kept(ck_evaluator *e)
{
    ck_big_free(e->kept);
    e->kept = NULL;
    e->nkept = e->haskept = 0;
}

/* the placement again from its kept offsets, the buffers' sizes and ranges
 * from the walk just made (the same buffers: their digest matched) */
static int restore(ck_evaluator *e)
{
    if (!(e->bufs = ck_big_alloc(sizeof *e->bufs * ((size_t)e->cap + (size_t)e->maxpos)))) return -1;
    for (int b = 0; b < e->nkept; b++) {
        const int key = e->kept[b].key, p = -1 - key;
        const int64_t off = (int64_t)e->kept[b].units * ALIGN;
        e->bufs[b] = key >= 0 ? (ck_place_buf){bytes_of(e, key), off, e->first[key], e->last[key], key, 0}
                              : (ck_place_buf){(int64_t)e->ws[e->at[p]], off, p, p, -1, 0};
    }
    e->nplaced = e->nkept;
    e->placed = 1;
    drop_kept(e);
    return 0;
}

/* the arena's high-water mark above the persistent region, as ck_plan_memory
 * places the same list (the same buffers, ids and order); once it passes stop,
 * the mark so far (the placement is then not kept) */
static int64_t place(ck_evaluator *e, int64_t stop)
{
    /* buffers the same as the last placement's (decisions that differ only
     * where the list does not) place the same: not placed again */
    uint64_t d[2];
    digest_of(e, d);
    if (e->known && d[0] == e->digest[0] && d[1] == e->digest[1]) {
        for (int t = 0; t < e->nt; t++) e->placed_mark[t] = (unsigned char)marked(e, t);
        if (!e->bufs && e->haskept && restore(e)) return -1;
        return e->top;
    }
    drop_kept(e);
    if (!e->bufs && !(e->bufs = ck_big_alloc(sizeof *e->bufs * ((size_t)e->cap + (size_t)e->maxpos)))) return -1;
    int nb = 0;
    for (int id = 0; id < e->ids; id++) {
        if (e->first[id] < 0 || is_persistent(e, id)) continue;
        e->bufs[nb++] = (ck_place_buf){bytes_of(e, id), 0, e->first[id], e->last[id], id, 0};
    }
    for (int i = 0; i < e->pos; i++)
        if (e->ws[e->at[i]]) e->bufs[nb++] = (ck_place_buf){(int64_t)e->ws[e->at[i]], 0, i, i, -1, 0};
    e->top = ck_place(e->bufs, nb, e->pos + 1, ALIGN, stop);
    if (e->top > stop) { /* stopped: not a placement of the list */
        e->placed = e->known = 0;
        return e->top;
    }
    e->placed = e->known = e->top >= 0;
    e->digest[0] = d[0];
    e->digest[1] = d[1];
    e->nplaced = nb;
    for (int t = 0; t < e->nt; t++) e->placed_mark[t] = (unsigned char)marked(e, t);
    return e->top;
}

/* whether the last placement was of decision mark */
static int placed_for(const ck_evaluator *e, const unsigned char *mark)
{
    if (!e->placed) return 0;
    for (int t = 0; t < e->nt; t++)
        if (e->placed_mark[t] != (mark && mark[t] && e->markable[t])) return 0;
    return 1;
}

size_t ck_evaluator_least_frag(const ck_evaluator *e) { return e->least_frag; }

int ck_evaluator_placed(const ck_evaluator *e, const unsigned char *mark) { return !e->fallback && placed_for(e, mark); }

void ck_evaluator_forget(ck_evaluator *e, int keep)
{
    drop_kept(e);
    for (int b = 0; keep && e->placed && b < e->nplaced; b++)
        if (e->bufs[b].off / ALIGN > (int64_t)UINT32_MAX) keep = 0;
    if (keep && e->placed) {
        /* compacted in place: entry b's 8 bytes end before entry b + 1's 32 begin */
        struct ck_kept *k = (struct ck_kept *)e->bufs;
        for (int b = 0; b < e->nplaced; b++) {
            const ck_place_buf x = e->bufs[b];
            k[b] = (struct ck_kept){x.id >= 0 ? x.id : -1 - x.first, (uint32_t)(x.off / ALIGN)};
        }
        struct ck_kept *small = ck_big_realloc(k, sizeof *k * (size_t)(e->nplaced ? e->nplaced : 1));
        e->kept = small ? small : k;
        e->nkept = e->nplaced;
        e->haskept = 1;
    } else {
        ck_big_free(e->bufs);
    }
    e->bufs = NULL;
    e->placed = 0;
}

/* what only walks need, given back before the plan is made (the plan keeps
 * the workspaces, FLOPs and last placement) */
static void release_walks(ck_evaluator *e)
{
    void **arrays[] = {(void **)&e->bytes, (void **)&e->persistent, (void **)&e->markable, (void **)&e->nodes,
                       (void **)&e->first, (void **)&e->last, (void **)&e->root, (void **)&e->origin,
                       (void **)&e->copy, (void **)&e->first0, (void **)&e->last0, (void **)&e->root0,
                       (void **)&e->delta, (void **)&e->at, (void **)&e->stack, (void **)&e->turn_root,
                       (void **)&e->turn_start, (void **)&e->turn_t};
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++) {
        ck_big_free(*arrays[i]);
        *arrays[i] = NULL;
    }
    e->released = 1;
}

int ck_evaluator_plan(ck_evaluator *e, const unsigned char *mark, ck_plan *pl)
{
    const ck_decide_ctx *c = e->c;
    const int placed = !e->fallback && !e->released && placed_for(e, mark);
    if (!e->fallback) release_walks(e);
    if (ck_schedule(pl, c->g, c->nodes, c->n, mark)) return -1;
    ck_plan_known k = {0};
    if (!e->fallback) {
        k.ws_node = e->ws;
        k.flops_node = e->flops;
        if (placed) {
            k.placed = e->bufs;
            k.nplaced = e->nplaced;
            k.top = e->top;
        }
    }
    if (ck_plan_memory_known(pl, c->g, c->poff, c->persistent, c->retain, c->be, &k)) {
        ck_plan_free(pl);
        return -1;
    }
    return 0;
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

size_t ck_evaluate_turn(ck_evaluator *e, const unsigned char *mark)
{
    size_t live = e->c->persistent;
    if (e->fallback || e->released) return live;
    e->mark = mark;
    for (int k = 0; k < e->nturn; k++)
        for (int j = e->turn_start[k]; j < e->turn_start[k + 1]; j++)
            if (e->turn_t[j] < 0 || !marked(e, e->turn_t[j])) { /* a copy does not stand in for it */
                live += (size_t)e->bytes[e->turn_root[k]];
                break;
            }
    return live;
}

static long gcd_of(long a, long b)
{
    while (b) {
        const long r = a % b;
        a = b;
        b = r;
    }
    return a;
}

int ck_evaluate_turn_multiples(ck_evaluator *e, const int *region, int n, size_t *turn)
{
    for (int m = 1; m <= n; m++) turn[m] = e->c->persistent;
    if (e->fallback || e->released || n < 1) return 0;
    /* a buffer stays out of marking m's turn when every tensor it holds is
     * marked there: each has a region, a multiple of m, so m divides their
     * greatest common divisor d (0 where one has none) */
    int64_t *by_d = calloc((size_t)n + 1, sizeof *by_d), *out = calloc((size_t)n + 1, sizeof *out);
    if (!by_d || !out) {
        free(by_d);
        free(out);
        return -1;
    }
    int64_t all = 0;
    for (int k = 0; k < e->nturn; k++) {
        const int64_t bytes = e->bytes[e->turn_root[k]];
        long d = 0;
        for (int j = e->turn_start[k]; j < e->turn_start[k + 1]; j++) {
            const int t = e->turn_t[j];
            if (t < 0 || t >= e->nt || region[t] <= 0 || !e->markable[t]) {
                d = 0;
                break;
            }
            d = gcd_of(d, region[t]);
        }
        all += bytes;
        if (d > 0 && d <= n) by_d[d] += bytes;
        for (long m = 1; d > n && m <= n; m++) /* out for the divisors of d up to n */
            if (d % m == 0) out[m] += bytes;
    }
    for (int m = 1; m <= n; m++) {
        for (int d = m; d <= n; d += m) out[m] += by_d[d];
        turn[m] += (size_t)(all - out[m]);
    }
    free(by_d);
    free(out);
    return 0;
}

double ck_evaluator_flops(const ck_evaluator *e, int v) { return e->fallback ? 0 : e->flops[v]; }

int ck_evaluator_recomputed(const ck_evaluator *e, int *nodes)
{
    int k = 0;
    for (int i = e->pos0; !e->fallback && i < e->pos; i++)
        if (e->c->g->n[e->at[i]].phase == CK_PHASE_FORWARD) nodes[k++] = e->at[i];
    return k;
}

/* ck_evaluate, exact where limit is SIZE_MAX; otherwise the placement stops
 * once the peak passes limit */
static int evaluate(ck_evaluator *e, const unsigned char *mark, int exact, size_t limit, size_t *peak, double *flops)
{
    if (e->fallback) return evaluate_listed(e->c, mark, exact, peak, flops);
    if (e->released || scratch(e)) return -1;
    walk(e, mark);
    *flops = e->rflops;
    if (!exact) {
        *peak = e->c->persistent + (size_t)sweep(e);
        return 0;
    }
    /* as ck_plan_memory: the transient region starts aligned above the persistent one */
    const size_t base = (e->c->persistent + ALIGN - 1) / ALIGN * ALIGN;
    const int64_t stop = limit == SIZE_MAX || limit < base ? INT64_MAX : (int64_t)(limit - base);
    const int64_t top = place(e, stop);
    if (top < 0) return -1;
    *peak = top > 0 || e->pos ? base + (size_t)top : e->c->persistent;
    if (top > stop) return 0; /* stopped: above limit, and no fragmentation known */
    const size_t live = e->c->persistent + (size_t)sweep(e);
    if (*peak >= live && *peak - live < e->least_frag) e->least_frag = *peak - live;
    return 0;
}

int ck_evaluate(ck_evaluator *e, const unsigned char *mark, int exact, size_t *peak, double *flops)
{
    return evaluate(e, mark, exact, SIZE_MAX, peak, flops);
}

int ck_evaluate_under(ck_evaluator *e, const unsigned char *mark, size_t limit, size_t *peak, double *flops)
{
    return evaluate(e, mark, 1, limit, peak, flops);
}

void ck_evaluator_free(ck_evaluator *e)
{
    if (!e) return;
    ck_big_free(e->bytes);
    ck_big_free(e->persistent);
    ck_big_free(e->markable);
    ck_big_free(e->nodes);
    ck_big_free(e->first0);
    ck_big_free(e->last0);
    ck_big_free(e->root0);
    ck_big_free(e->stack);
    ck_big_free(e->ws);
    ck_big_free(e->flops);
    ck_big_free(e->first);
    ck_big_free(e->last);
    ck_big_free(e->root);
    ck_big_free(e->origin);
    ck_big_free(e->copy);
    ck_big_free(e->delta);
    ck_big_free(e->at);
    ck_big_free(e->bufs);
    ck_big_free(e->kept);
    ck_big_free(e->placed_mark);
    ck_big_free(e->turn_root);
    ck_big_free(e->turn_start);
    ck_big_free(e->turn_t);
    ck_big_free(e);
}

/* the buffers that cross the turn unless what later entries read of them is
 * marked (ck_evaluate_turn); first, last and copy serve as scratch */
static int turn_buffers(ck_evaluator *e)
{
    const ck_decide_ctx *c = e->c;
    const ck_graph *g = c->g;
    int *later = e->copy, *count = e->last, *slot = e->first; /* per tensor; per root; per root */
    memset(later, 0, sizeof(int) * (size_t)e->nt);
    for (int i = 0; i < c->n; i++) {
        const ck_node *nd = &g->n[c->nodes[i]];
        if (nd->phase == CK_PHASE_FORWARD) continue;
        for (int j = 0; j < nd->nin; j++) later[nd->in[j]] = 1;
    }
    for (int t = 0; t < e->nt; t++) {
        count[t] = 0;
        if (c->retain && c->retain[t]) later[t] = 2;
    }
    int total = 0;
    for (int t = 0; t < e->nt; t++) {
        const int r = e->root0[t];
        if (!later[t] || e->persistent[t] || e->first0[r] < 0) continue;
        if (!count[r]++) e->nturn++;
        total++;
    }
    e->turn_root = ck_big_alloc(sizeof(int) * (size_t)(e->nturn ? e->nturn : 1));
    e->turn_start = ck_big_alloc(sizeof(int) * (size_t)(e->nturn + 1));
    e->turn_t = ck_big_alloc(sizeof(int) * (size_t)(total ? total : 1));
    if (!e->turn_root || !e->turn_start || !e->turn_t) return -1;
    int k = 0, at = 0;
    for (int r = 0; r < e->nt; r++) {
        if (!count[r]) continue;
        e->turn_root[k] = r;
        e->turn_start[k++] = at;
        slot[r] = at;
        at += count[r];
    }
    e->turn_start[k] = at;
    for (int t = 0; t < e->nt; t++) {
        const int r = e->root0[t];
        if (!later[t] || e->persistent[t] || e->first0[r] < 0) continue;
        e->turn_t[slot[r]++] = later[t] == 2 ? -1 : t;
    }
    return 0;
}

ck_evaluator *ck_evaluator_new(const ck_decide_ctx *c)
{
    ck_evaluator *e = ck_big_zalloc(sizeof *e);
    if (!e) return NULL;
    const ck_graph *g = c->g;
    e->c = c;
    e->nt = g->nt;
    e->least_frag = SIZE_MAX;
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
    e->nfwd = nfwd;
    e->cap = g->nt + nout;
    const size_t nt = (size_t)(g->nt ? g->nt : 1), nn = (size_t)(g->nn ? g->nn : 1), cap = (size_t)(e->cap ? e->cap : 1);
    e->bytes = ck_big_alloc(sizeof *e->bytes * nt);
    e->ws = ck_big_zalloc((nn) * (sizeof *e->ws));
    e->flops = ck_big_zalloc((nn) * (sizeof *e->flops));
    e->first = ck_big_alloc(sizeof(int) * cap);
    e->last = ck_big_alloc(sizeof(int) * cap);
    e->root = ck_big_alloc(sizeof(int) * cap);
    e->origin = ck_big_alloc(sizeof(int) * cap);
    e->copy = ck_big_alloc(sizeof(int) * nt);
    e->delta = ck_big_alloc(sizeof *e->delta * (size_t)(e->maxpos + 2));
    e->at = ck_big_alloc(sizeof(int) * (size_t)(e->maxpos + 1));
    e->persistent = ck_big_alloc(nt);
    e->markable = ck_big_alloc(nt);
    e->nodes = ck_big_alloc(sizeof *e->nodes * nn);
    e->first0 = ck_big_alloc(sizeof(int) * nt);
    e->last0 = ck_big_alloc(sizeof(int) * nt);
    e->root0 = ck_big_alloc(sizeof(int) * nt);
    e->stack = ck_big_alloc(sizeof *e->stack * (size_t)(nfwd ? nfwd : 1));
    e->placed_mark = ck_big_alloc(nt);
    if (!e->bytes || !e->ws || !e->flops || !e->first || !e->last || !e->root || !e->origin || !e->copy || !e->delta ||
        !e->at || !e->persistent || !e->markable || !e->nodes || !e->first0 || !e->last0 || !e->root0 ||
        !e->stack || !e->placed_mark) {
        ck_evaluator_free(e);
        return NULL;
    }
    for (int t = 0; t < g->nt; t++) {
        const ck_tensor *x = &g->t[t];
        e->bytes[t] = (int64_t)ck_tensor_bytes(x);
        e->persistent[t] = (unsigned char)ck_plan_is_persistent(x->kind);
        e->markable[t] = x->node >= 0 && g->n[x->node].phase == CK_PHASE_FORWARD;
    }
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
        ck_pnode *pn = &e->nodes[v];
        pn->nin = (signed char)nd->nin;
        pn->nout = (signed char)nd->nout;
        pn->reshape = nd->op == CK_OP_RESHAPE;
        memcpy(pn->in, nd->in, sizeof pn->in);
        memcpy(pn->out, nd->out, sizeof pn->out);
    }
    /* the forward entries, walked once */
    for (int t = 0; t < g->nt; t++) {
        e->first[t] = e->last[t] = -1;
        e->root[t] = t;
    }
    e->pos = 0;
    for (int i = 0; i < c->n; i++)
        if (g->n[c->nodes[i]].phase == CK_PHASE_FORWARD) entry(e, c->nodes[i], g->n[c->nodes[i]].in, g->n[c->nodes[i]].out);
    e->pos0 = e->pos;
    memcpy(e->first0, e->first, sizeof(int) * nt);
    memcpy(e->last0, e->last, sizeof(int) * nt);
    memcpy(e->root0, e->root, sizeof(int) * nt);
    return turn_buffers(e) ? (ck_evaluator_free(e), NULL) : e;
}
