/* Threads and signals in the host API.
 * - SIGTERM stops every VM that runs with a logger that asked for it
 *   (ck.log_open{sigterm = true}, the default), whichever VM armed it first
 *   and whether that one closed or closed its logger; VMs without such a
 *   logger run on, and the host's own SIGTERM handler is back once the last
 *   such logger closed.
 * - The handler, called as a signal calls it from a thread while other threads
 *   open, log in and close VMs (and call a closed one), touches no freed memory.
 * - Lua code that runs at ck_close (finalizers under trust, the coroutines
 *   they resume, the bindings they call) runs under the VM's callback budget
 *   (the close budget where it has none) and ck_interrupt, so ck_close
 *   returns; finalizers that end still run.
 * - VMs train, log and close in threads at once, with the same results.
 * Built also under ThreadSanitizer (test_host_threads_tsan, one OpenMP
 * thread: libgomp is not instrumented) and, by make test-asan, under
 * AddressSanitizer. Prints one line per check and "N passed, M failed". */
#include "ck.h"
#include "host_check.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static const char *MODEL =
    "local ck = require 'ck'\n"
    "function build()\n"
    "  local g = ck.graph()\n"
    "  local x, t = g:input('x', {8, 2}), g:input('t', {8, 1})\n"
    "  local h = ck.silu(ck.linear(x, g:param('l1.weight', {4, 2}), g:param('l1.bias', {4})))\n"
    "  local loss = ck.mse_loss(ck.linear(h, g:param('l2.weight', {1, 4})), t)\n"
    "  return g:compile{loss = loss, optimizer = 'adamw', lr = 1e-2, seed = 1}\n"
    "end\n";

/* ---- a VM running a script in a thread of its own */

typedef struct runner {
    ck_vm *vm;
    const char *code;
    pthread_t th;
    atomic_int done;
    int status;
    double ended; /* now() when the run returned */
} runner;

static void *run_main(void *ud)
{
    runner *r = ud;
    r->status = ck_run_string(r->vm, r->code, "loop");
    r->ended = now();
    atomic_store(&r->done, 1);
    return NULL;
}

static void run_start(runner *r, ck_vm *vm, const char *code)
{
    r->vm = vm;
    r->code = code;
    r->status = -1;
    r->ended = 0;
    atomic_store(&r->done, 0);
    pthread_create(&r->th, NULL, run_main, r);
}

/* waits up to s seconds for the run to end: 1 if it did */
static int run_wait(runner *r, double s)
{
    double t0 = now();
    while (!atomic_load(&r->done) && now() - t0 < s) sleep_s(0.005);
    return atomic_load(&r->done);
}

/* stops the run for good (ck_interrupt) and joins its thread */
static void run_stop(runner *r)
{
    while (!run_wait(r, 0.05)) ck_interrupt(r->vm);
    pthread_join(r->th, NULL);
}

/* a VM with a logger in logs/NAME.jsonl; sigterm: what the logger asks for */
static ck_vm *logged_vm(const char *name, int sigterm)
{
    ck_vm *vm = ck_open(NULL);
    char code[256];
    snprintf(code, sizeof code,
             "lg = require('ck').log_open{dir = 'logs', tensorboard = false, jsonl_name = '%s.jsonl', sigterm = %s}", name,
             sigterm ? "true" : "false");
    if (ck_run_string(vm, code, name) != CK_OK) printf("cannot open a logger in %s: %s\n", name, ck_error(vm));
    return vm;
}

static atomic_int host_terms;

static void host_on_term(int sig)
{
    (void)sig;
    atomic_fetch_add(&host_terms, 1);
}

static int term_is_host(void)
{
    struct sigaction sa;
    sigaction(SIGTERM, NULL, &sa);
    return sa.sa_handler == host_on_term;
}

static const char *LOOP = "while true do end";

