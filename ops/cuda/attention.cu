/* Multi-head scaled dot-product attention on the GPU, forward and backward.
 * Heads are columns of the (B,L,H*D) projections, as on the CPU.
 *
 * Head dims up to 128: fused kernels of our own (flash-attention style, fp32 on
 * CUDA cores). A query row belongs to TPR = ceil(D/32) adjacent threads, each
 * holding 32 of its dims (d = slice + TPR * e), dot products finished with
 * shuffles inside the group; keys and values pass through shared memory in
 * tiles of BK rows; softmax is online (running max and sum). The scores are
 * never stored. The backward is deterministic without atomics:
 *   1. per query row, rerun the forward to get lse = log sum exp and
 *      delta = dout . o (into the workspace);
 *   2. per query row, dq = scale sum_j dS_ij k_j, keys in order;
 *   3. per key row, dv = sum_i P_ij dout_i and dk = scale sum_i dS_ij q_i,
 *      queries in order;
 * with P = exp(scale q k - lse) and dS = P (dout . v - delta). Each output
 * element is owned by one thread and summed in one order.
 *
 * Larger head dims: the scores of a few heads at a time are materialized in the
 * workspace and the products go through cuBLAS, as ops/cpu/attention.c does. */
#include "common.cuh"

#define ROWS 64 /* query (or key) rows per block */
#define BK 32   /* key (or query) rows per shared-memory tile */
#define E 32    /* dims per thread */

struct att_geom {
    int64_t B, LQ, LK, H, D, HD;
    float scale;
};

static att_geom geom(const ck_op_params *p, const ck_view *q, const ck_view *k)
{
    att_geom g;
    g.B = q->shape[0], g.LQ = q->shape[1], g.HD = q->shape[2], g.LK = k->shape[1];
    g.H = p->i[0] > 0 ? p->i[0] : 1;
    g.D = g.HD / g.H;
    g.scale = p->f[0] != 0.0f ? p->f[0] : (g.D > 0 ? (float)(1.0 / sqrt((double)g.D)) : 1.0f);
    return g;
}

/* Sum over the TPR threads of one row (adjacent lanes); every one gets it. */
template <int TPR>
__device__ __forceinline__ float group_sum(float v)
{
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(CK_FULL_MASK, v, o);
    return v;
}

/* Rows [r0, r0 + BK) of a (L, HD) head view at column h*D into a BK x DM tile,
 * zero past L and past D; scaled by f. */
template <int DM>
__device__ __forceinline__ void load_tile(float (*t)[DM], const float *base, int64_t r0, int64_t L, int64_t HD, int D,
                                          float f)
{
    for (int idx = threadIdx.x; idx < BK * DM; idx += blockDim.x) {
        const int rr = idx / DM, d = idx % DM;
        const int64_t r = r0 + rr;
        t[rr][d] = r < L && d < D ? base[r * HD + d] * f : 0.0f;
    }
}

/* One thread's 32 dims of row r of a (L, HD) head view, zero past L and D, times f. */
template <int TPR>
__device__ __forceinline__ void load_row(float *dst, const float *base, int64_t r, int64_t L, int64_t HD, int D, int sl,
                                         float f)
{
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int d = sl + TPR * e;
        dst[e] = r < L && d < D ? base[r * HD + d] * f : 0.0f;
    }
}

template <int TPR>
__device__ __forceinline__ void store_row(float *base, const float *src, int64_t r, int64_t L, int64_t HD, int D,
                                          int sl, float f)
{
    if (r >= L) return;
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int d = sl + TPR * e;
        if (d < D) base[r * HD + d] = src[e] * f;
    }
}

/* Forward for the query rows of this block and head pair (pair0 + blockIdx.y).
 * STATS: instead of o, write lse and delta = dout . o per row (backward step 1),
 * at row (blockIdx.y * LQ + i) of the workspace arrays. */
