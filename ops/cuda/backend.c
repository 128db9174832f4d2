/* The CUDA backend as the executor sees it (ops/backend.h): one context on
 * device 0, opened on first use and closed at exit; the arena is one
 * cudaMalloc; every op is queued on the context's stream.
 *
 * This file and the kernels make libck_cuda.so, which libck loads only when
 * a program asks for the GPU (vm/run/cuda_loader.c): CUDA's libraries cost a
 * CPU-only run nothing. The ck_cuda_module_* functions are what the loader
 * looks up. With NCCL (CK_HAVE_NCCL), its data-parallel hooks are comm.cu's. */
#include "../backend.h"
#include "cuda.h"

#include <stdio.h>
#include <stdlib.h>

static ck_cuda_ctx *ctx;

static void enter(void) { ck_cuda_bind(ctx); }
static void *alloc(size_t bytes) { return ck_cuda_alloc(bytes); }
static void release(void *p) { ck_cuda_free(p); }

#ifdef CK_HAVE_NCCL
/* every wait of the host on the device first waits out the ranks'
 * collectives under the timeout (comm.cu), so none hangs silently */
#define QUIET() (ck_cuda_comm_quiet() ? -1 : 0)
#else
#define QUIET() 0
#endif

static int sync(void) { return QUIET() ? -1 : ck_cuda_sync(); }
static int upload(void *dst, const void *src, size_t bytes) { return QUIET() ? -1 : ck_cuda_upload(dst, src, bytes); }
static int download(void *dst, const void *src, size_t bytes)
{
    return QUIET() ? -1 : ck_cuda_download(dst, src, bytes);
}
static int copy(void *dst, const void *src, size_t bytes) { return QUIET() ? -1 : ck_cuda_copy(dst, src, bytes); }
static int high_water(const void *base, size_t lo, size_t hi, uint32_t v, size_t *top)
{
    return QUIET() ? -1 : ck_cuda_high_water(base, lo, hi, v, top);
}
static int all_finite(const float *x, int64_t n, int *finite)
{
    return QUIET() ? -1 : ck_cuda_all_finite(x, n, finite);
}

/* the plan's workspace rules: convolutions get the algorithm chosen for their
 * shape on this device (ck_cuda_workspace), which plans may be made for on
 * any thread */
static size_t workspace(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out,
                        int nthreads)
{
    (void)nthreads;
    ck_cuda_bind(ctx);
    return ck_cuda_workspace(op, p, in, nin, out, CK_F32);
}
static size_t workspace_bf16(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out,
                             int nthreads)
{
    (void)nthreads;
    ck_cuda_bind(ctx);
    return ck_cuda_workspace(op, p, in, nin, out, CK_BF16);
}
static size_t workspace_f16(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out,
                            int nthreads)
{
    (void)nthreads;
    ck_cuda_bind(ctx);
    return ck_cuda_workspace(op, p, in, nin, out, CK_F16);
}


_Static_assert(CK_CUDA_FIXED_BYTES == (CK_CUDA_SCRATCH_BYTES + CK_CUDA_BLAS_WS_BYTES + CK_CUDA_STEP_BYTES +
                                       CK_CUDA_GRANULE - 1) / CK_CUDA_GRANULE * CK_CUDA_GRANULE,
               "fixed bytes: the one allocation of the scratch, the cuBLAS workspace and the step block, in pages");

static void close_at_exit(void)
{
#ifdef CK_HAVE_NCCL
    ck_cuda_comm_close();
#endif
    ck_cuda_close(ctx);
    ctx = NULL;
}

static ck_backend be = {
    .name = "cuda",
    .kernels = ck_cuda_kernels,
    .kernels_bf16 = ck_cuda_kernels_bf16,
    .kernels_f16 = ck_cuda_kernels_f16,
    .workspace = workspace,
    .workspace_bf16 = workspace_bf16,
    .workspace_f16 = workspace_f16,
    .nthreads = 1,
    .host = 0,
    .fixed_bytes = CK_CUDA_FIXED_BYTES,
    .granule = CK_CUDA_GRANULE,
    .enter = enter,
    .alloc = alloc,
    .release = release,
    .upload = upload,
    .download = download,
    .copy = copy,
    .convert = ck_cuda_convert,
    .fill_u32 = ck_cuda_fill_u32,
    .high_water = high_water,
    .all_finite = all_finite,
    .set_step = ck_cuda_set_step,
    .capture_begin = ck_cuda_capture_begin,
    .capture_end = ck_cuda_capture_end,
    .capture_later = ck_cuda_capture_later,
    .graph_launch = ck_cuda_graph_launch,
    .graph_free = ck_cuda_graph_free,
    .capturable = ck_cuda_capturable,
    .sync = sync,
    .error = ck_cuda_last_error,
    .clear_error = ck_cuda_clear_error,
    .pinned_alloc = ck_cuda_pinned_alloc,
    .pinned_release = ck_cuda_pinned_release,
    .xfer_open = ck_cuda_xfer_open,
    .xfer_start = ck_cuda_xfer_start,
    .xfer_wait = ck_cuda_xfer_wait,
    .xfer_join = ck_cuda_xfer_join,
#ifdef CK_HAVE_NCCL
    .comm_id = ck_cuda_comm_id,
    .comm_init = ck_cuda_comm_init,
    .allreduce_start = ck_cuda_allreduce_start,
    .allreduce_wait = ck_cuda_allreduce_wait,
    .broadcast = ck_cuda_broadcast,
#endif
};

#define EXPORT __attribute__((visibility("default")))

/* local_rank: this process's rank among those of its machine (vm/dist): it
 * takes device local_rank modulo the devices present, one GPU per rank */
EXPORT const ck_backend *ck_cuda_module_open(int local_rank, char *err, size_t errlen)
{
    if (ctx) return &be;
    const int n = ck_cuda_device_count();
    if (n == 0) {
        snprintf(err, errlen, "no CUDA device is present");
        return NULL;
    }
    ctx = ck_cuda_open((local_rank > 0 ? local_rank : 0) % n);
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
