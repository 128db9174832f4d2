/* The CUDA kernel tables (fp32, bf16 and fp16 storage), generated from
 * ops.def with designated initializers (plain C: C++ has none for arrays). */
#include "cuda.h"

/* op -> kernel for each storage, from ops.def's cuda column */
#define K32_NO(E, id)
#define K32_F32(E, id) [CK_OP_##E] = ck_cuda_##id,
#define K32_F32_BF16(E, id) K32_F32(E, id)
#define K32_F32_BF16_F16(E, id) K32_F32(E, id)
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) K32_##cuda(E, id)
const ck_kernel_fn ck_cuda_kernels[CK_OP_COUNT] = {
#include "../ops.def"
};

#define KBF_NO(E, id)
#define KBF_F32(E, id)
#define KBF_F32_BF16(E, id) [CK_OP_##E] = ck_cuda_##id##_bf16,
#define KBF_F32_BF16_F16(E, id) KBF_F32_BF16(E, id)
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) KBF_##cuda(E, id)
const ck_kernel_fn ck_cuda_kernels_bf16[CK_OP_COUNT] = {
#include "../ops.def"
};

#define KF16_NO(E, id)
#define KF16_F32(E, id)
#define KF16_F32_BF16(E, id)
#define KF16_F32_BF16_F16(E, id) [CK_OP_##E] = ck_cuda_##id##_f16,
#define CK_OP(E, id, nin_lo, nin_hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, lua) KF16_##cuda(E, id)
const ck_kernel_fn ck_cuda_kernels_f16[CK_OP_COUNT] = {
#include "../ops.def"
};