template <int TPR, bool STATS>
__global__ void __launch_bounds__(ROWS *TPR) flash_fwd(float *o, const float *q, const float *k, const float *v,
                                                        const float *dout, float *lse, float *delta, int64_t LQ,
                                                        int64_t LK, int64_t H, int D, int64_t HD, float scale,
                                                        int64_t pair0)
{
    constexpr int DM = 32 * TPR;
    __shared__ float Ks[BK][DM], Vs[BK][DM];
    const int sl = threadIdx.x % TPR;
    const int64_t pair = pair0 + blockIdx.y, b = pair / H, h = pair % H;
    const int64_t i = (int64_t)blockIdx.x * ROWS + threadIdx.x / TPR;
    const int64_t qoff = b * LQ * HD + h * D, koff = b * LK * HD + h * D;
    float qv[E], acc[E], sc[BK];
    load_row<TPR>(qv, q + qoff, i, LQ, HD, D, sl, scale);
#pragma unroll
    for (int e = 0; e < E; e++) acc[e] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t k0 = 0; k0 < LK; k0 += BK) {
        load_tile<DM>(Ks, k + koff, k0, LK, HD, D, 1.0f);
        load_tile<DM>(Vs, v + koff, k0, LK, HD, D, 1.0f);
        __syncthreads();
        const int nk = LK - k0 < BK ? (int)(LK - k0) : BK;
        float tmax = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < BK; jj++) {
            if (jj < nk) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++) s += qv[e] * Ks[jj][sl + TPR * e];
                sc[jj] = group_sum<TPR>(s);
                tmax = fmaxf(tmax, sc[jj]);
            }
        }
        const float mnew = fmaxf(m, tmax), corr = expf(m - mnew);
        l *= corr;
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] *= corr;
#pragma unroll
        for (int jj = 0; jj < BK; jj++) {
            if (jj < nk) {
                const float pj = expf(sc[jj] - mnew);
                l += pj;
#pragma unroll
                for (int e = 0; e < E; e++) acc[e] += pj * Vs[jj][sl + TPR * e];
            }
        }
        m = mnew;
        __syncthreads();
    }
    const float inv = 1.0f / l;
    if (!STATS) {
        store_row<TPR>(o + qoff, acc, i, LQ, HD, D, sl, inv);
        return;
    }
    float dov[E];
    load_row<TPR>(dov, dout + qoff, i, LQ, HD, D, sl, 1.0f);
    float dd = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) dd += dov[e] * (acc[e] * inv);
    dd = group_sum<TPR>(dd);
    if (i < LQ && sl == 0) {
        lse[blockIdx.y * LQ + i] = m + logf(l);
        delta[blockIdx.y * LQ + i] = dd;
    }
}

/* Backward step 2: dq for this block's query rows, keys in order. */
template <int TPR>
__global__ void __launch_bounds__(ROWS *TPR) flash_bwd_dq(float *dq, const float *dout, const float *q, const float *k,
                                                           const float *v, const float *lse, const float *delta,
                                                           int64_t LQ, int64_t LK, int64_t H, int D, int64_t HD,
                                                           float scale, int64_t pair0)
{
    constexpr int DM = 32 * TPR;
    __shared__ float Ks[BK][DM], Vs[BK][DM];
    const int sl = threadIdx.x % TPR;
    const int64_t pair = pair0 + blockIdx.y, b = pair / H, h = pair % H;
    const int64_t i = (int64_t)blockIdx.x * ROWS + threadIdx.x / TPR;
    const int64_t qoff = b * LQ * HD + h * D, koff = b * LK * HD + h * D;
    float qv[E], dov[E], acc[E];
    load_row<TPR>(qv, q + qoff, i, LQ, HD, D, sl, scale);
    load_row<TPR>(dov, dout + qoff, i, LQ, HD, D, sl, 1.0f);
#pragma unroll
    for (int e = 0; e < E; e++) acc[e] = 0.0f;
    const float li = i < LQ ? lse[blockIdx.y * LQ + i] : 0.0f, di = i < LQ ? delta[blockIdx.y * LQ + i] : 0.0f;
    for (int64_t k0 = 0; k0 < LK; k0 += BK) {
        load_tile<DM>(Ks, k + koff, k0, LK, HD, D, 1.0f);
        load_tile<DM>(Vs, v + koff, k0, LK, HD, D, 1.0f);
        __syncthreads();
        const int nk = LK - k0 < BK ? (int)(LK - k0) : BK;
        for (int jj = 0; jj < nk; jj++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) {
                s += qv[e] * Ks[jj][sl + TPR * e];
                dp += dov[e] * Vs[jj][sl + TPR * e];
            }
            s = group_sum<TPR>(s);
            dp = group_sum<TPR>(dp);
            const float ds = expf(s - li) * (dp - di);
#pragma unroll
            for (int e = 0; e < E; e++) acc[e] += ds * Ks[jj][sl + TPR * e];
        }
        __syncthreads();
    }
    store_row<TPR>(dq + qoff, acc, i, LQ, HD, D, sl, scale);
}

