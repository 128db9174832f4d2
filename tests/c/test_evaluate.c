/* The evaluator the checkpoint searches use (vm/plan/evaluate.c) gives, for
 * any decision, the numbers of the op list the scheduler makes for it: on
 * random differentiated graphs (linear layers on trainable and frozen
 * weights, activations, sums, products, reshapes that alias, norms, concats,
 * slices) and random decisions and retained tensors, its live peak equals
 * ck_plan_live_peak of ck_schedule's list, its exact peak equals
 * ck_plan_memory's, and its recompute FLOPs the list's, on both backends'
 * workspace rules; the plan it makes of a decision it placed, reusing the
 * placement, is the same plan to the byte. */
#include "plan/evaluate.h"
#include "run/program.h"

#include "check.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int node(ck_graph *g, enum ck_op op, const int *in, int nin, const ck_op_params *p, const ck_shape *want,
                int *out)
{
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (want) outs[0] = *want;
    const int v = ck_graph_node(g, op, in, nin, p, outs, NULL, ids, "model.lua:1");
    if (v >= 0 && out) *out = ids[0];
    return v;
}

/* a random model of width 8 on a batch of b rows: a pool of activations
 * that each new op draws its inputs from; the loss is the MSE of the last
 * one against a target */
static ck_graph *random_model(int b, int depth, int *loss)
{
    ck_graph *g = ck_graph_new();
    ck_shape sx = {2, {b, 8}}, sw = {2, {8, 8}}, sbias = {1, {8}};
    int pool[256], np = 0;
    pool[np++] = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "model.lua:1");
    const int target = ck_graph_leaf(g, CK_KIND_INPUT, "target", &sx, "model.lua:1");
    const int gamma = ck_graph_leaf(g, CK_KIND_FROZEN, "norm.weight", &sbias, "model.lua:1");
    const int beta = ck_graph_leaf(g, CK_KIND_FROZEN, "norm.bias", &sbias, "model.lua:1");
    for (int d = 0; d < depth && np < 250; d++) {
        const int a = pool[np - 1 - (int)(next() % (uint64_t)(np < 4 ? np : 4))];
        const int c = pool[next() % (uint64_t)np];
        ck_op_params p = {{0}, {0}};
        char name[32];
        int out = -1;
        switch (next() % 9) {
        case 0:
        case 1: {
            snprintf(name, sizeof name, "l%d.weight", d);
            const int w = ck_graph_leaf(g, next() % 2 ? CK_KIND_PARAM : CK_KIND_FROZEN, name, &sw, "model.lua:2");
            snprintf(name, sizeof name, "l%d.bias", d);
            const int bias = ck_graph_leaf(g, CK_KIND_PARAM, name, &sbias, "model.lua:2");
            const int in[3] = {a, w, bias};
            node(g, CK_OP_LINEAR, in, 3, &p, NULL, &out);
            break;
        }
        case 2: node(g, CK_OP_SILU, &a, 1, &p, NULL, &out); break;
        case 3: {
            const int in[2] = {a, c};
            node(g, CK_OP_ADD, in, 2, &p, NULL, &out);
            break;
        }
        case 4: {
            const int in[2] = {a, c};
            node(g, CK_OP_MUL, in, 2, &p, NULL, &out);
            break;
        }
        case 5: { /* through another shape and back: the planner aliases both */
            ck_shape s2 = {2, {2 * b, 4}};
            int mid = -1;
            node(g, CK_OP_RESHAPE, &a, 1, &p, &s2, &mid);
            node(g, CK_OP_SILU, &mid, 1, &p, NULL, &mid);
            node(g, CK_OP_RESHAPE, &mid, 1, &p, &sx, &out);
            break;
        }
        case 6: {
            const int in[3] = {a, gamma, beta};
            p.f[0] = 1e-5f;
            node(g, CK_OP_LAYER_NORM, in, 3, &p, NULL, &out);
            break;
        }
        case 7: { /* two halves joined */
            int lo = -1, hi = -1;
            p.i[0] = 1;
            p.i[1] = 0;
            p.i[2] = 4;
            node(g, CK_OP_SLICE, &a, 1, &p, NULL, &lo);
            p.i[1] = 4;
            node(g, CK_OP_SLICE, &c, 1, &p, NULL, &hi);
            const int in[2] = {lo, hi};
            p.i[0] = 1;
            node(g, CK_OP_CONCAT, in, 2, &p, NULL, &out);
            break;
        }
        default: node(g, CK_OP_GELU, &a, 1, &p, NULL, &out); break;
        }
        if (out >= 0) pool[np++] = out;
    }
    const int in[2] = {pool[np - 1], target};
    ck_op_params p = {{0}, {0}};
    node(g, CK_OP_MSE_LOSS, in, 2, &p, NULL, loss);
    return g;
}

