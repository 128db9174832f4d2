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
 * workspace and the products go through cuBLAS, as ops/cpu/attention.c does.
 *
 * bf16 storage (ck_cuda_attention_bf16, ck_cuda_attention_bwd_bf16; head dims
 * up to 256): the same three steps, FlashAttention-2 style on tensor cores
 * (nvcuda::wmma, 16x16x16 bf16 tiles, fp32 accumulation). A warp owns 16 query
 * rows (16 key rows for dk/dv); tiles of the other side pass through shared
 * memory; the scores and P (rounded to bf16 for the P v and dS k products) live
 * in shared memory a tile at a time; the softmax, lse, delta and the output's
 * rescaling are fp32. The backward is deterministic like the fp32 one: dq per
 * query tile, dk and dv per key tile, tiles in order, no atomics. The kernels
 * are templates on the 16-bit type, instantiated for bf16 and fp16 storage
 * (ck_cuda_attention_f16, ck_cuda_attention_bwd_f16).
 *
 * Unverified: these tensor-core kernels have been compiled for sm_90 and run
 * only on the CPU emulator (tests/cuda_emu/mma_emu.h, which holds a whole tile
 * in every lane), never on a GPU. Their speed is unmeasured, the per-lane
 * layout of a fragment is never relied on (row-wise work goes through shared
 * memory), and the emulator cannot show bank conflicts, register spills (head
 * dims above 128 spill under ptxas) or the hardware's summation order. */
#include "common.cuh"

#ifndef CK_CUDA_EMU
#include <cuda_fp16.h>
#include <mma.h>
#endif

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

/* ---- 16-bit storage: tensor cores ----
 *
 * Every tensor bf16 (or fp16), products on tensor cores (nvcuda::wmma 16x16x16
 * tiles, fp32 accumulation), softmax and row statistics in fp32. A block is
 * WARPS warps, each owning 16 rows (queries, or keys for dk/dv), so a block
 * owns TROWS rows; the other side streams through shared memory in tiles of
 * ktile<DP>() (forward) or btile<DP>() (backward) rows. DP is the head dim
 * padded to 64, 128 or 256: loads zero the columns past D and the rows past
 * L, and the scores of keys past LK are masked, so partial tiles need nothing
 * else. Whatever depends on a row (the softmax, rescaling an accumulator, the
 * final scaling and the guarded store) goes through shared memory, never
 * through a fragment's elements, whose mapping to lanes is unspecified. */

#define WARPS 4
#define TROWS (16 * WARPS)

/* Rows of the streamed side per tile, so that a block's shared memory (the two
 * tiles, and per warp the fp32 scores and their 16-bit copy; the backward a
 * second fp32 tile) stays within the 48 KiB a kernel may declare statically:
 * 41 KiB at most (the forward at DP 64). */
template <int DP>
__host__ __device__ constexpr int ktile() { return DP == 64 ? 64 : DP == 128 ? 32 : 16; }
template <int DP>
__host__ __device__ constexpr int btile() { return DP == 256 ? 16 : 32; }

template <typename T>
using frag_a = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major>;
template <typename T>
using frag_b_row = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major>;
template <typename T>
using frag_b_col = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::col_major>;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> frag_c;

/* shared memory in 32-byte units: wmma wants 256-bit aligned tiles */
struct __align__(32) chunk32 {
    float f[8];
};
#define CHUNKS(bytes) (((bytes) + 31) / 32)

__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

/* eight 16-bit values: one 16-byte load */
struct __align__(16) vec8 {
    uint32_t w[4];
};

/* Whether tile_load may move 8 values at a time: the head's columns come in
 * whole groups of 8 and every row of the view starts 16-byte aligned. */
template <typename T>
static bool vec8_ok(const T *base, int64_t HD, int64_t D)
{
    return D % 8 == 0 && HD % 8 == 0 && (uintptr_t)base % 16 == 0;
}

/* Rows [r0, r0 + R) of a (L, HD) head view into an R x DP tile s, zero past L
 * and D; vec: in 16-byte pieces (vec8_ok). */
