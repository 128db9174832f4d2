/* The compiler's planning passes (plan/compile.h). */
#include "plan/compile.h"
#include "plan/evaluate.h"
#include "plan/offload.h"
#include "util/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void ck_plan_precision(ck_graph *g, ck_dtype storage, ck_dtype frozen, int loss)
{
    if (storage == CK_F32 && frozen == CK_F32) return;
    /* Kernels compute in fp32: the executor converts narrow operands around
     * an op unless the backend has a 16-bit kernel for it (ck_plan_entry_kernel_type). */
    for (int t = 0; t < g->nt; t++) {
        ck_kind k = g->t[t].kind;
        int nd = g->t[t].node;
        /* the optimizer's own tensors (clipped gradients) stay fp32 too */
        if (k == CK_KIND_FROZEN)
            g->t[t].dtype = frozen != CK_F32 ? frozen : storage;
        else if (k == CK_KIND_ACT && t != loss && !(nd >= 0 && g->n[nd].phase == CK_PHASE_OPTIMIZER))
            g->t[t].dtype = storage;
        /* a reshape shares its input's buffer, so it keeps its input's type */
        if (nd >= 0 && g->n[nd].op == CK_OP_RESHAPE) g->t[t].dtype = g->t[g->n[nd].in[0]].dtype;
    }
}

/* Nodes that the sinks need, in graph order (graph order is topological). */
static int cut_list(const ck_graph *g, const int *sink_nodes, int nsinks, int max_phase, int *list)
{
    char *need = calloc((size_t)(g->nn ? g->nn : 1), 1);
    if (!need) return -1;
    for (int i = 0; i < nsinks; i++)
        if (sink_nodes[i] >= 0) need[sink_nodes[i]] = 1;
    for (int i = g->nn - 1; i >= 0; i--) {
        if (!need[i] || (int)g->n[i].phase > max_phase) {
            need[i] = 0;
            continue;
        }
        for (int j = 0; j < g->n[i].nin; j++) {
            int pn = g->t[g->n[i].in[j]].node;
            if (pn >= 0) need[pn] = 1;
        }
    }
    int n = 0;
    for (int i = 0; i < g->nn; i++)
        if (need[i]) list[n++] = i;
    free(need);
    return n;
}

/* an upper bound on the host bytes of a plan of n entries over nt tensors,
 * with up to extra recomputed entries (each one copy) */
static size_t plan_estimate(int n, int nt, int extra)
{
    ck_plan pl = {0};
    pl.ops = (ck_op_ref *)&pl; /* ck_plan_host_bytes counts only a plan that has ops */
    pl.n = n + extra;
    pl.ntensors = nt + extra;
    return ck_plan_host_bytes(&pl);
}

static double thread_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the streamed weights marked CK_OFFLOAD in mark (ck_offload_schedule streams them) */
static void mark_streamed(const ck_plan_in *in, unsigned char *mark)
{
    for (int t = 0; in->streamed && t < in->g->nt; t++)
        if (in->streamed[t]) mark[t] = CK_OFFLOAD;
}

/* the most bytes the streamed weights' device copies hold at once in the
 * list of the n nodes of list under none; (size_t)-1 out of memory */
static size_t none_copies(const ck_plan_in *in, const int *list, int n)
{
    ck_plan pl = {0};
    unsigned char *mark = calloc((size_t)in->g->nt, 1);
    size_t most = (size_t)-1;
    if (mark && !ck_schedule(&pl, in->g, list, n, NULL)) {
        mark_streamed(in, mark);
        if (ck_offload_schedule(&pl, in->g, mark, in->retain, in->prefetch) >= 0)
            most = ck_offload_stream_copies_most(&pl, in->g);
    }
    ck_plan_free(&pl);
    free(mark);
    return most;
}

/* the list of the n nodes of list with the recompute marks of marks (NULL:
 * none) scheduled, then with xfers its transfers (CK_OFFLOAD marks,
 * streamed weights among them), and placed; 0, or -1 out of memory (pl
 * freed) */
static int plan_marked(const ck_plan_in *in, const int *list, int n, const unsigned char *marks, int xfers, ck_plan *pl)
{
    const ck_graph *g = in->g;
    unsigned char *rmask = xfers && marks ? malloc((size_t)g->nt) : NULL;
    if (xfers && marks && !rmask) return -1;
    for (int t = 0; rmask && t < g->nt; t++) rmask[t] = marks[t] == 1;
    const int bad = ck_schedule(pl, g, list, n, xfers ? rmask : marks) ||
                    (xfers && ck_offload_schedule(pl, g, marks, in->retain, in->prefetch) < 0) ||
                    ck_plan_memory(pl, g, in->poff, in->persistent, in->retain, in->be);
    free(rmask);
    if (bad) ck_plan_free(pl);
    return bad ? -1 : 0;
}

/* The decision into recompute (its thread time and none's peak into info):
 * 0, or 1 refused (err says why). */
