/* CUDA graph capture and replay on the CUDA backend (ops/cuda/graph.cu), op
 * by op against eager launches: kernel arguments are captured by value (a
 * value passed as an argument is frozen in the graph), while the per-step
 * values the kernels read from the device step block (AdamW's update count
 * and learning rate, dropout's step and evaluation flag) are those of the
 * replay; cuBLAS products and cuDNN convolutions are captured and read their
 * inputs as they are at replay; a kernel that reads back to the host cannot
 * be captured, and a change of per-step values inside a capture is refused;
 * CK_CUDA_GRAPH=0 and CK_CUDA_SYNC=1 turn capture off.
 *
 * Built like test_cuda_ops: against ck_cuda (skipped, exit 77, without a
 * device), against the CPU emulator (test_cuda_graph_emu), or without
 * either (skipped). */
#include "cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(CK_HAVE_CUDA) || defined(CK_CUDA_EMU)
#include "cuda/cuda.h"

static int passed, failed;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (ok) passed++;
    else failed++;
    if (ck_cuda_failed()) {
        printf("     pending failure: %s\n", ck_cuda_last_error());
        ck_cuda_clear_error();
    }
}

static float *dev(const float *host, int64_t n)
{
    float *d = ck_cuda_alloc(sizeof(float) * (size_t)n);
    if (d && host) ck_cuda_upload(d, host, sizeof(float) * (size_t)n);
    return d;
}

static void put(float *d, const float *host, int64_t n) { ck_cuda_upload(d, host, sizeof(float) * (size_t)n); }
static void get(float *host, const float *d, int64_t n) { ck_cuda_download(host, d, sizeof(float) * (size_t)n); }

static ck_view view1(float *d, int64_t n) { return (ck_view){.data = d, .ndim = 1, .shape = {n}}; }

static void randoms(float *x, int64_t n, unsigned seed, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
    }
}

/* the kernels of one op queued between capture_begin and capture_end */
static void *capture(enum ck_op op, const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout,
                     const ck_view *in, int nin)
{
    if (ck_cuda_set_step(ctx) || ck_cuda_capture_begin()) return NULL;
    ck_cuda_kernels[op](ctx, p, out, nout, in, nin);
    return ck_cuda_capture_end();
}

static int replay(void *g, const ck_kctx *ctx)
{
    return ck_cuda_set_step(ctx) || ck_cuda_graph_launch(g) || ck_cuda_sync() ? -1 : 0;
}

enum { N = 300 };

static void args_by_value(void)
{
    float zero[N] = {0}, got[N];
    float *y = dev(zero, N);
    ck_op_params p = {.f = {1.0f}};
    ck_view out = view1(y, N);
    const ck_kctx ctx = {.seed = 1, .step = 1, .lr = 1e-3f, .update = 1};
    void *g = capture(CK_OP_FILL, &ctx, &p, &out, 1, NULL, 0);
    get(got, y, N);
    check(g && got[0] == 0.0f && got[N - 1] == 0.0f, "a captured fill runs nothing until the graph is launched");
    p.f[0] = 2.0f; /* after capture: the graph keeps the argument it was given */
    int rc = g ? replay(g, &ctx) : -1;
    get(got, y, N);
    check(!rc && got[0] == 1.0f && got[N - 1] == 1.0f,
          "a replay fills with the value captured (1), not the parameter's value now (2): arguments are taken by value");
    ck_cuda_graph_free(g);
    ck_cuda_free(y);
}

