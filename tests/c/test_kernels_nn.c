/* Standalone test of the CPU nn kernels (norm.c, activation.c, attention.c): each
 * kernel against a naive double-precision reference, each backward also against
 * central finite differences of its forward, plus determinism and unwanted outputs.
 * Tolerances: forward and analytic backward vs reference, max |got - ref| /
 * (|ref| + 1e-2 max|ref|) <= 1e-4; finite differences (eps 1e-3 on fp32, directional
 * along a random u with random output weights) relative error <= 1e-2. */
#include "../../ops/cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_REF 1e-4
#define TOL_FD 1e-2
#define FD_EPS 3e-3f

static int npass, nfail;
static uint64_t rng = 0x1234567887654321ULL;

static float frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rnd(int64_t n, float scale, float shift)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = shift + scale * frand();
    return x;
}

static float *zeros(int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

static double *dzeros(int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

static float *dup(const float *x, int64_t n)
{
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

static ck_view view(float *d, int nd, const int64_t *shape)
{
    ck_view v;
    memset(&v, 0, sizeof v);
    v.data = d, v.ndim = nd;
    for (int i = 0; i < nd; i++) v.shape[i] = shape[i];
    return v;
}

static ck_op_params params(int64_t i0, float f0)
{
    ck_op_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = i0, p.f[0] = f0;
    return p;
}

/* Workspaces sized exactly by the workspace rules (ck_op_workspace; separate
 * blocks, so an overrun is an overrun under a sanitizer): ATTENTION's and
 * ATTENTION_BWD's. */
static float *g_ws_fwd, *g_ws_bwd;
static size_t g_ws_fwd_bytes, g_ws_bwd_bytes;

static void call(ck_kernel_fn k, const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin)
{
    ck_kctx ctx;
    memset(&ctx, 0, sizeof ctx);
    const int bwd = k == ck_cpu_attention_bwd;
    ctx.ws = bwd ? g_ws_bwd : g_ws_fwd, ctx.ws_bytes = bwd ? g_ws_bwd_bytes : g_ws_fwd_bytes;
    k(&ctx, p, out, nout, in, nin);
}

static void check(const char *name, double err, double tol)
{
    const int ok = err <= tol && err == err;
    printf("%s %s: err %.3g (tol %.0e)\n", ok ? "PASS" : "FAIL", name, err, tol);
    if (ok)
        npass++;
    else
        nfail++;
}

static void check_true(const char *name, int ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    if (ok)
        npass++;
    else
        nfail++;
}

static double err_ref(const float *got, const double *ref, int64_t n)
{
    double mx = 0, e = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-2 * mx + 1e-30));
    return e;
}

/* Forward loss sum(w * y) in double. */
static double loss(ck_kernel_fn f, const ck_op_params *p, ck_view *out, const ck_view *in, int nin, const float *w)
{
    call(f, p, out, 1, in, nin);
    const int64_t n = ck_view_numel(out);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)w[i] * out->data[i];
    return s;
}

/* Central difference of loss along a random direction of input `which`, against
 * grad . delta where delta is the perturbation actually stored in fp32. */
static double fd_err(ck_kernel_fn f, const ck_op_params *p, ck_view *out, ck_view *in, int nin, const float *w,
                     int which, const float *grad)
{
    const int64_t n = ck_view_numel(&in[which]);
    float *x = in[which].data, *x0 = dup(x, n), *xp = zeros(n), *xm = zeros(n);
    for (int64_t i = 0; i < n; i++) {
        const float u = frand();
        xp[i] = x0[i] + FD_EPS * u;
        xm[i] = x0[i] - FD_EPS * u;
    }
    memcpy(x, xp, (size_t)n * sizeof(float));
    const double lp = loss(f, p, out, in, nin, w);
    memcpy(x, xm, (size_t)n * sizeof(float));
    const double lm = loss(f, p, out, in, nin, w);
    memcpy(x, x0, (size_t)n * sizeof(float));
    double ana = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)xp[i] - xm[i];
        ana += grad[i] * d;
        mag += fabs(grad[i] * d);
    }
    free(x0), free(xp), free(xm);
    return fabs((lp - lm) - ana) / fmax(fabs(ana), 1e-3 * mag + 1e-30);
}

/* ---------------- group norm ---------------- */

static void ref_gn(const float *x, const float *gm, const float *bt, const float *dy, int64_t N, int64_t C,
                   int64_t S, int64_t G, double eps, double *y, double *dx, double *dg, double *db)
{
    const int64_t Cg = C / G, M = Cg * S;
    for (int64_t c = 0; c < C; c++) dg[c] = db[c] = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            const int64_t off = (n * C + g * Cg) * S;
            double m = 0, v = 0;
            for (int64_t i = 0; i < M; i++) m += x[off + i];
            m /= M;
            for (int64_t i = 0; i < M; i++) v += (x[off + i] - m) * (x[off + i] - m);
            v /= M;
            const double rs = 1.0 / sqrt(v + eps);
            double s1 = 0, s2 = 0;
            for (int64_t i = 0; i < M; i++) {
                const int64_t c = g * Cg + i / S;
                const double xh = (x[off + i] - m) * rs, gg = gm[c] * (double)dy[off + i];
                y[off + i] = xh * gm[c] + bt[c];
                s1 += gg, s2 += gg * xh;
                dg[c] += dy[off + i] * xh;
                db[c] += dy[off + i];
            }
            for (int64_t i = 0; i < M; i++) {
                const int64_t c = g * Cg + i / S;
                const double xh = (x[off + i] - m) * rs;
                dx[off + i] = rs * (gm[c] * (double)dy[off + i] - s1 / M - xh * s2 / M);
            }
        }
}

