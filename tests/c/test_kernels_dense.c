/* Checks the dense CPU kernels (matmul.c, conv2d.c, layout.c) against naive
 * double-precision references, adjoint identities, finite differences and
 * run-to-run determinism. Prints one line per check and "P passed, F failed". */
#include "cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerances: forward and backward kernels against the double reference must
 * agree normwise, max|got - ref| <= REL_TOL * max|ref|; adjoint identities
 * (<dy, conv(x)> vs <conv_bwd(dy), x>) to ADJ_TOL relative; central finite
 * differences of the fp32 forward kernel (eps 1e-2, exact for these linear maps
 * up to rounding) to FD_TOL relative. Layout ops are exact copies (bitwise). */
#define REL_TOL 1e-4
#define ADJ_TOL 1e-4
#define FD_TOL 1e-2
#define GUARD 16
#define GUARD_VAL 12345.678f

static int passed, failed;

static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    ok ? passed++ : failed++;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Buffers carry GUARD trailing floats set to GUARD_VAL to catch overruns. */
static float *buf(int64_t n)
{
    float *p = malloc((size_t)(n + GUARD) * sizeof(float));
    for (int64_t i = 0; i < n + GUARD; i++) p[i] = GUARD_VAL;
    return p;
}
static float *rbuf(int64_t n)
{
    float *p = buf(n);
    for (int64_t i = 0; i < n; i++) p[i] = frand();
    return p;
}
static int guard_ok(const float *p, int64_t n)
{
    for (int i = 0; i < GUARD; i++)
        if (p[n + i] != GUARD_VAL) return 0;
    return 1;
}
/* Fill the live part with garbage so a kernel that accumulates instead of
 * overwriting is caught. */
static void poison(float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) p[i] = 777.0f;
}

static ck_view view(float *data, int ndim, const int64_t *shape)
{
    ck_view v;
    memset(&v, 0, sizeof v);
    v.data = data, v.ndim = ndim;
    for (int d = 0; d < ndim; d++) v.shape[d] = shape[d];
    return v;
}

static double rel_err(const float *got, const double *ref, int64_t n)
{
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d; /* NaN propagates as failure */
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    return m > 0 ? e / m : e;
}

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static ck_kctx kctx(void *ws, size_t bytes)
{
    ck_kctx c;
    memset(&c, 0, sizeof c);
    c.ws = ws, c.ws_bytes = bytes;
    return c;
}

/* ---------------------------------------------------------------- matmul */

static void test_matmul(const char *name, int nb, const int64_t *batch, int bbatched, int64_t M, int64_t K,
                        int64_t N, int ta, int tb)
{
    int64_t B = 1;
    for (int i = 0; i < nb; i++) B *= batch[i];
    int64_t as[8], bs[8], ys[8];
    for (int i = 0; i < nb; i++) as[i] = ys[i] = batch[i];
    as[nb] = ta ? K : M, as[nb + 1] = ta ? M : K;
    ys[nb] = M, ys[nb + 1] = N;
    int bnd;
    if (bbatched == 2) { /* b batch of 1, written as a leading 1 */
        bs[0] = 1, bnd = 3;
    } else if (bbatched) {
        for (int i = 0; i < nb; i++) bs[i] = batch[i];
        bnd = nb + 2;
    } else {
        bnd = 2;
    }
    bs[bnd - 2] = tb ? N : K, bs[bnd - 1] = tb ? K : N;
    const int64_t bB = bbatched == 1 ? B : 1;
    float *a = rbuf(B * M * K), *b = rbuf(bB * K * N), *y = buf(B * M * N), *y2 = buf(B * M * N);
    double *ref = malloc((size_t)(B * M * N) * sizeof(double));
    for (int64_t i = 0; i < B; i++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                const int64_t bi = bbatched == 1 ? i : 0;
                for (int64_t k = 0; k < K; k++) {
                    double av = ta ? a[i * M * K + k * M + m] : a[i * M * K + m * K + k];
                    double bv = tb ? b[bi * K * N + n * K + k] : b[bi * K * N + k * N + n];
                    s += av * bv;
                }
                ref[(i * M + m) * N + n] = s;
            }
    ck_view in[2] = {view(a, nb + 2, as), view(b, bnd, bs)};
    ck_view out[1] = {view(y, nb + 2, ys)};
    ck_op_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = ta, p.i[1] = tb;
    ck_kctx c = kctx(NULL, 0);
    poison(y, B * M * N);
    ck_cpu_matmul(&c, &p, out, 1, in, 2);
    double e = rel_err(y, ref, B * M * N);
    check(e <= REL_TOL && guard_ok(y, B * M * N), "matmul %s (B=%lld M=%lld K=%lld N=%lld ta=%d tb=%d) err %.2e",
          name, (long long)B, (long long)M, (long long)K, (long long)N, ta, tb, e);
    out[0].data = y2;
    ck_cpu_matmul(&c, &p, out, 1, in, 2);
    check(!memcmp(y, y2, (size_t)(B * M * N) * sizeof(float)), "matmul %s deterministic", name);
    free(a), free(b), free(y), free(y2), free(ref);
}

