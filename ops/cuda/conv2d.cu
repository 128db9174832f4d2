/* 2-D convolution on the GPU (NCHW, zero padding, any kernel and stride):
 * forward, data gradient and filter gradient through cuDNN's convolution API,
 * the bias and its gradient through our own kernels. The algorithm is the
 * first deterministic one whose workspace fits what the plan gave the op
 * (ctx->ws); with determinism off, cuDNN's heuristic order instead (no
 * benchmarking: cudnnFind would allocate). When no cuDNN algorithm fits, the
 * CPU's method runs instead, in as many column chunks as the workspace needs:
 * per image and chunk, im2col (or a gather col2im) in the workspace around one
 * cuBLAS product. The plan's rule (ops/rules.c) gives at least one column.
 * Exact fp32 (FMA math) unless the context allows TF32. */
#include "common.cuh"

#include <limits.h>

struct conv_geom {
    int64_t N, C, H, W, O, KH, KW, HO, WO, sh, sw, ph, pw;
};

static conv_geom geom(const ck_op_params *p, const ck_view *x, const int64_t *w, const ck_view *y)
{
    conv_geom g;
    g.N = x->shape[0], g.C = x->shape[1], g.H = x->shape[2], g.W = x->shape[3];
    g.O = w[0], g.KH = w[2], g.KW = w[3];
    g.HO = y->shape[2], g.WO = y->shape[3];
    g.sh = p->i[0], g.sw = p->i[1], g.ph = p->i[2], g.pw = p->i[3];
    return g;
}

static int describe(ck_cuda_ctx *c, const char *op, const conv_geom *g)
{
    const int64_t v[] = {g->N, g->C, g->H, g->W, g->O, g->KH, g->KW, g->HO, g->WO, g->sh, g->sw, g->ph, g->pw};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] > INT_MAX) return ck_cuda_fail(op, "a dimension exceeds cuDNN's int sizes");
    if (!(CK_DNN(op, cudnnSetTensor4dDescriptor(c->tx, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)g->N, (int)g->C,
                                                (int)g->H, (int)g->W)) &&
          CK_DNN(op, cudnnSetTensor4dDescriptor(c->ty, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)g->N, (int)g->O,
                                                (int)g->HO, (int)g->WO)) &&
          CK_DNN(op, cudnnSetFilter4dDescriptor(c->fw, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, (int)g->O, (int)g->C,
                                                (int)g->KH, (int)g->KW)) &&
          CK_DNN(op, cudnnSetConvolution2dDescriptor(c->conv, (int)g->ph, (int)g->pw, (int)g->sh, (int)g->sw, 1, 1,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) &&
          CK_DNN(op, cudnnSetConvolutionMathType(c->conv, c->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH))))
        return 0;
    int n, o, h, w;
    if (!CK_DNN(op, cudnnGetConvolution2dForwardOutputDim(c->conv, c->tx, c->fw, &n, &o, &h, &w))) return 0;
    if (n != g->N || o != g->O || h != g->HO || w != g->WO)
        return ck_cuda_fail(op, "cuDNN computes a %dx%dx%dx%d output, the plan %lldx%lldx%lldx%lld", n, o, h, w,
                            (long long)g->N, (long long)g->O, (long long)g->HO, (long long)g->WO);
    return 1;
}

/* The three directions share the algorithm search; these wrap what differs. */
enum dir { FWD, BWD_DATA, BWD_FILTER };

/* Deterministic algorithms in order of preference (all forward algorithms are). */
static const int det_algos[3][5] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
     CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, -1},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
     CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, -1},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, -1},
};

/* Workspace of one algorithm, or SIZE_MAX when cuDNN does not offer it here
 * (a refusal is an answer, not a failure). */
