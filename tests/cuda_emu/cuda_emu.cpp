/* The emulator behind cuda_emu.h: a fiber per CUDA thread, blocks in order,
 * and the runtime, cuBLAS and cuDNN calls ops/cuda makes. */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <map>
#include <mutex>
#include <vector>

/* How fibers switch.
 *
 * glibc's swapcontext saves and restores the signal mask on every switch: two
 * rt_sigprocmask system calls, which made nearly all of the emulator's time
 * (a training step makes hundreds of thousands of switches). The fibers never
 * touch signals, so on x86-64 they switch with ck_emu_switch below instead:
 * it pushes the callee-saved registers of the SysV ABI (rbp, rbx, r12-r15)
 * on the current stack, stores rsp, loads the other fiber's rsp and pops the
 * same from there. Everything else is caller-saved, so the C++ call to it
 * has already spilled whatever is live. A new fiber's stack is laid out as if
 * it had been switched out at its first instruction: the first switch into it
 * "returns" into fiber_main, entered with rsp = 8 mod 16 like any function
 * after a call, which runs the block body, marks the fiber DONE and switches
 * back to the scheduler for good (it never returns: its return address is a
 * null word, which also ends backtraces there).
 *
 * The ABI also makes the control bits of MXCSR and the x87 control word
 * callee-saved. ck_emu_switch does not keep them per fiber (STMXCSR and
 * LDMXCSR on every switch cost a tenth of the run): CUDA device code cannot
 * change the rounding mode or the exception masks, so every fiber runs with
 * the launching thread's. A kernel that changed them anyway would leak the
 * change to the other threads of its block and to the caller; run_block
 * checks after every block that they are what they were, and stops.
 *
 * Under AddressSanitizer the switches are announced to it with its fiber
 * interface (__sanitizer_start_switch_fiber before, finish after), so it
 * knows which stack it is on.
 *
 * The ucontext path stays for everything else: other architectures; builds
 * under ThreadSanitizer, which learns of stack switches only through its
 * interceptor for swapcontext; and a process running
 * with a CET shadow stack (checked at run time), where returning to an
 * address the shadow stack did not record faults, while glibc's makecontext
 * and swapcontext manage shadow stacks. */
#if defined(__has_feature)
#define CK_EMU_HAS_FEATURE(x) __has_feature(x)
#else
#define CK_EMU_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || CK_EMU_HAS_FEATURE(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define CK_EMU_ASAN 1
#else
#define CK_EMU_ASAN 0
#endif
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !CK_EMU_HAS_FEATURE(thread_sanitizer)
#define CK_EMU_FAST_SWITCH 1
#else
#define CK_EMU_FAST_SWITCH 0
#endif

#if CK_EMU_FAST_SWITCH
/* Saves the current context on the current stack, stores the stack pointer
 * in *save, and resumes the context saved on stack `to`. Hidden: the test
 * binary and libck_cuda_emu.so each keep their own. */
extern "C" __attribute__((visibility("hidden"))) void ck_emu_switch(void **save, void *to);
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        ".globl ck_emu_switch\n"
        ".hidden ck_emu_switch\n"
        ".type ck_emu_switch,@function\n"
        "ck_emu_switch:\n"
        "\tpushq %rbp\n"
        "\tpushq %rbx\n"
        "\tpushq %r12\n"
        "\tpushq %r13\n"
        "\tpushq %r14\n"
        "\tpushq %r15\n"
        "\tmovq %rsp, (%rdi)\n"
        "\tmovq %rsi, %rsp\n"
        "\tpopq %r15\n"
        "\tpopq %r14\n"
        "\tpopq %r13\n"
        "\tpopq %r12\n"
        "\tpopq %rbx\n"
        "\tpopq %rbp\n"
        "\tret\n"
        ".size ck_emu_switch, .-ck_emu_switch\n"
        ".popsection\n");
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

enum state { RUN, AT_BLOCK, AT_WARP, DONE };

/* what the scheduler scans every round, small so the scan stays in cache;
 * the ucontext path keeps its (large) contexts apart, in ctxs */
struct fiber {
    void *sp; /* fast path: the stack pointer while switched out */
    char *stack;
    int state;
    unsigned tid;
    uint3 idx; /* threadIdx of tid in this launch's blockDim */
    long nbar; /* __syncthreads calls in this block */
#if CK_EMU_ASAN
    void *fake; /* ASan's fake stack while switched out */
#endif
};

