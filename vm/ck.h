/* ck.h: the one public header of libck, the ckrun runtime.
 *
 * A host opens a VM with the limits it chooses, runs Lua scripts in it
 * (scripts `require "ck"` to build, compile and train op graphs), calls the
 * functions those scripts define, drives their compiled models step by step,
 * and closes it. The host never needs Lua's own API. The library never calls
 * exit() and never prints unless a log callback is given: every call returns
 * a status (CK_OK or a CK_E* code) and ck_error() says what went wrong in one
 * line that names the script file and line where there is one.
 *
 * A worked example: the script defines a model; the host trains it.
 *
 *     -- model.lua
 *     local ck = require "ck"
 *     function build(width)
 *       local g = ck.graph()
 *       local x, t = g:input("x", {8, 2}), g:input("t", {8, 1})
 *       local h = ck.silu(ck.linear(x, g:param("l1.weight", {width, 2})))
 *       local loss = ck.mse_loss(ck.linear(h, g:param("l2.weight", {1, width})), t)
 *       return g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 1}
 *     end
 *
 *     // host.c: cc host.c $(pkg-config --cflags --libs ck)
 *     #include <ck.h>
 *     #include <stdio.h>
 *
 *     int main(void)
 *     {
 *         const char *data[] = {"data", NULL};
 *         ck_options opt = CK_OPTIONS_INIT;    // sets opt.size
 *         opt.allow_read = data;               // besides the working directory
 *         opt.heap_limit = 256u << 20;         // the Lua heap, not the tensors
 *         ck_vm *vm = ck_open(&opt);
 *         ck_model *m = NULL;
 *         float x[16], t[8];
 *         for (int i = 0; i < 8; i++) x[2 * i] = i / 8.0f, x[2 * i + 1] = 1, t[i] = i / 16.0f;
 *         ck_value width = ck_number(32);
 *         double loss = 0;
 *         int st = ck_run_file(vm, "model.lua", 0, NULL);
 *         if (st == CK_OK) st = ck_model_open(vm, "build", 1, &width, &m);
 *         if (st == CK_OK) st = ck_model_set(m, "x", x, 16);
 *         if (st == CK_OK) st = ck_model_set(m, "t", t, 8);
 *         for (int i = 0; st == CK_OK && i < 100; i++) st = ck_model_step(m, &loss);
 *         ck_plan_info plan = CK_PLAN_INFO_INIT;
 *         if (st == CK_OK) st = ck_model_plan(m, &plan);
 *         if (st == CK_OK) printf("loss %g, peak %zu bytes\n", loss, plan.peak);
 *         else fprintf(stderr, "%s\n", ck_error(vm));
 *         ck_close(vm);                        // closes m too
 *         return st == CK_OK ? 0 : 1;
 *     }
 *
 * Threads: one thread per VM at a time. VMs share no state, so different
 * threads may each drive their own VM. The one exception is ck_interrupt(),
 * which any thread (or a signal handler) may call while another runs the VM.
 *
 * Handles: every call checks its ck_vm or ck_model against a registry of
 * open handles before it reads through it, so a handle that is closed (a
 * second ck_close, any call after ck_close or ck_model_close, a model whose
 * VM was closed) gives CK_EINVAL (ck_close, ck_model_close and ck_interrupt
 * do nothing) instead of touching freed memory. The memory of the last 16
 * closed VMs (all closed VMs while a SIGTERM handler a logger installed is in
 * place) is kept back from free, so that the guarantee holds until a later
 * ck_open could be handed the same address again. NULL gives CK_EARG.
 *
 * The sandbox (on unless ck_options.trust is set): scripts get an allow-list
 * of Lua's libraries (no os.execute, io.popen, dofile, loadfile,
 * package.loadlib, debug beyond traceback, string.dump), only Lua source
 * (binary chunks are refused by every way of loading code), files only inside
 * the allowed directories, checked on resolved real paths, and a seeded
 * math.random. A denied access fails with CK_EDENIED and names the path and
 * the ckrun flag that would allow it (--allow-read DIR, --allow-write DIR).
 *
 * Versions and sizes: CK_VERSION_NUM is the header's version, ck_version_num()
 * the library's. Every struct a caller allocates and passes in (ck_options,
 * ck_plan_request, ck_plan_info, ck_metrics) starts with `size_t size`, which
 * the caller sets to sizeof the struct (the CK_*_INIT initializers do). Fields
 * are only ever appended, so the library reads a caller's struct as the
 * version its size names: a caller built against an older header keeps
 * working, and a size the library does not know (a newer header's, or
 * garbage) fails with CK_EARG and a message naming the struct and both sizes.
 * A size of 0 reads as the first layout (the fields of 0.1), so `{0}` still
 * works; only a set size lets a later library see later fields. ck_value is
 * passed in arrays and never changes its layout.
 *
 * Exported names: libck exports only the functions below (CK_API); everything
 * else in it is hidden.
 */
