/* Activations on the GPU: SiLU, GELU (erf or tanh form), GEGLU, Mish and softmax
 * over the last dim, forward and backward, in the same formulas as
 * ops/cpu/activation.c (device expf and erff instead of its polynomials).
 * Kernels are templated on the storage type; arithmetic is fp32. */
#include "common.cuh"

#include <math.h>

#define THREADS 256
#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f
#define SQRT_2_PI 0.79788456080286535588f
#define GELU_KAPPA 0.044715f

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_f(float x, int approx)
{
    /* 0.5 (1 + tanh(u)) is sigmoid(2u), which has no cancellation */
    if (approx) return x * sigmoid_f(2.0f * SQRT_2_PI * (x + GELU_KAPPA * x * x * x));
    return 0.5f * x * (1.0f + erff(x * SQRT1_2));
}

__device__ __forceinline__ float gelu_grad_f(float x, int approx)
{
    if (approx) {
        const float x2 = x * x;
        const float s = sigmoid_f(2.0f * SQRT_2_PI * (x + GELU_KAPPA * x2 * x));
        return s + 2.0f * x * s * (1.0f - s) * SQRT_2_PI * (1.0f + 3.0f * GELU_KAPPA * x2);
    }
    return 0.5f * (1.0f + erff(x * SQRT1_2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}

/* Mish as ops/cpu/activation.c's mish_c and mish_grad: with e = e^min(x, 20) (NaN kept)
 * and n = e (e + 2), tanh(softplus(x)) = n / (n + 2) and 1 - tanh^2 = 4 (n + 1) / (n + 2)^2 */
__device__ __forceinline__ float mish_f(float x)
{
    const float e = expf(x > 20.0f ? 20.0f : x), n = e * (e + 2.0f);
    return x * (n / (n + 2.0f));
}

__device__ __forceinline__ float mish_grad_f(float x)
{
    const float xc = x > 20.0f ? 20.0f : x, e = expf(xc), n = e * (e + 2.0f), d = n + 2.0f;
    return n / d + xc * (4.0f * (n + 1.0f) / (d * d)) * (e / (1.0f + e));
}

#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

template <typename T>
__global__ void __launch_bounds__(THREADS) silu_kernel(T *y, const T *x, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        const float v = ck_ld(x + i);
        ck_st(y + i, v * sigmoid_f(v));
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) silu_bwd_kernel(T *dx, const T *dy, const T *x, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        const float v = ck_ld(x + i), s = sigmoid_f(v);
        ck_st(dx + i, ck_ld(dy + i) * s * (1.0f + v * (1.0f - s)));
    }
}

/* SiLU and its backward with 16-byte accesses (4 floats, 8 bf16 or fp16): nv
 * vectors, pointers aligned; the same arithmetic per value */
template <typename T>
__global__ void __launch_bounds__(THREADS) silu_vec_kernel(T *y, const T *x, int64_t nv)
{
    constexpr int V = 16 / sizeof(T);
    GRID_STRIDE(i, nv)
    {
        const ck_vec<T> a = ((const ck_vec<T> *)x)[i];
        ck_vec<T> o;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float v = ck_ld(&a.v[k]);
            ck_st(&o.v[k], v * sigmoid_f(v));
        }
        ((ck_vec<T> *)y)[i] = o;
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) silu_bwd_vec_kernel(T *dx, const T *dy, const T *x, int64_t nv)
{
    constexpr int V = 16 / sizeof(T);
    GRID_STRIDE(i, nv)
    {
        const ck_vec<T> a = ((const ck_vec<T> *)x)[i], d = ((const ck_vec<T> *)dy)[i];
        ck_vec<T> o;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float v = ck_ld(&a.v[k]), s = sigmoid_f(v);
            ck_st(&o.v[k], ck_ld(&d.v[k]) * s * (1.0f + v * (1.0f - s)));
        }
        ((ck_vec<T> *)dx)[i] = o;
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS) gelu_kernel(T *y, const T *x, int64_t n, int approx)
{
    GRID_STRIDE(i, n) ck_st(y + i, gelu_f(ck_ld(x + i), approx));
}

template <typename T>
__global__ void __launch_bounds__(THREADS) gelu_bwd_kernel(T *dx, const T *dy, const T *x, int64_t n, int approx)
{
    GRID_STRIDE(i, n) ck_st(dx + i, ck_ld(dy + i) * gelu_grad_f(ck_ld(x + i), approx));
}

template <typename T>
__global__ void __launch_bounds__(THREADS) mish_kernel(T *y, const T *x, int64_t n)
{
    GRID_STRIDE(i, n) ck_st(y + i, mish_f(ck_ld(x + i)));
}

template <typename T>
__global__ void __launch_bounds__(THREADS) mish_bwd_kernel(T *dx, const T *dy, const T *x, int64_t n)
{
    GRID_STRIDE(i, n) ck_st(dx + i, ck_ld(dy + i) * mish_grad_f(ck_ld(x + i)));
}

// x (R, 2D) = [hidden | gate]; y (R, D) = hidden * gelu(gate)
template <typename T>
__global__ void __launch_bounds__(THREADS) geglu_kernel(T *y, const T *x, int64_t D, int64_t n, int approx)
{
    GRID_STRIDE(i, n)
    {
        const int64_t r = i / D, j = i % D;
        const T *h = x + r * 2 * D + j;
        ck_st(y + i, ck_ld(h) * gelu_f(ck_ld(h + D), approx));
    }
}

// dy (R, D), x (R, 2D); dx (R, 2D)
template <typename T>
__global__ void __launch_bounds__(THREADS) geglu_bwd_kernel(T *dx, const T *dy, const T *x, int64_t D, int64_t n,
                                                            int approx)
{
    GRID_STRIDE(i, n)
    {
        const int64_t r = i / D, j = i % D;
        const T *h = x + r * 2 * D + j;
        T *dh = dx + r * 2 * D + j;
        const float hv = ck_ld(h), gv = ck_ld(h + D), d = ck_ld(dy + i);
        ck_st(dh, d * gelu_f(gv, approx));
        ck_st(dh + D, d * hv * gelu_grad_f(gv, approx));
    }
}

/* GEGLU with 16-byte accesses: V = 16 / sizeof(T) outputs a step, their hidden
 * and gate halves each one vector load, the outputs one vector store (D a
 * multiple of V, pointers aligned): x is read once and y written once, as the
 * element kernels above do, in a quarter (fp32) or an eighth (16-bit) of the accesses. */
template <typename T>
__global__ void __launch_bounds__(THREADS) geglu_vec_kernel(T *y, const T *x, int64_t D, int64_t nv, int approx)
{
    constexpr int V = 16 / sizeof(T);
    const int64_t dv = D / V;
    GRID_STRIDE(i, nv)
    {
        const int64_t r = i / dv, j = (i - r * dv) * V;
        const ck_vec<T> h = *(const ck_vec<T> *)(x + r * 2 * D + j), g = *(const ck_vec<T> *)(x + r * 2 * D + D + j);
        ck_vec<T> o;
#pragma unroll
        for (int k = 0; k < V; k++) ck_st(&o.v[k], ck_ld(&h.v[k]) * gelu_f(ck_ld(&g.v[k]), approx));
        *(ck_vec<T> *)(y + r * D + j) = o;
    }
}

// dy (R, D), x (R, 2D); dx (R, 2D); as geglu_vec_kernel, dy, x and dx each read or written once
template <typename T>
__global__ void __launch_bounds__(THREADS) geglu_bwd_vec_kernel(T *dx, const T *dy, const T *x, int64_t D, int64_t nv,
                                                                int approx)
{
    constexpr int V = 16 / sizeof(T);
    const int64_t dv = D / V;
    GRID_STRIDE(i, nv)
    {
        const int64_t r = i / dv, j = (i - r * dv) * V;
        const ck_vec<T> h = *(const ck_vec<T> *)(x + r * 2 * D + j), g = *(const ck_vec<T> *)(x + r * 2 * D + D + j);
        const ck_vec<T> dyv = *(const ck_vec<T> *)(dy + r * D + j);
        ck_vec<T> dh, dg;
#pragma unroll
        for (int k = 0; k < V; k++) {
            const float hv = ck_ld(&h.v[k]), gv = ck_ld(&g.v[k]), d = ck_ld(&dyv.v[k]);
            ck_st(&dh.v[k], d * gelu_f(gv, approx));
            ck_st(&dg.v[k], d * hv * gelu_grad_f(gv, approx));
        }
        *(ck_vec<T> *)(dx + r * 2 * D + j) = dh;
        *(ck_vec<T> *)(dx + r * 2 * D + D + j) = dg;
    }
}

/* A warp per row of C: the max, the sum of exponentials, then the row. Each
 * element is read and written by one lane, so y may be x. */
template <typename T>
__global__ void __launch_bounds__(THREADS) softmax_rows(T *y, const T *x, int64_t R, int64_t C)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (THREADS / 32);
    for (int64_t r = (int64_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32; r < R; r += warps) {
        const T *xr = x + r * C;
        T *yr = y + r * C;
        float m = -INFINITY;
        for (int64_t c = lane; c < C; c += 32) m = fmaxf(m, ck_ld(xr + c));
        m = ck_warp_max(m);
        float s = 0.0f;
        for (int64_t c = lane; c < C; c += 32) s += expf(ck_ld(xr + c) - m);
        const float inv = 1.0f / ck_warp_sum(s);
        for (int64_t c = lane; c < C; c += 32) ck_st(yr + c, expf(ck_ld(xr + c) - m) * inv);
    }
}

/* dx = scale * y * (dy - sum(dy * y)) per row; dx may be dy. */
template <typename T>
__global__ void __launch_bounds__(THREADS) dsoftmax_rows(T *dx, const T *dy, const T *y, int64_t R, int64_t C,
                                                         float scale)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (THREADS / 32);
    for (int64_t r = (int64_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32; r < R; r += warps) {
        const T *dyr = dy + r * C, *yr = y + r * C;
        T *dxr = dx + r * C;
        float s = 0.0f;
        for (int64_t c = lane; c < C; c += 32) s += ck_ld(dyr + c) * ck_ld(yr + c);
        s = ck_warp_sum(s);
        for (int64_t c = lane; c < C; c += 32) {
            const float yv = ck_ld(yr + c);
            ck_st(dxr + c, scale * yv * (ck_ld(dyr + c) - s));
        }
    }
}

void ck_cuda_softmax_rows(ck_cuda_ctx *c, float *y, const float *x, int64_t R, int64_t C)
{
    if (R * C == 0) return;
    ck_launch(softmax_rows<float>, ck_grid(R, THREADS / 32), THREADS, c->stream, y, x, R, C);
}

void ck_cuda_dsoftmax_rows(ck_cuda_ctx *c, float *dx, const float *dy, const float *y, int64_t R, int64_t C, float scale)
{
    if (R * C == 0) return;
    ck_launch(dsoftmax_rows<float>, ck_grid(R, THREADS / 32), THREADS, c->stream, dx, dy, y, R, C, scale);
}

/* The ops on storage type T: every tensor of the op is T (float, or bf16 seen
 * through the view's float pointer). */
#define DATA(v) ((T *)(v).data)
#define CDATA(v) ((const T *)(v).data)

// x is any shape; y is like x.
template <typename T>
static void silu_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]);
    if (n == 0) return;
    const int64_t V = 16 / sizeof(T);
    if (n % V == 0 && ck_aligned16(out[0].data) && ck_aligned16(in[0].data))
        ck_launch(silu_vec_kernel<T>, ck_grid(n / V, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), n / V);
    else
        ck_launch(silu_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), n);
    ck_cuda_end(c, name);
}

