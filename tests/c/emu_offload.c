/* Offload on the CUDA backend under the emulator (tests/cuda_emu/stream_emu.h),
 * whose copies of pinned memory run only when an event after them is waited
 * for, leaving poison in their destination until then:
 *  - a_copy_back_read_before_its_wait_reads_poison, and reads the values
 *    once waited for: the emulator catches a missing wait;
 *  - a_source_overwritten_before_the_wait_is_copied_as_overwritten: it
 *    catches a plan that frees a buffer before its copy out is done;
 *  - a_capture_that_leaves_the_copy_stream_unjoined_fails, and one joined
 *    replays its copies;
 *  - on a program: offloaded training is bitwise the kept training on the
 *    emulated device, graphs on and off; the measured high-water mark is
 *    the plan's peak; the pinned memory held is the plan's host bytes; and
 *    the same list with one copy-back wait moved after its reader trains
 *    differently (the test itself can fail);
 *  - pinned memory that cannot be had is refused at compile, naming its bytes;
 *  - streamed frozen weights (compile's stream): training that brings two
 *    blocks' weights in from pinned memory is bitwise the kept training,
 *    graphs on and off; the high-water mark is the plan's peak and the pinned
 *    memory held is the plan's (the weights' bytes); a weight's copy read
 *    before its wait trains differently;
 *  - trained weights and optimizer state streamed (stream_trainable,
 *    offload_optimizer): bitwise the kept training, graphs on and off, the
 *    high-water mark and pinned memory the plan's; an update moved after
 *    its copy out is done trains differently.
 * Built against the emulator only (cmake/cuda.cmake). */
#include "cuda/cuda.h"
#include "plan/offload.h"
#include "run/program.h"

#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const ck_backend *ck_cuda_module_open(int local_rank, char *err, size_t errlen);
size_t ck_emu_pinned_used(void);

static void scale(float *y, const float *x, int64_t n, float s)
{
    ck_kctx ctx = {0};
    ck_op_params p = {{0}, {0}};
    p.f[0] = s;
    ck_view in = {.data = (float *)x, .ndim = 1, .shape = {n}}, out = {.data = y, .ndim = 1, .shape = {n}};
    ck_cuda_kernels[CK_OP_SCALE](&ctx, &p, &out, 1, &in, 1);
}

static void backend_semantics(const ck_backend *be)
{
    enum { N = 64 };
    float host[N], back[N];
    for (int i = 0; i < N; i++) host[i] = (float)i;
    be->enter();
    float *x = be->alloc(sizeof host), *y = be->alloc(sizeof host), *z = be->alloc(sizeof host);
    float *pin = be->pinned_alloc(sizeof host);
    be->upload(x, host, sizeof host);
    be->xfer_open(4);

    /* out, waited for, back, read before its wait: poison; then waited for */
    be->xfer_start(pin, x, sizeof host, 0);
    be->xfer_wait(0);
    be->xfer_start(y, pin, sizeof host, 1);
    scale(z, y, N, 2.0f); /* reads y before the wait */
    be->xfer_wait(1);
    be->download(back, z, sizeof back);
    int poisoned = 1;
    for (int i = 0; i < N; i++) poisoned &= isnan(back[i]);
    scale(z, y, N, 2.0f);
    be->download(back, z, sizeof back);
    int right = 1;
    for (int i = 0; i < N; i++) right &= back[i] == 2.0f * (float)i;
    check("a_copy_back_read_before_its_wait_reads_poison, and the values once waited for", poisoned && right, 0);

    /* the source overwritten before the copy out is waited for */
    be->xfer_start(pin, x, sizeof host, 2);
    scale(x, x, N, -1.0f);
    be->xfer_wait(2);
    be->xfer_join();
    int late = 1;
    for (int i = 1; i < N; i++) late &= pin[i] == -(float)i;
    check("a_source_overwritten_before_the_wait_is_copied_as_overwritten", late, 0);

    /* capture: a copy branch left open fails the capture; joined, it replays */
    if (be->capture_begin && ck_cuda_capture_begin() == 0) {
        be->xfer_start(pin, y, sizeof host, 0);
        void *gr = ck_cuda_capture_end();
        const int refused = gr == NULL;
        ck_cuda_clear_error();
        memset(pin, 0, sizeof host);
        ck_cuda_capture_begin();
        be->xfer_start(pin, y, sizeof host, 0);
        be->xfer_join();
        gr = ck_cuda_capture_end();
        const int before = pin[5] == 0.0f; /* captured, not run */
        int replayed = gr && ck_cuda_graph_launch(gr) == 0 && be->sync() == 0;
        for (int i = 0; i < N; i++) replayed &= pin[i] == (float)i;
        if (gr) ck_cuda_graph_free(gr);
        check("a_capture_that_leaves_the_copy_stream_unjoined_fails, and one joined replays its copies",
              refused && before && replayed, 0);
    }
    be->release(x);
    be->release(y);
    be->release(z);
    be->pinned_release(pin);
    ck_cuda_clear_error();
}