/* Backward step 3: dk and dv for this block's key rows, queries in order.
 * Query tiles hold scale * q, so dk needs no final scaling. */
template <int TPR>
__global__ void __launch_bounds__(ROWS *TPR) flash_bwd_dkdv(float *dk, float *dv, const float *dout, const float *q,
                                                             const float *k, const float *v, const float *lse,
                                                             const float *delta, int64_t LQ, int64_t LK, int64_t H,
                                                             int D, int64_t HD, float scale, int64_t pair0)
{
    constexpr int DM = 32 * TPR;
    __shared__ float Qs[BK][DM], Os[BK][DM], Ls[BK], Ds[BK];
    const int sl = threadIdx.x % TPR;
    const int64_t pair = pair0 + blockIdx.y, b = pair / H, h = pair % H;
    const int64_t j = (int64_t)blockIdx.x * ROWS + threadIdx.x / TPR;
    const int64_t qoff = b * LQ * HD + h * D, koff = b * LK * HD + h * D;
    float kv[E], vv[E], dka[E], dva[E];
    load_row<TPR>(kv, k + koff, j, LK, HD, D, sl, 1.0f);
    load_row<TPR>(vv, v + koff, j, LK, HD, D, sl, 1.0f);
#pragma unroll
    for (int e = 0; e < E; e++) dka[e] = dva[e] = 0.0f;
    for (int64_t i0 = 0; i0 < LQ; i0 += BK) {
        load_tile<DM>(Qs, q + qoff, i0, LQ, HD, D, scale);
        load_tile<DM>(Os, dout + qoff, i0, LQ, HD, D, 1.0f);
        for (int t = threadIdx.x; t < BK; t += blockDim.x) {
            const int64_t i = i0 + t;
            Ls[t] = i < LQ ? lse[blockIdx.y * LQ + i] : 0.0f;
            Ds[t] = i < LQ ? delta[blockIdx.y * LQ + i] : 0.0f;
        }
        __syncthreads();
        const int nq = LQ - i0 < BK ? (int)(LQ - i0) : BK;
        for (int ii = 0; ii < nq; ii++) {
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++) {
                s += Qs[ii][sl + TPR * e] * kv[e];
                dp += Os[ii][sl + TPR * e] * vv[e];
            }
            s = group_sum<TPR>(s);
            dp = group_sum<TPR>(dp);
            const float pr = expf(s - Ls[ii]), ds = pr * (dp - Ds[ii]);
#pragma unroll
            for (int e = 0; e < E; e++) {
                dva[e] += pr * Os[ii][sl + TPR * e];
                dka[e] += ds * Qs[ii][sl + TPR * e];
            }
        }
        __syncthreads();
    }
    if (dk) store_row<TPR>(dk + koff, dka, j, LK, HD, D, sl, 1.0f);
    if (dv) store_row<TPR>(dv + koff, dva, j, LK, HD, D, sl, 1.0f);
}

template <int TPR>
static void fused_fwd(ck_cuda_ctx *c, const att_geom *g, float *o, const float *q, const float *k, const float *v)
{
    const int64_t pairs = g->B * g->H;
    for (int64_t p0 = 0; p0 < pairs; p0 += 65535) {
        const int64_t np = pairs - p0 < 65535 ? pairs - p0 : 65535;
        ck_launch(flash_fwd<TPR, false>, dim3((unsigned)((g->LQ + ROWS - 1) / ROWS), (unsigned)np), ROWS * TPR,
                  c->stream, o, q, k, v, (const float *)NULL, (float *)NULL, (float *)NULL, g->LQ, g->LK, g->H,
                  (int)g->D, g->HD, g->scale, p0);
    }
}

