/* bf16 and fp16 storage for products and convolutions on the CPU: the
 * operands widened to fp32 in the op's workspace, the fp32 kernel run on them,
 * each output rounded once to the storage type: fp32 accumulation and one
 * rounding, as the GPU's tensor-core kernels do. With ck_op_autocast's
 * operands cast to the storage type first
 * by the executor, the CPU computes what PyTorch's autocast does, and remains
 * the GPU's reference.
 *
 * The workspace (ck_op_workspace_cpu_bf16): the fp32 copies of the inputs,
 * then of the wanted outputs, each rounded up to 64 bytes, then the fp32
 * kernel's own workspace. */
#include "cpu.h"
#include "../bf16.h"
#include "../fp16.h"

static size_t align64(size_t b) { return (b + 63) / 64 * 64; }

static void widened(enum ck_op op, ck_dtype st, const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout,
                    const ck_view *in, int nin)
{
    ck_view in32[CK_MAX_IN] = {{0}}, out32[CK_MAX_OUT] = {{0}};
    unsigned char *ws = ctx->ws;
    size_t used = 0;
    for (int j = 0; j < nin; j++) {
        const int64_t n = ck_view_numel(&in[j]);
        in32[j] = in[j];
        in32[j].data = (float *)(ws + used);
        ck_cpu_load16(st, in32[j].data, (const uint16_t *)in[j].data, n);
        used += align64((size_t)n * sizeof(float));
    }
    for (int k = 0; k < nout; k++) {
        out32[k] = out[k];
        if (!out[k].data) continue;
        out32[k].data = (float *)(ws + used);
        used += align64((size_t)ck_view_numel(&out[k]) * sizeof(float));
    }
    if (used > ctx->ws_bytes) {
        ck_cpu_fail(ck_op_name(op), "a workspace of %zu bytes holds no fp32 copies of %zu bytes", ctx->ws_bytes, used);
        return;
    }
    ck_kctx inner = *ctx;
    inner.ws = ctx->ws_bytes > used ? ws + used : NULL;
    inner.ws_bytes = ctx->ws_bytes - used;
    ck_cpu_kernels[op](&inner, p, out32, nout, in32, nin);
    for (int k = 0; k < nout; k++)
        if (out[k].data) ck_cpu_store16(st, (uint16_t *)out[k].data, out32[k].data, ck_view_numel(&out[k]));
}

CK_CPU_ENTRIES16(matmul, widened(CK_OP_MATMUL, st, ctx, p, out, nout, in, nin))
CK_CPU_ENTRIES16(linear, widened(CK_OP_LINEAR, st, ctx, p, out, nout, in, nin))
CK_CPU_ENTRIES16(conv2d, widened(CK_OP_CONV2D, st, ctx, p, out, nout, in, nin))
CK_CPU_ENTRIES16(conv2d_bwd_data, widened(CK_OP_CONV2D_BWD_DATA, st, ctx, p, out, nout, in, nin))
CK_CPU_ENTRIES16(conv2d_bwd_filter, widened(CK_OP_CONV2D_BWD_FILTER, st, ctx, p, out, nout, in, nin))

/* LINEAR_GEGLU with 16-bit storage: the product into h as ck_cpu_linear_<type>
 * computes it, then the type's GEGLU kernel on the rounded h, so outputs are
 * the pair's bitwise. */
static void linear_geglu_16(ck_dtype st, const ck_kctx *ctx, const ck_op_params *p, ck_view *out, const ck_view *in,
                            int nin)
{
    static const ck_op_params none;
    widened(CK_OP_LINEAR, st, ctx, &none, &out[1], 1, in, nin);
    if (st == CK_BF16)
        ck_cpu_geglu_bf16(ctx, p, &out[0], 1, &out[1], 1);
    else
        ck_cpu_geglu_f16(ctx, p, &out[0], 1, &out[1], 1);
}

CK_CPU_ENTRIES16(linear_geglu, linear_geglu_16(st, ctx, p, out, in, nin))
