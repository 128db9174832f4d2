/* Normalization on the GPU: GROUP_NORM (and GROUP_NORM_SILU: the same
 * kernels with SiLU applied to the output, or its gradient taken through the
 * recomputed pre-activation) and LAYER_NORM, forward and backward, in the
 * formulas of ops/cpu/norm.c with statistics recomputed from x in the
 * backward and fp32 arithmetic. Every sum has one fixed order (no atomics), so
 * results are the same from run to run and a recomputed op repeats itself:
 * - group norm: a block per piece of GN_PIECE positions of one channel (SDXL's
 *   320 channels at 128x128 make 1280 blocks, not 32 groups' worth). Pieces
 *   leave partial sums in the workspace; the next kernel combines a group's
 *   partials in piece order, in double. x's statistics are shifted sums
 *   (about the group's first value) taken in one pass; the backward's
 *   sum(dy) and sum(dy * (x - mean)) share another. Loads and stores are
 *   16-byte vectors where channels are whole vectors;
 * - layer norm: a warp per row, held in the warp's registers where rows are
 *   whole vectors up to 1280 wide; dgamma/dbeta sum over rows in fixed chunks
 *   whose partials wait in dx's own buffer before dx is written (the plan
 *   gives this op no workspace), or in column tiles when dx is unwanted.
 * RMS_NORM runs the layer norm's kernels with the mean taken as 0 (and no
 * mean(g) term in dx); a missing gamma or beta is 1 or 0. Every op here also
 * has bf16 and fp16 storage: the same kernels templated on the storage type,
 * arithmetic and partial sums in fp32, never in the 16-bit type (fp16 ends at
 * 65504). */
#include "common.cuh"

#define THREADS 256
#define WARPS (THREADS / 32)
/* layer norm backward: row chunks of the partial sums, at most */
#define LN_CHUNKS 1024

/* ---- group norm ---- */

/* positions of one channel a block takes; ops/rules.c sizes the workspace by it */
#define GN_PIECE 4096

/* Shapes of a group norm: x (N, C, S), G groups of Cg channels, P pieces a
 * channel. The workspace holds, per piece (n, c, k) in that order, four
 * floats: sum(x - K), sum((x - K)^2) with K the group's first value, then
 * sum(dh), sum(dh * (x - mean)); after them, per (n, g), the mean and
 * 1/sqrt(var + eps) the backward's later passes read. */
struct gn_dims {
    int64_t N, C, G, Cg, S, P;
};

__device__ __forceinline__ float gn_sigmoid(float h) { return 1.0f / (1.0f + expf(-h)); }

/* W values of storage type T at p, as floats: one 16-byte vector (W = 16 /
 * sizeof(T): 4 floats, 8 bf16 or fp16) or one value (W = 1) */
template <typename T, int W>
__device__ __forceinline__ void gn_ld(const T *p, float *v)
{
    if (W > 1) {
        const ck_vec<T> t = *(const ck_vec<T> *)p;
#pragma unroll
        for (int w = 0; w < W; w++) v[w] = ck_ld(&t.v[w]);
    } else {
        v[0] = ck_ld(p);
    }
}

template <typename T, int W>
__device__ __forceinline__ void gn_st(T *p, const float *v)
{
    if (W > 1) {
        ck_vec<T> t;
#pragma unroll
        for (int w = 0; w < W; w++) ck_st(&t.v[w], v[w]);
        *(ck_vec<T> *)p = t;
    } else {
        ck_st(p, v[0]);
    }
}

/* This block's piece: row nc = n C + c of x, positions [*s0, *s1). */
__device__ __forceinline__ void gn_piece(const gn_dims &d, int64_t *nc, int64_t *s0, int64_t *s1)
{
    const int64_t b = blockIdx.x, k = b % d.P;
    *nc = b / d.P;
    *s0 = k * GN_PIECE;
    *s1 = *s0 + GN_PIECE < d.S ? *s0 + GN_PIECE : d.S;
}

/* The gradient of h = (x - m) a + b through SiLU (SILU_BWD's arithmetic), or dy itself */
template <bool SILU>
__device__ __forceinline__ float gn_grad_in(float dy, float x, float m, float a, float b)
{
    if (!SILU) return dy;
    const float h = (x - m) * a + b, s = gn_sigmoid(h);
    return dy * s * (1.0f + h * (1.0f - s));
}

// x (N, C, S); part: each piece's sum(x - K) and sum((x - K)^2)
template <typename T, int W>
__global__ void __launch_bounds__(THREADS) gn_stats(float *part, const T *x, gn_dims d)
{
    __shared__ float sh[33];
    int64_t nc, s0, s1;
    gn_piece(d, &nc, &s0, &s1);
    const int64_t n = nc / d.C, g = nc % d.C / d.Cg;
    const float K = ck_ld(x + (n * d.C + g * d.Cg) * d.S);
    const T *row = x + nc * d.S;
    float a = 0.0f, q = 0.0f;
    for (int64_t i = s0 + W * threadIdx.x; i < s1; i += W * blockDim.x) {
        float v[W];
        gn_ld<T, W>(row + i, v);
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float e = v[w] - K;
            a += e;
            q += e * e;
        }
    }
    a = ck_block_sum(a, sh);
    q = ck_block_sum(q, sh);
    if (threadIdx.x == 0) part[4 * blockIdx.x] = a, part[4 * blockIdx.x + 1] = q;
}