static void test_group_norm(const char *tag, int nd, const int64_t *shape, int64_t G, float shift)
{
    char name[160];
    const int64_t N = shape[0], C = shape[1];
    int64_t S = 1;
    for (int d = 2; d < nd; d++) S *= shape[d];
    const int64_t n = N * C * S;
    const float eps = 1e-5f;
    float *x = rnd(n, 1.5f, shift), *gm = rnd(C, 1.0f, 1.0f), *bt = rnd(C, 0.5f, 0.0f), *dy = rnd(n, 1.0f, 0.0f);
    float *y = zeros(n), *dx = zeros(n), *dg = zeros(C), *db = zeros(C);
    double *ry = dzeros(n), *rdx = dzeros(n), *rdg = dzeros(C), *rdb = dzeros(C);
    const int64_t cshape[1] = {C};
    ck_op_params p = params(G, eps);
    ck_view fin[3] = {view(x, nd, shape), view(gm, 1, cshape), view(bt, 1, cshape)};
    ck_view fout[1] = {view(y, nd, shape)};
    ck_view bin[3] = {view(dy, nd, shape), view(x, nd, shape), view(gm, 1, cshape)};
    ck_view bout[3] = {view(dx, nd, shape), view(dg, 1, cshape), view(db, 1, cshape)};

    ref_gn(x, gm, bt, dy, N, C, S, G, eps, ry, rdx, rdg, rdb);
    call(ck_cpu_group_norm, &p, fout, 1, fin, 3);
    snprintf(name, sizeof name, "group_norm %s fwd vs ref", tag);
    check(name, err_ref(y, ry, n), TOL_REF);
    call(ck_cpu_group_norm_bwd, &p, bout, 3, bin, 3);
    float *yy = zeros(n);
    ck_view fdout[1] = {view(yy, nd, shape)};
    if (C / G * S == 1) {
        // One element per group: y = beta whatever x is, so dx and dgamma are
        // exactly zero and relative errors mean nothing; check them absolutely.
        double e = err_ref(db, rdb, C);
        for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(dx[i]));
        for (int64_t c = 0; c < C; c++) e = fmax(e, fabs(dg[c]));
        snprintf(name, sizeof name, "group_norm %s bwd dbeta vs ref, dx = dgamma = 0", tag);
        check(name, e, TOL_REF);
        snprintf(name, sizeof name, "group_norm %s finite diff dbeta", tag);
        check(name, fd_err(ck_cpu_group_norm, &p, fdout, fin, 3, dy, 2, db), TOL_FD);
    } else {
        snprintf(name, sizeof name, "group_norm %s bwd dx/dgamma/dbeta vs ref", tag);
        check(name, fmax(err_ref(dx, rdx, n), fmax(err_ref(dg, rdg, C), err_ref(db, rdb, C))), TOL_REF);
        snprintf(name, sizeof name, "group_norm %s finite diff dx/dgamma/dbeta", tag);
        double e = fd_err(ck_cpu_group_norm, &p, fdout, fin, 3, dy, 0, dx);
        e = fmax(e, fd_err(ck_cpu_group_norm, &p, fdout, fin, 3, dy, 1, dg));
        e = fmax(e, fd_err(ck_cpu_group_norm, &p, fdout, fin, 3, dy, 2, db));
        check(name, e, TOL_FD);
    }

    // Same bits again, with one thread, and when only some outputs are wanted.
    float *dx2 = zeros(n), *dg2 = zeros(C), *db2 = zeros(C), *y2 = zeros(n);
    ck_view fout2[1] = {view(y2, nd, shape)};
    ck_view bout2[3] = {view(dx2, nd, shape), view(dg2, 1, cshape), view(db2, 1, cshape)};
    call(ck_cpu_group_norm, &p, fout2, 1, fin, 3);
    call(ck_cpu_group_norm_bwd, &p, bout2, 3, bin, 3);
    int same = !memcmp(y, y2, n * 4) && !memcmp(dx, dx2, n * 4) && !memcmp(dg, dg2, C * 4) && !memcmp(db, db2, C * 4);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    call(ck_cpu_group_norm, &p, fout2, 1, fin, 3);
    call(ck_cpu_group_norm_bwd, &p, bout2, 3, bin, 3);
    omp_set_num_threads(nt);
    same = same && !memcmp(y, y2, n * 4) && !memcmp(dx, dx2, n * 4) && !memcmp(dg, dg2, C * 4) &&
           !memcmp(db, db2, C * 4);
    snprintf(name, sizeof name, "group_norm %s deterministic (twice, and 1 thread vs %d)", tag, nt);
    check_true(name, same);

    memset(dx2, 0, n * 4), memset(dg2, 0, C * 4);
    bout2[1].data = NULL, bout2[2].data = NULL;
    call(ck_cpu_group_norm_bwd, &p, bout2, 3, bin, 3);
    int ok = !memcmp(dx, dx2, n * 4);
    bout2[0].data = NULL, bout2[1].data = dg2;
    call(ck_cpu_group_norm_bwd, &p, bout2, 3, bin, 3);
    ok = ok && !memcmp(dg, dg2, C * 4);
    snprintf(name, sizeof name, "group_norm %s bwd with unwanted outputs", tag);
    check_true(name, ok);

    free(x), free(gm), free(bt), free(dy), free(y), free(dx), free(dg), free(db), free(yy);
    free(ry), free(rdx), free(rdg), free(rdb), free(dx2), free(dg2), free(db2), free(y2);
}

/* ---------------- layer norm ---------------- */

