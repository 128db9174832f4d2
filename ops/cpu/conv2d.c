/* 2-D convolution on the CPU (NCHW, zero padding, any kernel and stride):
 * forward, data gradient and filter/bias gradient, each as per-image im2col
 * (or col2im) into ctx->ws around one OpenBLAS sgemm. */
#include "cpu.h"

#include <assert.h>
#include <cblas.h>
#include <string.h>

typedef struct conv_geom {
    int64_t N, C, H, W, O, KH, KW, HO, WO;
    int64_t sh, sw, ph, pw;
    int64_t ckk, howo; /* rows and columns of the column matrix */
    int direct;        /* 1x1, stride 1, no padding: the image is its own column matrix */
} conv_geom;

static conv_geom geom(const ck_op_params *p, const ck_view *x, const ck_view *w, const ck_view *y)
{
    conv_geom g;
    g.N = x->shape[0], g.C = x->shape[1], g.H = x->shape[2], g.W = x->shape[3];
    g.O = w->shape[0], g.KH = w->shape[2], g.KW = w->shape[3];
    g.HO = y->shape[2], g.WO = y->shape[3];
    g.sh = p->i[0], g.sw = p->i[1], g.ph = p->i[2], g.pw = p->i[3];
    g.ckk = g.C * g.KH * g.KW, g.howo = g.HO * g.WO;
    g.direct = g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
    return g;
}

/* The output columns wo in [*lo, *hi) whose input column wo*sw - pw + kw lies
 * inside the image; the rest read zero padding. */
static void valid_cols(const conv_geom *g, int64_t kw, int64_t *lo, int64_t *hi)
{
    int64_t first = g->pw - kw, last = g->W - 1 + g->pw - kw;
    int64_t l = first > 0 ? (first + g->sw - 1) / g->sw : 0;
    int64_t h = last < 0 ? 0 : last / g->sw + 1;
    if (l > g->WO) l = g->WO;
    if (h > g->WO) h = g->WO;
    if (h < l) h = l;
    *lo = l, *hi = h;
}

// xn is (C,H,W); col is (C*KH*KW, HO*WO), row (c,kh,kw) holding x[c, ho*sh-ph+kh, wo*sw-pw+kw].
static void im2col(const conv_geom *g, const float *xn, float *col)
{
    const int64_t KK = g->KH * g->KW;
#pragma omp parallel for schedule(static) if (g->ckk * g->howo > 32768)
    for (int64_t r = 0; r < g->ckk; r++) {
        const int64_t c = r / KK, kh = (r % KK) / g->KW, kw = r % g->KW;
        const float *plane = xn + c * g->H * g->W;
        float *dst = col + r * g->howo;
        int64_t lo, hi;
        valid_cols(g, kw, &lo, &hi);
        const int64_t off = kw - g->pw;
        for (int64_t ho = 0; ho < g->HO; ho++, dst += g->WO) {
            const int64_t ih = ho * g->sh - g->ph + kh;
            if (ih < 0 || ih >= g->H) {
                memset(dst, 0, (size_t)g->WO * sizeof(float));
                continue;
            }
            const float *src = plane + ih * g->W;
            for (int64_t wo = 0; wo < lo; wo++) dst[wo] = 0.0f;
            if (g->sw == 1) {
                memcpy(dst + lo, src + lo + off, (size_t)(hi - lo) * sizeof(float));
            } else {
                const int64_t sw = g->sw;
                for (int64_t wo = lo; wo < hi; wo++) dst[wo] = src[wo * sw + off];
            }
            for (int64_t wo = hi; wo < g->WO; wo++) dst[wo] = 0.0f;
        }
    }
}

// col is (C*KH*KW, HO*WO); dxn is (C,H,W), overwritten with the sum of the col
// entries that im2col would have read from each pixel.
static void col2im(const conv_geom *g, const float *col, float *dxn)
{
    const int64_t KK = g->KH * g->KW, HW = g->H * g->W;
    // One thread owns each channel plane, and adds its KH*KW rows in a fixed
    // order, so the sums do not depend on the thread count.
#pragma omp parallel for schedule(static) if (g->ckk * g->howo > 32768)
    for (int64_t c = 0; c < g->C; c++) {
        float *plane = dxn + c * HW;
        memset(plane, 0, (size_t)HW * sizeof(float));
        for (int64_t k = 0; k < KK; k++) {
            const int64_t kh = k / g->KW, kw = k % g->KW;
            const float *src = col + (c * KK + k) * g->howo;
            int64_t lo, hi;
            valid_cols(g, kw, &lo, &hi);
            const int64_t off = kw - g->pw, sw = g->sw;
            for (int64_t ho = 0; ho < g->HO; ho++, src += g->WO) {
                const int64_t ih = ho * g->sh - g->ph + kh;
                if (ih < 0 || ih >= g->H) continue;
                float *dst = plane + ih * g->W;
                if (sw == 1)
                    for (int64_t wo = lo; wo < hi; wo++) dst[wo + off] += src[wo];
                else
                    for (int64_t wo = lo; wo < hi; wo++) dst[wo * sw + off] += src[wo];
            }
        }
    }
}

