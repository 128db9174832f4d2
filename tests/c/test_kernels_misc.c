/* Tests for the elementwise, loss, embedding (timesteps, token ids) and
 * optimizer CPU kernels against naive double-precision references, plus
 * determinism (bitwise, run twice).
 * Tolerance unless a check says otherwise: |got - ref| <= 1e-4 * max(1, |ref|).
 * Each line ends with the measured error (or, for counts, the measured value). */
#include "../../ops/cpu/cpu.h"
#include "../../ops/rng.h"
#include "check.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-4

static uint64_t rng_state = 0x1234567ULL;

static float frand(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rand_buf(int64_t n)
{
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

static ck_view view(float *data, int ndim, const int64_t *shape)
{
    ck_view v = {data, ndim, {0}};
    for (int d = 0; d < ndim; d++) v.shape[d] = shape[d];
    return v;
}

// max of |got - ref| / max(1, |ref|)
static double rel_err(const float *got, const double *ref, int64_t n)
{
    double e = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
        if (!(d <= e)) e = d; /* NaN counts as worst */
    }
    return e;
}

static const ck_kctx ctx0 = {42, 1, 0.01f, NULL, 0, 1, 0};

/* ---- broadcast binary ops ---- */

typedef struct shape {
    int nd;
    int64_t s[CK_MAX_DIMS];
} shape;

static int64_t numel(const shape *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->nd; d++) n *= s->s[d];
    return n;
}

// index into v (right-aligned, size-1 dims broadcast) of output multi-index idx
static int64_t bindex(const shape *v, const shape *o, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < v->nd; d++) {
        int od = d + (o->nd - v->nd);
        int64_t i = v->s[d] == 1 ? 0 : idx[od];
        off = off * v->s[d] + i;
    }
    return off;
}

static void decode(const shape *o, int64_t flat, int64_t *idx)
{
    for (int d = o->nd - 1; d >= 0; d--) {
        idx[d] = flat % o->s[d];
        flat /= o->s[d];
    }
}

static shape bshape(const shape *a, const shape *b)
{
    shape o;
    o.nd = a->nd > b->nd ? a->nd : b->nd;
    for (int d = 0; d < o.nd; d++) {
        int da = d - (o.nd - a->nd), db = d - (o.nd - b->nd);
        int64_t x = da >= 0 ? a->s[da] : 1, y = db >= 0 ? b->s[db] : 1;
        o.s[d] = x == 1 ? y : x;
    }
    return o;
}

static void test_binary(shape a, shape b)
{
    static const char *names[3] = {"add", "sub", "mul"};
    static const ck_kernel_fn fns[3] = {ck_cpu_add, ck_cpu_sub, ck_cpu_mul};
    shape o = bshape(&a, &b);
    int64_t na = numel(&a), nb = numel(&b), no = numel(&o);
    float *pa = rand_buf(na), *pb = rand_buf(nb), *po = malloc(sizeof(float) * (size_t)no);
    float *po2 = malloc(sizeof(float) * (size_t)no);
    double *ref = malloc(sizeof(double) * (size_t)no);
    ck_view in[2] = {view(pa, a.nd, a.s), view(pb, b.nd, b.s)};
    ck_view out = view(po, o.nd, o.s), out2 = view(po2, o.nd, o.s);
    ck_op_params p = {{0}, {0}};
    char desc[160];
    int len = 0;
    len += snprintf(desc + len, sizeof desc - (size_t)len, "(");
    for (int d = 0; d < a.nd; d++) len += snprintf(desc + len, sizeof desc - (size_t)len, "%s%lld", d ? "," : "", (long long)a.s[d]);
    len += snprintf(desc + len, sizeof desc - (size_t)len, ") . (");
    for (int d = 0; d < b.nd; d++) len += snprintf(desc + len, sizeof desc - (size_t)len, "%s%lld", d ? "," : "", (long long)b.s[d]);
    snprintf(desc + len, sizeof desc - (size_t)len, ")");
    for (int k = 0; k < 3; k++) {
        int64_t idx[CK_MAX_DIMS];
        for (int64_t i = 0; i < no; i++) {
            decode(&o, i, idx);
            double x = pa[bindex(&a, &o, idx)], y = pb[bindex(&b, &o, idx)];
            ref[i] = k == 0 ? x + y : k == 1 ? x - y : x * y;
        }
        fns[k](&ctx0, &p, &out, 1, in, 2);
        double e = rel_err(po, ref, no);
        char name[240];
        snprintf(name, sizeof name, "%s %s", names[k], desc);
        check(name, e <= TOL, e);
        if (no > 32768) {
            fns[k](&ctx0, &p, &out2, 1, in, 2);
            snprintf(name, sizeof name, "%s %s deterministic", names[k], desc);
            check(name, memcmp(po, po2, sizeof(float) * (size_t)no) == 0, 0);
        }
    }
    free(pa), free(pb), free(po), free(po2), free(ref);
}

#define S(...) ((shape){sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}})
#define S0 ((shape){0, {0}})

static void test_scale_fill(void)
{
    int64_t n = 70001;
    float *x = rand_buf(n), *y = malloc(sizeof(float) * (size_t)n);
    double *ref = malloc(sizeof(double) * (size_t)n);
    ck_view vx = view(x, 1, &n), vy = view(y, 1, &n);
    ck_op_params p = {{0}, {-1.75f}};
    ck_cpu_scale(&ctx0, &p, &vy, 1, &vx, 1);
    for (int64_t i = 0; i < n; i++) ref[i] = -1.75 * x[i];
    check("scale", rel_err(y, ref, n) <= TOL, rel_err(y, ref, n));
    p.f[0] = 0.3f;
    ck_cpu_fill(&ctx0, &p, &vy, 1, NULL, 0);
    for (int64_t i = 0; i < n; i++) ref[i] = 0.3f;
    check("fill", rel_err(y, ref, n) == 0, rel_err(y, ref, n));
    free(x), free(y), free(ref);
}

