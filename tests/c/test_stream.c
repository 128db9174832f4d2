/* Streamed frozen weights (ck_compile_opts.stream, vm/plan/offload.c) on the
 * CPU backend, on a chain of blocks "blocks.<l>" whose frozen weight a
 * trainable bias follows:
 *  - streamed_weights_leave_the_arena: the streamed blocks' weights have no
 *    bytes in the persistent region; they lie in the group's pinned weights,
 *    whose bytes are theirs;
 *  - every_use_reads_a_copy_waited_for: no kernel entry reads a streamed
 *    weight; each copy in reads one and writes a device copy, waited for
 *    before any entry reads that copy; one copy per group of uses (the
 *    forward part, the entries after it), in the training and the forward
 *    lists;
 *  - streamed_training_is_bitwise_kept_training: three AdamW steps, with and
 *    without recompute, in fp32 and with bf16 storage over an fp8 base, leave
 *    every parameter bitwise where keeping the weights leaves it, and the
 *    measured high-water mark is the planned peak;
 *  - a logging list (statistics of gradients and blocks) streams as the
 *    training list does: the same statistics and parameters as kept;
 *  - a_streamed_weight_reads_and_writes_from_the_host: read back as kept,
 *    and a value written trains as it does kept;
 *  - a_program_sharing_the_group_streams_what_the_group_streams: its forward
 *    list brings the group's streamed weights in, and computes what a kept
 *    one computes;
 *  - updates_stream_their_weights_and_state: with stream_trainable the
 *    streamed blocks' trainable weights and their optimizer state, with
 *    offload_optimizer every optimizer state, live in pinned memory; each
 *    group of uses (forward, backward, the update) reads a device copy, and
 *    an update's copy is written back after it and held until that copy's
 *    wait (fused updates share the copy backward read); three AdamW steps (recompute, bf16 over fp8, fused updates) leave
 *    the parameters and optimizer state bitwise where keeping them leaves
 *    them, the high-water mark the plan's; refused with data parallel. */
#include "plan/offload.h"
#include "run/program.h"

#include "check.h"
#include "program_tensors.h"

#include <stdlib.h>
#include <string.h>

enum { BLOCKS = 3 };

static int node(ck_graph *g, enum ck_op op, const int *in, int nin)
{
    ck_op_params p = {{0}, {0}};
    ck_shape outs[CK_MAX_OUT] = {{-1, {0}}, {-1, {0}}, {-1, {0}}};
    int ids[CK_MAX_OUT];
    return ck_graph_node(g, op, in, nin, &p, outs, NULL, ids, "m.lua:3") < 0 ? -1 : ids[0];
}

/* x -> per block: linear by the frozen blocks.<l>.weight plus the trainable
 * blocks.<l>.bias, silu between; MSE against a target. *out: the last block's output */
static ck_graph *chain(int *loss, int *out)
{
    ck_graph *g = ck_graph_new();
    ck_shape sx = {2, {4, 16}}, sw = {2, {16, 16}}, sb = {1, {16}};
    int h = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "m.lua:1");
    g->t[h].init = CK_INIT_NORMAL, g->t[h].init_a = 0, g->t[h].init_b = 1;
    const int target = ck_graph_leaf(g, CK_KIND_INPUT, "target", &sx, "m.lua:1");
    g->t[target].init = CK_INIT_NORMAL, g->t[target].init_a = 0, g->t[target].init_b = 1;
    for (int l = 0; l < BLOCKS; l++) {
        char name[32];
        snprintf(name, sizeof name, "blocks.%d", l);
        ck_graph_set_scope(g, name);
        snprintf(name, sizeof name, "blocks.%d.weight", l);
        const int w = ck_graph_leaf(g, CK_KIND_FROZEN, name, &sw, "m.lua:2");
        g->t[w].init = CK_INIT_NORMAL, g->t[w].init_a = 0, g->t[w].init_b = 0.3f;
        snprintf(name, sizeof name, "blocks.%d.bias", l);
        const int b = ck_graph_leaf(g, CK_KIND_PARAM, name, &sb, "m.lua:2");
        g->t[b].init = CK_INIT_NORMAL, g->t[b].init_a = 0, g->t[b].init_b = 0.1f;
        const int in[3] = {h, w, b};
        h = node(g, CK_OP_LINEAR, in, 3);
        if (l + 1 < BLOCKS) h = node(g, CK_OP_SILU, &h, 1);
    }
    ck_graph_set_scope(g, "");
    *out = h;
    const int in[2] = {h, target};
    *loss = node(g, CK_OP_MSE_LOSS, in, 2);
    return g;
}