static void adamw_reads_the_step_block(void)
{
    float p0[N], g0[N], m0[N], v0[N], want[N], frozen[N], got[N];
    randoms(p0, N, 1, -1, 1), randoms(g0, N, 2, -1, 1), randoms(m0, N, 3, -0.1f, 0.1f), randoms(v0, N, 4, 0, 0.01f);
    float *dp = dev(p0, N), *dg = dev(g0, N), *dm = dev(m0, N), *dv = dev(v0, N);
    const ck_op_params p = {.f = {0.9f, 0.999f, 1e-8f, 1e-2f, 0, 1.0f}};
    ck_view in[4] = {view1(dp, N), view1(dg, N), view1(dm, N), view1(dv, N)};
    ck_view out[3] = {view1(dp, N), view1(dm, N), view1(dv, N)};
    const ck_kctx first = {.seed = 1, .step = 1, .lr = 2e-2f, .update = 1};
    const ck_kctx later = {.seed = 1, .step = 5, .lr = 7e-3f, .update = 4};
    ck_cuda_set_step(&later); /* eager, at the later step's values */
    ck_cuda_kernels[CK_OP_ADAMW_STEP](&later, &p, out, 3, in, 4);
    ck_cuda_sync();
    get(want, dp, N);
    put(dp, p0, N), put(dm, m0, N), put(dv, v0, N);
    ck_cuda_kernels[CK_OP_ADAMW_STEP](&first, &p, out, 3, in, 4); /* eager, at the first step's */
    ck_cuda_sync();
    get(frozen, dp, N);
    put(dp, p0, N), put(dm, m0, N), put(dv, v0, N);
    void *g = capture(CK_OP_ADAMW_STEP, &first, &p, out, 3, in, 4);
    int rc = g ? replay(g, &later) : -1;
    get(got, dp, N);
    check(!rc && !memcmp(got, want, sizeof got) && memcmp(got, frozen, sizeof got),
          "AdamW captured at update 1 (lr 2e-2) and replayed at update 4 (lr 7e-3) is bitwise the eager step at update 4");
    ck_cuda_graph_free(g);
    ck_cuda_free(dp), ck_cuda_free(dg), ck_cuda_free(dm), ck_cuda_free(dv);
}

static void dropout_reads_the_step_block(void)
{
    float x0[N], want[N], got[N], at1[N];
    randoms(x0, N, 5, -1, 1);
    float *dx = dev(x0, N), *dy = dev(NULL, N);
    const ck_op_params p = {.i = {17}, .f = {0.5f}};
    ck_view in = view1(dx, N), out = view1(dy, N);
    const ck_kctx s1 = {.seed = 3, .step = 1, .lr = 1e-3f, .update = 1};
    const ck_kctx s7 = {.seed = 3, .step = 7, .lr = 1e-3f, .update = 7};
    ck_kctx ev = s7;
    ev.eval = 1;
    ck_cuda_kernels[CK_OP_DROPOUT](&s7, &p, &out, 1, &in, 1);
    ck_cuda_sync();
    get(want, dy, N);
    ck_cuda_kernels[CK_OP_DROPOUT](&s1, &p, &out, 1, &in, 1);
    ck_cuda_sync();
    get(at1, dy, N);
    void *g = capture(CK_OP_DROPOUT, &s1, &p, &out, 1, &in, 1);
    int rc = g ? replay(g, &s7) : -1;
    get(got, dy, N);
    check(!rc && !memcmp(got, want, sizeof got) && memcmp(got, at1, sizeof got),
          "dropout captured at step 1 and replayed at step 7 draws step 7's mask, bitwise");
    rc = g ? replay(g, &ev) : -1;
    get(got, dy, N);
    check(!rc && !memcmp(got, x0, sizeof got), "and replayed in an evaluation pass passes its input through");
    ck_cuda_graph_free(g);
    ck_cuda_free(dx), ck_cuda_free(dy);
}

/* a product (cuBLAS) or a convolution (cuDNN) captured, replayed on inputs
 * changed after the capture: the eager result on the new inputs */
