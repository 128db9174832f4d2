/* The recompute decision by an exact solver (vm/plan/optimal.c): a MILP over
 * the list's memory at every entry, solved by CBC under a time limit, as the
 * reference the budget search is held against and as --checkpoint optimal. */
#ifndef CK_OPTIMAL_H
#define CK_OPTIMAL_H

#include "plan/evaluate.h"

/* The most entries a list may have for the solver to take it (its none list:
 * forward and backward); larger graphs are refused in one line. */
#define CK_OPTIMAL_MAX_ENTRIES 100000
/* the time limit when none is given, in seconds */
#define CK_OPTIMAL_SECONDS 60.0

typedef struct ck_optimal_model ck_optimal_model;

/* The model of c's list (ev: c's evaluator); links: buffers no later entry
 * reads can be marked too (a recomputation that reads one recomputes it
 * rather than keep it), as the solver's model has them. NULL with err: out
 * of memory, a list too long, or one whose optimizer entries move. */
ck_optimal_model *ck_optimal_model_new(const ck_decide_ctx *c, ck_evaluator *ev, int links, char *err, size_t errlen);
void ck_optimal_model_free(ck_optimal_model *m);
/* The entries every list has (the none list's): the model's positions. */
int ck_optimal_model_positions(const ck_optimal_model *m);
/* in as the model can mark it: a buffer (a forward activation and the views
 * of it) is marked when the tensor that holds it is; tensors the model
 * leaves alone are not. */
void ck_optimal_model_mark(const ck_optimal_model *m, const unsigned char *in, unsigned char *out);
/* The model's values for decision mark (as ck_optimal_model_mark gives it):
 * the bytes live above the persistent ones at each position (mem: room for
 * positions) and the recompute FLOPs. 0, or -1 out of memory. */
int ck_optimal_model_memory(const ck_optimal_model *m, const unsigned char *mark, int64_t *mem, double *flops);

/* What a solve found: the recompute FLOPs of the decision returned and its
 * placed peak, the solver's lower bound on the FLOPs of any decision that
 * fits, whether the decision is proven optimal, the solves it took, and
 * whether the decision is the budget search's (the solver found none better). */
typedef struct ck_optimal_result {
    double flops, bound, forward_flops;
    size_t peak;
    int proven, solves, from_search, polished; /* polished: marks taken back after (see ck_optimal_solve) */
    double seconds;
} ck_optimal_result;

/* The decision of least recompute FLOPs whose placed peak fits budget, within
 * seconds of solving, into mark (per graph tensor). 1: found; 0: nothing
 * fits; -1 with err. */
int ck_optimal_solve(const ck_decide_ctx *c, ck_evaluator *ev, size_t budget, double seconds, unsigned char *mark,
                     ck_optimal_result *res, char *err, size_t errlen);

/* --checkpoint optimal: the budget (bytes, or when fraction > 0 a share of
 * none's placed peak) solved within seconds (0: CK_OPTIMAL_SECONDS), its
 * decision into recompute and what the solver found into c->why. Errors as
 * budget's: nothing fits names the smallest peak seen. 0, or -1 with err. */
int ck_optimal_decide(const ck_decide_ctx *c, double bytes, double fraction, double seconds, unsigned char *recompute,
                      char *err, size_t errlen);

#endif
