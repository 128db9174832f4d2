/* A compiled program: the differentiated graph, its op lists (a training step
 * and a forward-only pass), the memory plan of each, and the one arena that
 * holds every byte they use. */
#ifndef CK_PROGRAM_H
#define CK_PROGRAM_H

#include "graph/stats.h"
#include "graph/train.h"
#include "plan/compile.h"
#include "run/device.h"
#include "run/exec.h"


struct ck_program;

/* What the programs of one group hold in common: the one arena and the
 * training counters. A program compiled with ck_compile_opts.share joins the
 * group of that program; any other starts its own. Every member's persistent
 * tensors that the group's first program also has (same name, kind, shape and
 * dtype: the weights, their optimizer state and gradient sums) are that
 * program's, at its offsets in [0, shared). A member may add inputs and frozen
 * weights of its own (a decoder the training program lacks): they lie above,
 * where other members keep activations, so they hold only until another member
 * runs or writes there. A member refuses to run on own weights that another
 * has overwritten since they were written (serial and actor say who last used
 * the region above shared). The arena is as large as the largest member needs. */
typedef struct ck_group {
    int refs;
    unsigned char *arena;
    size_t bytes;   /* allocated */
    size_t need;    /* the most any member's lists need (plan-only groups too) */
    size_t shared;  /* the first program's persistent bytes */
    size_t charged; /* the arena's device bytes, charged to the first program's budget */
    int64_t step;   /* steps taken by any member */
    int64_t updates; /* optimizer updates applied */
    int64_t micro;  /* steps summed since the last update (accumulation) */
    const void *actor; /* the member that last ran, or wrote above shared */
    uint64_t serial;   /* counts changes of actor */
    const ck_backend *be;
    ck_mem_budget *budget; /* where charged is charged */
    /* streamed frozen weights (ck_compile_opts.stream): their pinned host
     * memory, its bytes, and what was charged to budget for it */
    unsigned char *weights;
    size_t weight_bytes, weight_charged;
} ck_group;

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
    /* 1: on CUDA every list runs op by op; 0: each run of a list that the host
     * does not act within is one graph launch, captured at its first run */
    int no_cuda_graph;
    int plan_only;     /* plan, allocate nothing: the program cannot run */
    ck_dtype storage;  /* CK_BF16 / CK_F16: 16-bit activations, their gradients and frozen weights */
    ck_dtype frozen;   /* frozen weights' storage (CK_BF16, CK_F8E4M3); CK_F32: as storage */
    ck_loss_scale scaler; /* dynamic loss scaling (fp16's); needs an optimizer, and no fused updates */
    ck_decide_fn decide; /* the checkpoint policy; NULL keeps every activation */
    /* offload (vm/plan/offload.c): activations: every saved activation the
     * policy keeps goes to pinned host memory and back (kohya's
     * --cpu_offload_checkpointing under a policy); auto: budget and auto
     * policies choose keep, recompute or offload per tensor by predicted step
     * time; prefetch: entries between a copy and its wait (0: the default,
     * CK_PREFETCH_DEFAULT); speed: the device the cost model predicts for
     * (NULL: the table's entry for the backend's device, if any) */
    int offload;
    int prefetch;
    const struct ck_device_speed *speed;
    /* streamed frozen weights (kohya's --blocks_to_swap): the frozen
     * weights whose names are one of these or start with one and a dot (a
     * block's scope, "transformer_blocks.18") live in pinned host memory, the
     * group's weights region, and every list brings each into a transient
     * device copy per group of uses (ck_offload_schedule). A program that
     * shares weights streams those its group's first program streams, and
     * keeps its own frozen weights on the device. */
    const char *const *stream;
    int nstream;
    /* stream_trainable: the named blocks' trainable weights are streamed
     * too, with their optimizer state (as kohya's --blocks_to_swap in a full
     * fine-tune); offload_optimizer: every parameter's optimizer state (the
     * update's moments) lives in the pinned weights region, brought in for
     * its update and copied back after it (DeepSpeed's offload_optimizer;
     * the update still runs on the device). Not with data parallel. */
    int stream_trainable;
    int offload_optimizer;
    /* the statistics logging steps will compute (CK_STATS_*, as
     * ck_program_add_stats takes them), so that the one arena is sized for
     * the logging lists too */
    unsigned stats;
    const char *const *stat_blocks;
    int nstat_blocks;
    void *decide_ud;
    ck_decide_report *report; /* where the decision's figures go (NULL: not wanted), whether or not compile succeeds */
    const ck_backend *be; /* where the program runs and its arena lives; NULL: the CPU */
    /* a program to share weights, optimizer state and counters with (its
     * group: ck_group); NULL: a program of its own. Both must be runnable,
     * or both plan-only, and on one backend. */
    const struct ck_program *share;
    /* data parallel (vm/dist): the ranks of the job this program trains on
     * (0 or 1: one process). Above 1 every trainable parameter's gradient is
     * summed into a persistent grad_sum tensor (as with accumulate), the sums
     * lie one after another in the persistent region, and before the update
     * ALLREDUCE_START and ALLREDUCE_WAIT entries sum them over the ranks in
     * buckets of at most bucket_bytes (0: 25 MiB, DDP's bucket_cap_mb), the
     * last parameters first; the update reads the mean over ranks and
     * accumulated steps. A plan-only program plans one rank of world. */
    int world;
    size_t bucket_bytes;
    /* ZeRO stage 1 (world > 1): each parameter's optimizer state lives on one
     * rank, its owner (whole tensors, dealt largest first to the rank holding
     * the fewest bytes), which alone updates it; BROADCAST entries then give
     * every rank its new values. rank: this program's rank (a plan-only
     * program plans the rank given; a runnable one is the job's) */
    int shard;
    int rank;
} ck_compile_opts;

