/* Streams, events and pinned host memory on the emulator (stream_emu.h):
 * each stream keeps the pinned copies queued on it, and an event names a
 * point of one stream's queue, which a wait or a query runs up to. */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

int ck_emu_events_hang;

struct CUstream_st {
    std::deque<std::function<void()>> q; /* pinned copies not run yet */
    uint64_t queued = 0, ran = 0;        /* counts since the stream was made */
    /* while a capture records: whether this stream has joined it, the
     * copies it captured, and whether some are not joined back */
    bool in_capture = false, unjoined = false;
    uint64_t captured = 0;
};

struct ck_emu_event {
    unsigned flags;
    int pending;           /* recorded behind a hung collective */
    CUstream_st *stream;   /* where it was recorded last, and at what count (NULL: never) */
    uint64_t upto;
    CUstream_st *cstream;  /* the same, recorded under the capture numbered cgen */
    uint64_t cupto;
    long cgen;
};

namespace {

CUstream_st legacy; /* the NULL stream */
std::vector<CUstream_st *> streams{&legacy};
long capture_gen;
std::map<uintptr_t, size_t> pinned;
size_t pinned_now, pinned_most;
std::mutex lock;

CUstream_st *of(cudaStream_t s) { return s ? s : &legacy; }

bool capturing(void)
{
    cudaStreamCaptureStatus cs;
    cudaStreamIsCapturing(NULL, &cs);
    return cs != cudaStreamCaptureStatusNone;
}

void run_to(CUstream_st *s, uint64_t upto)
{
    while (s->ran < upto && !s->q.empty()) {
        std::function<void()> f = std::move(s->q.front());
        s->q.pop_front();
        s->ran++;
        f();
    }
}

void enqueue(CUstream_st *s, void *dst, const void *src, size_t bytes)
{
    /* not done yet: what a reader that did not wait would find */
    if (!ck_emu_pinned(dst)) memset(dst, 0xff, bytes);
    s->q.push_back([=] { memmove(dst, src, bytes); });
    s->queued++;
}

void record_now(cudaEvent_t e, CUstream_st *s)
{
    e->stream = s;
    e->upto = s->queued;
    e->pending = ck_emu_events_hang;
}

void wait_now(cudaEvent_t e)
{
    if (e->stream) run_to(e->stream, e->upto);
}

} // namespace

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    if (!s) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> hold(lock);
    *s = new CUstream_st();
    streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s) return cudaErrorInvalidValue;
    run_to(s, s->queued); /* as CUDA: work queued before the destroy still completes */
    std::lock_guard<std::mutex> hold(lock);
    streams.erase(std::remove(streams.begin(), streams.end(), s), streams.end());
    delete s;
    return cudaSuccess;
}

void ck_emu_streams_drain(cudaStream_t s)
{
    if (s) {
        run_to(s, s->queued);
        return;
    }
    for (CUstream_st *x : streams) run_to(x, x->queued);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (cudaError_t e = ck_emu_capture_forbid()) return e;
    run_to(of(s), of(s)->queued);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (cudaError_t e = ck_emu_capture_forbid()) return e;
    ck_emu_streams_drain(NULL);
    return cudaSuccess;
}

cudaError_t ck_emu_async_copy(void *dst, const void *src, size_t bytes, cudaStream_t s)
{
    CUstream_st *st = of(s);
    if (capturing() && st->in_capture) {
        st->captured++;
        st->unjoined = true;
        ck_emu_capture([=] { enqueue(st, dst, src, bytes); });
        return cudaSuccess;
    }
    enqueue(st, dst, src, bytes);
    return cudaSuccess;
}

void ck_emu_streams_begin_capture(cudaStream_t origin)
{
    capture_gen++;
    for (CUstream_st *x : streams) {
        x->in_capture = false;
        x->unjoined = false;
        x->captured = 0;
    }
    of(origin)->in_capture = true;
}

cudaError_t ck_emu_streams_end_capture(cudaStream_t origin)
{
    bool unjoined = false;
    for (CUstream_st *x : streams) {
        if (x != of(origin) && x->in_capture && x->unjoined) unjoined = true;
        x->in_capture = false;
    }
    capture_gen++;
    return unjoined ? cudaErrorStreamCaptureUnjoined : cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    if (!e) return cudaErrorInvalidValue;
    *e = new ck_emu_event{flags, 0, NULL, 0, NULL, 0, -1};
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e) return cudaErrorInvalidValue;
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e) return cudaErrorInvalidValue;
    CUstream_st *st = of(s);
    if (capturing() && st->in_capture) {
        e->cstream = st;
        e->cupto = st->captured;
        e->cgen = capture_gen;
        ck_emu_capture([=] { record_now(e, st); });
        return cudaSuccess;
    }
    record_now(e, st);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e) return cudaErrorInvalidValue;
    wait_now(e); /* the device finishes what the event follows */
    return e->pending ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    if (!e || flags != 0) return cudaErrorInvalidValue;
    CUstream_st *st = of(s);
    if (capturing() && e->cgen == capture_gen && e->cstream) {
        /* an event of the capture: s joins it, and the stream it was
         * recorded on is joined back up to it */
        st->in_capture = true;
        if (e->cstream != st && e->cupto >= e->cstream->captured) e->cstream->unjoined = false;
        ck_emu_capture([=] { wait_now(e); });
        return cudaSuccess;
    }
    wait_now(e);
    return cudaSuccess;
}

bool ck_emu_pinned(const void *p)
{
    std::lock_guard<std::mutex> hold(lock);
    auto it = pinned.upper_bound((uintptr_t)p);
    if (it == pinned.begin()) return false;
    --it;
    return (uintptr_t)p < it->first + (it->second ? it->second : 1);
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    if (!p || flags != cudaHostAllocDefault) return cudaErrorInvalidValue;
    *p = NULL;
    if (cudaError_t e = ck_emu_capture_forbid()) return e;
    const char *lim = getenv("CK_EMU_PINNED_LIMIT");
    std::lock_guard<std::mutex> hold(lock);
    if (lim && *lim && pinned_now + bytes > (size_t)strtoull(lim, NULL, 10)) return cudaErrorMemoryAllocation;
    *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
    if (!*p) return cudaErrorMemoryAllocation;
    pinned[(uintptr_t)*p] = bytes;
    pinned_now += bytes;
    if (pinned_now > pinned_most) pinned_most = pinned_now;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p) return cudaSuccess;
    if (cudaError_t e = ck_emu_capture_forbid()) return e;
    ck_emu_streams_drain(NULL); /* as CUDA: it waits for the copies that use it */
    std::lock_guard<std::mutex> hold(lock);
    auto it = pinned.find((uintptr_t)p);
    if (it == pinned.end()) return cudaErrorInvalidValue;
    pinned_now -= it->second;
    pinned.erase(it);
    free(p);
    return cudaSuccess;
}

extern "C" size_t ck_emu_pinned_peak(void) { return pinned_most; }
extern "C" size_t ck_emu_pinned_used(void) { return pinned_now; }
