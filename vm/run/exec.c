/* The executor: runs one planned op list on a backend (ops/backend.h).
 * Every pointer it hands a kernel is an offset of the plan into the arena; a failure names the op, its scope and its script line. */
#include "run/exec.h"

#include "dist/dist.h"
#include "util/memory.h"

#include "../../ops/bf16.h"
#include "../../ops/fp16.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void view_of(const ck_exec_env *p, const ck_plan *pl, int t, ck_view *v)
{
    const ck_shape *s = &p->g->t[pl->origin[t]].shape;
    v->data = (float *)(p->arena + pl->off[t]);
    v->ndim = s->ndim;
    for (int d = 0; d < s->ndim; d++) v->shape[d] = s->d[d];
}

static const char *scope_of(const ck_node *n) { return n->scope && n->scope[0] ? n->scope : "(top)"; }

/* The backend's pending failure as the error of node n, naming the op, its
 * scope and its script line. */
static int node_failed(const ck_exec_env *p, const ck_node *n, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s in %s on %s: %s", n->where, ck_op_name(n->op), scope_of(n), p->be->name,
             p->be->error());
    p->be->clear_error();
    return -1;
}

/* the same for list entry i */
static int entry_failed(const ck_exec_env *p, const ck_plan *pl, int i, char *err, size_t errlen)
{
    return node_failed(p, &p->g->n[pl->ops[i].node], err, errlen);
}

/* what the backend's communicator takes from vm/dist */
static const ck_comm_host comm_host = {.timeout = ck_dist_timeout, .step = ck_dist_step, .abort = ck_dist_abort};

