/* Sinusoidal timestep embedding, dropout and the table lookup of token ids on
 * the GPU. The embedding rounds each step to float as ops/cpu/embedding.c does
 * (exp, sin and cos in double, then rounded, to match the host's correctly
 * rounded libm). Dropout draws the same counter-based numbers as ops/rng.h, so
 * the CPU and GPU masks agree bit for bit (test_cuda_ops compares them). The
 * lookup checks its ids as ops/cpu/embedding.c does and reads the check back. */
#include "common.cuh"

#define THREADS 256

/* ops/rng.h on the device: splitmix64's finalizer. Must stay identical. */
__device__ __forceinline__ uint64_t rng_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float rng_uniform(uint64_t stream, uint64_t counter)
{
    return (float)(rng_mix(stream ^ rng_mix(counter)) >> 40) * (1.0f / 16777216.0f);
}

/* ck_rng_key, on the device: the seed and step come from the step block */
__device__ __forceinline__ uint64_t rng_key(uint64_t seed, uint64_t step, uint64_t key)
{
    return rng_mix(rng_mix(rng_mix(seed) ^ step) ^ key);
}

// t (B); y (B, dim): [sin | cos] (or [cos | sin] when flipped), a zero column when dim is odd
__global__ void __launch_bounds__(THREADS) timestep_kernel(float *y, const float *t, int64_t B, int64_t dim, int flip,
                                                           float neg_log, float denom, float scale)
{
    const int64_t half = dim / 2, n = B * dim;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = i / dim, col = i % dim;
        if (col >= 2 * half) {
            y[i] = 0.0f;
            continue;
        }
        const int second = col >= half;
        const int64_t j = second ? col - half : col;
        const float e = neg_log * (float)j / denom;
        const float freq = (float)exp((double)e);
        const float arg = scale * (t[b] * freq);
        const int is_sin = second == flip;
        y[i] = is_sin ? (float)sin((double)arg) : (float)cos((double)arg);
    }
}

// t is (B); y is (B, dim); diffusers' get_timestep_embedding
extern "C" CK_CUDA_KERNEL(ck_cuda_timestep_embedding)
{
    (void)ctx, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("timestep_embedding");
    if (!c) return;
    const int64_t B = ck_view_numel(&in[0]), dim = p->i[0], half = dim / 2;
    if (B * dim == 0) return;
    const float neg_log = (float)(-log((double)p->f[1]));
    const float denom = (float)((double)half - (double)p->f[0]);
    ck_launch(timestep_kernel, ck_grid(B * dim, THREADS), THREADS, c->stream, out[0].data, (const float *)in[0].data, B,
              dim, (int)(p->i[1] != 0), neg_log, denom, p->f[2]);
    ck_cuda_end(c, "timestep_embedding");
}

/* ops/rng.h's ck_dropout_counter: a data-parallel rank's row b draws row rank + b * world's numbers */
__device__ __forceinline__ uint64_t dropout_counter(int64_t e, int64_t per, int64_t world, int64_t rank)
{
    if (world <= 1 || per <= 0) return (uint64_t)e;
    const int64_t b = e / per;
    return (uint64_t)((b * world + rank) * per + e % per);
}

__global__ void __launch_bounds__(THREADS) dropout_kernel(float *y, const float *x, const ck_cuda_step *st,
                                                          uint64_t op_key, float drop, float keep_scale, int64_t n,
                                                          int64_t per, int64_t world, int64_t rank)
{
    const int eval = st->eval;
    const uint64_t key = rng_key(st->seed, (uint64_t)st->step, op_key);
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        if (eval) {
            y[e] = x[e];
            continue;
        }
        const float m = rng_uniform(key, dropout_counter(e, per, world, rank)) >= drop ? keep_scale : 0.0f;
        y[e] = x[e] * m;
    }
}

/* x, y any shape, same numel: y = x * mask / (1 - p), element e kept when
 * u(key, e) >= p. Run on dy with the same context and params, it is the
 * backward. In an evaluation pass (ctx->eval), y = x. The key's seed and
 * step and the eval flag are read on the device (graph.cu's step block). A
 * data-parallel rank (i1 = world, i2 = rank) draws its rows' numbers as
 * ops/cpu/embedding.c. */
