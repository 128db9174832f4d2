/* Normalization on the CPU: GROUP_NORM, GROUP_NORM_SILU, LAYER_NORM and
 * RMS_NORM, forward and backward. Statistics are two-pass sums in double,
 * recomputed from x in the backward; gamma/beta gradients are summed in one
 * fixed order whatever the thread count. GROUP_NORM_SILU does the float
 * operations of GROUP_NORM then SILU (activation.c) in their order, so its
 * results are the pair's bitwise. RMS_NORM is LAYER_NORM's code with the mean
 * taken as 0 and no bias (the mean of the gradient drops out of dx with it);
 * a missing gamma is 1 and a missing beta 0, in the same arithmetic. All have
 * bf16 and fp16 storage kernels, one body each taking the type, the fp32
 * arithmetic on converted pieces. */
#include "cpu.h"
#include "vecmath.h"

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
/* GROUP_NORM_SILU_BWD: the pre-activation's gradient is made this many values
 * at a time on the stack (a multiple of LANES, so the lane sums run as over
 * one array). */
#define GN_CHUNK 2048

/* sum(x) over n values into lanes acc and, for the n % LANES at the end, *tail;
 * the caller adds the lanes to *tail last. Consecutive calls on pieces of
 * LANES-multiple length sum as one call (the 16-bit kernels' pieces). */
static void lanes_sum(const float *x, int64_t n, double *acc, double *tail)
{
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
    for (; i < n; i++) *tail += x[i];
}

/* sum((x - m)^2), as lanes_sum */
static void lanes_sumsq_dev(const float *x, int64_t n, float m, double *acc, double *tail)
{
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            const double d = x[i + l] - m;
            acc[l] += d * d;
        }
    for (; i < n; i++) {
        const double d = x[i] - m;
        *tail += d * d;
    }
}

static double sumsq_dev(const float *x, int64_t n, float m)
{
    double acc[LANES] = {0}, s = 0;
    lanes_sumsq_dev(x, n, m, acc, &s);
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

/* sum(dy) and sum(dy * (x - m)) in one pass, into lanes a and b and, for the
 * n % LANES values at the end, into *sdy and *sdyx; the caller adds the lanes
 * last. Consecutive calls on pieces of LANES-multiple length sum as one call. */
static void lanes_dy_dyx(const float *dy, const float *x, int64_t n, float m, double *a, double *b, double *sdy,
                         double *sdyx)
{
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            a[l] += dy[i + l];
            b[l] += (double)dy[i + l] * (x[i + l] - m);
        }
    for (; i < n; i++) {
        *sdy += dy[i];
        *sdyx += (double)dy[i] * (x[i] - m);
    }
}

/* The gradient of h = (x - m) * a + b through SiLU: GROUP_NORM's output and
 * SILU_BWD's arithmetic on it, for n values. */
static void silu_grad_of_norm(float *dh, const float *dy, const float *x, int64_t n, float m, float a, float b)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float h = (x[i] - m) * a + b;
        const float s = sigmoid_c(h);
        dh[i] = dy[i] * s * (1.0f + h * (1.0f - s));
    }
}

/* Mean and 1/sqrt(var + eps) of n > 0 values, biased variance. The mean is
 * rounded to float first and the variance taken about that rounded mean, so the
 * (x - mean) every caller forms in float is the same quantity the statistics saw. */
static void stats(const float *x, int64_t n, float eps, float *mean, float *rstd)
{
    const float m = (float)(ck_cpu_dot8(x, NULL, n) / (double)n);
    const double var = sumsq_dev(x, n, m) / (double)n;
    *mean = m;
    *rstd = (float)(1.0 / sqrt(var + (double)eps));
}

/* A layer norm's statistics, or an RMS norm's (rms: the mean taken as 0, so
 * rstd = 1/sqrt(mean(x^2) + eps)) */
static void row_stats(const float *x, int64_t n, float eps, int rms, float *mean, float *rstd)
{
    if (!rms) {
        stats(x, n, eps, mean, rstd);
        return;
    }
    *mean = 0.0f;
    *rstd = (float)(1.0 / sqrt(sumsq_dev(x, n, 0.0f) / (double)n + (double)eps));
}

