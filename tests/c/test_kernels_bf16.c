/* The CPU kernels for bf16 storage (ck_cpu_kernels_bf16), and for fp16
 * (ck_cpu_kernels_f16: every op with a bf16 kernel), against the fp32
 * kernels on the same inputs: every input is a value of the 16-bit type,
 * the fp32 kernel's output is the reference, and each 16-bit output must be
 * that reference rounded once: |got - ref| <= 2^-8 |ref| + 1e-5 max |ref| over each of its
 * outputs (bf16 keeps 8 significant bits; fp16 keeps 11 and is held to
 * 2^-10; the second term allows for a sum taken in another order).
 * Odd sizes cross the kernels' 256-value blocks. Products and convolutions
 * (fp32 accumulation) run in the workspace their bf16 rule gives
 * (ck_op_workspace_cpu_bf16), the fp32 kernel in its own. LINEAR_GEGLU's y is
 * held to the fp32 GEGLU of its rounded h, which is what the pair computes.
 * The copies (concat, slice, reshape, permute), the nearest upsample (moves)
 * and the upsample's backward (each window summed in fp32 in the fp32
 * kernel's order) are held to more: bitwise the fp32 kernel's output rounded
 * once. Also: two runs agree bitwise,
 * nothing is written past an output, every op with a bf16 kernel has a case
 * here, and every bf16 op of the CPU is one of the GPU's (ck_cuda_bf16_op),
 * every fp16 op one of the GPU's fp16 ops (ck_cuda_f16_op) and of the CPU's
 * bf16 ones. The GPU has more: attention runs on tensor cores in bf16 and
 * fp16, where the CPU converts around its fp32 kernel. The inputs a 16-bit
 * kernel reads as fp32 (ck_op_f32_inputs: rope's table) are fp32 for both. */
#include "../../ops/bf16.h"
#include "../../ops/fp16.h"
#include "../../ops/cpu/cpu.h"
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static float frand(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 6.0f - 3.0f;
}

#define SH(...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}}
#define GUARD 0xbeefu

typedef struct tcase {
    const char *label;
    enum ck_op op;
    ck_op_params p;
    int nin;
    ck_shape in[4];
    ck_shape out; /* preset (FILL, RESHAPE); otherwise from the op's rule */
    int exact;    /* each output bitwise the fp32 kernel's rounded once */
} tcase;

