/* The scheduler: turns graph nodes and a checkpoint decision into one op list.
 * Forward nodes run first. A forward activation marked for recompute is not
 * kept for backward: right before the first backward op that reads it, its
 * producer runs again (and so, first, do the producers of any marked inputs),
 * writing a copy that later backward ops share. Each recomputed op runs once;
 * random ops replay the same numbers because their keys are node parameters;
 * optimizer updates are never recomputed. With fused updates (the graph's
 * fused_updates), each update moves to right after the last entry that reads
 * or writes any of its operands (its parameter, gradient and state), so a
 * gradient is freed as soon as it is complete and applied; data parallel
 * (the graph's comm_overlap) moves each gradient's accumulation and each
 * bucket's ALLREDUCE_START the same way. */
#include "plan/plan.h"
#include "util/memory.h"

#include <stdlib.h>
#include <string.h>

typedef struct sched {
    const ck_graph *g;
    const unsigned char *recompute;
    ck_plan *pl;
    size_t cap_ops, cap_t;
    int *copy; /* per graph tensor: its recomputed copy, -1 */
} sched;

static int push(sched *s, const ck_op_ref *r)
{
    if (ck_grow(&s->pl->ops, &s->cap_ops, (size_t)s->pl->n + 1, sizeof *s->pl->ops, 256)) return -1;
    s->pl->ops[s->pl->n++] = *r;
    return 0;
}

static int marked(const sched *s, int t)
{
    return s->recompute && t < s->g->nt && s->recompute[t] && s->g->t[t].node >= 0 &&
           s->g->n[s->g->t[t].node].phase == CK_PHASE_FORWARD;
}

static int new_copy(sched *s, int origin)
{
    ck_plan *pl = s->pl;
    if (ck_grow(&pl->origin, &s->cap_t, (size_t)pl->ntensors + 1, sizeof *pl->origin, 64)) return -1;
    pl->origin[pl->ntensors] = origin;
    return pl->ntensors++;
}

/* the copy of marked tensor t, recomputing it (and its marked inputs) if needed */
static int materialize(sched *s, int t)
{
    if (s->copy[t] >= 0) return s->copy[t];
    const ck_node *n = &s->g->n[s->g->t[t].node];
    ck_op_ref r = {0};
    r.node = s->g->t[t].node;
    r.phase = CK_PHASE_RECOMPUTE;
    r.nin = n->nin;
    r.nout = n->nout;
    for (int j = 0; j < n->nin; j++) {
        int u = n->in[j];
        r.in[j] = marked(s, u) ? materialize(s, u) : u;
        if (r.in[j] < 0) return -1;
    }
    for (int k = 0; k < n->nout; k++) {
        r.out[k] = -1;
        if (n->out[k] < 0) continue;
        r.out[k] = new_copy(s, n->out[k]);
        if (r.out[k] < 0) return -1;
        s->copy[n->out[k]] = r.out[k];
    }
    if (push(s, &r)) return -1;
    return s->copy[t];
}

static ck_op_ref ref_of(const ck_graph *g, int id)
{
    const ck_node *n = &g->n[id];
    ck_op_ref r = {0};
    r.node = id;
    r.phase = n->phase;
    r.nin = n->nin;
    r.nout = n->nout;
    memcpy(r.in, n->in, sizeof r.in);
    memcpy(r.out, n->out, sizeof r.out);
    return r;
}

/* an optimizer entry that adds a gradient into its persistent sum */
static int is_accumulation(const ck_plan *pl, const ck_graph *g, int i)
{
    const ck_op_ref *r = &pl->ops[i];
    const ck_node *nd = &g->n[r->node];
    return r->phase == CK_PHASE_OPTIMIZER && nd->op == CK_OP_ADD && nd->out[0] >= 0 &&
           g->t[nd->out[0]].kind == CK_KIND_OPTSTATE;
}

/* Optimizer entries moved forward into the list. Fused updates (comm 0):
 * every optimizer entry right after the last other entry that touches one
 * of its inputs. Data parallel overlapped with backward (comm 1): each
 * accumulation entry likewise (right after its gradient is complete), and
 * each ALLREDUCE_START right after the last accumulation of its bucket (the
 * sums of graph tensors i0..i1); every other optimizer entry (the waits, the
 * mean, clipping, the updates, the broadcasts) stays at the end in list
 * order. The other entries keep their order. */
