/* Scalar float helpers the CPU kernels share: bit casts, a vectorizable e^x
 * (glibc's expf does not vectorize), the sigmoid built on it, and a row's max.
 * Header-only, static inline. */
#ifndef CK_CPU_VECMATH_H
#define CK_CPU_VECMATH_H

#include <stdint.h>
#include <string.h>

static inline uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* e^x within 2 ulp (Cephes expf polynomial). Inputs are clamped to [-87, 88] so
 * 2^n stays a normal float: below, results are ~1e-38 instead of 0; above, ~1.6e38
 * instead of inf. The clamp and the NaN pass-through compare bit patterns as
 * integers: float compares may trap, which stops GCC from vectorizing selects. */
static inline float exp_c(float x)
{
    const uint32_t u = bits_of(x);
    const uint32_t lim = (u >> 31) ? 0xC2AE0000u /* -87 */ : 0x42B00000u /* 88 */;
    const float c = float_of(u < lim ? u : lim);
    const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(c / ln 2) */
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    const uint32_t e = bits_of(y * float_of((uint32_t)((int32_t)n + 127) << 23));
    const uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    return float_of((u & nan) | (e & ~nan));
}

/* SiLU's gate; GROUP_NORM_SILU (norm.c) shares it with SILU so the two agree bitwise */
static inline float sigmoid_c(float x)
{
    return 1.0f / (1.0f + exp_c(-x));
}

/* Largest of n >= 1 values over interleaved lanes (vectorizes in GCC and
 * clang alike; the max is exact, so the lane split does not change it). */
static inline float max_c(const float *x, int64_t n)
{
    float m[8];
    for (int l = 0; l < 8; l++) m[l] = x[0];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    float r = m[0];
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    for (int l = 1; l < 8; l++) r = m[l] > r ? m[l] : r;
    return r;
}

#endif
