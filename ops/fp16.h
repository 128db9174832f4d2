/* fp16 storage (IEEE binary16: 1 sign, 5 exponent bits with bias 15, 10
 * mantissa bits; largest finite 65504): fp32 to fp16 rounds to nearest even
 * as __float2half_rn does (65520 and above become inf, subnormals kept, NaN
 * stays a quiet NaN); fp16 to fp32 is exact. Bit arithmetic only, so the host
 * and the GPU (these compile as device code too) store the same bits. */
#ifndef CK_FP16_H
#define CK_FP16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CK_FP16_HD __host__ __device__
#else
#define CK_FP16_HD
#endif

/* the largest finite fp16 value */
#define CK_F16_MAX 65504.0f

static inline CK_FP16_HD uint32_t ck_f16_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static inline CK_FP16_HD uint16_t ck_f16_from_f32(float x)
{
    const uint32_t u = ck_f16_f32_bits(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7FFFFFFFu;
    /* NaN: keep the top payload bits and force the quiet bit, so a payload
     * living only in the low bits cannot turn into inf */
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {
        /* below 2^-14 the half is subnormal: value = m * 2^-24 */
        if (a < 0x33000000u) return sign; /* under 2^-25, rounds to zero */
        const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r); /* r may reach 0x400: the smallest normal, correctly */
    }
    const uint32_t v = a - 0x38000000u; /* rebias the exponent from 127 to 15 */
    uint32_t r = v >> 13;
    const uint32_t rem = v & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

static inline CK_FP16_HD float ck_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu, u;
    if (e == 0x1F) u = sign | 0x7F800000u | (m << 13);
    else if (e) u = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) u = sign;
    else { /* subnormal: normalise, the result is exact in fp32 */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((m & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* n values from fp16 to fp32 and back (one thread's run: callers split the work) */
static inline void ck_f16_load(float *dst, const uint16_t *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = ck_f32_from_f16(src[i]);
}

static inline void ck_f16_store(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = ck_f16_from_f32(src[i]);
}

/* an fp16 value is finite unless its exponent bits are all ones */
static inline CK_FP16_HD int ck_f16_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

#endif
