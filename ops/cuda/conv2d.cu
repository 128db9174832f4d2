/* 2-D convolution on the GPU (NCHW, zero padding, any kernel and stride):
 * forward, data gradient and filter gradient through cuDNN's convolution API,
 * in fp32 (exact FMA math unless the context allows TF32) or bf16 or fp16 storage
 * (tensor cores, fp32 compute type); the bias and its gradient through our
 * own kernels. The algorithm is chosen once per shape: cudnnFind*AlgorithmEx
 * times every algorithm (cuDNN's heuristic order where the search cannot
 * allocate its buffers), and the fastest that is deterministic (unless the
 * context turns that off) and fits the context's cap is kept; the plan gives
 * the op that algorithm's workspace (ck_cuda_workspace), and the kernel runs
 * the first of the same list that fits what the plan gave. When no cuDNN
 * algorithm fits (or the context asks for it), fp32 runs the CPU's method
 * instead, in as many column chunks as the workspace needs: per image and
 * chunk, im2col (or a gather col2im) in the workspace around one cuBLAS
 * product. The plan's rule (ops/rules.c) gives at least one column. */
#include "common.cuh"

#include <limits.h>

#include <mutex>
#include <vector>

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

/* A handle and the descriptors of one convolution: the context's, which the
 * kernels set per call on the thread that runs them, or the search's own
 * (below), so that plans made on other threads never touch the kernels'. */
struct conv_desc {
    cudnnHandle_t dnn;
    cudnnTensorDescriptor_t tx, ty;
    cudnnFilterDescriptor_t fw;
    cudnnConvolutionDescriptor_t conv;
};

static conv_desc kernel_desc(const ck_cuda_ctx *c) { return {c->dnn, c->tx, c->ty, c->fw, c->conv}; }

static int describe(ck_cuda_ctx *c, const char *op, const conv_geom *g, ck_dtype st, const conv_desc *k)
{
    const cudnnDataType_t dt = st == CK_BF16 ? CUDNN_DATA_BFLOAT16 : st == CK_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
    /* 16-bit storage is tensor-core math whatever TF32 says; fp32 is exact unless TF32 is on */
    const cudnnMathType_t math = st || c->tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    const int64_t v[] = {g->N, g->C, g->H, g->W, g->O, g->KH, g->KW, g->HO, g->WO, g->sh, g->sw, g->ph, g->pw};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i] > INT_MAX) return ck_cuda_fail(op, "a dimension exceeds cuDNN's int sizes");
    if (!(CK_DNN(op, cudnnSetTensor4dDescriptor(k->tx, CUDNN_TENSOR_NCHW, dt, (int)g->N, (int)g->C,
                                                (int)g->H, (int)g->W)) &&
          CK_DNN(op, cudnnSetTensor4dDescriptor(k->ty, CUDNN_TENSOR_NCHW, dt, (int)g->N, (int)g->O,
                                                (int)g->HO, (int)g->WO)) &&
          CK_DNN(op, cudnnSetFilter4dDescriptor(k->fw, dt, CUDNN_TENSOR_NCHW, (int)g->O, (int)g->C,
                                                (int)g->KH, (int)g->KW)) &&
          CK_DNN(op, cudnnSetConvolution2dDescriptor(k->conv, (int)g->ph, (int)g->pw, (int)g->sh, (int)g->sw, 1, 1,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) &&
          CK_DNN(op, cudnnSetConvolutionMathType(k->conv, math))))
        return 0;
    int n, o, h, w;
    if (!CK_DNN(op, cudnnGetConvolution2dForwardOutputDim(k->conv, k->tx, k->fw, &n, &o, &h, &w))) return 0;
    if (n != g->N || o != g->O || h != g->HO || w != g->WO)
        return ck_cuda_fail(op, "cuDNN computes a %dx%dx%dx%d output, the plan %lldx%lldx%lldx%lld", n, o, h, w,
                            (long long)g->N, (long long)g->O, (long long)g->HO, (long long)g->WO);
    return 1;
}

/* The three directions share the algorithm search; these wrap what differs. */
enum dir { FWD, BWD_DATA, BWD_FILTER };