int main(void)
{
    int graphs = 0, trials = 0, live_ok = 1, exact_ok = 1, flops_ok = 1, plan_ok = 1, turn_ok = 1, turn_some = 0, track_ok = 1, tracked = 0, built = 1;
    char name[160];
    for (int round = 0; round < 60; round++) {
        int loss = -1;
        ck_graph *g = random_model(1 + (int)(next() % 3), 8 + (int)(next() % 40), &loss);
        if (loss < 0 || ck_autodiff(g, loss, -1)) {
            built = 0;
            ck_graph_free(g);
            continue;
        }
        graphs++;
        int *nodes = malloc(sizeof(int) * (size_t)g->nn), *cand = malloc(sizeof(int) * (size_t)g->nt);
        int64_t *poff = malloc(sizeof(int64_t) * (size_t)g->nt);
        int *retain = calloc((size_t)g->nt, sizeof(int));
        unsigned char *mark = calloc((size_t)g->nt, 1);
        for (int i = 0; i < g->nn; i++) nodes[i] = i;
        size_t persistent = 0;
        for (int t = 0; t < g->nt; t++) {
            poff[t] = -1;
            if (ck_is_persistent(g->t[t].kind)) {
                poff[t] = (int64_t)persistent;
                persistent += (ck_tensor_bytes(&g->t[t]) + 63) / 64 * 64;
            }
            retain[t] = next() % 16 == 0;
        }
        const int ncand = ck_saved_activations(g, cand);
        const ck_backend *be = round % 2 ? ck_backend_cpu() : ck_backend_cuda_plan();
        ck_decide_ctx c = {.g = g, .nodes = nodes, .n = g->nn, .cand = cand, .ncand = ncand, .poff = poff,
                           .persistent = persistent, .retain = round % 3 ? retain : NULL, .be = be};
        ck_evaluator *ev = ck_evaluator_new(&c);
        for (int trial = 0; ev && trial < 12; trial++) {
            const int density = (int)(next() % 4);
            memset(mark, 0, (size_t)g->nt);
            for (int k = 0; k < ncand; k++) mark[cand[k]] = (int)(next() % 4) < density;
            ck_plan pl;
            if (ck_schedule(&pl, g, nodes, g->nn, mark)) break;
            const size_t live = ck_plan_live_peak(&pl, g, persistent, c.retain, be);
            if (ck_plan_memory(&pl, g, poff, persistent, c.retain, be)) {
                ck_plan_free(&pl);
                break;
            }
            size_t elive, epeak;
            double eflops, xflops;
            ck_evaluate(ev, mark, 0, &elive, &eflops);
            ck_evaluate(ev, mark, 1, &epeak, &xflops);
            if (elive != live && live_ok) {
                snprintf(name, sizeof name, "round %d trial %d: live peak %zu, the list's %zu", round, trial, elive, live);
                check(name, 0, 0);
            }
            if (epeak != pl.peak && exact_ok) {
                snprintf(name, sizeof name, "round %d trial %d: exact peak %zu, the plan's %zu", round, trial, epeak,
                         pl.peak);
                check(name, 0, 0);
            }
            /* the plan made from an evaluator that placed the decision last
             * (its placement reused; its last use) is the plan */
            ck_plan ep;
            ck_evaluator *once = ck_evaluator_new(&c);
            size_t ignore;
            double fl;
            if (!once || ck_evaluate(once, mark, 1, &ignore, &fl) || ck_evaluator_plan(once, mark, &ep)) {
                ck_evaluator_free(once);
                ck_plan_free(&pl);
                break;
            }
            plan_ok &= ck_evaluate(once, mark, 0, &ignore, &fl) == -1; /* no walks after the plan */
            ck_evaluator_free(once);
            plan_ok &= ck_plan_digest(&ep, 1) == ck_plan_digest(&pl, 1) && ep.live_peak == pl.live_peak &&
                       ep.recompute_flops == pl.recompute_flops && ep.activation_bytes == pl.activation_bytes &&
                       !memcmp(ep.at_peak, pl.at_peak, sizeof ep.at_peak);
            ck_plan_free(&ep);
            const size_t turn = ck_evaluate_turn(ev, mark);
            turn_ok &= turn <= live;
            turn_some += turn > persistent;
            live_ok &= elive == live;
            exact_ok &= epeak == pl.peak;
            flops_ok &= eflops == pl.recompute_flops && xflops == pl.recompute_flops;
            ck_plan_free(&pl);
            trials++;
        }
        /* the tracker: from a random decision, random one-tensor changes, each
         * followed against a walk of the decision it leaves */
        ck_tracker *tr = ev ? ck_tracker_new(ev) : NULL;
        for (int trial = 0; tr && trial < 4; trial++) {
            const int density = (int)(next() % 4);
            memset(mark, 0, (size_t)g->nt);
            for (int k = 0; k < ncand; k++) mark[cand[k]] = (int)(next() % 4) < density;
            if (ck_tracker_reset(tr, mark)) break;
            for (int step = 0; step <= 40 && ncand; step++) {
                if (step) {
                    const int t = cand[next() % (uint64_t)ncand];
                    if (ck_tracker_flip(tr, t)) break;
                    mark[t] ^= 1;
                    if (next() % 8 == 0) ck_tracker_relabel(tr);
                }
                size_t live;
                double flops;
                ck_evaluate(ev, mark, 0, &live, &flops);
                if (ck_tracker_peak(tr) != live && track_ok) {
                    snprintf(name, sizeof name, "round %d trial %d step %d: tracked live peak %zu, the walk's %zu", round,
                             trial, step, ck_tracker_peak(tr), live);
                    check(name, 0, 0);
                }
                track_ok &= ck_tracker_peak(tr) == live;
                tracked++;
            }
        }
        built &= ev != NULL && tr != NULL;
        ck_tracker_free(tr);
        ck_evaluator_free(ev);
        free(nodes);
        free(cand);
        free(poff);
        free(retain);
        free(mark);
        ck_graph_free(g);
    }
    check("every random model builds and differentiates", built && graphs == 60, graphs);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the live peak is the scheduled list's", trials, graphs);
    check(name, live_ok && trials >= 600, trials);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the exact peak is the placed plan's", trials, graphs);
    check(name, exact_ok && trials >= 600, trials);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the recompute FLOPs are the list's", trials, graphs);
    check(name, flops_ok && trials >= 600, trials);
    snprintf(name, sizeof name, "%d one-tensor changes on %d graphs: the tracked live peak is the walk's", tracked,
             graphs);
    check(name, track_ok && tracked >= 5000, tracked);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the turn's bytes are a lower bound of the live peak (%d above "
             "the persistent bytes)", trials, graphs, turn_some);
    check(name, turn_ok && turn_some > trials / 2, trials);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the evaluator's plan (its placement reused) is the plan", trials,
             graphs);
    check(name, plan_ok && trials >= 600, trials);
    /* a graph past the planner's own limit: refused at once, naming the count
     * and the limit, before anything that size is made (the graph here has
     * only its count: compile may read nothing else of it) */
    {
        ck_graph big;
        memset(&big, 0, sizeof big);
        big.nn = CK_PLAN_MAX_NODES + 1;
        ck_compile_opts o;
        memset(&o, 0, sizeof o);
        o.loss = -1;
        char err[256] = "", want[128];
        ck_program *p = ck_compile(&big, &o, err, sizeof err);
        snprintf(want, sizeof want, "the graph has %d nodes, more than the %d ckrun plans", CK_PLAN_MAX_NODES + 1,
                 CK_PLAN_MAX_NODES);
        check("a graph past the planner's limit is refused in one line naming its count and the limit",
              p == NULL && strcmp(err, want) == 0, 0);
        if (strcmp(err, want)) printf("  got: %s\n", err);
    }
    return checks_done();
}
