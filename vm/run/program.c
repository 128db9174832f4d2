/* Compiling a graph into a program: differentiate, append the optimizer, cut
 * the op lists, plan their memory, allocate the one arena, initialize the
 * parameters. The op lists are the seam the recompute scheduler works on. */
#include "run/program.h"
#include "plan/offload.h"

#include "dist/dist.h"
#include "util/hash.h"
#include "util/text.h"

#include "../../ops/adam8.h"
#include "../../ops/bf16.h"
#include "../../ops/fp8.h"
#include "../../ops/fp16.h"
#include "../../ops/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The basis of the parameters' init streams: FNV-1a of the name from this
 * value (FNV's offset basis less its last digit), kept so that a seed gives
 * the weights it always gave. */
#define INIT_NAME_BASIS 1469598103934665603ULL

static uint64_t name_hash(const char *s) { return ck_fnv1a(INIT_NAME_BASIS, s, strlen(s)); }

/* Parameters start from the seed and their name, so adding a layer elsewhere
 * does not change how the others start. */
static void init_tensor(const ck_tensor *t, float *x, uint64_t seed)
{
    int64_t n = ck_shape_numel(&t->shape);
    uint64_t stream = ck_rng_key(seed, 0, name_hash(t->name ? t->name : ""));
    switch (t->init) {
    case CK_INIT_ZEROS: memset(x, 0, sizeof(float) * (size_t)n); break;
    /* counter-based: element i's value depends on i alone, so threads split the work */
    case CK_INIT_ONES:
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
        break;
    case CK_INIT_NORMAL:
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) x[i] = t->init_a + t->init_b * ck_rng_normal(stream, (uint64_t)i);
        break;
    case CK_INIT_UNIFORM:
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++)
            x[i] = t->init_a + (t->init_b - t->init_a) * ck_rng_uniform(stream, (uint64_t)i);
        break;
    }
}

/* Data parallel: compiled for several ranks, or for one with CK_COMM_FORCE=1
 * in the environment, which runs a world of one through the same buckets and
 * collectives (the collective path checked on a single device) */
static int data_parallel(const ck_compile_opts *o)
{
    const char *force = getenv("CK_COMM_FORCE");
    return o->world > 1 || (force && !strcmp(force, "1"));
}

int ck_program_param_state(const ck_program *p, int t, char names[2][CK_STATE_NAME_MAX], ck_shape shape[2],
                           ck_dtype dtype[2], int *owner)
{
    const ck_graph *g = p->g;
    *owner = -1;
    if (t < 0 || t >= g->nt || g->t[t].kind != CK_KIND_PARAM || !g->t[t].name || !p->opt.optim) return 0;
    if (p->owner && t < p->nowner) *owner = p->owner[t];
    const char *state[2];
    enum ck_op op;
    const int ns = ck_train_state(p->opt.optim, &g->t[t].shape, state, shape, dtype, &op);
    for (int k = 0; k < ns; k++) snprintf(names[k], CK_STATE_NAME_MAX, "%s.%s", state[k], g->t[t].name);
    return ns;
}

/* the host bytes p holds besides its graph: op lists, statistics, per-tensor arrays */
static size_t own_bytes(const ck_program *p)
{
    const size_t nt = (size_t)(p->g->nt ? p->g->nt : 1);
    size_t b = ck_graph_malloc_chunk(sizeof *p) + ck_plan_host_bytes(&p->train) + ck_plan_host_bytes(&p->eval) +
               (p->retain ? ck_graph_malloc_chunk(sizeof *p->retain * nt) : 0) +
               (p->poff ? ck_graph_malloc_chunk(sizeof *p->poff * nt) : 0) +
               (p->streamed ? ck_graph_malloc_chunk(nt) : 0);
    for (int k = 1; k <= CK_STATS_ALL; k++) b += ck_plan_host_bytes(&p->logplan[k]);
    if (p->st.nstats) b += ck_graph_malloc_chunk(sizeof *p->st.stats * (size_t)p->st.nstats);
    for (int k = 0; k < p->st.nblocks; k++) b += ck_graph_malloc_chunk(strlen(p->st.blocks[k]) + 1);
    if (p->accums) b += ck_graph_malloc_chunk(sizeof *p->accums * (size_t)p->naccum);
    return b;
}

/* charges n more bytes of p's own (a plan about to be built, or one built):
 * 0, or -1 with err */
static int take_own(ck_program *p, size_t n, const char *what, char *err, size_t errlen)
{
    return ck_mem_hold(p->budget, &p->charged_own, p->charged_own + n, what, err, errlen);
}

/* brings the charge for p's own bytes to what they are now (after a plan was
 * built in place of its estimate): 0, or -1 with err when they grew past the
 * limit */
static int settle_own(ck_program *p, const char *what, char *err, size_t errlen)
{
    return ck_mem_hold(p->budget, &p->charged_own, own_bytes(p), what, err, errlen);
}

/* p joins share's group, or starts its own (share NULL) */
static int join_group(ck_program *p, const ck_program *share, char *err, size_t errlen)
{
    if (share) {
        if (share->be != p->be)
            return ck_errf(err, errlen, "a program shares weights only with a program on the same device (%s, not %s)",
                         p->be->name, share->be->name);
        if ((share->grp->arena != NULL) != !p->opt.plan_only)
            return ck_errf(err, errlen, "a plan-only program shares weights only with a plan-only one, and a runnable "
                         "one with a runnable one");
        p->grp = share->grp;
        p->grp->refs++;
        return 0;
    }
    p->grp = calloc(1, sizeof *p->grp);
    if (!p->grp) return ck_errf(err, errlen, "out of memory");
    p->grp->refs = 1;
    p->grp->be = p->be;
    return 0;
}

/* p is the group's actor: it runs, or writes above the shared region, where
 * the other members' own tensors and activations lie */
static void become_actor(ck_program *p)
{
    if (p->grp->actor == p) return;
    p->grp->actor = p;
    p->grp->serial++;
}

/* whether t is a streamed weight or optimizer state: its poff is in grp->weights */
static int is_streamed(const ck_program *p, int t) { return p->streamed && p->streamed[t]; }

/* whether weight name is one of the blocks o streams: the name of one, or
 * one's name and a dot before the rest */
static int stream_match(const ck_compile_opts *o, const char *name)
{
    for (int k = 0; name && k < o->nstream; k++) {
        const size_t n = strlen(o->stream[k]);
        if (n && !strncmp(name, o->stream[k], n) && (name[n] == 0 || name[n] == '.')) return 1;
    }
    return 0;
}

/* Whether o streams persistent tensor t of g (a graph with no group to
 * follow): a frozen weight of a named block; with stream_trainable, a
 * trainable one too; an optimizer state whose parameter is streamed, or
 * any with offload_optimizer. owner: per tensor, the parameter an update
 * keeps an optimizer state for (-1: none). */
static int streams(const ck_compile_opts *o, const ck_graph *g, const int *owner, int t)
{
    switch (g->t[t].kind) {
    case CK_KIND_FROZEN: return stream_match(o, g->t[t].name);
    case CK_KIND_PARAM: return o->stream_trainable && stream_match(o, g->t[t].name);
    case CK_KIND_OPTSTATE: return owner[t] >= 0 && (o->offload_optimizer || streams(o, g, owner, owner[t]));
    default: return 0;
    }
}

