/* adaLN's modulation on the GPU, in the formulas of ops/cpu/modulate.c:
 * MODULATE ((1 + scale) x + shift) and GATE (x + gate y) with per-sample rows
 * [B,C] broadcast over the M positions of x [B,..,C], and their backwards.
 * The backward's sums over the positions (dshift, dscale, dgate) have one
 * fixed order, no atomics: block (column tile, chunk, sample) has each warp
 * walk rows w, w + WARPS, ... of its chunk of about 64 rows (ck_row_chunks)
 * for its lane's column, adds the warps' sums in warp order into the
 * workspace, and a second kernel adds a column's chunks in chunk order, in
 * double. The elementwise gradient (dx, or dy_y) is written by the same
 * walk. fp32, bf16 and fp16 storage; the arithmetic and the sums fp32. */
#include "common.cuh"

#define THREADS 256
#define WARPS (THREADS / 32)

// MODULATE: y = (1 + b) * x + a, a = shift and b = scale [B,C]; GATE: y = x + a * b, a = gate
// [B,C], b like x. x, y (B*M rows, C); rows and columns fit 31 bits (the caller checks).
template <typename T, bool GATE>
__global__ void __launch_bounds__(THREADS) mod_fwd(T *y, const T *x, const T *a, const T *b, unsigned rows, unsigned M,
                                                   unsigned C)
{
    for (unsigned r = blockIdx.y; r < rows; r += gridDim.y) {
        const size_t row = (size_t)(r / M) * C, off = (size_t)r * C;
        for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
            const float xv = ck_ld(x + off + c), av = ck_ld(a + row + c);
            ck_st(y + off + c, GATE ? xv + av * ck_ld(b + off + c) : (1.0f + ck_ld(b + row + c)) * xv + av);
        }
    }
}

// Backward, pass 1. dy, big (x for MODULATE, y for GATE) (B, M, C); w (B, C) (scale or gate).
// dbig = (1 + w) * dy (MODULATE's dx) or w * dy (GATE's dy_y), NULL: unwanted. Block
// (tile, k, b) sums, over rows [M k / P, M (k + 1) / P) of sample b, dy (MODULATE's dshift) into
// p1[(b P + k) C + c] and dy * big (dscale or dgate) into p2 at the same place (NULL: unwanted).
template <typename T, bool GATE>
__global__ void __launch_bounds__(THREADS) mod_partials(float *p1, float *p2, T *dbig, const T *dy, const T *big,
                                                        const T *w, unsigned M, unsigned C, unsigned P)
{
    __shared__ float sa[WARPS][32], sb[WARPS][32];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned k = blockIdx.y, b = blockIdx.z, c = blockIdx.x * 32 + lane;
    const unsigned r0 = (unsigned)((uint64_t)M * k / P), r1 = (unsigned)((uint64_t)M * (k + 1) / P);
    float a1 = 0.0f, a2 = 0.0f;
    if (c < C) {
        const float wc = GATE ? ck_ld(w + (size_t)b * C + c) : 1.0f + ck_ld(w + (size_t)b * C + c);
        for (unsigned r = r0 + warp; r < r1; r += WARPS) {
            const size_t off = ((size_t)b * M + r) * C + c;
            const float d = ck_ld(dy + off);
            a1 += d;
            if (p2) a2 += d * ck_ld(big + off);
            if (dbig) ck_st(dbig + off, wc * d);
        }
    }
    if (!p1 && !p2) return;
    sa[warp][lane] = a1;
    sb[warp][lane] = a2;
    __syncthreads();
    if (warp == 0 && c < C) {
        float t1 = 0.0f, t2 = 0.0f;
        for (int v = 0; v < WARPS; v++) t1 += sa[v][lane], t2 += sb[v][lane];
        if (p1) p1[((size_t)b * P + k) * C + c] = t1;
        if (p2) p2[((size_t)b * P + k) * C + c] = t2;
    }
}

// Pass 2: s[b, c] = the P chunk partials p[(b P + k) C + c] of column c of sample b, in chunk order.
template <typename T>
__global__ void __launch_bounds__(THREADS) mod_combine(T *s, const float *p, unsigned C, unsigned P)
{
    const unsigned b = blockIdx.y;
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
        double t = 0.0;
        for (unsigned k = 0; k < P; k++) t += p[((size_t)b * P + k) * C + c];
        ck_st(s + (size_t)b * C + c, (float)t);
    }
}

/* x [B,..,C] as B samples of M rows of C; 0 (after recording why) where a
 * count does not fit the kernels' 32-bit indices or launch limits */