/* Each fiber has STACK bytes of stack, its top moved down by a different
 * multiple of 64 bytes within COLOR: the few hot frames at the top of every
 * stack would otherwise sit at the same offset in pages 256 KiB apart, on
 * the same few cache sets. */
const size_t STACK = 256 * 1024, COLOR = 64 * 1024;
ucontext_t sched;
#if CK_EMU_FAST_SWITCH
void *sched_sp;
#endif
#if CK_EMU_ASAN
/* the scheduler's stack, as ASan tells a fiber that switched from it */
const void *sched_bottom;
size_t sched_size;
#define ASAN_START(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define ASAN_FINISH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define ASAN_START(save, bottom, size) ((void)0)
#define ASAN_FINISH(save, bottom, size) ((void)0)
#endif
std::vector<fiber> fibers;
std::vector<ucontext_t> ctxs;
fiber *cur;
const std::function<void()> *body;
uint64_t xchg[1024];
cudaError_t last_error = cudaSuccess;
int fast_switch = -1; /* decided at the first launch */

[[noreturn]] void die(const char *msg)
{
    fprintf(stderr, "cuda_emu: %s (block %u,%u,%u thread %u)\n", msg, blockIdx.x, blockIdx.y, blockIdx.z,
            cur ? cur->tid : 0u);
    abort();
}

char *stack_top(const fiber &f) { return f.stack + STACK + COLOR - (f.tid * 67u % (COLOR / 64)) * 64; }

void trampoline()
{
    (*body)();
    cur->state = DONE;
}

#if CK_EMU_FAST_SWITCH
[[noreturn]] void fiber_main()
{
    ASAN_FINISH(NULL, &sched_bottom, &sched_size);
    trampoline();
    fiber *me = cur;
    ASAN_START(NULL, sched_bottom, sched_size); /* NULL: this stack is done */
    ck_emu_switch(&me->sp, sched_sp);
    abort(); /* a DONE fiber is never resumed */
}

/* a shadow stack is on when RDSSP reads a nonzero pointer; without CET the
 * instruction is a NOP and leaves the 0 (encoded as bytes for old assemblers) */
bool shadow_stack_on()
{
    unsigned long ssp = 0;
    __asm__ volatile(".byte 0xf3, 0x48, 0x0f, 0x1e, 0xc8" /* rdsspq %%rax */ : "+a"(ssp));
    return ssp != 0;
}

/* the control bits of MXCSR (not its exception flags, which arithmetic sets)
 * and the x87 control word */
uint64_t fp_control()
{
    uint32_t mxcsr = 0;
    uint16_t cw = 0;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    return (uint64_t)(mxcsr & ~0x3fu) | (uint64_t)cw << 32;
}

void fast_init(fiber &f)
{
    void **sp = (void **)((uintptr_t)stack_top(f) & ~(uintptr_t)15);
    *--sp = NULL; /* fiber_main's return address: none */
    *--sp = (void *)&fiber_main; /* where ck_emu_switch's ret lands */
    for (int i = 0; i < 6; i++) *--sp = NULL; /* rbp, rbx, r12-r15 */
    f.sp = sp;
#if CK_EMU_ASAN
    /* a fiber's frames write their shadow whole (variables and redzones) as
     * they are entered; what a finished fiber leaves poisoned is the chain
     * it never returned from, at the top of its stack */
    const size_t top = 16 * 1024;
    __asan_unpoison_memory_region(stack_top(f) - top, top);
#endif
}
#endif

/* apart, so that getcontext (which returns twice, to the compiler) does not
 * hold back the optimization of the scheduler loop */
__attribute__((noinline)) void ucontext_init(fiber &f)
{
    ucontext_t &c = ctxs[f.tid];
    getcontext(&c);
    c.uc_stack.ss_sp = f.stack;
    c.uc_stack.ss_size = (size_t)(stack_top(f) - f.stack);
    c.uc_link = &sched;
    makecontext(&c, trampoline, 0);
#if CK_EMU_ASAN
    /* ASan's swapcontext clears the shadow of the whole stack the target
     * context names, at every switch into it: 40 KiB of shadow written per
     * switch made nine tenths of the emulator's time under ASan. A fiber's
     * own frames write their shadow whole (variables and redzones) as they
     * are entered; what a finished fiber leaves poisoned is the chain it
     * never returned from, at the top of its stack. So that top is cleared
     * once here, as the fiber starts, and the context names no stack. */
    const size_t top = 16 * 1024;
    __asan_unpoison_memory_region(stack_top(f) - top, top);
    c.uc_stack.ss_sp = NULL;
    c.uc_stack.ss_size = 0;
#endif
}

