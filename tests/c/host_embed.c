/* A host program over the public API alone (ck.h; no Lua headers): runs
 * scripts, calls their functions, trains a model they define, interrupts runs
 * from another thread, and checks every limit, every sandbox rule it can see
 * from outside, and the error paths. Built against the installed library by
 * tests/sh/test_install.sh and under AddressSanitizer by CMake
 * (host_embed_asan), where a leak after any of these errors fails it.
 * Prints one line per check and "N passed, M failed". */
#include <ck.h>

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* what the scripts print */
typedef struct logbuf {
    char text[16384];
    size_t n;
} logbuf;

static void on_log(void *ud, const char *s, size_t len)
{
    logbuf *b = ud;
    if (b->n + len < sizeof b->text) {
        memcpy(b->text + b->n, s, len);
        b->n += len;
        b->text[b->n] = 0;
    }
}

/* an allocator that counts what is outstanding */
typedef struct counting {
    long long calls;
    long long live;
} counting;

static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    counting *c = ud;
    c->calls++;
    if (ptr) c->live -= (long long)osize;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p) c->live += (long long)nsize;
    else if (ptr) c->live += (long long)osize;
    return p;
}

static int has(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
}

/* a model: x [8, 2] -> silu(linear) -> linear -> mse against t [8, 1] */
static const char *MODEL =
    "local ck = require 'ck'\n"
    "function build(width, lr)\n"
    "  local g = ck.graph()\n"
    "  local x, t = g:input('x', {8, 2}), g:input('t', {8, 1})\n"
    "  local h = ck.silu(ck.linear(x, g:param('l1.weight', {width, 2}), g:param('l1.bias', {width})))\n"
    "  local loss = ck.mse_loss(ck.linear(h, g:param('l2.weight', {1, width})), t)\n"
    "  return g:compile{loss = loss, optimizer = 'adamw', lr = lr or 1e-2, seed = 1}\n"
    "end\n"
    "function not_a_model() return {} end\n";

static void fill_data(float *x, float *t)
{
    for (int i = 0; i < 8; i++) {
        x[2 * i] = (float)i / 8.0f;
        x[2 * i + 1] = 1.0f - (float)i / 8.0f;
        t[i] = 0.5f * x[2 * i] - 0.25f * x[2 * i + 1] + 0.1f;
    }
}

