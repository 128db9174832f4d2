/* Activations on the CPU: SiLU, GELU (erf or tanh form), GEGLU, Mish and softmax
 * over the last dim, forward and backward. Each output comes from one thread in a fixed
 * order; exp and erf are inline polynomials so the loops vectorize (libm's do not). */
#include "cpu.h"
#include "vecmath.h"

#include <stdint.h>
#include <string.h>

#define SQRT1_2 0.70710678118654752440f     /* 1/sqrt(2) */
#define INV_SQRT_2PI 0.39894228040143267794f /* 1/sqrt(2 pi) */
#define SQRT_2_PI 0.79788456080286535588f    /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f

/* Elementwise loops with transcendentals pay for threads earlier than plain
 * arithmetic does (SiLU: ~0.45 ns an element on one core; a parallel region
 * costs tens of microseconds). */
#define PAR_MIN 65536

/* erf(x) within ~5e-7 absolute (Eigen's rational fit on [-4, 4]; beyond, erf is
 * +-1 in float). NaN comes out as +-1: every caller multiplies by x, which
 * carries the NaN through. */
static inline float erf_c(float x)
{
    const uint32_t u = bits_of(x), a = u & 0x7fffffffu;
    const float xc = float_of((a < 0x40800000u ? a : 0x40800000u) | (u & 0x80000000u));
    const float x2 = xc * xc;
    float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = x2 * p + -2.10102402082508e-06f;
    p = x2 * p + -5.69250639462346e-05f;
    p = x2 * p + -7.34990630326855e-04f;
    p = x2 * p + -2.95459980854025e-03f;
    p = x2 * p + -1.60960333262415e-02f;
    float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
    q = x2 * q + -1.68282697438203e-03f;
    q = x2 * q + -7.37332916720468e-03f;
    q = x2 * q + -1.42647390514189e-02f;
    return xc * p / q;
}

static inline float gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erf_c(x * SQRT1_2));
}

/* 0.5 (1 + tanh(u)) is sigmoid(2u), which has no cancellation. */
static inline float gelu_tanh(float x)
{
    return x * sigmoid_c(2.0f * SQRT_2_PI * (x + GELU_KAPPA * x * x * x));
}

static inline float gelu_erf_grad(float x)
{
    return 0.5f * (1.0f + erf_c(x * SQRT1_2)) + x * INV_SQRT_2PI * exp_c(-0.5f * x * x);
}

/* With s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3 kappa x^2): d/dx [x s] = s + 2 x s (1 - s) u',
 * torch's 0.5 (1 + t) + 0.5 x (1 - t^2) u' rewritten. */
static inline float gelu_tanh_grad(float x)
{
    const float x2 = x * x;
    const float s = sigmoid_c(2.0f * SQRT_2_PI * (x + GELU_KAPPA * x2 * x));
    return s + 2.0f * x * s * (1.0f - s) * SQRT_2_PI * (1.0f + 3.0f * GELU_KAPPA * x2);
}

/* Mish (torch.nn.functional.mish): x tanh(softplus(x)). With e = e^x and
 * n = e (e + 2), tanh(log(1 + e)) = n / (n + 2), and 1 - tanh^2 = 4 (n + 1) / (n + 2)^2
 * without cancellation. Above x = 20 tanh(softplus(x)) is 1 in float (torch's
 * softplus threshold), so e is taken at min(x, 20) and n never overflows. */
static inline float mish_c(float x)
{
    const float e = exp_c(x > 20.0f ? 20.0f : x), n = e * (e + 2.0f);
    return x * (n / (n + 2.0f));
}

/* d/dx [x t] = t + x (1 - t^2) sigmoid(x), t = tanh(softplus(x)); above 20 it is 1 */
static inline float mish_grad(float x)
{
    const float xc = x > 20.0f ? 20.0f : x; /* NaN stays NaN */
    const float e = exp_c(xc), n = e * (e + 2.0f), d = n + 2.0f;
    return n / d + xc * (4.0f * (n + 1.0f) / (d * d)) * (e / (1.0f + e));
}

// x is any shape; y is like x.
CK_CPU_KERNEL(ck_cpu_silu)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *x = in[0].data;
    float *y = out[0].data;
    const int64_t n = ck_view_numel(&in[0]);
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * sigmoid_c(x[i]);
}

// dy and x are any shape (the same); dx is like x.
CK_CPU_KERNEL(ck_cpu_silu_bwd)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *dy = in[0].data, *x = in[1].data;
    float *dx = out[0].data;
    const int64_t n = ck_view_numel(&in[1]);
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float s = sigmoid_c(x[i]);
        dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

