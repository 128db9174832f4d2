/* Every op forward and backward on both backends, on the same random inputs
 * (odd sizes included), compared: the CUDA results are copied back
 * (ck_cuda_download, a cudaMemcpy) and must agree with the CPU kernels, which
 * are the reference. Also: the CUDA kernels fit the workspace a GPU plan gives
 * them (ck_cuda_workspace, the backend's rule), never write past their
 * outputs, give bitwise the same result when run twice, and name the op when
 * they fail.
 *
 * Tolerance: max |gpu - cpu| <= tol * max |cpu| over each output. fp32 ops
 * 1e-4 (the bound); data movement, dropout (the same counter-based
 * mask), fill and plain arithmetic 0 or 1e-6 (the same float operations, at
 * most an FMA apart). TF32 cases 1e-2 (10 mantissa bits); bf16 and fp16
 * storage 1e-2 (the output's own rounding is 2^-9, 2^-11), against the CPU fed
 * the same rounded inputs, and 2^-8 where the fp32 case is exact (copies,
 * fill, scale, the upsample's window sums: the output's rounding only).
 *
 * Built three ways: against ck_cuda (CK_HAVE_CUDA; skipped, exit 77, without
 * a device), against the CPU emulator of tests/cuda_emu (CK_CUDA_EMU; small
 * shapes unless CK_TEST_BIG=1), or without either (skipped). */
#include "cpu/cpu.h"
#include "fp16.h"
#include "fp8.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(CK_HAVE_CUDA) || defined(CK_CUDA_EMU)
#include "cuda/cuda.h"

#define POISON 777.0f

enum fill_kind { UNIFORM = 0, POSITIVE, TIMESTEPS, WIDE, BYTES, IDS };

typedef struct tcase {
    const char *label;
    enum ck_op op;
    ck_op_params p;
    int nin;
    ck_shape in[CK_MAX_IN];
    ck_shape preset[CK_MAX_OUT]; /* output shapes the caller sets (reshape, reduce_to, ...) */
    unsigned unwanted;           /* bit k: output k not wanted */
    int kind[CK_MAX_IN];
    double tol;
    int alias[CK_MAX_OUT]; /* in-place optimizers: output k is input alias[k]-1 (0: its own buffer) */
    int big;               /* device only: too slow for the emulator */
    unsigned bytes;        /* bit k: output k holds bytes (8-bit codes), each within 1 of the CPU's */
    int bf16_only;         /* bf16 storage only: the fp32 kernels have cases of their own */
} tcase;

static int passed, failed, skipped;
/* CK_TEST_MATCH=a|b: only the cases whose label contains a or b */
static const char *match;

static int selected(const char *label)
{
    if (!match || !*match) return 1;
    const char *m = match;
    while (*m) {
        const char *e = strchr(m, '|');
        const size_t n = e ? (size_t)(e - m) : strlen(m);
        for (const char *l = label; *l; l++)
            if (n && strncmp(l, m, n) == 0) return 1;
        if (!e) break;
        m = e + 1;
    }
    return 0;
}

static void report(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s: ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    ok ? passed++ : failed++;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill(float *x, int64_t n, int kind)
{
    if (kind == BYTES) { /* n random bytes at the buffer's start (a CK_U8 tensor) */
        for (int64_t i = 0; i < n; i++) ((uint8_t *)x)[i] = (uint8_t)(255.0f * fabsf(frand()));
        return;
    }
    if (kind == IDS) { /* token ids: whole numbers 0 to 15 (tables of 16 rows or more) */
        for (int64_t i = 0; i < n; i++) {
            const int id = (int)((frand() + 1.0f) * 8.0f);
            x[i] = (float)(id > 15 ? 15 : id);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const float u = frand();
        x[i] = kind == POSITIVE ? fabsf(u) * 0.01f : kind == TIMESTEPS ? (u + 1.0f) * 499.5f : kind == WIDE ? 4.0f * u : u;
    }
}

static ck_view view(float *data, const ck_shape *s)
{
    ck_view v;
    memset(&v, 0, sizeof v);
    v.data = data, v.ndim = s->ndim;
    for (int d = 0; d < s->ndim; d++) v.shape[d] = s->d[d];
    return v;
}

/* bf16 storage: round to nearest even, and back */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n elements of storage st (fp32, bf16 or fp16) on the device, then GUARD_BYTES of 0xA5 */
#define GUARD_BYTES 64
static uint16_t to_16(ck_dtype st, float f) { return st == CK_F16 ? ck_f16_from_f32(f) : to_bf16(f); }
static float from_16(ck_dtype st, uint16_t h) { return st == CK_F16 ? ck_f32_from_f16(h) : from_bf16(h); }
static void upload(void *d, const float *h, int64_t n, ck_dtype st)
{
    if (st == CK_F32) {
        ck_cuda_upload(d, h, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) b[i] = to_16(st, h[i]);
    ck_cuda_upload(d, b, sizeof(uint16_t) * (size_t)n);
    free(b);
}
static void download(float *h, const void *d, int64_t n, ck_dtype st)
{
    if (st == CK_F32) {
        ck_cuda_download(h, d, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n + 1));
    ck_cuda_download(b, d, sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) h[i] = from_16(st, b[i]);
    free(b);
}
static float *dev_alloc(int64_t n, ck_dtype st)
{
    const size_t bytes = (size_t)n * ck_dtype_bytes(st);
    float *d = ck_cuda_alloc(bytes + GUARD_BYTES);
    float *h = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) h[i] = POISON;
    upload(d, h, n, st);
    free(h);
    unsigned char g[GUARD_BYTES];
    memset(g, 0xA5, sizeof g);
    ck_cuda_upload((char *)d + bytes, g, sizeof g);
    return d;
}
static int dev_guard_ok(const float *d, int64_t n, ck_dtype st)
{
    unsigned char g[GUARD_BYTES];
    ck_cuda_download(g, (const char *)d + (size_t)n * ck_dtype_bytes(st), sizeof g);
    for (int i = 0; i < GUARD_BYTES; i++)
        if (g[i] != 0xA5) return 0;
    return 1;
}

static double rel_err(const float *got, const float *ref, int64_t n)
{
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e)) e = d; /* NaN propagates */
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
    }
    return m > 0 ? e / m : e;
}

static const ck_kctx base_ctx = {42, 3, 1e-3f, NULL, 0, 3, 0};

/* Runs one case on both backends and reports. st CK_BF16 or CK_F16: every
 * tensor in that storage on the device (ck_cuda_kernels_bf16, _f16), the CPU
 * fed the same rounded inputs. */
/* the convolutions' workspace cut to this many im2col columns (0: the rule's) */
static int columns_only;
/* 1: cuDNN's heuristic (fastest) algorithms, which need not repeat bitwise */
static int nondeterministic;

static void run_case(const tcase *t, ck_dtype st)
{
    if (!selected(t->label)) return;
    const ck_kernel_fn *table = st == CK_BF16 ? ck_cuda_kernels_bf16 : st == CK_F16 ? ck_cuda_kernels_f16 : ck_cuda_kernels;
    char err[256];
    const enum ck_op op = t->op;
    const int nin = t->nin, nout = ck_op_nout(op);
    ck_shape out[CK_MAX_OUT];
    memset(out, 0, sizeof out);
    for (int k = 0; k < nout; k++) out[k] = t->preset[k];
    if (ck_op_infer(op, &t->p, t->in, nin, out, err, sizeof err)) {
        report(0, "%s: bad test shapes: %s", t->label, err);
        return;
    }
    int64_t nin_el[CK_MAX_IN], nout_el[CK_MAX_OUT];
    float *hin[CK_MAX_IN] = {0}, *cpu_in[CK_MAX_IN] = {0}, *din[CK_MAX_IN] = {0};
    float *cpu_out[CK_MAX_OUT] = {0}, *dout[CK_MAX_OUT] = {0}, *got[CK_MAX_OUT] = {0}, *got2[CK_MAX_OUT] = {0};
    /* the inputs a 16-bit kernel reads in fp32 (rope's table) stay fp32 */
    ck_dtype ist[CK_MAX_IN];
    for (int j = 0; j < nin; j++) {
        ist[j] = ck_op_f32_inputs(op) >> j & 1 ? CK_F32 : st;
        nin_el[j] = ck_shape_numel(&t->in[j]);
        hin[j] = malloc(sizeof(float) * (size_t)(nin_el[j] + 1));
        cpu_in[j] = malloc(sizeof(float) * (size_t)(nin_el[j] + 1));
        fill(hin[j], nin_el[j], t->kind[j]);
        if (ist[j] != CK_F32)
            for (int64_t i = 0; i < nin_el[j]; i++) hin[j][i] = from_16(st, to_16(st, hin[j][i]));
        memcpy(cpu_in[j], hin[j], sizeof(float) * (size_t)nin_el[j]);
        din[j] = dev_alloc(nin_el[j], ist[j]);
        upload(din[j], hin[j], nin_el[j], ist[j]);
    }
    for (int k = 0; k < nout; k++) {
        nout_el[k] = ck_shape_numel(&out[k]);
        got[k] = malloc(sizeof(float) * (size_t)(nout_el[k] + 1));
        got2[k] = malloc(sizeof(float) * (size_t)(nout_el[k] + 1));
        if (t->unwanted >> k & 1) continue;
        if (t->alias[k]) {
            cpu_out[k] = cpu_in[t->alias[k] - 1];
            dout[k] = din[t->alias[k] - 1];
        } else {
            cpu_out[k] = malloc(sizeof(float) * (size_t)(nout_el[k] + 1));
            for (int64_t i = 0; i < nout_el[k]; i++) cpu_out[k][i] = POISON;
            dout[k] = dev_alloc(nout_el[k], st);
        }
    }

    // CPU reference
    const size_t cpu_ws = ck_op_workspace(op, &t->p, t->in, nin, out, ck_cpu_threads());
    void *cws = cpu_ws ? malloc(cpu_ws) : NULL;
    ck_kctx cctx = base_ctx;
    cctx.ws = cws, cctx.ws_bytes = cpu_ws;
    ck_view vin[CK_MAX_IN], vout[CK_MAX_OUT];
    for (int j = 0; j < nin; j++) vin[j] = view(cpu_in[j], &t->in[j]);
    for (int k = 0; k < nout; k++) vout[k] = view(cpu_out[k], &out[k]);
    ck_cpu_kernels[op](&cctx, &t->p, vout, nout, vin, nin);

    // CUDA, with the workspace of a GPU plan (or columns_only columns of a convolution)
    size_t gws = ck_cuda_workspace(op, &t->p, t->in, nin, out, st);
    if (columns_only && (op == CK_OP_CONV2D || op == CK_OP_CONV2D_BWD_DATA || op == CK_OP_CONV2D_BWD_FILTER)) {
        const ck_shape *w = op == CK_OP_CONV2D_BWD_FILTER ? &out[0] : &t->in[1];
        const int64_t ch = op == CK_OP_CONV2D ? t->in[0].d[1] : op == CK_OP_CONV2D_BWD_DATA ? out[0].d[1] : t->in[1].d[1];
        const size_t cols = (size_t)columns_only * sizeof(float) * (size_t)(ch * w->d[2] * w->d[3]);
        if (cols < gws) gws = cols;
    }
    float *dws = gws ? dev_alloc((int64_t)((gws + 3) / 4), CK_F32) : NULL;
    ck_kctx gctx = base_ctx;
    gctx.ws = dws, gctx.ws_bytes = gws;
    for (int j = 0; j < nin; j++) vin[j] = view(din[j], &t->in[j]);
    for (int k = 0; k < nout; k++) vout[k] = view(dout[k], &out[k]);
    int ok = 1;
    for (int run = 0; run < 2 && ok; run++) {
        if (run == 1)
            for (int j = 0; j < nin; j++) upload(din[j], hin[j], nin_el[j], ist[j]);
        table[op](&gctx, &t->p, vout, nout, vin, nin);
        if (ck_cuda_failed() || ck_cuda_sync()) {
            report(0, "%s: %s", t->label, ck_cuda_last_error());
            ck_cuda_clear_error();
            ok = 0;
            break;
        }
        for (int k = 0; k < nout; k++)
            if (dout[k]) download(run ? got2[k] : got[k], dout[k], nout_el[k], st);
    }
    if (ok) {
        double worst = 0;
        int bitwise = 1, guards = 1;
        for (int k = 0; k < nout; k++) {
            if (!dout[k]) continue;
            double e = 0;
            if (t->bytes >> k & 1) { /* codes: off by more than one counts as the worst */
                for (int64_t i = 0; i < nout_el[k]; i++)
                    if (abs((int)((const uint8_t *)got[k])[i] - (int)((const uint8_t *)cpu_out[k])[i]) > 1) e = 1;
            } else {
                e = rel_err(got[k], cpu_out[k], nout_el[k]);
            }
            if (!(e <= worst)) worst = e;
            bitwise &= memcmp(got[k], got2[k], sizeof(float) * (size_t)nout_el[k]) == 0;
            guards &= dev_guard_ok(dout[k], nout_el[k], st);
        }
        for (int j = 0; j < nin; j++) guards &= dev_guard_ok(din[j], nin_el[j], ist[j]);
        if (dws) guards &= dev_guard_ok(dws, (int64_t)((gws + 3) / 4), CK_F32);
        const double tol = st == CK_F32 ? t->tol : t->tol == 0 ? ldexp(1, -8) : 1e-2;
        report(worst <= tol && (bitwise || nondeterministic) && guards, "%s%s: rel err %.2e (tol %.0e)%s%s", t->label, st == CK_BF16 ? ", bf16" : st == CK_F16 ? ", fp16" : "",
               worst, tol,
               bitwise ? "" : nondeterministic ? " (differs between two runs, as the heuristic may)" : ", differs between two runs",
               guards ? "" : ", wrote past a buffer");
    }

    for (int j = 0; j < nin; j++) free(hin[j]), free(cpu_in[j]), ck_cuda_free(din[j]);
    for (int k = 0; k < nout; k++) {
        if (!t->alias[k]) free(cpu_out[k]), ck_cuda_free(dout[k]);
        free(got[k]), free(got2[k]);
    }
    free(cws);
    ck_cuda_free(dws);
}