#ifndef CK_H
#define CK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes */
#define CK_OK 0
#define CK_EFILE 1   /* a script or data file cannot be read */
#define CK_ESYNTAX 2 /* a Lua syntax error */
#define CK_ERUN 3    /* an error raised while the script ran */
#define CK_EMEM 4    /* out of memory, or over the Lua heap limit */
#define CK_EARG 5    /* a bad argument to the API (a bad option, a missing function, a wrong size) */
#define CK_EINTR 6   /* stopped by ck_interrupt() */
#define CK_ELIMIT 7  /* a callback ran past its instruction budget */
#define CK_EDENIED 8 /* the sandbox refused a file, a function or a binary chunk */
#define CK_EINVAL 9  /* a handle that is closed, or that ck_open / ck_model_open never returned */

/* the library's version: "major.minor.patch", and as a number
 * major * 10000 + minor * 100 + patch (0.1.0 is 100, 1.2.3 would be 10203) */
#define CK_VERSION_MAJOR 0
#define CK_VERSION_MINOR 1
#define CK_VERSION_PATCH 0
#define CK_VERSION "0.1.0"
#define CK_VERSION_NUM (CK_VERSION_MAJOR * 10000 + CK_VERSION_MINOR * 100 + CK_VERSION_PATCH)

#if defined(__GNUC__)
#define CK_API __attribute__((visibility("default")))
#else
#define CK_API
#endif

typedef struct ck_vm ck_vm;
typedef struct ck_model ck_model;

/* ---- options: start from CK_OPTIONS_INIT, then set what you need */
typedef struct ck_options {
    size_t size; /* sizeof(ck_options) (see "Versions and sizes" above) */
    /* where `require "ck.nn"` and friends are found; NULL: the installed
     * stdlib beside the library, else the build's */
    const char *stdlib_dir;
    /* receives what scripts print (print, io.write, io.stdout, io.stderr,
     * warn); NULL: print and io.write go to stdout, warnings are dropped */
    void (*log)(void *ud, const char *text, size_t len);
    void *log_ud;
    /* on the GPU, cuDNN's fastest convolution algorithms instead of its
     * deterministic ones (gradients then vary in the last bits from run to run) */
    int nondeterministic;

    /* the device programs run on unless a script's compile{device=} says
     * otherwise: "cpu", "cuda", or "auto" (NULL): cuda when a CUDA device is
     * present, else cpu. A device that cannot be opened fails ck_open (CK_EARG). */
    const char *device;

    /* the Lua heap's allocator, with lua_Alloc's contract (nsize 0 frees;
     * shrinking never fails); NULL: realloc and free. The VM's own small
     * records come from it too; tensors live in compiled plans, outside it. */
    void *(*alloc)(void *ud, void *ptr, size_t osize, size_t nsize);
    void *alloc_ud;
    /* bytes the Lua heap may hold; a script that needs more fails with
     * CK_EMEM ("out of memory"), never an abort (the count hook fails it a
     * little early, within 1/8 or 16 MiB of the cap, to name its line).
     * 0: 1 GiB in the sandbox, no limit with trust; SIZE_MAX: no limit. */
    size_t heap_limit;
    /* Lua instructions one script callback may run (a function the runtime
     * calls while compiling, such as a checkpoint policy or a log cadence,
     * or ck.call_limited(fn, ...)); past it the run fails with CK_ELIMIT,
     * naming the callback's file and line, and pcall cannot catch it.
     * Counted in steps of 1000. 0: 100 million; negative: no limit. */
    long long callback_budget;

    /* 1: no sandbox: all of Lua's libraries, any file, binary chunks in load() */
    int trust;
    /* NULL-terminated lists of directories scripts may read under and may
     * write (and read) under, besides the defaults: the working directory
     * (read and write) and each script's own directory (read). */
    const char *const *allow_read;
    const char *const *allow_write;
    int no_default_dirs; /* 1: no defaults, only the lists above */
    /* math.random's seed: the same numbers every run (math.randomseed(n) reseeds) */
    uint64_t seed;

    /* (the second layout of ck_options; an older caller's size ends before
     * it and gets the default) bytes of memory all told that the VM's scripts may
     * make it take: the Lua heap (heap_limit still caps it alone) plus graphs,
     * plans and op lists, arenas (the device bytes their plans state), the
     * host stage of a device, and tensors read from files into Lua. A script
     * whose next allocation would pass it fails with CK_EMEM before the
     * allocation, in one line naming its file and line, what would pass and
     * the --max-memory value that would allow it; closing (or collecting) a
     * graph or program gives its bytes back. 0: the machine's physical memory
     * in the sandbox (MemTotal, plus the GPU's memory once a program compiles
     * for it), no limit with trust; SIZE_MAX: no limit. */
    size_t max_memory;
} ck_options;
#define CK_OPTIONS_INIT {.size = sizeof(ck_options)}