static int decide_marks(const ck_plan_in *in, ck_decide_ctx *dc, unsigned char *recompute, ck_step_info *info,
                        char *err, size_t errlen)
{
    const double t0 = thread_seconds();
    dc->report->budget = 0;
    if (in->decide(in->decide_ud, dc, recompute, err, errlen)) return 1;
    info->decide_seconds += thread_seconds() - t0;
    info->none_peak = dc->report->none_peak;
    return 0;
}

/* A refusal's figures are the list's: err says what the streamed weights'
 * device copies took from the budget, or add under none. 0, or -1 out of memory. */
static int refusal_note(const ck_plan_in *in, const ck_decide_ctx *dc, const int *list, int n, char *err,
                        size_t errlen)
{
    const size_t at = strlen(err);
    if (dc->cut) {
        snprintf(err + at, errlen - at, " (the budget less %.1f MiB for the streamed weights' device copies)",
                 dc->cut / 1048576.0);
    } else if (in->streamed) {
        const size_t most = none_copies(in, list, n);
        if (most == (size_t)-1) return -1;
        char size[64];
        ck_mem_text(most, size, sizeof size);
        snprintf(err + at, errlen - at, " (the streamed weights' device copies not counted: under none they hold %s "
                 "at once)", size);
    }
    return 0;
}

/* The transfers the marks ask for: offloaded activations (what the policy
 * keeps goes to host memory between its uses; what no later entry reads
 * stays: ck_offload_schedule) and the streamed weights. The entries the
 * marks add into *extra, the offloaded ones into *offloads. */
static void mark_transfers(const ck_plan_in *in, const ck_decide_ctx *dc, unsigned char *recompute, int *extra,
                           int *offloads)
{
    for (int k = 0; in->offload == CK_OFFLOAD_ACTIVATIONS && k < dc->ncand; k++)
        if (!recompute[dc->cand[k]]) recompute[dc->cand[k]] = CK_OFFLOAD;
    if (in->streamed) mark_streamed(in, recompute);
    *extra = *offloads = 0;
    for (int t = 0; recompute && t < in->g->nt; t++) {
        *extra += recompute[t] != 0;
        *offloads += recompute[t] == CK_OFFLOAD;
    }
}

/* The list with the marks scheduled, its transfers and placed, into tried:
 * from the decision's evaluator (which reuses the placement it made last),
 * else (offloads, or no decision) in full. The evaluator is freed. 0, or -1
 * out of memory. */
static int plan_list(const ck_plan_in *in, ck_decide_ctx *dc, const int *list, int n, const unsigned char *recompute,
                     int offloads, ck_plan *tried, ck_step_info *info)
{
    const double t0 = thread_seconds();
    if (offloads) {
        ck_evaluator_free(dc->ev);
        dc->ev = NULL;
    }
    const int rc = dc->ev ? ck_evaluator_plan(dc->ev, recompute, tried)
                          : plan_marked(in, list, n, recompute, offloads, tried);
    info->plan_seconds += thread_seconds() - t0;
    ck_evaluator_free(dc->ev);
    dc->ev = NULL;
    return rc;
}

/* The streamed weights' device copies are not in the list a decision sees:
 * where the plan with them passes the budget the decision aimed under,
 * ck_plan_step decides again with that budget cut by the excess, or by the
 * most the copies hold at once where that is more, then between the largest
 * cut that missed and the smallest that fit; the plan is the last that fit. */
typedef struct cuts {
    int have;           /* the plan holds a plan that fits */
    size_t missed, fit; /* cuts: the largest that missed, the smallest that fit (have) */
    size_t aim, over;   /* the budget aimed under; the last plan's peak that passed it */
} cuts;

/* tried, made under the cut, against the budget aimed under (none: it
 * fits): kept as *pl where it fits, else freed, with the next cut (the
 * excess, or the most the copies hold at once where that is more) in
 * *next. 0, or -1 out of memory. */
static int judge_cut(cuts *k, size_t cut, const ck_graph *g, ck_plan *tried, ck_plan *pl, size_t *next)
{
    if (!k->aim || tried->peak <= k->aim) {
        ck_plan_free(pl);
        *pl = *tried;
        k->have = 1;
        k->fit = cut;
        return 0;
    }
    k->missed = cut;
    k->over = tried->peak;
    *next = cut + (tried->peak - k->aim);
    const size_t most = ck_offload_stream_copies_most(tried, g);
    ck_plan_free(tried);
    if (most == (size_t)-1) return -1;
    if (most > *next) *next = most;
    return 0;
}

