/* Built-in checkpoint policies: which forward activations backward recomputes
 * instead of keeping. stdlib/ck/policy.lua builds these from scripts. */
#ifndef CK_POLICY_H
#define CK_POLICY_H

#include "plan/plan.h"

typedef enum ck_policy_kind {
    CK_POLICY_NONE = 0,  /* keep everything backward reads */
    CK_POLICY_BLOCKS,    /* recompute the inside of every scope matching a pattern */
    CK_POLICY_EVERY_N,   /* recompute every n-th block of the block sequence */
    CK_POLICY_SQRT_N,    /* Chen et al. 2016: sqrt(n) segments of the block sequence */
    CK_POLICY_SELECTIVE, /* recompute the outputs of the listed op kinds */
    CK_POLICY_BUDGET,    /* least recompute FLOPs whose peak fits the budget */
    CK_POLICY_AUTO,      /* none if it fits the device with headroom, else budget */
    CK_POLICY_OPTIMAL    /* budget's aim by an exact solver (vm/plan/optimal.c), within seconds */
} ck_policy_kind;

typedef struct ck_policy {
    ck_policy_kind kind;
    const char *const *patterns; /* blocks: scope patterns, '*' matches one dotted component */
    int npatterns;
    int any_pattern;                /* blocks: a pattern may match nothing while another matches */
    unsigned char ops[CK_OP_COUNT]; /* selective */
    int n;                          /* every_n */
    double budget;                  /* budget: bytes; 0 < budget_fraction: a share of none's peak instead */
    double budget_fraction;
    double device, headroom;        /* auto */
    double seconds;                 /* optimal: the solver's time limit (0: CK_OPTIMAL_SECONDS); its budget as budget's */
} ck_policy;

/* vm/plan/decide.c: fills recompute for the candidates of c. Errors name the policy and what is
 * wrong: a pattern that matches no scope, a budget nothing fits (with the
 * smallest peak found). */
int ck_policy_decide(const ck_policy *pol, const ck_decide_ctx *c, unsigned char *recompute, char *err,
                     size_t errlen);

/* The budget search alone: the decision of least recompute FLOPs whose
 * placed peak fits budget into mark (1: found; 0: none fits), and in *floor
 * the smallest placed peak it saw; -1 with err on failure. (The joint
 * search of vm/plan/offsearch.c starts from it.) */
struct ck_evaluator;
int ck_policy_budget_search(const ck_decide_ctx *c, struct ck_evaluator *ev, size_t budget, unsigned char *mark,
                            size_t *floor, char *err, size_t errlen);

/* A fixed policy's decision (none, blocks, every_n, sqrt_n, selective: no
 * search); -1 with err for another kind, or a pattern that matches no scope. */
int ck_policy_fixed(const ck_policy *pol, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen);
/* diffusers' gradient checkpointing as a blocks policy: the blocks it
 * recomputes in every family ckrun knows (a UNet's, a Flux transformer's). */
ck_policy ck_policy_diffusers(void);

/* The selective policy's default op kinds: cheap to recompute (norms,
 * activations, softmax, elementwise, layout), not matmul, conv or attention. */
void ck_policy_selective_default(unsigned char *ops);

/* The block a scope belongs to at diffusers' granularity (a ResnetBlock2D, a
 * BasicTransformerBlock, a Flux double or single block), written to buf; "" when it is in none. */
const char *ck_policy_block_of(const char *scope, char *buf, size_t len);

#endif