/* x -> linear -> silu -> linear -> gelu -> linear, MSE against a target */
static ck_graph *mlp(int *loss)
{
    ck_graph *g = ck_graph_new();
    ck_shape sx = {2, {4, 16}}, sw = {2, {16, 16}}, sb = {1, {16}};
    int h = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "m.lua:1");
    const int target = ck_graph_leaf(g, CK_KIND_INPUT, "target", &sx, "m.lua:1");
    for (int l = 0; l < 3; l++) {
        char name[32];
        snprintf(name, sizeof name, "l%d.weight", l);
        const int w = ck_graph_leaf(g, CK_KIND_PARAM, name, &sw, "m.lua:2");
        snprintf(name, sizeof name, "l%d.bias", l);
        const int b = ck_graph_leaf(g, CK_KIND_PARAM, name, &sb, "m.lua:2");
        ck_op_params p = {{0}, {0}};
        ck_shape outs[CK_MAX_OUT] = {{-1, {0}}, {-1, {0}}, {-1, {0}}};
        int ids[CK_MAX_OUT];
        const int in[3] = {h, w, b};
        ck_graph_node(g, CK_OP_LINEAR, in, 3, &p, outs, NULL, ids, "m.lua:3");
        h = ids[0];
        if (l < 2) {
            outs[0].ndim = -1;
            ck_graph_node(g, l ? CK_OP_GELU : CK_OP_SILU, &h, 1, &p, outs, NULL, ids, "m.lua:4");
            h = ids[0];
        }
    }
    ck_op_params p = {{0}, {0}};
    ck_shape outs[CK_MAX_OUT] = {{-1, {0}}, {-1, {0}}, {-1, {0}}};
    int ids[CK_MAX_OUT];
    const int in[2] = {h, target};
    ck_graph_node(g, CK_OP_MSE_LOSS, in, 2, &p, outs, NULL, ids, "m.lua:5");
    *loss = ids[0];
    return g;
}

/* x -> per block: linear by the frozen blocks.<l>.weight plus a trainable
 * bias, silu between; MSE against a target */