static void test_scripts(const char *dir)
{
    logbuf log = {{0}, 0};
    ck_options opt = CK_OPTIONS_INIT;
    opt.log = on_log;
    opt.log_ud = &log;
    ck_vm *vm = ck_open(&opt);
    check(vm && ck_status(vm) == CK_OK && !strcmp(ck_error(vm), ""), "ck_open with defaults gives a ready VM");
    check(!strcmp(ck_version(), CK_VERSION), "ck_version() is %s", CK_VERSION);

    int st = ck_run_string(vm, "print('hello', 42); io.write('w', 1, '\\n'); io.stdout:write('s\\n')", "hello");
    check(st == CK_OK && !strcmp(log.text, "hello\t42\nw1\ns\n"), "print, io.write and io.stdout go to the log callback");

    st = ck_run_string(vm, "local x = = 1", "syn");
    check(st == CK_ESYNTAX && has(ck_error(vm), "syn:1:"), "a syntax error: CK_ESYNTAX naming chunk and line (%s)",
          ck_error(vm));
    st = ck_run_string(vm, "local t = nil\nreturn t.x", "rt");
    check(st == CK_ERUN && has(ck_error(vm), "rt:2: attempt to index"), "a runtime error: CK_ERUN naming the line (%s)",
          ck_error(vm));
    check(!strchr(ck_error(vm), '\n'), "error messages are one line");
    st = ck_run_string(vm, "error({})", "obj");
    check(st == CK_ERUN && has(ck_error(vm), "obj:1: (error object is a table value)"),
          "a non-string error is named with its line (%s)", ck_error(vm));

    /* calls and globals */
    st = ck_run_string(vm,
                       "function add(a, b) return a + b, 'sum', a > b, nil, {} end\n"
                       "M = {twice = function(s) return s .. s end, depth = {n = 7}}\n"
                       "function fails() error('bad thing') end\n"
                       "name = 'ckrun'",
                       "defs");
    ck_value args[2] = {ck_number(2.5), ck_number(4)}, res[6];
    st = ck_call(vm, "add", 2, args, 6, res);
    check(st == CK_OK && res[0].type == CK_TNUMBER && res[0].number == 6.5 && res[1].type == CK_TSTRING &&
              !strcmp(res[1].string, "sum") && res[1].len == 3 && res[2].type == CK_TBOOLEAN && res[2].number == 0 &&
              res[3].type == CK_TNIL && res[4].type == CK_TOTHER && !strcmp(res[4].string, "table") &&
              res[5].type == CK_TNIL,
          "ck_call passes numbers and returns numbers, strings, booleans, nil and other types");
    ck_value s = ck_string("ab");
    st = ck_call(vm, "M.twice", 1, &s, 1, res);
    check(st == CK_OK && res[0].type == CK_TSTRING && !strcmp(res[0].string, "abab"), "ck_call follows dotted names");
    st = ck_call(vm, "nope", 0, NULL, 0, NULL);
    check(st == CK_EARG && has(ck_error(vm), "'nope' is not a function"), "calling a missing function: CK_EARG (%s)",
          ck_error(vm));
    st = ck_call(vm, "fails", 0, NULL, 1, res);
    check(st == CK_ERUN && has(ck_error(vm), "defs:3: bad thing") && res[0].type == CK_TNIL,
          "a function that raises: CK_ERUN with its line (%s)", ck_error(vm));
    double d = 0;
    const char *str = NULL;
    size_t len = 0;
    check(ck_get_number(vm, "M.depth.n", &d) == CK_OK && d == 7, "ck_get_number reads M.depth.n");
    check(ck_get_string(vm, "name", &str, &len) == CK_OK && !strcmp(str, "ckrun") && len == 5, "ck_get_string reads name");
    check(ck_get_number(vm, "name", &d) == CK_EARG && has(ck_error(vm), "'name' is string, not a number"),
          "a string is not a number: CK_EARG (%s)", ck_error(vm));
    check(ck_get_number(vm, "M.nothing.n", &d) == CK_EARG, "a missing global: CK_EARG");
    check(ck_set_number(vm, "M.depth.n", 9) == CK_OK && ck_set_string(vm, "greeting", "hi") == CK_OK &&
              ck_run_string(vm, "assert(M.depth.n == 9 and greeting == 'hi')", "set") == CK_OK,
          "ck_set_number and ck_set_string set globals the script sees");
    check(ck_set_number(vm, "no.such.table", 1) == CK_EARG, "setting into a missing table: CK_EARG (%s)", ck_error(vm));

    /* files: arguments, the script's own directory is readable */
    char path[512], data[512];
    snprintf(path, sizeof path, "%s/args.lua", dir);
    snprintf(data, sizeof data, "%s/data.txt", dir);
    write_file(data, "beside the script\n");
    write_file(path, "local f = assert(io.open(args.script:match('^(.*)/') .. '/data.txt'))\n"
                     "seen = f:read('l'); f:close()\n"
                     "result = args.steps * 2 + #args; word = args[1]; flag = args.flag and 1 or 0\n");
    const char *argv[] = {"--steps", "21", "pos", "--flag"};
    st = ck_run_file(vm, path, 4, argv);
    check(st == CK_OK && ck_get_number(vm, "result", &d) == CK_OK && d == 43 &&
              ck_get_string(vm, "word", &str, NULL) == CK_OK && !strcmp(str, "pos") &&
              ck_get_number(vm, "flag", &d) == CK_OK && d == 1,
          "ck_run_file passes arguments as args (%s)", ck_error(vm));
    check(ck_get_string(vm, "seen", &str, NULL) == CK_OK && !strcmp(str, "beside the script"),
          "a script reads files in its own directory");
    snprintf(path, sizeof path, "%s/none.lua", dir);
    st = ck_run_file(vm, path, 0, NULL);
    check(st == CK_EFILE && has(ck_error(vm), "cannot open script"), "a missing script: CK_EFILE (%s)", ck_error(vm));
    check(ck_run_file(vm, NULL, 0, NULL) == CK_EARG, "a NULL path: CK_EARG");
    ck_close(vm);
    ck_close(NULL);
}

