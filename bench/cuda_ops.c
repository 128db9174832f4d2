/* Times the UNet's heaviest ops on the CUDA backend at two scales: sdxl-tiny
 * with 64x64 latents and full SDXL at 1024x1024 (128x128 latents), batch 1,
 * fp32, deterministic algorithms (the defaults), and attention again with
 * bf16 storage (the tensor-core kernels) at SDXL's two self-attention sizes;
 * and Flux.1's block ops at 1024x1024 ("flux": mostly bf16 storage).
 * One JSON object per line on stdout, which bench/cuda_ops_torch.py reads to
 * time the same ops in PyTorch:
 *
 *   build/bench_cuda_ops [--reps N] [--only tiny|full|flux] > out/cuda_ops.jsonl
 *
 * Each op runs on random inputs with the workspace a GPU plan gives it
 * (ck_cuda_workspace: for a convolution, the algorithm chosen for its shape), twice to warm up, then N times
 * (default 20) between two syncs; the figure is wall time over N, launch overhead included.
 * Memory-bound ops (norms, activations, add, permute, upsample, the optimizer
 * update) also report "bytes": every input read once and every output written
 * once, the least an op can move, and "gbs", those bytes over the time, to set
 * beside the device's memory bandwidth (the H200's 4.8 TB/s). */
#include "cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bcase {
    const char *scale, *label;
    enum ck_op op;
    ck_op_params p;
    int nin;
    ck_shape in[CK_MAX_IN];
    ck_shape preset[CK_MAX_OUT];
    int mem; /* memory-bound: report bytes and GB/s */
    unsigned alias; /* bit k: output k updates an input in place (AdamW: param, m, v are inputs 0, 2, 3) */
    int bf16; /* every tensor in bf16 storage (ck_cuda_kernels_bf16), but ck_op_f32_inputs' (rope's table) */
    unsigned unwanted; /* bit k: output k not wanted (as autodiff leaves a norm's parameter gradients it has none of) */
} bcase;

#define SH(...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}}
#define CONV3 {.i = {1, 1, 1, 1}}
#define GN {.i = {32}, .f = {1e-5f}}
#define LN {.i = {0}, .f = {1e-5f}}
#define NOP {.i = {0}}
/* AdamW as ckrun's optimizer runs it: beta1, beta2, eps, weight decay, lr multiplier */
#define ADAMW {.i = {0}, .f = {0.9f, 0.999f, 1e-8f, 1e-2f, 0.0f, 1.0f}}
/* a forward conv and its two backward ops: x (1,C,S,S), w (C,C,3,3) */
#define CONV(scale, label, C, S)                                                                                     \
    {scale, label, CK_OP_CONV2D, CONV3, 3, .in = {SH(1, C, S, S), SH(C, C, 3, 3), SH(C)}},                           \
        {scale, label, CK_OP_CONV2D_BWD_DATA, CONV3, 2, .in = {SH(1, C, S, S), SH(C, C, 3, 3)},                      \
         .preset = {SH(1, C, S, S)}},                                                                                \
        {scale, label, CK_OP_CONV2D_BWD_FILTER, CONV3, 2, .in = {SH(1, C, S, S), SH(1, C, S, S)},                    \
         .preset = {SH(C, C, 3, 3)}}
/* attention and its backward: q (1,LQ,HD), k and v (1,LK,HD), H heads */
#define ATTN(scale, label, LQ, LK, HD, H)                                                                            \
    {scale, label, CK_OP_ATTENTION, {.i = {H}}, 3, .in = {SH(1, LQ, HD), SH(1, LK, HD), SH(1, LK, HD)}},             \
        {scale, label, CK_OP_ATTENTION_BWD, {.i = {H}}, 4,                                                           \
         .in = {SH(1, LQ, HD), SH(1, LQ, HD), SH(1, LK, HD), SH(1, LK, HD)}}

/* the same with every tensor in bf16 */
#define ATTN_BF16(scale, label, LQ, LK, HD, H)                                                                       \
    {scale, label, CK_OP_ATTENTION, {.i = {H}}, 3, .in = {SH(1, LQ, HD), SH(1, LK, HD), SH(1, LK, HD)}, .bf16 = 1},  \
        {scale, label, CK_OP_ATTENTION_BWD, {.i = {H}}, 4,                                                           \
         .in = {SH(1, LQ, HD), SH(1, LQ, HD), SH(1, LK, HD), SH(1, LK, HD)}, .bf16 = 1}

