/* Elementwise kernels on the GPU: ADD, SUB and MUL with numpy broadcasting,
 * SCALE, FILL, and REDUCE_TO (the backward of broadcasting). Shapes are folded
 * on the host into a few merged dims, as ops/cpu/elementwise.c does; sums run
 * in double in an order fixed by the shapes alone. */
#include "common.cuh"

#define THREADS 256

enum binop { BIN_ADD, BIN_SUB, BIN_MUL };

/* The output's dims with size-1 dims dropped and neighbours merged where both
 * inputs stay contiguous across them; sa, sb are the inputs' element strides
 * along each, 0 where broadcast. */
struct bcast {
    int m;
    int64_t n[CK_MAX_DIMS], sa[CK_MAX_DIMS], sb[CK_MAX_DIMS];
};

static void input_strides(const ck_view *v, const ck_view *o, int64_t *s)
{
    int64_t st = 1;
    for (int d = o->ndim - 1; d >= 0; d--) {
        const int vd = d - (o->ndim - v->ndim);
        const int64_t sz = vd >= 0 ? v->shape[vd] : 1;
        s[d] = sz == 1 ? 0 : st;
        st *= sz;
    }
}

static void bcast_init(bcast *bc, const ck_view *o, const ck_view *a, const ck_view *b)
{
    int64_t sa[CK_MAX_DIMS], sb[CK_MAX_DIMS];
    input_strides(a, o, sa);
    input_strides(b, o, sb);
    bc->m = 0;
    for (int d = 0; d < o->ndim; d++) {
        const int64_t n = o->shape[d];
        if (n == 1) continue;
        const int k = bc->m - 1;
        if (k >= 0 && bc->sa[k] == sa[d] * n && bc->sb[k] == sb[d] * n) {
            bc->n[k] *= n;
            bc->sa[k] = sa[d];
            bc->sb[k] = sb[d];
        } else {
            bc->n[bc->m] = n;
            bc->sa[bc->m] = sa[d];
            bc->sb[bc->m] = sb[d];
            bc->m++;
        }
    }
    if (bc->m == 0) {
        bc->n[0] = 1;
        bc->sa[0] = bc->sb[0] = 0;
        bc->m = 1;
    }
}

template <int OP>
__device__ __forceinline__ float bin_apply(float a, float b)
{
    return OP == BIN_ADD ? a + b : OP == BIN_SUB ? a - b : a * b;
}

// o, a, b are n elements each (the same shape)
template <int OP, typename T>
__global__ void __launch_bounds__(THREADS) binary_flat(T *o, const T *a, const T *b, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ck_st(o + i, bin_apply<OP>(ck_ld(a + i), ck_ld(b + i)));
}

/* binary_flat with 16-byte accesses (4 floats, 8 bf16 or fp16): nv vectors,
 * pointers aligned */
template <int OP, typename T>
__global__ void __launch_bounds__(THREADS) binary_flat_vec(T *o, const T *a, const T *b, int64_t nv)
{
    constexpr int V = 16 / sizeof(T);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
        const ck_vec<T> x = ((const ck_vec<T> *)a)[i], y = ((const ck_vec<T> *)b)[i];
        ck_vec<T> r;
#pragma unroll
        for (int k = 0; k < V; k++) ck_st(&r.v[k], bin_apply<OP>(ck_ld(&x.v[k]), ck_ld(&y.v[k])));
        ((ck_vec<T> *)o)[i] = r;
    }
}

// o is total elements over bc's merged dims; a and b are read at their strides.
// I is the index type: 32-bit whenever every offset fits, as integer division
// by a 64-bit value costs several times more.
template <int OP, typename T, typename I>
__global__ void __launch_bounds__(THREADS) binary_bcast(T *o, const T *a, const T *b, bcast bc, I total)
{
    I n[CK_MAX_DIMS], sa[CK_MAX_DIMS], sb[CK_MAX_DIMS];
    for (int d = 0; d < bc.m; d++) n[d] = (I)bc.n[d], sa[d] = (I)bc.sa[d], sb[d] = (I)bc.sb[d];
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < total; i += (I)(gridDim.x * blockDim.x)) {
        I rem = i, oa = 0, ob = 0;
        for (int d = bc.m - 1; d >= 0; d--) {
            const I idx = rem % n[d];
            rem /= n[d];
            oa += idx * sa[d];
            ob += idx * sb[d];
        }
        ck_st(o + i, bin_apply<OP>(ck_ld(a + oa), ck_ld(b + ob)));
    }
}

