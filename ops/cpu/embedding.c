/* Sinusoidal timestep embedding (diffusers' get_timestep_embedding, computed in
 * float step by step as torch does), dropout, whose mask is a pure function of
 * (seed, step, op key, element) so its backward redraws it instead of storing it,
 * and the table lookup of token ids (torch.nn.functional.embedding). */
#include "cpu.h"
#include "../rng.h"

#include <math.h>
#include <string.h>

/* Below this many elements one thread beats waking the pool. */
#define PAR_MIN 32768

/* t is (B); y is (B, dim). Each float rounding mirrors torch:
 * exponent = float(-ln(max_period)) * j / float(half - shift); freq = exp(exponent);
 * arg = scale * (t * freq); row = [sin, cos] (or [cos, sin] when flipped), then a
 * zero column when dim is odd. */
CK_CPU_KERNEL(ck_cpu_timestep_embedding)
{
    (void)ctx, (void)nout, (void)nin;
    const float *t = in[0].data;
    float *y = out[0].data;
    const int64_t B = ck_view_numel(&in[0]), dim = p->i[0], half = dim / 2;
    const int flip = p->i[1] != 0;
    const float neg_log = (float)(-log((double)p->f[1]));
    const float denom = (float)((double)half - (double)p->f[0]);
    const float scale = p->f[2];
    for (int64_t b = 0; b < B; b++) {
        float *row = y + b * dim;
        float *sin_part = flip ? row + half : row, *cos_part = flip ? row : row + half;
        for (int64_t j = 0; j < half; j++) {
            const float freq = expf(neg_log * (float)j / denom);
            const float arg = scale * (t[b] * freq);
            sin_part[j] = sinf(arg);
            cos_part[j] = cosf(arg);
        }
        if (dim % 2) row[dim - 1] = 0.0f;
    }
}

/* x, y any shape, same numel. y = x * (mask / (1 - p)) like torch's dropout;
 * element e is kept when ck_rng_uniform(key, e) >= p. Run on dy with the same
 * context and params it gives dx with the same mask. In an evaluation pass
 * (ctx->eval), y = x. A data-parallel rank (i1 = world > 1, i2 = rank) draws
 * for row b of x's first dimension what row rank + b * world of the global
 * batch draws (ck_dropout_counter). */
CK_CPU_KERNEL(ck_cpu_dropout)
{
    (void)nout, (void)nin;
    const float *x = in[0].data;
    float *y = out[0].data;
    const int64_t n = ck_view_numel(&in[0]);
    const float drop = p->f[0];
    if (drop <= 0.0f || ctx->eval) {
        if (y != x) memcpy(y, x, sizeof(float) * (size_t)n);
        return;
    }
    /* p >= 1 keeps nothing; 1/(1-p) would be inf, and inf * 0 NaN. */
    const float keep_scale = drop < 1.0f ? 1.0f / (1.0f - drop) : 0.0f;
    const uint64_t key = ck_rng_key(ctx->seed, (uint64_t)ctx->step, (uint64_t)p->i[0]);
    const int64_t rows = in[0].ndim > 0 && in[0].shape[0] > 0 ? in[0].shape[0] : 1, per = n / rows;
#pragma omp parallel for schedule(static) if (n > PAR_MIN / 8)
    for (int64_t e = 0; e < n; e++) {
        const uint64_t c = ck_dropout_counter(e, per, p->i[1], p->i[2]);
        const float m = ck_rng_uniform(key, c) >= drop ? keep_scale : 0.0f;
        y[e] = x[e] * m;
    }
}

/* Whether id names a row of a table of V rows: a whole number in [0, V) (NaN is not). */
static inline int row_ok(float id, int64_t V) { return id >= 0.0f && id < (float)V && id == floorf(id) && (int64_t)id < V; }

/* ids is any shape (N ids); table is (V, D); y is (ids.., D): row n of y is row
 * ids[n] of the table. A bad id (not a row, row_ok) fills its row with NaN and
 * records the first such id with its flat index (ck_cpu_fail), which the
 * executor turns into the run's error; the other rows are still copied. */
CK_CPU_KERNEL(ck_cpu_embedding)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *ids = in[0].data, *table = in[1].data;
    float *y = out[0].data;
    const int64_t N = ck_view_numel(&in[0]), V = in[1].shape[0], D = in[1].shape[1];
    int64_t bad = -1;
    for (int64_t n = 0; n < N && bad < 0; n++)
        if (!row_ok(ids[n], V)) bad = n;
    if (bad >= 0)
        ck_cpu_fail("embedding", "id %.9g at index %lld is not a row of the [%lld, %lld] table (whole numbers 0 to %lld)",
                    (double)ids[bad], (long long)bad, (long long)V, (long long)D, (long long)(V - 1));
#pragma omp parallel for schedule(static) if (N * D > PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        float *row = y + n * D;
        if (row_ok(ids[n], V)) {
            memcpy(row, table + (int64_t)ids[n] * D, sizeof(float) * (size_t)D);
        } else {
            for (int64_t d = 0; d < D; d++) row[d] = NAN;
        }
    }
}