// x is any shape; y is like x.
CK_CPU_KERNEL(ck_cpu_gelu)
{
    (void)ctx, (void)nout, (void)nin;
    const float *x = in[0].data;
    float *y = out[0].data;
    const int64_t n = ck_view_numel(&in[0]);
    // One loop per form: a branch inside would stop the loop vectorizing.
    if (p->i[0]) {
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) y[i] = gelu_tanh(x[i]);
    } else {
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) y[i] = gelu_erf(x[i]);
    }
}

// dy and x are any shape (the same); dx is like x.
CK_CPU_KERNEL(ck_cpu_gelu_bwd)
{
    (void)ctx, (void)nout, (void)nin;
    const float *dy = in[0].data, *x = in[1].data;
    float *dx = out[0].data;
    const int64_t n = ck_view_numel(&in[1]);
    if (p->i[0]) {
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
    } else {
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * gelu_erf_grad(x[i]);
    }
}

// x is any shape; y is like x.
CK_CPU_KERNEL(ck_cpu_mish)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *x = in[0].data;
    float *y = out[0].data;
    const int64_t n = ck_view_numel(&in[0]);
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = mish_c(x[i]);
}

// dy and x are any shape (the same); dx is like x.
CK_CPU_KERNEL(ck_cpu_mish_bwd)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *dy = in[0].data, *x = in[1].data;
    float *dx = out[0].data;
    const int64_t n = ck_view_numel(&in[1]);
#pragma omp parallel for simd schedule(static) if (parallel: n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * mish_grad(x[i]);
}

// x is (..,2D): hidden = x[..,:D], gate = x[..,D:]; y is (..,D) = hidden * gelu(gate).
CK_CPU_KERNEL(ck_cpu_geglu)
{
    (void)ctx, (void)nout, (void)nin;
    const float *x = in[0].data;
    float *y = out[0].data;
    const int64_t D = out[0].shape[out[0].ndim - 1];
    if (D == 0) return;
    const int64_t R = ck_view_numel(&out[0]) / D;
    const int approx = p->i[0] != 0;
#pragma omp parallel for schedule(static) if (R * D > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *h = x + r * 2 * D, *g = h + D;
        float *yr = y + r * D;
        if (approx) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = h[j] * gelu_tanh(g[j]);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = h[j] * gelu_erf(g[j]);
        }
    }
}

// dy is (..,D), x is (..,2D); dx is (..,2D).
CK_CPU_KERNEL(ck_cpu_geglu_bwd)
{
    (void)ctx, (void)nout, (void)nin;
    const float *dy = in[0].data, *x = in[1].data;
    float *dx = out[0].data;
    const int64_t D = in[0].shape[in[0].ndim - 1];
    if (D == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / D;
    const int approx = p->i[0] != 0;
#pragma omp parallel for schedule(static) if (R * D > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *h = x + r * 2 * D, *g = h + D, *dyr = dy + r * D;
        float *dh = dx + r * 2 * D, *dg = dh + D;
        if (approx) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) {
                dh[j] = dyr[j] * gelu_tanh(g[j]);
                dg[j] = dyr[j] * h[j] * gelu_tanh_grad(g[j]);
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) {
                dh[j] = dyr[j] * gelu_erf(g[j]);
                dg[j] = dyr[j] * h[j] * gelu_erf_grad(g[j]);
            }
        }
    }
}

// x is (..,C); y is like x, each row of C a softmax.
CK_CPU_KERNEL(ck_cpu_softmax)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *x = in[0].data;
    float *y = out[0].data;
    const int64_t C = in[0].shape[in[0].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / C;
#pragma omp parallel for schedule(static) if (R * C > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C;
        const float mx = max_c(xr, C);
#pragma omp simd
        for (int64_t c = 0; c < C; c++) yr[c] = exp_c(xr[c] - mx);
        const float inv = (float)(1.0 / ck_cpu_dot8(yr, NULL, C));
#pragma omp simd
        for (int64_t c = 0; c < C; c++) yr[c] *= inv;
    }
}

// dy and y (the forward output) are (..,C); dx is like y: y * (dy - sum(dy * y)) per row.
CK_CPU_KERNEL(ck_cpu_softmax_bwd)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const float *dy = in[0].data, *y = in[1].data;
    float *dx = out[0].data;
    const int64_t C = in[1].shape[in[1].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[1]) / C;
#pragma omp parallel for schedule(static) if (R * C > 32768)
    for (int64_t r = 0; r < R; r++) {
        const float *dyr = dy + r * C, *yr = y + r * C;
        float *dxr = dx + r * C;
        const float s = (float)ck_cpu_dot8(dyr, yr, C);
#pragma omp simd
        for (int64_t c = 0; c < C; c++) dxr[c] = yr[c] * (dyr[c] - s);
    }
}

/* ---- 16-bit storage (bf16 or fp16, st): every tensor of that type,
 * arithmetic in fp32 ----
 * The same functions over blocks of BLK values converted to fp32 on the
 * stack; each output is rounded to the storage type once. */

