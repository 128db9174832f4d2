/* ops.def is the one list of ops: op numbers are append-only (saved plans,
 * logs and the CUDA module name ops by number), names are unique, and its
 * columns agree with one another. (The kernel tables and declarations are
 * generated from its cpu and cuda columns: a kernel the column promises and
 * no file defines fails the link.) */
#include "cpu/cpu.h"

#include <stdio.h>
#include <string.h>

static int failures;

static void fail(const char *what, int op)
{
    printf("FAIL: %s (op %d, %s)\n", what, op, ck_op_name((enum ck_op)op));
    failures++;
}

/* every op ckrun has had, with the number it has always had */
static const struct {
    enum ck_op op;
    int number;
    const char *name;
} frozen[] = {
    {CK_OP_NONE, 0, "none"},
    {CK_OP_MATMUL, 1, "matmul"},
    {CK_OP_LINEAR, 2, "linear"},
    {CK_OP_CONV2D, 3, "conv2d"},
    {CK_OP_CONV2D_BWD_DATA, 4, "conv2d_bwd_data"},
    {CK_OP_CONV2D_BWD_FILTER, 5, "conv2d_bwd_filter"},
    {CK_OP_GROUP_NORM, 6, "group_norm"},
    {CK_OP_GROUP_NORM_BWD, 7, "group_norm_bwd"},
    {CK_OP_LAYER_NORM, 8, "layer_norm"},
    {CK_OP_LAYER_NORM_BWD, 9, "layer_norm_bwd"},
    {CK_OP_SILU, 10, "silu"},
    {CK_OP_SILU_BWD, 11, "silu_bwd"},
    {CK_OP_GELU, 12, "gelu"},
    {CK_OP_GELU_BWD, 13, "gelu_bwd"},
    {CK_OP_GEGLU, 14, "geglu"},
    {CK_OP_GEGLU_BWD, 15, "geglu_bwd"},
    {CK_OP_SOFTMAX, 16, "softmax"},
    {CK_OP_SOFTMAX_BWD, 17, "softmax_bwd"},
    {CK_OP_ATTENTION, 18, "attention"},
    {CK_OP_ATTENTION_BWD, 19, "attention_bwd"},
    {CK_OP_ADD, 20, "add"},
    {CK_OP_SUB, 21, "sub"},
    {CK_OP_MUL, 22, "mul"},
    {CK_OP_SCALE, 23, "scale"},
    {CK_OP_REDUCE_TO, 24, "reduce_to"},
    {CK_OP_CONCAT, 25, "concat"},
    {CK_OP_SLICE, 26, "slice"},
    {CK_OP_RESHAPE, 27, "reshape"},
    {CK_OP_PERMUTE, 28, "permute"},
    {CK_OP_UPSAMPLE2X, 29, "upsample2x"},
    {CK_OP_UPSAMPLE2X_BWD, 30, "upsample2x_bwd"},
    {CK_OP_MEAN, 31, "mean"},
    {CK_OP_MEAN_BWD, 32, "mean_bwd"},
    {CK_OP_MSE_LOSS, 33, "mse_loss"},
    {CK_OP_MSE_LOSS_BWD, 34, "mse_loss_bwd"},
    {CK_OP_TIMESTEP_EMBEDDING, 35, "timestep_embedding"},
    {CK_OP_DROPOUT, 36, "dropout"},
    {CK_OP_FILL, 37, "fill"},
    {CK_OP_SGD_STEP, 38, "sgd_step"},
    {CK_OP_ADAMW_STEP, 39, "adamw_step"},
    {CK_OP_STATS, 40, "stats"},
    {CK_OP_SUMSQ, 41, "sumsq"},
    {CK_OP_CLIP_FACTOR, 42, "clip_factor"},
    {CK_OP_LION_STEP, 43, "lion_step"},
    {CK_OP_ADAMW8_STEP, 44, "adamw8_step"},
    {CK_OP_MISH, 45, "mish"},
    {CK_OP_MISH_BWD, 46, "mish_bwd"},
    {CK_OP_EMBEDDING, 47, "embedding"},
    {CK_OP_ALLREDUCE_START, 48, "allreduce_start"},
    {CK_OP_ALLREDUCE_WAIT, 49, "allreduce_wait"},
    {CK_OP_BROADCAST, 50, "broadcast"},
    {CK_OP_GROUP_NORM_SILU, 51, "group_norm_silu"},
    {CK_OP_GROUP_NORM_SILU_BWD, 52, "group_norm_silu_bwd"},
    {CK_OP_LINEAR_GEGLU, 53, "linear_geglu"},
    {CK_OP_RMS_NORM, 54, "rms_norm"},
    {CK_OP_RMS_NORM_BWD, 55, "rms_norm_bwd"},
    {CK_OP_ROPE, 56, "rope"},
    {CK_OP_MODULATE, 57, "modulate"},
    {CK_OP_MODULATE_BWD, 58, "modulate_bwd"},
    {CK_OP_GATE, 59, "gate"},
    {CK_OP_GATE_BWD, 60, "gate_bwd"},
};