static void test_linear(int64_t R1, int64_t R2, int64_t IN, int64_t OUT, int with_bias)
{
    const int64_t R = R1 * R2;
    float *x = rbuf(R * IN), *w = rbuf(OUT * IN), *b = rbuf(OUT), *y = buf(R * OUT), *y2 = buf(R * OUT);
    double *ref = malloc((size_t)(R * OUT) * sizeof(double));
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < OUT; o++) {
            double s = with_bias ? b[o] : 0.0;
            for (int64_t k = 0; k < IN; k++) s += (double)x[r * IN + k] * w[o * IN + k];
            ref[r * OUT + o] = s;
        }
    int64_t xs[3] = {R1, R2, IN}, ws[2] = {OUT, IN}, bs[1] = {OUT}, ys[3] = {R1, R2, OUT};
    ck_view in[3] = {view(x, 3, xs), view(w, 2, ws), view(b, 1, bs)};
    ck_view out[1] = {view(y, 3, ys)};
    ck_op_params p;
    memset(&p, 0, sizeof p);
    ck_kctx c = kctx(NULL, 0);
    poison(y, R * OUT);
    ck_cpu_linear(&c, &p, out, 1, in, with_bias ? 3 : 2);
    double e = rel_err(y, ref, R * OUT);
    check(e <= REL_TOL && guard_ok(y, R * OUT), "linear (%lldx%lld,%lld)->%lld bias=%d err %.2e", (long long)R1,
          (long long)R2, (long long)IN, (long long)OUT, with_bias, e);
    out[0].data = y2;
    ck_cpu_linear(&c, &p, out, 1, in, with_bias ? 3 : 2);
    check(!memcmp(y, y2, (size_t)(R * OUT) * sizeof(float)), "linear deterministic");
    free(x), free(w), free(b), free(y), free(y2), free(ref);
}

/* A product's values depend on neither the thread count nor, for an input
 * with a leading batch dim, the other samples of the batch: the same sample
 * alone (batch 1) and as the middle one of three, on 1, 2 and 3 threads, gives
 * the same bits (sgemm's value for a row can depend on the call's size and
 * the row's place in it, so the kernels cut products into blocks fixed by the
 * shapes alone). */
static void test_invariance(const char *op)
{
    const int64_t S = 300, IN = 129, OUT = 171; /* 2 S IN OUT x 3 > 10 MFLOP: threaded */
    float *x = rbuf(3 * S * IN), *w = rbuf(OUT * IN), *b = rbuf(OUT), *y3 = buf(3 * S * OUT), *y1 = buf(S * OUT);
    const int lin = !strcmp(op, "linear");
    const int saved = omp_get_max_threads();
    int same = 1;
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        for (int B = 1; B <= 3; B += 2) {
            int64_t xs[3] = {B, S, IN}, ws[2] = {OUT, IN}, wt[2] = {IN, OUT}, bs[1] = {OUT}, ys[3] = {B, S, OUT};
            /* batch 1 holds the middle sample of the three */
            ck_view in[3] = {view(B == 3 ? x : x + S * IN, 3, xs), view(w, 2, lin ? ws : wt), view(b, 1, bs)};
            ck_view out[1] = {view(B == 3 ? y3 : y1, 3, ys)};
            ck_op_params p;
            memset(&p, 0, sizeof p);
            ck_kctx c = kctx(NULL, 0);
            if (lin) ck_cpu_linear(&c, &p, out, 1, in, 3);
            else ck_cpu_matmul(&c, &p, out, 1, in, 2);
        }
        static float first[300 * 171];
        if (threads == 1) memcpy(first, y1, sizeof first);
        same &= !memcmp(y1, y3 + S * OUT, (size_t)(S * OUT) * sizeof(float)) &&
                !memcmp(y1, first, (size_t)(S * OUT) * sizeof(float));
    }
    omp_set_num_threads(saved);
    check(same, "%s [3,300,129] -> 171: a sample's output is bitwise the same alone and in a batch of 3, on 1, 2 and 3 "
                "threads",
          op);
    free(x), free(w), free(b), free(y3), free(y1);
}