static const int algo_count[3] = {CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};

/* Workspace of one algorithm, or SIZE_MAX when cuDNN does not offer it here
 * (a refusal is an answer, not a failure). */
static size_t ws_need(const conv_desc *k, dir d, int algo)
{
    size_t bytes = 0;
    cudnnStatus_t s;
    if (d == FWD)
        s = cudnnGetConvolutionForwardWorkspaceSize(k->dnn, k->tx, k->fw, k->conv, k->ty, (cudnnConvolutionFwdAlgo_t)algo,
                                                    &bytes);
    else if (d == BWD_DATA)
        s = cudnnGetConvolutionBackwardDataWorkspaceSize(k->dnn, k->fw, k->ty, k->conv, k->tx,
                                                         (cudnnConvolutionBwdDataAlgo_t)algo, &bytes);
    else
        s = cudnnGetConvolutionBackwardFilterWorkspaceSize(k->dnn, k->tx, k->ty, k->conv, k->fw,
                                                           (cudnnConvolutionBwdFilterAlgo_t)algo, &bytes);
    return s == CUDNN_STATUS_SUCCESS ? bytes : SIZE_MAX;
}

/* A convolution call's status; on failure one message with what a fix needs:
 * the geometry, the algorithm, the workspace given against the algorithm's
 * need for these descriptors, the pointers' alignment and whether the stream
 * was capturing. */
static int conv_ok(cudnnStatus_t s, const char *op, const char *call, ck_cuda_ctx *c, const conv_desc *k, dir d,
                   const conv_geom *g, int algo, const void *ws, size_t ws_bytes, const void *a, const void *b,
                   const void *out)
{
    if (s == CUDNN_STATUS_SUCCESS) return 1;
    const size_t need = ws_need(k, d, algo);
    return ck_cuda_fail(op,
                        "%s: %s (N %lld, C %lld, %lldx%lld -> O %lld, %lldx%lld; kernel %lldx%lld, stride %lld, "
                        "pad %lld; algorithm %d needs %lld bytes, given %zu at %u mod 256; operands at %u, %u, %u "
                        "mod 256%s)",
                        call, cudnnGetErrorString(s), (long long)g->N, (long long)g->C, (long long)g->H,
                        (long long)g->W, (long long)g->O, (long long)g->HO, (long long)g->WO, (long long)g->KH,
                        (long long)g->KW, (long long)g->sh, (long long)g->ph, algo,
                        need == SIZE_MAX ? -1LL : (long long)need, ws_bytes, (unsigned)((uintptr_t)ws & 255),
                        (unsigned)((uintptr_t)a & 255), (unsigned)((uintptr_t)b & 255),
                        (unsigned)((uintptr_t)out & 255), c->capturing ? "; capturing" : "");
}

/* One algorithm as a search reported it. */
struct algo_perf {
    int algo, ok, det, tensor;
    size_t mem;
};

/* A shape's algorithms, fastest first, as searched once (on this device, in
 * this storage and math); kept for the process. */
struct conv_search {
    int device, dir, tf32;
    ck_dtype st;
    int64_t key[13];
    size_t cap;
    int n;
    algo_perf perf[8];
};

static std::mutex searches_lock;
static std::vector<conv_search> searches;

static void key_of(const conv_geom *g, int64_t *k)
{
    const int64_t v[13] = {g->N, g->C, g->H, g->W, g->O, g->KH, g->KW, g->HO, g->WO, g->sh, g->sw, g->ph, g->pw};
    memcpy(k, v, sizeof v);
}

template <typename Perf>
static void keep(conv_search *s, const Perf *perf, int k)
{
    s->n = 0;
    for (int i = 0; i < k && s->n < 8; i++)
        s->perf[s->n++] = {(int)perf[i].algo, perf[i].status == CUDNN_STATUS_SUCCESS,
                           perf[i].determinism == CUDNN_DETERMINISTIC, perf[i].mathType == CUDNN_TENSOR_OP_MATH,
                           perf[i].memory};
}

/* cuDNN's heuristic order (no timing runs, no memory), for when the search
 * cannot have its buffers. */
