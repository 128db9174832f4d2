/* cudnnFind*AlgorithmEx on the CPU emulator: every algorithm of a direction,
 * its workspace as cudnnGet*WorkspaceSize reports it under the default math
 * (what the search ran; under the descriptor's tensor-op math a 16-bit
 * algorithm may need more, as on an H200), a made-up time, sorted as cuDNN
 * sorts them (those that ran by time, then those that could not). */
#include "cuda_emu.h"

#include <algorithm>

/* The fastest need more workspace, as FFT and Winograd do on a GPU; among
 * the rest a nondeterministic algorithm beats the deterministic one, so that
 * the two settings choose differently. */
float ck_emu_conv_ms[3][8] = {
    {2.0f, 1.0f, 3.0f, 3.5f, 0.5f, 0.6f, 0.7f, 0.8f},
    {0.8f, 1.0f, 0.5f, 0.6f, 0.7f, 0.4f, 0, 0},
    {0.8f, 1.0f, 0.5f, 0.9f, 0.7f, 0.4f, 0.6f, 0},
};
int ck_emu_find_calls;

static const int algo_count[3] = {CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};

/* cuDNN's documentation: every forward algorithm is deterministic; backward
 * data ALGO_0 and backward filter ALGO_0 and ALGO_3 are not */
static cudnnDeterminism_t determinism(int dir, int algo)
{
    if ((dir == 1 && algo == 0) || (dir == 2 && (algo == 0 || algo == 3))) return CUDNN_NON_DETERMINISTIC;
    return CUDNN_DETERMINISTIC;
}

/* size(dir, algo, &bytes) is the direction's cudnnGet*WorkspaceSize; a
 * failure there (the geometry) is the search's failure */
template <typename Perf, typename Algo, typename Size>
static cudnnStatus_t find(int dir, const void *in, const void *other, void *out, int requested, int *returned,
                          Perf *perf, void *ws, size_t ws_bytes, Size size)
{
    if (!in || !other || !out || !returned || !perf || requested < 1 || (ws_bytes && !ws)) return CUDNN_STATUS_BAD_PARAM;
    ck_emu_find_calls++;
    Perf all[8];
    const int n = algo_count[dir];
    for (int a = 0; a < n; a++) {
        size_t bytes = 0;
        const cudnnStatus_t s = size((Algo)a, &bytes);
        if (s != CUDNN_STATUS_SUCCESS) return s;
        const int fits = bytes <= ws_bytes;
        all[a] = {(Algo)a, fits ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED, fits ? ck_emu_conv_ms[dir][a] : -1.0f,
                  bytes, determinism(dir, a), CUDNN_FMA_MATH, {0, 0, 0}};
    }
    std::stable_sort(all, all + n, [](const Perf &a, const Perf &b) {
        if ((a.status == CUDNN_STATUS_SUCCESS) != (b.status == CUDNN_STATUS_SUCCESS))
            return a.status == CUDNN_STATUS_SUCCESS;
        return a.status == CUDNN_STATUS_SUCCESS && a.time < b.time;
    });
    const int k = requested < n ? requested : n;
    for (int i = 0; i < k; i++) perf[i] = all[i];
    *returned = k;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x,
                                                     const cudnnFilterDescriptor_t wd, const void *w,
                                                     const cudnnConvolutionDescriptor_t conv,
                                                     const cudnnTensorDescriptor_t yd, void *y, const int requested,
                                                     int *returned, cudnnConvolutionFwdAlgoPerf_t *perf, void *ws,
                                                     size_t ws_bytes)
{
    if (!h) return CUDNN_STATUS_BAD_PARAM;
    return find<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
        0, x, w, y, requested, returned, perf, ws, ws_bytes, [&](cudnnConvolutionFwdAlgo_t a, size_t *b) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, ck_emu_conv_default_math(conv), yd, a, b);
        });
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t h, const cudnnFilterDescriptor_t wd,
                                                          const void *w, const cudnnTensorDescriptor_t dyd,
                                                          const void *dy, const cudnnConvolutionDescriptor_t conv,
                                                          const cudnnTensorDescriptor_t dxd, void *dx,
                                                          const int requested, int *returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf, void *ws,
                                                          size_t ws_bytes)
{
    if (!h) return CUDNN_STATUS_BAD_PARAM;
    return find<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
        1, dy, w, dx, requested, returned, perf, ws, ws_bytes, [&](cudnnConvolutionBwdDataAlgo_t a, size_t *b) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, dyd, ck_emu_conv_default_math(conv), dxd, a, b);
        });
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t h, const cudnnTensorDescriptor_t xd,
                                                            const void *x, const cudnnTensorDescriptor_t dyd,
                                                            const void *dy, const cudnnConvolutionDescriptor_t conv,
                                                            const cudnnFilterDescriptor_t dwd, void *dw,
                                                            const int requested, int *returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perf, void *ws,
                                                            size_t ws_bytes)
{
    if (!h) return CUDNN_STATUS_BAD_PARAM;
    return find<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
        2, x, dy, dw, requested, returned, perf, ws, ws_bytes, [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *b) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, dyd, ck_emu_conv_default_math(conv), dwd, a, b);
        });
}
