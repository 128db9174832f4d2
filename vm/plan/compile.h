/* The compiler's planning passes over a training graph (graph/train.h made
 * it): the precision of every tensor, then the training step's list
 * (decided, scheduled, offloaded, placed) and the forward pass's. What the
 * passes read besides the graph is the persistent region's layout, which
 * the program lays out (vm/run/program.c). */
#ifndef CK_COMPILE_H
#define CK_COMPILE_H

#include "plan/plan.h"

/* ck_compile_opts.offload */
enum { CK_OFFLOAD_NONE = 0, CK_OFFLOAD_ACTIVATIONS, CK_OFFLOAD_AUTO };

/* Mixed precision: activations, their gradients and frozen weights in
 * storage (frozen weights in frozen where it is not CK_F32); trainable
 * weights (the master copies), their gradients, the optimizer state, the
 * inputs and the loss stay fp32. Nothing changes when both are CK_F32. */
void ck_plan_precision(ck_graph *g, ck_dtype storage, ck_dtype frozen, int loss);

/* What the list passes read: the graph; the persistent region (offsets,
 * -1 for others, and its bytes); per tensor, 1 where it is read after a
 * list ends; per tensor, 1 for a frozen weight streamed from pinned host
 * memory (NULL: none); the backend whose rules size workspaces; the
 * decision (NULL: keep every activation), where it reports, and the
 * offload options, as ck_compile_opts has them; the budget each list and
 * plan is charged to before it is built. */
typedef struct ck_plan_in {
    const ck_graph *g;
    const int64_t *poff;
    size_t persistent;
    const int *retain;
    const unsigned char *streamed;
    const ck_backend *be;
    ck_decide_fn decide;
    void *decide_ud;
    ck_decide_report *report;
    int offload, prefetch;
    const struct ck_device_speed *speed;
    ck_mem_budget *budget;
} ck_plan_in;

/* What planning the training step found besides its plan: thread CPU
 * seconds of the decision and of the plan, none's placed peak where the
 * decision placed it (0: not), and the line the joint search says what it
 * chose in. */
typedef struct ck_step_info {
    double decide_seconds, plan_seconds;
    size_t none_peak;
    char why[256];
} ck_step_info;

/* The training step's plan: the list of the nodes the sinks need (forward,
 * backward, optimizer), decided, scheduled with its recompute entries,
 * offloaded (activations, streamed weights) and placed. Where the streamed
 * weights' device copies, which the decision does not see, take the plan
 * past the budget it aimed under, it decides again with the budget cut by
 * what they added (at most CK_STREAM_TRIES decisions) and plans the last
 * that fits. *held: the budget's charge for the lists and plans, the
 * plan's host bytes on return. 0, or -1 with err (pl and *held empty). */
#define CK_STREAM_TRIES 5
int ck_plan_step(const ck_plan_in *in, const int *sinks, int nsinks, ck_plan *pl, ck_step_info *info, size_t *held,
                 char *err, size_t errlen);
/* The forward pass's plan (no decision; streamed weights brought in as in
 * the step's). The same contract. */
int ck_plan_forward(const ck_plan_in *in, const int *sinks, int nsinks, ck_plan *pl, size_t *held, char *err,
                    size_t errlen);

#endif
