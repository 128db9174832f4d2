/* The CPU kernel table: op -> kernel, filled with designated initializers. */
#include "cpu.h"

#include <omp.h>

int ck_cpu_threads(void) { return omp_get_max_threads(); }

const ck_kernel_fn ck_cpu_kernels[CK_OP_COUNT] = {
    [CK_OP_MATMUL] = ck_cpu_matmul,
    [CK_OP_LINEAR] = ck_cpu_linear,
    [CK_OP_CONV2D] = ck_cpu_conv2d,
    [CK_OP_CONV2D_BWD_DATA] = ck_cpu_conv2d_bwd_data,
    [CK_OP_CONV2D_BWD_FILTER] = ck_cpu_conv2d_bwd_filter,
    [CK_OP_GROUP_NORM] = ck_cpu_group_norm,
    [CK_OP_GROUP_NORM_BWD] = ck_cpu_group_norm_bwd,
    [CK_OP_LAYER_NORM] = ck_cpu_layer_norm,
    [CK_OP_LAYER_NORM_BWD] = ck_cpu_layer_norm_bwd,
    [CK_OP_SILU] = ck_cpu_silu,
    [CK_OP_SILU_BWD] = ck_cpu_silu_bwd,
    [CK_OP_GELU] = ck_cpu_gelu,
    [CK_OP_GELU_BWD] = ck_cpu_gelu_bwd,
    [CK_OP_GEGLU] = ck_cpu_geglu,
    [CK_OP_GEGLU_BWD] = ck_cpu_geglu_bwd,
    [CK_OP_SOFTMAX] = ck_cpu_softmax,
    [CK_OP_SOFTMAX_BWD] = ck_cpu_softmax_bwd,
    [CK_OP_ATTENTION] = ck_cpu_attention,
    [CK_OP_ATTENTION_BWD] = ck_cpu_attention_bwd,
    [CK_OP_ADD] = ck_cpu_add,
    [CK_OP_SUB] = ck_cpu_sub,
    [CK_OP_MUL] = ck_cpu_mul,
    [CK_OP_SCALE] = ck_cpu_scale,
    [CK_OP_REDUCE_TO] = ck_cpu_reduce_to,
    [CK_OP_CONCAT] = ck_cpu_concat,
    [CK_OP_SLICE] = ck_cpu_slice,
    [CK_OP_RESHAPE] = ck_cpu_reshape,
    [CK_OP_PERMUTE] = ck_cpu_permute,
    [CK_OP_UPSAMPLE2X] = ck_cpu_upsample2x,
    [CK_OP_UPSAMPLE2X_BWD] = ck_cpu_upsample2x_bwd,
    [CK_OP_MEAN] = ck_cpu_mean,
    [CK_OP_MEAN_BWD] = ck_cpu_mean_bwd,
    [CK_OP_MSE_LOSS] = ck_cpu_mse_loss,
    [CK_OP_MSE_LOSS_BWD] = ck_cpu_mse_loss_bwd,
    [CK_OP_TIMESTEP_EMBEDDING] = ck_cpu_timestep_embedding,
    [CK_OP_DROPOUT] = ck_cpu_dropout,
    [CK_OP_FILL] = ck_cpu_fill,
    [CK_OP_SGD_STEP] = ck_cpu_sgd_step,
    [CK_OP_ADAMW_STEP] = ck_cpu_adamw_step,
    [CK_OP_STATS] = ck_cpu_stats,
    [CK_OP_SUMSQ] = ck_cpu_sumsq,
};

const ck_kernel_fn ck_cpu_kernels_bf16[CK_OP_COUNT] = {
    [CK_OP_CONCAT] = ck_cpu_concat_bf16,
    [CK_OP_SLICE] = ck_cpu_slice_bf16,
    [CK_OP_RESHAPE] = ck_cpu_reshape_bf16,
};