/* ---------------------------------------------------------------- conv2d */

typedef struct conv_case {
    int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw;
    int bias;
} conv_case;

static double xat(const float *x, const conv_case *k, int64_t n, int64_t c, int64_t h, int64_t w)
{
    if (h < 0 || h >= k->H || w < 0 || w >= k->W) return 0.0;
    return x[((n * k->C + c) * k->H + h) * k->W + w];
}

static void test_conv(const conv_case *k)
{
    const int64_t HO = (k->H + 2 * k->ph - k->KH) / k->sh + 1, WO = (k->W + 2 * k->pw - k->KW) / k->sw + 1;
    const int64_t nx = k->N * k->C * k->H * k->W, nw = k->O * k->C * k->KH * k->KW, ny = k->N * k->O * HO * WO;
    const int64_t nws = k->C * k->KH * k->KW * HO * WO;
    char tag[160];
    snprintf(tag, sizeof tag, "N%lld C%lld %lldx%lld O%lld k%lldx%lld s%lld,%lld p%lld,%lld%s", (long long)k->N,
             (long long)k->C, (long long)k->H, (long long)k->W, (long long)k->O, (long long)k->KH,
             (long long)k->KW, (long long)k->sh, (long long)k->sw, (long long)k->ph, (long long)k->pw,
             k->bias ? " bias" : "");

    float *x = rbuf(nx), *w = rbuf(nw), *b = rbuf(k->O), *dy = rbuf(ny);
    float *y = buf(ny), *y2 = buf(ny), *dx = buf(nx), *dx2 = buf(nx), *dw = buf(nw), *dw2 = buf(nw);
    float *db = buf(k->O), *db2 = buf(k->O), *ws = buf(nws);
    double *ry = malloc((size_t)ny * sizeof(double)), *rdx = calloc((size_t)nx, sizeof(double));
    double *rdw = calloc((size_t)nw, sizeof(double)), *rdb = calloc((size_t)k->O, sizeof(double));

    /* Direct 7-loop references. */
    for (int64_t n = 0; n < k->N; n++)
        for (int64_t o = 0; o < k->O; o++)
            for (int64_t ho = 0; ho < HO; ho++)
                for (int64_t wo = 0; wo < WO; wo++) {
                    double s = k->bias ? b[o] : 0.0;
                    const double g = dy[((n * k->O + o) * HO + ho) * WO + wo];
                    rdb[o] += g;
                    for (int64_t c = 0; c < k->C; c++)
                        for (int64_t i = 0; i < k->KH; i++)
                            for (int64_t j = 0; j < k->KW; j++) {
                                const int64_t h = ho * k->sh - k->ph + i, ww = wo * k->sw - k->pw + j;
                                const int64_t wi = ((o * k->C + c) * k->KH + i) * k->KW + j;
                                const double xv = xat(x, k, n, c, h, ww);
                                s += w[wi] * xv;
                                rdw[wi] += g * xv;
                                if (h >= 0 && h < k->H && ww >= 0 && ww < k->W)
                                    rdx[((n * k->C + c) * k->H + h) * k->W + ww] += g * w[wi];
                            }
                    ry[((n * k->O + o) * HO + ho) * WO + wo] = s;
                }

    int64_t xs[4] = {k->N, k->C, k->H, k->W}, wsh[4] = {k->O, k->C, k->KH, k->KW}, bs[1] = {k->O};
    int64_t ys[4] = {k->N, k->O, HO, WO};
    ck_op_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = k->sh, p.i[1] = k->sw, p.i[2] = k->ph, p.i[3] = k->pw;
    ck_kctx c = kctx(ws, (size_t)nws * sizeof(float));

    /* forward */
    ck_view fin[3] = {view(x, 4, xs), view(w, 4, wsh), view(b, 1, bs)};
    ck_view fout[1] = {view(y, 4, ys)};
    poison(y, ny);
    ck_cpu_conv2d(&c, &p, fout, 1, fin, k->bias ? 3 : 2);
    double e = rel_err(y, ry, ny);
    check(e <= REL_TOL && guard_ok(y, ny) && guard_ok(ws, nws), "conv2d fwd %s err %.2e", tag, e);
    fout[0].data = y2;
    ck_cpu_conv2d(&c, &p, fout, 1, fin, k->bias ? 3 : 2);
    check(!memcmp(y, y2, (size_t)ny * sizeof(float)), "conv2d fwd %s deterministic", tag);

    /* data gradient */
    ck_view din[2] = {view(dy, 4, ys), view(w, 4, wsh)};
    ck_view dout[1] = {view(dx, 4, xs)};
    poison(dx, nx);
    ck_cpu_conv2d_bwd_data(&c, &p, dout, 1, din, 2);
    e = rel_err(dx, rdx, nx);
    check(e <= REL_TOL && guard_ok(dx, nx) && guard_ok(ws, nws), "conv2d bwd_data %s err %.2e", tag, e);
    dout[0].data = dx2;
    ck_cpu_conv2d_bwd_data(&c, &p, dout, 1, din, 2);
    check(!memcmp(dx, dx2, (size_t)nx * sizeof(float)), "conv2d bwd_data %s deterministic", tag);

    /* filter and bias gradients */
    ck_view gin[2] = {view(dy, 4, ys), view(x, 4, xs)};
    ck_view gout[2] = {view(dw, 4, wsh), view(db, 1, bs)};
    poison(dw, nw), poison(db, k->O);
    ck_cpu_conv2d_bwd_filter(&c, &p, gout, 2, gin, 2);
    e = rel_err(dw, rdw, nw);
    double eb = rel_err(db, rdb, k->O);
    check(e <= REL_TOL && eb <= REL_TOL && guard_ok(dw, nw) && guard_ok(db, k->O) && guard_ok(ws, nws),
          "conv2d bwd_filter %s dw err %.2e db err %.2e", tag, e, eb);
    gout[0].data = dw2, gout[1].data = db2;
    ck_cpu_conv2d_bwd_filter(&c, &p, gout, 2, gin, 2);
    check(!memcmp(dw, dw2, (size_t)nw * sizeof(float)) && !memcmp(db, db2, (size_t)k->O * sizeof(float)),
          "conv2d bwd_filter %s deterministic", tag);

    /* Either output unwanted: the other is unchanged and nothing else is touched. */
    poison(dw2, nw), poison(db2, k->O);
    gout[0].data = NULL, gout[1].data = db2;
    ck_kctx c0 = kctx(NULL, 0);
    ck_cpu_conv2d_bwd_filter(&c0, &p, gout, 2, gin, 2);
    int ok = !memcmp(db, db2, (size_t)k->O * sizeof(float));
    gout[0].data = dw2, gout[1].data = NULL;
    ck_cpu_conv2d_bwd_filter(&c, &p, gout, 2, gin, 2);
    ok = ok && !memcmp(dw, dw2, (size_t)nw * sizeof(float));
    check(ok, "conv2d bwd_filter %s with dw / db unwanted", tag);

    /* Adjoint identities for the bias-free conv: <dy, conv(x, w)> equals
     * <bwd_data(dy), x> and <bwd_filter(dy, x), w>. */
    fout[0].data = y2;
    ck_cpu_conv2d(&c, &p, fout, 1, fin, 2);
    const double lhs = dot(dy, y2, ny), r1 = dot(dx, x, nx), r2 = dot(dw, w, nw);
    const double sc = fabs(lhs) + 1e-6 * sqrt((double)ny);
    check(fabs(lhs - r1) <= ADJ_TOL * sc && fabs(lhs - r2) <= ADJ_TOL * sc,
          "conv2d adjoint %s <dy,Ax>=%.6g <A'dy,x>=%.6g <dW,w>=%.6g", tag, lhs, r1, r2);

    /* Central finite differences of L(x, w, b) = <dy, conv(x, w, b)> computed with
     * the fp32 forward kernel, at a few random coordinates of x, w and b. */
    const float eps = 1e-2f;
    double worst = 0;
    for (int t = 0; t < 9; t++) {
        float *v, g;
        int64_t idx;
        if (t < 3) {
            idx = (int64_t)((frand() * 0.5 + 0.5) * (double)nx) % nx, v = x, g = dx[idx];
        } else if (t < 6) {
            idx = (int64_t)((frand() * 0.5 + 0.5) * (double)nw) % nw, v = w, g = dw[idx];
        } else {
            idx = (int64_t)((frand() * 0.5 + 0.5) * (double)k->O) % k->O, v = b, g = db[idx];
        }
        const float old = v[idx];
        v[idx] = old + eps;
        ck_cpu_conv2d(&c, &p, fout, 1, fin, 3);
        const double lp = dot(dy, y2, ny);
        v[idx] = old - eps;
        ck_cpu_conv2d(&c, &p, fout, 1, fin, 3);
        const double lm = dot(dy, y2, ny);
        v[idx] = old;
        const double fd = (lp - lm) / (2.0 * eps);
        const double r = fabs(fd - g) / (fabs(g) + 1e-2 * sqrt((double)(k->C * k->KH * k->KW)));
        if (r > worst) worst = r;
    }
    check(worst <= FD_TOL, "conv2d finite differences %s worst rel %.2e", tag, worst);

    free(x), free(w), free(b), free(dy), free(y), free(y2), free(dx), free(dx2), free(dw), free(dw2);
    free(db), free(db2), free(ws), free(ry), free(rdx), free(rdw), free(rdb);
}

