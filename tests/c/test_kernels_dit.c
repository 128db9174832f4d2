/* The CPU kernels of a diffusion transformer's block (rope.c, modulate.c):
 * ROPE against Black Forest Labs' rope/apply_rope computed in double from
 * token positions (3 axes of 4, 6 and 6 dims, theta 10000, text tokens at 0
 * and image tokens on a grid), its inverse, its layouts and its gradient;
 * MODULATE and GATE and their backwards against double references and
 * central finite differences, repeated bitwise at any thread count, with
 * unwanted outputs left alone. Tolerances as test_kernels_nn: references
 * 1e-4 relative (rounding of fp32 arithmetic), finite differences 1e-2. */
#include "../../ops/cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_REF 1e-4
#define TOL_FD 1e-2
#define FD_EPS 1e-3f

static int npass, nfail;
static uint64_t rng = 0x243f6a8885a308d3ULL;

static float frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rnd(int64_t n, float scale, float shift)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = shift + scale * frand();
    return x;
}

static float *filled(int64_t n, float v)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = v;
    return x;
}

static ck_view view(float *d, int nd, const int64_t *shape)
{
    ck_view v;
    memset(&v, 0, sizeof v);
    v.data = d, v.ndim = nd;
    for (int i = 0; i < nd; i++) v.shape[i] = shape[i];
    return v;
}

static void call(ck_kernel_fn k, const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin)
{
    ck_kctx ctx;
    memset(&ctx, 0, sizeof ctx);
    k(&ctx, p, out, nout, in, nin);
}

static void check(const char *name, double err, double tol)
{
    const int ok = err <= tol && err == err;
    printf("%s %s: err %.3g (tol %.0e)\n", ok ? "PASS" : "FAIL", name, err, tol);
    ok ? npass++ : nfail++;
}

static void check_true(const char *name, int ok)
{
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    ok ? npass++ : nfail++;
}

static double err_ref(const float *got, const double *ref, int64_t n)
{
    double mx = 0, e = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-2 * mx + 1e-30));
    return e;
}

/* sum(w * y) in double for the forward f */
static double loss(ck_kernel_fn f, const ck_op_params *p, ck_view *out, const ck_view *in, int nin, const float *w)
{
    call(f, p, out, 1, in, nin);
    const int64_t n = ck_view_numel(out);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)w[i] * out->data[i];
    return s;
}

/* central difference of loss along a random direction of input `which`, against grad . delta */
static double fd_err(ck_kernel_fn f, const ck_op_params *p, ck_view *out, ck_view *in, int nin, const float *w,
                     int which, const float *grad)
{
    const int64_t n = ck_view_numel(&in[which]);
    float *x = in[which].data, *x0 = malloc(sizeof(float) * (size_t)n), *xp = malloc(sizeof(float) * (size_t)n),
          *xm = malloc(sizeof(float) * (size_t)n);
    memcpy(x0, x, sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const float u = frand();
        xp[i] = x0[i] + FD_EPS * u;
        xm[i] = x0[i] - FD_EPS * u;
    }
    memcpy(x, xp, sizeof(float) * (size_t)n);
    const double lp = loss(f, p, out, in, nin, w);
    memcpy(x, xm, sizeof(float) * (size_t)n);
    const double lm = loss(f, p, out, in, nin, w);
    memcpy(x, x0, sizeof(float) * (size_t)n);
    double ana = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)xp[i] - xm[i];
        ana += grad[i] * d;
        mag += fabs(grad[i] * d);
    }
    free(x0), free(xp), free(xm);
    return fabs((lp - lm) - ana) / fmax(fabs(ana), 1e-3 * mag + 1e-30);
}

/* ---------------- rope ---------------- */

/* BFL's EmbedND: per axis i of dims d_i, omega_j = 1 / theta^(2j / d_i) and the
 * angle pos_i * omega_j, in float64 (torch.arange(..., dtype=float64)), axes
 * concatenated; table row l holds (cos, sin) per pair, rounded to float as
 * BFL's .float() does. ids [L, 3]. */
static const int AXES[3] = {4, 6, 6};
#define HEAD 16
#define THETA 10000.0

static void make_table(float *tab, double *ang, const double *ids, int64_t L)
{
    for (int64_t l = 0; l < L; l++) {
        int64_t j = 0;
        for (int a = 0; a < 3; a++)
            for (int k = 0; k < AXES[a] / 2; k++, j++) {
                const double omega = 1.0 / pow(THETA, (double)(2 * k) / AXES[a]);
                const double th = ids[l * 3 + a] * omega;
                ang[l * (HEAD / 2) + j] = th;
                tab[l * HEAD + 2 * j] = (float)cos(th);
                tab[l * HEAD + 2 * j + 1] = (float)sin(th);
            }
    }
}

