/* Optimizer steps on the GPU, updating parameters and moments in place (out[k]
 * is the same buffer as the matching input). The scalars are formed in double
 * and rounded where torch.optim rounds them, by the formulas ops/cpu/optim.c
 * uses; the per-element order follows torch's. The learning rate and the
 * update count are read on the device from the step block (graph.cu), so a
 * replayed graph uses each step's; the scalars that depend on them are formed
 * there, by each thread, before its loop. */
#include "common.cuh"
#include "../adam8.h"

#define THREADS 256

__global__ void __launch_bounds__(THREADS) sgd_kernel(float *pw, const float *pr, const float *g,
                                                      const ck_cuda_step *st, float lr_scale, float wd, int64_t n)
{
    const float lr = st->lr * lr_scale;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        pw[i] = pr[i] - lr * (g[i] + wd * pr[i]);
}

/* param, grad any shape, same numel; out param is in param's buffer.
 * Torch's SGD with weight decay: g += wd * p; p += -lr * g. */
extern "C" CK_CUDA_KERNEL(ck_cuda_sgd_step)
{
    (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("sgd_step");
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]);
    const ck_cuda_step *st = ck_cuda_step_of(c, ctx, "sgd_step");
    if (n == 0 || !st) return;
    ck_launch(sgd_kernel, ck_grid(n, THREADS), THREADS, c->stream, out[0].data, (const float *)in[0].data,
              (const float *)in[1].data, st, p->f[CK_OPT_LR_SCALE], p->f[0], n);
    ck_cuda_end(c, "sgd_step");
}

struct adamw_scalars {
    float decay, w1, w1c, w2, beta2, neg_step, bc2_sqrt, eps;
    int lerp_low;
};

/* t = ctx->update */
static __device__ adamw_scalars adamw_of(const ck_kctx *ctx, const ck_op_params *p)
{
    const double lr = (double)ctx->lr * p->f[CK_OPT_LR_SCALE], b1 = p->f[0], b2 = p->f[1], wd = p->f[3];
    const double t = (double)(ctx->update > 0 ? ctx->update : 1);
    adamw_scalars s;
    s.eps = p->f[2];
    s.beta2 = p->f[1];
    s.decay = (float)(1.0 - lr * wd);
    s.w1 = (float)(1.0 - b1);
    s.w2 = (float)(1.0 - b2);
    s.neg_step = (float)(-(lr / (1.0 - pow(b1, t))));
    s.bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    /* torch's lerp switches form at weight 0.5 to stay exact at weight 1 */
    s.lerp_low = fabsf(s.w1) < 0.5f;
    s.w1c = 1.0f - s.w1;
    return s;
}

__global__ void __launch_bounds__(THREADS) adamw_kernel(float *pw, float *mw, float *vw, const float *pr,
                                                        const float *grad, const float *mr, const float *vr,
                                                        const ck_cuda_step *st, ck_op_params p, int64_t n)
{
    const ck_kctx k = ck_cuda_kctx(st);
    const adamw_scalars s = adamw_of(&k, &p);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = grad[i], m0 = mr[i];
        const float m = s.lerp_low ? m0 + s.w1 * (g - m0) : g - (g - m0) * s.w1c;
        const float v = vr[i] * s.beta2 + s.w2 * g * g;
        const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
        pw[i] = pr[i] * s.decay + s.neg_step * m / denom;
        mw[i] = m;
        vw[i] = v;
    }
}

/* param, grad, m, v any shape, same numel; out param, m, v in the inputs' buffers.
 * torch.optim.AdamW (single-tensor path), t = ctx->update:
 *   p *= 1 - lr*wd;  m = lerp(m, g, 1 - b1);  v = v*b2 + (1 - b2)*g*g;
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += (-lr / (1 - b1^t)) * m / denom. */
extern "C" CK_CUDA_KERNEL(ck_cuda_adamw_step)
{
    (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("adamw_step");
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]);
    const ck_cuda_step *st = ck_cuda_step_of(c, ctx, "adamw_step");
    if (n == 0 || !st) return;
    ck_launch(adamw_kernel, ck_grid(n, THREADS), THREADS, c->stream, out[0].data, out[1].data, out[2].data,
              (const float *)in[0].data, (const float *)in[1].data, (const float *)in[2].data,
              (const float *)in[3].data, st, *p, n);
    ck_cuda_end(c, "adamw_step");
}

__global__ void clip_factor_kernel(float *y, const float *s, float max_norm)
{
    const float coef = max_norm / (sqrtf(s[0]) + 1e-6f);
    y[0] = coef < 1.0f ? coef : 1.0f;
}