static size_t ws_need(ck_cuda_ctx *c, dir d, int algo)
{
    size_t bytes = 0;
    cudnnStatus_t s;
    if (d == FWD)
        s = cudnnGetConvolutionForwardWorkspaceSize(c->dnn, c->tx, c->fw, c->conv, c->ty, (cudnnConvolutionFwdAlgo_t)algo,
                                                    &bytes);
    else if (d == BWD_DATA)
        s = cudnnGetConvolutionBackwardDataWorkspaceSize(c->dnn, c->fw, c->ty, c->conv, c->tx,
                                                         (cudnnConvolutionBwdDataAlgo_t)algo, &bytes);
    else
        s = cudnnGetConvolutionBackwardFilterWorkspaceSize(c->dnn, c->tx, c->ty, c->conv, c->fw,
                                                           (cudnnConvolutionBwdFilterAlgo_t)algo, &bytes);
    return s == CUDNN_STATUS_SUCCESS ? bytes : SIZE_MAX;
}

/* cuDNN's heuristic order (no timing runs): the first that fits and keeps to
 * the math the context allows; -1 if none. */
static int heuristic(ck_cuda_ctx *c, dir d, size_t ws_bytes)
{
    int k = 0;
    if (d == FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        if (cudnnGetConvolutionForwardAlgorithm_v7(c->dnn, c->tx, c->fw, c->conv, c->ty,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &k, perf) != CUDNN_STATUS_SUCCESS)
            return -1;
        for (int i = 0; i < k; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_bytes &&
                (c->tf32 || perf[i].mathType != CUDNN_TENSOR_OP_MATH))
                return (int)perf[i].algo;
    } else if (d == BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        if (cudnnGetConvolutionBackwardDataAlgorithm_v7(c->dnn, c->fw, c->ty, c->conv, c->tx,
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &k,
                                                        perf) != CUDNN_STATUS_SUCCESS)
            return -1;
        for (int i = 0; i < k; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_bytes &&
                (c->tf32 || perf[i].mathType != CUDNN_TENSOR_OP_MATH))
                return (int)perf[i].algo;
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->dnn, c->tx, c->ty, c->conv, c->fw,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &k,
                                                          perf) != CUDNN_STATUS_SUCCESS)
            return -1;
        for (int i = 0; i < k; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_bytes &&
                (c->tf32 || perf[i].mathType != CUDNN_TENSOR_OP_MATH))
                return (int)perf[i].algo;
    }
    return -1;
}

/* The cuDNN algorithm to run, or -1 for our im2col path. */
static int choose(ck_cuda_ctx *c, dir d, size_t ws_bytes)
{
    if (c->conv_im2col) return -1;
    if (!c->deterministic) {
        const int a = heuristic(c, d, ws_bytes);
        if (a >= 0) return a;
    }
    for (int i = 0; det_algos[d][i] >= 0; i++)
        if (ws_need(c, d, det_algos[d][i]) <= ws_bytes) return det_algos[d][i];
    return -1;
}

/* ---- the im2col path ----
 * Per image, the columns (output pixels) in chunks that fit the workspace:
 * im2col of a chunk, one cuBLAS product against it, and for the data gradient
 * a gather back (col2im) that adds the chunk's share into dx. The chunk size
 * follows from the workspace alone, so a plan's op always runs the same way. */

#define THREADS 256

static int direct(const conv_geom *g)
{
    return g->KH == 1 && g->KW == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

// xn is (C,H,W); col is (C*KH*KW, nq) for output pixels q0..q0+nq-1, row (c,kh,kw)
// holding x[c, ho*sh-ph+kh, wo*sw-pw+kw] (0 outside) where q = ho*WO + wo
__global__ void __launch_bounds__(THREADS) im2col_kernel(float *col, const float *xn, conv_geom g, int64_t q0,
                                                         int64_t nq, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t q = q0 + i % nq, r = i / nq;
        const int64_t kw = r % g.KW, kh = r / g.KW % g.KH, c = r / (g.KW * g.KH);
        const int64_t ih = q / g.WO * g.sh - g.ph + kh, iw = q % g.WO * g.sw - g.pw + kw;
        col[i] = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W ? xn[(c * g.H + ih) * g.W + iw] : 0.0f;
    }
}