static ck_graph *chain(int *loss)
{
    ck_graph *g = ck_graph_new();
    ck_shape sx = {2, {4, 16}}, sw = {2, {16, 16}}, sb = {1, {16}};
    int h = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "m.lua:1");
    const int target = ck_graph_leaf(g, CK_KIND_INPUT, "target", &sx, "m.lua:1");
    g->t[h].init = g->t[target].init = CK_INIT_NORMAL;
    g->t[h].init_b = g->t[target].init_b = 1;
    for (int l = 0; l < 3; l++) {
        char name[32];
        snprintf(name, sizeof name, "blocks.%d.weight", l);
        const int w = ck_graph_leaf(g, CK_KIND_FROZEN, name, &sw, "m.lua:2");
        g->t[w].init = CK_INIT_NORMAL, g->t[w].init_b = 0.3f;
        snprintf(name, sizeof name, "blocks.%d.bias", l);
        const int b = ck_graph_leaf(g, CK_KIND_PARAM, name, &sb, "m.lua:2");
        ck_op_params p = {{0}, {0}};
        ck_shape outs[CK_MAX_OUT] = {{-1, {0}}, {-1, {0}}, {-1, {0}}};
        int ids[CK_MAX_OUT];
        const int in[3] = {h, w, b};
        ck_graph_node(g, CK_OP_LINEAR, in, 3, &p, outs, NULL, ids, "m.lua:3");
        h = ids[0];
        if (l < 2) {
            outs[0].ndim = -1;
            ck_graph_node(g, CK_OP_SILU, &h, 1, &p, outs, NULL, ids, "m.lua:4");
            h = ids[0];
        }
    }
    ck_op_params p = {{0}, {0}};
    ck_shape outs[CK_MAX_OUT] = {{-1, {0}}, {-1, {0}}, {-1, {0}}};
    int ids[CK_MAX_OUT];
    const int in[2] = {h, target};
    ck_graph_node(g, CK_OP_MSE_LOSS, in, 2, &p, outs, NULL, ids, "m.lua:5");
    *loss = ids[0];
    return g;
}

static const char *const streamed_blocks[] = {"blocks.0", "blocks.1"};

/* stream: 0 kept, 1 the blocks' frozen weights streamed, 2 their trained
 * biases too and every optimizer state in pinned memory */
static ck_program *compile_streamed(const ck_graph *g, int loss, const ck_backend *be, int stream, int graphs,
                                    char *err)
{
    ck_compile_opts o = {0};
    o.loss = loss;
    o.optim = CK_OPTIM_ADAMW;
    o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.999f, o.eps = 1e-8f;
    o.seed = 3;
    o.storage = CK_BF16, o.frozen = CK_F32;
    o.prefetch = 2;
    o.no_cuda_graph = !graphs;
    o.be = be;
    if (stream) o.stream = streamed_blocks, o.nstream = 2;
    o.stream_trainable = o.offload_optimizer = stream == 2;
    return ck_compile(g, &o, err, 512);
}

static ck_program *compile(const ck_graph *g, int loss, const ck_backend *be, int offload, int graphs, char *err)
{
    ck_compile_opts o = {0};
    o.loss = loss;
    o.optim = CK_OPTIM_ADAMW;
    o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.999f, o.eps = 1e-8f;
    o.seed = 3;
    o.storage = o.frozen = CK_F32;
    o.offload = offload;
    o.prefetch = 2;
    o.no_cuda_graph = !graphs;
    o.be = be;
    return ck_compile(g, &o, err, 512);
}

/* the parameters after three steps, as bytes (NULL if a step failed) */
static unsigned char *trained(ck_program *p, size_t *hw, size_t *n)
{
    for (int s = 0; s < 3; s++)
        if (ck_program_step_measured(p, hw)) return NULL;
    size_t total = 0;
    for (int t = 0; t < p->g->nt; t++)
        if (p->g->t[t].kind == CK_KIND_PARAM) total += ck_tensor_bytes(&p->g->t[t]);
    unsigned char *out = malloc(total), *at = out;
    for (int t = 0; t < p->g->nt; t++) {
        if (p->g->t[t].kind != CK_KIND_PARAM) continue;
        memcpy(at, ck_program_read(p, t), ck_tensor_bytes(&p->g->t[t]));
        at += ck_tensor_bytes(&p->g->t[t]);
    }
    *n = total;
    return out;
}

/* whether p (freed here) trains unlike the kept parameters (or fails) */
static int trains_unlike(ck_program *p, const unsigned char *kept, size_t n0)
{
    size_t n, hw;
    unsigned char *got = p ? trained(p, &hw, &n) : NULL;
    const int unlike = !got || memcmp(got, kept, n0) != 0;
    free(got);
    ck_program_free(p);
    return unlike;
}

/* entry from of pl moved to position to, the entries between shifted by one
 * (with their workspaces): a list made wrong on purpose */