static void test_layer_norm(const char *tag, int nd, const int64_t *shape, float shift)
{
    char name[160];
    const int64_t C = shape[nd - 1];
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    const int64_t R = n / C;
    const float eps = 1e-5f;
    float *x = rnd(n, 1.5f, shift), *gm = rnd(C, 1.0f, 1.0f), *bt = rnd(C, 0.5f, 0.0f), *dy = rnd(n, 1.0f, 0.0f);
    float *y = zeros(n), *dx = zeros(n), *dg = zeros(C), *db = zeros(C);
    double *ry = dzeros(n), *rdx = dzeros(n), *rdg = dzeros(C), *rdb = dzeros(C);
    // LAYER_NORM is GROUP_NORM with one group on (R, 1, C) and per-row affine;
    // the reference does it directly.
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * C, *dyr = dy + r * C;
        double m = 0, v = 0, s1 = 0, s2 = 0;
        for (int64_t c = 0; c < C; c++) m += xr[c];
        m /= C;
        for (int64_t c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        const double rs = 1.0 / sqrt(v / C + eps);
        for (int64_t c = 0; c < C; c++) {
            const double xh = (xr[c] - m) * rs, g = (double)gm[c] * dyr[c];
            ry[r * C + c] = xh * gm[c] + bt[c];
            s1 += g, s2 += g * xh;
            rdg[c] += dyr[c] * xh;
            rdb[c] += dyr[c];
        }
        for (int64_t c = 0; c < C; c++)
            rdx[r * C + c] = rs * ((double)gm[c] * dyr[c] - s1 / C - (xr[c] - m) * rs * s2 / C);
    }
    const int64_t cshape[1] = {C};
    ck_op_params p = params(0, eps);
    ck_view fin[3] = {view(x, nd, shape), view(gm, 1, cshape), view(bt, 1, cshape)};
    ck_view fout[1] = {view(y, nd, shape)};
    ck_view bin[3] = {view(dy, nd, shape), view(x, nd, shape), view(gm, 1, cshape)};
    ck_view bout[3] = {view(dx, nd, shape), view(dg, 1, cshape), view(db, 1, cshape)};

    call(ck_cpu_layer_norm, &p, fout, 1, fin, 3);
    snprintf(name, sizeof name, "layer_norm %s fwd vs ref", tag);
    check(name, err_ref(y, ry, n), TOL_REF);
    call(ck_cpu_layer_norm_bwd, &p, bout, 3, bin, 3);
    snprintf(name, sizeof name, "layer_norm %s bwd dx/dgamma/dbeta vs ref", tag);
    check(name, fmax(err_ref(dx, rdx, n), fmax(err_ref(dg, rdg, C), err_ref(db, rdb, C))), TOL_REF);

    float *yy = zeros(n);
    ck_view fdout[1] = {view(yy, nd, shape)};
    snprintf(name, sizeof name, "layer_norm %s finite diff dx/dgamma/dbeta", tag);
    double e = fd_err(ck_cpu_layer_norm, &p, fdout, fin, 3, dy, 0, dx);
    e = fmax(e, fd_err(ck_cpu_layer_norm, &p, fdout, fin, 3, dy, 1, dg));
    e = fmax(e, fd_err(ck_cpu_layer_norm, &p, fdout, fin, 3, dy, 2, db));
    check(name, e, TOL_FD);

    float *dx2 = zeros(n), *dg2 = zeros(C), *db2 = zeros(C);
    ck_view bout2[3] = {view(dx2, nd, shape), view(dg2, 1, cshape), view(db2, 1, cshape)};
    call(ck_cpu_layer_norm_bwd, &p, bout2, 3, bin, 3);
    int same = !memcmp(dx, dx2, n * 4) && !memcmp(dg, dg2, C * 4) && !memcmp(db, db2, C * 4);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    call(ck_cpu_layer_norm_bwd, &p, bout2, 3, bin, 3);
    call(ck_cpu_layer_norm, &p, fdout, 1, fin, 3);
    omp_set_num_threads(nt);
    same = same && !memcmp(dx, dx2, n * 4) && !memcmp(dg, dg2, C * 4) && !memcmp(db, db2, C * 4) &&
           !memcmp(y, yy, n * 4);
    snprintf(name, sizeof name, "layer_norm %s deterministic (twice, and 1 thread vs %d)", tag, nt);
    check_true(name, same);

    memset(dx2, 0, n * 4), memset(db2, 0, C * 4);
    bout2[1].data = NULL, bout2[2].data = NULL;
    call(ck_cpu_layer_norm_bwd, &p, bout2, 3, bin, 3);
    int ok = !memcmp(dx, dx2, n * 4);
    bout2[0].data = NULL, bout2[2].data = db2;
    call(ck_cpu_layer_norm_bwd, &p, bout2, 3, bin, 3);
    ok = ok && !memcmp(db, db2, C * 4);
    snprintf(name, sizeof name, "layer_norm %s bwd with unwanted outputs", tag);
    check_true(name, ok);

    free(x), free(gm), free(bt), free(dy), free(y), free(dx), free(dg), free(db), free(yy);
    free(ry), free(rdx), free(rdg), free(rdb), free(dx2), free(dg2), free(db2);
}

/* LAYER_NORM without its affine, or without its bias, is the affine layer norm
 * with gamma 1 and beta 0 in the same float arithmetic: both, forward and dx,
 * are compared value for value. */
static void test_layer_norm_optional_affine(const char *tag, int64_t R, int64_t C)
{
    char name[160];
    const int64_t n = R * C, shape[2] = {R, C}, cshape[1] = {C};
    float *x = rnd(n, 2.0f, 0.5f), *dy = rnd(n, 1.0f, 0.0f), *gm = rnd(C, 1.0f, 1.0f), *ones = zeros(C), *zs = zeros(C);
    for (int64_t c = 0; c < C; c++) ones[c] = 1.0f;
    float *y1 = zeros(n), *y2 = zeros(n), *dx1 = zeros(n), *dx2 = zeros(n);
    ck_op_params p = params(0, 1e-6f);
    ck_view o1 = view(y1, 2, shape), o2 = view(y2, 2, shape);
    ck_view none[1] = {view(x, 2, shape)};
    ck_view full[3] = {view(x, 2, shape), view(ones, 1, cshape), view(zs, 1, cshape)};
    call(ck_cpu_layer_norm, &p, &o1, 1, none, 1);
    call(ck_cpu_layer_norm, &p, &o2, 1, full, 3);
    int same = !memcmp(y1, y2, (size_t)n * 4);
    ck_view bnone[2] = {view(dy, 2, shape), view(x, 2, shape)};
    ck_view bfull[3] = {view(dy, 2, shape), view(x, 2, shape), view(ones, 1, cshape)};
    ck_view b1[3] = {view(dx1, 2, shape), {0}, {0}}, b2[3] = {view(dx2, 2, shape), {0}, {0}};
    call(ck_cpu_layer_norm_bwd, &p, b1, 3, bnone, 2);
    call(ck_cpu_layer_norm_bwd, &p, b2, 3, bfull, 3);
    same = same && !memcmp(dx1, dx2, (size_t)n * 4);
    snprintf(name, sizeof name, "layer_norm %s without gamma and beta is gamma 1, beta 0 (y, dx)", tag);
    check_true(name, same);

    ck_view wonly[2] = {view(x, 2, shape), view(gm, 1, cshape)};
    full[1] = view(gm, 1, cshape);
    call(ck_cpu_layer_norm, &p, &o1, 1, wonly, 2);
    call(ck_cpu_layer_norm, &p, &o2, 1, full, 3);
    snprintf(name, sizeof name, "layer_norm %s without beta is beta 0", tag);
    check_true(name, !memcmp(y1, y2, (size_t)n * 4));
    free(x), free(dy), free(gm), free(ones), free(zs), free(y1), free(y2), free(dx1), free(dx2);
}

/* ---------------- RMS norm ---------------- */

/* RMS_NORM against a double reference (torch.nn.RMSNorm: y = x / sqrt(mean(x^2)
 * + eps) * w; dx = r w dy - x r^3 mean(w dy x); dw = sum over rows of dy x r),
 * finite differences, determinism across thread counts, unwanted outputs, and
 * without a weight (w = 1). */