/* label, op, params, inputs (FILL: none, its output preset) */
#define CASE(l_, o_, p_, n_, ...) {.label = l_, .op = o_, .p = p_, .nin = n_, .in = {__VA_ARGS__}}
#define NOP {.i = {0}}
#define GN(groups, eps) {.i = {groups}, .f = {eps}}
#define PERM(...) {.i = {__VA_ARGS__}}
/* one input; the output held bitwise to the fp32 kernel's rounded once */
#define EXACT(l_, o_, p_, in_) {.label = l_, .op = o_, .p = p_, .nin = 1, .in = {in_}, .exact = 1}
static const tcase cases[] = {
    CASE("silu [3,1001]", CK_OP_SILU, NOP, 1, SH(3, 1001)),
    CASE("silu_bwd [3,1001]", CK_OP_SILU_BWD, NOP, 2, SH(3, 1001), SH(3, 1001)),
    CASE("gelu erf [517]", CK_OP_GELU, {.i = {0}}, 1, SH(517)),
    CASE("gelu tanh [517]", CK_OP_GELU, {.i = {1}}, 1, SH(517)),
    CASE("gelu_bwd erf [2,517]", CK_OP_GELU_BWD, {.i = {0}}, 2, SH(2, 517), SH(2, 517)),
    CASE("gelu_bwd tanh [2,517]", CK_OP_GELU_BWD, {.i = {1}}, 2, SH(2, 517), SH(2, 517)),
    CASE("geglu erf [5,600]", CK_OP_GEGLU, {.i = {0}}, 1, SH(5, 600)),
    CASE("geglu tanh [2,3,10]", CK_OP_GEGLU, {.i = {1}}, 1, SH(2, 3, 10)),
    CASE("geglu_bwd erf [5,300] [5,600]", CK_OP_GEGLU_BWD, {.i = {0}}, 2, SH(5, 300), SH(5, 600)),
    CASE("geglu_bwd tanh [4,7] [4,14]", CK_OP_GEGLU_BWD, {.i = {1}}, 2, SH(4, 7), SH(4, 14)),
    /* dg = (dy * h) * gelu'(g), the fp32 kernel's order: (dy * gelu'(g)) * h
     * gives other fp16 values for a few of these 128000 */
    {.label = "geglu_bwd erf [64,1000] [64,2000] bitwise", .op = CK_OP_GEGLU_BWD, .p = {.i = {0}}, .nin = 2,
     .in = {SH(64, 1000), SH(64, 2000)}, .exact = 1},
    CASE("softmax [7,600]", CK_OP_SOFTMAX, NOP, 1, SH(7, 600)),
    CASE("softmax [3,5]", CK_OP_SOFTMAX, NOP, 1, SH(3, 5)),
    CASE("softmax_bwd [7,600]", CK_OP_SOFTMAX_BWD, NOP, 2, SH(7, 600), SH(7, 600)),
    CASE("mish [3,1001]", CK_OP_MISH, NOP, 1, SH(3, 1001)),
    CASE("mish_bwd [3,1001]", CK_OP_MISH_BWD, NOP, 2, SH(3, 1001), SH(3, 1001)),
    /* one group's 2 x 2100 values cross the 2048-value pieces; dx of the backward */
    CASE("group_norm_silu [2,4,30,70] 2 groups", CK_OP_GROUP_NORM_SILU, GN(2, 1e-5f), 3, SH(2, 4, 30, 70),
         SH(4), SH(4)),
    CASE("group_norm_silu_bwd [2,4,30,70] 2 groups", CK_OP_GROUP_NORM_SILU_BWD, GN(2, 1e-5f), 4,
         SH(2, 4, 30, 70), SH(2, 4, 30, 70), SH(4), SH(4)),
    CASE("group_norm_silu [3,6,7] 3 groups", CK_OP_GROUP_NORM_SILU, GN(3, 1e-6f), 3, SH(3, 6, 7), SH(6), SH(6)),
    /* group_norm's and layer_norm's: a group of 2 x 2100 values (the 2048-value
     * pieces), 300 channels (the 256-channel dgamma/dbeta blocks), rows of 640
     * and 1280 (the transformer's) and of 2100 (pieces within a row) */
    CASE("group_norm [2,4,30,70] 2 groups", CK_OP_GROUP_NORM, GN(2, 1e-5f), 3, SH(2, 4, 30, 70), SH(4), SH(4)),
    CASE("group_norm_bwd [2,4,30,70] 2 groups", CK_OP_GROUP_NORM_BWD, GN(2, 1e-5f), 3, SH(2, 4, 30, 70),
         SH(2, 4, 30, 70), SH(4)),
    CASE("group_norm [2,300,3] 1 group", CK_OP_GROUP_NORM, GN(1, 1e-6f), 3, SH(2, 300, 3), SH(300), SH(300)),
    CASE("group_norm_bwd [3,300,5] 3 groups", CK_OP_GROUP_NORM_BWD, GN(3, 1e-6f), 3, SH(3, 300, 5), SH(3, 300, 5),
         SH(300)),
    CASE("layer_norm [2,37,640]", CK_OP_LAYER_NORM, GN(0, 1e-5f), 3, SH(2, 37, 640), SH(640), SH(640)),
    CASE("layer_norm [9,1280]", CK_OP_LAYER_NORM, GN(0, 1e-5f), 3, SH(9, 1280), SH(1280), SH(1280)),
    CASE("layer_norm [3,2100]", CK_OP_LAYER_NORM, GN(0, 1e-5f), 3, SH(3, 2100), SH(2100), SH(2100)),
    CASE("layer_norm_bwd [2,37,640]", CK_OP_LAYER_NORM_BWD, GN(0, 1e-5f), 3, SH(2, 37, 640), SH(2, 37, 640),
         SH(640)),
    CASE("layer_norm_bwd [70,1280]", CK_OP_LAYER_NORM_BWD, GN(0, 1e-5f), 3, SH(70, 1280), SH(70, 1280), SH(1280)),
    CASE("layer_norm_bwd [5,2100]", CK_OP_LAYER_NORM_BWD, GN(0, 1e-5f), 3, SH(5, 2100), SH(5, 2100), SH(2100)),
    /* layer_norm without its affine (Flux's norms) or its bias, and rms_norm:
     * T5's rows of d_model (here 640 and 2100: pieces within a row), Flux's of
     * the head dim (128), with and without a weight */
    CASE("layer_norm no affine [4,300]", CK_OP_LAYER_NORM, GN(0, 1e-6f), 1, SH(4, 300)),
    CASE("layer_norm weight only [3,2100]", CK_OP_LAYER_NORM, GN(0, 1e-6f), 2, SH(3, 2100), SH(2100)),
    CASE("layer_norm_bwd no affine [6,300]", CK_OP_LAYER_NORM_BWD, GN(0, 1e-6f), 2, SH(6, 300), SH(6, 300)),
    CASE("rms_norm [2,37,640]", CK_OP_RMS_NORM, GN(0, 1e-6f), 2, SH(2, 37, 640), SH(640)),
    CASE("rms_norm [3,2100]", CK_OP_RMS_NORM, GN(0, 1e-6f), 2, SH(3, 2100), SH(2100)),
    CASE("rms_norm no weight [2,3,5,128]", CK_OP_RMS_NORM, GN(0, 1e-6f), 1, SH(2, 3, 5, 128)),
    CASE("rms_norm_bwd [70,1280]", CK_OP_RMS_NORM_BWD, GN(0, 1e-6f), 3, SH(70, 1280), SH(70, 1280), SH(1280)),
    CASE("rms_norm_bwd [9,5,128]", CK_OP_RMS_NORM_BWD, GN(0, 1e-6f), 3, SH(9, 5, 128), SH(9, 5, 128), SH(128)),
    CASE("rms_norm_bwd no weight [5,2100]", CK_OP_RMS_NORM_BWD, GN(0, 1e-6f), 2, SH(5, 2100), SH(5, 2100)),
    /* rope, modulate and gate do the fp32 kernels' float operations on the
     * same values (their sums too: in double, rounded once): bitwise theirs
     * rounded once. rope's table stays fp32 (ck_op_f32_inputs). */
    {.label = "rope [2,7,24] table [7,8]", .op = CK_OP_ROPE, .nin = 2, .in = {SH(2, 7, 24), SH(7, 8)}, .exact = 1},
    {.label = "rope inverse [2,7,24] table [7,8]", .op = CK_OP_ROPE, .p = {.i = {1}}, .nin = 2,
     .in = {SH(2, 7, 24), SH(7, 8)}, .exact = 1},
    {.label = "rope [1,2,5,4352] table [5,4352] (rows past one piece)", .op = CK_OP_ROPE, .nin = 2,
     .in = {SH(1, 2, 5, 4352), SH(5, 4352)}, .exact = 1},
    {.label = "modulate [2,37,300]", .op = CK_OP_MODULATE, .nin = 3, .in = {SH(2, 37, 300), SH(2, 300), SH(2, 300)},
     .exact = 1},
    {.label = "modulate_bwd [2,37,300]", .op = CK_OP_MODULATE_BWD, .nin = 3,
     .in = {SH(2, 37, 300), SH(2, 37, 300), SH(2, 300)}, .exact = 1},
    {.label = "gate [3,5,7,9]", .op = CK_OP_GATE, .nin = 3, .in = {SH(3, 5, 7, 9), SH(3, 9), SH(3, 5, 7, 9)}, .exact = 1},
    {.label = "gate_bwd [2,37,300]", .op = CK_OP_GATE_BWD, .nin = 3, .in = {SH(2, 37, 300), SH(2, 300), SH(2, 37, 300)},
     .exact = 1},
    CASE("add same shape [3,333]", CK_OP_ADD, NOP, 2, SH(3, 333), SH(3, 333)),
    CASE("add bias [4,5,6] + [6]", CK_OP_ADD, NOP, 2, SH(4, 5, 6), SH(6)),
    CASE("sub per channel [2,3,4,5] - [3,1,1]", CK_OP_SUB, NOP, 2, SH(2, 3, 4, 5), SH(3, 1, 1)),
    CASE("sub broadcast both [4,1] - [1,5]", CK_OP_SUB, NOP, 2, SH(4, 1), SH(1, 5)),
    CASE("mul [2,300,7] * [2,1,7]", CK_OP_MUL, NOP, 2, SH(2, 300, 7), SH(2, 1, 7)),
    CASE("mul by a scalar [1] * [9,9]", CK_OP_MUL, NOP, 2, SH(1), SH(9, 9)),
    CASE("scale by -0.37 [1000]", CK_OP_SCALE, {.f = {-0.37f}}, 1, SH(1000)),
    {.label = "fill 0.1 [3,77]", .op = CK_OP_FILL, .p = {.f = {0.1f}}, .nin = 0, .out = SH(3, 77)},
    /* a transformer's NCHW -> tokens and back (tiles of the transpose), odd
     * sizes crossing the 32 x 32 tiles, one keeping the last dim (runs), one
     * past the size that starts the thread pool */
    EXACT("permute [2,4,6,5] (0,2,3,1)", CK_OP_PERMUTE, PERM(0, 2, 3, 1), SH(2, 4, 6, 5)),
    EXACT("permute [2,6,5,4] (0,3,1,2)", CK_OP_PERMUTE, PERM(0, 3, 1, 2), SH(2, 6, 5, 4)),
    EXACT("permute [2,37,5,9] (0,2,3,1)", CK_OP_PERMUTE, PERM(0, 2, 3, 1), SH(2, 37, 5, 9)),
    EXACT("permute [3,7,5,9] (0,2,1,3) keeps the last dim", CK_OP_PERMUTE, PERM(0, 2, 1, 3), SH(3, 7, 5, 9)),
    EXACT("permute [1,320,33,29] (0,2,3,1)", CK_OP_PERMUTE, PERM(0, 2, 3, 1), SH(1, 320, 33, 29)),
    /* the copies: bitwise, as the moves above */
    {.label = "concat [2,3,5] [2,4,5] on dim 1", .op = CK_OP_CONCAT, .p = {.i = {1}}, .nin = 2,
     .in = {SH(2, 3, 5), SH(2, 4, 5)}, .exact = 1},
    {.label = "concat [3,7] [2,7] on dim 0", .op = CK_OP_CONCAT, .p = {.i = {0}}, .nin = 2, .in = {SH(3, 7), SH(2, 7)},
     .exact = 1},
    {.label = "slice [3,10,7] dim 1, 5 from 2", .op = CK_OP_SLICE, .p = {.i = {1, 2, 5}}, .nin = 1, .in = {SH(3, 10, 7)},
     .exact = 1},
    {.label = "reshape [6,35] to [2,3,5,7]", .op = CK_OP_RESHAPE, .nin = 1, .in = {SH(6, 35)}, .out = SH(2, 3, 5, 7),
     .exact = 1},
    EXACT("upsample2x [2,3,5,7]", CK_OP_UPSAMPLE2X, NOP, SH(2, 3, 5, 7)),
    EXACT("upsample2x [1,130,33,35]", CK_OP_UPSAMPLE2X, NOP, SH(1, 130, 33, 35)),
    EXACT("upsample2x_bwd [2,3,10,14]", CK_OP_UPSAMPLE2X_BWD, NOP, SH(2, 3, 10, 14)),
    EXACT("upsample2x_bwd [1,130,66,70]", CK_OP_UPSAMPLE2X_BWD, NOP, SH(1, 130, 66, 70)),
    {.label = "matmul [2,5,64,40] x [2,5,77,40]^T", .op = CK_OP_MATMUL, .p = {.i = {0, 1}}, .nin = 2,
     .in = {SH(2, 5, 64, 40), SH(2, 5, 77, 40)}},
    {.label = "matmul [3,7]^T x [3,9]", .op = CK_OP_MATMUL, .p = {.i = {1, 0}}, .nin = 2, .in = {SH(3, 7), SH(3, 9)}},
    CASE("linear [2,64,320] x [640,320]^T + b", CK_OP_LINEAR, NOP, 3, SH(2, 64, 320), SH(640, 320), SH(640)),
    CASE("linear_geglu [2,33,40] x [96,40]^T + b", CK_OP_LINEAR_GEGLU, NOP, 3, SH(2, 33, 40), SH(96, 40), SH(96)),
    CASE("linear_geglu tanh [7,9] x [600,9]^T", CK_OP_LINEAR_GEGLU, {.i = {1}}, 2, SH(7, 9), SH(600, 9)),
    {.label = "conv2d [1,32,16,16] 3x3 pad 1 + b", .op = CK_OP_CONV2D, .p = {.i = {1, 1, 1, 1}}, .nin = 3,
     .in = {SH(1, 32, 16, 16), SH(32, 32, 3, 3), SH(32)}},
    {.label = "conv2d [2,5,9,7] 3x3 stride 2", .op = CK_OP_CONV2D, .p = {.i = {2, 2, 1, 1}}, .nin = 2,
     .in = {SH(2, 5, 9, 7), SH(3, 5, 3, 3)}},
    {.label = "conv2d_bwd_data [1,32,16,16] 3x3 pad 1", .op = CK_OP_CONV2D_BWD_DATA, .p = {.i = {1, 1, 1, 1}},
     .nin = 2, .in = {SH(1, 32, 16, 16), SH(32, 32, 3, 3)}, .out = SH(1, 32, 16, 16)},
    {.label = "conv2d_bwd_filter [1,32,16,16] dw", .op = CK_OP_CONV2D_BWD_FILTER, .p = {.i = {1, 1, 1, 1}},
     .nin = 2, .in = {SH(1, 32, 16, 16), SH(1, 32, 16, 16)}, .out = SH(32, 32, 3, 3)},
};

