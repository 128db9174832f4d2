/* The planner's types and passes (vm/plan): an op list scheduled from the
 * graph, recompute placed in it, and every tensor it touches given an offset
 * in one arena. Below the program: nothing here knows a program or an arena's
 * memory, only its rules (the backend's workspace and alignment). */
#ifndef CK_PLAN_H
#define CK_PLAN_H

#include "graph/graph.h"
#include "../../ops/backend.h"

/* The most nodes a graph compile plans may have (before differentiation,
 * which adds a few per node): list entries, tree positions and the
 * tracker's keys stay within their integers. */
#define CK_PLAN_MAX_NODES (1 << 20)

/* One entry of an op list: a graph node run on the tensors named here. A
 * recompute entry reruns a forward node and writes a copy of its output, a
 * tensor id >= g->nt whose origin is the forward tensor; backward entries read
 * such copies in place of the forward tensors that were not kept. */
typedef struct ck_op_ref {
    int node;
    ck_phase phase : 8;
    /* the type its kernel runs in (ck_plan_entry_kernel_type), set by the memory
     * plan for the backend it plans for: the executor runs that kernel */
    ck_dtype kt : 8;
    int nin, nout;
    int in[CK_MAX_IN];
    int out[CK_MAX_OUT]; /* -1: slot unwanted */
    /* a transfer (vm/plan/offload.c), not the node's kernel: node names the
     * producer of the tensor it moves, slot its copy (ck_xfer) */
    unsigned xfer : 3;
    unsigned slot : 29;
} ck_op_ref;

/* Transfer entries of offloaded tensors. OUT copies in[0] (device) to out[0]
 * (a host id) on the copy stream behind every entry before it; OUT_WAIT
 * orders the entries after it behind that copy (in[0] is held until then);
 * IN copies in[0] (host) to out[0] (a device copy whose origin is the
 * tensor) behind every entry before it; IN_WAIT orders the entries after it
 * (its first reader) behind that copy. A wait names its copy's slot. */
typedef enum ck_xfer { CK_XFER_NONE = 0, CK_XFER_OUT, CK_XFER_OUT_WAIT, CK_XFER_IN, CK_XFER_IN_WAIT } ck_xfer;

/* where a tensor id of a list lives (ck_plan.loc; NULL: every id on the device) */
enum { CK_LOC_DEVICE = 0, CK_LOC_HOST = 1, CK_LOC_BACK = 2 /* a device copy brought back from the host */ };

/* What the memory plan reports, by category. */
typedef enum ck_cat {
    CK_CAT_FROZEN = 0, CK_CAT_TRAINABLE, CK_CAT_GRADIENTS, CK_CAT_OPTSTATE, CK_CAT_INPUTS,
    CK_CAT_ACTIVATIONS, CK_CAT_RECOMPUTED, CK_CAT_WORKSPACE, CK_CAT_COUNT
} ck_cat;

extern const char *const ck_plan_cat_names[CK_CAT_COUNT];

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
    /* offload (vm/plan/offload.c; all 0 / NULL without): per tensor id its
     * CK_LOC_* (off[] of a host id is its offset in the host region), the
     * host region's bytes (placed like the arena, by live overlap), the
     * copies' slots, the bytes each way a step moves, and the prefetch
     * distance in entries the transfers were placed at; stream_bytes: the
     * bytes of streamed frozen weights a run of the list brings in (their
     * host ids are the graph's frozen tensors, whose off[] is their offset in
     * the program's pinned weights: ck_offload_schedule) */
    unsigned char *loc;
    size_t host_peak;
    int nslots;
    size_t offload_bytes;
    int prefetch;
    size_t stream_bytes;
} ck_plan;

/* The host memory pl's arrays hold (ck_graph_malloc_chunk of each). */
size_t ck_plan_host_bytes(const ck_plan *pl);

/* What a checkpoint policy sees: the differentiated graph, the training list
 * before scheduling, and the candidates (ck_plan_saved_activations). It can
 * evaluate trial decisions with vm/plan/evaluate.h. */
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
    struct ck_evaluator *ev; /* the list's evaluator (vm/plan/evaluate.h), shared by the searches and the plan */
    /* offload (vm/plan/offload.h): 1 when a search may mark CK_OFFLOAD (the
     * joint search of vm/plan/offsearch.c), the prefetch distance, the
     * device's speeds the cost model predicts step times by (NULL: none
     * known), and a line the search says what it chose in */
    int offload, prefetch;
    const struct ck_device_speed *speed;
    char *why;
    size_t whylen;
    /* what a budget or auto decision says beside its marks (NULL: not wanted) */
    struct ck_decide_report *report;
    /* bytes a budget's or auto's room is cut by: what the list the decision
     * sees lacks at the planned list's peak (the streamed weights'
     * device copies: ck_plan_step, vm/plan/compile.c, decides again with them cut when the
     * plan passes the budget) */
    size_t cut;
} ck_decide_ctx;

/* The figures a decision under a budget found, for a caller that weighs
 * budgets (ck.fit) without reading them back from a message: none's placed
 * peak where the decision placed it, and when nothing fits the smallest
 * peak it could plan (with offload where offload was allowed), the smallest
 * without offload (where it was allowed) and with it (where it was not: what
 * --offload auto would reach). 0: not known. */
typedef struct ck_decide_report {
    size_t none_peak;
    size_t floor, floor_without, floor_offload;
    size_t budget; /* the budget or room the decision aimed under, before the cut; 0: none (a fixed policy) */
} ck_decide_report;