static int heuristic(const conv_desc *k, dir d, conv_search *s)
{
    int n = 0;
    if (d == FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        if (cudnnGetConvolutionForwardAlgorithm_v7(k->dnn, k->tx, k->fw, k->conv, k->ty,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf) != CUDNN_STATUS_SUCCESS)
            return 0;
        keep(s, perf, n);
    } else if (d == BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        if (cudnnGetConvolutionBackwardDataAlgorithm_v7(k->dnn, k->fw, k->ty, k->conv, k->tx,
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n,
                                                        perf) != CUDNN_STATUS_SUCCESS)
            return 0;
        keep(s, perf, n);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(k->dnn, k->tx, k->ty, k->conv, k->fw,
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n,
                                                          perf) != CUDNN_STATUS_SUCCESS)
            return 0;
        keep(s, perf, n);
    }
    return 1;
}

/* cudnnFind*AlgorithmEx on scratch tensors of the shape and a workspace as
 * large as the largest algorithm within the cap needs: one allocation, freed
 * at once (outside every plan: it happens while plans are made, before the
 * arena is taken). 0 when the memory is not there. */
static int timed(const conv_desc *k, dir d, const conv_geom *g, ck_dtype st, size_t cap, conv_search *s)
{
    size_t ws = 0;
    for (int a = 0; a < algo_count[d]; a++) {
        const size_t need = ws_need(k, d, a);
        if (need != SIZE_MAX && need <= cap && need > ws) ws = need;
    }
    const size_t es = st ? 2 : 4, al = 256;
    const size_t xb = ((size_t)(g->N * g->C * g->H * g->W) * es + al - 1) / al * al;
    const size_t wb = ((size_t)(g->O * g->C * g->KH * g->KW) * es + al - 1) / al * al;
    const size_t yb = ((size_t)(g->N * g->O * g->HO * g->WO) * es + al - 1) / al * al;
    char *buf = NULL;
    if (cudaMalloc((void **)&buf, xb + wb + yb + ws) != cudaSuccess) {
        (void)cudaGetLastError(); /* an answer (search without timing), not a failure */
        return 0;
    }
    char *x = buf, *w = buf + xb, *y = w + wb, *wsp = ws ? y + yb : NULL;
    int n = 0;
    cudnnStatus_t rc;
    if (d == FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        rc = cudnnFindConvolutionForwardAlgorithmEx(k->dnn, k->tx, x, k->fw, w, k->conv, k->ty, y,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf, wsp, ws);
        if (rc == CUDNN_STATUS_SUCCESS) keep(s, perf, n);
    } else if (d == BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        rc = cudnnFindConvolutionBackwardDataAlgorithmEx(k->dnn, k->fw, w, k->ty, y, k->conv, k->tx, x,
                                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf, wsp, ws);
        if (rc == CUDNN_STATUS_SUCCESS) keep(s, perf, n);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        rc = cudnnFindConvolutionBackwardFilterAlgorithmEx(k->dnn, k->tx, x, k->ty, y, k->conv, k->fw, w,
                                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf, wsp, ws);
        if (rc == CUDNN_STATUS_SUCCESS) keep(s, perf, n);
    }
    cudaFree(buf);
    (void)cudaGetLastError();
    return rc == CUDNN_STATUS_SUCCESS;
}

/* The search's own handle and descriptors (one device per process), made on
 * first use; used under searches_lock only. */
static conv_desc searcher;
static int searcher_device = -1;

static int searcher_for(ck_cuda_ctx *c, const char *op)
{
    if (searcher_device == c->device) return 1;
    if (searcher.dnn) return ck_cuda_fail(op, "convolution algorithms are searched on device %d only", searcher_device);
    conv_desc k = {};
    if (!(CK_DNN(op, cudnnCreate(&k.dnn)) && CK_DNN(op, cudnnCreateTensorDescriptor(&k.tx)) &&
          CK_DNN(op, cudnnCreateTensorDescriptor(&k.ty)) && CK_DNN(op, cudnnCreateFilterDescriptor(&k.fw)) &&
          CK_DNN(op, cudnnCreateConvolutionDescriptor(&k.conv)))) {
        if (k.conv) cudnnDestroyConvolutionDescriptor(k.conv);
        if (k.fw) cudnnDestroyFilterDescriptor(k.fw);
        if (k.ty) cudnnDestroyTensorDescriptor(k.ty);
        if (k.tx) cudnnDestroyTensorDescriptor(k.tx);
        if (k.dnn) cudnnDestroy(k.dnn);
        return 0;
    }
    searcher = k, searcher_device = c->device;
    return 1;
}