void to_fiber(fiber &f)
{
#if CK_EMU_FAST_SWITCH
    if (fast_switch) {
        void *fake = NULL; /* unused without ASan */
        (void)fake;
        ASAN_START(&fake, f.stack, (size_t)(stack_top(f) - f.stack));
        ck_emu_switch(&sched_sp, f.sp);
        ASAN_FINISH(fake, NULL, NULL);
        return;
    }
#endif
    swapcontext(&sched, &ctxs[f.tid]);
}

void to_sched(fiber &f)
{
#if CK_EMU_FAST_SWITCH
    if (fast_switch) {
        ASAN_START(&f.fake, sched_bottom, sched_size);
        ck_emu_switch(&f.sp, sched_sp);
        ASAN_FINISH(f.fake, &sched_bottom, &sched_size);
        return;
    }
#endif
    swapcontext(&ctxs[f.tid], &sched);
}

void yield(int st)
{
    if (!cur) die("barrier or shuffle outside a kernel");
    cur->state = st;
    to_sched(*cur);
}

void run_block(unsigned n)
{
#if CK_EMU_FAST_SWITCH
    const uint64_t fp = fast_switch ? fp_control() : 0;
#endif
    for (unsigned i = 0; i < n; i++) {
        fiber &f = fibers[i];
#if CK_EMU_FAST_SWITCH
        if (fast_switch)
            fast_init(f);
        else
#endif
            ucontext_init(f);
        f.state = RUN;
        f.nbar = 0;
    }
    for (;;) {
        /* run every runnable thread to its next barrier, shuffle or return;
         * a thread's state changes only while it runs, so the tally can be
         * taken as the round goes */
        unsigned done = 0, at_block = 0;
        for (unsigned i = 0; i < n; i++) {
            fiber &f = fibers[i];
            if (f.state == RUN) {
                cur = &f;
                threadIdx = f.idx;
                to_fiber(f);
            }
            done += f.state == DONE;
            at_block += f.state == AT_BLOCK;
        }
        cur = NULL;
        if (done == n) break;
        if (at_block == n - done) {
            if (done) die("__syncthreads reached after some threads of the block returned");
            for (unsigned i = 0; i < n; i++) fibers[i].state = RUN;
            continue;
        }
        int released = 0;
        for (unsigned w = 0; w * 32 < n; w++) {
            const unsigned lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
            unsigned waiting = 0, gone = 0;
            for (unsigned i = lo; i < hi; i++) waiting += fibers[i].state == AT_WARP, gone += fibers[i].state == DONE;
            if (waiting && gone) die("warp shuffle with lanes that returned");
            if (waiting == hi - lo) {
                for (unsigned i = lo; i < hi; i++) fibers[i].state = RUN;
                released = 1;
            }
        }
        if (!released) die("deadlock: threads wait at different barriers (a divergent __syncthreads or shuffle)");
    }
    long nb = fibers[0].nbar;
    for (unsigned i = 1; i < n; i++)
        if (fibers[i].nbar != nb) die("threads of one block passed different numbers of __syncthreads");
#if CK_EMU_FAST_SWITCH
    if (fast_switch && fp_control() != fp)
        die("a kernel changed the floating-point rounding mode or exception masks (MXCSR or x87 control word)");
#endif
}

} // namespace

