/* Dense products on the GPU: batched MATMUL and LINEAR (x W^T + b). fp32
 * through cuBLAS sgemm (strided batched), exact unless the context allows
 * TF32; cuBLAS's workspace is the context's fixed one (the plan gives fp32
 * products none). bf16 and fp16 storage through cuBLASLt on tensor cores: A,
 * B and D of the storage type (CUDA_R_16BF, CUDA_R_16F), fp32 accumulation
 * (CUBLAS_COMPUTE_32F), the bias added in the epilogue, in the workspace the
 * plan gave the op (ck_op_workspace_cuda_bf16, the same for either type)
 * from its first 256-byte boundary.
 * Row-major operands are handed to column-major cuBLAS as their transposes:
 * C^T = op(B)^T op(A)^T. One stream and a fixed workspace per op keep results
 * bitwise reproducible. */
#include "common.cuh"

#include <limits.h>

static int64_t batch_of(const ck_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim - 2; d++) n *= v->shape[d];
    return n;
}

int ck_cuda_gemm(ck_cuda_ctx *c, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, int64_t sa, const float *B, int64_t ldb, int64_t sb, float beta, float *C,
                 int64_t ldc, int64_t sc, int64_t batch)
{
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX ||
        batch > INT_MAX)
        return ck_cuda_fail(op, "product of %lld x %lld x %lld (batch %lld) exceeds cuBLAS's int sizes", (long long)M,
                            (long long)N, (long long)K, (long long)batch);
    return CK_BLAS(op, cublasSgemmStridedBatched(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                 (int)N, (int)M, (int)K, &alpha, B, (int)ldb, (long long)sb, A, (int)lda,
                                                 (long long)sa, &beta, C, (int)ldc, (long long)sc, (int)batch));
}

