/* cuDNN's timed algorithm search on the CPU emulator (tests/cuda_emu),
 * included by cuda_emu.h. As documented, cudnnFind*AlgorithmEx tries every
 * algorithm of a direction on the given tensors and workspace and returns
 * them sorted by time, the ones it could not run (their workspace exceeds the
 * one given) last with a failed status. The emulator runs none of them: the
 * times are ck_emu_conv_ms (made up, fixed per algorithm so a choice repeats),
 * the workspaces those cudnnGet*WorkspaceSize report (ck_emu_conv_ws), and the
 * determinism cuDNN documents per algorithm. */
#ifndef CK_CUDNN_FIND_EMU_H
#define CK_CUDNN_FIND_EMU_H

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x,
                                                     const cudnnFilterDescriptor_t wd, const void *w,
                                                     const cudnnConvolutionDescriptor_t conv,
                                                     const cudnnTensorDescriptor_t yd, void *y, const int requested,
                                                     int *returned, cudnnConvolutionFwdAlgoPerf_t *perf, void *ws,
                                                     size_t ws_bytes);
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t h, const cudnnFilterDescriptor_t wd,
                                                          const void *w, const cudnnTensorDescriptor_t dyd,
                                                          const void *dy, const cudnnConvolutionDescriptor_t conv,
                                                          const cudnnTensorDescriptor_t dxd, void *dx,
                                                          const int requested, int *returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf, void *ws,
                                                          size_t ws_bytes);
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t h, const cudnnTensorDescriptor_t xd,
                                                            const void *x, const cudnnTensorDescriptor_t dyd,
                                                            const void *dy, const cudnnConvolutionDescriptor_t conv,
                                                            const cudnnFilterDescriptor_t dwd, void *dw,
                                                            const int requested, int *returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t *perf, void *ws,
                                                            size_t ws_bytes);

/* Test hooks: each algorithm's made-up time in ms (fwd, bwd data, bwd
 * filter), and how many searches have run (a cache shows as no new ones). */
extern float ck_emu_conv_ms[3][8];
extern int ck_emu_find_calls;
/* A copy of cv under the default math (thread-local, valid until the next
 * call): what the search reports each algorithm's workspace under. */
cudnnConvolutionDescriptor_t ck_emu_conv_default_math(cudnnConvolutionDescriptor_t cv);

#endif