// dy and x are any shape (the same); dx is like x.
template <typename T>
static void silu_bwd_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&in[1]);
    if (n == 0) return;
    const int64_t V = 16 / sizeof(T);
    if (n % V == 0 && ck_aligned16(out[0].data) && ck_aligned16(in[0].data) && ck_aligned16(in[1].data))
        ck_launch(silu_bwd_vec_kernel<T>, ck_grid(n / V, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]),
                  CDATA(in[1]), n / V);
    else
        ck_launch(silu_bwd_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]),
                  CDATA(in[1]), n);
    ck_cuda_end(c, name);
}

template <typename T>
static void gelu_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]);
    if (n == 0) return;
    ck_launch(gelu_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), n,
              (int)(p->i[0] != 0));
    ck_cuda_end(c, name);
}

template <typename T>
static void gelu_bwd_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&in[1]);
    if (n == 0) return;
    ck_launch(gelu_bwd_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), CDATA(in[1]), n,
              (int)(p->i[0] != 0));
    ck_cuda_end(c, name);
}

// x is any shape; y is like x.
template <typename T>
static void mish_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]);
    if (n == 0) return;
    ck_launch(mish_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), n);
    ck_cuda_end(c, name);
}

// dy and x are any shape (the same); dx is like x.
template <typename T>
static void mish_bwd_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&in[1]);
    if (n == 0) return;
    ck_launch(mish_bwd_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), CDATA(in[1]), n);
    ck_cuda_end(c, name);
}