static int recompute_all(void *ud, const ck_decide_ctx *c, unsigned char *mark, char *err, size_t errlen)
{
    (void)ud, (void)err, (void)errlen;
    for (int k = 0; k < c->ncand; k++) mark[c->cand[k]] = 1;
    return 0;
}

static const char *const streamed_blocks[] = {"blocks.0", "blocks.2"};

typedef struct how {
    int stream, recompute;
    ck_dtype storage, frozen;
    int stats;     /* the logging lists of every statistic, planned into the arena */
    int trainable; /* the streamed blocks' trainable weights too (stream_trainable) */
    int optim;     /* every optimizer state in pinned memory (offload_optimizer) */
    int fused;     /* updates inside backward */
} how;

static const char *const stat_blocks[] = {"blocks.*"};

static ck_program *compile(const ck_graph *g, int loss, how h, char *err)
{
    ck_compile_opts o = {0};
    o.loss = loss;
    o.optim = CK_OPTIM_ADAMW;
    o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.999f, o.eps = 1e-8f;
    o.seed = 5;
    o.storage = h.storage, o.frozen = h.frozen;
    o.prefetch = 2;
    if (h.recompute) o.decide = recompute_all;
    if (h.stream) o.stream = streamed_blocks, o.nstream = 2;
    if (h.stats) o.stats = CK_STATS_ALL, o.stat_blocks = stat_blocks, o.nstat_blocks = 1;
    o.stream_trainable = h.trainable, o.offload_optimizer = h.optim, o.fused_backward = h.fused;
    return ck_compile(g, &o, err, 512);
}

/* the bytes of every tensor of a kind (parameters, optimizer state), read back in graph order */
/* the list's transfers of streamed weights against what ck_offload_schedule states:
 * *copies gets the copies in of all streamed weights */
static int uses_sound(const ck_plan *pl, const ck_program *p, int *copies)
{
    const ck_graph *g = p->g;
    int turn = 0, ok = 1, total = 0;
    while (turn < pl->n && pl->ops[turn].phase == CK_PHASE_FORWARD) turn++;
    for (int t = 0; t < g->nt; t++) {
        if (!p->streamed || !p->streamed[t]) continue;
        int ins = 0, fwd = 0, later = 0;
        for (int i = 0; i < pl->n && ok; i++) {
            const ck_op_ref *r = &pl->ops[i];
            if (!r->xfer) {
                for (int j = 0; j < r->nin; j++) ok &= r->in[j] != t;
                continue;
            }
            if (r->xfer != CK_XFER_IN || r->in[0] != t) continue;
            ins++;
            fwd += i < turn, later += i >= turn;
            const int c = r->out[0];
            ok &= pl->loc[c] == CK_LOC_BACK && pl->origin[c] == t && pl->off[c] >= 0;
            int w = i + 1, read = 0;
            while (w < pl->n && !(pl->ops[w].xfer == CK_XFER_IN_WAIT && pl->ops[w].slot == r->slot)) {
                for (int j = 0; j < pl->ops[w].nin; j++) ok &= pl->ops[w].in[j] != c;
                w++;
            }
            ok &= w < pl->n;
            for (int k = w + 1; k < pl->n; k++)
                for (int j = 0; j < pl->ops[k].nin; j++) read |= pl->ops[k].in[j] == c;
            ok &= read;
        }
        /* a frozen weight comes in for the forward part and once after it; a trainable one for the forward
         * part, backward and its update; an optimizer state for its update alone */
        const ck_kind kind = g->t[t].kind;
        if (!ins && kind == CK_KIND_OPTSTATE) continue; /* a forward pass reads no optimizer state */
        ok &= pl->loc && pl->loc[t] == CK_LOC_HOST && fwd == (kind != CK_KIND_OPTSTATE) &&
              later <= (kind == CK_KIND_PARAM ? 2 : 1);
        total += ins;
    }
    *copies = total;
    return ok;
}

/* every streamed tensor the list writes (an update, in place) is written
 * in a device copy, which is copied out to it after its last write and
 * held until the wait for that copy: no kernel entry writes a streamed
 * tensor, or touches the copy after its copy out. *outs: the copies out. */