static void library_call(enum ck_op op, const char *what, const ck_shape *shapes, int nin, const ck_op_params *p)
{
    ck_shape out_shape[CK_MAX_OUT];
    char err[256];
    check(!ck_op_infer(op, p, shapes, nin, out_shape, err, sizeof err), what);
    const int64_t no = ck_shape_numel(&out_shape[0]);
    /* the device's rule, as a plan asks it: a convolution's algorithm is chosen here, before the capture */
    const size_t ws = ck_cuda_workspace(op, p, shapes, nin, out_shape, 0);
    const ck_kctx base = {.seed = 1, .step = 1, .lr = 1e-3f, .update = 1, .ws = ws ? ck_cuda_alloc(ws) : NULL,
                          .ws_bytes = ws};
    float *host[CK_MAX_IN], *din[CK_MAX_IN];
    ck_view in[CK_MAX_IN];
    for (int j = 0; j < nin; j++) {
        const int64_t n = ck_shape_numel(&shapes[j]);
        host[j] = malloc(sizeof(float) * (size_t)n);
        randoms(host[j], n, 10 + (unsigned)j, -1, 1);
        din[j] = dev(host[j], n);
        in[j] = (ck_view){.data = din[j], .ndim = shapes[j].ndim};
        memcpy(in[j].shape, shapes[j].d, sizeof shapes[j].d);
    }
    float *dy = dev(NULL, no), *want = malloc(sizeof(float) * (size_t)no), *got = malloc(sizeof(float) * (size_t)no);
    ck_view out = {.data = dy, .ndim = out_shape[0].ndim};
    memcpy(out.shape, out_shape[0].d, sizeof out.shape);
    void *g = capture(op, &base, p, &out, 1, in, nin);
    for (int j = 0; j < nin; j++) { /* new inputs after the capture */
        const int64_t n = ck_shape_numel(&shapes[j]);
        randoms(host[j], n, 20 + (unsigned)j, -1, 1);
        put(din[j], host[j], n);
    }
    int rc = g ? replay(g, &base) : -1;
    get(got, dy, no);
    ck_cuda_kernels[op](&base, p, &out, 1, in, nin);
    ck_cuda_sync();
    get(want, dy, no);
    char line[256];
    snprintf(line, sizeof line, "%s captured, replayed on inputs written after the capture: bitwise the eager result", what);
    check(g && !rc && !memcmp(got, want, sizeof(float) * (size_t)no), line);
    ck_cuda_graph_free(g);
    for (int j = 0; j < nin; j++) free(host[j]), ck_cuda_free(din[j]);
    ck_cuda_free(dy), ck_cuda_free(base.ws), free(want), free(got);
}

/* A convolution met first inside a capture: its algorithm search (an
 * allocation and timing runs) is not done there, the capture is refused with
 * ck_cuda_capture_later set, and after an eager run (which searches) the same
 * kernels capture and replay bitwise. */
static void search_refused_then_captured(void)
{
    const ck_shape sh[2] = {{4, {1, 3, 5, 5}}, {4, {2, 3, 3, 3}}};
    const ck_op_params p = {.i = {1, 1, 1, 1}};
    float x[75], w[54], want[50], got[50];
    randoms(x, 75, 31, -1, 1);
    randoms(w, 54, 32, -1, 1);
    float *dx = dev(x, 75), *dw = dev(w, 54), *dy = dev(NULL, 50);
    const ck_kctx ctx = {.seed = 1, .step = 1, .lr = 1e-3f, .update = 1, .ws = ck_cuda_alloc(1 << 16),
                         .ws_bytes = 1 << 16};
    ck_view in[2] = {{.data = dx, .ndim = 4}, {.data = dw, .ndim = 4}};
    memcpy(in[0].shape, sh[0].d, sizeof sh[0].d);
    memcpy(in[1].shape, sh[1].d, sizeof sh[1].d);
    ck_view out = {.data = dy, .ndim = 4, .shape = {1, 2, 5, 5}};
    void *g = capture(CK_OP_CONV2D, &ctx, &p, &out, 1, in, 2);
    const int later = ck_cuda_capture_later();
    const int named = strstr(ck_cuda_last_error(), "searched outside a CUDA graph capture") != NULL;
    ck_cuda_clear_error();
    check(!g && later && named, "a convolution's first algorithm search inside a capture refuses it, to be captured later");
    ck_cuda_kernels[CK_OP_CONV2D](&ctx, &p, &out, 1, in, 2);
    const int eager = !ck_cuda_failed() && !ck_cuda_sync();
    get(want, dy, 50);
    g = capture(CK_OP_CONV2D, &ctx, &p, &out, 1, in, 2);
    const int again = g != NULL && !ck_cuda_capture_later();
    ck_cuda_upload(dy, (float[50]){0}, sizeof got);
    const int rc = g ? replay(g, &ctx) : -1;
    get(got, dy, 50);
    check(eager && again && !rc && !memcmp(got, want, sizeof got),
          "after an eager run searched it, the same convolution captures and replays bitwise the eager result");
    ck_cuda_graph_free(g);
    ck_cuda_clear_error();
    ck_cuda_free(dx), ck_cuda_free(dw), ck_cuda_free(dy), ck_cuda_free(ctx.ws);
}