static void op_numbers_never_change(void)
{
    for (size_t k = 0; k < sizeof frozen / sizeof frozen[0]; k++) {
        if ((int)frozen[k].op != frozen[k].number) fail("renumbered: ops.def rows are append-only", frozen[k].number);
        if (k && strcmp(ck_op_name(frozen[k].op), frozen[k].name)) fail("renamed", frozen[k].number);
    }
    if (CK_OP_COUNT < (int)(sizeof frozen / sizeof frozen[0])) fail("an op was removed", CK_OP_COUNT);
}

static void names_are_unique(void)
{
    for (int a = 1; a < CK_OP_COUNT; a++) {
        if (!strcmp(ck_op_name((enum ck_op)a), "?")) fail("no name", a);
        for (int b = 1; b < a; b++)
            if (!strcmp(ck_op_name((enum ck_op)a), ck_op_name((enum ck_op)b))) fail("a name used twice", a);
    }
}

/* a backward op takes the place of a kernel-less forward nowhere: it has kernels wherever its forward has */
static void backward_ops_run_where_their_forward_runs(void)
{
    for (int op = 1; op < CK_OP_COUNT; op++) {
        const enum ck_op b = ck_op_backward((enum ck_op)op);
        if (b == CK_OP_NONE) continue;
        for (int cuda = 0; cuda < 2; cuda++)
            if ((ck_op_precisions((enum ck_op)op, cuda) & ~ck_op_precisions(b, cuda)) != 0)
                fail("its backward op lacks a precision the forward has", op);
    }
}

/* an input slot read as fp32 by an op's 16-bit kernels (ck_op_f32_inputs) is
 * one the op takes, of an op that has 16-bit kernels */
static void f32_inputs_are_slots_of_16bit_ops(void)
{
    for (int op = 1; op < CK_OP_COUNT; op++) {
        const unsigned m = ck_op_f32_inputs((enum ck_op)op);
        if (!m) continue;
        if (m >> CK_MAX_IN) fail("an fp32 input slot past CK_MAX_IN", op);
        if (!((ck_op_precisions((enum ck_op)op, 0) | ck_op_precisions((enum ck_op)op, 1)) &
              (CK_PREC_MASK_BF16 | CK_PREC_MASK_F16)))
            fail("fp32 input slots on an op without 16-bit kernels", op);
    }
    if (ck_op_f32_inputs(CK_OP_ROPE) != 2u) fail("rope's table (input 1) is read as fp32", CK_OP_ROPE);
}

/* the autocast column: the products and convolutions PyTorch's autocast runs
 * in 16 bits (its lower-precision list: mm, linear, conv and their
 * backward), each with 16-bit kernels on both backends, and nothing else */
static void autocast_is_torchs_list(void)
{
    static const enum ck_op cast[] = {CK_OP_MATMUL,          CK_OP_LINEAR,           CK_OP_LINEAR_GEGLU,
                                      CK_OP_CONV2D,          CK_OP_CONV2D_BWD_DATA,  CK_OP_CONV2D_BWD_FILTER};
    for (int op = 0; op < CK_OP_COUNT; op++) {
        int listed = 0;
        for (size_t k = 0; k < sizeof cast / sizeof cast[0]; k++) listed |= (int)cast[k] == op;
        if (ck_op_autocast((enum ck_op)op) != listed) fail(listed ? "autocast: not marked" : "autocast: marked", op);
        for (int cuda = 0; listed && cuda < 2; cuda++)
            if (!(ck_op_precisions((enum ck_op)op, cuda) & CK_PREC_MASK_BF16)) fail("autocast without bf16 kernels", op);
    }
    if (ck_op_autocast(CK_OP_COUNT) || ck_op_autocast((enum ck_op)-1)) fail("autocast of no op", CK_OP_COUNT);
}

int main(void)
{
    op_numbers_never_change();
    autocast_is_torchs_list();
    names_are_unique();
    backward_ops_run_where_their_forward_runs();
    f32_inputs_are_slots_of_16bit_ops();
    printf("%d ops, %d failures\n", CK_OP_COUNT, failures);
    return failures != 0;
}