static int64_t spatial_of(const ck_view *x)
{
    int64_t s = 1;
    for (int d = 2; d < x->ndim; d++) s *= x->shape[d];
    return s;
}

// x is (N,C,*) with S = prod(*) (1 when x is (N,C)), gamma and beta are (C), y is like x;
// statistics per (n, group) over C/G channels x S positions. silu: y = silu(group_norm(x)).
static void gn_fwd(const ck_op_params *p, ck_view *out, const ck_view *in, int silu)
{
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
            if (silu) {
#pragma omp simd
                for (int64_t s = 0; s < S; s++) {
                    const float h = (xc[s] - m) * a + b;
                    yc[s] = h * sigmoid_c(h);
                }
            } else {
#pragma omp simd
                for (int64_t s = 0; s < S; s++) yc[s] = (xc[s] - m) * a + b;
            }
        }
    }
}

CK_CPU_KERNEL(ck_cpu_group_norm)
{
    (void)ctx, (void)nout, (void)nin;
    gn_fwd(p, out, in, 0);
}

CK_CPU_KERNEL(ck_cpu_group_norm_silu)
{
    (void)ctx, (void)nout, (void)nin;
    gn_fwd(p, out, in, 1);
}

/* One (n, group) of GROUP_NORM_BWD: dx for its Cg*S elements, and its terms of
 * dgamma/dbeta for channels c0.. (stored when first, else added). With beta
 * (GROUP_NORM_SILU_BWD), dy is the gradient of the SiLU's output and the
 * norm's is made from it and the recomputed pre-activation, GN_CHUNK values
 * at a time, in each of the two passes. */
static void gn_bwd_group(const float *dy, const float *x, const float *gamma, const float *beta, float *dx,
                         float *dgamma, float *dbeta, int64_t Cg, int64_t S, float eps, int first)
{
    const int64_t M = Cg * S;
    float m, rs;
    stats(x, M, eps, &m, &rs);
    float dh[GN_CHUNK];
    // With g = gamma * dy and xh = (x - m) * rs: dx = rs * (g - mean(g) - xh * mean(g * xh)).
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < Cg; c++) {
        const float *dyc = dy + c * S, *xc = x + c * S;
        double a[LANES] = {0}, b[LANES] = {0}, sdy = 0, sdyx = 0;
        if (!beta)
            lanes_dy_dyx(dyc, xc, S, m, a, b, &sdy, &sdyx);
        else
            for (int64_t s0 = 0; s0 < S; s0 += GN_CHUNK) {
                const int64_t n = S - s0 < GN_CHUNK ? S - s0 : GN_CHUNK;
                silu_grad_of_norm(dh, dyc + s0, xc + s0, n, m, rs * gamma[c], beta[c]);
                lanes_dy_dyx(dh, xc + s0, n, m, a, b, &sdy, &sdyx);
            }
        for (int l = 0; l < LANES; l++) sdy += a[l], sdyx += b[l];
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
        if (!beta) {
#pragma omp simd
            for (int64_t s = 0; s < S; s++) dxc[s] = (gc * dyc[s] - mg) * rs - (xc[s] - m) * k2;
            continue;
        }
        for (int64_t s0 = 0; s0 < S; s0 += GN_CHUNK) {
            const int64_t n = S - s0 < GN_CHUNK ? S - s0 : GN_CHUNK;
            silu_grad_of_norm(dh, dyc + s0, xc + s0, n, m, rs * gc, beta[c]);
#pragma omp simd
            for (int64_t s = 0; s < n; s++) dxc[s0 + s] = (gc * dh[s] - mg) * rs - (xc[s0 + s] - m) * k2;
        }
    }
}

