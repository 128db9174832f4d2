/* Stream capture and CUDA graphs on the emulator (graph_emu.cpp), as the
 * runtime API documents them: between cudaStreamBeginCapture and
 * cudaStreamEndCapture, work queued on the stream (kernel launches, async
 * copies and memsets, cuBLAS and cuDNN calls) is recorded, not run, with its
 * arguments as they were at the call; cudaGraphLaunch runs the recording in
 * order. A call that capture prohibits (a stream or device synchronize,
 * cudaMalloc, cudaFree) fails and invalidates the capture. Kernels carry
 * no stream here, so capture state is global; which other streams join a
 * capture, and whether they are joined back, is stream_emu.h's. Included by
 * cuda_emu.h. */
#ifndef CK_GRAPH_EMU_H
#define CK_GRAPH_EMU_H

#include <functional>

typedef struct ck_emu_graph *cudaGraph_t;
typedef struct ck_emu_graph_exec *cudaGraphExec_t;
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

/* For the emulator's own calls that queue work: while the stream captures,
 * records op (which must hold copies of everything it reads at the call)
 * and returns true; otherwise false, and the caller runs the work now. */
bool ck_emu_capture(std::function<void()> op);
/* For calls capture prohibits: cudaSuccess when not capturing; otherwise the
 * capture is invalidated and cudaErrorStreamCaptureUnsupported returned. */
cudaError_t ck_emu_capture_forbid(void);

/* Counts, for tests: graphs captured, instantiated and launched, and work
 * items replayed. CK_EMU_GRAPH_LOG names a file rewritten after every
 * instantiation and launch ("captures N", "launches N", ...). */
struct ck_emu_graph_counts {
    long captures, instantiated, launches, replayed;
};
ck_emu_graph_counts ck_emu_graph_counts_now(void);

#endif
