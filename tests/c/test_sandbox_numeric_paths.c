/* With no_default_dirs, a number given where a path goes is judged as the
 * string Lua turns it into: io.open(12345, "w"), io.lines(780), os.remove(777),
 * os.rename(778, 779), ck.safetensors, ck.listdir, ck.mkdir and require all
 * name files of the working directory, which is not allowed, so each is
 * denied and nothing there changes; the same calls under the one allowed
 * directory, and numbers spelled as paths inside it, work. */
#include "ck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int npass, nfail;

static void check(int ok, const char *what, const char *detail)
{
    printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail ? ": " : "", detail ? detail : "");
    if (ok) npass++;
    else nfail++;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int holds(const char *path, const char *text)
{
    char buf[64] = {0};
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return !strcmp(buf, text);
}

/* runs code (which sets ok and msg) in a fresh VM allowed only under allowed/ */
static void run(const char *what, const char *code, const char *allowed)
{
    const char *dirs[] = {allowed, NULL};
    ck_options o = CK_OPTIONS_INIT;
    o.no_default_dirs = 1;
    o.allow_read = dirs;
    o.allow_write = dirs;
    ck_vm *vm = ck_open(&o);
    int st = vm ? ck_status(vm) : CK_EMEM;
    if (st == CK_OK) st = ck_run_string(vm, code, "numeric");
    double ok = 0;
    if (st == CK_OK) ck_get_number(vm, "ok", &ok);
    check(st == CK_OK && ok == 1, what, st == CK_OK ? NULL : ck_error(vm));
    ck_close(vm);
}

/* the call, caught: ok = 1 when it raised the sandbox's denial */
#define DENIED(call) "local r, e = pcall(function() return " call " end)\n" \
                     "ok = (not r and tostring(e):find('is denied', 1, true)) and 1 or 0\n" \
                     "if ok == 0 then print(r, e) end"

int main(void)
{
    char dir[] = "/tmp/ck_numeric_XXXXXX";
    if (!mkdtemp(dir) || chdir(dir)) return 1;
    char allowed[sizeof dir + 16];
    snprintf(allowed, sizeof allowed, "%s/allowed", dir);
    mkdir("allowed", 0777);
    put("777", "keep");
    put("778", "keep");
    put("780", "keep\n");
    put("781", "keep");
    mkdir("782", 0777);
    put("123.lua", "return 'outside'");
    put("allowed/12", "inside\n");

    run("io.open(12345, 'w') is denied", DENIED("io.open(12345, 'w')"), allowed);
    run("io.open(12345, 'a') is denied", DENIED("io.open(12345, 'a')"), allowed);
    run("io.open(780) is denied", DENIED("io.open(780)"), allowed);
    run("io.open(1e3, 'w') (\"1000.0\") is denied", DENIED("io.open(1e3, 'w')"), allowed);
    run("io.open(-5, 'w') is denied", DENIED("io.open(-5, 'w')"), allowed);
    run("io.lines(780) is denied", DENIED("io.lines(780)"), allowed);
    run("os.remove(777) is denied", DENIED("os.remove(777)"), allowed);
    run("os.rename(778, 779) is denied", DENIED("os.rename(778, 779)"), allowed);
    run("os.rename('allowed/12', 779) is denied", DENIED("os.rename('allowed/12', 779)"), allowed);
    run("os.rename(778, 'allowed/x') is denied", DENIED("os.rename(778, 'allowed/x')"), allowed);
    run("ck.safetensors(781) is denied", DENIED("require('ck').safetensors(781)"), allowed);
    run("ck.write_safetensors(783, ...) is denied", DENIED("require('ck').write_safetensors(783, {{'x', {1}, {1}}})"),
        allowed);
    run("ck.listdir(782) is denied", DENIED("require('ck').listdir(782)"), allowed);
    run("ck.mkdir(784) is denied", DENIED("require('ck').mkdir(784)"), allowed);
    run("require(123) finds nothing outside",
        "package.path = './?.lua'; local r, e = pcall(require, 123)\n"
        "ok = (not r and tostring(e):find('outside the directories', 1, true)) and 1 or 0",
        allowed);

    check(!exists("12345") && !exists("1000.0") && !exists("-5") && !exists("779") && !exists("783") &&
              !exists("784") && !exists("allowed/x"),
          "no file was created outside", NULL);
    check(holds("777", "keep") && holds("778", "keep") && holds("780", "keep\n") && holds("allowed/12", "inside\n"),
          "every file is where it was, as it was", NULL);

    /* inside the allowed directory, the same calls work */
    char code[1024];
    snprintf(code, sizeof code,
             "local d = '%s/'\n"
             "local f = assert(io.open(d .. 12)); local s = f:read('l'); f:close()\n"
             "local n = 0; for l in io.lines(d .. 12) do n = n + 1 end\n"
             "assert(io.open(d .. 99, 'w')):close()\n"
             "assert(os.rename(d .. 99, d .. 98)); assert(os.remove(d .. 98))\n"
             "ok = (s == 'inside' and n == 1) and 1 or 0",
             allowed);
    run("the same calls under the allowed directory work", code, allowed);
    check(!exists("allowed/98") && !exists("allowed/99"), "and the files they made and removed are gone", NULL);

    char cmd[sizeof dir + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (chdir("/") || system(cmd)) return 1;
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