#define BLK 256

/* y = f(a[, b]) elementwise on a block of m fp32 values; flag: the op's i[0] */
typedef void (*block_fn)(float *y, const float *a, const float *b, int64_t m, int flag);

static void silu_blk(float *y, const float *x, const float *unused, int64_t m, int flag)
{
    (void)unused, (void)flag;
#pragma omp simd
    for (int64_t i = 0; i < m; i++) y[i] = x[i] * sigmoid_c(x[i]);
}

static void silu_bwd_blk(float *dx, const float *dy, const float *x, int64_t m, int flag)
{
    (void)flag;
#pragma omp simd
    for (int64_t i = 0; i < m; i++) {
        const float s = sigmoid_c(x[i]);
        dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

static void gelu_blk(float *y, const float *x, const float *unused, int64_t m, int approx)
{
    (void)unused;
    if (approx) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) y[i] = gelu_tanh(x[i]);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) y[i] = gelu_erf(x[i]);
    }
}

static void gelu_bwd_blk(float *dx, const float *dy, const float *x, int64_t m, int approx)
{
    if (approx) {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
    } else {
#pragma omp simd
        for (int64_t i = 0; i < m; i++) dx[i] = dy[i] * gelu_erf_grad(x[i]);
    }
}

static void mish_blk(float *y, const float *x, const float *unused, int64_t m, int flag)
{
    (void)unused, (void)flag;
#pragma omp simd
    for (int64_t i = 0; i < m; i++) y[i] = mish_c(x[i]);
}

static void mish_bwd_blk(float *dx, const float *dy, const float *x, int64_t m, int flag)
{
    (void)flag;
#pragma omp simd
    for (int64_t i = 0; i < m; i++) dx[i] = dy[i] * mish_grad(x[i]);
}

// y (n) = f(a (n)[, b (n)]), in blocks
static void map16(ck_dtype st, block_fn f, uint16_t *y, const uint16_t *a, const uint16_t *b, int64_t n, int flag)
{
    const int64_t nb = (n + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t k = 0; k < nb; k++) {
        float ya[BLK], aa[BLK], ba[BLK];
        const int64_t o = k * BLK, m = n - o < BLK ? n - o : BLK;
        ck_cpu_load16(st, aa, a + o, m);
        if (b) ck_cpu_load16(st, ba, b + o, m);
        f(ya, aa, ba, m, flag);
        ck_cpu_store16(st, y + o, ya, m);
    }
}

/* an elementwise op: y = f(in[0][, in[1]]) over the numel of in[binary] */
#define MAP_ENTRIES(op, f, binary)                                                                                   \
    static void op##_16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in)                       \
    {                                                                                                                \
        map16(st, f, (uint16_t *)out[0].data, (const uint16_t *)in[0].data,                                         \
              binary ? (const uint16_t *)in[1].data : NULL, ck_view_numel(&in[binary]), p->i[0] != 0);               \
    }                                                                                                                \
    CK_CPU_ENTRIES16(op, op##_16(st, p, out, in))
MAP_ENTRIES(silu, silu_blk, 0)
MAP_ENTRIES(silu_bwd, silu_bwd_blk, 1)
MAP_ENTRIES(gelu, gelu_blk, 0)
MAP_ENTRIES(gelu_bwd, gelu_bwd_blk, 1)
MAP_ENTRIES(mish, mish_blk, 0)
MAP_ENTRIES(mish_bwd, mish_bwd_blk, 1)

// x is (..,2D); y is (..,D) = hidden * gelu(gate), a row's D in blocks
static void geglu_16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    const uint16_t *x = (const uint16_t *)in[0].data;
    uint16_t *y = (uint16_t *)out[0].data;
    const int64_t D = out[0].shape[out[0].ndim - 1];
    if (D == 0) return;
    const int64_t R = ck_view_numel(&out[0]) / D;
    const int approx = p->i[0] != 0;
#pragma omp parallel for schedule(static) if (R * D > PAR_MIN)
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < D; j += BLK) {
            float h[BLK], g[BLK], yb[BLK];
            const int64_t m = D - j < BLK ? D - j : BLK;
            ck_cpu_load16(st, h, x + r * 2 * D + j, m);
            ck_cpu_load16(st, g, x + r * 2 * D + D + j, m);
            gelu_blk(yb, g, NULL, m, approx);
#pragma omp simd
            for (int64_t i = 0; i < m; i++) yb[i] *= h[i];
            ck_cpu_store16(st, y + r * D + j, yb, m);
        }
}

