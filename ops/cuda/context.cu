/* The CUDA context: one device, one stream, the cuBLAS and cuDNN handles made
 * once at open, the thread's current binding, and errors that name the op.
 * Every runtime, cuBLAS and cuDNN call in the backend is checked through here. */
#include "common.cuh"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static thread_local ck_cuda_ctx *current;
static thread_local char last_err[512];
static thread_local int failed;

static const char *blas_status(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

static void set_error(const char *op, const char *fmt, va_list ap)
{
    if (failed) return;
    int k = snprintf(last_err, sizeof last_err, "%s: ", op ? op : "cuda");
    if (k < 0) k = 0;
    if ((size_t)k < sizeof last_err) vsnprintf(last_err + k, sizeof last_err - (size_t)k, fmt, ap);
    failed = 1;
}

int ck_cuda_fail(const char *op, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_error(op, fmt, ap);
    va_end(ap);
    return 0;
}

int ck_cuda_ok(cudaError_t e, const char *op, const char *what)
{
    if (e == cudaSuccess) return 1;
    return ck_cuda_fail(op, "%s: %s", what, cudaGetErrorString(e));
}

int ck_cuda_blas_ok(cublasStatus_t s, const char *op, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return 1;
    return ck_cuda_fail(op, "%s: %s", what, blas_status(s));
}

int ck_cuda_dnn_ok(cudnnStatus_t s, const char *op, const char *what)
{
    if (s == CUDNN_STATUS_SUCCESS) return 1;
    return ck_cuda_fail(op, "%s: %s", what, cudnnGetErrorString(s));
}

extern "C" const char *ck_cuda_last_error(void) { return failed ? last_err : ""; }
extern "C" int ck_cuda_failed(void) { return failed; }
extern "C" void ck_cuda_clear_error(void)
{
    failed = 0;
    last_err[0] = 0;
}

extern "C" int ck_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* "no driver" is an answer here, not a pending error */
        return 0;
    }
    return n;
}

ck_cuda_ctx *ck_cuda_begin(const char *op)
{
    if (failed) return NULL;
    if (!current) {
        ck_cuda_fail(op, "no CUDA context bound to this thread (ck_cuda_bind)");
        return NULL;
    }
    current->last_op = op;
    return current;
}

void ck_cuda_end(ck_cuda_ctx *c, const char *op)
{
    if (!CK_CU(op, cudaGetLastError())) return;
    if (c->sync_each) CK_CU(op, cudaStreamSynchronize(c->stream));
}

