/* What every file of ops/cuda shares: the context layout, error checks that
 * name the op, the launch helper, block and warp reductions, and fp32/bf16/fp16
 * loads and stores. Built with nvcc, or with a C++ compiler against
 * tests/cuda_emu (CK_CUDA_EMU), which runs the kernels on the CPU. */
#ifndef CK_CUDA_COMMON_CUH
#define CK_CUDA_COMMON_CUH

#ifdef CK_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda.h"

/* The per-step values of ck_kctx as kernels read them on the GPU: from this
 * block in device memory (after the cuBLAS workspace, in the fixed bytes),
 * through a pointer, never as launch arguments, so that a list captured as a
 * graph once (graph.cu) reads each step's values when it is replayed. */
struct ck_cuda_step {
    uint64_t seed;
    int64_t step, update;
    float lr;
    int eval;
};

struct ck_cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt; /* bf16 products (matmul.cu) */
    cudnnHandle_t dnn;
    /* conv2d.cu sets these per call (host-side only, no device memory) */
    cudnnTensorDescriptor_t tx, ty;
    cudnnFilterDescriptor_t fw;
    cudnnConvolutionDescriptor_t conv;
    void *scratch; /* CK_CUDA_SCRATCH_BYTES of reduction partials */
    void *blas_ws; /* CK_CUDA_BLAS_WS_BYTES, cuBLAS's only workspace */
    int deterministic, tf32, sync_each;
    int conv_im2col; /* conv2d.cu's own path instead of cuDNN (tests) */
    size_t conv_ws_cap; /* the most workspace a convolution's algorithm may take (conv2d.cu) */
    const char *last_op; /* the op queued last, for asynchronous faults */
    ck_cuda_step *step_dev; /* CK_CUDA_STEP_BYTES: the block kernels read */
    ck_cuda_step step_host; /* what was last queued into it (step_set: whether anything was) */
    int step_set;
    int graphs;    /* lists may be captured as graphs (CK_CUDA_GRAPH=0 turns it off) */
    int capturing; /* between ck_cuda_capture_begin and _end */
    int capture_later; /* the capture met work an op-by-op run does once (conv2d.cu's algorithm search) */
    struct ck_cuda_xfer *xfer; /* offload.cu: the copy stream and its events (NULL until xfer_open) */
};

/* offload.cu: the copy stream's teardown, at ck_cuda_close */
void ck_cuda_xfer_close(ck_cuda_ctx *c);

/* context.cu */
/* The bound context at the start of an op, or NULL (the op must return) when
 * none is bound or a failure is pending. */
ck_cuda_ctx *ck_cuda_begin(const char *op);
/* After an op's launches: launch errors, and a sync when sync_each is on. */
void ck_cuda_end(ck_cuda_ctx *c, const char *op);
/* Records "op: message" unless a failure is pending; returns 0. */
int ck_cuda_fail(const char *op, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int ck_cuda_ok(cudaError_t e, const char *op, const char *what);
int ck_cuda_blas_ok(cublasStatus_t s, const char *op, const char *what);
int ck_cuda_dnn_ok(cudnnStatus_t s, const char *op, const char *what);

/* Each returns 1 on success, else records the failure (op and call) and returns 0. */
#define CK_CU(op, call) ck_cuda_ok((call), (op), #call)
#define CK_BLAS(op, call) ck_cuda_blas_ok((call), (op), #call)
#define CK_DNN(op, call) ck_cuda_dnn_ok((call), (op), #call)

/* graph.cu: the device block holding ctx's per-step values, with a write of
 * them queued first when they differ from what the block holds (the
 * executor writes them before each list, so inside a captured list they never
 * differ); NULL with a failure recorded when they would change during capture. */
const ck_cuda_step *ck_cuda_step_of(ck_cuda_ctx *c, const ck_kctx *ctx, const char *op);
/* The kctx fields a device-side formula reads, from the block. */
__device__ __forceinline__ ck_kctx ck_cuda_kctx(const ck_cuda_step *s)
{
    ck_kctx k;
    memset(&k, 0, sizeof k);
    k.seed = s->seed, k.step = s->step, k.update = s->update, k.lr = s->lr, k.eval = s->eval;
    return k;
}

/* matmul.cu: row-major C = alpha op(A) op(B) + beta C over `batch` matrices
 * (strides in elements, 0 broadcasts); M x N result, K inner. */
int ck_cuda_gemm(ck_cuda_ctx *c, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta,
                 float *C, int64_t ldc, int64_t sc, int64_t batch);
/* elementwise.cu: y (Q) = x (P, Q, R) summed over P and R, deterministically
 * (the bias gradient of a convolution). */
void ck_cuda_sum_pqr(ck_cuda_ctx *c, float *y, const float *x, int64_t P, int64_t Q, int64_t R);
/* elementwise.cu: y (P, Q, R) = b[q] broadcast (the bias under a product). */
void ck_cuda_bias_fill(ck_cuda_ctx *c, float *y, const float *b, int64_t P, int64_t Q, int64_t R);

/* activation.cu: softmax over rows of C (y may be x), and its backward
 * dx = scale * y * (dy - sum(dy * y)) (dx may be dy). */
void ck_cuda_softmax_rows(ck_cuda_ctx *c, float *y, const float *x, int64_t R, int64_t C);
void ck_cuda_dsoftmax_rows(ck_cuda_ctx *c, float *dx, const float *dy, const float *y, int64_t R, int64_t C, float scale);

/* stats.cu: scalar reductions of n floats in double, in an order fixed by n:
 * RED_MEAN out[0] = mean(x); RED_MSE out[0] = mean((x - y)^2); RED_SUMSQ
 * out[0] = sum(x^2); RED_STATS out[0..2] = mean, std (population), max |x|;
 * RED_FINITE out[0] = sum(x * 0), 0 exactly when every x is finite. */
enum ck_red { RED_MEAN, RED_MSE, RED_SUMSQ, RED_STATS, RED_FINITE };
void ck_cuda_reduce(ck_cuda_ctx *c, ck_red mode, float *out, const float *x, const float *y, int64_t n);

/* Kernel launch on a stream: the triple chevron under nvcc, the emulator's
 * scheduler under CK_CUDA_EMU. Errors surface in ck_cuda_end. */
template <typename... P, typename... A>
static inline void ck_launch(void (*k)(P...), dim3 grid, dim3 block, cudaStream_t s, A... a)
{
#ifdef CK_CUDA_EMU
    (void)s;
    /* the arguments by value, as a launch takes them (a captured graph keeps them) */
    ck_emu_launch(grid, block, [=] { k(a...); });
#else
    k<<<grid, block, 0, s>>>(a...);
#endif
}

/* Blocks for a grid-stride loop over n items: enough to fill the GPU, no more. */
static inline unsigned ck_grid(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > 8192) b = 8192;
    return (unsigned)(b > 0 ? b : 1);
}