template <int OP, typename T>
static void binary(const char *name, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t total = ck_view_numel(&out[0]);
    if (total == 0) return;
    T *o = (T *)out[0].data;
    const T *a = (const T *)in[0].data, *b = (const T *)in[1].data;
    bcast bc;
    bcast_init(&bc, &out[0], &in[0], &in[1]);
    const int64_t V = 16 / sizeof(T);
    if (bc.m == 1 && bc.sa[0] == 1 && bc.sb[0] == 1 && total % V == 0 && ck_aligned16(o) && ck_aligned16(a) &&
        ck_aligned16(b))
        ck_launch(binary_flat_vec<OP, T>, ck_grid(total / V, THREADS), THREADS, c->stream, o, a, b, total / V);
    else if (bc.m == 1 && bc.sa[0] == 1 && bc.sb[0] == 1)
        ck_launch(binary_flat<OP, T>, ck_grid(total, THREADS), THREADS, c->stream, o, a, b, total);
    else if (total < ((int64_t)1 << 31) && ck_view_numel(&in[0]) < ((int64_t)1 << 31) &&
             ck_view_numel(&in[1]) < ((int64_t)1 << 31))
        ck_launch(binary_bcast<OP, T, uint32_t>, ck_grid(total, THREADS), THREADS, c->stream, o, a, b, bc,
                  (uint32_t)total);
    else
        ck_launch(binary_bcast<OP, T, int64_t>, ck_grid(total, THREADS), THREADS, c->stream, o, a, b, bc, total);
    ck_cuda_end(c, name);
}

