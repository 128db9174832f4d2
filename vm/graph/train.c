/* The training step as graph transforms (graph/train.h). */
#include "graph/train.h"

#include "../../ops/adam8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One optimizer-phase node with one output: its tensor, or -1 (g->err set). */
static int opt_node(ck_graph *g, enum ck_op op, const int *in, int nin, const ck_op_params *p, const char *where)
{
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    const int id = ck_graph_node(g, op, in, nin, p, outs, NULL, ids, where);
    if (id < 0) return -1;
    g->n[id].phase = CK_PHASE_OPTIMIZER;
    return ids[0];
}

/* torch.nn.utils.clip_grad_norm_(params, max_norm): the factor every gradient
 * is multiplied by, min(1, max_norm / (||all gradients|| + 1e-6)), from the
 * gradients src[t]'s summed squares in parameter order: a chain of SUMSQ
 * nodes, each adding the squares of a few gradients to the running total of
 * the one before. The tensor, -2 when nothing trains, or -1 (g->err set). */
static int clip_factor(ck_graph *g, int nt, const int *src, float max_norm, int inv)
{
    int total = -2, in[CK_MAX_IN], k = 0;
    const char *where = NULL;
    ck_graph_set_scope(g, "clip_grad_norm");
    for (int t = 0; t <= nt && total != -1; t++) {
        const int last = t == nt;
        if (!last && g->t[t].kind != CK_KIND_PARAM) continue;
        if (!last) {
            if (k == 0 && total >= 0) in[k++] = total;
            in[k++] = src[t];
            where = g->t[t].where;
        }
        if (k == CK_MAX_IN || (last && k > 0)) {
            ck_op_params sp = {0};
            sp.i[0] = total >= 0; /* in[0] is the running total */
            total = opt_node(g, CK_OP_SUMSQ, in, k, &sp, where);
            k = 0;
        }
    }
    if (total < 0) return total;
    static const ck_op_params none;
    for (int k = 0; k < 2 && inv >= 0 && total >= 0; k++) { /* the unscaled gradients' squares */
        const int by_inv[2] = {total, inv};
        total = opt_node(g, CK_OP_MUL, by_inv, 2, &none, where);
    }
    if (total < 0) return -1;
    ck_op_params cp = {0};
    cp.f[0] = max_norm;
    int factor = opt_node(g, CK_OP_CLIP_FACTOR, &total, 1, &cp, where);
    if (factor >= 0 && inv >= 0) {
        const int times_inv[2] = {factor, inv};
        factor = opt_node(g, CK_OP_MUL, times_inv, 2, &none, where);
    }
    return factor;
}

/* Data parallel: the gradient sums (ids->accums, one after another in the
 * persistent region) in buckets of at most o->bucket_bytes, the last
 * parameters first (DDP's order: theirs are complete first), each summed over
 * the ranks by an ALLREDUCE_START entry, all started before the first
 * ALLREDUCE_WAIT; in place, in the optimizer's tail after the accumulation
 * entries (so once per update). */
static int add_buckets(ck_graph *g, const ck_train_opts *o, ck_train_ids *ids)
{
    const size_t cap = o->bucket_bytes ? o->bucket_bytes : (size_t)25 << 20;
    int *lo = malloc(sizeof(int) * (size_t)(ids->naccum ? ids->naccum : 1)), *hi = malloc(sizeof(int) * (size_t)(ids->naccum ? ids->naccum : 1));
    if (!lo || !hi) {
        free(lo);
        free(hi);
        snprintf(g->err, sizeof g->err, "out of memory");
        return -1;
    }
    int nb = 0;
    size_t in_bucket = 0;
    for (int k = ids->naccum - 1; k >= 0; k--) {
        const size_t b = (ck_tensor_bytes(&g->t[ids->accums[k]]) + 63) / 64 * 64;
        if (nb == 0 || (in_bucket > 0 && in_bucket + b > cap)) {
            hi[nb] = k;
            lo[nb++] = k;
            in_bucket = 0;
        }
        lo[nb - 1] = k;
        in_bucket += b;
    }
    int rc = 0;
    ck_graph_set_scope(g, "data_parallel");
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        for (int b = 0; b < nb; b++) {
            ck_op_params prm = {0};
            prm.i[0] = ids->accums[lo[b]];
            prm.i[1] = ids->accums[hi[b]];
            prm.i[2] = b;
            ck_shape outs[CK_MAX_OUT];
            const int in[1] = {ids->accums[hi[b]]}, want[CK_MAX_OUT] = {0, 0, 0};
            for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
            const int id = ck_graph_node(g, pass ? CK_OP_ALLREDUCE_WAIT : CK_OP_ALLREDUCE_START, in, 1, &prm, outs, want,
                                         NULL, g->t[ids->accums[hi[b]]].where);
            if (id < 0) {
                rc = -1;
                break;
            }
            g->n[id].phase = CK_PHASE_OPTIMIZER;
            g->n[id].out[0] = ids->accums[hi[b]]; /* in place */
        }
    }
    ck_graph_set_scope(g, "");
    free(lo);
    free(hi);
    ids->nbuckets = nb;
    /* one reduction a step: the sums start as backward completes them */
    g->comm_overlap = o->accumulate <= 1;
    return rc;
}

