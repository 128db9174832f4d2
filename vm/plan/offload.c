/* Offload as entries of the op list: a saved activation marked CK_OFFLOAD
 * leaves the device after its last forward use and comes back before its
 * first later use, through transfer entries (plan.h's ck_xfer) the executor
 * runs on a copy stream. Being entries, the transfers are planned like any
 * other use: the buffer is held on the device until the wait that ends its
 * copy out, its host copy lives in the host region from the copy out to the
 * copy back, and the copy back holds its device bytes from the entry that
 * starts it. So the memory plan states device and host bytes exactly, and a
 * captured graph replays the copies with the kernels. A weight or optimizer
 * state marked CK_OFFLOAD (kohya's block swap, DeepSpeed's optimizer
 * offload) is streamed through the same entries: it lives in pinned host
 * memory, comes in once per group of its uses, and an update's copy goes
 * back out. */
#include "plan/offload.h"

#include <stdlib.h>
#include <string.h>

typedef struct moved {
    int root;                 /* the buffer: a forward activation */
    int last_fwd, first_later; /* its last forward use, its first later one */
    int out_slot, in_slot;
    int host, copy;           /* its host id and its device copy */
} moved;

/* per list position, the moved buffers anchored there (linked through next) */
typedef struct anchors {
    int *head, *tail, *next;
} anchors;

static void anchor(anchors *a, int pos, int m)
{
    a->next[m] = -1;
    if (a->tail[pos] < 0) a->head[pos] = m;
    else a->next[a->tail[pos]] = m;
    a->tail[pos] = m;
}

static ck_op_ref xfer_entry(const ck_graph *g, int root, ck_phase ph, ck_xfer kind, int in, int out, int slot)
{
    ck_op_ref r = {0};
    r.node = g->t[root].node;
    r.phase = ph;
    r.nin = 1;
    r.in[0] = in;
    r.nout = out >= 0;
    r.out[0] = out;
    for (int k = 1; k < CK_MAX_OUT; k++) r.out[k] = -1;
    r.xfer = kind;
    r.slot = (unsigned)slot;
    return r;
}

