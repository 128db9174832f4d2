/* 2-D convolution on the CPU (NCHW, zero padding, any kernel and stride):
 * forward, data gradient and filter/bias gradient, each as per-image im2col
 * (or col2im) into ctx->ws around OpenBLAS sgemm. One parallel region per op:
 * each thread builds its own share of the column matrix and runs its own
 * single-threaded sgemm on it, so no thread waits on another mid-op. */
#include "cpu.h"

#include <assert.h>
#include <cblas.h>
#include <omp.h>
#include <string.h>

/* Products below this many FLOPs run on one thread. */
#define PAR_FLOPS 1e7
/* CONV2D_BWD_FILTER with fewer output channels than this accumulates dw^T. */
#define FILTER_T_MAX_O 64

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

// xn is (C,H,W); col holds rows r0..r1-1 and columns j0..j1-1 of the image's
// (C*KH*KW, HO*WO) column matrix with leading dimension ld: row (c,kh,kw), column
// j = ho*WO + wo holds x[c, ho*sh-ph+kh, wo*sw-pw+kw] (zero outside the image).
static void im2col_block(const conv_geom *g, const float *xn, float *col, int64_t ld, int64_t r0, int64_t r1,
                         int64_t j0, int64_t j1)
{
    const int64_t KK = g->KH * g->KW, WO = g->WO;
    if (j1 <= j0) return;
    const int64_t ho0 = j0 / WO, ho1 = (j1 - 1) / WO;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t c = r / KK, kh = (r % KK) / g->KW, kw = r % g->KW;
        const float *plane = xn + c * g->H * g->W;
        float *row = col + (r - r0) * ld;
        int64_t lo, hi;
        valid_cols(g, kw, &lo, &hi);
        const int64_t off = kw - g->pw;
        for (int64_t ho = ho0; ho <= ho1; ho++) {
            // this output row's columns [a, b) inside [j0, j1); d[wo] is column ho*WO + wo
            const int64_t a = ho == ho0 ? j0 - ho * WO : 0, b = ho == ho1 ? j1 - ho * WO : WO;
            float *d = row + (ho * WO - j0);
            const int64_t ih = ho * g->sh - g->ph + kh;
            if (ih < 0 || ih >= g->H) {
                memset(d + a, 0, (size_t)(b - a) * sizeof(float));
                continue;
            }
            const float *src = plane + ih * g->W;
            const int64_t l = lo > a ? lo : a, h = hi < b ? (hi > l ? hi : l) : b;
            for (int64_t wo = a; wo < l; wo++) d[wo] = 0.0f;
            if (g->sw == 1) {
                memcpy(d + l, src + l + off, (size_t)(h - l) * sizeof(float));
            } else {
                const int64_t sw = g->sw;
                for (int64_t wo = l; wo < h; wo++) d[wo] = src[wo * sw + off];
            }
            for (int64_t wo = h; wo < b; wo++) d[wo] = 0.0f;
        }
    }
}