/* ---- reduce_to ---- */

static void test_reduce(shape x, shape y, const char *name)
{
    int64_t nx = numel(&x), ny = numel(&y);
    float *px = rand_buf(nx), *py = malloc(sizeof(float) * (size_t)ny), *py2 = malloc(sizeof(float) * (size_t)ny);
    double *ref = calloc((size_t)ny, sizeof(double));
    int64_t idx[CK_MAX_DIMS];
    for (int64_t i = 0; i < nx; i++) {
        decode(&x, i, idx);
        ref[bindex(&y, &x, idx)] += px[i];
    }
    ck_view vx = view(px, x.nd, x.s), vy = view(py, y.nd, y.s), vy2 = view(py2, y.nd, y.s);
    ck_op_params p = {{0}, {0}};
    ck_cpu_reduce_to(&ctx0, &p, &vy, 1, &vx, 1);
    double e = rel_err(py, ref, ny);
    char full[200];
    snprintf(full, sizeof full, "reduce_to %s", name);
    check(full, e <= TOL, e);
    ck_cpu_reduce_to(&ctx0, &p, &vy2, 1, &vx, 1);
    snprintf(full, sizeof full, "reduce_to %s deterministic", name);
    check(full, memcmp(py, py2, sizeof(float) * (size_t)ny) == 0, 0);
    free(px), free(py), free(py2), free(ref);
}

/* ---- losses ---- */

static void test_losses(int64_t n)
{
    char name[120];
    float *a = rand_buf(n), *b = rand_buf(n), y, y2;
    ck_view va = view(a, 1, &n), vb = view(b, 1, &n), vy = view(&y, 0, NULL), vy2 = view(&y2, 0, NULL);
    ck_op_params p = {{0}, {0}};

    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i];
    double ref = s / (double)n;
    ck_cpu_mean(&ctx0, &p, &vy, 1, &va, 1);
    ck_cpu_mean(&ctx0, &p, &vy2, 1, &va, 1);
    snprintf(name, sizeof name, "mean n=%lld (rel to max(|ref|,1e-3))", (long long)n);
    double e = fabs(y - ref) / fmax(fabs(ref), 1e-3);
    check(name, e <= TOL, e);
    snprintf(name, sizeof name, "mean n=%lld deterministic", (long long)n);
    check(name, memcmp(&y, &y2, sizeof y) == 0, 0);

    s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    ref = s / (double)n;
    ck_view in2[2] = {va, vb};
    ck_cpu_mse_loss(&ctx0, &p, &vy, 1, in2, 2);
    ck_cpu_mse_loss(&ctx0, &p, &vy2, 1, in2, 2);
    e = fabs(y - ref) / fabs(ref);
    snprintf(name, sizeof name, "mse_loss n=%lld", (long long)n);
    check(name, e <= TOL, e);
    snprintf(name, sizeof name, "mse_loss n=%lld deterministic", (long long)n);
    check(name, memcmp(&y, &y2, sizeof y) == 0, 0);

    /* backward: dy = 0.7 */
    float dy = 0.7f;
    float *da = malloc(sizeof(float) * (size_t)n), *db = malloc(sizeof(float) * (size_t)n);
    float *da2 = malloc(sizeof(float) * (size_t)n), *db2 = malloc(sizeof(float) * (size_t)n);
    double *rda = malloc(sizeof(double) * (size_t)n), *rdb = malloc(sizeof(double) * (size_t)n);
    ck_view vdy = view(&dy, 0, NULL);
    ck_view outs[2] = {view(da, 1, &n), view(db, 1, &n)};
    ck_view in3[3] = {vdy, va, vb};
    ck_cpu_mse_loss_bwd(&ctx0, &p, outs, 2, in3, 3);
    for (int64_t i = 0; i < n; i++) {
        rda[i] = 0.7 * 2.0 * ((double)a[i] - b[i]) / (double)n;
        rdb[i] = -rda[i];
    }
    /* gradients are O(1/n): compare relative to the largest reference */
    double mx = 0, ea = 0, eb = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(rda[i]));
    for (int64_t i = 0; i < n; i++) {
        ea = fmax(ea, fabs(da[i] - rda[i]) / mx);
        eb = fmax(eb, fabs(db[i] - rdb[i]) / mx);
    }
    snprintf(name, sizeof name, "mse_loss_bwd da,db n=%lld (rel to max|ref|)", (long long)n);
    check(name, ea <= TOL && eb <= TOL, fmax(ea, eb));
    ck_view outs2[2] = {view(da2, 1, &n), view(NULL, 1, &n)};
    ck_cpu_mse_loss_bwd(&ctx0, &p, outs2, 2, in3, 3);
    snprintf(name, sizeof name, "mse_loss_bwd da only, same bits n=%lld", (long long)n);
    check(name, memcmp(da, da2, sizeof(float) * (size_t)n) == 0, 0);
    ck_view outs3[2] = {view(NULL, 1, &n), view(db2, 1, &n)};
    ck_cpu_mse_loss_bwd(&ctx0, &p, outs3, 2, in3, 3);
    snprintf(name, sizeof name, "mse_loss_bwd db only, same bits n=%lld", (long long)n);
    check(name, memcmp(db, db2, sizeof(float) * (size_t)n) == 0, 0);

    ck_view vda = view(da, 1, &n);
    ck_cpu_mean_bwd(&ctx0, &p, &vda, 1, &vdy, 1);
    e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(da[i] - 0.7 / (double)n) * (double)n);
    snprintf(name, sizeof name, "mean_bwd n=%lld (rel)", (long long)n);
    check(name, e <= TOL, e);

    free(a), free(b), free(da), free(db), free(da2), free(db2), free(rda), free(rdb);
}

