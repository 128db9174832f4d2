/* Elementwise kernels: ADD, SUB and MUL with numpy broadcasting, SCALE, FILL, and
 * REDUCE_TO (the backward of broadcasting). Shapes are first folded into a few
 * merged dims so that every inner loop is a plain contiguous (or constant) run. */
#include "cpu.h"

#include <assert.h>
#include <string.h>

/* Below this many elements one thread beats waking the pool: a core adds ~10
 * floats a nanosecond, and each parallel region costs tens of microseconds
 * here (more when other processes hold the other core). */
#define PAR_MIN (1 << 18)
/* Output elements per parallel task of the binary ops. */
#define CHUNK 8192
/* REDUCE_TO: columns summed together by one task, the parallel tasks aimed for
 * when there are few outputs, and the stack space (doubles) for their partials. */
#define TILE 64
#define TASKS_TARGET 64
#define PART_MAX 4096

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

enum binop { BIN_ADD, BIN_SUB, BIN_MUL };

/* Inlined with a constant op, so each kernel gets its own branch-free loops. */
static ALWAYS_INLINE float bin_apply(enum binop op, float a, float b)
{
    switch (op) {
    case BIN_ADD: return a + b;
    case BIN_SUB: return a - b;
    default: return a * b;
    }
}

// o, a, b are runs of n; sa, sb are 1 for a run or 0 for a broadcast value
static ALWAYS_INLINE void bin_run(enum binop op, float *o, const float *a, int64_t sa, const float *b, int64_t sb,
                                  int64_t n)
{
    if (sa && sb) {
        for (int64_t j = 0; j < n; j++) o[j] = bin_apply(op, a[j], b[j]);
    } else if (sa) {
        const float bv = b[0];
        for (int64_t j = 0; j < n; j++) o[j] = bin_apply(op, a[j], bv);
    } else if (sb) {
        const float av = a[0];
        for (int64_t j = 0; j < n; j++) o[j] = bin_apply(op, av, b[j]);
    } else {
        const float v = bin_apply(op, a[0], b[0]);
        for (int64_t j = 0; j < n; j++) o[j] = v;
    }
}

// the same on 16-bit storage st: each value converted, the result rounded once
static ALWAYS_INLINE void bin_run16(enum binop op, ck_dtype st, uint16_t *o, const uint16_t *a, int64_t sa,
                                    const uint16_t *b, int64_t sb, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        o[j] = ck_cpu_16_of_f32(st, bin_apply(op, ck_cpu_f32_of16(st, a[j * sa]), ck_cpu_f32_of16(st, b[j * sb])));
}

/* The output's dims with size-1 dims dropped and neighbours merged wherever both
 * inputs stay contiguous across them. sa, sb are the inputs' strides in elements,
 * 0 along a broadcast dim. This gives the fast paths without special cases: the
 * same shape folds to one dim (one flat loop per chunk), a bias over rows to
 * (R, K) with sb = (0, 1) (runs of K re-reading b), a per-channel (C,1,1)
 * against (N,C,H,W) to (N, C, HW) with sb = (0, 1, 0) (runs of HW against one
 * b value); anything else is a strided walk over up to CK_MAX_DIMS dims. */
typedef struct bcast {
    int m;
    int64_t n[CK_MAX_DIMS], sa[CK_MAX_DIMS], sb[CK_MAX_DIMS];
} bcast;

// v right-aligned against o; s gets v's stride along each of o's dims
static void input_strides(const ck_view *v, const ck_view *o, int64_t *s)
{
    int64_t st = 1;
    for (int d = o->ndim - 1; d >= 0; d--) {
        const int vd = d - (o->ndim - v->ndim);
        const int64_t sz = vd >= 0 ? v->shape[vd] : 1;
        assert(sz == 1 || sz == o->shape[d]);
        s[d] = sz == 1 ? 0 : st;
        st *= sz;
    }
}

// returns the output's numel
static int64_t bcast_init(bcast *bc, const ck_view *o, const ck_view *a, const ck_view *b)
{
    int64_t sa[CK_MAX_DIMS], sb[CK_MAX_DIMS];
    input_strides(a, o, sa);
    input_strides(b, o, sb);
    bc->m = 0;
    for (int d = 0; d < o->ndim; d++) {
        const int64_t n = o->shape[d];
        if (n == 1) continue;
        const int k = bc->m - 1;
        if (k >= 0 && bc->sa[k] == sa[d] * n && bc->sb[k] == sb[d] * n) {
            bc->n[k] *= n;
            bc->sa[k] = sa[d];
            bc->sb[k] = sb[d];
        } else {
            bc->n[bc->m] = n;
            bc->sa[bc->m] = sa[d];
            bc->sb[bc->m] = sb[d];
            bc->m++;
        }
    }
    if (bc->m == 0) {
        bc->n[0] = 1;
        bc->sa[0] = bc->sb[0] = 0;
        bc->m = 1;
    }
    assert(bc->sa[bc->m - 1] <= 1 && bc->sb[bc->m - 1] <= 1);
    return ck_view_numel(o);
}

