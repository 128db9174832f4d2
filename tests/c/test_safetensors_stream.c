/* safetensors files stream both ways: a 256 MiB file (64 tensors of 1M
 * floats) is saved from a source and read back tensor by tensor into one
 * 4 MiB buffer, every value checked, and neither the save nor the open and
 * reads may grow the process's peak memory (VmHWM) by LIMIT_MIB. A reader or
 * writer holding the file's data in memory would grow it by 256 MiB. The same
 * again with the data stored as F16 (128 MiB). */
#define _POSIX_C_SOURCE 200809L
#include "formats/safetensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "named_check.h"

#define NT 64
#define NUMEL (1 << 20)
#define LIMIT_MIB 48

static float *buf; /* the one tensor-sized buffer: source of saves, destination of reads */

/* Cheap values that differ per tensor and per element. */
static float value(int t, int64_t i)
{
    return (float)(((int64_t)t * 1000003 + i * 7919) % 100003) * 0.001f - 50.0f;
}

/* What a value reads back as once stored in dtype d. */
static float stored(ck_st_dtype d, float x)
{
    return d == CK_ST_F16 ? ck_st_f16_to_f32(ck_st_f32_to_f16(x)) : x;
}

static const float *fill(void *ud, int t, char *err, size_t errlen)
{
    (void)ud;
    (void)err;
    (void)errlen;
    for (int64_t i = 0; i < NUMEL; i++) buf[i] = value(t, i);
    return buf;
}

static long hwm_kib(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    if (fp) fclose(fp);
    return kib;
}

/* Resets VmHWM to the current RSS where Linux allows it; otherwise the phases
 * are measured by how much they raise the peak, which works as long as the
 * measured phases come first (they do) and each stays small. */
static void reset_hwm(void)
{
    FILE *fp = fopen("/proc/self/clear_refs", "w");
    if (!fp) return;
    fputs("5", fp);
    fclose(fp);
}

static void name_of(char *b, size_t len, int t)
{
    snprintf(b, len, "down_blocks.%02d.weight", t);
}

static void save(const char *path, ck_st_dtype d, const char *test)
{
    char err[512], name[64];
    int64_t shape[2] = {1024, NUMEL / 1024};
    ck_st_writer *w = ck_st_writer_new();
    for (int t = 0; t < NT; t++) {
        name_of(name, sizeof name, t);
        ck_st_writer_add_source(w, name, d, 2, shape, fill, NULL, t);
    }
    reset_hwm();
    long before = hwm_kib();
    int rc = ck_st_writer_save(w, path, err, sizeof err);
    long grew = hwm_kib() - before;
    ck_st_writer_free(w);
    struct stat st;
    long long want = (long long)NT * NUMEL * (long long)ck_st_dtype_size(d);
    check(rc == 0 && stat(path, &st) == 0 && st.st_size > want && st.st_size < want + 65536, test, "%s", err);
    printf("     (saving %lld MiB grew the peak by %ld KiB)\n", want >> 20, grew);
    char bound[96];
    snprintf(bound, sizeof bound, "saving_%s_streams_the_data_through_a_bounded_buffer", ck_st_dtype_name(d));
    check(before > 0 && grew < LIMIT_MIB * 1024L, bound, "the peak grew by %ld KiB (limit %d MiB)", grew, LIMIT_MIB);
}

static void load(const char *path, ck_st_dtype d, const char *test)
{
    char err[512], name[64];
    reset_hwm();
    long before = hwm_kib();
    ck_st_file *f = ck_st_open(path, err, sizeof err);
    int bad = f ? -1 : 0, wrong = -1;
    int64_t at = -1;
    for (int t = 0; f && t < NT && bad < 0 && wrong < 0; t++) {
        name_of(name, sizeof name, t);
        const ck_st_tensor *s = ck_st_find(f, name);
        if (!s || s->dtype != d || ck_st_read_f32(s, buf, NUMEL, err, sizeof err)) {
            bad = t;
            break;
        }
        for (int64_t i = 0; i < NUMEL && wrong < 0; i++)
            if (buf[i] != stored(d, value(t, i))) {
                wrong = t;
                at = i;
            }
    }
    int count = ck_st_count(f);
    ck_st_close(f);
    long grew = hwm_kib() - before;
    check(f && count == NT && bad < 0 && wrong < 0, test, "tensor %d unreadable (%s), tensor %d wrong at %lld", bad,
          err, wrong, (long long)at);
    printf("     (opening and reading it grew the peak by %ld KiB)\n", grew);
    char bound[96];
    snprintf(bound, sizeof bound, "loading_%s_streams_the_data_through_a_bounded_buffer", ck_st_dtype_name(d));
    check(before > 0 && grew < LIMIT_MIB * 1024L, bound, "the peak grew by %ld KiB (limit %d MiB)", grew, LIMIT_MIB);
}

int main(void)
{
    char dir[64] = "/tmp/ck_st_stream.XXXXXX", path[128];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/big.safetensors", dir);
    buf = malloc(sizeof(float) * NUMEL);
    if (!buf) return 1;
    /* its pages count before the first measure (not zeros: malloc and a
     * memset of 0 may become a calloc that touches nothing) */
    for (int64_t i = 0; i < NUMEL; i++) buf[i] = 1.0f;

    save(path, CK_ST_F32, "a_256_mib_f32_file_saves_from_a_source");
    load(path, CK_ST_F32, "the_256_mib_f32_file_reads_back_exactly_tensor_by_tensor");
    save(path, CK_ST_F16, "a_128_mib_f16_file_saves_from_a_source");
    load(path, CK_ST_F16, "the_128_mib_f16_file_reads_back_as_fp16_rounds_tensor_by_tensor");

    remove(path);
    rmdir(dir);
    free(buf);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