template <typename T, int R, int DP>
__device__ __forceinline__ void tile_load(T *s, const T *base, int64_t r0, int64_t L, int64_t HD, int D, bool vec)
{
    if (vec) {
        for (int idx = threadIdx.x; idx < R * DP / 8; idx += blockDim.x) {
            const int rr = idx / (DP / 8), d = idx % (DP / 8) * 8;
            const int64_t r = r0 + rr;
            vec8 x = {{0u, 0u, 0u, 0u}}; /* +0.0 in bf16 and fp16 */
            if (r < L && d < D) x = *(const vec8 *)(base + r * HD + d);
            *(vec8 *)(s + rr * DP + d) = x;
        }
        return;
    }
    const T z = from_f<T>(0.0f);
    for (int idx = threadIdx.x; idx < R * DP; idx += blockDim.x) {
        const int rr = idx / DP, d = idx % DP;
        const int64_t r = r0 + rr;
        s[idx] = r < L && d < D ? base[r * HD + d] : z;
    }
}

/* A warp's 16 rows (row w*16 of a TROWS x DP tile in shared memory) as DP/16 fragments. */
template <typename T, int DP>
__device__ __forceinline__ void rows_to_frags(frag_a<T> *a, const T *s, int w)
{
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++) nvcuda::wmma::load_matrix_sync(a[kk], s + w * 16 * DP + kk * 16, DP);
}

/* s (16 x N floats, row-major) = a (16 x DP) times b^T, b the N x DP tile in shared memory. */
template <typename T, int DP, int N>
__device__ __forceinline__ void mul_abt(float *s, const frag_a<T> *a, const T *b)
{
#pragma unroll
    for (int j = 0; j < N / 16; j++) {
        frag_c c;
        nvcuda::wmma::fill_fragment(c, 0.0f);
#pragma unroll
        for (int kk = 0; kk < DP / 16; kk++) {
            frag_b_col<T> bf;
            nvcuda::wmma::load_matrix_sync(bf, b + j * 16 * DP + kk * 16, DP);
            nvcuda::wmma::mma_sync(c, a[kk], bf, c);
        }
        nvcuda::wmma::store_matrix_sync(s + j * 16, c, N, nvcuda::wmma::mem_row_major);
    }
}

/* acc (16 x DP, DP/16 fragments) += a (16 x N, row-major in shared memory) times b (N x DP tile). */
template <typename T, int DP, int N>
__device__ __forceinline__ void mul_ab(frag_c *acc, const T *a, const T *b)
{
    frag_a<T> af[N / 16];
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) nvcuda::wmma::load_matrix_sync(af[kk], a + kk * 16, N);
#pragma unroll
    for (int d = 0; d < DP / 16; d++)
#pragma unroll
        for (int kk = 0; kk < N / 16; kk++) {
            frag_b_row<T> bf;
            nvcuda::wmma::load_matrix_sync(bf, b + kk * 16 * DP + d * 16, DP);
            nvcuda::wmma::mma_sync(acc[d], af[kk], bf, acc[d]);
        }
    __syncwarp();
}

/* Row r of an accumulator times f[r], through the warp's 16 x 16 scratch. */
__device__ __forceinline__ void scale_rows(frag_c &c, float *scr, const float *f)
{
    const int lane = threadIdx.x & 31;
    nvcuda::wmma::store_matrix_sync(scr, c, 16, nvcuda::wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) scr[e] *= f[e >> 4];
    __syncwarp();
    nvcuda::wmma::load_matrix_sync(c, scr, 16, nvcuda::wmma::mem_row_major);
    __syncwarp();
}

/* Rows i0.. of a (L, HD) head view = f[row] * acc (DP/16 fragments), through
 * the warp's scratch; rows past L and columns past D are not written. */
template <typename T, int DP>
__device__ __forceinline__ void store_rows(T *base, const frag_c *acc, float *scr, const float *f, int64_t i0,
                                           int64_t L, int64_t HD, int D)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int d = 0; d < DP / 16; d++) {
        nvcuda::wmma::store_matrix_sync(scr, acc[d], 16, nvcuda::wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            const int64_t i = i0 + (e >> 4);
            const int dd = d * 16 + (e & 15);
            if (i < L && dd < D) base[i * HD + dd] = from_f<T>(scr[e] * f[e >> 4]);
        }
        __syncwarp();
    }
}

