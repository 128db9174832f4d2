/* The memory plan of one scheduled op list: liveness of every transient tensor
 * and workspace, then offsets in one arena (vm/plan/place.c: largest first,
 * best-fit gap among the buffers live at the same time). Persistent tensors sit below, at fixed
 * offsets. The peak is the arena's exact high-water mark: the end of the
 * highest byte any op touches. */
#include "plan/plan.h"
#include "plan/place.h"
#include "util/memory.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 64

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

/* a host id of an offloaded tensor: in the host region, not the arena */
static int on_host(const ck_plan *pl, int id) { return pl->loc && pl->loc[id] == CK_LOC_HOST; }

/* the shapes entry i reads and writes (an unwanted output gets the first input's) */
static void shapes_of(const ck_plan *pl, const ck_graph *g, int i, ck_shape *ins, ck_shape *outs)
{
    const ck_op_ref *r = &pl->ops[i];
    for (int j = 0; j < r->nin; j++) ins[j] = g->t[pl->origin[r->in[j]]].shape;
    for (int j = 0; j < r->nout; j++) outs[j] = r->out[j] >= 0 ? g->t[pl->origin[r->out[j]]].shape : ins[0];
}

static ck_dtype dtype_of(const ck_plan *pl, const ck_graph *g, int id) { return g->t[pl->origin[id]].dtype; }

ck_dtype ck_plan_entry_kernel_type(const ck_plan *pl, const ck_graph *g, int i, const ck_backend *be)
{
    const ck_op_ref *r = &pl->ops[i];
    if (r->xfer) return CK_F32; /* a copy of bytes, of no type */
    const enum ck_op op = g->n[r->node].op;
    /* as PyTorch's autocast: a product or convolution of 16-bit activations
     * (bf16 or fp16 storage) runs in their type, its other operands
     * (trainable fp32 weights, fp32 inputs, an fp8 base) cast; with fp32
     * activations it stays fp32 whatever its weights are stored in */
    const int cast = ck_op_autocast(op);
    const unsigned f32 = ck_op_f32_inputs(op); /* inputs its kernels read in fp32 whatever the type: no say */
    ck_dtype half = CK_F32;
    int act16 = 0;
    for (int j = 0; j < r->nin + r->nout; j++) {
        const int t = j < r->nin ? r->in[j] : r->out[j - r->nin];
        if (t < 0 || (j < r->nin && f32 >> j & 1)) continue;
        const ck_dtype dt = dtype_of(pl, g, t);
        if (dt == CK_BF16 || dt == CK_F16) {
            if (half != CK_F32 && half != dt) return CK_F32;
            half = dt;
            act16 |= g->t[pl->origin[t]].kind == CK_KIND_ACT;
        } else if (!(cast && (dt == CK_F32 || dt == CK_F8E4M3))) {
            return CK_F32;
        }
    }
    const ck_kernel_fn *k16 = ck_backend_kernels16(be, half);
    if (!k16 || !k16[op]) return CK_F32;
    return !cast || act16 ? half : CK_F32;
}

ck_dtype ck_plan_entry_copy_type(enum ck_op op, int input, ck_dtype dt, ck_dtype kt)
{
    if (input >= 0 && ck_op_f32_inputs(op) >> input & 1) kt = CK_F32; /* read in fp32 by every kernel */
    if (kt != CK_F32) return dt == CK_F32 || dt == CK_F8E4M3 ? kt : dt;
    return ck_dtype_copied(dt) ? CK_F32 : dt;
}

size_t ck_plan_entry_convert_bytes(const ck_plan *pl, const ck_graph *g, int i, ck_dtype kt)
{
    const ck_op_ref *r = &pl->ops[i];
    const enum ck_op op = g->n[r->node].op;
    size_t b = 0;
    for (int j = 0; j < r->nin + r->nout; j++) {
        int t = j < r->nin ? r->in[j] : r->out[j - r->nin];
        if (t < 0) continue;
        const ck_dtype dt = dtype_of(pl, g, t), ct = ck_plan_entry_copy_type(op, j < r->nin ? j : -1, dt, kt);
        if (ct != dt)
            b += (size_t)align_up(ck_shape_numel(&g->t[pl->origin[t]].shape) * (int64_t)ck_dtype_bytes(ct));
    }
    return b;
}