/* Central differences of the forward kernels (fp32, eps 1e-3, tol 1e-2 rel). */
static void test_loss_fd(void)
{
    int64_t n = 37;
    float *a = rand_buf(n), *b = rand_buf(n), da[37], db[37], dy = 1.3f, lp, lm;
    ck_view va = view(a, 1, &n), vb = view(b, 1, &n), vl = view(&lp, 0, NULL), vl2 = view(&lm, 0, NULL);
    ck_view in2[2] = {va, vb}, in3[3] = {view(&dy, 0, NULL), va, vb};
    ck_view outs[2] = {view(da, 1, &n), view(db, 1, &n)};
    ck_op_params p = {{0}, {0}};
    ck_cpu_mse_loss_bwd(&ctx0, &p, outs, 2, in3, 3);
    const float eps = 1e-3f;
    double e = 0;
    for (int64_t i = 0; i < n; i += 5) {
        for (int which = 0; which < 2; which++) {
            float *t = which ? b : a, save = t[i];
            t[i] = save + eps;
            ck_cpu_mse_loss(&ctx0, &p, &vl, 1, in2, 2);
            t[i] = save - eps;
            ck_cpu_mse_loss(&ctx0, &p, &vl2, 1, in2, 2);
            t[i] = save;
            double fd = dy * ((double)lp - lm) / (2.0 * eps), an = which ? db[i] : da[i];
            e = fmax(e, fabs(fd - an) / fmax(fabs(an), 1e-3));
        }
    }
    check("mse_loss_bwd vs finite differences (tol 1e-2)", e <= 1e-2, e);

    float dx[37], one = 1.0f;
    ck_view vdx = view(dx, 1, &n), vone = view(&one, 0, NULL);
    ck_cpu_mean_bwd(&ctx0, &p, &vdx, 1, &vone, 1);
    e = 0;
    for (int64_t i = 0; i < n; i += 5) {
        float save = a[i];
        a[i] = save + eps;
        ck_cpu_mean(&ctx0, &p, &vl, 1, &va, 1);
        a[i] = save - eps;
        ck_cpu_mean(&ctx0, &p, &vl2, 1, &va, 1);
        a[i] = save;
        double fd = ((double)lp - lm) / (2.0 * eps);
        e = fmax(e, fabs(fd - dx[i]) / fabs(dx[i]));
    }
    check("mean_bwd vs finite differences (tol 1e-2)", e <= 1e-2, e);
    free(a), free(b);
}

/* ---- timestep embedding ---- */

static void test_timestep(int64_t dim, int flip, float shift, float scale)
{
    const int64_t B = 7, half = dim / 2;
    float t[7] = {0.0f, 1.0f, 17.0f, 250.5f, 499.0f, 733.0f, 999.0f};
    float *y = malloc(sizeof(float) * (size_t)(B * dim));
    int64_t sh[2] = {B, dim};
    ck_view vt = view(t, 1, &B), vy = view(y, 2, sh);
    ck_op_params p = {{dim, flip}, {shift, 10000.0f, scale}};
    ck_cpu_timestep_embedding(&ctx0, &p, &vy, 1, &vt, 1);
    /* the formula in double; fp32 argument rounding at t ~ 1000 (as in torch)
     * moves sin/cos by up to ~1e-3, so the tolerance is absolute 2e-3 */
    double e = 0, et = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < dim; j++) {
            double r;
            float rt;
            if (j >= 2 * half) {
                r = 0;
                rt = 0;
            } else {
                int64_t k = j < half ? j : j - half;
                int first = j < half;
                int use_sin = flip ? !first : first;
                double freq = exp(-log(10000.0) * (double)k / ((double)half - shift));
                double arg = scale * t[b] * freq;
                r = use_sin ? sin(arg) : cos(arg);
                /* torch's float steps */
                float ft = expf((float)(-log(10000.0)) * (float)k / (float)((double)half - shift));
                float at = scale * (t[b] * ft);
                rt = use_sin ? sinf(at) : cosf(at);
            }
            e = fmax(e, fabs(y[b * dim + j] - r));
            et = fmax(et, fabs(y[b * dim + j] - rt));
        }
    char name[160];
    snprintf(name, sizeof name, "timestep_embedding dim=%lld flip=%d shift=%g scale=%g vs formula (abs 2e-3)",
             (long long)dim, flip, shift, scale);
    check(name, e <= 2e-3, e);
    snprintf(name, sizeof name, "timestep_embedding dim=%lld flip=%d shift=%g scale=%g vs torch float steps (abs 1e-6)",
             (long long)dim, flip, shift, scale);
    check(name, et <= 1e-6, et);
    free(y);
}

/* ---- embedding (token id lookup) ---- */

/* Rows of the table that the ids name, bit for bit; every id checked. N ids of
 * a [V, D] table, in the shape given (1-D or [B, T]). */