// col is the (C*KH*KW, HO*WO) column matrix; channels c0..c1-1 of dxn (C,H,W) are
// overwritten with the sum of the col entries that im2col would have read from
// each pixel, a channel's KH*KW rows added in a fixed order.
static void col2im_channels(const conv_geom *g, const float *col, float *dxn, int64_t c0, int64_t c1)
{
    const int64_t KK = g->KH * g->KW, HW = g->H * g->W;
    for (int64_t c = c0; c < c1; c++) {
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

/* Threads for a product of this many FLOPs: below PAR_FLOPS one thread beats
 * waking the others (each parallel region costs tens of microseconds here). */
static int threads_for(double flops)
{
    return flops >= PAR_FLOPS ? omp_get_max_threads() : 1;
}

// x is (N,C,H,W), w is (O,C,KH,KW), b is (O) when nin == 3; out y is (N,O,HO,WO).
// Each thread owns a fixed share of every image's output columns: it builds just
// those columns and multiplies them, so the workspace stays one image's columns.
CK_CPU_KERNEL(ck_cpu_conv2d)
{
    (void)nout;
    const conv_geom g = geom(p, &in[0], &in[1], &out[0]);
    const float *x = in[0].data, *w = in[1].data, *bias = nin > 2 ? in[2].data : NULL;
    float *y = out[0].data, *ws = ctx->ws;
    assert(g.direct || ctx->ws_bytes >= (size_t)(g.ckk * g.howo) * sizeof(float));
    if (g.N * g.O * g.howo == 0) return;

#pragma omp parallel num_threads(threads_for(2.0 * g.N * g.O * g.ckk * g.howo))
    {
        omp_set_num_threads(1); // this thread's sgemm runs single-threaded
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int64_t j0 = g.howo * t / T, j1 = g.howo * (t + 1) / T, nj = j1 - j0;
        float *col = ws + g.ckk * j0;
        for (int64_t n = 0; n < g.N && nj > 0; n++) {
            const float *xn = x + n * g.C * g.H * g.W;
            float *yn = y + n * g.O * g.howo + j0;
            // The bias is laid down first so sgemm adds onto it (beta = 1).
            if (bias || g.ckk == 0)
                for (int64_t o = 0; o < g.O; o++) {
                    const float bo = bias ? bias[o] : 0.0f;
                    for (int64_t j = 0; j < nj; j++) yn[o * g.howo + j] = bo;
                }
            if (g.ckk == 0) continue;
            const float *b = xn + j0;
            int64_t ldb = g.howo;
            if (!g.direct) {
                im2col_block(&g, xn, col, nj, 0, g.ckk, j0, j1);
                b = col, ldb = nj;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.O, (int)nj, (int)g.ckk, 1.0f, w,
                        (int)g.ckk, b, (int)ldb, bias ? 1.0f : 0.0f, yn, (int)g.howo);
        }
    }
}

// dy is (N,O,HO,WO), w is (O,C,KH,KW); out dx is (N,C,H,W).
// Each thread owns a fixed range of input channels: its rows of dcol = w^T dy_n,
// then col2im of those channels alone.
CK_CPU_KERNEL(ck_cpu_conv2d_bwd_data)
{
    (void)nout, (void)nin;
    const conv_geom g = geom(p, &out[0], &in[1], &in[0]);
    const float *dy = in[0].data, *w = in[1].data;
    float *dx = out[0].data, *dcol = ctx->ws;
    const int64_t CHW = g.C * g.H * g.W, KK = g.KH * g.KW;
    assert(g.direct || ctx->ws_bytes >= (size_t)(g.ckk * g.howo) * sizeof(float));
    if (g.N * CHW == 0) return;
    if (g.O * g.howo == 0) {
        memset(dx, 0, (size_t)(g.N * CHW) * sizeof(float));
        return;
    }

#pragma omp parallel num_threads(threads_for(2.0 * g.N * g.O * g.ckk * g.howo))
    {
        omp_set_num_threads(1); // this thread's sgemm runs single-threaded
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int64_t c0 = g.C * t / T, c1 = g.C * (t + 1) / T;
        for (int64_t n = 0; n < g.N && c1 > c0; n++) {
            const float *dyn = dy + n * g.O * g.howo;
            float *dxn = dx + n * CHW;
            // without overlap or padding the rows of dcol are dx_n itself
            float *dst = g.direct ? dxn + c0 * g.howo : dcol + c0 * KK * g.howo;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)((c1 - c0) * KK), (int)g.howo, (int)g.O, 1.0f,
                        w + c0 * KK, (int)g.ckk, dyn, (int)g.howo, 0.0f, dst, (int)g.howo);
            if (!g.direct) col2im_channels(&g, dcol, dxn, c0, c1);
        }
    }
}

