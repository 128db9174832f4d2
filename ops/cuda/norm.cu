/* Normalization on the GPU: GROUP_NORM (and GROUP_NORM_SILU, the same kernels
 * with SiLU applied to the output, or its gradient taken through the
 * recomputed pre-activation) and LAYER_NORM, forward and backward,
 * in the formulas of ops/cpu/norm.c: two-pass statistics about the float mean,
 * recomputed from x in the backward, fp32 accumulation. Every sum has one fixed
 * order (no atomics), so results are the same from run to run:
 * - group norm: a block per (image, group); the backward runs a block per
 *   group walking the images in order when dgamma/dbeta are wanted;
 * - layer norm: a warp per row; dgamma/dbeta sum over rows in fixed chunks
 *   whose partials wait in dx's own buffer before dx is written (the plan
 *   gives this op no workspace), or in column tiles when dx is unwanted. */
#include "common.cuh"

#define GN_THREADS 512
#define THREADS 256
#define WARPS (THREADS / 32)
/* layer norm backward: row chunks of the partial sums, at most */
#define LN_CHUNKS 1024

/* ---- group norm ---- */

/* Mean and 1/sqrt(var + eps) of v[0..M), the variance about the float mean. */
__device__ __forceinline__ void block_stats(const float *v, int64_t M, float eps, float *sh, float *mean, float *rstd)
{
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) s += v[i];
    const float m = ck_block_sum(s, sh) / (float)M;
    float q = 0.0f;
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
        const float d = v[i] - m;
        q += d * d;
    }
    const float var = ck_block_sum(q, sh) / (float)M;
    *mean = m;
    *rstd = 1.0f / sqrtf(var + eps);
}

/* SILU's gate (activation.cu's formula) */
__device__ __forceinline__ float gn_sigmoid(float h) { return 1.0f / (1.0f + expf(-h)); }

// x (N, C, S) with groups of Cg = C/G channels; block (n, g) normalizes its Cg*S values;
// SILU: y = silu of that
template <bool SILU>
__global__ void __launch_bounds__(GN_THREADS) gn_fwd(float *y, const float *x, const float *gamma, const float *beta,
                                                     int64_t G, int64_t Cg, int64_t S, float eps)
{
    __shared__ float sh[33];
    const int64_t ng = blockIdx.x, c0 = ng % G * Cg, M = Cg * S;
    const float *xg = x + ng * M;
    float *yg = y + ng * M;
    float m, rs;
    block_stats(xg, M, eps, sh, &m, &rs);
    for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
        const int64_t c = c0 + i / S;
        const float h = (xg[i] - m) * (rs * gamma[c]) + beta[c];
        yg[i] = SILU ? h * gn_sigmoid(h) : h;
    }
}

/* Group g (blockIdx.x, images n0 .. n1-1 in order) of GROUP_NORM_BWD. Warp w
 * owns channels w, w + WARPS, ...: their sums of dy and dy * (x - m) over S,
 * their dgamma/dbeta entries (stored at n0, added after), and its share of the
 * group's sums, which the warps then add in warp order. SILU: dy is the
 * gradient of silu(h), and the norm's, dh, is made from it and h (recomputed
 * with beta) where it is read. */
template <bool SILU>
__device__ __forceinline__ float gn_grad_in(const float *dy, const float *x, int64_t i, float m, float a, float b)
{
    if (!SILU) return dy[i];
    const float h = (x[i] - m) * a + b, s = gn_sigmoid(h);
    return dy[i] * s * (1.0f + h * (1.0f - s));
}