static void move_entry(ck_plan *pl, int from, int to)
{
    const ck_op_ref r = pl->ops[from];
    const int64_t wo = pl->ws_off[from];
    const size_t wb = pl->ws_bytes[from];
    const int step = to > from ? 1 : -1;
    for (int j = from; j != to; j += step) {
        pl->ops[j] = pl->ops[j + step];
        pl->ws_off[j] = pl->ws_off[j + step];
        pl->ws_bytes[j] = pl->ws_bytes[j + step];
    }
    pl->ops[to] = r, pl->ws_off[to] = wo, pl->ws_bytes[to] = wb;
}

int main(void)
{
    char err[512];
    const ck_backend *be = ck_cuda_module_open(0, err, sizeof err);
    if (!be) {
        printf("FAIL the emulated CUDA backend opens: %s\n", err);
        return 1;
    }
    backend_semantics(be);

    int loss;
    ck_graph *g = mlp(&loss);
    size_t n0, hw0;
    ck_program *p0 = compile(g, loss, be, CK_OFFLOAD_NONE, 0, err);
    unsigned char *kept = p0 ? trained(p0, &hw0, &n0) : NULL;
    for (int graphs = 0; graphs < 2; graphs++) {
        ck_program *p = compile(g, loss, be, CK_OFFLOAD_ACTIVATIONS, graphs, err);
        if (!p) {
            printf("FAIL compile: %s\n", err);
            return 1;
        }
        const size_t pinned = ck_emu_pinned_used();
        size_t n, hw;
        unsigned char *got = trained(p, &hw, &n);
        char name[200];
        snprintf(name, sizeof name, "offloaded training is bitwise the kept training on the emulated device (graphs %s, %d transfers)",
                 graphs ? "on" : "off", p->train.nslots);
        check(name, kept && got && n == n0 && !memcmp(got, kept, n) && p->train.nslots > 0, 0);
        snprintf(name, sizeof name, "measured high-water %zu is the plan's peak %zu; pinned %zu the plan's host bytes %zu",
                 hw, p->train.peak, pinned, p->train.host_peak);
        check(name, hw == p->train.peak && pinned == p->train.host_peak && pinned > 0, 0);
        free(got);
        ck_program_free(p);
    }
    {
        /* one copy back's wait moved after its reader: the reader reads poison */
        ck_program *p = compile(g, loss, be, CK_OFFLOAD_ACTIVATIONS, 0, err);
        int moved = 0;
        for (int i = 0; p && i + 1 < p->train.n && !moved; i++)
            if (p->train.ops[i].xfer == CK_XFER_IN_WAIT && !p->train.ops[i + 1].xfer) {
                move_entry(&p->train, i, i + 1);
                moved = 1;
            }
        const int unlike = trains_unlike(p, kept, n0);
        check("a list whose copy back is read before its wait does not train as the kept one", moved && unlike, 0);
    }
    {
        /* pinned memory the system will not lock: refused at compile, naming the bytes */
        setenv("CK_EMU_PINNED_LIMIT", "1024", 1);
        ck_program *p = compile(g, loss, be, CK_OFFLOAD_ACTIVATIONS, 0, err);
        unsetenv("CK_EMU_PINNED_LIMIT");
        check("pinned memory that cannot be had is refused before the first step, naming its bytes",
              !p && strstr(err, "bytes") && strstr(err, "pinned host memory"), 0);
        printf("     %s\n", err);
        ck_program_free(p);
    }
    free(kept);
    ck_program_free(p0);
    ck_graph_free(g);

    /* streamed frozen weights */
    g = chain(&loss);
    p0 = compile_streamed(g, loss, be, 0, 0, err);
    kept = p0 ? trained(p0, &hw0, &n0) : NULL;
    for (int graphs = 0; graphs < 2; graphs++) {
        ck_program *p = compile_streamed(g, loss, be, 1, graphs, err);
        if (!p) {
            printf("FAIL compile: %s\n", err);
            return 1;
        }
        const size_t pinned = ck_emu_pinned_used();
        size_t n, hw;
        unsigned char *got = trained(p, &hw, &n);
        char name[240];
        snprintf(name, sizeof name, "streamed training is bitwise the kept training on the emulated device (graphs %s, "
                 "%zu bytes brought in a step)", graphs ? "on" : "off", p->train.stream_bytes);
        check(name, kept && got && n == n0 && !memcmp(got, kept, n) && p->train.stream_bytes > 0, 0);
        snprintf(name, sizeof name, "streamed: high-water %zu is the plan's peak %zu (kept: %zu); pinned %zu the plan's "
                 "weights %zu + host region %zu", hw, p->train.peak, hw0, pinned, p->grp->weight_bytes,
                 p->train.host_peak);
        check(name, hw == p->train.peak && pinned == p->grp->weight_bytes + p->train.host_peak && pinned == 2 * 512 && /* two bf16 weights of 16x16 */
                        p->persistent + 2 * 512 == p0->persistent, 0);
        free(got);
        ck_program_free(p);
    }
    /* trained weights and optimizer state streamed: each update's copy in and out */
    for (int graphs = 0; graphs < 2; graphs++) {
        ck_program *p = compile_streamed(g, loss, be, 2, graphs, err);
        if (!p) {
            printf("FAIL compile: %s\n", err);
            return 1;
        }
        const size_t pinned = ck_emu_pinned_used();
        size_t n, hw, moved = 0;
        for (int t = 0; t < p->g->nt; t++)
            if (p->streamed[t]) moved += (ck_tensor_bytes(&p->g->t[t]) + 63) / 64 * 64;
        unsigned char *got = trained(p, &hw, &n);
        char name[300];
        snprintf(name, sizeof name, "updates streaming their weights and state train bitwise as kept on the emulated "
                 "device (graphs %s); high-water %zu is the plan's %zu; pinned %zu the plan's weights %zu + host "
                 "region %zu", graphs ? "on" : "off", hw, p->train.peak, pinned, p->grp->weight_bytes,
                 p->train.host_peak);
        /* two frozen weights (bf16 16x16), two biases and six moments (fp32 16 each), at 64 bytes apiece */
        check(name, kept && got && n == n0 && !memcmp(got, kept, n) && hw == p->train.peak &&
                        pinned == p->grp->weight_bytes + p->train.host_peak && moved == p->grp->weight_bytes &&
                        moved == 2 * 512 + 8 * 64 && p->persistent + moved == p0->persistent,
              0);
        free(got);
        ck_program_free(p);
    }
    {
        /* an update moved after its weight's copy out and that copy's wait:
         * the host keeps the old values */
        ck_program *p = compile_streamed(g, loss, be, 2, 0, err);
        int moved = 0;
        for (int i = 1; p && i < p->train.n && !moved; i++) {
            if (p->train.ops[i].xfer != CK_XFER_OUT || p->train.ops[i - 1].xfer ||
                p->g->t[p->train.ops[i].out[0]].kind != CK_KIND_PARAM)
                continue;
            int w = i + 1;
            while (w < p->train.n && !(p->train.ops[w].xfer == CK_XFER_OUT_WAIT && p->train.ops[w].slot == p->train.ops[i].slot)) w++;
            if (w == p->train.n) break;
            move_entry(&p->train, i - 1, w);
            moved = 1;
        }
        const int unlike = trains_unlike(p, kept, n0);
        check("a list that copies a trained weight out before its update is done does not train as the kept one", moved && unlike, 0);
    }
    {
        /* a weight's copy read before its wait: poison in the product */
        ck_program *p = compile_streamed(g, loss, be, 1, 0, err);
        int moved = 0;
        for (int i = 0; p && i + 1 < p->train.n && !moved; i++)
            if (p->train.ops[i].xfer == CK_XFER_IN_WAIT && !p->train.ops[i + 1].xfer &&
                p->g->t[p->train.origin[p->train.ops[i].in[0]]].kind == CK_KIND_FROZEN) {
                move_entry(&p->train, i, i + 1);
                moved = 1;
            }
        const int unlike = trains_unlike(p, kept, n0);
        check("a list that reads a streamed weight's copy before its wait does not train as the kept one", moved && unlike, 0);
    }
    free(kept);
    ck_program_free(p0);
    ck_graph_free(g);
    return checks_done();
}