/* Forward for the TROWS query rows of this block and head pair (pair0 +
 * blockIdx.y), online softmax over key tiles. STATS: instead of o, write
 * lse = log sum exp and delta = dout . o per row (backward step 1), at row
 * (blockIdx.y * LQ + i) of the workspace arrays. Lane pair (2r, 2r+1) of a
 * warp keeps the statistics of its row r, each over half the tile's keys. */
template <typename T, int DP, bool STATS>
__global__ void __launch_bounds__(32 * WARPS) tc_fwd(T *o, const T *q, const T *k, const T *v, const T *dout,
                                                      float *lse, float *delta, int64_t LQ, int64_t LK, int64_t H,
                                                      int D, int64_t HD, float scale, int64_t pair0, bool vec)
{
    constexpr int N = ktile<DP>();
    constexpr int MAIN = 2 * N * DP * (int)sizeof(T) + WARPS * 16 * N * (4 + (int)sizeof(T));
    constexpr int STAGE = TROWS * DP * (int)sizeof(T);
    __shared__ chunk32 sm[CHUNKS(MAIN > STAGE ? MAIN : STAGE)];
    __shared__ float rowf[WARPS][16];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    T *Ks = (T *)sm, *Vs = Ks + N * DP;
    float *S = (float *)(Vs + N * DP) + w * 16 * N;
    T *P = (T *)((float *)(Vs + N * DP) + WARPS * 16 * N) + w * 16 * N;
    const int64_t pair = pair0 + blockIdx.y, b = pair / H, h = pair % H;
    const int64_t qoff = b * LQ * HD + h * D, koff = b * LK * HD + h * D;
    const int64_t i0 = (int64_t)blockIdx.x * TROWS + w * 16;

    frag_a<T> qa[DP / 16];
    frag_c acc[DP / 16];
    tile_load<T, TROWS, DP>((T *)sm, q + qoff, (int64_t)blockIdx.x * TROWS, LQ, HD, D, vec);
    __syncthreads();
    rows_to_frags<T, DP>(qa, (const T *)sm, w);
    __syncthreads();
#pragma unroll
    for (int d = 0; d < DP / 16; d++) nvcuda::wmma::fill_fragment(acc[d], 0.0f);

    float m = -INFINITY, l = 0.0f;
    for (int64_t k0 = 0; k0 < LK; k0 += N) {
        tile_load<T, N, DP>(Ks, k + koff, k0, LK, HD, D, vec);
        tile_load<T, N, DP>(Vs, v + koff, k0, LK, HD, D, vec);
        __syncthreads();
        mul_abt<T, DP, N>(S, qa, Ks);
        __syncwarp();
        const int nk = LK - k0 < N ? (int)(LK - k0) : N;
        float *srow = S + r * N;
        float tmax = -INFINITY;
        for (int c = half * (N / 2); c < (half + 1) * (N / 2); c++) {
            const float s = c < nk ? srow[c] * scale : -INFINITY;
            srow[c] = s;
            tmax = fmaxf(tmax, s);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(CK_FULL_MASK, tmax, 1));
        const float mnew = fmaxf(m, tmax), corr = expf(m - mnew);
        float ps = 0.0f;
        for (int c = half * (N / 2); c < (half + 1) * (N / 2); c++) {
            const float pv = expf(srow[c] - mnew);
            P[r * N + c] = from_f<T>(pv);
            ps += pv;
        }
        ps += __shfl_xor_sync(CK_FULL_MASK, ps, 1);
        l = l * corr + ps;
        m = mnew;
        if (!half) rowf[w][r] = corr;
        __syncwarp();
        /* S is free now: its first 256 floats are the rescaling scratch; a
         * factor of 1 everywhere in the warp (no row's max moved) changes nothing */
        if (ck_warp_max(corr != 1.0f ? 1.0f : 0.0f) != 0.0f) {
#pragma unroll
            for (int d = 0; d < DP / 16; d++) scale_rows(acc[d], S, rowf[w]);
        }
        mul_ab<T, DP, N>(acc, P, Vs);
        __syncthreads();
    }
    if (!half) rowf[w][r] = 1.0f / l;
    __syncwarp();
    if (!STATS) {
        store_rows<T, DP>(o + qoff, acc, S, rowf[w], i0, LQ, HD, D);
        return;
    }
    /* delta = dout . o: lane pair r sums its row, half the columns of each fragment each */
    const int64_t i = i0 + r;
    float dd = 0.0f;
#pragma unroll
    for (int d = 0; d < DP / 16; d++) {
        nvcuda::wmma::store_matrix_sync(S, acc[d], 16, nvcuda::wmma::mem_row_major);
        __syncwarp();
        for (int c = half * 8; c < half * 8 + 8; c++) {
            const int col = d * 16 + c;
            if (i < LQ && col < D) dd += to_f(dout[qoff + i * HD + col]) * (S[r * 16 + c] * rowf[w][r]);
        }
        __syncwarp();
    }
    dd += __shfl_xor_sync(CK_FULL_MASK, dd, 1);
    if (i < LQ && !half) {
        lse[blockIdx.y * LQ + i] = m + logf(l);
        delta[blockIdx.y * LQ + i] = dd;
    }
}