int ck_plan_step(const ck_plan_in *in, const int *sinks, int nsinks, ck_plan *pl, ck_step_info *info, size_t *held,
                 char *err, size_t errlen)
{
    static const char what[] = "the training step's op list and plan";
    const ck_graph *g = in->g;
    int *list = malloc(sizeof(int) * (size_t)(g->nn + 1)), *cand = NULL;
    unsigned char *recompute = NULL;
    ck_decide_report report = {0};
    ck_decide_ctx dc = {0};
    int rc = -1;
    *pl = (ck_plan){0};
    *info = (ck_step_info){0};
    if (!list) goto oom;
    const int n = cut_list(g, sinks, nsinks, CK_PHASE_OPTIMIZER, list);
    if (n < 0) goto oom;
    /* with a policy, one evaluator for its trials and the plan: the
     * decision it placed last is not placed again */
    dc = (ck_decide_ctx){.g = g, .nodes = list, .n = n, .poff = in->poff, .persistent = in->persistent,
                         .retain = in->retain, .be = in->be, .offload = in->offload == CK_OFFLOAD_AUTO,
                         .prefetch = in->prefetch, .speed = in->speed ? in->speed : ck_cost_backend_speed(in->be),
                         .why = info->why, .whylen = sizeof info->why, .report = in->report ? in->report : &report};
    if (in->decide && !(dc.ev = ck_evaluator_new(&dc))) goto oom;
    if (in->decide || in->offload == CK_OFFLOAD_ACTIVATIONS || in->streamed) {
        recompute = calloc((size_t)g->nt, 1);
        cand = malloc(sizeof(int) * (size_t)g->nt);
        if (!recompute || !cand) goto oom;
        dc.cand = cand;
        dc.ncand = ck_plan_saved_activations(g, cand);
    }
    cuts k = {0};
    for (int tries = 1;; tries++) {
        if (in->decide && decide_marks(in, &dc, recompute, info, err, errlen)) {
            if (k.have) break; /* a larger cut fit: its plan */
            if (refusal_note(in, &dc, list, n, err, errlen)) goto oom;
            goto fail;
        }
        int extra, offloads;
        mark_transfers(in, &dc, recompute, &extra, &offloads);
        if (ck_mem_hold(in->budget, held, *held + plan_estimate(n, g->nt, (offloads ? 4 : 2) * extra), what, err,
                        errlen))
            goto fail;
        ck_plan tried = {0};
        if (plan_list(in, &dc, list, n, recompute, offloads, &tried, info)) goto oom;
        k.aim = in->decide && in->streamed ? dc.report->budget : 0;
        size_t next = 0;
        if (judge_cut(&k, dc.cut, g, &tried, pl, &next)) goto oom;
        if (ck_mem_hold(in->budget, held, ck_plan_host_bytes(pl), what, err, errlen)) goto fail;
        /* done: no budget to meet, it fits uncut, out of tries, or the cuts
         * that missed and fit are within 1/128 of the budget */
        if (!k.aim || (k.have && !k.fit) || tries == CK_STREAM_TRIES || (k.have && k.fit - k.missed <= k.aim / 128))
            break;
        dc.cut = k.have ? k.missed + (k.fit - k.missed) / 2 : next;
        memset(recompute, 0, (size_t)g->nt);
        if (in->decide && !(dc.ev = ck_evaluator_new(&dc))) goto oom;
    }
    if (!k.have) {
        snprintf(err, errlen, "the plan with the streamed weights' device copies peaks at %.1f MiB (%zu bytes), over "
                 "the %.1f MiB it aimed under, after %d decisions, each with the budget cut by what the copies added",
                 k.over / 1048576.0, k.over, k.aim / 1048576.0, CK_STREAM_TRIES);
        goto fail;
    }
    rc = 0;
    goto done;
oom:
    snprintf(err, errlen, "out of memory while compiling");
fail:
    ck_plan_free(pl);
    ck_mem_hold(in->budget, held, 0, what, err, errlen);
done:
    ck_evaluator_free(dc.ev);
    free(list);
    free(cand);
    free(recompute);
    return rc;
}

int ck_plan_forward(const ck_plan_in *in, const int *sinks, int nsinks, ck_plan *pl, size_t *held, char *err,
                    size_t errlen)
{
    static const char what[] = "the forward pass's op list and plan";
    const ck_graph *g = in->g;
    int *list = malloc(sizeof(int) * (size_t)(g->nn + 1));
    unsigned char *mark = in->streamed ? calloc((size_t)g->nt, 1) : NULL;
    *pl = (ck_plan){0};
    int n = -1;
    if (list && (!in->streamed || mark)) n = cut_list(g, sinks, nsinks, CK_PHASE_FORWARD, list);
    /* the forward pass streams too (plans that use no streamed weight are left as they are) */
    if (mark) mark_streamed(in, mark);
    int rc = n < 0 ? -2 : ck_mem_hold(in->budget, held, *held + plan_estimate(n, g->nt, 0), what, err, errlen);
    if (rc == 0 && plan_marked(in, list, n, mark, mark != NULL, pl)) rc = -2;
    if (rc == 0) rc = ck_mem_hold(in->budget, held, ck_plan_host_bytes(pl), what, err, errlen);
    if (rc == -2) snprintf(err, errlen, "out of memory while compiling");
    if (rc) {
        ck_plan_free(pl);
        ck_mem_hold(in->budget, held, 0, what, err, errlen);
    }
    free(list);
    free(mark);
    return rc ? -1 : 0;
}