/* the workspace of entry i (not a transfer) whose kernel runs in kt */
static size_t workspace_in(const ck_plan *pl, const ck_graph *g, int i, const ck_backend *be, ck_dtype kt)
{
    const ck_node *nd = &g->n[pl->ops[i].node];
    ck_shape ins[CK_MAX_IN], outs[CK_MAX_OUT];
    shapes_of(pl, g, i, ins, outs);
    size_t conv = ck_plan_entry_convert_bytes(pl, g, i, kt);
    const ck_workspace_fn rule = ck_backend_workspace(be, kt);
    return conv + rule(nd->op, &nd->p, ins, pl->ops[i].nin, outs, be->nthreads);
}

size_t ck_plan_entry_workspace(const ck_plan *pl, const ck_graph *g, int i, const ck_backend *be)
{
    return pl->ops[i].xfer ? 0 : workspace_in(pl, g, i, be, ck_plan_entry_kernel_type(pl, g, i, be));
}

double ck_plan_op_flops(const ck_plan *pl, const ck_graph *g, int i)
{
    if (pl->ops[i].xfer) return 0;
    const ck_node *nd = &g->n[pl->ops[i].node];
    ck_shape ins[CK_MAX_IN], outs[CK_MAX_OUT];
    shapes_of(pl, g, i, ins, outs);
    return ck_op_flops(nd->op, &nd->p, ins, pl->ops[i].nin, outs);
}

/* A reshape's output is its input seen with another shape: both share one
 * buffer. root[t] names the tensor whose buffer t uses (itself if it owns one). */
static void alias_roots(const ck_plan *pl, const ck_graph *g, int *root)
{
    for (int t = 0; t < pl->ntensors; t++) root[t] = t;
    for (int i = 0; i < pl->n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (!r->xfer && g->n[r->node].op == CK_OP_RESHAPE && r->out[0] >= 0) root[r->out[0]] = root[r->in[0]];
    }
}

/* First and last list positions of every buffer, by root (aliases fold into
 * their root and get first = -1); retained tensors live to the end. */
static void liveness(const ck_plan *pl, const ck_graph *g, const int *retain, int *first, int *last, int *root)
{
    alias_roots(pl, g, root);
    for (int t = 0; t < pl->ntensors; t++) first[t] = last[t] = -1;
    for (int i = 0; i < pl->n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        for (int j = 0; j < r->nin + r->nout; j++) {
            int t = j < r->nin ? r->in[j] : r->out[j - r->nin];
            if (t < 0) continue;
            t = root[t];
            if (first[t] < 0) first[t] = i;
            last[t] = i;
        }
    }
    for (int t = 0; t < g->nt; t++)
        if (retain && retain[t] && first[root[t]] >= 0) last[root[t]] = pl->n;
}

/* Bytes live at each position from liveness (no placement): the most at
 * once (persistent added) and where (peak_at); cat, when given, gets every
 * position's bytes by category (cat[i * CK_CAT_COUNT + c]). */