/* a, b broadcast to out (shapes aligned on the right); fp32, bf16 and fp16 storage */
#define BINARY(fn, OP)                                                                                                 \
    extern "C" CK_CUDA_KERNEL(ck_cuda_##fn)                                                                            \
    {                                                                                                                  \
        (void)ctx, (void)p, (void)nout, (void)nin;                                                                     \
        binary<OP, float>(#fn, out, in);                                                                               \
    }                                                                                                                  \
    extern "C" CK_CUDA_KERNEL(ck_cuda_##fn##_bf16)                                                                     \
    {                                                                                                                  \
        (void)ctx, (void)p, (void)nout, (void)nin;                                                                     \
        binary<OP, __nv_bfloat16>(#fn "_bf16", out, in);                                                               \
    }                                                                                                                  \
    extern "C" CK_CUDA_KERNEL(ck_cuda_##fn##_f16)                                                                      \
    {                                                                                                                  \
        (void)ctx, (void)p, (void)nout, (void)nin;                                                                     \
        binary<OP, __half>(#fn "_f16", out, in);                                                                       \
    }

BINARY(add, BIN_ADD)
BINARY(sub, BIN_SUB)
BINARY(mul, BIN_MUL)

template <typename T>
__global__ void __launch_bounds__(THREADS) scale_kernel(T *y, const T *x, float f, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ck_st(y + i, f * ck_ld(x + i));
}

template <typename T>
__global__ void __launch_bounds__(THREADS) fill_kernel(T *y, float f, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ck_st(y + i, f);
}

// x and y any shape, same numel
template <typename T>
static void scale_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&out[0]);
    if (n == 0) return;
    ck_launch(scale_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, (T *)out[0].data, (const T *)in[0].data,
              p->f[0], n);
    ck_cuda_end(c, name);
}

// y any shape
template <typename T>
static void fill_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)in;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&out[0]);
    if (n == 0) return;
    ck_launch(fill_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, (T *)out[0].data, p->f[0], n);
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(scale, scale_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(fill, fill_op<T>(name, p, out, in))

/* ---- REDUCE_TO ---- */

/* A set of x's merged dims walked in row-major order. */
struct dims {
    int n;
    int64_t size[CK_MAX_DIMS], stride[CK_MAX_DIMS];
};

__device__ __forceinline__ int64_t dims_offset(const dims &d, int64_t flat)
{
    int64_t off = 0;
    for (int k = d.n - 1; k >= 0; k--) {
        off += flat % d.size[k] * d.stride[k];
        flat /= d.size[k];
    }
    return off;
}

static int64_t dims_count(const dims *d)
{
    int64_t c = 1;
    for (int k = 0; k < d->n; k++) c *= d->size[k];
    return c;
}

/* Each output o = (row, j) sums Q rows of a W-wide run: x[kd(row) + rd(q) + j]
 * for q in segment s of S. A thread per (o, s); neighbouring threads take
 * neighbouring j, so reads coalesce. dst: y (S == 1) or the partials. */
__global__ void __launch_bounds__(THREADS) reduce_rows_kernel(float *y, double *part, const float *x, dims kd, dims rd,
                                                              int64_t W, int64_t Q, int64_t nout, int64_t S)
{
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < nout * S; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = t / nout, o = t % nout, row = o / W, j = o % W;
        const float *base = x + dims_offset(kd, row) + j;
        double acc = 0;
        for (int64_t q = Q * s / S; q < Q * (s + 1) / S; q++) acc += (double)base[dims_offset(rd, q)];
        if (S == 1)
            y[o] = (float)acc;
        else
            part[t] = acc;
    }
}

/* Each output o sums M = Q * L elements: x[kd(o) + rd(f / L) + f % L] over f in
 * segment s of S. A warp per (o, s), its lanes striding f, summed lane by lane
 * and then across the warp in a fixed order. */
__global__ void __launch_bounds__(THREADS) reduce_runs_kernel(float *y, double *part, const float *x, dims kd, dims rd,
                                                              int64_t L, int64_t M, int64_t nout, int64_t S)
{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t t = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; t < nout * S; t += warps) {
        const int64_t s = t / nout, o = t % nout;
        const float *base = x + dims_offset(kd, o);
        double acc = 0;
        for (int64_t f = M * s / S + lane; f < M * (s + 1) / S; f += 32) acc += (double)base[dims_offset(rd, f / L) + f % L];
        acc = ck_warp_sum(acc);
        if (lane == 0) {
            if (S == 1)
                y[o] = (float)acc;
            else
                part[t] = acc;
        }
    }
}

// y[o] = the S partials of o added in order
__global__ void __launch_bounds__(THREADS) reduce_combine(float *y, const double *part, int64_t nout, int64_t S)
{
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < nout; o += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0;
        for (int64_t s = 0; s < S; s++) acc += part[s * nout + o];
        y[o] = (float)acc;
    }
}

/* Segments per output: enough (output, segment) tasks to fill the GPU, each
 * segment at least min_len long, all partials within the context's scratch.
 * Depends on the shapes only, so the sums do not depend on anything else. */
static int64_t segments(int64_t nout, int64_t len, int64_t target_tasks, int64_t min_len)
{
    if (nout >= target_tasks) return 1;
    int64_t s = (target_tasks + nout - 1) / nout;
    if (s > len / min_len) s = len / min_len;
    const int64_t cap = (int64_t)(CK_CUDA_SCRATCH_BYTES / sizeof(double)) / nout;
    if (s > cap) s = cap;
    return s < 1 ? 1 : s;
}

/* y (nout) from x: rows case when the last kept dim runs contiguous (W wide),
 * runs case when the last dim is summed (runs of L). */
static void reduce_launch(ck_cuda_ctx *c, float *y, const float *x, const dims *kd, const dims *rd, int64_t last,
                          int last_kept)
{
    double *part = (double *)c->scratch;
    if (last_kept) {
        const int64_t W = last, nout = dims_count(kd) * W, Q = dims_count(rd);
        const int64_t S = segments(nout, Q, 65536, 64);
        ck_launch(reduce_rows_kernel, ck_grid(nout * S, THREADS), THREADS, c->stream, y, part, x, *kd, *rd, W, Q, nout, S);
        if (S > 1) ck_launch(reduce_combine, ck_grid(nout, THREADS), THREADS, c->stream, y, (const double *)part, nout, S);
    } else {
        const int64_t L = last, nout = dims_count(kd), M = dims_count(rd) * L;
        const int64_t S = segments(nout, M, 4096, 4096);
        const int64_t warps_per_block = THREADS / 32;
        ck_launch(reduce_runs_kernel, ck_grid(nout * S, (int)warps_per_block), THREADS, c->stream, y, part, x, *kd, *rd,
                  L, M, nout, S);
        if (S > 1) ck_launch(reduce_combine, ck_grid(nout, THREADS), THREADS, c->stream, y, (const double *)part, nout, S);
    }
}