/* chunk: head pairs whose lse and delta fit the workspace at once */
template <int TPR>
static void fused_bwd(ck_cuda_ctx *c, const att_geom *g, float *dq, float *dk, float *dv, const float *dout,
                      const float *q, const float *k, const float *v, float *ws, int64_t chunk)
{
    const int64_t pairs = g->B * g->H;
    float *lse = ws, *delta = ws + chunk * g->LQ;
    const unsigned qblocks = (unsigned)((g->LQ + ROWS - 1) / ROWS), kblocks = (unsigned)((g->LK + ROWS - 1) / ROWS);
    for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
        const unsigned np = (unsigned)(pairs - p0 < chunk ? pairs - p0 : chunk);
        ck_launch(flash_fwd<TPR, true>, dim3(qblocks, np), ROWS * TPR, c->stream, (float *)NULL, q, k, v, dout, lse,
                  delta, g->LQ, g->LK, g->H, (int)g->D, g->HD, g->scale, p0);
        if (dq)
            ck_launch(flash_bwd_dq<TPR>, dim3(qblocks, np), ROWS * TPR, c->stream, dq, dout, q, k, v,
                      (const float *)lse, (const float *)delta, g->LQ, g->LK, g->H, (int)g->D, g->HD, g->scale, p0);
        if (dk || dv)
            ck_launch(flash_bwd_dkdv<TPR>, dim3(kblocks, np), ROWS * TPR, c->stream, dk, dv, dout, q, k, v,
                      (const float *)lse, (const float *)delta, g->LQ, g->LK, g->H, (int)g->D, g->HD, g->scale, p0);
    }
}

/* ---- head dims above 128: scores through the workspace and cuBLAS ---- */

/* Heads hc at a time of batch b: S = scale q k^T into P, row softmax, o = P v. */
static void gemm_fwd(ck_cuda_ctx *c, const att_geom *g, float *o, const float *q, const float *k, const float *v,
                     float *P, int64_t hmax)
{
    const int64_t LQ = g->LQ, LK = g->LK, D = g->D, HD = g->HD, S = LQ * LK;
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t h = 0; h < g->H; h += hmax) {
            const int64_t hc = g->H - h < hmax ? g->H - h : hmax;
            const int64_t qo = b * LQ * HD + h * D, ko = b * LK * HD + h * D;
            if (!ck_cuda_gemm(c, "attention", 0, 1, LQ, LK, D, g->scale, q + qo, HD, D, k + ko, HD, D, 0.0f, P, LK, S, hc))
                return;
            ck_cuda_softmax_rows(c, P, P, hc * LQ, LK);
            if (!ck_cuda_gemm(c, "attention", 0, 0, LQ, D, LK, 1.0f, P, LK, S, v + ko, HD, D, 0.0f, o + qo, HD, D, hc))
                return;
        }
}

/* dv = P^T dout, dS = scale P (dout v^T - rowsum), dq = dS k, dk = dS^T q. */
static void gemm_bwd(ck_cuda_ctx *c, const att_geom *g, float *dq, float *dk, float *dv, const float *dout,
                     const float *q, const float *k, const float *v, float *ws, int64_t hmax)
{
    const char *op = "attention_bwd";
    const int64_t LQ = g->LQ, LK = g->LK, D = g->D, HD = g->HD, S = LQ * LK;
    float *P = ws, *dS = ws + hmax * S;
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t h = 0; h < g->H; h += hmax) {
            const int64_t hc = g->H - h < hmax ? g->H - h : hmax;
            const int64_t qo = b * LQ * HD + h * D, ko = b * LK * HD + h * D;
            if (!ck_cuda_gemm(c, op, 0, 1, LQ, LK, D, g->scale, q + qo, HD, D, k + ko, HD, D, 0.0f, P, LK, S, hc)) return;
            ck_cuda_softmax_rows(c, P, P, hc * LQ, LK);
            if (dv && !ck_cuda_gemm(c, op, 1, 0, LK, D, LQ, 1.0f, P, LK, S, dout + qo, HD, D, 0.0f, dv + ko, HD, D, hc))
                return;
            if (!dq && !dk) continue;
            if (!ck_cuda_gemm(c, op, 0, 1, LQ, LK, D, 1.0f, dout + qo, HD, D, v + ko, HD, D, 0.0f, dS, LK, S, hc)) return;
            ck_cuda_dsoftmax_rows(c, dS, dS, P, hc * LQ, LK, g->scale);
            if (dq && !ck_cuda_gemm(c, op, 0, 0, LQ, D, LK, 1.0f, dS, LK, S, k + ko, HD, D, 0.0f, dq + qo, HD, D, hc))
                return;
            if (dk && !ck_cuda_gemm(c, op, 1, 0, LK, D, LQ, 1.0f, dS, LK, S, q + qo, HD, D, 0.0f, dk + ko, HD, D, hc))
                return;
        }
}