/* 3 text tokens (ids 0) then a 2 x 4 grid of image tokens (0, row, col), as
 * BFL's prepare() lays them out */
#define LT 3
#define GH 2
#define GW 4
#define L (LT + GH * GW)

static void flux_ids(double *ids)
{
    for (int l = 0; l < L; l++) {
        ids[3 * l] = 0;
        ids[3 * l + 1] = l < LT ? 0 : (l - LT) / GW;
        ids[3 * l + 2] = l < LT ? 0 : (l - LT) % GW;
    }
}

static void test_rope(void)
{
    enum { B = 2, H = 3, F = H * HEAD };
    double ids[L * 3], ang[L * HEAD / 2];
    float tab[L * HEAD];
    flux_ids(ids);
    make_table(tab, ang, ids, L);
    const int64_t n = (int64_t)B * L * F, xs[3] = {B, L, F}, ts[2] = {L, HEAD};
    float *x = rnd(n, 1.0f, 0.0f), *y = filled(n, 0), *back = filled(n, 0);
    double *ry = malloc(sizeof(double) * (size_t)n);
    /* the reference: (x0 + i x1) e^{i angle}, the angle in double */
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < HEAD / 2; j++) {
                    const int64_t o = (b * L + l) * F + h * HEAD + 2 * j;
                    const double th = ang[l * (HEAD / 2) + j], c = cos(th), s = sin(th);
                    ry[o] = x[o] * c - x[o + 1] * s;
                    ry[o + 1] = x[o] * s + x[o + 1] * c;
                }
    ck_op_params fwd, inv;
    memset(&fwd, 0, sizeof fwd);
    inv = fwd;
    inv.i[0] = 1;
    ck_view in[2] = {view(x, 3, xs), view(tab, 2, ts)}, out = view(y, 3, xs);
    call(ck_cpu_rope, &fwd, &out, 1, in, 2);
    check("rope [2,11,3*16] (3 axes of 4, 6, 6 dims; 3 text, 2x4 image tokens) vs BFL's rope in double",
          err_ref(y, ry, n), TOL_REF);
    int text_unrotated = 1; /* text tokens sit at position 0: the identity */
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < LT * F; i++) text_unrotated &= y[b * L * F + i] == x[b * L * F + i];
    check_true("rope leaves the text tokens (all ids 0) as they are", text_unrotated);

    ck_view bin[2] = {view(y, 3, xs), view(tab, 2, ts)}, bout = view(back, 3, xs);
    call(ck_cpu_rope, &inv, &bout, 1, bin, 2);
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(back[i] - x[i]));
    check("rope, then rope with inverse = true, gives x back", e, 1e-6);

    /* ROPE's gradient is its inverse on dy (autodiff emits that): finite differences */
    float *dy = rnd(n, 1.0f, 0.0f), *dx = filled(n, 0), *yy = filled(n, 0);
    ck_view gin[2] = {view(dy, 3, xs), view(tab, 2, ts)}, gout = view(dx, 3, xs), fout = view(yy, 3, xs);
    call(ck_cpu_rope, &inv, &gout, 1, gin, 2);
    check("rope finite diff: dx is the inverse rotation of dy", fd_err(ck_cpu_rope, &fwd, &fout, in, 2, dy, 0, dx),
          TOL_FD);

    /* [B,H,L,D]: the same rotation per position as [B,L,H*D] */
    float *xp = filled(n, 0), *yp = filled(n, 0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++)
                memcpy(xp + ((b * H + h) * L + l) * HEAD, x + (b * L + l) * F + h * HEAD, sizeof(float) * HEAD);
    const int64_t ps[4] = {B, H, L, HEAD};
    ck_view pin[2] = {view(xp, 4, ps), view(tab, 2, ts)}, pout = view(yp, 4, ps);
    call(ck_cpu_rope, &fwd, &pout, 1, pin, 2);
    int same = 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++)
            for (int64_t h = 0; h < H; h++)
                same &= !memcmp(yp + ((b * H + h) * L + l) * HEAD, y + (b * L + l) * F + h * HEAD, sizeof(float) * HEAD);
    check_true("rope on [B,H,L,D] is rope on [B,L,H*D], head by head", same);

    /* threaded (past 32768 values) and one thread: the same bits */
    enum { LB = 300 };
    const int64_t nb = (int64_t)LB * 8 * HEAD, bs[3] = {1, LB, 8 * HEAD}, bts[2] = {LB, HEAD};
    float *xb = rnd(nb, 1.0f, 0.0f), *tb = rnd((int64_t)LB * HEAD, 1.0f, 0.0f), *y1 = filled(nb, 0), *y2 = filled(nb, 0);
    ck_view tin[2] = {view(xb, 3, bs), view(tb, 2, bts)}, t1 = view(y1, 3, bs), t2 = view(y2, 3, bs);
    call(ck_cpu_rope, &fwd, &t1, 1, tin, 2);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    call(ck_cpu_rope, &fwd, &t2, 1, tin, 2);
    omp_set_num_threads(nt);
    check_true("rope [1,300,128] deterministic (1 thread vs max)", !memcmp(y1, y2, sizeof(float) * (size_t)nb));
    free(x), free(y), free(back), free(ry), free(dy), free(dx), free(yy), free(xp), free(yp);
    free(xb), free(tb), free(y1), free(y2);
}