extern "C" CK_CUDA_KERNEL(ck_cuda_dropout)
{
    (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("dropout");
    if (!c) return;
    const int64_t n = ck_view_numel(&in[0]);
    if (n == 0) return;
    const float drop = p->f[0];
    if (drop <= 0.0f) {
        if (out[0].data != in[0].data)
            CK_CU("dropout", cudaMemcpyAsync(out[0].data, in[0].data, sizeof(float) * (size_t)n,
                                             cudaMemcpyDeviceToDevice, c->stream));
        ck_cuda_end(c, "dropout");
        return;
    }
    const float keep_scale = drop < 1.0f ? 1.0f / (1.0f - drop) : 0.0f;
    const ck_cuda_step *st = ck_cuda_step_of(c, ctx, "dropout");
    if (!st) return;
    const int64_t rows = in[0].ndim > 0 && in[0].shape[0] > 0 ? in[0].shape[0] : 1;
    ck_launch(dropout_kernel, ck_grid(n, THREADS), THREADS, c->stream, out[0].data, (const float *)in[0].data, st,
              (uint64_t)p->i[0], drop, keep_scale, n, n / rows, (int64_t)p->i[1], (int64_t)p->i[2]);
    ck_cuda_end(c, "dropout");
}

/* as ops/cpu/embedding.c's row_ok: a whole number in [0, V), NaN excluded */
__device__ __forceinline__ int row_ok(float id, int64_t V)
{
    return id >= 0.0f && id < (float)V && id == floorf(id) && (int64_t)id < V;
}

// ids (N); table (V, D); y (N, D): row n of y is row ids[n] of the table, NaN for a bad id
__global__ void __launch_bounds__(THREADS) embedding_kernel(float *y, const float *ids, const float *table, int64_t N,
                                                            int64_t V, int64_t D)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * D; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t n = i / D, d = i % D;
        const float id = ids[n];
        y[i] = row_ok(id, V) ? table[(int64_t)id * D + d] : NAN;
    }
}

/* One block: first[0] = the smallest index n whose id is bad, or -1 (a fixed
 * answer however the threads interleave). */
__global__ void __launch_bounds__(THREADS) embedding_check_kernel(long long *first, const float *ids, int64_t N, int64_t V)
{
    __shared__ long long sh[THREADS];
    long long m = -1;
    for (int64_t n = threadIdx.x; n < N && m < 0; n += blockDim.x)
        if (!row_ok(ids[n], V)) m = (long long)n;
    sh[threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long best = -1;
        for (int t = 0; t < (int)blockDim.x; t++)
            if (sh[t] >= 0 && (best < 0 || sh[t] < best)) best = sh[t];
        first[0] = best;
    }
}

/* ids is any shape (N ids); table is (V, D); y is (ids.., D). A bad id gives a
 * NaN row and a recorded failure naming the id and its index, read back from
 * the check kernel's answer in the context's scratch (a stream sync). */
extern "C" CK_CUDA_KERNEL(ck_cuda_embedding)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("embedding");
    if (!c) return;
    const int64_t N = ck_view_numel(&in[0]), V = in[1].shape[0], D = in[1].shape[1];
    if (N == 0) return;
    const float *ids = (const float *)in[0].data;
    if (D > 0)
        ck_launch(embedding_kernel, ck_grid(N * D, THREADS), THREADS, c->stream, out[0].data, ids,
                  (const float *)in[1].data, N, V, D);
    long long *first = (long long *)c->scratch;
    ck_launch(embedding_check_kernel, 1, THREADS, c->stream, first, ids, N, V);
    ck_cuda_end(c, "embedding");
    long long bad = -1;
    float id = 0.0f;
    if (ck_cuda_failed() || !CK_CU("embedding", cudaMemcpyAsync(&bad, first, sizeof bad, cudaMemcpyDeviceToHost, c->stream)) ||
        !CK_CU("embedding", cudaStreamSynchronize(c->stream)) || bad < 0)
        return;
    if (!CK_CU("embedding", cudaMemcpyAsync(&id, ids + bad, sizeof id, cudaMemcpyDeviceToHost, c->stream)) ||
        !CK_CU("embedding", cudaStreamSynchronize(c->stream)))
        return;
    ck_cuda_fail("embedding", "id %.9g at index %lld is not a row of the [%lld, %lld] table (whole numbers 0 to %lld)",
                 (double)id, bad, (long long)V, (long long)D, (long long)(V - 1));
}