// a is (..,M,K) or (..,K,M) if i0; b is (K,N) / (..,K,N), or (N,K) / (..,N,K) if i1;
// out is (..,M,N). The batch of a and of b is 1 (broadcast) or that of out.
extern "C" CK_CUDA_KERNEL(ck_cuda_matmul)
{
    (void)ctx, (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("matmul");
    if (!c) return;
    const ck_view *a = &in[0], *b = &in[1];
    ck_view *y = &out[0];
    const int ta = p->i[0] != 0, tb = p->i[1] != 0;
    const int64_t M = y->shape[y->ndim - 2], N = y->shape[y->ndim - 1];
    const int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    const int64_t batch = batch_of(y), abatch = batch_of(a), bbatch = batch_of(b);
    if (batch * M * N == 0) return;
    if (K == 0) {
        CK_CU("matmul", cudaMemsetAsync(y->data, 0, sizeof(float) * (size_t)(batch * M * N), c->stream));
        ck_cuda_end(c, "matmul");
        return;
    }
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    const int64_t sa = abatch == 1 ? 0 : M * K, sb = bbatch == 1 ? 0 : K * N;
    // A shared b under an untransposed a: the whole batch is one tall product.
    if (sb == 0 && !ta && abatch == batch)
        ck_cuda_gemm(c, "matmul", 0, tb, batch * M, N, K, 1.0f, a->data, lda, 0, b->data, ldb, 0, 0.0f, y->data, N, 0, 1);
    else
        ck_cuda_gemm(c, "matmul", ta, tb, M, N, K, 1.0f, a->data, lda, sa, b->data, ldb, sb, 0.0f, y->data, N, M * N,
                     batch);
    ck_cuda_end(c, "matmul");
}

// x is (..,IN), w is (OUT,IN), b is (OUT) when nin == 3; out is (..,OUT).
extern "C" CK_CUDA_KERNEL(ck_cuda_linear)
{
    (void)ctx, (void)p, (void)nout;
    ck_cuda_ctx *c = ck_cuda_begin("linear");
    if (!c) return;
    const float *bias = nin > 2 ? in[2].data : NULL;
    float *y = out[0].data;
    const int64_t IN = in[1].shape[1], OUT = in[1].shape[0];
    if (OUT == 0) return;
    const int64_t rows = ck_view_numel(&out[0]) / OUT;
    if (rows == 0) return;
    // The bias is laid down first so the product adds onto it (beta = 1).
    if (bias)
        ck_cuda_bias_fill(c, y, bias, rows, OUT, 1);
    else if (IN == 0)
        CK_CU("linear", cudaMemsetAsync(y, 0, sizeof(float) * (size_t)(rows * OUT), c->stream));
    if (IN > 0)
        ck_cuda_gemm(c, "linear", 0, 1, rows, OUT, IN, 1.0f, in[0].data, IN, 0, in[1].data, IN, 0, bias ? 1.0f : 0.0f, y,
                     OUT, 0, 1);
    ck_cuda_end(c, "linear");
}

/* ---- bf16 and fp16 through cuBLASLt ---- */

/* The largest power of two (at most 256) dividing a 16-bit operand's address
 * and, when batched, its batch stride of `stride` elements. */
static uint32_t lt_align(const void *p, int64_t stride, int64_t batch)
{
    uint64_t a = (uint64_t)(uintptr_t)p | 256;
    if (batch > 1 && stride) a |= (uint64_t)stride * sizeof(__nv_bfloat16);
    return (uint32_t)(a & (~a + 1));
}

/* The part of a planned workspace (aligned to 64 bytes) from its first
 * 256-byte boundary, which cuBLASLt requires of a workspace; NULL and 0 when
 * nothing is left. */
static void ws256(void **ws, size_t *bytes)
{
    const size_t skip = (size_t)(-(uintptr_t)*ws & 255);
    if (*ws && *bytes > skip) {
        *ws = (char *)*ws + skip;
        *bytes -= skip;
    } else {
        *ws = NULL;
        *bytes = 0;
    }
}

/* Row-major D = op(A) op(B) (+ bias per column of D) over `batch` matrices, A,
 * B, D and the bias of the 16-bit type dt (CUDA_R_16BF or CUDA_R_16F), fp32
 * accumulation, in the workspace given (the heuristic is offered
 * exactly that); strides in elements, 0 broadcasts. */
static int gemm_lt(ck_cuda_ctx *c, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K, const void *A,
                   int64_t lda, int64_t sa, const void *B, int64_t ldb, int64_t sb, void *D, cudaDataType_t dt,
                   int64_t ldd, int64_t sd, int64_t batch, const void *bias, void *ws, size_t ws_bytes)
{
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch > INT_MAX)
        return ck_cuda_fail(op, "product of %lld x %lld x %lld (batch %lld) exceeds cuBLASLt's int sizes", (long long)M,
                            (long long)N, (long long)K, (long long)batch);
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lb = NULL, la = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    /* column-major: the first operand is B (N x K, or K x N stored when tb), the second A */
    const int32_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const int32_t nb = (int32_t)batch;
    /* cuBLASLt takes a workspace aligned to 256 bytes (else
     * CUBLAS_STATUS_INVALID_VALUE); the plan aligns to 64 */
    ws256(&ws, &ws_bytes);
    const uint64_t max_ws = ws_bytes;
    /* what the heuristic may assume of each operand's alignment (it assumes
     * 256 bytes unless told): its pointer's and, batched, its stride's */
    const uint32_t al_a = lt_align(B, sb, batch), al_b = lt_align(A, sa, batch);
    const uint32_t al_d = lt_align(D, sd, batch);
    const float one = 1.0f, zero = 0.0f;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    int ok = CK_BLAS(op, cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
             CK_BLAS(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb)) &&
             CK_BLAS(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa)) &&
             CK_BLAS(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) &&
             (!bias ||
              CK_BLAS(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias))) &&
             CK_BLAS(op, cublasLtMatrixLayoutCreate(&lb, dt, tb ? K : N, tb ? N : K, ldb)) &&
             CK_BLAS(op, cublasLtMatrixLayoutCreate(&la, dt, ta ? M : K, ta ? K : M, lda)) &&
             CK_BLAS(op, cublasLtMatrixLayoutCreate(&ld, dt, N, M, ldd));
    const struct {
        cublasLtMatrixLayout_t l;
        int64_t stride;
    } lays[3] = {{lb, sb}, {la, sa}, {ld, sd}};
    for (int i = 0; i < 3 && ok && batch > 1; i++)
        ok = CK_BLAS(op, cublasLtMatrixLayoutSetAttribute(lays[i].l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &nb, sizeof nb)) &&
             CK_BLAS(op, cublasLtMatrixLayoutSetAttribute(lays[i].l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                          &lays[i].stride, sizeof lays[i].stride));
    ok = ok && CK_BLAS(op, cublasLtMatmulPreferenceCreate(&pref)) &&
         CK_BLAS(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                          sizeof max_ws)) &&
         CK_BLAS(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                          sizeof al_a)) &&
         CK_BLAS(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                          sizeof al_b)) &&
         CK_BLAS(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                          sizeof al_d)) &&
         CK_BLAS(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                          sizeof al_d)) &&
         CK_BLAS(op, cublasLtMatmulAlgoGetHeuristic(c->lt, desc, lb, la, ld, ld, pref, 1, &h, &found));
    if (ok && found < 1) ok = ck_cuda_fail(op, "cuBLASLt offers no %s algorithm within the planned workspace of %zu bytes",
                                          dt == CUDA_R_16F ? "fp16" : "bf16", ws_bytes);
    ok = ok && CK_BLAS(op, cublasLtMatmul(c->lt, desc, &one, B, lb, A, la, &zero, D, ld, D, ld, &h.algo, ws,
                                          (size_t)max_ws, c->stream));
    if (pref) CK_BLAS(op, cublasLtMatmulPreferenceDestroy(pref));
    if (ld) CK_BLAS(op, cublasLtMatrixLayoutDestroy(ld));
    if (la) CK_BLAS(op, cublasLtMatrixLayoutDestroy(la));
    if (lb) CK_BLAS(op, cublasLtMatrixLayoutDestroy(lb));
    if (desc) CK_BLAS(op, cublasLtMatmulDescDestroy(desc));
    return ok;
}