/* Backward step 2: dq for this block's query rows, key tiles in order:
 * dS = P (dout v^T - delta), dq = scale dS k. */
template <typename T, int DP>
__global__ void __launch_bounds__(32 * WARPS) tc_bwd_dq(T *dq, const T *dout, const T *q, const T *k, const T *v,
                                                         const float *lse, const float *delta, int64_t LQ,
                                                         int64_t LK, int64_t H, int D, int64_t HD, float scale,
                                                         int64_t pair0, bool vec)
{
    constexpr int N = btile<DP>();
    constexpr int MAIN = 2 * N * DP * (int)sizeof(T) + WARPS * 16 * N * (8 + (int)sizeof(T));
    constexpr int STAGE = TROWS * DP * (int)sizeof(T);
    __shared__ chunk32 sm[CHUNKS(MAIN > STAGE ? MAIN : STAGE)];
    __shared__ float rowf[WARPS][16];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    T *Ks = (T *)sm, *Vs = Ks + N * DP;
    float *S = (float *)(Vs + N * DP) + w * 16 * N;
    float *dP = (float *)(Vs + N * DP) + (WARPS + w) * 16 * N;
    T *dS = (T *)((float *)(Vs + N * DP) + 2 * WARPS * 16 * N) + w * 16 * N;
    const int64_t pair = pair0 + blockIdx.y, b = pair / H, h = pair % H;
    const int64_t qoff = b * LQ * HD + h * D, koff = b * LK * HD + h * D;
    const int64_t i0 = (int64_t)blockIdx.x * TROWS + w * 16, i = i0 + r;

    frag_a<T> qa[DP / 16], oa[DP / 16];
    frag_c acc[DP / 16];
    tile_load<T, TROWS, DP>((T *)sm, q + qoff, (int64_t)blockIdx.x * TROWS, LQ, HD, D, vec);
    __syncthreads();
    rows_to_frags<T, DP>(qa, (const T *)sm, w);
    __syncthreads();
    tile_load<T, TROWS, DP>((T *)sm, dout + qoff, (int64_t)blockIdx.x * TROWS, LQ, HD, D, vec);
    __syncthreads();
    rows_to_frags<T, DP>(oa, (const T *)sm, w);
    __syncthreads();
#pragma unroll
    for (int d = 0; d < DP / 16; d++) nvcuda::wmma::fill_fragment(acc[d], 0.0f);
    const float li = i < LQ ? lse[blockIdx.y * LQ + i] : 0.0f, di = i < LQ ? delta[blockIdx.y * LQ + i] : 0.0f;

    for (int64_t k0 = 0; k0 < LK; k0 += N) {
        tile_load<T, N, DP>(Ks, k + koff, k0, LK, HD, D, vec);
        tile_load<T, N, DP>(Vs, v + koff, k0, LK, HD, D, vec);
        __syncthreads();
        mul_abt<T, DP, N>(S, qa, Ks);
        mul_abt<T, DP, N>(dP, oa, Vs);
        __syncwarp();
        const int nk = LK - k0 < N ? (int)(LK - k0) : N;
        for (int c = half * (N / 2); c < (half + 1) * (N / 2); c++) {
            const float ds = c < nk && i < LQ ? expf(S[r * N + c] * scale - li) * (dP[r * N + c] - di) : 0.0f;
            dS[r * N + c] = from_f<T>(ds);
        }
        __syncwarp();
        mul_ab<T, DP, N>(acc, dS, Ks);
        __syncthreads();
    }
    if (!half) rowf[w][r] = scale;
    __syncwarp();
    store_rows<T, DP>(dq + qoff, acc, S, rowf[w], i0, LQ, HD, D);
}