template <bool SILU>
__global__ void __launch_bounds__(GN_THREADS) gn_bwd(float *dx, float *dgamma, float *dbeta, const float *dy,
                                                     const float *x, const float *gamma, const float *beta, int64_t C,
                                                     int64_t G, int64_t Cg, int64_t S, float eps, int64_t n0,
                                                     int64_t n1)
{
    __shared__ float sh[33];
    __shared__ float wsum[2][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int64_t g = blockIdx.x % G, M = Cg * S, c0 = g * Cg;
    if (n1 < 0) { /* a block per (n, g) */
        n0 = blockIdx.x / G;
        n1 = n0 + 1;
    }
    for (int64_t n = n0; n < n1; n++) {
        const int64_t off = (n * C + c0) * S;
        const float *xg = x + off, *dyg = dy + off;
        float m, rs;
        block_stats(xg, M, eps, sh, &m, &rs);
        float sg = 0.0f, sgx = 0.0f;
        for (int64_t c = warp; c < Cg; c += nwarps) {
            const float ga = rs * gamma[c0 + c], gb = SILU ? beta[c0 + c] : 0.0f;
            float a = 0.0f, b = 0.0f;
            for (int64_t s = lane; s < S; s += 32) {
                const float d = gn_grad_in<SILU>(dyg, xg, c * S + s, m, ga, gb);
                a += d;
                b += d * (xg[c * S + s] - m);
            }
            a = ck_warp_sum(a);
            b = ck_warp_sum(b);
            if (lane == 0) {
                if (dgamma) dgamma[c0 + c] = (n == n0 ? 0.0f : dgamma[c0 + c]) + b * rs;
                if (dbeta) dbeta[c0 + c] = (n == n0 ? 0.0f : dbeta[c0 + c]) + a;
            }
            sg += gamma[c0 + c] * a;
            sgx += gamma[c0 + c] * b;
        }
        if (lane == 0) wsum[0][warp] = sg, wsum[1][warp] = sgx;
        __syncthreads();
        sg = 0.0f, sgx = 0.0f;
        for (int w = 0; w < nwarps; w++) sg += wsum[0][w], sgx += wsum[1][w];
        __syncthreads();
        if (!dx) continue;
        // With g = gamma * dy and xh = (x - m) * rs: dx = rs * (g - mean(g) - xh * mean(g * xh)).
        const float mg = sg / (float)M, k2 = rs * rs * rs * sgx / (float)M;
        float *dxg = dx + off;
        for (int64_t i = threadIdx.x; i < M; i += blockDim.x) {
            const int64_t c = c0 + i / S;
            const float d = gn_grad_in<SILU>(dyg, xg, i, m, rs * gamma[c], SILU ? beta[c] : 0.0f);
            dxg[i] = (gamma[c] * d - mg) * rs - (xg[i] - m) * k2;
        }
    }
}

static int64_t spatial_of(const ck_view *x)
{
    int64_t s = 1;
    for (int d = 2; d < x->ndim; d++) s *= x->shape[d];
    return s;
}

// x is (N,C,*), gamma and beta (C), y like x; statistics per (n, group); silu: y = silu of the norm
static void group_norm_fwd(const char *name, int silu, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t N = in[0].shape[0], C = in[0].shape[1], S = spatial_of(&in[0]), G = p->i[0];
    if (G <= 0 || C % G) {
        ck_cuda_fail(name, "%lld channels do not split into %lld groups", (long long)C, (long long)G);
        return;
    }
    if (N * C * S == 0) return;
    ck_launch(silu ? gn_fwd<true> : gn_fwd<false>, (unsigned)(N * G), GN_THREADS, c->stream, out[0].data,
              (const float *)in[0].data, (const float *)in[1].data, (const float *)in[2].data, G, C / G, S, p->f[0]);
    ck_cuda_end(c, name);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_group_norm)
{
    (void)ctx, (void)nout, (void)nin;
    group_norm_fwd("group_norm", 0, p, out, in);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_group_norm_silu)
{
    (void)ctx, (void)nout, (void)nin;
    group_norm_fwd("group_norm_silu", 1, p, out, in);
}

// dy and x are (N,C,*), gamma (and beta when silu) is (C); dx like x, dgamma and dbeta (C), any unwanted
static void group_norm_bwd(const char *name, const float *beta, const ck_op_params *p, ck_view *out, int nout,
                           const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    float *dx = out[0].data, *dgamma = nout > 1 ? out[1].data : NULL, *dbeta = nout > 2 ? out[2].data : NULL;
    const int64_t N = in[1].shape[0], C = in[1].shape[1], S = spatial_of(&in[1]), G = p->i[0];
    if (G <= 0 || C % G) {
        ck_cuda_fail(name, "%lld channels do not split into %lld groups", (long long)C, (long long)G);
        return;
    }
    if (C == 0) return;
    if (N * S == 0) {
        if (dgamma) CK_CU(name, cudaMemsetAsync(dgamma, 0, sizeof(float) * (size_t)C, c->stream));
        if (dbeta) CK_CU(name, cudaMemsetAsync(dbeta, 0, sizeof(float) * (size_t)C, c->stream));
        ck_cuda_end(c, name);
        return;
    }
    const float *dy = in[0].data, *x = in[1].data, *gamma = in[2].data;
    auto k = beta ? gn_bwd<true> : gn_bwd<false>;
    if (dgamma || dbeta)
        ck_launch(k, (unsigned)G, GN_THREADS, c->stream, dx, dgamma, dbeta, dy, x, gamma, beta, C, G, C / G, S, p->f[0],
                  (int64_t)0, N);
    else if (dx)
        ck_launch(k, (unsigned)(N * G), GN_THREADS, c->stream, dx, (float *)NULL, (float *)NULL, dy, x, gamma, beta, C,
                  G, C / G, S, p->f[0], (int64_t)0, (int64_t)-1);
    ck_cuda_end(c, name);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_group_norm_bwd)
{
    (void)ctx, (void)nin;
    group_norm_bwd("group_norm_bwd", NULL, p, out, nout, in);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_group_norm_silu_bwd)
{
    (void)ctx, (void)nin;
    group_norm_bwd("group_norm_silu_bwd", (const float *)in[3].data, p, out, nout, in);
}

/* ---- layer norm ---- */

/* A warp's mean and 1/sqrt(var + eps) of one row of C. */
__device__ __forceinline__ void warp_stats(const float *xr, int64_t C, float eps, float *mean, float *rstd)
{
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += 32) s += xr[c];
    const float m = ck_warp_sum(s) / (float)C;
    float q = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        const float d = xr[c] - m;
        q += d * d;
    }
    *mean = m;
    *rstd = 1.0f / sqrtf(ck_warp_sum(q) / (float)C + eps);
}