// dy and x are (N,C,*), gamma (and beta, for GROUP_NORM_SILU_BWD) are (C); dx is like x,
// dgamma and dbeta are (C).
static void gn_bwd(const ck_op_params *p, ck_view *out, int nout, const ck_view *in, const float *beta)
{
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
            const int64_t off = ng * Cg * S, c0 = (ng % G) * Cg;
            gn_bwd_group(dy + off, x + off, gamma + c0, beta ? beta + c0 : NULL, dx + off, NULL, NULL, Cg, S, eps, 1);
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
            gn_bwd_group(dy + off, x + off, gamma + c0, beta ? beta + c0 : NULL, dx ? dx + off : NULL,
                         dgamma ? dgamma + c0 : NULL, dbeta ? dbeta + c0 : NULL, Cg, S, eps, n == 0);
        }
    }
}

CK_CPU_KERNEL(ck_cpu_group_norm_bwd)
{
    (void)ctx, (void)nin;
    gn_bwd(p, out, nout, in, NULL);
}

CK_CPU_KERNEL(ck_cpu_group_norm_silu_bwd)
{
    (void)ctx, (void)nin;
    gn_bwd(p, out, nout, in, in[3].data);
}

// x is (..,C), gamma and beta (C, either absent: 1 and 0), y is like x; each row of C is
// normalized (rms: divided by its root mean square, no bias).
static void ln_fwd(const ck_op_params *p, ck_view *out, const ck_view *in, int nin, int rms)
{
    const float *x = in[0].data, *gamma = nin > 1 ? in[1].data : NULL, *beta = nin > 2 ? in[2].data : NULL;
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
        row_stats(xr, C, eps, rms, &m, &rs);
        if (gamma && beta) {
#pragma omp simd
            for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
        } else if (gamma) {
#pragma omp simd
            for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs * gamma[c];
        } else {
#pragma omp simd
            for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rs;
        }
    }
}

CK_CPU_KERNEL(ck_cpu_layer_norm)
{
    (void)ctx, (void)nout;
    ln_fwd(p, out, in, nin, 0);
}

CK_CPU_KERNEL(ck_cpu_rms_norm)
{
    (void)ctx, (void)nout;
    ln_fwd(p, out, in, nin, 1);
}

/* dx of one LAYER_NORM row given its statistics (gamma NULL: 1); rms: of an RMS_NORM row (m = 0). */
static void ln_bwd_row(const float *dy, const float *x, const float *gamma, float *dx, int64_t C, float m, float rs,
                       int rms)
{
    // With g = gamma * dy and xh = (x - m) * rs: dx = rs * (g - mean(g) - xh * mean(g * xh)); an RMS
    // norm's mean is no function of x, so its dx has no mean(g) term.
    double a[LANES] = {0}, b[LANES] = {0};
    int64_t c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int l = 0; l < LANES; l++) {
            const float g = gamma ? gamma[c + l] * dy[c + l] : dy[c + l];
            a[l] += g;
            b[l] += (double)g * (x[c + l] - m);
        }
    double sg = 0, sgx = 0;
    for (; c < C; c++) {
        const float g = gamma ? gamma[c] * dy[c] : dy[c];
        sg += g;
        sgx += (double)g * (x[c] - m);
    }
    for (int l = 0; l < LANES; l++) sg += a[l], sgx += b[l];
    const float mg = rms ? 0.0f : (float)(sg / (double)C);
    const float k2 = (float)((double)rs * rs * rs * sgx / (double)C);
    if (gamma) {
#pragma omp simd
        for (c = 0; c < C; c++) dx[c] = (gamma[c] * dy[c] - mg) * rs - (x[c] - m) * k2;
    } else {
#pragma omp simd
        for (c = 0; c < C; c++) dx[c] = (dy[c] - mg) * rs - (x[c] - m) * k2;
    }
}