// x is (N,C,H,W), w is (O,C,KH,KW), b is (O) when nin == 3; out y is (N,O,HO,WO).
CK_CPU_KERNEL(ck_cpu_conv2d)
{
    (void)nout;
    const conv_geom g = geom(p, &in[0], &in[1], &out[0]);
    const float *x = in[0].data, *w = in[1].data, *bias = nin > 2 ? in[2].data : NULL;
    float *y = out[0].data;
    float *col = ctx->ws;
    assert(g.direct || ctx->ws_bytes >= (size_t)(g.ckk * g.howo) * sizeof(float));
    if (g.N * g.O * g.howo == 0) return;

    for (int64_t n = 0; n < g.N; n++) {
        const float *xn = x + n * g.C * g.H * g.W;
        float *yn = y + n * g.O * g.howo;
        // The bias is laid down first so sgemm adds onto it (beta = 1).
        if (bias) {
#pragma omp parallel for schedule(static) if (g.O * g.howo > 32768)
            for (int64_t o = 0; o < g.O; o++) {
                float *row = yn + o * g.howo;
                const float bo = bias[o];
                for (int64_t i = 0; i < g.howo; i++) row[i] = bo;
            }
        } else if (g.ckk == 0) {
            memset(yn, 0, (size_t)(g.O * g.howo) * sizeof(float));
        }
        if (g.ckk == 0) continue;
        const float *cn = xn;
        if (!g.direct) {
            im2col(&g, xn, col);
            cn = col;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.O, (int)g.howo, (int)g.ckk, 1.0f,
                    w, (int)g.ckk, cn, (int)g.howo, bias ? 1.0f : 0.0f, yn, (int)g.howo);
    }
}

// dy is (N,O,HO,WO), w is (O,C,KH,KW); out dx is (N,C,H,W).
CK_CPU_KERNEL(ck_cpu_conv2d_bwd_data)
{
    (void)nout, (void)nin;
    const conv_geom g = geom(p, &out[0], &in[1], &in[0]);
    const float *dy = in[0].data, *w = in[1].data;
    float *dx = out[0].data, *dcol = ctx->ws;
    const int64_t CHW = g.C * g.H * g.W;
    assert(g.direct || ctx->ws_bytes >= (size_t)(g.ckk * g.howo) * sizeof(float));
    if (g.N * CHW == 0) return;
    if (g.O * g.howo == 0) {
        memset(dx, 0, (size_t)(g.N * CHW) * sizeof(float));
        return;
    }

    for (int64_t n = 0; n < g.N; n++) {
        const float *dyn = dy + n * g.O * g.howo;
        float *dxn = dx + n * CHW;
        // dcol = w^T dy_n; without overlap or padding it is dx_n itself.
        float *dst = g.direct ? dxn : dcol;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)g.ckk, (int)g.howo, (int)g.O, 1.0f,
                    w, (int)g.ckk, dyn, (int)g.howo, 0.0f, dst, (int)g.howo);
        if (!g.direct) col2im(&g, dcol, dxn);
    }
}

/* Sum of n floats in a fixed order: eight interleaved double lanes (so the
 * loop pipelines and vectorizes) folded pairwise at the end. */
static double sum_fixed(const float *v, int64_t n)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)v[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += (double)v[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// dy is (N,O,HO,WO), x is (N,C,H,W); out dw is (O,C,KH,KW), db is (O); either may be unwanted.
CK_CPU_KERNEL(ck_cpu_conv2d_bwd_filter)
{
    (void)nin;
    const float *dy = in[0].data, *x = in[1].data;
    float *dw = out[0].data, *db = nout > 1 ? out[1].data : NULL;
    // dw's shape gives the kernel size; with dw unwanted only O (from dy) matters.
    const ck_view wshape = {NULL, 4, {in[0].shape[1], in[1].shape[1], dw ? out[0].shape[2] : 1,
                                      dw ? out[0].shape[3] : 1}};
    const conv_geom g = geom(p, &in[1], &wshape, &in[0]);

    if (db) {
        // Each channel is summed by one thread, image by image, in a fixed order.
#pragma omp parallel for schedule(static) if (g.N * g.O * g.howo > 32768)
        for (int64_t o = 0; o < g.O; o++) {
            double s = 0.0;
            for (int64_t n = 0; n < g.N; n++) s += sum_fixed(dy + (n * g.O + o) * g.howo, g.howo);
            db[o] = (float)s;
        }
    }
    if (!dw || g.O * g.ckk == 0) return;
    if (g.N * g.howo == 0) {
        memset(dw, 0, (size_t)(g.O * g.ckk) * sizeof(float));
        return;
    }

    float *col = ctx->ws;
    assert(g.direct || ctx->ws_bytes >= (size_t)(g.ckk * g.howo) * sizeof(float));
    // dw = sum_n dy_n col_n^T, accumulated image by image in order (beta = 1 after the first).
    for (int64_t n = 0; n < g.N; n++) {
        const float *xn = x + n * g.C * g.H * g.W, *cn = xn;
        if (!g.direct) {
            im2col(&g, xn, col);
            cn = col;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.O, (int)g.ckk, (int)g.howo, 1.0f,
                    dy + n * g.O * g.howo, (int)g.howo, cn, (int)g.howo, n ? 1.0f : 0.0f, dw, (int)g.ckk);
    }
}
