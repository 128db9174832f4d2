/* The kernels of an sdxl-tiny training step at the shapes that step runs them
 * (bench/vs_pytorch.sh --kernels builds this against build/libck.a): time per
 * call, median of repeated calls after a warm-up, and GFLOP/s as the planner
 * counts them (ck_op_flops).
 *
 *   vs_pytorch_kernels [FILTER [REPS]]     cases whose name contains FILTER
 *
 * With REPS = 1 it runs each case once after one warm-up call, for instruction
 * counts: valgrind --tool=callgrind --toggle-collect='ck_cpu_*' ... */
#include "cpu/cpu.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_case {
    const char *name;
    enum ck_op op;
    int nin, nout;
    int nd[CK_MAX_IN + CK_MAX_OUT];               /* ranks: inputs, then outputs */
    int64_t shape[CK_MAX_IN + CK_MAX_OUT][4];     /* shapes: inputs, then outputs */
    ck_op_params p;
} bench_case;

#define P(...) {{__VA_ARGS__}, {0}}
/* conv: x, w, b -> y; bwd data: dy, w -> dx; bwd filter: dy, x -> dw, db */
#define CONV(nm, N, C, H, W, O, K, S, PAD)                                                                          \
    {nm " fwd", CK_OP_CONV2D, 3, 1, {4, 4, 1, 4},                                                                  \
     {{N, C, H, W}, {O, C, K, K}, {O}, {N, O, (H + 2 * PAD - K) / S + 1, (W + 2 * PAD - K) / S + 1}},               \
     P(S, S, PAD, PAD)},                                                                                           \
    {nm " bwd_data", CK_OP_CONV2D_BWD_DATA, 2, 1, {4, 4, 4},                                                      \
     {{N, O, (H + 2 * PAD - K) / S + 1, (W + 2 * PAD - K) / S + 1}, {O, C, K, K}, {N, C, H, W}}, P(S, S, PAD, PAD)}, \
    {nm " bwd_filter", CK_OP_CONV2D_BWD_FILTER, 2, 2, {4, 4, 4, 1},                                               \
     {{N, O, (H + 2 * PAD - K) / S + 1, (W + 2 * PAD - K) / S + 1}, {N, C, H, W}, {O, C, K, K}, {O}},               \
     P(S, S, PAD, PAD)}
/* linear x [R, IN] w [OUT, IN] b [OUT]; its backward products dx = dy w, dw = dy^T x */
#define LINEAR(nm, R, IN, OUT)                                                                                     \
    {nm " fwd", CK_OP_LINEAR, 3, 1, {2, 2, 1, 2}, {{R, IN}, {OUT, IN}, {OUT}, {R, OUT}}, P(0)},                    \
    {nm " dx", CK_OP_MATMUL, 2, 1, {2, 2, 2}, {{R, OUT}, {OUT, IN}, {R, IN}}, P(0, 0)},                           \
    {nm " dw", CK_OP_MATMUL, 2, 1, {2, 2, 2}, {{R, OUT}, {R, IN}, {OUT, IN}}, P(1, 0)}
#define ATTN(nm, B, LQ, LK, HD, H)                                                                                 \
    {nm " fwd", CK_OP_ATTENTION, 3, 1, {3, 3, 3, 3}, {{B, LQ, HD}, {B, LK, HD}, {B, LK, HD}, {B, LQ, HD}}, P(H)},  \
    {nm " bwd", CK_OP_ATTENTION_BWD, 4, 3, {3, 3, 3, 3, 3, 3, 3},                                                  \
     {{B, LQ, HD}, {B, LQ, HD}, {B, LK, HD}, {B, LK, HD}, {B, LQ, HD}, {B, LK, HD}, {B, LK, HD}}, P(H)}

