/* Specification of the safetensors header's limits (vm/formats/safetensors):
 * a header of many empty tensors is polled per megabyte read and per 4096
 * entries parsed, with the work reported; a stop asked at any poll fails the
 * open with "stopped", everything charged given back; the tables that the
 * parse grows (larger than the header itself) are charged before they are
 * made, so a budget between the header's needs and the tables' refuses at
 * the table that would pass, and never holds more than the budget.
 *
 * With --write DIR it only writes big.safetensors (600000 empty tensors, a
 * 37 MB header) for tests/sh/test_decoder_interrupt.sh. */
#define _POSIX_C_SOURCE 200809L
#include "formats/safetensors.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "named_check.h"

/* a file of n empty F32 tensors named t000000000, t000000001, ...; its size */
static size_t write_empty_tensors(const char *path, long n)
{
    const size_t cap = (size_t)n * 64 + 16;
    char *h = malloc(cap);
    size_t len = 0;
    h[len++] = '{';
    for (long i = 0; i < n; i++)
        len += (size_t)snprintf(h + len, cap - len, "%s\"t%09ld\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                                i ? "," : "", i);
    h[len++] = '}';
    FILE *fp = fopen(path, "wb");
    unsigned char l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    const int ok = fp && fwrite(l8, 1, 8, fp) == 8 && fwrite(h, 1, len, fp) == len;
    if (fp) fclose(fp);
    free(h);
    return ok ? len + 8 : 0;
}

typedef struct watch {
    size_t limit, used, peak;
    long long polls, work, stop_at;
} watch;

static int take_fn(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    watch *w = ud;
    if (w->used + n > w->limit) {
        snprintf(err, errlen, "%s would pass the limit", what);
        return -1;
    }
    w->used += n;
    if (w->used > w->peak) w->peak = w->used;
    return 0;
}

static void give_fn(void *ud, size_t n) { ((watch *)ud)->used -= n; }

static int poll_fn(void *ud, long long work)
{
    watch *w = ud;
    w->polls++;
    w->work += work;
    return w->stop_at && w->polls >= w->stop_at;
}

static ck_st_file *open_watched(const char *path, watch *w, char *err, size_t errlen)
{
    const ck_st_charge c = {take_fn, give_fn, w, poll_fn, w};
    return ck_st_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, &c, err, errlen);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write")) {
        char path[512];
        snprintf(path, sizeof path, "%s/big.safetensors", argv[2]);
        return write_empty_tensors(path, 600000) ? 0 : 1;
    }
    char dir[64] = "/tmp/ck_test_st_header.XXXXXX", path[128], err[512];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/many.safetensors", dir);
    /* 200000 empty tensors: a header of 12.4 MB */
    const long n = 200000;
    const size_t size = write_empty_tensors(path, n);
    watch w = {SIZE_MAX, 0, 0, 0, 0, 0};
    ck_st_file *f = open_watched(path, &w, err, sizeof err);
    const size_t held = w.used;
    const int count = f ? ck_st_count(f) : -1;
    ck_st_close(f);
    check(f && count == n && w.polls >= (long long)(size >> 20) + n / 4096 && w.work >= (long long)(size / 16) &&
              w.used == 0,
          "a 12 MB header of 200000 tensors opens, polled per megabyte and per 4096 entries, its bytes reported",
          "%s; %d tensors, %lld polls, %lld units", f ? "" : err, count, w.polls, w.work);
    const size_t tables = held;
    check(f && tables >= (size_t)n * (sizeof(ck_st_tensor) + sizeof(void *)),
          "the open file holds its tables charged (the tensors' and the names')", "%zu bytes held", tables);

    /* a stop at the first poll, at one in the read, one in the parse, the last */
    const long long total = w.polls;
    const long long at[] = {1, 5, 20, total};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        watch s = {SIZE_MAX, 0, 0, 0, 0, at[i]};
        f = open_watched(path, &s, err, sizeof err);
        char what[200];
        snprintf(what, sizeof what, "a stop asked at poll %lld of %lld fails the open there, naming the file, all "
                 "given back", at[i], total);
        check(!f && s.polls == at[i] && strstr(err, path) == err &&
                  strstr(err, "stopped while reading its header (the caller asked)") && s.used == 0,
              what, "%s, %lld polls: %s", f ? "opened" : "refused", s.polls, err);
        ck_st_close(f);
    }

    /* a budget that holds the header twice but not the tables as well */
    watch b = {(size_t)(2 * size + (size_t)n * 40), 0, 0, 0, 0, 0};
    f = open_watched(path, &b, err, sizeof err);
    check(!f && strstr(err, path) == err && strstr(err, "the table of its tensors grown to") &&
              strstr(err, "would pass the limit") && b.peak <= b.limit && b.used == 0,
          "a budget too small for the tables refuses at the growth that would pass it, never holding more",
          "%s: %s; peak %zu of %zu", f ? "opened" : "refused", err, b.peak, b.limit);
    ck_st_close(f);
    unlink(path);
    rmdir(dir);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