/* Backward step 3: dk and dv for this block's key rows, query tiles in order:
 * with S^T = k q^T, P^T = exp(scale S^T - lse), dv = P^T dout,
 * dS^T = P^T (v dout^T - delta), dk = scale dS^T q. */
template <typename T, int DP>
__global__ void __launch_bounds__(32 * WARPS) tc_bwd_dkdv(T *dk, T *dv, const T *dout, const T *q, const T *k,
                                                           const T *v, const float *lse, const float *delta,
                                                           int64_t LQ, int64_t LK, int64_t H, int D, int64_t HD,
                                                           float scale, int64_t pair0, bool vec)
{
    constexpr int N = btile<DP>();
    constexpr int MAIN = 2 * N * DP * (int)sizeof(T) + WARPS * 16 * N * (8 + (int)sizeof(T));
    constexpr int STAGE = TROWS * DP * (int)sizeof(T);
    __shared__ chunk32 sm[CHUNKS(MAIN > STAGE ? MAIN : STAGE)];
    __shared__ float Ls[N], Ds[N], rowf[WARPS][16];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 1, half = lane & 1;
    T *Qs = (T *)sm, *Os = Qs + N * DP;
    float *S = (float *)(Os + N * DP) + w * 16 * N;
    float *dP = (float *)(Os + N * DP) + (WARPS + w) * 16 * N;
    T *P = (T *)((float *)(Os + N * DP) + 2 * WARPS * 16 * N) + w * 16 * N;
    const int64_t pair = pair0 + blockIdx.y, b = pair / H, h = pair % H;
    const int64_t qoff = b * LQ * HD + h * D, koff = b * LK * HD + h * D;
    const int64_t j0 = (int64_t)blockIdx.x * TROWS + w * 16;

    frag_a<T> ka[DP / 16], va[DP / 16];
    frag_c dka[DP / 16], dva[DP / 16];
    tile_load<T, TROWS, DP>((T *)sm, k + koff, (int64_t)blockIdx.x * TROWS, LK, HD, D, vec);
    __syncthreads();
    rows_to_frags<T, DP>(ka, (const T *)sm, w);
    __syncthreads();
    tile_load<T, TROWS, DP>((T *)sm, v + koff, (int64_t)blockIdx.x * TROWS, LK, HD, D, vec);
    __syncthreads();
    rows_to_frags<T, DP>(va, (const T *)sm, w);
    __syncthreads();
#pragma unroll
    for (int d = 0; d < DP / 16; d++) {
        nvcuda::wmma::fill_fragment(dka[d], 0.0f);
        nvcuda::wmma::fill_fragment(dva[d], 0.0f);
    }

    for (int64_t q0 = 0; q0 < LQ; q0 += N) {
        tile_load<T, N, DP>(Qs, q + qoff, q0, LQ, HD, D, vec);
        tile_load<T, N, DP>(Os, dout + qoff, q0, LQ, HD, D, vec);
        for (int t = threadIdx.x; t < N; t += blockDim.x) {
            const int64_t i = q0 + t;
            Ls[t] = i < LQ ? lse[blockIdx.y * LQ + i] : 0.0f;
            Ds[t] = i < LQ ? delta[blockIdx.y * LQ + i] : 0.0f;
        }
        __syncthreads();
        mul_abt<T, DP, N>(S, ka, Qs);
        mul_abt<T, DP, N>(dP, va, Os);
        __syncwarp();
        const int nq = LQ - q0 < N ? (int)(LQ - q0) : N;
        for (int c = half * (N / 2); c < (half + 1) * (N / 2); c++) {
            const float pr = c < nq ? expf(S[r * N + c] * scale - Ls[c]) : 0.0f;
            P[r * N + c] = from_f<T>(pr);
            dP[r * N + c] = pr * (dP[r * N + c] - Ds[c]);
        }
        __syncwarp();
        mul_ab<T, DP, N>(dva, P, Os);
        for (int c = half * (N / 2); c < (half + 1) * (N / 2); c++) P[r * N + c] = from_f<T>(dP[r * N + c]);
        __syncwarp();
        mul_ab<T, DP, N>(dka, P, Qs);
        __syncthreads();
    }
    if (!half) rowf[w][r] = scale;
    __syncwarp();
    if (dk) store_rows<T, DP>(dk + koff, dka, S, rowf[w], j0, LK, HD, D);
    if (!half) rowf[w][r] = 1.0f;
    __syncwarp();
    if (dv) store_rows<T, DP>(dv + koff, dva, S, rowf[w], j0, LK, HD, D);
}