static size_t sweep(ck_plan *pl, const ck_graph *g, size_t persistent, const int *first, const int *last,
                    const size_t *ws, size_t *cat, int *peak_at)
{
    const int n = pl->n, nc = cat ? CK_CAT_COUNT : 1; /* by category only for cat */
    int64_t *delta = calloc((size_t)(n + 2) * (size_t)nc, sizeof(int64_t));
    if (!delta) return 0;
    for (int t = 0; t < pl->ntensors; t++) {
        if (first[t] < 0 || (t < g->nt && ck_plan_is_persistent(g->t[t].kind)) || on_host(pl, t)) continue;
        const int c = cat ? (int)ck_plan_tensor_cat(pl, g, t) : 0;
        const int64_t b = (int64_t)ck_plan_tensor_bytes(pl, g, t);
        delta[(size_t)first[t] * (size_t)nc + (size_t)c] += b;
        delta[(size_t)(last[t] + 1) * (size_t)nc + (size_t)c] -= b;
    }
    const int w = cat ? CK_CAT_WORKSPACE : 0;
    for (int i = 0; i < n; i++) {
        delta[(size_t)i * (size_t)nc + (size_t)w] += (int64_t)ws[i];
        delta[(size_t)(i + 1) * (size_t)nc + (size_t)w] -= (int64_t)ws[i];
    }
    int64_t live[CK_CAT_COUNT] = {0};
    size_t best = 0;
    int at = 0;
    for (int i = 0; i < n; i++) {
        int64_t sum = 0;
        for (int c = 0; c < nc; c++) {
            live[c] += delta[(size_t)i * (size_t)nc + (size_t)c];
            sum += live[c];
            if (cat) cat[(size_t)i * CK_CAT_COUNT + c] = (size_t)live[c];
        }
        if ((size_t)sum > best) {
            best = (size_t)sum;
            at = i;
        }
    }
    free(delta);
    if (peak_at) *peak_at = at;
    return persistent + best;
}

/* the transient bytes live at position i, by category */
static void live_at(const ck_plan *pl, const ck_graph *g, const int *first, const int *last, const size_t *ws, int i,
                    size_t *out)
{
    memset(out, 0, sizeof(size_t) * CK_CAT_COUNT);
    for (int t = 0; t < pl->ntensors; t++)
        if (first[t] >= 0 && first[t] <= i && i <= last[t] && !(t < g->nt && ck_plan_is_persistent(g->t[t].kind)) &&
            !on_host(pl, t))
            out[ck_plan_tensor_cat(pl, g, t)] += ck_plan_tensor_bytes(pl, g, t);
    if (i < pl->n) out[CK_CAT_WORKSPACE] += ws[i];
}

size_t ck_plan_live_peak(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, const ck_backend *be)
{
    int *first = malloc(sizeof(int) * (size_t)pl->ntensors), *last = malloc(sizeof(int) * (size_t)pl->ntensors);
    int *root = malloc(sizeof(int) * (size_t)pl->ntensors);
    size_t *ws = malloc(sizeof(size_t) * (size_t)(pl->n ? pl->n : 1));
    size_t peak = 0;
    if (first && last && root && ws) {
        liveness(pl, g, retain, first, last, root);
        for (int i = 0; i < pl->n; i++) ws[i] = ck_plan_entry_workspace(pl, g, i, be);
        peak = sweep((ck_plan *)pl, g, persistent, first, last, ws, NULL, NULL);
    }
    free(first);
    free(last);
    free(root);
    free(ws);
    return peak;
}

size_t *ck_plan_timeline(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, const ck_backend *be)
{
    int *first = malloc(sizeof(int) * (size_t)pl->ntensors), *last = malloc(sizeof(int) * (size_t)pl->ntensors);
    int *root = malloc(sizeof(int) * (size_t)pl->ntensors);
    size_t *ws = malloc(sizeof(size_t) * (size_t)(pl->n ? pl->n : 1));
    size_t *cat = malloc(sizeof(size_t) * (size_t)(pl->n ? pl->n : 1) * CK_CAT_COUNT);
    if (first && last && root && ws && cat) {
        liveness(pl, g, retain, first, last, root);
        for (int i = 0; i < pl->n; i++) ws[i] = ck_plan_entry_workspace(pl, g, i, be);
        sweep((ck_plan *)pl, g, persistent, first, last, ws, cat, NULL);
        size_t fixed[CK_CAT_COUNT] = {0};
        for (int t = 0; t < g->nt; t++)
            if (first[t] >= 0 && ck_plan_is_persistent(g->t[t].kind) && !on_host(pl, t))
                fixed[ck_plan_tensor_cat(pl, g, t)] += ck_plan_tensor_bytes(pl, g, t);
        for (int i = 0; i < pl->n; i++)
            for (int c = 0; c < CK_CAT_COUNT; c++) cat[(size_t)i * CK_CAT_COUNT + c] += fixed[c];
    } else {
        free(cat);
        cat = NULL;
    }
    free(first);
    free(last);
    free(root);
    free(ws);
    return cat;
}

