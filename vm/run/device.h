/* The CUDA backend as the runtime reaches it (vm/run/cuda_loader.c): the
 * module libck_cuda.so (ops/cuda) loaded on first use, its device's memory
 * and algorithm settings, and its rules for plans on any machine. */
#ifndef CK_DEVICE_H
#define CK_DEVICE_H

#include "../../ops/backend.h"

#include <stddef.h>

/* The CUDA backend on device 0 (ops/cuda/backend.c, in
 * libck_cuda.so, loaded on first use), opened once and kept for the process;
 * NULL with the reason in err when there is none. */
const ck_backend *ck_backend_cuda(char *err, size_t errlen);
/* The CUDA backend's rules without its code, for plans only (compile{plan_only
 * = true}): the plan a GPU run would have, on any machine. */
const ck_backend *ck_backend_cuda_plan(void);
/* CUDA devices usable now: 0 without an NVIDIA driver, a device, or a build
 * of the CUDA backend. Loads nothing on a machine without a driver. */
int ck_cuda_devices(void);
/* CUDA algorithm choices, for programs compiled from now on: deterministic
 * (the default, 1): the fastest of cuDNN's deterministic convolution
 * algorithms, so gradients are bitwise repeatable; 0: the fastest of all
 * (timed once per shape, ops/cuda/conv2d.cu). tf32
 * (default 0): TF32 tensor cores for fp32 products and convolutions. A value
 * below 0 leaves that setting. 0, or -1 with err when there is no CUDA backend. */
int ck_cuda_configure(int deterministic, int tf32, char *err, size_t errlen);
/* cudaMemGetInfo of the CUDA backend's device: 0, or -1 when it is not open */
int ck_cuda_memory(size_t *free_bytes, size_t *total_bytes);

#endif
