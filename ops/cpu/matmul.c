/* Dense products on the CPU: batched MATMUL and LINEAR (x W^T + b).
 * All the arithmetic is OpenBLAS sgemm; this file only maps shapes and batches
 * onto as few sgemm calls as the layout allows. */
#include "cpu.h"

#include <cblas.h>
#include <string.h>

static int64_t batch_of(const ck_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim - 2; d++) n *= v->shape[d];
    return n;
}

// a is (..,M,K) or (..,K,M) if i0; b is (K,N) / (..,K,N), or (N,K) / (..,N,K) if i1;
// out is (..,M,N). The batch of a and of b is 1 (broadcast) or that of out.
CK_CPU_KERNEL(ck_cpu_matmul)
{
    (void)ctx, (void)nout, (void)nin;
    const ck_view *a = &in[0], *b = &in[1];
    ck_view *y = &out[0];
    const int ta = p->i[0] != 0, tb = p->i[1] != 0;
    const int64_t M = y->shape[y->ndim - 2], N = y->shape[y->ndim - 1];
    const int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    const int64_t batch = batch_of(y), abatch = batch_of(a), bbatch = batch_of(b);
    if (batch * M * N == 0) return;
    if (K == 0) {
        memset(y->data, 0, (size_t)(batch * M * N) * sizeof(float));
        return;
    }
    const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE opb = tb ? CblasTrans : CblasNoTrans;
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    const int64_t astride = abatch == 1 ? 0 : M * K, bstride = bbatch == 1 ? 0 : K * N;

    // A shared b with row-major, untransposed a stacks the whole batch into one
    // tall product, which OpenBLAS blocks and threads far better than many small ones.
    if (bstride == 0 && !ta && abatch == batch) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, opb, (int)(batch * M), (int)N, (int)K, 1.0f,
                    a->data, (int)lda, b->data, (int)ldb, 0.0f, y->data, (int)N);
        return;
    }
    for (int64_t i = 0; i < batch; i++)
        cblas_sgemm(CblasRowMajor, opa, opb, (int)M, (int)N, (int)K, 1.0f, a->data + i * astride,
                    (int)lda, b->data + i * bstride, (int)ldb, 0.0f, y->data + i * M * N, (int)N);
}

// x is (..,IN), w is (OUT,IN), b is (OUT) when nin == 3; out is (..,OUT).
CK_CPU_KERNEL(ck_cpu_linear)
{
    (void)ctx, (void)p, (void)nout;
    const float *x = in[0].data, *w = in[1].data;
    const float *bias = nin > 2 ? in[2].data : NULL;
    float *y = out[0].data;
    const int64_t IN = in[1].shape[1], OUT = in[1].shape[0];
    if (OUT == 0) return;
    const int64_t rows = ck_view_numel(&out[0]) / OUT;
    if (rows == 0) return;

    // The bias is laid down first so sgemm adds onto it (beta = 1) in its own pass.
    if (bias) {
#pragma omp parallel for schedule(static) if (rows * OUT > 32768)
        for (int64_t r = 0; r < rows; r++) memcpy(y + r * OUT, bias, (size_t)OUT * sizeof(float));
    } else if (IN == 0) {
        memset(y, 0, (size_t)(rows * OUT) * sizeof(float));
    }
    if (IN == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)OUT, (int)IN, 1.0f, x, (int)IN,
                w, (int)IN, bias ? 1.0f : 0.0f, y, (int)OUT);
}
