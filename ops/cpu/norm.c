/* Normalization on the CPU: GROUP_NORM and LAYER_NORM, forward and backward.
 * Statistics are two-pass sums in double, recomputed from x in the backward;
 * gamma/beta gradients are summed in one fixed order whatever the thread count. */
#include "cpu.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* Interleaved accumulators let the sums vectorize without reassociating. */
#define LANES 8
/* LAYER_NORM_BWD: rows are split into this many chunks (fewer if there are fewer
 * rows) independent of the thread count, so the gamma/beta sums always add the
 * same partials in the same order. */
#define LN_CHUNKS 64
/* Chunk x column partials of gamma and beta kept on the stack (2 x 32 KiB). */
#define LN_PART 4096

static double sum_f(const float *x, int64_t n)
{
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
    double s = 0;
    for (; i < n; i++) s += x[i];
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

static double sumsq_dev(const float *x, int64_t n, float m)
{
    double acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            const double d = x[i + l] - m;
            acc[l] += d * d;
        }
    double s = 0;
    for (; i < n; i++) {
        const double d = x[i] - m;
        s += d * d;
    }
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

/* sum(dy) and sum(dy * (x - m)) in one pass. */
static void sum_dy_dyx(const float *dy, const float *x, int64_t n, float m, double *sdy, double *sdyx)
{
    double a[LANES] = {0}, b[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            a[l] += dy[i + l];
            b[l] += (double)dy[i + l] * (x[i + l] - m);
        }
    double s0 = 0, s1 = 0;
    for (; i < n; i++) {
        s0 += dy[i];
        s1 += (double)dy[i] * (x[i] - m);
    }
    for (int l = 0; l < LANES; l++) s0 += a[l], s1 += b[l];
    *sdy = s0, *sdyx = s1;
}

/* Mean and 1/sqrt(var + eps) of n > 0 values, biased variance. The mean is
 * rounded to float first and the variance taken about that rounded mean, so the
 * (x - mean) every caller forms in float is the same quantity the statistics saw. */
static void stats(const float *x, int64_t n, float eps, float *mean, float *rstd)
{
    const float m = (float)(sum_f(x, n) / (double)n);
    const double var = sumsq_dev(x, n, m) / (double)n;
    *mean = m;
    *rstd = (float)(1.0 / sqrt(var + (double)eps));
}

static int64_t spatial_of(const ck_view *x)
{
    int64_t s = 1;
    for (int d = 2; d < x->ndim; d++) s *= x->shape[d];
    return s;
}

// x is (N,C,*) with S = prod(*) (1 when x is (N,C)), gamma and beta are (C), y is like x;
// statistics per (n, group) over C/G channels x S positions.
CK_CPU_KERNEL(ck_cpu_group_norm)
{
    (void)ctx, (void)nout, (void)nin;
    const float *x = in[0].data, *gamma = in[1].data, *beta = in[2].data;
    float *y = out[0].data;
    const int64_t N = in[0].shape[0], C = in[0].shape[1], S = spatial_of(&in[0]);
    const int64_t G = p->i[0], Cg = G > 0 ? C / G : 0;
    const float eps = p->f[0];
    assert(G > 0 && C % G == 0);
    if (N * C * S == 0) return;

#pragma omp parallel for schedule(static) if (N * C * S > 32768)
    for (int64_t ng = 0; ng < N * G; ng++) {
        const int64_t c0 = (ng % G) * Cg;
        const float *xg = x + ng * Cg * S;
        float *yg = y + ng * Cg * S;
        float m, rs;
        stats(xg, Cg * S, eps, &m, &rs);
        for (int64_t c = 0; c < Cg; c++) {
            const float a = rs * gamma[c0 + c], b = beta[c0 + c];
            const float *xc = xg + c * S;
            float *yc = yg + c * S;
#pragma omp simd
            for (int64_t s = 0; s < S; s++) yc[s] = (xc[s] - m) * a + b;
        }
    }
}

/* One (n, group) of GROUP_NORM_BWD: dx for its Cg*S elements, and its terms of
 * dgamma/dbeta for channels c0.. (stored when first, else added). */
static void gn_bwd_group(const float *dy, const float *x, const float *gamma, float *dx, float *dgamma,
                         float *dbeta, int64_t Cg, int64_t S, float eps, int first)
{
    const int64_t M = Cg * S;
    float m, rs;
    stats(x, M, eps, &m, &rs);
    // With g = gamma * dy and xh = (x - m) * rs: dx = rs * (g - mean(g) - xh * mean(g * xh)).
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < Cg; c++) {
        double sdy, sdyx;
        sum_dy_dyx(dy + c * S, x + c * S, S, m, &sdy, &sdyx);
        sg += gamma[c] * sdy;
        sgx += gamma[c] * sdyx;
        if (dgamma) dgamma[c] = (first ? 0.0f : dgamma[c]) + (float)(sdyx * rs);
        if (dbeta) dbeta[c] = (first ? 0.0f : dbeta[c]) + (float)sdy;
    }
    if (!dx) return;
    // g - mean(g) is formed before scaling by rs so it cancels exactly where it
    // should (a one-element group has dx = 0).
    const float mg = (float)(sg / (double)M);
    const float k2 = (float)((double)rs * rs * rs * sgx / (double)M);
    for (int64_t c = 0; c < Cg; c++) {
        const float gc = gamma[c];
        const float *dyc = dy + c * S, *xc = x + c * S;
        float *dxc = dx + c * S;
#pragma omp simd
        for (int64_t s = 0; s < S; s++) dxc[s] = (gc * dyc[s] - mg) * rs - (xc[s] - m) * k2;
    }
}