/* What the ckrun command's --plan, --json, --policies, --svg and --max-batch
 * ask of a VM (ck_open_plan); a host that trains needs none of it. */
typedef struct ck_plan_request {
    size_t size; /* sizeof(ck_plan_request) */
    /* build and plan only: compiled programs allocate nothing and cannot run
     * (a device named in ck_options need not be present); scripts see
     * ck.plan_mode (and ck.json for machine-readable output) */
    int plan_only;
    int json;
    /* what the plan report holds (scripts see ck.plan_policies, ck.plan_svg,
     * ck.plan_max_batch): policies to compare side by side
     * ("none,diffusers,budget:62%"), an SVG memory timeline to write, and a
     * memory size for which to report the largest batch that fits (0: none).
     * The strings are copied. svg and export_graph name files: in the sandbox
     * each allows that file and its temp files alone, and a path that names
     * a directory (one that exists, or ends in '/') is refused (CK_EARG). */
    const char *policies;
    const char *svg;
    double max_batch;
    /* a file to write the compiled graph to as JSON, with what each policy
     * compared decided (scripts see ck.plan_export_graph; the schema is in
     * README.md, "Graph export"); copied */
    const char *export_graph;
    /* plan one rank of a data-parallel job of this many ranks, launching none
     * (scripts see ck.plan_world_size; 0: not asked) */
    int world_size;
} ck_plan_request;
#define CK_PLAN_REQUEST_INIT {.size = sizeof(ck_plan_request)}

/* ---- life cycle */

/* NULL options: defaults. Returns NULL only when memory for the VM itself
 * cannot be had. A VM whose options are bad (an unknown device, a heap limit
 * too small to start Lua) is still returned: ck_status() and ck_error() say
 * why, and every call on it fails with that status. */
CK_API ck_vm *ck_open(const ck_options *opt);
/* ck_open with a plan request (NULL: none, as ck_open); its scripts see the
 * request as ck.plan_mode, ck.json, ck.plan_policies, ck.plan_svg and
 * ck.plan_max_batch (nil in a VM opened without one). */
CK_API ck_vm *ck_open_plan(const ck_options *opt, const ck_plan_request *plan);
/* Also closes the VM's models. NULL, a handle already closed and a pointer
 * ck_open never returned are all fine: nothing happens. */
CK_API void ck_close(ck_vm *vm);
CK_API const char *ck_version(void); /* CK_VERSION of the library */
CK_API int ck_version_num(void);     /* CK_VERSION_NUM of the library */
/* 1 when programs can run on the device called name ("cpu", "cuda"): cuda
 * needs a build with the CUDA backend and a device present. */
CK_API int ck_device_available(const char *name);

/* The status of the last call (CK_OK after a success). */
CK_API int ck_status(const ck_vm *vm);
/* The message of the last failed call: one line that names the script file and
 * line where there is one; "" after a success. Valid until the next call. */
CK_API const char *ck_error(const ck_vm *vm);
/* What a status code means, in a few words ("CK_EDENIED: the sandbox refused
 * a file, a function or a binary chunk"); a static string, for any code (an
 * unknown one gives "unknown status"). */
CK_API const char *ck_errstr(int code);

/* Stops what the VM runs now, between two Lua instructions or two ops of a
 * step, and makes that call return CK_EINTR; pcall in the script cannot catch
 * it. If nothing runs, the next call returns CK_EINTR at once. Safe from any
 * thread and from signal handlers. */
CK_API void ck_interrupt(ck_vm *vm);

/* ---- running scripts
 * Arguments reach the script as the global table `args` (`--key value` becomes
 * args.key = value, numbers converted; a `--flag` alone is true; other words are
 * args[1], args[2], ...; args.script is the path) and as the chunk's `...`.
 * Scripts are Lua source; a binary chunk fails with CK_EDENIED. */
CK_API int ck_run_file(ck_vm *vm, const char *path, int argc, const char *const *argv); /* a NULL in argv[0..argc): CK_EARG */
CK_API int ck_run_string(ck_vm *vm, const char *code, const char *chunkname);

/* ---- values passed to and from script functions */
typedef enum ck_type { CK_TNIL = 0, CK_TBOOLEAN, CK_TNUMBER, CK_TSTRING, CK_TOTHER } ck_type;