static void apply_math(ck_cuda_ctx *c)
{
    CK_BLAS("cuda_open", cublasSetMathMode(c->blas, c->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

/* Teardown failures are recorded too (a fault that surfaces only here still
 * deserves a name), but never stop the rest of the teardown. */
extern "C" void ck_cuda_close(ck_cuda_ctx *c)
{
    if (!c) return;
    const char *op = "cuda_close";
    if (current == c) current = NULL;
    CK_CU(op, cudaSetDevice(c->device));
    if (c->stream) CK_CU(op, cudaStreamSynchronize(c->stream));
    ck_cuda_xfer_close(c);
    if (c->conv) CK_DNN(op, cudnnDestroyConvolutionDescriptor(c->conv));
    if (c->fw) CK_DNN(op, cudnnDestroyFilterDescriptor(c->fw));
    if (c->ty) CK_DNN(op, cudnnDestroyTensorDescriptor(c->ty));
    if (c->tx) CK_DNN(op, cudnnDestroyTensorDescriptor(c->tx));
    if (c->dnn) CK_DNN(op, cudnnDestroy(c->dnn));
    if (c->lt) CK_BLAS(op, cublasLtDestroy(c->lt));
    if (c->blas) CK_BLAS(op, cublasDestroy(c->blas));
    if (c->scratch) CK_CU(op, cudaFree(c->scratch)); /* the one allocation blas_ws and step_dev are part of */
    if (c->stream) CK_CU(op, cudaStreamDestroy(c->stream));
    free(c);
}

extern "C" ck_cuda_ctx *ck_cuda_open(int device)
{
    const char *op = "cuda_open";
    const int n = ck_cuda_device_count();
    if (device < 0 || device >= n) {
        ck_cuda_fail(op, n ? "device %d does not exist (%d present)" : "device %d: no CUDA device present", device, n);
        return NULL;
    }
    ck_cuda_ctx *c = (ck_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) {
        ck_cuda_fail(op, "out of host memory");
        return NULL;
    }
    c->device = device;
    c->deterministic = 1;
    c->conv_ws_cap = CK_CUDA_CONV_WS_CAP;
    const char *s = getenv("CK_CUDA_SYNC");
    c->sync_each = s && s[0] == '1';
    const char *gr = getenv("CK_CUDA_GRAPH");
    c->graphs = !(gr && gr[0] == '0');
    int ok = CK_CU(op, cudaSetDevice(device)) && CK_CU(op, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) &&
             /* the scratch, cuBLAS's workspace and the step block in one allocation: CK_CUDA_FIXED_BYTES */
             CK_CU(op, cudaMalloc(&c->scratch, CK_CUDA_SCRATCH_BYTES + CK_CUDA_BLAS_WS_BYTES + CK_CUDA_STEP_BYTES)) &&
             (c->blas_ws = (char *)c->scratch + CK_CUDA_SCRATCH_BYTES) &&
             (c->step_dev = (ck_cuda_step *)((char *)c->blas_ws + CK_CUDA_BLAS_WS_BYTES)) &&
             CK_BLAS(op, cublasCreate(&c->blas)) && CK_BLAS(op, cublasLtCreate(&c->lt)) &&
             /* the stream first: setting it resets cuBLAS to its default pool */
             CK_BLAS(op, cublasSetStream(c->blas, c->stream)) &&
             CK_BLAS(op, cublasSetWorkspace(c->blas, c->blas_ws, CK_CUDA_BLAS_WS_BYTES)) &&
             CK_BLAS(op, cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST)) && CK_DNN(op, cudnnCreate(&c->dnn)) &&
             CK_DNN(op, cudnnSetStream(c->dnn, c->stream)) && CK_DNN(op, cudnnCreateTensorDescriptor(&c->tx)) &&
             CK_DNN(op, cudnnCreateTensorDescriptor(&c->ty)) && CK_DNN(op, cudnnCreateFilterDescriptor(&c->fw)) &&
             CK_DNN(op, cudnnCreateConvolutionDescriptor(&c->conv));
    if (ok) apply_math(c);
    if (!ok || failed) {
        ck_cuda_close(c);
        return NULL;
    }
    current = c;
    return c;
}

extern "C" void ck_cuda_bind(ck_cuda_ctx *c)
{
    current = c;
    if (c) CK_CU("cuda_bind", cudaSetDevice(c->device));
}

extern "C" ck_cuda_ctx *ck_cuda_current(void) { return current; }

extern "C" void ck_cuda_set_deterministic(ck_cuda_ctx *c, int on) { c->deterministic = on != 0; }

extern "C" void ck_cuda_set_tf32(ck_cuda_ctx *c, int on)
{
    c->tf32 = on != 0;
    apply_math(c);
}

extern "C" void ck_cuda_set_sync_each_op(ck_cuda_ctx *c, int on) { c->sync_each = on != 0; }

extern "C" void ck_cuda_set_conv_im2col(ck_cuda_ctx *c, int on) { c->conv_im2col = on != 0; }

static ck_cuda_ctx *need(const char *op)
{
    if (!current) ck_cuda_fail(op, "no CUDA context bound to this thread (ck_cuda_bind)");
    return current;
}

extern "C" void *ck_cuda_alloc(size_t bytes)
{
    void *p = NULL;
    if (!need("cuda_alloc")) return NULL;
    if (!CK_CU("cuda_alloc", cudaMalloc(&p, bytes ? bytes : 1))) return NULL;
    return p;
}

extern "C" void ck_cuda_free(void *p)
{
    if (p) CK_CU("cuda_free", cudaFree(p));
}

extern "C" int ck_cuda_upload(void *dst, const void *src, size_t bytes)
{
    ck_cuda_ctx *c = need("cuda_upload");
    if (!c) return -1;
    if (!bytes) return 0;
    return CK_CU("cuda_upload", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream)) &&
                   CK_CU("cuda_upload", cudaStreamSynchronize(c->stream))
               ? 0
               : -1;
}

extern "C" int ck_cuda_download(void *dst, const void *src, size_t bytes)
{
    ck_cuda_ctx *c = need("cuda_download");
    if (!c) return -1;
    if (!bytes) return 0;
    return CK_CU("cuda_download", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)) &&
                   CK_CU("cuda_download", cudaStreamSynchronize(c->stream))
               ? 0
               : -1;
}

extern "C" int ck_cuda_copy(void *dst, const void *src, size_t bytes)
{
    ck_cuda_ctx *c = need("cuda_copy");
    if (!c) return -1;
    if (!bytes) return 0;
    return CK_CU("cuda_copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream)) &&
                   CK_CU("cuda_copy", cudaStreamSynchronize(c->stream))
               ? 0
               : -1;
}

extern "C" int ck_cuda_memset(void *dst, int byte, size_t bytes)
{
    ck_cuda_ctx *c = need("cuda_memset");
    if (!c) return -1;
    if (!bytes) return 0;
    return CK_CU("cuda_memset", cudaMemsetAsync(dst, byte, bytes, c->stream)) ? 0 : -1;
}

extern "C" int ck_cuda_sync(void)
{
    ck_cuda_ctx *c = need("cuda_sync");
    if (!c) return -1;
    if (failed) return -1;
    const cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess) return 0;
    /* an asynchronous fault: the op queued last is the best name we have
     * (CK_CUDA_SYNC=1 pins it to the op exactly) */
    ck_cuda_fail(c->last_op ? c->last_op : "cuda_sync", "%s (reported at the next sync; CK_CUDA_SYNC=1 names the op exactly)",
                 cudaGetErrorString(e));
    return -1;
}

extern "C" int ck_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    if (!need("cuda_mem_info")) return -1;
    return CK_CU("cuda_mem_info", cudaMemGetInfo(free_bytes, total_bytes)) ? 0 : -1;
}