#define SH(...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}}
#define SCALAR {0, {0}}
#define F32 1e-4
#define EXACT 0.0
#define ARITH 1e-6

static const tcase cases[] = {
    /* matmul.cu */
    {"matmul [3,5,7] x [7,4]", CK_OP_MATMUL, {.i = {0}}, 2, {SH(3, 5, 7), SH(7, 4)}, .tol = F32},
    {"matmul transposed a, batched b", CK_OP_MATMUL, {.i = {1, 0}}, 2, {SH(2, 7, 5), SH(2, 7, 3)}, .tol = F32},
    {"matmul transposed b", CK_OP_MATMUL, {.i = {0, 1}}, 2, {SH(2, 3, 9, 6), SH(11, 6)}, .tol = F32},
    {"matmul both transposed, batched", CK_OP_MATMUL, {.i = {1, 1}}, 2, {SH(3, 6, 5), SH(3, 4, 6)}, .tol = F32},
    {"matmul inner dim 0", CK_OP_MATMUL, {.i = {0}}, 2, {SH(3, 0), SH(0, 4)}, .tol = EXACT},
    {"matmul [2,128,320] x [320,640]", CK_OP_MATMUL, {.i = {0}}, 2, {SH(2, 128, 320), SH(320, 640)}, .tol = F32, .big = 1},
    {"linear with bias", CK_OP_LINEAR, {.i = {0}}, 3, {SH(2, 5, 7), SH(6, 7), SH(6)}, .tol = F32},
    {"linear without bias", CK_OP_LINEAR, {.i = {0}}, 2, {SH(13, 3), SH(5, 3)}, .tol = F32},
    {"linear [2,64,320] x [640,320]^T + b (SDXL-like)", CK_OP_LINEAR, {.i = {0}}, 3, {SH(2, 64, 320), SH(640, 320), SH(640)},
     .tol = F32},
    {"matmul [2,5,64,40] x [2,5,77,40]^T (attention-like)", CK_OP_MATMUL, {.i = {0, 1}}, 2, {SH(2, 5, 64, 40), SH(2, 5, 77, 40)},
     .tol = F32},
    {"linear [4096,640] x [640,640]^T + b", CK_OP_LINEAR, {.i = {0}}, 3, {SH(4096, 640), SH(640, 640), SH(640)}, .tol = F32,
     .big = 1},
    /* LINEAR_GEGLU (activation.cu): y and h against the CPU's pair; 2500 rows of 4096-wide h run as
     * slices of 16 MiB (3 in fp32, 2 in 16 bits, the last short) */
    {"linear_geglu with bias", CK_OP_LINEAR_GEGLU, {.i = {0}}, 3, {SH(2, 5, 7), SH(12, 7), SH(12)}, .tol = F32},
    {"linear_geglu without bias, tanh", CK_OP_LINEAR_GEGLU, {.i = {1}}, 2, {SH(13, 3), SH(10, 3)}, .tol = F32},
    {"linear_geglu [2500,16] x [4096,16]^T + b in slices", CK_OP_LINEAR_GEGLU, {.i = {0}}, 3,
     {SH(2500, 16), SH(4096, 16), SH(4096)}, .tol = F32},
    /* conv2d.cu */
    {"conv2d 3x3 pad 1 bias", CK_OP_CONV2D, {.i = {1, 1, 1, 1}}, 3, {SH(2, 3, 9, 7), SH(5, 3, 3, 3), SH(5)}, .tol = F32},
    {"conv2d 3x3 stride 2 pad 1", CK_OP_CONV2D, {.i = {2, 2, 1, 1}}, 2, {SH(2, 4, 9, 8), SH(3, 4, 3, 3)}, .tol = F32},
    {"conv2d 1x1 bias", CK_OP_CONV2D, {.i = {1, 1, 0, 0}}, 3, {SH(1, 3, 5, 5), SH(4, 3, 1, 1), SH(4)}, .tol = F32},
    {"conv2d 3x2 stride (2,1) pad (0,1)", CK_OP_CONV2D, {.i = {2, 1, 0, 1}}, 2, {SH(2, 2, 7, 5), SH(3, 2, 3, 2)}, .tol = F32},
    {"conv2d [1,32,16,16] 3x3 pad 1 bias (SDXL-like)", CK_OP_CONV2D, {.i = {1, 1, 1, 1}}, 3,
     {SH(1, 32, 16, 16), SH(32, 32, 3, 3), SH(32)}, .tol = F32},
    {"conv2d [1,32,16,16] 3x3 stride 2 (SDXL-like downsample)", CK_OP_CONV2D, {.i = {2, 2, 1, 1}}, 2,
     {SH(1, 32, 16, 16), SH(32, 32, 3, 3)}, .tol = F32},
    {"conv2d [2,320,64,64] 3x3", CK_OP_CONV2D, {.i = {1, 1, 1, 1}}, 3, {SH(2, 320, 64, 64), SH(320, 320, 3, 3), SH(320)},
     .tol = F32, .big = 1},
    {"conv2d_bwd_data 3x3 pad 1", CK_OP_CONV2D_BWD_DATA, {.i = {1, 1, 1, 1}}, 2, {SH(2, 5, 9, 7), SH(5, 3, 3, 3)},
     {SH(2, 3, 9, 7)}, .tol = F32},
    {"conv2d_bwd_data 3x3 stride 2", CK_OP_CONV2D_BWD_DATA, {.i = {2, 2, 1, 1}}, 2, {SH(2, 3, 5, 4), SH(3, 4, 3, 3)},
     {SH(2, 4, 9, 8)}, .tol = F32},
    {"conv2d_bwd_data 3x2 stride (2,1)", CK_OP_CONV2D_BWD_DATA, {.i = {2, 1, 0, 1}}, 2, {SH(2, 3, 3, 6), SH(3, 2, 3, 2)},
     {SH(2, 2, 7, 5)}, .tol = F32},
    {"conv2d_bwd_data [1,32,16,16] 3x3 pad 1 (SDXL-like)", CK_OP_CONV2D_BWD_DATA, {.i = {1, 1, 1, 1}}, 2,
     {SH(1, 32, 16, 16), SH(32, 32, 3, 3)}, {SH(1, 32, 16, 16)}, .tol = F32},
    {"conv2d_bwd_data [2,320,64,64]", CK_OP_CONV2D_BWD_DATA, {.i = {1, 1, 1, 1}}, 2, {SH(2, 320, 64, 64), SH(320, 320, 3, 3)},
     {SH(2, 320, 64, 64)}, .tol = F32, .big = 1},
    {"conv2d_bwd_filter dw and db", CK_OP_CONV2D_BWD_FILTER, {.i = {1, 1, 1, 1}}, 2, {SH(2, 5, 9, 7), SH(2, 3, 9, 7)},
     {SH(5, 3, 3, 3)}, .tol = F32},
    {"conv2d_bwd_filter stride 2, db unwanted", CK_OP_CONV2D_BWD_FILTER, {.i = {2, 2, 1, 1}}, 2,
     {SH(2, 3, 5, 4), SH(2, 4, 9, 8)}, {SH(3, 4, 3, 3)}, .unwanted = 2, .tol = F32},
    {"conv2d_bwd_filter db only", CK_OP_CONV2D_BWD_FILTER, {.i = {1, 1, 0, 0}}, 2, {SH(3, 4, 6, 5), SH(3, 2, 6, 5)},
     {SH(4, 2, 1, 1)}, .unwanted = 1, .tol = F32},
    {"conv2d_bwd_filter 1x1", CK_OP_CONV2D_BWD_FILTER, {.i = {1, 1, 0, 0}}, 2, {SH(1, 4, 5, 5), SH(1, 3, 5, 5)},
     {SH(4, 3, 1, 1)}, .tol = F32},
    {"conv2d_bwd_filter [1,32,16,16] dw and db (SDXL-like)", CK_OP_CONV2D_BWD_FILTER, {.i = {1, 1, 1, 1}}, 2,
     {SH(1, 32, 16, 16), SH(1, 32, 16, 16)}, {SH(32, 32, 3, 3)}, .tol = F32},
    {"conv2d_bwd_filter [1,32,16,16] dw only (SDXL-like)", CK_OP_CONV2D_BWD_FILTER, {.i = {1, 1, 1, 1}}, 2,
     {SH(1, 32, 16, 16), SH(1, 32, 16, 16)}, {SH(32, 32, 3, 3)}, .unwanted = 2, .tol = F32},
    {"conv2d_bwd_filter [2,320,64,64]", CK_OP_CONV2D_BWD_FILTER, {.i = {1, 1, 1, 1}}, 2,
     {SH(2, 320, 64, 64), SH(2, 320, 64, 64)}, {SH(320, 320, 3, 3)}, .tol = F32, .big = 1},
    /* norm.cu */
    {"group_norm [2,6,5,3] 3 groups", CK_OP_GROUP_NORM, {.i = {3}, .f = {1e-5f}}, 3, {SH(2, 6, 5, 3), SH(6), SH(6)}, .tol = F32},
    {"group_norm [3,8] 4 groups", CK_OP_GROUP_NORM, {.i = {4}, .f = {1e-6f}}, 3, {SH(3, 8), SH(8), SH(8)}, .tol = F32},
    {"group_norm [1,64,32,32] 32 groups", CK_OP_GROUP_NORM, {.i = {32}, .f = {1e-5f}}, 3, {SH(1, 64, 32, 32), SH(64), SH(64)},
     .tol = F32},
    {"group_norm [2,640,64,64] 32 groups", CK_OP_GROUP_NORM, {.i = {32}, .f = {1e-5f}}, 3, {SH(2, 640, 64, 64), SH(640), SH(640)},
     .tol = F32, .big = 1},
    {"group_norm_bwd all", CK_OP_GROUP_NORM_BWD, {.i = {3}, .f = {1e-5f}}, 3, {SH(3, 6, 5, 3), SH(3, 6, 5, 3), SH(6)}, .tol = F32},
    {"group_norm_bwd dx only", CK_OP_GROUP_NORM_BWD, {.i = {2}, .f = {1e-5f}}, 3, {SH(2, 4, 7), SH(2, 4, 7), SH(4)},
     .unwanted = 6, .tol = F32},
    {"group_norm_bwd dgamma dbeta only", CK_OP_GROUP_NORM_BWD, {.i = {2}, .f = {1e-5f}}, 3, {SH(2, 4, 7), SH(2, 4, 7), SH(4)},
     .unwanted = 1, .tol = F32},
    {"group_norm_bwd [1,64,32,32]", CK_OP_GROUP_NORM_BWD, {.i = {32}, .f = {1e-5f}}, 3,
     {SH(1, 64, 32, 32), SH(1, 64, 32, 32), SH(64)}, .tol = F32},
    {"group_norm_bwd [2,640,64,64]", CK_OP_GROUP_NORM_BWD, {.i = {32}, .f = {1e-5f}}, 3,
     {SH(2, 640, 64, 64), SH(2, 640, 64, 64), SH(640)}, .tol = F32, .big = 1},
    {"group_norm_silu [2,6,5,3] 3 groups", CK_OP_GROUP_NORM_SILU, {.i = {3}, .f = {1e-5f}}, 3,
     {SH(2, 6, 5, 3), SH(6), SH(6)}, .tol = F32},
    {"group_norm_silu [1,64,32,32] 32 groups", CK_OP_GROUP_NORM_SILU, {.i = {32}, .f = {1e-5f}}, 3,
     {SH(1, 64, 32, 32), SH(64), SH(64)}, .tol = F32},
    {"group_norm_silu [2,640,64,64] 32 groups", CK_OP_GROUP_NORM_SILU, {.i = {32}, .f = {1e-5f}}, 3,
     {SH(2, 640, 64, 64), SH(640), SH(640)}, .tol = F32, .big = 1},
    {"group_norm_silu_bwd all", CK_OP_GROUP_NORM_SILU_BWD, {.i = {3}, .f = {1e-5f}}, 4,
     {SH(3, 6, 5, 3), SH(3, 6, 5, 3), SH(6), SH(6)}, .tol = F32},
    {"group_norm_silu_bwd dx only", CK_OP_GROUP_NORM_SILU_BWD, {.i = {2}, .f = {1e-5f}}, 4,
     {SH(2, 4, 7), SH(2, 4, 7), SH(4), SH(4)}, .unwanted = 6, .tol = F32},
    {"group_norm_silu_bwd dgamma dbeta only", CK_OP_GROUP_NORM_SILU_BWD, {.i = {2}, .f = {1e-5f}}, 4,
     {SH(2, 4, 7), SH(2, 4, 7), SH(4), SH(4)}, .unwanted = 1, .tol = F32},
    {"group_norm_silu_bwd [1,64,32,32]", CK_OP_GROUP_NORM_SILU_BWD, {.i = {32}, .f = {1e-5f}}, 4,
     {SH(1, 64, 32, 32), SH(1, 64, 32, 32), SH(64), SH(64)}, .tol = F32},
    {"group_norm_silu_bwd [2,640,64,64]", CK_OP_GROUP_NORM_SILU_BWD, {.i = {32}, .f = {1e-5f}}, 4,
     {SH(2, 640, 64, 64), SH(2, 640, 64, 64), SH(640), SH(640)}, .tol = F32, .big = 1},
    /* channels of more than one 4096-position piece (the partial sums' second pass), with and without vectors */
    {"group_norm [2,4,72,72] 2 pieces a channel", CK_OP_GROUP_NORM, {.i = {2}, .f = {1e-5f}}, 3,
     {SH(2, 4, 72, 72), SH(4), SH(4)}, .tol = F32},
    {"group_norm_bwd [2,6,4099] 2 pieces, scalar", CK_OP_GROUP_NORM_BWD, {.i = {3}, .f = {1e-5f}}, 3,
     {SH(2, 6, 4099), SH(2, 6, 4099), SH(6)}, .tol = F32},
    {"group_norm_silu [2,6,4099] 2 pieces, scalar", CK_OP_GROUP_NORM_SILU, {.i = {3}, .f = {1e-5f}}, 3,
     {SH(2, 6, 4099), SH(6), SH(6)}, .tol = F32},
    {"group_norm_silu_bwd [2,4,72,72] 2 pieces", CK_OP_GROUP_NORM_SILU_BWD, {.i = {2}, .f = {1e-5f}}, 4,
     {SH(2, 4, 72, 72), SH(2, 4, 72, 72), SH(4), SH(4)}, .tol = F32},
    {"group_norm_silu_bwd [3,4,9000] dgamma dbeta only", CK_OP_GROUP_NORM_SILU_BWD, {.i = {1}, .f = {1e-5f}}, 4,
     {SH(3, 4, 9000), SH(3, 4, 9000), SH(4), SH(4)}, .unwanted = 1, .tol = F32},
    /* SDXL's channel counts at small images: 8-value vectors in bf16 (S 16), scalar (S 25) */
    {"group_norm [1,640,4,4] 32 groups", CK_OP_GROUP_NORM, {.i = {32}, .f = {1e-5f}}, 3,
     {SH(1, 640, 4, 4), SH(640), SH(640)}, .tol = F32},
    {"group_norm [2,1280,5,5] 32 groups", CK_OP_GROUP_NORM, {.i = {32}, .f = {1e-6f}}, 3,
     {SH(2, 1280, 5, 5), SH(1280), SH(1280)}, .tol = F32},
    {"group_norm_bwd [2,640,4,4] dx only", CK_OP_GROUP_NORM_BWD, {.i = {32}, .f = {1e-5f}}, 3,
     {SH(2, 640, 4, 4), SH(2, 640, 4, 4), SH(640)}, .unwanted = 6, .tol = F32},
    {"group_norm_bwd [2,1280,5,5] dgamma dbeta only", CK_OP_GROUP_NORM_BWD, {.i = {32}, .f = {1e-5f}}, 3,
     {SH(2, 1280, 5, 5), SH(2, 1280, 5, 5), SH(1280)}, .unwanted = 1, .tol = F32},
    {"group_norm_bwd [2,200,8,8] 8 groups", CK_OP_GROUP_NORM_BWD, {.i = {8}, .f = {1e-5f}}, 3,
     {SH(2, 200, 8, 8), SH(2, 200, 8, 8), SH(200)}, .tol = F32},
    {"layer_norm [3,5,37]", CK_OP_LAYER_NORM, {.i = {0}, .f = {1e-5f}}, 3, {SH(3, 5, 37), SH(37), SH(37)}, .tol = F32},
    {"layer_norm [1,300,64]", CK_OP_LAYER_NORM, {.i = {0}, .f = {1e-5f}}, 3, {SH(1, 300, 64), SH(64), SH(64)}, .tol = F32},
    {"layer_norm C 2100", CK_OP_LAYER_NORM, {.i = {0}, .f = {1e-5f}}, 3, {SH(3, 2100), SH(2100), SH(2100)}, .tol = F32},
    {"layer_norm_bwd chunked [3,5,37]", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3, {SH(3, 5, 37), SH(3, 5, 37), SH(37)},
     .tol = F32},
    {"layer_norm_bwd chunked [1,300,64]", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(1, 300, 64), SH(1, 300, 64), SH(64)}, .tol = F32},
    {"layer_norm_bwd 2 rows (column tiles)", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3, {SH(2, 45), SH(2, 45), SH(45)},
     .tol = F32},
    {"layer_norm_bwd dx unwanted (column tiles)", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(9, 40), SH(9, 40), SH(40)}, .unwanted = 1, .tol = F32},
    {"layer_norm_bwd dx only", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3, {SH(7, 33), SH(7, 33), SH(33)}, .unwanted = 6,
     .tol = F32},
    /* rows of whole vectors up to 1280: held in registers */
    {"layer_norm [2,9,640] rows in registers", CK_OP_LAYER_NORM, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(2, 9, 640), SH(640), SH(640)}, .tol = F32},
    {"layer_norm [3,1280] rows in registers", CK_OP_LAYER_NORM, {.i = {0}, .f = {1e-5f}}, 3, {SH(3, 1280), SH(1280), SH(1280)},
     .tol = F32},
    {"layer_norm_bwd dx only [5,200] rows in registers", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(5, 200), SH(5, 200), SH(200)}, .unwanted = 6, .tol = F32},
    {"layer_norm_bwd chunked [4,7,1280] rows in registers", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(4, 7, 1280), SH(4, 7, 1280), SH(1280)}, .tol = F32},
    {"layer_norm_bwd [2,4096,640]", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(2, 4096, 640), SH(2, 4096, 640), SH(640)}, .tol = F32, .big = 1},
    /* bf16's rows in registers are 8-value vectors (640: 3 a lane, the last
     * partial; 1280: 5; 200: 1), and its chunked dgamma/dbeta needs 8 rows of 8
     * columns (partials in half the bytes): 5 rows or 6 columns take chunks in
     * fp32, column tiles in bf16 */
    {"layer_norm [6,200] rows in registers", CK_OP_LAYER_NORM, {.i = {0}, .f = {1e-5f}}, 3, {SH(6, 200), SH(200), SH(200)},
     .tol = F32},
    {"layer_norm_bwd dx only [2,5,640] rows in registers", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(2, 5, 640), SH(2, 5, 640), SH(640)}, .unwanted = 6, .tol = F32},
    {"layer_norm_bwd dx only [3,1280] rows in registers", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(3, 1280), SH(3, 1280), SH(1280)}, .unwanted = 6, .tol = F32},
    {"layer_norm_bwd chunked [9,640] dbeta unwanted", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(9, 640), SH(9, 640), SH(640)}, .unwanted = 4, .tol = F32},
    {"layer_norm_bwd chunked [40,200] dgamma unwanted", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(40, 200), SH(40, 200), SH(200)}, .unwanted = 2, .tol = F32},
    {"layer_norm_bwd dx unwanted [12,1280]", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(12, 1280), SH(12, 1280), SH(1280)}, .unwanted = 1, .tol = F32},
    {"layer_norm_bwd 5 rows (bf16: column tiles)", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(5, 44), SH(5, 44), SH(44)}, .tol = F32},
    {"layer_norm_bwd 6 columns (bf16: column tiles)", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(20, 6), SH(20, 6), SH(6)}, .tol = F32},
    {"layer_norm_bwd 3 columns (column tiles)", CK_OP_LAYER_NORM_BWD, {.i = {0}, .f = {1e-5f}}, 3,
     {SH(10, 3), SH(10, 3), SH(3)}, .tol = F32},
    /* RMS_NORM on the layer norm's kernels (norm.cu), and LAYER_NORM without
     * its affine: Flux's q/k norm (rows of the head dim 128: in registers),
     * T5's (d_model rows: 640 here), rows of no whole vectors; the backward's
     * chunked dweight, its column tiles (2 rows), dx alone */
    {"rms_norm [3,5,128] (q/k norm)", CK_OP_RMS_NORM, {.f = {1e-6f}}, 2, {SH(3, 5, 128), SH(128)}, .kind = {WIDE}, .tol = F32},
    {"rms_norm [2,640]", CK_OP_RMS_NORM, {.f = {1e-6f}}, 2, {SH(2, 640), SH(640)}, .tol = F32},
    {"rms_norm no weight [4,37]", CK_OP_RMS_NORM, {.f = {1e-6f}}, 1, {SH(4, 37)}, .tol = F32},
    {"rms_norm_bwd chunked [3,5,128]", CK_OP_RMS_NORM_BWD, {.f = {1e-6f}}, 3, {SH(3, 5, 128), SH(3, 5, 128), SH(128)},
     .tol = F32},
    {"rms_norm_bwd 2 rows (column tiles)", CK_OP_RMS_NORM_BWD, {.f = {1e-6f}}, 3, {SH(2, 45), SH(2, 45), SH(45)},
     .tol = F32},
    {"rms_norm_bwd dweight only [9,40]", CK_OP_RMS_NORM_BWD, {.f = {1e-6f}}, 3, {SH(9, 40), SH(9, 40), SH(40)},
     .unwanted = 1, .tol = F32},
    {"rms_norm_bwd no weight, dx [4,37]", CK_OP_RMS_NORM_BWD, {.f = {1e-6f}}, 2, {SH(4, 37), SH(4, 37)}, .unwanted = 2,
     .tol = F32},
    {"layer_norm no affine [3,5,64]", CK_OP_LAYER_NORM, {.f = {1e-6f}}, 1, {SH(3, 5, 64)}, .tol = F32},
    {"layer_norm weight only [4,37]", CK_OP_LAYER_NORM, {.f = {1e-6f}}, 2, {SH(4, 37), SH(37)}, .tol = F32},
    {"layer_norm_bwd no affine, dx [6,64]", CK_OP_LAYER_NORM_BWD, {.f = {1e-6f}}, 2, {SH(6, 64), SH(6, 64)},
     .unwanted = 6, .tol = F32},
    {"layer_norm_bwd no affine, dx [3,37]", CK_OP_LAYER_NORM_BWD, {.f = {1e-6f}}, 2, {SH(3, 37), SH(3, 37)},
     .unwanted = 6, .tol = F32},
    /* rope.cu: heads of 8 in [B,L,H*D]; Flux's head dim 128 in [B,L,H*D] and
     * in [B,H,L,D]; the inverse (the backward) */
    {"rope [2,7,24] table [7,8]", CK_OP_ROPE, {.i = {0}}, 2, {SH(2, 7, 24), SH(7, 8)}, .tol = ARITH},
    {"rope [1,13,256] table [13,128]", CK_OP_ROPE, {.i = {0}}, 2, {SH(1, 13, 256), SH(13, 128)}, .tol = ARITH},
    {"rope inverse [1,3,5,128] table [5,128]", CK_OP_ROPE, {.i = {1}}, 2, {SH(1, 3, 5, 128), SH(5, 128)}, .tol = ARITH},
    /* modulate.cu: one chunk of rows, and 150 rows in 3 chunks; wanted and unwanted sums */
    {"modulate [2,37,40]", CK_OP_MODULATE, {.i = {0}}, 3, {SH(2, 37, 40), SH(2, 40), SH(2, 40)}, .tol = ARITH},
    {"modulate_bwd [2,37,40]", CK_OP_MODULATE_BWD, {.i = {0}}, 3, {SH(2, 37, 40), SH(2, 37, 40), SH(2, 40)}, .tol = F32},
    {"modulate_bwd [1,150,33] 3 chunks", CK_OP_MODULATE_BWD, {.i = {0}}, 3, {SH(1, 150, 33), SH(1, 150, 33), SH(1, 33)},
     .tol = F32},
    {"modulate_bwd dscale unwanted", CK_OP_MODULATE_BWD, {.i = {0}}, 3, {SH(2, 3, 5, 40), SH(2, 3, 5, 40), SH(2, 40)},
     .unwanted = 4, .tol = F32},
    {"modulate_bwd dx only", CK_OP_MODULATE_BWD, {.i = {0}}, 3, {SH(2, 7, 40), SH(2, 7, 40), SH(2, 40)}, .unwanted = 6,
     .tol = F32},
    {"gate [2,37,40]", CK_OP_GATE, {.i = {0}}, 3, {SH(2, 37, 40), SH(2, 40), SH(2, 37, 40)}, .tol = ARITH},
    {"gate_bwd [1,150,33] 3 chunks", CK_OP_GATE_BWD, {.i = {0}}, 3, {SH(1, 150, 33), SH(1, 33), SH(1, 150, 33)},
     .tol = F32},
    {"gate_bwd dgate only", CK_OP_GATE_BWD, {.i = {0}}, 3, {SH(2, 7, 40), SH(2, 40), SH(2, 7, 40)}, .unwanted = 2,
     .tol = F32},
    {"gate_bwd dy_y only", CK_OP_GATE_BWD, {.i = {0}}, 3, {SH(2, 7, 40), SH(2, 40), SH(2, 7, 40)}, .unwanted = 1,
     .tol = ARITH},
    /* activation.cu */
    {"silu", CK_OP_SILU, {.i = {0}}, 1, {SH(3, 333)}, .kind = {WIDE}, .tol = F32},
    {"silu_bwd", CK_OP_SILU_BWD, {.i = {0}}, 2, {SH(3, 333), SH(3, 333)}, .kind = {UNIFORM, WIDE}, .tol = F32},
    {"silu [3,320] vectors", CK_OP_SILU, {.i = {0}}, 1, {SH(3, 320)}, .kind = {WIDE}, .tol = F32},
    {"silu_bwd [3,320] vectors", CK_OP_SILU_BWD, {.i = {0}}, 2, {SH(3, 320), SH(3, 320)}, .kind = {UNIFORM, WIDE},
     .tol = F32},
    {"gelu erf", CK_OP_GELU, {.i = {0}}, 1, {SH(1001)}, .kind = {WIDE}, .tol = F32},
    {"gelu tanh", CK_OP_GELU, {.i = {1}}, 1, {SH(1001)}, .kind = {WIDE}, .tol = F32},
    {"gelu_bwd erf", CK_OP_GELU_BWD, {.i = {0}}, 2, {SH(1001), SH(1001)}, .kind = {UNIFORM, WIDE}, .tol = F32},
    {"gelu_bwd tanh", CK_OP_GELU_BWD, {.i = {1}}, 2, {SH(1001), SH(1001)}, .kind = {UNIFORM, WIDE}, .tol = F32},
    {"geglu erf", CK_OP_GEGLU, {.i = {0}}, 1, {SH(3, 7, 18)}, .kind = {WIDE}, .tol = F32},
    {"geglu tanh", CK_OP_GEGLU, {.i = {1}}, 1, {SH(5, 22)}, .kind = {WIDE}, .tol = F32},
    {"geglu_bwd erf", CK_OP_GEGLU_BWD, {.i = {0}}, 2, {SH(3, 7, 9), SH(3, 7, 18)}, .kind = {UNIFORM, WIDE}, .tol = F32},
    {"geglu_bwd tanh", CK_OP_GEGLU_BWD, {.i = {1}}, 2, {SH(5, 11), SH(5, 22)}, .kind = {UNIFORM, WIDE}, .tol = F32},
    /* rows of whole 16-byte vectors: the vector kernels (4 floats, 8 bf16 a load) */
    {"geglu [4,5,32] vectors", CK_OP_GEGLU, {.i = {0}}, 1, {SH(4, 5, 32)}, .kind = {WIDE}, .tol = F32},
    {"geglu_bwd [4,5,16] vectors", CK_OP_GEGLU_BWD, {.i = {1}}, 2, {SH(4, 5, 16), SH(4, 5, 32)}, .kind = {UNIFORM, WIDE},
     .tol = F32},
    {"geglu [2,4096,5120] vectors", CK_OP_GEGLU, {.i = {0}}, 1, {SH(2, 4096, 5120)}, .kind = {WIDE}, .tol = F32, .big = 1},
    {"geglu_bwd [2,4096,2560] vectors", CK_OP_GEGLU_BWD, {.i = {0}}, 2, {SH(2, 4096, 2560), SH(2, 4096, 5120)},
     .kind = {UNIFORM, WIDE}, .tol = F32, .big = 1},
    {"softmax [7,33]", CK_OP_SOFTMAX, {.i = {0}}, 1, {SH(7, 33)}, .kind = {WIDE}, .tol = F32},
    {"softmax [3,1500]", CK_OP_SOFTMAX, {.i = {0}}, 1, {SH(3, 1500)}, .kind = {WIDE}, .tol = F32},
    {"softmax_bwd", CK_OP_SOFTMAX_BWD, {.i = {0}}, 2, {SH(7, 33), SH(7, 33)}, .tol = F32},
    {"mish", CK_OP_MISH, {.i = {0}}, 1, {SH(3, 333)}, .kind = {WIDE}, .tol = F32},
    {"mish_bwd", CK_OP_MISH_BWD, {.i = {0}}, 2, {SH(3, 333), SH(3, 333)}, .kind = {UNIFORM, WIDE}, .tol = F32},
    /* attention.cu: head dims 4 (one thread a row), 40 (two), 100 (four), 160 (cuBLAS) */
    {"attention D 4, cross", CK_OP_ATTENTION, {.i = {3}}, 3, {SH(2, 9, 12), SH(2, 11, 12), SH(2, 11, 12)}, .tol = F32},
    {"attention D 40, self, 37 rows", CK_OP_ATTENTION, {.i = {2}}, 3, {SH(1, 37, 80), SH(1, 37, 80), SH(1, 37, 80)},
     .tol = F32},
    {"attention D 100, scale 0.3", CK_OP_ATTENTION, {.i = {1}, .f = {0.3f}}, 3, {SH(2, 5, 100), SH(2, 70, 100), SH(2, 70, 100)},
     .tol = F32},
    {"attention D 160 (cuBLAS in fp32)", CK_OP_ATTENTION, {.i = {2}}, 3, {SH(1, 13, 320), SH(1, 17, 320), SH(1, 17, 320)},
     .tol = F32},
    {"attention [2,1024,640] 10 heads", CK_OP_ATTENTION, {.i = {10}}, 3,
     {SH(2, 1024, 640), SH(2, 1024, 640), SH(2, 1024, 640)}, .tol = F32, .big = 1},
    {"attention [2,4096,640] x 77 keys", CK_OP_ATTENTION, {.i = {10}}, 3, {SH(2, 4096, 640), SH(2, 77, 640), SH(2, 77, 640)},
     .tol = F32, .big = 1},
    {"attention_bwd D 4, cross", CK_OP_ATTENTION_BWD, {.i = {3}}, 4,
     {SH(2, 9, 12), SH(2, 9, 12), SH(2, 11, 12), SH(2, 11, 12)}, .tol = F32},
    {"attention_bwd D 40, 37 rows", CK_OP_ATTENTION_BWD, {.i = {2}}, 4,
     {SH(1, 37, 80), SH(1, 37, 80), SH(1, 37, 80), SH(1, 37, 80)}, .tol = F32},
    {"attention_bwd D 100, dk unwanted", CK_OP_ATTENTION_BWD, {.i = {1}, .f = {0.3f}}, 4,
     {SH(2, 5, 100), SH(2, 5, 100), SH(2, 70, 100), SH(2, 70, 100)}, .unwanted = 2, .tol = F32},
    {"attention_bwd D 160 (cuBLAS in fp32)", CK_OP_ATTENTION_BWD, {.i = {2}}, 4,
     {SH(1, 13, 320), SH(1, 13, 320), SH(1, 17, 320), SH(1, 17, 320)}, .tol = F32},
    {"attention_bwd [2,1024,640] 10 heads", CK_OP_ATTENTION_BWD, {.i = {10}}, 4,
     {SH(2, 1024, 640), SH(2, 1024, 640), SH(2, 1024, 640), SH(2, 1024, 640)}, .tol = F32, .big = 1},
    /* The tensor-core kernels of bf16 storage at SDXL's shapes, shortened (self-attention 256 tokens,
     * cross-attention 77 keys), and head dim 128 with lengths that are no multiple of any tile */
    {"attention [1,256,640] 10 heads (D 64)", CK_OP_ATTENTION, {.i = {10}}, 3, {SH(1, 256, 640), SH(1, 256, 640), SH(1, 256, 640)},
     .tol = F32, .bf16_only = 1},
    {"attention [2,100,640] x 77 keys, 10 heads", CK_OP_ATTENTION, {.i = {10}}, 3,
     {SH(2, 100, 640), SH(2, 77, 640), SH(2, 77, 640)}, .tol = F32, .bf16_only = 1},
    {"attention D 128, 2 heads, 93 x 45", CK_OP_ATTENTION, {.i = {2}}, 3, {SH(1, 93, 256), SH(1, 45, 256), SH(1, 45, 256)},
     .tol = F32, .bf16_only = 1},
    {"attention_bwd [1,256,640] 10 heads (D 64)", CK_OP_ATTENTION_BWD, {.i = {10}}, 4,
     {SH(1, 256, 640), SH(1, 256, 640), SH(1, 256, 640), SH(1, 256, 640)}, .tol = F32, .bf16_only = 1},
    {"attention_bwd [2,100,640] x 77 keys, 10 heads", CK_OP_ATTENTION_BWD, {.i = {10}}, 4,
     {SH(2, 100, 640), SH(2, 100, 640), SH(2, 77, 640), SH(2, 77, 640)}, .tol = F32, .bf16_only = 1},
    {"attention_bwd D 128, 2 heads, 93 x 45, scale 0.05", CK_OP_ATTENTION_BWD, {.i = {2}, .f = {0.05f}}, 4,
     {SH(1, 93, 256), SH(1, 93, 256), SH(1, 45, 256), SH(1, 45, 256)}, .tol = F32, .bf16_only = 1},
    /* Flux's joint attention at head dim 128 (3 text and 6 image tokens, one
     * head): the fp32 kernels (four threads a row), and bf16 and fp16 on
     * tensor cores (as the 93 x 45 cases above) */
    {"attention D 128, joint 3 + 6 tokens", CK_OP_ATTENTION, {.i = {1}}, 3, {SH(1, 9, 128), SH(1, 9, 128), SH(1, 9, 128)},
     .tol = F32},
    {"attention_bwd D 128, joint 3 + 6 tokens", CK_OP_ATTENTION_BWD, {.i = {1}}, 4,
     {SH(1, 9, 128), SH(1, 9, 128), SH(1, 9, 128), SH(1, 9, 128)}, .tol = F32},
    /* elementwise.cu */
    {"add same shape", CK_OP_ADD, {.i = {0}}, 2, {SH(3, 7, 5), SH(3, 7, 5)}, .tol = EXACT},
    {"add same shape [4,6,10] vectors", CK_OP_ADD, {.i = {0}}, 2, {SH(4, 6, 10), SH(4, 6, 10)}, .tol = EXACT},
    {"mul same shape [2,40] vectors", CK_OP_MUL, {.i = {0}}, 2, {SH(2, 40), SH(2, 40)}, .tol = EXACT},
    {"add row bias", CK_OP_ADD, {.i = {0}}, 2, {SH(4, 6, 9), SH(9)}, .tol = EXACT},
    {"add channel bias", CK_OP_ADD, {.i = {0}}, 2, {SH(2, 5, 3, 4), SH(5, 1, 1)}, .tol = EXACT},
    {"sub both broadcast", CK_OP_SUB, {.i = {0}}, 2, {SH(1, 5, 1, 1), SH(2, 1, 3, 4)}, .tol = EXACT},
    {"mul [N,1,H,W] x [N,C,1,1]", CK_OP_MUL, {.i = {0}}, 2, {SH(2, 1, 3, 4), SH(2, 5, 1, 1)}, .tol = EXACT},
    {"mul by a one-element tensor", CK_OP_MUL, {.i = {0}}, 2, {SH(6, 7), SH(1)}, .tol = EXACT},
    {"scale", CK_OP_SCALE, {.i = {0}, .f = {-0.37f}}, 1, {SH(5, 77)}, .tol = EXACT},
    {"fill", CK_OP_FILL, {.i = {0}, .f = {2.5f}}, 0, {SCALAR}, {SH(3, 11)}, .tol = EXACT},
    {"reduce_to channels", CK_OP_REDUCE_TO, {.i = {0}}, 1, {SH(2, 5, 3, 4)}, {SH(5, 1, 1)}, .tol = F32},
    {"reduce_to rows", CK_OP_REDUCE_TO, {.i = {0}}, 1, {SH(40, 9)}, {SH(9)}, .tol = F32},
    {"reduce_to (1,1,C)", CK_OP_REDUCE_TO, {.i = {0}}, 1, {SH(3, 50, 7)}, {SH(1, 1, 7)}, .tol = F32},
    {"reduce_to last dim", CK_OP_REDUCE_TO, {.i = {0}}, 1, {SH(6, 333)}, {SH(6, 1)}, .tol = F32},
    {"reduce_to everything", CK_OP_REDUCE_TO, {.i = {0}}, 1, {SH(3, 4, 1000)}, {SH(1)}, .tol = F32},
    {"reduce_to nothing", CK_OP_REDUCE_TO, {.i = {0}}, 1, {SH(3, 4)}, {SH(3, 4)}, .tol = EXACT},
    {"reduce_to [2,16384,320] -> [320]", CK_OP_REDUCE_TO, {.i = {0}}, 1, {SH(2, 16384, 320)}, {SH(320)}, .tol = F32,
     .big = 1},
    /* layout.cu */
    {"concat dim 1", CK_OP_CONCAT, {.i = {1}}, 2, {SH(2, 3, 4, 5), SH(2, 2, 4, 5)}, .tol = EXACT},
    {"concat dim 0", CK_OP_CONCAT, {.i = {0}}, 2, {SH(2, 7), SH(3, 7)}, .tol = EXACT},
    {"concat last dim", CK_OP_CONCAT, {.i = {2}}, 2, {SH(3, 4, 5), SH(3, 4, 2)}, .tol = EXACT},
    {"slice dim 1", CK_OP_SLICE, {.i = {1, 2, 3}}, 1, {SH(2, 7, 4)}, .tol = EXACT},
    {"slice dim 0", CK_OP_SLICE, {.i = {0, 1, 2}}, 1, {SH(4, 9)}, .tol = EXACT},
    {"reshape", CK_OP_RESHAPE, {.i = {0}}, 1, {SH(2, 3, 10)}, {SH(6, 10)}, .tol = EXACT},
    /* (0,2,1,3) keeps the last dim: the gather; the others move the contiguous
     * dim, so tiles of 32 x 32 (37 and 45 cross them) */
    {"permute (0,2,1,3)", CK_OP_PERMUTE, {.i = {0, 2, 1, 3}}, 1, {SH(2, 5, 7, 3)}, .tol = EXACT},
    {"permute (0,2,3,1)", CK_OP_PERMUTE, {.i = {0, 2, 3, 1}}, 1, {SH(2, 37, 5, 9)}, .tol = EXACT},
    {"permute (0,2,3,1) batch 1", CK_OP_PERMUTE, {.i = {0, 2, 3, 1}}, 1, {SH(1, 40, 3, 11)}, .tol = EXACT},
    {"permute (0,3,1,2)", CK_OP_PERMUTE, {.i = {0, 3, 1, 2}}, 1, {SH(2, 5, 9, 37)}, .tol = EXACT},
    {"permute (2,1,0)", CK_OP_PERMUTE, {.i = {2, 1, 0}}, 1, {SH(33, 3, 40)}, .tol = EXACT},
    {"permute identity", CK_OP_PERMUTE, {.i = {0, 1}}, 1, {SH(3, 4)}, .tol = EXACT},
    /* odd H and W */
    {"upsample2x", CK_OP_UPSAMPLE2X, {.i = {0}}, 1, {SH(2, 3, 5, 7)}, .tol = EXACT},
    {"upsample2x_bwd", CK_OP_UPSAMPLE2X_BWD, {.i = {0}}, 1, {SH(2, 3, 10, 14)}, .tol = EXACT},
    /* loss.cu */
    {"mean", CK_OP_MEAN, {.i = {0}}, 1, {SH(3, 1001)}, .tol = F32},
    {"mean of 100000", CK_OP_MEAN, {.i = {0}}, 1, {SH(100000)}, .tol = F32},
    {"mean_bwd", CK_OP_MEAN_BWD, {.i = {0}}, 1, {SCALAR}, {SH(4, 33)}, .tol = EXACT},
    {"mse_loss", CK_OP_MSE_LOSS, {.i = {0}}, 2, {SH(2, 4, 9, 9), SH(2, 4, 9, 9)}, .tol = F32},
    {"mse_loss_bwd both", CK_OP_MSE_LOSS_BWD, {.i = {0}}, 3, {SCALAR, SH(2, 4, 9), SH(2, 4, 9)}, .tol = EXACT},
    {"mse_loss_bwd da only", CK_OP_MSE_LOSS_BWD, {.i = {0}}, 3, {SCALAR, SH(31), SH(31)}, .unwanted = 2, .tol = EXACT},
    {"mse_loss_bwd db only", CK_OP_MSE_LOSS_BWD, {.i = {0}}, 3, {SCALAR, SH(31), SH(31)}, .unwanted = 1, .tol = EXACT},
    /* embedding.cu */
    {"timestep_embedding 320 flipped", CK_OP_TIMESTEP_EMBEDDING, {.i = {320, 1}, .f = {0.0f, 10000.0f, 1.0f}}, 1, {SH(5)},
     .kind = {TIMESTEPS}, .tol = F32},
    {"timestep_embedding 33, shift 1", CK_OP_TIMESTEP_EMBEDDING, {.i = {33, 0}, .f = {1.0f, 10000.0f, 1.0f}}, 1, {SH(3)},
     .kind = {TIMESTEPS}, .tol = F32},
    {"dropout p 0.25 (same mask)", CK_OP_DROPOUT, {.i = {7}, .f = {0.25f}}, 1, {SH(3, 1001)}, .tol = EXACT},
    {"dropout p 0", CK_OP_DROPOUT, {.i = {7}, .f = {0.0f}}, 1, {SH(50)}, .tol = EXACT},
    {"dropout on rank 1 of 3 (global rows)", CK_OP_DROPOUT, {.i = {7, 3, 1}, .f = {0.25f}}, 1, {SH(2, 5, 101)},
     .tol = EXACT},
    {"embedding [3,77] of [16,33]", CK_OP_EMBEDDING, {.i = {0}}, 2, {SH(3, 77), SH(16, 33)}, .kind = {IDS}, .tol = EXACT},
    {"embedding [5] of [20,1]", CK_OP_EMBEDDING, {.i = {0}}, 2, {SH(5), SH(20, 1)}, .kind = {IDS}, .tol = EXACT},
    {"embedding [2,77] of [49408,768]", CK_OP_EMBEDDING, {.i = {0}}, 2, {SH(2, 77), SH(49408, 768)}, .kind = {IDS},
     .tol = EXACT, .big = 1},
    /* optim.cu */
    {"sgd_step", CK_OP_SGD_STEP, {.i = {0}, .f = {0.01f, 0, 0, 0, 0, 1}}, 2, {SH(7, 9), SH(7, 9)}, .tol = ARITH, .alias = {1}},
    {"adamw_step", CK_OP_ADAMW_STEP, {.i = {0}, .f = {0.9f, 0.999f, 1e-8f, 0.01f, 0, 1}}, 4, {SH(5, 13), SH(5, 13), SH(5, 13), SH(5, 13)},
     .kind = {UNIFORM, UNIFORM, UNIFORM, POSITIVE}, .tol = 1e-5, .alias = {1, 3, 4}},
    {"adamw_step, lr multiplier 16 (LoRA+)", CK_OP_ADAMW_STEP, {.i = {0}, .f = {0.9f, 0.999f, 1e-8f, 0.01f, 0, 16}}, 4,
     {SH(5, 13), SH(5, 13), SH(5, 13), SH(5, 13)}, .kind = {UNIFORM, UNIFORM, UNIFORM, POSITIVE}, .tol = 1e-5,
     .alias = {1, 3, 4}},
    {"adamw8_step, 300 values (a short block)", CK_OP_ADAMW8_STEP, {.i = {0}, .f = {0.9f, 0.999f, 1e-8f, 0.01f, 0, 1}}, 4,
     {SH(3, 100), SH(3, 100), SH(600), SH(4)}, .kind = {UNIFORM, UNIFORM, BYTES, POSITIVE}, .tol = 1e-5,
     .alias = {1, 3, 4}, .bytes = 2},
    {"lion_step", CK_OP_LION_STEP, {.i = {0}, .f = {0.9f, 0.99f, 0.01f, 0, 0, 2.5f}}, 3, {SH(7, 11), SH(7, 11), SH(7, 11)},
     .tol = 1e-5, .alias = {1, 3}},
    /* stats.cu */
    {"stats", CK_OP_STATS, {.i = {0}}, 1, {SH(3, 5, 701)}, .tol = F32},
    {"sumsq", CK_OP_SUMSQ, {.i = {0}}, 1, {SH(100003)}, .tol = F32},
    {"sumsq of 4 tensors", CK_OP_SUMSQ, {.i = {0}}, 4, {SH(7), SH(3, 4099), SH(1), SH(9000, 3)}, .tol = F32},
    {"sumsq, a running total and 3 tensors", CK_OP_SUMSQ, {.i = {1}}, 4, {SCALAR, SH(5000), SH(2, 3), SH(700)},
     .kind = {TIMESTEPS}, .tol = F32},
    /* optim.cu: the same fp32 sqrt and division (IEEE on both) */
    {"clip_factor, clipping", CK_OP_CLIP_FACTOR, {.f = {0.01f}}, 1, {SCALAR}, .kind = {POSITIVE}, .tol = EXACT},
    {"clip_factor, no clipping", CK_OP_CLIP_FACTOR, {.f = {10.0f}}, 1, {SH(1)}, .kind = {POSITIVE}, .tol = EXACT},
};