void ck_emu_launch(dim3 grid, dim3 block, const std::function<void()> &f)
{
    const unsigned long long n = (unsigned long long)block.x * block.y * block.z;
    if (n == 0 || n > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535 || grid.x > 0x7fffffffu) {
        if (last_error == cudaSuccess) last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (cur) die("kernel launched from inside a kernel");
    if (ck_emu_capture([grid, block, f] { ck_emu_launch(grid, block, f); })) return;
    if (fast_switch < 0) {
#if CK_EMU_FAST_SWITCH
        fast_switch = !shadow_stack_on();
#else
        fast_switch = 0;
#endif
    }
    while (fibers.size() < n) {
        fiber fb = {};
        fb.stack = (char *)malloc(STACK + COLOR);
        if (!fb.stack) die("out of memory for fiber stacks");
        fb.tid = (unsigned)fibers.size();
        fibers.push_back(fb);
    }
    if (!fast_switch && ctxs.size() < n) ctxs.resize(n);
    gridDim = grid;
    blockDim = block;
    for (unsigned i = 0; i < n; i++) {
        fiber &fb = fibers[i];
        fb.idx.x = i % block.x;
        fb.idx.y = i / block.x % block.y;
        fb.idx.z = i / (block.x * block.y);
    }
    body = &f;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx.x = x, blockIdx.y = y, blockIdx.z = z;
                run_block((unsigned)n);
            }
    body = NULL;
}

void __syncthreads(void)
{
    if (cur) cur->nbar++;
    yield(AT_BLOCK);
}

void __syncwarp(unsigned) { yield(AT_WARP); }

uint64_t ck_emu_exchange(uint64_t v, int, int mode, int arg, int width)
{
    if (!cur) die("shuffle outside a kernel");
    const unsigned t = cur->tid, lane = t & 31, base = t - lane;
    const unsigned n = blockDim.x * blockDim.y * blockDim.z;
    const unsigned lanes = n - base < 32 ? n - base : 32;
    if (width <= 0 || width > 32 || (width & (width - 1))) die("shuffle width not a power of 2 up to 32");
    xchg[t] = v;
    yield(AT_WARP);
    unsigned src = lane;
    const unsigned seg = lane & ~(unsigned)(width - 1);
    if (mode == 0) {
        src = lane ^ (unsigned)arg;
        if ((src & ~(unsigned)(width - 1)) != seg) src = lane;
    } else if (mode == 1) {
        if ((lane - seg) + (unsigned)arg < (unsigned)width) src = lane + (unsigned)arg;
    } else {
        src = seg + ((unsigned)arg & (unsigned)(width - 1));
    }
    if (src >= lanes) die("shuffle from a lane past the end of the block");
    const uint64_t r = xchg[base + src];
    yield(AT_WARP);
    return r;
}