/* per tensor, the parameter whose update keeps it as optimizer state (the
 * update's outputs after the parameter), else -1; NULL out of memory */
static int *state_owners(const ck_graph *g)
{
    int *owner = malloc(sizeof(int) * (size_t)(g->nt ? g->nt : 1));
    if (!owner) return NULL;
    for (int t = 0; t < g->nt; t++) owner[t] = -1;
    for (int i = 0; i < g->nn; i++) {
        const ck_node *n = &g->n[i];
        if (n->phase != CK_PHASE_OPTIMIZER || n->nout < 1 || n->out[0] < 0 || g->t[n->out[0]].kind != CK_KIND_PARAM)
            continue;
        for (int k = 1; k < n->nout; k++)
            if (n->out[k] >= 0 && g->t[n->out[k]].kind == CK_KIND_OPTSTATE) owner[n->out[k]] = n->out[0];
    }
    return owner;
}

/* p's own frozen weights are as they were written: no other member has run or
 * written above the shared region since; else one line naming the first */
static int own_intact(ck_program *p)
{
    if (!p->own_at) return 0;
    for (int t = 0; t < p->g->nt; t++) {
        if (p->poff[t] < (int64_t)p->grp->shared || p->g->t[t].kind != CK_KIND_FROZEN || is_streamed(p, t)) continue;
        if (p->own_at[t] != p->grp->serial)
            return ck_errf(p->err, sizeof p->err, "'%s' is a weight of this program alone, and another program of its "
                         "group has run since it was written: load it again (or p:init_own() for its initial values)",
                         p->g->t[t].name ? p->g->t[t].name : "a tensor");
    }
    return 0;
}

/* where share keeps a tensor like t in the group's shared region: same name,
 * kind, shape and dtype; -1 where it has none by that name, -2 where its
 * tensor of that name differs */
static int64_t shared_offset(const ck_program *share, const ck_tensor *t)
{
    const int s = t->name ? ck_graph_find(share->g, t->name) : -1;
    if (s >= 0 && is_streamed(share, s)) return -2; /* a streamed weight like t was taken before: this one differs */
    if (s < 0 || share->poff[s] < 0 || (size_t)share->poff[s] >= share->grp->shared) return -1;
    const ck_tensor *u = &share->g->t[s];
    if (u->kind != t->kind || u->dtype != t->dtype || u->shape.ndim != t->shape.ndim) return -2;
    for (int d = 0; d < t->shape.ndim; d++)
        if (u->shape.d[d] != t->shape.d[d]) return -2;
    return share->poff[s];
}

/* the group's arena made as large as p needs (before the first step: the
 * shared region is copied into the larger one, the old one released) */
static int group_grow(ck_program *p, char *err, size_t errlen)
{
    ck_group *gr = p->grp;
    if (gr->bytes >= p->arena_bytes) return 0;
    const ck_backend *be = p->be;
    const size_t bytes = ck_program_device_bytes(be, p->arena_bytes);
    char what[200], size[64];
    ck_mem_text(p->arena_bytes, size, sizeof size);
    snprintf(what, sizeof what, "the arena of programs that share weights, grown to %s", size);
    if (ck_mem_take(gr->budget, bytes, what, err, errlen)) return -1;
    be->enter();
    unsigned char *a = be->alloc(p->arena_bytes);
    if (!a) {
        ck_mem_give(gr->budget, bytes);
        ck_errf(err, errlen, "cannot allocate the arena of %zu bytes on %s%s%s", p->arena_bytes, be->name,
              be->error()[0] ? ": " : "", be->error());
        be->clear_error();
        return -1;
    }
    if (be->copy(a, gr->arena, gr->shared)) {
        be->release(a);
        ck_mem_give(gr->budget, bytes);
        ck_errf(err, errlen, "copying the shared weights on %s: %s", be->name, be->error());
        be->clear_error();
        return -1;
    }
    be->release(gr->arena);
    ck_mem_give(gr->budget, gr->charged);
    become_actor(p); /* only the shared region was copied */
    gr->arena = a;
    gr->bytes = p->arena_bytes;
    gr->charged = bytes;
    return 0;
}

/* every persistent tensor at its initial values (own_only: those above the
 * group's shared region) */
static int init_persistent(ck_program *p, int own_only, char *err, size_t errlen)
{
    const ck_graph *g = p->g;
    for (int t = 0; t < g->nt; t++) {
        if (p->poff[t] < 0 || (own_only && ((size_t)p->poff[t] < p->grp->shared || is_streamed(p, t)))) continue;
        float *x = ck_program_write_begin(p, t, 0);
        if (x) init_tensor(&g->t[t], x, p->opt.seed);
        if (!x || ck_program_write_end(p, t))
            return ck_errf(err, errlen, "initializing '%s': %s", g->t[t].name ? g->t[t].name : "tensor", p->err);
    }
    return 0;
}

/* the CPU time of this thread: what planning costs, whatever else runs */
/* The host region of the lists' offloaded tensors: pinned memory on a
 * device, as large as the largest list's host_peak; refused before the
 * first step, naming its bytes, when it cannot be had (the budget, or the
 * system's locked-memory limit). Copy slots opened for the most any list has. */
static int host_region(ck_program *p, char *err, size_t errlen)
{
    size_t need = p->train.host_peak > p->eval.host_peak ? p->train.host_peak : p->eval.host_peak;
    int slots = p->train.nslots > p->eval.nslots ? p->train.nslots : p->eval.nslots;
    for (int k = 1; k <= CK_STATS_ALL; k++) {
        if (p->logplan[k].host_peak > need) need = p->logplan[k].host_peak;
        if (p->logplan[k].nslots > slots) slots = p->logplan[k].nslots;
    }
    if (!slots) return 0;
    const ck_backend *be = p->be;
    char what[200], size[64];
    ck_mem_text(need, size, sizeof size);
    snprintf(what, sizeof what, "the host region of offloaded tensors (%s of %shost memory)", size,
             be->host ? "" : "pinned ");
    if (ck_mem_take(p->budget, need, what, err, errlen)) return -1;
    p->host_charged = need;
    be->enter();
    p->host = need ? be->pinned_alloc(need) : NULL; /* streamed weights alone: copies, no host region */
    if (need && !p->host) {
        ck_errf(err, errlen, "cannot allocate %zu bytes (%s) of %shost memory for the offloaded tensors%s%s", need, size,
              be->host ? "" : "pinned ", be->error()[0] ? ": " : "", be->error());
        be->clear_error();
        return -1;
    }
    p->host_bytes = need;
    if (be->xfer_open(slots)) {
        ck_errf(err, errlen, "the copy stream on %s: %s", be->name, be->error());
        be->clear_error();
        return -1;
    }
    return 0;
}

/* The pinned host memory of the group's streamed weights and optimizer state (its first
 * program's), refused before the first step, naming its bytes, when it
 * cannot be had. */
