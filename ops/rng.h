/* Counter-based random numbers: a value is a pure function of (seed, step, op key,
 * element index), so replaying an op (recompute, dropout backward) draws the same
 * numbers without saving any state. The mixer is splitmix64's finalizer. */
#ifndef CK_RNG_H
#define CK_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint64_t ck_rng_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One stream per (seed, step, key). */
static inline uint64_t ck_rng_key(uint64_t seed, uint64_t step, uint64_t key)
{
    return ck_rng_mix(ck_rng_mix(ck_rng_mix(seed) ^ step) ^ key);
}

static inline uint64_t ck_rng_u64(uint64_t stream, uint64_t counter)
{
    return ck_rng_mix(stream ^ ck_rng_mix(counter));
}

/* Uniform in [0, 1) with 24 bits. */
static inline float ck_rng_uniform(uint64_t stream, uint64_t counter)
{
    return (float)(ck_rng_u64(stream, counter) >> 40) * (1.0f / 16777216.0f);
}

/* Standard normal (Box-Muller on two 32-bit halves of one draw). */
static inline float ck_rng_normal(uint64_t stream, uint64_t counter)
{
    uint64_t r = ck_rng_u64(stream, counter);
    double u1 = ((double)(r >> 40) + 1.0) * (1.0 / 16777217.0); /* (0, 1] */
    double u2 = (double)((r >> 8) & 0xffffffULL) * (1.0 / 16777216.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Dropout's counter for element e of a tensor whose rows (its first
 * dimension) hold per elements each: e itself, or on a data-parallel rank
 * (world > 1) the element of row rank + b * world of the global batch that
 * row b is, so each sample draws what it draws in one process (the CUDA
 * kernel holds a copy: ops/cuda/embedding.cu). */
static inline uint64_t ck_dropout_counter(int64_t e, int64_t per, int64_t world, int64_t rank)
{
    if (world <= 1 || per <= 0) return (uint64_t)e;
    const int64_t b = e / per;
    return (uint64_t)((b * world + rank) * per + e % per);
}

#endif