// dy and x are (..,C), gamma (C, or absent: 1); dx is like x, dgamma and dbeta are (C).
static void ln_bwd(const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin, int rms)
{
    const float *dy = in[0].data, *x = in[1].data, *gamma = nin > 2 ? in[2].data : NULL;
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
            row_stats(x + r * C, C, eps, rms, &m, &rs);
            ln_bwd_row(dy + r * C, x + r * C, gamma, dx + r * C, C, m, rs, rms);
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
                row_stats(xr, C, eps, rms, &m, &rs);
                if (dx && c0 == 0) ln_bwd_row(dyr, xr, gamma, dx + r * C, C, m, rs, rms);
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

CK_CPU_KERNEL(ck_cpu_layer_norm_bwd)
{
    (void)ctx;
    ln_bwd(p, out, nout, in, nin, 0);
}

CK_CPU_KERNEL(ck_cpu_rms_norm_bwd)
{
    (void)ctx;
    ln_bwd(p, out, nout, in, nin, 1);
}

/* ---- 16-bit storage (st: bf16 or fp16): GROUP_NORM, GROUP_NORM_SILU and
 * LAYER_NORM with every tensor of that type, the fp32 kernels' arithmetic on the values converted GN_CHUNK
 * at a time (lane sums carried across pieces, whose lengths are multiples of
 * LANES), so each output is the fp32 kernel's on the same values, rounded
 * once. ---- */

/* stats() over n values of type st */
static void stats16(ck_dtype st, const uint16_t *x, int64_t n, float eps, float *mean, float *rstd)
{
    float buf[GN_CHUNK];
    double acc[LANES] = {0}, s = 0;
    for (int64_t o = 0; o < n; o += GN_CHUNK) {
        const int64_t k = n - o < GN_CHUNK ? n - o : GN_CHUNK;
        ck_cpu_load16(st, buf, x + o, k);
        lanes_sum(buf, k, acc, &s);
    }
    for (int l = 0; l < LANES; l++) s += acc[l];
    const float m = (float)(s / (double)n);
    double acc2[LANES] = {0}, q = 0;
    for (int64_t o = 0; o < n; o += GN_CHUNK) {
        const int64_t k = n - o < GN_CHUNK ? n - o : GN_CHUNK;
        ck_cpu_load16(st, buf, x + o, k);
        lanes_sumsq_dev(buf, k, m, acc2, &q);
    }
    for (int l = 0; l < LANES; l++) q += acc2[l];
    *mean = m;
    *rstd = (float)(1.0 / sqrt(q / (double)n + (double)eps));
}

// x is (N,C,*) as GROUP_NORM, gamma and beta (C), y like x; all st. silu: y = silu(group_norm(x))
static void gn_fwd16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in, int silu)
{
    const uint16_t *x = (const uint16_t *)in[0].data, *gamma = (const uint16_t *)in[1].data;
    const uint16_t *beta = (const uint16_t *)in[2].data;
    uint16_t *y = (uint16_t *)out[0].data;
    const int64_t N = in[0].shape[0], C = in[0].shape[1], S = spatial_of(&in[0]);
    const int64_t G = p->i[0], Cg = G > 0 ? C / G : 0;
    const float eps = p->f[0];
    assert(G > 0 && C % G == 0);
    if (N * C * S == 0) return;

#pragma omp parallel for schedule(static) if (N * C * S > 32768)
    for (int64_t ng = 0; ng < N * G; ng++) {
        const int64_t c0 = (ng % G) * Cg;
        const uint16_t *xg = x + ng * Cg * S;
        uint16_t *yg = y + ng * Cg * S;
        float m, rs, buf[GN_CHUNK];
        stats16(st, xg, Cg * S, eps, &m, &rs);
        for (int64_t c = 0; c < Cg; c++) {
            const float a = rs * ck_cpu_f32_of16(st, gamma[c0 + c]), b = ck_cpu_f32_of16(st, beta[c0 + c]);
            for (int64_t s0 = 0; s0 < S; s0 += GN_CHUNK) {
                const int64_t k = S - s0 < GN_CHUNK ? S - s0 : GN_CHUNK;
                ck_cpu_load16(st, buf, xg + c * S + s0, k);
                if (silu) {
#pragma omp simd
                    for (int64_t s = 0; s < k; s++) {
                        const float h = (buf[s] - m) * a + b;
                        buf[s] = h * sigmoid_c(h);
                    }
                } else {
#pragma omp simd
                    for (int64_t s = 0; s < k; s++) buf[s] = (buf[s] - m) * a + b;
                }
                ck_cpu_store16(st, yg + c * S + s0, buf, k);
            }
        }
    }
}

CK_CPU_ENTRIES16(group_norm, gn_fwd16(st, p, out, in, 0))

