/* One launch per list: the executor (vm/run/exec.c) captures a list's
 * kernels once on the context's stream as a CUDA graph and replays it with
 * one cudaGraphLaunch at each later step. Per-step values live in a small
 * block of the context's fixed device memory that kernels read through a
 * pointer (ck_cuda_step_of); a tiny kernel queued before each list writes
 * them, so a replay reads the step's own values, never the capture's. */
#include "common.cuh"

__global__ void step_kernel(ck_cuda_step *dst, ck_cuda_step v) { *dst = v; }

static int same_step(const ck_cuda_step *a, const ck_cuda_step *b)
{
    return a->seed == b->seed && a->step == b->step && a->update == b->update &&
           memcmp(&a->lr, &b->lr, sizeof a->lr) == 0 && a->eval == b->eval;
}

const ck_cuda_step *ck_cuda_step_of(ck_cuda_ctx *c, const ck_kctx *ctx, const char *op)
{
    ck_cuda_step v;
    memset(&v, 0, sizeof v);
    v.seed = ctx->seed, v.step = ctx->step, v.update = ctx->update, v.lr = ctx->lr, v.eval = ctx->eval;
    if (c->step_set && same_step(&v, &c->step_host)) return c->step_dev;
    if (c->capturing) {
        /* the write would be frozen into the graph: a replay would read it */
        ck_cuda_fail(op, "per-step values changed inside a captured list");
        return NULL;
    }
    ck_launch(step_kernel, 1, 1, c->stream, c->step_dev, v);
    c->step_host = v;
    c->step_set = 1;
    return c->step_dev;
}

extern "C" int ck_cuda_set_step(const ck_kctx *ctx)
{
    ck_cuda_ctx *c = ck_cuda_begin("set_step");
    if (!c) return -1;
    ck_cuda_step_of(c, ctx, "set_step");
    ck_cuda_end(c, "set_step");
    return ck_cuda_failed() ? -1 : 0;
}

extern "C" int ck_cuda_capture_begin(void)
{
    ck_cuda_ctx *c = ck_cuda_begin("capture");
    if (!c) return -1;
    /* thread-local: calls that capture prohibits fail on this thread only */
    if (!CK_CU("capture", cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal))) return -1;
    c->capturing = 1;
    c->capture_later = 0;
    return 0;
}

/* Ends the capture even when a kernel failed during it (the stream must leave
 * capture mode), keeping the first failure, and leaves the runtime with no
 * pending error. */
extern "C" void *ck_cuda_capture_end(void)
{
    ck_cuda_ctx *c = ck_cuda_current();
    if (!c || !c->capturing) {
        ck_cuda_fail("capture", "no capture in progress");
        return NULL;
    }
    c->capturing = 0;
    cudaGraph_t g = NULL;
    const int ended = CK_CU("capture", cudaStreamEndCapture(c->stream, &g));
    if (!ended || ck_cuda_failed()) {
        if (g) CK_CU("capture", cudaGraphDestroy(g));
        /* the failure is kept as ckrun's; the runtime's own last error (an
         * invalidated capture's, which the failing calls and the end left)
         * is reset, or the next eager launch's check would report it */
        (void)cudaGetLastError();
        return NULL;
    }
    cudaGraphExec_t exec = NULL;
    const int ok = CK_CU("capture", cudaGraphInstantiateWithFlags(&exec, g, 0));
    CK_CU("capture", cudaGraphDestroy(g)); /* the executable graph is independent of it */
    if (!ok || ck_cuda_failed()) {
        if (exec) cudaGraphExecDestroy(exec);
        return NULL;
    }
    return (void *)exec;
}

extern "C" int ck_cuda_graph_launch(void *graph)
{
    ck_cuda_ctx *c = ck_cuda_begin("graph_launch");
    if (!c) return -1;
    c->last_op = "graph_launch (a captured list; CK_CUDA_GRAPH=0 runs it op by op and names the op)";
    if (!CK_CU("graph_launch", cudaGraphLaunch((cudaGraphExec_t)graph, c->stream))) return -1;
    if (c->sync_each) CK_CU("graph_launch", cudaStreamSynchronize(c->stream));
    return ck_cuda_failed() ? -1 : 0;
}

extern "C" int ck_cuda_capture_later(void)
{
    const ck_cuda_ctx *c = ck_cuda_current();
    return c && c->capture_later;
}

extern "C" void ck_cuda_graph_free(void *graph)
{
    if (graph) CK_CU("graph_free", cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

extern "C" int ck_cuda_capturable(enum ck_op op)
{
    const ck_cuda_ctx *c = ck_cuda_current();
    if (!c || !c->graphs || c->sync_each) return 0;
    /* the lookup reads its check of the ids back to the host (embedding.cu) */
    return op != CK_OP_EMBEDDING;
}
