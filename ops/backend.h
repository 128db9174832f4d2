/* A backend: where a program's ops run and where its arena lives. The executor
 * (vm/run/exec.c) and the program (vm/run/program.c) reach kernels, memory and errors
 * only through this table, so one plan runs on the CPU or on a GPU unchanged.
 *
 * The CPU backend's arena is host memory and its calls are plain loops; the
 * CUDA backend's (ops/cuda/backend.c) is one cudaMalloc, its kernels are
 * queued on one stream, and host reads and writes go through copies. */
#ifndef CK_BACKEND_H
#define CK_BACKEND_H

#include "ops.h"

struct ck_comm_host;

/* An op's workspace rule: the bytes the plan gives its kernel as ctx->ws. */
typedef size_t (*ck_workspace_fn)(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                                  const ck_shape *out, int nthreads);

typedef struct ck_backend {
    const char *name;             /* "cpu", "cuda" */
    const ck_kernel_fn *kernels;  /* op -> kernel; views point into the arena */
    /* op -> kernel whose every tensor is bf16, or fp16 (NULL, or NULL
     * entries: none); elsewhere 16-bit operands are converted to fp32 around
     * the fp32 kernel (ck_backend_kernels16 picks the table by dtype) */
    const ck_kernel_fn *kernels_bf16;
    const ck_kernel_fn *kernels_f16;
    ck_workspace_fn workspace;    /* the rule the plan sizes each op's workspace by */
    /* the rules for an op that runs its kernels_bf16 or kernels_f16 entry
     * (NULL: workspace's; workspace_f16 NULL: workspace_bf16's, the bytes
     * being the same where no algorithm is chosen per storage type) */
    ck_workspace_fn workspace_bf16;
    ck_workspace_fn workspace_f16;
    int nthreads;                 /* passed to the rule (the CPU's threads; 1 on a GPU) */
    int host;                     /* 1: the arena is host memory */
    size_t fixed_bytes;           /* device memory held outside every plan (library workspaces) */
    /* the device allocator's page: an allocation of n bytes takes n rounded up
     * to a multiple of it (the CUDA driver's 2 MiB; 1 on the host) */
    size_t granule;
    /* makes the backend current on the calling thread (a GPU context binding) */
    void (*enter)(void);
    /* the arena: NULL on failure, with error() */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    /* copies; each returns when done: 0, or -1 with error() */
    int (*upload)(void *dst, const void *src_host, size_t bytes);
    int (*download)(void *dst_host, const void *src, size_t bytes);
    int (*copy)(void *dst, const void *src, size_t bytes);
    /* n values of dtype from at src into dtype to at dst (arena memory;
     * CK_F32 <-> CK_BF16 or CK_F16, CK_F8E4M3 -> any of them), queued like a
     * kernel: 0, or -1 with error() */
    int (*convert)(void *dst, ck_dtype to, const void *src, ck_dtype from, int64_t n);
    /* the measured peak (a sentinel fill, then the highest word in [lo, hi)
     * that differs, plus one) and the non-finite guard */
    int (*fill_u32)(void *dst, uint32_t v, size_t nwords);
    int (*high_water)(const void *base, size_t lo, size_t hi, uint32_t v, size_t *top);
    int (*all_finite)(const float *x, int64_t n, int *finite);
    /* Graph replay (NULL on the CPU). set_step: ctx's per-step values (seed,
     * step, lr, update, eval) into the device block kernels read them from,
     * queued: kernels never take them as launch arguments, so a list captured
     * once reads each step's values when replayed. capture_begin and
     * capture_end record the kernels queued between them as one graph
     * (capture_end: NULL on failure, with error()), graph_launch queues it,
     * graph_free destroys it. capturable: whether op's kernel can be captured
     * (it reads nothing back to the host mid-list), 0 for every op when
     * graphs are turned off. 0, or -1 with error(). capture_later (after
     * capture_end failed, may be NULL): 1 when the capture met work that an
     * op-by-op run does once (an algorithm search), so that the same list
     * may be captured after such a run. */
    int (*set_step)(const ck_kctx *ctx);
    int (*capture_begin)(void);
    void *(*capture_end)(void);
    int (*capture_later)(void);
    int (*graph_launch)(void *graph);
    void (*graph_free)(void *graph);
    int (*capturable)(enum ck_op op);
    /* waits for every op queued so far: 0, or -1 with error() */
    int (*sync)(void);
    /* the first failure since the last clear ("" when none): kernels record
     * their failures here, naming the call that failed */
    const char *(*error)(void);
    void (*clear_error)(void);
    /* Data parallel on the device's own memory (ops/cuda/comm.cu: NCCL). NULL
     * on the CPU, and on a CUDA build without NCCL: there the executor sums
     * host memory through vm/dist. comm_id fills rank 0's CK_COMM_ID_BYTES of
     * a new communicator's id; comm_init joins it (every rank, with the id
     * rank 0 made). allreduce_start sums x[0..n) over the ranks in place,
     * queued after the ops queued so far and overlapping those queued after;
     * allreduce_wait orders the ops queued after it behind bucket b's sum;
     * broadcast makes x[0..n) root's on every rank, ordered like an op. Each
     * returns 0, or -1 with error(). A wait on the host (sync, download, ...)
     * that the ranks' sums hold up past host->timeout() seconds, or a failed
     * communicator, ends the job through host->abort, naming the rank and
     * host->step(). */
    int (*comm_id)(void *id);
    int (*comm_init)(const void *id, int rank, int nranks, const struct ck_comm_host *host);
    int (*allreduce_start)(float *x, int64_t n, int b);
    int (*allreduce_wait)(int b);
    int (*broadcast)(float *x, int64_t n, int root);
    /* Offload (vm/plan/offload.c): the host region's memory (pinned on a
     * device, so that copies run asynchronously; plain memory on the CPU:
     * NULL on failure, with error()), and copies between it and the arena on
     * a copy stream. xfer_open makes room for copies in nslots slots (before
     * any capture); xfer_start queues a copy of bytes behind every op queued
     * so far, as slot's; xfer_wait orders the ops queued after it behind
     * slot's copy; xfer_join orders them behind every copy queued so far, and
     * a wait on a slot started before the last join does nothing. On the CPU
     * a copy is done when xfer_start returns. Each returns 0, or -1 with
     * error(). */
    void *(*pinned_alloc)(size_t bytes);
    void (*pinned_release)(void *p);
    int (*xfer_open)(int nslots);
    int (*xfer_start)(void *dst, const void *src, size_t bytes, int slot);
    int (*xfer_wait)(int slot);
    int (*xfer_join)(void);
} ck_backend;

