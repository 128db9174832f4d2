/* Multi-head scaled dot-product attention on the CPU, forward and backward.
 * Heads are columns of the (B,L,H*D) projections. Each (batch, head) pair is
 * computed whole by one schedule, in a fixed order, so results are deterministic;
 * the scores are formed a block of query rows at a time, so the softmax matrix
 * is never held whole. */
#include "cpu.h"
#include "vecmath.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* Every product is an OpenBLAS sgemm on strided head views. Two schedules:
 * - pairs in parallel, each pair whole on one thread, which first drops its own
 *   OpenMP thread count to 1 so that OpenBLAS (the OpenMP build, which sizes itself
 *   by omp_get_max_threads()) runs single-threaded there; the thread uses its
 *   slice of the workspace. Taken when there are at least as many pairs as
 *   threads, or a pair is too small for sgemm's own threading to pay off;
 * - otherwise pairs one after another, each sgemm with all OpenBLAS threads
 *   (called outside our parallel regions) and the softmax rows split over ours.
 * Each pair is computed in one fixed order either way. */
#define SMALL_PAIR ((int64_t)1 << 20) /* LQ * LK * D at or below which pairs run in parallel */
#define BLOCK_FLOATS 65536            /* scores per block of query rows (256 KiB) */
#define BLOCK_ROWS_MAX 1024           /* and at most this many rows */

typedef struct att_geom {
    int64_t B, LQ, LK, H, D, HD;
    float scale;
} att_geom;

static att_geom geom(const ck_op_params *p, const ck_view *q, const ck_view *k)
{
    att_geom g;
    g.B = q->shape[0], g.LQ = q->shape[1], g.HD = q->shape[2], g.LK = k->shape[1];
    g.H = p->i[0] > 0 ? p->i[0] : 1;
    assert(g.HD % g.H == 0);
    g.D = g.HD / g.H;
    g.scale = p->f[0] != 0.0f ? p->f[0] : (g.D > 0 ? (float)(1.0 / sqrt((double)g.D)) : 1.0f);
    return g;
}

/* r := exp(r - max r); returns 1 / sum of the exponentials. */
static float exp_row(float *r, int64_t n)
{
    const float mx = max_c(r, n);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) r[j] = exp_c(r[j] - mx);
    return (float)(1.0 / ck_cpu_dot8(r, NULL, n));
}

static void softmax_row(float *r, int64_t n)
{
    const float inv = exp_row(r, n);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) r[j] *= inv;
}

/* Row r of dS (holding dP on entry) := scale * P * (dP - sum(dP * P)). */
static void dsoftmax_row(float *dr, const float *pr, int64_t n, float scale)
{
    const float t = (float)ck_cpu_dot8(dr, pr, n);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) dr[j] = scale * pr[j] * (dr[j] - t);
}

static void zero(float *x, int64_t n)
{
    if (x && n > 0) memset(x, 0, (size_t)n * sizeof(float));
}

/* Query rows per block: a block of scores (rows x LK floats) stays in L2 while it
 * is formed, normalized and used. Depends on the shapes only, never on the
 * thread count; ops/rules.c sizes the workspace with the same formula. */
static int64_t block_rows(int64_t LQ, int64_t LK)
{
    int64_t r = LK > 0 ? BLOCK_FLOATS / LK : LQ;
    if (r < 16) r = 16;
    if (r > BLOCK_ROWS_MAX) r = BLOCK_ROWS_MAX;
    return r < LQ ? r : LQ;
}

/* Threads for the pair-parallel schedule, or 0 when it should not run: fewer
 * pairs than threads, and big pairs. */
static int pair_threads(const ck_kctx *ctx, size_t slice_bytes, int64_t pairs, int64_t pair_size)
{
    const int nt = omp_get_max_threads();
    if (pairs < nt && pair_size > SMALL_PAIR) return 0;
    const size_t slices = ctx->ws_bytes / slice_bytes;
    assert(slices >= 1);
    return slices < (size_t)nt ? (int)slices : nt;
}