typedef struct ck_value {
    ck_type type;
    double number;      /* CK_TNUMBER; CK_TBOOLEAN: 0 or 1 */
    const char *string; /* CK_TSTRING (may hold zeros: see len); CK_TOTHER: the Lua type name */
    size_t len;
} ck_value;

static inline ck_value ck_nil(void) { ck_value v = {CK_TNIL, 0, NULL, 0}; return v; }
static inline ck_value ck_boolean(int b) { ck_value v = {CK_TBOOLEAN, b ? 1 : 0, NULL, 0}; return v; }
static inline ck_value ck_number(double x) { ck_value v = {CK_TNUMBER, x, NULL, 0}; return v; }
static inline ck_value ck_string(const char *s)
{
    ck_value v = {CK_TSTRING, 0, s, 0};
    while (s && s[v.len]) v.len++;
    return v;
}

/* Calls the global function `name` (a dotted path such as "trainer.step" looks
 * into tables) with nargs arguments; fills res[0..nres) with its first nres
 * results (missing ones are nil). Result strings stay valid until the next
 * call on the VM. CK_EARG if `name` is not a function. */
CK_API int ck_call(ck_vm *vm, const char *name, int nargs, const ck_value *args, int nres, ck_value *res);

/* Typed accessors for globals (dotted paths): CK_EARG when the value is
 * missing or of another type (a number string is not a number). Strings stay
 * valid until the next call. The setters need every table on the path. */
CK_API int ck_get_number(ck_vm *vm, const char *name, double *out);
CK_API int ck_get_string(ck_vm *vm, const char *name, const char **out, size_t *len);
CK_API int ck_set_number(ck_vm *vm, const char *name, double x);
CK_API int ck_set_string(ck_vm *vm, const char *name, const char *s);

/* ---- models: compiled programs the host drives
 * ck_model_open takes the program a script made (g:compile{...}): `name` is a
 * global holding one, or a global function that returns one when called with
 * args. The model stays valid until ck_model_close or ck_close. */
CK_API int ck_model_open(ck_vm *vm, const char *name, int nargs, const ck_value *args, ck_model **out);
CK_API void ck_model_close(ck_model *m);

/* Bytes of the memory plan (of the training step; of the forward pass when
 * the program does not train). Set size (CK_PLAN_INFO_INIT) before the call. */
typedef struct ck_plan_info {
    size_t size;       /* sizeof(ck_plan_info) */
    size_t peak;       /* persistent + transient: what a step needs */
    size_t persistent; /* parameters, inputs, gradients kept, optimizer state */
    size_t transient;  /* activations and workspace above the persistent bytes */
    size_t workspace;  /* the largest kernel workspace live at once */
    size_t arena;      /* bytes allocated */
    int ops;           /* ops in the step's list */
    size_t device;     /* device memory the program takes: the arena in the
                          allocator's pages (2 MiB on CUDA) and the library
                          workspaces the backend holds; the arena on the CPU */
} ck_plan_info;
#define CK_PLAN_INFO_INIT {.size = sizeof(ck_plan_info)}
CK_API int ck_model_plan(ck_model *m, ck_plan_info *out);

/* One training step (forward, backward, optimizer update), or the forward pass
 * alone; *loss (may be NULL) gets the loss, NaN without one. */
CK_API int ck_model_step(ck_model *m, double *loss);
CK_API int ck_model_forward(ck_model *m, double *loss);

/* Tensors by name ("x", "mlp.l1.weight"). set: an input or a parameter, n must
 * equal its element count. read: a parameter, an input, or a tensor the last
 * run kept (compile{outputs=...}); copies *numel floats into dst, or fails with
 * CK_EARG and sets *numel when cap is too small (dst NULL: only *numel). */
#define CK_SHAPE_MAX 8
CK_API int ck_model_set(ck_model *m, const char *tensor, const float *values, size_t n);
CK_API int ck_model_read(ck_model *m, const char *tensor, float *dst, size_t cap, size_t *numel);
CK_API int ck_model_shape(ck_model *m, const char *tensor, int64_t dims[CK_SHAPE_MAX], int *ndim);

/* Set size (CK_METRICS_INIT) before the call. */
typedef struct ck_metrics {
    size_t size;              /* sizeof(ck_metrics) */
    int64_t steps;            /* training steps taken */
    double loss;              /* of the last step or forward pass; NaN before any */
    double lr;                /* the learning rate the next step uses */
    double last_step_seconds; /* wall time of the last ck_model_step */
    double mean_step_seconds; /* over every ck_model_step of this model */
} ck_metrics;
#define CK_METRICS_INIT {.size = sizeof(ck_metrics)}
CK_API int ck_model_metrics(ck_model *m, ck_metrics *out);

#ifdef __cplusplus
}
#endif

#endif