typedef struct ck_program {
    ck_graph *g;
    double decide_seconds, plan_seconds; /* thread CPU time: the policy's decision, the training list's plan */
    size_t none_peak; /* the training list's placed peak with no recompute, where the decision placed it (0: not) */
    int loss;
    int *retain;       /* per tensor: readable after the list ends */
    ck_plan train;     /* forward, backward, optimizer (n == 0 without a loss) */
    ck_plan eval;      /* forward only: the loss and the outputs */
    size_t persistent; /* bytes of parameters, inputs and optimizer state */
    int64_t *poff;     /* per tensor: offset of a persistent tensor, -1 otherwise */
    /* per tensor: 1 for a streamed weight or optimizer state, whose poff is its offset in
     * grp->weights (pinned host memory), not in the arena; NULL: none */
    unsigned char *streamed;
    const ck_backend *be;
    ck_group *grp;     /* the arena (grp->arena: the backend's memory, device memory on a GPU) and counters */
    size_t arena_bytes; /* the bytes this program's lists need (the group's arena holds at least these) */
    float *stage;      /* host copy of one tensor on a device backend (ck_program_read) */
    size_t stage_bytes;
    ck_compile_opts opt;
    /* steps taken (grp->step), optimizer updates applied (grp->updates: steps
     * taken less those a guard skipped): counted for the whole group */
    int eval_mode;     /* forward passes evaluate (no dropout); steps always train */
    unsigned stat_groups; /* the statistics' groups its logging lists compute (CK_STATS_*) */
    /* gradient accumulation (opt.accumulate > 1): the sums (persistent, zeroed
     * after each update), the graph nodes that add into them (the first
     * entries of the optimizer's tail), and the steps summed since the update */
    int *accums;
    int naccum;
    int accum_nodes[2]; /* [first, end) */
    const ck_plan *last;
    /* set from another thread to stop a run between two ops (NULL: never) */
    const _Atomic int *interrupt;
    /* logging: the training list plus stat entries, per stats mask ([0] unused,
     * n == 0 where not built), the statistics and the block names they use */
    ck_plan logplan[CK_STATS_ALL + 1];
    ck_stat_set st;
    /* when non-NULL, seconds spent per op kind (CK_OP_COUNT entries): ck_exec adds to it */
    double *profile;
    /* the ranges of its lists captured as graphs (a backend with capture, opt.no_cuda_graph == 0) */
    ck_exec_graphs graphs;
    /* the memory budget of the graph it was compiled from (NULL: none) and
     * what the program charged to it besides its graph's own charges: its op
     * lists and per-tensor arrays (own) and the stage; all given back when it
     * is freed (the arena's device bytes are the group's: ck_group.charged) */
    ck_mem_budget *budget;
    size_t charged_own, charged_stage;
    /* a group member's own frozen weights (above grp->shared): per tensor, the
     * group's serial when it was last written (NULL: it has none) */
    uint64_t *own_at;
    /* offload: the host region (pinned on a device) the lists' host ids
     * live in, its bytes (the largest list's host_peak), what was charged to
     * the budget for it; and what the decision said (the joint search's why) */
    unsigned char *host;
    size_t host_bytes, host_charged;
    char offload_why[256];
    /* data parallel: one request per bucket (opt.world > 1), and the buckets'
     * bytes (the gradient sums, padding included) */
    struct ck_dist_req *reqs;
    int nbuckets;
    size_t bucket_total;
    /* loss scaling (opt.scaler.on): the scale (the loss's gradient), the
     * updates applied since it last changed, and 1/scale, which the update
     * multiplies the gradients by (an input the step writes); -1 without */
    int scale_t, tracker_t, inv_t;
    /* data parallel and runnable: each step opens the backend's communicator
     * if it is not open yet (once per process, ck_exec_comm_open) */
    int comm;
    /* ZeRO-1 (opt.shard): per tensor below nowner, the rank owning a
     * parameter's optimizer state (-1 for other tensors); NULL unsharded */
    int *owner;
    int nowner;
    char err[512];
} ck_program;