void ck_cuda_sum_pqr(ck_cuda_ctx *c, float *y, const float *x, int64_t P, int64_t Q, int64_t R)
{
    dims kd = {0, {0}, {0}}, rd = {0, {0}, {0}};
    kd.n = 1, kd.size[0] = Q, kd.stride[0] = R;
    rd.n = 1, rd.size[0] = P, rd.stride[0] = Q * R;
    reduce_launch(c, y, x, &kd, &rd, R, 0);
}

/* x is any shape; y's shape broadcasts to x's when right-aligned, e.g.
 * (N,C,H,W) -> (C,1,1), (R,K) -> (K), (B,L,C) -> (1,1,C). Every output is a
 * double sum over its x elements, cut into segments fixed by the shapes and
 * added in order. */
extern "C" CK_CUDA_KERNEL(ck_cuda_reduce_to)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("reduce_to");
    if (!c) return;
    const ck_view *xv = &in[0], *yv = &out[0];
    if (ck_view_numel(yv) == 0) return;
    const int r = xv->ndim > yv->ndim ? xv->ndim : yv->ndim;
    int64_t gsize[CK_MAX_DIMS], gstride[CK_MAX_DIMS];
    int gkept[CK_MAX_DIMS], g = 0;
    for (int k = 0; k < r; k++) {
        const int xd = k - (r - xv->ndim), yd = k - (r - yv->ndim);
        const int64_t xs = xd >= 0 ? xv->shape[xd] : 1, ys = yd >= 0 ? yv->shape[yd] : 1;
        if (ys != xs && ys != 1) {
            ck_cuda_fail("reduce_to", "output does not broadcast to the input");
            return;
        }
        if (xs == 1) continue;
        const int kept = ys == xs;
        if (g > 0 && gkept[g - 1] == kept) {
            gsize[g - 1] *= xs;
        } else {
            gsize[g] = xs;
            gkept[g] = kept;
            g++;
        }
    }
    int reduced = 0;
    int64_t st = 1;
    for (int k = g - 1; k >= 0; k--) {
        gstride[k] = st;
        st *= gsize[k];
        reduced |= !gkept[k];
    }
    if (!reduced) {
        if (yv->data != xv->data)
            CK_CU("reduce_to", cudaMemcpyAsync(yv->data, xv->data, sizeof(float) * (size_t)ck_view_numel(xv),
                                               cudaMemcpyDeviceToDevice, c->stream));
        ck_cuda_end(c, "reduce_to");
        return;
    }
    if (ck_view_numel(xv) == 0) { /* every output sums nothing */
        CK_CU("reduce_to", cudaMemsetAsync(yv->data, 0, sizeof(float) * (size_t)ck_view_numel(yv), c->stream));
        ck_cuda_end(c, "reduce_to");
        return;
    }
    dims kd = {0, {0}, {0}}, rd = {0, {0}, {0}};
    for (int k = 0; k < g - 1; k++) {
        dims *d = gkept[k] ? &kd : &rd;
        d->size[d->n] = gsize[k];
        d->stride[d->n] = gstride[k];
        d->n++;
    }
    reduce_launch(c, yv->data, xv->data, &kd, &rd, gsize[g - 1], gkept[g - 1]);
    ck_cuda_end(c, "reduce_to");
}

/* y (P, Q, R) = b[q]: the bias laid down before a product adds onto it */
__global__ void __launch_bounds__(THREADS) bias_fill_kernel(float *y, const float *b, int64_t Q, int64_t R, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = b[i / R % Q];
}

void ck_cuda_bias_fill(ck_cuda_ctx *c, float *y, const float *b, int64_t P, int64_t Q, int64_t R)
{
    const int64_t n = P * Q * R;
    if (n == 0) return;
    ck_launch(bias_fill_kernel, ck_grid(n, THREADS), THREADS, c->stream, y, b, Q, R, n);
}