/* ---------------------------------------------------------------- layout */

static int64_t numel(int nd, const int64_t *s)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= s[d];
    return n;
}

static void test_concat(int nd, const int64_t *as, int64_t bdim, int dim)
{
    int64_t bs[CK_MAX_DIMS], ys[CK_MAX_DIMS];
    for (int d = 0; d < nd; d++) bs[d] = ys[d] = as[d];
    bs[dim] = bdim, ys[dim] = as[dim] + bdim;
    const int64_t na = numel(nd, as), nb = numel(nd, bs), ny = numel(nd, ys);
    float *a = rbuf(na), *b = rbuf(nb), *y = buf(ny);
    ck_view in[2] = {view(a, nd, as), view(b, nd, bs)};
    ck_view out[1] = {view(y, nd, ys)};
    ck_op_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim;
    ck_kctx c = kctx(NULL, 0);
    poison(y, ny);
    ck_cpu_concat(&c, &p, out, 1, in, 2);
    int64_t P = 1, Q = 1;
    for (int d = 0; d < dim; d++) P *= as[d];
    for (int d = dim + 1; d < nd; d++) Q *= as[d];
    int ok = guard_ok(y, ny);
    for (int64_t i = 0; i < P && ok; i++)
        for (int64_t j = 0; j < ys[dim] && ok; j++)
            for (int64_t q = 0; q < Q; q++) {
                float want = j < as[dim] ? a[(i * as[dim] + j) * Q + q] : b[(i * bdim + j - as[dim]) * Q + q];
                if (y[(i * ys[dim] + j) * Q + q] != want) ok = 0;
            }
    check(ok, "concat rank %d dim %d (%lld elements)", nd, dim, (long long)ny);
    free(a), free(b), free(y);
}