static int move_optimizer_entries(ck_plan *pl, const ck_graph *g, int comm)
{
    const int n = pl->n;
    int *last = malloc(sizeof(int) * (size_t)(pl->ntensors ? pl->ntensors : 1));
    int *after = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *sum_after = malloc(sizeof(int) * (size_t)(g->nt ? g->nt : 1));
    int *head = malloc(sizeof(int) * (size_t)(n + 1)), *tail = malloc(sizeof(int) * (size_t)(n + 1));
    int *next = malloc(sizeof(int) * (size_t)(n ? n : 1));
    ck_op_ref *ops = malloc(sizeof *ops * (size_t)(n ? n : 1));
    int rc = -1;
    if (!last || !after || !sum_after || !head || !tail || !next || !ops) goto out;
    for (int t = 0; t < pl->ntensors; t++) last[t] = -1;
    for (int t = 0; t < g->nt; t++) sum_after[t] = -1;
    for (int i = 0; i < n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (r->phase == CK_PHASE_OPTIMIZER) continue;
        for (int j = 0; j < r->nin; j++) last[r->in[j]] = i;
        for (int k = 0; k < r->nout; k++)
            if (r->out[k] >= 0) last[r->out[k]] = i;
    }
    for (int i = 0; i < n; i++) {
        after[i] = pl->ops[i].phase == CK_PHASE_OPTIMIZER ? -2 : i; /* -2: stays at the end */
        if (pl->ops[i].phase != CK_PHASE_OPTIMIZER || (comm && !is_accumulation(pl, g, i))) continue;
        after[i] = -1;
        for (int j = 0; j < pl->ops[i].nin; j++)
            if (last[pl->ops[i].in[j]] > after[i]) after[i] = last[pl->ops[i].in[j]];
        if (comm) sum_after[g->n[pl->ops[i].node].out[0]] = after[i];
    }
    for (int i = 0; comm && i < n; i++) {
        const ck_node *nd = &g->n[pl->ops[i].node];
        if (nd->op != CK_OP_ALLREDUCE_START) continue;
        after[i] = -1;
        for (int t = (int)nd->p.i[0]; t <= (int)nd->p.i[1] && t < g->nt; t++)
            if (sum_after[t] > after[i]) after[i] = sum_after[t];
    }
    /* anchor b + 1 holds the entries that follow entry b (anchor 0: those
     * that touch nothing else), in list order */
    for (int b = 0; b <= n; b++) head[b] = tail[b] = -1;
    for (int u = 0; u < n; u++) {
        if (pl->ops[u].phase != CK_PHASE_OPTIMIZER || after[u] == -2) continue;
        const int b = after[u] + 1;
        next[u] = -1;
        if (tail[b] < 0) head[b] = u;
        else next[tail[b]] = u;
        tail[b] = u;
    }
    int m = 0;
    for (int u = head[0]; u >= 0; u = next[u]) ops[m++] = pl->ops[u];
    for (int i = 0; i < n; i++) {
        if (pl->ops[i].phase == CK_PHASE_OPTIMIZER) continue;
        ops[m++] = pl->ops[i];
        for (int u = head[i + 1]; u >= 0; u = next[u]) ops[m++] = pl->ops[u];
    }
    for (int i = 0; i < n; i++)
        if (after[i] == -2) ops[m++] = pl->ops[i];
    memcpy(pl->ops, ops, sizeof *ops * (size_t)n);
    rc = 0;
out:
    free(last), free(after), free(sum_after), free(head), free(tail), free(next), free(ops);
    return rc;
}

int ck_schedule(ck_plan *pl, const ck_graph *g, const int *nodes, int n, const unsigned char *recompute)
{
    sched s = {g, recompute, pl, 0, 0, NULL};
    memset(pl, 0, sizeof *pl);
    s.cap_t = (size_t)g->nt + 64;
    pl->ntensors = g->nt;
    pl->origin = malloc(sizeof(int) * (size_t)s.cap_t);
    s.copy = malloc(sizeof(int) * (size_t)(g->nt ? g->nt : 1));
    if (!pl->origin || !s.copy) goto fail;
    for (int t = 0; t < g->nt; t++) {
        pl->origin[t] = t;
        s.copy[t] = -1;
    }
    for (int i = 0; i < n; i++) {
        if (g->n[nodes[i]].phase != CK_PHASE_FORWARD) continue;
        ck_op_ref r = ref_of(g, nodes[i]);
        if (push(&s, &r)) goto fail;
    }
    for (int i = 0; i < n; i++) {
        if (g->n[nodes[i]].phase == CK_PHASE_FORWARD) continue;
        ck_op_ref r = ref_of(g, nodes[i]);
        for (int j = 0; j < r.nin; j++)
            if (marked(&s, r.in[j]) && (r.in[j] = materialize(&s, r.in[j])) < 0) goto fail;
        if (push(&s, &r)) goto fail;
    }
    if ((g->fused_updates || g->comm_overlap) && move_optimizer_entries(pl, g, !g->fused_updates)) goto fail;
    free(s.copy);
    return 0;
fail:
    free(s.copy);
    ck_plan_free(pl);
    return -1;
}

int ck_plan_saved_activations(const ck_graph *g, int *out)
{
    int k = 0;
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].kind == CK_KIND_ACT && g->t[t].node >= 0 && g->n[g->t[t].node].phase == CK_PHASE_FORWARD)
            out[k++] = t;
    return k;
}