/* ---- runtime ---- */

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalState: return "the operation is not permitted in the current state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorStreamCaptureUnjoined: return "capture was not joined";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t ck_emu_error(cudaError_t e)
{
    if (e != cudaSuccess) last_error = e;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
/* streams, events and pinned host memory: stream_emu.cpp */

/* Device memory as the driver gives it: cudaMalloc takes whole 2 MiB pages
 * from a device of EMU_TOTAL bytes and fails when they are not free;
 * cudaMemGetInfo reports what is left. The most ever taken is written at exit
 * to the file CK_EMU_MEMORY_LOG names ("peak_bytes N"), so a test can compare
 * the high-water mark of a whole run with the plan. */
static const size_t EMU_TOTAL = (size_t)1 << 34, EMU_PAGE = (size_t)2 << 20;
static std::mutex emu_mem_lock;
static std::map<void *, size_t> emu_blocks;
static size_t emu_used, emu_peak;

static void emu_memory_report(void)
{
    const char *path = getenv("CK_EMU_MEMORY_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "peak_bytes %zu\nused_bytes %zu\npinned_peak_bytes %zu\npinned_used_bytes %zu\n", emu_peak, emu_used,
            ck_emu_pinned_peak(), ck_emu_pinned_used());
    fclose(f);
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    static std::once_flag reported;
    std::call_once(reported, [] { atexit(emu_memory_report); });
    const size_t taken = (bytes + EMU_PAGE - 1) / EMU_PAGE * EMU_PAGE;
    std::lock_guard<std::mutex> hold(emu_mem_lock);
    *p = NULL;
    if (cudaError_t e = ck_emu_capture_forbid()) return e;
    if (taken > EMU_TOTAL - emu_used) return cudaErrorMemoryAllocation;
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!*p) return cudaErrorMemoryAllocation;
    emu_blocks[*p] = taken;
    emu_used += taken;
    if (emu_used > emu_peak) emu_peak = emu_used;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    if (cudaError_t e = ck_emu_capture_forbid()) return e;
    std::lock_guard<std::mutex> hold(emu_mem_lock);
    auto it = emu_blocks.find(p);
    if (it == emu_blocks.end()) return cudaErrorInvalidValue;
    emu_used -= it->second;
    emu_blocks.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind, cudaStream_t s)
{
    if (bytes && (!dst || !src)) return cudaErrorInvalidValue;
    /* pinned host memory: asynchronous on a device, so queued (stream_emu.h) */
    if (ck_emu_pinned(dst) || ck_emu_pinned(src)) return ck_emu_async_copy(dst, src, bytes, s);
    if (ck_emu_capture([=] { memmove(dst, src, bytes); })) return cudaSuccess;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind, cudaStream_t)
{
    if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
    if (ck_emu_capture([=] { cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, NULL); }))
        return cudaSuccess;
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t)
{
    if (ck_emu_capture([=] { memset(dst, v, bytes); })) return cudaSuccess;
    memset(dst, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::mutex> hold(emu_mem_lock);
    *free_bytes = EMU_TOTAL - emu_used;
    *total_bytes = EMU_TOTAL;
    return cudaSuccess;
}

/* ---- cuBLAS: column-major, as documented ---- */

struct ck_emu_blas {
    void *ws; /* set by cublasSetWorkspace; NULL: cuBLAS's own pool, which capture cannot use */
};

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new ck_emu_blas();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
/* setting the stream resets the workspace to the default pool (documented) */
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t)
{
    h->ws = NULL;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t)
{
    h->ws = ws;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta, float *C, int ldc,
                                         long long sc, int batch)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    const int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
        ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* captured with the scalars' values (host pointer mode); without a
     * workspace of the user's, cuBLAS would allocate inside the capture */
    cudaStreamCaptureStatus capturing;
    cudaStreamIsCapturing(NULL, &capturing);
    if (capturing != cudaStreamCaptureStatusNone && !h->ws) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *alpha, be = *beta;
    if (ck_emu_capture([=] {
            cublasSgemmStridedBatched(h, ta, tb, m, n, k, &al, A, lda, sa, B, ldb, sb, &be, C, ldc, sc, batch);
        }))
        return CUBLAS_STATUS_SUCCESS;
    for (int b = 0; b < batch; b++) {
        const float *a = A + b * sa, *bb = B + b * sb;
        float *c = C + b * sc;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    const float av = ta == CUBLAS_OP_N ? a[i + (long)l * lda] : a[l + (long)i * lda];
                    const float bv = tb == CUBLAS_OP_N ? bb[l + (long)j * ldb] : bb[j + (long)l * ldb];
                    s += (double)av * bv;
                }
                float *cij = c + i + (long)j * ldc;
                *cij = (float)(*alpha * s + (*beta == 0.0f ? 0.0 : (double)*beta * *cij));
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuDNN: NCHW fp32 convolution, as documented ---- */

struct ck_emu_dnn {
    int unused;
};
struct ck_emu_tensor {
    int set, n, c, h, w;
    cudnnDataType_t type; /* fp32 or bf16 storage; the arithmetic is fp32 either way */
};
struct ck_emu_conv {
    int set, ph, pw, sh, sw, dh, dw, mode, math;
};

size_t ck_emu_conv_ws[3][8] = {
    /* fwd: implicit gemm needs none, precomp a little, the rest too much */
    {0, 4096, 1u << 30, 1u << 30, 1u << 30, 1u << 30, 1u << 30, 1u << 30},
    /* bwd data */
    {0, 2048, 1u << 30, 1u << 30, 1u << 30, 1u << 30, 1u << 30, 1u << 30},
    /* bwd filter */
    {0, 1024, 1u << 30, 0, 1u << 30, 1u << 30, 1u << 30, 1u << 30},
};
/* What an algorithm needs beyond ck_emu_conv_ws under tensor-op math with
 * 16-bit storage: an H200 asked 5264 bytes more of a bf16 algorithm than its
 * search had listed (the search reports the math it ran, see
 * cudnn_find_emu.cpp) */
size_t ck_emu_conv_tensor_ws[3][8] = {{0, 5264}, {0, 5264}, {0, 5264}};
int ck_emu_last_algo[3] = {-1, -1, -1};