static const ck_kctx ctx0 = {7, 1, 0.01f, NULL, 0, 1, 0};

static ck_view view(void *data, const ck_shape *s)
{
    ck_view v = {data, s->ndim, {0}};
    for (int d = 0; d < s->ndim; d++) v.shape[d] = s->d[d];
    return v;
}

static uint16_t to_16(ck_dtype st, float f) { return st == CK_F16 ? ck_f16_from_f32(f) : ck_bf16_from_f32(f); }
static float from_16(ck_dtype st, uint16_t h) { return st == CK_F16 ? ck_f32_from_f16(h) : ck_f32_from_bf16(h); }

/* st: CK_BF16 or CK_F16, the storage of every tensor of the 16-bit kernel */
static void run_case(const tcase *t, ck_dtype st)
{
    const ck_kernel_fn *k16 = st == CK_F16 ? ck_cpu_kernels_f16 : ck_cpu_kernels_bf16;
    ck_shape outs[CK_MAX_OUT] = {t->out};
    char err[160];
    if (t->op != CK_OP_FILL && ck_op_infer(t->op, &t->p, t->in, t->nin, outs, err, sizeof err)) {
        check(t->label, 0, 0);
        printf("  shape rule: %s\n", err);
        return;
    }
    /* every output the op has (a norm's backward: dx, dgamma, dbeta) */
    const int nout = t->op == CK_OP_FILL ? 1 : ck_op_nout(t->op);
    float *in32[4] = {0}, *ref[CK_MAX_OUT];
    uint16_t *in16[4] = {0}, *got[CK_MAX_OUT], *got2[CK_MAX_OUT];
    int64_t n[CK_MAX_OUT];
    ck_view v32[4], v16[4], o32[CK_MAX_OUT], o16[CK_MAX_OUT], o16b[CK_MAX_OUT];
    for (int j = 0; j < t->nin; j++) {
        const int64_t m = ck_shape_numel(&t->in[j]);
        /* the slots a 16-bit kernel reads in fp32 (rope's table) get fp32 values in both */
        const int f32 = ck_op_f32_inputs(t->op) >> j & 1;
        in32[j] = malloc(sizeof(float) * (size_t)m);
        in16[j] = malloc(sizeof(uint16_t) * (size_t)m);
        for (int64_t i = 0; i < m; i++) {
            in16[j][i] = to_16(st, frand());
            in32[j][i] = f32 ? frand() : from_16(st, in16[j][i]);
        }
        v32[j] = view(in32[j], &t->in[j]);
        v16[j] = f32 ? v32[j] : view(in16[j], &t->in[j]);
    }
    for (int k = 0; k < nout; k++) {
        n[k] = ck_shape_numel(&outs[k]);
        ref[k] = malloc(sizeof(float) * (size_t)(n[k] + 1));
        got[k] = malloc(sizeof(uint16_t) * (size_t)(n[k] + 1));
        got2[k] = malloc(sizeof(uint16_t) * (size_t)(n[k] + 1));
        got[k][n[k]] = got2[k][n[k]] = GUARD;
        o32[k] = view(ref[k], &outs[k]);
        o16[k] = view(got[k], &outs[k]);
        o16b[k] = view(got2[k], &outs[k]);
    }
    ck_kctx c32 = ctx0, c16 = ctx0;
    c32.ws_bytes = ck_op_workspace(t->op, &t->p, t->in, t->nin, outs, ck_cpu_threads());
    c16.ws_bytes = ck_op_workspace_cpu_bf16(t->op, &t->p, t->in, t->nin, outs, ck_cpu_threads());
    c32.ws = c32.ws_bytes ? malloc(c32.ws_bytes) : NULL;
    c16.ws = c16.ws_bytes ? malloc(c16.ws_bytes) : NULL;
    ck_cpu_kernels[t->op](&c32, &t->p, o32, nout, v32, t->nin);
    if (t->op == CK_OP_LINEAR_GEGLU) {
        /* y is the GEGLU of the stored (rounded) h, as the pair computes it */
        float *h = malloc(sizeof(float) * (size_t)n[1]);
        for (int64_t i = 0; i < n[1]; i++) h[i] = from_16(st, to_16(st, ref[1][i]));
        const ck_view vh = view(h, &outs[1]);
        ck_cpu_kernels[CK_OP_GEGLU](&c32, &t->p, o32, 1, &vh, 1);
        free(h);
    }
    k16[t->op](&c16, &t->p, o16, nout, v16, t->nin);
    k16[t->op](&c16, &t->p, o16b, nout, v16, t->nin);
    if (ck_cpu_last_error()[0]) printf("  %s\n", ck_cpu_last_error()), ck_cpu_clear_error();
    free(c32.ws), free(c16.ws);

    double worst = 0;
    int ok = 1, same = 1, guard = 1;
    int64_t inexact = 0;
    for (int k = 0; k < nout; k++) {
        double mx = 0;
        for (int64_t i = 0; i < n[k]; i++) mx = fmax(mx, fabs(ref[k][i]));
        for (int64_t i = 0; i < n[k]; i++) {
            const double g = from_16(st, got[k][i]), d = fabs(g - ref[k][i]);
            const double allowed = ldexp(fabs(ref[k][i]), st == CK_F16 ? -10 : -8) + 1e-5 * mx;
            if (!(d <= allowed)) ok = 0;
            const double rel = d / fmax(fabs(ref[k][i]), 1e-30);
            if (!(rel <= worst)) worst = rel;
            if (t->exact && got[k][i] != to_16(st, ref[k][i])) inexact++;
        }
        same &= memcmp(got[k], got2[k], sizeof(uint16_t) * (size_t)n[k]) == 0;
        guard &= got[k][n[k]] == GUARD && got2[k][n[k]] == GUARD;
    }
    if (inexact) printf("  %lld values not the fp32 kernel's rounded once\n", (long long)inexact), ok = 0;
    if (!same) printf("  two runs differ\n");
    if (!guard) printf("  wrote past the output\n");
    char label[160];
    snprintf(label, sizeof label, "%s%s", t->label, st == CK_F16 ? ", fp16" : "");
    check(label, ok && same && guard, worst);
    for (int j = 0; j < t->nin; j++) free(in32[j]), free(in16[j]);
    for (int k = 0; k < nout; k++) free(ref[k]), free(got[k]), free(got2[k]);
}