/* The shape's algorithm list: searched on first use (with the search's own
 * handle and descriptors) under the context's cap, then kept. A shape cuDNN
 * refuses records the failure and gives an empty list, not kept; so does a
 * first use under a graph capture. */
static conv_search search(ck_cuda_ctx *c, const char *op, dir d, const conv_geom *g, ck_dtype st)
{
    conv_search s;
    memset(&s, 0, sizeof s);
    s.device = c->device, s.dir = d, s.st = st, s.tf32 = st ? 0 : c->tf32, s.cap = c->conv_ws_cap;
    key_of(g, s.key);
    std::lock_guard<std::mutex> hold(searches_lock);
    for (const conv_search &o : searches)
        if (o.device == s.device && o.dir == s.dir && o.st == s.st && o.tf32 == s.tf32 && o.cap == s.cap &&
            !memcmp(o.key, s.key, sizeof s.key))
            return o;
    /* a capture forbids the search's allocation and timing runs (they would
     * end it); its range then runs op by op, which searches and keeps the
     * list, and is captured at a later run (ck_cuda_capture_later) */
    if (c->capturing) {
        c->capture_later = 1;
        ck_cuda_fail(op, "convolution algorithms are searched outside a CUDA graph capture");
        return s;
    }
    if (!searcher_for(c, op) || !describe(c, op, g, st, &searcher)) return s;
    if (!timed(&searcher, d, g, st, s.cap, &s) && !heuristic(&searcher, d, &s)) s.n = 0;
    /* each algorithm's need under the math type the kernels set: a search
     * reports what it ran, which may be another math type's (on an H200 a
     * bf16 algorithm listed at 0 bytes needed 5264 under tensor-op math) */
    for (int i = 0; i < s.n; i++) {
        const size_t need = ws_need(&searcher, d, s.perf[i].algo);
        if (need == SIZE_MAX)
            s.perf[i].ok = 0;
        else if (need > s.perf[i].mem)
            s.perf[i].mem = need;
    }
    searches.push_back(s);
    return s;
}

/* The first algorithm of the list that ran, fits `limit`, keeps to the math
 * the context allows (TF32 only if allowed; 16-bit storage is tensor-core math anyway)
 * and is deterministic unless that is off; -1 if none. */
static int pick(ck_cuda_ctx *c, const conv_search *s, size_t limit, size_t *bytes)
{
    for (int i = 0; i < s->n; i++) {
        const algo_perf *a = &s->perf[i];
        if (a->ok && a->mem <= limit && (!c->deterministic || a->det) && (s->st || c->tf32 || !a->tensor)) {
            if (bytes) *bytes = a->mem;
            return a->algo;
        }
    }
    return -1;
}

/* The cuDNN algorithm to run in ws_bytes, or -1 for our im2col path. */
static int choose(ck_cuda_ctx *c, const char *op, dir d, const conv_geom *g, ck_dtype st, size_t ws_bytes)
{
    if (c->conv_im2col && !st) return -1;
    const conv_search s = search(c, op, d, g, st);
    return pick(c, &s, ws_bytes, NULL);
}

extern "C" void ck_cuda_set_conv_workspace_cap(ck_cuda_ctx *c, size_t bytes) { c->conv_ws_cap = bytes; }