/* an algorithm's workspace under the descriptor's math and the storage type t */
static size_t conv_need(int dir, int algo, const ck_emu_conv *cv, cudnnDataType_t t)
{
    const size_t extra = cv->math == CUDNN_TENSOR_OP_MATH && t != CUDNN_DATA_FLOAT ? ck_emu_conv_tensor_ws[dir][algo] : 0;
    return ck_emu_conv_ws[dir][algo] + extra;
}

cudnnConvolutionDescriptor_t ck_emu_conv_default_math(cudnnConvolutionDescriptor_t cv)
{
    static thread_local ck_emu_conv copy;
    copy = *cv;
    copy.math = CUDNN_DEFAULT_MATH;
    return &copy;
}

const char *cudnnGetErrorString(cudnnStatus_t s)
{
    switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    *h = new ck_emu_dnn();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h)
{
    delete h;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d)
{
    *d = new ck_emu_tensor();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
static cudnnStatus_t set4(ck_emu_tensor *d, cudnnDataType_t t, int n, int c, int h, int w)
{
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (t != CUDNN_DATA_FLOAT && t != CUDNN_DATA_BFLOAT16 && t != CUDNN_DATA_HALF) return CUDNN_STATUS_NOT_SUPPORTED;
    *d = {1, n, c, h, w, t};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t, cudnnDataType_t t, int n,
                                         int c, int h, int w)
{
    return set4(d, t, n, c, h, w);
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) { return cudnnCreateTensorDescriptor(d); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) { return cudnnDestroyTensorDescriptor(d); }
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t, cudnnTensorFormat_t, int k,
                                         int c, int h, int w)
{
    return set4(d, t, k, c, h, w);
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d)
{
    *d = new ck_emu_conv();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw, int u, int v, int dh,
                                              int dw, cudnnConvolutionMode_t mode, cudnnDataType_t)
{
    if (ph < 0 || pw < 0 || u <= 0 || v <= 0 || dh <= 0 || dw <= 0) return CUDNN_STATUS_BAD_PARAM;
    *d = {1, ph, pw, u, v, dh, dw, (int)mode, d->math};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m)
{
    d->math = (int)m;
    return CUDNN_STATUS_SUCCESS;
}

/* x, w and y agree with the convolution; the output size is computed */
static cudnnStatus_t geometry(const ck_emu_conv *cv, const ck_emu_tensor *x, const ck_emu_tensor *w,
                              const ck_emu_tensor *y)
{
    if (!cv->set || !x->set || !w->set || (y && !y->set)) return CUDNN_STATUS_BAD_PARAM;
    if (cv->mode != CUDNN_CROSS_CORRELATION || cv->dh != 1 || cv->dw != 1) return CUDNN_STATUS_NOT_SUPPORTED;
    if (x->c != w->c) return CUDNN_STATUS_BAD_PARAM;
    if (w->type != x->type || (y && y->type != x->type)) return CUDNN_STATUS_NOT_SUPPORTED;
    const int ho = (x->h + 2 * cv->ph - w->h) / cv->sh + 1, wo = (x->w + 2 * cv->pw - w->w) / cv->sw + 1;
    if (ho <= 0 || wo <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (y && (y->n != x->n || y->c != w->n || y->h != ho || y->w != wo)) return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cv,
                                                    const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
                                                    int *n, int *c, int *h, int *wo)
{
    cudnnStatus_t s = geometry(cv, x, w, NULL);
    if (s) return s;
    *n = x->n, *c = w->n;
    *h = (x->h + 2 * cv->ph - w->h) / cv->sh + 1;
    *wo = (x->w + 2 * cv->pw - w->w) / cv->sw + 1;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t cv,
                                                      const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *bytes)
{
    cudnnStatus_t s = geometry(cv, x, w, y);
    if (s) return s;
    *bytes = conv_need(0, algo, cv, x->type);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t cv,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes)
{
    cudnnStatus_t s = geometry(cv, dx, w, dy);
    if (s) return s;
    *bytes = conv_need(1, algo, cv, dx->type);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                             const cudnnTensorDescriptor_t dy,
                                                             const cudnnConvolutionDescriptor_t cv,
                                                             const cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes)
{
    cudnnStatus_t s = geometry(cv, x, dw, dy);
    if (s) return s;
    *bytes = conv_need(2, algo, cv, x->type);
    return CUDNN_STATUS_SUCCESS;
}

/* heuristics: a fixed order, the non-deterministic choice first where there is one */
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t cv,
                                                     const cudnnTensorDescriptor_t y, const int requested,
                                                     int *returned, cudnnConvolutionFwdAlgoPerf_t *perf)
{
    cudnnStatus_t s = geometry(cv, x, w, y);
    if (s) return s;
    const cudnnConvolutionFwdAlgo_t order[] = {CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                               CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM};
    int k = 0;
    for (; k < 3 && k < requested; k++)
        perf[k] = {order[k], CUDNN_STATUS_SUCCESS, 1.0f, ck_emu_conv_ws[0][order[k]], CUDNN_DETERMINISTIC,
                   CUDNN_FMA_MATH, {0, 0, 0}};
    *returned = k;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t cv,
                                                          const cudnnTensorDescriptor_t dx, const int requested,
                                                          int *returned, cudnnConvolutionBwdDataAlgoPerf_t *perf)
{
    cudnnStatus_t s = geometry(cv, dx, w, dy);
    if (s) return s;
    const cudnnConvolutionBwdDataAlgo_t order[] = {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};
    int k = 0;
    for (; k < 2 && k < requested; k++)
        perf[k] = {order[k], CUDNN_STATUS_SUCCESS, 1.0f, ck_emu_conv_ws[1][order[k]],
                   k ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC, CUDNN_FMA_MATH, {0, 0, 0}};
    *returned = k;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t dy,
                                                            const cudnnConvolutionDescriptor_t cv,
                                                            const cudnnFilterDescriptor_t dw, const int requested,
                                                            int *returned, cudnnConvolutionBwdFilterAlgoPerf_t *perf)
{
    cudnnStatus_t s = geometry(cv, x, dw, dy);
    if (s) return s;
    const cudnnConvolutionBwdFilterAlgo_t order[] = {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
                                                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};
    int k = 0;
    for (; k < 2 && k < requested; k++)
        perf[k] = {order[k], CUDNN_STATUS_SUCCESS, 1.0f, ck_emu_conv_ws[2][order[k]],
                   k ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC, CUDNN_FMA_MATH, {0, 0, 0}};
    *returned = k;
    return CUDNN_STATUS_SUCCESS;
}