/* the table of kernels whose every tensor is of the 16-bit dtype dt (NULL for
 * another dtype, or when the backend has none) */
static inline const ck_kernel_fn *ck_backend_kernels16(const ck_backend *be, ck_dtype dt)
{
    return dt == CK_BF16 ? be->kernels_bf16 : dt == CK_F16 ? be->kernels_f16 : NULL;
}

/* the workspace rule of an op run by a kernel of type kt (CK_F32: fp32) */
static inline ck_workspace_fn ck_backend_workspace(const ck_backend *be, ck_dtype kt)
{
    if (kt == CK_F16 && be->workspace_f16) return be->workspace_f16;
    if (kt != CK_F32 && be->workspace_bf16) return be->workspace_bf16;
    return be->workspace;
}

/* the bytes of a communicator's id (NCCL_UNIQUE_ID_BYTES) */
#define CK_COMM_ID_BYTES 128

/* What a backend's communicator asks of the process that runs it (vm/dist's
 * timeout, step counter and end of the job): the module holding the
 * communicator links none of libck. */
typedef struct ck_comm_host {
    double (*timeout)(void);
    long long (*step)(void);
    void (*abort)(int code) __attribute__((noreturn));
} ck_comm_host;

/* ops/cpu/backend.c */
const ck_backend *ck_backend_cpu(void);

/* cudaMalloc takes device memory in 2 MiB pages: an arena of n bytes holds n
 * rounded up to a multiple of this */
#define CK_CUDA_GRANULE ((size_t)2 << 20)
/* device memory the CUDA backend holds outside every plan: one allocation of
 * cuBLAS's workspace, the reduction scratch and the block of per-step values
 * (CK_CUDA_BLAS_WS_BYTES + CK_CUDA_SCRATCH_BYTES + CK_CUDA_STEP_BYTES, 4.25
 * MiB and 256 bytes), in whole pages. The CUDA context and what
 * cuBLAS and cuDNN allocate for themselves are not in it (README, "Memory
 * outside the plan"). */
#define CK_CUDA_FIXED_BYTES (((((size_t)4 << 20) + ((size_t)1 << 18) + 256) + CK_CUDA_GRANULE - 1) / CK_CUDA_GRANULE * CK_CUDA_GRANULE)

#endif
