/* ckrun: the command line over vm/ck.h. Runs one script with its arguments in
 * a sandboxed VM; every failure is one line on stderr and a non-zero exit. */
#include "ck.h"
#include "dist/dist.h"

#include <signal.h>
#include <stdint.h>
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
            "  --nondeterministic  on the GPU, the fastest convolution algorithms instead of\n"
            "                  deterministic ones (gradients vary in the last bits between runs)\n"
            "  --policies LIST with --plan: compare checkpoint policies, e.g.\n"
            "                  none,diffusers,selective,budget:62%%,budget:4GiB\n"
            "  --max-batch SIZE  with --plan: the largest batch whose plan fits SIZE\n"
            "                  (bytes, or with a unit: 24GiB, 512MiB)\n"
            "  --world-size N  with --plan: plan one rank of a data-parallel job of N ranks\n"
            "                  (launching none)\n"
            "  --svg FILE      with --plan: write the memory timeline as SVG\n"
            "  --export-graph FILE\n"
            "                  with --plan: write the compiled graph and each policy's\n"
            "                  decisions as JSON (README.md, \"Graph export\")\n"
            "\n"
            "sandbox and limits (the sandbox is on unless --trust):\n"
            "  --allow-read DIR   scripts may also read under DIR (default: the working\n"
            "                     directory and the script's directory)\n"
            "  --allow-write DIR  scripts may also write (and read) under DIR (default:\n"
            "                     the working directory)\n"
            "  --trust         no sandbox: all of Lua's libraries, any file\n"
            "  --max-heap SIZE the Lua heap's limit (default 1GiB in the sandbox; none)\n"
            "  --max-memory SIZE  all the memory scripts may make ckrun take: the Lua\n"
            "                  heap, graphs, plans, arenas, stages and tensors read into\n"
            "                  Lua; an allocation that would pass it is refused first\n"
            "                  (default: the machine's memory in the sandbox; none)\n"
            "  --callback-budget N  Lua instructions a compile-time callback may run\n"
            "                  (default 100000000; none)\n"
            "  --device NAME   the device to run on: cpu, cuda or auto (the default:\n"
            "                  cuda when a CUDA device is present, else cpu)\n"
            "\n"
            "Ctrl-C stops the run between two ops; a second Ctrl-C kills it.\n");
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

/* bytes from "24GiB", "512MiB", "64M" (K, M, G, T: powers of 1024, as
 * truncate -s reads them), "1e9"; -1 if malformed */
static double parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    double unit = !strcmp(end, "") || !strcmp(end, "B") ? 1
                : !strcmp(end, "KiB") || !strcmp(end, "K") ? 1024.0
                : !strcmp(end, "MiB") || !strcmp(end, "M") ? 1048576.0
                : !strcmp(end, "GiB") || !strcmp(end, "G") ? 1073741824.0
                : !strcmp(end, "TiB") || !strcmp(end, "T") ? 1099511627776.0
                : !strcmp(end, "GB") ? 1e9 : -1;
    return unit < 0 || end == s || v <= 0 ? -1 : v * unit;
}

/* the VM a Ctrl-C interrupts (ck_interrupt is safe in a signal handler) */
static ck_vm *volatile running;

static void on_sigint(int sig)
{
    (void)sig;
    if (running) ck_interrupt(running);
}