/* The cases of the given ops again under another setting of the context. */
static void rerun(const enum ck_op *ops, const char *what, double tol, int emulated)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tcase t = cases[i];
        int hit = 0;
        for (int k = 0; ops[k] != CK_OP_NONE; k++) hit |= t.op == ops[k];
        if (!hit || (t.big && emulated)) continue;
        char label[160];
        snprintf(label, sizeof label, "%s, %s", t.label, what);
        t.label = label;
        if (tol > 0) t.tol = tol;
        run_case(&t, CK_F32);
    }
}

/* A kernel with no context bound fails and names the op; nothing runs. */
static void unbound_context_names_the_op(ck_cuda_ctx *c)
{
    float *d = ck_cuda_alloc(64);
    ck_view v = {d, 1, {4}};
    ck_cuda_bind(NULL);
    ck_cuda_kernels[CK_OP_SILU](&base_ctx, &(ck_op_params){.i = {0}}, &v, 1, &v, 1);
    const int ok = ck_cuda_failed() && strstr(ck_cuda_last_error(), "silu") &&
                   strstr(ck_cuda_last_error(), "no CUDA context");
    report(ok, "unbound context: \"%s\"", ck_cuda_last_error());
    ck_cuda_clear_error();
    ck_cuda_bind(c);
    ck_cuda_free(d);
}