// dy is (..,D), x is (..,2D); dx is (..,2D)
static void geglu_bwd_16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    const uint16_t *dy = (const uint16_t *)in[0].data, *x = (const uint16_t *)in[1].data;
    uint16_t *dx = (uint16_t *)out[0].data;
    const int64_t D = in[0].shape[in[0].ndim - 1];
    if (D == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / D;
    const int approx = p->i[0] != 0;
#pragma omp parallel for schedule(static) if (R * D > PAR_MIN)
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < D; j += BLK) {
            float h[BLK], g[BLK], d[BLK], dh[BLK], dg[BLK];
            const int64_t m = D - j < BLK ? D - j : BLK;
            ck_cpu_load16(st, h, x + r * 2 * D + j, m);
            ck_cpu_load16(st, g, x + r * 2 * D + D + j, m);
            ck_cpu_load16(st, d, dy + r * D + j, m);
            gelu_blk(dh, g, NULL, m, approx);
            // dg = (dy * h) * gelu'(g), the fp32 kernel's order (dy * gelu'(g) first rounds differently)
#pragma omp simd
            for (int64_t i = 0; i < m; i++) {
                dh[i] *= d[i];
                h[i] *= d[i];
            }
            gelu_bwd_blk(dg, h, g, m, approx);
            ck_cpu_store16(st, dx + r * 2 * D + j, dh, m);
            ck_cpu_store16(st, dx + r * 2 * D + D + j, dg, m);
        }
}

// x is (..,C); y like x: per row the max, then the sum of exp in double, then y
// (exp computed twice rather than kept: a row may be longer than any stack block)
static void softmax_16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    const uint16_t *x = (const uint16_t *)in[0].data;
    uint16_t *y = (uint16_t *)out[0].data;
    const int64_t C = in[0].shape[in[0].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[0]) / C;
#pragma omp parallel for schedule(static) if (R * C > PAR_MIN)
    for (int64_t r = 0; r < R; r++) {
        const uint16_t *xr = x + r * C;
        uint16_t *yr = y + r * C;
        float b[BLK], mx = ck_cpu_f32_of16(st, xr[0]);
        double sum = 0;
        for (int64_t j = 0; j < C; j += BLK) {
            const int64_t m = C - j < BLK ? C - j : BLK;
            ck_cpu_load16(st, b, xr + j, m);
            const float bm = max_c(b, m);
            mx = bm > mx ? bm : mx;
        }
        for (int64_t j = 0; j < C; j += BLK) {
            const int64_t m = C - j < BLK ? C - j : BLK;
            ck_cpu_load16(st, b, xr + j, m);
#pragma omp simd
            for (int64_t c = 0; c < m; c++) b[c] = exp_c(b[c] - mx);
            sum += ck_cpu_dot8(b, NULL, m);
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < C; j += BLK) {
            const int64_t m = C - j < BLK ? C - j : BLK;
            ck_cpu_load16(st, b, xr + j, m);
#pragma omp simd
            for (int64_t c = 0; c < m; c++) b[c] = exp_c(b[c] - mx) * inv;
            ck_cpu_store16(st, yr + j, b, m);
        }
    }
}

// dy and y are (..,C); dx = y * (dy - sum(dy * y)) per row
static void softmax_bwd_16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    const uint16_t *dy = (const uint16_t *)in[0].data, *y = (const uint16_t *)in[1].data;
    uint16_t *dx = (uint16_t *)out[0].data;
    const int64_t C = in[1].shape[in[1].ndim - 1];
    if (C == 0) return;
    const int64_t R = ck_view_numel(&in[1]) / C;
#pragma omp parallel for schedule(static) if (R * C > 32768)
    for (int64_t r = 0; r < R; r++) {
        const uint16_t *dyr = dy + r * C, *yr = y + r * C;
        float a[BLK], b[BLK];
        double s = 0;
        for (int64_t j = 0; j < C; j += BLK) {
            const int64_t m = C - j < BLK ? C - j : BLK;
            ck_cpu_load16(st, a, dyr + j, m);
            ck_cpu_load16(st, b, yr + j, m);
            s += ck_cpu_dot8(a, b, m);
        }
        const float sf = (float)s;
        for (int64_t j = 0; j < C; j += BLK) {
            const int64_t m = C - j < BLK ? C - j : BLK;
            ck_cpu_load16(st, a, dyr + j, m);
            ck_cpu_load16(st, b, yr + j, m);
#pragma omp simd
            for (int64_t c = 0; c < m; c++) a[c] = b[c] * (a[c] - sf);
            ck_cpu_store16(st, dx + r * C + j, a, m);
        }
    }
}

CK_CPU_ENTRIES16(geglu, geglu_16(st, p, out, in))
CK_CPU_ENTRIES16(geglu_bwd, geglu_bwd_16(st, p, out, in))
CK_CPU_ENTRIES16(softmax, softmax_16(st, p, out, in))
CK_CPU_ENTRIES16(softmax_bwd, softmax_bwd_16(st, p, out, in))
