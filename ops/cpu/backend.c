/* The CPU backend (ops/backend.h): the arena is host memory. */
#include "../backend.h"
#include "../bf16.h"
#include "../fp8.h"
#include "../fp16.h"
#include "cpu.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void enter(void) {}

static void *alloc(size_t bytes)
{
    /* 64-byte aligned, with a line of slack past the end */
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

static void release(void *p) { free(p); }

static int copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

#define CONVERT_RUN 4096

float ck_f8e4m3_values[256];

__attribute__((constructor)) static void fp8_values(void)
{
    for (int c = 0; c < 256; c++) ck_f8e4m3_values[c] = ck_f8e4m3_decode((uint8_t)c);
}

static int convert(void *dst, ck_dtype to, const void *src, ck_dtype from, int64_t n)
{
    if (to == from) return copy(dst, src, (size_t)n * ck_dtype_bytes(to));
    /* fp32 <-> bf16, fp32 <-> fp16, and fp8 -> fp32, bf16 or fp16 (fp8 tensors are frozen: written from the
     * host only; every fp8 value is a bf16 and an fp16 value) */
    if (!(((to == CK_BF16 || to == CK_F16) && (from == CK_F32 || from == CK_F8E4M3)) ||
          (to == CK_F32 && (from == CK_BF16 || from == CK_F16 || from == CK_F8E4M3))))
        return -1;
    /* runs of CONVERT_RUN values, one per task */
    const int64_t runs = (n + CONVERT_RUN - 1) / CONVERT_RUN;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t r = 0; r < runs; r++) {
        const int64_t i = r * CONVERT_RUN, m = n - i < CONVERT_RUN ? n - i : CONVERT_RUN;
        if (to == CK_BF16 && from == CK_F8E4M3)
            for (int64_t k = 0; k < m; k++)
                ((uint16_t *)dst)[i + k] = ck_bf16_from_f32(ck_f8e4m3_values[((const uint8_t *)src)[i + k]]);
        else if (to == CK_F16 && from == CK_F8E4M3)
            for (int64_t k = 0; k < m; k++)
                ((uint16_t *)dst)[i + k] = ck_f16_from_f32(ck_f8e4m3_values[((const uint8_t *)src)[i + k]]);
        else if (to == CK_BF16) ck_bf16_store((uint16_t *)dst + i, (const float *)src + i, m);
        else if (from == CK_BF16) ck_bf16_load((float *)dst + i, (const uint16_t *)src + i, m);
        else if (to == CK_F16) ck_f16_store((uint16_t *)dst + i, (const float *)src + i, m);
        else if (from == CK_F16) ck_f16_load((float *)dst + i, (const uint16_t *)src + i, m);
        else
            for (int64_t k = 0; k < m; k++) ((float *)dst)[i + k] = ck_f8e4m3_values[((const uint8_t *)src)[i + k]];
    }
    return 0;
}

static int fill_u32(void *dst, uint32_t v, size_t nwords)
{
    uint32_t *w = dst;
    for (size_t i = 0; i < nwords; i++) w[i] = v;
    return 0;
}

static int high_water(const void *base, size_t lo, size_t hi, uint32_t v, size_t *top)
{
    const uint32_t *w = base;
    for (size_t i = hi; i > lo; i--)
        if (w[i - 1] != v) {
            *top = i;
            return 0;
        }
    *top = lo;
    return 0;
}

static int all_finite(const float *x, int64_t n, int *finite)
{
    /* x * 0 is 0 for every finite x and NaN otherwise; eight lanes vectorize */
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * 0.0f;
    float t = 0;
    for (; i < n; i++) t += x[i] * 0.0f;
    for (int k = 0; k < 8; k++) t += acc[k];
    *finite = t == 0.0f;
    return 0;
}

static int sync(void) { return 0; }

/* offload: the host region is plain memory and a transfer a copy, done when it returns */
static void *pinned_alloc(size_t bytes) { return alloc(bytes); }
static int xfer_open(int nslots) { return (void)nslots, 0; }
static int xfer_start(void *dst, const void *src, size_t bytes, int slot) { return (void)slot, copy(dst, src, bytes); }
static int xfer_wait(int slot) { return (void)slot, 0; }
static int xfer_join(void) { return 0; }

/* Kernels that meet bad data (an embedding id outside its table) record it
 * here; the executor reads it after each op. One message per thread, as each
 * VM's executor runs its kernels on its own thread. */
static _Thread_local char cpu_err[256];

void ck_cpu_fail(const char *op, const char *fmt, ...)
{
    if (cpu_err[0]) return; /* the first cause is kept */
    int k = snprintf(cpu_err, sizeof cpu_err, "%s: ", op);
    if (k < 0 || (size_t)k >= sizeof cpu_err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cpu_err + k, sizeof cpu_err - (size_t)k, fmt, ap);
    va_end(ap);
}

const char *ck_cpu_last_error(void) { return cpu_err; }
void ck_cpu_clear_error(void) { cpu_err[0] = 0; }

static ck_backend be;
static pthread_once_t be_once = PTHREAD_ONCE_INIT;

static void be_make(void)
{
    ck_backend b = {
        .name = "cpu",
        .kernels = ck_cpu_kernels,
        .kernels_bf16 = ck_cpu_kernels_bf16,
        .kernels_f16 = ck_cpu_kernels_f16,
        .workspace = ck_op_workspace,
        .workspace_bf16 = ck_op_workspace_cpu_bf16,
        .nthreads = 1,
        .host = 1,
        .fixed_bytes = 0,
        .granule = 1,
        .enter = enter,
        .alloc = alloc,
        .release = release,
        .upload = copy,
        .download = copy,
        .copy = copy,
        .convert = convert,
        .fill_u32 = fill_u32,
        .high_water = high_water,
        .all_finite = all_finite,
        .sync = sync,
        .error = ck_cpu_last_error,
        .clear_error = ck_cpu_clear_error,
        .pinned_alloc = pinned_alloc,
        .pinned_release = release,
        .xfer_open = xfer_open,
        .xfer_start = xfer_start,
        .xfer_wait = xfer_wait,
        .xfer_join = xfer_join,
    };
    be = b;
    be.nthreads = ck_cpu_threads();
}

/* One backend for every thread, made once. Workspace rules follow the thread
 * count of the moment, stored only when it changes, so that threads of one
 * OpenMP setting (every VM of a host, as a rule) only ever read it. */
const ck_backend *ck_backend_cpu(void)
{
    pthread_once(&be_once, be_make);
    const int n = ck_cpu_threads();
    if (__atomic_load_n(&be.nthreads, __ATOMIC_RELAXED) != n) __atomic_store_n(&be.nthreads, n, __ATOMIC_RELAXED);
    return &be;
}
