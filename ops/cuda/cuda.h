/* The CUDA backend: the ops of ops/ops.h on one NVIDIA GPU, through cuBLAS,
 * cuDNN and our own kernels. Kernels have the CPU's signature (ck_kernel_fn):
 * every ck_view data pointer is a device pointer and ctx->ws device workspace
 * placed by the plan. They never allocate; their stream, library handles and
 * options come from the calling thread's bound context (ck_cuda_bind).
 *
 *   ck_cuda_ctx *c = ck_cuda_open(0);            // NULL: ck_cuda_last_error()
 *   ck_cuda_bind(c);
 *   float *arena = ck_cuda_alloc(bytes);
 *   ck_cuda_kernels[CK_OP_SILU](&kctx, &params, out, 1, in, 1);
 *   if (ck_cuda_failed() || ck_cuda_sync()) puts(ck_cuda_last_error());
 */
#ifndef CK_CUDA_H
#define CK_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

/* inside the C linkage: the rules of ops/rules.c are C functions */
#include "../ops.h"

typedef struct ck_cuda_ctx ck_cuda_ctx;

/* Devices present; 0 when there are none or no driver (not an error). */
int ck_cuda_device_count(void);

/* Opens `device`: a stream, cuBLAS and cuDNN handles, their descriptors, and
 * the fixed buffers below. Binds it to the calling thread. NULL on failure,
 * with the reason in ck_cuda_last_error(). */
ck_cuda_ctx *ck_cuda_open(int device);
void ck_cuda_close(ck_cuda_ctx *c);
/* The calling thread's current context (and its device); NULL unbinds. */
void ck_cuda_bind(ck_cuda_ctx *c);
ck_cuda_ctx *ck_cuda_current(void);

/* Device memory the context allocates at open, outside any plan (a fixed
 * cost, like the handles' own): the reduction scratch that scalar reductions
 * (mean, mse_loss, stats, sumsq, reduce_to, bias gradients) use for their
 * per-block partials, and cuBLAS's workspace (set with cublasSetWorkspace, so
 * cuBLAS never grows a pool of its own; the plan gives products none, and
 * cuBLAS may fail with no workspace at all). */
#define CK_CUDA_SCRATCH_BYTES ((size_t)1 << 18)
#define CK_CUDA_BLAS_WS_BYTES ((size_t)4 << 20)
/* and the block of per-step values kernels read (graph.cu), in the same allocation */
#define CK_CUDA_STEP_BYTES ((size_t)256)

/* Deterministic algorithms (default 1): the fastest of cuDNN's deterministic
 * convolution algorithms (ck_cuda_workspace); 0 the fastest of all. Our own
 * kernels, and cuBLAS/cuBLASLt with a fixed workspace, are deterministic
 * either way. */
void ck_cuda_set_deterministic(ck_cuda_ctx *c, int on);
/* TF32 tensor cores for fp32 products and convolutions (default 0: exact fp32). */
void ck_cuda_set_tf32(ck_cuda_ctx *c, int on);
/* Convolutions through our own im2col + cuBLAS path, which they take anyway
 * when no cuDNN algorithm fits the planned workspace (default 0; for tests). */
void ck_cuda_set_conv_im2col(ck_cuda_ctx *c, int on);
/* The most workspace a convolution's cuDNN algorithm may take (default
 * CK_CUDA_CONV_WS_CAP): the per-shape choice below stays within it. */
#define CK_CUDA_CONV_WS_CAP ((size_t)256 << 20)
void ck_cuda_set_conv_workspace_cap(ck_cuda_ctx *c, size_t bytes);
/* Tests: forget every convolution's algorithm list, so that the next use
 * of a shape searches again (as where no plan searched it first). */
void ck_cuda_conv_forget(void);
/* The workspace a convolution op (CONV2D, CONV2D_BWD_DATA, CONV2D_BWD_FILTER)
 * takes on the current context, in storage st (CK_F32, CK_BF16, CK_F16; the
 * search is keyed by it): the workspace of the
 * algorithm chosen for its shape, the fastest (by cudnnFind*AlgorithmEx, or
 * cuDNN's heuristic where the search cannot allocate its buffers) that fits
 * the cap and is deterministic unless determinism is off; searched once per
 * shape and kept, so the kernel later runs the algorithm the plan paid for.
 * Where none fits, the im2col path's workspace (fp32; ck_op_workspace_cuda).
 * Other ops: the rules of ops/rules.c. */
size_t ck_cuda_workspace(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out,
                         ck_dtype st);
/* Synchronize after every op so an asynchronous fault names its op
 * (default 0; the environment variable CK_CUDA_SYNC=1 turns it on at open). */
void ck_cuda_set_sync_each_op(ck_cuda_ctx *c, int on);

/* The first failure on this thread since the last clear, naming the op, e.g.
 * "conv2d: cudnnConvolutionForward: CUDNN_STATUS_BAD_PARAM". Kernels called
 * while a failure is pending do nothing, so the first cause is kept. */
const char *ck_cuda_last_error(void);
int ck_cuda_failed(void);
void ck_cuda_clear_error(void);

/* Memory and copies on the current context's device and stream. Copies
 * return when done. 0, or -1 with ck_cuda_last_error(). */
void *ck_cuda_alloc(size_t bytes);
void ck_cuda_free(void *p);
int ck_cuda_upload(void *dst_dev, const void *src_host, size_t bytes);
int ck_cuda_download(void *dst_host, const void *src_dev, size_t bytes);
int ck_cuda_copy(void *dst_dev, const void *src_dev, size_t bytes);
int ck_cuda_memset(void *dst_dev, int byte, size_t bytes);
/* Waits for every op queued so far; an asynchronous fault names the last op queued. */
int ck_cuda_sync(void);
/* cudaMemGetInfo of the current device. */
int ck_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* arena.cu: for the executor's measured peaks and step guard on a device arena.
 * Fill nwords 32-bit words with v; the highest word index in [lo, hi) whose
 * value is not v, plus one (lo when none); whether n floats are all finite. */