static void test_slice(int nd, const int64_t *xs, int dim, int64_t start, int64_t len)
{
    int64_t ys[CK_MAX_DIMS];
    for (int d = 0; d < nd; d++) ys[d] = xs[d];
    ys[dim] = len;
    const int64_t nx = numel(nd, xs), ny = numel(nd, ys);
    float *x = rbuf(nx), *y = buf(ny);
    ck_view in[1] = {view(x, nd, xs)};
    ck_view out[1] = {view(y, nd, ys)};
    ck_op_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim, p.i[1] = start, p.i[2] = len;
    ck_kctx c = kctx(NULL, 0);
    poison(y, ny);
    ck_cpu_slice(&c, &p, out, 1, in, 1);
    int64_t P = 1, Q = 1;
    for (int d = 0; d < dim; d++) P *= xs[d];
    for (int d = dim + 1; d < nd; d++) Q *= xs[d];
    int ok = guard_ok(y, ny);
    for (int64_t i = 0; i < P && ok; i++)
        for (int64_t j = 0; j < len && ok; j++)
            for (int64_t q = 0; q < Q; q++)
                if (y[(i * len + j) * Q + q] != x[(i * xs[dim] + start + j) * Q + q]) ok = 0;
    check(ok, "slice rank %d dim %d [%lld, +%lld)", nd, dim, (long long)start, (long long)len);
    free(x), free(y);
}

