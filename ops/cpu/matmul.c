/* Dense products on the CPU: batched MATMUL and LINEAR (x W^T + b).
 * All the arithmetic is OpenBLAS sgemm. One parallel region per op: each
 * thread runs single-threaded sgemm on whole blocks of the output, so a
 * product costs one wake-up of the other threads (OpenBLAS's own threading
 * costs several) and small products wake nobody.
 *
 * The blocks are fixed by the shapes alone: at most BLOCK rows of each product
 * (columns, when it is wider than tall), and for a linear whose input has a
 * leading batch dim, of each sample. sgemm's value for a row can depend on the
 * size of the call and the row's place in it, so cutting by thread count would
 * make results depend on the machine's cores, and cutting across samples
 * would make a sample's results depend on the batch it came in. */
#include "cpu.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

/* Products below this many FLOPs run on one thread: each parallel region costs
 * tens of microseconds here, what one core needs for a few MFLOP. */
#define PAR_FLOPS 1e7
#define BLOCK 256

static int threads_for(double flops)
{
    return flops >= PAR_FLOPS ? omp_get_max_threads() : 1;
}

static int64_t blocks_of(int64_t M, int64_t N) { return ((M >= N ? M : N) + BLOCK - 1) / BLOCK; }

/* Block k of the row-major product C (M,N) = op(A) op(B) (beta 0 or 1): rows
 * [k BLOCK, (k+1) BLOCK) of C, or those columns when C is wider than tall. */
static void gemm_block(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *a, int64_t lda, const float *b,
                       int64_t ldb, float beta, float *c, int64_t ldc, int64_t k)
{
    if (M >= N) {
        const int64_t m0 = k * BLOCK, m1 = m0 + BLOCK < M ? m0 + BLOCK : M;
        a += ta ? m0 : m0 * lda;
        c += m0 * ldc;
        M = m1 - m0;
    } else {
        const int64_t n0 = k * BLOCK, n1 = n0 + BLOCK < N ? n0 + BLOCK : N;
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
    const int64_t per = blocks_of(M, N), units = batch * per;

#pragma omp parallel num_threads(threads_for(2.0 * batch * M * N * K))
    {
        omp_set_num_threads(1); // this thread's sgemm runs single-threaded
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        for (int64_t u = units * t / T; u < units * (t + 1) / T; u++) {
            const int64_t i = u / per;
            gemm_block(ta, tb, M, N, K, a->data + i * astride, lda, b->data + i * bstride, ldb, 0.0f,
                       y->data + i * M * N, N, u % per);
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
    // blocks of BLOCK rows within each sample (the leading dim of a 3-D or wider x)
    const int64_t samples = in[0].ndim >= 3 && in[0].shape[0] > 0 ? in[0].shape[0] : 1, S = rows / samples;
    const int64_t per = (S + BLOCK - 1) / BLOCK, units = samples * per;

#pragma omp parallel num_threads(threads_for(2.0 * rows * OUT * IN))
    {
        omp_set_num_threads(1); // this thread's sgemm runs single-threaded
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        for (int64_t u = units * t / T; u < units * (t + 1) / T; u++) {
            const int64_t s0 = u % per * BLOCK, r0 = u / per * S + s0, n = S - s0 < BLOCK ? S - s0 : BLOCK;
            // The bias is laid down first so sgemm adds onto it (beta = 1).
            if (bias)
                for (int64_t r = r0; r < r0 + n; r++) memcpy(y + r * OUT, bias, (size_t)OUT * sizeof(float));
            else if (IN == 0)
                memset(y + r0 * OUT, 0, (size_t)(n * OUT) * sizeof(float));
            if (IN > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)OUT, (int)IN, 1.0f, x + r0 * IN,
                            (int)IN, w, (int)IN, bias ? 1.0f : 0.0f, y + r0 * OUT, (int)OUT);
        }
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
