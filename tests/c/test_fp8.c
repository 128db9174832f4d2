/* The fp8 (e4m3fn) codec of ops/fp8.h (and the host's table of decoded
 * values, ops/cpu/backend.c) against references built here from the
 * format's definition: every one of the 256 codes decodes to
 * (-1)^s (1 + m/8) 2^(e-7) (subnormals m/8 2^-6; 0x7f and 0xff NaN), and
 * encoding picks the nearest code, ties to the even code, over a grid where
 * 0x7f stands for 480 (so that, as PyTorch's cast, |x| above 464 becomes NaN):
 * on every code's value, every midpoint between neighbours and the floats
 * just either side of it, and random floats from 2^-12 to 2^10. */
#include "../../ops/fp8.h"
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the value of a non-negative code 0..0x7e, and 480 for 0x7f */
static double grid(int c)
{
    const int e = c >> 3, m = c & 7;
    if (c == 0x7f) return 480.0;
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

static uint8_t nearest(float x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const double a = fabs((double)x);
    if (isnan(x) || a >= 480.0) return sign | 0x7f;
    int best = 0;
    for (int c = 1; c <= 0x7f; c++) {
        const double d = fabs(grid(c) - a), db = fabs(grid(best) - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return sign | (uint8_t)best;
}

static uint64_t rng = 0x2545f4914f6cdd1dULL;

static double unit(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static long encode_misses(float x, long *seen)
{
    (*seen)++;
    const uint8_t got = ck_f8e4m3_encode(x), want = nearest(x);
    if (got == want) return 0;
    if (*seen < 1000000) printf("  %.9g encodes as 0x%02x, nearest 0x%02x\n", (double)x, got, want);
    return 1;
}

int main(void)
{
    long bad = 0;
    for (int c = 0; c < 256; c++) {
        const float got = ck_f8e4m3_decode((uint8_t)c);
        const int mag = c & 0x7f;
        if (mag == 0x7f) {
            bad += !isnan(got);
            continue;
        }
        const double want = (c & 0x80 ? -1.0 : 1.0) * grid(mag);
        bad += (double)got != want || !!signbit(got) != (c >= 0x80);
    }
    check("the 256 codes decode to their values (0x7f and 0xff NaN)", bad == 0, bad);
    bad = 0;
    for (int c = 0; c < 256; c++) {
        const float d = ck_f8e4m3_decode((uint8_t)c), t = ck_f8e4m3_values[c];
        bad += isnan(d) ? !isnan(t) : memcmp(&d, &t, sizeof d) != 0;
    }
    check("the host's table holds the same 256 values", bad == 0, bad);
    check("the largest finite code is 448", ck_f8e4m3_decode(0x7e) == CK_F8E4M3_MAX && ck_f8e4m3_decode(0xfe) == -448.0f,
          0);

    long seen = 0;
    bad = 0;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f) bad += encode_misses(ck_f8e4m3_decode((uint8_t)c), &seen);
    check("every finite code's value encodes back to its code (signs and zeros included)", bad == 0, bad);

    bad = 0;
    for (int c = 0; c < 0x7f; c++) {
        const float mid = (float)((grid(c) + grid(c + 1)) / 2); /* exact: a few significant bits */
        for (int s = 0; s < 2; s++) {
            const float x = s ? -mid : mid;
            bad += encode_misses(x, &seen);
            bad += encode_misses(nextafterf(x, 0.0f), &seen);
            bad += encode_misses(nextafterf(x, s ? -1e9f : 1e9f), &seen);
        }
    }
    check("midpoints round to the even code, and the floats beside them to the nearer", bad == 0, bad);
    check("464 rounds to 448, above it is NaN, as PyTorch's cast", ck_f8e4m3_encode(464.0f) == 0x7e &&
          ck_f8e4m3_encode(nextafterf(464.0f, 1e9f)) == 0x7f && ck_f8e4m3_encode(-1e30f) == 0xff &&
          ck_f8e4m3_encode(INFINITY) == 0x7f && (ck_f8e4m3_encode(NAN) & 0x7f) == 0x7f, 0);

    bad = 0;
    for (int i = 0; i < 500000; i++) {
        const float x = (float)((unit() < 0.5 ? -1 : 1) * ldexp(1.0 + unit(), (int)(unit() * 22) - 12));
        bad += encode_misses(x, &seen);
    }
    check("500,000 random floats from 2^-12 to 2^10 encode to the nearest code", bad == 0, bad);
    return checks_done();
}
