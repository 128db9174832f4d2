/* 8-bit AdamW state, as bitsandbytes' AdamW8bit stores it: the moments in
 * blocks of CK_ADAM8_BLOCK values, each value a byte indexing a 256-entry
 * code and each block scaled by its largest magnitude. The first moment uses
 * bitsandbytes' signed dynamic code, the second its unsigned one
 * (create_dynamic_map: decades 1e-6 .. 1 split into 2^i (signed) or 2^(i+1)
 * (unsigned) midpoints of linspace(0.1, 1), plus 0 and 1). A step dequantizes
 * a block, updates the moments and the parameter in fp32, and quantizes the
 * new moments to the nearest code (ties to the larger) under the block's new
 * largest magnitude. The quantizer also compiles as CUDA device code. */
#ifndef CK_ADAM8_H
#define CK_ADAM8_H

#include "ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __CUDACC__
#define CK_ADAM8_HD __host__ __device__
#else
#define CK_ADAM8_HD
#endif

#define CK_ADAM8_BLOCK 256

/* the codes, ascending */
typedef struct ck_adam8_maps {
    float m[256]; /* signed, for the first moment */
    float v[256]; /* unsigned, for the second */
} ck_adam8_maps;

static inline int ck_adam8_cmp(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static inline void ck_adam8_code(float *out, int is_signed)
{
    int k = 0;
    for (int i = 0; i < 7; i++) {
        const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1; /* linspace(0.1, 1, items) */
        const double scale = pow(10.0, i - 6);
        for (int j = 0; j + 1 < items; j++) {
            const double lo = 0.1 + 0.9 * j / (items - 1), hi = 0.1 + 0.9 * (j + 1) / (items - 1);
            out[k++] = (float)(scale * (lo + hi) / 2);
            if (is_signed) out[k++] = (float)(-scale * (lo + hi) / 2);
        }
    }
    out[k++] = 0.0f;
    out[k++] = 1.0f;
    qsort(out, (size_t)k, sizeof *out, ck_adam8_cmp);
}

static inline void ck_adam8_maps_make(ck_adam8_maps *maps)
{
    ck_adam8_code(maps->m, 1);
    ck_adam8_code(maps->v, 0);
}

/* A step's scalars, formed in double from the context and the op's params
 * and rounded to float once (as AdamW's); on the GPU, on the device, from the
 * step block (ops/cuda/optim.cu). */
typedef struct ck_adam8_step {
    float b1, b2, w1, w2, eps, decay, neg_step, bc2_sqrt;
} ck_adam8_step;

static inline CK_ADAM8_HD ck_adam8_step ck_adam8_step_of(const ck_kctx *ctx, const ck_op_params *p)
{
    const double lr = (double)ctx->lr * p->f[CK_OPT_LR_SCALE], b1 = p->f[0], b2 = p->f[1], wd = p->f[3];
    const double t = (double)(ctx->update > 0 ? ctx->update : 1);
    ck_adam8_step s;
    s.b1 = p->f[0], s.b2 = p->f[1], s.w1 = (float)(1.0 - b1), s.w2 = (float)(1.0 - b2), s.eps = p->f[2];
    s.decay = (float)(1.0 - lr * wd), s.neg_step = (float)(-(lr / (1.0 - pow(b1, t))));
    s.bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    return s;
}

/* One value: the moments m0, v0 (dequantized) updated with gradient g into
 * *m, *v, and the parameter pr updated, returned. */
static inline CK_ADAM8_HD float ck_adam8_update(const ck_adam8_step *s, float pr, float g, float m0, float v0, float *m,
                                                float *v)
{
    *m = m0 * s->b1 + s->w1 * g;
    *v = v0 * s->b2 + s->w2 * g * g;
    return pr * s->decay + s->neg_step * *m / (sqrtf(*v) / s->bc2_sqrt + s->eps);
}

/* the index of the code nearest x (codes ascending; ties to the larger) */
static inline CK_ADAM8_HD uint8_t ck_adam8_quantize(const float *code, float x)
{
    int lo = 0, hi = 255; /* the first code >= x lies in [lo, hi] */
    if (!(x > code[0])) return 0;
    if (x >= code[255]) return 255;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (code[mid] >= x) hi = mid;
        else lo = mid + 1;
    }
    return (uint8_t)(x - code[lo - 1] < code[lo] - x ? lo - 1 : lo);
}

#endif
