/* Data parallel on the GPU: the ranks' gradient sums and ZeRO-1 broadcasts
 * through NCCL, on a second (communication) stream, so a bucket's sum runs
 * while backward goes on. One communicator per process (one process per
 * device), bootstrapped by the host with the id rank 0 makes (vm/run/exec.c
 * sends it over MPI). Without NCCL (CK_HAVE_NCCL undefined) this file is
 * empty and the backend has no hooks: data parallel on CUDA is refused. */
#include "common.cuh"

#ifdef CK_HAVE_NCCL

#include "../backend.h"

#ifdef CK_CUDA_EMU
#include "nccl_emu.h"
#else
#include <nccl.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static struct {
    ncclComm_t comm;
    int rank;
    const ck_comm_host *host;
    cudaStream_t stream;   /* the communication stream */
    cudaEvent_t *ready;    /* per bucket: its gradient sums are complete (compute stream) */
    cudaEvent_t *done;     /* per bucket: its sum is done (communication stream) */
    int nevents;
    cudaEvent_t quiet[2];  /* what a host wait polls (both streams drained); a broadcast orders by them too */
    int pending;           /* collectives queued since the last drain */
} C;

static int nccl_ok(ncclResult_t r, const char *op, const char *what)
{
    if (r == ncclSuccess) return 1;
    return ck_cuda_fail(op, "%s: %s", what, ncclGetErrorString(r));
}
#define CK_NCCL(op, call) nccl_ok((call), (op), #call)