extern "C" void ck_cuda_conv_forget(void)
{
    std::lock_guard<std::mutex> hold(searches_lock);
    searches.clear();
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

/* ---- 16-bit storage (T: __nv_bfloat16 or __half): the bias and its gradient ---- */

// y (N,O,HW) = b[o] broadcast
template <typename T>
__global__ void __launch_bounds__(THREADS) bias_fill_16(T *y, const T *b, int64_t O, int64_t HW, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = b[i / HW % O];
}

// db (O) = dy (N,O,HW) summed over N and HW in fp32, one block per channel in a fixed order
template <typename T>
__global__ void __launch_bounds__(THREADS) bias_grad_16(T *db, const T *dy, int64_t N, int64_t O, int64_t HW)
{
    __shared__ float sh[33];
    const int64_t o = blockIdx.x;
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < N * HW; i += blockDim.x)
        acc += ck_ld(&dy[(i / HW * O + o) * HW + i % HW]);
    acc = ck_block_sum(acc, sh);
    if (threadIdx.x == 0) ck_st(&db[o], acc);
}

/* The three kernels in any storage (st: CK_F32, CK_BF16 or CK_F16; es: 4 or
 * 2 bytes). 16-bit storage has no im2col path: an algorithm that fits is
 * required. */
static int no_algo(const char *op, ck_dtype st, size_t ws_bytes)
{
    if (st)
        ck_cuda_fail(op, "no cuDNN %s algorithm fits the planned workspace of %zu bytes", st == CK_F16 ? "fp16" : "bf16",
                     ws_bytes);
    return st != CK_F32;
}

static void conv_fwd(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, const ck_view *in, int nin, ck_dtype st)
{
    const char *op = "conv2d";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return;
    const conv_desc kd = kernel_desc(c);
    const size_t es = st ? 2 : 4;
    const conv_geom g = geom(p, &in[0], in[1].shape, &out[0]);
    const void *bias = nin > 2 ? in[2].data : NULL;
    void *y = out[0].data;
    const int64_t ny = g.N * g.O * g.HO * g.WO;
    if (ny == 0) return;
    if (bias && st == CK_BF16)
        ck_launch(bias_fill_16<__nv_bfloat16>, ck_grid(ny, THREADS), THREADS, c->stream, (__nv_bfloat16 *)y,
                  (const __nv_bfloat16 *)bias, g.O, g.HO * g.WO, ny);
    else if (bias && st == CK_F16)
        ck_launch(bias_fill_16<__half>, ck_grid(ny, THREADS), THREADS, c->stream, (__half *)y, (const __half *)bias,
                  g.O, g.HO * g.WO, ny);
    else if (bias)
        ck_cuda_bias_fill(c, (float *)y, (const float *)bias, g.N, g.O, g.HO * g.WO);
    else if (g.C * g.KH * g.KW == 0)
        CK_CU(op, cudaMemsetAsync(y, 0, es * (size_t)ny, c->stream));
    if (g.C * g.KH * g.KW > 0 && describe(c, op, &g, st, &kd)) {
        const int algo = choose(c, op, FWD, &g, st, ctx->ws_bytes);
        const float one = 1.0f, beta = bias ? 1.0f : 0.0f;
        if (algo >= 0)
            conv_ok(cudnnConvolutionForward(c->dnn, &one, c->tx, in[0].data, c->fw, in[1].data, c->conv,
                                            (cudnnConvolutionFwdAlgo_t)algo, ctx->ws, ctx->ws_bytes, &beta, c->ty, y),
                    op, "cudnnConvolutionForward", c, &kd, FWD, &g, algo, ctx->ws, ctx->ws_bytes, in[0].data,
                    in[1].data, y);
        else if (no_algo(op, st, ctx->ws_bytes))
            ;
        else if (const int64_t chunk = chunk_of(op, &g, ctx->ws_bytes))
            im2col_fwd(c, &g, (float *)y, in[0].data, in[1].data, beta, (float *)ctx->ws, chunk);
    }
    ck_cuda_end(c, op);
}