/* One task's stretch [c*CHUNK, (c+1)*CHUNK) of the output, walked run by run
 * along the last merged dim with an odometer over the others (no division per
 * element). Called with a literal op from inside each kernel's own parallel
 * loop: OpenMP outlines a region before inlining, so an op passed into a shared
 * region would stay a runtime value and block vectorization. */
static ALWAYS_INLINE void bin_chunk(enum binop op, void *o, const void *a, const void *b, const bcast *bc,
                                    int64_t total, int64_t c, ck_dtype st)
{
    const int last = bc->m - 1;
    int64_t i = c * CHUNK;
    const int64_t end = i + CHUNK < total ? i + CHUNK : total;
    int64_t idx[CK_MAX_DIMS], rem = i, oa = 0, ob = 0;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % bc->n[d];
        rem /= bc->n[d];
        oa += idx[d] * bc->sa[d];
        ob += idx[d] * bc->sb[d];
    }
    while (i < end) {
        int64_t len = bc->n[last] - idx[last];
        if (len > end - i) len = end - i;
        if (st != CK_F32)
            bin_run16(op, st, (uint16_t *)o + i, (const uint16_t *)a + oa, bc->sa[last], (const uint16_t *)b + ob,
                         bc->sb[last], len);
        else
            bin_run(op, (float *)o + i, (const float *)a + oa, bc->sa[last], (const float *)b + ob, bc->sb[last], len);
        i += len;
        idx[last] += len;
        oa += len * bc->sa[last];
        ob += len * bc->sb[last];
        for (int d = last; d > 0 && idx[d] == bc->n[d]; d--) {
            idx[d] = 0;
            oa += bc->sa[d - 1] - bc->n[d] * bc->sa[d];
            ob += bc->sb[d - 1] - bc->n[d] * bc->sb[d];
            idx[d - 1]++;
        }
    }
}

// a, b broadcast to out (shapes aligned on the right); storage st: CK_F32, CK_BF16 or CK_F16
#define BIN_KERNEL(name, op, st)                                                                               \
    CK_CPU_KERNEL(name)                                                                                          \
    {                                                                                                            \
        (void)ctx, (void)p, (void)nout, (void)nin;                                                               \
        bcast bc;                                                                                                \
        const int64_t total = bcast_init(&bc, &out[0], &in[0], &in[1]), nchunks = (total + CHUNK - 1) / CHUNK; \
        _Pragma("omp parallel for schedule(static) if (total > PAR_MIN)")                                       \
        for (int64_t c = 0; c < nchunks; c++) bin_chunk(op, out[0].data, in[0].data, in[1].data, &bc, total, c, st);   \
    }
BIN_KERNEL(ck_cpu_add, BIN_ADD, CK_F32)
BIN_KERNEL(ck_cpu_sub, BIN_SUB, CK_F32)
BIN_KERNEL(ck_cpu_mul, BIN_MUL, CK_F32)
BIN_KERNEL(ck_cpu_add_bf16, BIN_ADD, CK_BF16)
BIN_KERNEL(ck_cpu_sub_bf16, BIN_SUB, CK_BF16)
BIN_KERNEL(ck_cpu_mul_bf16, BIN_MUL, CK_BF16)
BIN_KERNEL(ck_cpu_add_f16, BIN_ADD, CK_F16)
BIN_KERNEL(ck_cpu_sub_f16, BIN_SUB, CK_F16)
BIN_KERNEL(ck_cpu_mul_f16, BIN_MUL, CK_F16)

// x and y any shape, same numel
CK_CPU_KERNEL(ck_cpu_scale)
{
    (void)ctx, (void)nout, (void)nin;
    float *y = out[0].data;
    const float *x = in[0].data;
    const float f = p->f[0];
    const int64_t n = ck_view_numel(&out[0]);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = f * x[i];
}

