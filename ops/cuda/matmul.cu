/* Dense products on the GPU: batched MATMUL and LINEAR (x W^T + b), all
 * through cuBLAS sgemm (strided batched). Row-major operands are handed to
 * column-major cuBLAS as their transposes: C^T = op(B)^T op(A)^T. fp32 unless
 * the context allows TF32. cuBLAS's workspace is the context's fixed one (the
 * plan gives products none); one stream and one workspace keep its results
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
