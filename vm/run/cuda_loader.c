/* The CUDA backend, loaded on first use: libck_cuda.so (ops/cuda) holds the
 * kernels and links cuBLAS, cuDNN and the CUDA runtime, whose loading alone
 * costs a process a few hundred megabytes and a noticeable start. A machine
 * without an NVIDIA driver never loads it; one with a driver loads it when a
 * program asks for a device or the default device is looked up.
 *
 * Where it is looked for: $CK_CUDA_MODULE when set (a path; it is loaded even
 * without a driver, which lets tests run an emulated backend), else beside the
 * library or program that holds this code (dir, dir/../lib, dir/..), else the
 * build and install directories this copy was configured with.
 *
 * Any thread may ask first: the module is looked for once (pthread_once), and
 * the backend opened once under a lock, then read through an atomic pointer. */
#define _GNU_SOURCE /* dladdr */
#include "dist/dist.h"
#include "run/device.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODULE "libck_cuda.so"

/* the module opens device local_rank modulo the devices it sees: one per rank of a machine */
typedef const ck_backend *(*open_fn)(int local_rank, char *err, size_t errlen);
typedef int (*devices_fn)(void);
typedef int (*memory_fn)(size_t *free_bytes, size_t *total_bytes);
typedef int (*configure_fn)(int deterministic, int tf32);

/* written once, inside load_once; read only after pthread_once returns */
static struct {
    open_fn open;
    devices_fn devices;
    memory_fn memory;
    configure_fn configure;
    char why[PATH_MAX + 256];
} mod;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(const ck_backend *) opened; /* the backend, once open */

static int driver_present(void)
{
    return access("/proc/driver/nvidia/version", F_OK) == 0 || access("/dev/nvidiactl", F_OK) == 0;
}

static void *try_open(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && access(path, F_OK) == 0) /* there but unloadable: say why */
        snprintf(mod.why, sizeof mod.why, "cannot load %s: %s", path, dlerror());
    return h;
}

static void *find(void)
{
    char dir[PATH_MAX], path[PATH_MAX + 64];
    Dl_info info;
    dir[0] = 0;
    if (dladdr((void *)&ck_backend_cuda, &info) && info.dli_fname && strchr(info.dli_fname, '/') &&
        realpath(info.dli_fname, dir)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
    }
    /* beside this code (dir, dir/../lib, dir/..), then where this copy was built and installed */
    const char *const places[][2] = {
        {dir, "/"}, {dir, "/../lib/"}, {dir, "/../"},
#ifdef CK_CUDA_MODULE_DIR
        {CK_CUDA_MODULE_DIR, "/"},
#endif
#ifdef CK_CUDA_INSTALL_DIR
        {CK_CUDA_INSTALL_DIR, "/"},
#endif
    };
    for (size_t i = 0; i < sizeof places / sizeof places[0]; i++) {
        if (!places[i][0][0]) continue;
        snprintf(path, sizeof path, "%s%s" MODULE, places[i][0], places[i][1]);
        void *h = try_open(path);
        if (h) return h;
    }
    return NULL;
}

static void load_module(void)
{
    const char *env = getenv("CK_CUDA_MODULE");
    void *h = NULL;
    if (env && env[0]) {
        h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(mod.why, sizeof mod.why, "cannot load CK_CUDA_MODULE=%s: %s", env, dlerror());
    } else if (!driver_present()) {
        snprintf(mod.why, sizeof mod.why, "no CUDA device is present (no NVIDIA driver)");
    } else {
        h = find();
        if (!h && !mod.why[0])
            snprintf(mod.why, sizeof mod.why, "this build has no CUDA backend (%s not found)", MODULE);
    }
    if (!h) return;
    mod.open = (open_fn)dlsym(h, "ck_cuda_module_open");
    mod.devices = (devices_fn)dlsym(h, "ck_cuda_module_devices");
    mod.memory = (memory_fn)dlsym(h, "ck_cuda_module_memory");
    mod.configure = (configure_fn)dlsym(h, "ck_cuda_module_configure");
    if (!mod.open || !mod.devices || !mod.memory || !mod.configure) {
        snprintf(mod.why, sizeof mod.why, "%s is not a ckrun CUDA backend", MODULE);
        mod.open = NULL;
    }
}

static int load(void)
{
    pthread_once(&load_once, load_module);
    return mod.open != NULL;
}

int ck_cuda_devices(void) { return load() ? mod.devices() : 0; }

const ck_backend *ck_backend_cuda(char *err, size_t errlen)
{
    const ck_backend *be = atomic_load(&opened);
    if (be) return be;
    if (!load()) {
        snprintf(err, errlen, "%s", mod.why);
        return NULL;
    }
    pthread_mutex_lock(&open_mu);
    be = atomic_load(&opened);
    if (!be) {
        be = mod.open(ck_dist_local_rank(), err, errlen);
        atomic_store(&opened, be);
    }
    pthread_mutex_unlock(&open_mu);
    return be;
}

int ck_cuda_memory(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    return atomic_load(&opened) ? mod.memory(free_bytes, total_bytes) : -1;
}

int ck_cuda_configure(int deterministic, int tf32, char *err, size_t errlen)
{
    if (!ck_backend_cuda(err, errlen)) return -1;
    return mod.configure(deterministic, tf32);
}

/* ---- plans for the GPU on a machine without one */

static void plan_enter(void) {}
static void plan_kernel(const ck_kctx *ctx, const ck_op_params *p, ck_view *out, int nout, const ck_view *in, int nin)
{
    (void)ctx, (void)p, (void)out, (void)nout, (void)in, (void)nin;
}
static void *plan_alloc(size_t bytes)
{
    (void)bytes;
    return NULL;
}
static const char *plan_error(void) { return "a plan-only CUDA target cannot run"; }
static void plan_clear(void) {}

static ck_kernel_fn plan_none[CK_OP_COUNT], plan_bf16[CK_OP_COUNT], plan_f16[CK_OP_COUNT];
static ck_backend plan_be;
static pthread_once_t plan_once = PTHREAD_ONCE_INIT;

static void plan_make(void)
{
    /* the ops with 16-bit kernels need a non-NULL entry; nothing calls it */
    for (int op = 0; op < CK_OP_COUNT; op++) {
        if (ck_cuda_bf16_op((enum ck_op)op)) plan_bf16[op] = plan_kernel;
        if (ck_cuda_f16_op((enum ck_op)op)) plan_f16[op] = plan_kernel;
    }
    plan_be = (ck_backend){.name = "cuda",
                           .kernels = plan_none,
                           .kernels_bf16 = plan_bf16,
                           .kernels_f16 = plan_f16,
                           .workspace = ck_op_workspace_cuda,
                           .workspace_bf16 = ck_op_workspace_cuda_bf16,
                           .nthreads = 1,
                           .host = 0,
                           .fixed_bytes = CK_CUDA_FIXED_BYTES,
                           .granule = CK_CUDA_GRANULE,
                           .enter = plan_enter,
                           .alloc = plan_alloc,
                           .error = plan_error,
                           .clear_error = plan_clear};
}

const ck_backend *ck_backend_cuda_plan(void)
{
    pthread_once(&plan_once, plan_make);
    return &plan_be;
}