static void test_models(void)
{
    ck_vm *vm = ck_open(NULL);
    ck_model *m = NULL;
    float x[16], t[8];
    fill_data(x, t);
    int st = ck_run_string(vm, MODEL, "model");
    ck_value width = ck_number(16);
    st = st ? st : ck_model_open(vm, "build", 1, &width, &m);
    check(st == CK_OK && m, "ck_model_open calls build(16) and takes the program (%s)", ck_error(vm));
    if (!m) return;
    ck_plan_info plan = CK_PLAN_INFO_INIT;
    st = ck_model_plan(m, &plan);
    check(st == CK_OK && plan.peak > 0 && plan.persistent > 0 && plan.peak >= plan.persistent && plan.ops > 0 &&
              plan.device == plan.arena,
          "ck_model_plan: peak %zu bytes, persistent %zu, %d ops, on the CPU device memory = the arena (%zu)", plan.peak,
          plan.persistent, plan.ops, plan.device);
    st = ck_model_set(m, "x", x, 16);
    st = st ? st : ck_model_set(m, "t", t, 8);
    check(st == CK_OK, "ck_model_set fills the inputs");
    double first = NAN, loss = NAN;
    for (int i = 0; i < 60 && st == CK_OK; i++) {
        st = ck_model_step(m, &loss);
        if (i == 0) first = loss;
    }
    check(st == CK_OK && loss < 0.5 * first, "60 steps of ck_model_step: loss %.5f -> %.5f", first, loss);
    ck_metrics met = CK_METRICS_INIT;
    st = ck_model_metrics(m, &met);
    check(st == CK_OK && met.steps == 60 && met.loss == loss && fabs(met.lr - 1e-2) < 1e-9 && met.mean_step_seconds > 0 &&
              met.last_step_seconds > 0,
          "ck_model_metrics: steps %lld, loss, lr %g, %.3f ms a step", (long long)met.steps, met.lr,
          1e3 * met.mean_step_seconds);
    double fl = NAN;
    st = ck_model_forward(m, &fl);
    check(st == CK_OK && fl < first, "ck_model_forward returns the loss (%.5f)", fl);
    float w[64];
    size_t n = 0;
    int64_t dims[CK_SHAPE_MAX];
    int nd = 0;
    st = ck_model_read(m, "l1.weight", w, 64, &n);
    check(st == CK_OK && n == 32 && isfinite(w[0]), "ck_model_read copies a parameter (%zu values)", n);
    st = ck_model_shape(m, "l1.weight", dims, &nd);
    check(st == CK_OK && nd == 2 && dims[0] == 16 && dims[1] == 2, "ck_model_shape: [16, 2]");
    n = 0;
    st = ck_model_read(m, "l1.weight", w, 8, &n);
    check(st == CK_EARG && n == 32 && has(ck_error(vm), "more than the buffer"),
          "a buffer too small: CK_EARG with the size needed (%s)", ck_error(vm));
    st = ck_model_read(m, "l1.weight", NULL, 0, &n);
    check(st == CK_OK && n == 32, "ck_model_read with no buffer gives the size");
    st = ck_model_set(m, "x", x, 3);
    check(st == CK_EARG && has(ck_error(vm), "has 16 elements, got 3 values"), "ck_model_set with a wrong count: CK_EARG (%s)",
          ck_error(vm));
    st = ck_model_set(m, "nothing", x, 3);
    check(st == CK_EARG && has(ck_error(vm), "no tensor named 'nothing'"), "an unknown tensor: CK_EARG (%s)", ck_error(vm));
    ck_model *bad = NULL;
    st = ck_model_open(vm, "not_a_model", 0, NULL, &bad);
    check(st == CK_EARG && !bad && has(ck_error(vm), "not a compiled program"),
          "a function that returns no program: CK_EARG (%s)", ck_error(vm));
    st = ck_model_open(vm, "missing", 1, &width, &bad);
    check(st == CK_EARG && !bad, "arguments for something that is not a function: CK_EARG (%s)", ck_error(vm));
    st = ck_run_string(vm, "prog = build(4, 0.5)", "prog");
    ck_model *g = NULL;
    st = st ? st : ck_model_open(vm, "prog", 0, NULL, &g);
    check(st == CK_OK && g && ck_model_metrics(g, &met) == CK_OK && met.lr == 0.5 && met.steps == 0,
          "ck_model_open takes a program held by a global");
    ck_model_close(g);
    st = ck_model_step(m, &loss);
    check(st == CK_OK, "a model still steps after another is closed");
    ck_close(vm); /* closes m */
}

/* ---- interrupts */

typedef struct later {
    ck_vm *vm;
    int ms;
} later;

static void *interrupt_later(void *arg)
{
    later *l = arg;
    usleep((useconds_t)l->ms * 1000);
    ck_interrupt(l->vm);
    return NULL;
}

