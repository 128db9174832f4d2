/* fp8 storage of frozen weights: float8 e4m3fn (1 sign, 4 exponent bits with
 * bias 7, 3 mantissa bits; no infinities; 0x7f and 0xff are NaN; largest
 * finite 448), as torch.float8_e4m3fn and kohya's --fp8_base store them.
 * Encoding rounds to nearest even as PyTorch's cast does: |x| above 464
 * rounds to the NaN code, as do infinities and NaN. Decoding is exact. The
 * decoder also compiles as CUDA device code; the host reads a table. */
#ifndef CK_FP8_H
#define CK_FP8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CK_FP8_HD __host__ __device__
#else
#define CK_FP8_HD
#endif

/* the largest finite e4m3fn value */
#define CK_F8E4M3_MAX 448.0f

static inline CK_FP8_HD float ck_f8e4m3_decode(uint8_t v)
{
    const int e = (v >> 3) & 15, m = v & 7;
    float f;
    if (e == 15 && m == 7) f = NAN;
    else if (e == 0) f = ldexpf((float)m, -9);   /* subnormal: m/8 * 2^-6 */
    else f = ldexpf((float)(m | 8), e - 10);      /* (1 + m/8) * 2^(e-7) */
    return (v & 0x80) ? -f : f;
}

/* the 256 codes decoded, for loops on the host (ops/cpu/backend.c fills it
 * from ck_f8e4m3_decode when the library loads) */
extern float ck_f8e4m3_values[256];

static inline uint8_t ck_f8e4m3_encode(float f)
{
    uint32_t u, big;
    memcpy(&u, &f, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    big = UINT32_C(1087) << 20; /* 480.0f */
    if (u >= big) return (uint8_t)(sign | 0x7f);
    if (u < (UINT32_C(121) << 23)) {
        /* below 2^-6, the smallest normal: adding 2^14 rounds to the
         * subnormal step 2^-9 (to nearest even), whose count is the code */
        const uint32_t denorm = UINT32_C(141) << 23;
        float a, d;
        memcpy(&a, &u, sizeof a);
        memcpy(&d, &denorm, sizeof d);
        a += d;
        memcpy(&u, &a, sizeof u);
        return (uint8_t)(sign | (uint8_t)(u - denorm));
    }
    const uint32_t odd = (u >> 20) & 1;
    u += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + odd;
    return (uint8_t)(sign | (uint8_t)(u >> 20));
}

#endif
