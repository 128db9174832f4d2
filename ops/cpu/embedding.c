/* Sinusoidal timestep embedding (diffusers' get_timestep_embedding, computed in
 * float step by step as torch does) and dropout, whose mask is a pure function of
 * (seed, step, op key, element) so its backward redraws it instead of storing it. */
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
 * (ctx->eval), y = x. */
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
#pragma omp parallel for schedule(static) if (n > PAR_MIN / 8)
    for (int64_t e = 0; e < n; e++) {
        const float m = ck_rng_uniform(key, (uint64_t)e) >= drop ? keep_scale : 0.0f;
        y[e] = x[e] * m;
    }
}
