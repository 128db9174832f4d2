/* Streams, events and pinned host memory on the emulator (stream_emu.cpp),
 * from the runtime API's documented semantics. Kernels, library calls and
 * copies of pageable or device memory run as soon as they are queued, as
 * ever. A copy to or from pinned host memory (cudaHostAlloc's) is what runs
 * asynchronously on a device, so here it waits in its stream's queue: it
 * runs, in its stream's order, when an event recorded after it on that
 * stream is waited on (cudaStreamWaitEvent) or queried, or when its stream
 * or the device is synchronized, and never sooner. Until then a device
 * destination holds poison (all bits set: NaN), so an op that reads it
 * before ordering itself behind the copy reads NaN, and a source that an op
 * overwrites before that order is copied as it is then: a missing wait fails
 * the test that runs it instead of passing by luck.
 *
 * Under stream capture the same calls are recorded and replayed in order.
 * As CUDA requires, a second stream joins a capture by waiting on an event
 * recorded in it (work it queues before is not captured), and it must be
 * joined back (the capturing stream waits on an event recorded after its
 * last captured work) before cudaStreamEndCapture, which otherwise fails
 * with cudaErrorStreamCaptureUnjoined. Included by cuda_emu.h. */
#ifndef CK_STREAM_EMU_H
#define CK_STREAM_EMU_H

typedef struct ck_emu_event *cudaEvent_t;
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);

/* For the emulator's own calls: whether p lies in pinned host memory; a
 * copy that involves it, queued on s (cudaMemcpyAsync's work when it does);
 * every queue run (cudaDeviceSynchronize), or s's (cudaStreamSynchronize). */
bool ck_emu_pinned(const void *p);
cudaError_t ck_emu_async_copy(void *dst, const void *src, size_t bytes, cudaStream_t s);
void ck_emu_streams_drain(cudaStream_t s);
/* At cudaStreamEndCapture: cudaSuccess, or cudaErrorStreamCaptureUnjoined
 * when a stream that joined the capture was not joined back; the capture's
 * streams leave it either way. */
cudaError_t ck_emu_streams_end_capture(cudaStream_t origin);
void ck_emu_streams_begin_capture(cudaStream_t origin);

/* Events recorded from now on stay pending (nccl_emu.cpp: behind a hung collective). */
extern int ck_emu_events_hang;

/* The most pinned host memory held at once, and what is held now (the
 * memory log of cuda_emu.cpp reports them). CK_EMU_PINNED_LIMIT=N: a
 * cudaHostAlloc that would hold more than N bytes fails, as one past what
 * the system can lock does. C names: C tests read them. */
extern "C" size_t ck_emu_pinned_peak(void);
extern "C" size_t ck_emu_pinned_used(void);

#endif