static int weights_region(ck_program *p, char *err, size_t errlen)
{
    ck_group *gr = p->grp;
    if (!gr->weight_bytes) return 0;
    const ck_backend *be = p->be;
    char what[200], size[64];
    ck_mem_text(gr->weight_bytes, size, sizeof size);
    snprintf(what, sizeof what, "the streamed weights (%s of %shost memory)", size, be->host ? "" : "pinned ");
    if (ck_mem_take(p->budget, gr->weight_bytes, what, err, errlen)) return -1;
    gr->weight_charged = gr->weight_bytes;
    be->enter();
    gr->weights = be->pinned_alloc(gr->weight_bytes);
    if (!gr->weights)
        return ck_errf(err, errlen, "cannot allocate %zu bytes (%s) of %shost memory for the streamed weights%s%s",
                     gr->weight_bytes, size, be->host ? "" : "pinned ", be->error()[0] ? ": " : "", be->error());
    return 0;
}

static int oom(char *err, size_t errlen) { return ck_errf(err, errlen, "out of memory while compiling"); }

/* A program for src under o: its options, its backend and its copy of the
 * graph (charged first); NULL with err. */
static ck_program *program_new(const ck_graph *src, const ck_compile_opts *o, char *err, size_t errlen)
{
    /* the planner's own limit (list entries and tree positions stay far
     * below 2^31, keys below 2^63), refused before anything that size is made */
    if (src->nn > CK_PLAN_MAX_NODES) {
        ck_errf(err, errlen, "the graph has %d nodes, more than the %d ckrun plans", src->nn, CK_PLAN_MAX_NODES);
        return NULL;
    }
    ck_program *p = calloc(1, sizeof *p);
    if (!p) {
        ck_errf(err, errlen, "out of memory");
        return NULL;
    }
    p->opt = *o;
    p->opt.outputs = NULL; /* the caller's arrays: not kept */
    p->opt.stat_blocks = NULL;
    p->opt.stream = NULL;
    p->opt.nstream = 0;
    p->be = o->be ? o->be : ck_backend_cpu();
    p->loss = o->loss;
    p->budget = src->budget;
    const size_t gbytes = ck_graph_host_bytes(src);
    char what[160], size[64];
    ck_mem_text(gbytes, size, sizeof size);
    snprintf(what, sizeof what, "the program's copy of the graph (%d nodes, %s)", src->nn, size);
    if (ck_mem_take(p->budget, gbytes, what, err, errlen)) {
        free(p);
        return NULL;
    }
    if (!(p->g = ck_graph_clone(src))) {
        ck_mem_give(p->budget, gbytes);
        oom(err, errlen);
        ck_program_free(p);
        return NULL;
    }
    p->g->budget = p->budget;
    p->g->charged = gbytes;
    return p;
}

/* A data-parallel training program that will run: the job's checks, and
 * this process's rank (its communicator opens at the first step) */
static int job_check(ck_program *p, const ck_compile_opts *o, char *err, size_t errlen)
{
    if (!data_parallel(o) || o->loss < 0 || !ck_train_has_params(p->g) || o->optim == CK_OPTIM_NONE) return 0;
    if (o->fused_backward)
        return ck_errf(err, errlen, "fused updates run inside backward, before the ranks' gradients are summed: data "
                       "parallel training refuses them (compile without fused_backward)");
    if (o->plan_only) return 0;
    if (!p->be->host && !p->be->allreduce_start)
        return ck_errf(err, errlen, "data parallel training on the %s device needs NCCL, and this build of its "
                       "backend has none (rebuild with NCCL found, or run the ranks on the CPU)", p->be->name);
    if (ck_dist_size() != (o->world > 1 ? o->world : 1))
        return ck_errf(err, errlen, "compiled for %d ranks, but this job has %d (mpirun -np %d ...)", o->world,
                       ck_dist_size(), o->world);
    p->opt.rank = ck_dist_rank();
    p->comm = 1;
    return 0;
}

/* the training step's graph transforms (graph/train.c), what they made kept */
static int train_graph(ck_program *p, const ck_compile_opts *o, char *err, size_t errlen)
{
    const ck_train_opts to = {.loss = o->loss, .optim = o->optim, .beta1 = o->beta1, .beta2 = o->beta2,
                              .eps = o->eps, .weight_decay = o->weight_decay, .max_grad_norm = o->max_grad_norm,
                              .accumulate = o->accumulate, .fused_backward = o->fused_backward, .scaler = o->scaler,
                              .data_parallel = data_parallel(o), .world = o->world, .rank = o->rank,
                              .shard = o->shard, .bucket_bytes = o->bucket_bytes};
    ck_train_ids ids;
    const int rc = ck_train_graph(p->g, &to, &ids, err, errlen);
    p->scale_t = ids.scale_t, p->tracker_t = ids.tracker_t, p->inv_t = ids.inv_t;
    p->accums = ids.accums, p->naccum = ids.naccum;
    p->accum_nodes[0] = ids.accum_nodes[0], p->accum_nodes[1] = ids.accum_nodes[1];
    p->nbuckets = ids.nbuckets;
    p->owner = ids.owner, p->nowner = ids.nowner;
    return rc;
}

/* The persistent region: parameters, inputs, optimizer state, by graph
 * order (streamed frozen weights in the group's pinned weights instead); in
 * a group, the tensors the group's first program has are its own. Then the
 * buckets' bytes, and a request for each. */
