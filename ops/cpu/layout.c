/* Data movement on the CPU: concat, slice, reshape, permute and nearest 2x
 * upsampling (with its backward). Everything but the upsample backward is a pure
 * copy; each output element is written by one thread. */
#include "cpu.h"

#include <omp.h>
#include <string.h>

/* Below this many elements one thread beats waking the pool (plain copies). */
#define PAR_MIN (1 << 18)

static int norm_dim(int64_t d, int ndim) { return (int)(d < 0 ? d + ndim : d); }

static int64_t prod(const int64_t *s, int from, int to)
{
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= s[d];
    return n;
}

/* A large copy split into blocks so more than one core streams memory. */
static void copy_bytes(void *dst, const void *src, size_t n)
{
    const size_t B = (size_t)1 << 18;
    const int64_t nb = (int64_t)((n + B - 1) / B);
#pragma omp parallel for schedule(static) if (n > 4 * B)
    for (int64_t i = 0; i < nb; i++) {
        const size_t lo = (size_t)i * B, len = n - lo < B ? n - lo : B;
        memcpy((char *)dst + lo, (const char *)src + lo, len);
    }
}

/* Concat, slice and reshape move elements of es bytes: fp32 (4), or bf16 and
 * fp16 alike (2). */

// a is (P,A,Q), b is (P,B,Q) around dim i0; out is (P,A+B,Q).
static void concat(const ck_op_params *p, ck_view *out, const ck_view *in, size_t es)
{
    const int d = norm_dim(p->i[0], out[0].ndim);
    const int64_t P = prod(out[0].shape, 0, d), Q = prod(out[0].shape, d + 1, out[0].ndim);
    const size_t A = (size_t)(in[0].shape[d] * Q) * es, Bq = (size_t)(in[1].shape[d] * Q) * es;
    const char *a = (const char *)in[0].data, *b = (const char *)in[1].data;
    char *y = (char *)out[0].data;
    if (P == 1) {
        copy_bytes(y, a, A);
        copy_bytes(y + A, b, Bq);
        return;
    }
#pragma omp parallel for schedule(static) if ((size_t)P * (A + Bq) > PAR_MIN * sizeof(float))
    for (int64_t i = 0; i < P; i++) {
        memcpy(y + (size_t)i * (A + Bq), a + (size_t)i * A, A);
        memcpy(y + (size_t)i * (A + Bq) + A, b + (size_t)i * Bq, Bq);
    }
}

// x is (P,X,Q) around dim i0; out is (P,i2,Q), entries i1 .. i1+i2-1 of that dim.
static void slice(const ck_op_params *p, ck_view *out, const ck_view *in, size_t es)
{
    const int d = norm_dim(p->i[0], in[0].ndim);
    const int64_t P = prod(in[0].shape, 0, d), Q = prod(in[0].shape, d + 1, in[0].ndim);
    const size_t X = (size_t)(in[0].shape[d] * Q) * es, L = (size_t)(p->i[2] * Q) * es, off = (size_t)(p->i[1] * Q) * es;
    const char *x = (const char *)in[0].data;
    char *y = (char *)out[0].data;
    if (P == 1) {
        copy_bytes(y, x + off, L);
        return;
    }
#pragma omp parallel for schedule(static) if ((size_t)P * L > PAR_MIN * sizeof(float))
    for (int64_t i = 0; i < P; i++) memcpy(y + (size_t)i * L, x + (size_t)i * X + off, L);
}

// x is any shape; out has the same number of elements (possibly the same buffer).
static void reshape(ck_view *out, const ck_view *in, size_t es)
{
    if (out[0].data != in[0].data) copy_bytes(out[0].data, in[0].data, (size_t)ck_view_numel(&in[0]) * es);
}

CK_CPU_KERNEL(ck_cpu_concat)
{
    (void)ctx, (void)nout, (void)nin;
    concat(p, out, in, sizeof(float));
}

CK_CPU_KERNEL(ck_cpu_slice)
{
    (void)ctx, (void)nout, (void)nin;
    slice(p, out, in, sizeof(float));
}

CK_CPU_KERNEL(ck_cpu_reshape)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    reshape(out, in, sizeof(float));
}

/* bf16 and fp16 storage (ops/cpu/table.c's ck_cpu_kernels_bf16 and _f16): the
 * same copies of 2-byte elements, bitwise whatever they hold */