/* Flux.1-dev at 1024x1024, batch 1: 512 text and 4096 image tokens (4608 in the
 * joint sequence), hidden 3072 = 24 heads of 128; T5-XXL's rows of 4096 */
#define FLUX_L 4608
#define FLUX_C 3072
#define RMS {.i = {0}, .f = {1e-6f}}

/* The shapes of one resnet (GroupNorm, SiLU, 3x3 conv) and one transformer block
 * (LayerNorm, self and cross attention, projections, GEGLU feed-forward) at the
 * levels that cost the most. */
static const bcase cases[] = {
    /* sdxl-tiny, 64x64 latents: channels 32/64/128, heads 1/2/4 of 32, context 77 x 64 */
    CONV("tiny", "conv 32->32 3x3 @64x64", 32, 64),
    CONV("tiny", "conv 64->64 3x3 @32x32", 64, 32),
    {"tiny", "group_norm 32 @64x64", CK_OP_GROUP_NORM, GN, 3, .in = {SH(1, 32, 64, 64), SH(32), SH(32)}, .mem = 1},
    {"tiny", "group_norm 32 @64x64", CK_OP_GROUP_NORM_BWD, GN, 3, .in = {SH(1, 32, 64, 64), SH(1, 32, 64, 64), SH(32)},
     .mem = 1},
    {"tiny", "silu 32 @64x64", CK_OP_SILU, NOP, 1, .in = {SH(1, 32, 64, 64)}, .mem = 1},
    {"tiny", "group_norm_silu 32 @64x64", CK_OP_GROUP_NORM_SILU, GN, 3, .in = {SH(1, 32, 64, 64), SH(32), SH(32)},
     .mem = 1},
    {"tiny", "group_norm_silu 32 @64x64", CK_OP_GROUP_NORM_SILU_BWD, GN, 4,
     .in = {SH(1, 32, 64, 64), SH(1, 32, 64, 64), SH(32), SH(32)}, .mem = 1},
    ATTN("tiny", "self attention L1024 2x32", 1024, 1024, 64, 2),
    ATTN("tiny", "cross attention L1024x77 2x32", 1024, 77, 64, 2),
    {"tiny", "to_q 1024x64 -> 64", CK_OP_LINEAR, NOP, 2, .in = {SH(1, 1024, 64), SH(64, 64)}},
    {"tiny", "ff proj 1024x64 -> 512", CK_OP_LINEAR, NOP, 3, .in = {SH(1, 1024, 64), SH(512, 64), SH(512)}},
    {"tiny", "layer_norm 1024x64", CK_OP_LAYER_NORM, LN, 3, .in = {SH(1, 1024, 64), SH(64), SH(64)}, .mem = 1},
    {"tiny", "layer_norm 1024x64", CK_OP_LAYER_NORM_BWD, LN, 3, .in = {SH(1, 1024, 64), SH(1, 1024, 64), SH(64)},
     .mem = 1},
    {"tiny", "geglu 1024x512", CK_OP_GEGLU, NOP, 1, .in = {SH(1, 1024, 512)}, .mem = 1},
    {"tiny", "geglu 1024x512", CK_OP_GEGLU_BWD, NOP, 2, .in = {SH(1, 1024, 256), SH(1, 1024, 512)}, .mem = 1},
    {"tiny", "residual add 32 @64x64", CK_OP_ADD, NOP, 2, .in = {SH(1, 32, 64, 64), SH(1, 32, 64, 64)}, .mem = 1},
    /* SDXL at 1024x1024: channels 320/640/1280, heads 5/10/20 of 64, context 77 x 2048 */
    CONV("full", "conv 320->320 3x3 @128x128", 320, 128),
    CONV("full", "conv 640->640 3x3 @64x64", 640, 64),
    CONV("full", "conv 1280->1280 3x3 @32x32", 1280, 32),
    {"full", "group_norm 320 @128x128", CK_OP_GROUP_NORM, GN, 3, .in = {SH(1, 320, 128, 128), SH(320), SH(320)},
     .mem = 1},
    {"full", "group_norm 320 @128x128", CK_OP_GROUP_NORM_BWD, GN, 3,
     .in = {SH(1, 320, 128, 128), SH(1, 320, 128, 128), SH(320)}, .mem = 1},
    {"full", "silu 320 @128x128", CK_OP_SILU, NOP, 1, .in = {SH(1, 320, 128, 128)}, .mem = 1},
    {"full", "group_norm_silu 320 @128x128", CK_OP_GROUP_NORM_SILU, GN, 3,
     .in = {SH(1, 320, 128, 128), SH(320), SH(320)}, .mem = 1},
    {"full", "group_norm_silu 320 @128x128", CK_OP_GROUP_NORM_SILU_BWD, GN, 4,
     .in = {SH(1, 320, 128, 128), SH(1, 320, 128, 128), SH(320), SH(320)}, .mem = 1},
    {"full", "group_norm_silu 1280 @32x32", CK_OP_GROUP_NORM_SILU, GN, 3, .in = {SH(1, 1280, 32, 32), SH(1280), SH(1280)},
     .mem = 1},
    {"full", "group_norm_silu 1280 @32x32", CK_OP_GROUP_NORM_SILU_BWD, GN, 4,
     .in = {SH(1, 1280, 32, 32), SH(1, 1280, 32, 32), SH(1280), SH(1280)}, .mem = 1},
    {"full", "residual add 320 @128x128", CK_OP_ADD, NOP, 2, .in = {SH(1, 320, 128, 128), SH(1, 320, 128, 128)},
     .mem = 1},
    ATTN("full", "self attention L4096 10x64", 4096, 4096, 640, 10),
    ATTN("full", "cross attention L4096x77 10x64", 4096, 77, 640, 10),
    ATTN("full", "self attention L1024 20x64", 1024, 1024, 1280, 20),
    ATTN_BF16("full", "self attention L4096 10x64 bf16", 4096, 4096, 640, 10),
    ATTN_BF16("full", "self attention L1024 20x64 bf16", 1024, 1024, 1280, 20),
    {"full", "to_q 4096x640 -> 640", CK_OP_LINEAR, NOP, 2, .in = {SH(1, 4096, 640), SH(640, 640)}},
    {"full", "to_k 77x2048 -> 640", CK_OP_LINEAR, NOP, 2, .in = {SH(1, 77, 2048), SH(640, 2048)}},
    {"full", "ff proj 4096x640 -> 5120", CK_OP_LINEAR, NOP, 3, .in = {SH(1, 4096, 640), SH(5120, 640), SH(5120)}},
    {"full", "ff out 4096x2560 -> 640", CK_OP_LINEAR, NOP, 3, .in = {SH(1, 4096, 2560), SH(640, 2560), SH(640)}},
    {"full", "dW of ff proj (5120x640 over 4096)", CK_OP_MATMUL, {.i = {1, 0}}, 2, .in = {SH(4096, 5120), SH(4096, 640)}},
    {"full", "layer_norm 4096x640", CK_OP_LAYER_NORM, LN, 3, .in = {SH(1, 4096, 640), SH(640), SH(640)}, .mem = 1},
    {"full", "layer_norm 4096x640", CK_OP_LAYER_NORM_BWD, LN, 3, .in = {SH(1, 4096, 640), SH(1, 4096, 640), SH(640)},
     .mem = 1},
    /* the transformer's norms in bf16 storage (a frozen-weight mixed-precision run): half the bytes */
    {"full", "layer_norm 4096x640 bf16", CK_OP_LAYER_NORM, LN, 3, .in = {SH(1, 4096, 640), SH(640), SH(640)}, .mem = 1,
     .bf16 = 1},
    {"full", "layer_norm 4096x640 bf16", CK_OP_LAYER_NORM_BWD, LN, 3,
     .in = {SH(1, 4096, 640), SH(1, 4096, 640), SH(640)}, .mem = 1, .bf16 = 1},
    {"full", "group_norm 640 @64x64", CK_OP_GROUP_NORM, GN, 3, .in = {SH(1, 640, 64, 64), SH(640), SH(640)}, .mem = 1},
    {"full", "group_norm 640 @64x64", CK_OP_GROUP_NORM_BWD, GN, 3,
     .in = {SH(1, 640, 64, 64), SH(1, 640, 64, 64), SH(640)}, .mem = 1},
    {"full", "group_norm 640 @64x64 bf16", CK_OP_GROUP_NORM, GN, 3, .in = {SH(1, 640, 64, 64), SH(640), SH(640)},
     .mem = 1, .bf16 = 1},
    {"full", "group_norm 640 @64x64 bf16", CK_OP_GROUP_NORM_BWD, GN, 3,
     .in = {SH(1, 640, 64, 64), SH(1, 640, 64, 64), SH(640)}, .mem = 1, .bf16 = 1},
    {"full", "geglu 4096x5120", CK_OP_GEGLU, NOP, 1, .in = {SH(1, 4096, 5120)}, .mem = 1},
    {"full", "geglu 4096x5120", CK_OP_GEGLU_BWD, NOP, 2, .in = {SH(1, 4096, 2560), SH(1, 4096, 5120)}, .mem = 1},
    /* the feed-forward's product and GEGLU in bf16: apart, and as LINEAR_GEGLU (h in 16 MiB slices) */
    {"full", "ff proj 4096x640 -> 5120 bf16", CK_OP_LINEAR, NOP, 3, .in = {SH(1, 4096, 640), SH(5120, 640), SH(5120)},
     .bf16 = 1},
    {"full", "geglu 4096x5120 bf16", CK_OP_GEGLU, NOP, 1, .in = {SH(1, 4096, 5120)}, .mem = 1, .bf16 = 1},
    {"full", "ff proj + geglu 4096x640 -> 2560 bf16", CK_OP_LINEAR_GEGLU, NOP, 3,
     .in = {SH(1, 4096, 640), SH(5120, 640), SH(5120)}, .bf16 = 1},
    {"full", "ff proj + geglu 1024x1280 -> 5120 bf16", CK_OP_LINEAR_GEGLU, NOP, 3,
     .in = {SH(1, 1024, 1280), SH(10240, 1280), SH(10240)}, .bf16 = 1},
    /* a transformer's NCHW -> tokens permute (the tiled transpose), fp32 and bf16,
     * and an up block's nearest 2x upsample in bf16 */
    {"full", "permute 640 @64x64 -> tokens", CK_OP_PERMUTE, {.i = {0, 2, 3, 1}}, 1, .in = {SH(1, 640, 64, 64)},
     .mem = 1},
    {"full", "permute 640 @64x64 -> tokens bf16", CK_OP_PERMUTE, {.i = {0, 2, 3, 1}}, 1, .in = {SH(1, 640, 64, 64)},
     .mem = 1, .bf16 = 1},
    {"full", "upsample2x 1280 @32x32 bf16", CK_OP_UPSAMPLE2X, NOP, 1, .in = {SH(1, 1280, 32, 32)}, .mem = 1, .bf16 = 1},
    /* Flux.1's block ops in bf16 (and the norms in fp32 too): LayerNorm without affine, adaLN's modulate
     * and gate, the q/k RMSNorm over the head dim, rope on q [1,L,H*D] with its fp32 table, the joint
     * attention at head dim 128; T5's RMSNorm over d_model */
    {"flux", "layer_norm no affine 4608x3072", CK_OP_LAYER_NORM, RMS, 1, .in = {SH(1, FLUX_L, FLUX_C)}, .mem = 1},
    {"flux", "layer_norm no affine 4608x3072", CK_OP_LAYER_NORM_BWD, RMS, 2,
     .in = {SH(1, FLUX_L, FLUX_C), SH(1, FLUX_L, FLUX_C)}, .mem = 1, .unwanted = 6},
    {"flux", "layer_norm no affine 4608x3072 bf16", CK_OP_LAYER_NORM, RMS, 1, .in = {SH(1, FLUX_L, FLUX_C)}, .mem = 1,
     .bf16 = 1},
    {"flux", "layer_norm no affine 4608x3072 bf16", CK_OP_LAYER_NORM_BWD, RMS, 2,
     .in = {SH(1, FLUX_L, FLUX_C), SH(1, FLUX_L, FLUX_C)}, .mem = 1, .bf16 = 1, .unwanted = 6},
    {"flux", "modulate 4608x3072 bf16", CK_OP_MODULATE, NOP, 3, .in = {SH(1, FLUX_L, FLUX_C), SH(1, FLUX_C), SH(1, FLUX_C)},
     .mem = 1, .bf16 = 1},
    {"flux", "modulate 4608x3072 bf16", CK_OP_MODULATE_BWD, NOP, 3,
     .in = {SH(1, FLUX_L, FLUX_C), SH(1, FLUX_L, FLUX_C), SH(1, FLUX_C)}, .mem = 1, .bf16 = 1},
    {"flux", "gate 4608x3072 bf16", CK_OP_GATE, NOP, 3, .in = {SH(1, FLUX_L, FLUX_C), SH(1, FLUX_C), SH(1, FLUX_L, FLUX_C)},
     .mem = 1, .bf16 = 1},
    {"flux", "gate 4608x3072 bf16", CK_OP_GATE_BWD, NOP, 3,
     .in = {SH(1, FLUX_L, FLUX_C), SH(1, FLUX_C), SH(1, FLUX_L, FLUX_C)}, .mem = 1, .bf16 = 1},
    {"flux", "q/k rms_norm 4608x24x128", CK_OP_RMS_NORM, RMS, 2, .in = {SH(1, FLUX_L, 24, 128), SH(128)}, .mem = 1},
    {"flux", "q/k rms_norm 4608x24x128", CK_OP_RMS_NORM_BWD, RMS, 3,
     .in = {SH(1, FLUX_L, 24, 128), SH(1, FLUX_L, 24, 128), SH(128)}, .mem = 1},
    {"flux", "q/k rms_norm 4608x24x128 bf16", CK_OP_RMS_NORM, RMS, 2, .in = {SH(1, FLUX_L, 24, 128), SH(128)}, .mem = 1,
     .bf16 = 1},
    {"flux", "q/k rms_norm 4608x24x128 bf16", CK_OP_RMS_NORM_BWD, RMS, 3,
     .in = {SH(1, FLUX_L, 24, 128), SH(1, FLUX_L, 24, 128), SH(128)}, .mem = 1, .bf16 = 1},
    {"flux", "rope 4608x24x128", CK_OP_ROPE, NOP, 2, .in = {SH(1, FLUX_L, FLUX_C), SH(FLUX_L, 128)}, .mem = 1},
    {"flux", "rope 4608x24x128 bf16", CK_OP_ROPE, NOP, 2, .in = {SH(1, FLUX_L, FLUX_C), SH(FLUX_L, 128)}, .mem = 1,
     .bf16 = 1},
    ATTN_BF16("flux", "joint attention L4608 24x128 bf16", FLUX_L, FLUX_L, FLUX_C, 24),
    {"flux", "T5 rms_norm 512x4096 bf16", CK_OP_RMS_NORM, RMS, 2, .in = {SH(1, 512, 4096), SH(4096)}, .mem = 1, .bf16 = 1},
    {"flux", "T5 rms_norm 512x4096 bf16", CK_OP_RMS_NORM_BWD, RMS, 3, .in = {SH(1, 512, 4096), SH(1, 512, 4096), SH(4096)},
     .mem = 1, .bf16 = 1},
    /* an AdamW update of 64M parameters (SDXL's 2.6B in 40 such calls): p, g, m, v read, p, m, v written */
    {"full", "adamw_step 64M", CK_OP_ADAMW_STEP, ADAMW, 4, .in = {SH(1 << 26), SH(1 << 26), SH(1 << 26), SH(1 << 26)},
     .mem = 1, .alias = 7},
};