// y (rows, OUT) = b[j] broadcast, or 0 without b: a product with no inner dimension
template <typename T>
__global__ void __launch_bounds__(256) fill_rows_16(T *y, const T *b, int64_t OUT, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        ck_st(&y[i], b ? ck_ld(&b[i % OUT]) : 0.0f);
}

// a, b, out as ck_cuda_matmul, every tensor of the 16-bit type dt
static void matmul_16(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, const ck_view *in, cudaDataType_t dt)
{
    ck_cuda_ctx *c = ck_cuda_begin("matmul");
    if (!c) return;
    const ck_view *a = &in[0], *b = &in[1];
    const ck_view *y = &out[0];
    const int ta = p->i[0] != 0, tb = p->i[1] != 0;
    const int64_t M = y->shape[y->ndim - 2], N = y->shape[y->ndim - 1];
    const int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    const int64_t batch = batch_of(y), abatch = batch_of(a), bbatch = batch_of(b);
    if (batch * M * N == 0) return;
    if (K == 0) {
        CK_CU("matmul", cudaMemsetAsync(y->data, 0, 2 * (size_t)(batch * M * N), c->stream));
        ck_cuda_end(c, "matmul");
        return;
    }
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    const int64_t sa = abatch == 1 ? 0 : M * K, sb = bbatch == 1 ? 0 : K * N;
    if (sb == 0 && !ta && abatch == batch)
        gemm_lt(c, "matmul", 0, tb, batch * M, N, K, a->data, lda, 0, b->data, ldb, 0, y->data, dt, N, 0, 1, NULL,
                ctx->ws, ctx->ws_bytes);
    else
        gemm_lt(c, "matmul", ta, tb, M, N, K, a->data, lda, sa, b->data, ldb, sb, y->data, dt, N, M * N, batch, NULL,
                ctx->ws, ctx->ws_bytes);
    ck_cuda_end(c, "matmul");
}

// x, w, b, out as ck_cuda_linear, every tensor of the 16-bit type dt; the bias in cuBLASLt's epilogue.
static void linear_16(const ck_kctx *ctx, ck_view *out, const ck_view *in, int nin, cudaDataType_t dt)
{
    ck_cuda_ctx *c = ck_cuda_begin("linear");
    if (!c) return;
    const void *bias = nin > 2 ? in[2].data : NULL;
    const int64_t IN = in[1].shape[1], OUT = in[1].shape[0];
    if (OUT == 0) return;
    const int64_t rows = ck_view_numel(&out[0]) / OUT;
    if (rows == 0) return;
    if (IN == 0) {
        const int64_t n = rows * OUT;
        if (dt == CUDA_R_16F)
            ck_launch(fill_rows_16<__half>, ck_grid(n, 256), 256, c->stream, (__half *)out[0].data,
                      (const __half *)bias, OUT, n);
        else
            ck_launch(fill_rows_16<__nv_bfloat16>, ck_grid(n, 256), 256, c->stream, (__nv_bfloat16 *)out[0].data,
                      (const __nv_bfloat16 *)bias, OUT, n);
    } else {
        gemm_lt(c, "linear", 0, 1, rows, OUT, IN, in[0].data, IN, 0, in[1].data, IN, 0, out[0].data, dt, OUT, 0, 1,
                bias, ctx->ws, ctx->ws_bytes);
    }
    ck_cuda_end(c, "linear");
}

extern "C" CK_CUDA_KERNEL(ck_cuda_matmul_bf16)
{
    (void)nout, (void)nin;
    matmul_16(ctx, p, out, in, CUDA_R_16BF);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_matmul_f16)
{
    (void)nout, (void)nin;
    matmul_16(ctx, p, out, in, CUDA_R_16F);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_linear_bf16)
{
    (void)p, (void)nout;
    linear_16(ctx, out, in, nin, CUDA_R_16BF);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_linear_f16)
{
    (void)p, (void)nout;
    linear_16(ctx, out, in, nin, CUDA_R_16F);
}
