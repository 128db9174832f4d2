/* Rotary position embedding on the GPU (ROPE), in the formulas of
 * ops/cpu/rope.c: each head's adjacent pairs of x rotated by the angle the
 * fp32 table gives the row's position; i0 = 1 rotates back (the backward).
 * Memory-bound: a thread per pair, blocks along a row (blockIdx.y walks the
 * rows), positions from 32-bit remainders. x and y are fp32, bf16 or fp16
 * (the table fp32 always); the arithmetic is fp32. */
#include "common.cuh"

#define THREADS 256

// x (rows, F) of T, rows = (.., L) flattened; table (L, D) fp32; y like x. rows and F fit 31
// bits (the caller checks), so the positions come from 32-bit remainders.
template <typename T>
__global__ void __launch_bounds__(THREADS) rope_kernel(T *y, const T *x, const float *tab, unsigned rows, unsigned L,
                                                       unsigned F, unsigned D, float sg)
{
    const unsigned half = F / 2;
    for (unsigned r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *t = tab + (size_t)(r % L) * D;
        const T *xr = x + (size_t)r * F;
        T *yr = y + (size_t)r * F;
        for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < half; i += gridDim.x * blockDim.x) {
            const unsigned j = 2 * i % D;
            const float c = t[j], s = sg * t[j + 1];
            const float x0 = ck_ld(xr + 2 * i), x1 = ck_ld(xr + 2 * i + 1);
            ck_st(yr + 2 * i, c * x0 - s * x1);
            ck_st(yr + 2 * i + 1, s * x0 + c * x1);
        }
    }
}

template <typename T>
static void rope(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const ck_view *x = &in[0];
    const int64_t L = x->shape[x->ndim - 2], F = x->shape[x->ndim - 1], D = in[1].shape[1];
    const int64_t n = ck_view_numel(x);
    if (n == 0) return;
    const int64_t rows = n / F;
    if (rows > INT32_MAX || F > INT32_MAX) {
        ck_cuda_fail(name, "%lld rows of %lld: the kernel takes fewer than 2^31 of each", (long long)rows, (long long)F);
        return;
    }
    const int64_t bx = (F / 2 + THREADS - 1) / THREADS;
    const unsigned gx = (unsigned)(bx < 64 ? bx : 64), gy = (unsigned)(rows < 65535 ? rows : 65535);
    ck_launch(rope_kernel<T>, dim3(gx, gy), THREADS, c->stream, (T *)out[0].data, (const T *)x->data,
              (const float *)in[1].data, (unsigned)rows, (unsigned)L, (unsigned)F, (unsigned)D, p->i[0] ? -1.0f : 1.0f);
    ck_cuda_end(c, name);
}

CK_CUDA_ENTRIES(rope, rope<T>(name, p, out, in))
