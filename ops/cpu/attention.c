/* Multi-head scaled dot-product attention on the CPU, forward and backward.
 * Heads are columns of the (B,L,H*D) projections; per (batch, head) the products
 * are OpenBLAS sgemms on strided views, the row softmax our own OpenMP loop. */
#include "cpu.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <string.h>

/* The pairs run one after another so each sgemm gets all of OpenBLAS's threads:
 * a single-threaded sgemm beats our best plain loops about 4x, and OpenBLAS is
 * only called outside our parallel regions. The workspace rule reserves one
 * score matrix per thread; this layout uses the first one (two in the backward). */

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

/* Rows of s (rows x cols) replaced by their softmax. */
static void softmax_rows(float *s, int64_t rows, int64_t cols)
{
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
    for (int64_t i = 0; i < rows; i++) {
        float *r = s + i * cols;
        float mx = r[0];
        for (int64_t j = 1; j < cols; j++) mx = r[j] > mx ? r[j] : mx;
        double sum = 0;
        for (int64_t j = 0; j < cols; j++) {
            r[j] = expf(r[j] - mx);
            sum += r[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < cols; j++) r[j] *= inv;
    }
}

/* P (LQ x LK) = softmax(scale * Q K^T) of head h of batch b. */
static void probs(const att_geom *g, const float *qb, const float *kb, float *P)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g->LQ, (int)g->LK, (int)g->D, g->scale, qb,
                (int)g->HD, kb, (int)g->HD, 0.0f, P, (int)g->LK);
    softmax_rows(P, g->LQ, g->LK);
}

static void zero(float *x, int64_t n)
{
    if (x && n > 0) memset(x, 0, (size_t)n * sizeof(float));
}

// q is (B,LQ,H*D), k and v are (B,LK,H*D); o is (B,LQ,H*D). Head h is columns h*D..h*D+D-1.
CK_CPU_KERNEL(ck_cpu_attention)
{
    (void)nout, (void)nin;
    const att_geom g = geom(p, &in[0], &in[1]);
    const float *q = in[0].data, *k = in[1].data, *v = in[2].data;
    float *o = out[0].data;
    if (g.B * g.LQ * g.HD == 0) return;
    if (g.LK == 0) {
        zero(o, g.B * g.LQ * g.HD);
        return;
    }
    assert(ctx->ws_bytes >= (size_t)(g.LQ * g.LK) * sizeof(float));
    float *P = ctx->ws;

    for (int64_t b = 0; b < g.B; b++)
        for (int64_t h = 0; h < g.H; h++) {
            const int64_t qo = b * g.LQ * g.HD + h * g.D, ko = b * g.LK * g.HD + h * g.D;
            probs(&g, q + qo, k + ko, P);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.LQ, (int)g.D, (int)g.LK, 1.0f, P,
                        (int)g.LK, v + ko, (int)g.HD, 0.0f, o + qo, (int)g.HD);
        }
}

// dout and q are (B,LQ,H*D), k and v are (B,LK,H*D); dq is like q, dk and dv like k.
CK_CPU_KERNEL(ck_cpu_attention_bwd)
{
    (void)nin;
    const att_geom g = geom(p, &in[1], &in[2]);
    const float *dout = in[0].data, *q = in[1].data, *k = in[2].data, *v = in[3].data;
    float *dq = out[0].data, *dk = nout > 1 ? out[1].data : NULL, *dv = nout > 2 ? out[2].data : NULL;
    if (g.B * g.HD == 0) return;
    if (g.LQ == 0 || g.LK == 0) {
        // No scores: o did not depend on anything, so every gradient is zero.
        zero(dq, g.B * g.LQ * g.HD);
        zero(dk, g.B * g.LK * g.HD);
        zero(dv, g.B * g.LK * g.HD);
        return;
    }
    assert(ctx->ws_bytes >= (size_t)(2 * g.LQ * g.LK) * sizeof(float));
    const int64_t LQ = g.LQ, LK = g.LK;
    float *P = ctx->ws, *dS = P + LQ * LK;

    for (int64_t b = 0; b < g.B; b++)
        for (int64_t h = 0; h < g.H; h++) {
            const int64_t qo = b * LQ * g.HD + h * g.D, ko = b * LK * g.HD + h * g.D;
            probs(&g, q + qo, k + ko, P);
            if (dv)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)LK, (int)g.D, (int)LQ, 1.0f, P,
                            (int)LK, dout + qo, (int)g.HD, 0.0f, dv + ko, (int)g.HD);
            if (!dq && !dk) continue;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)LQ, (int)LK, (int)g.D, 1.0f, dout + qo,
                        (int)g.HD, v + ko, (int)g.HD, 0.0f, dS, (int)LK);
            // dS = scale * P * (dP - rowsum(dP * P)); the scale is folded in here once.
#pragma omp parallel for schedule(static) if (LQ * LK > 32768)
            for (int64_t i = 0; i < LQ; i++) {
                const float *pr = P + i * LK;
                float *dr = dS + i * LK;
                double acc[8] = {0};
                int64_t j = 0;
                for (; j + 8 <= LK; j += 8)
                    for (int l = 0; l < 8; l++) acc[l] += (double)dr[j + l] * pr[j + l];
                double s = 0;
                for (; j < LK; j++) s += (double)dr[j] * pr[j];
                for (int l = 0; l < 8; l++) s += acc[l];
                const float sf = (float)s;
                for (j = 0; j < LK; j++) dr[j] = g.scale * pr[j] * (dr[j] - sf);
            }
            if (dq)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)LQ, (int)g.D, (int)LK, 1.0f, dS,
                            (int)LK, k + ko, (int)g.HD, 0.0f, dq + qo, (int)g.HD);
            if (dk)
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)LK, (int)g.D, (int)LQ, 1.0f, dS,
                            (int)LK, q + qo, (int)g.HD, 0.0f, dk + ko, (int)g.HD);
        }
}