/* A workspace smaller than the rule's is refused with the op's name, and the
 * first failure is kept while later ops do nothing. */
static void short_workspace_names_the_op(void)
{
    const int64_t n = 2 * 9 * 12;
    float *d = ck_cuda_alloc(sizeof(float) * (size_t)n * 4);
    ck_view in[4], out[3];
    for (int j = 0; j < 4; j++) in[j] = (ck_view){d + j * (n / 2), 3, {2, 9, 6}};
    for (int k = 0; k < 3; k++) out[k] = in[k];
    ck_op_params p = {.i = {2}};
    ck_kctx ctx = base_ctx; /* no workspace at all */
    ck_cuda_kernels[CK_OP_ATTENTION_BWD](&ctx, &p, out, 3, in, 4);
    ck_cuda_kernels[CK_OP_SILU](&ctx, &p, out, 1, in, 1);
    const int ok = ck_cuda_failed() && strncmp(ck_cuda_last_error(), "attention_bwd: ", 15) == 0;
    report(ok, "short workspace: \"%s\"", ck_cuda_last_error());
    ck_cuda_clear_error();
    /* group norm keeps its partial sums in the workspace */
    const ck_op_params gp = {.i = {3}, .f = {1e-5f}};
    ck_cuda_kernels[CK_OP_GROUP_NORM_SILU](&ctx, &gp, out, 1, in, 3);
    const int gok = ck_cuda_failed() && strncmp(ck_cuda_last_error(), "group_norm_silu: workspace", 26) == 0;
    report(gok, "short workspace: \"%s\"", ck_cuda_last_error());
    ck_cuda_clear_error();
    ck_cuda_free(d);
}