static int run_interrupted(ck_vm *vm, const char *code, double *seconds)
{
    pthread_t th;
    later l = {vm, 150};
    pthread_create(&th, NULL, interrupt_later, &l);
    double t0 = now();
    int st = ck_run_string(vm, code, "loop");
    *seconds = now() - t0;
    pthread_join(th, NULL);
    return st;
}

static void test_interrupt(void)
{
    ck_vm *vm = ck_open(NULL);
    double s;
    int st = run_interrupted(vm, "while true do end", &s);
    check(st == CK_EINTR && s < 5 && has(ck_error(vm), "loop:1: interrupted"),
          "ck_interrupt from another thread stops an endless loop: CK_EINTR after %.2f s (%s)", s, ck_error(vm));
    st = run_interrupted(vm, "while true do pcall(function() while true do end end) end", &s);
    check(st == CK_EINTR && s < 5, "pcall in the script cannot catch the interrupt (%.2f s)", s);
    check(ck_run_string(vm, "x = 1", "after") == CK_OK, "the VM runs again after an interrupt");
    ck_interrupt(vm);
    st = ck_run_string(vm, "x = 2", "pending");
    check(st == CK_EINTR && ck_run_string(vm, "x = 3", "next") == CK_OK,
          "an interrupt while idle stops the next call only");

    /* a model between two ops */
    ck_model *m = NULL;
    float x[16], t[8];
    fill_data(x, t);
    ck_value width = ck_number(256);
    st = ck_run_string(vm, MODEL, "model");
    st = st ? st : ck_model_open(vm, "build", 1, &width, &m);
    st = st ? st : ck_model_set(m, "x", x, 16);
    st = st ? st : ck_model_set(m, "t", t, 8);
    pthread_t th;
    later l = {vm, 200};
    pthread_create(&th, NULL, interrupt_later, &l);
    double t0 = now();
    int steps = 0;
    while (st == CK_OK && now() - t0 < 20) {
        st = ck_model_step(m, NULL);
        if (st == CK_OK) steps++;
    }
    pthread_join(th, NULL);
    check(st == CK_EINTR && has(ck_error(vm), "interrupted"), "ck_interrupt stops ck_model_step after %d steps (%s)", steps,
          ck_error(vm));
    ck_metrics met = CK_METRICS_INIT;
    st = ck_model_step(m, NULL);
    if (st == CK_OK) st = ck_model_metrics(m, &met);
    /* the interrupted step counts as taken (the program's own counter) */
    check(st == CK_OK && met.steps >= steps + 1, "the model steps on afterwards (%lld steps)", (long long)met.steps);
    ck_close(vm);
}

/* ---- limits */

static void test_limits(void)
{
    ck_options opt = CK_OPTIONS_INIT;
    opt.heap_limit = 16u << 20;
    opt.callback_budget = 200000;
    ck_vm *vm = ck_open(&opt);
    int st = ck_run_string(vm, "local t = {}\nfor i = 1, 1e9 do t[i] = ('x'):rep(64) .. i end", "bomb");
    check(st == CK_EMEM && has(ck_error(vm), "out of memory") && has(ck_error(vm), "16 MiB") && has(ck_error(vm), "bomb:"),
          "a growing table past the heap limit: CK_EMEM (%s)", ck_error(vm));
    st = ck_run_string(vm, "local s = ('x'):rep(1 << 30)", "big");
    check(st == CK_EMEM && has(ck_error(vm), "out of memory"), "one allocation past the limit: CK_EMEM (%s)", ck_error(vm));
    check(ck_run_string(vm, "y = ('x'):rep(1000)", "after") == CK_OK, "the VM runs again after running out of memory");

    st = ck_run_string(vm, "local ck = require 'ck'\nck.call_limited(function()\n  while true do end\nend)", "cb");
    check(st == CK_ELIMIT && has(ck_error(vm), "cb:3: callback ran past its instruction budget of 200000"),
          "an endless callback: CK_ELIMIT naming its line (%s)", ck_error(vm));
    st = ck_run_string(vm,
                       "local ck = require 'ck'\n"
                       "local ok = pcall(ck.call_limited, function() while true do end end)\n"
                       "escaped = true",
                       "pcall");
    double d;
    check(st == CK_ELIMIT && ck_get_number(vm, "escaped", &d) == CK_EARG, "pcall around the callback cannot swallow it");
    st = ck_run_string(vm,
                       "local ck = require 'ck'\n"
                       "ck.call_limited(function()\n"
                       "  for i = 1, 100 do pcall(function() while true do end end) end\n"
                       "end)",
                       "inner");
    check(st == CK_ELIMIT && has(ck_error(vm), "inner:3:"), "nor pcall inside the callback (%s)", ck_error(vm));
    st = ck_run_string(vm,
                       "local ck = require 'ck'\n"
                       "sum = ck.call_limited(function(n) local s = 0 for i = 1, n do s = s + i end return s end, 1000)",
                       "within");
    check(st == CK_OK && ck_get_number(vm, "sum", &d) == CK_OK && d == 500500,
          "a callback within its budget returns its results");
    check(ck_run_string(vm, "local s = 0 for i = 1, 3e6 do s = s + i end", "top") == CK_OK,
          "the budget binds callbacks, not the script itself");
    ck_close(vm);
}