static int lay_out(ck_program *p, const ck_compile_opts *o, char *err, size_t errlen)
{
    const ck_graph *g = p->g;
    if (take_own(p, ck_graph_malloc_chunk(sizeof *p) + ck_graph_malloc_chunk(sizeof(int) * (size_t)g->nt) +
                        ck_graph_malloc_chunk(sizeof(int64_t) * (size_t)g->nt),
                 "the program's tensor tables", err, errlen))
        return -1;
    p->retain = calloc((size_t)g->nt, sizeof(int));
    p->poff = malloc(sizeof(int64_t) * (size_t)g->nt);
    if (!p->retain || !p->poff) return oom(err, errlen);
    for (int i = 0; i < o->noutputs; i++) p->retain[o->outputs[i]] = 1;
    if (o->loss >= 0) p->retain[o->loss] = 1;
    if (join_group(p, o->share, err, errlen)) return -1;
    if ((o->stream_trainable || o->offload_optimizer) && data_parallel(o))
        return ck_errf(err, errlen, "%s is not for data parallel training: each rank's updates keep their state "
                       "on its device", o->offload_optimizer ? "offloading the optimizer state" :
                       "streaming trainable weights");
    if (o->nstream || o->offload_optimizer || (o->share && o->share->streamed)) {
        if (take_own(p, ck_graph_malloc_chunk((size_t)g->nt), "the program's tensor tables", err, errlen)) return -1;
        if (!(p->streamed = calloc((size_t)g->nt, 1))) return oom(err, errlen);
    }
    if (p->streamed && !o->share) { /* what this program streams (a member of a group: what the group streams) */
        int *owner = state_owners(g);
        if (!owner) return oom(err, errlen);
        for (int t = 0; t < g->nt; t++) p->streamed[t] = (unsigned char)streams(o, g, owner, t);
        free(owner);
    }
    size_t off = p->grp->shared, woff = 0;
    for (int t = 0; t < g->nt; t++) {
        p->poff[t] = -1;
        if (!ck_plan_is_persistent(g->t[t].kind)) continue;
        if (o->share && g->t[t].kind != CK_KIND_INPUT && o->share->streamed) {
            /* what the group streams: streamed here too, from the group's pinned copy */
            const int s = g->t[t].name ? ck_graph_find(o->share->g, g->t[t].name) : -1;
            const ck_tensor *u = s >= 0 ? &o->share->g->t[s] : NULL;
            int same = u && is_streamed(o->share, s) && u->kind == g->t[t].kind && u->dtype == g->t[t].dtype &&
                       u->shape.ndim == g->t[t].shape.ndim;
            for (int d = 0; same && d < u->shape.ndim; d++) same = u->shape.d[d] == g->t[t].shape.d[d];
            if (same) {
                p->poff[t] = o->share->poff[s];
                p->streamed[t] = 1;
                continue;
            }
        }
        if (!o->share && is_streamed(p, t)) {
            p->poff[t] = (int64_t)woff; /* in the pinned weights, not the arena */
            woff += (ck_tensor_bytes(&g->t[t]) + 63) / 64 * 64;
            continue;
        }
        if (o->share) {
            const int64_t at = shared_offset(o->share, &g->t[t]);
            if (at >= 0) {
                p->poff[t] = at;
                continue;
            }
            if (at == -2 && g->t[t].kind != CK_KIND_INPUT) {
                ck_errf(err, errlen, "'%s' (%s) differs in kind, shape or type from the tensor of that name in the "
                      "program this one shares its weights with", g->t[t].name, g->t[t].where ? g->t[t].where : "?");
                return -1;
            }
            if (g->t[t].kind != CK_KIND_INPUT && g->t[t].kind != CK_KIND_FROZEN) {
                ck_errf(err, errlen, "'%s' (%s) is not in the program this one shares its weights with: a program "
                      "that shares weights may add inputs and frozen weights only", g->t[t].name ? g->t[t].name :
                      "a tensor", g->t[t].where ? g->t[t].where : "?");
                return -1;
            }
            if (g->t[t].kind == CK_KIND_FROZEN && !p->own_at) {
                if (take_own(p, ck_graph_malloc_chunk(sizeof(uint64_t) * (size_t)g->nt), "the program's tensor tables",
                             err, errlen))
                    return -1;
                p->own_at = calloc((size_t)g->nt, sizeof(uint64_t));
                if (!p->own_at) return oom(err, errlen);
            }
        }
        p->poff[t] = (int64_t)off;
        off += (ck_tensor_bytes(&g->t[t]) + 63) / 64 * 64;
    }
    p->persistent = off;
    /* data parallel: the buckets' bytes, and a request for each */
    for (int i = 0; i < g->nn; i++)
        if (g->n[i].op == CK_OP_ALLREDUCE_START) {
            const int first = (int)g->n[i].p.i[0], last = (int)g->n[i].p.i[1];
            p->bucket_total += (size_t)(p->poff[last] - p->poff[first]) + ck_tensor_bytes(&g->t[last]);
        }
    if (p->nbuckets) {
        if (take_own(p, ck_graph_malloc_chunk(sizeof *p->reqs * (size_t)p->nbuckets), "the buckets' requests", err,
                     errlen))
            return -1;
        p->reqs = calloc((size_t)p->nbuckets, sizeof *p->reqs);
        if (!p->reqs) return oom(err, errlen);
    }
    if (!o->share) {
        p->grp->shared = off;
        p->grp->weight_bytes = woff;
    }
    return 0;
}

/* The op lists: the training step's (with a loss and something to train),
 * then the forward pass's, planned after the step's so that the step's
 * search does not hold it (plan/compile.c); the arena's bytes. */
static int plan_lists(ck_program *p, const ck_compile_opts *o, char *err, size_t errlen)
{
    const ck_graph *g = p->g;
    const ck_plan_in in = {.g = g, .poff = p->poff, .persistent = p->persistent, .retain = p->retain,
                           .streamed = p->streamed, .be = p->be, .decide = o->decide, .decide_ud = o->decide_ud,
                           .report = o->report, .offload = o->offload,
                           .prefetch = o->prefetch > 0 ? o->prefetch : CK_PREFETCH_DEFAULT, .speed = o->speed,
                           .budget = p->budget};
    int *sinks = malloc(sizeof(int) * (size_t)(g->nn + o->noutputs + 2)), ns = 0, rc = 0;
    if (!sinks) return oom(err, errlen);
    for (int i = 0; i < o->noutputs; i++) sinks[ns++] = g->t[o->outputs[i]].node;
    if (o->loss >= 0) sinks[ns++] = g->t[o->loss].node;
    const int nsinks = ns; /* the forward pass's */
    if (o->loss >= 0 && ck_train_has_params(g)) {
        for (int t = 0; t < g->nt; t++) {
            if (g->t[t].kind != CK_KIND_PARAM) continue;
            int gt = g->t[t].grad;
            if (o->keep_grads) p->retain[gt] = 1;
            sinks[ns++] = g->t[gt].node;
        }
        for (int i = 0; i < g->nn; i++)
            if (g->n[i].phase == CK_PHASE_OPTIMIZER) sinks[ns++] = i;
        ck_step_info info;
        size_t held = 0;
        rc = ck_plan_step(&in, sinks, ns, &p->train, &info, &held, err, errlen);
        p->charged_own += held;
        p->decide_seconds = info.decide_seconds, p->plan_seconds = info.plan_seconds, p->none_peak = info.none_peak;
        memcpy(p->offload_why, info.why, sizeof p->offload_why);
    }
    if (rc == 0) {
        size_t held = 0;
        rc = ck_plan_forward(&in, sinks, nsinks, &p->eval, &held, err, errlen);
        p->charged_own += held;
    }
    free(sinks);
    /* the one arena: the largest list the program will run */
    p->arena_bytes = p->train.peak > p->eval.peak ? p->train.peak : p->eval.peak;
    if (p->arena_bytes < p->persistent) p->arena_bytes = p->persistent;
    return rc;
}

/* A program that will run: in a group, the group's arena grown to it and
 * its own tensors' first values; else its arena (its device bytes charged
 * before the backend is asked), the streamed weights' pinned memory and
 * every persistent tensor's first value; then the host region. */
static int allocate(ck_program *p, char *err, size_t errlen)
{
    const ck_backend *be = p->be;
    if (p->opt.share) {
        if (group_grow(p, err, errlen)) return -1;
        /* the shared tensors hold the group's values; the inputs start as any others do */
        if (init_persistent(p, 1, err, errlen)) return -1;
        return host_region(p, err, errlen);
    }
    size_t dev_free, dev_total;
    if (!be->host && p->budget && p->budget->add_device && p->budget->limit &&
        ck_cuda_memory(&dev_free, &dev_total) == 0) {
        p->budget->limit += dev_total; /* the machine's memory is its host's and its device's */
        p->budget->add_device = 0;
    }
    char what[200], size[64], dev[64];
    const size_t bytes = ck_program_device_bytes(be, p->arena_bytes);
    ck_mem_text(p->arena_bytes, size, sizeof size);
    ck_mem_text(bytes, dev, sizeof dev);
    if (be->host || bytes == p->arena_bytes)
        snprintf(what, sizeof what, "the program's arena of %s", size);
    else
        snprintf(what, sizeof what, "the program's arena of %s (%s of %s memory)", size, dev, be->name);
    if (ck_mem_take(p->budget, bytes, what, err, errlen)) return -1;
    p->grp->charged = bytes;
    p->grp->budget = p->budget;
    be->enter();
    p->grp->arena = be->alloc(p->arena_bytes);
    if (!p->grp->arena) {
        ck_errf(err, errlen, "cannot allocate the arena of %zu bytes on %s%s%s", p->arena_bytes, be->name,
                be->error()[0] ? ": " : "", be->error());
        be->clear_error();
        return -1;
    }
    p->grp->bytes = p->arena_bytes;
    if (weights_region(p, err, errlen) || init_persistent(p, 0, err, errlen)) return -1;
    return host_region(p, err, errlen);
}