/* 16-bit attention (bf16 or fp16) runs on tensor cores for head dims up to
 * 256; a wider head is refused, naming the op, and nothing is written. */
static void attention16_wide_head_names_the_op(ck_dtype st)
{
    const int64_t n = 2 * 3 * 320;
    const char *name = st == CK_F16 ? "fp16" : "bf16";
    uint16_t *d = ck_cuda_alloc(sizeof(uint16_t) * (size_t)n * 4);
    uint16_t h[2 * 3 * 320], back[2 * 3 * 320];
    for (int64_t i = 0; i < n; i++) h[i] = to_16(st, 0.5f);
    for (int j = 0; j < 4; j++) ck_cuda_upload(d + j * n, h, sizeof h);
    ck_view in[4], out[1];
    for (int j = 0; j < 3; j++) in[j] = (ck_view){(float *)(d + j * n), 3, {2, 3, 320}};
    out[0] = (ck_view){(float *)(d + 3 * n), 3, {2, 3, 320}}; /* 16-bit data */
    (st == CK_F16 ? ck_cuda_kernels_f16 : ck_cuda_kernels_bf16)[CK_OP_ATTENTION](&base_ctx, &(ck_op_params){.i = {1}},
                                                                                 out, 1, in, 3);
    char want[64];
    snprintf(want, sizeof want, "attention_%s: head dim 320", st == CK_F16 ? "f16" : "bf16");
    const int failed_ok = ck_cuda_failed() && strstr(ck_cuda_last_error(), want) &&
                          strstr(ck_cuda_last_error(), "up to 256");
    char got[256];
    snprintf(got, sizeof got, "%s", ck_cuda_last_error());
    ck_cuda_clear_error();
    const int untouched = ck_cuda_download(back, out[0].data, sizeof back) == 0 && memcmp(back, h, sizeof h) == 0;
    report(failed_ok && untouched, "%s attention with head dim 320: \"%s\"%s", name, got,
           untouched ? "" : ", output written");
    ck_cuda_free(d);
}