/* The mean and rstd of group (n, g) from its pieces' partials, summed by warp 0
 * in double (lane j takes entries j, j + 32, ...; then the xor tree), returned
 * to every thread. Every thread of the block calls it. */
template <typename T>
__device__ __forceinline__ void gn_group_stats(const float *part, const T *x, const gn_dims &d, int64_t n,
                                               int64_t g, float eps, float *mean, float *rstd)
{
    __shared__ float st[2];
    if (threadIdx.x < 32) {
        const int64_t first = (n * d.C + g * d.Cg) * d.P, cnt = d.Cg * d.P;
        double a = 0.0, q = 0.0;
        for (int64_t j = threadIdx.x; j < cnt; j += 32) a += part[4 * (first + j)], q += part[4 * (first + j) + 1];
        a = ck_warp_sum(a);
        q = ck_warp_sum(q);
        if (threadIdx.x == 0) {
            const double M = (double)(d.Cg * d.S), e = a / M, var = q / M - e * e;
            st[0] = (float)((double)ck_ld(x + (n * d.C + g * d.Cg) * d.S) + e);
            st[1] = (float)(1.0 / sqrt((var > 0.0 ? var : 0.0) + (double)eps));
        }
    }
    __syncthreads();
    *mean = st[0];
    *rstd = st[1];
}

// y (N, C, S) = the norm of x, scaled and shifted per channel; SILU: silu of that
template <typename T, int W, bool SILU>
__global__ void __launch_bounds__(THREADS) gn_apply(T *y, const T *x, const T *gamma, const T *beta, const float *part,
                                                    gn_dims d, float eps)
{
    int64_t nc, s0, s1;
    gn_piece(d, &nc, &s0, &s1);
    const int64_t n = nc / d.C, c = nc % d.C;
    float m, rs;
    gn_group_stats(part, x, d, n, c / d.Cg, eps, &m, &rs);
    const float a = rs * ck_ld(gamma + c), b = ck_ld(beta + c);
    const T *row = x + nc * d.S;
    T *yr = y + nc * d.S;
    for (int64_t i = s0 + W * threadIdx.x; i < s1; i += W * blockDim.x) {
        float v[W];
        gn_ld<T, W>(row + i, v);
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float h = (v[w] - m) * a + b;
            v[w] = SILU ? h * gn_sigmoid(h) : h;
        }
        gn_st<T, W>(yr + i, v);
    }
}

/* Backward, second pass: each piece's sum(dh) and sum(dh * (x - mean)) in one
 * read of dy and x; the group's first piece also stores the group's mean and
 * rstd for the passes after. */
template <typename T, int W, bool SILU>
__global__ void __launch_bounds__(THREADS) gn_grad_sums(float *part, float *gst, const T *dy, const T *x,
                                                        const T *gamma, const T *beta, gn_dims d, float eps)
{
    __shared__ float sh[33];
    int64_t nc, s0, s1;
    gn_piece(d, &nc, &s0, &s1);
    const int64_t n = nc / d.C, c = nc % d.C, g = c / d.Cg;
    float m, rs;
    gn_group_stats(part, x, d, n, g, eps, &m, &rs);
    if (threadIdx.x == 0 && c == g * d.Cg && s0 == 0) gst[2 * (n * d.G + g)] = m, gst[2 * (n * d.G + g) + 1] = rs;
    const float a = rs * ck_ld(gamma + c), b = SILU ? ck_ld(beta + c) : 0.0f;
    const T *row = x + nc * d.S, *dyr = dy + nc * d.S;
    float sa = 0.0f, sb = 0.0f;
    for (int64_t i = s0 + W * threadIdx.x; i < s1; i += W * blockDim.x) {
        float v[W], e[W];
        gn_ld<T, W>(row + i, v);
        gn_ld<T, W>(dyr + i, e);
#pragma unroll
        for (int w = 0; w < W; w++) {
            const float dh = gn_grad_in<SILU>(e[w], v[w], m, a, b);
            sa += dh;
            sb += dh * (v[w] - m);
        }
    }
    sa = ck_block_sum(sa, sh);
    sb = ck_block_sum(sb, sh);
    if (threadIdx.x == 0) part[4 * blockIdx.x + 2] = sa, part[4 * blockIdx.x + 3] = sb;
}

/* Backward, dx: with g = gamma * dh and xh = (x - m) * rs,
 * dx = rs * (g - mean(g) - xh * mean(g * xh)); warp 0 sums the group's
 * gamma-weighted piece partials in double, in a fixed order. */
