/* A compiled program: the differentiated graph, its op lists (a training step
 * and a forward-only pass), the memory plan of each, and the one arena that
 * holds every byte they use. */
#ifndef CK_PROGRAM_H
#define CK_PROGRAM_H

#include "graph.h"

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
} ck_compile_opts;

/* One op list and where each tensor it touches lives in the arena. */
typedef struct ck_plan {
    int n;
    int *nodes;         /* node ids in run order */
    int64_t *off;       /* per tensor: byte offset in the arena, -1 if the list does not touch it */
    int64_t *ws_off;    /* per list position: workspace offset, -1 if none */
    size_t *ws_bytes;
    size_t transient;   /* bytes above the persistent region */
    size_t peak;        /* persistent + transient */
    size_t by_kind[CK_KIND_COUNT];
    size_t workspace;   /* largest workspace live at once */
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

/* vm/memplan.c: the liveness-based plan of one op list. */
int ck_plan_build(ck_plan *pl, const ck_graph *g, const int *nodes, int n, const int64_t *poff, size_t persistent,
                  const int *retain, int nthreads);
void ck_plan_free(ck_plan *pl);
int ck_is_persistent(ck_kind k);

/* vm/exec.c: runs one list on the CPU backend. */
int ck_exec(ck_program *p, const ck_plan *pl, char *err, size_t errlen);

#endif