static int writes_sound(const ck_plan *pl, const ck_program *p, int *outs)
{
    const ck_graph *g = p->g;
    int ok = 1, total = 0;
    for (int t = 0; t < g->nt; t++) {
        if (!p->streamed || !p->streamed[t]) continue;
        int written = 0, nout = 0;
        for (int i = 0; i < pl->n && ok; i++) {
            const ck_op_ref *r = &pl->ops[i];
            if (!r->xfer) {
                for (int j = 0; j < r->nout; j++) ok &= r->out[j] != t;
                for (int j = 0; j < r->nout; j++) written |= r->out[j] >= 0 && pl->origin[r->out[j]] == t;
                continue;
            }
            if (r->xfer != CK_XFER_OUT || r->out[0] != t) continue;
            nout++;
            const int c = r->in[0];
            ok &= pl->origin[c] == t && pl->loc[c] == CK_LOC_BACK && written;
            int w = i + 1;
            for (; w < pl->n && !(pl->ops[w].xfer == CK_XFER_OUT_WAIT && pl->ops[w].slot == r->slot); w++)
                for (int j = 0; j < pl->ops[w].nin + pl->ops[w].nout; j++)
                    ok &= (j < pl->ops[w].nin ? pl->ops[w].in[j] : pl->ops[w].out[j - pl->ops[w].nin]) != c;
            ok &= w < pl->n && pl->ops[w].in[0] == c;
        }
        ok &= nout == written;
        total += nout;
    }
    *outs = total;
    return ok;
}

/* copies in of streamed trainable weights after the forward part: per
 * weight, one for backward and one for its update, or one for both where
 * the update runs inside backward (fused updates) */
static int later_param_copies(const ck_plan *pl, const ck_program *p)
{
    int turn = 0, n = 0;
    while (turn < pl->n && pl->ops[turn].phase == CK_PHASE_FORWARD) turn++;
    for (int i = turn; i < pl->n; i++)
        n += pl->ops[i].xfer == CK_XFER_IN && pl->ops[i].in[0] < p->g->nt &&
             p->g->t[pl->ops[i].in[0]].kind == CK_KIND_PARAM;
    return n;
}