CK_CPU_ENTRIES16(group_norm_silu, gn_fwd16(st, p, out, in, 1))

/* One channel's sum(dh) and sum(dh (x - m)) from dy and x of type st: gn_bwd_group's
 * sums, piece by piece. silu: dh is dy through SiLU of h = (x - m) a + b;
 * otherwise dy itself. */
static void channel_sums16(ck_dtype st, const uint16_t *dy, const uint16_t *x, int64_t S, float m, float a, float b,
                           int silu, double *sdy, double *sdyx)
{
    float xb[GN_CHUNK], dh[GN_CHUNK];
    double la[LANES] = {0}, lb[LANES] = {0};
    *sdy = 0, *sdyx = 0;
    for (int64_t s0 = 0; s0 < S; s0 += GN_CHUNK) {
        const int64_t k = S - s0 < GN_CHUNK ? S - s0 : GN_CHUNK;
        ck_cpu_load16(st, xb, x + s0, k);
        ck_cpu_load16(st, dh, dy + s0, k);
        if (silu) silu_grad_of_norm(dh, dh, xb, k, m, a, b);
        lanes_dy_dyx(dh, xb, k, m, la, lb, sdy, sdyx);
    }
    for (int l = 0; l < LANES; l++) *sdy += la[l], *sdyx += lb[l];
}

/* dx of one (n, group), as gn_bwd_group (through SiLU when beta is given) */
static void gn_dx16(ck_dtype st, const uint16_t *dy, const uint16_t *x, const uint16_t *gamma, const uint16_t *beta,
                    uint16_t *dx, int64_t Cg, int64_t S, float eps)
{
    const int64_t M = Cg * S;
    float m, rs;
    stats16(st, x, M, eps, &m, &rs);
    double sg = 0, sgx = 0;
    for (int64_t c = 0; c < Cg; c++) {
        const float gc = ck_cpu_f32_of16(st, gamma[c]), bc = beta ? ck_cpu_f32_of16(st, beta[c]) : 0.0f;
        double sdy, sdyx;
        channel_sums16(st, dy + c * S, x + c * S, S, m, rs * gc, bc, beta != NULL, &sdy, &sdyx);
        sg += gc * sdy;
        sgx += gc * sdyx;
    }
    const float mg = (float)(sg / (double)M);
    const float k2 = (float)((double)rs * rs * rs * sgx / (double)M);
    float xb[GN_CHUNK], dh[GN_CHUNK];
    for (int64_t c = 0; c < Cg; c++) {
        const float gc = ck_cpu_f32_of16(st, gamma[c]), bc = beta ? ck_cpu_f32_of16(st, beta[c]) : 0.0f;
        for (int64_t s0 = 0; s0 < S; s0 += GN_CHUNK) {
            const int64_t k = S - s0 < GN_CHUNK ? S - s0 : GN_CHUNK;
            ck_cpu_load16(st, xb, x + c * S + s0, k);
            ck_cpu_load16(st, dh, dy + c * S + s0, k);
            if (beta) silu_grad_of_norm(dh, dh, xb, k, m, rs * gc, bc);
#pragma omp simd
            for (int64_t s = 0; s < k; s++) dh[s] = (gc * dh[s] - mg) * rs - (xb[s] - m) * k2;
            ck_cpu_store16(st, dx + c * S + s0, dh, k);
        }
    }
}

/* channels a dgamma/dbeta sweep accumulates on the stack */
#define GN_PARAM_BLOCK 256