static int offload_activations(ck_plan *pl, const ck_graph *g, const unsigned char *mark, const int *retain,
                               int prefetch)
{
    const int n = pl->n, nt0 = pl->ntensors;
    int turn = 0;
    while (turn < n && pl->ops[turn].phase == CK_PHASE_FORWARD) turn++;
    if (!mark || turn == 0 || turn == n || pl->loc) return 0;
    int *root = malloc(sizeof(int) * (size_t)nt0), *last_fwd = malloc(sizeof(int) * (size_t)nt0);
    int *first_later = malloc(sizeof(int) * (size_t)nt0), *copyof = malloc(sizeof(int) * (size_t)nt0);
    unsigned char *bad = calloc((size_t)nt0, 1), *need = calloc((size_t)nt0, 1);
    moved *mv = NULL;
    anchors in_at = {0}, wait_in_at = {0}, out_at = {0}, wait_out_at = {0};
    ck_op_ref *ops = NULL;
    int *origin = NULL;
    unsigned char *loc = NULL;
    int *alias = NULL;
    int rc = -1;
    if (!root || !last_fwd || !first_later || !copyof || !bad || !need) goto out;
    for (int t = 0; t < nt0; t++) {
        root[t] = t;
        last_fwd[t] = first_later[t] = copyof[t] = -1;
    }
    for (int i = 0; i < n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (g->n[r->node].op == CK_OP_RESHAPE && r->out[0] >= 0) root[r->out[0]] = root[r->in[0]];
        for (int j = 0; j < r->nin + r->nout; j++) {
            const int id = j < r->nin ? r->in[j] : r->out[j - r->nin];
            if (id < 0) continue;
            const int b = root[id];
            if (i < turn) {
                last_fwd[b] = i;
            } else {
                if (first_later[b] < 0) first_later[b] = i;
                /* written again after the forward part: not a saved activation (a
                 * reshape's output is a view of it, made again from the copy) */
                if (j >= r->nin && g->n[r->node].op != CK_OP_RESHAPE) bad[b] = 1;
                else if (id < g->nt && id != b) need[id] = 1; /* an alias read later: made again from the copy */
            }
        }
    }
    for (int t = 0; retain && t < g->nt; t++)
        if (retain[t]) bad[root[t]] = 1; /* read by the host after the list: on the device at the end */
    /* the buffers moved, by root id */
    int k = 0;
    for (int t = 0; t < g->nt; t++) {
        if (mark[t] != CK_OFFLOAD) continue;
        const int b = root[t];
        if (b >= g->nt || bad[b] || copyof[b] == -2 || g->t[b].kind != CK_KIND_ACT || g->t[b].node < 0 ||
            g->n[g->t[b].node].phase != CK_PHASE_FORWARD || last_fwd[b] < 0 || first_later[b] < 0)
            continue;
        copyof[b] = -2; /* chosen (made a copy below) */
        k++;
    }
    if (k == 0) {
        rc = 0;
        goto out;
    }
    /* the aliases a copy must make again: those read later, and the reshapes between them and their root */
    for (int a = g->nt - 1; a >= 0; a--) {
        if (!need[a] || copyof[root[a]] != -2) {
            need[a] = 0;
            continue;
        }
        const int b = g->n[g->t[a].node].in[0];
        if (b != root[a]) need[b] = 1;
    }
    int nalias = 0;
    for (int a = 0; a < g->nt; a++) nalias += need[a];
    const int m_ops = n + 4 * k + nalias, m_t = nt0 + 2 * k + nalias;
    mv = malloc(sizeof *mv * (size_t)k);
    ops = malloc(sizeof *ops * (size_t)m_ops);
    origin = malloc(sizeof(int) * (size_t)m_t);
    loc = calloc((size_t)m_t, 1);
    const size_t na = (size_t)n;
    anchors *all[4] = {&in_at, &wait_in_at, &out_at, &wait_out_at};
    for (int q = 0; q < 4; q++) {
        all[q]->head = malloc(sizeof(int) * na);
        all[q]->tail = malloc(sizeof(int) * na);
        all[q]->next = malloc(sizeof(int) * (size_t)k);
        if (!all[q]->head || !all[q]->tail || !all[q]->next) goto out;
        for (int i = 0; i < n; i++) all[q]->head[i] = all[q]->tail[i] = -1;
    }
    if (!mv || !ops || !origin || !loc) goto out;
    memcpy(origin, pl->origin, sizeof(int) * (size_t)nt0);
    int ids = nt0, m = 0;
    size_t moved_bytes = 0;
    for (int b = 0; b < g->nt; b++) {
        if (copyof[b] != -2) continue;
        mv[m] = (moved){b, last_fwd[b], first_later[b], -1, -1, ids, ids + 1};
        origin[ids] = b, loc[ids] = CK_LOC_HOST;
        origin[ids + 1] = b, loc[ids + 1] = CK_LOC_BACK;
        copyof[b] = ids + 1;
        ids += 2;
        moved_bytes += ck_plan_tensor_bytes(pl, g, b);
        int wait_out = last_fwd[b] + prefetch, start_in = first_later[b] - prefetch;
        if (wait_out > turn - 1) wait_out = turn - 1;
        if (start_in < turn) start_in = turn;
        anchor(&out_at, last_fwd[b], m);
        anchor(&wait_out_at, wait_out, m);
        anchor(&in_at, start_in, m);
        anchor(&wait_in_at, first_later[b], m);
        m++;
    }
    /* per root, its aliases made again, in rising id order */
    alias = malloc(sizeof(int) * 3 * (size_t)g->nt);
    if (!alias) goto out;
    int *alias_head = alias, *alias_tail = alias + g->nt, *alias_next = alias + 2 * g->nt;
    for (int a = 0; a < g->nt; a++) alias_head[a] = alias_tail[a] = -1;
    for (int a = 0; a < g->nt; a++) {
        if (!need[a]) continue;
        origin[ids] = a, loc[ids] = CK_LOC_BACK;
        copyof[a] = ids++;
        const int b = root[a];
        alias_next[a] = -1;
        if (alias_tail[b] < 0) alias_head[b] = a;
        else alias_next[alias_tail[b]] = a;
        alias_tail[b] = a;
    }
    int e = 0, slots = 0;
    for (int i = 0; i < n; i++) {
        for (int x = in_at.head[i]; x >= 0; x = in_at.next[x]) {
            mv[x].in_slot = slots++;
            ops[e++] = xfer_entry(g, mv[x].root, CK_PHASE_BACKWARD, CK_XFER_IN, mv[x].host, mv[x].copy, mv[x].in_slot);
        }
        for (int x = wait_in_at.head[i]; x >= 0; x = wait_in_at.next[x]) {
            const int b = mv[x].root;
            ops[e++] = xfer_entry(g, b, CK_PHASE_BACKWARD, CK_XFER_IN_WAIT, mv[x].copy, -1, mv[x].in_slot);
            /* the aliases read later, each from its input's copy (ids rise along a chain of reshapes) */
            for (int a = alias_head[b]; a >= 0; a = alias_next[a]) {
                const ck_node *nd = &g->n[g->t[a].node];
                ck_op_ref r = {0};
                r.node = g->t[a].node;
                r.phase = CK_PHASE_BACKWARD;
                r.nin = nd->nin;
                r.nout = nd->nout;
                for (int j = 0; j < nd->nin; j++) r.in[j] = copyof[nd->in[j]] >= 0 ? copyof[nd->in[j]] : nd->in[j];
                for (int j = 0; j < CK_MAX_OUT; j++) r.out[j] = -1;
                r.out[0] = copyof[a];
                ops[e++] = r;
            }
        }
        ck_op_ref r = pl->ops[i];
        if (i >= turn)
            for (int j = 0; j < r.nin; j++)
                if (r.in[j] < g->nt && copyof[r.in[j]] >= 0) r.in[j] = copyof[r.in[j]];
        ops[e++] = r;
        for (int x = out_at.head[i]; x >= 0; x = out_at.next[x]) {
            mv[x].out_slot = slots++;
            ops[e++] = xfer_entry(g, mv[x].root, CK_PHASE_FORWARD, CK_XFER_OUT, mv[x].root, mv[x].host, mv[x].out_slot);
        }
        for (int x = wait_out_at.head[i]; x >= 0; x = wait_out_at.next[x])
            ops[e++] = xfer_entry(g, mv[x].root, CK_PHASE_FORWARD, CK_XFER_OUT_WAIT, mv[x].root, -1, mv[x].out_slot);
    }
    free(pl->ops);
    free(pl->origin);
    pl->ops = ops;
    pl->origin = origin;
    pl->loc = loc;
    pl->n = e;
    pl->ntensors = ids;
    pl->nslots = slots;
    pl->offload_bytes = moved_bytes;
    pl->prefetch = prefetch;
    ops = NULL, origin = NULL, loc = NULL;
    rc = k;
out:
    for (int q = 0; q < 4; q++) {
        anchors *a = q == 0 ? &in_at : q == 1 ? &wait_in_at : q == 2 ? &out_at : &wait_out_at;
        free(a->head), free(a->tail), free(a->next);
    }
    free(root), free(last_fwd), free(first_later), free(copyof), free(bad), free(need);
    free(mv), free(ops), free(origin), free(loc), free(alias);
    return rc;
}