// dy and x are (N,C,*), gamma is (C); dx is like x, dgamma and dbeta are (C).
CK_CPU_KERNEL(ck_cpu_group_norm_bwd)
{
    (void)ctx, (void)nin;
    const float *dy = in[0].data, *x = in[1].data, *gamma = in[2].data;
    float *dx = out[0].data;
    float *dgamma = nout > 1 ? out[1].data : NULL, *dbeta = nout > 2 ? out[2].data : NULL;
    const int64_t N = in[1].shape[0], C = in[1].shape[1], S = spatial_of(&in[1]);
    const int64_t G = p->i[0], Cg = G > 0 ? C / G : 0;
    const float eps = p->f[0];
    assert(G > 0 && C % G == 0);
    if (C == 0) return;
    if (N * S == 0) {
        if (dgamma) memset(dgamma, 0, (size_t)C * sizeof(float));
        if (dbeta) memset(dbeta, 0, (size_t)C * sizeof(float));
        return;
    }
    const int64_t total = N * C * S;

    if (!dgamma && !dbeta) {
        if (!dx) return;
#pragma omp parallel for schedule(static) if (total > 32768)
        for (int64_t ng = 0; ng < N * G; ng++) {
            const int64_t off = ng * Cg * S;
            gn_bwd_group(dy + off, x + off, gamma + (ng % G) * Cg, dx + off, NULL, NULL, Cg, S, eps, 1);
        }
        return;
    }
    // A group's channels belong to one thread, which walks n in order: each
    // dgamma/dbeta entry is one fixed sequence of additions.
#pragma omp parallel for schedule(static) if (total > 32768)
    for (int64_t g = 0; g < G; g++) {
        const int64_t c0 = g * Cg;
        for (int64_t n = 0; n < N; n++) {
            const int64_t off = (n * C + c0) * S;
            gn_bwd_group(dy + off, x + off, gamma + c0, dx ? dx + off : NULL, dgamma ? dgamma + c0 : NULL,
                         dbeta ? dbeta + c0 : NULL, Cg, S, eps, n == 0);
        }
    }
}

// x is (..,C), gamma and beta are (C), y is like x; each row of C is normalized.
CK_CPU_KERNEL(ck_cpu_layer_norm)
{
    (void)ctx, (void)nout, (void)nin;
    const float *x = in[0].data, *gamma = in[1].data, *beta = in[2].data;
    float *y = out[0].data;
    const int64_t C = in[0].shape[in[0].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / C;
    const float eps = p->f[0];

#pragma omp parallel for schedule(static) if (R * C > 32768)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        float m, rs;
        stats(xr, C, eps, &m, &rs);
#pragma omp simd
        for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
    }
}

