/* Scalar losses and their backward: MEAN and MSE_LOSS. Sums are taken in double
 * over a fixed number of segments (chosen from the size alone) combined in
 * order, so the result is the same at every thread count. */
#include "cpu.h"

/* Below this many elements one thread beats waking the pool. */
#define PAR_MIN 32768

static int64_t nsegments(int64_t n) { return ck_cpu_segments(n, PAR_MIN); }

// the difference is rounded to float first, as torch does, then squared in double
static double sqdiff_run(const float *a, const float *b, int64_t n)
{
    double s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            const double d = (double)(a[i + k] - b[i + k]);
            s[k] += d * d;
        }
    double t = 0;
    for (; i < n; i++) {
        const double d = (double)(a[i] - b[i]);
        t += d * d;
    }
    return ck_cpu_lanes8(s, t);
}

// x any shape; y scalar (ndim 0)
CK_CPU_KERNEL(ck_cpu_mean)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *x = in[0].data;
    const int64_t n = ck_view_numel(&in[0]), S = nsegments(n);
    double part[CK_CPU_SEG_MAX];
#pragma omp parallel for schedule(static) if (S > 1)
    for (int64_t s = 0; s < S; s++) {
        const int64_t i0 = n * s / S, i1 = n * (s + 1) / S;
        part[s] = ck_cpu_sum8(x + i0, i1 - i0);
    }
    double acc = 0;
    for (int64_t s = 0; s < S; s++) acc += part[s];
    out[0].data[0] = (float)(acc / (double)n);
}

// dy scalar; dx any shape
CK_CPU_KERNEL(ck_cpu_mean_bwd)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    float *dx = out[0].data;
    const int64_t n = ck_view_numel(&out[0]);
    const float g = in[0].data[0] / (float)n;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) dx[i] = g;
}

// a, b same shape; y scalar (ndim 0)
CK_CPU_KERNEL(ck_cpu_mse_loss)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *a = in[0].data, *b = in[1].data;
    const int64_t n = ck_view_numel(&in[0]), S = nsegments(n);
    double part[CK_CPU_SEG_MAX];
#pragma omp parallel for schedule(static) if (S > 1)
    for (int64_t s = 0; s < S; s++) {
        const int64_t i0 = n * s / S, i1 = n * (s + 1) / S;
        part[s] = sqdiff_run(a + i0, b + i0, i1 - i0);
    }
    double acc = 0;
    for (int64_t s = 0; s < S; s++) acc += part[s];
    out[0].data[0] = (float)(acc / (double)n);
}

/* dy scalar; a, b same shape; da, db like a (either may be unwanted).
 * da = (a - b) * (2/n) * dy in torch's order; db = -da. */
CK_CPU_KERNEL(ck_cpu_mse_loss_bwd)
{
    (void)ctx, (void)p, (void)nin;
    float *da = out[0].data, *db = nout > 1 ? out[1].data : NULL;
    const float *a = in[1].data, *b = in[2].data;
    const int64_t n = ck_view_numel(&in[1]);
    const float dy = in[0].data[0], norm = (float)(2.0 / (double)n);
    if (da && db) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            const float g = (a[i] - b[i]) * norm * dy;
            da[i] = g;
            db[i] = -g;
        }
    } else if (da) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) da[i] = (a[i] - b[i]) * norm * dy;
    } else if (db) {
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) db[i] = -((a[i] - b[i]) * norm * dy);
    }
}
