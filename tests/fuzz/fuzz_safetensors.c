/* libFuzzer harness for the safetensors reader: every input is opened from
 * memory and, the same bytes, from a file; both ways must agree on success, on
 * the message and on every tensor's bytes. A file that opens has every tensor
 * read in full both ways (as fp32 where it can be) and every lookup checked,
 * so a parser that accepted a bad offset would read out of bounds under
 * AddressSanitizer (from memory) or fail a read (from the file). */
#include "formats/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp_path[64];

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("TMPDIR");
    snprintf(tmp_path, sizeof tmp_path, "%s/ckfuzz_st_%ld.safetensors",
             dir && strlen(dir) < 24 ? dir : "/tmp", (long)getpid());
    return 0;
}

static void read_all(const ck_st_file *f)
{
    int n = ck_st_count(f);
    int64_t prev_end = -1;
    for (int i = 0; i < n; i++) {
        const ck_st_tensor *t = ck_st_get(f, i);
        check(t != NULL, "ck_st_get in range");
        check(ck_st_find(f, t->name) == t, "ck_st_find returns the tensor of that name");
        check(t->nbytes == t->numel * (int64_t)ck_st_dtype_size(t->dtype), "nbytes = numel * dtype size");
        check(t->src == f, "a tensor reads from its file");
        check(prev_end < 0 || t->offset == prev_end, "tensors tile the data in order");
        prev_end = t->offset + t->nbytes;
        char err[256];
        /* every byte, whatever the dtype, and nothing past the tensor */
        unsigned char *raw = malloc(t->nbytes ? (size_t)t->nbytes : 1);
        if (!raw) continue;
        check(ck_st_read_bytes(t, 0, raw, t->nbytes, err, sizeof err) == 0, "ck_st_read_bytes reads a whole tensor");
        check(ck_st_read_bytes(t, 1, raw, t->nbytes, err, sizeof err) != 0 && err[0],
              "ck_st_read_bytes refuses bytes past the tensor");
        free(raw);
        float *x = malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1));
        if (!x) continue;
        int rc = ck_st_read_f32(t, x, t->numel, err, sizeof err);
        int floaty = t->dtype == CK_ST_F32 || t->dtype == CK_ST_F16 || t->dtype == CK_ST_BF16 ||
                     t->dtype == CK_ST_F8_E4M3 || t->dtype == CK_ST_F8_E5M2 || t->dtype == CK_ST_U8;
        check(floaty ? rc == 0 : rc != 0 && err[0], "ck_st_read_f32 reads exactly the float dtypes");
        if (t->numel > 0) check(ck_st_read_f32(t, x, t->numel - 1, err, sizeof err) != 0, "a short destination is refused");
        free(x);
    }
    check(ck_st_get(f, n) == NULL && ck_st_get(f, -1) == NULL, "ck_st_get out of range is NULL");
    const char *k, *v, *prev = NULL;
    for (int i = 0; ck_st_meta_at(f, i, &k, &v) == 0; i++) {
        check(ck_st_meta(f, k) == v, "ck_st_meta finds every key");
        check(!prev || strcmp(prev, k) < 0, "__metadata__ sorted and unique");
        prev = k;
    }
}

/* The file read from disk holds the same bytes as the one read from memory. */
static void same_data(const ck_st_file *fm, const ck_st_file *ff)
{
    for (int i = 0; i < ck_st_count(fm); i++) {
        const ck_st_tensor *a = ck_st_get(fm, i), *b = ck_st_get(ff, i);
        check(b && !strcmp(a->name, b->name) && a->offset == b->offset && a->nbytes == b->nbytes,
              "the same tensors either way");
        unsigned char *x = malloc(a->nbytes ? (size_t)a->nbytes : 1), *y = malloc(a->nbytes ? (size_t)a->nbytes : 1);
        char err[256];
        if (x && y) {
            check(ck_st_read_bytes(a, 0, x, a->nbytes, err, sizeof err) == 0 &&
                  ck_st_read_bytes(b, 0, y, b->nbytes, err, sizeof err) == 0 && !memcmp(x, y, (size_t)a->nbytes),
                  "the same bytes either way");
        }
        free(x);
        free(y);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err_mem[512], err_file[512];
    ck_st_file *fm = ck_st_open_memory(data, size, tmp_path, err_mem, sizeof err_mem);
    check(fm || err_mem[0], "a refused file has a message");
    check(!strchr(err_mem, '\n'), "a message is one line");
    if (fm) read_all(fm);

    FILE *fp = fopen(tmp_path, "wb");
    if (fp) {
        size_t put = fwrite(data, 1, size, fp);
        if (fclose(fp) == 0 && put == size) {
            ck_st_file *ff = ck_st_open(tmp_path, err_file, sizeof err_file);
            check(!fm == !ff, "ck_st_open and ck_st_open_memory agree on success");
            if (!fm) check(strcmp(err_mem, err_file) == 0, "ck_st_open and ck_st_open_memory give the same message");
            if (ff) {
                check(ck_st_count(ff) == ck_st_count(fm), "the same tensors either way");
                read_all(ff);
                same_data(fm, ff);
            }
            ck_st_close(ff);
        }
        unlink(tmp_path);
    }
    ck_st_close(fm);
    return 0;
}