template <typename T, int W, bool SILU>
__global__ void __launch_bounds__(THREADS) gn_dx(T *dx, const T *dy, const T *x, const T *gamma, const T *beta,
                                                 const float *part, const float *gst, gn_dims d)
{
    __shared__ float k[2];
    int64_t nc, s0, s1;
    gn_piece(d, &nc, &s0, &s1);
    const int64_t n = nc / d.C, c = nc % d.C, g = c / d.Cg;
    const float m = gst[2 * (n * d.G + g)], rs = gst[2 * (n * d.G + g) + 1];
    if (threadIdx.x < 32) {
        const int64_t first = (n * d.C + g * d.Cg) * d.P, cnt = d.Cg * d.P;
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = threadIdx.x; j < cnt; j += 32) {
            const double gc = ck_ld(gamma + g * d.Cg + j / d.P);
            sg += gc * part[4 * (first + j) + 2];
            sgx += gc * part[4 * (first + j) + 3];
        }
        sg = ck_warp_sum(sg);
        sgx = ck_warp_sum(sgx);
        if (threadIdx.x == 0) {
            const double M = (double)(d.Cg * d.S);
            k[0] = (float)(sg / M);
            k[1] = (float)((double)rs * rs * rs * sgx / M);
        }
    }
    __syncthreads();
    const float mg = k[0], k2 = k[1], gc = ck_ld(gamma + c), a = rs * gc, b = SILU ? ck_ld(beta + c) : 0.0f;
    const T *row = x + nc * d.S, *dyr = dy + nc * d.S;
    T *dxr = dx + nc * d.S;
    for (int64_t i = s0 + W * threadIdx.x; i < s1; i += W * blockDim.x) {
        float v[W], e[W];
        gn_ld<T, W>(row + i, v);
        gn_ld<T, W>(dyr + i, e);
#pragma unroll
        for (int w = 0; w < W; w++) e[w] = (gc * gn_grad_in<SILU>(e[w], v[w], m, a, b) - mg) * rs - (v[w] - m) * k2;
        gn_st<T, W>(dxr + i, e);
    }
}

/* Backward, dgamma and dbeta: a thread per channel adds its pieces' partials,
 * image by image in order (in double): dgamma = sum rs * sum(dh (x - m)),
 * dbeta = sum(dh). */
template <typename T>
__global__ void __launch_bounds__(THREADS) gn_params(T *dgamma, T *dbeta, const float *part, const float *gst, gn_dims d)
{
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < d.C; c += (int64_t)gridDim.x * blockDim.x) {
        double a = 0.0, b = 0.0;
        for (int64_t n = 0; n < d.N; n++) {
            double pa = 0.0, pb = 0.0;
            for (int64_t j = 0; j < d.P; j++) {
                pa += part[4 * ((n * d.C + c) * d.P + j) + 3];
                pb += part[4 * ((n * d.C + c) * d.P + j) + 2];
            }
            a += pa * gst[2 * (n * d.G + c / d.Cg) + 1];
            b += pb;
        }
        if (dgamma) ck_st(dgamma + c, (float)a);
        if (dbeta) ck_st(dbeta + c, (float)b);
    }
}

static int64_t spatial_of(const ck_view *x)
{
    int64_t s = 1;
    for (int d = 2; d < x->ndim; d++) s *= x->shape[d];
    return s;
}

/* The shapes of x, checked; the pieces' and groups' workspace, checked against
 * the plan's (ck_op_workspace_cuda). Returns 0 and fails naming the op if not. */
static int gn_setup(const char *name, const ck_kctx *ctx, const ck_op_params *p, const ck_view *x, gn_dims *d,
                    float **part, float **gst)
{
    d->N = x->shape[0], d->C = x->shape[1], d->S = spatial_of(x), d->G = p->i[0];
    if (d->G <= 0 || d->C % d->G) {
        ck_cuda_fail(name, "%lld channels do not split into %lld groups", (long long)d->C, (long long)d->G);
        return 0;
    }
    d->Cg = d->C / d->G;
    d->P = (d->S + GN_PIECE - 1) / GN_PIECE;
    const size_t need = sizeof(float) * (size_t)(4 * d->N * d->C * d->P + 2 * d->N * d->G);
    if (d->N * d->S > 0 && (!ctx->ws || ctx->ws_bytes < need)) {
        ck_cuda_fail(name, "workspace of %zu bytes holds no partial sums (%zu needed)", ctx->ws_bytes, need);
        return 0;
    }
    *part = (float *)ctx->ws;
    *gst = *part + 4 * d->N * d->C * d->P;
    return 1;
}

/* Threads a piece block runs: one per W values of a piece, in whole warps, at
 * most THREADS (small channels, the UNet's deepest levels, leave none idle). */
static unsigned gn_threads(const gn_dims &d, int W)
{
    const int64_t items = ((d.S < GN_PIECE ? d.S : GN_PIECE) + W - 1) / W, t = (items + 31) / 32 * 32;
    return (unsigned)(t < THREADS ? t : THREADS);
}

/* whole 16-byte vectors: channels of a multiple of W positions, pointers aligned */
static int gn_vec(const gn_dims &d, int W, const void *a, const void *b, const void *c)
{
    return d.S % W == 0 && ck_aligned16(a) && ck_aligned16(b) && (!c || ck_aligned16(c));
}