static void test_rms_norm(const char *tag, int nd, const int64_t *shape, float shift)
{
    char name[160];
    const int64_t C = shape[nd - 1];
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    const int64_t R = n / C;
    const float eps = 1e-6f;
    float *x = rnd(n, 1.5f, shift), *w = rnd(C, 1.0f, 1.0f), *dy = rnd(n, 1.0f, 0.0f);
    float *y = zeros(n), *dx = zeros(n), *dw = zeros(C);
    double *ry = dzeros(n), *rdx = dzeros(n), *rdw = dzeros(C), *ry1 = dzeros(n), *rdx1 = dzeros(n);
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * C, *dyr = dy + r * C;
        double q = 0, s = 0, s1 = 0;
        for (int64_t c = 0; c < C; c++) q += (double)xr[c] * xr[c];
        const double rs = 1.0 / sqrt(q / C + eps);
        for (int64_t c = 0; c < C; c++) {
            ry[r * C + c] = xr[c] * rs * w[c];
            ry1[r * C + c] = xr[c] * rs;
            s += (double)w[c] * dyr[c] * xr[c];
            s1 += (double)dyr[c] * xr[c];
            rdw[c] += dyr[c] * xr[c] * rs;
        }
        for (int64_t c = 0; c < C; c++) {
            rdx[r * C + c] = rs * w[c] * dyr[c] - xr[c] * rs * rs * rs * s / C;
            rdx1[r * C + c] = rs * dyr[c] - xr[c] * rs * rs * rs * s1 / C;
        }
    }
    const int64_t cshape[1] = {C};
    ck_op_params p = params(0, eps);
    ck_view fin[2] = {view(x, nd, shape), view(w, 1, cshape)};
    ck_view fout[1] = {view(y, nd, shape)};
    ck_view bin[3] = {view(dy, nd, shape), view(x, nd, shape), view(w, 1, cshape)};
    ck_view bout[2] = {view(dx, nd, shape), view(dw, 1, cshape)};

    call(ck_cpu_rms_norm, &p, fout, 1, fin, 2);
    snprintf(name, sizeof name, "rms_norm %s fwd vs ref", tag);
    check(name, err_ref(y, ry, n), TOL_REF);
    call(ck_cpu_rms_norm_bwd, &p, bout, 2, bin, 3);
    snprintf(name, sizeof name, "rms_norm %s bwd dx/dweight vs ref", tag);
    check(name, fmax(err_ref(dx, rdx, n), err_ref(dw, rdw, C)), TOL_REF);

    float *yy = zeros(n);
    ck_view fdout[1] = {view(yy, nd, shape)};
    snprintf(name, sizeof name, "rms_norm %s finite diff dx/dweight", tag);
    double e = fd_err(ck_cpu_rms_norm, &p, fdout, fin, 2, dy, 0, dx);
    e = fmax(e, fd_err(ck_cpu_rms_norm, &p, fdout, fin, 2, dy, 1, dw));
    check(name, e, TOL_FD);

    float *dx2 = zeros(n), *dw2 = zeros(C);
    ck_view bout2[2] = {view(dx2, nd, shape), view(dw2, 1, cshape)};
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    call(ck_cpu_rms_norm_bwd, &p, bout2, 2, bin, 3);
    call(ck_cpu_rms_norm, &p, fdout, 1, fin, 2);
    omp_set_num_threads(nt);
    int same = !memcmp(dx, dx2, n * 4) && !memcmp(dw, dw2, C * 4) && !memcmp(y, yy, n * 4);
    snprintf(name, sizeof name, "rms_norm %s deterministic (1 thread vs %d)", tag, nt);
    check_true(name, same);

    memset(dx2, 0, n * 4), memset(dw2, 0, C * 4);
    bout2[1].data = NULL;
    call(ck_cpu_rms_norm_bwd, &p, bout2, 2, bin, 3);
    int ok = !memcmp(dx, dx2, n * 4);
    bout2[0].data = NULL, bout2[1].data = dw2;
    call(ck_cpu_rms_norm_bwd, &p, bout2, 2, bin, 3);
    ok = ok && !memcmp(dw, dw2, C * 4);
    snprintf(name, sizeof name, "rms_norm %s bwd with unwanted outputs", tag);
    check_true(name, ok);

    /* no weight: the op on x alone, and its dx from dy and x */
    call(ck_cpu_rms_norm, &p, fdout, 1, fin, 1);
    bout2[0].data = dx2, bout2[1].data = NULL;
    call(ck_cpu_rms_norm_bwd, &p, bout2, 2, bin, 2);
    snprintf(name, sizeof name, "rms_norm %s without a weight: fwd and dx vs ref", tag);
    check(name, fmax(err_ref(yy, ry1, n), err_ref(dx2, rdx1, n)), TOL_REF);
    snprintf(name, sizeof name, "rms_norm %s without a weight: finite diff dx", tag);
    check(name, fd_err(ck_cpu_rms_norm, &p, fdout, fin, 1, dy, 0, dx2), TOL_FD);

    free(x), free(w), free(dy), free(y), free(dx), free(dw), free(yy), free(dx2), free(dw2);
    free(ry), free(rdx), free(rdw), free(ry1), free(rdx1);
}

/* ---------------- activations ---------------- */

static double gelu_d(double x, int approx)
{
    if (approx) return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}

/* The derivative by a central difference in double: independent of the kernel's formula. */
static double gelu_grad_d(double x, int approx)
{
    const double h = 1e-5;
    return (gelu_d(x + h, approx) - gelu_d(x - h, approx)) / (2 * h);
}

static double silu_d(double x) { return x / (1 + exp(-x)); }

/* torch.nn.functional.mish: x tanh(softplus(x)) */
static double mish_d(double x) { return x * tanh(log1p(exp(x))); }