// dy and x are (N,C,*), gamma (and beta, for GROUP_NORM_SILU_BWD) (C); dx like x, dgamma and dbeta (C),
// any unwanted; all st. dgamma and dbeta are summed over n in float, as the fp32 kernel does, and
// rounded once.
static void gn_bwd16(ck_dtype st, const ck_op_params *p, ck_view *out, int nout, const ck_view *in,
                     const uint16_t *beta)
{
    const uint16_t *dy = (const uint16_t *)in[0].data, *x = (const uint16_t *)in[1].data;
    const uint16_t *gamma = (const uint16_t *)in[2].data;
    uint16_t *dx = (uint16_t *)out[0].data;
    uint16_t *dgamma = nout > 1 ? (uint16_t *)out[1].data : NULL, *dbeta = nout > 2 ? (uint16_t *)out[2].data : NULL;
    const int64_t N = in[1].shape[0], C = in[1].shape[1], S = spatial_of(&in[1]);
    const int64_t G = p->i[0], Cg = G > 0 ? C / G : 0;
    const float eps = p->f[0];
    assert(G > 0 && C % G == 0);
    if (C == 0) return;
    if (N * S == 0) {
        if (dgamma) memset(dgamma, 0, (size_t)C * sizeof(uint16_t));
        if (dbeta) memset(dbeta, 0, (size_t)C * sizeof(uint16_t));
        return;
    }
    const int64_t total = N * C * S;
    if (dx) {
#pragma omp parallel for schedule(static) if (total > 32768)
        for (int64_t ng = 0; ng < N * G; ng++) {
            const int64_t off = ng * Cg * S, c0 = (ng % G) * Cg;
            gn_dx16(st, dy + off, x + off, gamma + c0, beta ? beta + c0 : NULL, dx + off, Cg, S, eps);
        }
    }
    if (!dgamma && !dbeta) return;
#pragma omp parallel for schedule(static) if (total > 32768)
    for (int64_t g = 0; g < G; g++) {
        for (int64_t cb = 0; cb < Cg; cb += GN_PARAM_BLOCK) {
            const int64_t c0 = g * Cg, nb = Cg - cb < GN_PARAM_BLOCK ? Cg - cb : GN_PARAM_BLOCK;
            float ag[GN_PARAM_BLOCK], ab[GN_PARAM_BLOCK];
            for (int64_t n = 0; n < N; n++) {
                const int64_t off = (n * C + c0) * S;
                float m, rs;
                stats16(st, x + off, Cg * S, eps, &m, &rs);
                for (int64_t c = cb; c < cb + nb; c++) {
                    const float bc = beta ? ck_cpu_f32_of16(st, beta[c0 + c]) : 0.0f;
                    double sdy, sdyx;
                    channel_sums16(st, dy + off + c * S, x + off + c * S, S, m, rs * ck_cpu_f32_of16(st, gamma[c0 + c]),
                                      bc, beta != NULL, &sdy, &sdyx);
                    ag[c - cb] = (n == 0 ? 0.0f : ag[c - cb]) + (float)(sdyx * rs);
                    ab[c - cb] = (n == 0 ? 0.0f : ab[c - cb]) + (float)sdy;
                }
            }
            for (int64_t c = cb; c < cb + nb; c++) {
                if (dgamma) dgamma[c0 + c] = ck_cpu_16_of_f32(st, ag[c - cb]);
                if (dbeta) dbeta[c0 + c] = ck_cpu_16_of_f32(st, ab[c - cb]);
            }
        }
    }
}

CK_CPU_ENTRIES16(group_norm_bwd, gn_bwd16(st, p, out, nout, in, NULL))

CK_CPU_ENTRIES16(group_norm_silu_bwd, gn_bwd16(st, p, out, nout, in, (const uint16_t *)in[3].data))

/* row_stats over n values of type st: stats16's sums, the mean taken as 0 when rms */
static void row_stats16(ck_dtype st, const uint16_t *x, int64_t n, float eps, int rms, float *mean, float *rstd)
{
    if (!rms) {
        stats16(st, x, n, eps, mean, rstd);
        return;
    }
    float buf[GN_CHUNK];
    double acc[LANES] = {0}, q = 0;
    for (int64_t o = 0; o < n; o += GN_CHUNK) {
        const int64_t k = n - o < GN_CHUNK ? n - o : GN_CHUNK;
        ck_cpu_load16(st, buf, x + o, k);
        lanes_sumsq_dev(buf, k, 0.0f, acc, &q);
    }
    for (int l = 0; l < LANES; l++) q += acc[l];
    *mean = 0.0f;
    *rstd = (float)(1.0 / sqrt(q / (double)n + (double)eps));
}