/* The compiler: the training step as graph transforms, the precision of
 * each tensor, the persistent region's layout, the op lists decided,
 * scheduled, offloaded and placed, the logging lists; then, for a program
 * that will run, its memory. */
ck_program *ck_compile(const ck_graph *src, const ck_compile_opts *o, char *err, size_t errlen)
{
    ck_program *p = program_new(src, o, err, errlen);
    if (!p) return NULL;
    if (job_check(p, o, err, errlen)) goto fail;
    ck_compile_opts own = *o; /* with this process's rank */
    own.rank = p->opt.rank;
    o = &own;
    if (train_graph(p, o, err, errlen)) goto fail;
    ck_plan_precision(p->g, o->storage, o->frozen, o->loss);
    if (lay_out(p, o, err, errlen) || plan_lists(p, o, err, errlen)) goto fail;
    if (o->stats && ck_program_add_stats(p, o->stats, o->stat_blocks, o->nstat_blocks, err, errlen)) goto fail;
    if (settle_own(p, "the logging steps' op lists and plans", err, errlen)) goto fail;
    if (p->arena_bytes > p->grp->need) p->grp->need = p->arena_bytes;
    if (!o->plan_only && allocate(p, err, errlen)) goto fail;
    return p;
fail:
    ck_program_free(p);
    return NULL;
}

const char *ck_program_default_device(void) { return ck_cuda_devices() > 0 ? "cuda" : "cpu"; }

const ck_backend *ck_program_backend_find(const char *name, int plan_only, char *err, size_t errlen)
{
    if (!name || !strcmp(name, "auto")) name = ck_program_default_device();
    if (!strcmp(name, "cpu")) return ck_backend_cpu();
    if (!strcmp(name, "cuda")) {
        const ck_backend *be = ck_backend_cuda(err, errlen);
        return be || !plan_only ? be : ck_backend_cuda_plan();
    }
    ck_errf(err, errlen, "unknown device '%s' (cpu, cuda or auto)", name);
    return NULL;
}

size_t ck_program_device_bytes(const ck_backend *be, size_t arena)
{
    const size_t g = be->granule > 1 ? be->granule : 1;
    return (arena + g - 1) / g * g + be->fixed_bytes;
}

size_t ck_program_host_bytes(const ck_program *p) { return own_bytes(p) + ck_graph_host_bytes(p->g); }

size_t ck_program_stage_bound(const ck_program *p)
{
    size_t most = 0;
    for (int t = 0; t < p->g->nt; t++) {
        const ck_tensor *tt = &p->g->t[t];
        if (p->be->host && tt->dtype == CK_F32) continue; /* read and written in place */
        const size_t f32 = (size_t)ck_shape_numel(&tt->shape) * sizeof(float);
        const size_t b = f32 + (tt->dtype == CK_F32 ? 0 : ck_tensor_bytes(tt));
        if (b > most) most = b;
    }
    return most ? ck_graph_malloc_chunk(most) : 0;
}

void ck_program_free(ck_program *p)
{
    if (!p) return;
    ck_mem_give(p->budget, p->charged_own + p->charged_stage + p->host_charged);
    ck_exec_graphs_clear(p->be, &p->graphs);
    if (p->host) {
        p->be->enter();
        p->be->pinned_release(p->host);
    }
    ck_plan_free(&p->train);
    ck_plan_free(&p->eval);
    for (int k = 0; k <= CK_STATS_ALL; k++) ck_plan_free(&p->logplan[k]);
    ck_graph_stat_set_truncate(&p->st, 0);
    free(p->st.blocks);
    free(p->profile);
    ck_graph_free(p->g);
    free(p->retain);
    free(p->poff);
    free(p->streamed);
    free(p->accums);
    free(p->owner);
    free(p->own_at);
    free(p->reqs);
    if (p->grp && p->grp->actor == p) p->grp->actor = NULL;
    if (p->grp && --p->grp->refs == 0) {
        if (p->grp->arena) {
            p->be->enter();
            p->be->release(p->grp->arena);
        }
        if (p->grp->weights) {
            p->be->enter();
            p->be->pinned_release(p->grp->weights);
        }
        ck_mem_give(p->grp->budget, p->grp->charged + p->grp->weight_charged);
        free(p->grp);
    }
    free(p->stage);
    free(p);
}

/* what the executor needs of p for a run of list pl */
static ck_exec_env exec_env(ck_program *p, const ck_plan *pl)
{
    return (ck_exec_env){.g = p->g,
                         .be = p->be,
                         .arena = p->grp->arena,
                         .arena_bytes = p->arena_bytes,
                         .host = p->host,
                         .weights = p->grp->weights,
                         .persistent = p->persistent,
                         .poff = p->poff,
                         .seed = p->opt.seed,
                         .step = p->grp->step,
                         .update = p->grp->updates + 1,
                         .lr = p->opt.lr,
                         .eval = pl == &p->eval && p->eval_mode,
                         .fused_backward = p->opt.fused_backward,
                         .interrupt = p->interrupt,
                         .profile = p->profile,
                         .reqs = p->reqs,
                         .nreqs = p->nbuckets,
                         .graphs = p->opt.no_cuda_graph || !p->be->capture_begin ? NULL : &p->graphs};
}

static int runnable(ck_program *p)
{
    if (p->grp->arena) return 1;
    snprintf(p->err, sizeof p->err, "this program was compiled for planning only and cannot run");
    return 0;
}

int ck_program_step(ck_program *p)
{
    ck_run_opts o = {0, 0, 0};
    ck_run_info r;
    return ck_program_run(p, &o, &r);
}

/* where the optimizer's entries start: they are the list's tail */
static int optimizer_start(const ck_plan *pl)
{
    int k = pl->n;
    while (k > 0 && pl->ops[k - 1].phase == CK_PHASE_OPTIMIZER) k--;
    return k;
}

/* where the update proper starts: past the accumulation entries that lead the
 * optimizer's tail (there are none without accumulation) */
static int update_start(const ck_program *p, const ck_plan *pl, int opt_start)
{
    int k = opt_start;
    while (k < pl->n && pl->ops[k].node >= p->accum_nodes[0] && pl->ops[k].node < p->accum_nodes[1]) k++;
    return k;
}

/* the gradient sums start over after an update */
static int zero_accums(ck_program *p)
{
    p->be->enter();
    for (int i = 0; i < p->naccum; i++) {
        const int t = p->accums[i];
        if (p->be->fill_u32(p->grp->arena + p->poff[t], 0u, ck_tensor_bytes(&p->g->t[t]) / 4)) {
            snprintf(p->err, sizeof p->err, "%s device: %s", p->be->name, p->be->error());
            p->be->clear_error();
            return -1;
        }
    }
    return 0;
}