static void test_embedding(int64_t B, int64_t T, int64_t V, int64_t D)
{
    const int64_t N = B * T;
    float *ids = malloc(sizeof(float) * (size_t)N), *table = rand_buf(V * D);
    float *y = malloc(sizeof(float) * (size_t)(N * D));
    for (int64_t n = 0; n < N; n++) ids[n] = (float)((n * 7919 + 13) % V);
    ids[0] = 0.0f, ids[N - 1] = (float)(V - 1); /* both ends of the table */
    int64_t sid[2] = {B, T}, stab[2] = {V, D}, sy[3] = {B, T, D};
    ck_view vin[2] = {view(ids, 2, sid), view(table, 2, stab)}, vy = view(y, 3, sy);
    ck_op_params p = {{0}, {0}};
    ck_cpu_clear_error();
    ck_cpu_embedding(&ctx0, &p, &vy, 1, vin, 2);
    int64_t wrong = 0;
    for (int64_t n = 0; n < N; n++)
        wrong += memcmp(y + n * D, table + (int64_t)ids[n] * D, sizeof(float) * (size_t)D) != 0;
    char name[160];
    snprintf(name, sizeof name, "embedding [%lld,%lld] of [%lld,%lld]: each row is the table's row, bitwise, no failure",
             (long long)B, (long long)T, (long long)V, (long long)D);
    check(name, wrong == 0 && ck_cpu_last_error()[0] == 0, (double)wrong);
    free(ids), free(table), free(y);
}

/* An id outside the table, fractional, negative or NaN gives a NaN row and a
 * failure naming the op, the first bad id and its index; the good rows are
 * still copied, and the first failure is kept until cleared. */
static void test_embedding_bad_ids(void)
{
    const int64_t V = 10, D = 3, N = 7;
    const float bad[4] = {10.0f, 2.5f, -1.0f, NAN};
    const char *want[4] = {"embedding: id 10 at index 4 is not a row of the [10, 3] table",
                           "embedding: id 2.5 at index 4 ", "embedding: id -1 at index 4 ", "embedding: id nan at index 4 "};
    float *table = rand_buf(V * D), y[21];
    for (int c = 0; c < 4; c++) {
        float ids[7] = {1, 9, 0, 3, bad[c], 5, bad[c]};
        int64_t sid[1] = {N}, stab[2] = {V, D}, sy[2] = {N, D};
        ck_view vin[2] = {view(ids, 1, sid), view(table, 2, stab)}, vy = view(y, 2, sy);
        ck_op_params p = {{0}, {0}};
        ck_cpu_clear_error();
        ck_cpu_embedding(&ctx0, &p, &vy, 1, vin, 2);
        int ok = strncmp(ck_cpu_last_error(), want[c], strlen(want[c])) == 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t d = 0; d < D; d++) {
                const float v = y[n * D + d];
                ok &= n == 4 || n == 6 ? isnan(v) : v == table[(int64_t)ids[n] * D + d];
            }
        /* a second failure does not replace the first */
        float one[1] = {99.0f};
        int64_t s1[1] = {1}, sy1[2] = {1, D};
        ck_view vin1[2] = {view(one, 1, s1), view(table, 2, stab)}, vy1 = view(y, 2, sy1);
        ck_cpu_embedding(&ctx0, &p, &vy1, 1, vin1, 2);
        ok &= strncmp(ck_cpu_last_error(), want[c], strlen(want[c])) == 0;
        char name[200];
        snprintf(name, sizeof name, "embedding with id %g: NaN rows where it stands, the rest copied, \"%s\"",
                 (double)bad[c], ck_cpu_last_error());
        check(name, ok, 0);
    }
    ck_cpu_clear_error();
    check("embedding: the failure clears", ck_cpu_last_error()[0] == 0, 0);
    free(table);
}

/* ---- dropout ---- */