int main(void)
{
    int covered[CK_OP_COUNT] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(&cases[i], CK_BF16);
        if (ck_cpu_kernels_f16[cases[i].op]) run_case(&cases[i], CK_F16);
        covered[cases[i].op] = 1;
    }
    for (int op = 1; op < CK_OP_COUNT; op++) {
        const char *name = ck_op_name((enum ck_op)op);
        if (ck_cpu_kernels_bf16[op] && !covered[op]) check(name, 0, 0), printf("  has a bf16 kernel and no case here\n");
        if (ck_cpu_kernels_bf16[op] && !ck_cuda_bf16_op((enum ck_op)op))
            check(name, 0, 0), printf("  a bf16 kernel on the CPU and none on the GPU\n");
        if (ck_cpu_kernels_bf16[op] && !ck_cpu_kernels[op]) check(name, 0, 0), printf("  bf16 kernel without an fp32 one\n");
        if (ck_cpu_kernels_f16[op] && !covered[op]) check(name, 0, 0), printf("  has an fp16 kernel and no case here\n");
        if (ck_cpu_kernels_f16[op] && !ck_cuda_f16_op((enum ck_op)op))
            check(name, 0, 0), printf("  an fp16 kernel on the CPU and none on the GPU\n");
        if (ck_cpu_kernels_f16[op] && !ck_cpu_kernels_bf16[op]) check(name, 0, 0), printf("  fp16 kernel without a bf16 one\n");
        /* the GPU's fp16 ops the CPU lacks are those its bf16 set lacks too (attention) */
        if (ck_cuda_f16_op((enum ck_op)op) && !ck_cpu_kernels_f16[op] && ck_cpu_kernels_bf16[op])
            check(name, 0, 0), printf("  an fp16 kernel on the GPU and none on the CPU, which has a bf16 one\n");
    }
    return checks_done();
}