/* Elementwise forward/backward pair: kernels, reference value and derivative. */
static void test_unary(const char *tag, ck_kernel_fn fwd, ck_kernel_fn bwd, int64_t i0, int kind, int64_t n)
{
    char name[160];
    const int64_t shape[2] = {n / 3, 3};
    float *x = rnd(n, 6.0f, 0.0f), *dy = rnd(n, 1.0f, 0.0f), *y = zeros(n), *dx = zeros(n);
    double *ry = dzeros(n), *rdx = dzeros(n);
    for (int64_t i = 0; i < n; i++) {
        const double v = x[i];
        if (kind == 0) {
            ry[i] = silu_d(v);
            rdx[i] = dy[i] * (silu_d(v + 1e-5) - silu_d(v - 1e-5)) / 2e-5;
        } else if (kind == 2) {
            ry[i] = mish_d(v);
            rdx[i] = dy[i] * (mish_d(v + 1e-5) - mish_d(v - 1e-5)) / 2e-5;
        } else {
            ry[i] = gelu_d(v, (int)i0);
            rdx[i] = dy[i] * gelu_grad_d(v, (int)i0);
        }
    }
    ck_op_params p = params(i0, 0);
    ck_view fin[1] = {view(x, 2, shape)}, fout[1] = {view(y, 2, shape)};
    ck_view bin[2] = {view(dy, 2, shape), view(x, 2, shape)}, bout[1] = {view(dx, 2, shape)};
    call(fwd, &p, fout, 1, fin, 1);
    snprintf(name, sizeof name, "%s n=%lld fwd vs ref", tag, (long long)n);
    check(name, err_ref(y, ry, n), TOL_REF);
    call(bwd, &p, bout, 1, bin, 2);
    // The reference derivative is itself a difference quotient (error ~1e-10).
    snprintf(name, sizeof name, "%s n=%lld bwd vs ref", tag, (long long)n);
    check(name, err_ref(dx, rdx, n), TOL_REF);
    float *yy = zeros(n);
    ck_view fdout[1] = {view(yy, 2, shape)};
    snprintf(name, sizeof name, "%s n=%lld finite diff", tag, (long long)n);
    check(name, fd_err(fwd, &p, fdout, fin, 1, dy, 0, dx), TOL_FD);
    float *y2 = zeros(n), *dx2 = zeros(n);
    ck_view fout2[1] = {view(y2, 2, shape)}, bout2[1] = {view(dx2, 2, shape)};
    call(fwd, &p, fout2, 1, fin, 1);
    call(bwd, &p, bout2, 1, bin, 2);
    snprintf(name, sizeof name, "%s n=%lld deterministic", tag, (long long)n);
    check_true(name, !memcmp(y, y2, n * 4) && !memcmp(dx, dx2, n * 4));
    free(x), free(dy), free(y), free(dx), free(ry), free(rdx), free(yy), free(y2), free(dx2);
}

static void test_geglu(int64_t approx, int64_t R, int64_t D)
{
    char name[160];
    const int64_t xs[3] = {1, R, 2 * D}, ys[3] = {1, R, D};
    const int64_t nx = R * 2 * D, ny = R * D;
    float *x = rnd(nx, 4.0f, 0.0f), *dy = rnd(ny, 1.0f, 0.0f), *y = zeros(ny), *dx = zeros(nx);
    double *ry = dzeros(ny), *rdx = dzeros(nx);
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < D; j++) {
            const double h = x[r * 2 * D + j], g = x[r * 2 * D + D + j], d = dy[r * D + j];
            ry[r * D + j] = h * gelu_d(g, (int)approx);
            rdx[r * 2 * D + j] = d * gelu_d(g, (int)approx);
            rdx[r * 2 * D + D + j] = d * h * gelu_grad_d(g, (int)approx);
        }
    ck_op_params p = params(approx, 0);
    ck_view fin[1] = {view(x, 3, xs)}, fout[1] = {view(y, 3, ys)};
    ck_view bin[2] = {view(dy, 3, ys), view(x, 3, xs)}, bout[1] = {view(dx, 3, xs)};
    call(ck_cpu_geglu, &p, fout, 1, fin, 1);
    snprintf(name, sizeof name, "geglu %s R=%lld D=%lld fwd vs ref", approx ? "tanh" : "erf", (long long)R,
             (long long)D);
    check(name, err_ref(y, ry, ny), TOL_REF);
    call(ck_cpu_geglu_bwd, &p, bout, 1, bin, 2);
    snprintf(name, sizeof name, "geglu %s R=%lld D=%lld bwd vs ref", approx ? "tanh" : "erf", (long long)R,
             (long long)D);
    check(name, err_ref(dx, rdx, nx), TOL_REF);
    float *yy = zeros(ny);
    ck_view fdout[1] = {view(yy, 3, ys)};
    snprintf(name, sizeof name, "geglu %s R=%lld D=%lld finite diff", approx ? "tanh" : "erf", (long long)R,
             (long long)D);
    check(name, fd_err(ck_cpu_geglu, &p, fdout, fin, 1, dy, 0, dx), TOL_FD);
    float *dx2 = zeros(nx);
    ck_view bout2[1] = {view(dx2, 3, xs)};
    call(ck_cpu_geglu_bwd, &p, bout2, 1, bin, 2);
    call(ck_cpu_geglu, &p, fdout, 1, fin, 1);
    snprintf(name, sizeof name, "geglu %s R=%lld D=%lld deterministic", approx ? "tanh" : "erf", (long long)R,
             (long long)D);
    check_true(name, !memcmp(dx, dx2, nx * 4) && !memcmp(y, yy, ny * 4));
    free(x), free(dy), free(y), free(dx), free(ry), free(rdx), free(yy), free(dx2);
}

static void test_softmax(int64_t R, int64_t C, float spread)
{
    char name[160];
    const int64_t shape[2] = {R, C}, n = R * C;
    float *x = rnd(n, spread, 0.0f), *dy = rnd(n, 1.0f, 0.0f), *y = zeros(n), *dx = zeros(n);
    double *ry = dzeros(n), *rdx = dzeros(n);
    for (int64_t r = 0; r < R; r++) {
        double s = 0, t = 0;
        for (int64_t c = 0; c < C; c++) s += exp((double)x[r * C + c]);
        for (int64_t c = 0; c < C; c++) ry[r * C + c] = exp((double)x[r * C + c]) / s;
        for (int64_t c = 0; c < C; c++) t += dy[r * C + c] * ry[r * C + c];
        for (int64_t c = 0; c < C; c++) rdx[r * C + c] = ry[r * C + c] * (dy[r * C + c] - t);
    }
    ck_op_params p = params(0, 0);
    ck_view fin[1] = {view(x, 2, shape)}, fout[1] = {view(y, 2, shape)};
    ck_view bin[2] = {view(dy, 2, shape), view(y, 2, shape)}, bout[1] = {view(dx, 2, shape)};
    call(ck_cpu_softmax, &p, fout, 1, fin, 1);
    snprintf(name, sizeof name, "softmax %lldx%lld fwd vs ref", (long long)R, (long long)C);
    check(name, err_ref(y, ry, n), TOL_REF);
    call(ck_cpu_softmax_bwd, &p, bout, 1, bin, 2);
    snprintf(name, sizeof name, "softmax %lldx%lld bwd vs ref", (long long)R, (long long)C);
    check(name, err_ref(dx, rdx, n), TOL_REF);
    float *yy = zeros(n);
    ck_view fdout[1] = {view(yy, 2, shape)};
    snprintf(name, sizeof name, "softmax %lldx%lld finite diff", (long long)R, (long long)C);
    check(name, fd_err(ck_cpu_softmax, &p, fdout, fin, 1, dy, 0, dx), TOL_FD);
    float *dx2 = zeros(n);
    ck_view bout2[1] = {view(dx2, 2, shape)};
    call(ck_cpu_softmax_bwd, &p, bout2, 1, bin, 2);
    call(ck_cpu_softmax, &p, fdout, 1, fin, 1);
    snprintf(name, sizeof name, "softmax %lldx%lld deterministic", (long long)R, (long long)C);
    check_true(name, !memcmp(dx, dx2, n * 4) && !memcmp(y, yy, n * 4));
    free(x), free(dy), free(y), free(dx), free(ry), free(rdx), free(yy), free(dx2);
}

