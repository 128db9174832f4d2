/* The exact solver of --checkpoint optimal (vm/plan/optimal.c) on random
 * differentiated graphs (as test_evaluate's: linear layers, activations,
 * sums, products, aliasing reshapes, norms, concats, slices) and random
 * decisions: its model's memory at every entry every list has is at most the
 * scheduled list's live bytes there (a lower bound, so the solver's bound is
 * one), equal for no recompute and at most entries of random decisions, and
 * its recompute FLOPs are the list's; at budgets between the smallest peak
 * and none's, its decision fits when placed, recomputes no more than the
 * budget search's, and its bound is at most what any decision it can make
 * that was found recomputes. */
#include "plan/evaluate.h"
#include "plan/optimal.h"
#include "plan/policy.h"
#include "run/program.h"

#include "check.h"
#include "random_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* the list's live bytes above the persistent ones at each entry that is no
 * recomputation, in order: the model's positions */
static int64_t *list_memory(const ck_decide_ctx *c, const unsigned char *mark, int *n)
{
    ck_plan pl;
    if (ck_schedule(&pl, c->g, c->nodes, c->n, mark)) return NULL;
    size_t *tl = ck_plan_timeline(&pl, c->g, c->persistent, c->retain, c->be);
    int64_t *mem = malloc(sizeof *mem * (size_t)(pl.n ? pl.n : 1)), fixed = 0;
    unsigned char *touched = calloc((size_t)c->g->nt, 1);
    if (!tl || !mem || !touched) {
        free(tl), free(mem), free(touched);
        ck_plan_free(&pl);
        return NULL;
    }
    for (int i = 0; i < pl.n; i++) {
        for (int j = 0; j < pl.ops[i].nin; j++)
            if (pl.ops[i].in[j] < c->g->nt) touched[pl.ops[i].in[j]] = 1;
    }
    for (int t = 0; t < c->g->nt; t++)
        if (touched[t] && ck_plan_is_persistent(c->g->t[t].kind)) fixed += (int64_t)ck_tensor_bytes(&c->g->t[t]);
    *n = 0;
    for (int i = 0; i < pl.n; i++) {
        if (pl.ops[i].phase == CK_PHASE_RECOMPUTE) continue;
        int64_t tot = 0;
        for (int k = 0; k < CK_CAT_COUNT; k++) tot += (int64_t)tl[(size_t)i * CK_CAT_COUNT + k];
        mem[(*n)++] = tot - fixed;
    }
    free(tl), free(touched);
    ck_plan_free(&pl);
    return mem;
}

