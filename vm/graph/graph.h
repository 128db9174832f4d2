/* The op graph: tensors (shape, dtype, kind, name, scope, script line) and the
 * nodes that produce them. Op constructors only record; nothing is computed
 * here. Knows nothing of Lua: errors come back as a status and a message. */
#ifndef CK_GRAPH_H
#define CK_GRAPH_H

#include "../../ops/ops.h"
#include "util/budget.h"

typedef enum ck_kind {
    CK_KIND_ACT = 0,   /* made by a node */
    CK_KIND_INPUT,     /* set by the host before a step */
    CK_KIND_PARAM,     /* trainable parameter */
    CK_KIND_FROZEN,    /* parameter that gets no gradient */
    CK_KIND_GRAD,      /* gradient of a trainable parameter */
    CK_KIND_OPTSTATE,  /* optimizer state (AdamW moments) */
    CK_KIND_COUNT
} ck_kind;

typedef enum ck_init { CK_INIT_ZEROS = 0, CK_INIT_ONES, CK_INIT_NORMAL, CK_INIT_UNIFORM } ck_init;

typedef enum ck_phase { CK_PHASE_FORWARD = 0, CK_PHASE_BACKWARD, CK_PHASE_OPTIMIZER, CK_PHASE_RECOMPUTE } ck_phase;

/* the names scripts and files use: "activation", "input", "param", "frozen",
 * "grad", "optimizer_state"; "forward", "backward", "optimizer", "recompute" */
const char *ck_graph_kind_name(ck_kind k);
const char *ck_graph_phase_name(ck_phase ph);

/* A graph holds hundreds of thousands of tensors and nodes (the planner's
 * memory is mostly theirs): the small fields are bit-fields packed in one
 * word. */
typedef struct ck_tensor {
    ck_shape shape;
    ck_dtype dtype : 8;
    ck_kind kind : 8;
    unsigned needs_grad : 1;
    ck_init init : 8; /* parameters: how the runtime fills them */
    char *name;   /* full dotted name for parameters and inputs, NULL otherwise */
    const char *scope; /* diffusers-style scope, "" at the top (the graph's strings) */
    const char *where; /* script "file:line" that made it (the graph's strings) */
    int node;     /* producing node, -1 for leaves */
    int grad;     /* gradient tensor after autodiff, -1 if none */
    float init_a, init_b;
    float lr_scale; /* trainable parameters: the learning-rate multiplier (1; LoRA+) */
} ck_tensor;

typedef struct ck_node {
    enum ck_op op : 16;
    unsigned nin : 4, nout : 4;
    ck_phase phase : 8;
    int in[CK_MAX_IN];
    int out[CK_MAX_OUT]; /* -1: slot unwanted */
    ck_op_params p;
    const char *scope; /* the graph's strings, as a tensor's */
    const char *where;
} ck_node;


typedef struct ck_graph {
    ck_tensor *t;
    int nt, capt;
    ck_node *n;
    int nn, capn;
    const char *scope; /* current scope for new tensors and nodes: scope_own, or
                        * for a while one of the graph's strings (autodiff) */
    char *scope_own;
    /* 1: each optimizer update runs as soon as nothing reads its parameter or
     * gradient any more (vm/plan/schedule.c), so gradients do not wait for the
     * end of backward */
    int fused_updates;
    /* 1: data parallel with its sums overlapped with backward: each gradient's
     * accumulation into its sum runs as soon as the gradient is complete, and
     * each bucket's ALLREDUCE_START as soon as its last sum is
     * (vm/plan/schedule.c); the waits and the update stay at the end */
    int comm_overlap;
    /* the budget its growth is charged to (NULL: none), and what it charged,
     * given back when it is freed: every new tensor, node and string is
     * charged before it is made, so a graph that would pass the limit fails
     * to grow with g->err saying so */
    ck_mem_budget *budget;
    size_t charged;
    /* the named tensors by name: an open-addressing table of tensor ids (-1
     * empty), names_cap a power of two at least twice named (0: none yet) */
    int *names;
    int names_cap, named;
    /* every scope and script line its tensors and nodes name, held once: an
     * open-addressing table of strings (NULL empty), strs_cap a power of
     * two at least twice nstrs */
    char **strs;
    int strs_cap, nstrs;
    char err[512];
} ck_graph;

ck_graph *ck_graph_new(void);
/* A deep copy charged to nothing (its owner charges it, then sets budget and
 * charged to ck_graph_host_bytes of it). */
ck_graph *ck_graph_clone(const ck_graph *g);
void ck_graph_free(ck_graph *g);
/* The host memory g holds (its arrays at their capacity and every string, in
 * the C library's chunks), for the plan's list of what it does not plan. */
size_t ck_graph_host_bytes(const ck_graph *g);
/* A malloc of n bytes as the C library takes it: a chunk of at least 32
 * bytes, n plus its 8-byte header rounded up to 16 (glibc on 64 bits). */
size_t ck_graph_malloc_chunk(size_t n);

/* Removes the tensors from nt on and the nodes from nn on (the last ones
 * added: a step that failed part way undone), names and all. */
void ck_graph_truncate(ck_graph *g, int nt, int nn);

/* Scope and script line that new tensors and nodes record. */
void ck_graph_set_scope(ck_graph *g, const char *scope);
/* Adds a leaf (parameter or input); returns its id. */
int ck_graph_leaf(ck_graph *g, ck_kind kind, const char *name, const ck_shape *shape, const char *where);
/* The tensor named name, or -1: a lookup in g's table of names. */
int ck_graph_find(const ck_graph *g, const char *name);

/* bytes one tensor holds in its dtype */
static inline size_t ck_tensor_bytes(const ck_tensor *t)
{
    return (size_t)ck_shape_numel(&t->shape) * ck_dtype_bytes(t->dtype);
}

/* Adds a node; infers the output shapes (outs[k] preset with ndim >= 0 asks for that
 * shape, which the rule checks). Fills out_ids with the new tensors (or -1 for an
 * unwanted slot: want == NULL means every slot is wanted). Returns the node id, or
 * -1 with g->err set to "op in scope: what is wrong". */
int ck_graph_node(ck_graph *g, enum ck_op op, const int *in, int nin, const ck_op_params *p,
                  ck_shape *outs, const int *want, int *out_ids, const char *where);

/* vm/graph/autodiff.c: appends backward nodes for d(loss)/d(every trainable parameter);
 * sets t[param].grad. seed: a tensor of the loss's shape that backward starts
 * from as the loss's gradient (a loss scale), or -1 for 1. Returns 0, or -1
 * with g->err set. */
int ck_autodiff(ck_graph *g, int loss, int seed);

#endif
