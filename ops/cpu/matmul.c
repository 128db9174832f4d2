/* Dense products on the CPU: batched MATMUL and LINEAR (x W^T + b).
 * All the arithmetic is OpenBLAS sgemm. One parallel region per op: each
 * thread runs single-threaded sgemm on a fixed share of the output, so a
 * product costs one wake-up of the other threads (OpenBLAS's own threading
 * costs several) and small products wake nobody. */
#include "cpu.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

/* Products below this many FLOPs run on one thread: each parallel region costs
 * tens of microseconds here, what one core needs for a few MFLOP. */
#define PAR_FLOPS 1e7

static int threads_for(double flops)
{
    return flops >= PAR_FLOPS ? omp_get_max_threads() : 1;
}

/* Part t of T of the row-major product C (M,N) = op(A) op(B) (beta 0 or 1): a
 * fixed range of C's rows, or of its columns when C is wider than tall. */
static void gemm_part(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda, const float *b,
                      int64_t ldb, float beta, float *c, int64_t ldc, int t, int T)
{
    if (M >= N) {
        const int64_t m0 = M * t / T, m1 = M * (t + 1) / T;
        if (m1 <= m0) return;
        a += ta ? m0 : m0 * lda;
        c += m0 * ldc;
        M = m1 - m0;
    } else {
        const int64_t n0 = N * t / T, n1 = N * (t + 1) / T;
        if (n1 <= n0) return;
        b += tb ? n0 * ldb : n0;
        c += n0;
        N = n1 - n0;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

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
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    const int64_t astride = abatch == 1 ? 0 : M * K, bstride = bbatch == 1 ? 0 : K * N;
    // A shared b with row-major, untransposed a stacks the whole batch into one
    // tall product.
    const int tall = bstride == 0 && !ta && abatch == batch;

#pragma omp parallel num_threads(threads_for(2.0 * batch * M * N * K))
    {
        omp_set_num_threads(1); // this thread's sgemm runs single-threaded
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        if (tall) {
            gemm_part(0, tb, batch * M, N, K, a->data, lda, b->data, ldb, 0.0f, y->data, N, t, T);
        } else if (batch >= T) {
            // whole products per thread
            for (int64_t i = batch * t / T; i < batch * (t + 1) / T; i++)
                gemm_part(ta, tb, M, N, K, a->data + i * astride, lda, b->data + i * bstride, ldb, 0.0f,
                          y->data + i * M * N, N, 0, 1);
        } else {
            for (int64_t i = 0; i < batch; i++)
                gemm_part(ta, tb, M, N, K, a->data + i * astride, lda, b->data + i * bstride, ldb, 0.0f,
                          y->data + i * M * N, N, t, T);
        }
    }
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

#pragma omp parallel num_threads(threads_for(2.0 * rows * OUT * IN))
    {
        omp_set_num_threads(1); // this thread's sgemm runs single-threaded
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int64_t r0 = rows * t / T, r1 = rows * (t + 1) / T;
        // The bias is laid down first so sgemm adds onto it (beta = 1).
        if (bias)
            for (int64_t r = r0; r < r1; r++) memcpy(y + r * OUT, bias, (size_t)OUT * sizeof(float));
        else if (IN == 0 && r1 > r0)
            memset(y + r0 * OUT, 0, (size_t)((r1 - r0) * OUT) * sizeof(float));
        if (IN > 0 && r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(r1 - r0), (int)OUT, (int)IN, 1.0f, x + r0 * IN,
                        (int)IN, w, (int)IN, bias ? 1.0f : 0.0f, y + r0 * OUT, (int)OUT);
    }
}

// LINEAR_GEGLU: x, w, b as ck_cpu_linear; out[1] h = x w^T + b, out[0] y = geglu(h),
// the pair's kernels in turn, so both outputs are theirs bitwise.
CK_CPU_KERNEL(ck_cpu_linear_geglu)
{
    static const ck_op_params none;
    (void)nout;
    ck_cpu_linear(ctx, &none, &out[1], 1, in, nin);
    ck_cpu_geglu(ctx, p, &out[0], 1, &out[1], 1);
}
