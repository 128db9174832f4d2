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

/* Every tensor is contiguous row-major. Shapes below use the names in the
 * comments; "in" and "out" list the node's input and output slots in order.
 * i[] and f[] are the node's integer and float parameters. An output slot whose
 * view has data == NULL is not wanted and must not be written. */
enum ck_op {
    CK_OP_NONE = 0,
    /* in a [..,M,K] (a [..,K,M] if i0), b [K,N] or [..,K,N] (b [N,K] / [..,N,K] if i1)
     * out [..,M,N]. The batch of b is 1 or equal to that of a. i0 transA, i1 transB. */
    CK_OP_MATMUL,
    /* in x [..,IN], w [OUT,IN], b [OUT] (optional third input); out [..,OUT] = x w^T + b */
    CK_OP_LINEAR,
    /* in x [N,C,H,W], w [O,C,KH,KW], b [O] (optional); out [N,O,HO,WO];
     * i0 stride_h, i1 stride_w, i2 pad_h, i3 pad_w (zero padding).
     * HO = (H + 2 pad_h - KH) / stride_h + 1. workspace: C*KH*KW*HO*WO floats. */
    CK_OP_CONV2D,
    /* in dy [N,O,HO,WO], w [O,C,KH,KW]; out dx [N,C,H,W]; i0..i3 as CONV2D.
     * workspace: C*KH*KW*HO*WO floats. */
    CK_OP_CONV2D_BWD_DATA,
    /* in dy [N,O,HO,WO], x [N,C,H,W]; out dw [O,C,KH,KW], db [O] (either may be
     * unwanted); i0..i3 as CONV2D. workspace: C*KH*KW*HO*WO floats. */
    CK_OP_CONV2D_BWD_FILTER,
    /* in x [N,C,*], gamma [C], beta [C]; out y like x. i0 groups, f0 eps. */
    CK_OP_GROUP_NORM,
    /* in dy, x, gamma; out dx, dgamma, dbeta (any may be unwanted). i0, f0 as forward. */
    CK_OP_GROUP_NORM_BWD,
    /* in x [..,C], gamma [C], beta [C]; out y like x; normalizes the last dim. f0 eps. */
    CK_OP_LAYER_NORM,
    /* in dy, x, gamma; out dx, dgamma, dbeta (any may be unwanted). f0 eps. */
    CK_OP_LAYER_NORM_BWD,
    /* in x; out y = x * sigmoid(x) */
    CK_OP_SILU,
    /* in dy, x; out dx */
    CK_OP_SILU_BWD,
    /* in x; out y. i0: 0 exact (erf), 1 tanh approximation */
    CK_OP_GELU,
    /* in dy, x; out dx. i0 as GELU */
    CK_OP_GELU_BWD,
    /* in x [..,2D]; out y [..,D] = x[..,:D] * gelu(x[..,D:]). i0 as GELU */
    CK_OP_GEGLU,
    /* in dy [..,D], x [..,2D]; out dx [..,2D]. i0 as GELU */
    CK_OP_GEGLU_BWD,
    /* in x; out y = softmax over the last dim */
    CK_OP_SOFTMAX,
    /* in dy, y (the forward output); out dx */
    CK_OP_SOFTMAX_BWD,
    /* in q [B,LQ,H*D], k [B,LK,H*D], v [B,LK,H*D]; out o [B,LQ,H*D].
     * i0 heads H, f0 scale (0 means 1/sqrt(D)). Per head: o = softmax(q k^T * scale) v.
     * workspace: nthreads * R*LK floats, R = 65536/LK rows of queries clamped to
     * [16, 1024] and to LQ (nthreads = ck_cpu_threads()); see ck_op_workspace. */
    CK_OP_ATTENTION,
    /* in dout, q, k, v; out dq, dk, dv; i0, f0 as forward.
     * workspace: nthreads * 2*R*LK floats, R as for ATTENTION. */
    CK_OP_ATTENTION_BWD,
    /* in a, b; out a + b with numpy broadcasting (shapes aligned on the right) */
    CK_OP_ADD,
    /* in a, b; out a - b, broadcasting as ADD */
    CK_OP_SUB,
    /* in a, b; out a * b, broadcasting as ADD */
    CK_OP_MUL,
    /* in x; out f0 * x */
    CK_OP_SCALE,
    /* in x; out: x summed down to the output's shape, which broadcasts to x's
     * shape when aligned on the right (the backward of broadcasting). */
    CK_OP_REDUCE_TO,
    /* in a [P, A, Q], b [P, B, Q] viewed around dim i0; out [P, A+B, Q] */
    CK_OP_CONCAT,
    /* in x; out: along dim i0, the i2 entries starting at i1 */
    CK_OP_SLICE,
    /* in x; out: same elements, the output's shape (a plain copy; the planner
     * may alias the two, in which case out.data == in.data) */
    CK_OP_RESHAPE,
    /* in x [d0..dn-1]; out [d_perm0 .. d_permn-1]; i0..i5 the permutation:
     * out dim j is input dim i_j */
    CK_OP_PERMUTE,
    /* in x [N,C,H,W]; out [N,C,2H,2W], nearest */
    CK_OP_UPSAMPLE2X,
    /* in dy [N,C,2H,2W]; out dx [N,C,H,W] = sum of each 2x2 window */
    CK_OP_UPSAMPLE2X_BWD,
    /* in x; out scalar (ndim 0) = mean of all elements */
    CK_OP_MEAN,
    /* in dy scalar; out dx (its shape) filled with dy / numel(dx) */
    CK_OP_MEAN_BWD,
    /* in a, b same shape; out scalar = mean((a - b)^2) */
    CK_OP_MSE_LOSS,
    /* in dy scalar, a, b; out da, db (either may be unwanted) */
    CK_OP_MSE_LOSS_BWD,
    /* in t [B]; out [B, i0]. diffusers get_timestep_embedding:
     * half = i0/2, freq_j = exp(-ln(f1) * j / (half - f0)), arg = f2 * t * freq_j,
     * out = [sin(arg), cos(arg)], or [cos, sin] when i1 (flip_sin_to_cos); a zero
     * column is appended when i0 is odd. f0 downscale_freq_shift, f1 max_period, f2 scale. */
    CK_OP_TIMESTEP_EMBEDDING,
    /* in x; out y = x * mask / (1 - f0), mask_e = (u(seed, step, i0, e) >= f0) where
     * u is ck_rng_uniform(ck_rng_key(seed, step, i0), e). Running it on dy with the
     * same key is its backward. f0 drop probability, i0 the op key. */
    CK_OP_DROPOUT,
    /* in: nothing; out filled with f0 */
    CK_OP_FILL,
    /* in param, grad; out param (same buffer, updated in place).
     * p -= lr * (grad + f0 * p). lr comes from the kernel context, times f5. */
    CK_OP_SGD_STEP,
    /* in param, grad, m, v; out param, m, v (same buffers, in place).
     * f0 beta1, f1 beta2, f2 eps, f3 weight_decay; lr (times f5) and the 1-based
     * step from the context. Decoupled decay (AdamW): p -= lr * wd * p; then with bias correction
     * mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t): p -= lr * mhat / (sqrt(vhat) + eps). */
    CK_OP_ADAMW_STEP,
    /* in x; out [3] = mean, standard deviation (population) and largest |x| over
     * all elements; a NaN anywhere makes the mean and absmax NaN. Logging steps
     * only (vm/run/logstats.c): a block's activation statistics. */
    CK_OP_STATS,
    /* in x1..xk (k <= CK_MAX_IN); out scalar = the sum of the squares of all
     * their elements, accumulated in double and rounded once. With i0 = 1, x1
     * is a scalar running total, added as it is, so that a chain of nodes
     * sums any number of tensors. Logging steps (a gradient's squared norm)
     * and gradient clipping (all gradients', a few per node). */
    CK_OP_SUMSQ,
    /* in scalar s (the gradients' summed squares); out scalar
     * min(1, f0 / (sqrt(s) + 1e-6)): the factor torch.nn.utils.clip_grad_norm_
     * scales every gradient by, in its fp32 arithmetic. f0 the largest norm. */
    CK_OP_CLIP_FACTOR,
    /* in param, grad, m; out param, m (same buffers, in place). Lion (Chen et
     * al. 2023, as lion-pytorch): p *= 1 - lr * f2; p -= lr * sign(f0 * m + (1 - f0) * g);
     * m = f1 * m + (1 - f1) * g. f0 beta1, f1 beta2, f2 weight_decay; lr from the context, times f5. */
    CK_OP_LION_STEP,
    /* in param, grad, q (CK_U8, [2 n]: the first moment's codes, then the
     * second's), s ([2 nb]: each block's scale, first moment's blocks then the
     * second's; nb = ceil(n / CK_ADAM8_BLOCK)); out param, q, s (the same
     * buffers, in place). bitsandbytes' AdamW8bit (ops/adam8.h): m = b1 m +
     * (1 - b1) g, v = b2 v + (1 - b2) g^2 in fp32 from the dequantized state;
     * p *= 1 - lr wd; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps);
     * then m and v quantized under their blocks' new largest magnitudes.
     * f0 beta1, f1 beta2, f2 eps, f3 weight_decay, f5 the lr multiplier; lr and t from the context. */
    CK_OP_ADAMW8_STEP,
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
int ck_op_infer(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, ck_shape *out,
                char *err, size_t errlen);
size_t ck_op_workspace(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                       const ck_shape *out, int nthreads);
/* The CUDA backend's workspace rule (its kernels need less than the CPU's),
 * and the ops it runs with every tensor in bf16 (ops/cuda/table.c's
 * ck_cuda_kernels_bf16): plans for the GPU are made without one. */
size_t ck_op_workspace_cuda(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                            const ck_shape *out, int nthreads);
int ck_cuda_bf16_op(enum ck_op op);
double ck_op_flops(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out);

#endif