/* Charges g's budget (g->budget) before each allocation it makes: its copy of
 * the graph and what autodiff adds, its op lists and plans, and the arena (the
 * device bytes its plan states, ck_program_device_bytes) before the backend allocates
 * it; one that would pass the limit fails with err saying what and by how much
 * (ck_mem_take). */
ck_program *ck_compile(const ck_graph *g, const ck_compile_opts *o, char *err, size_t errlen);
/* What "auto" means: "cuda" when a CUDA device is present, else "cpu" (looks,
 * opens nothing). */
const char *ck_program_default_device(void);
/* The backend called "cpu" or "cuda"; "auto" (or NULL): ck_program_default_device().
 * plan_only: "cuda" without a device is its rules alone (ck_backend_cuda_plan).
 * NULL with the reason in err. */
const ck_backend *ck_program_backend_find(const char *name, int plan_only, char *err, size_t errlen);
/* The device memory a program with an arena of `arena` bytes takes on be: the
 * arena rounded up to the allocator's pages, plus the backend's fixed bytes
 * (the arena alone on the CPU). */
size_t ck_program_device_bytes(const ck_backend *be, size_t arena);
void ck_program_free(ck_program *p);
/* Host memory outside the arena that p takes, for the plan's statement of
 * what it does not plan: its graph and op lists (every plan, the statistics
 * and the per-tensor arrays), and the largest stage a read or write of one
 * tensor can need (0 on the CPU when every tensor is fp32). */
size_t ck_program_host_bytes(const ck_program *p);
size_t ck_program_stage_bound(const ck_program *p);
/* The optimizer state of parameter t as an unsharded program of the job
 * holds it, whichever rank owns it: the count (0 for a tensor that is no
 * trainable parameter), each state's name ("exp_avg.<parameter>"), shape and
 * dtype; *owner gets the rank that holds it under ZeRO-1, or -1 when every
 * rank does. A training state of a sharded job is saved in this layout. */
#define CK_STATE_NAME_MAX 1024
int ck_program_param_state(const ck_program *p, int t, char names[2][CK_STATE_NAME_MAX], ck_shape shape[2],
                           ck_dtype dtype[2], int *owner);
/* One training step (forward, backward, optimizer). 0 or -1 with p->err. */
int ck_program_step(ck_program *p);
/* The forward pass only. */
int ck_program_forward(ck_program *p);
/* The tensors only p holds in its group (its own inputs and frozen weights,
 * above the shared region) back to the values compile gave them (the seeded
 * init); nothing for a group's first program. 0 or -1 with p->err. */
int ck_program_init_own(ck_program *p);

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
    float loss_scale;     /* the scale the step's gradients carry (1 without loss scaling) */
    int overflow;         /* loss scaling: finite loss, gradients not; the update skipped, the scale backed off */
} ck_run_info;
/* 0 or -1 with p->err. On a non-finite step (guard) the list up to the
 * optimizer runs a second time checking every output, to name the first op
 * that made a non-finite value; steps that are finite pay for one scan of the
 * loss and the gradients. */
int ck_program_run(ck_program *p, const ck_run_opts *o, ck_run_info *r);

/* vm/run/logstats.c: adds the stat nodes of the groups asked for (gradient norms
 * of every trainable parameter, statistics of every block's output) and builds
 * a logging list per combination of groups, each planned like the training
 * list. A block is the prefix of a scope that one of the patterns matches ('*'
 * matches one dotted component), or else the scope's first component. Once per
 * program: ck_compile calls it for opts.stats before it sizes the arena; on a
 * program whose arena exists it fails, changing nothing, when a logging list
 * needs more than the arena holds (the arena is never reallocated). 0 or -1
 * with err. */
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

/* One training step on an arena first filled with a sentinel; *high_water gets
 * the offset just past the last byte the step wrote: the measured peak. */
int ck_program_step_measured(ck_program *p, size_t *high_water);

#endif
