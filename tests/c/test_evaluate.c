/* The evaluator the checkpoint searches use (vm/plan/evaluate.c) gives, for
 * any decision, the numbers of the op list the scheduler makes for it: on
 * random differentiated graphs (linear layers on trainable and frozen
 * weights, activations, sums, products, reshapes that alias, norms, concats,
 * slices) and random decisions and retained tensors, its live peak equals
 * ck_plan_live_peak of ck_schedule's list, its exact peak equals
 * ck_plan_memory's, and its recompute FLOPs the list's, on both backends'
 * workspace rules; the plan it makes of a decision it placed, reusing the
 * placement (also once restored from the offsets kept while other walks
 * were made), is the same plan to the byte; and the budget search, from the
 * smallest peak it reports to none's, finds a decision that fits once placed
 * and recomputes no more than a fixed policy that fits. */
#include "plan/evaluate.h"
#include "plan/policy.h"
#include "run/program.h"

#include "check.h"
#include "random_model.h"

#include <stdlib.h>
#include <string.h>


int main(void)
{
    int searches = 0, searched_big = 0, search_found = 1, search_fits = 1, search_beats = 1, fixed_fits = 0;
    int graphs = 0, trials = 0, live_ok = 1, exact_ok = 1, frag_ok = 1, flops_ok = 1, plan_ok = 1, turn_ok = 1, turn_some = 0, track_ok = 1, tracked = 0, built = 1, floor_ok = 1, floors = 0, under_ok = 1, unders = 0, multiples_ok = 1, multiples_some = 0;
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
        size_t least = SIZE_MAX; /* the least placed peak less live peak of the decisions below */
        ck_evaluator *uev = ck_evaluator_new(&c);
        size_t uleast = SIZE_MAX; /* uev's: of those placed to the end */
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
            if (pl.peak - live < least) least = pl.peak - live;
            if (ck_evaluator_least_frag(ev) != least && frag_ok) {
                snprintf(name, sizeof name, "round %d trial %d: least fragmentation %zu, the plans' %zu", round, trial,
                         ck_evaluator_least_frag(ev), least);
                check(name, 0, 0);
            }
            frag_ok &= ck_evaluator_least_frag(ev) == least;
            /* placed under a limit by an evaluator whose last placement was
             * another decision's: the exact peak where it is at most the limit;
             * else above the limit and at most the exact peak, and the least
             * fragmentation as it was; then placed exactly (limits not drawn
             * from next(), whose sequence the tests below follow) */
            {
                const size_t span = (pl.peak - live) * 2 + 2; /* from the live peak to past the exact one */
                const size_t limit = live + span * (size_t)((round * 12 + trial) % 7) / 6;
                size_t upeak, again;
                double uflops;
                if (!uev || ck_evaluate_under(uev, mark, limit, &upeak, &uflops)) {
                    ck_plan_free(&pl);
                    break;
                }
                int good = pl.peak <= limit ? upeak == pl.peak : upeak > limit && upeak <= pl.peak;
                if (pl.peak <= limit && pl.peak - live < uleast) uleast = pl.peak - live;
                good &= ck_evaluator_least_frag(uev) == uleast;
                if (ck_evaluate(uev, mark, 1, &again, &uflops)) {
                    ck_plan_free(&pl);
                    break;
                }
                good &= again == pl.peak;
                if (pl.peak - live < uleast) uleast = pl.peak - live;
                if (!good && under_ok) {
                    snprintf(name, sizeof name, "round %d trial %d: peak %zu under limit %zu, exact %zu (then %zu)", round,
                             trial, upeak, limit, pl.peak, again);
                    check(name, 0, 0);
                }
                under_ok &= good;
                unders += pl.peak > limit;
            }
            /* the plan made from an evaluator that placed the decision last
             * (its placement reused; its last use) is the plan */
            ck_plan ep;
            ck_evaluator *once = ck_evaluator_new(&c);
            size_t ignore;
            double fl;
            /* its placement forgotten while other walks are made, with its
             * offsets kept (the evaluation of the same decision then restores
             * it) or not (and the plan places it) */
            unsigned char *other = calloc((size_t)g->nt, 1);
            for (int k = 0; other && k < ncand; k++) other[cand[k]] = !mark[cand[k]];
            const int keep = trial % 2;
            size_t again = 0;
            if (!once || !other || ck_evaluate(once, mark, 1, &ignore, &fl)) {
                free(other);
                ck_evaluator_free(once);
                ck_plan_free(&pl);
                break;
            }
            ck_evaluator_forget(once, keep);
            ck_evaluator_rest(once);
            const int bad = ck_evaluate(once, other, trial % 4 < 2, &again, &fl) || ck_evaluate(once, mark, 1, &again, &fl);
            const int restored = !bad && ck_evaluator_placed(once, mark);
            if (bad || ck_evaluator_plan(once, mark, &ep)) {
                ck_evaluator_free(once);
                ck_plan_free(&pl);
                break;
            }
            free(other);
            plan_ok &= again == ignore && (restored || !keep || trial % 4 < 2);
            plan_ok &= ck_evaluate(once, mark, 0, &ignore, &fl) == -1; /* no walks after the plan */
            ck_evaluator_free(once);
            plan_ok &= ck_plan_digest(&ep, 1) == ck_plan_digest(&pl, 1) && ep.live_peak == pl.live_peak &&
                       ep.recompute_flops == pl.recompute_flops && ep.activation_bytes == pl.activation_bytes &&
                       !memcmp(ep.at_peak, pl.at_peak, sizeof ep.at_peak);
            ck_plan_free(&ep);
            const size_t turn = ck_evaluate_turn(ev, mark);
            turn_ok &= turn <= live;
            /* the turns of the markings by multiples of a region, in one pass:
             * each that of its marking (regions past the count of markings too) */
            {
                enum { NM = 6 };
                int *region = calloc((size_t)g->nt, sizeof *region);
                unsigned char *by = calloc((size_t)g->nt, 1);
                size_t turns[NM + 1];
                if (!region || !by || ck_evaluate_turn_multiples(ev, region, NM, turns)) {
                    free(region);
                    free(by);
                    ck_plan_free(&pl);
                    break;
                }
                multiples_ok &= turns[1] == ck_evaluate_turn(ev, NULL);
                for (int k = 0; k < ncand; k++) region[cand[k]] = (int)((round * 7 + trial * 5 + k * 3) % 10);
                if (ck_evaluate_turn_multiples(ev, region, NM, turns)) {
                    free(region);
                    free(by);
                    ck_plan_free(&pl);
                    break;
                }
                for (int m = 1; m <= NM; m++) {
                    for (int t = 0; t < g->nt; t++) by[t] = region[t] > 0 && region[t] % m == 0;
                    const size_t want = ck_evaluate_turn(ev, by);
                    multiples_ok &= turns[m] == want;
                    multiples_some += want != ck_evaluate_turn(ev, NULL);
                }
                free(region);
                free(by);
            }
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
                    /* a marked tensor's bound on the peak once unmarked, found
                     * without a change: never above the peak the change makes */
                    const size_t before = ck_tracker_peak(tr), floor = mark[t] ? ck_tracker_unmark_floor(tr, t) : 0;
                    if (ck_tracker_peak(tr) != before && floor_ok) {
                        snprintf(name, sizeof name, "round %d trial %d step %d: the peak %zu moved to %zu by the floor's look",
                                 round, trial, step, before, ck_tracker_peak(tr));
                        check(name, 0, 0);
                    }
                    floor_ok &= ck_tracker_peak(tr) == before;
                    if (ck_tracker_flip(tr, t)) break;
                    mark[t] ^= 1;
                    if (floor > ck_tracker_peak(tr) && floor_ok) {
                        snprintf(name, sizeof name, "round %d trial %d step %d: unmarking's floor %zu over the peak %zu",
                                 round, trial, step, floor, ck_tracker_peak(tr));
                        check(name, 0, 0);
                    }
                    floor_ok &= floor <= ck_tracker_peak(tr);
                    floors += floor > before;
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
        tr = NULL;
        /* the budget search, at budgets from the smallest peak it reports to
         * none's: it finds a decision, that decision fits once placed, and it
         * recomputes no more than a fixed policy that fits */
        unsigned char *ans = calloc((size_t)g->nt, 1), *fx = calloc((size_t)g->nt, 1);
        size_t none_peak = 0, floor = 0;
        double nf;
        char err[256];
        if (ev && ans && fx && !ck_evaluate(ev, NULL, 1, &none_peak, &nf) &&
            ck_policy_budget_search(&c, ev, 0, ans, &floor, err, sizeof err) == 0 && floor && floor <= none_peak) {
            for (int k = 0; k <= 4; k++) {
                const size_t budget = floor + (none_peak - floor) * (size_t)k / 4;
                size_t ignore, peak = 0;
                double flops = 0;
                const int found = ck_policy_budget_search(&c, ev, budget, ans, &ignore, err, sizeof err);
                if (found < 0) break;
                if (found && ck_evaluate(ev, ans, 1, &peak, &flops)) break;
                searches++;
                searched_big += ncand > 14; /* past the exhaustive search: the starts, prunings and exchanges */
                search_found &= found == 1;
                search_fits &= !found || peak <= budget;
                ck_policy fixed[] = {{.kind = CK_POLICY_NONE}, {.kind = CK_POLICY_SQRT_N}, {.kind = CK_POLICY_SELECTIVE}};
                ck_policy_selective_default(fixed[2].ops);
                for (size_t q = 0; q < sizeof fixed / sizeof *fixed; q++) {
                    size_t fp;
                    double ff;
                    memset(fx, 0, (size_t)g->nt);
                    if (ck_policy_decide(&fixed[q], &c, fx, err, sizeof err) || ck_evaluate(ev, fx, 1, &fp, &ff)) continue;
                    if (fp > budget) continue;
                    fixed_fits++;
                    if (found && flops > ff && search_beats) {
                        snprintf(name, sizeof name, "round %d budget %zu: the search recomputes %.17g, %s fits with %.17g",
                                 round, budget, flops, q == 0 ? "none" : q == 1 ? "sqrt_n" : "selective", ff);
                        check(name, 0, 0);
                    }
                    search_beats &= found && flops <= ff;
                }
            }
        }
        free(ans);
        free(fx);
        ck_evaluator_free(ev);
        ck_evaluator_free(uev);
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
    snprintf(name, sizeof name, "%d decisions on %d graphs: the least fragmentation is the placed plans' least", trials,
             graphs);
    check(name, frag_ok && trials >= 600, trials);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the turns of the markings by regions' multiples are theirs (%d below none's)",
             trials, graphs, multiples_some);
    check(name, multiples_ok && multiples_some >= 100, multiples_some);
    snprintf(name, sizeof name, "%d decisions placed under a limit (%d past it): the exact peak under it, a bound above", trials,
             unders);
    check(name, under_ok && unders >= 100 && unders < trials, unders);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the recompute FLOPs are the list's", trials, graphs);
    check(name, flops_ok && trials >= 600, trials);
    snprintf(name, sizeof name, "%d one-tensor changes on %d graphs: the tracked live peak is the walk's", tracked,
             graphs);
    check(name, track_ok && tracked >= 5000, tracked);
    snprintf(name, sizeof name, "%d one-tensor changes on %d graphs: unmarking's floor is never above the peak it "
             "makes (%d floors above the peak before)", tracked, graphs, floors);
    /* floors above the peak before are the changes the search refuses
     * unmade: 275 of these, 243 where the floor counts the buffers read by
     * A's entries that go back in as freed */
    check(name, floor_ok && floors >= 260, floors);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the turn's bytes are a lower bound of the live peak (%d above "
             "the persistent bytes)", trials, graphs, turn_some);
    check(name, turn_ok && turn_some > trials / 2, trials);
    snprintf(name, sizeof name, "%d decisions on %d graphs: the evaluator's plan (its placement reused) is the plan", trials,
             graphs);
    check(name, plan_ok && trials >= 600, trials);
    snprintf(name, sizeof name, "%d budget searches on %d graphs, from the smallest peak each reports to none's: each "
             "finds a decision (%d past the exhaustive search)", searches, graphs, searched_big);
    check(name, search_found && searches >= 200 && searched_big >= 100, searches);
    snprintf(name, sizeof name, "%d budget searches: each decision fits its budget once placed", searches);
    check(name, search_fits && searches >= 200, searches);
    snprintf(name, sizeof name, "%d budget searches: none recomputes more than a fixed policy that fits (%d fit)", searches,
             fixed_fits);
    check(name, search_beats && fixed_fits >= searches, fixed_fits);
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