static void test_reshape(void)
{
    const int64_t n = 300 * 1001; /* large enough for the threaded copy */
    int64_t xs[2] = {300, 1001}, ys[3] = {2100, 11, 13};
    float *x = rbuf(n), *y = buf(n);
    ck_view in[1] = {view(x, 2, xs)};
    ck_view out[1] = {view(y, 3, ys)};
    ck_op_params p;
    memset(&p, 0, sizeof p);
    ck_kctx c = kctx(NULL, 0);
    poison(y, n);
    ck_cpu_reshape(&c, &p, out, 1, in, 1);
    int ok = !memcmp(x, y, (size_t)n * sizeof(float)) && guard_ok(y, n);
    float *keep = buf(n);
    memcpy(keep, x, (size_t)n * sizeof(float));
    out[0].data = x;
    ck_cpu_reshape(&c, &p, out, 1, in, 1);
    ok = ok && !memcmp(x, keep, (size_t)n * sizeof(float));
    check(ok, "reshape copy and aliased no-op");
    free(x), free(y), free(keep);
}

static void test_permute(int nd, const int64_t *xs, const int *perm)
{
    int64_t ys[CK_MAX_DIMS], ist[CK_MAX_DIMS];
    for (int j = 0; j < nd; j++) ys[j] = xs[perm[j]];
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) ist[d] = s, s *= xs[d];
    const int64_t n = numel(nd, xs);
    float *x = rbuf(n), *y = buf(n), *y2 = buf(n);
    ck_view in[1] = {view(x, nd, xs)};
    ck_view out[1] = {view(y, nd, ys)};
    ck_op_params p;
    memset(&p, 0, sizeof p);
    for (int j = 0; j < nd; j++) p.i[j] = perm[j];
    ck_kctx c = kctx(NULL, 0);
    poison(y, n);
    ck_cpu_permute(&c, &p, out, 1, in, 1);
    int ok = guard_ok(y, n);
    for (int64_t o = 0; o < n && ok; o++) {
        int64_t r = o, io = 0;
        for (int j = nd - 1; j >= 0; j--) io += (r % ys[j]) * ist[perm[j]], r /= ys[j];
        if (y[o] != x[io]) ok = 0;
    }
    out[0].data = y2;
    ck_cpu_permute(&c, &p, out, 1, in, 1);
    ok = ok && !memcmp(y, y2, (size_t)n * sizeof(float));
    char desc[128];
    int len = 0;
    for (int j = 0; j < nd; j++) len += snprintf(desc + len, sizeof desc - (size_t)len, "%lld%s", (long long)xs[j], j + 1 < nd ? "x" : " perm ");
    for (int j = 0; j < nd; j++) len += snprintf(desc + len, sizeof desc - (size_t)len, "%d", perm[j]);
    check(ok, "permute %s", desc);
    free(x), free(y), free(y2);
}

