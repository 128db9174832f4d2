/* adaLN's modulation on the CPU: MODULATE ((1 + scale) x + shift) and GATE
 * (x + gate y), per-sample rows [B,C] broadcast over the M positions of x
 * [B,..,C], and their backwards, whose sums over the positions (dshift, dscale,
 * dgate) are taken in double, position by position in order, and rounded once,
 * whatever the thread count. One body for fp32, bf16 and fp16 storage: the
 * same float operations on the same values, so a 16-bit output is the fp32
 * kernel's rounded once. */
#include "cpu.h"

#include <string.h>

/* columns a task takes: its sums live on the stack (2 x 2 KiB) */
#define CB 256

/* n values of storage st from element off of src into dst, as floats */
static void ld(ck_dtype st, float *dst, const void *src, int64_t off, int64_t n)
{
    if (st == CK_F32) memcpy(dst, (const float *)src + off, sizeof(float) * (size_t)n);
    else ck_cpu_load16(st, dst, (const uint16_t *)src + off, n);
}

static void sto(ck_dtype st, void *dst, int64_t off, const float *src, int64_t n)
{
    if (st == CK_F32) memcpy((float *)dst + off, src, sizeof(float) * (size_t)n);
    else ck_cpu_store16(st, (uint16_t *)dst + off, src, n);
}

/* x [B,..,C] as B samples of M rows of C */
typedef struct dims {
    int64_t B, M, C;
} dims;

static dims dims_of(const ck_view *x)
{
    dims d = {x->shape[0], 0, x->shape[x->ndim - 1]};
    d.M = d.B > 0 && d.C > 0 ? ck_view_numel(x) / (d.B * d.C) : 0;
    return d;
}

// MODULATE: x [B,..,C], shift and scale [B,C]; y = (1 + scale) * x + shift.
// GATE: x [B,..,C], gate [B,C], v like x; y = x + gate * v.
static void fwd(ck_dtype st, int gate, ck_view *out, const ck_view *in)
{
    const dims d = dims_of(&in[0]);
    if (d.B * d.M * d.C == 0) return;
    const void *x = in[0].data, *a = in[1].data, *b = in[2].data;
    void *y = out[0].data;
#pragma omp parallel for schedule(static) if (d.B * d.M * d.C > 32768)
    for (int64_t r = 0; r < d.B * d.M; r++) {
        const int64_t row = r / d.M * d.C;
        float xb[CB], ab[CB], bb[CB];
        for (int64_t c0 = 0; c0 < d.C; c0 += CB) {
            const int64_t k = d.C - c0 < CB ? d.C - c0 : CB;
            ld(st, xb, x, r * d.C + c0, k);
            ld(st, ab, a, row + c0, k);
            if (gate) {
                ld(st, bb, b, r * d.C + c0, k);
                for (int64_t c = 0; c < k; c++) xb[c] = xb[c] + ab[c] * bb[c];
            } else {
                ld(st, bb, b, row + c0, k);
                for (int64_t c = 0; c < k; c++) xb[c] = (1.0f + bb[c]) * xb[c] + ab[c];
            }
            sto(st, y, r * d.C + c0, xb, k);
        }
    }
}

// MODULATE_BWD: in dy, x, scale; out dx = (1 + scale) * dy, dshift = sum dy, dscale = sum dy * x.
// GATE_BWD: in dy, gate, v; out dgate = sum dy * v, dv = gate * dy.
// Sums over the M rows of each sample. A task owns a sample's CB columns and walks
// its rows in order, so each sum is one fixed sequence of additions.
static void bwd(ck_dtype st, int gate, ck_view *out, int nout, const ck_view *in)
{
    const ck_view *big = &in[gate ? 2 : 1]; /* x or v: [B,..,C] */
    const dims d = dims_of(big);
    if (d.B * d.C == 0) return;
    const void *dy = in[0].data, *x = big->data, *w = in[gate ? 1 : 2].data; /* w: scale or gate */
    void *dbig = gate ? (nout > 1 ? out[1].data : NULL) : out[0].data;       /* dx or dv */
    void *s1 = gate ? NULL : (nout > 1 ? out[1].data : NULL);                /* dshift */
    void *s2 = gate ? out[0].data : (nout > 2 ? out[2].data : NULL);         /* dscale or dgate */
    const int64_t nb = (d.C + CB - 1) / CB;
#pragma omp parallel for schedule(static) if (d.B * d.M * d.C > 32768)
    for (int64_t task = 0; task < d.B * nb; task++) {
        const int64_t b = task / nb, c0 = task % nb * CB, k = d.C - c0 < CB ? d.C - c0 : CB;
        float wb[CB], gb[CB], xb[CB];
        double a1[CB], a2[CB];
        for (int64_t c = 0; c < k; c++) a1[c] = a2[c] = 0.0;
        ld(st, wb, w, b * d.C + c0, k);
        if (!gate)
            for (int64_t c = 0; c < k; c++) wb[c] = 1.0f + wb[c];
        for (int64_t m = 0; m < d.M; m++) {
            const int64_t off = (b * d.M + m) * d.C + c0;
            ld(st, gb, dy, off, k);
            if (s1)
                for (int64_t c = 0; c < k; c++) a1[c] += gb[c];
            if (s2) {
                ld(st, xb, x, off, k);
                for (int64_t c = 0; c < k; c++) a2[c] += (double)gb[c] * xb[c];
            }
            if (dbig) {
                for (int64_t c = 0; c < k; c++) gb[c] = wb[c] * gb[c];
                sto(st, dbig, off, gb, k);
            }
        }
        float r[CB];
        if (s1) {
            for (int64_t c = 0; c < k; c++) r[c] = (float)a1[c];
            sto(st, s1, b * d.C + c0, r, k);
        }
        if (s2) {
            for (int64_t c = 0; c < k; c++) r[c] = (float)a2[c];
            sto(st, s2, b * d.C + c0, r, k);
        }
    }
}

CK_CPU_KERNEL(ck_cpu_modulate)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    fwd(CK_F32, 0, out, in);
}

CK_CPU_KERNEL(ck_cpu_modulate_bwd)
{
    (void)ctx, (void)p, (void)nin;
    bwd(CK_F32, 0, out, nout, in);
}

CK_CPU_KERNEL(ck_cpu_gate)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    fwd(CK_F32, 1, out, in);
}

CK_CPU_KERNEL(ck_cpu_gate_bwd)
{
    (void)ctx, (void)p, (void)nin;
    bwd(CK_F32, 1, out, nout, in);
}

CK_CPU_ENTRIES16(modulate, fwd(st, 0, out, in))

CK_CPU_ENTRIES16(modulate_bwd, bwd(st, 0, out, nout, in))

CK_CPU_ENTRIES16(gate, fwd(st, 1, out, in))

CK_CPU_ENTRIES16(gate_bwd, bwd(st, 1, out, nout, in))