static cudaEvent_t new_event(const char *op)
{
    cudaEvent_t e = NULL;
    /* no timing: the cheapest to record and to wait on */
    CK_CU(op, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}

/* bucket b's pair of events, made on first use */
static int events_for(int b, const char *op)
{
    if (b < C.nevents) return 1;
    const int n = b + 1;
    cudaEvent_t *r = (cudaEvent_t *)realloc(C.ready, sizeof *r * (size_t)n);
    if (r) C.ready = r;
    cudaEvent_t *d = (cudaEvent_t *)realloc(C.done, sizeof *d * (size_t)n);
    if (d) C.done = d;
    if (!r || !d) return ck_cuda_fail(op, "out of host memory");
    for (; C.nevents < n; C.nevents++) {
        C.ready[C.nevents] = new_event(op);
        C.done[C.nevents] = new_event(op);
        if (!C.ready[C.nevents] || !C.done[C.nevents]) return 0;
    }
    return 1;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The end of the job from a wait, in vm/dist's words: the communicator
 * aborted first, so that no kernel of ours stays blocked on a peer that will
 * never come. */
static void end_job(const char *why) __attribute__((noreturn));
static void end_job(const char *why)
{
    fflush(stdout);
    fprintf(stderr, "ckrun: rank %d: %s (step %lld)\n", C.rank, why, C.host->step());
    ncclCommAbort(C.comm);
    C.comm = NULL;
    C.host->abort(1);
}

extern "C" int ck_cuda_comm_id(void *id)
{
    ncclUniqueId u;
    if (!CK_NCCL("comm_init", ncclGetUniqueId(&u))) return -1;
    memcpy(id, &u, sizeof u);
    return 0;
}

extern "C" int ck_cuda_comm_init(const void *id, int rank, int nranks, const ck_comm_host *host)
{
    const char *op = "comm_init";
    static_assert(sizeof(ncclUniqueId) == CK_COMM_ID_BYTES, "the id's bytes");
    if (C.comm) return 0;
    if (!ck_cuda_begin(op)) return -1;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    C.rank = rank;
    C.host = host;
    if (!CK_CU(op, cudaStreamCreateWithFlags(&C.stream, cudaStreamNonBlocking))) return -1;
    if (!(C.quiet[0] = new_event(op)) || !(C.quiet[1] = new_event(op))) return -1;
    if (!CK_NCCL(op, ncclCommInitRank(&C.comm, nranks, u, rank))) {
        C.comm = NULL;
        return -1;
    }
    return 0;
}

/* The ops queued so far on the compute stream, then x summed on the
 * communication stream; the compute stream goes on meanwhile. */
extern "C" int ck_cuda_allreduce_start(float *x, int64_t n, int b)
{
    const char *op = "allreduce";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    if (!C.comm) return ck_cuda_fail(op, "no NCCL communicator (comm_init)"), -1;
    if (!events_for(b, op)) return -1;
    int ok = CK_CU(op, cudaEventRecord(C.ready[b], c->stream)) &&
             CK_CU(op, cudaStreamWaitEvent(C.stream, C.ready[b], 0)) &&
             CK_NCCL(op, ncclAllReduce(x, x, (size_t)n, ncclFloat32, ncclSum, C.comm, C.stream)) &&
             CK_CU(op, cudaEventRecord(C.done[b], C.stream));
    C.pending = 1;
    return ok ? 0 : -1;
}

/* what the compute stream runs from now on waits for bucket b's sum */
extern "C" int ck_cuda_allreduce_wait(int b)
{
    const char *op = "allreduce_wait";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    if (!C.comm || b >= C.nevents) return ck_cuda_fail(op, "bucket %d was never started", b), -1;
    return CK_CU(op, cudaStreamWaitEvent(c->stream, C.done[b], 0)) ? 0 : -1;
}

/* root's x to every rank, between the ops queued before and after it (what
 * follows reads the parameter it carries) */
extern "C" int ck_cuda_broadcast(float *x, int64_t n, int root)
{
    const char *op = "broadcast";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    if (!C.comm) return ck_cuda_fail(op, "no NCCL communicator (comm_init)"), -1;
    if (!C.quiet[0]) return -1;
    int ok = CK_CU(op, cudaEventRecord(C.quiet[0], c->stream)) &&
             CK_CU(op, cudaStreamWaitEvent(C.stream, C.quiet[0], 0)) &&
             CK_NCCL(op, ncclBroadcast(x, x, (size_t)n, ncclFloat32, root, C.comm, C.stream)) &&
             CK_CU(op, cudaEventRecord(C.quiet[1], C.stream)) &&
             CK_CU(op, cudaStreamWaitEvent(c->stream, C.quiet[1], 0));
    C.pending = 1;
    return ok ? 0 : -1;
}

/* Before the host waits on the device: polls both streams until the
 * collectives queued so far are done, so that a peer that never joins one
 * ends the job after the timeout instead of hanging this rank in a
 * cudaStreamSynchronize. Free when nothing was queued since the last drain. */
extern "C" int ck_cuda_comm_quiet(void)
{
    const char *op = "comm_wait";
    if (!C.comm || !C.pending) return 0;
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    if (!CK_CU(op, cudaEventRecord(C.quiet[0], C.stream)) || !CK_CU(op, cudaEventRecord(C.quiet[1], c->stream)))
        return -1;
    const double t0 = now(), limit = C.host->timeout();
    for (int k = 0;; k++) {
        int idle = 1;
        for (int s = 0; s < 2; s++) {
            cudaError_t q = cudaEventQuery(C.quiet[s]);
            if (q == cudaErrorNotReady) {
                idle = 0;
            } else if (!CK_CU(op, q)) {
                return -1;
            }
        }
        if (idle) break;
        ncclResult_t async = ncclSuccess;
        char why[160];
        if (ncclCommGetAsyncError(C.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
            snprintf(why, sizeof why, "the NCCL communicator failed: %s", ncclGetErrorString(async));
            end_job(why);
        }
        if (now() - t0 > limit) {
            snprintf(why, sizeof why, "no reply from the other ranks in an NCCL collective for %g s", limit);
            end_job(why);
        }
        /* short sleeps first (a sum about to finish), then up to 1 ms */
        struct timespec ts = {0, k < 64 ? 0L : k < 512 ? 20000L : 1000000L};
        if (ts.tv_nsec) nanosleep(&ts, NULL);
    }
    C.pending = 0;
    return 0;
}

/* at exit: the communicator freed before the context (its stream) */
extern "C" void ck_cuda_comm_close(void)
{
    /* collectives still queued (a job ending on an error) are abandoned, not awaited */
    if (C.comm) (C.pending ? ncclCommAbort : ncclCommDestroy)(C.comm);
    for (int b = 0; b < C.nevents; b++) {
        if (C.ready[b]) cudaEventDestroy(C.ready[b]);
        if (C.done[b]) cudaEventDestroy(C.done[b]);
    }
    for (int s = 0; s < 2; s++)
        if (C.quiet[s]) cudaEventDestroy(C.quiet[s]);
    if (C.stream) cudaStreamDestroy(C.stream);
    free(C.ready);
    free(C.done);
    memset(&C, 0, sizeof C);
}

#endif
