/* Rotary position embedding on the CPU (ROPE): each head's adjacent pairs of x
 * rotated by the angle the table gives the row's position, in fp32 whatever
 * the storage of x (the table is fp32 always); i0 = 1 rotates back, which is
 * the backward. One body for fp32, bf16 and fp16 storage: the same float
 * operations on the same values, so a 16-bit output is the fp32 kernel's
 * rounded once. */
#include "cpu.h"

#include <string.h>

/* 16-bit rows are converted this many values at a time (even: pairs stay whole) */
#define CHUNK 2048

/* n values (n even) of one row from column f (even) on: y = x rotated by the
 * table row t of D floats (cos, sin per pair); sg = -1 negates the sines
 * (the inverse rotation). y may be x. The products and the sum in the order
 * of Black Forest Labs' apply_rope: y0 = c x0 + (-s) x1, y1 = s x0 + c x1. */
static void rotate(float *y, const float *x, int64_t f, int64_t n, const float *t, int64_t D, float sg)
{
    int64_t j = f % D;
    for (int64_t i = 0; i < n; i += 2) {
        const float c = t[j], s = sg * t[j + 1], x0 = x[i], x1 = x[i + 1];
        y[i] = c * x0 - s * x1;
        y[i + 1] = s * x0 + c * x1;
        j += 2;
        if (j == D) j = 0;
    }
}

// x is (..,L,F) of storage st, table (L,D) fp32, y like x
static void rope(ck_dtype st, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    const ck_view *x = &in[0];
    const int64_t L = x->shape[x->ndim - 2], F = x->shape[x->ndim - 1], D = in[1].shape[1];
    const int64_t n = ck_view_numel(x);
    if (n == 0) return;
    const int64_t rows = n / F;
    const float *tab = in[1].data, sg = p->i[0] ? -1.0f : 1.0f;

#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t r = 0; r < rows; r++) {
        const float *t = tab + (r % L) * D;
        if (st == CK_F32) {
            rotate(out[0].data + r * F, x->data + r * F, 0, F, t, D, sg);
            continue;
        }
        const uint16_t *xr = (const uint16_t *)x->data + r * F;
        uint16_t *yr = (uint16_t *)out[0].data + r * F;
        float buf[CHUNK];
        for (int64_t f = 0; f < F; f += CHUNK) {
            const int64_t k = F - f < CHUNK ? F - f : CHUNK;
            ck_cpu_load16(st, buf, xr + f, k);
            rotate(buf, buf, f, k, t, D, sg);
            ck_cpu_store16(st, yr + f, buf, k);
        }
    }
}

CK_CPU_KERNEL(ck_cpu_rope)
{
    (void)ctx, (void)nout, (void)nin;
    rope(CK_F32, p, out, in);
}

CK_CPU_ENTRIES16(rope, rope(st, p, out, in))