// y any shape
CK_CPU_KERNEL(ck_cpu_fill)
{
    (void)ctx, (void)nout, (void)in, (void)nin;
    float *y = out[0].data;
    const float f = p->f[0];
    const int64_t n = ck_view_numel(&out[0]);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = f;
}

// 16-bit storage st: y = f * x and y = f, rounded once
static ALWAYS_INLINE void scale16(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    uint16_t *y = (uint16_t *)out[0].data;
    const uint16_t *x = (const uint16_t *)in[0].data;
    const float f = p->f[0];
    const int64_t n = ck_view_numel(&out[0]);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = ck_cpu_16_of_f32(st, f * ck_cpu_f32_of16(st, x[i]));
}

static void fill16(ck_dtype st, const ck_op_params *p, ck_view *out)
{
    uint16_t *y = (uint16_t *)out[0].data;
    const uint16_t v = ck_cpu_16_of_f32(st, p->f[0]);
    const int64_t n = ck_view_numel(&out[0]);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = v;
}

CK_CPU_ENTRIES16(scale, scale16(st, p, out, in))
CK_CPU_ENTRIES16(fill, fill16(st, p, out))

/* ---- REDUCE_TO ---- */

/* A set of x's (merged) dims walked in row-major order. */
typedef struct dims {
    int n;
    int64_t size[CK_MAX_DIMS], stride[CK_MAX_DIMS];
} dims;

static int64_t dims_count(const dims *d)
{
    int64_t c = 1;
    for (int k = 0; k < d->n; k++) c *= d->size[k];
    return c;
}

// returns the offset of position `flat`, leaving its indices in idx
static int64_t dims_decode(const dims *d, int64_t flat, int64_t *idx)
{
    int64_t off = 0;
    for (int k = d->n - 1; k >= 0; k--) {
        idx[k] = flat % d->size[k];
        flat /= d->size[k];
        off += idx[k] * d->stride[k];
    }
    return off;
}

static inline void dims_next(const dims *d, int64_t *idx, int64_t *off)
{
    for (int k = d->n - 1; k >= 0; k--) {
        *off += d->stride[k];
        if (++idx[k] < d->size[k]) return;
        *off -= d->stride[k] * d->size[k];
        idx[k] = 0;
    }
}


/* How many fixed segments to split each output's sum into: one when the outputs
 * alone give enough parallel tasks, else enough to reach TASKS_TARGET, each at
 * least ~4096 elements, and all partials within PART_MAX. Depends on shapes
 * only, so results do not depend on the thread count. */
static int64_t segments(int64_t tasks, int64_t total, int64_t task_elems, int64_t part_per_task)
{
    if (total <= PAR_MIN || tasks >= TASKS_TARGET) return 1;
    int64_t s = (TASKS_TARGET + tasks - 1) / tasks;
    if (s > task_elems / 4096) s = task_elems / 4096;
    if (s * tasks * part_per_task > PART_MAX) s = PART_MAX / (tasks * part_per_task);
    return s < 1 ? 1 : s;
}

/* The summed dims end with a contiguous run of L: each output sums Q such runs
 * (rd walks them), as a flat sequence of Q*L elements cut into S segments. */
static void reduce_runs(float *y, const float *x, const dims *kd, const dims *rd, int64_t L)
{
    const int64_t nout = dims_count(kd), M = dims_count(rd) * L, total = nout * M;
    const int64_t S = segments(nout, total, M, 1);
    double part[PART_MAX];
#pragma omp parallel for schedule(static) if (total > PAR_MIN)
    for (int64_t t = 0; t < nout * S; t++) {
        const int64_t o = t / S, s = t % S;
        int64_t kidx[CK_MAX_DIMS], ridx[CK_MAX_DIMS];
        const float *base = x + dims_decode(kd, o, kidx);
        int64_t f = M * s / S;
        const int64_t f1 = M * (s + 1) / S;
        int64_t l = f % L, off = dims_decode(rd, f / L, ridx);
        double acc = 0;
        while (f < f1) {
            const int64_t len = L - l < f1 - f ? L - l : f1 - f;
            acc += ck_cpu_sum8(base + off + l, len);
            f += len;
            l = 0;
            dims_next(rd, ridx, &off);
        }
        if (S == 1)
            y[o] = (float)acc;
        else
            part[t] = acc;
    }
    if (S == 1) return;
    for (int64_t o = 0; o < nout; o++) {
        double acc = 0;
        for (int64_t s = 0; s < S; s++) acc += part[o * S + s];
        y[o] = (float)acc;
    }
}