static void test_upsample(int64_t N, int64_t C, int64_t H, int64_t W)
{
    const int64_t nx = N * C * H * W, ny = 4 * nx;
    int64_t xs[4] = {N, C, H, W}, ys[4] = {N, C, 2 * H, 2 * W};
    float *x = rbuf(nx), *y = buf(ny), *dy = rbuf(ny), *dx = buf(nx), *dx2 = buf(nx);
    ck_op_params p;
    memset(&p, 0, sizeof p);
    ck_kctx c = kctx(NULL, 0);
    ck_view fin[1] = {view(x, 4, xs)}, fout[1] = {view(y, 4, ys)};
    poison(y, ny);
    ck_cpu_upsample2x(&c, &p, fout, 1, fin, 1);
    int ok = guard_ok(y, ny);
    for (int64_t i = 0; i < N * C && ok; i++)
        for (int64_t h = 0; h < 2 * H; h++)
            for (int64_t w = 0; w < 2 * W; w++)
                if (y[(i * 2 * H + h) * 2 * W + w] != x[(i * H + h / 2) * W + w / 2]) ok = 0;
    check(ok, "upsample2x %lldx%lldx%lldx%lld", (long long)N, (long long)C, (long long)H, (long long)W);

    ck_view bin[1] = {view(dy, 4, ys)}, bout[1] = {view(dx, 4, xs)};
    poison(dx, nx);
    ck_cpu_upsample2x_bwd(&c, &p, bout, 1, bin, 1);
    double *ref = malloc((size_t)nx * sizeof(double));
    for (int64_t i = 0; i < N * C; i++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++) {
                const float *d = dy + (i * 2 * H + 2 * h) * 2 * W + 2 * w;
                ref[(i * H + h) * W + w] = (double)d[0] + d[1] + d[2 * W] + d[2 * W + 1];
            }
    double e = rel_err(dx, ref, nx);
    const double lhs = dot(dy, y, ny), rhs = dot(dx, x, nx);
    bout[0].data = dx2;
    ck_cpu_upsample2x_bwd(&c, &p, bout, 1, bin, 1);
    check(e <= 1e-6 && guard_ok(dx, nx) && fabs(lhs - rhs) <= ADJ_TOL * (fabs(lhs) + 1) &&
              !memcmp(dx, dx2, (size_t)nx * sizeof(float)),
          "upsample2x_bwd err %.2e, adjoint %.6g vs %.6g, deterministic", e, lhs, rhs);
    free(x), free(y), free(dy), free(dx), free(dx2), free(ref);
}

