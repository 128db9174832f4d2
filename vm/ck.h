/* ck.h: the one public header of libck, the ckrun runtime.
 *
 * A host opens a VM, runs Lua scripts in it (scripts `require "ck"` to build,
 * compile and train op graphs), reads the last error, and closes it. The
 * library never calls exit() and never prints unless a log callback is given.
 *
 *     ck_vm *vm = ck_open(NULL);
 *     const char *args[] = {"--steps", "10"};
 *     if (ck_run_file(vm, "train.lua", 2, args) != CK_OK)
 *         fprintf(stderr, "%s\n", ck_error(vm));
 *     ck_close(vm);
 *
 * One thread per VM at a time; VMs share no state.
 */
#ifndef CK_H
#define CK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes */
#define CK_OK 0
#define CK_EFILE 1   /* a script or data file cannot be read */
#define CK_ESYNTAX 2 /* a Lua syntax error */
#define CK_ERUN 3    /* an error raised while the script ran */
#define CK_EMEM 4    /* out of memory */
#define CK_EARG 5    /* a bad argument to the API */

#define CK_VERSION "0.1.0"

typedef struct ck_vm ck_vm;

/* ---- options */
typedef struct ck_options {
    /* where `require "ck.nn"` and friends are found; NULL: the built-in default */
    const char *stdlib_dir;
    /* receives what scripts print (print, io.write); NULL: stdout */
    void (*log)(void *ud, const char *text, size_t len);
    void *log_ud;
    /* build and plan only: compiled programs allocate nothing and cannot run;
     * scripts see ck.plan_mode (and ck.json for machine-readable output) */
    int plan_only;
    int json;
    /* with plan_only, what the plan report holds (scripts see ck.plan_policies,
     * ck.plan_svg, ck.plan_max_batch): policies to compare side by side
     * ("none,diffusers,budget:62%"), an SVG memory timeline to write, and a
     * memory size for which to report the largest batch that fits (0: none) */
    const char *plan_policies;
    const char *plan_svg;
    double plan_max_batch;
} ck_options;

/* ---- life cycle */
ck_vm *ck_open(const ck_options *opt); /* NULL options: defaults. NULL on out of memory. */
void ck_close(ck_vm *vm);
const char *ck_version(void);

/* ---- running scripts
 * Arguments reach the script as the global table `args` (`--key value` becomes
 * args.key = value, numbers converted; a `--flag` alone is true; other words are
 * args[1], args[2], ...) and as the chunk's `...`. */
int ck_run_file(ck_vm *vm, const char *path, int argc, const char *const *argv);
int ck_run_string(ck_vm *vm, const char *code, const char *chunkname);

/* The message of the last failed call: one line that names the script file and
 * line where there is one. Valid until the next call on the VM. */
const char *ck_error(const ck_vm *vm);

#ifdef __cplusplus
}
#endif

#endif