// col is (C*KH*KW, nq) for output pixels q0..q0+nq-1; dxn (C,H,W) gets, per pixel,
// the sum of the col entries im2col would have read from it, in (kh, kw) order
// as ops/cpu/conv2d.c adds them; added onto dxn when add is set (a later chunk)
__global__ void __launch_bounds__(THREADS) col2im_kernel(float *dxn, const float *col, conv_geom g, int64_t q0,
                                                         int64_t nq, int add, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t iw = i % g.W, ih = i / g.W % g.H, c = i / (g.W * g.H);
        float acc = 0.0f;
        for (int64_t kh = 0; kh < g.KH; kh++) {
            const int64_t th = ih + g.ph - kh;
            if (th < 0 || th % g.sh || th / g.sh >= g.HO) continue;
            for (int64_t kw = 0; kw < g.KW; kw++) {
                const int64_t tw = iw + g.pw - kw;
                if (tw < 0 || tw % g.sw || tw / g.sw >= g.WO) continue;
                const int64_t q = th / g.sh * g.WO + tw / g.sw - q0;
                if (q < 0 || q >= nq) continue;
                acc += col[((c * g.KH + kh) * g.KW + kw) * nq + q];
            }
        }
        dxn[i] = add ? dxn[i] + acc : acc;
    }
}

/* Output pixels per chunk: as many as the workspace holds columns of, or all
 * of them at once without a workspace when the geometry is direct (the image
 * is its own column matrix); 0, with the failure recorded, when not one fits. */
static int64_t chunk_of(const char *op, const conv_geom *g, size_t ws_bytes)
{
    const int64_t ckk = g->C * g->KH * g->KW, howo = g->HO * g->WO;
    if (direct(g)) return howo;
    const int64_t fit = (int64_t)(ws_bytes / (sizeof(float) * (size_t)ckk));
    if (fit >= 1) return fit < howo ? fit : howo;
    ck_cuda_fail(op, "no cuDNN algorithm, nor one im2col column (%zu bytes), fits the planned workspace of %zu bytes",
                 sizeof(float) * (size_t)ckk, ws_bytes);
    return 0;
}

/* The column matrix (CKK x nq) of output pixels q0..q0+nq-1 of image xn:
 * im2col into the workspace, or the image itself when the geometry is direct.
 * Returns it, its leading dimension in *ld. */
static const float *columns(ck_cuda_ctx *c, const conv_geom *g, const float *xn, int64_t q0, int64_t nq, float *ws,
                            int64_t *ld)
{
    if (direct(g)) {
        *ld = g->HO * g->WO;
        return xn + q0;
    }
    const int64_t n = g->C * g->KH * g->KW * nq;
    ck_launch(im2col_kernel, ck_grid(n, THREADS), THREADS, c->stream, ws, xn, *g, q0, nq, n);
    *ld = nq;
    return ws;
}

// y (N,O,HO,WO) = w (O, CKK) col_n (CKK, HOWO), added onto y when beta is 1 (the bias)
static void im2col_fwd(ck_cuda_ctx *c, const conv_geom *g, float *y, const float *x, const float *w, float beta,
                       float *ws, int64_t chunk)
{
    const int64_t ckk = g->C * g->KH * g->KW, howo = g->HO * g->WO;
    for (int64_t n = 0; n < g->N; n++) {
        const float *xn = x + n * g->C * g->H * g->W;
        for (int64_t q0 = 0; q0 < howo; q0 += chunk) {
            const int64_t nq = howo - q0 < chunk ? howo - q0 : chunk;
            int64_t ldb;
            const float *col = columns(c, g, xn, q0, nq, ws, &ldb);
            if (!ck_cuda_gemm(c, "conv2d", 0, 0, g->O, nq, ckk, 1.0f, w, ckk, 0, col, ldb, 0, beta,
                              y + n * g->O * howo + q0, howo, 0, 1))
                return;
        }
    }
}