/* An embedding id outside the table gives NaN rows and a failure naming the
 * op, the first bad id and its index, as on the CPU; the good rows are copied. */
static void embedding_bad_id_names_the_op(void)
{
    const int64_t N = 300, V = 16, D = 5;
    float ids[300], table[80], y[1500];
    for (int64_t n = 0; n < N; n++) ids[n] = (float)(n % V);
    ids[257] = 16.0f, ids[299] = -3.0f, ids[280] = 1.5f; /* the first bad one is at 257 */
    fill(table, V * D, UNIFORM);
    float *d = ck_cuda_alloc(sizeof(float) * (size_t)(N + V * D + N * D));
    ck_cuda_upload(d, ids, sizeof ids);
    ck_cuda_upload(d + N, table, sizeof table);
    ck_view in[2] = {{d, 1, {N}}, {d + N, 2, {V, D}}}, out[1] = {{d + N + V * D, 2, {N, D}}};
    ck_cuda_kernels[CK_OP_EMBEDDING](&base_ctx, &(ck_op_params){.i = {0}}, out, 1, in, 2);
    const char *want = "embedding: id 16 at index 257 is not a row of the [16, 5] table (whole numbers 0 to 15)";
    int ok = ck_cuda_failed() && strcmp(ck_cuda_last_error(), want) == 0;
    char got[512];
    snprintf(got, sizeof got, "%s", ck_cuda_last_error());
    ck_cuda_clear_error();
    ok &= ck_cuda_download(y, out[0].data, sizeof y) == 0;
    for (int64_t n = 0; n < N && ok; n++)
        for (int64_t d2 = 0; d2 < D; d2++) {
            const float v = y[n * D + d2];
            ok &= n == 257 || n == 280 || n == 299 ? isnan(v) : v == table[(int64_t)ids[n] * D + d2];
        }
    report(ok, "embedding with bad ids: NaN rows, good rows copied, \"%s\"", got);
    ck_cuda_free(d);
}