static void conv_bwd_data(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, const ck_view *in, ck_dtype st)
{
    const char *op = "conv2d_bwd_data";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return;
    const conv_desc kd = kernel_desc(c);
    const size_t es = st ? 2 : 4;
    const conv_geom g = geom(p, &out[0], in[1].shape, &in[0]);
    void *dx = out[0].data;
    if (!dx || g.N * g.C * g.H * g.W == 0) return;
    if (g.O * g.HO * g.WO * g.KH * g.KW == 0) {
        CK_CU(op, cudaMemsetAsync(dx, 0, es * (size_t)(g.N * g.C * g.H * g.W), c->stream));
    } else if (describe(c, op, &g, st, &kd)) {
        const int algo = choose(c, op, BWD_DATA, &g, st, ctx->ws_bytes);
        const float one = 1.0f, zero = 0.0f;
        if (algo >= 0)
            conv_ok(cudnnConvolutionBackwardData(c->dnn, &one, c->fw, in[1].data, c->ty, in[0].data, c->conv,
                                                 (cudnnConvolutionBwdDataAlgo_t)algo, ctx->ws, ctx->ws_bytes, &zero,
                                                 c->tx, dx),
                    op, "cudnnConvolutionBackwardData", c, &kd, BWD_DATA, &g, algo, ctx->ws, ctx->ws_bytes,
                    in[1].data, in[0].data, dx);
        else if (no_algo(op, st, ctx->ws_bytes))
            ;
        else if (const int64_t chunk = chunk_of(op, &g, ctx->ws_bytes))
            im2col_bwd_data(c, &g, (float *)dx, in[0].data, in[1].data, (float *)ctx->ws, chunk);
    }
    ck_cuda_end(c, op);
}

static void conv_bwd_filter(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout, const ck_view *in,
                            ck_dtype st)
{
    const char *op = "conv2d_bwd_filter";
    ck_cuda_ctx *c = ck_cuda_begin(op);
    if (!c) return;
    const conv_desc kd = kernel_desc(c);
    const size_t es = st ? 2 : 4;
    void *dw = out[0].data, *db = nout > 1 ? out[1].data : NULL;
    // dw's shape gives the kernel size; with dw unwanted only O (from dy) matters.
    const int64_t wshape[4] = {in[0].shape[1], in[1].shape[1], dw ? out[0].shape[2] : 1, dw ? out[0].shape[3] : 1};
    const conv_geom g = geom(p, &in[1], wshape, &in[0]);
    const int64_t howo = g.HO * g.WO;
    if (db && g.O > 0) {
        if (g.N * howo == 0)
            CK_CU(op, cudaMemsetAsync(db, 0, es * (size_t)g.O, c->stream));
        else if (st == CK_BF16)
            ck_launch(bias_grad_16<__nv_bfloat16>, dim3((unsigned)g.O), THREADS, c->stream, (__nv_bfloat16 *)db,
                      (const __nv_bfloat16 *)in[0].data, g.N, g.O, howo);
        else if (st == CK_F16)
            ck_launch(bias_grad_16<__half>, dim3((unsigned)g.O), THREADS, c->stream, (__half *)db,
                      (const __half *)in[0].data, g.N, g.O, howo);
        else
            ck_cuda_sum_pqr(c, (float *)db, in[0].data, g.N, g.O, howo);
    }
    if (dw && g.O * g.C * g.KH * g.KW > 0) {
        if (g.N * howo == 0) {
            CK_CU(op, cudaMemsetAsync(dw, 0, es * (size_t)(g.O * g.C * g.KH * g.KW), c->stream));
        } else if (describe(c, op, &g, st, &kd)) {
            const int algo = choose(c, op, BWD_FILTER, &g, st, ctx->ws_bytes);
            const float one = 1.0f, zero = 0.0f;
            if (algo >= 0)
                conv_ok(cudnnConvolutionBackwardFilter(c->dnn, &one, c->tx, in[1].data, c->ty, in[0].data, c->conv,
                                                       (cudnnConvolutionBwdFilterAlgo_t)algo, ctx->ws, ctx->ws_bytes,
                                                       &zero, c->fw, dw),
                        op, "cudnnConvolutionBackwardFilter", c, &kd, BWD_FILTER, &g, algo, ctx->ws, ctx->ws_bytes,
                        in[1].data, in[0].data, dw);
            else if (no_algo(op, st, ctx->ws_bytes))
                ;
            else if (const int64_t chunk = chunk_of(op, &g, ctx->ws_bytes))
                im2col_bwd_filter(c, &g, (float *)dw, in[0].data, in[1].data, (float *)ctx->ws, chunk);
        }
    }
    ck_cuda_end(c, op);
}