// per chunk: dcol = w^T dy_n[:, chunk], then col2im into dx_n (the product goes
// straight into dx_n when the geometry is direct)
static void im2col_bwd_data(ck_cuda_ctx *c, const conv_geom *g, float *dx, const float *dy, const float *w, float *ws,
                            int64_t chunk)
{
    const int64_t ckk = g->C * g->KH * g->KW, howo = g->HO * g->WO, chw = g->C * g->H * g->W;
    for (int64_t n = 0; n < g->N; n++) {
        float *dxn = dx + n * chw;
        const float *dyn = dy + n * g->O * howo;
        if (direct(g)) {
            if (!ck_cuda_gemm(c, "conv2d_bwd_data", 1, 0, ckk, howo, g->O, 1.0f, w, ckk, 0, dyn, howo, 0, 0.0f, dxn,
                              howo, 0, 1))
                return;
            continue;
        }
        for (int64_t q0 = 0; q0 < howo; q0 += chunk) {
            const int64_t nq = howo - q0 < chunk ? howo - q0 : chunk;
            if (!ck_cuda_gemm(c, "conv2d_bwd_data", 1, 0, ckk, nq, g->O, 1.0f, w, ckk, 0, dyn + q0, howo, 0, 0.0f, ws,
                              nq, 0, 1))
                return;
            ck_launch(col2im_kernel, ck_grid(chw, THREADS), THREADS, c->stream, dxn, (const float *)ws, *g, q0, nq,
                      q0 > 0 ? 1 : 0, chw);
        }
    }
}

// dw = sum over n and chunks of dy_n[:, chunk] col_chunk^T, in order (beta 1 after the first)
static void im2col_bwd_filter(ck_cuda_ctx *c, const conv_geom *g, float *dw, const float *dy, const float *x,
                              float *ws, int64_t chunk)
{
    const int64_t ckk = g->C * g->KH * g->KW, howo = g->HO * g->WO;
    for (int64_t n = 0; n < g->N; n++) {
        const float *xn = x + n * g->C * g->H * g->W;
        for (int64_t q0 = 0; q0 < howo; q0 += chunk) {
            const int64_t nq = howo - q0 < chunk ? howo - q0 : chunk;
            int64_t ldb;
            const float *col = columns(c, g, xn, q0, nq, ws, &ldb);
            if (!ck_cuda_gemm(c, "conv2d_bwd_filter", 0, 1, g->O, ckk, nq, 1.0f, dy + n * g->O * howo + q0, howo, 0,
                              col, ldb, 0, n || q0 ? 1.0f : 0.0f, dw, ckk, 0, 1))
                return;
        }
    }
}

// x is (N,C,H,W), w is (O,C,KH,KW), b is (O) when nin == 3; out y is (N,O,HO,WO).
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d)
{
    (void)nout;
    ck_cuda_ctx *c = ck_cuda_begin("conv2d");
    if (!c) return;
    const conv_geom g = geom(p, &in[0], in[1].shape, &out[0]);
    const float *bias = nin > 2 ? in[2].data : NULL;
    float *y = out[0].data;
    if (g.N * g.O * g.HO * g.WO == 0) return;
    if (bias)
        ck_cuda_bias_fill(c, y, bias, g.N, g.O, g.HO * g.WO);
    else if (g.C * g.KH * g.KW == 0)
        CK_CU("conv2d", cudaMemsetAsync(y, 0, sizeof(float) * (size_t)(g.N * g.O * g.HO * g.WO), c->stream));
    if (g.C * g.KH * g.KW > 0 && describe(c, "conv2d", &g)) {
        const int algo = choose(c, FWD, ctx->ws_bytes);
        const float one = 1.0f, beta = bias ? 1.0f : 0.0f;
        if (algo >= 0)
            CK_DNN("conv2d", cudnnConvolutionForward(c->dnn, &one, c->tx, in[0].data, c->fw, in[1].data, c->conv,
                                                     (cudnnConvolutionFwdAlgo_t)algo, ctx->ws, ctx->ws_bytes, &beta,
                                                     c->ty, y));
        else if (const int64_t chunk = chunk_of("conv2d", &g, ctx->ws_bytes))
            im2col_fwd(c, &g, y, in[0].data, in[1].data, beta, (float *)ctx->ws, chunk);
    }
    ck_cuda_end(c, "conv2d");
}

