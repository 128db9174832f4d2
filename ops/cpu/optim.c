/* Optimizer steps, updating parameters and moments in place (out[k] is the same
 * buffer as the matching input). Scalars are formed in double and rounded to float
 * where torch.optim rounds them, and the per-element order follows torch's. */
#include "cpu.h"
#include "../adam8.h"

#include <math.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* Below this many elements one thread beats waking the pool. */
#define PAR_MIN 32768
/* AdamW: elements per unit of work a thread takes (a multiple of 8 lanes), and
 * the size below which one thread does it all (about 100 us of work). */
#define ADAMW_BLOCK 4096
#define ADAMW_PAR_MIN (1 << 18)

/* param, grad any shape, same numel; out param is in param's buffer.
 * Torch's SGD with weight decay: g += wd * p; p += -lr * g. */
CK_CPU_KERNEL(ck_cpu_sgd_step)
{
    (void)nout, (void)nin;
    float *pw = out[0].data;
    const float *pr = in[0].data, *grad = in[1].data;
    const int64_t n = ck_view_numel(&in[0]);
    const float lr = ctx->lr * p->f[CK_OPT_LR_SCALE], wd = p->f[0];
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) pw[i] = pr[i] - lr * (grad[i] + wd * pr[i]);
}

/* AdamW's per-element constants, each rounded to float once. */
typedef struct adamw_k {
    float decay, w1, w1c, w2, beta2, neg_step, bc2_sqrt, eps;
    int lerp_low;
} adamw_k;

/* Elements [i0, i1) of one AdamW update, in torch's order of operations:
 * p = p * decay; m = lerp(m, g, w1); v = v * beta2 + (w2 * g) * g;
 * p = p + (neg_step * m) / (sqrt(v) / bc2_sqrt + eps). With AVX, eight lanes at
 * a time (libm's sqrtf keeps GCC from vectorizing the plain loop), and a short
 * tail through a padded copy, so every element takes the same instructions. */
#if defined(__AVX__)
static inline void adamw8(const adamw_k *k, float *pw, float *mw, float *vw, const float *pr, const float *grad,
                          const float *mr, const float *vr)
{
    const __m256 g = _mm256_loadu_ps(grad), m0 = _mm256_loadu_ps(mr), d = _mm256_sub_ps(g, m0);
    const __m256 m = k->lerp_low ? _mm256_add_ps(m0, _mm256_mul_ps(_mm256_set1_ps(k->w1), d))
                                 : _mm256_sub_ps(g, _mm256_mul_ps(d, _mm256_set1_ps(k->w1c)));
    const __m256 w2g = _mm256_mul_ps(_mm256_set1_ps(k->w2), g);
    const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(vr), _mm256_set1_ps(k->beta2)), _mm256_mul_ps(w2g, g));
    const __m256 den =
        _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(k->bc2_sqrt)), _mm256_set1_ps(k->eps));
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(pr), _mm256_set1_ps(k->decay));
    _mm256_storeu_ps(pw, _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(k->neg_step), m), den)));
    _mm256_storeu_ps(mw, m);
    _mm256_storeu_ps(vw, v);
}
#endif

static void adamw_run(const adamw_k *k, float *pw, float *mw, float *vw, const float *pr, const float *grad,
                      const float *mr, const float *vr, int64_t i0, int64_t i1)
{
#if defined(__AVX__)
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) adamw8(k, pw + i, mw + i, vw + i, pr + i, grad + i, mr + i, vr + i);
    if (i < i1) {
        float tp[8] = {0}, tg[8] = {0}, tm[8] = {0}, tv[8] = {0};
        const int64_t r = i1 - i;
        memcpy(tp, pr + i, (size_t)r * sizeof(float));
        memcpy(tg, grad + i, (size_t)r * sizeof(float));
        memcpy(tm, mr + i, (size_t)r * sizeof(float));
        memcpy(tv, vr + i, (size_t)r * sizeof(float));
        adamw8(k, tp, tm, tv, tp, tg, tm, tv);
        memcpy(pw + i, tp, (size_t)r * sizeof(float));
        memcpy(mw + i, tm, (size_t)r * sizeof(float));
        memcpy(vw + i, tv, (size_t)r * sizeof(float));
    }
#else
    for (int64_t i = i0; i < i1; i++) {
        const float g = grad[i], d = g - mr[i];
        const float m = k->lerp_low ? mr[i] + k->w1 * d : g - d * k->w1c;
        const float v = vr[i] * k->beta2 + k->w2 * g * g;
        const float den = sqrtf(v) / k->bc2_sqrt + k->eps;
        pw[i] = pr[i] * k->decay + k->neg_step * m / den;
        mw[i] = m;
        vw[i] = v;
    }
#endif
}

/* param, grad, m, v any shape, same numel; out param, m, v in the inputs' buffers.
 * torch.optim.AdamW (single-tensor path), t = ctx->update:
 *   p *= 1 - lr*wd;  m = lerp(m, g, 1 - b1);  v = v*b2 + (1 - b2)*g*g;
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) * m / denom.
 * Threads take whole blocks of ADAMW_BLOCK elements, so which elements run in
 * vector lanes does not depend on the thread count. */
