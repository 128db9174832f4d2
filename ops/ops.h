/* The op set: one enum (append-only), the parameter block every node carries,
 * and the kernel calling convention shared by every backend.
 * Nothing here knows Lua or the graph; vm/ builds on it. */
#ifndef CK_OPS_H
#define CK_OPS_H

#include <stddef.h>
#include <stdint.h>

#define CK_MAX_DIMS 6
#define CK_MAX_IN 4
#define CK_MAX_OUT 3

/* How a tensor is stored; kernels compute in fp32 (ops/bf16.h, ops/fp8.h).
 * CK_F8E4M3: float8 e4m3fn, for frozen weights only. CK_U8: bytes that a
 * kernel reads as they are (8-bit optimizer state, ops/adam8.h). */
typedef enum ck_dtype { CK_F32 = 0, CK_BF16 = 1, CK_F16 = 2, CK_F8E4M3 = 3, CK_U8 = 4 } ck_dtype;

static inline unsigned ck_dtype_bytes(ck_dtype d)
{
    return d == CK_F32 ? 4u : d == CK_F8E4M3 || d == CK_U8 ? 1u : 2u;
}

/* whether an fp32 kernel reads and writes a tensor of this storage through an
 * fp32 copy (the narrow floats), rather than as it is (fp32, bytes) */
static inline int ck_dtype_copied(ck_dtype d) { return d != CK_F32 && d != CK_U8; }

/* The ops, numbered in ops.def's order (append-only). Every tensor is
 * contiguous row-major. The comment above each op's row in ops.def gives its
 * contract: "in" and "out" list the node's input and output slots in order;
 * i[] and f[] are the node's integer and float parameters. An output slot whose
 * view has data == NULL is not wanted and must not be written. */
enum ck_op {
#define CK_OP(E, ...) CK_OP_##E,
#include "ops.def"
    CK_OP_COUNT
};

typedef struct ck_op_params {
    int64_t i[8];
    float f[6];
} ck_op_params;

/* The optimizer ops' f5: the parameter's learning-rate multiplier (LoRA+'s
 * ratio on lora_up; 1 otherwise): the update uses lr * f5 wherever torch's
 * param group would use its lr. */
#define CK_OPT_LR_SCALE 5

/* A contiguous fp32 tensor as a kernel sees it. data == NULL: slot unused. */
typedef struct ck_view {
    float *data;
    int ndim;
    int64_t shape[CK_MAX_DIMS];
} ck_view;

/* What a kernel may read besides its tensors. Kernels never allocate: scratch is
 * ws (ws_bytes long), sized by the op's workspace rule and placed by the plan. */
typedef struct ck_kctx {
    uint64_t seed;
    int64_t step; /* 1-based training step: keys random numbers (dropout) */
    float lr;
    void *ws;
    size_t ws_bytes;
    /* 1-based count of optimizer updates, this one included: AdamW's t. It
     * falls behind step when a guarded step skips its update (non-finite). */
    int64_t update;
    /* 1: an evaluation pass (torch's model.eval()): dropout passes values through */
    int eval;
} ck_kctx;

typedef void (*ck_kernel_fn)(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout,
                             const ck_view *in, int nin);

static inline int64_t ck_view_numel(const ck_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    return n;
}

typedef struct ck_shape {
    int ndim;
    int64_t d[CK_MAX_DIMS];
} ck_shape;

static inline int64_t ck_shape_numel(const ck_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}
int ck_shape_eq(const ck_shape *a, const ck_shape *b);
/* "[2, 3, 4]" into buf */
const char *ck_shape_str(const ck_shape *s, char *buf, size_t len);

/* ops/rules.c: the name, output count, shape rule, workspace and cost of each op.
 * For ops whose output shape is not implied by the inputs (RESHAPE, REDUCE_TO,
 * MEAN_BWD, FILL) the caller presets out[0] and the rule checks it; otherwise
 * out[k].ndim is set by the rule. The error text names what is wrong, e.g.
 * "input has 320 channels, weight expects 640". */
const char *ck_op_name(enum ck_op op);
int ck_op_nout(enum ck_op op);
/* the op autodiff emits for op's gradient (ops.def's bwd: GELU -> GELU_BWD);
 * NONE where the gradient takes several ops or there is none */
enum ck_op ck_op_backward(enum ck_op op);
/* the precisions a backend has kernels for (ops.def's cpu and cuda columns):
 * CK_PREC_MASK_* bits, for the CPU (cuda == 0) or the CUDA backend */
#define CK_PREC_MASK_F32 1u
#define CK_PREC_MASK_BF16 2u
#define CK_PREC_MASK_F16 4u
unsigned ck_op_precisions(enum ck_op op, int cuda);
int ck_op_infer(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, ck_shape *out,
                char *err, size_t errlen);
size_t ck_op_workspace(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                       const ck_shape *out, int nthreads);
/* The CUDA backend's workspace rule (its kernels need less than the CPU's),
 * and the ops it runs with every tensor in bf16, or in fp16 (ops.def's cuda
 * column, which ops/cuda/table.c's ck_cuda_kernels_bf16 and _f16 follow): plans for the GPU are made
 * without one. */
size_t ck_op_workspace_cuda(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                            const ck_shape *out, int nthreads);
/* The CUDA rule for an op run by its bf16 kernel (products: cuBLASLt's
 * workspace; elsewhere ck_op_workspace_cuda's) */
size_t ck_op_workspace_cuda_bf16(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                                 const ck_shape *out, int nthreads);
/* The input slots (bit j: input j) that an op's 16-bit kernels read as fp32
 * whatever the storage: ROPE's table. Its tensor is a graph input, which
 * mixed precision keeps fp32 (ck.rope refuses any other kind). The planner
 * picks an op's 16-bit kernel only where every other tensor has that type, so
 * today a 16-bit x with an fp32 table runs the fp32 kernel through copies
 * (vm/plan/memplan.c, ck_plan_entry_kernel_type); these kernels are tested on
 * their own (test_kernels_bf16, test_cuda_ops). */
unsigned ck_op_f32_inputs(enum ck_op op);
/* MODULATE_BWD's and GATE_BWD's sums over the M rows of a sample (the dims
 * between the first and the last) go in this many chunks of about 64 rows,
 * each chunk's partials added in chunk order (ops/cuda/modulate.cu, which the
 * CUDA workspace rule sizes) */
static inline int64_t ck_row_chunks(int64_t M)
{
    const int64_t p = (M + 63) / 64;
    return p < 1 ? 1 : p > 1024 ? 1024 : p;
}
int ck_cuda_bf16_op(enum ck_op op);
int ck_cuda_f16_op(enum ck_op op);
/* The CPU rule for an op run by its bf16 or fp16 kernel: products and convolutions
 * widen their operands into it (ops/cpu/products_bf16.c) */
size_t ck_op_workspace_cpu_bf16(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                                const ck_shape *out, int nthreads);
/* the ops PyTorch's autocast runs in bf16 whatever their fp32 operands:
 * products and convolutions, forward and backward (vm/plan/memplan.c) */
int ck_op_autocast(enum ck_op op);
double ck_op_flops(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out);

#endif