// dy is (N,O,HO,WO), x is (N,C,H,W); out dw is (O,C,KH,KW), db is (O); either may be unwanted.
// Each thread owns a fixed range of rows of the column matrix (columns of dw)
// and of db. It builds its rows image by image and accumulates its columns of
// dw = sum_n dy_n col_n^T in image order. With fewer than FILTER_T_MAX_O output
// channels it accumulates dw^T = sum_n col_n dy_n^T instead, a block of rows at a
// time with that block of dw^T kept after its columns in the thread's share of
// the workspace, and writes it transposed: OpenBLAS packs the big column matrix
// much faster in that orientation.
CK_CPU_KERNEL(ck_cpu_conv2d_bwd_filter)
{
    (void)nin;
    const float *dy = in[0].data, *x = in[1].data;
    float *dw = out[0].data, *db = nout > 1 ? out[1].data : NULL;
    // dw's shape gives the kernel size; with dw unwanted only O (from dy) matters.
    const ck_view wshape = {NULL, 4, {in[0].shape[1], in[1].shape[1], dw ? out[0].shape[2] : 1,
                                      dw ? out[0].shape[3] : 1}};
    const conv_geom g = geom(p, &in[1], &wshape, &in[0]);
    float *ws = ctx->ws;
    int want_dw = dw && g.O * g.ckk > 0;
    if (want_dw && g.N * g.howo == 0) {
        memset(dw, 0, (size_t)(g.O * g.ckk) * sizeof(float));
        want_dw = 0;
    }
    if (!want_dw && !db) return;
    assert(!want_dw || g.direct || ctx->ws_bytes >= (size_t)(g.ckk * g.howo) * sizeof(float));
    const double flops = want_dw ? 2.0 * g.N * g.O * g.ckk * g.howo : (double)(g.N * g.O * g.howo);

#pragma omp parallel num_threads(threads_for(flops))
    {
        omp_set_num_threads(1); // this thread's sgemm runs single-threaded
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        if (db)
            // each channel summed image by image in a fixed order
            for (int64_t o = g.O * t / T; o < g.O * (t + 1) / T; o++) {
                double s = 0.0;
                for (int64_t n = 0; n < g.N; n++) s += ck_cpu_sum8(dy + (n * g.O + o) * g.howo, g.howo);
                db[o] = (float)s;
            }
        const int64_t r0 = g.ckk * t / T, r1 = g.ckk * (t + 1) / T, nr = r1 - r0;
        // rows per block such that a block's columns and its dw^T fit the thread's nr * HO*WO
        const int64_t fit = nr * g.howo / ((g.direct ? 0 : g.howo) + g.O);
        if (want_dw && nr > 0 && g.O < FILTER_T_MAX_O && fit > 0) {
            const int64_t nblk = (nr + fit - 1) / fit;
            for (int64_t b = 0; b < nblk; b++) {
                const int64_t b0 = r0 + nr * b / nblk, b1 = r0 + nr * (b + 1) / nblk;
                float *dwt = ws + r0 * g.howo + (b1 - b0) * (g.direct ? 0 : g.howo);
                for (int64_t n = 0; n < g.N; n++) {
                    const float *xn = x + n * g.C * g.H * g.W, *cn = xn + b0 * g.howo;
                    if (!g.direct) {
                        im2col_block(&g, xn, ws + r0 * g.howo, g.howo, b0, b1, 0, g.howo);
                        cn = ws + r0 * g.howo;
                    }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(b1 - b0), (int)g.O, (int)g.howo, 1.0f,
                                cn, (int)g.howo, dy + n * g.O * g.howo, (int)g.howo, n ? 1.0f : 0.0f, dwt, (int)g.O);
                }
                for (int64_t o = 0; o < g.O; o++)
                    for (int64_t r = b0; r < b1; r++) dw[o * g.ckk + r] = dwt[(r - b0) * g.O + o];
            }
        } else if (want_dw && nr > 0) {
            for (int64_t n = 0; n < g.N; n++) {
                const float *xn = x + n * g.C * g.H * g.W, *cn = xn + r0 * g.howo;
                if (!g.direct) {
                    im2col_block(&g, xn, ws + r0 * g.howo, g.howo, r0, r1, 0, g.howo);
                    cn = ws + r0 * g.howo;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)g.O, (int)nr, (int)g.howo, 1.0f,
                            dy + n * g.O * g.howo, (int)g.howo, cn, (int)g.howo, n ? 1.0f : 0.0f, dw + r0, (int)g.ckk);
            }
        }
    }
}