int ck_cuda_fill_u32(void *dst, uint32_t v, size_t nwords);
int ck_cuda_high_water(const void *base, size_t lo, size_t hi, uint32_t v, size_t *top);
int ck_cuda_all_finite(const float *x, int64_t n, int *finite);
/* n values between fp32 and bf16 or fp16 storage, and from fp8 to any of them (to == from
 * copies), queued on the stream */
int ck_cuda_convert(void *dst, ck_dtype to, const void *src, ck_dtype from, int64_t n);

/* comm.cu (built with CK_HAVE_NCCL): the backend's data-parallel hooks
 * (ops/backend.h: comm_id, comm_init, allreduce_start, allreduce_wait,
 * broadcast) on one NCCL communicator per process; ck_cuda_comm_quiet polls,
 * under the host's timeout, until the collectives queued so far are done (the
 * backend calls it before every wait of the host on the device);
 * ck_cuda_comm_close frees the communicator (at exit, before the context). */
struct ck_comm_host;
int ck_cuda_comm_id(void *id);
int ck_cuda_comm_init(const void *id, int rank, int nranks, const struct ck_comm_host *host);
int ck_cuda_allreduce_start(float *x, int64_t n, int b);
int ck_cuda_allreduce_wait(int b);
int ck_cuda_broadcast(float *x, int64_t n, int root);
int ck_cuda_comm_quiet(void);
void ck_cuda_comm_close(void);

/* graph.cu: one launch per list. ck_cuda_set_step queues the per-step values
 * (seed, step, lr, update, eval) into the device block the kernels read them
 * from; the executor calls it before each list, outside any capture. Between
 * ck_cuda_capture_begin and ck_cuda_capture_end the kernels called on this
 * thread are recorded on the stream, not run; _end instantiates them as a
 * graph (NULL on failure, with the reason), which ck_cuda_graph_launch
 * queues as one launch and ck_cuda_graph_free destroys. ck_cuda_capturable:
 * whether op's kernel can be captured (0 for every op when graphs are off:
 * CK_CUDA_GRAPH=0, or CK_CUDA_SYNC=1; and for the kernels that read a result
 * back to the host). 0, or -1 with ck_cuda_last_error(). After _end failed,
 * ck_cuda_capture_later: 1 when the capture met work that an op-by-op run
 * does once (a convolution's first algorithm search), so that a capture of
 * the same kernels after such a run may succeed. */
int ck_cuda_set_step(const ck_kctx *ctx);
int ck_cuda_capture_begin(void);
void *ck_cuda_capture_end(void);
int ck_cuda_capture_later(void);
int ck_cuda_graph_launch(void *graph);
void ck_cuda_graph_free(void *graph);
int ck_cuda_capturable(enum ck_op op);

/* offload.cu: the backend's offload hooks (ops/backend.h): pinned host
 * memory (cudaHostAlloc), and copies on a copy stream ordered by events. */
void *ck_cuda_pinned_alloc(size_t bytes);
void ck_cuda_pinned_release(void *p);
int ck_cuda_xfer_open(int nslots);
int ck_cuda_xfer_start(void *dst, const void *src, size_t bytes, int slot);
int ck_cuda_xfer_wait(int slot);
int ck_cuda_xfer_join(void);

/* op -> kernel, as ck_cpu_kernels; NULL where the CUDA backend lacks the op. */
extern const ck_kernel_fn ck_cuda_kernels[CK_OP_COUNT];

/* The same ops with every tensor in bf16 storage (the views' data pointers
 * point at __nv_bfloat16; arithmetic stays fp32; the slots of
 * ck_op_f32_inputs, ROPE's table, fp32): activations, softmax, the norms
 * (GROUP_NORM_SILU and RMS_NORM among them), broadcasting add/sub/mul, scale,
 * fill, the copies concat, slice, reshape and permute, the nearest 2x
 * upsample and its backward, rope, adaLN's modulate and gate, and on tensor
 * cores (fp32 accumulation) the products (cuBLASLt), convolutions (cuDNN)
 * and attention. NULL elsewhere. */
extern const ck_kernel_fn ck_cuda_kernels_bf16[CK_OP_COUNT];
/* Every tensor in fp16 storage (__half): the same ops as bf16's, the same
 * code instantiated for the other type (partial sums stay fp32). NULL
 * elsewhere: those ops read fp32 copies. */
extern const ck_kernel_fn ck_cuda_kernels_f16[CK_OP_COUNT];

#define CK_CUDA_KERNEL(name) \
    void name(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin)

/* Every kernel, declared from ops.def's cuda column: ck_cuda_<id>, and
 * ck_cuda_<id>_bf16 and ck_cuda_<id>_f16 where the column has those storages. */
#define CK_CUDA_DECL_NO(id)
#define CK_CUDA_DECL_F32(id) CK_CUDA_KERNEL(ck_cuda_##id);
#define CK_CUDA_DECL_F32_BF16(id) CK_CUDA_DECL_F32(id) CK_CUDA_KERNEL(ck_cuda_##id##_bf16);
#define CK_CUDA_DECL_F32_BF16_F16(id) CK_CUDA_DECL_F32_BF16(id) CK_CUDA_KERNEL(ck_cuda_##id##_f16);
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) CK_CUDA_DECL_##cuda(id)
#include "../ops.def"

#ifdef __cplusplus
}
#endif

#endif