/* whether known holds a placement of this very list's buffers (each id once,
 * with its size and live range, and each workspace) */
static int same_buffers(const ck_plan_known *k, const ck_plan *pl, const ck_graph *g, int nb, const int *first,
                        const int *last)
{
    if (!k || !k->placed || k->nplaced != nb) return 0;
    unsigned char *seen = calloc((size_t)pl->ntensors + (size_t)pl->n + 1, 1);
    int same = seen != NULL;
    for (int b = 0; same && b < nb; b++) {
        const ck_place_buf *x = &k->placed[b];
        if (x->id >= 0)
            same = x->id < pl->ntensors && !seen[x->id] && first[x->id] == x->first && last[x->id] == x->last &&
                   x->size == (int64_t)ck_plan_tensor_bytes(pl, g, x->id);
        else
            same = x->first >= 0 && x->first < pl->n && x->first == x->last && !seen[pl->ntensors + x->first] &&
                   (int64_t)pl->ws_bytes[x->first] == x->size;
        if (same) seen[x->id >= 0 ? x->id : pl->ntensors + x->first] = 1;
    }
    free(seen);
    return same;
}

int ck_plan_memory(ck_plan *pl, const ck_graph *g, const int64_t *poff, size_t persistent, const int *retain,
                   const ck_backend *be)
{
    return ck_plan_memory_known(pl, g, poff, persistent, retain, be, NULL);
}