// x is (N,C,H,W), w is (O,C,KH,KW), b is (O) when nin == 3; out y is (N,O,HO,WO).
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d)
{
    (void)nout;
    conv_fwd(ctx, p, out, in, nin, CK_F32);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bf16)
{
    (void)nout;
    conv_fwd(ctx, p, out, in, nin, CK_BF16);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_f16)
{
    (void)nout;
    conv_fwd(ctx, p, out, in, nin, CK_F16);
}

// dy is (N,O,HO,WO), w is (O,C,KH,KW); out dx is (N,C,H,W).
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_data)
{
    (void)nout, (void)nin;
    conv_bwd_data(ctx, p, out, in, CK_F32);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_data_bf16)
{
    (void)nout, (void)nin;
    conv_bwd_data(ctx, p, out, in, CK_BF16);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_data_f16)
{
    (void)nout, (void)nin;
    conv_bwd_data(ctx, p, out, in, CK_F16);
}

// dy is (N,O,HO,WO), x is (N,C,H,W); out dw is (O,C,KH,KW), db is (O); either may be unwanted.
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_filter)
{
    (void)nin;
    conv_bwd_filter(ctx, p, out, nout, in, CK_F32);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_filter_bf16)
{
    (void)nin;
    conv_bwd_filter(ctx, p, out, nout, in, CK_BF16);
}
extern "C" CK_CUDA_KERNEL(ck_cuda_conv2d_bwd_filter_f16)
{
    (void)nin;
    conv_bwd_filter(ctx, p, out, nout, in, CK_F16);
}

/* ---- the plan's workspace ---- */

extern "C" size_t ck_cuda_workspace(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                                    const ck_shape *out, ck_dtype st)
{
    const size_t stated =
        st ? ck_op_workspace_cuda_bf16(op, p, in, nin, out, 1) : ck_op_workspace_cuda(op, p, in, nin, out, 1);
    if (op != CK_OP_CONV2D && op != CK_OP_CONV2D_BWD_DATA && op != CK_OP_CONV2D_BWD_FILTER) return stated;
    ck_cuda_ctx *c = ck_cuda_current();
    if (!c || ck_cuda_failed()) return stated;
    /* x, w, y as the kernels see them: (x, w) -> y; (dy, w) -> dx; (dy, x) -> dw */
    const ck_shape *x = op == CK_OP_CONV2D ? &in[0] : op == CK_OP_CONV2D_BWD_DATA ? &out[0] : &in[1];
    const ck_shape *w = op == CK_OP_CONV2D_BWD_FILTER ? &out[0] : &in[1];
    const ck_shape *y = op == CK_OP_CONV2D ? &out[0] : &in[0];
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4) return stated;
    conv_geom g;
    g.N = x->d[0], g.C = x->d[1], g.H = x->d[2], g.W = x->d[3];
    g.O = w->d[0], g.KH = w->d[2], g.KW = w->d[3];
    g.HO = y->d[2], g.WO = y->d[3];
    g.sh = p->i[0], g.sw = p->i[1], g.ph = p->i[2], g.pw = p->i[3];
    const int64_t dims[] = {g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.HO, g.WO};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] == 0) return 0; /* the kernels call no algorithm */
    const dir d = op == CK_OP_CONV2D ? FWD : op == CK_OP_CONV2D_BWD_DATA ? BWD_DATA : BWD_FILTER;
    if (c->conv_im2col && !st) return stated;
    /* a shape cuDNN refuses (or an unwanted dw, which comes as dy's shape) keeps the stated rule */
    const conv_search s = search(c, ck_op_name(op), d, &g, st);
    if (ck_cuda_failed()) {
        ck_cuda_clear_error();
        return stated;
    }
    size_t bytes = 0;
    return pick(c, &s, c->conv_ws_cap, &bytes) >= 0 ? bytes : stated;
}