static int zero(ck_cuda_ctx *c, const char *op, float *x, int64_t n)
{
    if (!x || n <= 0) return 1;
    return CK_CU(op, cudaMemsetAsync(x, 0, sizeof(float) * (size_t)n, c->stream));
}

// q is (B,LQ,H*D), k and v are (B,LK,H*D); o is (B,LQ,H*D). Head h is columns h*D..h*D+D-1.
extern "C" CK_CUDA_KERNEL(ck_cuda_attention)
{
    (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("attention");
    if (!c) return;
    const att_geom g = geom(p, &in[0], &in[1]);
    const float *q = in[0].data, *k = in[1].data, *v = in[2].data;
    float *o = out[0].data;
    if (g.B * g.LQ * g.HD == 0) return;
    if (g.LK == 0) {
        zero(c, "attention", o, g.B * g.LQ * g.HD);
    } else if (g.D <= 32) {
        fused_fwd<1>(c, &g, o, q, k, v);
    } else if (g.D <= 64) {
        fused_fwd<2>(c, &g, o, q, k, v);
    } else if (g.D <= 128) {
        fused_fwd<4>(c, &g, o, q, k, v);
    } else {
        const int64_t hmax = (int64_t)(ctx->ws_bytes / (sizeof(float) * (size_t)(g.LQ * g.LK)));
        if (hmax < 1)
            ck_cuda_fail("attention", "workspace of %zu bytes holds no %lld x %lld score matrix", ctx->ws_bytes,
                         (long long)g.LQ, (long long)g.LK);
        else
            gemm_fwd(c, &g, o, q, k, v, (float *)ctx->ws, hmax < g.H ? hmax : g.H);
    }
    ck_cuda_end(c, "attention");
}

// dout and q are (B,LQ,H*D), k and v are (B,LK,H*D); dq is like q, dk and dv like k.
extern "C" CK_CUDA_KERNEL(ck_cuda_attention_bwd)
{
    (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("attention_bwd");
    if (!c) return;
    const att_geom g = geom(p, &in[1], &in[2]);
    const float *dout = in[0].data, *q = in[1].data, *k = in[2].data, *v = in[3].data;
    float *dq = out[0].data, *dk = nout > 1 ? out[1].data : NULL, *dv = nout > 2 ? out[2].data : NULL;
    if (g.B * g.HD == 0 || (!dq && !dk && !dv)) return;
    if (g.LQ == 0 || g.LK == 0) {
        // No scores: o did not depend on anything, so every gradient is zero.
        if (zero(c, "attention_bwd", dq, g.B * g.LQ * g.HD) && zero(c, "attention_bwd", dk, g.B * g.LK * g.HD))
            zero(c, "attention_bwd", dv, g.B * g.LK * g.HD);
        ck_cuda_end(c, "attention_bwd");
        return;
    }
    float *ws = (float *)ctx->ws;
    const size_t wsf = ctx->ws_bytes / sizeof(float);
    if (g.D <= 128) {
        // lse and delta of `chunk` head pairs at a time (the rule gives at least 2 LQ LK floats)
        int64_t chunk = (int64_t)(wsf / (size_t)(2 * g.LQ));
        if (chunk > g.B * g.H) chunk = g.B * g.H;
        if (chunk > 65535) chunk = 65535;
        if (chunk < 1)
            ck_cuda_fail("attention_bwd", "workspace of %zu bytes holds no row statistics for %lld queries",
                         ctx->ws_bytes, (long long)g.LQ);
        else if (g.D <= 32)
            fused_bwd<1>(c, &g, dq, dk, dv, dout, q, k, v, ws, chunk);
        else if (g.D <= 64)
            fused_bwd<2>(c, &g, dq, dk, dv, dout, q, k, v, ws, chunk);
        else
            fused_bwd<4>(c, &g, dq, dk, dv, dout, q, k, v, ws, chunk);
    } else {
        const int64_t hmax = (int64_t)(wsf / (size_t)(2 * g.LQ * g.LK));
        if (hmax < 1)
            ck_cuda_fail("attention_bwd", "workspace of %zu bytes holds no two %lld x %lld score matrices",
                         ctx->ws_bytes, (long long)g.LQ, (long long)g.LK);
        else
            gemm_bwd(c, &g, dq, dk, dv, dout, q, k, v, ws, hmax < g.H ? hmax : g.H);
    }
    ck_cuda_end(c, "attention_bwd");
}