// x is (..,2D); y is (..,D)
template <typename T>
static void geglu_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t D = out[0].shape[out[0].ndim - 1], n = ck_view_numel(&out[0]), V = 16 / sizeof(T);
    if (n == 0) return;
    if (D % V == 0 && ck_aligned16(out[0].data) && ck_aligned16(in[0].data))
        ck_launch(geglu_vec_kernel<T>, ck_grid(n / V, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), D,
                  n / V, (int)(p->i[0] != 0));
    else
        ck_launch(geglu_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), D, n,
                  (int)(p->i[0] != 0));
    ck_cuda_end(c, name);
}

// dy is (..,D), x is (..,2D); dx is (..,2D)
template <typename T>
static void geglu_bwd_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t D = in[0].shape[in[0].ndim - 1], n = ck_view_numel(&in[0]), V = 16 / sizeof(T);
    if (n == 0) return;
    if (D % V == 0 && ck_aligned16(out[0].data) && ck_aligned16(in[0].data) && ck_aligned16(in[1].data))
        ck_launch(geglu_bwd_vec_kernel<T>, ck_grid(n / V, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]),
                  CDATA(in[1]), D, n / V, (int)(p->i[0] != 0));
    else
        ck_launch(geglu_bwd_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), CDATA(in[1]),
                  D, n, (int)(p->i[0] != 0));
    ck_cuda_end(c, name);
}