template <typename T, int W>
static void gn_fwd_passes(ck_cuda_ctx *c, const gn_dims &d, int silu, T *y, const T *x, const T *gamma, const T *beta,
                          float *part, float eps)
{
    const unsigned blocks = (unsigned)(d.N * d.C * d.P), t = gn_threads(d, W);
    ck_launch(gn_stats<T, W>, blocks, t, c->stream, part, x, d);
    ck_launch(silu ? gn_apply<T, W, true> : gn_apply<T, W, false>, blocks, t, c->stream, y, x, gamma, beta,
              (const float *)part, d, eps);
}

// x is (N,C,*), gamma and beta (C), y like x, all T; statistics per (n, group); silu: y = silu of the norm
template <typename T>
static void group_norm_fwd(const char *name, int silu, const ck_kctx *ctx, const ck_op_params *p, ck_view *out,
                           const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    gn_dims d;
    float *part, *gst;
    if (!gn_setup(name, ctx, p, &in[0], &d, &part, &gst)) return;
    if (d.N * d.C * d.S == 0) return;
    const T *x = (const T *)in[0].data, *gamma = (const T *)in[1].data, *beta = (const T *)in[2].data;
    T *y = (T *)out[0].data;
    constexpr int V = 16 / sizeof(T);
    if (gn_vec(d, V, x, y, NULL))
        gn_fwd_passes<T, V>(c, d, silu, y, x, gamma, beta, part, p->f[0]);
    else
        gn_fwd_passes<T, 1>(c, d, silu, y, x, gamma, beta, part, p->f[0]);
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(group_norm, group_norm_fwd<T>(name, 0, ctx, p, out, in))

CK_CUDA_ENTRIES(group_norm_silu, group_norm_fwd<T>(name, 1, ctx, p, out, in))

template <typename T, int W, bool SILU>
static void gn_bwd_passes(ck_cuda_ctx *c, const gn_dims &d, T *dx, T *dgamma, T *dbeta, const T *dy, const T *x,
                          const T *gamma, const T *beta, float *part, float *gst, float eps)
{
    const unsigned blocks = (unsigned)(d.N * d.C * d.P), t = gn_threads(d, W);
    ck_launch(gn_stats<T, W>, blocks, t, c->stream, part, x, d);
    ck_launch(gn_grad_sums<T, W, SILU>, blocks, t, c->stream, part, gst, dy, x, gamma, beta, d, eps);
    if (dx)
        ck_launch(gn_dx<T, W, SILU>, blocks, t, c->stream, dx, dy, x, gamma, beta, (const float *)part,
                  (const float *)gst, d);
    if (dgamma || dbeta)
        ck_launch(gn_params<T>, ck_grid(d.C, THREADS), THREADS, c->stream, dgamma, dbeta, (const float *)part,
                  (const float *)gst, d);
}

// dy and x are (N,C,*), gamma (and beta when silu) is (C); dx like x, dgamma and dbeta (C), any unwanted; all T
template <typename T>
static void group_norm_bwd(const char *name, int silu, const ck_kctx *ctx, const ck_op_params *p, ck_view *out,
                           int nout, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    T *dx = (T *)out[0].data, *dgamma = nout > 1 ? (T *)out[1].data : NULL, *dbeta = nout > 2 ? (T *)out[2].data : NULL;
    gn_dims d;
    float *part, *gst;
    if (!gn_setup(name, ctx, p, &in[1], &d, &part, &gst)) return;
    if (d.C == 0) return;
    if (d.N * d.S == 0) {
        if (dgamma) CK_CU(name, cudaMemsetAsync(dgamma, 0, sizeof(T) * (size_t)d.C, c->stream));
        if (dbeta) CK_CU(name, cudaMemsetAsync(dbeta, 0, sizeof(T) * (size_t)d.C, c->stream));
        ck_cuda_end(c, name);
        return;
    }
    if (!dx && !dgamma && !dbeta) return;
    const T *dy = (const T *)in[0].data, *x = (const T *)in[1].data, *gamma = (const T *)in[2].data;
    const T *beta = silu ? (const T *)in[3].data : NULL;
    const float eps = p->f[0];
    constexpr int V = 16 / sizeof(T);
    const int vec = gn_vec(d, V, x, dy, dx);
    if (vec && silu)
        gn_bwd_passes<T, V, true>(c, d, dx, dgamma, dbeta, dy, x, gamma, beta, part, gst, eps);
    else if (vec)
        gn_bwd_passes<T, V, false>(c, d, dx, dgamma, dbeta, dy, x, gamma, beta, part, gst, eps);
    else if (silu)
        gn_bwd_passes<T, 1, true>(c, d, dx, dgamma, dbeta, dy, x, gamma, beta, part, gst, eps);
    else
        gn_bwd_passes<T, 1, false>(c, d, dx, dgamma, dbeta, dy, x, gamma, beta, part, gst, eps);
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(group_norm_bwd, group_norm_bwd<T>(name, 0, ctx, p, out, nout, in))

CK_CUDA_ENTRIES(group_norm_silu_bwd, group_norm_bwd<T>(name, 1, ctx, p, out, nout, in))

/* ---- layer norm ---- */

/* A warp's mean and 1/sqrt(var + eps) of one row of C; rms (an RMS norm): the
 * mean taken as 0, so rstd = 1/sqrt(mean(x^2) + eps). */
template <typename T>
__device__ __forceinline__ void warp_stats(const T *xr, int64_t C, float eps, bool rms, float *mean, float *rstd)
{
    const int lane = threadIdx.x & 31;
    float m = 0.0f;
    if (!rms) {
        float s = 0.0f;
        for (int64_t c = lane; c < C; c += 32) s += ck_ld(xr + c);
        m = ck_warp_sum(s) / (float)C;
    }
    float q = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        const float d = ck_ld(xr + c) - m;
        q += d * d;
    }
    *mean = m;
    *rstd = 1.0f / sqrtf(ck_warp_sum(q) / (float)C + eps);
}

#define FOR_ROWS(r, R)                                                                                  \
    for (int64_t r = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); r < (R); \
         r += (int64_t)gridDim.x * WARPS)

