/* The CUDA backend as the executor sees it (ops/backend.h): one context on
 * device 0, opened on first use and closed at exit; the arena is one
 * cudaMalloc; every op is queued on the context's stream.
 *
 * This file and the kernels make libck_cuda.so, which libck loads only when
 * a program asks for the GPU (vm/cuda_loader.c): CUDA's libraries cost a
 * CPU-only run nothing. The ck_cuda_module_* functions are what the loader
 * looks up. */
#include "../backend.h"
#include "cuda.h"

#include <stdio.h>
#include <stdlib.h>

static ck_cuda_ctx *ctx;

/* The workspace each CUDA kernel can use, sized for what it does with it
 * (the kernels in ops/cuda): convolutions the CPU's rule, which our im2col path fits by
 * construction when no cuDNN algorithm does (cuDNN's deterministic algorithms
 * take at most that); fused attention (head size up to 128) no workspace
 * forward and row statistics of every head backward; wider heads score
 * matrices of as many heads as fit in 64 MiB, at least one. */
static size_t workspace(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out,
                        int nthreads)
{
    (void)nthreads;
    if (op != CK_OP_ATTENTION && op != CK_OP_ATTENTION_BWD) return ck_op_workspace(op, p, in, nin, out, 1);
    const int bwd = op == CK_OP_ATTENTION_BWD;
    const ck_shape *q = &in[bwd], *k = &in[bwd + 1];
    const int64_t B = q->d[0], LQ = q->d[1], HD = q->d[2], LK = k->d[1], H = p->i[0] > 0 ? p->i[0] : 1;
    const int64_t D = HD / H;
    if (D <= 128) {
        if (!bwd) return 0;
        int64_t chunk = B * H < 65535 ? B * H : 65535;
        if (chunk < 1) chunk = 1;
        return (size_t)(2 * LQ * chunk) * sizeof(float);
    }
    const size_t per_head = (size_t)((bwd + 1) * LQ * LK) * sizeof(float);
    int64_t heads = per_head ? (int64_t)(((size_t)64 << 20) / per_head) : H;
    if (heads > H) heads = H;
    if (heads < 1) heads = 1;
    return per_head * (size_t)heads;
}

static void enter(void) { ck_cuda_bind(ctx); }
static void *alloc(size_t bytes) { return ck_cuda_alloc(bytes); }
static void release(void *p) { ck_cuda_free(p); }
static int sync(void) { return ck_cuda_sync(); }

static int all_finite(const float *x, int64_t n, int *finite) { return ck_cuda_all_finite(x, n, finite); }

static void close_at_exit(void)
{
    ck_cuda_close(ctx);
    ctx = NULL;
}

static ck_backend be = {"cuda", ck_cuda_kernels, ck_cuda_kernels_bf16, workspace, 1, 0,
                        CK_CUDA_SCRATCH_BYTES + CK_CUDA_BLAS_WS_BYTES, enter, alloc, release, ck_cuda_upload,
                        ck_cuda_download, ck_cuda_copy, ck_cuda_convert, ck_cuda_fill_u32, ck_cuda_high_water,
                        all_finite, sync, ck_cuda_last_error, ck_cuda_clear_error};

#define EXPORT __attribute__((visibility("default")))

EXPORT const ck_backend *ck_cuda_module_open(char *err, size_t errlen)
{
    if (ctx) return &be;
    if (ck_cuda_device_count() == 0) {
        snprintf(err, errlen, "no CUDA device is present");
        return NULL;
    }
    ctx = ck_cuda_open(0);
    if (!ctx) {
        snprintf(err, errlen, "cannot open the CUDA device: %s", ck_cuda_last_error());
        ck_cuda_clear_error();
        return NULL;
    }
    atexit(close_at_exit);
    return &be;
}

EXPORT int ck_cuda_module_configure(int deterministic, int tf32)
{
    if (!ctx) return -1;
    if (deterministic >= 0) ck_cuda_set_deterministic(ctx, deterministic);
    if (tf32 >= 0) ck_cuda_set_tf32(ctx, tf32);
    return 0;
}

EXPORT int ck_cuda_module_devices(void) { return ck_cuda_device_count(); }

EXPORT int ck_cuda_module_memory(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    if (!ctx) return -1;
    ck_cuda_bind(ctx);
    return ck_cuda_mem_info(free_bytes, total_bytes);
}