/* Extremes and NaN through the polynomial exp/erf: saturate like libm, NaN stays NaN. */
static void test_special(void)
{
    static const float xs[9] = {-1e4f, -100.0f, -20.0f, -3.0f, 0.0f, 2.5f, 20.0f, 100.0f, 1e4f};
    const int64_t shape[1] = {10};
    float x[10], dy[10], y[10], dx[10];
    for (int i = 0; i < 9; i++) x[i] = xs[i], dy[i] = 1.0f;
    x[9] = NAN, dy[9] = 1.0f;
    const struct {
        const char *name;
        ck_kernel_fn f, b;
        int64_t i0;
        int kind;
    } cases[4] = {{"silu", ck_cpu_silu, ck_cpu_silu_bwd, 0, 0},
                  {"gelu erf", ck_cpu_gelu, ck_cpu_gelu_bwd, 0, 1},
                  {"gelu tanh", ck_cpu_gelu, ck_cpu_gelu_bwd, 1, 1},
                  {"mish", ck_cpu_mish, ck_cpu_mish_bwd, 0, 2}};
    for (int c = 0; c < 4; c++) {
        ck_op_params p = params(cases[c].i0, 0);
        ck_view fin[1] = {view(x, 1, shape)}, fout[1] = {view(y, 1, shape)};
        ck_view bin[2] = {view(dy, 1, shape), view(x, 1, shape)}, bout[1] = {view(dx, 1, shape)};
        call(cases[c].f, &p, fout, 1, fin, 1);
        call(cases[c].b, &p, bout, 1, bin, 2);
        int ok = isnan(y[9]) && isnan(dx[9]);
        for (int i = 0; i < 9; i++) {
            const double v = x[i];
            double r, d;
            if (cases[c].kind == 0) {
                r = silu_d(v);
                d = (silu_d(v + 1e-4) - silu_d(v - 1e-4)) / 2e-4;
            } else if (cases[c].kind == 2) {
                r = mish_d(v);
                d = (mish_d(v + 1e-4) - mish_d(v - 1e-4)) / 2e-4;
            } else {
                r = gelu_d(v, (int)cases[c].i0);
                d = (gelu_d(v + 1e-4, (int)cases[c].i0) - gelu_d(v - 1e-4, (int)cases[c].i0)) / 2e-4;
            }
            ok = ok && fabs(y[i] - r) <= 1e-5 * fabs(r) + 1e-6 && fabs(dx[i] - d) <= 1e-4 * fabs(d) + 1e-6;
        }
        char name[96];
        snprintf(name, sizeof name, "%s at +-1e4, +-100, +-20 and NaN", cases[c].name);
        check_true(name, ok);
    }
    // Rows: a 2000 spread, a -inf (masked) entry, a NaN.
    float sx[9] = {1000.0f, -1000.0f, 0.0f, -INFINITY, 0.0f, 0.0f, NAN, 1.0f, 2.0f}, sy[9];
    const int64_t ss[2] = {3, 3};
    ck_op_params p = params(0, 0);
    ck_view fin[1] = {view(sx, 2, ss)}, fout[1] = {view(sy, 2, ss)};
    call(ck_cpu_softmax, &p, fout, 1, fin, 1);
    const int ok = sy[0] == 1.0f && sy[1] < 1e-30f && sy[2] < 1e-30f && sy[3] < 1e-30f && sy[4] == 0.5f &&
                   sy[5] == 0.5f && isnan(sy[6]) && isnan(sy[7]) && isnan(sy[8]);
    check_true("softmax with 2000 spread, -inf and NaN", ok);
}

/* ---------------- attention ---------------- */

static void ref_attention(const float *q, const float *k, const float *v, const float *dO, int64_t B, int64_t LQ,
                          int64_t LK, int64_t H, int64_t D, double scale, double *o, double *dq, double *dk,
                          double *dv)
{
    const int64_t HD = H * D;
    double *P = dzeros(LQ * LK), *dP = dzeros(LQ * LK);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
#define Q(i, d) q[(b * LQ + (i)) * HD + h * D + (d)]
#define K(j, d) k[(b * LK + (j)) * HD + h * D + (d)]
#define V(j, d) v[(b * LK + (j)) * HD + h * D + (d)]
#define DO(i, d) dO[(b * LQ + (i)) * HD + h * D + (d)]
            for (int64_t i = 0; i < LQ; i++) {
                double mx = -INFINITY, s = 0, t = 0;
                for (int64_t j = 0; j < LK; j++) {
                    double a = 0;
                    for (int64_t d = 0; d < D; d++) a += (double)Q(i, d) * K(j, d);
                    P[i * LK + j] = a * scale;
                    mx = fmax(mx, a * scale);
                }
                for (int64_t j = 0; j < LK; j++) s += P[i * LK + j] = exp(P[i * LK + j] - mx);
                for (int64_t j = 0; j < LK; j++) P[i * LK + j] /= s;
                for (int64_t d = 0; d < D; d++) {
                    double a = 0;
                    for (int64_t j = 0; j < LK; j++) a += P[i * LK + j] * V(j, d);
                    o[(b * LQ + i) * HD + h * D + d] = a;
                }
                for (int64_t j = 0; j < LK; j++) {
                    double a = 0;
                    for (int64_t d = 0; d < D; d++) a += (double)DO(i, d) * V(j, d);
                    dP[i * LK + j] = a;
                    t += a * P[i * LK + j];
                }
                for (int64_t j = 0; j < LK; j++) dP[i * LK + j] = P[i * LK + j] * (dP[i * LK + j] - t);
            }
            for (int64_t j = 0; j < LK; j++)
                for (int64_t d = 0; d < D; d++) {
                    double sv = 0, sk = 0;
                    for (int64_t i = 0; i < LQ; i++) {
                        sv += P[i * LK + j] * DO(i, d);
                        sk += dP[i * LK + j] * Q(i, d);
                    }
                    dv[(b * LK + j) * HD + h * D + d] = sv;
                    dk[(b * LK + j) * HD + h * D + d] = scale * sk;
                }
            for (int64_t i = 0; i < LQ; i++)
                for (int64_t d = 0; d < D; d++) {
                    double s = 0;
                    for (int64_t j = 0; j < LK; j++) s += dP[i * LK + j] * K(j, d);
                    dq[(b * LQ + i) * HD + h * D + d] = scale * s;
                }
#undef Q
#undef K
#undef V
#undef DO
        }
    free(P), free(dP);
}