int main(void)
{
    char err[512];
    int loss, out;
    ck_graph *g = chain(&loss, &out);
    const how kept_f32 = {0, 0, CK_F32, CK_F32, 0, 0, 0, 0};

    /* where the streamed weights live */
    {
        ck_program *k = compile(g, loss, kept_f32, err), *s = compile(g, loss, (how){1, 0, CK_F32, CK_F32, 0, 0, 0, 0}, err);
        if (!k || !s) {
            printf("FAIL compile: %s\n", err);
            return 1;
        }
        size_t wbytes = 0;
        int inside = 1;
        for (int t = 0; t < g->nt; t++)
            if (s->streamed && s->streamed[t]) {
                wbytes += (ck_tensor_bytes(&g->t[t]) + 63) / 64 * 64;
                inside &= s->poff[t] >= 0 && (size_t)s->poff[t] + ck_tensor_bytes(&g->t[t]) <= s->grp->weight_bytes;
            }
        char name[200];
        snprintf(name, sizeof name, "streamed_weights_leave_the_arena: persistent %zu -> %zu, pinned weights %zu",
                 k->persistent, s->persistent, s->grp->weight_bytes);
        /* blocks.0's weight has no use after the forward part (its input needs no gradient), blocks.2's has */
        check(name, wbytes == 2 * 1024 && s->persistent + wbytes == k->persistent && s->grp->weight_bytes == wbytes &&
                        inside && s->grp->weights != NULL && s->train.stream_bytes == 3 * 1024 &&
                        s->eval.stream_bytes == 2 * 1024,
              0);
        int ct = 0, ce = 0;
        const int st = uses_sound(&s->train, s, &ct), se = uses_sound(&s->eval, s, &ce);
        snprintf(name, sizeof name, "every_use_reads_a_copy_waited_for: %d copies in a step, %d a forward pass", ct, ce);
        check(name, st && se && ct == 3 && ce == 2, 0);
        ck_program_free(k);
        ck_program_free(s);
    }

    /* bitwise, measured */
    const how cases[4][2] = {
        {{0, 0, CK_F32, CK_F32, 0, 0, 0, 0}, {1, 0, CK_F32, CK_F32, 0, 0, 0, 0}},
        {{0, 1, CK_F32, CK_F32, 0, 0, 0, 0}, {1, 1, CK_F32, CK_F32, 0, 0, 0, 0}},
        {{0, 0, CK_BF16, CK_F8E4M3, 0, 0, 0, 0}, {1, 0, CK_BF16, CK_F8E4M3, 0, 0, 0, 0}},
        {{0, 1, CK_BF16, CK_F8E4M3, 0, 0, 0, 0}, {1, 1, CK_BF16, CK_F8E4M3, 0, 0, 0, 0}},
    };
    for (int c = 0; c < 4; c++) {
        ck_program *k = compile(g, loss, cases[c][0], err), *s = compile(g, loss, cases[c][1], err);
        size_t nk = 0, ns = 0, hwk = 0, hws = 0;
        int ran = k && s;
        for (int step = 0; ran && step < 3; step++)
            ran = !ck_program_step_measured(k, &hwk) && !ck_program_step_measured(s, &hws);
        unsigned char *a = ran ? tensors_of(k, CK_KIND_PARAM, &nk) : NULL;
        unsigned char *b = ran ? tensors_of(s, CK_KIND_PARAM, &ns) : NULL;
        char name[240];
        snprintf(name, sizeof name,
                 "streamed_training_is_bitwise_kept_training (%s%s): high-water %zu of plan %zu; kept %zu of %zu",
                 cases[c][0].recompute ? "recompute, " : "", c >= 2 ? "bf16 over fp8" : "fp32", hws, s ? s->train.peak : 0,
                 hwk, k ? k->train.peak : 0);
        /* the high-water mark is the plan's peak, or as far below it as the kept list's is (a workspace of
         * bf16 recompute that the CPU's kernels leave unwritten): streaming adds no gap */
        check(name, ran && nk == ns && !memcmp(a, b, nk) && hws <= s->train.peak &&
                        s->train.peak - hws == k->train.peak - hwk && (c != 0 || hws == s->train.peak), 0);
        if (!ran) printf("     %s\n", k && s ? (k->err[0] ? k->err : s->err) : err);
        free(a);
        free(b);
        ck_program_free(k);
        ck_program_free(s);
    }

    /* the logging lists (statistics of gradients and blocks) stream as the training list does */
    {
        how hk = cases[1][0], hs = cases[1][1];
        hk.stats = hs.stats = 1;
        ck_program *k = compile(g, loss, hk, err), *s = compile(g, loss, hs, err);
        int ok = k && s;
        ck_run_opts ro = {CK_STATS_ALL, 0, 1};
        ck_run_info rk = {0}, rs = {0};
        int copies = 0;
        int train_copies = 0; /* recompute reads blocks.0's weight after the forward part too: 4 */
        ok = ok && uses_sound(&s->logplan[CK_STATS_ALL], s, &copies) && uses_sound(&s->train, s, &train_copies) &&
             copies == train_copies && copies == 4;
        for (int step = 0; ok && step < 2; step++)
            ok = !ck_program_run(k, &ro, &rk) && !ck_program_run(s, &ro, &rs);
        size_t nk = 0, ns = 0;
        unsigned char *a = ok ? tensors_of(k, CK_KIND_PARAM, &nk) : NULL;
        unsigned char *b = ok ? tensors_of(s, CK_KIND_PARAM, &ns) : NULL;
        /* every statistic's values, as kept */
        for (int i = 0; ok && i < s->st.nstats; i++) {
            const int o = s->st.stats[i].out;
            const size_t bytes = ck_tensor_bytes(&s->g->t[o]);
            float *x = malloc(bytes);
            const float *xk = ck_program_read(k, o);
            ok = xk != NULL;
            if (ok) memcpy(x, xk, bytes);
            const float *xs = ok ? ck_program_read(s, o) : NULL;
            ok = xs && !memcmp(x, xs, bytes);
            free(x);
        }
        char name[240];
        snprintf(name, sizeof name, "a logging list streams as the training list: statistics and parameters as kept "
                 "(%d statistics), high-water %zu of plan %zu", s ? s->st.nstats : 0, rs.high_water,
                 s ? s->logplan[CK_STATS_ALL].peak : 0);
        check(name, ok && s->st.nstats > 0 && nk == ns && !memcmp(a, b, nk) &&
                        rs.high_water == s->logplan[CK_STATS_ALL].peak, 0);
        free(a);
        free(b);
        ck_program_free(k);
        ck_program_free(s);
    }

    /* trainable weights and optimizer state streamed: each update brings its
     * weight and state in and copies them back out; training is bitwise
     * what keeping them trains, and the high-water mark is the plan */
    {
        static const struct {
            const char *what;
            how kept, moved;
            int streamed, outs; /* tensors streamed, copies out per step */
            int later;          /* copies in of the trainable weights after the forward part */
        } tc[] = {
            /* blocks.0 and .2: frozen weight, bias and its two moments each (8); 3 copies out per block;
             * each bias in for its update (backward does not read a bias; recompute does) */
            {"stream_trainable", {0, 0, CK_F32, CK_F32, 0, 0, 0, 0}, {1, 0, CK_F32, CK_F32, 0, 1, 0, 0}, 8, 6, 2},
            /* the three biases' moments (6), each copied out once */
            {"offload_optimizer", {0, 0, CK_F32, CK_F32, 0, 0, 0, 0}, {0, 0, CK_F32, CK_F32, 0, 0, 1, 0}, 6, 6, 0},
            {"both, recompute", {0, 1, CK_F32, CK_F32, 0, 0, 0, 0}, {1, 1, CK_F32, CK_F32, 0, 1, 1, 0}, 10, 8, 4},
            {"both, bf16 over fp8", {0, 0, CK_BF16, CK_F8E4M3, 0, 0, 0, 0}, {1, 0, CK_BF16, CK_F8E4M3, 0, 1, 1, 0}, 10, 8,
             2},
            /* an update inside backward shares the copy its weight's recompute read: one each, not two */
            {"both, fused updates, recompute", {0, 1, CK_F32, CK_F32, 0, 0, 0, 1}, {1, 1, CK_F32, CK_F32, 0, 1, 1, 1}, 10,
             8, 2},
        };
        for (size_t c = 0; c < sizeof tc / sizeof tc[0]; c++) {
            ck_program *k = compile(g, loss, tc[c].kept, err), *s = compile(g, loss, tc[c].moved, err);
            int ran = k && s, nstreamed = 0, outs = 0, copies = 0;
            if (!ran) printf("     %s\n", err);
            size_t moved = 0;
            for (int t = 0; s && t < s->g->nt; t++)
                if (s->streamed && s->streamed[t]) nstreamed++, moved += (ck_tensor_bytes(&s->g->t[t]) + 63) / 64 * 64;
            const int planned = ran && writes_sound(&s->train, s, &outs) && uses_sound(&s->train, s, &copies) &&
                                uses_sound(&s->eval, s, &copies) && s->persistent + moved == k->persistent &&
                                s->grp->weight_bytes == moved && later_param_copies(&s->train, s) == tc[c].later;
            size_t hwk = 0, hws = 0;
            for (int step = 0; ran && step < 3; step++)
                ran = !ck_program_step_measured(k, &hwk) && !ck_program_step_measured(s, &hws);
            if (!ran && k && s) printf("     %s\n", k->err[0] ? k->err : s->err);
            size_t n[4] = {0};
            unsigned char *a = ran ? tensors_of(k, CK_KIND_PARAM, &n[0]) : NULL;
            unsigned char *b = ran ? tensors_of(s, CK_KIND_PARAM, &n[1]) : NULL;
            unsigned char *sa = ran ? tensors_of(k, CK_KIND_OPTSTATE, &n[2]) : NULL;
            unsigned char *sb = ran ? tensors_of(s, CK_KIND_OPTSTATE, &n[3]) : NULL;
            char name[300];
            snprintf(name, sizeof name,
                     "updates_stream_their_weights_and_state (%s): %d streamed, %d copies out; bitwise as kept; "
                     "high-water %zu of plan %zu (kept %zu of %zu); %d copies in of trained weights after the forward "
                     "part", tc[c].what, nstreamed, outs, hws,
                     s ? s->train.peak : 0, hwk, k ? k->train.peak : 0, s ? later_param_copies(&s->train, s) : 0);
            check(name, planned && ran && nstreamed == tc[c].streamed && outs == tc[c].outs && n[0] == n[1] &&
                            !memcmp(a, b, n[0]) && n[2] == n[3] && n[2] > 0 && !memcmp(sa, sb, n[2]) &&
                            hws <= s->train.peak && s->train.peak - hws == k->train.peak - hwk &&
                            (c != 1 || hws == s->train.peak),
                  0);
            free(a), free(b), free(sa), free(sb);
            ck_program_free(k);
            ck_program_free(s);
        }
    }

    /* data parallel keeps each rank's updates on its device: refused at compile, naming the option */
    {
        ck_compile_opts o = {0};
        o.loss = loss;
        o.optim = CK_OPTIM_ADAMW;
        o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.999f, o.eps = 1e-8f;
        o.world = 2, o.plan_only = 1;
        o.offload_optimizer = 1;
        ck_program *p = ck_compile(g, &o, err, sizeof err);
        int ok = !p && strstr(err, "offloading the optimizer state is not for data parallel training");
        ck_program_free(p);
        o.offload_optimizer = 0;
        p = ck_compile(g, &o, err, sizeof err); /* the same without it compiles */
        ok = ok && p;
        check("offload_optimizer with data parallel: refused at compile, naming it", ok, 0);
        if (!ok) printf("     %s\n", err);
        ck_program_free(p);
    }

    /* host reads and writes of a streamed weight */
    {
        ck_program *k = compile(g, loss, cases[2][0], err), *s = compile(g, loss, cases[2][1], err);
        const int w = ck_graph_find(g, "blocks.2.weight");
        int same = k && s && s->streamed[w];
        const size_t bytes = 256 * sizeof(float);
        float *rk = malloc(bytes);
        if (same) memcpy(rk, ck_program_read(k, w), bytes);
        same = same && !memcmp(rk, ck_program_read(s, w), bytes);
        for (int m = 0; m < 2 && same; m++) {
            ck_program *p = m ? s : k;
            float *x = ck_program_write_begin(p, w, 1);
            for (int i = 0; x && i < 256; i++) x[i] = x[i] * -0.5f + (float)(i % 7) * 0.0625f;
            same = x && !ck_program_write_end(p, w) && !ck_program_step(p);
        }
        size_t nk = 0, ns = 0;
        unsigned char *a = same ? tensors_of(k, CK_KIND_PARAM, &nk) : NULL;
        unsigned char *b = same ? tensors_of(s, CK_KIND_PARAM, &ns) : NULL;
        same = same && nk == ns && !memcmp(a, b, nk);
        float *ak = malloc(bytes);
        if (same) memcpy(ak, ck_program_read(k, w), bytes);
        same = same && !memcmp(ak, ck_program_read(s, w), bytes);
        check("a_streamed_weight_reads_and_writes_from_the_host: as kept (fp8), and a value written trains as kept",
              same, 0);
        free(rk), free(ak), free(a), free(b);

        /* a forward-only member of each group: the streamed group's streams the same weights */
        ck_compile_opts o = {0};
        o.loss = -1;
        o.outputs = &out;
        o.noutputs = 1;
        o.storage = CK_BF16, o.frozen = CK_F8E4M3;
        o.seed = 5;
        o.share = k;
        ck_program *fk = k ? ck_compile(g, &o, err, sizeof err) : NULL;
        o.share = s;
        ck_program *fs = s ? ck_compile(g, &o, err, sizeof err) : NULL;
        int copies = 0;
        int ok = fk && fs && fs->streamed && fs->streamed[w] && uses_sound(&fs->eval, fs, &copies) && copies == 2 &&
                 fs->persistent == s->persistent;
        ok = ok && !ck_program_forward(fk) && !ck_program_forward(fs);
        const size_t ob = fk ? ck_tensor_bytes(&fk->g->t[out]) : 0; /* its stored type: the program's */
        unsigned char *yk = malloc(ob);
        if (ok) memcpy(yk, ck_program_data(fk, out), ob);
        ok = ok && !memcmp(yk, ck_program_data(fs, out), ob);
        check("a_program_sharing_the_group_streams_what_the_group_streams, and computes what the kept group does", ok, 0);
        if (!fk || !fs) printf("     %s\n", err);
        free(yk);
        ck_program_free(fk);
        ck_program_free(fs);
        ck_program_free(k);
        ck_program_free(s);
    }
    ck_graph_free(g);
    return checks_done();
}