CK_CPU_KERNEL(ck_cpu_adamw_step)
{
    (void)nout, (void)nin;
    float *pw = out[0].data, *mw = out[1].data, *vw = out[2].data;
    const float *pr = in[0].data, *grad = in[1].data, *mr = in[2].data, *vr = in[3].data;
    const int64_t n = ck_view_numel(&in[0]);
    const double lr = (double)ctx->lr * p->f[CK_OPT_LR_SCALE], b1 = p->f[0], b2 = p->f[1], wd = p->f[3];
    const double t = (double)(ctx->update > 0 ? ctx->update : 1);
    adamw_k k;
    k.decay = (float)(1.0 - lr * wd);
    k.w1 = (float)(1.0 - b1);
    k.w1c = 1.0f - k.w1;
    k.w2 = (float)(1.0 - b2);
    k.beta2 = p->f[1];
    k.neg_step = (float)(-(lr / (1.0 - pow(b1, t))));
    k.bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    k.eps = p->f[2];
    /* torch's lerp switches form at weight 0.5 to stay exact at weight 1. */
    k.lerp_low = fabsf(k.w1) < 0.5f;
    const int64_t nb = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
#pragma omp parallel for schedule(static) if (n > ADAMW_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i0 = b * ADAMW_BLOCK, i1 = i0 + ADAMW_BLOCK < n ? i0 + ADAMW_BLOCK : n;
        adamw_run(&k, pw, mw, vw, pr, grad, mr, vr, i0, i1);
    }
}

// s is a scalar (summed squares); out is a scalar: torch's clip_grad_norm_
// factor, total_norm = sqrt(s), clamp(max_norm / (total_norm + 1e-6), max=1), in fp32
CK_CPU_KERNEL(ck_cpu_clip_factor)
{
    (void)ctx, (void)nout, (void)nin;
    const float norm = sqrtf(in[0].data[0]), coef = p->f[0] / (norm + 1e-6f);
    out[0].data[0] = coef < 1.0f ? coef : 1.0f;
}

/* param, grad, m any shape, same numel; out param, m in the inputs' buffers.
 * Lion as lion-pytorch: p *= 1 - lr*wd; c = m*b1 + g*(1 - b1); p += -lr * sign(c);
 * m = m*b2 + g*(1 - b2); sign(0) = 0, a NaN stays NaN. */
CK_CPU_KERNEL(ck_cpu_lion_step)
{
    (void)nout, (void)nin;
    float *pw = out[0].data, *mw = out[1].data;
    const float *pr = in[0].data, *grad = in[1].data, *mr = in[2].data;
    const int64_t n = ck_view_numel(&in[0]);
    const float b1 = p->f[0], b2 = p->f[1], w1 = (float)(1.0 - p->f[0]), w2 = (float)(1.0 - p->f[1]);
    const float lr = ctx->lr * p->f[CK_OPT_LR_SCALE];
    const float decay = (float)(1.0 - (double)lr * p->f[2]), neg_lr = -lr;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = grad[i], m = mr[i], c = m * b1 + g * w1;
        const float s = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c; /* c: 0 or NaN as they are */
        pw[i] = pr[i] * decay + neg_lr * s;
        mw[i] = m * b2 + g * w2;
    }
}

/* the 8-bit codes, made when the library loads */
static ck_adam8_maps adam8_maps;

__attribute__((constructor)) static void adam8_maps_init(void) { ck_adam8_maps_make(&adam8_maps); }

/* param, grad any shape (n values); q [2n] bytes, s [2 nb] scales; out param,
 * q, s in the inputs' buffers. AdamW8bit as ops/ops.h says: each block on its
 * own, in fp32, the same arithmetic as the GPU's. */
CK_CPU_KERNEL(ck_cpu_adamw8_step)
{
    (void)nout, (void)nin;
    float *pw = out[0].data, *sw = out[2].data;
    uint8_t *q = (uint8_t *)out[1].data;
    const float *pr = in[0].data, *grad = in[1].data;
    const int64_t n = ck_view_numel(&in[0]), nb = (n + CK_ADAM8_BLOCK - 1) / CK_ADAM8_BLOCK;
    const ck_adam8_step s = ck_adam8_step_of(ctx, p);
    const ck_adam8_maps *mp = &adam8_maps;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i0 = b * CK_ADAM8_BLOCK, i1 = i0 + CK_ADAM8_BLOCK < n ? i0 + CK_ADAM8_BLOCK : n;
        const float sm = sw[b], sv = sw[nb + b];
        float m[CK_ADAM8_BLOCK], v[CK_ADAM8_BLOCK], mm = 0.0f, mv = 0.0f;
        for (int64_t i = i0; i < i1; i++) {
            float *mi = &m[i - i0], *vi = &v[i - i0];
            pw[i] = ck_adam8_update(&s, pr[i], grad[i], mp->m[q[i]] * sm, mp->v[q[n + i]] * sv, mi, vi);
            mm = fmaxf(mm, fabsf(*mi)), mv = fmaxf(mv, *vi);
        }
        sw[b] = mm, sw[nb + b] = mv;
        for (int64_t i = i0; i < i1; i++) {
            q[i] = ck_adam8_quantize(mp->m, mm > 0.0f ? m[i - i0] / mm : 0.0f);
            q[n + i] = ck_adam8_quantize(mp->v, mv > 0.0f ? v[i - i0] / mv : 0.0f);
        }
    }
}