/* SIGTERM while VMs with and without loggers run, the first to arm it closed */
static void sigterm_after_first_closed(void)
{
    ck_vm *first = logged_vm("first", 1);
    ck_vm *b = logged_vm("b", 1), *c = logged_vm("c", 1), *d = logged_vm("d", 0), *e = ck_open(NULL);
    check(!term_is_host(), "a logger replaces the host's SIGTERM handler");
    ck_close(first);
    runner r[4];
    ck_vm *vms[4] = {b, c, d, e};
    for (int i = 0; i < 4; i++) run_start(&r[i], vms[i], LOOP);
    sleep_s(0.2);
    double t0 = now();
    kill(getpid(), SIGTERM);
    int stopped_b = run_wait(&r[0], 5), stopped_c = run_wait(&r[1], 5);
    check(stopped_b && r[0].status == CK_EINTR && r[0].ended - t0 < 1.0,
          "SIGTERM stops a VM with a logger after the first VM to arm it closed (%.3f s, %s)", r[0].ended - t0,
          ck_error(b));
    check(stopped_c && r[1].status == CK_EINTR && r[1].ended - t0 < 1.0,
          "and a second such VM in another thread (%.3f s, %s)", r[1].ended - t0, ck_error(c));
    sleep_s(0.3);
    check(!atomic_load(&r[2].done), "a VM whose logger says sigterm = false runs on");
    check(!atomic_load(&r[3].done), "a VM without a logger runs on");
    check(atomic_load(&host_terms) == 0, "the host's handler did not see it");
    for (int i = 0; i < 4; i++) run_stop(&r[i]);
    check(r[2].status == CK_EINTR && r[3].status == CK_EINTR, "ck_interrupt stops those two");
    ck_close(b);
    check(!term_is_host(), "while one logger that asked for SIGTERM is open, the handler stays");
    ck_close(c);
    ck_close(d);
    ck_close(e);
    check(term_is_host(), "once the last such logger closed (with its VM) the host's handler is back");
    kill(getpid(), SIGTERM);
    sleep_s(0.05);
    check(atomic_load(&host_terms) == 1, "and it gets the next SIGTERM");
}

/* the first VM closes its logger and runs on */
static void sigterm_after_logger_closed(void)
{
    ck_vm *a = logged_vm("a2", 1), *b = logged_vm("b2", 1);
    int st = ck_run_string(a, "lg:close()", "a");
    runner r[2];
    run_start(&r[0], a, LOOP);
    run_start(&r[1], b, "while true do pcall(function() while true do end end) end");
    sleep_s(0.2);
    double t0 = now();
    kill(getpid(), SIGTERM);
    int stopped = run_wait(&r[1], 5);
    check(st == CK_OK && stopped && r[1].status == CK_EINTR && r[1].ended - t0 < 1.0,
          "after the first VM closed its logger, SIGTERM stops the other, pcall or not (%.3f s)", r[1].ended - t0);
    sleep_s(0.3);
    check(!atomic_load(&r[0].done), "the VM whose logger closed runs on");
    run_stop(&r[0]);
    run_stop(&r[1]);
    ck_close(a);
    ck_close(b);
    check(term_is_host(), "the host's handler is back");
}

/* two VMs train in threads; one logs asynchronously */
static void sigterm_between_ops(void)
{
    ck_vm *vm[2];
    runner r[2];
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        vm[i] = ck_open(NULL);
        char code[256];
        snprintf(code, sizeof code,
                 "lg = require('ck').log_open{dir = 'logs', tensorboard = false, jsonl_name = 'train%d.jsonl', async = %s}\n"
                 "p = build(); steps = 0",
                 i, i ? "true" : "false");
        ok &= ck_run_string(vm[i], MODEL, "model") == CK_OK && ck_run_string(vm[i], code, "setup") == CK_OK;
    }
    const char *train = "while true do local loss = p:step(); steps = steps + 1; lg:write{step = steps, loss = loss} end";
    for (int i = 0; i < 2; i++) run_start(&r[i], vm[i], train);
    sleep_s(0.3);
    double t0 = now();
    kill(getpid(), SIGTERM);
    int stopped = run_wait(&r[0], 5) && run_wait(&r[1], 5);
    double steps0 = 0, steps1 = 0;
    for (int i = 0; i < 2; i++) run_stop(&r[i]);
    ck_get_number(vm[0], "steps", &steps0);
    ck_get_number(vm[1], "steps", &steps1);
    double late = fmax(r[0].ended, r[1].ended) - t0;
    check(ok && stopped && r[0].status == CK_EINTR && r[1].status == CK_EINTR && late < 1.0 && steps0 > 0 && steps1 > 0,
          "SIGTERM stops two VMs training in threads between ops (%.3f s, %g and %g steps, %s)", late, steps0, steps1,
          ck_error(vm[1]));
    for (int i = 0; i < 2; i++) ck_close(vm[i]);
    check(term_is_host(), "the host's handler is back");
}