static void test_dropout(void)
{
    int64_t n = 100003;
    const float drop = 0.3f;
    float *x = rand_buf(n), *y = malloc(sizeof(float) * (size_t)n), *y2 = malloc(sizeof(float) * (size_t)n);
    float *y3 = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        if (x[i] == 0.0f) x[i] = 0.5f; /* zero outputs then mean dropped */
    ck_view vx = view(x, 1, &n), vy = view(y, 1, &n), vy2 = view(y2, 1, &n), vy3 = view(y3, 1, &n);
    ck_op_params p = {{5}, {drop}};
    ck_kctx ctx = {1234, 7, 0.0f, NULL, 0, 0, 0};
    ck_cpu_dropout(&ctx, &p, &vy, 1, &vx, 1);

    int64_t kept = 0, bad = 0;
    const uint64_t key = ck_rng_key(1234, 7, 5);
    const float sc = 1.0f / (1.0f - drop);
    for (int64_t i = 0; i < n; i++) {
        int k = ck_rng_uniform(key, (uint64_t)i) >= drop;
        kept += k;
        if (y[i] != (k ? x[i] * sc : 0.0f)) bad++;
    }
    double frac = (double)kept / (double)n;
    check("dropout mask is rng.h's and kept values are x/(1-p) exactly", bad == 0, (double)bad);
    check("dropout fraction kept within 0.01 of 1-p", fabs(frac - 0.7) < 0.01, fabs(frac - 0.7));

    ck_cpu_dropout(&ctx, &p, &vy2, 1, &vx, 1);
    check("dropout same key, same output (bitwise)", memcmp(y, y2, sizeof(float) * (size_t)n) == 0, 0);

    ctx.step = 8;
    ck_cpu_dropout(&ctx, &p, &vy2, 1, &vx, 1);
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) diff += (y[i] == 0.0f) != (y2[i] == 0.0f);
    /* independent masks differ in 2 p (1-p) = 42% of positions */
    check("dropout different step, different mask", diff > n / 4, (double)diff / (double)n);
    ctx.step = 7;
    p.i[0] = 6;
    ck_cpu_dropout(&ctx, &p, &vy2, 1, &vx, 1);
    diff = 0;
    for (int64_t i = 0; i < n; i++) diff += (y[i] == 0.0f) != (y2[i] == 0.0f);
    check("dropout different op key, different mask", diff > n / 4, (double)diff / (double)n);
    p.i[0] = 5;

    /* backward: the same kernel on dy with the same context */
    float *dy = rand_buf(n);
    ck_view vdy = view(dy, 1, &n);
    ck_cpu_dropout(&ctx, &p, &vy3, 1, &vdy, 1);
    bad = 0;
    for (int64_t i = 0; i < n; i++) {
        int k = y[i] != 0.0f;
        if (y3[i] != (k ? dy[i] * sc : 0.0f * dy[i])) bad++;
    }
    check("dropout backward uses the forward's mask", bad == 0, (double)bad);

    p.f[0] = 0.0f;
    ck_cpu_dropout(&ctx, &p, &vy2, 1, &vx, 1);
    check("dropout p=0 copies", memcmp(x, y2, sizeof(float) * (size_t)n) == 0, 0);
    p.f[0] = drop;
    ctx.eval = 1;
    ck_cpu_dropout(&ctx, &p, &vy2, 1, &vx, 1);
    check("dropout in an evaluation pass copies", memcmp(x, y2, sizeof(float) * (size_t)n) == 0, 0);
    ctx.eval = 0;
    p.f[0] = 1.0f;
    ck_cpu_dropout(&ctx, &p, &vy2, 1, &vx, 1);
    bad = 0;
    for (int64_t i = 0; i < n; i++) bad += y2[i] != 0.0f;
    check("dropout p=1 zeros", bad == 0, (double)bad);
    free(x), free(y), free(y2), free(y3), free(dy);
}

/* A data-parallel rank's dropout (i1 = world, i2 = rank) draws for each row of
 * its input's first dimension what that row draws in the global batch, as
 * torch's DistributedSampler deals the rows: rank r has rows r, r + world, ...
 * A global batch of 3 rows over 2 ranks: rank 0 rows 0 and 2, rank 1 row 1. */
static void test_dropout_ranks(void)
{
    const int64_t gshape[3] = {3, 5, 7}, per = 5 * 7;
    const int64_t n = 3 * per;
    float *x = rand_buf(n), *y = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        if (x[i] == 0.0f) x[i] = 0.5f;
    ck_op_params p = {{9}, {0.4f}};
    ck_kctx ctx = {77, 3, 0.0f, NULL, 0, 0, 0};
    ck_view vx = view(x, 3, gshape), vy = view(y, 3, gshape);
    ck_cpu_dropout(&ctx, &p, &vy, 1, &vx, 1);
    int64_t bad = 0, dropped = 0;
    for (int rank = 0; rank < 2; rank++) {
        const int64_t rows = rank == 0 ? 2 : 1, lshape[3] = {rows, 5, 7};
        float *lx = malloc(sizeof(float) * (size_t)(rows * per)), *ly = malloc(sizeof(float) * (size_t)(rows * per));
        for (int64_t b = 0; b < rows; b++) memcpy(lx + b * per, x + (rank + 2 * b) * per, sizeof(float) * (size_t)per);
        ck_op_params q = p;
        q.i[1] = 2, q.i[2] = rank;
        ck_view lvx = view(lx, 3, lshape), lvy = view(ly, 3, lshape);
        ck_cpu_dropout(&ctx, &q, &lvy, 1, &lvx, 1);
        for (int64_t b = 0; b < rows; b++)
            for (int64_t j = 0; j < per; j++) {
                bad += ly[b * per + j] != y[(rank + 2 * b) * per + j];
                dropped += ly[b * per + j] == 0.0f;
            }
        free(lx), free(ly);
    }
    check("dropout on ranks: each row draws what its row of the global batch draws (bitwise)", bad == 0, (double)bad);
    check("dropout on ranks: some elements dropped", dropped > 0, (double)dropped);
    free(x), free(y);
}

/* ---- summed squares: up to CK_MAX_IN tensors, or a running total and the rest ---- */

static float sumsq_of(float *const *x, const int64_t *n, int nin, int total)
{
    ck_view in[CK_MAX_IN];
    for (int k = 0; k < nin; k++) in[k] = view(x[k], 1, &n[k]);
    float out = NAN;
    ck_view o = {&out, 0, {0}};
    ck_op_params p = {{total}, {0}};
    ck_cpu_sumsq(&ctx0, &p, &o, 1, in, nin);
    return out;
}

