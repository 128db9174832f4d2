/* Reductions that logging steps place in the op list: a block's activation
 * statistics (STATS) and a gradient's squared norm (SUMSQ). They read each
 * element once. Partial sums run over a fixed number of segments chosen from
 * the size alone and are combined in order, so results do not depend on the
 * thread count. */
#include "cpu.h"

#include <math.h>

/* Below this many elements one thread beats waking the pool: block outputs
 * are read right after the op that made them, from cache, and a statistic
 * that waited for a sleeping (or, on a busy machine, descheduled) thread
 * would cost more than its reads. */
#define PAR_MIN 262144

static int64_t nsegments(int64_t n) { return ck_cpu_segments(n, PAR_MIN); }

typedef struct moments {
    double sum, sumsq; /* of x - c */
    float absmax;
} moments;

/* Runs of CHUNK elements are summed in float as SIMD reductions (the lanes
 * are fixed by the build, so results are too), then added in double: float
 * rounding touches at most a CHUNK's terms. Sums are of x - c, a value near
 * the data, so the variance is not the difference of two large numbers. */
#define CHUNK 1024

static moments moments_run(const float *x, int64_t n, float c)
{
    moments r = {0, 0, 0};
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        const float *y = x + i0;
        const int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        float s = 0, q = 0, a = 0;
#pragma omp simd reduction(+ : s, q) reduction(max : a)
        for (int64_t i = 0; i < m; i++) {
            const float v = y[i] - c, u = fabsf(y[i]);
            s += v;
            q += v * v;
            a = u > a ? u : a; /* maxps; NaN is caught by the sum */
        }
        r.sum += (double)s;
        r.sumsq += (double)q;
        r.absmax = a > r.absmax ? a : r.absmax;
    }
    return r;
}

static double sumsq_run(const float *x, int64_t n)
{
    double acc = 0;
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        const float *y = x + i0;
        const int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        float q = 0;
#pragma omp simd reduction(+ : q)
        for (int64_t i = 0; i < m; i++) q += y[i] * y[i];
        acc += (double)q;
    }
    return acc;
}

// x any shape (numel > 0); out [3] = mean, std (population), max |x|
CK_CPU_KERNEL(ck_cpu_stats)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *x = in[0].data;
    const int64_t n = ck_view_numel(&in[0]), S = nsegments(n);
    const float c = isfinite(x[0]) ? x[0] : 0.0f;
    moments part[CK_CPU_SEG_MAX];
#pragma omp parallel for schedule(static) if (S > 1)
    for (int64_t s = 0; s < S; s++) {
        const int64_t i0 = n * s / S, i1 = n * (s + 1) / S;
        part[s] = moments_run(x + i0, i1 - i0, c);
    }
    double sum = 0, sumsq = 0;
    float absmax = 0;
    for (int64_t s = 0; s < S; s++) {
        sum += part[s].sum;
        sumsq += part[s].sumsq;
        absmax = part[s].absmax > absmax ? part[s].absmax : absmax;
    }
    const double d = sum / (double)n, mean = (double)c + d, var = sumsq / (double)n - d * d;
    /* comparisons skip NaN; the sum does not */
    if (isnan(sum)) absmax = NAN;
    out[0].data[0] = (float)mean;
    out[0].data[1] = (float)(var >= 0 || isnan(var) ? sqrt(var) : 0.0); /* rounding can make var < 0 */
    out[0].data[2] = absmax;
}

// x1..xk any shapes (x1 a running total with i0 = 1); out scalar = the sum of
// their squares, each input's segments added in order, in double
CK_CPU_KERNEL(ck_cpu_sumsq)
{
    (void)ctx, (void)nout;
    double acc = p->i[0] ? (double)in[0].data[0] : 0.0;
    for (int k = p->i[0] ? 1 : 0; k < nin; k++) {
        const float *x = in[k].data;
        const int64_t n = ck_view_numel(&in[k]), S = nsegments(n);
        double part[CK_CPU_SEG_MAX];
#pragma omp parallel for schedule(static) if (S > 1)
        for (int64_t s = 0; s < S; s++) {
            const int64_t i0 = n * s / S, i1 = n * (s + 1) / S;
            part[s] = sumsq_run(x + i0, i1 - i0);
        }
        for (int64_t s = 0; s < S; s++) acc += part[s];
    }
    out[0].data[0] = (float)acc;
}
