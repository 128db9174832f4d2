/* GFLOP/s of the CPU kernels next to plain OpenBLAS sgemm on the same shapes:
 * conv2d forward + backward (N=2, 64->64, 3x3, 32x32, pad 1) and a
 * 1024x1024x1024 matmul forward + backward. Median of repeated runs. */
#include "cpu/cpu.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *randn(int64_t n, unsigned seed)
{
    float *x = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return x;
}

static ck_view view(float *d, int nd, const int64_t *s)
{
    ck_view v = {d, nd, {0}};
    for (int i = 0; i < nd; i++) v.shape[i] = s[i];
    return v;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define REPS 15
typedef void (*fn)(void *);
static double median_time(fn f, void *arg)
{
    double t[REPS];
    f(arg); /* warm-up */
    for (int r = 0; r < REPS; r++) {
        double t0 = omp_get_wtime();
        f(arg);
        t[r] = omp_get_wtime() - t0;
    }
    qsort(t, REPS, sizeof t[0], cmp);
    return t[REPS / 2];
}

/* conv */
enum { N = 2, C = 64, O = 64, H = 32, W = 32, K = 3 };
static float *cx, *cw, *cb, *cy, *cdy, *cdx, *cdw, *cdb, *cws;
static ck_op_params cp = {{1, 1, 1, 1}, {0}};
static ck_kctx cctx;

static void conv_fwd(void *a)
{
    (void)a;
    int64_t xs[] = {N, C, H, W}, ws[] = {O, C, K, K}, bs[] = {O}, ys[] = {N, O, H, W};
    ck_view in[3] = {view(cx, 4, xs), view(cw, 4, ws), view(cb, 1, bs)}, out[1] = {view(cy, 4, ys)};
    ck_cpu_conv2d(&cctx, &cp, out, 1, in, 3);
}

static void conv_bwd(void *a)
{
    (void)a;
    int64_t xs[] = {N, C, H, W}, ws[] = {O, C, K, K}, bs[] = {O}, ys[] = {N, O, H, W};
    ck_view din[2] = {view(cdy, 4, ys), view(cw, 4, ws)}, dout[1] = {view(cdx, 4, xs)};
    ck_cpu_conv2d_bwd_data(&cctx, &cp, dout, 1, din, 2);
    ck_view fin[2] = {view(cdy, 4, ys), view(cx, 4, xs)}, fout[2] = {view(cdw, 4, ws), view(cdb, 1, bs)};
    ck_cpu_conv2d_bwd_filter(&cctx, &cp, fout, 2, fin, 2);
}

/* the same conv as plain sgemm on pre-built columns: the BLAS ceiling */
static void conv_sgemm(void *a)
{
    (void)a;
    for (int n = 0; n < N; n++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, H * W, C * K * K, 1.0f, cw, C * K * K, cws,
                    H * W, 0.0f, cy + (size_t)n * O * H * W, H * W);
}

/* matmul */
enum { M = 1024 };
static float *ma, *mb, *mc, *mdc, *mda, *mdb;
static ck_kctx mctx;

static void mm_fwd(void *a)
{
    (void)a;
    int64_t s[] = {M, M};
    ck_op_params p = {{0}, {0}};
    ck_view in[2] = {view(ma, 2, s), view(mb, 2, s)}, out[1] = {view(mc, 2, s)};
    ck_cpu_matmul(&mctx, &p, out, 1, in, 2);
}

static void mm_bwd(void *a)
{
    (void)a;
    int64_t s[] = {M, M};
    ck_op_params pa = {{0, 1}, {0}}, pb = {{1, 0}, {0}};
    ck_view ina[2] = {view(mdc, 2, s), view(mb, 2, s)}, outa[1] = {view(mda, 2, s)};
    ck_cpu_matmul(&mctx, &pa, outa, 1, ina, 2);
    ck_view inb[2] = {view(ma, 2, s), view(mdc, 2, s)}, outb[1] = {view(mdb, 2, s)};
    ck_cpu_matmul(&mctx, &pb, outb, 1, inb, 2);
}

static void mm_sgemm(void *a)
{
    (void)a;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, 1.0f, ma, M, mb, M, 0.0f, mc, M);
}

int main(void)
{
    cx = randn(N * C * H * W, 1);
    cw = randn(O * C * K * K, 2);
    cb = randn(O, 3);
    cy = randn(N * O * H * W, 4);
    cdy = randn(N * O * H * W, 5);
    cdx = randn(N * C * H * W, 6);
    cdw = randn(O * C * K * K, 7);
    cdb = randn(O, 8);
    cws = randn((int64_t)C * K * K * H * W, 9);
    cctx.ws = cws;
    cctx.ws_bytes = (size_t)C * K * K * H * W * 4;
    ma = randn((int64_t)M * M, 10);
    mb = randn((int64_t)M * M, 11);
    mc = randn((int64_t)M * M, 12);
    mdc = randn((int64_t)M * M, 13);
    mda = randn((int64_t)M * M, 14);
    mdb = randn((int64_t)M * M, 15);

    double conv_flops = 2.0 * N * O * H * W * C * K * K;
    double mm_flops = 2.0 * M * M * M;
    double t_cf = median_time(conv_fwd, NULL), t_cb = median_time(conv_bwd, NULL), t_cs = median_time(conv_sgemm, NULL);
    double t_mf = median_time(mm_fwd, NULL), t_mb = median_time(mm_bwd, NULL), t_ms = median_time(mm_sgemm, NULL);
    printf("threads %d\n", omp_get_max_threads());
    printf("| case | ms | GFLOP/s | plain sgemm GFLOP/s |\n|---|---|---|---|\n");
    printf("| conv2d forward (2x64x32x32, 64 out, 3x3) | %.3f | %.1f | %.1f |\n", t_cf * 1e3, conv_flops / t_cf / 1e9,
           conv_flops / t_cs / 1e9);
    printf("| conv2d backward (data + filter + bias) | %.3f | %.1f | %.1f |\n", t_cb * 1e3, 2 * conv_flops / t_cb / 1e9,
           conv_flops / t_cs / 1e9);
    printf("| matmul 1024^3 forward | %.3f | %.1f | %.1f |\n", t_mf * 1e3, mm_flops / t_mf / 1e9, mm_flops / t_ms / 1e9);
    printf("| matmul 1024^3 backward (dA + dB) | %.3f | %.1f | %.1f |\n", t_mb * 1e3, 2 * mm_flops / t_mb / 1e9,
           mm_flops / t_ms / 1e9);
    return 0;
}