/* A persistent tensor marked CK_OFFLOAD is streamed: its values live in
 * pinned host memory (its persistent offset is one in the host weights'
 * region, not the arena's), and each group of its uses reads a device copy
 * of its own. A frozen weight's groups are the forward part and the entries
 * after it (recompute and backward, which reads a block's weights where it
 * recomputes that block); a trainable weight's or an optimizer state's are
 * the forward part, backward (with fused updates, the updates inside it),
 * and the optimizer's tail, so that the updates bring the weights and states
 * in one at a time. The copy comes in prefetch entries before the group's first
 * use (not before the group starts), the wait right before that use; a group
 * that writes the tensor (an update, in place) copies it back out after its
 * last use and waits for that prefetch entries later (not past the list's
 * end); the copy's bytes are free after its last use, or after that wait. A
 * group that writes is the tensor's last in the list (the optimizer's).
 * Returns the groups streamed, or -1 out of memory (pl unchanged). */
enum { GROUPS = 3 };

static int use_group(const ck_graph *g, int t, int i, int turn, int tail)
{
    if (i < turn) return 0;
    return g->t[t].kind != CK_KIND_FROZEN && i >= tail ? 2 : 1;
}

/* a group's transfers run in its phase: an interrupt that stops a step
 * before its updates leaves no update's copy half made */
static const ck_phase group_phase[GROUPS] = {CK_PHASE_FORWARD, CK_PHASE_BACKWARD, CK_PHASE_OPTIMIZER};

