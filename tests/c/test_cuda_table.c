/* The CUDA backend has a kernel for every op the CPU backend has, and for no
 * op the CPU lacks (its bf16 kernels are a subset of its fp32 ones, and the
 * ones plans without a device assume, ck_cuda_bf16_op). Runs without a
 * device: it only reads the tables. */
#include "cpu/cpu.h"

#include <stdio.h>

#ifdef CK_HAVE_CUDA
#include "cuda/cuda.h"

int main(void)
{
    int missing = 0, extra = 0, both = 0;
    for (int op = 1; op < CK_OP_COUNT; op++) {
        const int cpu = ck_cpu_kernels[op] != NULL, gpu = ck_cuda_kernels[op] != NULL;
        if (cpu && !gpu) printf("FAIL: %s has a CPU kernel and no CUDA kernel\n", ck_op_name((enum ck_op)op)), missing++;
        if (gpu && !cpu) printf("FAIL: %s has a CUDA kernel and no CPU kernel\n", ck_op_name((enum ck_op)op)), extra++;
        both += cpu && gpu;
        if (ck_cuda_kernels_bf16[op] && !gpu)
            printf("FAIL: %s has a bf16 CUDA kernel and no fp32 one\n", ck_op_name((enum ck_op)op)), extra++;
        if ((ck_cuda_kernels_bf16[op] != NULL) != ck_cuda_bf16_op((enum ck_op)op))
            printf("FAIL: %s: ck_cuda_bf16_op (plans made without a device) disagrees with the bf16 table\n",
                   ck_op_name((enum ck_op)op)), extra++;
    }
    printf("%d ops on both backends, %d without a CUDA kernel, %d without a CPU kernel\n", both, missing, extra);
    return missing || extra || both == 0;
}
#else
int main(void)
{
    printf("SKIP: built without the CUDA toolkit\n");
    return 77;
}
#endif