/* ---- the handler, called while VMs open and close */

typedef struct churn {
    int id, rounds, bad;
    ck_vm *stale;       /* closed before the threads start */
    ck_model *stale_m;  /* the same */
} churn;

static void *churn_main(void *ud)
{
    churn *c = ud;
    for (int i = 0; i < c->rounds; i++) {
        char name[32];
        snprintf(name, sizeof name, "churn%d", c->id);
        ck_vm *vm = logged_vm(name, 1);
        int st = ck_run_string(vm, "x = 0; for i = 1, 20000 do x = x + i end", "churn");
        if (st != CK_OK && st != CK_EINTR) c->bad++;
        if (i & 1) ck_run_string(vm, "lg:close()", "churn");
        ck_interrupt(c->stale);
        if (ck_run_string(c->stale, "x = 1", "stale") != CK_EINVAL || ck_status(c->stale) != CK_EINVAL) c->bad++;
        ck_model *m = NULL;
        st = ck_run_string(vm, MODEL, "model");
        st = st ? st : ck_model_open(vm, "build", 0, NULL, &m);
        if (st == CK_OK) {
            st = ck_model_step(m, NULL);
            if (i & 1) ck_model_close(m);
        }
        if (st != CK_OK && st != CK_EINTR) c->bad++;
        if (ck_model_step(c->stale_m, NULL) != CK_EINVAL) c->bad++;
        ck_close(vm);
        ck_close(vm);
    }
    return NULL;
}

static void handler_while_churning(void)
{
    ck_vm *anchor = logged_vm("anchor", 1);
    struct sigaction sa;
    sigaction(SIGTERM, NULL, &sa);
    void (*handler)(int) = sa.sa_handler;
    int usable = handler != SIG_DFL && handler != SIG_IGN && handler != host_on_term;
    ck_vm *stale = ck_open(NULL);
    ck_model *stale_m = NULL;
    if (ck_run_string(stale, MODEL, "model") || ck_model_open(stale, "build", 0, NULL, &stale_m))
        printf("cannot open a model: %s\n", ck_error(stale));
    ck_model_close(stale_m);
    ck_close(stale);
    pthread_t th[3];
    churn c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = (churn){i, 25, 0, stale, stale_m};
        pthread_create(&th[i], NULL, churn_main, &c[i]);
    }
    int calls = 0;
    double t0 = now();
    while (usable && now() - t0 < 0.5) {
        handler(SIGTERM);
        calls++;
    }
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        bad += c[i].bad;
    }
    check(usable && calls > 0 && bad == 0,
          "the SIGTERM handler called %d times while 3 threads open, log in, train in, close twice 25 VMs each "
          "and call a closed VM and a closed model: %d wrong statuses",
          calls, bad);
    ck_close(anchor);
    check(term_is_host(), "the host's handler is back");
}

/* ---- Lua code at ck_close */

typedef struct logbuf {
    char text[8192];
    size_t len;
} logbuf;

static void to_buf(void *ud, const char *s, size_t n)
{
    logbuf *b = ud;
    if (n > sizeof b->text - 1 - b->len) n = sizeof b->text - 1 - b->len;
    for (size_t i = 0; i < n; i++) b->text[b->len + i] = s[i] == '\n' ? ' ' : s[i];
    b->len += n;
    b->text[b->len] = 0;
}

/* opens a VM (trust or sandboxed, callback budget), runs code, closes it:
 * the seconds ck_close took, or -1 when the code failed */
static double close_after(int trust, long long budget, const char *code, logbuf *log, int interrupt_after_ms);

typedef struct later {
    ck_vm *vm;
    int ms;
    atomic_int stop;
} later;

