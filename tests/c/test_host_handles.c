/* The handle-based API where lua.h is not safe: a closed ck_vm or ck_model,
 * a pointer ck_open never returned and a double close give CK_EINVAL (or do
 * nothing) instead of touching freed memory; a NULL argv entry is CK_EARG;
 * SIGTERM after the VM whose logger armed it closed reaches the VM still open;
 * threads that open, close and interrupt VMs at once; and ck.listdir that
 * runs out of memory gives its directory back. Under AddressSanitizer
 * (make test-asan) any access to freed memory here fails the run.
 * Prints one line per check and "N passed, M failed". */
#include "ck.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int passed, failed;

static void check(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf(cond ? "ok   " : "FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (cond) passed++;
    else failed++;
}

static const char *MODEL =
    "local ck = require 'ck'\n"
    "function build(width)\n"
    "  width = width or 4\n"
    "  local g = ck.graph()\n"
    "  local x, t = g:input('x', {8, 2}), g:input('t', {8, 1})\n"
    "  local h = ck.silu(ck.linear(x, g:param('l1.weight', {width, 2}), g:param('l1.bias', {width})))\n"
    "  local loss = ck.mse_loss(ck.linear(h, g:param('l2.weight', {1, width})), t)\n"
    "  return g:compile{loss = loss, optimizer = 'adamw', lr = 1e-2, seed = 1}\n"
    "end\n";

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

typedef struct churn {
    int rounds, bad;
    ck_vm *stale;
} churn;

static void *churn_main(void *ud)
{
    churn *c = ud;
    for (int i = 0; i < c->rounds; i++) {
        ck_vm *vm = ck_open(NULL);
        double d = 0;
        if (ck_run_string(vm, "x = 41 + 1", "churn") != CK_OK || ck_get_number(vm, "x", &d) != CK_OK || d != 42) c->bad++;
        ck_interrupt(c->stale); /* a closed handle: nothing */
        if (ck_run_string(c->stale, "x = 1", "stale") != CK_EINVAL) c->bad++;
        ck_close(vm);
        ck_close(vm);
    }
    return NULL;
}

int main(void)
{
    char dir[] = "/tmp/ck_handles_XXXXXX";
    if (!mkdtemp(dir) || chdir(dir)) return 1;

    /* ---- after ck_close */
    ck_vm *vm = ck_open(NULL);
    check(ck_status(vm) == CK_OK, "a VM opens");
    ck_model *m = NULL;
    ck_value width = ck_number(4);
    int st = ck_run_string(vm, MODEL, "model");
    st = st ? st : ck_model_open(vm, "build", 1, &width, &m);
    check(st == CK_OK && m, "a model opens (%s)", ck_error(vm));
    ck_close(vm);
    ck_close(vm);
    check(1, "a second ck_close of the same handle returns");
    double d = 0;
    const char *s = NULL;
    ck_value res[1];
    const char *argv1[] = {"a"};
    check(ck_status(vm) == CK_EINVAL, "ck_status of a closed VM: CK_EINVAL");
    check(ck_error(vm) && strstr(ck_error(vm), "closed"), "ck_error of a closed VM says so (%s)", ck_error(vm));
    check(ck_run_string(vm, "x = 1", "x") == CK_EINVAL, "ck_run_string after ck_close: CK_EINVAL");
    check(ck_run_file(vm, "none.lua", 1, argv1) == CK_EINVAL, "ck_run_file after ck_close: CK_EINVAL");
    check(ck_call(vm, "f", 0, NULL, 1, res) == CK_EINVAL, "ck_call after ck_close: CK_EINVAL");
    check(ck_get_number(vm, "x", &d) == CK_EINVAL, "ck_get_number after ck_close: CK_EINVAL");
    check(ck_get_string(vm, "x", &s, NULL) == CK_EINVAL, "ck_get_string after ck_close: CK_EINVAL");
    check(ck_set_number(vm, "x", 1) == CK_EINVAL, "ck_set_number after ck_close: CK_EINVAL");
    check(ck_set_string(vm, "x", "y") == CK_EINVAL, "ck_set_string after ck_close: CK_EINVAL");
    ck_model *m2 = (ck_model *)1;
    check(ck_model_open(vm, "build", 0, NULL, &m2) == CK_EINVAL && m2 == NULL, "ck_model_open after ck_close: CK_EINVAL");
    ck_interrupt(vm);
    check(1, "ck_interrupt of a closed VM returns");
    float x[16] = {0};
    ck_plan_info plan = CK_PLAN_INFO_INIT;
    ck_metrics met = CK_METRICS_INIT;
    int64_t dims[CK_SHAPE_MAX];
    check(ck_model_step(m, NULL) == CK_EINVAL, "ck_model_step of a model whose VM closed: CK_EINVAL");
    check(ck_model_forward(m, NULL) == CK_EINVAL, "ck_model_forward: CK_EINVAL");
    check(ck_model_set(m, "x", x, 16) == CK_EINVAL, "ck_model_set: CK_EINVAL");
    check(ck_model_read(m, "x", x, 16, NULL) == CK_EINVAL, "ck_model_read: CK_EINVAL");
    check(ck_model_shape(m, "x", dims, NULL) == CK_EINVAL, "ck_model_shape: CK_EINVAL");
    check(ck_model_plan(m, &plan) == CK_EINVAL, "ck_model_plan: CK_EINVAL");
    check(ck_model_metrics(m, &met) == CK_EINVAL, "ck_model_metrics: CK_EINVAL");
    ck_model_close(m);
    check(1, "ck_model_close of a model whose VM closed returns");

    /* ---- a model closed on its own, its VM open */
    vm = ck_open(NULL);
    st = ck_run_string(vm, MODEL, "model");
    st = st ? st : ck_model_open(vm, "build", 0, NULL, &m);
    ck_model_close(m);
    check(st == CK_OK && ck_model_step(m, NULL) == CK_EINVAL, "ck_model_step after ck_model_close: CK_EINVAL");
    ck_model_close(m);
    check(ck_run_string(vm, "y = 2", "y") == CK_OK, "a second ck_model_close returns; the VM still runs");

    /* ---- a NULL argv entry */
    FILE *f = fopen("args.lua", "w");
    fputs("n = #args\n", f);
    fclose(f);
    const char *argv3[] = {"--a", NULL, "b"};
    check(ck_run_file(vm, "args.lua", 3, argv3) == CK_EARG && strstr(ck_error(vm), "NULL"),
          "a NULL entry in argv: CK_EARG (%s)", ck_error(vm));
    const char *argv0[] = {NULL};
    check(ck_run_file(vm, "args.lua", 1, argv0) == CK_EARG, "argv = {NULL}: CK_EARG");
    check(ck_run_file(vm, "args.lua", 0, argv0) == CK_OK, "argc 0 reads no entry of argv (%s)", ck_error(vm));
    ck_close(vm);

    /* ---- pointers ck_open never returned */
    char junk[4096];
    memset(junk, 0x5a, sizeof junk);
    ck_vm *fake = (ck_vm *)junk;
    check(ck_run_string(fake, "x = 1", "x") == CK_EINVAL && ck_status(fake) == CK_EINVAL,
          "a pointer ck_open never returned: CK_EINVAL");
    ck_close(fake);
    ck_interrupt(fake);
    ck_model_close((ck_model *)junk);
    check(ck_model_step((ck_model *)junk, NULL) == CK_EINVAL, "and as a model: CK_EINVAL; closing it does nothing");
    check(ck_run_string(NULL, "x = 1", "x") == CK_EARG && ck_status(NULL) == CK_EARG, "NULL stays CK_EARG");

    /* ---- SIGTERM armed by a VM that closed while another still holds it */
    ck_vm *a = ck_open(NULL), *b = ck_open(NULL);
    mkdir("logs", 0777);
    st = ck_run_string(a, "lg = require('ck').log_open{dir = 'logs', tensorboard = false, jsonl_name = 'a.jsonl'}", "a");
    st = st ? st : ck_run_string(b, "lg = require('ck').log_open{dir = 'logs', tensorboard = false, jsonl_name = 'b.jsonl'}", "b");
    check(st == CK_OK, "two VMs each open a logger that stops the run on SIGTERM (%s)", ck_error(b));
    ck_close(a);
    struct sigaction now;
    sigaction(SIGTERM, NULL, &now);
    int armed = now.sa_handler != SIG_DFL && now.sa_handler != SIG_IGN;
    if (armed) raise(SIGTERM); /* SA_RESETHAND: the first one is handled */
    check(armed, "SIGTERM after the first VM closed is handled (no write into its freed memory)");
    check(ck_run_string(b, "x = 1", "b") == CK_EINTR, "it reaches the other VM: its next call is interrupted (%s)",
          ck_error(b));
    check(ck_run_string(b, "lg:close(); lg = nil", "b") == CK_OK, "which then runs on (%s)", ck_error(b));
    ck_close(b);
    sigaction(SIGTERM, NULL, &now);
    check(now.sa_handler == SIG_DFL, "with the last logger closed, SIGTERM's disposition is the default again");

    /* ---- threads: open, run, close, and calls on a stale handle */
    ck_vm *stale = ck_open(NULL);
    ck_close(stale);
    pthread_t th[4];
    churn c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (churn){20, 0, stale};
        pthread_create(&th[i], NULL, churn_main, &c[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += c[i].bad;
    }
    check(bad == 0, "4 threads open, run and close 20 VMs each and call a stale handle: %d wrong answers", bad);

    /* ---- ck.listdir out of memory gives its directory back */
    mkdir("many", 0777);
    for (int i = 0; i < 600; i++) {
        char p[64];
        snprintf(p, sizeof p, "many/entry-with-a-long-name-%04d", i);
        FILE *e = fopen(p, "w");
        if (e) fclose(e);
    }
    ck_options opt = CK_OPTIONS_INIT;
    opt.heap_limit = (size_t)4 << 20;
    vm = ck_open(&opt);
    int fd0 = open_fds();
    /* fill(short) fills the heap to `short` bytes below its limit in a few
     * big strings (string.rep needs twice its result while it builds it) */
    char prelude[1024];
    snprintf(prelude, sizeof prelude,
             "ck = require 'ck'; fails = 0\n"
             "function fill(short)\n"
             "  local t = {}\n"
             "  for i = 1, 30 do\n"
             "    collectgarbage()\n"
             "    local n = (%zu - collectgarbage('count') * 1024 - short) // 2 - 256\n"
             "    if n < 64 then break end\n"
             "    t[#t + 1] = string.rep('x', n)\n"
             "  end\n"
             "  return t\n"
             "end\n",
             opt.heap_limit);
    st = ck_run_string(vm, prelude, "listdir");
    /* each try lists the directory D bytes short of the limit: for small D it
     * runs out of memory part way (a try the heap's soft limit stops first
     * fails as a whole, which is fine) */
    for (int k = 0; k < 120 && st == CK_OK; k++) {
        char code[256];
        snprintf(code, sizeof code,
                 "local pad = fill(%d)\n"
                 "local ok = pcall(ck.listdir, 'many')\n"
                 "pad = nil\n"
                 "if not ok then fails = fails + 1 end\n",
                 100 + 400 * k);
        ck_run_string(vm, code, "listdir");
    }
    ck_run_string(vm, "collectgarbage(); collectgarbage()", "gc");
    double fails = 0;
    ck_get_number(vm, "fails", &fails);
    int fd1 = open_fds();
    check(st == CK_OK && fails > 0 && fd1 <= fd0 + 1,
          "ck.listdir failing for lack of memory (%g of 120 times) leaves no directory open (%d descriptors, %d before) (%s)",
          fails, fd1, fd0, ck_error(vm));
    ck_close(vm);

    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (chdir("/") == 0 && system(cmd) != 0) printf("cannot remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