static void test_attention(int64_t B, int64_t LQ, int64_t LK, int64_t H, int64_t D, float scale_param)
{
    char name[200], tag[120];
    snprintf(tag, sizeof tag, "B=%lld LQ=%lld LK=%lld H=%lld D=%lld scale=%g", (long long)B, (long long)LQ,
             (long long)LK, (long long)H, (long long)D, scale_param);
    const int64_t HD = H * D, nq = B * LQ * HD, nk = B * LK * HD;
    const int64_t qs[3] = {B, LQ, HD}, ks[3] = {B, LK, HD};
    const double scale = scale_param != 0 ? scale_param : 1.0 / sqrt((double)D);
    float *q = rnd(nq, 1.5f, 0.0f), *k = rnd(nk, 1.5f, 0.0f), *v = rnd(nk, 1.0f, 0.0f), *dO = rnd(nq, 1.0f, 0.0f);
    float *o = zeros(nq), *dq = rnd(nq, 9, 9), *dk = rnd(nk, 9, 9), *dv = rnd(nk, 9, 9); /* garbage: must be overwritten */
    double *ro = dzeros(nq), *rdq = dzeros(nq), *rdk = dzeros(nk), *rdv = dzeros(nk);
    ref_attention(q, k, v, dO, B, LQ, LK, H, D, scale, ro, rdq, rdk, rdv);

    ck_op_params p = params(H, scale_param);
    const ck_shape sq = {3, {B, LQ, HD}}, sk = {3, {B, LK, HD}};
    const ck_shape fwd_in[3] = {sq, sk, sk}, bwd_in[4] = {sq, sq, sk, sk}, bwd_out[3] = {sq, sk, sk};
    g_ws_fwd_bytes = ck_op_workspace(CK_OP_ATTENTION, &p, fwd_in, 3, &sq, omp_get_max_threads());
    g_ws_bwd_bytes = ck_op_workspace(CK_OP_ATTENTION_BWD, &p, bwd_in, 4, bwd_out, omp_get_max_threads());
    g_ws_fwd = malloc(g_ws_fwd_bytes), g_ws_bwd = malloc(g_ws_bwd_bytes);
    ck_view fin[3] = {view(q, 3, qs), view(k, 3, ks), view(v, 3, ks)}, fout[1] = {view(o, 3, qs)};
    ck_view bin[4] = {view(dO, 3, qs), view(q, 3, qs), view(k, 3, ks), view(v, 3, ks)};
    ck_view bout[3] = {view(dq, 3, qs), view(dk, 3, ks), view(dv, 3, ks)};
    call(ck_cpu_attention, &p, fout, 1, fin, 3);
    snprintf(name, sizeof name, "attention %s fwd vs ref", tag);
    check(name, err_ref(o, ro, nq), TOL_REF);
    call(ck_cpu_attention_bwd, &p, bout, 3, bin, 4);
    snprintf(name, sizeof name, "attention %s bwd dq/dk/dv vs ref", tag);
    check(name, fmax(err_ref(dq, rdq, nq), fmax(err_ref(dk, rdk, nk), err_ref(dv, rdv, nk))), TOL_REF);

    float *oo = zeros(nq);
    ck_view fdout[1] = {view(oo, 3, qs)};
    snprintf(name, sizeof name, "attention %s finite diff dq/dk/dv", tag);
    double e = fd_err(ck_cpu_attention, &p, fdout, fin, 3, dO, 0, dq);
    e = fmax(e, fd_err(ck_cpu_attention, &p, fdout, fin, 3, dO, 1, dk));
    e = fmax(e, fd_err(ck_cpu_attention, &p, fdout, fin, 3, dO, 2, dv));
    check(name, e, TOL_FD);

    float *dq2 = zeros(nq), *dk2 = zeros(nk), *dv2 = zeros(nk);
    ck_view bout2[3] = {view(dq2, 3, qs), view(dk2, 3, ks), view(dv2, 3, ks)};
    call(ck_cpu_attention, &p, fdout, 1, fin, 3);
    call(ck_cpu_attention_bwd, &p, bout2, 3, bin, 4);
    int same = !memcmp(o, oo, nq * 4) && !memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nk * 4) &&
               !memcmp(dv, dv2, nk * 4);
    // Small pairs always run one pair per thread with single-threaded sgemm, so the
    // thread count cannot matter; large ones may use OpenBLAS's threads, not checked.
    const int nt = omp_get_max_threads(), small = LQ * LK * D <= (1 << 20);
    if (small) {
        omp_set_num_threads(1);
        call(ck_cpu_attention, &p, fdout, 1, fin, 3);
        call(ck_cpu_attention_bwd, &p, bout2, 3, bin, 4);
        omp_set_num_threads(nt);
        same = same && !memcmp(o, oo, nq * 4) && !memcmp(dq, dq2, nq * 4) && !memcmp(dk, dk2, nk * 4) &&
               !memcmp(dv, dv2, nk * 4);
    }
    snprintf(name, sizeof name, "attention %s deterministic (twice%s)", tag,
             small ? ", and 1 thread vs max" : "");
    check_true(name, same);

    memset(dq2, 0, nq * 4), memset(dk2, 0, nk * 4), memset(dv2, 0, nk * 4);
    bout2[0].data = NULL, bout2[1].data = NULL;
    call(ck_cpu_attention_bwd, &p, bout2, 3, bin, 4);
    int ok = !memcmp(dv, dv2, nk * 4);
    for (int64_t i = 0; i < nk; i++) ok = ok && dk2[i] == 0;
    bout2[0].data = dq2, bout2[2].data = NULL;
    call(ck_cpu_attention_bwd, &p, bout2, 3, bin, 4);
    ok = ok && !memcmp(dq, dq2, nq * 4);
    snprintf(name, sizeof name, "attention %s bwd with unwanted outputs", tag);
    check_true(name, ok);

    free(g_ws_fwd), free(g_ws_bwd);
    g_ws_fwd = g_ws_bwd = NULL, g_ws_fwd_bytes = g_ws_bwd_bytes = 0;
    free(q), free(k), free(v), free(dO), free(o), free(dq), free(dk), free(dv), free(oo);
    free(ro), free(rdq), free(rdk), free(rdv), free(dq2), free(dk2), free(dv2);
}