/* The kept dims end with a contiguous run of W columns: each output row sums Q
 * x rows (rd walks them) in order into a double tile of up to TILE columns. */
static void reduce_rows(float *y, const float *x, const dims *kd, const dims *rd, int64_t W)
{
    const int64_t nrows = dims_count(kd), Q = dims_count(rd), total = nrows * Q * W;
    const int64_t T = W < TILE ? W : TILE, ntiles = (W + T - 1) / T, tasks = nrows * ntiles;
    const int64_t S = segments(tasks, total, Q * T, T);
    double part[PART_MAX];
#pragma omp parallel for schedule(static) if (total > PAR_MIN)
    for (int64_t t = 0; t < tasks * S; t++) {
        const int64_t s = t % S, tile = t / S % ntiles, row = t / S / ntiles;
        const int64_t j0 = tile * T, w = W - j0 < T ? W - j0 : T;
        int64_t kidx[CK_MAX_DIMS], ridx[CK_MAX_DIMS];
        const float *base = x + dims_decode(kd, row, kidx) + j0;
        const int64_t q1 = Q * (s + 1) / S;
        int64_t q = Q * s / S, off = dims_decode(rd, q, ridx);
        double acc[TILE];
        for (int64_t j = 0; j < w; j++) acc[j] = 0;
        for (; q < q1; q++) {
            const float *xr = base + off;
            for (int64_t j = 0; j < w; j++) acc[j] += (double)xr[j];
            dims_next(rd, ridx, &off);
        }
        if (S == 1) {
            for (int64_t j = 0; j < w; j++) y[row * W + j0 + j] = (float)acc[j];
        } else {
            for (int64_t j = 0; j < w; j++) part[t * T + j] = acc[j];
        }
    }
    if (S == 1) return;
    for (int64_t tt = 0; tt < tasks; tt++) {
        const int64_t tile = tt % ntiles, row = tt / ntiles, j0 = tile * T, w = W - j0 < T ? W - j0 : T;
        for (int64_t j = 0; j < w; j++) {
            double acc = 0;
            for (int64_t s = 0; s < S; s++) acc += part[(tt * S + s) * T + j];
            y[row * W + j0 + j] = (float)acc;
        }
    }
}

/* x is any shape; y's shape broadcasts to x's when right-aligned, e.g.
 * (N,C,H,W) -> (C,1,1), (R,K) -> (K), (B,L,C) -> (1,1,C). Every output is a
 * double sum over its x elements in row-major order of the summed dims (cut into
 * fixed segments, combined in order, when there are few outputs). */
CK_CPU_KERNEL(ck_cpu_reduce_to)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const ck_view *xv = &in[0], *yv = &out[0];
    float *y = yv->data;
    const float *x = xv->data;
    if (ck_view_numel(yv) == 0) return;
    const int r = xv->ndim > yv->ndim ? xv->ndim : yv->ndim;
    int64_t gsize[CK_MAX_DIMS], gstride[CK_MAX_DIMS];
    int gkept[CK_MAX_DIMS], g = 0;
    for (int k = 0; k < r; k++) {
        const int xd = k - (r - xv->ndim), yd = k - (r - yv->ndim);
        const int64_t xs = xd >= 0 ? xv->shape[xd] : 1, ys = yd >= 0 ? yv->shape[yd] : 1;
        assert(ys == xs || ys == 1);
        if (xs == 1) continue;
        const int kept = ys == xs;
        if (g > 0 && gkept[g - 1] == kept) {
            gsize[g - 1] *= xs;
        } else {
            gsize[g] = xs;
            gkept[g] = kept;
            g++;
        }
    }
    int reduced = 0;
    int64_t st = 1;
    for (int k = g - 1; k >= 0; k--) {
        gstride[k] = st;
        st *= gsize[k];
        reduced |= !gkept[k];
    }
    if (!reduced) {
        if (y != x) memcpy(y, x, sizeof(float) * (size_t)ck_view_numel(xv));
        return;
    }
    const int last_kept = gkept[g - 1];
    dims kd = {0}, rd = {0};
    for (int k = 0; k < g - 1; k++) {
        dims *d = gkept[k] ? &kd : &rd;
        d->size[d->n] = gsize[k];
        d->stride[d->n] = gstride[k];
        d->n++;
    }
    if (last_kept)
        reduce_rows(y, x, &kd, &rd, gsize[g - 1]);
    else
        reduce_runs(y, x, &kd, &rd, gsize[g - 1]);
}