/* gamma[c] or beta[c], or what a missing one stands for (1 and 0) */
template <typename T>
__device__ __forceinline__ float ld_or(const T *p, int64_t c, float v)
{
    return p ? ck_ld(p + c) : v;
}

// x (R, C); y (R, C): each row normalized, then scaled by gamma and shifted by beta (either
// may be NULL: 1 and 0; an RMS norm has no beta)
template <typename T>
__global__ void __launch_bounds__(THREADS) ln_fwd(T *y, const T *x, const T *gamma, const T *beta, int64_t R,
                                                  int64_t C, float eps, bool rms)
{
    const int lane = threadIdx.x & 31;
    FOR_ROWS(r, R)
    {
        const T *xr = x + r * C;
        T *yr = y + r * C;
        float m, rs;
        warp_stats(xr, C, eps, rms, &m, &rs);
        for (int64_t c = lane; c < C; c += 32) {
            const float v = (ck_ld(xr + c) - m) * rs * ld_or(gamma, c, 1.0f);
            ck_st(yr + c, beta ? v + ck_ld(beta + c) : v);
        }
    }
}

/* dx of one row by its warp. With g = gamma * dy and xh = (x - m) * rs:
 * dx = rs * (g - mean(g) - xh * mean(g * xh)); an RMS norm's (m = 0) has no
 * mean(g) term, its mean being no function of x. */
template <typename T>
__device__ __forceinline__ void ln_dx_row(T *dxr, const T *dyr, const T *xr, const T *gamma, int64_t C, float eps,
                                          bool rms)
{
    const int lane = threadIdx.x & 31;
    float m, rs;
    warp_stats(xr, C, eps, rms, &m, &rs);
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
        const float g = ld_or(gamma, c, 1.0f) * ck_ld(dyr + c);
        sg += g;
        sgx += g * (ck_ld(xr + c) - m);
    }
    const float mg = rms ? 0.0f : ck_warp_sum(sg) / (float)C;
    const float k2 = rs * rs * rs * ck_warp_sum(sgx) / (float)C;
    for (int64_t c = lane; c < C; c += 32)
        ck_st(dxr + c, (ld_or(gamma, c, 1.0f) * ck_ld(dyr + c) - mg) * rs - (ck_ld(xr + c) - m) * k2);
}

template <typename T>
__global__ void __launch_bounds__(THREADS) ln_bwd_dx(T *dx, const T *dy, const T *x, const T *gamma, int64_t R,
                                                     int64_t C, float eps, bool rms)
{
    FOR_ROWS(r, R) ln_dx_row(dx + r * C, dy + r * C, x + r * C, gamma, C, eps, rms);
}

/* Rows held in registers: C a multiple of W = 16 / sizeof(T) (a vector: 4
 * floats, 8 bf16 or fp16) and at most 32 W NV with NV <= LN_NV_MAX(T) (SDXL's 640 and
 * 1280), pointers 16-byte aligned. Lane l holds the row's vectors l, l + 32,
 * ..., NV of them, loaded once (as floats: at most 40 a lane whatever T); the
 * statistics and the output come from the registers, in the formulas above. */
#define LN_NV_MAX(T) (10 * (int)sizeof(T) / 4)
#define LN_W(T) (16 / (int)sizeof(T))

/* one vector's sum, pairwise: (v0 + v1) + (v2 + v3) for floats */
template <int W>
__device__ __forceinline__ float ln_vsum(const float *v);
template <>
__device__ __forceinline__ float ln_vsum<4>(const float *v)
{
    return (v[0] + v[1]) + (v[2] + v[3]);
}
template <>
__device__ __forceinline__ float ln_vsum<8>(const float *v)
{
    return ln_vsum<4>(v) + ln_vsum<4>(v + 4);
}

