/* What the executor needs of the arena besides the ops, when the arena is
 * device memory: the sentinel fill and high-water scan behind measured peaks,
 * the finiteness check behind the non-finite step guard, and the conversions
 * between bf16 storage and the fp32 copies kernels without a bf16 form read (the CPU does both
 * with plain loops over host memory, vm/run/exec.c and vm/run/program.c). */
#include "common.cuh"
#include "../fp8.h"
#include "../fp16.h"

#define THREADS 256
#define MAX_BLOCKS 1024

__global__ void __launch_bounds__(THREADS) fill_u32_kernel(uint32_t *w, uint32_t v, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        w[i] = v;
}

extern "C" int ck_cuda_fill_u32(void *dst, uint32_t v, size_t nwords)
{
    ck_cuda_ctx *c = ck_cuda_begin("fill_u32");
    if (!c) return -1;
    if (nwords) ck_launch(fill_u32_kernel, ck_grid((int64_t)nwords, THREADS), THREADS, c->stream, (uint32_t *)dst, v,
                          (int64_t)nwords);
    ck_cuda_end(c, "fill_u32");
    return ck_cuda_failed() ? -1 : 0;
}

/* Block b of nb: the highest index in its segment of [lo, hi) whose word is
 * not v, plus one (0 when none), into part[b]. */
__global__ void __launch_bounds__(THREADS) top_kernel(int64_t *part, const uint32_t *w, uint32_t v, int64_t lo,
                                                      int64_t hi, int nb)
{
    __shared__ int64_t sh[THREADS];
    const int64_t n = hi - lo, b = blockIdx.x, s0 = lo + n * b / nb, s1 = lo + n * (b + 1) / nb;
    int64_t top = 0;
    for (int64_t i = s0 + threadIdx.x; i < s1; i += blockDim.x)
        if (w[i] != v) top = i + 1;
    sh[threadIdx.x] = top;
    __syncthreads();
    for (int o = THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o && sh[threadIdx.x + o] > sh[threadIdx.x]) sh[threadIdx.x] = sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[b] = sh[0];
}

extern "C" int ck_cuda_high_water(const void *base, size_t lo, size_t hi, uint32_t v, size_t *top)
{
    ck_cuda_ctx *c = ck_cuda_begin("high_water");
    if (!c) return -1;
    *top = lo;
    if (hi <= lo) return 0;
    int64_t nb = (int64_t)((hi - lo + 65535) / 65536);
    if (nb > MAX_BLOCKS) nb = MAX_BLOCKS;
    int64_t *part = (int64_t *)c->scratch, host[MAX_BLOCKS];
    ck_launch(top_kernel, (unsigned)nb, THREADS, c->stream, part, (const uint32_t *)base, v, (int64_t)lo, (int64_t)hi,
              (int)nb);
    ck_cuda_end(c, "high_water");
    if (ck_cuda_failed() || ck_cuda_download(host, part, sizeof(int64_t) * (size_t)nb)) return -1;
    for (int64_t b = 0; b < nb; b++)
        if (host[b] > (int64_t)*top) *top = (size_t)host[b];
    return 0;
}

extern "C" int ck_cuda_all_finite(const float *x, int64_t n, int *finite)
{
    ck_cuda_ctx *c = ck_cuda_begin("all_finite");
    if (!c) return -1;
    *finite = 1;
    if (n <= 0) return 0;
    /* the sum of x * 0: 0 for finite x, NaN as soon as one is not; the result
     * goes to the scratch past the partials */
    float *res = (float *)((char *)c->scratch + CK_CUDA_SCRATCH_BYTES / 2), h;
    ck_cuda_reduce(c, RED_FINITE, res, x, NULL, n);
    ck_cuda_end(c, "all_finite");
    if (ck_cuda_failed() || ck_cuda_download(&h, res, sizeof h)) return -1;
    *finite = h == 0.0f;
    return 0;
}

__global__ void __launch_bounds__(THREADS) to_bf16_kernel(__nv_bfloat16 *d, const float *s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = __float2bfloat16(s[i]);
}

__global__ void __launch_bounds__(THREADS) to_f32_kernel(float *d, const __nv_bfloat16 *s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = __bfloat162float(s[i]);
}

/* fp16 by bit arithmetic (ops/fp16.h): the bits the CPU backend stores */
__global__ void __launch_bounds__(THREADS) to_f16_kernel(uint16_t *d, const float *s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = ck_f16_from_f32(s[i]);
}

__global__ void __launch_bounds__(THREADS) f16_to_f32_kernel(float *d, const uint16_t *s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = ck_f32_from_f16(s[i]);
}

__global__ void __launch_bounds__(THREADS) f8_to_f32_kernel(float *d, const uint8_t *s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = ck_f8e4m3_decode(s[i]);
}

// d (bf16) = the fp8 codes s decoded: exact, every fp8 value is a bf16 value
__global__ void __launch_bounds__(THREADS) f8_to_bf16_kernel(__nv_bfloat16 *d, const uint8_t *s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = __float2bfloat16(ck_f8e4m3_decode(s[i]));
}

// d (fp16) = the fp8 codes s decoded: exact, every fp8 value is an fp16 value
__global__ void __launch_bounds__(THREADS) f8_to_f16_kernel(uint16_t *d, const uint8_t *s, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        d[i] = ck_f16_from_f32(ck_f8e4m3_decode(s[i]));
}

extern "C" int ck_cuda_convert(void *dst, ck_dtype to, const void *src, ck_dtype from, int64_t n)
{
    ck_cuda_ctx *c = ck_cuda_begin("convert");
    if (!c) return -1;
    if (n <= 0) return 0;
    if (to == from) {
        CK_CU("convert", cudaMemcpyAsync(dst, src, (size_t)n * ck_dtype_bytes(to), cudaMemcpyDeviceToDevice, c->stream));
    } else if (to == CK_BF16 && from == CK_F32) {
        ck_launch(to_bf16_kernel, ck_grid(n, THREADS), THREADS, c->stream, (__nv_bfloat16 *)dst, (const float *)src, n);
    } else if (to == CK_F32 && from == CK_BF16) {
        ck_launch(to_f32_kernel, ck_grid(n, THREADS), THREADS, c->stream, (float *)dst, (const __nv_bfloat16 *)src, n);
    } else if (to == CK_F16 && from == CK_F32) {
        ck_launch(to_f16_kernel, ck_grid(n, THREADS), THREADS, c->stream, (uint16_t *)dst, (const float *)src, n);
    } else if (to == CK_F32 && from == CK_F16) {
        ck_launch(f16_to_f32_kernel, ck_grid(n, THREADS), THREADS, c->stream, (float *)dst, (const uint16_t *)src, n);
    } else if (to == CK_F32 && from == CK_F8E4M3) {
        ck_launch(f8_to_f32_kernel, ck_grid(n, THREADS), THREADS, c->stream, (float *)dst, (const uint8_t *)src, n);
    } else if (to == CK_BF16 && from == CK_F8E4M3) {
        ck_launch(f8_to_bf16_kernel, ck_grid(n, THREADS), THREADS, c->stream, (__nv_bfloat16 *)dst, (const uint8_t *)src, n);
    } else if (to == CK_F16 && from == CK_F8E4M3) {
        ck_launch(f8_to_f16_kernel, ck_grid(n, THREADS), THREADS, c->stream, (uint16_t *)dst, (const uint8_t *)src, n);
    } else {
        ck_cuda_fail("convert", "no conversion between these storage types");
    }
    ck_cuda_end(c, "convert");
    return ck_cuda_failed() ? -1 : 0;
}