/* dx of one LAYER_NORM row given its statistics. */
static void ln_bwd_row(const float *dy, const float *x, const float *gamma, float *dx, int64_t C, float m, float rs)
{
    // With g = gamma * dy and xh = (x - m) * rs: dx = rs * (g - mean(g) - xh * mean(g * xh)).
    double a[LANES] = {0}, b[LANES] = {0};
    int64_t c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int l = 0; l < LANES; l++) {
            const float g = gamma[c + l] * dy[c + l];
            a[l] += g;
            b[l] += (double)g * (x[c + l] - m);
        }
    double sg = 0, sgx = 0;
    for (; c < C; c++) {
        const float g = gamma[c] * dy[c];
        sg += g;
        sgx += (double)g * (x[c] - m);
    }
    for (int l = 0; l < LANES; l++) sg += a[l], sgx += b[l];
    const float mg = (float)(sg / (double)C);
    const float k2 = (float)((double)rs * rs * rs * sgx / (double)C);
#pragma omp simd
    for (c = 0; c < C; c++) dx[c] = (gamma[c] * dy[c] - mg) * rs - (x[c] - m) * k2;
}

// dy and x are (..,C), gamma is (C); dx is like x, dgamma and dbeta are (C).
CK_CPU_KERNEL(ck_cpu_layer_norm_bwd)
{
    (void)ctx, (void)nin;
    const float *dy = in[0].data, *x = in[1].data, *gamma = in[2].data;
    float *dx = out[0].data;
    float *dgamma = nout > 1 ? out[1].data : NULL, *dbeta = nout > 2 ? out[2].data : NULL;
    const int64_t C = in[1].shape[in[1].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[1]) / C;
    const float eps = p->f[0];

    if (!dgamma && !dbeta) {
        if (!dx) return;
#pragma omp parallel for schedule(static) if (R * C > 32768)
        for (int64_t r = 0; r < R; r++) {
            float m, rs;
            stats(x + r * C, C, eps, &m, &rs);
            ln_bwd_row(dy + r * C, x + r * C, gamma, dx + r * C, C, m, rs);
        }
        return;
    }
    if (R == 0) {
        if (dgamma) memset(dgamma, 0, (size_t)C * sizeof(float));
        if (dbeta) memset(dbeta, 0, (size_t)C * sizeof(float));
        return;
    }
    // gamma/beta gradients sum over rows. Each chunk of rows sums its own partials
    // into its slot of a table on this stack, and the table is added up in chunk
    // order after the loop; the chunking depends on R only, so the result does not
    // depend on the thread count (and no thread waits on another mid-loop). Rows
    // wider than the table take several sweeps, recomputing statistics (dx is done
    // on the first).
    const int64_t nch = R < LN_CHUNKS ? R : LN_CHUNKS, cols = LN_PART / nch;
    double part[2][LN_PART];
    for (int64_t c0 = 0; c0 < C; c0 += cols) {
        const int64_t cw = C - c0 < cols ? C - c0 : cols;
#pragma omp parallel for schedule(static) if (R * C > 32768)
        for (int64_t k = 0; k < nch; k++) {
            double *pg = part[0] + k * cw, *pb = part[1] + k * cw;
            for (int64_t c = 0; c < cw; c++) pg[c] = 0, pb[c] = 0;
            for (int64_t r = R * k / nch; r < R * (k + 1) / nch; r++) {
                const float *dyr = dy + r * C, *xr = x + r * C;
                float m, rs;
                stats(xr, C, eps, &m, &rs);
                if (dx && c0 == 0) ln_bwd_row(dyr, xr, gamma, dx + r * C, C, m, rs);
#pragma omp simd
                for (int64_t c = 0; c < cw; c++) {
                    pg[c] += (double)dyr[c0 + c] * ((xr[c0 + c] - m) * rs);
                    pb[c] += dyr[c0 + c];
                }
            }
        }
        for (int64_t c = 0; c < cw; c++) {
            double sg = 0, sb = 0;
            for (int64_t k = 0; k < nch; k++) sg += part[0][k * cw + c], sb += part[1][k * cw + c];
            if (dgamma) dgamma[c0 + c] = (float)sg;
            if (dbeta) dbeta[c0 + c] = (float)sb;
        }
    }
}