template <typename T, int NV>
__device__ __forceinline__ void ln_row_load(float (*v)[LN_W(T)], const T *r, int64_t CW)
{
    constexpr int W = LN_W(T);
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int64_t j = lane + 32 * k;
        if (j < CW) {
            gn_ld<T, W>(r + W * j, v[k]);
        } else {
#pragma unroll
            for (int w = 0; w < W; w++) v[k][w] = 0.0f;
        }
    }
}

/* W values of a parameter vector at p, or W copies of v where p is NULL */
template <typename T, int W>
__device__ __forceinline__ void ld_vec_or(const T *p, int64_t j, float *out, float v)
{
    if (p) {
        gn_ld<T, W>(p + W * j, out);
    } else {
#pragma unroll
        for (int w = 0; w < W; w++) out[w] = v;
    }
}

template <int W, int NV>
__device__ __forceinline__ void ln_row_stats(float (*v)[W], int64_t C, float eps, bool rms, float *mean, float *rstd)
{
    const int lane = threadIdx.x & 31;
    const int64_t CW = C / W;
    float m = 0.0f;
    if (!rms) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++)
            if (lane + 32 * k < CW) s += ln_vsum<W>(v[k]);
        m = ck_warp_sum(s) / (float)C;
    }
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (lane + 32 * k < CW)
#pragma unroll
            for (int w = 0; w < W; w++) {
                const float d = v[k][w] - m;
                q += d * d;
            }
    *mean = m;
    *rstd = 1.0f / sqrtf(ck_warp_sum(q) / (float)C + eps);
}

template <typename T, int NV>
__global__ void __launch_bounds__(THREADS) ln_fwd_reg(T *y, const T *x, const T *gamma, const T *beta, int64_t R,
                                                      int64_t C, float eps, bool rms)
{
    constexpr int W = LN_W(T);
    const int lane = threadIdx.x & 31;
    const int64_t CW = C / W;
    FOR_ROWS(r, R)
    {
        float v[NV][W];
        ln_row_load<T, NV>(v, x + r * C, CW);
        float m, rs;
        ln_row_stats<W, NV>(v, C, eps, rms, &m, &rs);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t j = lane + 32 * k;
            if (j < CW) {
                float g[W];
                ld_vec_or<T, W>(gamma, j, g, 1.0f);
#pragma unroll
                for (int w = 0; w < W; w++) g[w] = (v[k][w] - m) * rs * g[w];
                if (beta) {
                    float b[W];
                    gn_ld<T, W>(beta + W * j, b);
#pragma unroll
                    for (int w = 0; w < W; w++) g[w] += b[w];
                }
                gn_st<T, W>(y + r * C + W * j, g);
            }
        }
    }
}

/* ln_dx_row from registers: x and dy each read once */
template <typename T, int NV>
__global__ void __launch_bounds__(THREADS) ln_bwd_dx_reg(T *dx, const T *dy, const T *x, const T *gamma, int64_t R,
                                                         int64_t C, float eps, bool rms)
{
    constexpr int W = LN_W(T);
    const int lane = threadIdx.x & 31;
    const int64_t CW = C / W;
    FOR_ROWS(r, R)
    {
        float v[NV][W], e[NV][W];
        ln_row_load<T, NV>(v, x + r * C, CW);
        ln_row_load<T, NV>(e, dy + r * C, CW);
        float m, rs;
        ln_row_stats<W, NV>(v, C, eps, rms, &m, &rs);
        float sg = 0.0f, sgx = 0.0f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t j = lane + 32 * k;
            if (j < CW) {
                float g[W];
                ld_vec_or<T, W>(gamma, j, g, 1.0f);
#pragma unroll
                for (int w = 0; w < W; w++) {
                    const float gd = g[w] * e[k][w];
                    sg += gd;
                    sgx += gd * (v[k][w] - m);
                }
            }
        }
        const float mg = rms ? 0.0f : ck_warp_sum(sg) / (float)C;
        const float k2 = rs * rs * rs * ck_warp_sum(sgx) / (float)C;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int64_t j = lane + 32 * k;
            if (j < CW) {
                float g[W];
                ld_vec_or<T, W>(gamma, j, g, 1.0f);
#pragma unroll
                for (int w = 0; w < W; w++) g[w] = (g[w] * e[k][w] - mg) * rs - (v[k][w] - m) * k2;
                gn_st<T, W>(dx + r * C + W * j, g);
            }
        }
    }
}

/* The register kernels' NV for rows of C, or 0 where they do not apply. */
template <typename T>
static int ln_nv(int64_t C, const void *a, const void *b, const void *c, const void *d)
{
    const int64_t W = LN_W(T);
    if (C % W || C > 32 * W * LN_NV_MAX(T) || !ck_aligned16(a) || !ck_aligned16(b) || !ck_aligned16(c) ||
        (d && !ck_aligned16(d)))
        return 0;
    return (int)((C + 32 * W - 1) / (32 * W));
}

/* ln_nv's values; a T's cases past LN_NV_MAX(T) never occur and instantiate its largest */
#define LN_NV_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10)
#define LN_NVT(T, n) ((n) <= LN_NV_MAX(T) ? (n) : LN_NV_MAX(T))

