/* Offload on the GPU: the host region in pinned memory, and the transfer
 * entries of a list (vm/plan/offload.c) as copies on a copy stream. A copy
 * waits for the compute stream's ops queued before it (an event recorded
 * there), runs on the copy stream, and records its slot's event; a wait
 * makes the compute stream wait on that event; a join on the copy stream's
 * latest. Under capture the same calls make a graph whose copy branch forks
 * from the compute stream and joins it again before the capture ends. */
#include "common.cuh"

#include <stdlib.h>

struct ck_cuda_xfer {
    cudaStream_t copy;
    cudaEvent_t compute_at, joined; /* reused: a wait reads the record made last before it */
    cudaEvent_t *done;              /* per slot */
    unsigned char *started;         /* per slot: started since the last join */
    int nslots;
    int any;                        /* a copy queued since the last join */
};

static cudaEvent_t new_event(const char *op)
{
    cudaEvent_t e = NULL;
    return CK_CU(op, cudaEventCreateWithFlags(&e, cudaEventDisableTiming)) ? e : NULL;
}

extern "C" void *ck_cuda_pinned_alloc(size_t bytes)
{
    const char *op = "pinned_alloc";
    if (!ck_cuda_begin(op)) return NULL;
    void *p = NULL;
    return CK_CU(op, cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault)) ? p : NULL;
}

extern "C" void ck_cuda_pinned_release(void *p)
{
    if (p) CK_CU("pinned_release", cudaFreeHost(p));
}

extern "C" int ck_cuda_xfer_open(int nslots)
{
    const char *op = "xfer_open";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    if (!c->xfer) {
        ck_cuda_xfer *x = (ck_cuda_xfer *)calloc(1, sizeof *x);
        if (!x) return ck_cuda_fail(op, "out of host memory"), -1;
        c->xfer = x;
        if (!CK_CU(op, cudaStreamCreateWithFlags(&x->copy, cudaStreamNonBlocking)) || !(x->compute_at = new_event(op)) ||
            !(x->joined = new_event(op)))
            return -1;
    }
    ck_cuda_xfer *x = c->xfer;
    if (nslots <= x->nslots) return 0;
    cudaEvent_t *d = (cudaEvent_t *)realloc(x->done, sizeof *d * (size_t)nslots);
    if (d) x->done = d;
    unsigned char *s = (unsigned char *)realloc(x->started, (size_t)nslots);
    if (s) x->started = s;
    if (!d || !s) return ck_cuda_fail(op, "out of host memory"), -1;
    for (; x->nslots < nslots; x->nslots++) {
        x->started[x->nslots] = 0;
        if (!(x->done[x->nslots] = new_event(op))) return -1;
    }
    return 0;
}

extern "C" int ck_cuda_xfer_start(void *dst, const void *src, size_t bytes, int slot)
{
    const char *op = "transfer";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    ck_cuda_xfer *x = c->xfer;
    if (!x || slot < 0 || slot >= x->nslots) return ck_cuda_fail(op, "slot %d was not opened (xfer_open)", slot), -1;
    const int ok = CK_CU(op, cudaEventRecord(x->compute_at, c->stream)) &&
                   CK_CU(op, cudaStreamWaitEvent(x->copy, x->compute_at, 0)) &&
                   CK_CU(op, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, x->copy)) &&
                   CK_CU(op, cudaEventRecord(x->done[slot], x->copy));
    x->started[slot] = 1;
    x->any = 1;
    return ok ? 0 : -1;
}

extern "C" int ck_cuda_xfer_wait(int slot)
{
    const char *op = "transfer_wait";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    ck_cuda_xfer *x = c->xfer;
    if (!x || slot < 0 || slot >= x->nslots) return ck_cuda_fail(op, "slot %d was not opened (xfer_open)", slot), -1;
    if (!x->started[slot]) return 0; /* started before the last join, which ordered it already */
    return CK_CU(op, cudaStreamWaitEvent(c->stream, x->done[slot], 0)) ? 0 : -1;
}

extern "C" int ck_cuda_xfer_join(void)
{
    const char *op = "transfer_join";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return -1;
    ck_cuda_xfer *x = c->xfer;
    if (!x || !x->any) return 0;
    const int ok = CK_CU(op, cudaEventRecord(x->joined, x->copy)) &&
                   CK_CU(op, cudaStreamWaitEvent(c->stream, x->joined, 0));
    for (int i = 0; i < x->nslots; i++) x->started[i] = 0;
    x->any = 0;
    return ok ? 0 : -1;
}

void ck_cuda_xfer_close(ck_cuda_ctx *c)
{
    ck_cuda_xfer *x = c->xfer;
    if (!x) return;
    const char *op = "cuda_close";
    if (x->copy) CK_CU(op, cudaStreamSynchronize(x->copy));
    for (int i = 0; i < x->nslots; i++) CK_CU(op, cudaEventDestroy(x->done[i]));
    if (x->compute_at) CK_CU(op, cudaEventDestroy(x->compute_at));
    if (x->joined) CK_CU(op, cudaEventDestroy(x->joined));
    if (x->copy) CK_CU(op, cudaStreamDestroy(x->copy));
    free(x->done);
    free(x->started);
    free(x);
    c->xfer = NULL;
}