/* ---- device helpers ---- */

#define CK_FULL_MASK 0xffffffffu

template <typename T>
__device__ __forceinline__ T ck_warp_sum(T v)
{
    /* xor butterfly: every lane ends with the same bits, in a fixed order */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(CK_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float ck_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(CK_FULL_MASK, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to
 * every thread; sh is __shared__ T[33]. Every thread of the block must call it. */
template <typename T>
__device__ __forceinline__ T ck_block_sum(T v, T *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = ck_warp_sum(v);
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        T t = lane < nw ? sh[lane] : T(0);
        t = ck_warp_sum(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    const T r = sh[32];
    __syncthreads(); /* sh is free for the next call */
    return r;
}

__device__ __forceinline__ float ck_block_max(float v, float *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = ck_warp_max(v);
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        float t = lane < nw ? sh[lane] : -INFINITY;
        t = ck_warp_max(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    const float r = sh[32];
    __syncthreads();
    return r;
}

/* Storage types: activations may be fp32, bf16 or fp16; arithmetic is fp32. */
__device__ __forceinline__ float ck_ld(const float *p) { return *p; }
__device__ __forceinline__ float ck_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ck_ld(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ void ck_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void ck_st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16(v); }
__device__ __forceinline__ void ck_st(__half *p, float v) { *p = __float2half(v); }

/* 16 bytes of storage type T (4 floats, 8 bf16) loaded or stored as one
 * vector access, where a kernel's rows are whole vectors and its pointers
 * 16-byte aligned (ck_aligned16). */
template <typename T>
struct alignas(16) ck_vec {
    T v[16 / sizeof(T)];
};

static inline bool ck_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* An op's fp32, bf16 and fp16 entry points (ck_cuda_<fn>, _bf16, _f16): each
 * runs `call` with T its storage type, name its own name ("fn", "fn_bf16",
 * "fn_f16") and the kernel's arguments in scope */
#define CK_CUDA_ENTRY_(fn, suffix, type, call)                                                                          \
    extern "C" CK_CUDA_KERNEL(ck_cuda_##fn##suffix)                                                                     \
    {                                                                                                                  \
        using T = type;                                                                                                \
        const char *name = #fn #suffix;                                                                                \
        (void)ctx, (void)p, (void)out, (void)nout, (void)in, (void)nin, (void)name;                                    \
        call;                                                                                                          \
    }
#define CK_CUDA_ENTRIES(fn, call)                                                                                      \
    CK_CUDA_ENTRY_(fn, , float, call)                                                                                  \
    CK_CUDA_ENTRY_(fn, _bf16, __nv_bfloat16, call)                                                                     \
    CK_CUDA_ENTRY_(fn, _f16, __half, call)

#endif