template <typename T>
static void ln_fwd_launch(ck_cuda_ctx *c, int nv, T *y, const T *x, const T *gamma, const T *beta, int64_t R,
                          int64_t C, float eps, bool rms)
{
    switch (nv) {
#define LN_FWD(n)                                                                                                          case n: ck_launch(ln_fwd_reg<T, LN_NVT(T, n)>, ck_grid(R, WARPS), THREADS, c->stream, y, x, gamma, beta, R, C, eps, rms); break;
        LN_NV_CASES(LN_FWD)
#undef LN_FWD
    default: ck_launch(ln_fwd<T>, ck_grid(R, WARPS), THREADS, c->stream, y, x, gamma, beta, R, C, eps, rms);
    }
}

template <typename T>
static void ln_dx_launch(ck_cuda_ctx *c, T *dx, const T *dy, const T *x, const T *gamma, int64_t R, int64_t C,
                         float eps, bool rms)
{
    switch (ln_nv<T>(C, dx, dy, x, gamma)) {
#define LN_DX(n)                                                                                                           case n: ck_launch(ln_bwd_dx_reg<T, LN_NVT(T, n)>, ck_grid(R, WARPS), THREADS, c->stream, dx, dy, x, gamma, R, C, eps, rms); break;
        LN_NV_CASES(LN_DX)
#undef LN_DX
    default: ck_launch(ln_bwd_dx<T>, ck_grid(R, WARPS), THREADS, c->stream, dx, dy, x, gamma, R, C, eps, rms);
    }
}

/* Phase 1 of the chunked dgamma/dbeta: block k takes rows [R k / P, R (k+1) / P),
 * writes their statistics to st and, per column, the sums of dy * xh and dy
 * over its rows (in row order) to part[2k] and part[2k+1]. */
template <typename T>
__global__ void __launch_bounds__(THREADS) ln_bwd_partials(float *part, float *st, const T *dy, const T *x, int64_t R,
                                                           int64_t C, float eps, bool rms, int64_t P)
{
    const int64_t k = blockIdx.x, r0 = R * k / P, r1 = R * (k + 1) / P;
    for (int64_t r = r0 + (threadIdx.x >> 5); r < r1; r += WARPS) {
        float m, rs;
        warp_stats(x + r * C, C, eps, rms, &m, &rs);
        if ((threadIdx.x & 31) == 0) st[2 * r] = m, st[2 * r + 1] = rs;
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float a = 0.0f, b = 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            const float d = ck_ld(dy + r * C + c);
            a += d * ((ck_ld(x + r * C + c) - st[2 * r]) * st[2 * r + 1]);
            b += d;
        }
        part[2 * k * C + c] = a;
        part[(2 * k + 1) * C + c] = b;
    }
}

/* Phase 2: dgamma[c], dbeta[c] = the P chunk partials of column c. Block b
 * takes columns [32 b, 32 b + 32), a lane each; warp w adds chunks w, w +
 * WARPS, ... in order (in double), then warp 0 adds the warps' sums in warp
 * order: WARPS loads in flight per column instead of one thread walking all P. */