int ck_plan_memory_known(ck_plan *pl, const ck_graph *g, const int64_t *poff, size_t persistent, const int *retain,
                         const ck_backend *be, const ck_plan_known *known)
{
    int n = pl->n, nt = pl->ntensors, rc = -1;
    pl->off = malloc(sizeof(int64_t) * (size_t)nt);
    pl->ws_off = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    pl->ws_bytes = calloc((size_t)(n ? n : 1), sizeof(size_t));
    int *first = ck_big_alloc(sizeof(int) * (size_t)nt), *last = ck_big_alloc(sizeof(int) * (size_t)nt);
    int *root = ck_big_alloc(sizeof(int) * (size_t)nt);
    ck_place_buf *bufs = ck_big_alloc(sizeof *bufs * (size_t)(nt + n + 1));
    if (!pl->off || !pl->ws_off || !pl->ws_bytes || !first || !last || !root || !bufs) goto out;
    liveness(pl, g, retain, first, last, root);
    for (int i = 0; i < n; i++) {
        pl->ops[i].kt = ck_plan_entry_kernel_type(pl, g, i, be);
        pl->ws_bytes[i] = pl->ops[i].xfer ? 0
                          : known && known->ws_node ? known->ws_node[pl->ops[i].node]
                                                    : workspace_in(pl, g, i, be, pl->ops[i].kt);
    }

    int nb = 0, nh = 0;
    for (int t = 0; t < nt; t++) {
        pl->off[t] = -1;
        if (first[t] < 0) continue;
        if (t < g->nt && ck_plan_is_persistent(g->t[t].kind)) {
            pl->off[t] = poff[t];
            continue;
        }
        if (on_host(pl, t)) {
            nh++;
            continue;
        }
        bufs[nb++] = (ck_place_buf){(int64_t)ck_plan_tensor_bytes(pl, g, t), 0, first[t], last[t], t, 0};
    }
    for (int i = 0; i < n; i++) {
        pl->ws_off[i] = -1;
        if (pl->ws_bytes[i]) bufs[nb++] = (ck_place_buf){(int64_t)pl->ws_bytes[i], 0, i, i, -1, 0};
        if (pl->ws_bytes[i] > pl->workspace) pl->workspace = pl->ws_bytes[i];
    }
    /* retained tensors live to position n */
    const ck_place_buf *placed = bufs;
    int64_t top;
    if (same_buffers(known, pl, g, nb, first, last)) {
        placed = known->placed;
        top = known->top;
    } else if ((top = ck_place(bufs, nb, n + 1, ALIGN, INT64_MAX)) < 0) {
        goto out;
    }
    const int64_t base = align_up((int64_t)persistent);
    for (int b = 0; b < nb; b++) {
        if (placed[b].id >= 0) pl->off[placed[b].id] = base + placed[b].off;
        else pl->ws_off[placed[b].first] = base + placed[b].off;
    }
    /* the host region: the host ids placed by live overlap like the arena's buffers */
    pl->host_peak = 0;
    if (nh) { /* bufs is free again: placed is known's, or bufs read above */
        int k = 0;
        for (int t = 0; t < nt; t++)
            /* not a streamed weight */
            if (first[t] >= 0 && on_host(pl, t) && !(t < g->nt && ck_plan_is_persistent(g->t[t].kind)))
                bufs[k++] = (ck_place_buf){(int64_t)ck_plan_tensor_bytes(pl, g, t), 0, first[t], last[t], t, 0};
        const int64_t htop = ck_place(bufs, k, n + 1, ALIGN, INT64_MAX);
        if (htop < 0) goto out;
        for (int b = 0; b < k; b++) pl->off[bufs[b].id] = bufs[b].off;
        pl->host_peak = (size_t)htop;
    }
    for (int t = 0; t < nt; t++)
        if (root[t] != t) pl->off[t] = pl->off[root[t]];
    pl->transient = (size_t)top;
    pl->peak = nb ? (size_t)(base + top) : persistent;

    pl->live_peak = sweep(pl, g, persistent, first, last, pl->ws_bytes, NULL, &pl->peak_at);
    if (n) live_at(pl, g, first, last, pl->ws_bytes, pl->peak_at, pl->at_peak);
    for (int t = 0; t < g->nt && t < nt; t++)
        /* streamed weights: in host memory */
        if (first[t] >= 0 && ck_plan_is_persistent(g->t[t].kind) && !on_host(pl, t))
            pl->at_peak[ck_plan_tensor_cat(pl, g, t)] += ck_plan_tensor_bytes(pl, g, t);

    /* forward activations still live when the first non-forward op runs */
    int turn = n;
    for (int i = 0; i < n; i++)
        if (pl->ops[i].phase != CK_PHASE_FORWARD) {
            turn = i;
            break;
        }
    pl->activation_bytes = 0;
    for (int t = 0; t < g->nt; t++)
        if (first[t] >= 0 && first[t] < turn && last[t] >= turn && ck_plan_tensor_cat(pl, g, t) == CK_CAT_ACTIVATIONS)
            pl->activation_bytes += ck_plan_tensor_bytes(pl, g, t);
    pl->step_flops = pl->recompute_flops = 0;
    for (int i = 0; i < n; i++) {
        const double f = pl->ops[i].xfer                 ? 0
                         : known && known->flops_node ? known->flops_node[pl->ops[i].node]
                                                       : ck_plan_op_flops(pl, g, i);
        pl->step_flops += f;
        if (pl->ops[i].phase == CK_PHASE_RECOMPUTE) pl->recompute_flops += f;
    }
    rc = 0;
out:
    ck_big_free(first);
    ck_big_free(last);
    ck_big_free(root);
    ck_big_free(bufs);
    return rc;
}