/* A checkpoint decision: per graph tensor, 1 when backward recomputes it instead
 * of keeping it, CK_OFFLOAD when it is kept in pinned host memory between its
 * forward and backward uses (vm/plan/offload.c). Returns 0, or -1 with a message. */
#define CK_OFFLOAD 2
typedef int (*ck_decide_fn)(void *ud, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen);

/* vm/plan/schedule.c: the op list of the given graph nodes (forward nodes first, in
 * graph order, then the rest), with recompute entries placed before the first
 * backward use of every tensor marked in recompute (NULL: none). */
int ck_schedule(ck_plan *pl, const ck_graph *g, const int *nodes, int n, const unsigned char *recompute);
/* The checkpoint candidates: every forward activation. Marking one that
 * backward reads frees it after the forward pass; marking one that only a
 * recomputation reads lets that recomputation make it again instead of
 * holding it. Returns their count; ids into out (g->nt entries at most). */
int ck_plan_saved_activations(const ck_graph *g, int *out);
/* A copy of planned list src whose recomputed copies are renumbered after the
 * graph grew from base_nt to g_nt tensors (ck_program_add_stats appends stat
 * nodes): copies move above g_nt and the new graph tensors are not in the
 * list, so that every id below g_nt means the graph's tensor again. 0, or -1
 * (out of memory) with dst empty. */
int ck_plan_renumbered(const ck_plan *src, int base_nt, int g_nt, ck_plan *dst);

/* The logging variant of a scheduled list: base plus, right after the entry
 * that writes each stat node's input, that node (activations are reduced
 * where the forward pass makes them, so recompute holds nothing more). base
 * must number its recomputed copies above g->nt (ck_plan_renumbered after the
 * stat nodes were added). placed[k] (may be NULL) gets 1 for the nodes placed;
 * a node whose input the list never writes is left out. */
int ck_schedule_stats(ck_plan *pl, const ck_plan *base, const ck_graph *g, const int *nodes, int n, int *placed);

/* vm/plan/memplan.c: liveness over a scheduled list, then offsets in one arena. */
int ck_plan_memory(ck_plan *pl, const ck_graph *g, const int64_t *poff, size_t persistent, const int *retain,
                   const ck_backend *be);
/* What an evaluator (vm/plan/evaluate.h) already knows of a list: each
 * node's workspace and FLOPs (per graph node; NULL: worked out per entry),
 * and a placement it made (NULL: none), used when its buffers are the list's. */
typedef struct ck_plan_known {
    const size_t *ws_node;
    const double *flops_node;
    const struct ck_place_buf *placed;
    int nplaced;
    int64_t top;
} ck_plan_known;
int ck_plan_memory_known(ck_plan *pl, const ck_graph *g, const int64_t *poff, size_t persistent, const int *retain,
                         const ck_backend *be, const ck_plan_known *known);
/* The most bytes live at once, without placing anything (fast; for searches). */
size_t ck_plan_live_peak(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, const ck_backend *be);
/* Live bytes at every list position by category (persistent ones included):
 * n * CK_CAT_COUNT entries, malloc'd; NULL on out of memory. */
size_t *ck_plan_timeline(const ck_plan *pl, const ck_graph *g, size_t persistent, const int *retain, const ck_backend *be);
void ck_plan_free(ck_plan *pl);
/* h continued over pl's entries, offsets, workspaces and peak (FNV-1a,
 * vm/util/hash.h): equal for two plans the same to the byte */
uint64_t ck_plan_digest(const ck_plan *pl, uint64_t h);
int ck_plan_is_persistent(ck_kind k);
ck_cat ck_plan_tensor_cat(const ck_plan *pl, const ck_graph *g, int id);
/* 16-bit storage: the type of the kernel list entry i runs: CK_BF16 or CK_F16
 * when the backend has that type's kernel (ck_backend_kernels16) and every
 * operand is of it (but the inputs every kernel reads in fp32,
 * ck_op_f32_inputs), or for a product or convolution (ck_op_autocast) a 16-bit
 * activation among operands of that type, fp32 or fp8, which are cast; else
 * CK_F32. The bytes of the copies its kernel reads and writes in its own type
 * (16-bit kt: kt copies of its fp32 and fp8 operands; else fp32 copies of its
 * 16- and 8-bit ones), placed at the start of its workspace (inputs, then
 * outputs, each rounded up to 64 bytes) */
ck_dtype ck_plan_entry_kernel_type(const ck_plan *pl, const ck_graph *g, int i, const ck_backend *be);
size_t ck_plan_entry_convert_bytes(const ck_plan *pl, const ck_graph *g, int i, ck_dtype kt);
/* the type an operand of dtype dt (input slot input of op, or -1 for an
 * output) is copied into for a kernel of type kt, or dt itself when the
 * kernel reads it as it is (ck_op_f32_inputs: slots every kernel reads in
 * fp32, such as ROPE's table, are copied to fp32 if at all) */
ck_dtype ck_plan_entry_copy_type(enum ck_op op, int input, ck_dtype dt, ck_dtype kt);
/* the workspace list entry i needs: the copies ck_plan_entry_convert_bytes counts,
 * then the kernel's own (the backend's rule) */
size_t ck_plan_entry_workspace(const ck_plan *pl, const ck_graph *g, int i, const ck_backend *be);
/* FLOPs of list entry i */
double ck_plan_op_flops(const ck_plan *pl, const ck_graph *g, int i);
/* bytes of tensor id (a graph tensor or a recomputed copy) */
size_t ck_plan_tensor_bytes(const ck_plan *pl, const ck_graph *g, int id);

#endif
