/* A compiled program: the differentiated graph, its op lists (a training step
 * and a forward-only pass), the memory plan of each, and the one arena that
 * holds every byte they use. */
#ifndef CK_PROGRAM_H
#define CK_PROGRAM_H

#include "graph.h"

/* What a checkpoint policy sees: the differentiated graph, the training list
 * before scheduling, and the candidates (ck_saved_activations). It can
 * schedule and plan trial decisions with ck_decide_eval. */
typedef struct ck_decide_ctx {
    const ck_graph *g;
    const int *nodes;
    int n;
    const int *cand;
    int ncand;
    const int64_t *poff;
    size_t persistent;
    const int *retain;
    int nthreads;
} ck_decide_ctx;

/* A checkpoint decision: per graph tensor, 1 when backward recomputes it instead
 * of keeping it. Returns 0, or -1 with a message. */
typedef int (*ck_decide_fn)(void *ud, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen);

/* The peak and recompute FLOPs of one trial decision; exact: place every byte
 * (the true peak), otherwise the most bytes live at once (a lower bound, fast). */
int ck_decide_eval(const ck_decide_ctx *c, const unsigned char *recompute, int exact, size_t *peak, double *flops);

typedef enum ck_optim { CK_OPTIM_NONE = 0, CK_OPTIM_SGD, CK_OPTIM_ADAMW } ck_optim;

typedef struct ck_compile_opts {
    int loss;          /* tensor id, -1 for a forward-only program */
    const int *outputs; /* tensors the host reads after a run */
    int noutputs;
    ck_optim optim;
    float lr, beta1, beta2, eps, weight_decay;
    uint64_t seed;
    int keep_grads;    /* gradients stay readable after a step (no optimizer update needed) */
    int plan_only;     /* plan, allocate nothing: the program cannot run */
    ck_dtype storage;  /* CK_BF16 / CK_F16: plan 16-bit activations and frozen weights (plan_only) */
    ck_decide_fn decide; /* the checkpoint policy; NULL keeps every activation */
    void *decide_ud;
} ck_compile_opts;

/* One entry of an op list: a graph node run on the tensors named here. A
 * recompute entry reruns a forward node and writes a copy of its output, a
 * tensor id >= g->nt whose origin is the forward tensor; backward entries read
 * such copies in place of the forward tensors that were not kept. */
typedef struct ck_op_ref {
    int node;
    ck_phase phase;
    int nin, nout;
    int in[CK_MAX_IN];
    int out[CK_MAX_OUT]; /* -1: slot unwanted */
} ck_op_ref;

/* What the memory plan reports, by category. */
typedef enum ck_cat {
    CK_CAT_FROZEN = 0, CK_CAT_TRAINABLE, CK_CAT_GRADIENTS, CK_CAT_OPTSTATE, CK_CAT_INPUTS,
    CK_CAT_ACTIVATIONS, CK_CAT_RECOMPUTED, CK_CAT_WORKSPACE, CK_CAT_COUNT
} ck_cat;

extern const char *const ck_cat_names[CK_CAT_COUNT];

/* One op list and where each tensor it touches lives in the arena. */
typedef struct ck_plan {
    int n;
    ck_op_ref *ops;
    int ntensors;        /* graph tensors plus recomputed copies */
    int *origin;         /* per tensor id: the graph tensor it holds (itself, or what a copy recomputes) */
    int64_t *off;        /* per tensor id: byte offset in the arena, -1 if the list does not touch it */
    int64_t *ws_off;     /* per list position: workspace offset, -1 if none */
    size_t *ws_bytes;
    size_t transient;    /* bytes above the persistent region */
    size_t peak;         /* the arena's high-water mark: persistent + transient */
    size_t live_peak;    /* the most bytes live at once (peak minus fragmentation) */
    int peak_at;         /* list position where live bytes are the most */
    size_t at_peak[CK_CAT_COUNT]; /* live bytes at peak_at, by category */
    size_t activation_bytes; /* forward activations held across the turn to backward */
    size_t workspace;    /* largest workspace */
    double step_flops, recompute_flops;
} ck_plan;


typedef struct ck_program {
    ck_graph *g;
    int loss;
    int *retain;       /* per tensor: readable after the list ends */
    ck_plan train;     /* forward, backward, optimizer (n == 0 without a loss) */
    ck_plan eval;      /* forward only: the loss and the outputs */
    size_t persistent; /* bytes of parameters, inputs and optimizer state */
    int64_t *poff;     /* per tensor: offset of a persistent tensor, -1 otherwise */
    unsigned char *arena;
    size_t arena_bytes;
    ck_compile_opts opt;
    int64_t step;      /* steps taken */
    const ck_plan *last;
    /* set from another thread to stop a run between two ops (NULL: never) */
    const volatile int *interrupt;
    char err[512];
} ck_program;

ck_program *ck_compile(const ck_graph *g, const ck_compile_opts *o, char *err, size_t errlen);
void ck_program_free(ck_program *p);
/* One training step (forward, backward, optimizer). 0 or -1 with p->err. */
int ck_program_step(ck_program *p);
/* The forward pass only. */
int ck_program_forward(ck_program *p);
/* Where a tensor's values are now, or NULL if the last run did not keep it. */
float *ck_program_data(ck_program *p, int t);

/* vm/schedule.c: the op list of the given graph nodes (forward nodes first, in
 * graph order, then the rest), with recompute entries placed before the first
 * backward use of every tensor marked in recompute (NULL: none). */
int ck_schedule(ck_plan *pl, const ck_graph *g, const int *nodes, int n, const unsigned char *recompute);
/* The checkpoint candidates: every forward activation. Marking one that
 * backward reads frees it after the forward pass; marking one that only a
 * recomputation reads lets that recomputation make it again instead of
 * holding it. Returns their count; ids into out (g->nt entries at most). */
int ck_saved_activations(const ck_graph *g, int *out);

/* vm/memplan.c: liveness over a scheduled list, then offsets in one arena. */
int ck_plan_memory(ck_plan *pl, const ck_graph *g, const int64_t *poff, size_t persistent, const int *retain,
                   int nthreads);
/* The most bytes live at once, without placing anything (fast; for searches). */
size_t ck_plan_live_peak(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, int nthreads);
/* Live bytes at every list position by category (persistent ones included):
 * n * CK_CAT_COUNT entries, malloc'd; NULL on out of memory. */
size_t *ck_plan_timeline(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, int nthreads);
void ck_plan_free(ck_plan *pl);
int ck_is_persistent(ck_kind k);
ck_cat ck_tensor_cat(const ck_plan *pl, const ck_graph *g, int id);
/* FLOPs of list entry i */
double ck_plan_op_flops(const ck_plan *pl, const ck_graph *g, int i);
/* bytes of tensor id (a graph tensor or a recomputed copy) */
size_t ck_plan_tensor_bytes(const ck_plan *pl, const ck_graph *g, int id);

/* vm/exec.c: runs one list on the CPU backend. */
int ck_exec(ck_program *p, const ck_plan *pl, char *err, size_t errlen);
/* One training step on an arena first filled with a sentinel; *high_water gets
 * the offset just past the last byte the step wrote: the measured peak. */
int ck_program_step_measured(ck_program *p, size_t *high_water);

#endif
