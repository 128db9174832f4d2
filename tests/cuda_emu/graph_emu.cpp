/* Stream capture and CUDA graphs on the emulator: a capture is a list of
 * closures, each holding copies of the arguments of one queued call, and a
 * launch runs them in order. What the documentation says and this keeps:
 * kernel arguments are captured by value at launch (so a per-step value
 * passed as an argument is frozen in the graph), pointers stay pointers (so
 * a kernel that reads through one sees the memory as it is at replay), and
 * an instantiated graph is independent of the graph it came from. */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>

#include <memory>
#include <vector>

struct ck_emu_graph {
    std::vector<std::function<void()>> ops;
};
struct ck_emu_graph_exec {
    std::vector<std::function<void()>> ops;
};

namespace {

cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
std::unique_ptr<ck_emu_graph> capturing;
ck_emu_graph_counts counts;

void write_log(void)
{
    const char *path = getenv("CK_EMU_GRAPH_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "captures %ld\ninstantiated %ld\nlaunches %ld\nreplayed %ld\n", counts.captures, counts.instantiated,
            counts.launches, counts.replayed);
    fclose(f);
}

} // namespace

bool ck_emu_capture(std::function<void()> op)
{
    if (status == cudaStreamCaptureStatusNone) return false;
    /* an invalidated capture records nothing more; the error comes at its end */
    if (status == cudaStreamCaptureStatusActive) capturing->ops.push_back(std::move(op));
    return true;
}

cudaError_t ck_emu_capture_forbid(void)
{
    if (status == cudaStreamCaptureStatusNone) return cudaSuccess;
    status = cudaStreamCaptureStatusInvalidated;
    return cudaErrorStreamCaptureUnsupported;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    if (!s) return cudaErrorStreamCaptureUnsupported; /* the legacy default stream cannot be captured */
    if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed) return cudaErrorInvalidValue;
    if (status != cudaStreamCaptureStatusNone) return cudaErrorIllegalState;
    capturing.reset(new ck_emu_graph());
    status = cudaStreamCaptureStatusActive;
    ck_emu_streams_begin_capture(s);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (status == cudaStreamCaptureStatusNone) return cudaErrorIllegalState;
    const bool ok = status == cudaStreamCaptureStatusActive;
    status = cudaStreamCaptureStatusNone;
    *graph = NULL;
    const cudaError_t joined = ck_emu_streams_end_capture(s);
    if (!ok) {
        capturing.reset();
        return ck_emu_error(cudaErrorStreamCaptureInvalidated);
    }
    if (joined != cudaSuccess) { /* a second stream's work left outside the graph's end */
        capturing.reset();
        return ck_emu_error(joined);
    }
    *graph = capturing.release();
    counts.captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *s)
{
    *s = status;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    *exec = NULL;
    if (!graph || flags > 0xf) return cudaErrorInvalidValue;
    ck_emu_graph_exec *e = new ck_emu_graph_exec();
    e->ops = graph->ops; /* a snapshot: later changes to graph do not reach it */
    *exec = e;
    counts.instantiated++;
    write_log();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(exec, graph, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (!exec) return cudaErrorInvalidValue;
    /* a launch into a capturing stream is itself captured (a child graph) */
    if (ck_emu_capture([exec, s] { cudaGraphLaunch(exec, s); })) return cudaSuccess;
    for (auto &op : exec->ops) {
        op();
        counts.replayed++;
    }
    counts.launches++;
    write_log();
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

ck_emu_graph_counts ck_emu_graph_counts_now(void) { return counts; }
