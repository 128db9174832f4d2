/* ckrun: the command line over vm/ck.h. Runs one script with its arguments;
 * every failure is one line on stderr and a non-zero exit. */
#include "ck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ckrun [options] SCRIPT.lua [--key value ...]\n"
            "\n"
            "Runs a ckrun Lua script. Arguments after the script reach it as the\n"
            "table `args` (--key value -> args.key; a lone --flag -> true).\n"
            "\n"
            "options:\n"
            "  -h, --help      show this help and exit\n"
            "  -v, --version   show the version and exit\n"
            "  -e CODE         run CODE instead of a script file\n"
            "  --plan          build and plan only: print the plan, allocate and run nothing\n"
            "  --json          with --plan: print the plan as one JSON object\n"
            "  --policies LIST with --plan: compare checkpoint policies, e.g.\n"
            "                  none,diffusers,selective,budget:62%%,budget:4GiB\n"
            "  --max-batch SIZE  with --plan: the largest batch whose plan fits SIZE\n"
            "                  (bytes, or with a unit: 24GiB, 512MiB)\n"
            "  --svg FILE      with --plan: write the memory timeline as SVG\n");
}

/* OpenMP threads that spin while they wait steal the cores that OpenBLAS and
 * the other threads need (a UNet step here ran 17x slower with spinning waits
 * under load). libgomp reads its settings when it loads, before main, so the
 * policy is set by running ckrun again with it in the environment. */
static void passive_openmp(char **argv)
{
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);
    /* if that fails, run with the default policy */
}

int main(int argc, char **argv)
{
    passive_openmp(argv);
    int i = 1;
    const char *code = NULL;
    ck_options opt = {0};
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--version")) {
            printf("ckrun %s\n", ck_version());
            return 0;
        }
        if (!strcmp(argv[i], "--plan")) {
            opt.plan_only = 1;
            continue;
        }
        if (!strcmp(argv[i], "--json")) {
            opt.json = 1;
            continue;
        }
        if (!strcmp(argv[i], "--policies") && i + 1 < argc) {
            opt.plan_policies = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--svg") && i + 1 < argc) {
            opt.plan_svg = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--max-batch") && i + 1 < argc) {
            char *end;
            double v = strtod(argv[++i], &end);
            double unit = !strcmp(end, "") || !strcmp(end, "B") ? 1
                        : !strcmp(end, "KiB") ? 1024.0
                        : !strcmp(end, "MiB") ? 1048576.0
                        : !strcmp(end, "GiB") ? 1073741824.0
                        : !strcmp(end, "GB") ? 1e9 : -1;
            if (unit < 0 || v <= 0) {
                fprintf(stderr, "ckrun: --max-batch wants a size such as 24GiB, got '%s'\n", argv[i]);
                return 2;
            }
            opt.plan_max_batch = v * unit;
            continue;
        }
        if (!strcmp(argv[i], "-e") && i + 1 < argc) {
            code = argv[++i];
            continue;
        }
        fprintf(stderr, "ckrun: unknown option '%s' (see ckrun --help)\n", argv[i]);
        return 2;
    }
    if (!code && i >= argc) {
        usage(stderr);
        return 2;
    }
    ck_vm *vm = ck_open(&opt);
    if (!vm) {
        fprintf(stderr, "ckrun: out of memory\n");
        return 1;
    }
    int st = code ? ck_run_string(vm, code, "(command line)")
                  : ck_run_file(vm, argv[i], argc - i - 1, (const char *const *)argv + i + 1);
    if (st != CK_OK) fprintf(stderr, "ckrun: %s\n", ck_error(vm));
    fflush(stdout);
    ck_close(vm);
    return st == CK_OK ? 0 : 1;
}