/* k values of type st at src into dst, or k copies of v where src is NULL (a missing gamma or beta) */
static void load16_or(ck_dtype st, float *dst, const uint16_t *src, int64_t k, float v)
{
    if (src) {
        ck_cpu_load16(st, dst, src, k);
        return;
    }
    for (int64_t i = 0; i < k; i++) dst[i] = v;
}

// x is (..,C), gamma and beta (C, either absent), y like x, all st; each row of C normalized
// (rms: an RMS norm's rows)
static void ln_fwd16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in, int nin, int rms)
{
    const uint16_t *x = (const uint16_t *)in[0].data, *gamma = nin > 1 ? (const uint16_t *)in[1].data : NULL;
    const uint16_t *beta = nin > 2 ? (const uint16_t *)in[2].data : NULL;
    uint16_t *y = (uint16_t *)out[0].data;
    const int64_t C = in[0].shape[in[0].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / C;
    const float eps = p->f[0];

#pragma omp parallel for schedule(static) if (R * C > 32768)
    for (int64_t r = 0; r < R; r++) {
        float m, rs, xb[GN_CHUNK], gb[GN_CHUNK], bb[GN_CHUNK];
        row_stats16(st, x + r * C, C, eps, rms, &m, &rs);
        for (int64_t c0 = 0; c0 < C; c0 += GN_CHUNK) {
            const int64_t k = C - c0 < GN_CHUNK ? C - c0 : GN_CHUNK;
            ck_cpu_load16(st, xb, x + r * C + c0, k);
            load16_or(st, gb, gamma ? gamma + c0 : NULL, k, 1.0f);
            if (beta) {
                ck_cpu_load16(st, bb, beta + c0, k);
#pragma omp simd
                for (int64_t c = 0; c < k; c++) xb[c] = (xb[c] - m) * rs * gb[c] + bb[c];
            } else {
#pragma omp simd
                for (int64_t c = 0; c < k; c++) xb[c] = (xb[c] - m) * rs * gb[c];
            }
            ck_cpu_store16(st, y + r * C + c0, xb, k);
        }
    }
}

/* ln_bwd_row on one row of type st: the sums of g = gamma * dy and g (x - m) go
 * through lanes_dy_dyx with g in place of dy, which is ln_bwd_row's order. */
static void ln_bwd_row16(ck_dtype st, const uint16_t *dy, const uint16_t *x, const uint16_t *gamma, uint16_t *dx,
                         int64_t C, float m, float rs, int rms)
{
    float xb[GN_CHUNK], gb[GN_CHUNK], db[GN_CHUNK];
    double a[LANES] = {0}, b[LANES] = {0}, sg = 0, sgx = 0;
    for (int64_t c0 = 0; c0 < C; c0 += GN_CHUNK) {
        const int64_t k = C - c0 < GN_CHUNK ? C - c0 : GN_CHUNK;
        ck_cpu_load16(st, xb, x + c0, k);
        load16_or(st, gb, gamma ? gamma + c0 : NULL, k, 1.0f);
        ck_cpu_load16(st, db, dy + c0, k);
#pragma omp simd
        for (int64_t c = 0; c < k; c++) db[c] = gb[c] * db[c];
        lanes_dy_dyx(db, xb, k, m, a, b, &sg, &sgx);
    }
    for (int l = 0; l < LANES; l++) sg += a[l], sgx += b[l];
    const float mg = rms ? 0.0f : (float)(sg / (double)C);
    const float k2 = (float)((double)rs * rs * rs * sgx / (double)C);
    for (int64_t c0 = 0; c0 < C; c0 += GN_CHUNK) {
        const int64_t k = C - c0 < GN_CHUNK ? C - c0 : GN_CHUNK;
        ck_cpu_load16(st, xb, x + c0, k);
        load16_or(st, gb, gamma ? gamma + c0 : NULL, k, 1.0f);
        ck_cpu_load16(st, db, dy + c0, k);
#pragma omp simd
        for (int64_t c = 0; c < k; c++) xb[c] = (gb[c] * db[c] - mg) * rs - (xb[c] - m) * k2;
        ck_cpu_store16(st, dx + c0, xb, k);
    }
}

// dy and x are (..,C), gamma (C, or absent); dx like x, dgamma and dbeta (C), any unwanted; all st.
// The fp32 kernel's chunks of rows and column sweeps, its double partials rounded once.
static void ln_bwd16(ck_dtype st, const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin, int rms)
{
    const uint16_t *dy = (const uint16_t *)in[0].data, *x = (const uint16_t *)in[1].data;
    const uint16_t *gamma = nin > 2 ? (const uint16_t *)in[2].data : NULL;
    uint16_t *dx = (uint16_t *)out[0].data;
    uint16_t *dgamma = nout > 1 ? (uint16_t *)out[1].data : NULL, *dbeta = nout > 2 ? (uint16_t *)out[2].data : NULL;
    const int64_t C = in[1].shape[in[1].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[1]) / C;
    const float eps = p->f[0];

    if (!dgamma && !dbeta) {
        if (!dx) return;
#pragma omp parallel for schedule(static) if (R * C > 32768)
        for (int64_t r = 0; r < R; r++) {
            float m, rs;
            row_stats16(st, x + r * C, C, eps, rms, &m, &rs);
            ln_bwd_row16(st, dy + r * C, x + r * C, gamma, dx + r * C, C, m, rs, rms);
        }
        return;
    }
    if (R == 0) {
        if (dgamma) memset(dgamma, 0, (size_t)C * sizeof(uint16_t));
        if (dbeta) memset(dbeta, 0, (size_t)C * sizeof(uint16_t));
        return;
    }
    const int64_t nch = R < LN_CHUNKS ? R : LN_CHUNKS, cols = LN_PART / nch;
    double part[2][LN_PART];
    for (int64_t c0 = 0; c0 < C; c0 += cols) {
        const int64_t cw = C - c0 < cols ? C - c0 : cols;
#pragma omp parallel for schedule(static) if (R * C > 32768)
        for (int64_t k = 0; k < nch; k++) {
            double *pg = part[0] + k * cw, *pb = part[1] + k * cw;
            float xb[GN_CHUNK], db[GN_CHUNK];
            for (int64_t c = 0; c < cw; c++) pg[c] = 0, pb[c] = 0;
            for (int64_t r = R * k / nch; r < R * (k + 1) / nch; r++) {
                const uint16_t *dyr = dy + r * C, *xr = x + r * C;
                float m, rs;
                row_stats16(st, xr, C, eps, rms, &m, &rs);
                if (dx && c0 == 0) ln_bwd_row16(st, dyr, xr, gamma, dx + r * C, C, m, rs, rms);
                for (int64_t o = 0; o < cw; o += GN_CHUNK) {
                    const int64_t n = cw - o < GN_CHUNK ? cw - o : GN_CHUNK;
                    ck_cpu_load16(st, xb, xr + c0 + o, n);
                    ck_cpu_load16(st, db, dyr + c0 + o, n);
#pragma omp simd
                    for (int64_t c = 0; c < n; c++) {
                        pg[o + c] += (double)db[c] * ((xb[c] - m) * rs);
                        pb[o + c] += db[c];
                    }
                }
            }
        }
        for (int64_t c = 0; c < cw; c++) {
            double sg = 0, sb = 0;
            for (int64_t k = 0; k < nch; k++) sg += part[0][k * cw + c], sb += part[1][k * cw + c];
            if (dgamma) dgamma[c0 + c] = ck_cpu_16_of_f32(st, (float)sg);
            if (dbeta) dbeta[c0 + c] = ck_cpu_16_of_f32(st, (float)sb);
        }
    }
}

CK_CPU_ENTRIES16(layer_norm, ln_fwd16(st, p, out, in, nin, 0))

CK_CPU_ENTRIES16(layer_norm_bwd, ln_bwd16(st, p, out, nout, in, nin, 0))

CK_CPU_ENTRIES16(rms_norm, ln_fwd16(st, p, out, in, nin, 1))

CK_CPU_ENTRIES16(rms_norm_bwd, ln_bwd16(st, p, out, nout, in, nin, 1))