int main(int argc, char **argv)
{
    passive_openmp(argv);
    int i = 1;
    const char *code = NULL;
    ck_options opt = CK_OPTIONS_INIT;
    ck_plan_request plan = CK_PLAN_REQUEST_INIT; /* --plan and its companions */
    const char **reads = calloc((size_t)argc + 1, sizeof *reads);
    const char **writes = calloc((size_t)argc + 1, sizeof *writes);
    int nreads = 0, nwrites = 0, rc = 1;
    ck_vm *vm = NULL;
    if (!reads || !writes) {
        fprintf(stderr, "ckrun: out of memory\n");
        goto done;
    }
    opt.allow_read = reads;
    opt.allow_write = writes;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        }
        if (!strcmp(a, "-v") || !strcmp(a, "--version")) {
            printf("ckrun %s\n", ck_version());
            rc = 0;
            goto done;
        }
        if (!strcmp(a, "--plan")) plan.plan_only = 1;
        else if (!strcmp(a, "--json")) plan.json = 1;
        else if (!strcmp(a, "--nondeterministic")) opt.nondeterministic = 1;
        else if (!strcmp(a, "--trust")) opt.trust = 1;
        else if (!strcmp(a, "--policies") && more) plan.policies = argv[++i];
        /* the file named may be written wherever it is: the sandbox allows
         * that file (ck_open_plan), not the rest of its directory */
        else if (!strcmp(a, "--svg") && more) plan.svg = argv[++i];
        else if (!strcmp(a, "--export-graph") && more) plan.export_graph = argv[++i];
        else if (!strcmp(a, "-e") && more) code = argv[++i];
        else if (!strcmp(a, "--allow-read") && more) reads[nreads++] = argv[++i];
        else if (!strcmp(a, "--allow-write") && more) writes[nwrites++] = argv[++i];
        else if (!strcmp(a, "--device") && more) opt.device = argv[++i];
        else if (!strcmp(a, "--world-size") && more) {
            char *end = NULL;
            const long v = strtol(argv[++i], &end, 10);
            if (!end || *end || v < 1 || v > 65536) {
                fprintf(stderr, "ckrun: --world-size wants a number of ranks from 1 to 65536, got '%s'\n", argv[i]);
                rc = 2;
                goto done;
            }
            plan.world_size = (int)v;
        } else if (!strcmp(a, "--max-batch") && more) {
            double v = parse_size(argv[++i]);
            if (v < 0) {
                fprintf(stderr, "ckrun: --max-batch wants a size such as 24GiB, got '%s'\n", argv[i]);
                rc = 2;
                goto done;
            }
            plan.max_batch = v;
        } else if (!strcmp(a, "--max-heap") && more) {
            double v = !strcmp(argv[++i], "none") ? (double)SIZE_MAX : parse_size(argv[i]);
            if (v < 0) {
                fprintf(stderr, "ckrun: --max-heap wants a size such as 512MiB or 'none', got '%s'\n", argv[i]);
                rc = 2;
                goto done;
            }
            opt.heap_limit = v >= (double)SIZE_MAX ? SIZE_MAX : (size_t)v;
        } else if (!strcmp(a, "--max-memory") && more) {
            double v = !strcmp(argv[++i], "none") ? (double)SIZE_MAX : parse_size(argv[i]);
            if (v < 0) {
                fprintf(stderr, "ckrun: --max-memory wants a size such as 8GiB or 'none', got '%s'\n", argv[i]);
                rc = 2;
                goto done;
            }
            opt.max_memory = v >= (double)SIZE_MAX ? SIZE_MAX : (size_t)v;
        } else if (!strcmp(a, "--callback-budget") && more) {
            char *end;
            const char *s = argv[++i];
            long long n = !strcmp(s, "none") ? -1 : strtoll(s, &end, 10);
            if (strcmp(s, "none") && (end == s || *end || n <= 0)) {
                fprintf(stderr, "ckrun: --callback-budget wants a number of instructions or 'none', got '%s'\n", s);
                rc = 2;
                goto done;
            }
            opt.callback_budget = n;
        } else {
            fprintf(stderr, "ckrun: unknown option '%s' (see ckrun --help)\n", a);
            rc = 2;
            goto done;
        }
    }
    if (!code && i >= argc) {
        usage(stderr);
        rc = 2;
        goto done;
    }
    /* MPI starts here when a launcher started this process: before the VM
     * and its threads, and before the script runs */
    char dist_err[300];
    if (ck_dist_init(dist_err, sizeof dist_err)) {
        fprintf(stderr, "ckrun: %s\n", dist_err);
        goto done;
    }
    vm = ck_open_plan(&opt, &plan);
    if (!vm) {
        fprintf(stderr, "ckrun: out of memory\n");
        goto done;
    }
    int st = ck_status(vm);
    if (st == CK_OK) {
        running = vm;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sa.sa_flags = SA_RESETHAND; /* a second Ctrl-C kills */
        sigaction(SIGINT, &sa, NULL);
        st = code ? ck_run_string(vm, code, "(command line)")
                  : ck_run_file(vm, argv[i], argc - i - 1, (const char *const *)argv + i + 1);
        signal(SIGINT, SIG_DFL);
        running = NULL;
    }
    rc = st == CK_OK ? 0 : st == CK_EINTR ? 130 : 1;
    if (st != CK_OK && ck_dist_size() > 1) {
        /* one rank failed: say which, and end the job so that the others do
         * not wait for it in a collective */
        fprintf(stderr, "ckrun: rank %d: %s\n", ck_dist_rank(), ck_error(vm));
        ck_close(vm);
        ck_dist_abort(rc);
    }
    if (st != CK_OK) fprintf(stderr, "ckrun: %s\n", ck_error(vm));
    fflush(stdout);
done:
    ck_close(vm);
    ck_dist_finalize();
    free(reads);
    free(writes);
    return rc;
}