/* The executor's arena helpers: sentinel fill and high-water scan (measured
 * peaks), and the finiteness check (the step guard). */
static void arena_helpers(void)
{
    const size_t n = 100000;
    const uint32_t sentinel = 0x7fa5a5a5u, mark = 1;
    uint32_t *w = ck_cuda_alloc(n * 4);
    size_t top = 0, empty = 0;
    int ok = ck_cuda_fill_u32(w, sentinel, n) == 0 && ck_cuda_high_water(w, 100, n, sentinel, &empty) == 0;
    ok = ok && ck_cuda_upload(w + 1234, &mark, 4) == 0 && ck_cuda_upload(w + 77777, &mark, 4) == 0 &&
         ck_cuda_high_water(w, 100, n, sentinel, &top) == 0;
    report(ok && empty == 100 && top == 77778, "high water: %zu words (expect 77778), untouched %zu (expect 100)", top,
           empty);
    ck_cuda_free(w);

    float *h = malloc(sizeof(float) * n), *d = ck_cuda_alloc(sizeof(float) * n);
    fill(h, (int64_t)n, WIDE);
    int fin[3] = {-1, -1, -1};
    ck_cuda_upload(d, h, sizeof(float) * n);
    ck_cuda_all_finite(d, (int64_t)n, &fin[0]);
    h[n - 7] = INFINITY;
    ck_cuda_upload(d, h, sizeof(float) * n);
    ck_cuda_all_finite(d, (int64_t)n, &fin[1]);
    h[n - 7] = 0.0f, h[3] = NAN;
    ck_cuda_upload(d, h, sizeof(float) * n);
    ck_cuda_all_finite(d, (int64_t)n, &fin[2]);
    report(!ck_cuda_failed() && fin[0] == 1 && fin[1] == 0 && fin[2] == 0, "all_finite: %d %d %d (expect 1 0 0)",
           fin[0], fin[1], fin[2]);
    ck_cuda_clear_error();
    free(h);
    ck_cuda_free(d);

    /* fp8 frozen weights: every code read as fp32 on the device as the CPU reads it (NaN as NaN) */
    uint8_t codes[256];
    float got[256];
    for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
    uint8_t *d8 = ck_cuda_alloc(256);
    float *d32 = ck_cuda_alloc(sizeof got);
    ok = ck_cuda_upload(d8, codes, 256) == 0 && ck_cuda_convert(d32, CK_F32, d8, CK_F8E4M3, 256) == 0 &&
         ck_cuda_download(got, d32, sizeof got) == 0;
    int wrong = 0;
    for (int c = 0; c < 256; c++) {
        const float want = ck_f8e4m3_decode((uint8_t)c);
        wrong += isnan(want) ? !isnan(got[c]) : memcmp(&want, &got[c], sizeof want) != 0;
    }
    report(ok && wrong == 0, "convert fp8 -> fp32: the 256 codes as the CPU decodes them (%d differ)", wrong);
    ck_cuda_clear_error();
    /* fp8 -> bf16 (an fp8 base cast for a bf16 product): exact, NaN as NaN */
    uint16_t got16[256];
    ok = ck_cuda_convert(d32, CK_BF16, d8, CK_F8E4M3, 256) == 0 && ck_cuda_download(got16, d32, sizeof got16) == 0;
    wrong = 0;
    for (int c = 0; c < 256; c++) {
        const float want = ck_f8e4m3_decode((uint8_t)c), back = from_bf16(got16[c]);
        wrong += isnan(want) ? !isnan(back) : memcmp(&want, &back, sizeof want) != 0;
    }
    report(ok && wrong == 0, "convert fp8 -> bf16: the 256 codes exactly (%d differ)", wrong);
    ck_cuda_clear_error();
    ck_cuda_free(d8);
    ck_cuda_free(d32);
}

#ifdef CK_CUDA_EMU
/* the emulator's hooks (tests/cuda_emu): each algorithm's workspace and
 * made-up time, the algorithms the last calls ran, searches so far, and the
 * workspace cuBLASLt's one algorithm claims */
extern size_t ck_emu_conv_ws[3][8];
extern float ck_emu_conv_ms[3][8];
extern int ck_emu_last_algo[3];
extern int ck_emu_find_calls;
extern size_t ck_emu_lt_ws;

/* Runs op once on zeros with the workspace ws_bytes (out[0] preset): 0, or -1
 * with the failure kept. */
static int run_once(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out0, int bf16,
                    size_t ws_bytes)
{
    ck_shape out[CK_MAX_OUT];
    char err[128];
    memset(out, 0, sizeof out);
    out[0] = *out0;
    if (ck_op_infer(op, p, in, nin, out, err, sizeof err)) return -1;
    ck_view vin[CK_MAX_IN], vout[CK_MAX_OUT];
    float *bufs[CK_MAX_IN + CK_MAX_OUT] = {0};
    int nb = 0;
    for (int j = 0; j < nin; j++) {
        bufs[nb] = dev_alloc(ck_shape_numel(&in[j]), CK_F32);
        ck_cuda_memset(bufs[nb], 0, 4 * (size_t)ck_shape_numel(&in[j]));
        vin[j] = view(bufs[nb++], &in[j]);
    }
    for (int k = 0; k < ck_op_nout(op); k++) {
        bufs[nb] = dev_alloc(ck_shape_numel(&out[k]), CK_F32);
        vout[k] = view(bufs[nb++], &out[k]);
    }
    float *ws = ws_bytes ? dev_alloc((int64_t)((ws_bytes + 3) / 4), CK_F32) : NULL;
    ck_kctx ctx = base_ctx;
    ctx.ws = ws, ctx.ws_bytes = ws_bytes;
    (bf16 ? ck_cuda_kernels_bf16 : ck_cuda_kernels)[op](&ctx, p, vout, ck_op_nout(op), vin, nin);
    const int rc = ck_cuda_failed() || ck_cuda_sync() ? -1 : 0;
    for (int i = 0; i < nb; i++) ck_cuda_free(bufs[i]);
    ck_cuda_free(ws);
    return rc;
}