#define FOR_ROWS(r, R)                                                                                  \
    for (int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); r < (R); \
         r += (int64_t)gridDim.x * WARPS)

// x (R, C); y (R, C): each row normalized, then scaled by gamma and shifted by beta
__global__ void __launch_bounds__(THREADS) ln_fwd(float *y, const float *x, const float *gamma, const float *beta,
                                                  int64_t R, int64_t C, float eps)
{
    const int lane = threadIdx.x & 31;
    FOR_ROWS(r, R)
    {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        float m, rs;
        warp_stats(xr, C, eps, &m, &rs);
        for (int64_t c = lane; c < C; c += 32) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
    }
}

/* dx of one row by its warp. With g = gamma * dy and xh = (x - m) * rs:
 * dx = rs * (g - mean(g) - xh * mean(g * xh)). */
__device__ __forceinline__ void ln_dx_row(float *dxr, const float *dyr, const float *xr, const float *gamma, int64_t C,
                                          float eps)
{
    const int lane = threadIdx.x & 31;
    float m, rs;
    warp_stats(xr, C, eps, &m, &rs);
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        const float g = gamma[c] * dyr[c];
        sg += g;
        sgx += g * (xr[c] - m);
    }
    const float mg = ck_warp_sum(sg) / (float)C;
    const float k2 = rs * rs * rs * ck_warp_sum(sgx) / (float)C;
    for (int64_t c = lane; c < C; c += 32) dxr[c] = (gamma[c] * dyr[c] - mg) * rs - (xr[c] - m) * k2;
}

__global__ void __launch_bounds__(THREADS) ln_bwd_dx(float *dx, const float *dy, const float *x, const float *gamma,
                                                     int64_t R, int64_t C, float eps)
{
    FOR_ROWS(r, R) ln_dx_row(dx + r * C, dy + r * C, x + r * C, gamma, C, eps);
}

/* Phase 1 of the chunked dgamma/dbeta: block k takes rows [R k / P, R (k+1) / P),
 * writes their statistics to st and, per column, the sums of dy * xh and dy
 * over its rows (in row order) to part[2k] and part[2k+1]. */
__global__ void __launch_bounds__(THREADS) ln_bwd_partials(float *part, float *st, const float *dy, const float *x,
                                                           int64_t R, int64_t C, float eps, int64_t P)
{
    const int64_t k = blockIdx.x, r0 = R * k / P, r1 = R * (k + 1) / P;
    for (int64_t r = r0 + (threadIdx.x >> 5); r < r1; r += WARPS) {
        float m, rs;
        warp_stats(x + r * C, C, eps, &m, &rs);
        if ((threadIdx.x & 31) == 0) st[2 * r] = m, st[2 * r + 1] = rs;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float a = 0.0f, b = 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            const float d = dy[r * C + c];
            a += d * ((x[r * C + c] - st[2 * r]) * st[2 * r + 1]);
            b += d;
        }
        part[2 * k * C + c] = a;
        part[(2 * k + 1) * C + c] = b;
    }
}

// Phase 2: dgamma[c], dbeta[c] = the P chunk partials of column c, added in chunk order
__global__ void __launch_bounds__(THREADS) ln_bwd_combine(float *dgamma, float *dbeta, const float *part, int64_t C,
                                                          int64_t P)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        double a = 0.0, b = 0.0;
        for (int64_t k = 0; k < P; k++) a += part[2 * k * C + c], b += part[(2 * k + 1) * C + c];
        if (dgamma) dgamma[c] = (float)a;
        if (dbeta) dbeta[c] = (float)b;
    }
}

/* Without a dx buffer to borrow (or one too small): block b owns columns
 * [32 b, 32 b + 32); warp w walks rows w, w + WARPS, ... computing each row's
 * statistics (and its dx sums when dx is wanted) and its lane's column terms;
 * the warps' partials are then added in warp order. Reads every row once per
 * column tile: slower, and only for shapes the chunked path cannot take. */
