/* Optimizer steps, updating parameters and moments in place (out[k] is the same
 * buffer as the matching input). Scalars are formed in double and rounded to float
 * where torch.optim rounds them, and the per-element order follows torch's. */
#include "cpu.h"

#include <math.h>

/* Below this many elements one thread beats waking the pool. */
#define PAR_MIN 32768

/* param, grad any shape, same numel; out param is in param's buffer.
 * Torch's SGD with weight decay: g += wd * p; p += -lr * g. */
CK_CPU_KERNEL(ck_cpu_sgd_step)
{
    (void)nout, (void)nin;
    float *pw = out[0].data;
    const float *pr = in[0].data, *grad = in[1].data;
    const int64_t n = ck_view_numel(&in[0]);
    const float lr = ctx->lr, wd = p->f[0];
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) pw[i] = pr[i] - lr * (grad[i] + wd * pr[i]);
}

/* param, grad, m, v any shape, same numel; out param, m, v in the inputs' buffers.
 * torch.optim.AdamW (single-tensor path), t = ctx->step:
 *   p *= 1 - lr*wd;  m = lerp(m, g, 1 - b1);  v = v*b2 + (1 - b2)*g*g;
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) * m / denom. */
CK_CPU_KERNEL(ck_cpu_adamw_step)
{
    (void)nout, (void)nin;
    float *pw = out[0].data, *mw = out[1].data, *vw = out[2].data;
    const float *pr = in[0].data, *grad = in[1].data, *mr = in[2].data, *vr = in[3].data;
    const int64_t n = ck_view_numel(&in[0]);
    const double lr = ctx->lr, b1 = p->f[0], b2 = p->f[1], wd = p->f[3];
    const double t = (double)(ctx->step > 0 ? ctx->step : 1);
    const float eps = p->f[2], beta2 = p->f[1];
    const float decay = (float)(1.0 - lr * wd);
    const float w1 = (float)(1.0 - b1), w2 = (float)(1.0 - b2);
    const float neg_step = (float)(-(lr / (1.0 - pow(b1, t))));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    /* torch's lerp switches form at weight 0.5 to stay exact at weight 1. */
    const int lerp_low = fabsf(w1) < 0.5f;
    const float w1c = 1.0f - w1;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = grad[i];
        const float m = lerp_low ? mr[i] + w1 * (g - mr[i]) : g - (g - mr[i]) * w1c;
        const float v = vr[i] * beta2 + w2 * g * g;
        const float denom = sqrtf(v) / bc2_sqrt + eps;
        pw[i] = pr[i] * decay + neg_step * m / denom;
        mw[i] = m;
        vw[i] = v;
    }
}