static void test_sumsq(void)
{
    /* sizes below and above one segment, and an empty tensor */
    int64_t n[CK_MAX_IN] = {1, 70001, 0, 300007};
    float *x[CK_MAX_IN];
    double ref = 0;
    for (int k = 0; k < CK_MAX_IN; k++) {
        x[k] = rand_buf(n[k]);
        for (int64_t i = 0; i < n[k]; i++) ref += (double)x[k][i] * x[k][i];
    }
    const float all = sumsq_of(x, n, CK_MAX_IN, 0);
    check("sumsq of 4 tensors", fabs(all - ref) <= 1e-6 * ref, fabs(all - ref) / ref);
    /* the first tensor's squares as a running total, then the other three */
    float t = 1000.0f;
    float *xt[CK_MAX_IN] = {&t, x[1], x[2], x[3]};
    int64_t nt[CK_MAX_IN] = {1, n[1], n[2], n[3]};
    double rt = 1000.0;
    for (int k = 1; k < CK_MAX_IN; k++)
        for (int64_t i = 0; i < n[k]; i++) rt += (double)x[k][i] * x[k][i];
    const float chained = sumsq_of(xt, nt, CK_MAX_IN, 1);
    check("sumsq: a running total added as it is, then 3 tensors' squares", fabs(chained - rt) <= 1e-6 * rt,
          fabs(chained - rt) / rt);
    const float again = sumsq_of(xt, nt, CK_MAX_IN, 1);
    check("sumsq: bitwise the same run twice", memcmp(&chained, &again, sizeof again) == 0, 0);
    for (int k = 0; k < CK_MAX_IN; k++) free(x[k]);
}

/* ---- optimizers ---- */

static void test_sgd(void)
{
    int64_t n = 50021;
    float *w = rand_buf(n), *g = rand_buf(n);
    double *ref = malloc(sizeof(double) * (size_t)n);
    const float wd = 0.01f;
    ck_kctx ctx = ctx0;
    ctx.lr = 0.05f;
    for (int64_t i = 0; i < n; i++) ref[i] = (double)w[i] - (double)ctx.lr * ((double)g[i] + (double)wd * w[i]);
    ck_view outs[1] = {view(w, 1, &n)}, ins[2] = {view(w, 1, &n), view(g, 1, &n)};
    ck_op_params p = {{0}, {wd, 0, 0, 0, 0, 1}};
    ck_cpu_sgd_step(&ctx, &p, outs, 1, ins, 2);
    check("sgd_step in place", rel_err(w, ref, n) <= TOL, rel_err(w, ref, n));
    free(w), free(g), free(ref);
}

/* f5, a parameter's learning-rate multiplier: each optimizer with lr and f5 = 4
 * does bitwise what it does with 4 lr and f5 = 1 */
static void test_lr_scale(void)
{
    int64_t n = 1031;
    float *g = rand_buf(n), *w0 = rand_buf(n), *m0 = rand_buf(n), *v0 = rand_buf(n);
    for (int64_t i = 0; i < n; i++) v0[i] *= v0[i];
    const ck_kernel_fn ks[3] = {ck_cpu_sgd_step, ck_cpu_adamw_step, ck_cpu_lion_step};
    const int nins[3] = {2, 4, 3}, nouts[3] = {1, 3, 2};
    const char *names[3] = {"sgd_step", "adamw_step", "lion_step"};
    const ck_op_params base[3] = {{{0}, {0.01f}}, {{0}, {0.9f, 0.999f, 1e-8f, 0.01f}}, {{0}, {0.9f, 0.99f, 0.01f}}};
    for (int k = 0; k < 3; k++) {
        float *st[2][3];
        for (int r = 0; r < 2; r++) {
            ck_op_params p = base[k];
            ck_kctx ctx = ctx0;
            ctx.lr = r ? 4e-3f : 1e-3f;
            p.f[CK_OPT_LR_SCALE] = r ? 1.0f : 4.0f;
            for (int s = 0; s < 3; s++) st[r][s] = malloc(sizeof(float) * (size_t)n);
            memcpy(st[r][0], w0, sizeof(float) * (size_t)n);
            memcpy(st[r][1], m0, sizeof(float) * (size_t)n);
            memcpy(st[r][2], v0, sizeof(float) * (size_t)n);
            ck_view ins[4] = {view(st[r][0], 1, &n), view(g, 1, &n), view(st[r][1], 1, &n), view(st[r][2], 1, &n)};
            ck_view outs[3] = {view(st[r][0], 1, &n), view(st[r][1], 1, &n), view(st[r][2], 1, &n)};
            ks[k](&ctx, &p, outs, nouts[k], ins, nins[k]);
        }
        int same = 1, moved = 0;
        for (int s = 0; s < 3; s++) same &= memcmp(st[0][s], st[1][s], sizeof(float) * (size_t)n) == 0;
        for (int64_t i = 0; i < n; i++) moved += st[0][0][i] != w0[i];
        char name[96];
        snprintf(name, sizeof name, "%s: lr 1e-3 with multiplier 4 is bitwise lr 4e-3", names[k]);
        check(name, same && moved > n / 2, (double)moved);
        for (int r = 0; r < 2; r++)
            for (int s = 0; s < 3; s++) free(st[r][s]);
    }
    free(g), free(w0), free(m0), free(v0);
}