/* With accumulate = N > 1: per parameter a persistent sum "grad_sum.<name>"
 * and an in-place sum += grad node, all made before any other optimizer node
 * (the list keeps graph order, so they lead the optimizer's tail: the steps
 * between updates run only them); src[t] becomes the mean, sum / N. */
static int add_accumulation(ck_graph *g, const ck_train_opts *o, ck_train_ids *ids, int nt, int *src)
{
    static const ck_op_params none;
    ids->accums = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
    if (!ids->accums) {
        snprintf(g->err, sizeof g->err, "out of memory");
        return -1;
    }
    ids->accum_nodes[0] = g->nn;
    for (int t = 0; t < nt; t++) {
        if (g->t[t].kind != CK_KIND_PARAM) continue;
        char name[1024];
        snprintf(name, sizeof name, "grad_sum.%s", g->t[t].name);
        ck_shape shape = g->t[t].shape; /* ck_graph_leaf may move g->t */
        ck_graph_set_scope(g, g->t[t].scope);
        const int acc = ck_graph_leaf(g, CK_KIND_OPTSTATE, name, &shape, g->t[t].where);
        if (acc < 0) return -1;
        g->t[acc].init = CK_INIT_ZEROS;
        ck_shape outs[CK_MAX_OUT];
        const int in[2] = {acc, g->t[t].grad}, want[CK_MAX_OUT] = {0, 0, 0};
        for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
        const int id = ck_graph_node(g, CK_OP_ADD, in, 2, &none, outs, want, NULL, g->t[t].where);
        if (id < 0) return -1;
        g->n[id].phase = CK_PHASE_OPTIMIZER;
        g->n[id].out[0] = acc; /* in place */
        ids->accums[ids->naccum++] = acc;
    }
    ids->accum_nodes[1] = g->nn;
    const int world = o->world > 1 ? o->world : 1;
    if (o->data_parallel && add_buckets(g, o, ids)) return -1;
    ck_op_params mean = {0};
    mean.f[0] = 1.0f / ((float)(o->accumulate > 1 ? o->accumulate : 1) * (float)world);
    for (int k = 0, t = 0; t < nt; t++) {
        if (g->t[t].kind != CK_KIND_PARAM) continue;
        ck_graph_set_scope(g, g->t[t].scope);
        if ((src[t] = opt_node(g, CK_OP_SCALE, &ids->accums[k++], 1, &mean, g->t[t].where)) < 0) return -1;
    }
    return 0;
}

/* Loss scaling's tensors: the scale (the loss's shape: backward starts from
 * it), the updates applied since it changed (optimizer state, saved with the
 * rest) and 1/scale (an input each step writes). */
static int add_loss_scale(ck_graph *g, const ck_train_opts *o, ck_train_ids *ids)
{
    const ck_shape one = {0, {0}};
    ck_shape loss_shape = g->t[o->loss].shape;
    const char *where = g->t[o->loss].where;
    ck_graph_set_scope(g, "loss_scale");
    ids->scale_t = ck_graph_leaf(g, CK_KIND_OPTSTATE, "loss_scale", &loss_shape, where);
    ids->tracker_t = ids->scale_t < 0 ? -1 : ck_graph_leaf(g, CK_KIND_OPTSTATE, "loss_scale.growth_tracker", &one, where);
    ids->inv_t = ids->tracker_t < 0 ? -1 : ck_graph_leaf(g, CK_KIND_INPUT, "loss_scale.inverse", &one, where);
    ck_graph_set_scope(g, "");
    if (ids->inv_t < 0) return -1;
    /* constant starts: uniform on [v, v] is v */
    g->t[ids->scale_t].init = g->t[ids->inv_t].init = CK_INIT_UNIFORM;
    g->t[ids->scale_t].init_a = g->t[ids->scale_t].init_b = o->scaler.init;
    g->t[ids->inv_t].init_a = g->t[ids->inv_t].init_b = (float)(1.0 / (double)o->scaler.init);
    g->t[ids->tracker_t].init = CK_INIT_ZEROS;
    return 0;
}

