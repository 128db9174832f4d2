/* Scalar losses and their backward on the GPU: MEAN and MSE_LOSS. Sums are
 * taken in double over a number of blocks fixed by the size alone, each block
 * summing its own contiguous segment, and the block partials are added in
 * order by one thread: the result does not change from run to run. The
 * partials live in the context's reduction scratch. */
#include "common.cuh"

#define THREADS 256

// x any shape; y scalar (ndim 0)
extern "C" CK_CUDA_KERNEL(ck_cuda_mean)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("mean");
    if (!c) return;
    ck_cuda_reduce(c, RED_MEAN, out[0].data, in[0].data, NULL, ck_view_numel(&in[0]));
    ck_cuda_end(c, "mean");
}

__global__ void __launch_bounds__(THREADS) mean_bwd_kernel(float *dx, const float *dy, int64_t n)
{
    const float g = dy[0] / (float)n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = g;
}

// dy scalar; dx any shape, filled with dy / numel(dx)
extern "C" CK_CUDA_KERNEL(ck_cuda_mean_bwd)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("mean_bwd");
    if (!c) return;
    const int64_t n = ck_view_numel(&out[0]);
    if (n == 0) return;
    ck_launch(mean_bwd_kernel, ck_grid(n, THREADS), THREADS, c->stream, out[0].data, (const float *)in[0].data, n);
    ck_cuda_end(c, "mean_bwd");
}

// a, b same shape; y scalar = mean((a - b)^2)
extern "C" CK_CUDA_KERNEL(ck_cuda_mse_loss)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("mse_loss");
    if (!c) return;
    ck_cuda_reduce(c, RED_MSE, out[0].data, in[0].data, in[1].data, ck_view_numel(&in[0]));
    ck_cuda_end(c, "mse_loss");
}

/* da = (a - b) * (2/n) * dy in torch's order; db = -da; either may be NULL. */
__global__ void __launch_bounds__(THREADS) mse_bwd_kernel(float *da, float *db, const float *dy, const float *a,
                                                          const float *b, float norm, int64_t n)
{
    const float d = dy[0];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float g = (a[i] - b[i]) * norm * d;
        if (da) da[i] = g;
        if (db) db[i] = -g;
    }
}

// dy scalar; a, b same shape; da, db like a (either may be unwanted)
extern "C" CK_CUDA_KERNEL(ck_cuda_mse_loss_bwd)
{
    (void)ctx, (void)p, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("mse_loss_bwd");
    if (!c) return;
    float *da = out[0].data, *db = nout > 1 ? out[1].data : NULL;
    const int64_t n = ck_view_numel(&in[1]);
    if (n == 0 || (!da && !db)) return;
    ck_launch(mse_bwd_kernel, ck_grid(n, THREADS), THREADS, c->stream, da, db, (const float *)in[0].data,
              (const float *)in[1].data, (const float *)in[2].data, (float)(2.0 / (double)n), n);
    ck_cuda_end(c, "mse_loss_bwd");
}