/* the gradient sums (after their sums over the ranks: the same on every rank) are finite */
static int sums_finite(ck_program *p, const ck_exec_env *e, const ck_plan *pl)
{
    int fin = 1;
    for (int i = 0; i < p->naccum && fin; i++)
        if (ck_exec_tensor_finite(e, pl, p->accums[i], &fin, p->err, sizeof p->err)) return -1;
    return fin;
}

/* the loss and, where the update reads them, the gradients are finite */
static int step_finite(ck_program *p, const ck_exec_env *e, const ck_plan *pl, int opt_start, ck_run_info *r)
{
    const ck_graph *g = p->g;
    int fin = 1;
    if (p->loss >= 0 && pl->off[p->loss] >= 0) {
        if (ck_exec_tensor_finite(e, pl, p->loss, &fin, p->err, sizeof p->err)) return -1;
        r->loss_nonfinite = !fin;
        if (!fin) return 0;
    }
    /* no update to guard, gradients may be gone; or, fused, none computed yet */
    if ((opt_start == pl->n && !p->opt.keep_grads) || p->opt.fused_backward) return 1;
    for (int t = 0; t < g->nt; t++) {
        if (g->t[t].kind != CK_KIND_PARAM) continue;
        int gt = g->t[t].grad;
        if (gt < 0 || pl->off[gt] < 0) continue;
        if (ck_exec_tensor_finite(e, pl, gt, &fin, p->err, sizeof p->err)) return -1;
        if (!fin) return 0;
    }
    return 1;
}

/* Data parallel overlapped with backward: forward and backward with each
 * bucket's sum started as soon as backward completes it, then the waits;
 * the guard checks the loss and the summed gradients (the same on every
 * rank), agreed over the ranks; then the rest of the optimizer's tail runs as
 * the update. k: where the tail starts (the waits lead it). */
static int run_overlapped(ck_program *p, const ck_run_opts *o, ck_run_info *r, const ck_plan *pl,
                          const ck_exec_env *e, int k)
{
    int w = k;
    while (w < pl->n && p->g->n[pl->ops[w].node].op == CK_OP_ALLREDUCE_WAIT) w++;
    if (ck_exec_range(e, pl, 0, w, p->err, sizeof p->err)) {
        p->grp->step--;
        return -1;
    }
    int fin = 1;
    if (o->guard) {
        if (p->loss >= 0 && pl->off[p->loss] >= 0 &&
            ck_exec_tensor_finite(e, pl, p->loss, &fin, p->err, sizeof p->err)) {
            p->grp->step--;
            return -1;
        }
        r->loss_nonfinite = !fin;
        const int sums = fin ? sums_finite(p, e, pl) : 0;
        if (sums < 0) {
            p->grp->step--;
            return -1;
        }
        float bad = sums ? 0.0f : 1.0f;
        if (ck_dist_allreduce(&bad, 1, NULL, NULL) != 0) {
            p->grp->step--;
            return ck_errf(p->err, sizeof p->err, "the ranks could not agree whether the step was finite");
        }
        fin = bad == 0.0f;
    }
    if (!fin) {
        /* a second pass names the op; it adds into the sums again, which start over */
        ck_exec_env again = *e;
        again.replay = 1;
        r->nonfinite = 1;
        if (ck_exec_find_nonfinite(&again, pl, k, &r->bad_entry, &r->bad_input, p->err, sizeof p->err) ||
            zero_accums(p)) {
            p->grp->step--;
            return -1;
        }
    } else if (ck_exec_range(e, pl, w, pl->n, p->err, sizeof p->err) || zero_accums(p)) {
        p->grp->step--;
        return -1;
    } else {
        p->grp->updates++;
    }
    if (ck_exec_sync(p->be, p->err, sizeof p->err)) return -1;
    if (o->measure && ck_exec_arena_high_water(e, &r->high_water, p->err, sizeof p->err)) return -1;
    return 0;
}

/* one scalar of the arena, read or written from the host */
static int scalar_get(ck_program *p, int t, float *v)
{
    const float *x = ck_program_read(p, t);
    if (!x) return -1;
    *v = x[0];
    return 0;
}

static int scalar_set(ck_program *p, int t, float v)
{
    float *x = ck_program_write_begin(p, t, 0);
    if (!x) return -1;
    x[0] = v;
    return ck_program_write_end(p, t);
}

/* Before a loss-scaled step: the scale (as saved, or as p:set left it) and
 * 1/scale for the update, in fp32 from the double reciprocal as GradScaler
 * computes inv_scale. */
static int scale_begin(ck_program *p, float *scale)
{
    if (scalar_get(p, p->scale_t, scale)) return -1;
    if (!(*scale > 0.0f) || isinf(*scale))
        return ck_errf(p->err, sizeof p->err, "the loss scale is %g: it must be a finite number > 0", (double)*scale);
    return scalar_set(p, p->inv_t, (float)(1.0 / (double)*scale));
}

/* After an update step: GradScaler.update(). On an overflow the scale backs
 * off and the count of updates since it changed starts over; after
 * growth_interval updates in a row it grows (unless that is no longer
 * finite), and the count starts over. */
static int scale_end(ck_program *p, float scale, int overflow)
{
    const ck_loss_scale *c = &p->opt.scaler;
    float tracker;
    if (scalar_get(p, p->tracker_t, &tracker)) return -1;
    if (overflow) {
        scale *= c->backoff_factor;
        tracker = 0.0f;
    } else if (tracker + 1.0f >= (float)c->growth_interval) {
        const float grown = scale * c->growth_factor;
        if (isfinite(grown)) scale = grown;
        tracker = 0.0f;
    } else {
        tracker += 1.0f;
    }
    if (scalar_set(p, p->scale_t, scale) || scalar_set(p, p->tracker_t, tracker)) return -1;
    return 0;
}

/* A loss-scaled step: forward and backward from the scale, the gradients
 * added into their sums whatever they hold (an inf in one accumulated step
 * makes the whole update's sums non-finite, as in GradScaler, which checks
 * once per update); on an update step, the update only if the loss and
 * what the update reads are finite, and the scale updated. A non-finite
 * loss is reported as such (and, with the guard, its op named); gradients
 * that overflow with a finite loss are loss scaling's ordinary skip. */