template <typename T>
__global__ void __launch_bounds__(THREADS) ln_bwd_combine(T *dgamma, T *dbeta, const float *part, int64_t C, int64_t P)
{
    __shared__ double pa[WARPS][32], pb[WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t c = (int64_t)blockIdx.x * 32 + lane;
    double a = 0.0, b = 0.0;
    if (c < C)
        for (int64_t k = warp; k < P; k += WARPS) a += part[2 * k * C + c], b += part[(2 * k + 1) * C + c];
    pa[warp][lane] = a;
    pb[warp][lane] = b;
    __syncthreads();
    if (warp == 0 && c < C) {
        double sa = 0.0, sb = 0.0;
        for (int w = 0; w < WARPS; w++) sa += pa[w][lane], sb += pb[w][lane];
        if (dgamma) ck_st(dgamma + c, (float)sa);
        if (dbeta) ck_st(dbeta + c, (float)sb);
    }
}

/* Without a dx buffer to borrow (or one too small): block b owns columns
 * [32 b, 32 b + 32); warp w walks rows w, w + WARPS, ... computing each row's
 * statistics (and its dx sums when dx is wanted) and its lane's column terms;
 * the warps' partials are then added in warp order. Reads every row once per
 * column tile: slower, and only for shapes the chunked path cannot take. */
template <typename T>
__global__ void __launch_bounds__(THREADS) ln_bwd_columns(T *dx, T *dgamma, T *dbeta, const T *dy, const T *x,
                                                          const T *gamma, int64_t R, int64_t C, float eps, bool rms)
{
    __shared__ float pa[WARPS][32], pb[WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t c = (int64_t)blockIdx.x * 32 + lane;
    float a = 0.0f, b = 0.0f;
    for (int64_t r = warp; r < R; r += WARPS) {
        const T *xr = x + r * C, *dyr = dy + r * C;
        float m, rs;
        warp_stats(xr, C, eps, rms, &m, &rs);
        float mg = 0.0f, k2 = 0.0f;
        if (dx) {
            float sg = 0.0f, sgx = 0.0f;
            for (int64_t j = lane; j < C; j += 32) {
                const float g = ld_or(gamma, j, 1.0f) * ck_ld(dyr + j);
                sg += g;
                sgx += g * (ck_ld(xr + j) - m);
            }
            mg = rms ? 0.0f : ck_warp_sum(sg) / (float)C;
            k2 = rs * rs * rs * ck_warp_sum(sgx) / (float)C;
        }
        if (c < C) {
            const float d = ck_ld(dyr + c), xc = ck_ld(xr + c);
            a += d * ((xc - m) * rs);
            b += d;
            if (dx) ck_st(dx + r * C + c, (ld_or(gamma, c, 1.0f) * d - mg) * rs - (xc - m) * k2);
        }
    }
    pa[warp][lane] = a;
    pb[warp][lane] = b;
    __syncthreads();
    if (warp == 0 && c < C) {
        float sa = 0.0f, sb = 0.0f;
        for (int w = 0; w < WARPS; w++) sa += pa[w][lane], sb += pb[w][lane];
        if (dgamma) ck_st(dgamma + c, sa);
        if (dbeta) ck_st(dbeta + c, sb);
    }
}

// x is (..,C), gamma and beta (C, either absent), y like x, all T; each row of C normalized
// (rms: an RMS norm's rows)
template <typename T>
static void layer_norm_fwd(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in, int nin, bool rms)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t C = in[0].shape[in[0].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / C;
    if (R == 0) return;
    const T *x = (const T *)in[0].data, *gamma = nin > 1 ? (const T *)in[1].data : NULL;
    const T *beta = nin > 2 ? (const T *)in[2].data : NULL;
    T *y = (T *)out[0].data;
    ln_fwd_launch<T>(c, ln_nv<T>(C, y, x, gamma, beta), y, x, gamma, beta, R, C, p->f[0], rms);
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(layer_norm, layer_norm_fwd<T>(name, p, out, in, nin, false))

CK_CUDA_ENTRIES(rms_norm, layer_norm_fwd<T>(name, p, out, in, nin, true))

// dy and x are (..,C), gamma (C, or absent); dx like x, dgamma and dbeta (C), any unwanted; all T
template <typename T>
static void layer_norm_bwd(const char *name, const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin,
                           bool rms)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    T *dx = (T *)out[0].data, *dgamma = nout > 1 ? (T *)out[1].data : NULL, *dbeta = nout > 2 ? (T *)out[2].data : NULL;
    const T *dy = (const T *)in[0].data, *x = (const T *)in[1].data, *gamma = nin > 2 ? (const T *)in[2].data : NULL;
    const int64_t C = in[1].shape[in[1].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[1]) / C;
    const float eps = p->f[0];
    if (R == 0) {
        if (dgamma) CK_CU(name, cudaMemsetAsync(dgamma, 0, sizeof(T) * (size_t)C, c->stream));
        if (dbeta) CK_CU(name, cudaMemsetAsync(dbeta, 0, sizeof(T) * (size_t)C, c->stream));
        ck_cuda_end(c, name);
        return;
    }
    // Chunks of rows: their partials (2 P C floats) and row statistics (2 R)
    // fit in dx (R C sizeof(T) / 4 floats) because, with W = 16 / sizeof(T),
    // P <= R / W and C >= W: each takes at most half. A 16-bit dx (bf16 or
    // fp16) holds half fp32's floats, so it has R / 8 chunks where fp32 has
    // R / 4; the floats need dx 4-byte aligned. They are fp32 bits whatever T
    // is, so fp16's range never bounds them.
    const int64_t W = LN_W(T);
    if (!dgamma && !dbeta) {
        if (dx) ln_dx_launch<T>(c, dx, dy, x, gamma, R, C, eps, rms);
    } else if (dx && R >= W && C >= W && ((uintptr_t)dx & 3u) == 0) {
        int64_t P = R / W;
        if (P > LN_CHUNKS) P = LN_CHUNKS;
        float *part = (float *)dx, *st = part + 2 * P * C;
        ck_launch(ln_bwd_partials<T>, (unsigned)P, THREADS, c->stream, part, st, dy, x, R, C, eps, rms, P);
        ck_launch(ln_bwd_combine<T>, (unsigned)((C + 31) / 32), THREADS, c->stream, dgamma, dbeta,
                  (const float *)part, C, P);
        ln_dx_launch<T>(c, dx, dy, x, gamma, R, C, eps, rms);
    } else {
        ck_launch(ln_bwd_columns<T>, (unsigned)((C + 31) / 32), THREADS, c->stream, dx, dgamma, dbeta, dy, x, gamma,
                  R, C, eps, rms);
    }
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(layer_norm_bwd, layer_norm_bwd<T>(name, p, out, nout, in, nin, false))

CK_CUDA_ENTRIES(rms_norm_bwd, layer_norm_bwd<T>(name, p, out, nout, in, nin, true))