static int stream_weights(ck_plan *pl, const ck_graph *g, const unsigned char *mark, int prefetch)
{
    const int n = pl->n, nt0 = pl->ntensors, nt = g->nt;
    int turn = 0;
    while (turn < n && pl->ops[turn].phase == CK_PHASE_FORWARD) turn++;
    /* the optimizer's tail: after the last backward or recompute entry; none
     * where updates run inside backward (fused), where a weight's update
     * shares the copy its backward read */
    int last_bwd = -1, fused = 0;
    for (int i = 0; i < n; i++)
        if (!pl->ops[i].xfer && (pl->ops[i].phase == CK_PHASE_BACKWARD || pl->ops[i].phase == CK_PHASE_RECOMPUTE))
            last_bwd = i;
    for (int i = 0; i < last_bwd && !fused; i++) fused = !pl->ops[i].xfer && pl->ops[i].phase == CK_PHASE_OPTIMIZER;
    int tail = fused ? n : last_bwd + 1;
    if (tail < turn) tail = turn;
    const size_t nx = (size_t)GROUPS * (size_t)(nt ? nt : 1);
    int *first = malloc(sizeof(int) * nx), *copy = malloc(sizeof(int) * nx), *last = malloc(sizeof(int) * nx);
    unsigned char *writes = calloc(nx, 1);
    int *grp_t = NULL, *grp_of = NULL, *out_slot = NULL;
    anchors in_at = {0}, wait_at = {0}, out_at = {0}, wait_out_at = {0};
    ck_op_ref *ops = NULL;
    int *origin = NULL;
    unsigned char *loc = NULL;
    int rc = -1;
    if (!first || !copy || !last || !writes) goto out;
    for (size_t x = 0; x < nx; x++) first[x] = copy[x] = last[x] = -1;
    int k = 0, kw = 0;
    for (int i = 0; i < n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (r->xfer) continue;
        for (int j = 0; j < r->nin + r->nout; j++) {
            const int t = j < r->nin ? r->in[j] : r->out[j - r->nin];
            if (t < 0 || t >= nt || mark[t] != CK_OFFLOAD || !ck_plan_is_persistent(g->t[t].kind) ||
                g->t[t].kind == CK_KIND_INPUT)
                continue;
            const int x = GROUPS * t + use_group(g, t, i, turn, tail);
            if (first[x] < 0) first[x] = i, k++;
            last[x] = i;
            if (j >= r->nin && !writes[x]) writes[x] = 1, kw++;
        }
    }
    if (k == 0) {
        rc = 0;
        goto out;
    }
    grp_t = malloc(sizeof(int) * (size_t)k);
    grp_of = malloc(sizeof(int) * (size_t)k);
    out_slot = malloc(sizeof(int) * (size_t)k);
    ops = malloc(sizeof *ops * (size_t)(n + 2 * k + 2 * kw));
    origin = malloc(sizeof(int) * (size_t)(nt0 + k));
    loc = calloc((size_t)(nt0 + k), 1);
    anchors *all[4] = {&in_at, &wait_at, &out_at, &wait_out_at};
    for (int q = 0; q < 4; q++) {
        all[q]->head = malloc(sizeof(int) * (size_t)(n ? n : 1));
        all[q]->tail = malloc(sizeof(int) * (size_t)(n ? n : 1));
        all[q]->next = malloc(sizeof(int) * (size_t)k);
        if (!all[q]->head || !all[q]->tail || !all[q]->next) goto out;
        for (int i = 0; i < n; i++) all[q]->head[i] = all[q]->tail[i] = -1;
    }
    if (!grp_t || !grp_of || !out_slot || !ops || !origin || !loc) goto out;
    memcpy(origin, pl->origin, sizeof(int) * (size_t)nt0);
    if (pl->loc) memcpy(loc, pl->loc, (size_t)nt0);
    int m = 0, ids = nt0;
    size_t streamed = 0;
    for (size_t x = 0; x < nx; x++) {
        if (first[x] < 0) continue;
        const int t = (int)(x / GROUPS), later = x % GROUPS != 0;
        grp_t[m] = t, grp_of[m] = (int)x;
        copy[x] = ids;
        origin[ids] = t, loc[ids] = CK_LOC_BACK;
        loc[t] = CK_LOC_HOST;
        ids++;
        streamed += ck_tensor_bytes(&g->t[t]);
        int start = first[x] - prefetch;
        if (start < (later ? turn : 0)) start = later ? turn : 0;
        anchor(&in_at, start, m);
        anchor(&wait_at, first[x], m);
        if (writes[x]) {
            anchor(&out_at, last[x], m);
            anchor(&wait_out_at, last[x] + prefetch < n ? last[x] + prefetch : n - 1, m);
        }
        m++;
    }
    int e = 0, slot = pl->nslots;
    int *slot_of = first; /* each group's first use is anchored: its slot in its place */
    for (int i = 0; i < n; i++) {
        for (int y = in_at.head[i]; y >= 0; y = in_at.next[y]) {
            const int x = grp_of[y];
            ck_op_ref r = xfer_entry(g, 0, group_phase[x % GROUPS], CK_XFER_IN, grp_t[y], copy[x], slot);
            r.node = pl->ops[first[x]].node; /* a weight has no producer: its first reader names it */
            slot_of[x] = slot++;
            ops[e++] = r;
        }
        for (int y = wait_at.head[i]; y >= 0; y = wait_at.next[y]) {
            const int x = grp_of[y];
            ck_op_ref r = xfer_entry(g, 0, group_phase[x % GROUPS], CK_XFER_IN_WAIT, copy[x], -1, slot_of[x]);
            r.node = pl->ops[i].node;
            ops[e++] = r;
        }
        ck_op_ref r = pl->ops[i];
        if (!r.xfer) {
            for (int j = 0; j < r.nin + r.nout; j++) {
                int *id = j < r.nin ? &r.in[j] : &r.out[j - r.nin];
                if (*id < 0 || *id >= nt) continue;
                const int c = copy[GROUPS * *id + use_group(g, *id, i, turn, tail)];
                if (c >= 0) *id = c;
            }
        }
        ops[e++] = r;
        /* an update's copy back: it writes the tensor's host values, and holds the copy until its wait */
        for (int y = out_at.head[i]; y >= 0; y = out_at.next[y]) {
            const int x = grp_of[y];
            ck_op_ref o = xfer_entry(g, 0, group_phase[x % GROUPS], CK_XFER_OUT, copy[x], grp_t[y], slot);
            o.node = pl->ops[i].node;
            out_slot[y] = slot++;
            ops[e++] = o;
        }
        for (int y = wait_out_at.head[i]; y >= 0; y = wait_out_at.next[y]) {
            const int x = grp_of[y];
            ck_op_ref o = xfer_entry(g, 0, group_phase[x % GROUPS], CK_XFER_OUT_WAIT, copy[x], -1, out_slot[y]);
            o.node = pl->ops[last[x]].node;
            ops[e++] = o;
        }
    }
    free(pl->ops);
    free(pl->origin);
    free(pl->loc);
    pl->ops = ops;
    pl->origin = origin;
    pl->loc = loc;
    pl->n = e;
    pl->ntensors = ids;
    pl->nslots = slot;
    pl->stream_bytes = streamed;
    pl->prefetch = prefetch;
    ops = NULL, origin = NULL, loc = NULL;
    rc = k;
out:
    for (int q = 0; q < 4; q++) {
        anchors *a = q == 0 ? &in_at : q == 1 ? &wait_at : q == 2 ? &out_at : &wait_out_at;
        free(a->head), free(a->tail), free(a->next);
    }
    free(first), free(copy), free(last), free(writes), free(grp_t), free(grp_of), free(out_slot), free(ops), free(origin),
        free(loc);
    return rc;
}

