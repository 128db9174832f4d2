/* The CPU kernel tables, generated from ops.def (designated initializers). */
#include "cpu.h"

#include <omp.h>

int ck_cpu_threads(void) { return omp_get_max_threads(); }

/* op -> kernel for each storage, from ops.def's cpu column (F32: the fp32
 * table; F32_BF16: bf16's too; F32_BF16_F16: fp16's too) */
#define K32_NO(E, id)
#define K32_F32(E, id) [CK_OP_##E] = ck_cpu_##id,
#define K32_F32_BF16(E, id) K32_F32(E, id)
#define K32_F32_BF16_F16(E, id) K32_F32(E, id)
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) K32_##cpu(E, id)
const ck_kernel_fn ck_cpu_kernels[CK_OP_COUNT] = {
#include "../ops.def"
};

#define KBF_NO(E, id)
#define KBF_F32(E, id)
#define KBF_F32_BF16(E, id) [CK_OP_##E] = ck_cpu_##id##_bf16,
#define KBF_F32_BF16_F16(E, id) KBF_F32_BF16(E, id)
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) KBF_##cpu(E, id)
const ck_kernel_fn ck_cpu_kernels_bf16[CK_OP_COUNT] = {
#include "../ops.def"
};

#define KF16_NO(E, id)
#define KF16_F32(E, id)
#define KF16_F32_BF16(E, id)
#define KF16_F32_BF16_F16(E, id) [CK_OP_##E] = ck_cpu_##id##_f16,
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) KF16_##cpu(E, id)
const ck_kernel_fn ck_cpu_kernels_f16[CK_OP_COUNT] = {
#include "../ops.def"
};