/* ---- the sandbox */

static void test_sandbox(const char *dir)
{
    ck_vm *vm = ck_open(NULL);
    int st = ck_run_string(vm, "io.open('/etc/hostname')", "rd");
    check(st == CK_EDENIED && has(ck_error(vm), "rd:1: reading '/etc/hostname' is denied") &&
              has(ck_error(vm), "--allow-read /etc"),
          "reading outside the allowed directories: CK_EDENIED naming path and flag (%s)", ck_error(vm));
    char code[1024];
    snprintf(code, sizeof code, "io.open('%s/out.txt', 'w')", dir);
    st = ck_run_string(vm, code, "wr");
    check(st == CK_EDENIED && has(ck_error(vm), "--allow-write"), "writing outside: CK_EDENIED (%s)", ck_error(vm));
    st = ck_run_string(vm, "os.execute('true')", "ex");
    check(st == CK_EDENIED && has(ck_error(vm), "os.execute is not available in the sandbox"), "os.execute: CK_EDENIED (%s)",
          ck_error(vm));
    st = ck_run_string(vm, "\x1bLua\x54\x00", "bin");
    check(st == CK_EDENIED && has(ck_error(vm), "binary chunks are refused"), "a binary chunk: CK_EDENIED (%s)", ck_error(vm));
    st = ck_run_string(vm, "load('\\27Lua')", "ld");
    check(st == CK_EDENIED, "load() of a binary chunk: CK_EDENIED (%s)", ck_error(vm));
    st = ck_run_string(vm, "a = math.random(1, 1000000); b = math.random(1, 1000000)", "rnd");
    double a1, b1, a2;
    ck_get_number(vm, "a", &a1);
    ck_get_number(vm, "b", &b1);
    ck_close(vm);

    ck_vm *vm2 = ck_open(NULL);
    ck_run_string(vm2, "a = math.random(1, 1000000)", "rnd");
    ck_get_number(vm2, "a", &a2);
    check(a1 == a2 && a1 != b1, "math.random is seeded: two VMs draw the same numbers (%g)", a1);
    ck_close(vm2);

    const char *dirs[] = {dir, NULL};
    ck_options opt = CK_OPTIONS_INIT;
    opt.allow_write = dirs;
    vm = ck_open(&opt);
    snprintf(code, sizeof code,
             "local f = assert(io.open('%s/out.txt', 'w')); f:write('x'); f:close()\n"
             "assert(io.open('%s/out.txt')):close()",
             dir, dir);
    st = ck_run_string(vm, code, "allowed");
    check(st == CK_OK, "allow_write lets a script write (and read) there (%s)", ck_error(vm));
    ck_close(vm);

    opt.allow_write = NULL;
    opt.trust = 1;
    vm = ck_open(&opt);
    st = ck_run_string(vm, "assert(os.getenv('PATH')) assert(io.open('/etc/hostname') or true)", "trust");
    check(st == CK_OK, "trust turns the sandbox off (%s)", ck_error(vm));
    ck_close(vm);
}

/* ---- options, allocators, independence */

typedef struct trainer {
    int st;
    double loss;
} trainer;