/* One pair's forward into o, R query rows at a time: E (R x LK scratch) =
 * exp(scale q k^T - row max), o = (E v) / rowsum(E): the normalization is
 * applied to the D outputs of a row rather than to its LK scores. par: split
 * the rows over threads (only when called outside a region). */
static void pair_fwd(const att_geom *g, const float *q, const float *k, const float *v, float *o, float *P, int64_t R,
                     int par)
{
    const int64_t LK = g->LK, D = g->D, HD = g->HD;
    float inv[BLOCK_ROWS_MAX];
    for (int64_t i0 = 0; i0 < g->LQ; i0 += R) {
        const int64_t m = g->LQ - i0 < R ? g->LQ - i0 : R;
        float *ob = o + i0 * HD;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)LK, (int)D, g->scale, q + i0 * HD, (int)HD,
                    k, (int)HD, 0.0f, P, (int)LK);
#pragma omp parallel for schedule(static) if (par && m * LK > 16384)
        for (int64_t i = 0; i < m; i++) inv[i] = exp_row(P + i * LK, LK);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)D, (int)LK, 1.0f, P, (int)LK, v, (int)HD,
                    0.0f, ob, (int)HD);
        for (int64_t i = 0; i < m; i++)
            for (int64_t d = 0; d < D; d++) ob[i * HD + d] *= inv[i];
    }
}

/* One pair's backward, R query rows at a time; P and dS are R x LK scratch; any
 * of dq, dk, dv may be NULL. dk and dv add up the blocks in order. */
static void pair_bwd(const att_geom *g, const float *dout, const float *q, const float *k, const float *v,
                     float *dq, float *dk, float *dv, float *P, float *dS, int64_t R, int par)
{
    const int64_t LK = g->LK, D = g->D, HD = g->HD;
    for (int64_t i0 = 0; i0 < g->LQ; i0 += R) {
        const int64_t m = g->LQ - i0 < R ? g->LQ - i0 : R;
        const float *qb = q + i0 * HD, *db = dout + i0 * HD;
        const float beta = i0 ? 1.0f : 0.0f;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)LK, (int)D, g->scale, qb, (int)HD, k,
                    (int)HD, 0.0f, P, (int)LK);
#pragma omp parallel for schedule(static) if (par && m * LK > 16384)
        for (int64_t i = 0; i < m; i++) softmax_row(P + i * LK, LK);
        if (dv)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)LK, (int)D, (int)m, 1.0f, P, (int)LK, db,
                        (int)HD, beta, dv, (int)HD);
        if (!dq && !dk) continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)LK, (int)D, 1.0f, db, (int)HD, v, (int)HD,
                    0.0f, dS, (int)LK);
#pragma omp parallel for schedule(static) if (par && m * LK > 16384)
        for (int64_t i = 0; i < m; i++) dsoftmax_row(dS + i * LK, P + i * LK, LK, g->scale);
        if (dq)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)D, (int)LK, 1.0f, dS, (int)LK, k,
                        (int)HD, 0.0f, dq + i0 * HD, (int)HD);
        if (dk)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)LK, (int)D, (int)m, 1.0f, dS, (int)LK, qb,
                        (int)HD, beta, dk, (int)HD);
    }
}