int ck_plan_renumbered(const ck_plan *src, int base_nt, int g_nt, ck_plan *dst)
{
    const int shift = g_nt - base_nt, nt = src->ntensors + (shift > 0 ? shift : 0), n = src->n ? src->n : 1;
    *dst = *src;
    dst->ops = malloc(sizeof *dst->ops * (size_t)n);
    dst->origin = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
    dst->off = src->off ? malloc(sizeof(int64_t) * (size_t)(nt ? nt : 1)) : NULL;
    dst->ws_off = src->ws_off ? malloc(sizeof(int64_t) * (size_t)n) : NULL;
    dst->ws_bytes = src->ws_bytes ? malloc(sizeof(size_t) * (size_t)n) : NULL;
    dst->loc = src->loc ? calloc((size_t)(nt ? nt : 1), 1) : NULL;
    if (!dst->ops || !dst->origin || (src->off && !dst->off) || (src->ws_off && !dst->ws_off) ||
        (src->ws_bytes && !dst->ws_bytes) || (src->loc && !dst->loc)) {
        ck_plan_free(dst);
        return -1;
    }
    dst->ntensors = nt;
    for (int t = 0; t < nt; t++) {
        const int from = t < base_nt ? t : t < g_nt ? -1 : t - shift; /* -1: a new graph tensor */
        dst->origin[t] = from < 0 ? t : src->origin[from];      /* a copy's origin is below base_nt */
        if (dst->off) dst->off[t] = from < 0 ? -1 : src->off[from];
        if (dst->loc) dst->loc[t] = from < 0 ? CK_LOC_DEVICE : src->loc[from];
    }
    for (int i = 0; i < src->n; i++) {
        ck_op_ref r = src->ops[i];
        for (int j = 0; j < r.nin; j++)
            if (r.in[j] >= base_nt) r.in[j] += shift;
        for (int j = 0; j < r.nout; j++)
            if (r.out[j] >= base_nt) r.out[j] += shift;
        dst->ops[i] = r;
    }
    if (src->ws_off) memcpy(dst->ws_off, src->ws_off, sizeof(int64_t) * (size_t)src->n);
    if (src->ws_bytes) memcpy(dst->ws_bytes, src->ws_bytes, sizeof(size_t) * (size_t)src->n);
    return 0;
}

int ck_schedule_stats(ck_plan *pl, const ck_plan *base, const ck_graph *g, const int *nodes, int n, int *placed)
{
    const int nt = g->nt;
    int *after = malloc(sizeof(int) * (size_t)(n ? n : 1)), *count = calloc((size_t)base->n + 1, sizeof(int));
    int *writer = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
    memset(pl, 0, sizeof *pl);
    if (!after || !count || !writer) goto fail;
    /* the entry that writes each graph tensor (recompute entries write copies) */
    for (int t = 0; t < nt; t++) writer[t] = -1;
    for (int i = 0; i < base->n; i++)
        for (int k = 0; k < base->ops[i].nout; k++) {
            int t = base->ops[i].out[k];
            if (t >= 0 && t < nt && writer[t] < 0) writer[t] = i;
        }
    int extra = 0;
    for (int k = 0; k < n; k++) {
        int src = g->n[nodes[k]].in[0];
        after[k] = src < nt ? writer[src] : -1;
        if (placed) placed[k] = after[k] >= 0;
        if (after[k] >= 0) {
            count[after[k]]++;
            extra++;
        }
    }
    pl->ntensors = base->ntensors;
    pl->origin = malloc(sizeof(int) * (size_t)(pl->ntensors ? pl->ntensors : 1));
    pl->ops = malloc(sizeof(ck_op_ref) * (size_t)(base->n + extra ? base->n + extra : 1));
    if (!pl->origin || !pl->ops) goto fail;
    memcpy(pl->origin, base->origin, sizeof(int) * (size_t)pl->ntensors);
    if (base->loc) { /* the base's transfers come along: the stat entries read activations before they leave */
        if (!(pl->loc = malloc((size_t)(pl->ntensors ? pl->ntensors : 1)))) goto fail;
        memcpy(pl->loc, base->loc, (size_t)pl->ntensors);
        pl->nslots = base->nslots;
        pl->offload_bytes = base->offload_bytes;
        pl->stream_bytes = base->stream_bytes;
        pl->prefetch = base->prefetch;
    }
    /* stat entries grouped by the entry they follow, in the order given */
    int *start = count; /* prefix sums: where each entry's stats begin in order[] */
    int *order = malloc(sizeof(int) * (size_t)(extra ? extra : 1));
    if (!order) goto fail;
    for (int i = 0, acc = 0; i <= base->n; i++) {
        int c = count[i];
        start[i] = acc;
        acc += c;
    }
    for (int k = 0; k < n; k++)
        if (after[k] >= 0) order[start[after[k]]++] = k;
    for (int k = 0, i = 0; i < base->n; i++) { /* start[i] now ends entry i's run */
        const ck_op_ref r = base->ops[i];
        pl->ops[pl->n++] = r;
        for (; k < start[i]; k++) {
            ck_op_ref s = ref_of(g, nodes[order[k]]);
            s.phase = r.phase == CK_PHASE_RECOMPUTE ? CK_PHASE_BACKWARD : r.phase;
            pl->ops[pl->n++] = s;
        }
    }
    free(order);
    free(after);
    free(count);
    free(writer);
    return 0;
fail:
    free(after);
    free(count);
    free(writer);
    ck_plan_free(pl);
    return -1;
}