// s is a scalar (summed squares); out is a scalar: as ops/cpu/optim.c
extern "C" CK_CUDA_KERNEL(ck_cuda_clip_factor)
{
    (void)ctx, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("clip_factor");
    if (!c) return;
    ck_launch(clip_factor_kernel, 1, 1, c->stream, out[0].data, (const float *)in[0].data, p->f[0]);
    ck_cuda_end(c, "clip_factor");
}

__global__ void __launch_bounds__(THREADS) lion_kernel(float *pw, float *mw, const float *pr, const float *grad,
                                                       const float *mr, float b1, float b2, float w1, float w2,
                                                       const ck_cuda_step *st, float lr_scale, float wd, int64_t n)
{
    const float lr = st->lr * lr_scale, decay = (float)(1.0 - (double)lr * wd), neg_lr = -lr;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = grad[i], m = mr[i], c = m * b1 + g * w1;
        const float s = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c;
        pw[i] = pr[i] * decay + neg_lr * s;
        mw[i] = m * b2 + g * w2;
    }
}

/* param, grad, m any shape, same numel; out param, m in the inputs' buffers:
 * Lion as ops/cpu/optim.c */
extern "C" CK_CUDA_KERNEL(ck_cuda_lion_step)
{
    (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("lion_step");
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]);
    const ck_cuda_step *st = ck_cuda_step_of(c, ctx, "lion_step");
    if (n == 0 || !st) return;
    const float w1 = (float)(1.0 - p->f[0]), w2 = (float)(1.0 - p->f[1]);
    ck_launch(lion_kernel, ck_grid(n, THREADS), THREADS, c->stream, out[0].data, out[1].data, (const float *)in[0].data,
              (const float *)in[1].data, (const float *)in[2].data, p->f[0], p->f[1], w1, w2, st,
              p->f[CK_OPT_LR_SCALE], p->f[2], n);
    ck_cuda_end(c, "lion_step");
}

/* one thread block per quantization block, one thread per value */
__global__ void __launch_bounds__(CK_ADAM8_BLOCK) adamw8_kernel(float *pw, uint8_t *q, float *sw, const float *pr,
                                                                const float *grad, int64_t n, int64_t nb,
                                                                const ck_cuda_step *st, ck_op_params p, ck_adam8_maps mp)
{
    __shared__ float sh[33];
    const ck_kctx k = ck_cuda_kctx(st);
    const ck_adam8_step s = ck_adam8_step_of(&k, &p);
    const int64_t b = blockIdx.x, i = b * CK_ADAM8_BLOCK + threadIdx.x;
    const bool here = i < n;
    float m = 0.0f, v = 0.0f;
    if (here) pw[i] = ck_adam8_update(&s, pr[i], grad[i], mp.m[q[i]] * sw[b], mp.v[q[n + i]] * sw[nb + b], &m, &v);
    /* the scales are read above, before the reductions' barriers; written below */
    const float mm = ck_block_max(here ? fabsf(m) : 0.0f, sh), mv = ck_block_max(here ? v : 0.0f, sh);
    if (threadIdx.x == 0) sw[b] = mm, sw[nb + b] = mv;
    if (here) {
        q[i] = ck_adam8_quantize(mp.m, mm > 0.0f ? m / mm : 0.0f);
        q[n + i] = ck_adam8_quantize(mp.v, mv > 0.0f ? v / mv : 0.0f);
    }
}

/* param, grad any shape (n values); q [2n] bytes, s [2 nb] scales; out param,
 * q, s in the inputs' buffers: AdamW8bit as ops/cpu/optim.c */
extern "C" CK_CUDA_KERNEL(ck_cuda_adamw8_step)
{
    (void)nout, (void)nin;
    static const ck_adam8_maps maps = [] {
        ck_adam8_maps m;
        ck_adam8_maps_make(&m);
        return m;
    }();
    ck_cuda_ctx *c = ck_cuda_begin("adamw8_step");
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]), nb = (n + CK_ADAM8_BLOCK - 1) / CK_ADAM8_BLOCK;
    const ck_cuda_step *st = ck_cuda_step_of(c, ctx, "adamw8_step");
    if (n == 0 || !st) return;
    ck_launch(adamw8_kernel, (unsigned)nb, CK_ADAM8_BLOCK, c->stream, out[0].data, (uint8_t *)out[1].data,
              out[2].data, (const float *)in[0].data, (const float *)in[1].data, n, nb, st, *p, maps);
    ck_cuda_end(c, "adamw8_step");
}