static void test_adamw(int64_t n)
{
    float *w = rand_buf(n), *m = calloc((size_t)n, sizeof(float)), *v = calloc((size_t)n, sizeof(float));
    double *rw = malloc(sizeof(double) * (size_t)n), *rm = calloc((size_t)n, sizeof(double));
    double *rv = calloc((size_t)n, sizeof(double));
    double *w0 = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) rw[i] = w0[i] = w[i];
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    ck_op_params p = {{0}, {b1, b2, eps, wd, 0, 1}};
    ck_kctx ctx = ctx0;
    ctx.lr = 1e-3f;
    double ew = 0, em = 0, ev = 0, eu = 0;
    for (int step = 1; step <= 3; step++) {
        float *g = rand_buf(n);
        ctx.step = ctx.update = step;
        ck_view outs[3] = {view(w, 1, &n), view(m, 1, &n), view(v, 1, &n)};
        ck_view ins[4] = {view(w, 1, &n), view(g, 1, &n), view(m, 1, &n), view(v, 1, &n)};
        ck_cpu_adamw_step(&ctx, &p, outs, 3, ins, 4);
        /* hand-written reference in double, from the same float hyperparameters */
        const double lr = ctx.lr;
        for (int64_t i = 0; i < n; i++) {
            rw[i] *= 1.0 - lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            double mhat = rm[i] / (1.0 - pow(b1, step)), vhat = rv[i] / (1.0 - pow(b2, step));
            rw[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
        free(g);
    }
    /* moments are compared relative to their own scale (v is O(1e-3)) */
    double mm = 0, mv = 0, mu = 0;
    for (int64_t i = 0; i < n; i++) {
        mm = fmax(mm, fabs(rm[i]));
        mv = fmax(mv, fabs(rv[i]));
        mu = fmax(mu, fabs(rw[i] - w0[i]));
    }
    for (int64_t i = 0; i < n; i++) {
        ew = fmax(ew, fabs(w[i] - rw[i]) / fmax(1.0, fabs(rw[i])));
        eu = fmax(eu, fabs((w[i] - w0[i]) - (rw[i] - w0[i])) / mu);
        em = fmax(em, fabs(m[i] - rm[i]) / mm);
        ev = fmax(ev, fabs(v[i] - rv[i]) / mv);
    }
    char name[120];
    snprintf(name, sizeof name, "adamw_step 3 steps n=%lld param", (long long)n);
    check(name, ew <= TOL, ew);
    snprintf(name, sizeof name, "adamw_step 3 steps n=%lld m, v (rel to max)", (long long)n);
    check(name, em <= TOL && ev <= TOL, fmax(em, ev));
    /* the update itself (~3e-3) must be right, not just small; fp32 rounding of
     * params near 1 is ~6e-8, i.e. ~2e-5 of the update, so tol 1e-3 here */
    snprintf(name, sizeof name, "adamw_step 3 steps n=%lld update (rel to max update, tol 1e-3)", (long long)n);
    check(name, eu <= 1e-3, eu);
    free(w), free(m), free(v), free(rw), free(rm), free(rv), free(w0);
}

#ifdef _OPENMP
/* Results must not even depend on the thread count: 1 thread vs 5. */
static void run_threads(int nt, ck_kernel_fn k, ck_view *out, const ck_view *in, int nin, const ck_op_params *p)
{
    int saved = omp_get_max_threads();
    omp_set_num_threads(nt);
    k(&ctx0, p, out, 1, in, nin);
    omp_set_num_threads(saved);
}

static void test_thread_count(const char *name, ck_kernel_fn k, shape x, shape x2, shape y)
{
    int64_t nx = numel(&x), nx2 = numel(&x2), ny = numel(&y);
    float *px = rand_buf(nx), *px2 = rand_buf(nx2);
    float *y1 = malloc(sizeof(float) * (size_t)ny), *y5 = malloc(sizeof(float) * (size_t)ny);
    ck_view in[2] = {view(px, x.nd, x.s), view(px2, x2.nd, x2.s)};
    ck_view o1 = view(y1, y.nd, y.s), o5 = view(y5, y.nd, y.s);
    ck_op_params p = {{0}, {0}};
    int nin = x2.nd ? 2 : 1;
    run_threads(1, k, &o1, in, nin, &p);
    run_threads(5, k, &o5, in, nin, &p);
    char full[160];
    snprintf(full, sizeof full, "%s same bits at 1 and 5 threads", name);
    check(full, memcmp(y1, y5, sizeof(float) * (size_t)ny) == 0, 0);
    free(px), free(px2), free(y1), free(y5);
}
#endif

#ifdef _OPENMP
/* AdamW on n elements from fixed state, at nt threads: param, m, v concatenated. */
static float *adamw_at(int nt, int64_t n)
{
    float *w = rand_buf(n), *g = rand_buf(n), *m = rand_buf(n), *v = rand_buf(n);
    for (int64_t i = 0; i < n; i++) v[i] *= v[i];
    ck_op_params p = {{0}, {0.9f, 0.999f, 1e-8f, 0.01f, 0, 1}};
    ck_kctx ctx = ctx0;
    ctx.lr = 1e-3f, ctx.step = 7;
    ck_view outs[3] = {view(w, 1, &n), view(m, 1, &n), view(v, 1, &n)};
    ck_view ins[4] = {view(w, 1, &n), view(g, 1, &n), view(m, 1, &n), view(v, 1, &n)};
    int saved = omp_get_max_threads();
    omp_set_num_threads(nt);
    ck_cpu_adamw_step(&ctx, &p, outs, 3, ins, 4);
    omp_set_num_threads(saved);
    float *all = malloc(sizeof(float) * (size_t)(3 * n));
    memcpy(all, w, sizeof(float) * (size_t)n);
    memcpy(all + n, m, sizeof(float) * (size_t)n);
    memcpy(all + 2 * n, v, sizeof(float) * (size_t)n);
    free(w), free(g), free(m), free(v);
    return all;
}

static void test_adamw_threads(int64_t n)
{
    rng_state = 99;
    float *a = adamw_at(1, n);
    rng_state = 99;
    float *b = adamw_at(5, n);
    char name[120];
    snprintf(name, sizeof name, "adamw_step n=%lld same bits at 1 and 5 threads", (long long)n);
    check(name, memcmp(a, b, sizeof(float) * (size_t)(3 * n)) == 0, 0);
    free(a), free(b);
}
#endif

int main(void)
{
    /* broadcasting: same shape, suffix, per-channel, rank mismatch, both sides */
    test_binary(S(5, 7, 13), S(5, 7, 13));
    test_binary(S(5, 7, 13), S(13));
    test_binary(S(5, 7, 13), S(7, 13));
    test_binary(S(3, 5, 7, 9), S(5, 1, 1));
    test_binary(S(3, 5, 7, 9), S(3, 5, 1, 1));
    test_binary(S(4, 1, 6), S(5, 1));
    test_binary(S(5, 1, 1), S(3, 5, 7, 9));
    test_binary(S(13), S(5, 7, 13));
    test_binary(S(2, 3, 1, 5), S(3, 4, 1));
    test_binary(S(7, 11), S0);
    test_binary(S(1), S(7, 11));
    test_binary(S(2, 1, 3, 1, 5, 1), S(4, 1, 6, 1, 2));
    test_binary(S0, S0);
    /* big enough to run threaded */
    test_binary(S(64, 1031), S(1031));
    test_binary(S(4, 64, 31, 33), S(64, 1, 1));
    test_binary(S(33, 1, 1025), S(1, 37, 1025));
    test_binary(S(1000, 1), S(1, 997));
    test_binary(S(70001), S(70001));
    test_binary(S(300001), S(300001));
    test_binary(S(4, 64, 41, 33), S(64, 1, 1));

    test_scale_fill();

    test_reduce(S(3, 5, 7, 9), S(5, 1, 1), "(3,5,7,9)->(5,1,1)");
    test_reduce(S(37, 41), S(41), "(37,41)->(41)");
    test_reduce(S(3, 11, 13), S(1, 1, 13), "(3,11,13)->(1,1,13)");
    test_reduce(S(4, 5, 6), S(4, 5, 6), "(4,5,6)->(4,5,6) copy");
    test_reduce(S(3, 5, 7, 9), S(3, 5, 1, 1), "(3,5,7,9)->(3,5,1,1)");
    test_reduce(S(3, 5, 7, 9), S(5, 1, 9), "(3,5,7,9)->(5,1,9)");
    test_reduce(S(3, 5, 7, 9), S(3, 1, 7, 1), "(3,5,7,9)->(3,1,7,1)");
    test_reduce(S(7, 9), S(1), "(7,9)->(1)");
    test_reduce(S(7, 9), S0, "(7,9)->()");
    test_reduce(S(7, 9), S(1, 1, 9), "(7,9)->(1,1,9) extra leading 1s");
    /* big: many outputs, and few outputs (split into segments) */
    test_reduce(S(16, 320, 16, 16), S(320, 1, 1), "(16,320,16,16)->(320,1,1)");
    test_reduce(S(4099, 320), S(320), "(4099,320)->(320)");
    test_reduce(S(200003, 3), S(3), "(200003,3)->(3)");
    test_reduce(S(2, 300001), S(2, 1), "(2,300001)->(2,1)");
    test_reduce(S(1000003), S0, "(1000003)->()");
    test_reduce(S(4, 64, 33, 35), S(4, 64, 1, 1), "(4,64,33,35)->(4,64,1,1)");
    test_reduce(S(8, 97, 130), S(1, 1, 130), "(8,97,130)->(1,1,130)");
    test_reduce(S(9, 2, 5000, 3), S(2, 1, 3), "(9,2,5000,3)->(2,1,3)");

    test_losses(37);
    test_losses(1000003);
    test_loss_fd();

    test_timestep(320, 0, 1.0f, 1.0f);
    test_timestep(320, 1, 0.0f, 1.0f);
    test_timestep(33, 0, 1.0f, 1.0f);
    test_timestep(33, 1, 0.0f, 2.0f);
    test_timestep(1, 1, 0.0f, 1.0f);

    test_embedding(1, 7, 5, 3);
    test_embedding(4, 77, 512, 32);
    test_embedding(2, 77, 49408, 768); /* threaded: SDXL's vocabulary and CLIP-L's width */
    test_embedding_bad_ids();

    test_dropout();
    test_dropout_ranks();
    test_sumsq();
    test_lr_scale();
    test_sgd();
    test_adamw(1001);
    test_adamw(100003);
    test_adamw(1000003); /* threaded */

#ifdef _OPENMP
    test_thread_count("reduce_to (200003,3)->(3)", ck_cpu_reduce_to, S(200003, 3), S0, S(3));
    test_thread_count("reduce_to (4099,320)->(320)", ck_cpu_reduce_to, S(4099, 320), S0, S(320));
    test_thread_count("reduce_to (2,300001)->(2,1)", ck_cpu_reduce_to, S(2, 300001), S0, S(2, 1));
    test_thread_count("reduce_to (16,320,16,16)->(320,1,1)", ck_cpu_reduce_to, S(16, 320, 16, 16), S0, S(320, 1, 1));
    test_thread_count("mean n=1000003", ck_cpu_mean, S(1000003), S0, S0);
    test_thread_count("mse_loss n=1000003", ck_cpu_mse_loss, S(1000003), S(1000003), S0);
    test_thread_count("add (33,1,1025)+(1,37,1025)", ck_cpu_add, S(33, 1, 1025), S(1, 37, 1025), S(33, 37, 1025));
    test_adamw_threads(1000003);
#endif

    return checks_done();
}
