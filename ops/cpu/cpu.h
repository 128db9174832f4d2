/* The CPU backend: one kernel per op (ops/ops.h gives each op's contract),
 * fp32, deterministic at a given thread count. Threads come from OpenMP
 * (static schedules, fixed reduction order); OpenBLAS is the OpenMP build and
 * is only called outside our own parallel regions, so there is one pool. */
#ifndef CK_CPU_H
#define CK_CPU_H

#include "../ops.h"
#include "../bf16.h"
#include "../fp16.h"

#define CK_CPU_KERNEL(name) \
    void name(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin)

/* 16-bit storage (st is CK_BF16 or CK_F16): the kernels with _bf16 and _f16
 * entry points share one body that takes st, and convert with these. */
static inline float ck_cpu_f32_of16(ck_dtype st, uint16_t h)
{
    return st == CK_F16 ? ck_f32_from_f16(h) : ck_f32_from_bf16(h);
}

static inline uint16_t ck_cpu_16_of_f32(ck_dtype st, float x)
{
    return st == CK_F16 ? ck_f16_from_f32(x) : ck_bf16_from_f32(x);
}

static inline void ck_cpu_load16(ck_dtype st, float *dst, const uint16_t *src, int64_t n)
{
    if (st == CK_F16) ck_f16_load(dst, src, n);
    else ck_bf16_load(dst, src, n);
}

static inline void ck_cpu_store16(ck_dtype st, uint16_t *dst, const float *src, int64_t n)
{
    if (st == CK_F16) ck_f16_store(dst, src, n);
    else ck_bf16_store(dst, src, n);
}

/* An op's ck_cpu_<op>_bf16 and _f16 entry points: each runs `call`, which may
 * use st (its storage type) and the kernel's arguments. */
#define CK_CPU_ENTRIES16(op, call)                                                                                   \
    CK_CPU_KERNEL(ck_cpu_##op##_bf16)                                                                                \
    {                                                                                                                \
        const ck_dtype st = CK_BF16;                                                                                 \
        (void)ctx, (void)p, (void)out, (void)nout, (void)in, (void)nin, (void)st;                                    \
        call;                                                                                                        \
    }                                                                                                                \
    CK_CPU_KERNEL(ck_cpu_##op##_f16)                                                                                 \
    {                                                                                                                \
        const ck_dtype st = CK_F16;                                                                                  \
        (void)ctx, (void)p, (void)out, (void)nout, (void)in, (void)nin, (void)st;                                    \
        call;                                                                                                        \
    }

/* A float run's sum in double, in eight lanes combined pairwise: vectorizes
 * without reassociating anything, and the order depends on n alone. The
 * reductions (loss, mean, sum, a convolution's bias gradient) sum so. */
static inline double ck_cpu_lanes8(const double *s, double tail)
{
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

static inline double ck_cpu_sum8(const float *x, int64_t n)
{
    double s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += (double)x[i + k];
    double t = 0;
    for (; i < n; i++) t += (double)x[i];
    return ck_cpu_lanes8(s, t);
}

/* A float run's sum (b NULL) or its dot product with b, in double over eight
 * interleaved lanes, the n % 8 values at the end summed first and the lanes
 * added to them in index order: as ck_cpu_sum8 vectorizes without
 * reassociating, in an order fixed by n alone, but its own order. The
 * softmax, attention and normalization rows sum so. */
static inline double ck_cpu_dot8(const float *a, const float *b, int64_t n)
{
    double acc[8] = {0}, s = 0;
    int64_t i = 0;
    if (!b) {
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += a[i + l];
        for (; i < n; i++) s += a[i];
    } else {
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)a[i + l] * b[i + l];
        for (; i < n; i++) s += (double)a[i] * b[i];
    }
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

/* How many fixed segments a reduction of n elements is cut into: one at or
 * below par_min (one thread beats waking the pool), else one per 16384
 * elements, at most CK_CPU_SEG_MAX. On shapes alone, so results do not depend on the
 * thread count. */
#define CK_CPU_SEG_MAX 64
static inline int64_t ck_cpu_segments(int64_t n, int64_t par_min)
{
    if (n <= par_min) return 1;
    const int64_t s = (n + 16384 - 1) / 16384;
    return s < CK_CPU_SEG_MAX ? s : CK_CPU_SEG_MAX;
}

/* Threads kernels may use (omp_get_max_threads()); workspace rules scale by it. */
int ck_cpu_threads(void);

/* A kernel's failure on bad data (backend.c): "op: message", kept until
 * cleared; the first one since the last clear wins. The CPU backend's error()
 * and clear_error() (ops/backend.h) are these two, per thread. */
void ck_cpu_fail(const char *op, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *ck_cpu_last_error(void);
void ck_cpu_clear_error(void);

extern const ck_kernel_fn ck_cpu_kernels[CK_OP_COUNT];
/* The ops with a kernel for bf16 storage (every tensor bf16, arithmetic in
 * fp32; the slots of ck_op_f32_inputs, ROPE's table, fp32): the activations,
 * softmax, the norms (GROUP_NORM_SILU and RMS_NORM among them), the
 * broadcasting add/sub/mul, scale, fill, the copies (permute among them), the
 * nearest 2x upsample and its backward, rope, adaLN's modulate and gate, and
 * the products and convolutions (widened into their workspace), as on the GPU
 * (ck_cuda_bf16_op), which has attention too. */
extern const ck_kernel_fn ck_cpu_kernels_bf16[CK_OP_COUNT];
/* fp16 storage: the same ops, each bf16 kernel's body run on fp16 (the GPU has
 * attention too, ck_cuda_f16_op). */
extern const ck_kernel_fn ck_cpu_kernels_f16[CK_OP_COUNT];

/* Every kernel, declared from ops.def's cpu column: ck_cpu_<id>, and
 * ck_cpu_<id>_bf16 and ck_cpu_<id>_f16 where the column has those storages. */
#define CK_CPU_DECL_NO(id)
#define CK_CPU_DECL_F32(id) CK_CPU_KERNEL(ck_cpu_##id);
#define CK_CPU_DECL_F32_BF16(id) CK_CPU_DECL_F32(id) CK_CPU_KERNEL(ck_cpu_##id##_bf16);
#define CK_CPU_DECL_F32_BF16_F16(id) CK_CPU_DECL_F32_BF16(id) CK_CPU_KERNEL(ck_cpu_##id##_f16);
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) CK_CPU_DECL_##cpu(id)
#include "../ops.def"

#endif