/* ---------------- modulate and gate ---------------- */

/* x [B, M, C] (M the positions, any dims between); gate = 0: MODULATE, 1: GATE */
static void test_adaln(int gate, int64_t B, int64_t M, int64_t C)
{
    char name[200];
    const char *op = gate ? "gate" : "modulate";
    const int64_t n = B * M * C, xs[3] = {B, M, C}, rs[2] = {B, C};
    /* MODULATE: x, shift, scale; GATE: x, gate, v */
    float *x = rnd(n, 1.5f, 0.2f), *a = rnd(B * C, 1.0f, 0.0f), *b = gate ? rnd(n, 1.0f, 0.0f) : rnd(B * C, 0.5f, 0.1f);
    float *dy = rnd(n, 1.0f, 0.0f), *y = filled(n, 0), *yy = filled(n, 0);
    double *ry = malloc(sizeof(double) * (size_t)n), *rdbig = malloc(sizeof(double) * (size_t)n);
    double *rs1 = calloc((size_t)(B * C), sizeof(double)), *rs2 = calloc((size_t)(B * C), sizeof(double));
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t o = (bi * M + m) * C + c, r = bi * C + c;
                if (gate) {
                    ry[o] = x[o] + (double)a[r] * b[o];
                    rdbig[o] = (double)a[r] * dy[o]; /* dv */
                    rs2[r] += (double)dy[o] * b[o];  /* dgate */
                } else {
                    ry[o] = (1.0 + b[r]) * x[o] + a[r];
                    rdbig[o] = (1.0 + b[r]) * dy[o]; /* dx */
                    rs1[r] += dy[o];                 /* dshift */
                    rs2[r] += (double)dy[o] * x[o];  /* dscale */
                }
            }
    ck_op_params p;
    memset(&p, 0, sizeof p);
    ck_view in[3] = {view(x, 3, xs), view(a, 2, rs), gate ? view(b, 3, xs) : view(b, 2, rs)}, out = view(y, 3, xs);
    const ck_kernel_fn f = gate ? ck_cpu_gate : ck_cpu_modulate, g = gate ? ck_cpu_gate_bwd : ck_cpu_modulate_bwd;
    call(f, &p, &out, 1, in, 3);
    snprintf(name, sizeof name, "%s [%lld,%lld,%lld] fwd vs ref", op, (long long)B, (long long)M, (long long)C);
    check(name, err_ref(y, ry, n), TOL_REF);

    /* the backward: MODULATE_BWD (dy, x, scale) -> dx, dshift, dscale; GATE_BWD (dy, gate, v) -> dgate, dv */
    float *dbig = filled(n, 0), *s1 = filled(B * C, 0), *s2 = filled(B * C, 0);
    ck_view bin[3] = {view(dy, 3, xs), gate ? view(a, 2, rs) : view(x, 3, xs), gate ? view(b, 3, xs) : view(b, 2, rs)};
    ck_view bout[3];
    if (gate) bout[0] = view(s2, 2, rs), bout[1] = view(dbig, 3, xs);
    else bout[0] = view(dbig, 3, xs), bout[1] = view(s1, 2, rs), bout[2] = view(s2, 2, rs);
    call(g, &p, bout, gate ? 2 : 3, bin, 3);
    double e = fmax(err_ref(dbig, rdbig, n), err_ref(s2, rs2, B * C));
    if (!gate) e = fmax(e, err_ref(s1, rs1, B * C));
    snprintf(name, sizeof name, "%s [%lld,%lld,%lld] bwd vs ref", op, (long long)B, (long long)M, (long long)C);
    check(name, e, TOL_REF);

    /* finite differences of every input: x's gradient is dbig (MODULATE) or dy itself (GATE) */
    ck_view fout = view(yy, 3, xs);
    if (gate) {
        e = fd_err(f, &p, &fout, in, 3, dy, 0, dy);
        e = fmax(e, fd_err(f, &p, &fout, in, 3, dy, 1, s2));
        e = fmax(e, fd_err(f, &p, &fout, in, 3, dy, 2, dbig));
    } else {
        e = fd_err(f, &p, &fout, in, 3, dy, 0, dbig);
        e = fmax(e, fd_err(f, &p, &fout, in, 3, dy, 1, s1));
        e = fmax(e, fd_err(f, &p, &fout, in, 3, dy, 2, s2));
    }
    snprintf(name, sizeof name, "%s [%lld,%lld,%lld] finite diff of every input", op, (long long)B, (long long)M,
             (long long)C);
    check(name, e, TOL_FD);

    /* one thread: the same bits */
    float *dbig2 = filled(n, 0), *s12 = filled(B * C, 0), *s22 = filled(B * C, 0);
    ck_view bout2[3];
    if (gate) bout2[0] = view(s22, 2, rs), bout2[1] = view(dbig2, 3, xs);
    else bout2[0] = view(dbig2, 3, xs), bout2[1] = view(s12, 2, rs), bout2[2] = view(s22, 2, rs);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    call(g, &p, bout2, gate ? 2 : 3, bin, 3);
    call(f, &p, &fout, 1, in, 3);
    omp_set_num_threads(nt);
    int same = !memcmp(dbig, dbig2, sizeof(float) * (size_t)n) && !memcmp(s2, s22, sizeof(float) * (size_t)(B * C)) &&
               !memcmp(s1, s12, sizeof(float) * (size_t)(B * C)) && !memcmp(y, yy, sizeof(float) * (size_t)n);
    snprintf(name, sizeof name, "%s [%lld,%lld,%lld] deterministic (1 thread vs %d)", op, (long long)B, (long long)M,
             (long long)C, nt);
    check_true(name, same);

    /* each output alone: the wanted one the same, the others unwritten */
    const int nout = gate ? 2 : 3;
    float *buf[3], *ref[3];
    int64_t len[3];
    if (gate) buf[0] = s22, ref[0] = s2, len[0] = B * C, buf[1] = dbig2, ref[1] = dbig, len[1] = n;
    else
        buf[0] = dbig2, ref[0] = dbig, len[0] = n, buf[1] = s12, ref[1] = s1, len[1] = B * C, buf[2] = s22, ref[2] = s2,
        len[2] = B * C;
    int ok = 1;
    for (int k = 0; k < nout; k++) {
        ck_view o[3];
        for (int j = 0; j < nout; j++) {
            for (int64_t i = 0; i < len[j]; i++) buf[j][i] = 777.0f;
            o[j] = len[j] == n ? view(buf[j], 3, xs) : view(buf[j], 2, rs);
            if (j != k) o[j].data = NULL;
        }
        call(g, &p, o, nout, bin, 3);
        for (int j = 0; j < nout; j++)
            if (j == k) ok &= !memcmp(buf[j], ref[j], sizeof(float) * (size_t)len[j]);
            else
                for (int64_t i = 0; i < len[j]; i++) ok &= buf[j][i] == 777.0f;
    }
    snprintf(name, sizeof name, "%s [%lld,%lld,%lld] bwd: each output alone, the others untouched", op, (long long)B,
             (long long)M, (long long)C);
    check_true(name, ok);
    free(x), free(a), free(b), free(dy), free(y), free(yy), free(ry), free(rdbig), free(rs1), free(rs2);
    free(dbig), free(s1), free(s2), free(dbig2), free(s12), free(s22);
}

int main(void)
{
    printf("threads: %d\n", omp_get_max_threads());
    test_rope();
    test_adaln(0, 2, 7, 9);
    test_adaln(1, 2, 7, 9);
    test_adaln(0, 1, 1, 5);       /* one position */
    test_adaln(0, 2, 97, 300);    /* threaded; columns in two blocks of 256 */
    test_adaln(1, 2, 97, 300);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