template <typename T, int DP>
static void tc_forward(ck_cuda_ctx *c, const att_geom *g, T *o, const T *q, const T *k, const T *v)
{
    const int64_t pairs = g->B * g->H;
    const bool vec = vec8_ok(q, g->HD, g->D) && vec8_ok(k, g->HD, g->D) && vec8_ok(v, g->HD, g->D);
    for (int64_t p0 = 0; p0 < pairs; p0 += 65535) {
        const int64_t np = pairs - p0 < 65535 ? pairs - p0 : 65535;
        ck_launch(tc_fwd<T, DP, false>, dim3((unsigned)((g->LQ + TROWS - 1) / TROWS), (unsigned)np), 32 * WARPS,
                  c->stream, o, q, k, v, (const T *)NULL, (float *)NULL, (float *)NULL, g->LQ, g->LK, g->H, (int)g->D,
                  g->HD, g->scale, p0, vec);
    }
}

/* chunk: head pairs whose lse and delta fit the workspace at once */
template <typename T, int DP>
static void tc_backward(ck_cuda_ctx *c, const att_geom *g, T *dq, T *dk, T *dv, const T *dout, const T *q,
                        const T *k, const T *v, float *ws, int64_t chunk)
{
    const int64_t pairs = g->B * g->H;
    float *lse = ws, *delta = ws + chunk * g->LQ;
    const unsigned qblocks = (unsigned)((g->LQ + TROWS - 1) / TROWS), kblocks = (unsigned)((g->LK + TROWS - 1) / TROWS);
    const bool vec = vec8_ok(q, g->HD, g->D) && vec8_ok(k, g->HD, g->D) && vec8_ok(v, g->HD, g->D) &&
                     vec8_ok(dout, g->HD, g->D);
    for (int64_t p0 = 0; p0 < pairs; p0 += chunk) {
        const unsigned np = (unsigned)(pairs - p0 < chunk ? pairs - p0 : chunk);
        ck_launch(tc_fwd<T, DP, true>, dim3(qblocks, np), 32 * WARPS, c->stream, (T *)NULL, q, k, v, dout, lse, delta,
                  g->LQ, g->LK, g->H, (int)g->D, g->HD, g->scale, p0, vec);
        if (dq)
            ck_launch(tc_bwd_dq<T, DP>, dim3(qblocks, np), 32 * WARPS, c->stream, dq, dout, q, k, v,
                      (const float *)lse, (const float *)delta, g->LQ, g->LK, g->H, (int)g->D, g->HD, g->scale, p0,
                      vec);
        if (dk || dv)
            ck_launch(tc_bwd_dkdv<T, DP>, dim3(kblocks, np), 32 * WARPS, c->stream, dk, dv, dout, q, k, v,
                      (const float *)lse, (const float *)delta, g->LQ, g->LK, g->H, (int)g->D, g->HD, g->scale, p0,
                      vec);
    }
}

#define TC_MAX_D 256