int main(void)
{
    printf("threads: %d\n", omp_get_max_threads());
    {
        const int64_t s4[4] = {2, 6, 5, 7}, s3[3] = {3, 6, 9}, s2[2] = {5, 8}, s5[5] = {2, 12, 3, 5, 7};
        const int64_t big[4] = {3, 12, 31, 37}, big1[3] = {2, 3, 7001};
        test_group_norm("(2,6,5,7) G=1", 4, s4, 1, 0.0f);
        test_group_norm("(2,6,5,7) G=6 shifted", 4, s4, 6, 50.0f);
        test_group_norm("(3,6,9) G=6", 3, s3, 6, 0.0f);
        test_group_norm("(3,6,9) G=2", 3, s3, 2, -3.0f);
        test_group_norm("(5,8) G=2 no spatial", 2, s2, 2, 0.0f);
        test_group_norm("(5,8) G=1 no spatial", 2, s2, 1, 0.0f);
        test_group_norm("(5,8) G=8 no spatial", 2, s2, 8, 0.0f);
        test_group_norm("(2,12,3,5,7) G=3", 5, s5, 3, 0.0f);
        test_group_norm("(3,12,31,37) G=4 threaded", 4, big, 4, 1.0f);
        test_group_norm("(2,3,7001) G=1 threaded", 3, big1, 1, 0.0f);
    }
    {
        const int64_t a[2] = {7, 33}, b[3] = {2, 3, 65}, c[2] = {300, 131}, d[2] = {20, 2100}, e[2] = {1, 5};
        test_layer_norm("(7,33)", 2, a, 0.0f);
        test_layer_norm("(2,3,65) shifted", 3, b, 20.0f);
        test_layer_norm("(1,5)", 2, e, 0.0f);
        test_layer_norm("(300,131) threaded", 2, c, 0.0f);
        test_layer_norm("(20,2100) threaded, wider than one sweep", 2, d, 1.0f);
        test_layer_norm_optional_affine("(7,33)", 7, 33);
        test_layer_norm_optional_affine("(300,131) threaded", 300, 131);
    }
    {
        /* Flux's q/k norm (rows of the head dim), T5's (rows of d_model) */
        const int64_t a[3] = {2, 5, 128}, b[2] = {7, 33}, c[2] = {300, 131}, d[2] = {20, 2100}, e[2] = {1, 5};
        test_rms_norm("(2,5,128)", 3, a, 0.0f);
        test_rms_norm("(7,33) shifted", 2, b, 3.0f);
        test_rms_norm("(1,5)", 2, e, 0.0f);
        test_rms_norm("(300,131) threaded", 2, c, 0.0f);
        test_rms_norm("(20,2100) threaded, wider than one sweep", 2, d, 1.0f);
    }
    test_unary("silu", ck_cpu_silu, ck_cpu_silu_bwd, 0, 0, 99);
    test_unary("silu", ck_cpu_silu, ck_cpu_silu_bwd, 0, 0, 60003);
    test_unary("gelu erf", ck_cpu_gelu, ck_cpu_gelu_bwd, 0, 1, 99);
    test_unary("gelu erf", ck_cpu_gelu, ck_cpu_gelu_bwd, 0, 1, 60003);
    test_unary("gelu tanh", ck_cpu_gelu, ck_cpu_gelu_bwd, 1, 1, 99);
    test_unary("gelu tanh", ck_cpu_gelu, ck_cpu_gelu_bwd, 1, 1, 60003);
    /* above the threading threshold (65536 elements) */
    test_unary("silu", ck_cpu_silu, ck_cpu_silu_bwd, 0, 0, 100005);
    test_unary("gelu erf", ck_cpu_gelu, ck_cpu_gelu_bwd, 0, 1, 100005);
    test_unary("gelu tanh", ck_cpu_gelu, ck_cpu_gelu_bwd, 1, 1, 100005);
    test_unary("mish", ck_cpu_mish, ck_cpu_mish_bwd, 0, 2, 99);
    test_unary("mish", ck_cpu_mish, ck_cpu_mish_bwd, 0, 2, 60003);
    test_unary("mish", ck_cpu_mish, ck_cpu_mish_bwd, 0, 2, 100005);
    test_geglu(0, 7, 13);
    test_geglu(1, 7, 13);
    test_geglu(0, 301, 67);
    test_geglu(1, 301, 67);
    test_geglu(0, 301, 331); /* threaded */
    test_softmax(5, 17, 3.0f);
    test_softmax(3, 1, 1.0f);
    test_softmax(257, 131, 20.0f);
    test_softmax(601, 131, 20.0f); /* threaded */
    test_special();
    test_attention(2, 9, 9, 1, 5, 0.0f);
    test_attention(2, 17, 5, 3, 7, 0.0f);
    test_attention(1, 5, 17, 3, 7, 0.3f);
    test_attention(2, 13, 13, 3, 9, 0.0f);
    test_attention(2, 200, 201, 2, 9, 0.0f);
    // Pairs above SMALL_PAIR (LQ*LK*D > 2^20): fewer pairs than threads run one
    // after another with threaded sgemm, the rest one pair per thread.
    test_attention(1, 130, 131, 1, 65, 0.0f);
    test_attention(2, 300, 77, 2, 49, 0.0f);
    // Scores formed a block of query rows at a time (65536 / LK rows, 16 to 1024):
    // several blocks with a short last one, and the 16-row floor.
    test_attention(1, 300, 1000, 2, 8, 0.0f);
    test_attention(2, 40, 5000, 1, 4, 0.0f);
    test_attention(1, 1100, 20, 1, 4, 0.0f); /* at most 1024 rows a block */
    test_attention(1, 21, 21, 2, 128, 0.0f); /* Flux's head dim over a joint sequence (5 + 16 tokens) */
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