/* Under capture a convolution is recorded with copies of its descriptors
 * (which ops/cuda sets anew for every call) and of its scalars. */
#define CAPTURE_CONV(call, D1, D2, D3)                                                                                 \
    do {                                                                                                               \
        const float al = *(const float *)alpha, be = *(const float *)beta;                                             \
        ck_emu_tensor d1 = *D1, d2 = *D2, d3 = *D3;                                                                    \
        ck_emu_conv dc = *cv;                                                                                          \
        if (ck_emu_capture([=]() mutable { (void)(call); })) return CUDNN_STATUS_SUCCESS;                             \
    } while (0)

/* y (N,K,HO,WO) += sum over c, r, s of x(n, c, ho*sh-ph+r, wo*sw-pw+s) w(k, c, r, s), in the
 * three roles: out = alpha * result + beta * out */
enum conv_role { FWD, BWD_DATA, BWD_FILTER };

static float ld_t(cudnnDataType_t t, const void *p, long i)
{
    return t == CUDNN_DATA_BFLOAT16 ? __bfloat162float(((const __nv_bfloat16 *)p)[i])
           : t == CUDNN_DATA_HALF   ? __half2float(((const __half *)p)[i])
                                    : ((const float *)p)[i];
}

static void conv_loops(conv_role role, const ck_emu_conv *cv, const ck_emu_tensor *xd, const ck_emu_tensor *wd,
                       const ck_emu_tensor *yd, const void *x, const void *w, const void *y, void *out, float alpha,
                       float beta)
{
    const cudnnDataType_t t = xd->type;
    const int N = xd->n, C = xd->c, H = xd->h, W = xd->w, K = wd->n, R = wd->h, S = wd->w, HO = yd->h, WO = yd->w;
    const long total = role == FWD ? (long)N * K * HO * WO : role == BWD_DATA ? (long)N * C * H * W : (long)K * C * R * S;
    std::vector<double> acc((size_t)total, 0.0);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int ho = 0; ho < HO; ho++)
                for (int wo = 0; wo < WO; wo++)
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++)
                            for (int s = 0; s < S; s++) {
                                const int ih = ho * cv->sh - cv->ph + r, iw = wo * cv->sw - cv->pw + s;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                const long xi = (((long)n * C + c) * H + ih) * W + iw;
                                const long wi = (((long)k * C + c) * R + r) * S + s;
                                const long yi = (((long)n * K + k) * HO + ho) * WO + wo;
                                if (role == FWD)
                                    acc[yi] += (double)ld_t(t, x, xi) * ld_t(t, w, wi);
                                else if (role == BWD_DATA)
                                    acc[xi] += (double)ld_t(t, y, yi) * ld_t(t, w, wi);
                                else
                                    acc[wi] += (double)ld_t(t, y, yi) * ld_t(t, x, xi);
                            }
    /* 16-bit output: the fp32 result rounded once */
    for (long i = 0; i < total; i++) {
        const float v = (float)(alpha * acc[i] + (beta == 0.0f ? 0.0 : (double)beta * ld_t(t, out, i)));
        if (t == CUDNN_DATA_BFLOAT16)
            ((__nv_bfloat16 *)out)[i] = __float2bfloat16(v);
        else if (t == CUDNN_DATA_HALF)
            ((__half *)out)[i] = __float2half(v);
        else
            ((float *)out)[i] = v;
    }
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t xd,
                                      const void *x, const cudnnFilterDescriptor_t wd, const void *w,
                                      const cudnnConvolutionDescriptor_t cv, cudnnConvolutionFwdAlgo_t algo, void *ws,
                                      size_t ws_bytes, const void *beta, const cudnnTensorDescriptor_t yd, void *y)
{
    cudnnStatus_t s = geometry(cv, xd, wd, yd);
    if (s) return s;
    const size_t need = conv_need(0, algo, cv, xd->type);
    if (!h || ws_bytes < need || (need && !ws)) return CUDNN_STATUS_BAD_PARAM;
    CAPTURE_CONV(cudnnConvolutionForward(h, &al, &d1, x, &d2, w, &dc, algo, ws, ws_bytes, &be, &d3, y), xd, wd, yd);
    ck_emu_last_algo[0] = algo;
    conv_loops(FWD, cv, xd, wd, yd, x, w, NULL, y, *(const float *)alpha, *(const float *)beta);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha, const cudnnFilterDescriptor_t wd,
                                           const void *w, const cudnnTensorDescriptor_t dyd, const void *dy,
                                           const cudnnConvolutionDescriptor_t cv, cudnnConvolutionBwdDataAlgo_t algo,
                                           void *ws, size_t ws_bytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxd, void *dx)
{
    cudnnStatus_t s = geometry(cv, dxd, wd, dyd);
    if (s) return s;
    const size_t need = conv_need(1, algo, cv, dxd->type);
    if (!h || ws_bytes < need || (need && !ws)) return CUDNN_STATUS_BAD_PARAM;
    CAPTURE_CONV(cudnnConvolutionBackwardData(h, &al, &d1, w, &d2, dy, &dc, algo, ws, ws_bytes, &be, &d3, dx), wd, dyd,
                 dxd);
    ck_emu_last_algo[1] = algo;
    conv_loops(BWD_DATA, cv, dxd, wd, dyd, NULL, w, dy, dx, *(const float *)alpha, *(const float *)beta);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t xd,
                                             const void *x, const cudnnTensorDescriptor_t dyd, const void *dy,
                                             const cudnnConvolutionDescriptor_t cv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *ws, size_t ws_bytes,
                                             const void *beta, const cudnnFilterDescriptor_t dwd, void *dw)
{
    cudnnStatus_t s = geometry(cv, xd, dwd, dyd);
    if (s) return s;
    const size_t need = conv_need(2, algo, cv, xd->type);
    if (!h || ws_bytes < need || (need && !ws)) return CUDNN_STATUS_BAD_PARAM;
    CAPTURE_CONV(cudnnConvolutionBackwardFilter(h, &al, &d1, x, &d2, dy, &dc, algo, ws, ws_bytes, &be, &d3, dw), xd, dyd,
                 dwd);
    ck_emu_last_algo[2] = algo;
    conv_loops(BWD_FILTER, cv, xd, dwd, dyd, x, NULL, dy, dw, *(const float *)alpha, *(const float *)beta);
    return CUDNN_STATUS_SUCCESS;
}
