/* Reductions that logging steps place in the op list (STATS, SUMSQ), and the
 * scalar reductions MEAN and MSE_LOSS use. Each block sums one contiguous
 * segment in double (threads strided, then a fixed-order tree); one thread adds
 * the block partials in order. The block count depends on n alone, so results
 * are the same from run to run. Partials live in the context's scratch. */
#include "common.cuh"

#define THREADS 256
#define MAX_BLOCKS 1024
#define MIN_PER_BLOCK 4096

template <int MODE>
__global__ void __launch_bounds__(THREADS) reduce_partial(double *part, const float *x, const float *y, int64_t n,
                                                          int nblocks)
{
    __shared__ double sh[33];
    __shared__ float shm[33];
    const int64_t b = blockIdx.x, lo = n * b / nblocks, hi = n * (b + 1) / nblocks;
    double s = 0, q = 0;
    float m = 0.0f;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = x[i];
        if (MODE == RED_MEAN) {
            s += (double)v;
        } else if (MODE == RED_MSE) {
            const double d = (double)(v - y[i]); /* the difference rounded to float first, as torch */
            s += d * d;
        } else if (MODE == RED_SUMSQ) {
            s += (double)v * (double)v;
        } else if (MODE == RED_FINITE) {
            s += (double)(v * 0.0f);
        } else {
            s += (double)v;
            q += (double)v * (double)v;
            m = fmaxf(m, fabsf(v));
        }
    }
    s = ck_block_sum(s, sh);
    if (MODE == RED_STATS) {
        q = ck_block_sum(q, sh);
        m = ck_block_max(m, shm);
    }
    if (threadIdx.x == 0) {
        part[3 * b] = s;
        part[3 * b + 1] = q;
        part[3 * b + 2] = (double)m;
    }
}

__global__ void reduce_final(float *out, const double *part, int nblocks, int64_t n, int mode)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0, q = 0, m = 0;
    for (int b = 0; b < nblocks; b++) {
        s += part[3 * b];
        q += part[3 * b + 1];
        m = part[3 * b + 2] > m ? part[3 * b + 2] : m;
    }
    if (mode == RED_MEAN || mode == RED_MSE) {
        out[0] = (float)(s / (double)n);
    } else if (mode == RED_SUMSQ || mode == RED_FINITE) {
        out[0] = (float)s;
    } else {
        const double mean = s / (double)n, var = q / (double)n - mean * mean;
        out[0] = (float)mean;
        out[1] = (float)sqrt(var > 0 ? var : 0);
        /* comparisons skip NaN; the sum does not */
        out[2] = isnan(s) ? NAN : (float)m;
    }
}

void ck_cuda_reduce(ck_cuda_ctx *c, ck_red mode, float *out, const float *x, const float *y, int64_t n)
{
    int64_t nb = (n + MIN_PER_BLOCK - 1) / MIN_PER_BLOCK;
    if (nb > MAX_BLOCKS) nb = MAX_BLOCKS;
    if (nb < 1) nb = 1;
    double *part = (double *)c->scratch;
    switch (mode) {
    case RED_MEAN: ck_launch(reduce_partial<RED_MEAN>, (unsigned)nb, THREADS, c->stream, part, x, y, n, (int)nb); break;
    case RED_MSE: ck_launch(reduce_partial<RED_MSE>, (unsigned)nb, THREADS, c->stream, part, x, y, n, (int)nb); break;
    case RED_SUMSQ: ck_launch(reduce_partial<RED_SUMSQ>, (unsigned)nb, THREADS, c->stream, part, x, y, n, (int)nb); break;
    case RED_STATS: ck_launch(reduce_partial<RED_STATS>, (unsigned)nb, THREADS, c->stream, part, x, y, n, (int)nb); break;
    case RED_FINITE: ck_launch(reduce_partial<RED_FINITE>, (unsigned)nb, THREADS, c->stream, part, x, y, n, (int)nb); break;
    }
    ck_launch(reduce_final, 1, 32, c->stream, out, (const double *)part, (int)nb, n, (int)mode);
}

// x any shape (numel > 0); out [3] = mean, std (population), max |x|
extern "C" CK_CUDA_KERNEL(ck_cuda_stats)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("stats");
    if (!c) return;
    ck_cuda_reduce(c, RED_STATS, out[0].data, in[0].data, NULL, ck_view_numel(&in[0]));
    ck_cuda_end(c, "stats");
}

// x any shape; out scalar = sum of x^2, accumulated in double
extern "C" CK_CUDA_KERNEL(ck_cuda_sumsq)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("sumsq");
    if (!c) return;
    ck_cuda_reduce(c, RED_SUMSQ, out[0].data, in[0].data, NULL, ck_view_numel(&in[0]));
    ck_cuda_end(c, "sumsq");
}