int ck_train_state(ck_optim optim, const ck_shape *ps, const char *state[2], ck_shape shape[2], ck_dtype dtype[2],
                     enum ck_op *op)
{
    const int64_t numel = ck_shape_numel(ps), nb = (numel + CK_ADAM8_BLOCK - 1) / CK_ADAM8_BLOCK;
    state[0] = "exp_avg", state[1] = "exp_avg_sq";
    shape[0] = shape[1] = *ps;
    dtype[0] = dtype[1] = CK_F32;
    *op = CK_OP_ADAMW_STEP;
    if (optim == CK_OPTIM_SGD) return *op = CK_OP_SGD_STEP, 0;
    if (optim == CK_OPTIM_LION) return *op = CK_OP_LION_STEP, 1;
    if (optim == CK_OPTIM_ADAMW8) {
        *op = CK_OP_ADAMW8_STEP;
        state[0] = "adam8_code", state[1] = "adam8_scale";
        shape[0] = (ck_shape){1, {2 * numel}}, shape[1] = (ck_shape){1, {2 * nb}};
        dtype[0] = CK_U8;
    }
    return 2;
}

/* The optimizer's nodes: accumulation (when asked), the clip factor (when
 * asked), then per parameter its update, reading src[t]: the gradient, its
 * mean over the accumulated steps, either times the clip factor. With loss
 * scaling, times 1/scale too: the clip factor is taken from the unscaled
 * norm (the scaled squares times 1/scale twice) and multiplied by 1/scale,
 * so one product per gradient does both, as with clipping alone. */
static int add_optimizer(ck_graph *g, const ck_train_opts *o, ck_train_ids *ids)
{
    const int nt = g->nt;
    int factor = -2, rc = -1;
    int *src = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
    if (!src) {
        snprintf(g->err, sizeof g->err, "out of memory");
        return -1;
    }
    for (int t = 0; t < nt; t++) src[t] = g->t[t].grad;
    /* ZeRO-1: each parameter's owner, the rank that updates it and alone holds its state */
    int *owner = NULL;
    if (o->shard && o->world > 1) {
        owner = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
        size_t *held = calloc((size_t)o->world, sizeof(size_t));
        int *order = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
        if (!owner || !held || !order) {
            free(owner), free(held), free(order);
            owner = NULL;
            snprintf(g->err, sizeof g->err, "out of memory");
            goto out;
        }
        int np = 0;
        for (int t = 0; t < nt; t++) {
            owner[t] = -1;
            if (g->t[t].kind == CK_KIND_PARAM) order[np++] = t;
        }
        /* largest first (ties: graph order), each to the rank holding the fewest bytes (ties: the lowest) */
        for (int i = 1; i < np; i++)
            for (int j = i; j > 0 && ck_tensor_bytes(&g->t[order[j]]) > ck_tensor_bytes(&g->t[order[j - 1]]); j--) {
                const int x = order[j];
                order[j] = order[j - 1];
                order[j - 1] = x;
            }
        for (int i = 0; i < np; i++) {
            int best = 0;
            for (int r = 1; r < o->world; r++)
                if (held[r] < held[best]) best = r;
            owner[order[i]] = best;
            held[best] += ck_tensor_bytes(&g->t[order[i]]);
        }
        free(held);
        free(order);
    }
    if ((o->accumulate > 1 || o->data_parallel) && add_accumulation(g, o, ids, nt, src)) goto out;
    if (o->max_grad_norm > 0 && (factor = clip_factor(g, nt, src, o->max_grad_norm, ids->inv_t)) == -1) goto out;
    if (factor == -2 && ids->inv_t >= 0) factor = ids->inv_t;
    for (int t = 0; t < nt; t++) {
        if (g->t[t].kind != CK_KIND_PARAM) continue;
        if (owner && owner[t] != o->rank) continue; /* another rank updates it */
        ck_op_params p = {0};
        p.f[CK_OPT_LR_SCALE] = g->t[t].lr_scale;
        ck_shape outs[CK_MAX_OUT];
        int want[CK_MAX_OUT] = {0, 0, 0}, in[4] = {t, src[t], -1, -1}, nin = 2;
        ck_graph_set_scope(g, g->t[t].scope);
        if (factor >= 0) {
            static const ck_op_params none;
            const int pair[2] = {src[t], factor};
            if ((in[1] = opt_node(g, CK_OP_MUL, pair, 2, &none, g->t[t].where)) < 0) goto out;
        }
        const char *state[2];
        ck_shape shape[2]; /* ck_graph_leaf may move g->t: the shapes are copies */
        ck_dtype dtype[2];
        enum ck_op op;
        const int ns = ck_train_state(o->optim, &g->t[t].shape, state, shape, dtype, &op);
        for (int k = 0; k < ns; k++) {
            char name[1024];
            snprintf(name, sizeof name, "%s.%s", state[k], g->t[t].name);
            in[2 + k] = ck_graph_leaf(g, CK_KIND_OPTSTATE, name, &shape[k], g->t[t].where);
            if (in[2 + k] < 0) goto out;
            g->t[in[2 + k]].init = CK_INIT_ZEROS;
            g->t[in[2 + k]].dtype = dtype[k];
        }
        nin = 2 + ns;
        if (ns) {
            p.f[0] = o->beta1;
            p.f[1] = o->beta2;
            p.f[2] = op == CK_OP_LION_STEP ? o->weight_decay : o->eps;
            p.f[3] = o->weight_decay;
        } else {
            p.f[0] = o->weight_decay;
        }
        for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
        int id = ck_graph_node(g, op, in, nin, &p, outs, want, NULL, g->t[t].where);
        if (id < 0) goto out;
        /* updates happen in place: the outputs are the parameter and its state */
        ck_node *n = &g->n[id];
        n->phase = CK_PHASE_OPTIMIZER;
        n->out[0] = t;
        for (int k = 0; k < ns; k++) n->out[1 + k] = in[2 + k];
    }
    /* ZeRO-1: every parameter from its owner to every rank, after the updates */
    for (int t = 0; owner && t < nt; t++) {
        if (g->t[t].kind != CK_KIND_PARAM) continue;
        ck_op_params prm = {0};
        prm.i[0] = owner[t];
        ck_shape outs[CK_MAX_OUT];
        const int in[1] = {t}, want[CK_MAX_OUT] = {0, 0, 0};
        for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
        ck_graph_set_scope(g, "data_parallel");
        const int id = ck_graph_node(g, CK_OP_BROADCAST, in, 1, &prm, outs, want, NULL, g->t[t].where);
        if (id < 0) goto out;
        g->n[id].phase = CK_PHASE_OPTIMIZER;
        g->n[id].out[0] = t; /* in place */
    }
    rc = 0;
out:
    ck_graph_set_scope(g, "");
    if (rc == 0 && owner) {
        ids->owner = owner, ids->nowner = nt; /* a saved state gathers each state from its owner */
        owner = NULL;
    }
    free(owner);
    free(src);
    return rc;
}

