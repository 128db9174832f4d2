/* A compiled program: the differentiated graph, its op lists (a training step
 * and a forward-only pass), the memory plan of each, and the one arena that
 * holds every byte they use. */
#ifndef CK_PROGRAM_H
#define CK_PROGRAM_H

#include "graph.h"
#include "../ops/backend.h"

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
    const ck_backend *be; /* the workspace rules */
} ck_decide_ctx;

/* A checkpoint decision: per graph tensor, 1 when backward recomputes it instead
 * of keeping it. Returns 0, or -1 with a message. */
typedef int (*ck_decide_fn)(void *ud, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen);

/* The peak and recompute FLOPs of one trial decision; exact: place every byte
 * (the true peak), otherwise the most bytes live at once (a lower bound, fast). */
int ck_decide_eval(const ck_decide_ctx *c, const unsigned char *recompute, int exact, size_t *peak, double *flops);

typedef enum ck_optim { CK_OPTIM_NONE = 0, CK_OPTIM_SGD, CK_OPTIM_ADAMW, CK_OPTIM_LION, CK_OPTIM_ADAMW8 } ck_optim;

typedef struct ck_compile_opts {
    int loss;          /* tensor id, -1 for a forward-only program */
    const int *outputs; /* tensors the host reads after a run */
    int noutputs;
    ck_optim optim;
    float lr, beta1, beta2, eps, weight_decay;
    float max_grad_norm; /* > 0: gradients scaled as torch.nn.utils.clip_grad_norm_ does before the update */
    int accumulate;      /* > 1: gradients summed over this many steps, the update every accumulate-th step */
    int fused_backward;  /* each update runs as soon as its gradient is complete (kohya's --fused_backward_pass) */
    uint64_t seed;
    int keep_grads;    /* gradients stay readable after a step (no optimizer update needed) */
    int plan_only;     /* plan, allocate nothing: the program cannot run */
    ck_dtype storage;  /* CK_BF16 / CK_F16: plan 16-bit activations and frozen weights (plan_only) */
    ck_dtype frozen;   /* frozen weights' storage (CK_BF16, CK_F8E4M3); CK_F32: as storage */
    ck_decide_fn decide; /* the checkpoint policy; NULL keeps every activation */
    void *decide_ud;
    const ck_backend *be; /* where the program runs and its arena lives; NULL: the CPU */
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


/* Statistics that logging steps compute (vm/logstats.c), by group. */
enum { CK_STATS_GRADS = 1, CK_STATS_ACTS = 2, CK_STATS_ALL = 3 };

/* One statistic: a stat node of the graph reducing one tensor. Stat nodes have
 * phase BACKWARD, so no checkpoint policy sees them; only the logging lists
 * run them. */
typedef struct ck_stat {
    int group;  /* CK_STATS_GRADS: SUMSQ of a parameter's gradient; CK_STATS_ACTS: STATS of a block output */
    int node;   /* the stat node */
    int src;    /* the tensor it reduces */
    int out;    /* its output: [1] squared norm, or [3] mean, std, absmax */
    int param;  /* grads: the parameter; -1 otherwise */
    int block;  /* index into ck_program.blocks */
    int placed; /* 1 when the training list makes src (the logging lists run it) */
} ck_stat;

typedef struct ck_program {
    ck_graph *g;
    int loss;
    int *retain;       /* per tensor: readable after the list ends */
    ck_plan train;     /* forward, backward, optimizer (n == 0 without a loss) */
    ck_plan eval;      /* forward only: the loss and the outputs */
    size_t persistent; /* bytes of parameters, inputs and optimizer state */
    int64_t *poff;     /* per tensor: offset of a persistent tensor, -1 otherwise */
    const ck_backend *be;
    unsigned char *arena; /* the backend's memory: device memory on a GPU */
    size_t arena_bytes;
    float *stage;      /* host copy of one tensor on a device backend (ck_program_read) */
    size_t stage_bytes;
    ck_compile_opts opt;
    int64_t step;      /* steps taken */
    int64_t updates;   /* optimizer updates applied (steps taken less those a guard skipped) */
    int eval_mode;     /* forward passes evaluate (no dropout); steps always train */
    /* gradient accumulation (opt.accumulate > 1): the sums (persistent, zeroed
     * after each update), the graph nodes that add into them (the first
     * entries of the optimizer's tail), and the steps summed since the update */
    int *accums;
    int naccum;
    int accum_nodes[2]; /* [first, end) */
    int64_t micro;
    const ck_plan *last;
    /* set from another thread to stop a run between two ops (NULL: never) */
    const volatile int *interrupt;
    /* logging: the training list plus stat entries, per stats mask ([0] unused,
     * n == 0 where not built), the statistics and the block names they use */
    ck_plan logplan[CK_STATS_ALL + 1];
    ck_stat *stats;
    int nstats;
    char **blocks;
    int nblocks;
    unsigned stat_groups;
    /* when non-NULL, seconds spent per op kind (CK_OP_COUNT entries): ck_exec adds to it */
    double *profile;
    char err[512];
} ck_program;

ck_program *ck_compile(const ck_graph *g, const ck_compile_opts *o, char *err, size_t errlen);
/* What "auto" means: "cuda" when a CUDA device is present, else "cpu" (looks,
 * opens nothing). */
const char *ck_default_device(void);
/* The backend called "cpu" or "cuda"; "auto" (or NULL): ck_default_device(). plan_only: "cuda" without a device is its
 * rules alone (ck_backend_cuda_plan). NULL with the reason in err. */
const ck_backend *ck_backend_find(const char *name, int plan_only, char *err, size_t errlen);
/* The device memory a program with an arena of `arena` bytes takes on be: the
 * arena rounded up to the allocator's pages, plus the backend's fixed bytes
 * (the arena alone on the CPU). */
size_t ck_device_bytes(const ck_backend *be, size_t arena);
void ck_program_free(ck_program *p);
/* One training step (forward, backward, optimizer). 0 or -1 with p->err. */
int ck_program_step(ck_program *p);
/* The forward pass only. */
int ck_program_forward(ck_program *p);

/* A training step as a logging script asks for it. */
typedef struct ck_run_opts {
    unsigned stats; /* run the logging list of these stat groups (0: the plain list) */
    int guard;      /* check the loss and the gradients before the update; skip it when any is non-finite */
    int measure;    /* measure the arena's high-water mark (sentinel fill and scan) */
} ck_run_opts;

typedef struct ck_run_info {
    const ck_plan *plan;  /* the list that ran */
    int nonfinite;        /* guard: the loss or a gradient was non-finite; the update was not applied */
    int loss_nonfinite;   /* the loss was */
    int bad_entry;        /* nonfinite: the first list entry whose output held a non-finite value, -1 */
    int bad_input;        /* a parameter or input of that entry holding non-finite values, -1 */
    size_t high_water;    /* measure: bytes from the arena's start to the last byte the step wrote */
} ck_run_info;
/* 0 or -1 with p->err. On a non-finite step (guard) the list up to the
 * optimizer runs a second time checking every output, to name the first op
 * that made a non-finite value; steps that are finite pay for one scan of the
 * loss and the gradients. */
int ck_program_run(ck_program *p, const ck_run_opts *o, ck_run_info *r);

/* vm/logstats.c: adds the stat nodes of the groups asked for (gradient norms
 * of every trainable parameter, statistics of every block's output) and builds
 * a logging list per combination of groups, each planned like the training
 * list; grows the arena when one needs more. A block is the prefix of a scope
 * that one of the patterns matches ('*' matches one dotted component), or else
 * the scope's first component. Once per program. 0 or -1 with err. */
int ck_program_add_stats(ck_program *p, unsigned groups, const char *const *patterns, int npatterns, char *err,
                         size_t errlen);
/* Where a tensor's values are in the arena (a device address on a GPU), or
 * NULL if the last run did not keep it. */
float *ck_program_data(ck_program *p, int t);
/* A tensor's values on the host, valid until the next read, write or run of
 * p: the arena itself on the CPU, a copy on a device. NULL when the last run
 * did not keep it (p->err empty) or the copy failed (p->err says why). */
const float *ck_program_read(ck_program *p, int t);
/* Host memory for a tensor's new values: write them, then call
 * ck_program_write_end (which uploads them on a device). keep: the memory
 * starts with the current values (for partial writes). NULL as for
 * ck_program_read. */
float *ck_program_write_begin(ck_program *p, int t, int keep);
int ck_program_write_end(ck_program *p, int t);

/* vm/schedule.c: the op list of the given graph nodes (forward nodes first, in
 * graph order, then the rest), with recompute entries placed before the first
 * backward use of every tensor marked in recompute (NULL: none). */
int ck_schedule(ck_plan *pl, const ck_graph *g, const int *nodes, int n, const unsigned char *recompute);
/* The checkpoint candidates: every forward activation. Marking one that
 * backward reads frees it after the forward pass; marking one that only a
 * recomputation reads lets that recomputation make it again instead of
 * holding it. Returns their count; ids into out (g->nt entries at most). */
int ck_saved_activations(const ck_graph *g, int *out);
/* The logging variant of a scheduled list: base plus, right after the entry
 * that writes each stat node's input, that node (activations are reduced
 * where the forward pass makes them, so recompute holds nothing more). base
 * was scheduled when the graph had base_nt tensors: its recomputed copies are
 * renumbered above g->nt. placed[k] (may be NULL) gets 1 for the nodes placed;
 * a node whose input the list never writes is left out. */
int ck_schedule_stats(ck_plan *pl, const ck_plan *base, int base_nt, const ck_graph *g, const int *nodes, int n,
                      int *placed);

/* vm/memplan.c: liveness over a scheduled list, then offsets in one arena. */
int ck_plan_memory(ck_plan *pl, const ck_graph *g, const int64_t *poff, size_t persistent, const int *retain,
                   const ck_backend *be);
/* The most bytes live at once, without placing anything (fast; for searches). */
size_t ck_plan_live_peak(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, const ck_backend *be);
/* Live bytes at every list position by category (persistent ones included):
 * n * CK_CAT_COUNT entries, malloc'd; NULL on out of memory. */
size_t *ck_plan_timeline(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, const ck_backend *be);
void ck_plan_free(ck_plan *pl);
int ck_is_persistent(ck_kind k);
ck_cat ck_tensor_cat(const ck_plan *pl, const ck_graph *g, int id);
/* bf16 storage: whether list entry i runs the backend's bf16 kernel (every
 * operand bf16, and the backend has one); when it does not, the bytes of the
 * fp32 copies of its 16-bit operands, placed at the start of its workspace
 * (inputs, then outputs, each rounded up to 64 bytes) */
int ck_entry_bf16_native(const ck_plan *pl, const ck_graph *g, int i, const ck_backend *be);
size_t ck_entry_convert_bytes(const ck_plan *pl, const ck_graph *g, int i);
/* FLOPs of list entry i */
double ck_plan_op_flops(const ck_plan *pl, const ck_graph *g, int i);
/* bytes of tensor id (a graph tensor or a recomputed copy) */
size_t ck_plan_tensor_bytes(const ck_plan *pl, const ck_graph *g, int id);

/* vm/exec.c: runs one list on the program's backend. */
int ck_exec(ck_program *p, const ck_plan *pl, char *err, size_t errlen);
/* Runs entries [from, to) of a list. */
int ck_exec_range(ck_program *p, const ck_plan *pl, int from, int to, char *err, size_t errlen);
/* Runs entries [0, to) again, scanning each entry's outputs: *entry gets the
 * first that wrote a non-finite value (-1: none), *input a parameter or input
 * it read that holds one (-1: none). */
int ck_exec_find_nonfinite(ck_program *p, const ck_plan *pl, int to, int *entry, int *input, char *err,
                           size_t errlen);
/* Waits for the ops queued on the backend: 0, or -1 with the failure. */
int ck_exec_sync(ck_program *p, char *err, size_t errlen);
/* *finite: whether tensor id t of list pl holds only finite values. 0, or -1 with p->err. */
int ck_exec_tensor_finite(ck_program *p, const ck_plan *pl, int t, int *finite);
/* The sentinel fill of the transient region and the scan for the last byte
 * written since (the measured peak). 0, or -1 with p->err. */
int ck_arena_fill_sentinel(ck_program *p);
int ck_arena_high_water(ck_program *p, size_t *high_water);
/* One training step on an arena first filled with a sentinel; *high_water gets
 * the offset just past the last byte the step wrote: the measured peak. */
int ck_program_step_measured(ck_program *p, size_t *high_water);

#endif
