/* libFuzzer harness for script loading: each input is Lua source (or not)
 * run by ck_run_string in a fresh sandboxed VM with a 16 MiB heap, a callback
 * budget of 100k instructions and a watchdog that interrupts the run after
 * CK_FUZZ_SCRIPT_MS (default 250) milliseconds, so endless loops end. Every
 * outcome must be a status with a message, the VM must stay usable, and
 * closing it must free everything (LeakSanitizer). */
#include "fuzz_util.h"

#include <ck.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define H "fuzz_script"

static const char *const dirs[2] = {fuzz_dir, NULL};
static long limit_ms = 250;

/* the watchdog: interrupts the armed VM once its deadline passes */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static ck_vm *armed;
static unsigned long generation;
static struct timespec deadline;
static int fired;

static void *watchdog(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!armed) pthread_cond_wait(&cv, &mu);
        unsigned long g = generation;
        int rc = 0;
        while (armed && generation == g && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&cv, &mu, &deadline);
        if (armed && generation == g) {
            ck_interrupt(armed);
            fired = 1;
            armed = NULL;
        }
    }
    return NULL;
}

static void arm(ck_vm *vm)
{
    pthread_mutex_lock(&mu);
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_nsec += (limit_ms % 1000) * 1000000L;
    deadline.tv_sec += limit_ms / 1000 + deadline.tv_nsec / 1000000000L;
    deadline.tv_nsec %= 1000000000L;
    armed = vm;
    generation++;
    fired = 0;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

/* returns whether the watchdog interrupted the run */
static int disarm(void)
{
    pthread_mutex_lock(&mu);
    armed = NULL;
    generation++;
    int f = fired;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    return f;
}

static void drop_log(void *ud, const char *text, size_t len)
{
    (void)ud;
    (void)text;
    (void)len;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *ms = getenv("CK_FUZZ_SCRIPT_MS");
    if (ms && atol(ms) > 0) limit_ms = atol(ms);
    fuzz_scratch("script");
    pthread_t t;
    if (pthread_create(&t, NULL, watchdog, NULL) != 0) abort();
    pthread_detach(t);
    return 0;
}

static int valid_status(int st) { return st >= CK_OK && st <= CK_EDENIED; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *code = malloc(size + 1);
    if (!code) return 0;
    memcpy(code, data, size);
    code[size] = 0;

    ck_options o = {0};
    o.log = drop_log;
    o.heap_limit = 16u << 20;
    o.callback_budget = 100000;
    o.no_default_dirs = 1;
    o.allow_read = dirs;
    o.allow_write = dirs;
    o.seed = 1;
    fuzz_enter();
    ck_vm *vm = ck_open(&o);
    fuzz_check(vm && ck_status(vm) == CK_OK, H, "ck_open succeeds");

    arm(vm);
    int st = ck_run_string(vm, code, "fuzz");
    fuzz_check(valid_status(st) && st == ck_status(vm), H, "ck_run_string returns a status");
    fuzz_check(st == CK_OK ? ck_error(vm)[0] == 0 : ck_error(vm)[0] != 0, H, "a failure has a message, a success none");
    if (getenv("CK_FUZZ_VERBOSE")) fprintf(stderr, "status %d: %s\n", st, ck_error(vm));
    if (code[0] == '\x1b') fuzz_check(st == CK_EDENIED, H, "a binary chunk is refused");

    /* the VM stays usable: globals, calls, and another chunk */
    ck_value arg = ck_number(3), res[2];
    int st2 = ck_call(vm, "f", 1, &arg, 2, res);
    fuzz_check(valid_status(st2), H, "ck_call returns a status");
    double x;
    const char *s;
    size_t len;
    fuzz_check(valid_status(ck_get_number(vm, "x", &x)), H, "ck_get_number returns a status");
    fuzz_check(valid_status(ck_get_string(vm, "s", &s, &len)), H, "ck_get_string returns a status");
    int st3 = ck_run_string(vm, "ck_fuzz_after = 1 + 1", "after");
    int interrupted = disarm();
    fuzz_check(st3 == CK_OK || st3 == CK_EMEM || (interrupted && st3 == CK_EINTR), H,
               "the VM runs another chunk after any error");

    ck_close(vm);
    free(code);
    fuzz_leave(1);
    return 0;
}
