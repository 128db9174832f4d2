/* bf16 storage: fp32 with the low 16 bits dropped, rounded to nearest even
 * (NaN stays a quiet NaN), as __float2bfloat16 does on the GPU. */
#ifndef CK_BF16_H
#define CK_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t ck_bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ck_f32_from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n values from bf16 to fp32 and back (one thread's run: callers split the work) */
static inline void ck_bf16_load(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = ck_f32_from_bf16(src[i]);
}

static inline void ck_bf16_store(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = ck_bf16_from_f32(src[i]);
}

/* a bf16 value is finite unless its exponent bits are all ones */
static inline int ck_bf16_finite(uint16_t h) { return (h & 0x7f80u) != 0x7f80u; }

#endif