static const bench_case cases[] = {
    CONV("conv3x3 2x32x32x32->32", 2, 32, 32, 32, 32, 3, 1, 1),
    CONV("conv3x3 2x96x32x32->32", 2, 96, 32, 32, 32, 3, 1, 1),
    CONV("conv3x3 2x64x16x16->64", 2, 64, 16, 16, 64, 3, 1, 1),
    CONV("conv3x3 2x128x8x8->128", 2, 128, 8, 8, 128, 3, 1, 1),
    CONV("conv3x3 2x256x8x8->128", 2, 256, 8, 8, 128, 3, 1, 1),
    CONV("conv3x3 1x32x64x64->32", 1, 32, 64, 64, 32, 3, 1, 1),
    CONV("conv3x3s2 2x32x32x32->32", 2, 32, 32, 32, 32, 3, 2, 1),
    CONV("conv1x1 2x96x32x32->32", 2, 96, 32, 32, 32, 1, 1, 0),
    LINEAR("linear 128x128->128", 128, 128, 128),
    LINEAR("linear 512x64->64", 512, 64, 64),
    LINEAR("linear 512x64->512", 512, 64, 512),
    LINEAR("linear 128x128->1024", 128, 128, 1024),
    ATTN("attention self 2x256 h2", 2, 256, 256, 64, 2),
    ATTN("attention cross 2x256x77 h2", 2, 256, 77, 64, 2),
    ATTN("attention self 2x64 h4", 2, 64, 64, 128, 4),
    ATTN("attention self 1x1024 h2", 1, 1024, 1024, 64, 2),
    {"group_norm 2x64x16x16", CK_OP_GROUP_NORM, 3, 1, {4, 1, 1, 4}, {{2, 64, 16, 16}, {64}, {64}, {2, 64, 16, 16}},
     {{32}, {1e-5f}}},
    {"group_norm_bwd 2x64x16x16", CK_OP_GROUP_NORM_BWD, 3, 3, {4, 4, 1, 4, 1, 1},
     {{2, 64, 16, 16}, {2, 64, 16, 16}, {64}, {2, 64, 16, 16}, {64}, {64}}, {{32}, {1e-5f}}},
    {"silu 2x32x32x32", CK_OP_SILU, 1, 1, {4, 4}, {{2, 32, 32, 32}, {2, 32, 32, 32}}, P(0)},
    {"silu_bwd 2x32x32x32", CK_OP_SILU_BWD, 2, 1, {4, 4, 4}, {{2, 32, 32, 32}, {2, 32, 32, 32}, {2, 32, 32, 32}},
     P(0)},
    {"layer_norm 512x64", CK_OP_LAYER_NORM, 3, 1, {2, 1, 1, 2}, {{512, 64}, {64}, {64}, {512, 64}}, {{0}, {1e-5f}}},
    {"layer_norm_bwd 512x64", CK_OP_LAYER_NORM_BWD, 3, 3, {2, 2, 1, 2, 1, 1},
     {{512, 64}, {512, 64}, {64}, {512, 64}, {64}, {64}}, {{0}, {1e-5f}}},
    {"geglu 512x512", CK_OP_GEGLU, 1, 1, {2, 2}, {{512, 512}, {512, 256}}, P(0)},
    {"geglu_bwd 512x512", CK_OP_GEGLU_BWD, 2, 1, {2, 2, 2}, {{512, 256}, {512, 512}, {512, 512}}, P(0)},
    {"add 2x32x32x32 + 2x32x1x1", CK_OP_ADD, 2, 1, {4, 4, 4}, {{2, 32, 32, 32}, {2, 32, 1, 1}, {2, 32, 32, 32}}, P(0)},
    {"reduce_to 512x64 -> 64", CK_OP_REDUCE_TO, 1, 1, {2, 1}, {{512, 64}, {64}}, P(0)},
    {"reduce_to 256x1024 -> 1024", CK_OP_REDUCE_TO, 1, 1, {2, 1}, {{256, 1024}, {1024}}, P(0)},
    {"reduce_to 1024x64 -> 64", CK_OP_REDUCE_TO, 1, 1, {2, 1}, {{1024, 64}, {64}}, P(0)},
    {"adamw 32x32x3x3", CK_OP_ADAMW_STEP, 4, 3, {1, 1, 1, 1, 1, 1, 1},
     {{9216}, {9216}, {9216}, {9216}, {9216}, {9216}, {9216}}, {{0}, {0.9f, 0.999f, 1e-8f, 1e-2f, 0, 1}}},
    {"adamw 1M", CK_OP_ADAMW_STEP, 4, 3, {1, 1, 1, 1, 1, 1, 1},
     {{1 << 20}, {1 << 20}, {1 << 20}, {1 << 20}, {1 << 20}, {1 << 20}, {1 << 20}}, {{0}, {0.9f, 0.999f, 1e-8f, 1e-2f, 0, 1}}},
};

static float *randn(int64_t n, unsigned seed)
{
    float *x = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return x;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *filter = argc > 1 ? argv[1] : "";
    const int reps = argc > 2 ? atoi(argv[2]) : 41;
    const int nt = ck_cpu_threads();
    double *t = malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
    printf("| kernel (threads %d) | us per call | GFLOP/s |\n|---|---|---|\n", nt);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const bench_case *k = &cases[c];
        if (!strstr(k->name, filter)) continue;
        ck_view in[CK_MAX_IN], out[CK_MAX_OUT];
        ck_shape sin[CK_MAX_IN], sout[CK_MAX_OUT];
        for (int j = 0; j < k->nin + k->nout; j++) {
            ck_view *v = j < k->nin ? &in[j] : &out[j - k->nin];
            ck_shape *s = j < k->nin ? &sin[j] : &sout[j - k->nin];
            v->ndim = s->ndim = k->nd[j];
            for (int d = 0; d < k->nd[j]; d++) v->shape[d] = s->d[d] = k->shape[j][d];
            if (k->op == CK_OP_ADAMW_STEP && j >= k->nin) /* in place: param, m, v */
                v->data = in[j == k->nin ? 0 : j - k->nin + 1].data;
            else
                v->data = randn(ck_view_numel(v), 17u + (unsigned)j);
        }
        if (k->op == CK_OP_ADAMW_STEP) /* the second moment is non-negative */
            for (int64_t i = 0; i < ck_view_numel(&in[3]); i++) in[3].data[i] *= in[3].data[i];
        const size_t ws = ck_op_workspace(k->op, &k->p, sin, k->nin, sout, nt);
        ck_kctx ctx = {1, 1, 1e-4f, ws ? aligned_alloc(64, (ws + 63) / 64 * 64) : NULL, ws, 1, 0};
        const double flops = ck_op_flops(k->op, &k->p, sin, k->nin, sout);
        ck_cpu_kernels[k->op](&ctx, &k->p, out, k->nout, in, k->nin); /* warm-up */
        for (int r = 0; r < reps; r++) {
            const double t0 = omp_get_wtime();
            ck_cpu_kernels[k->op](&ctx, &k->p, out, k->nout, in, k->nin);
            t[r] = omp_get_wtime() - t0;
        }
        qsort(t, (size_t)reps, sizeof t[0], cmp);
        const double med = t[reps / 2];
        printf("| %s | %.1f | %.1f |\n", k->name, med * 1e6, flops / med * 1e-9);
        for (int j = 0; j < k->nin; j++) free(in[j].data);
        for (int j = 0; j < k->nout; j++)
            if (k->op != CK_OP_ADAMW_STEP) free(out[j].data);
        free(ctx.ws);
    }
    free(t);
    return 0;
}