__global__ void __launch_bounds__(THREADS) ln_bwd_columns(float *dx, float *dgamma, float *dbeta, const float *dy,
                                                          const float *x, const float *gamma, int64_t R, int64_t C,
                                                          float eps)
{
    __shared__ float pa[WARPS][32], pb[WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t c = (int64_t)blockIdx.x * 32 + lane;
    float a = 0.0f, b = 0.0f;
    for (int64_t r = warp; r < R; r += WARPS) {
        const float *xr = x + r * C, *dyr = dy + r * C;
        float m, rs;
        warp_stats(xr, C, eps, &m, &rs);
        float mg = 0.0f, k2 = 0.0f;
        if (dx) {
            float sg = 0.0f, sgx = 0.0f;
            for (int64_t j = lane; j < C; j += 32) {
                const float g = gamma[j] * dyr[j];
                sg += g;
                sgx += g * (xr[j] - m);
            }
            mg = ck_warp_sum(sg) / (float)C;
            k2 = rs * rs * rs * ck_warp_sum(sgx) / (float)C;
        }
        if (c < C) {
            const float d = dyr[c];
            a += d * ((xr[c] - m) * rs);
            b += d;
            if (dx) dx[r * C + c] = (gamma[c] * d - mg) * rs - (xr[c] - m) * k2;
        }
    }
    pa[warp][lane] = a;
    pb[warp][lane] = b;
    __syncthreads();
    if (warp == 0 && c < C) {
        float sa = 0.0f, sb = 0.0f;
        for (int w = 0; w < WARPS; w++) sa += pa[w][lane], sb += pb[w][lane];
        if (dgamma) dgamma[c] = sa;
        if (dbeta) dbeta[c] = sb;
    }
}

// x is (..,C), gamma and beta (C), y like x; each row of C normalized
extern "C" CK_CUDA_KERNEL(ck_cuda_layer_norm)
{
    (void)ctx, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("layer_norm");
    if (!c) return;
    const int64_t C = in[0].shape[in[0].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / C;
    if (R == 0) return;
    ck_launch(ln_fwd, ck_grid(R, WARPS), THREADS, c->stream, out[0].data, (const float *)in[0].data,
              (const float *)in[1].data, (const float *)in[2].data, R, C, p->f[0]);
    ck_cuda_end(c, "layer_norm");
}

// dy and x are (..,C), gamma (C); dx like x, dgamma and dbeta (C), any unwanted
extern "C" CK_CUDA_KERNEL(ck_cuda_layer_norm_bwd)
{
    (void)ctx, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("layer_norm_bwd");
    if (!c) return;
    float *dx = out[0].data, *dgamma = nout > 1 ? out[1].data : NULL, *dbeta = nout > 2 ? out[2].data : NULL;
    const float *dy = in[0].data, *x = in[1].data, *gamma = in[2].data;
    const int64_t C = in[1].shape[in[1].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[1]) / C;
    const float eps = p->f[0];
    if (R == 0) {
        if (dgamma) CK_CU("layer_norm_bwd", cudaMemsetAsync(dgamma, 0, sizeof(float) * (size_t)C, c->stream));
        if (dbeta) CK_CU("layer_norm_bwd", cudaMemsetAsync(dbeta, 0, sizeof(float) * (size_t)C, c->stream));
        ck_cuda_end(c, "layer_norm_bwd");
        return;
    }
    if (!dgamma && !dbeta) {
        if (dx) ck_launch(ln_bwd_dx, ck_grid(R, WARPS), THREADS, c->stream, dx, dy, x, gamma, R, C, eps);
    } else if (dx && R >= 4 && C >= 4) {
        // Chunks of rows: their partials (2 P C floats) and row statistics (2 R)
        // fit in dx (R C floats) because P <= R / 4 and C >= 4.
        int64_t P = R / 4;
        if (P > LN_CHUNKS) P = LN_CHUNKS;
        float *part = dx, *st = dx + 2 * P * C;
        ck_launch(ln_bwd_partials, (unsigned)P, THREADS, c->stream, part, st, dy, x, R, C, eps, P);
        ck_launch(ln_bwd_combine, ck_grid(C, THREADS), THREADS, c->stream, dgamma, dbeta, (const float *)part, C, P);
        ck_launch(ln_bwd_dx, ck_grid(R, WARPS), THREADS, c->stream, dx, dy, x, gamma, R, C, eps);
    } else {
        ck_launch(ln_bwd_columns, (unsigned)((C + 31) / 32), THREADS, c->stream, dx, dgamma, dbeta, dy, x, gamma, R, C,
                  eps);
    }
    ck_cuda_end(c, "layer_norm_bwd");
}