// dy is (N,O,HO,WO), w is (O,C,KH,KW); out dx is (N,C,H,W).
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_data)
{
    (void)nout, (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("conv2d_bwd_data");
    if (!c) return;
    const conv_geom g = geom(p, &out[0], in[1].shape, &in[0]);
    float *dx = out[0].data;
    if (!dx || g.N * g.C * g.H * g.W == 0) return;
    if (g.O * g.HO * g.WO * g.KH * g.KW == 0) {
        CK_CU("conv2d_bwd_data", cudaMemsetAsync(dx, 0, sizeof(float) * (size_t)(g.N * g.C * g.H * g.W), c->stream));
    } else if (describe(c, "conv2d_bwd_data", &g)) {
        const int algo = choose(c, BWD_DATA, ctx->ws_bytes);
        const float one = 1.0f, zero = 0.0f;
        if (algo >= 0)
            CK_DNN("conv2d_bwd_data",
                   cudnnConvolutionBackwardData(c->dnn, &one, c->fw, in[1].data, c->ty, in[0].data, c->conv,
                                                (cudnnConvolutionBwdDataAlgo_t)algo, ctx->ws, ctx->ws_bytes, &zero,
                                                c->tx, dx));
        else if (const int64_t chunk = chunk_of("conv2d_bwd_data", &g, ctx->ws_bytes))
            im2col_bwd_data(c, &g, dx, in[0].data, in[1].data, (float *)ctx->ws, chunk);
    }
    ck_cuda_end(c, "conv2d_bwd_data");
}

// dy is (N,O,HO,WO), x is (N,C,H,W); out dw is (O,C,KH,KW), db is (O); either may be unwanted.
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_filter)
{
    (void)nin;
    ck_cuda_ctx *c = ck_cuda_begin("conv2d_bwd_filter");
    if (!c) return;
    float *dw = out[0].data, *db = nout > 1 ? out[1].data : NULL;
    // dw's shape gives the kernel size; with dw unwanted only O (from dy) matters.
    const int64_t wshape[4] = {in[0].shape[1], in[1].shape[1], dw ? out[0].shape[2] : 1, dw ? out[0].shape[3] : 1};
    const conv_geom g = geom(p, &in[1], wshape, &in[0]);
    const int64_t howo = g.HO * g.WO;
    if (db && g.O > 0) {
        if (g.N * howo == 0)
            CK_CU("conv2d_bwd_filter", cudaMemsetAsync(db, 0, sizeof(float) * (size_t)g.O, c->stream));
        else
            ck_cuda_sum_pqr(c, db, in[0].data, g.N, g.O, howo);
    }
    if (dw && g.O * g.C * g.KH * g.KW > 0) {
        if (g.N * howo == 0) {
            CK_CU("conv2d_bwd_filter",
                  cudaMemsetAsync(dw, 0, sizeof(float) * (size_t)(g.O * g.C * g.KH * g.KW), c->stream));
        } else if (describe(c, "conv2d_bwd_filter", &g)) {
            const int algo = choose(c, BWD_FILTER, ctx->ws_bytes);
            const float one = 1.0f, zero = 0.0f;
            if (algo >= 0)
                CK_DNN("conv2d_bwd_filter",
                       cudnnConvolutionBackwardFilter(c->dnn, &one, c->tx, in[1].data, c->ty, in[0].data, c->conv,
                                                      (cudnnConvolutionBwdFilterAlgo_t)algo, ctx->ws, ctx->ws_bytes,
                                                      &zero, c->fw, dw));
            else if (const int64_t chunk = chunk_of("conv2d_bwd_filter", &g, ctx->ws_bytes))
                im2col_bwd_filter(c, &g, dw, in[0].data, in[1].data, (float *)ctx->ws, chunk);
        }
    }
    ck_cuda_end(c, "conv2d_bwd_filter");
}
