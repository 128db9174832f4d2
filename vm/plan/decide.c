/* A checkpoint decision (plan/policy.h's ck_policy_decide): the fixed
 * policies and the budget search of vm/plan/policy.c, the joint search with
 * offload of vm/plan/offsearch.c (budget and auto where offload is allowed),
 * and the exact solver of vm/plan/optimal.c. */
#include "plan/evaluate.h"
#include "plan/offload.h"
#include "plan/optimal.h"
#include "plan/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the budget search's answer into recompute, or a refusal naming the
 * smallest peak it saw (and, offload not allowed, what offload would reach) */
static int decide_budget(const ck_decide_ctx *c, ck_evaluator *ev, size_t budget, unsigned char *recompute,
                         const char *what, char *err, size_t errlen)
{
    unsigned char *mark = calloc((size_t)c->g->nt, 1);
    size_t floor = 0;
    if (!mark) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int found = ck_policy_budget_search(c, ev, budget, mark, &floor, err, errlen);
    int rc = found < 0 ? -1 : 0;
    if (found == 0) {
        /* the smallest peak rounded up, so that as a budget it fits */
        snprintf(err, errlen, "%s: nothing fits in %.1f MiB; the smallest peak ckrun can plan is %.1f MiB (%zu bytes)",
                 what, budget / 1048576.0, ceil(floor / 104857.6) / 10, floor);
        /* offload not allowed: what it would reach, after the figure without */
        const size_t with = c->offload ? 0 : ck_offload_floor(c, ev);
        if (c->report) {
            c->report->floor = floor;
            c->report->floor_offload = with;
        }
        if (with && with < floor) {
            const size_t at = strlen(err);
            snprintf(err + at, errlen - at, "; with offload (--offload auto), %.1f MiB (%zu bytes)",
                     ceil(with / 104857.6) / 10, with);
        }
        rc = -1;
    }
    if (found == 1) {
        for (int k = 0; k < c->ncand; k++) recompute[c->cand[k]] = mark[c->cand[k]];
        /* the plan reuses the placement of the decision placed last: the answer's */
        size_t peak;
        double flops;
        if (!ck_evaluator_placed(ev, mark) && ck_evaluate(ev, mark, 1, &peak, &flops)) rc = -1;
    }
    free(mark);
    return rc;
}

int ck_policy_decide(const ck_policy *pol, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen)
{
    switch (pol->kind) {
    case CK_POLICY_NONE:
    case CK_POLICY_BLOCKS:
    case CK_POLICY_EVERY_N:
    case CK_POLICY_SQRT_N:
    case CK_POLICY_SELECTIVE: return ck_policy_fixed(pol, c, recompute, err, errlen);
    case CK_POLICY_BUDGET:
    case CK_POLICY_AUTO: {
        ck_evaluator *own = c->ev ? NULL : ck_evaluator_new(c), *ev = c->ev ? c->ev : own;
        size_t none = 0;
        double f;
        int rc = ev ? 0 : -1;
        /* none's placed peak where the answer needs it: a budget that is a
         * share of it, or auto where none's live peak does not rule it out */
        if (ev && pol->kind == CK_POLICY_BUDGET && pol->budget_fraction > 0) rc = ck_evaluate(ev, NULL, 1, &none, &f);
        const double fit = pol->device * (1.0 - pol->headroom);
        /* auto places none when it may fit, or when its caller asks what none needs */
        if (ev && pol->kind == CK_POLICY_AUTO) {
            rc = ck_evaluate(ev, NULL, 0, &none, &f);
            if (!rc && ((double)none <= fit || c->report)) rc = ck_evaluate(ev, NULL, 1, &none, &f);
        }
        if (!rc && c->report && (pol->kind == CK_POLICY_AUTO || pol->budget_fraction > 0)) c->report->none_peak = none;
        if (rc) {
            ck_evaluator_free(own);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        /* offload allowed: the joint search of vm/plan/offsearch.c */
        int (*decide)(const ck_decide_ctx *, ck_evaluator *, size_t, unsigned char *, const char *, char *, size_t) =
            c->offload ? ck_offload_decide : decide_budget;
        const double room = pol->kind == CK_POLICY_AUTO ? fit
                            : pol->budget_fraction > 0 ? pol->budget_fraction * (double)none : pol->budget;
        if (c->report) c->report->budget = (size_t)room;
        const size_t aim = (double)c->cut < room ? (size_t)(room - (double)c->cut) : 0;
        if (pol->kind == CK_POLICY_BUDGET || none > aim)
            rc = decide(c, ev, aim, recompute, pol->kind == CK_POLICY_BUDGET ? "budget" : "auto", err, errlen);
        ck_evaluator_free(own);
        return rc;
    }
    case CK_POLICY_OPTIMAL:
        return ck_optimal_decide(c, pol->budget, pol->budget_fraction, pol->seconds, recompute, err, errlen);
    }
    snprintf(err, errlen, "unknown policy kind %d", (int)pol->kind);
    return -1;
}