static void *interrupt_main(void *ud)
{
    later *l = ud;
    sleep_s(l->ms / 1000.0);
    while (!atomic_load(&l->stop)) {
        ck_interrupt(l->vm);
        sleep_s(0.01);
    }
    return NULL;
}

static double close_after(int trust, long long budget, const char *code, logbuf *log, int interrupt_after_ms)
{
    ck_options opt = CK_OPTIONS_INIT;
    opt.trust = trust;
    opt.callback_budget = budget;
    opt.log = to_buf;
    opt.log_ud = log;
    log->len = 0;
    log->text[0] = 0;
    ck_vm *vm = ck_open(&opt);
    int st = ck_run_string(vm, code, "close");
    if (st != CK_OK) {
        printf("     (%s)\n", ck_error(vm));
        ck_close(vm);
        return -1;
    }
    later l = {vm, interrupt_after_ms, 0};
    pthread_t th;
    if (interrupt_after_ms >= 0) pthread_create(&th, NULL, interrupt_main, &l);
    double t0 = now();
    ck_close(vm);
    double dt = now() - t0;
    if (interrupt_after_ms >= 0) {
        atomic_store(&l.stop, 1);
        pthread_join(th, NULL);
    }
    return dt;
}

static void close_under_limits(void)
{
    logbuf log;
    const char *spin = "setmetatable({}, {__gc = function() coroutine.wrap(function() while true do end end)() end})";
    double dt = close_after(1, 10000000, spin, &log, -1);
    check(dt >= 0 && dt < 10 && strstr(log.text, "instruction budget of 10000000"),
          "a finalizer that resumes a looping coroutine is stopped at close by the budget (%.2f s: %.120s)", dt, log.text);
    dt = close_after(1, -1, spin, &log, -1);
    check(dt >= 0 && dt < 30 && strstr(log.text, "instruction budget of 100000000"),
          "with no callback budget, by the close budget of 100M instructions (%.2f s)", dt);
    dt = close_after(1, 10000000000000LL, spin, &log, 100);
    check(dt >= 0 && dt < 10 && strstr(log.text, "interrupted"),
          "with a budget of hours, by ck_interrupt from another thread while ck_close runs (%.2f s: %.120s)", dt,
          log.text);
    dt = close_after(1, 10000000,
                     "for i = 1, 20 do setmetatable({}, {__gc = function() coroutine.wrap(function() while true do end end)() end}) end",
                     &log, -1);
    check(dt >= 0 && dt < 10, "20 such finalizers share one budget (%.2f s)", dt);
    dt = close_after(1, 200000,
                     "local lg = require('ck').log_open{dir = 'logs', jsonl = false, tensorboard = false}\n"
                     "local rec = {}; for i = 1, 1024 do rec['k' .. i] = i end\n"
                     "setmetatable({}, {__gc = function() while true do lg:write(rec) end end})",
                     &log, -1);
    check(dt >= 0 && dt < 10 && strstr(log.text, "instruction budget"),
          "a finalizer looping over a binding that charges the budget (lg:write of 1024 fields) is stopped (%.2f s)", dt);
    dt = close_after(1, 0,
                     "co = coroutine.create(function()\n"
                     "  local x <close> = setmetatable({}, {__close = function() while true do end end})\n"
                     "  coroutine.yield()\n"
                     "end)\n"
                     "coroutine.resume(co)",
                     &log, -1);
    check(dt >= 0 && dt < 10, "a suspended coroutine's pending <close> that would loop does not run at close (%.2f s)", dt);
    dt = close_after(1, 0, "setmetatable({}, {__gc = function() error('finalizer failed') end})", &log, -1);
    check(dt >= 0 && dt < 10 && strstr(log.text, "finalizer failed"), "a finalizer that raises: close returns, the log says why (%s)",
          log.text);
    remove("fin.txt");
    dt = close_after(1, 0,
                     "setmetatable({}, {__gc = function() local f = io.open('fin.txt', 'w'); "
                     "for i = 1, 1000 do f:write(i, '\\n') end; f:close() end})",
                     &log, -1);
    FILE *f = fopen("fin.txt", "r");
    int lines = 0;
    char line[64];
    while (f && fgets(line, sizeof line, f)) lines++;
    if (f) fclose(f);
    check(dt >= 0 && lines == 1000, "a finalizer that ends runs whole at close (%d of 1000 lines)", lines);
    remove("logs/flushed.jsonl");
    dt = close_after(0, 0,
                     "local lg = require('ck').log_open{dir = 'logs', tensorboard = false, jsonl_name = 'flushed.jsonl', async = true}\n"
                     "for i = 1, 50 do lg:write{step = i, v = i} end",
                     &log, -1);
    f = fopen("logs/flushed.jsonl", "r");
    lines = 0;
    char big[512];
    while (f && fgets(big, sizeof big, f)) lines++;
    if (f) fclose(f);
    check(dt >= 0 && lines == 50, "a sandboxed VM's async logger left open is flushed by ck_close (%d of 50 records)", lines);
    ck_vm *vm = ck_open(NULL);
    int st = ck_run_string(vm, "setmetatable({}, {__gc = function() while true do end end})", "gc");
    double t0 = now();
    ck_close(vm);
    check(st == CK_EDENIED && now() - t0 < 5, "in the sandbox no finalizer is set, and ck_close returns");
}