int ck_offload_schedule(ck_plan *pl, const ck_graph *g, const unsigned char *mark, const int *retain, int prefetch)
{
    if (prefetch < 0) prefetch = 0;
    if (!mark) return 0;
    const int a = offload_activations(pl, g, mark, retain, prefetch);
    if (a < 0) return -1;
    const int w = stream_weights(pl, g, mark, prefetch);
    return w < 0 ? -1 : a + w;
}

size_t ck_offload_stream_copies_most(const ck_plan *pl, const ck_graph *g)
{
    if (!pl->loc || !pl->stream_bytes) return 0;
    int *first = malloc(sizeof(int) * (size_t)(pl->ntensors ? pl->ntensors : 1));
    int *last = malloc(sizeof(int) * (size_t)(pl->ntensors ? pl->ntensors : 1));
    int64_t *delta = calloc((size_t)pl->n + 1, sizeof *delta);
    size_t most = (size_t)-1;
    if (!first || !last || !delta) goto out;
    for (int id = 0; id < pl->ntensors; id++) first[id] = last[id] = -1;
    for (int i = 0; i < pl->n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        int ids[CK_MAX_IN + CK_MAX_OUT], k = 0;
        for (int j = 0; j < r->nin; j++) ids[k++] = r->in[j];
        for (int j = 0; j < r->nout; j++) ids[k++] = r->out[j];
        for (int j = 0; j < k; j++) {
            const int id = ids[j];
            if (id < 0 || pl->loc[id] != CK_LOC_BACK || !ck_plan_is_persistent(g->t[pl->origin[id]].kind)) continue;
            if (first[id] < 0) first[id] = i;
            last[id] = i;
        }
    }
    for (int id = 0; id < pl->ntensors; id++) {
        if (first[id] < 0) continue;
        const int64_t b = (int64_t)ck_tensor_bytes(&g->t[pl->origin[id]]);
        delta[first[id]] += b;
        delta[last[id] + 1] -= b;
    }
    int64_t live = 0, m = 0;
    for (int i = 0; i < pl->n; i++) {
        live += delta[i];
        if (live > m) m = live;
    }
    most = (size_t)m;
out:
    free(first), free(last), free(delta);
    return most;
}