CK_CPU_ENTRIES16(concat, concat(p, out, in, 2))
CK_CPU_ENTRIES16(slice, slice(p, out, in, 2))
CK_CPU_ENTRIES16(reshape, reshape(out, in, 2))

#define TILE 32

/* Permute and the upsample forward move elements of es bytes too, as integers
 * of that width (bitwise whatever they hold). */

// One tile of a transpose: dst[a * ok + b] = src[a + b * sl] over a in [bk, ek), b in [bl, el).
static void tile_copy(char *dst, const char *src, int64_t bk, int64_t ek, int64_t ok, int64_t bl, int64_t el, int64_t sl,
                      size_t es)
{
    for (int64_t a = bk; a < ek; a++) {
        if (es == 4) {
            uint32_t *drow = (uint32_t *)dst + a * ok;
            const uint32_t *scol = (const uint32_t *)src + a;
            for (int64_t b = bl; b < el; b++) drow[b] = scol[b * sl];
        } else {
            uint16_t *drow = (uint16_t *)dst + a * ok;
            const uint16_t *scol = (const uint16_t *)src + a;
            for (int64_t b = bl; b < el; b++) drow[b] = scol[b * sl];
        }
    }
}

// x is (d0..dn-1); out is (d_i0 .. d_i(n-1)): out dim j is input dim p->i[j].
static void permute(const ck_op_params *p, ck_view *out, const ck_view *in, size_t es)
{
    const ck_view *x = &in[0];
    const int nd = x->ndim;
    const int64_t n = ck_view_numel(x);
    if (n == 0) return;

    int64_t istride[CK_MAX_DIMS], s = 1;
    for (int d = nd - 1; d >= 0; d--) istride[d] = s, s *= x->shape[d];
    // In output order: sizes and input strides, dropping size-1 dims and merging
    // neighbours that stay adjacent in the input, so the loops below see as few
    // and as long dims as possible.
    int m = 0;
    int64_t sz[CK_MAX_DIMS], st[CK_MAX_DIMS];
    for (int j = 0; j < nd; j++) {
        const int64_t e = x->shape[p->i[j]], t = istride[p->i[j]];
        if (e == 1) continue;
        if (m > 0 && st[m - 1] == t * e) {
            sz[m - 1] *= e, st[m - 1] = t;
        } else {
            sz[m] = e, st[m] = t, m++;
        }
    }
    const char *src = (const char *)x->data;
    char *dst = (char *)out[0].data;
    if (m <= 1) {
        copy_bytes(dst, src, (size_t)n * es);
        return;
    }

    if (st[m - 1] == 1) {
        // The innermost output dim is contiguous in the input: copy runs of L,
        // each thread walking its share of runs with an odometer.
        const int64_t L = sz[m - 1], R = n / L;
#pragma omp parallel if (n > PAR_MIN)
        {
            const int nt = omp_get_num_threads(), t = omp_get_thread_num();
            const int64_t lo = R * t / nt, hi = R * (t + 1) / nt;
            int64_t idx[CK_MAX_DIMS], off = 0, r0 = lo;
            for (int j = m - 2; j >= 0; j--) idx[j] = r0 % sz[j], r0 /= sz[j], off += idx[j] * st[j];
            for (int64_t r = lo; r < hi; r++) {
                memcpy(dst + (size_t)(r * L) * es, src + (size_t)off * es, (size_t)L * es);
                for (int j = m - 2; j >= 0; j--) {
                    off += st[j];
                    if (++idx[j] < sz[j]) break;
                    off -= st[j] * sz[j];
                    idx[j] = 0;
                }
            }
        }
        return;
    }

    // Otherwise some output dim k is the contiguous input dim: transpose TILE x TILE
    // blocks of (k, last) so both reads and writes stay within a few cache lines.
    int k = 0;
    while (st[k] != 1) k++;
    int64_t ost[CK_MAX_DIMS];
    s = 1;
    for (int j = m - 1; j >= 0; j--) ost[j] = s, s *= sz[j];
    const int64_t K = sz[k], L = sz[m - 1], sl = st[m - 1], ok = ost[k];
    const int64_t tk = (K + TILE - 1) / TILE, tl = (L + TILE - 1) / TILE;
    const int64_t units = n / (K * L) * tk * tl;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        int64_t r = u / (tk * tl);
        const int64_t bk = (u / tl) % tk * TILE, bl = u % tl * TILE;
        int64_t io = 0, oo = 0;
        for (int j = m - 2; j >= 0; j--) {
            if (j == k) continue;
            const int64_t i = r % sz[j];
            r /= sz[j], io += i * st[j], oo += i * ost[j];
        }
        const int64_t ek = bk + TILE < K ? bk + TILE : K, el = bl + TILE < L ? bl + TILE : L;
        tile_copy(dst + (size_t)oo * es, src + (size_t)io * es, bk, ek, ok, bl, el, sl, es);
    }
}