/* Per shape the fastest algorithm that fits the cap (and is deterministic
 * unless that is off) is chosen once: its workspace is what the plan gives
 * the op, and the kernel given that workspace runs it. */
static void algorithm_choice(ck_cuda_ctx *c)
{
    size_t saved[3][8];
    memcpy(saved, ck_emu_conv_ws, sizeof saved);
    /* forward: FFT (4) fastest at 3 MiB, precomputed implicit GEMM (1) next at
     * 4 KiB, implicit GEMM (0) slowest at none */
    ck_emu_conv_ws[0][4] = (size_t)3 << 20;
    const ck_op_params p = {.i = {1, 1, 1, 1}};
    const ck_shape fin[2] = {SH(1, 4, 6, 6), SH(5, 4, 3, 3)};
    ck_shape fout[1] = {SH(1, 5, 6, 6)};
    /* bf16 runs under tensor-op math, where (1) needs 5264 bytes more than
     * the search lists (ck_emu_conv_tensor_ws, as on an H200): the plan gives
     * what the kernel's math needs, or the next algorithm */
    const size_t caps[4] = {(size_t)8 << 20, 5000, 10000, 0};
    const size_t want_ws[4][2] = {{(size_t)3 << 20, (size_t)3 << 20}, {4096, 0}, {4096, 4096 + 5264}, {0, 0}};
    const int want_algo[4][2] = {{4, 4}, {1, 0}, {1, 1}, {0, 0}};
    for (int k = 0; k < 4; k++) {
        ck_cuda_set_conv_workspace_cap(c, caps[k]);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int before = ck_emu_find_calls;
            const size_t ws = ck_cuda_workspace(CK_OP_CONV2D, &p, fin, 2, fout, bf16);
            const int searched = ck_emu_find_calls - before;
            const size_t again = ck_cuda_workspace(CK_OP_CONV2D, &p, fin, 2, fout, bf16);
            ck_emu_last_algo[0] = -1;
            const int rc = run_once(CK_OP_CONV2D, &p, fin, 2, fout, bf16, ws);
            report(rc == 0 && ws == want_ws[k][bf16] && again == ws && searched == 1 &&
                       ck_emu_find_calls - before == 1 && ck_emu_last_algo[0] == want_algo[k][bf16],
                   "conv2d%s under a cap of %zu bytes: algorithm %d (expect %d) planned with %zu bytes (expect %zu), "
                   "searched %d time(s), kernel ran it%s",
                   bf16 ? " bf16" : "", caps[k], ck_emu_last_algo[0], want_algo[k][bf16], ws, want_ws[k][bf16],
                   ck_emu_find_calls - before, rc ? ck_cuda_last_error() : "");
            ck_cuda_clear_error();
        }
    }
    ck_cuda_set_conv_workspace_cap(c, CK_CUDA_CONV_WS_CAP);

    /* data gradient: ALGO_0 (nondeterministic) beats ALGO_1 (deterministic) */
    const ck_shape din[2] = {SH(1, 5, 6, 6), SH(5, 4, 3, 3)};
    ck_shape dout[1] = {SH(1, 4, 6, 6)};
    for (int det = 1; det >= 0; det--) {
        ck_cuda_set_deterministic(c, det);
        const size_t ws = ck_cuda_workspace(CK_OP_CONV2D_BWD_DATA, &p, din, 2, dout, 0);
        ck_emu_last_algo[1] = -1;
        const int rc = run_once(CK_OP_CONV2D_BWD_DATA, &p, din, 2, dout, 0, ws);
        const int want = det ? 1 : 0;
        report(rc == 0 && ck_emu_last_algo[1] == want && ws == ck_emu_conv_ws[1][want],
               "conv2d_bwd_data, deterministic %d: algorithm %d (expect %d), workspace %zu", det, ck_emu_last_algo[1],
               want, ws);
        ck_cuda_clear_error();
    }
    ck_cuda_set_deterministic(c, 1);

    /* a workspace short of every algorithm: fp32 falls back to im2col, bf16 names the op */
    for (int k = 0; k < 8; k++) ck_emu_conv_ws[0][k] = (size_t)1 << 30;
    const ck_shape gin[2] = {SH(1, 3, 5, 5), SH(2, 3, 3, 3)};
    ck_shape gout[1] = {SH(1, 2, 5, 5)};
    const size_t ws32 = ck_cuda_workspace(CK_OP_CONV2D, &p, gin, 2, gout, 0);
    const size_t cols = ck_op_workspace_cuda(CK_OP_CONV2D, &p, gin, 2, gout, 1);
    ck_emu_last_algo[0] = -1;
    const int rc32 = run_once(CK_OP_CONV2D, &p, gin, 2, gout, 0, ws32);
    report(rc32 == 0 && ws32 == cols && ck_emu_last_algo[0] == -1,
           "conv2d with no algorithm under the cap: the im2col workspace (%zu bytes, expect %zu), no cuDNN call", ws32, cols);
    ck_cuda_clear_error();
    const int rc16 = run_once(CK_OP_CONV2D, &p, gin, 2, gout, 1, ck_cuda_workspace(CK_OP_CONV2D, &p, gin, 2, gout, 1));
    report(rc16 != 0 && strstr(ck_cuda_last_error(), "conv2d: no cuDNN bf16 algorithm"), "conv2d bf16 with no algorithm: \"%s\"",
           ck_cuda_last_error());
    ck_cuda_clear_error();
    memcpy(ck_emu_conv_ws, saved, sizeof saved);
}

/* A bf16 product runs in the workspace its rule gives; an algorithm that
 * would need more is not taken (here: none is left, and the op says so). */
static void lt_workspace(void)
{
    const ck_op_params p = {.i = {0}};
    const ck_shape in[3] = {SH(3, 8), SH(5, 8), SH(5)};
    ck_shape out[1] = {SH(3, 5)};
    const size_t ws = ck_cuda_workspace(CK_OP_LINEAR, &p, in, 3, out, 1);
    ck_emu_lt_ws = ws;
    const int fits = run_once(CK_OP_LINEAR, &p, in, 3, out, 1, ws);
    ck_cuda_clear_error();
    ck_emu_lt_ws = ws + 1;
    const int over = run_once(CK_OP_LINEAR, &p, in, 3, out, 1, ws);
    report(ws == 3 * 5 * 4 && fits == 0 && over != 0 && strstr(ck_cuda_last_error(), "linear: "),
           "linear bf16: the planned %zu bytes suffice; an algorithm needing one more is refused (\"%s\")", ws,
           ck_cuda_last_error());
    ck_cuda_clear_error();
    ck_emu_lt_ws = 0;
}
#endif

int main(void)
{
    if (ck_cuda_device_count() == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    match = getenv("CK_TEST_MATCH");
    setvbuf(stdout, NULL, _IOLBF, 0);
    ck_cuda_ctx *c = ck_cuda_open(0);
    if (!c) {
        printf("FAIL: %s\n", ck_cuda_last_error());
        return 1;
    }
#ifdef CK_CUDA_EMU
    printf("(the CUDA kernels under the CPU emulator: not a GPU run)\n");
    /* CK_TEST_BIG=1: the device-size cases too (minutes) */
    const char *big = getenv("CK_TEST_BIG");
    const int emulated = !(big && big[0] == '1');
#else
    const int emulated = 0;
#endif
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].big && emulated) {
            skipped++;
            continue;
        }
        if (!cases[i].bf16_only) run_case(&cases[i], CK_F32);
    }
    // bf16 storage, where the op has it
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (ck_cuda_kernels_bf16[cases[i].op] && !(cases[i].big && emulated)) run_case(&cases[i], CK_BF16);
    // fp16 storage, where the op has it (every op with bf16 storage)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (ck_cuda_kernels_f16[cases[i].op] && !(cases[i].big && emulated)) run_case(&cases[i], CK_F16);

    // cuDNN's heuristic choice (determinism off), our im2col path, TF32 products
    static const enum ck_op convs[] = {CK_OP_CONV2D, CK_OP_CONV2D_BWD_DATA, CK_OP_CONV2D_BWD_FILTER, CK_OP_NONE};
    static const enum ck_op products[] = {CK_OP_CONV2D, CK_OP_MATMUL, CK_OP_LINEAR, CK_OP_NONE};
    ck_cuda_set_deterministic(c, 0);
    nondeterministic = 1;
    rerun(convs, "heuristic algorithm", 0, emulated);
    nondeterministic = 0;
    ck_cuda_set_deterministic(c, 1);
    ck_cuda_set_conv_im2col(c, 1);
    rerun(convs, "im2col", 0, emulated);
    columns_only = 5; /* chunks of 5 output pixels: chunk edges inside rows */
    rerun(convs, "im2col in chunks of 5 columns", 0, emulated);
    columns_only = 0;
    ck_cuda_set_conv_im2col(c, 0);
    ck_cuda_set_tf32(c, 1);
    rerun(products, "TF32", 1e-2, emulated);
    ck_cuda_set_tf32(c, 0);

    arena_helpers();
#ifdef CK_CUDA_EMU
    algorithm_choice(c);
    lt_workspace();
#endif
    unbound_context_names_the_op(c);
    short_workspace_names_the_op();
    attention16_wide_head_names_the_op(CK_BF16);
    attention16_wide_head_names_the_op(CK_F16);
    embedding_bad_id_names_the_op();

    int covered[CK_OP_COUNT] = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) covered[cases[i].op] = 1;
    for (int op = 1; op < CK_OP_COUNT; op++)
        if (ck_cpu_kernels[op] && !covered[op]) report(0, "%s has no test case here", ck_op_name((enum ck_op)op));

    ck_cuda_close(c);
    printf("%d passed, %d failed", passed, failed);
    if (skipped) printf(", %d device-only cases skipped", skipped);
    printf("\n");
    return failed ? 1 : 0;
}

#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit\n");
    return 77;
}
#endif