int main(void)
{
    int graphs = 0, trials = 0, built = 1, none_ok = 1, bound_ok = 1, flops_ok = 1, equal = 0, positions = 0;
    double slowest = 0;
    int bounded = 0;
    int solves = 0;
    int solved = 0, fits = 0, no_worse = 0, bound_below = 0, bound_some = 0, found_when = 1, better = 0;
    char name[200], err[256];
    for (int round = 0; round < 40; round++) {
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
        unsigned char *mark = calloc((size_t)g->nt, 1), *tied = calloc((size_t)g->nt, 1);
        unsigned char *best = calloc((size_t)g->nt, 1);
        for (int i = 0; i < g->nn; i++) nodes[i] = i;
        size_t persistent = 0;
        for (int t = 0; t < g->nt; t++) {
            poff[t] = -1;
            if (ck_plan_is_persistent(g->t[t].kind)) {
                poff[t] = (int64_t)persistent;
                persistent += (ck_tensor_bytes(&g->t[t]) + 63) / 64 * 64;
            }
            retain[t] = next() % 16 == 0;
        }
        const int ncand = ck_plan_saved_activations(g, cand);
        const ck_backend *be = round % 2 ? ck_backend_cpu() : ck_backend_cuda_plan();
        ck_decide_ctx c = {.g = g, .nodes = nodes, .n = g->nn, .cand = cand, .ncand = ncand, .poff = poff,
                           .persistent = persistent, .retain = round % 3 ? retain : NULL, .be = be};
        ck_evaluator *ev = ck_evaluator_new(&c);
        ck_optimal_model *m = ev ? ck_optimal_model_new(&c, ev, 1, err, sizeof err) : NULL;
        const int P = m ? ck_optimal_model_positions(m) : 0;
        ck_optimal_model *solver_m = ev ? ck_optimal_model_new(&c, ev, 1, err, sizeof err) : NULL; /* the solver's */
        int64_t *mm = malloc(sizeof *mm * (size_t)(P ? P : 1));
        for (int trial = 0; m && mm && trial < 12; trial++) {
            const int density = trial ? (int)(next() % 4) : 0; /* the first: no recompute */
            memset(mark, 0, (size_t)g->nt);
            for (int k = 0; k < ncand; k++) mark[cand[k]] = (int)(next() % 4) < density;
            ck_optimal_model_mark(m, mark, tied);
            double mflops, eflops;
            size_t live;
            int n = 0;
            int64_t *lm = list_memory(&c, tied, &n);
            if (!lm || n != P || ck_optimal_model_memory(m, tied, mm, &mflops) || ck_evaluate(ev, tied, 0, &live, &eflops)) {
                free(lm);
                built = 0;
                break;
            }
            for (int k = 0; k < P; k++) {
                if (mm[k] > lm[k] && bound_ok) {
                    snprintf(name, sizeof name, "round %d trial %d entry %d: the model's %lld bytes, the list's %lld",
                             round, trial, k, (long long)mm[k], (long long)lm[k]);
                    check(name, 0, 0);
                }
                bound_ok &= mm[k] <= lm[k];
                if (!trial) none_ok &= mm[k] == lm[k];
                else equal += mm[k] == lm[k], positions++;
            }
            if (flops_ok && fabs(mflops - eflops) > 1e-9 * (eflops + 1)) {
                snprintf(name, sizeof name, "round %d trial %d: the model's recompute FLOPs %.17g, the list's %.17g", round,
                         trial, mflops, eflops);
                check(name, 0, 0);
            }
            flops_ok &= fabs(mflops - eflops) <= 1e-9 * (eflops + 1);
            free(lm);
            trials++;
        }
        /* on every other graph, two budgets: the smallest peak the search sees, and a third of the way to none's */
        size_t none, floor;
        double f0;
        if (m && round % 2 == 0 && !ck_evaluate(ev, NULL, 1, &none, &f0) &&
            ck_policy_budget_search(&c, ev, 0, best, &floor, err, sizeof err) >= 0) {
            for (int b = 0; b < 2; b++) {
                const size_t budget = floor + (none - floor) * (size_t)b / 3;
                size_t peak, sp = 0;
                double sflops = 0, f;
                const int sfound = ck_policy_budget_search(&c, ev, budget, best, &floor, err, sizeof err);
                /* the search's decision within the model's (each buffer with all its views) */
                int within = 1;
                ck_optimal_model_mark(solver_m, best, tied);
                for (int t = 0; t < g->nt; t++) within &= tied[t] == best[t];
                if (sfound == 1 && ck_evaluate(ev, best, 1, &sp, &sflops)) break;
                ck_optimal_result res;
                const int found = ck_optimal_solve(&c, ev, budget, 5.0, mark, &res, err, sizeof err);
                if (found < 0) {
                    built = 0;
                    break;
                }
                found_when &= found >= (sfound == 1);
                if (!found) continue;
                solved++;
                if (res.seconds > slowest) slowest = res.seconds;
                solves += res.solves;
                /* the decision as a fresh evaluator places it */
                ck_evaluator *fresh = ck_evaluator_new(&c);
                if (!fresh || ck_evaluate(fresh, mark, 1, &peak, &f)) {
                    ck_evaluator_free(fresh);
                    built = 0;
                    break;
                }
                ck_evaluator_free(fresh);
                fits += peak <= budget && peak == res.peak && f == res.flops;
                no_worse += sfound != 1 || f <= sflops;
                better += sfound == 1 && f < sflops;
                /* the bound holds over the solver's decisions: each buffer with all its views, none that no
                 * later entry reads (the search's decision is one when tied[] is it) */
                int mine = 1;
                ck_optimal_model_mark(solver_m, mark, tied);
                for (int t = 0; t < g->nt; t++) mine &= tied[t] == mark[t];
                double least = mine ? f : INFINITY;
                if (within && sfound == 1 && sflops < least) least = sflops;
                bounded += least < INFINITY;
                if (bound_below == solved - 1 && !(res.bound <= least * (1 + 1e-9) + 1e-9)) {
                    snprintf(name, sizeof name, "round %d budget %zu: bound %.17g above the decision's %.17g (search %.17g)",
                             round, budget, res.bound, f, sflops);
                    check(name, 0, 0);
                }
                bound_below += res.bound <= least * (1 + 1e-9) + 1e-9;
                bound_some += res.bound > 0;
            }
        }
        built &= ev != NULL && m != NULL && solver_m != NULL;
        free(mm);
        ck_optimal_model_free(m);
        ck_optimal_model_free(solver_m);
        ck_evaluator_free(ev);
        free(nodes), free(cand), free(poff), free(retain), free(mark), free(tied), free(best);
        ck_graph_free(g);
    }
    check("every random model builds, differentiates and is modelled", built && graphs == 40, graphs);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the model's memory at every entry is at most the list's live "
             "bytes", trials, graphs);
    check(name, bound_ok && trials >= 400, trials);
    check("without recompute the model's memory is the list's at every entry", none_ok && graphs == 40, graphs);
    snprintf(name, sizeof name, "random decisions: the model's memory equals the list's at most entries (%d of %d)", equal,
             positions);
    check(name, positions > 0 && equal >= positions * 3 / 4, positions ? (double)equal / positions : 0);
    check("the model's recompute FLOPs are the list's", flops_ok && trials >= 400, trials);
    snprintf(name, sizeof name, "%d solves (%d CBC runs, the slowest %.2f s): a decision wherever the budget search "
             "finds one", solved, solves, slowest);
    check(name, found_when && solved >= 30, solved);
    snprintf(name, sizeof name, "%d solves: the decision fits the budget when placed, as reported", solved);
    check(name, fits == solved && solved >= 30, fits);
    snprintf(name, sizeof name, "%d solves: it recomputes no more than the budget search (less in %d)", solved, better);
    check(name, no_worse == solved && solved >= 30, no_worse);
    snprintf(name, sizeof name, "%d solves: the solver's bound is at most what its decisions found recompute (%d of them "
             "within its decisions, bound above 0 in %d)", solved, bounded, bound_some);
    check(name, bound_below == solved && bounded >= solved / 2 && bound_some > 0, bound_below);
    return checks_done();
}