static int run_scaled(ck_program *p, const ck_run_opts *o, ck_run_info *r, const ck_plan *pl, const ck_exec_env *e,
                      int k, int u)
{
    float scale;
    if (scale_begin(p, &scale)) return -1;
    r->loss_scale = scale;
    /* data parallel overlapped with backward: the sums were started inside
     * backward, so their waits (which lead the tail) run before the check */
    if (p->g->comm_overlap && p->nbuckets)
        while (u < pl->n && p->g->n[pl->ops[u].node].op == CK_OP_ALLREDUCE_WAIT) u++;
    if (ck_exec_range(e, pl, 0, u, p->err, sizeof p->err)) return -1;
    int loss_fin = 1;
    if (p->loss >= 0 && pl->off[p->loss] >= 0 &&
        ck_exec_tensor_finite(e, pl, p->loss, &loss_fin, p->err, sizeof p->err))
        return -1;
    r->loss_nonfinite = !loss_fin;
    const int update = !(p->opt.accumulate > 1 && p->grp->micro + 1 < p->opt.accumulate);
    int fin = loss_fin;
    if (update && fin) {
        if (p->naccum) fin = sums_finite(p, e, pl);
        else fin = step_finite(p, e, pl, k, r);
        if (fin < 0) return -1;
    }
    if (update && p->nbuckets && ck_dist_size() > 1) { /* every rank takes the same decision */
        float bad = fin ? 0.0f : 1.0f;
        if (ck_dist_allreduce(&bad, 1, NULL, NULL) != 0)
            return ck_errf(p->err, sizeof p->err, "the ranks could not agree whether the step was finite");
        if (bad > 0.0f) fin = 0;
    }
    if (!update) {
        p->grp->micro++; /* summed; the update comes with a later step */
    } else {
        if (fin) {
            if (ck_exec_range(e, pl, u, pl->n, p->err, sizeof p->err)) return -1;
            p->grp->updates++;
        }
        p->grp->micro = 0;
        if (zero_accums(p) || scale_end(p, scale, !fin)) return -1;
        r->overflow = !fin && loss_fin;
    }
    if (!loss_fin) { /* reported guarded or not: the step's gradients never reach an update */
        r->nonfinite = 1;
        if (o->guard) {
            ck_exec_env again = *e; /* a second pass names the op; it sums nothing over the ranks */
            again.replay = 1;
            if (ck_exec_find_nonfinite(&again, pl, k, &r->bad_entry, &r->bad_input, p->err, sizeof p->err)) return -1;
        }
    }
    return 0;
}

int ck_program_run(ck_program *p, const ck_run_opts *o, ck_run_info *r)
{
    memset(r, 0, sizeof *r);
    r->bad_entry = r->bad_input = -1;
    r->loss_scale = 1.0f;
    if (!runnable(p)) return -1;
    /* data parallel: the communicator, a collective of every rank, opens at the first step */
    if (p->comm && ck_exec_comm_open(p->be, p->err, sizeof p->err)) return -1;
    if (p->train.n == 0) {
        snprintf(p->err, sizeof p->err, "this program has nothing to train (no loss or no trainable parameter)");
        return -1;
    }
    /* statistics enabled after compile added op lists: they are charged now */
    if (settle_own(p, "the logging steps' op lists and plans", p->err, sizeof p->err)) return -1;
    const ck_plan *pl = &p->train;
    if (o->stats) {
        if (o->stats > CK_STATS_ALL || p->logplan[o->stats].n == 0) {
            snprintf(p->err, sizeof p->err, "this program computes no such statistics (enable them first)");
            return -1;
        }
        pl = &p->logplan[o->stats];
    }
    become_actor(p);
    if (own_intact(p)) return -1;
    p->grp->step++;
    p->last = pl;
    r->plan = pl;
    const ck_exec_env e = exec_env(p, pl);
    if (o->measure && ck_exec_arena_fill_sentinel(&e, p->err, sizeof p->err)) {
        p->grp->step--;
        return -1;
    }
    /* forward and backward; then, if the guard passes, the optimizer's tail:
     * gradient sums every step, the update every opt.accumulate-th. Fused
     * updates run inside backward: the guard checks the loss after forward,
     * and the rest of the list runs as the update */
    int k = optimizer_start(pl), u = update_start(p, pl, k);
    if (p->opt.fused_backward) {
        k = 0;
        while (k < pl->n && pl->ops[k].phase == CK_PHASE_FORWARD) k++;
        u = k;
    }
    if (p->scale_t >= 0) {
        if (run_scaled(p, o, r, pl, &e, k, u)) {
            p->grp->step--;
            return -1;
        }
        if (ck_exec_sync(p->be, p->err, sizeof p->err)) return -1;
        if (o->measure && ck_exec_arena_high_water(&e, &r->high_water, p->err, sizeof p->err)) return -1;
        return 0;
    }
    if (p->g->comm_overlap && p->nbuckets) return run_overlapped(p, o, r, pl, &e, k);
    /* a run that fails stops before the updates (exec.c): the step did not happen */
    if (ck_exec_range(&e, pl, 0, k, p->err, sizeof p->err)) {
        p->grp->step--;
        return -1;
    }
    int fin = o->guard ? step_finite(p, &e, pl, k, r) : 1;
    if (fin < 0) {
        p->grp->step--;
        return -1;
    }
    if (o->guard && p->nbuckets && ck_dist_size() > 1) {
        /* every rank skips the update if any rank's step was not finite:
         * the ranks' weights stay equal, and none waits in a sum alone */
        float bad = fin ? 0.0f : 1.0f;
        if (ck_dist_allreduce(&bad, 1, NULL, NULL) != 0) {
            p->grp->step--;
            return ck_errf(p->err, sizeof p->err, "the ranks could not agree whether the step was finite");
        }
        if (bad > 0.0f) fin = 0;
    }
    if (!fin) {
        r->nonfinite = 1;
        if (ck_exec_find_nonfinite(&e, pl, k, &r->bad_entry, &r->bad_input, p->err, sizeof p->err)) {
            p->grp->step--;
            return -1;
        }
    } else if (ck_exec_range(&e, pl, k, u, p->err, sizeof p->err)) {
        p->grp->step--;
        return -1;
    } else if (p->opt.accumulate > 1 && p->grp->micro + 1 < p->opt.accumulate) {
        p->grp->micro++; /* summed; the update comes with a later step */
    } else if (ck_exec_range(&e, pl, u, pl->n, p->err, sizeof p->err) || zero_accums(p)) {
        p->grp->step--;
        return -1;
    } else {
        p->grp->micro = 0;
        if (u < pl->n) p->grp->updates++; /* the list had updates, and they were applied */
    }
    if (ck_exec_sync(p->be, p->err, sizeof p->err)) return -1;
    if (o->measure && ck_exec_arena_high_water(&e, &r->high_water, p->err, sizeof p->err)) return -1;
    return 0;
}

int ck_program_forward(ck_program *p)
{
    if (!runnable(p)) return -1;
    become_actor(p);
    if (own_intact(p)) return -1;
    p->last = &p->eval;
    const ck_exec_env e = exec_env(p, &p->eval);
    if (ck_exec_range(&e, &p->eval, 0, p->eval.n, p->err, sizeof p->err)) return -1;
    return ck_exec_sync(p->be, p->err, sizeof p->err);
}

int ck_program_init_own(ck_program *p)
{
    if (!runnable(p)) return -1;
    return init_persistent(p, 1, p->err, sizeof p->err); /* a first program's are all shared */
}

int ck_program_step_measured(ck_program *p, size_t *high_water)
{
    if (!p->grp->arena) return ck_program_step(p);
    ck_run_opts o = {.measure = 1};
    ck_run_info r;
    int rc = ck_program_run(p, &o, &r);
    *high_water = r.high_water;
    return rc;
}