// x is (..,C); y is like x, each row of C a softmax
template <typename T>
static void softmax_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t C = in[0].shape[in[0].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / C;
    if (R == 0) return;
    ck_launch(softmax_rows<T>, ck_grid(R, THREADS / 32), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), R, C);
    ck_cuda_end(c, name);
}

// dy and y (the forward output) are (..,C); dx = y * (dy - sum(dy * y)) per row
template <typename T>
static void softmax_bwd_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t C = in[1].shape[in[1].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[1]) / C;
    if (R == 0) return;
    ck_launch(dsoftmax_rows<T>, ck_grid(R, THREADS / 32), THREADS, c->stream, DATA(out[0]), CDATA(in[0]), CDATA(in[1]),
              R, C, 1.0f);
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(silu, silu_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(silu_bwd, silu_bwd_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(gelu, gelu_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(gelu_bwd, gelu_bwd_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(geglu, geglu_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(geglu_bwd, geglu_bwd_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(softmax, softmax_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(softmax_bwd, softmax_bwd_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(mish, mish_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(mish_bwd, mish_bwd_op<T>(name, p, out, in))

/* LINEAR_GEGLU: the rows of x in slices whose part of h is at most
 * LG_SLICE_BYTES (whole multiples of 128 rows; one slice when h is small),
 * each slice's product by the type's LINEAR kernel (cuBLASLt with the bias in
 * its epilogue, or cuBLAS in fp32) and then its GEGLU, so the GEGLU reads the
 * slice of h that the product has just written while it is still in L2 (50 MB
 * on an H100 or H200) rather than from device memory. h is still written
 * whole: the backward reads it. */
#define LG_SLICE_BYTES ((int64_t)16 << 20)

template <typename T>
static void linear_geglu_op(ck_kernel_fn linear, const ck_kctx *ctx, const ck_op_params *p, ck_view *out,
                            const ck_view *in, int nin)
{
    static const ck_op_params none = {};
    const int64_t IN = in[1].shape[1], H2 = in[1].shape[0], D = H2 / 2;
    if (H2 == 0) return;
    const int64_t rows = ck_view_numel(&out[1]) / H2;
    if (rows == 0) return;
    int64_t slice = LG_SLICE_BYTES / (H2 * (int64_t)sizeof(T)) / 128 * 128;
    if (slice < 128) slice = 128;
    for (int64_t r0 = 0; r0 < rows; r0 += slice) {
        const int64_t n = rows - r0 < slice ? rows - r0 : slice;
        ck_view v[3], h = out[1], y = out[0];
        for (int j = 0; j < nin; j++) v[j] = in[j];
        v[0].ndim = h.ndim = y.ndim = 2;
        v[0].shape[0] = h.shape[0] = y.shape[0] = n;
        v[0].shape[1] = IN;
        h.shape[1] = H2;
        y.shape[1] = D;
        v[0].data = (float *)((const T *)in[0].data + r0 * IN);
        h.data = (float *)((T *)out[1].data + r0 * H2);
        y.data = (float *)((T *)out[0].data + r0 * D);
        linear(ctx, &none, &h, 1, v, nin);
        geglu_op<T>("linear_geglu", p, &y, &h);
    }
}

extern "C" CK_CUDA_KERNEL(ck_cuda_linear_geglu)
{
    (void)nout;
    linear_geglu_op<float>(ck_cuda_linear, ctx, p, out, in, nin);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_linear_geglu_bf16)
{
    (void)nout;
    linear_geglu_op<__nv_bfloat16>(ck_cuda_linear_bf16, ctx, p, out, in, nin);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_linear_geglu_f16)
{
    (void)nout;
    linear_geglu_op<__half>(ck_cuda_linear_f16, ctx, p, out, in, nin);
}
