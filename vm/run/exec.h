/* The executor (vm/run/exec.c): runs entries of a planned op list on a
 * backend, handing each kernel views into the arena. It sees an environment,
 * not a program: the graph, the arena and the step's counters. */
#ifndef CK_EXEC_H
#define CK_EXEC_H

#include "plan/plan.h"

/* Graph replay (a backend with capture_begin, the CUDA one): a range of a
 * list captured once, kept by the program that runs it, keyed by the list
 * (its plan, its entries' array and count), the range and the arena. */
typedef struct ck_exec_graph {
    const ck_plan *pl;
    const void *ops;
    int n, from, to;
    const unsigned char *arena;
    void *graph; /* the backend's; NULL: the range could not be captured, it runs op by op */
} ck_exec_graph;

typedef struct ck_exec_graphs {
    ck_exec_graph *g;
    int n;
    size_t cap;
    /* ranges captured, graph launches, and ranges run op by op although
     * graphs were on (profiling, collectives, host reads, an interrupt) */
    int64_t captures, launches, op_by_op;
} ck_exec_graphs;

/* Destroys every graph in gs (after a list is replaced, or with the program). */
void ck_exec_graphs_clear(const ck_backend *be, ck_exec_graphs *gs);

/* What one run of a list needs: the program builds it before each run. */
typedef struct ck_exec_env {
    const ck_graph *g;
    const ck_backend *be;
    unsigned char *arena;
    size_t arena_bytes;
    unsigned char *host;     /* the host region of the list's offloaded tensors (NULL: it has none) */
    unsigned char *weights;  /* the pinned memory of streamed frozen weights (NULL: none) */
    size_t persistent;       /* the arena's persistent region: [0, persistent) */
    const int64_t *poff;     /* per graph tensor: its persistent offset, -1 otherwise */
    uint64_t seed;
    int64_t step;            /* steps taken before this one */
    int64_t update;          /* the optimizer update this step applies (1-based) */
    float lr;
    int eval;                /* a forward pass that evaluates (no dropout) */
    int fused_backward;      /* updates run inside backward: an interrupt stops only forward entries */
    const _Atomic int *interrupt; /* set from another thread to stop between two ops (NULL: never) */
    double *profile;         /* non-NULL: seconds per op kind (CK_OP_COUNT entries) added to */
    struct ck_dist_req *reqs; /* data parallel: the requests of ALLREDUCE entries, by bucket */
    int nreqs;               /* how many; the active ones are progressed after every entry */
    int replay;              /* a second pass (naming a non-finite op): ALLREDUCE entries do nothing */
    /* non-NULL: a range the backend can capture runs as one graph, captured
     * at its first run and kept here (NULL: op by op, as on the CPU) */
    ck_exec_graphs *graphs;
} ck_exec_env;

/* Runs entries [from, to) of a list. 0, or -1 with the failure naming the
 * op, its scope and its script line. */
int ck_exec_range(const ck_exec_env *e, const ck_plan *pl, int from, int to, char *err, size_t errlen);
/* Runs entries [0, to) again, scanning each entry's outputs: *entry gets the
 * first that wrote a non-finite value (-1: none), *input a parameter or input
 * it read that holds one (-1: none). */
int ck_exec_find_nonfinite(const ck_exec_env *e, const ck_plan *pl, int to, int *entry, int *input, char *err,
                           size_t errlen);
/* Data parallel on a backend with its own collectives (ops/backend.h's
 * comm_init: NCCL on CUDA): rank 0 makes the communicator's id, vm/dist
 * carries it to every rank, and each joins; once per process, a collective
 * of every rank. Nothing to do for a backend without (the CPU). 0, or -1 with
 * err. */
int ck_exec_comm_open(const ck_backend *be, char *err, size_t errlen);
/* Waits for the ops queued on the backend: 0, or -1 with the failure. */
int ck_exec_sync(const ck_backend *be, char *err, size_t errlen);
/* *finite: whether tensor id t of list pl holds only finite values. 0, or -1 with err. */
int ck_exec_tensor_finite(const ck_exec_env *e, const ck_plan *pl, int t, int *finite, char *err, size_t errlen);
/* The sentinel fill of the transient region and the scan for the last byte
 * written since (the measured peak). 0, or -1 with err. */
int ck_exec_arena_fill_sentinel(const ck_exec_env *e, char *err, size_t errlen);
int ck_exec_arena_high_water(const ck_exec_env *e, size_t *high_water, char *err, size_t errlen);

#endif