// q is (B,LQ,H*D), k and v are (B,LK,H*D); o is (B,LQ,H*D). Head h is columns h*D..h*D+D-1.
CK_CPU_KERNEL(ck_cpu_attention)
{
    (void)nout, (void)nin;
    const att_geom g = geom(p, &in[0], &in[1]);
    const float *q = in[0].data, *k = in[1].data, *v = in[2].data;
    float *o = out[0].data;
    const int64_t LQ = g.LQ, LK = g.LK, D = g.D, HD = g.HD, pairs = g.B * g.H;
    if (g.B * LQ * HD == 0) return;
    if (LK == 0) {
        zero(o, g.B * LQ * HD);
        return;
    }
    const int64_t R = block_rows(LQ, LK);
    const size_t slice = (size_t)(R * LK);
    float *ws = ctx->ws;
    assert(ctx->ws_bytes >= slice * sizeof(float));

    const int nt = pair_threads(ctx, slice * sizeof(float), pairs, LQ * LK * D);
    if (nt > 0) {
#pragma omp parallel num_threads(nt) if (pairs > 1 && pairs * LQ * LK * D > 32768)
        {
            omp_set_num_threads(1); // this thread's OpenBLAS calls: single-threaded
            float *P = ws + (size_t)omp_get_thread_num() * slice;
#pragma omp for schedule(static)
            for (int64_t pr = 0; pr < pairs; pr++) {
                const int64_t qo = (pr / g.H) * LQ * HD + (pr % g.H) * D, ko = (pr / g.H) * LK * HD + (pr % g.H) * D;
                pair_fwd(&g, q + qo, k + ko, v + ko, o + qo, P, R, 0);
            }
        }
        return;
    }
    for (int64_t pr = 0; pr < pairs; pr++) {
        const int64_t qo = (pr / g.H) * LQ * HD + (pr % g.H) * D, ko = (pr / g.H) * LK * HD + (pr % g.H) * D;
        pair_fwd(&g, q + qo, k + ko, v + ko, o + qo, ws, R, 1);
    }
}

// dout and q are (B,LQ,H*D), k and v are (B,LK,H*D); dq is like q, dk and dv like k.
// With P = softmax(scale q k^T): dv = P^T dout, dS = P * (dP - rowsum(dP * P)) for
// dP = dout v^T, dq = scale dS k, dk = scale dS^T q.
CK_CPU_KERNEL(ck_cpu_attention_bwd)
{
    (void)nin;
    const att_geom g = geom(p, &in[1], &in[2]);
    const float *dout = in[0].data, *q = in[1].data, *k = in[2].data, *v = in[3].data;
    float *dq = out[0].data, *dk = nout > 1 ? out[1].data : NULL, *dv = nout > 2 ? out[2].data : NULL;
    const int64_t LQ = g.LQ, LK = g.LK, D = g.D, HD = g.HD, pairs = g.B * g.H;
    if (g.B * HD == 0) return;
    if (LQ == 0 || LK == 0) {
        // No scores: o did not depend on anything, so every gradient is zero.
        zero(dq, g.B * LQ * HD);
        zero(dk, g.B * LK * HD);
        zero(dv, g.B * LK * HD);
        return;
    }
    const int64_t R = block_rows(LQ, LK);
    const size_t slice = (size_t)(2 * R * LK);
    float *ws = ctx->ws;
    assert(ctx->ws_bytes >= slice * sizeof(float));

    const int nt = pair_threads(ctx, slice * sizeof(float), pairs, LQ * LK * D);
    if (nt > 0) {
#pragma omp parallel num_threads(nt) if (pairs > 1 && pairs * LQ * LK * D > 32768)
        {
            omp_set_num_threads(1); // this thread's OpenBLAS calls: single-threaded
            float *P = ws + (size_t)omp_get_thread_num() * slice;
#pragma omp for schedule(static)
            for (int64_t pr = 0; pr < pairs; pr++) {
                const int64_t qo = (pr / g.H) * LQ * HD + (pr % g.H) * D, ko = (pr / g.H) * LK * HD + (pr % g.H) * D;
                pair_bwd(&g, dout + qo, q + qo, k + ko, v + ko, dq ? dq + qo : NULL, dk ? dk + ko : NULL,
                         dv ? dv + ko : NULL, P, P + R * LK, R, 0);
            }
        }
        return;
    }
    for (int64_t pr = 0; pr < pairs; pr++) {
        const int64_t qo = (pr / g.H) * LQ * HD + (pr % g.H) * D, ko = (pr / g.H) * LK * HD + (pr % g.H) * D;
        pair_bwd(&g, dout + qo, q + qo, k + ko, v + ko, dq ? dq + qo : NULL, dk ? dk + ko : NULL, dv ? dv + ko : NULL,
                 ws, ws + R * LK, R, 1);
    }
}