int ck_exec_comm_open(const ck_backend *be, char *err, size_t errlen)
{
    static const ck_backend *opened; /* one communicator per process, as one device */
    if (!be->comm_init || opened == be) return 0;
    be->enter(); /* the communicator's stream and events are made on this thread's device */
    /* rank 0's id (and whether it has one) to every rank: a word of status, then the id */
    enum { W = 1 + CK_COMM_ID_BYTES / 8 };
    int64_t mine[W] = {0}, *all = calloc((size_t)ck_dist_size(), sizeof mine);
    if (!all) {
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    if (ck_dist_rank() == 0) mine[0] = be->comm_id(mine + 1) ? -1 : 1;
    int rc = ck_dist_allgather_i64(mine, all, W, NULL, NULL);
    if (rc == 0 && all[0] == 1) rc = be->comm_init(all + 1, ck_dist_rank(), ck_dist_size(), &comm_host);
    else if (rc == 0) rc = -1;
    free(all);
    if (rc == 0) {
        opened = be;
        return 0;
    }
    if (be->error()[0]) {
        snprintf(err, errlen, "data parallel on the %s device: %s", be->name, be->error());
        be->clear_error();
    } else {
        snprintf(err, errlen, "data parallel on the %s device: rank 0 could not make the communicator's id", be->name);
    }
    return -1;
}

/* ALLREDUCE_START and ALLREDUCE_WAIT: the bucket (a range of the persistent
 * region, in place) summed over the job's ranks: by the backend's own
 * collectives (NCCL on device memory) when it has them, else through vm/dist
 * on host memory; BROADCAST the same way */
static int run_comm(const ck_exec_env *p, const ck_node *n, char *err, size_t errlen)
{
    const int first = (int)n->p.i[0], last = (int)n->p.i[1], b = (int)n->p.i[2];
    const ck_backend *be = p->be;
    if (p->replay) return 0;
    if (n->op == CK_OP_BROADCAST) { /* ZeRO-1: the owner's updated parameter to every rank */
        const int t = n->in[0];
        if (p->poff[t] < 0) {
            snprintf(err, errlen, "%s: broadcast: not a parameter", n->where);
            return -1;
        }
        float *x = (float *)(p->arena + p->poff[t]);
        const int64_t count = ck_shape_numel(&p->g->t[t].shape);
        if (be->broadcast) return be->broadcast(x, count, (int)n->p.i[0]) ? node_failed(p, n, err, errlen) : 0;
        return ck_dist_broadcast(x, count, (int)n->p.i[0], NULL, NULL) == 0 ? 0 : -1;
    }
    if (!p->reqs || p->poff[first] < 0 || p->poff[last] < 0) {
        snprintf(err, errlen, "%s: %s: the program has no buckets", n->where, ck_op_name(n->op));
        return -1;
    }
    float *x = (float *)(p->arena + p->poff[first]);
    const int64_t bytes = p->poff[last] + (int64_t)ck_tensor_bytes(&p->g->t[last]) - p->poff[first];
    if (be->allreduce_start) {
        const int rc = n->op == CK_OP_ALLREDUCE_START ? be->allreduce_start(x, bytes / 4, b) : be->allreduce_wait(b);
        return rc ? node_failed(p, n, err, errlen) : 0;
    }
    if (n->op == CK_OP_ALLREDUCE_START) {
        if (ck_dist_iallreduce(x, bytes / 4, &p->reqs[b]) != 0) {
            snprintf(err, errlen, "%s: bucket %d of %lld values is too large for one allreduce", n->where, b,
                     (long long)(bytes / 4));
            return -1;
        }
        return 0;
    }
    /* an update in flight is finished, never left half done (as an interrupt
     * leaves the optimizer's entries to run): no poll */
    return ck_dist_wait(&p->reqs[b], NULL, NULL) == 0 ? 0 : -1;
}

/* A transfer entry (vm/plan/offload.c): a copy between the arena and the
 * host region on the backend's copy stream, or a wait for one. */
static int run_xfer(const ck_exec_env *p, const ck_plan *pl, int i, char *err, size_t errlen)
{
    const ck_op_ref *r = &pl->ops[i];
    const ck_backend *be = p->be;
    int rc;
    if (r->xfer == CK_XFER_OUT || r->xfer == CK_XFER_IN) {
        const int from = r->in[0], to = r->out[0];
        const size_t bytes = ck_plan_tensor_bytes(pl, p->g, from);
        /* a graph tensor on the host is a streamed one, in the weights' pinned
         * memory: brought in, or an update's copy written back */
        const int host_id = r->xfer == CK_XFER_OUT ? to : from;
        unsigned char *on_host = (host_id < p->g->nt ? p->weights : p->host) + pl->off[host_id];
        unsigned char *src = r->xfer == CK_XFER_OUT ? p->arena + pl->off[from] : on_host;
        unsigned char *dst = r->xfer == CK_XFER_OUT ? on_host : p->arena + pl->off[to];
        rc = be->xfer_start(dst, src, bytes, (int)r->slot);
    } else {
        rc = be->xfer_wait((int)r->slot);
    }
    if (!rc) return 0;
    const ck_node *n = &p->g->n[r->node];
    const int w = pl->origin[r->in[0]];
    if (w < p->g->nt && ck_plan_is_persistent(p->g->t[w].kind)) {
        const int out = r->xfer == CK_XFER_OUT || r->xfer == CK_XFER_OUT_WAIT;
        snprintf(err, errlen, "%s: the copy %s of streamed %s '%s' %s %s in %s on %s: %s", n->where, out ? "out" : "in",
                 p->g->t[w].kind == CK_KIND_OPTSTATE ? "optimizer state" : "weight",
                 p->g->t[w].name ? p->g->t[w].name : "?", out ? "after" : "for", ck_op_name(n->op), scope_of(n),
                 be->name, be->error());
        be->clear_error();
        return -1;
    }
    snprintf(err, errlen, "%s: the %s of %s's output in %s on %s: %s", n->where,
             r->xfer == CK_XFER_OUT || r->xfer == CK_XFER_OUT_WAIT ? "copy to host memory" : "copy back",
             ck_op_name(n->op), scope_of(n), be->name, be->error());
    be->clear_error();
    return -1;
}

/* every copy the list queued is done before what follows: a range ends joined */
static int join_copies(const ck_exec_env *p, const ck_plan *pl, char *err, size_t errlen)
{
    if (!pl->nslots || !p->be->xfer_join() ) return 0;
    snprintf(err, errlen, "%s device: %s", p->be->name, p->be->error());
    p->be->clear_error();
    return -1;
}

static int run_entry(const ck_exec_env *p, const ck_plan *pl, int i, ck_kctx *ctx, char *err, size_t errlen)
{
    const ck_op_ref *r = &pl->ops[i];
    const ck_node *n = &p->g->n[r->node];
    if (r->xfer) {
        if (p->interrupt && *p->interrupt && !p->fused_backward && r->phase != CK_PHASE_OPTIMIZER) {
            snprintf(err, errlen, "interrupted");
            return -1;
        }
        return run_xfer(p, pl, i, err, errlen);
    }
    /* an interrupt stops a step before its updates, never among them, so a
     * step is either applied whole or not at all (fused updates run inside
     * backward: there, only forward entries stop) */
    if (p->interrupt && *p->interrupt &&
        (p->fused_backward ? r->phase == CK_PHASE_FORWARD : r->phase != CK_PHASE_OPTIMIZER)) {
        snprintf(err, errlen, "interrupted");
        return -1;
    }
    if (n->op == CK_OP_ALLREDUCE_START || n->op == CK_OP_ALLREDUCE_WAIT || n->op == CK_OP_BROADCAST)
        return run_comm(p, n, err, errlen);
    const ck_backend *be = p->be;
    ck_view in[CK_MAX_IN], out[CK_MAX_OUT] = {{0}};
    const ck_dtype kt = r->kt; /* the plan's choice */
    ck_kernel_fn k = kt != CK_F32 ? ck_backend_kernels16(be, kt)[n->op] : be->kernels[n->op];
    if (!k) {
        snprintf(err, errlen, "%s: %s in %s: no %s kernel", n->where, ck_op_name(n->op), scope_of(n), be->name);
        return -1;
    }
    for (int j = 0; j < r->nin; j++) view_of(p, pl, r->in[j], &in[j]);
    for (int j = 0; j < r->nout; j++)
        if (r->out[j] >= 0) view_of(p, pl, r->out[j], &out[j]);
    /* operands not in the kernel's type (16-bit ones of an fp32 kernel, fp32
     * ones of a 16-bit product): copies in its type at the workspace's start */
    unsigned char *ws = pl->ws_off[i] >= 0 ? p->arena + pl->ws_off[i] : NULL;
    size_t conv = ck_plan_entry_convert_bytes(pl, p->g, i, kt);
    void *stored[CK_MAX_OUT] = {0};
    if (conv) {
        unsigned char *slot = ws;
        for (int j = 0; j < r->nin + r->nout; j++) {
            int t = j < r->nin ? r->in[j] : r->out[j - r->nin];
            if (t < 0) continue;
            const ck_dtype dt = p->g->t[pl->origin[t]].dtype;
            const ck_dtype ct = ck_plan_entry_copy_type(n->op, j < r->nin ? j : -1, dt, kt);
            if (ct == dt) continue;
            ck_view *v = j < r->nin ? &in[j] : &out[j - r->nin];
            int64_t ne = ck_view_numel(v);
            if (j < r->nin) {
                if (be->convert(slot, ct, v->data, dt, ne)) return entry_failed(p, pl, i, err, errlen);
            } else {
                stored[j - r->nin] = v->data;
            }
            v->data = (float *)slot;
            slot += (ne * (int64_t)ck_dtype_bytes(ct) + 63) / 64 * 64;
        }
        ws += conv;
    }
    ctx->ws = pl->ws_bytes[i] > conv ? ws : NULL;
    ctx->ws_bytes = pl->ws_bytes[i] - conv;
    if (!p->profile) {
        k(ctx, &n->p, out, r->nout, in, r->nin);
    } else {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        k(ctx, &n->p, out, r->nout, in, r->nin);
        p->be->sync(); /* a queued op has taken its time only when it is done */
        clock_gettime(CLOCK_MONOTONIC, &t1);
        p->profile[n->op] += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    for (int j = 0; j < r->nout; j++)
        if (stored[j] && be->convert(stored[j], p->g->t[pl->origin[r->out[j]]].dtype, out[j].data,
                                     ck_plan_entry_copy_type(n->op, -1, p->g->t[pl->origin[r->out[j]]].dtype, kt),
                                     ck_view_numel(&out[j])))
            return entry_failed(p, pl, i, err, errlen);
    /* kernels record failures instead of returning them (the CPU's never fail) */
    if (be->error()[0]) return entry_failed(p, pl, i, err, errlen);
    return 0;
}

void ck_exec_graphs_clear(const ck_backend *be, ck_exec_graphs *gs)
{
    if (gs->n) be->enter();
    for (int i = 0; i < gs->n; i++)
        if (gs->g[i].graph) be->graph_free(gs->g[i].graph);
    free(gs->g);
    gs->g = NULL;
    gs->n = gs->cap = 0;
}

/* Whether entries [from, to) can run as one captured graph. Not when the
 * host acts between two ops: profiling (a sync after each op), collectives
 * (progressed by the host, or host calls), a kernel that reads a result back
 * (the backend's capturable), a pending interrupt (checked between ops). */
static int capturable(const ck_exec_env *p, const ck_plan *pl, int from, int to)
{
    if (p->profile || p->nreqs || p->replay || (p->interrupt && *p->interrupt)) return 0;
    for (int i = from; i < to; i++) {
        if (pl->ops[i].xfer) continue; /* copies and waits on streams: captured with the kernels */
        const enum ck_op op = p->g->n[pl->ops[i].node].op;
        if (op == CK_OP_ALLREDUCE_START || op == CK_OP_ALLREDUCE_WAIT || op == CK_OP_BROADCAST ||
            !p->be->capturable(op))
            return 0;
    }
    return 1;
}

static ck_exec_graph *graph_of(ck_exec_graphs *gs, const ck_exec_env *p, const ck_plan *pl, int from, int to)
{
    for (int i = 0; i < gs->n; i++) {
        ck_exec_graph *x = &gs->g[i];
        if (x->pl == pl && x->ops == pl->ops && x->n == pl->n && x->from == from && x->to == to && x->arena == p->arena)
            return x;
    }
    if (ck_grow(&gs->g, &gs->cap, (size_t)gs->n + 1, sizeof *gs->g, 8)) return NULL;
    ck_exec_graph *x = &gs->g[gs->n++];
    *x = (ck_exec_graph){.pl = pl, .ops = pl->ops, .n = pl->n, .from = from, .to = to, .arena = p->arena, .graph = NULL};
    return x;
}

/* Entries [from, to) as one graph launch, capturing them at the first run.
 * 0: done; 1: not captured (run them op by op); -1: failed, with err. A
 * capture that fails (a kernel doing what capture forbids) is not an error:
 * nothing it recorded ran, and the range runs op by op from then on. */
static int run_graph(const ck_exec_env *p, const ck_plan *pl, int from, int to, ck_kctx *ctx, char *err, size_t errlen)
{
    ck_exec_graphs *gs = p->graphs;
    const ck_backend *be = p->be;
    const int fresh = gs->n;
    ck_exec_graph *x = graph_of(gs, p, pl, from, to);
    if (!x) return 1;
    if (gs->n > fresh) {
        if (be->capture_begin()) {
            be->clear_error();
            return 1;
        }
        int bad = 0;
        for (int i = from; i < to && !bad; i++) bad = run_entry(p, pl, i, ctx, err, errlen) != 0;
        if (!bad) bad = join_copies(p, pl, err, errlen) != 0; /* the copy branch joins the graph again */
        x->graph = be->capture_end();
        be->clear_error();
        if (x->graph && bad) { /* a part of the range: never launched */
            be->graph_free(x->graph);
            x->graph = NULL;
        }
        if (!x->graph) { /* what failed in the capture fails again op by op, if it fails at all */
            if (errlen) err[0] = 0;
            /* stopped, not refused, or refused for work the op-by-op run
             * does once (an algorithm search): a later run captures it */
            if ((p->interrupt && *p->interrupt) || (be->capture_later && be->capture_later())) gs->n--;
            return 1;
        }
        gs->captures++;
    }
    if (!x->graph) return 1;
    if (be->graph_launch(x->graph)) {
        const ck_node *n = &p->g->n[pl->ops[from].node];
        snprintf(err, errlen, "%s: the captured entries %d to %d (from %s in %s) on %s: %s", n->where, from, to - 1,
                 ck_op_name(n->op), scope_of(n), be->name, be->error());
        be->clear_error();
        return -1;
    }
    gs->launches++;
    return 0;
}

int ck_exec_range(const ck_exec_env *p, const ck_plan *pl, int from, int to, char *err, size_t errlen)
{
    ck_kctx ctx = {.seed = p->seed, .step = p->step, .lr = p->lr, .update = p->update, .eval = p->eval};
    p->be->enter();
    if (from >= to) return 0;
    /* the per-step values first, outside any capture: kernels read them from
     * the device, so a graph replays with this step's */
    if (p->be->set_step && p->be->set_step(&ctx)) {
        snprintf(err, errlen, "%s device: %s", p->be->name, p->be->error());
        p->be->clear_error();
        return -1;
    }
    if (p->graphs && p->be->capture_begin) {
        const int rc = capturable(p, pl, from, to) ? run_graph(p, pl, from, to, &ctx, err, errlen) : 1;
        if (rc <= 0) return rc;
        p->graphs->op_by_op++;
    }
    for (int i = from; i < to; i++) {
        if (run_entry(p, pl, i, &ctx, err, errlen)) {
            join_copies(p, pl, err[0] ? NULL : err, err[0] ? 0 : errlen); /* no copy outlives the range */
            return -1;
        }
        /* sums in flight move on between ops (MPI progresses inside its calls) */
        for (int b = 0; b < p->nreqs; b++)
            if (p->reqs[b].active && !p->reqs[b].done) ck_dist_test(&p->reqs[b]);
    }
    return join_copies(p, pl, err, errlen);
}

int ck_exec_sync(const ck_backend *be, char *err, size_t errlen)
{
    be->enter();
    if (!be->sync()) return 0;
    snprintf(err, errlen, "%s device: %s", be->name, be->error());
    be->clear_error();
    return -1;
}

int ck_exec_tensor_finite(const ck_exec_env *p, const ck_plan *pl, int t, int *finite, char *err, size_t errlen)
{
    const float *x = (const float *)(p->arena + pl->off[t]);
    p->be->enter();
    const ck_dtype dt = p->g->t[pl->origin[t]].dtype;
    if (dt == CK_U8) { /* bytes are always finite */
        *finite = 1;
        return 0;
    }
    if (dt != CK_F32) {
        /* only a non-finite step's second pass checks these: on the host */
        int64_t n = ck_shape_numel(&p->g->t[pl->origin[t]].shape);
        const size_t bytes = ck_dtype_bytes(dt) * (size_t)n;
        unsigned char *h = malloc(bytes ? bytes : 1);
        if (!h) {
            snprintf(err, errlen, "out of host memory");
            return -1;
        }
        int rc = p->be->download(h, x, bytes);
        *finite = 1;
        for (int64_t k = 0; k < n && *finite && !rc; k++)
            *finite = dt == CK_F8E4M3 ? (h[k] & 0x7f) != 0x7f
                      : dt == CK_F16  ? ck_f16_finite(((const uint16_t *)h)[k])
                                      : ck_bf16_finite(((const uint16_t *)h)[k]);
        free(h);
        if (!rc) return 0;
        snprintf(err, errlen, "checking values on the %s device: %s", p->be->name, p->be->error());
        p->be->clear_error();
        return -1;
    }
    if (!p->be->all_finite(x, ck_shape_numel(&p->g->t[pl->origin[t]].shape), finite)) return 0;
    snprintf(err, errlen, "checking values on the %s device: %s", p->be->name, p->be->error());
    p->be->clear_error();
    return -1;
}

int ck_exec_find_nonfinite(const ck_exec_env *p, const ck_plan *pl, int to, int *entry, int *input, char *err,
                           size_t errlen)
{
    ck_kctx ctx = {.seed = p->seed, .step = p->step, .lr = p->lr, .update = p->update, .eval = 0};
    *entry = *input = -1;
    p->be->enter();
    for (int i = 0; i < to; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (run_entry(p, pl, i, &ctx, err, errlen)) return -1;
        if (r->xfer) continue; /* a copy of a value checked when it was made */
        int fin = 1;
        for (int j = 0; j < r->nout && fin; j++)
            if (r->out[j] >= 0 && ck_exec_tensor_finite(p, pl, r->out[j], &fin, err, errlen)) return -1;
        if (fin) continue;
        *entry = i;
        for (int j = 0; j < r->nin; j++) {
            int t = pl->origin[r->in[j]];
            if (p->poff[t] < 0) continue;
            if (ck_exec_tensor_finite(p, pl, r->in[j], &fin, err, errlen)) return -1;
            if (!fin) {
                *input = t;
                break;
            }
        }
        return join_copies(p, pl, err, errlen);
    }
    return join_copies(p, pl, err, errlen);
}

/* a NaN with a payload no kernel writes */
#define SENTINEL 0x7fa5a5a5u

int ck_exec_arena_fill_sentinel(const ck_exec_env *p, char *err, size_t errlen)
{
    p->be->enter();
    if (!p->be->fill_u32(p->arena + p->persistent, SENTINEL, (p->arena_bytes - p->persistent) / 4)) return 0;
    snprintf(err, errlen, "%s device: %s", p->be->name, p->be->error());
    p->be->clear_error();
    return -1;
}

int ck_exec_arena_high_water(const ck_exec_env *p, size_t *high_water, char *err, size_t errlen)
{
    size_t top = 0;
    p->be->enter();
    if (!p->be->high_water(p->arena, p->persistent / 4, p->arena_bytes / 4, SENTINEL, &top)) {
        *high_water = top * 4;
        return 0;
    }
    snprintf(err, errlen, "%s device: %s", p->be->name, p->be->error());
    p->be->clear_error();
    return -1;
}