static void host_reads_refused(void)
{
    float ids[4] = {0, 2, 1, 2}, table[3 * 5], got[4 * 5];
    randoms(table, 15, 9, -1, 1);
    float *di = dev(ids, 4), *dt = dev(table, 15), *dy = dev(NULL, 20);
    ck_view in[2] = {view1(di, 4), {.data = dt, .ndim = 2, .shape = {3, 5}}};
    ck_view out = {.data = dy, .ndim = 2, .shape = {4, 5}};
    const ck_kctx ctx = {.seed = 1, .step = 1, .lr = 1e-3f, .update = 1};
    const ck_op_params p = {.i = {0}};
    check(!ck_cuda_capturable(CK_OP_EMBEDDING) && ck_cuda_capturable(CK_OP_MATMUL),
          "the embedding (which reads its id check back) is not capturable, a product is");
    void *g = capture(CK_OP_EMBEDDING, &ctx, &p, &out, 1, in, 2);
    const int refused = g == NULL && ck_cuda_failed();
    ck_cuda_clear_error();
    check(refused, "capturing it anyway fails: its stream synchronize is not permitted while capturing");
    ck_cuda_kernels[CK_OP_EMBEDDING](&ctx, &p, &out, 1, in, 2);
    const int ok = !ck_cuda_failed() && !ck_cuda_sync();
    get(got, dy, 20);
    check(ok && got[5] == table[10] && got[19] == table[14], "and the stream runs it eagerly afterwards");
    ck_cuda_graph_free(g);
    ck_cuda_free(di), ck_cuda_free(dt), ck_cuda_free(dy);
}

static void step_change_in_capture_refused(void)
{
    float x[N];
    randoms(x, N, 6, -1, 1);
    float *dx = dev(x, N), *dy = dev(NULL, N);
    ck_view in = view1(dx, N), out = view1(dy, N);
    const ck_op_params p = {.i = {3}, .f = {0.25f}};
    const ck_kctx a = {.seed = 1, .step = 1, .lr = 1e-3f, .update = 1};
    ck_kctx b = a;
    b.step = 2;
    int rc = ck_cuda_set_step(&a) || ck_cuda_capture_begin();
    ck_cuda_kernels[CK_OP_DROPOUT](&b, &p, &out, 1, &in, 1);
    void *g = ck_cuda_capture_end();
    const int named = strstr(ck_cuda_last_error(), "per-step values changed inside a captured list") != NULL;
    ck_cuda_clear_error();
    check(!rc && !g && named, "a kernel whose per-step values differ from the block's inside a capture is refused");
    ck_cuda_graph_free(g);
    ck_cuda_free(dx), ck_cuda_free(dy);
}

int main(void)
{
    if (ck_cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    ck_cuda_ctx *c = ck_cuda_open(0);
    if (!c) {
        printf("FAIL: %s\n", ck_cuda_last_error());
        return 1;
    }
#ifdef CK_CUDA_EMU
    printf("(under the CPU emulator: not a GPU run)\n");
#endif
    args_by_value();
    adamw_reads_the_step_block();
    dropout_reads_the_step_block();
    const ck_shape mm[2] = {{3, {2, 5, 7}}, {2, {7, 4}}};
    library_call(CK_OP_MATMUL, "a cuBLAS product [2,5,7] x [7,4]", mm, 2, &(ck_op_params){.i = {0}});
    const ck_shape cv[3] = {{4, {2, 3, 7, 6}}, {4, {4, 3, 3, 3}}, {1, {4}}};
    library_call(CK_OP_CONV2D, "a cuDNN 3x3 convolution with bias", cv, 3, &(ck_op_params){.i = {1, 1, 1, 1}});
    search_refused_then_captured();
    host_reads_refused();
    step_change_in_capture_refused();
    ck_cuda_set_sync_each_op(c, 1);
    check(!ck_cuda_capturable(CK_OP_MATMUL), "with a sync after each op (CK_CUDA_SYNC=1) nothing is capturable");
    ck_cuda_close(c);
    setenv("CK_CUDA_GRAPH", "0", 1);
    c = ck_cuda_open(0);
    check(c && !ck_cuda_capturable(CK_OP_MATMUL), "a context opened with CK_CUDA_GRAPH=0 captures nothing");
    ck_cuda_close(c);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit\n");
    return 77;
}
#endif
