/* The CUDA backend has a kernel for every op the CPU backend has and for no
 * op the CPU lacks, its 16-bit storages nest (fp16 only where bf16, bf16
 * only where fp32), and what plans made without a device take for its
 * 16-bit ops (ck_cuda_bf16_op, ck_cuda_f16_op) is what its tables hold (the
 * tables are generated from ops.def's cuda column). Runs without a device:
 * it only reads the tables. */
#include "cpu/cpu.h"

#include <stdio.h>

#ifdef CK_HAVE_CUDA
#include "cuda/cuda.h"

int main(void)
{
    int bad = 0, both = 0;
    for (int op = 0; op < CK_OP_COUNT; op++) {
        const int cpu = ck_cpu_kernels[op] != NULL, gpu = ck_cuda_kernels[op] != NULL;
        if (cpu != gpu)
            printf("FAIL: %s has a %s kernel and no %s kernel\n", ck_op_name((enum ck_op)op), cpu ? "CPU" : "CUDA",
                   cpu ? "CUDA" : "CPU"), bad++;
        if (ck_cuda_kernels_bf16[op] && !gpu)
            printf("FAIL: %s has a bf16 CUDA kernel and no fp32 one\n", ck_op_name((enum ck_op)op)), bad++;
        if (ck_cuda_kernels_f16[op] && !ck_cuda_kernels_bf16[op])
            printf("FAIL: %s has an fp16 CUDA kernel and no bf16 one\n", ck_op_name((enum ck_op)op)), bad++;
        if ((ck_cuda_kernels_f16[op] != NULL) != ck_cuda_f16_op((enum ck_op)op))
            printf("FAIL: %s: ck_cuda_f16_op (plans made without a device) disagrees with the fp16 table\n",
                   ck_op_name((enum ck_op)op)), bad++;
        if ((ck_cuda_kernels_bf16[op] != NULL) != ck_cuda_bf16_op((enum ck_op)op))
            printf("FAIL: %s: ck_cuda_bf16_op (plans made without a device) disagrees with the bf16 table\n",
                   ck_op_name((enum ck_op)op)), bad++;
        both += cpu && gpu;
    }
    printf("%d ops on both backends, %d disagreements with ops.def or the CPU\n", both, bad);
    return bad || both == 0;
}
#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit\n");
    return 77;
}
#endif