// x is (N,C,H,W); out is (N,C,2H,2W), each pixel repeated over a 2x2 block.
static void upsample2x(ck_view *out, const ck_view *in, size_t es)
{
    const int64_t W = in[0].shape[3], rows = in[0].shape[0] * in[0].shape[1] * in[0].shape[2];
    const char *x = (const char *)in[0].data;
    char *y = (char *)out[0].data;
#pragma omp parallel for schedule(static) if (rows * W > PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++) {
        char *d = y + (size_t)(r * 4 * W) * es;
        if (es == 4) {
            const uint32_t *s = (const uint32_t *)x + r * W;
            uint32_t *d4 = (uint32_t *)d;
            for (int64_t w = 0; w < W; w++) d4[2 * w] = s[w], d4[2 * w + 1] = s[w];
        } else {
            const uint16_t *s = (const uint16_t *)x + r * W;
            uint16_t *d2 = (uint16_t *)d;
            for (int64_t w = 0; w < W; w++) d2[2 * w] = s[w], d2[2 * w + 1] = s[w];
        }
        memcpy(d + (size_t)(2 * W) * es, d, (size_t)(2 * W) * es);
    }
}

CK_CPU_KERNEL(ck_cpu_permute)
{
    (void)ctx, (void)nout, (void)nin;
    permute(p, out, in, sizeof(float));
}

CK_CPU_KERNEL(ck_cpu_upsample2x)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    upsample2x(out, in, sizeof(float));
}

// dy is (N,C,2H,2W); out dx is (N,C,H,W), the sum of each 2x2 block.
CK_CPU_KERNEL(ck_cpu_upsample2x_bwd)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    const int64_t W = out[0].shape[3], rows = out[0].shape[0] * out[0].shape[1] * out[0].shape[2];
    const float *dy = in[0].data;
    float *dx = out[0].data;
#pragma omp parallel for schedule(static) if (rows * W > PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++) {
        const float *d0 = dy + r * 4 * W, *d1 = d0 + 2 * W;
        float *s = dx + r * W;
        for (int64_t w = 0; w < W; w++) s[w] = (d0[2 * w] + d0[2 * w + 1]) + (d1[2 * w] + d1[2 * w + 1]);
    }
}

/* 16-bit storage: permute and the upsample move 2-byte elements; the upsample
 * backward sums each window in fp32, in the fp32 kernel's order, and rounds
 * once, so its output is the fp32 kernel's on the same values, rounded. */
CK_CPU_ENTRIES16(permute, permute(p, out, in, 2))
CK_CPU_ENTRIES16(upsample2x, upsample2x(out, in, 2))

// dy is (N,C,2H,2W); out dx is (N,C,H,W); both of storage type st.
static void upsample2x_bwd16(ck_dtype st, ck_view *out, const ck_view *in)
{
    const int64_t W = out[0].shape[3], rows = out[0].shape[0] * out[0].shape[1] * out[0].shape[2];
    const uint16_t *dy = (const uint16_t *)in[0].data;
    uint16_t *dx = (uint16_t *)out[0].data;
#pragma omp parallel for schedule(static) if (rows * W > PAR_MIN / 4)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *d0 = dy + r * 4 * W, *d1 = d0 + 2 * W;
        uint16_t *s = dx + r * W;
        for (int64_t w = 0; w < W; w++) {
            const float a = ck_cpu_f32_of16(st, d0[2 * w]), b = ck_cpu_f32_of16(st, d0[2 * w + 1]);
            const float c = ck_cpu_f32_of16(st, d1[2 * w]), d = ck_cpu_f32_of16(st, d1[2 * w + 1]);
            s[w] = ck_cpu_16_of_f32(st, (a + b) + (c + d));
        }
    }
}

CK_CPU_ENTRIES16(upsample2x_bwd, upsample2x_bwd16(st, out, in))