float *ck_program_data(ck_program *p, int t)
{
    if (t < 0 || t >= p->g->nt || !p->grp->arena) return NULL;
    if (p->poff[t] >= 0 && is_streamed(p, t)) return p->grp->weights ? (float *)(p->grp->weights + p->poff[t]) : NULL;
    if (p->poff[t] >= 0) return (float *)(p->grp->arena + p->poff[t]);
    /* in a list scheduled before stat nodes were added, ids above its graph
     * tensors are recomputed copies, not those nodes' outputs */
    if (!p->last || !p->retain[t] || t >= p->last->ntensors || p->last->origin[t] != t || p->last->off[t] < 0)
        return NULL;
    return (float *)(p->grp->arena + p->last->off[t]);
}

static int copy_failed(ck_program *p, int t, const char *what)
{
    snprintf(p->err, sizeof p->err, "%s '%s' %s the %s device: %s", what, p->g->t[t].name ? p->g->t[t].name : "a tensor",
             what[0] == 'r' ? "from" : "to", p->be->name, p->be->error());
    p->be->clear_error();
    return -1;
}

/* bytes of tensor t from its memory to the host's: a copy from the device,
 * or a plain one from a streamed weight's pinned memory */
static int fetch(ck_program *p, int t, void *dst, const void *src, size_t bytes)
{
    if (!is_streamed(p, t)) return p->be->download(dst, src, bytes);
    memcpy(dst, src, bytes);
    return 0;
}

/* The host memory for tensor t's values as fp32: the arena itself on the CPU
 * for fp32 tensors, else the stage: fp32 values, then room for the stored
 * bytes of a bf16 or fp8 tensor. keep: filled with the current values. */
static float *host_of(ck_program *p, int t, float *x, int keep)
{
    const ck_tensor *tt = &p->g->t[t];
    const int in_host = p->be->host || is_streamed(p, t); /* a streamed weight is in host memory on any device */
    if (in_host && tt->dtype == CK_F32) return x;
    int64_t n = ck_shape_numel(&tt->shape);
    size_t f32 = (size_t)n * sizeof(float), raw = tt->dtype == CK_F32 ? 0 : ck_tensor_bytes(tt);
    if (f32 + raw > p->stage_bytes) {
        /* the stage grows to the largest tensor read or written: charged
         * before it is allocated, the old one given back once it is freed */
        const size_t bytes = ck_graph_malloc_chunk(f32 + raw ? f32 + raw : 1);
        char what[200], size[64];
        ck_mem_text(bytes, size, sizeof size);
        snprintf(what, sizeof what, "a host copy of '%s' (%s)", tt->name ? tt->name : "a tensor", size);
        if (ck_mem_take(p->budget, bytes, what, p->err, sizeof p->err)) return NULL;
        float *s = malloc(f32 + raw ? f32 + raw : 1);
        if (!s) {
            ck_mem_give(p->budget, bytes);
            snprintf(p->err, sizeof p->err, "out of host memory for a copy of %zu bytes", f32 + raw);
            return NULL;
        }
        free(p->stage);
        ck_mem_give(p->budget, p->charged_stage);
        p->stage = s;
        p->stage_bytes = f32 + raw;
        p->charged_stage = bytes;
    }
    if (!keep) return p->stage;
    p->be->enter();
    if (!raw) return fetch(p, t, p->stage, x, f32) && copy_failed(p, t, "reading") ? NULL : p->stage;
    void *h = (char *)p->stage + f32;
    if (fetch(p, t, h, x, raw)) {
        copy_failed(p, t, "reading");
        return NULL;
    }
    if (tt->dtype == CK_F8E4M3)
        for (int64_t i = 0; i < n; i++) p->stage[i] = ck_f8e4m3_values[((const uint8_t *)h)[i]];
    else if (tt->dtype == CK_U8)
        for (int64_t i = 0; i < n; i++) p->stage[i] = (float)((const uint8_t *)h)[i];
    else if (tt->dtype == CK_F16)
        ck_f16_load(p->stage, (const uint16_t *)h, n);
    else
        ck_bf16_load(p->stage, (const uint16_t *)h, n);
    return p->stage;
}

const float *ck_program_read(ck_program *p, int t)
{
    p->err[0] = 0;
    float *x = ck_program_data(p, t);
    return x ? host_of(p, t, x, 1) : NULL;
}

float *ck_program_write_begin(ck_program *p, int t, int keep)
{
    p->err[0] = 0;
    if (t >= 0 && t < p->g->nt && p->poff[t] >= (int64_t)p->grp->shared && !is_streamed(p, t)) become_actor(p);
    float *x = ck_program_data(p, t);
    return x ? host_of(p, t, x, keep) : NULL;
}

int ck_program_write_end(ck_program *p, int t)
{
    const ck_tensor *tt = &p->g->t[t];
    if (p->own_at && p->poff[t] >= (int64_t)p->grp->shared && !is_streamed(p, t)) p->own_at[t] = p->grp->serial;
    if ((p->be->host || is_streamed(p, t)) && tt->dtype == CK_F32) return 0;
    float *x = ck_program_data(p, t);
    if (!x) return -1;
    int64_t n = ck_shape_numel(&tt->shape);
    const void *src = p->stage;
    void *h = (char *)p->stage + (size_t)n * sizeof(float);
    if (tt->dtype == CK_F8E4M3) {
        for (int64_t i = 0; i < n; i++) {
            const uint8_t v = ck_f8e4m3_encode(p->stage[i]);
            if ((v & 0x7f) == 0x7f && !isnan(p->stage[i])) { /* a number the cast would make NaN */
                snprintf(p->err, sizeof p->err,
                         "'%s' holds %g at element %lld, beyond what fp8 (e4m3) stores (largest %g): store it in "
                         "bf16 or fp32", tt->name ? tt->name : "a tensor", (double)p->stage[i], (long long)i,
                         (double)CK_F8E4M3_MAX);
                return -1;
            }
            ((uint8_t *)h)[i] = v;
        }
        src = h;
    } else if (tt->dtype == CK_U8) {
        for (int64_t i = 0; i < n; i++) {
            const float v = p->stage[i];
            if (!(v >= 0.0f && v <= 255.0f && v == floorf(v))) {
                snprintf(p->err, sizeof p->err, "'%s' holds %g at element %lld: its values are bytes (0 to 255)",
                         tt->name ? tt->name : "a tensor", (double)v, (long long)i);
                return -1;
            }
            ((uint8_t *)h)[i] = (uint8_t)v;
        }
        src = h;
    } else if (tt->dtype == CK_F16) {
        for (int64_t i = 0; i < n; i++) {
            const uint16_t v = ck_f16_from_f32(p->stage[i]);
            if (!ck_f16_finite(v) && isfinite(p->stage[i])) { /* a number the cast would make inf */
                snprintf(p->err, sizeof p->err,
                         "'%s' holds %g at element %lld, beyond what fp16 stores (largest %g): store it in bf16 "
                         "or fp32", tt->name ? tt->name : "a tensor", (double)p->stage[i], (long long)i,
                         (double)CK_F16_MAX);
                return -1;
            }
            ((uint16_t *)h)[i] = v;
        }
        src = h;
    } else if (tt->dtype != CK_F32) {
        ck_bf16_store((uint16_t *)h, p->stage, n);
        src = h;
    }
    if (is_streamed(p, t)) {
        memcpy(x, src, ck_tensor_bytes(tt));
        return 0;
    }
    p->be->enter();
    return p->be->upload(x, src, ck_tensor_bytes(tt)) ? copy_failed(p, t, "writing") : 0;
}
