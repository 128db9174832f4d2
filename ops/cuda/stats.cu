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

/* The tensors of one SUMSQ node: block b of first[k] <= b < first[k + 1]
 * sums its segment of x[k]. */
typedef struct sumsq_set {
    const float *x[CK_MAX_IN];
    int64_t n[CK_MAX_IN];
    int first[CK_MAX_IN + 1];
    int k;
} sumsq_set;
static_assert(sizeof(double) * CK_MAX_IN * MAX_BLOCKS <= CK_CUDA_SCRATCH_BYTES, "sumsq partials fit the scratch");

__global__ void __launch_bounds__(THREADS) sumsq_partial(double *part, sumsq_set a)
{
    __shared__ double sh[33];
    int k = 0;
    while (k + 1 < a.k && (int)blockIdx.x >= a.first[k + 1]) k++;
    const int64_t b = blockIdx.x - a.first[k], nb = a.first[k + 1] - a.first[k], n = a.n[k];
    const int64_t lo = n * b / nb, hi = n * (b + 1) / nb;
    const float *x = a.x[k];
    double s = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += (double)x[i] * (double)x[i];
    s = ck_block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void sumsq_final(float *out, const double *part, int nblocks, const float *total)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = total ? (double)total[0] : 0.0;
    for (int b = 0; b < nblocks; b++) s += part[b];
    out[0] = (float)s;
}

// x1..xk any shapes (x1 a running total with i0 = 1); out scalar = the sum of
// their squares: one launch of block partials over all the tensors (each
// tensor's block count from its size alone, as ck_cuda_reduce), one to add
// them in order, in double
extern "C" CK_CUDA_KERNEL(ck_cuda_sumsq)
{
    (void)ctx, (void)nout;
    ck_cuda_ctx *c = ck_cuda_begin("sumsq");
    if (!c) return;
    sumsq_set a = {};
    const int k0 = p->i[0] ? 1 : 0;
    for (int k = k0; k < nin; k++) {
        const int64_t n = ck_view_numel(&in[k]);
        int64_t nb = (n + MIN_PER_BLOCK - 1) / MIN_PER_BLOCK;
        if (nb > MAX_BLOCKS) nb = MAX_BLOCKS;
        if (nb < 1) nb = 1;
        a.x[a.k] = in[k].data;
        a.n[a.k] = n;
        a.first[a.k + 1] = a.first[a.k] + (int)nb;
        a.k++;
    }
    double *part = (double *)c->scratch;
    ck_launch(sumsq_partial, (unsigned)a.first[a.k], THREADS, c->stream, part, a);
    ck_launch(sumsq_final, 1, 32, c->stream, out[0].data, (const double *)part, a.first[a.k],
              k0 ? (const float *)in[0].data : (const float *)NULL);
    ck_cuda_end(c, "sumsq");
}