static void *train_thread(void *arg)
{
    trainer *tr = arg;
    ck_vm *vm = ck_open(NULL);
    ck_model *m = NULL;
    float x[16], t[8];
    fill_data(x, t);
    ck_value width = ck_number(32);
    int st = ck_run_string(vm, MODEL, "model");
    st = st ? st : ck_model_open(vm, "build", 1, &width, &m);
    st = st ? st : ck_model_set(m, "x", x, 16);
    st = st ? st : ck_model_set(m, "t", t, 8);
    for (int i = 0; i < 30 && st == CK_OK; i++) st = ck_model_step(m, &tr->loss);
    tr->st = st;
    ck_close(vm);
    return NULL;
}

static void test_vms(void)
{
    ck_options opt = CK_OPTIONS_INIT;
    opt.device = "tpu";
    ck_vm *vm = ck_open(&opt);
    check(vm && ck_status(vm) == CK_EARG && has(ck_error(vm), "unknown device 'tpu'"),
          "an unknown device: the VM reports CK_EARG (%s)", ck_error(vm));
    check(ck_run_string(vm, "x = 1", "dead") == CK_EARG, "and refuses to run");
    ck_close(vm);
    /* cuda where there is none (no device, or a build without CUDA): a clear refusal */
    opt.device = "cuda";
    vm = ck_open(&opt);
    if (!ck_device_available("cuda"))
        check(vm && ck_status(vm) == CK_EARG && (has(ck_error(vm), "no CUDA device") || has(ck_error(vm), "no CUDA backend")),
              "cuda without a device: CK_EARG (%s)", ck_error(vm));
    else
        check(vm && ck_status(vm) == CK_OK, "cuda with a device opens (%s)", ck_error(vm));
    ck_close(vm);
    opt.device = "cpu";
    opt.heap_limit = 2000;
    vm = ck_open(&opt);
    check(vm && ck_status(vm) == CK_EMEM, "a heap limit too small to start Lua: CK_EMEM (%s)", ck_error(vm));
    ck_close(vm);

    counting c = {0, 0};
    opt.heap_limit = 0;
    opt.alloc = counting_alloc;
    opt.alloc_ud = &c;
    vm = ck_open(&opt);
    ck_model *m = NULL;
    ck_value width = ck_number(8);
    int st = ck_run_string(vm, MODEL, "model");
    st = st ? st : ck_model_open(vm, "build", 1, &width, &m);
    st = st ? st : ck_model_step(m, NULL);
    long long live = c.live;
    ck_close(vm);
    check(st == CK_OK && c.calls > 100 && live > 0 && c.live == 0,
          "the host's allocator serves the VM, and ck_close gives every byte back (%lld calls)", c.calls);

    ck_vm *a = ck_open(NULL), *b = ck_open(NULL);
    ck_run_string(a, "shared = 1", "a");
    double d;
    check(ck_get_number(b, "shared", &d) == CK_EARG, "two VMs share no globals");
    ck_interrupt(a);
    check(ck_run_string(b, "x = 1", "b") == CK_OK && ck_run_string(a, "x = 1", "a") == CK_EINTR,
          "interrupting one VM leaves the other running");
    ck_close(a);
    ck_close(b);

    pthread_t th[2];
    trainer tr[2] = {{-1, 0}, {-1, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, train_thread, &tr[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    check(tr[0].st == CK_OK && tr[1].st == CK_OK && tr[0].loss == tr[1].loss,
          "two threads train a model each in their own VM, with equal results");
}

/* ---- versions, sizes, status words, the plan request */

static void test_api(void)
{
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", CK_VERSION_MAJOR, CK_VERSION_MINOR, CK_VERSION_PATCH);
    check(ck_version_num() == CK_VERSION_NUM && !strcmp(v, CK_VERSION) && !strcmp(ck_version(), CK_VERSION) &&
              CK_VERSION_NUM == CK_VERSION_MAJOR * 10000 + CK_VERSION_MINOR * 100 + CK_VERSION_PATCH,
          "ck_version_num() is CK_VERSION_NUM (%d), major * 10000 + minor * 100 + patch of %s", ck_version_num(), v);
    int words = 1;
    for (int c = CK_OK; c <= CK_EINVAL; c++)
        for (int d = CK_OK; d < c; d++) words = words && strcmp(ck_errstr(c), ck_errstr(d));
    check(words && !strncmp(ck_errstr(CK_EDENIED), "CK_EDENIED: ", 12) && !strcmp(ck_errstr(-1), "unknown status") &&
              !strcmp(ck_errstr(CK_EINVAL + 1), "unknown status"),
          "ck_errstr names each status in words (%s), and an unknown one as such", ck_errstr(CK_EDENIED));

    ck_options opt = CK_OPTIONS_INIT;
    opt.size = sizeof opt + 8; /* a newer header's */
    ck_vm *vm = ck_open(&opt);
    check(vm && ck_status(vm) == CK_EARG && has(ck_error(vm), "ck_options.size is") && has(ck_error(vm), "CK_OPTIONS_INIT") &&
              ck_run_string(vm, "x = 1", "x") == CK_EARG,
          "options of a size the library does not know: CK_EARG, and the VM refuses to run (%s)", ck_error(vm));
    ck_close(vm);
    ck_options zero = {0};
    zero.heap_limit = 64u << 20;
    vm = ck_open(&zero);
    check(vm && ck_status(vm) == CK_OK, "options with size 0 read as the first layout (%s)", ck_error(vm));
    ck_model *m = NULL;
    int st = ck_run_string(vm, MODEL, "model");
    ck_value width = ck_number(4);
    st = st ? st : ck_model_open(vm, "build", 1, &width, &m);
    ck_plan_info plan = {.size = 3};
    st = st ? st : ck_model_plan(m, &plan) == CK_EARG ? CK_OK : CK_ERUN;
    check(st == CK_OK && has(ck_error(vm), "ck_plan_info.size is 3") && plan.size == 3 && plan.peak == 0,
          "ck_model_plan refuses a ck_plan_info of an unknown size and leaves it alone (%s)", ck_error(vm));
    ck_metrics met = {.size = sizeof met * 2};
    check(m && ck_model_metrics(m, &met) == CK_EARG && has(ck_error(vm), "ck_metrics.size"),
          "ck_model_metrics refuses a ck_metrics of an unknown size (%s)", ck_error(vm));
    ck_plan_info plan0 = {0};
    check(m && ck_model_plan(m, &plan0) == CK_OK && plan0.peak > 0 && plan0.size == 0,
          "a ck_plan_info of size 0 is filled as the first layout");
    check(ck_run_string(vm, "local ck = require 'ck'; assert(ck.plan_mode == nil and ck.json == nil and "
                            "ck.plan_policies == nil and ck.plan_max_batch == nil)", "noplan") == CK_OK,
          "a VM opened without a plan request shows scripts no plan fields (%s)", ck_error(vm));
    ck_close(vm);

    ck_plan_request req = CK_PLAN_REQUEST_INIT;
    req.plan_only = 1;
    req.json = 1;
    char policies[] = "none,diffusers";
    req.policies = policies;
    req.max_batch = 1e9;
    ck_options popt = CK_OPTIONS_INIT;
    popt.device = "cpu";
    vm = ck_open_plan(&popt, &req);
    policies[0] = 'X'; /* copied at open */
    st = ck_status(vm);
    st = st ? st : ck_run_string(vm, "local ck = require 'ck'; assert(ck.plan_mode == true and ck.json == true and "
                                     "ck.plan_policies == 'none,diffusers' and ck.plan_svg == nil and "
                                     "ck.plan_max_batch == 1e9)", "plan");
    st = st ? st : ck_run_string(vm, MODEL, "model");
    m = NULL;
    st = st ? st : ck_model_open(vm, "build", 1, &width, &m);
    float x[16] = {0};
    check(st == CK_OK && m && ck_model_set(m, "x", x, 16) == CK_EARG && has(ck_error(vm), "plan-only"),
          "ck_open_plan: scripts see the request (ck.plan_mode, ck.json, ck.plan_policies, ck.plan_max_batch) and "
          "programs only plan (%s)", ck_error(vm));
    ck_close(vm);
    req.size = 1;
    vm = ck_open_plan(NULL, &req);
    check(vm && ck_status(vm) == CK_EARG && has(ck_error(vm), "ck_plan_request.size is 1"),
          "a plan request of an unknown size: CK_EARG (%s)", ck_error(vm));
    ck_close(vm);
}

int main(void)
{
    char dir[] = "/tmp/ck_host_XXXXXX";
    char cwd[64];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    /* work in dir/cwd, so that dir itself is outside the default directories */
    snprintf(cwd, sizeof cwd, "%s/cwd", dir);
    if (mkdir(cwd, 0700) || chdir(cwd)) {
        perror(cwd);
        return 2;
    }
    test_scripts(dir);
    test_models();
    test_interrupt();
    test_limits();
    test_sandbox(dir);
    test_vms();
    test_api();
    char cmd[600];
    if (chdir("/")) perror("chdir");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