static int dims_of(const char *name, const ck_view *x, int64_t *B, int64_t *M, int64_t *C)
{
    *B = x->shape[0], *C = x->shape[x->ndim - 1];
    *M = *B > 0 && *C > 0 ? ck_view_numel(x) / (*B * *C) : 0;
    if (*B > 65535 || *B * *M > INT32_MAX || *C > INT32_MAX)
        return ck_cuda_fail(name, "%lld samples of %lld rows of %lld: too large for the kernels' indices", (long long)*B,
                            (long long)*M, (long long)*C);
    return 1;
}

template <typename T, bool GATE>
static void modulate_fwd(const char *name, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    int64_t B, M, C;
    if (!dims_of(name, &in[0], &B, &M, &C) || B * M * C == 0) return;
    const int64_t bx = (C + THREADS - 1) / THREADS, rows = B * M;
    ck_launch(mod_fwd<T, GATE>, dim3((unsigned)(bx < 64 ? bx : 64), (unsigned)(rows < 65535 ? rows : 65535)), THREADS,
              c->stream, (T *)out[0].data, (const T *)in[0].data, (const T *)in[1].data, (const T *)in[2].data,
              (unsigned)rows, (unsigned)M, (unsigned)C);
    ck_cuda_end(c, name);
}

// MODULATE_BWD: in dy, x, scale; out dx, dshift, dscale. GATE_BWD: in dy, gate, y; out dgate, dy_y.
template <typename T, bool GATE>
static void modulate_bwd(const char *name, const ck_kctx *ctx, ck_view *out, int nout, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const ck_view *big = &in[GATE ? 2 : 1];
    int64_t B, M, C;
    if (!dims_of(name, big, &B, &M, &C) || B * C == 0) return;
    T *dbig = (T *)(GATE ? (nout > 1 ? out[1].data : NULL) : out[0].data);
    T *s1 = GATE ? NULL : (T *)(nout > 1 ? out[1].data : NULL);
    T *s2 = (T *)(GATE ? out[0].data : (nout > 2 ? out[2].data : NULL));
    const int64_t P = ck_row_chunks(M);
    const size_t need = sizeof(float) * (size_t)((GATE ? 1 : 2) * B * P * C);
    if ((s1 || s2) && ctx->ws_bytes < need) {
        ck_cuda_fail(name, "workspace of %zu bytes, the sums' partials need %zu", ctx->ws_bytes, need);
        return;
    }
    /* the workspace: MODULATE_BWD's dshift partials, then its dscale ones; GATE_BWD's dgate ones */
    float *p1 = s1 ? (float *)ctx->ws : NULL;
    float *p2 = s2 ? (float *)ctx->ws + (GATE ? 0 : B * P * C) : NULL;
    if (M > 0 && (dbig || p1 || p2))
        ck_launch(mod_partials<T, GATE>, dim3((unsigned)((C + 31) / 32), (unsigned)P, (unsigned)B), THREADS, c->stream,
                  p1, p2, dbig, (const T *)in[0].data, (const T *)big->data, (const T *)in[GATE ? 1 : 2].data,
                  (unsigned)M, (unsigned)C, (unsigned)P);
    if (s1 || s2) {
        if (M > 0) {
            const int64_t bx = (C + THREADS - 1) / THREADS;
            const dim3 grid((unsigned)(bx < 64 ? bx : 64), (unsigned)B);
            if (s1) ck_launch(mod_combine<T>, grid, THREADS, c->stream, s1, (const float *)p1, (unsigned)C, (unsigned)P);
            if (s2) ck_launch(mod_combine<T>, grid, THREADS, c->stream, s2, (const float *)p2, (unsigned)C, (unsigned)P);
        } else { /* no rows: the sums are empty */
            if (s1) CK_CU(name, cudaMemsetAsync(s1, 0, sizeof(T) * (size_t)(B * C), c->stream));
            if (s2) CK_CU(name, cudaMemsetAsync(s2, 0, sizeof(T) * (size_t)(B * C), c->stream));
        }
    }
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(modulate, (modulate_fwd<T, false>(name, out, in)))

CK_CUDA_ENTRIES(gate, (modulate_fwd<T, true>(name, out, in)))

CK_CUDA_ENTRIES(modulate_bwd, (modulate_bwd<T, false>(name, ctx, out, nout, in)))

CK_CUDA_ENTRIES(gate_bwd, (modulate_bwd<T, true>(name, ctx, out, nout, in)))