int ck_train_has_params(const ck_graph *g)
{
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].kind == CK_KIND_PARAM) return 1;
    return 0;
}

int ck_train_graph(ck_graph *g, const ck_train_opts *o, ck_train_ids *ids, char *err, size_t errlen)
{
    *ids = (ck_train_ids){.scale_t = -1, .tracker_t = -1, .inv_t = -1};
    const int trains = ck_train_has_params(g);
    if (o->loss >= 0 && trains && o->scaler.on) {
        if (o->fused_backward) {
            snprintf(err, errlen, "loss scaling checks every gradient for an overflow before any update, so it cannot "
                     "go with fused_backward (each parameter updated inside backward)");
            return -1;
        }
        if (o->optim == CK_OPTIM_NONE) {
            snprintf(err, errlen, "loss scaling skips the updates whose gradients overflow: it needs an optimizer "
                     "(optimizer = \"none\" here)");
            return -1;
        }
        if (add_loss_scale(g, o, ids)) goto failed;
    }
    /* Data parallel: a dropout draws for each row of its input's first
     * dimension (the sample) what one process draws for that sample's row of
     * the global batch, rank + b * world, as torch's DistributedSampler deals
     * the rows; its gradient (autodiff copies the parameters) the same. */
    for (int i = 0; o->world > 1 && i < g->nn; i++)
        if (g->n[i].op == CK_OP_DROPOUT) {
            g->n[i].p.i[1] = o->world;
            g->n[i].p.i[2] = o->rank;
        }
    if (o->loss < 0 || !trains) return 0;
    if (ck_autodiff(g, o->loss, ids->scale_t)) goto failed;
    if (o->optim != CK_OPTIM_NONE && add_optimizer(g, o, ids)) goto failed;
    g->fused_updates = o->fused_backward;
    return 0;
failed:
    snprintf(err, errlen, "%s", g->err);
    return -1;
}