/* round to nearest even, as the backend's conversion does */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void print_shape(const ck_shape *s)
{
    printf("[");
    for (int d = 0; d < s->ndim; d++) printf(d ? ",%lld" : "%lld", (long long)s->d[d]);
    printf("]");
}

int main(int argc, char **argv)
{
    int reps = 20;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--reps N] [--only tiny|full|flux]\n", argv[0]);
            return 2;
        }
    }
    if (ck_cuda_device_count() == 0) {
        fprintf(stderr, "bench_cuda_ops: no CUDA device\n");
        return 1;
    }
    ck_cuda_ctx *c = ck_cuda_open(0);
    if (!c) {
        fprintf(stderr, "bench_cuda_ops: %s\n", ck_cuda_last_error());
        return 1;
    }
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bcase *b = &cases[i];
        if (only && strcmp(only, b->scale)) continue;
        char err[256];
        const int nout = ck_op_nout(b->op);
        ck_shape out[CK_MAX_OUT];
        memset(out, 0, sizeof out);
        for (int k = 0; k < nout; k++) out[k] = b->preset[k];
        if (ck_op_infer(b->op, &b->p, b->in, b->nin, out, err, sizeof err)) {
            fprintf(stderr, "bench_cuda_ops: %s: %s\n", b->label, err);
            return 1;
        }
        ck_view vin[CK_MAX_IN], vout[CK_MAX_OUT];
        memset(vin, 0, sizeof vin);
        memset(vout, 0, sizeof vout);
        size_t esz[CK_MAX_IN];
        for (int j = 0; j < b->nin; j++) esz[j] = b->bf16 && !(ck_op_f32_inputs(b->op) >> j & 1) ? 2 : 4;
        const size_t es = b->bf16 ? 2 : 4;
        for (int j = 0; j < b->nin; j++) {
            const int64_t n = ck_shape_numel(&b->in[j]);
            const size_t ies = esz[j];
            float *h = malloc(sizeof(float) * (size_t)n);
            uint16_t *h16 = malloc(sizeof(uint16_t) * (size_t)n);
            uint64_t s = 0x9E3779B97F4A7C15ull + (uint64_t)j;
            for (int64_t e = 0; e < n; e++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                h[e] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
                h16[e] = to_bf16(h[e]);
            }
            vin[j].data = ck_cuda_alloc(ies * (size_t)n);
            ck_cuda_upload(vin[j].data, ies == 2 ? (const void *)h16 : (const void *)h, ies * (size_t)n);
            free(h), free(h16);
            vin[j].ndim = b->in[j].ndim;
            memcpy(vin[j].shape, b->in[j].d, sizeof b->in[j].d);
        }
        /* in-place updates (the optimizers): output k is input 0, 2, 3 (param, m, v) */
        static const int adamw_in[CK_MAX_OUT] = {0, 2, 3};
        size_t bytes = 0;
        for (int j = 0; j < b->nin; j++) bytes += esz[j] * (size_t)ck_shape_numel(&b->in[j]);
        for (int k = 0; k < nout; k++) {
            vout[k].ndim = out[k].ndim;
            memcpy(vout[k].shape, out[k].d, sizeof out[k].d);
            if (b->unwanted >> k & 1) continue;
            bytes += es * (size_t)ck_shape_numel(&out[k]);
            vout[k].data = b->alias >> k & 1 ? vin[adamw_in[k]].data
                                             : ck_cuda_alloc(es * (size_t)ck_shape_numel(&out[k]));
        }
        const size_t ws = ck_cuda_workspace(b->op, &b->p, b->in, b->nin, out, b->bf16 ? CK_BF16 : CK_F32);
        ck_kctx kctx = {1, 1, 1e-4f, ws ? ck_cuda_alloc(ws) : NULL, ws, 1, 0};
        const ck_kernel_fn run = (b->bf16 ? ck_cuda_kernels_bf16 : ck_cuda_kernels)[b->op];
        double ms = -1;
        for (int r = 0; r < 2; r++) run(&kctx, &b->p, vout, nout, vin, b->nin);
        if (!ck_cuda_failed() && !ck_cuda_sync()) {
            const double t0 = now();
            for (int r = 0; r < reps; r++) run(&kctx, &b->p, vout, nout, vin, b->nin);
            if (!ck_cuda_sync()) ms = (now() - t0) * 1e3 / reps;
        }
        const double flops = ck_op_flops(b->op, &b->p, b->in, b->nin, out);
        printf("{\"scale\": \"%s\", \"label\": \"%s\", \"op\": \"%s\", \"dtype\": \"%s\", \"i\": [", b->scale,
               b->label, ck_op_name(b->op), b->bf16 ? "bf16" : "fp32");
        for (int k = 0; k < 8; k++) printf(k ? ", %lld" : "%lld", (long long)b->p.i[k]);
        printf("], \"f\": [%g, %g, %g, %g], \"in\": [", b->p.f[0], b->p.f[1], b->p.f[2], b->p.f[3]);
        for (int j = 0; j < b->nin; j++) {
            if (j) printf(", ");
            print_shape(&b->in[j]);
        }
        printf("], \"out\": [");
        for (int k = 0; k < nout; k++) {
            if (k) printf(", ");
            print_shape(&out[k]);
        }
        printf("], \"workspace_bytes\": %zu, \"flops\": %.0f, \"ms\": %.4f", ws, flops, ms);
        if (b->mem) printf(", \"bytes\": %zu, \"gbs\": %.1f", bytes, ms > 0 ? (double)bytes / (ms * 1e6) : -1.0);
        if (ms < 0) {
            printf(", \"error\": \"%s\"", ck_cuda_last_error());
            ck_cuda_clear_error();
            failures++;
        }
        printf("}\n");
        fflush(stdout);
        for (int j = 0; j < b->nin; j++) ck_cuda_free(vin[j].data);
        for (int k = 0; k < nout; k++)
            if (!(b->alias >> k & 1) && vout[k].data) ck_cuda_free(vout[k].data);
        ck_cuda_free(kctx.ws);
    }
    ck_cuda_close(c);
    return failures ? 1 : 0;
}
