/* A training program's lists captured as CUDA graphs on the emulator when
 * their convolutions' algorithms are searched at the first run, not while
 * planning (ck_cuda_conv_forget): the search is never made inside a capture
 * (its allocation would end it), so the first run's capture is refused and
 * runs op by op, which searches; the next run captures, and from the third
 * step every range replays. Three bf16 steps so are bitwise the same
 * program's with graphs off. Built against the emulator only
 * (cmake/cuda.cmake). */
#include "cuda/cuda.h"
#include "run/program.h"

#include "check.h"
#include "program_tensors.h"

#include <stdlib.h>
#include <string.h>

const ck_backend *ck_cuda_module_open(int local_rank, char *err, size_t errlen);

#define CHECK(ok, ...)                                                                                                 \
    do {                                                                                                               \
        char line_[512];                                                                                               \
        snprintf(line_, sizeof line_, __VA_ARGS__);                                                                    \
        check(line_, (ok), 0);                                                                                         \
    } while (0)

/* x -> conv 3x3 (4 -> 8) -> silu -> conv 3x3 (8 -> 4), MSE against a target */
static ck_graph *convnet(int *loss)
{
    ck_graph *g = ck_graph_new();
    ck_shape sx = {4, {1, 4, 8, 8}};
    const int x = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "m.lua:1");
    const int target = ck_graph_leaf(g, CK_KIND_INPUT, "target", &sx, "m.lua:1");
    g->t[x].init = g->t[target].init = CK_INIT_NORMAL;
    g->t[x].init_b = g->t[target].init_b = 1;
    int h = x;
    const int64_t chans[2][2] = {{8, 4}, {4, 8}};
    for (int l = 0; l < 2; l++) {
        char name[32];
        ck_shape sw = {4, {chans[l][0], chans[l][1], 3, 3}}, sb = {1, {chans[l][0]}};
        snprintf(name, sizeof name, "conv%d.weight", l);
        const int w = ck_graph_leaf(g, CK_KIND_PARAM, name, &sw, "m.lua:2");
        g->t[w].init = CK_INIT_NORMAL, g->t[w].init_b = 0.2f;
        snprintf(name, sizeof name, "conv%d.bias", l);
        const int b = ck_graph_leaf(g, CK_KIND_PARAM, name, &sb, "m.lua:2");
        ck_op_params p = {{1, 1, 1, 1}, {0}};
        ck_shape outs[CK_MAX_OUT] = {{-1, {0}}, {-1, {0}}, {-1, {0}}};
        int ids[CK_MAX_OUT];
        const int in[3] = {h, w, b};
        ck_graph_node(g, CK_OP_CONV2D, in, 3, &p, outs, NULL, ids, "m.lua:3");
        h = ids[0];
        if (l == 0) {
            const ck_op_params q = {{0}, {0}};
            outs[0].ndim = -1;
            ck_graph_node(g, CK_OP_SILU, &h, 1, &q, outs, NULL, ids, "m.lua:4");
            h = ids[0];
        }
    }
    const ck_op_params p = {{0}, {0}};
    ck_shape outs[CK_MAX_OUT] = {{-1, {0}}, {-1, {0}}, {-1, {0}}};
    int ids[CK_MAX_OUT];
    const int in[2] = {h, target};
    ck_graph_node(g, CK_OP_MSE_LOSS, in, 2, &p, outs, NULL, ids, "m.lua:5");
    *loss = ids[0];
    return g;
}

static ck_program *compile(const ck_graph *g, int loss, const ck_backend *be, int graphs, char *err)
{
    ck_compile_opts o = {0};
    o.loss = loss;
    o.optim = CK_OPTIM_ADAMW;
    o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.999f, o.eps = 1e-8f;
    o.seed = 3;
    o.storage = CK_BF16, o.frozen = CK_F32;
    o.no_cuda_graph = !graphs;
    o.be = be;
    return ck_compile(g, &o, err, 512);
}

int main(void)
{
    char err[512];
    const ck_backend *be = ck_cuda_module_open(0, err, sizeof err);
    if (!be) {
        printf("FAIL: %s\n", err);
        return 1;
    }
    int loss;
    ck_graph *g = convnet(&loss);
    ck_program *pg = compile(g, loss, be, 1, err), *pe = pg ? compile(g, loss, be, 0, err) : NULL;
    CHECK(pg && pe, "a bf16 convolution net compiles with graphs on and off%s%.400s", pg && pe ? "" : ": ",
          pg && pe ? "" : err);
    if (!pg || !pe) return checks_done();
    /* the plans searched every shape: forgotten, the first run searches */
    ck_cuda_conv_forget();
    int ok = 1;
    ck_exec_graphs before_last = {0};
    for (int s = 0; s < 3 && ok; s++) {
        if (s == 2) before_last = pg->graphs;
        ok = !ck_program_step(pg) && !ck_program_step(pe);
    }
    CHECK(ok, "three steps run with graphs on and off%s%.400s", ok ? "" : ": ",
          ok ? "" : pg->err[0] ? pg->err : pe->err);
    if (!ok) return checks_done();
    const ck_exec_graphs last = pg->graphs;
    CHECK(before_last.captures >= 1 && last.op_by_op == before_last.op_by_op && last.launches > before_last.launches,
          "the ranges refused at the first run for a search are captured after it: the third step replays every range "
          "(%lld captures, %lld launches, %lld ranges op by op, %lld before the third step)",
          (long long)last.captures, (long long)last.launches, (long long)last.op_by_op,
          (long long)before_last.op_by_op);
    CHECK(before_last.op_by_op > 0, "the first run's searches refused its captures (%lld ranges op by op)",
          (long long)before_last.op_by_op);
    size_t na, nb;
    unsigned char *a = tensors_of(pg, CK_KIND_PARAM, &na), *b = tensors_of(pe, CK_KIND_PARAM, &nb);
    CHECK(a && b && na == nb && !memcmp(a, b, na), "the parameters after three steps are bitwise those of graphs off");
    free(a), free(b);
    ck_program_free(pg), ck_program_free(pe);
    ck_graph_free(g);
    return checks_done();
}