int main(void)
{
    /* matmul: every transpose combination, batched a with shared b (one tall
     * sgemm), b with leading batch 1, and per-batch b. */
    const int64_t b1[1] = {3}, b2[2] = {2, 3};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) test_matmul("2-D", 0, NULL, 0, 7, 13, 5, ta, tb);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) test_matmul("batched a, 2-D b", 2, b2, 0, 9, 6, 11, ta, tb);
    test_matmul("batched a, b batch 1", 1, b1, 2, 5, 8, 3, 0, 1);
    test_matmul("batched a, b batch 1", 1, b1, 2, 5, 8, 3, 1, 0);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) test_matmul("batched a and b", 2, b2, 1, 4, 17, 6, ta, tb);
    test_matmul("large", 1, b1, 0, 129, 200, 77, 0, 0);
    /* Above 10 MFLOP the product is split over threads (rows, or columns when
     * the output is wider than tall); odd sizes leave unequal shares. */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_matmul("split rows", 0, NULL, 0, 251, 201, 211, ta, tb);
            test_matmul("split columns", 0, NULL, 0, 61, 201, 803, ta, tb);
        }
    const int64_t b5[1] = {5};
    test_matmul("split per-batch b", 1, b1, 1, 131, 121, 211, 1, 0);
    test_matmul("split per-batch b", 1, b5, 1, 65, 101, 317, 0, 1);

    test_linear(2, 3, 7, 5, 1);
    test_linear(2, 3, 7, 5, 0);
    test_linear(5, 67, 33, 130, 1);
    test_linear(7, 67, 129, 171, 1); /* split over threads */
    test_linear(7, 67, 129, 171, 0);
    test_invariance("linear");
    test_invariance("matmul");

    const conv_case cases[] = {
        {2, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1, 1},    /* 3x3 same */
        {2, 3, 8, 7, 5, 3, 3, 2, 2, 1, 1, 1},    /* stride 2, pad 1 */
        {2, 5, 6, 5, 3, 1, 1, 1, 1, 0, 0, 1},    /* 1x1 direct path */
        {2, 4, 9, 11, 3, 3, 5, 1, 2, 1, 2, 0},   /* 3x5 kernel, mixed stride */
        {1, 2, 5, 5, 3, 1, 1, 2, 2, 0, 0, 1},    /* 1x1 stride 2 (im2col path) */
        {2, 3, 7, 7, 2, 4, 4, 2, 2, 1, 1, 0},    /* even kernel, downsampling */
        {1, 2, 4, 4, 2, 3, 3, 1, 1, 2, 2, 1},    /* padding wider than needed */
        {2, 3, 5, 6, 2, 5, 3, 3, 1, 0, 1, 1},    /* kernel taller than stride */
        {2, 16, 33, 31, 8, 3, 3, 1, 1, 1, 1, 1}, /* large enough to thread im2col/col2im */
        {2, 32, 24, 20, 16, 1, 1, 1, 1, 0, 0, 1}, /* large 1x1 */
        /* above 10 MFLOP: split over threads, unequal shares */
        {2, 16, 17, 19, 80, 3, 3, 1, 1, 1, 1, 1},
        {2, 24, 25, 27, 40, 3, 3, 1, 1, 1, 1, 1},  /* O < 64: filter gradient via dw^T */
        {2, 48, 4, 4, 40, 1, 1, 1, 1, 0, 0, 1},    /* 1x1, fewer pixels than channels */
        {2, 48, 2, 2, 40, 3, 3, 1, 1, 1, 1, 1},    /* 3x3, fewer pixels than channels */
        {2, 48, 21, 23, 80, 3, 3, 2, 2, 1, 1, 1},  /* stride 2, columns cut mid-row */
        {2, 64, 20, 22, 96, 1, 1, 1, 1, 0, 0, 0},  /* 1x1 direct */
        {1, 1, 96, 96, 128, 3, 3, 1, 1, 1, 1, 1},  /* one input channel: a thread has none */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_conv(&cases[i]);

    const int64_t s4[4] = {3, 4, 5, 6};
    for (int d = 0; d < 4; d++) test_concat(4, s4, 2 + d, d);
    const int64_t s2[2] = {300, 257};
    test_concat(2, s2, 129, 1);
    test_concat(2, s2, 129, 0);
    const int64_t s2big[2] = {1200, 257}; /* above the threading threshold */
    test_concat(2, s2big, 129, 1);
    test_concat(2, s2big, 129, 0);
    for (int d = 0; d < 4; d++) test_slice(4, s4, d, 1, s4[d] - 2);
    const int64_t s3[3] = {64, 40, 33};
    test_slice(3, s3, 1, 7, 20);
    test_slice(3, s3, 0, 10, 50);
    const int64_t s3big[3] = {300, 40, 33};
    test_slice(3, s3big, 1, 7, 30);
    test_slice(3, s3big, 0, 10, 250);
    test_reshape();

    const int p_id[4] = {0, 1, 2, 3}, p_swap[4] = {0, 2, 1, 3}, p_nhwc[4] = {0, 2, 3, 1}, p_rev[4] = {3, 2, 1, 0};
    const int p_nchw[4] = {0, 3, 1, 2};
    test_permute(4, s4, p_id);
    test_permute(4, s4, p_swap);
    test_permute(4, s4, p_nhwc);
    test_permute(4, s4, p_rev);
    test_permute(4, s4, p_nchw);
    const int64_t s6[6] = {2, 3, 1, 4, 5, 3};
    const int p6[6] = {4, 2, 0, 5, 3, 1}, p6b[6] = {0, 1, 3, 2, 4, 5};
    test_permute(6, s6, p6);
    test_permute(6, s6, p6b);
    const int64_t big[4] = {4, 37, 23, 65}; /* threaded, tile edges */
    test_permute(4, big, p_swap);
    test_permute(4, big, p_nhwc);
    test_permute(4, big, p_rev);
    const int64_t bigger[4] = {4, 37, 47, 65}; /* above the threading threshold */
    test_permute(4, bigger, p_swap);
    test_permute(4, bigger, p_nhwc);
    test_permute(4, bigger, p_rev);
    const int64_t ones[4] = {1, 70, 1, 90};
    test_permute(4, ones, p_rev);
    const int p2[2] = {1, 0};
    const int64_t m2[2] = {1, 9};
    test_permute(2, m2, p2);

    test_upsample(2, 3, 5, 7);
    test_upsample(2, 16, 33, 17);
    test_upsample(2, 64, 33, 37);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