template <typename T>
static void attention_16(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, const ck_view *in, const char *name)
{
    (void)ctx;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const att_geom g = geom(p, &in[0], &in[1]);
    const T *q = (const T *)in[0].data, *k = (const T *)in[1].data, *v = (const T *)in[2].data;
    T *o = (T *)out[0].data;
    if (g.B * g.LQ * g.HD == 0) return;
    if (g.LK == 0)
        CK_CU(name, cudaMemsetAsync(o, 0, sizeof(T) * (size_t)(g.B * g.LQ * g.HD), c->stream));
    else if (g.D > TC_MAX_D)
        ck_cuda_fail(name, "head dim %lld: 16-bit attention takes head dims up to %d", (long long)g.D, TC_MAX_D);
    else if (g.D <= 64)
        tc_forward<T, 64>(c, &g, o, q, k, v);
    else if (g.D <= 128)
        tc_forward<T, 128>(c, &g, o, q, k, v);
    else
        tc_forward<T, 256>(c, &g, o, q, k, v);
    ck_cuda_end(c, name);
}

template <typename T>
static void attention_bwd_16(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout, const ck_view *in,
                             const char *name)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const att_geom g = geom(p, &in[1], &in[2]);
    const T *dout = (const T *)in[0].data, *q = (const T *)in[1].data, *k = (const T *)in[2].data,
            *v = (const T *)in[3].data;
    T *dq = (T *)out[0].data, *dk = nout > 1 ? (T *)out[1].data : NULL, *dv = nout > 2 ? (T *)out[2].data : NULL;
    if (g.B * g.HD == 0 || (!dq && !dk && !dv)) return;
    if (g.LQ == 0 || g.LK == 0) {
        // No scores: o did not depend on anything, so every gradient is zero.
        const size_t nq = sizeof(T) * (size_t)(g.B * g.LQ * g.HD), nk = sizeof(T) * (size_t)(g.B * g.LK * g.HD);
        if ((!dq || CK_CU(name, cudaMemsetAsync(dq, 0, nq, c->stream))) &&
            (!dk || CK_CU(name, cudaMemsetAsync(dk, 0, nk, c->stream))) && dv)
            CK_CU(name, cudaMemsetAsync(dv, 0, nk, c->stream));
        ck_cuda_end(c, name);
        return;
    }
    // lse and delta of `chunk` head pairs at a time (the rule gives 2 LQ floats a pair, or more)
    int64_t chunk = (int64_t)(ctx->ws_bytes / sizeof(float) / (size_t)(2 * g.LQ));
    if (chunk > g.B * g.H) chunk = g.B * g.H;
    if (chunk > 65535) chunk = 65535;
    float *ws = (float *)ctx->ws;
    if (g.D > TC_MAX_D)
        ck_cuda_fail(name, "head dim %lld: 16-bit attention takes head dims up to %d", (long long)g.D, TC_MAX_D);
    else if (chunk < 1)
        ck_cuda_fail(name, "workspace of %zu bytes holds no row statistics for %lld queries", ctx->ws_bytes,
                     (long long)g.LQ);
    else if (g.D <= 64)
        tc_backward<T, 64>(c, &g, dq, dk, dv, dout, q, k, v, ws, chunk);
    else if (g.D <= 128)
        tc_backward<T, 128>(c, &g, dq, dk, dv, dout, q, k, v, ws, chunk);
    else
        tc_backward<T, 256>(c, &g, dq, dk, dv, dout, q, k, v, ws, chunk);
    ck_cuda_end(c, name);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_attention_bf16)
{
    (void)nout, (void)nin;
    attention_16<__nv_bfloat16>(ctx, p, out, in, "attention_bf16");
}

extern "C" CK_CUDA_KERNEL(ck_cuda_attention_bwd_bf16)
{
    (void)nin;
    attention_bwd_16<__nv_bfloat16>(ctx, p, out, nout, in, "attention_bwd_bf16");
}

extern "C" CK_CUDA_KERNEL(ck_cuda_attention_f16)
{
    (void)nout, (void)nin;
    attention_16<__half>(ctx, p, out, in, "attention_f16");
}

extern "C" CK_CUDA_KERNEL(ck_cuda_attention_bwd_f16)
{
    (void)nin;
    attention_bwd_16<__half>(ctx, p, out, nout, in, "attention_bwd_f16");
}