/* ---- VMs that train, log and close in threads at once */

typedef struct trainer {
    int id;
    double loss;
    int status;
    char err[256];
} trainer;

static void *train_main(void *ud)
{
    trainer *t = ud;
    ck_options opt = CK_OPTIONS_INIT;
    opt.device = "auto";
    ck_vm *vm = ck_open(&opt);
    char code[512];
    snprintf(code, sizeof code,
             "lg = require('ck').log_open{dir = 'logs', tensorboard = true, jsonl_name = 't%d.jsonl', async = %s, queue = 4}\n"
             "p = build()\n"
             "local xs, ts = {}, {}\n"
             "for i = 1, 16 do xs[i] = math.sin(i) end\n"
             "for i = 1, 8 do ts[i] = math.cos(i) end\n"
             "p:set('x', xs); p:set('t', ts)\n"
             "for i = 1, 10 do local loss = p:step(); lg:write{step = i, loss = loss}; last = loss end\n"
             "lg:flush()",
             t->id, t->id & 1 ? "true" : "false");
    int st = ck_run_string(vm, MODEL, "model");
    st = st ? st : ck_run_string(vm, code, "train");
    st = st ? st : ck_get_number(vm, "last", &t->loss);
    t->status = st;
    snprintf(t->err, sizeof t->err, "%s", ck_error(vm));
    ck_close(vm);
    /* a plan for a GPU this machine may not have: the CUDA loader, asked from many threads */
    ck_plan_request req = CK_PLAN_REQUEST_INIT;
    req.plan_only = 1;
    opt.device = "cuda";
    vm = ck_open_plan(&opt, &req);
    int pst = ck_run_string(vm, MODEL, "model");
    pst = pst ? pst : ck_run_string(vm, "p = build()", "plan");
    if (t->status == CK_OK && pst != CK_OK) {
        t->status = pst;
        snprintf(t->err, sizeof t->err, "plan: %s", ck_error(vm));
    }
    ck_close(vm);
    return NULL;
}

static void train_in_threads(void)
{
    pthread_t th[4];
    trainer t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (trainer){i, NAN, -1, ""};
        pthread_create(&th[i], NULL, train_main, &t[i]);
    }
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        if (t[i].status != CK_OK) printf("     thread %d: %s\n", i, t[i].err);
        ok &= t[i].status == CK_OK && isfinite(t[i].loss) && t[i].loss == t[0].loss;
    }
    check(ok && t[0].loss > 0, "4 threads each train a model 10 steps, log (2 async) and plan for cuda: the same loss %.9g",
          t[0].loss);
}

int main(void)
{
    alarm(300); /* a close or a run that nothing stops fails the test instead of hanging it */
    char dir[] = "/tmp/ck_threads_XXXXXX";
    if (!mkdtemp(dir) || chdir(dir)) return 1;
    mkdir("logs", 0777);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = host_on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);

    sigterm_after_first_closed();
    sigterm_after_logger_closed();
    sigterm_between_ops();
    handler_while_churning();
    close_under_limits();
    train_in_threads();

    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (chdir("/") == 0 && system(cmd) != 0) printf("cannot remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
