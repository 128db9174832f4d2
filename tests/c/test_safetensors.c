/* Specification of vm/safetensors: conversions against hand-computed values,
 * round trips, one rejection per kind of malformed file, a seeded fuzz loop
 * that must never crash, files that change after they were opened, the
 * source writer against the copying one, and saves that fail without
 * touching the old file. */
#define _POSIX_C_SOURCE 200809L
#include "formats/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "named_check.h"

static char dir[64];

static void path_of(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

static int write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(p, 1, n, fp);
    return (fclose(fp) == 0 && w == n) ? 0 : -1;
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *p = malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(p, 1, (size_t)sz, fp);
    fclose(fp);
    return p;
}

/* A file with the given header JSON (not padded) and data bytes. */
static int write_raw(const char *path, const char *header, const void *data, size_t dlen)
{
    size_t hlen = strlen(header);
    unsigned char *b = malloc(8 + hlen + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((unsigned long long)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    if (dlen) memcpy(b + 8 + hlen, data, dlen);
    int r = write_bytes(path, b, 8 + hlen + dlen);
    free(b);
    return r;
}

static uint32_t bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float from_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

static int temp_files_left(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static void f16_conversion_matches_hand_values(void)
{
    struct { float x; uint16_t h; } c[] = {
        {1.0f, 0x3C00}, {-2.5f, 0xC100}, {65504.0f, 0x7BFF}, {65519.0f, 0x7BFF},
        {65520.0f, 0x7C00},                  /* halfway to 65536: ties to even, which is inf */
        {1e-7f, 0x0002},                     /* subnormal: 1e-7 * 2^24 = 1.68 -> 2 */
        {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, /* exactly half the smallest subnormal: to even 0 */
        {0x1.8p-24f, 0x0002},                /* 1.5 subnormal steps: ties to even 2 */
        {0x1.ffcp-15f, 0x0400},              /* rounds up out of the subnormals */
        {1.0f + 0x1p-11f, 0x3C00},           /* tie between 0x3C00 and 0x3C01: even */
        {1.0f + 0x3p-11f, 0x3C02},           /* tie between 0x3C01 and 0x3C02: even */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01}, /* just above the tie */
        {INFINITY, 0x7C00}, {-INFINITY, 0xFC00}, {1e10f, 0x7C00}, {-0.0f, 0x8000},
    };
    int bad = -1;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && bad < 0; i++)
        if (ck_st_f32_to_f16(c[i].x) != c[i].h) bad = (int)i;
    uint16_t n1 = ck_st_f32_to_f16(NAN), n2 = ck_st_f32_to_f16(from_bits(0x7F800001u));
    int nan_ok = (n1 & 0x7C00) == 0x7C00 && (n1 & 0x3FF) && (n2 & 0x7C00) == 0x7C00 && (n2 & 0x3FF);
    check(bad < 0 && nan_ok, "f16_from_f32_rounds_to_nearest_even_and_keeps_nan",
          "case %d gives 0x%04x; nan gives 0x%04x 0x%04x", bad,
          bad >= 0 ? ck_st_f32_to_f16(c[bad].x) : 0, n1, n2);
}

static void f16_widening_is_exact(void)
{
    struct { uint16_t h; float x; } c[] = {
        {0x0001, 0x1p-24f}, {0x03FF, 1023 * 0x1p-24f}, {0x0400, 0x1p-14f}, {0x7BFF, 65504.0f},
        {0xC100, -2.5f}, {0x3C00, 1.0f}, {0x0002, 0x1p-23f}, {0x7C00, INFINITY}, {0xFC00, -INFINITY},
    };
    int bad = -1;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && bad < 0; i++)
        if (bits(ck_st_f16_to_f32(c[i].h)) != bits(c[i].x)) bad = (int)i;
    int ok = bad < 0 && isnan(ck_st_f16_to_f32(0x7E00)) && isnan(ck_st_f16_to_f32(0xFC01)) &&
             bits(ck_st_f16_to_f32(0x8000)) == 0x80000000u;
    check(ok, "f16_to_f32_is_exact_for_subnormals_inf_nan", "case %d", bad);
}

static void f16_every_value_round_trips(void)
{
    int bad = -1;
    for (uint32_t h = 0; h < 65536 && bad < 0; h++) {
        float x = ck_st_f16_to_f32((uint16_t)h);
        uint16_t back = ck_st_f32_to_f16(x);
        if (isnan(x) ? !((back & 0x7C00) == 0x7C00 && (back & 0x3FF)) : back != h) bad = (int)h;
    }
    check(bad < 0, "f16_all_65536_values_survive_f32_and_back", "0x%04x", bad);
}

static void bf16_conversion_matches_hand_values(void)
{
    struct { float x; uint16_t h; } c[] = {
        {1.0f, 0x3F80}, {-2.5f, 0xC020},
        {1.0f + 0x1p-8f, 0x3F80},            /* tie: even */
        {1.0f + 0x3p-8f, 0x3F82},            /* tie: even, upward */
        {1.0f + 0x1p-8f + 0x1p-20f, 0x3F81}, /* above the tie */
        {65504.0f, 0x4780},                  /* 0x477FE000 rounds up to 65536 */
        {1e-7f, 0x33D7},                     /* 0x33D6BF95: low half above 0x8000 */
        {INFINITY, 0x7F80}, {-INFINITY, 0xFF80},
        {3.4028235e38f, 0x7F80},             /* FLT_MAX is past the last tie: inf */
    };
    int bad = -1;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && bad < 0; i++)
        if (ck_st_f32_to_bf16(c[i].x) != c[i].h) bad = (int)i;
    /* A payload only in the low 16 bits must not truncate to inf, and the
     * all-ones NaN must not carry into the sign. */
    uint16_t n1 = ck_st_f32_to_bf16(from_bits(0x7F800001u)), n2 = ck_st_f32_to_bf16(from_bits(0xFFFFFFFFu));
    int nan_ok = isnan(ck_st_bf16_to_f32(n1)) && isnan(ck_st_bf16_to_f32(n2)) && (n2 & 0x8000);
    int wide_ok = ck_st_bf16_to_f32(0x3F80) == 1.0f && ck_st_bf16_to_f32(0xC020) == -2.5f &&
                  ck_st_bf16_to_f32(0x0001) == 0x1p-133f;
    check(bad < 0 && nan_ok && wide_ok, "bf16_rounds_to_nearest_even_keeps_nan_and_widens_by_shifting",
          "case %d nan 0x%04x 0x%04x", bad, n1, n2);
}

static const char escaped_name[] = "a\"b\\c\n\t\x01/ \xC3\xA9 \xF0\x9F\x98\x80";

/* Writes the file the round-trip checks and the fuzz loop start from. */
static int write_sample(const char *path, char *err, size_t errlen)
{
    ck_st_writer *w = ck_st_writer_new();
    float f32[6] = {1.0f, -2.5f, 65504.0f, 1e-7f, INFINITY, NAN};
    float f16[7] = {1.0f, -2.5f, 65504.0f, 1e-7f, INFINITY, NAN, 1.0f + 0x1p-11f};
    float bf[3] = {1.0f, -2.5f, 1.0f + 0x3p-8f};
    float one = 7.0f, scalar = 3.5f;
    int64_t s23[2] = {2, 3}, s7[1] = {7}, s31[2] = {3, 1}, s1[1] = {1}, s04[2] = {0, 4};
    int r = 0;
    r |= ck_st_writer_meta(w, "ss_network_dim", "16");
    r |= ck_st_writer_meta(w, "modelspec.architecture", "stable-diffusion-xl-v1-base/lora");
    r |= ck_st_writer_meta(w, "quote\"key", "line1\nline2 \xE2\x9C\x93");
    r |= ck_st_writer_add(w, "w.f32", CK_ST_F32, 2, s23, f32);
    r |= ck_st_writer_add(w, "w.f16", CK_ST_F16, 1, s7, f16);
    r |= ck_st_writer_add(w, "w.bf16", CK_ST_BF16, 2, s31, bf);
    r |= ck_st_writer_add(w, escaped_name, CK_ST_F32, 1, s1, &one);
    r |= ck_st_writer_add(w, "scalar", CK_ST_F32, 0, NULL, &scalar);
    r |= ck_st_writer_add(w, "empty", CK_ST_F16, 2, s04, NULL);
    if (!r) r = ck_st_writer_save(w, path, err, errlen);
    ck_st_writer_free(w);
    return r;
}

static int read_all(const ck_st_tensor *t, float *dst)
{
    char err[256];
    return ck_st_read_f32(t, dst, t->numel, err, sizeof err);
}

/* fp8 checkpoints (torch.float8_e4m3fn and float8_e5m2, as ComfyUI and kohya
 * save them) read as fp32: hand-computed values of each format */
static void fp8_reads(void)
{
    char path[128], err[256];
    path_of(path, sizeof path, "fp8.safetensors");
    /* e4m3: 1.0, -1.0, 448, 2^-9 (smallest subnormal), 0.875 * 2^-6 (largest subnormal), NaN;
     * e5m2: 1.0, -2.0, 57344 (largest), 2^-16 (smallest subnormal), inf, NaN */
    const unsigned char data[12] = {0x38, 0xb8, 0x7e, 0x01, 0x07, 0x7f, 0x3c, 0xc0, 0x7b, 0x01, 0x7c, 0x7e};
    int ok = write_raw(path, "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[6],\"data_offsets\":[0,6]},"
                             "\"b\":{\"dtype\":\"F8_E5M2\",\"shape\":[2,3],\"data_offsets\":[6,12]}}",
                       data, sizeof data) == 0;
    ck_st_file *f = ok ? ck_st_open(path, err, sizeof err) : NULL;
    const ck_st_tensor *a = f ? ck_st_find(f, "a") : NULL, *b = f ? ck_st_find(f, "b") : NULL;
    float va[6], vb[6];
    ok = a && b && a->dtype == CK_ST_F8_E4M3 && b->dtype == CK_ST_F8_E5M2 && a->nbytes == 6 &&
         read_all(a, va) == 0 && read_all(b, vb) == 0;
    check(ok && va[0] == 1.0f && va[1] == -1.0f && va[2] == 448.0f && va[3] == 0x1p-9f && va[4] == 0x1.cp-7f &&
              isnan(va[5]),
          "f8_e4m3_reads_as_fp32", "%s", f ? "" : err);
    check(ok && vb[0] == 1.0f && vb[1] == -2.0f && vb[2] == 57344.0f && vb[3] == 0x1p-16f && isinf(vb[4]) &&
              isnan(vb[5]),
          "f8_e5m2_reads_as_fp32", "%s", f ? "" : err);
    ck_st_close(f);

    /* bytes (8-bit optimizer codes) written from fp32 data as U8, read back exactly; a non-byte refused */
    path_of(path, sizeof path, "u8.safetensors");
    const float codes[5] = {0, 1, 127, 200, 255};
    ck_st_writer *w = ck_st_writer_new();
    int64_t shape[1] = {5};
    ok = ck_st_writer_add(w, "q", CK_ST_U8, 1, shape, codes) == 0 && ck_st_writer_save(w, path, err, sizeof err) == 0;
    ck_st_writer_free(w);
    f = ok ? ck_st_open(path, err, sizeof err) : NULL;
    a = f ? ck_st_find(f, "q") : NULL;
    float back[5];
    ok = a && a->dtype == CK_ST_U8 && a->nbytes == 5 && read_all(a, back) == 0 && memcmp(back, codes, sizeof back) == 0;
    check(ok, "u8_round_trip_is_exact", "%s", f ? "" : err);
    ck_st_close(f);
    const float bad[2] = {3, 2.5f};
    w = ck_st_writer_new();
    int64_t two[1] = {2};
    const int rc = ck_st_writer_add(w, "q", CK_ST_U8, 1, two, bad);
    path_of(path, sizeof path, "u8_bad.safetensors");
    const int saved = ck_st_writer_save(w, path, err, sizeof err);
    check(rc != 0 && saved != 0 && strstr(err, "not a byte"), "u8_refuses_a_value_that_is_not_a_byte", "%s", err);
    ck_st_writer_free(w);
}

static void round_trips(void)
{
    char path[128], err[256];
    path_of(path, sizeof path, "sample.safetensors");
    int wr = write_sample(path, err, sizeof err);
    check(wr == 0, "writer_saves_f32_f16_bf16_scalar_and_empty_tensors", "%s", err);
    ck_st_file *f = ck_st_open(path, err, sizeof err);
    check(f != NULL, "reader_opens_what_the_writer_wrote", "%s", err);
    if (!f) return;
    check(ck_st_count(f) == 6, "round_trip_keeps_every_tensor", "count %d", ck_st_count(f));

    float v[8];
    const ck_st_tensor *t = ck_st_find(f, "w.f32");
    uint32_t want32[6] = {bits(1.0f), bits(-2.5f), bits(65504.0f), bits(1e-7f), bits(INFINITY), 0};
    int ok = t && t->dtype == CK_ST_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 &&
             t->nbytes == 24 && read_all(t, v) == 0;
    for (int i = 0; ok && i < 5; i++) ok = bits(v[i]) == want32[i];
    check(ok && isnan(v[5]), "round_trip_f32_is_bitwise_exact", "");

    t = ck_st_find(f, "w.f16");
    float want16[7] = {1.0f, -2.5f, 65504.0f, 0x1p-23f, INFINITY, 0, 1.0f};
    ok = t && t->dtype == CK_ST_F16 && t->nbytes == 14 && read_all(t, v) == 0;
    for (int i = 0; ok && i < 7; i++) ok = i == 5 ? isnan(v[i]) : bits(v[i]) == bits(want16[i]);
    check(ok, "round_trip_f16_gives_hand_computed_values", "");

    t = ck_st_find(f, "w.bf16");
    ok = t && t->dtype == CK_ST_BF16 && t->shape[0] == 3 && t->shape[1] == 1 && read_all(t, v) == 0 &&
         v[0] == 1.0f && v[1] == -2.5f && v[2] == 1.0f + 0x1p-6f;
    check(ok, "round_trip_bf16_gives_hand_computed_values", "");

    t = ck_st_find(f, escaped_name);
    check(t && t->numel == 1 && read_all(t, v) == 0 && v[0] == 7.0f, "round_trip_names_needing_escapes", "");

    t = ck_st_find(f, "scalar");
    check(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 4 && read_all(t, v) == 0 && v[0] == 3.5f,
          "round_trip_scalar_has_no_dims_and_one_element", "");

    t = ck_st_find(f, "empty");
    check(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 4 && t->numel == 0 && t->nbytes == 0 &&
          read_all(t, v) == 0, "round_trip_empty_tensor", "");

    const char *k, *val;
    ok = ck_st_meta_count(f) == 3 && ck_st_meta(f, "ss_network_dim") &&
         !strcmp(ck_st_meta(f, "ss_network_dim"), "16") && ck_st_meta(f, "quote\"key") &&
         !strcmp(ck_st_meta(f, "quote\"key"), "line1\nline2 \xE2\x9C\x93") && !ck_st_meta(f, "absent") &&
         ck_st_meta_at(f, 0, &k, &val) == 0 && !strcmp(k, "modelspec.architecture") &&
         !strcmp(val, "stable-diffusion-xl-v1-base/lora") && ck_st_meta_at(f, 3, &k, &val) != 0;
    check(ok, "round_trip_metadata_with_escapes_sorted_by_key", "");

    check(!ck_st_find(f, "w") && !ck_st_find(f, "w.f32x") && !ck_st_get(f, 6) && !ck_st_get(f, -1),
          "lookups_of_absent_tensors_return_null", "");

    ok = 1;
    for (int i = 1; i < ck_st_count(f); i++) {
        const ck_st_tensor *a = ck_st_get(f, i - 1), *b = ck_st_get(f, i);
        if (strcmp(a->name, b->name) >= 0 || a->offset + a->nbytes != b->offset) ok = 0;
    }
    size_t n;
    unsigned char *raw = read_bytes(path, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
    ok = ok && hlen % 8 == 0 && !memcmp(raw + 8, "{\"__metadata__\":{", 17);
    free(raw);
    check(ok, "writer_sorts_names_lays_data_out_in_that_order_and_pads_header_to_8", "hlen %llu",
          (unsigned long long)hlen);
    ck_st_close(f);

    path_of(path, sizeof path, "spaces.safetensors");
    float two[2] = {1.0f, 2.0f};
    write_raw(path, "{ \"\\ud83d\\ude00\" :\n {\"shape\": [2], \"data_offsets\" : [0, 8],\t\"dtype\":\"F32\"} }   ",
              two, 8);
    f = ck_st_open(path, err, sizeof err);
    t = f ? ck_st_find(f, "\xF0\x9F\x98\x80") : NULL;
    check(t && t->numel == 2 && read_all(t, v) == 0 && v[1] == 2.0f,
          "reader_accepts_whitespace_any_field_order_and_surrogate_pairs", "%s", err);
    ck_st_close(f);

    path_of(path, sizeof path, "i32.safetensors");
    write_raw(path, "{\"ids\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", two, 8);
    f = ck_st_open(path, err, sizeof err);
    t = f ? ck_st_find(f, "ids") : NULL;
    int rc = t ? ck_st_read_f32(t, v, 2, err, sizeof err) : 0;
    check(t && rc == -1 && strstr(err, "I32") && strstr(err, "ids") && strstr(err, path),
          "read_f32_refuses_integer_dtypes_naming_the_dtype", "%s", err);
    ck_st_close(f);

    path_of(path, sizeof path, "sample.safetensors");
    f = ck_st_open(path, err, sizeof err);
    t = f ? ck_st_find(f, "w.f16") : NULL;
    rc = t ? ck_st_read_f32(t, v, 6, err, sizeof err) : 0;
    check(t && rc == -1 && strstr(err, "7 elements"), "read_f32_refuses_a_wrong_element_count", "%s", err);
    ck_st_close(f);
}

/* One malformed file: it must be refused with a message naming the file and
 * containing the word that says what is wrong. */
static void rejects(const char *name, const char *word, const void *bytes, size_t n)
{
    char path[128], err[256] = "";
    path_of(path, sizeof path, "bad.safetensors");
    write_bytes(path, bytes, n);
    ck_st_file *f = ck_st_open(path, err, sizeof err);
    check(!f && strstr(err, word) && strstr(err, path), name, f ? "opened" : "message: %s", err);
    ck_st_close(f);
}

static void rejects_header(const char *name, const char *word, const char *header, size_t dlen)
{
    char path[128];
    static const unsigned char zeros[64];
    path_of(path, sizeof path, "bad.safetensors");
    write_raw(path, header, zeros, dlen);
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    rejects(name, word, b, n);
    free(b);
}

#define ENTRY(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void malformed_files(void)
{
    char path[128], err[256];
    path_of(path, sizeof path, "sample.safetensors");
    size_t n;
    unsigned char *good = read_bytes(path, &n);
    unsigned char *b = malloc(n + 16);

    rejects("truncated_data_is_rejected", "truncated", good, n - 3);
    rejects("file_shorter_than_length_prefix_is_rejected", "truncated", good, 5);
    memcpy(b, good, n);
    memset(b + n, 0, 4);
    rejects("trailing_bytes_after_data_are_rejected", "trailing", b, n + 4);

    unsigned char big[24] = {0};
    uint64_t len = 100000001;
    for (int i = 0; i < 8; i++) big[i] = (unsigned char)(len >> (8 * i));
    memcpy(big + 8, "{}", 2);
    rejects("header_length_over_100000000_is_rejected", "too large", big, sizeof big);
    len = 1000;
    for (int i = 0; i < 8; i++) big[i] = (unsigned char)(len >> (8 * i));
    rejects("header_length_beyond_file_is_rejected", "beyond", big, sizeof big);

    rejects_header("overlapping_offsets_are_rejected", "overlap",
                   "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 4, 12) "}", 12);
    rejects_header("gap_between_tensors_is_rejected", "gap",
                   "{" ENTRY("a", "F32", "[1]", 0, 4) "," ENTRY("b", "F32", "[1]", 8, 12) "}", 12);
    rejects_header("offsets_not_starting_at_0_are_rejected", "begin at 0",
                   "{" ENTRY("a", "F32", "[1]", 4, 8) "}", 8);
    rejects_header("offsets_not_matching_shape_are_rejected", "do not match shape [2,2] F32 (16 bytes)",
                   "{" ENTRY("x.weight", "F32", "[2,2]", 0, 12) "}", 12);
    rejects_header("end_before_begin_is_rejected", "end before",
                   "{" ENTRY("a", "U8", "[0]", 4, 0) "}", 4);
    rejects_header("header_not_json_is_rejected", "invalid JSON", "{\"a\" 1}", 0);
    rejects_header("header_json_not_an_object_is_rejected", "not a JSON object", "[1, 2]", 0);
    rejects_header("entry_not_an_object_is_rejected", "must be a JSON object", "{\"a\": 5}", 0);
    rejects_header("unknown_dtype_is_rejected", "unknown dtype 'Q4'", "{" ENTRY("a", "Q4", "[1]", 0, 1) "}", 1);
    rejects_header("duplicate_tensor_name_is_rejected", "duplicate",
                   "{" ENTRY("a", "F32", "[1]", 0, 4) "," ENTRY("a", "F32", "[1]", 4, 8) "}", 8);
    rejects_header("duplicate_field_in_entry_is_rejected", "duplicate",
                   "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    rejects_header("duplicate_metadata_key_is_rejected", "duplicate",
                   "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0);
    rejects_header("unknown_field_in_entry_is_rejected", "unknown field 'foo'",
                   "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"foo\":1}}", 1);
    rejects_header("missing_field_is_rejected", "missing 'shape'", "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1);
    rejects_header("negative_dim_is_rejected", "negative", "{" ENTRY("a", "U8", "[-1]", 0, 1) "}", 1);
    rejects_header("fractional_offset_is_rejected", "integer", "{" ENTRY("a", "U8", "[1]", 0, 1.0) "}", 1);
    rejects_header("nine_dims_are_rejected", "more than 8",
                   "{" ENTRY("a", "U8", "[1,1,1,1,1,1,1,1,1]", 0, 1) "}", 1);
    rejects_header("shape_product_overflow_is_rejected", "too many elements",
                   "{" ENTRY("a", "F64", "[4294967296,4294967296]", 0, 8) "}", 8);
    rejects_header("metadata_value_not_a_string_is_rejected", "must be a string",
                   "{\"__metadata__\":{\"k\":1}}", 0);
    rejects_header("invalid_utf8_is_rejected", "UTF-8", "{\"\xC0\xAF\":{}}", 0);
    rejects_header("lone_surrogate_is_rejected", "surrogate", "{\"\\udc00\":{}}", 0);
    rejects_header("garbage_after_json_object_is_rejected", "after the JSON object", "{}  x", 0);
    rejects_header("trailing_comma_is_rejected", "invalid JSON", "{" ENTRY("a", "U8", "[1]", 0, 1) ",}", 1);
    rejects_header("empty_header_is_rejected", "not a JSON object", "", 0);

    char missing[160];
    path_of(missing, sizeof missing, "no-such-file.safetensors");
    ck_st_file *f = ck_st_open(missing, err, sizeof err);
    check(!f && strstr(err, missing) && strstr(err, "cannot open"), "missing_file_is_reported", "%s", err);
    ck_st_close(f);
    free(b);
    free(good);
}

static uint64_t rng = 0x5AFE7E45012345ULL;

static uint64_t next(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Corrupts a copy of a valid file many times; each result must either be
 * refused or open with every invariant holding and every tensor readable. */
static void fuzz(void)
{
    char path[128], fpath[128], err[256];
    path_of(path, sizeof path, "sample.safetensors");
    path_of(fpath, sizeof fpath, "fuzz.safetensors");
    size_t n0;
    unsigned char *base = read_bytes(path, &n0);
    size_t hlen0 = 0;
    for (int i = 7; i >= 0; i--) hlen0 = hlen0 << 8 | base[i];
    size_t cap = n0 + 64;
    unsigned char *b = malloc(cap);
    int opened = 0, refused = 0, broken = 0, iters = 3000;
    char why[400] = "";

    for (int it = 0; it < iters; it++) {
        size_t n = n0;
        memcpy(b, base, n0);
        int nm = 1 + (int)(next() % 3);
        for (int m = 0; m < nm && n > 0; m++) {
            size_t pos = (size_t)(next() % n);
            switch (next() % 6) {
            case 0: b[pos] ^= (unsigned char)(1u << (next() % 8)); break;
            case 1: b[pos] = (unsigned char)next(); break;
            case 2: n = (size_t)(next() % n); break;
            case 3: {
                size_t k = 1 + (size_t)(next() % 8);
                if (n + k > cap) break;
                memmove(b + pos + k, b + pos, n - pos);
                for (size_t i = 0; i < k; i++) b[pos + i] = (unsigned char)next();
                n += k;
                break;
            }
            case 4: case 5: {
                /* Digits in the header are shapes and offsets: nudge one. */
                size_t end = 8 + hlen0 < n ? 8 + hlen0 : n, tries = 0, at = 0;
                while (tries++ < 64) {
                    at = 8 + (size_t)(next() % (end > 8 ? end - 8 : 1));
                    if (at < n && b[at] >= '0' && b[at] <= '9') break;
                }
                if (at >= n || b[at] < '0' || b[at] > '9') break;
                static const char repl[] = "0123456789-.e";
                b[at] = (unsigned char)repl[next() % (sizeof repl - 1)];
                break;
            }
            }
        }
        write_bytes(fpath, b, n);
        ck_st_file *f = ck_st_open(fpath, err, sizeof err);
        if (!f) {
            refused++;
            if (!err[0] || !strstr(err, fpath)) { broken++; snprintf(why, sizeof why, "bare message '%s'", err); }
            continue;
        }
        opened++;
        uint64_t hl = 0, total = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
        for (int i = 0; i < ck_st_count(f); i++) {
            const ck_st_tensor *t = ck_st_get(f, i);
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            /* Read every byte so a sanitizer build catches a tensor that
             * points outside the file. */
            unsigned char *raw = malloc(t->nbytes ? (size_t)t->nbytes : 1);
            if (ck_st_read_bytes(t, 0, raw, t->nbytes, err, sizeof err)) {
                broken++;
                snprintf(why, sizeof why, "iteration %d: %s", it, err);
            }
            free(raw);
            if (numel != t->numel || t->nbytes != numel * (int64_t)ck_st_dtype_size(t->dtype) ||
                ck_st_find(f, t->name) != t) {
                broken++;
                snprintf(why, sizeof why, "iteration %d: tensor invariant", it);
            }
            if (t->dtype == CK_ST_F32 || t->dtype == CK_ST_F16 || t->dtype == CK_ST_BF16 || t->dtype == CK_ST_F8_E4M3 ||
                t->dtype == CK_ST_F8_E5M2 || t->dtype == CK_ST_U8) {
                float *dst = malloc(t->numel ? (size_t)t->numel * sizeof *dst : 1);
                if (ck_st_read_f32(t, dst, t->numel, err, sizeof err)) {
                    broken++;
                    snprintf(why, sizeof why, "iteration %d: %s", it, err);
                }
                free(dst);
            }
            total += (uint64_t)t->nbytes;
        }
        for (int i = 0; i < ck_st_meta_count(f); i++) {
            const char *k, *v;
            ck_st_meta_at(f, i, &k, &v);
            if (ck_st_meta(f, k) != v) { broken++; snprintf(why, sizeof why, "iteration %d: meta", it); }
        }
        if (total + 8 + hl != n) { broken++; snprintf(why, sizeof why, "iteration %d: sizes don't add up", it); }
        ck_st_close(f);
    }
    check(broken == 0 && opened > 0 && refused > 0, "fuzzed_files_are_refused_or_fully_consistent",
          "%d opened, %d refused, %d broken: %s", opened, refused, broken, why);
    printf("     (%d corruptions: %d opened, %d refused)\n", iters, opened, refused);
    free(b);
    free(base);
}

static int same_bytes(const char *path, const unsigned char *want, size_t n)
{
    size_t m;
    unsigned char *got = read_bytes(path, &m);
    int ok = got && m == n && !memcmp(got, want, n);
    free(got);
    return ok;
}

static void failed_saves(void)
{
    char path[128], tmp[160], err[256];
    path_of(path, sizeof path, "keep.safetensors");
    write_sample(path, err, sizeof err);
    size_t n;
    unsigned char *old = read_bytes(path, &n);
    float x[2] = {1, 2};
    int64_t s2[1] = {2};

    ck_st_writer *w = ck_st_writer_new();
    ck_st_writer_add(w, "a", CK_ST_F32, 1, s2, x);
    ck_st_writer_add(w, "a", CK_ST_F16, 1, s2, x);
    int rc = ck_st_writer_save(w, path, err, sizeof err);
    check(rc == -1 && strstr(err, "duplicate") && strstr(err, path) && same_bytes(path, old, n) &&
          temp_files_left() == 0, "save_with_duplicate_names_fails_and_keeps_old_file", "%s", err);
    ck_st_writer_free(w);

    /* A directory squatting on the temp name makes the save fail even as root. */
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    mkdir(tmp, 0755);
    w = ck_st_writer_new();
    ck_st_writer_add(w, "b", CK_ST_F32, 1, s2, x);
    rc = ck_st_writer_save(w, path, err, sizeof err);
    struct stat st;
    check(rc == -1 && strstr(err, path) && same_bytes(path, old, n) && stat(tmp, &st) == 0 && S_ISDIR(st.st_mode),
          "save_that_cannot_create_its_temp_file_keeps_old_file", "%s", err);
    rmdir(tmp);

    /* rename() fails onto a non-empty directory: the temp file must go. */
    char target[128], inner[192];
    path_of(target, sizeof target, "is_a_dir.safetensors");
    mkdir(target, 0755);
    snprintf(inner, sizeof inner, "%s/x", target);
    write_bytes(inner, "x", 1);
    rc = ck_st_writer_save(w, target, err, sizeof err);
    check(rc == -1 && strstr(err, "rename") && temp_files_left() == 0 && same_bytes(inner, (const unsigned char *)"x", 1),
          "save_whose_rename_fails_removes_its_temp_file", "%s", err);
    remove(inner);
    rmdir(target);

    if (geteuid() != 0) {
        char sub[128], subfile[160];
        path_of(sub, sizeof sub, "readonly");
        mkdir(sub, 0755);
        snprintf(subfile, sizeof subfile, "%s/keep.safetensors", sub);
        write_bytes(subfile, old, n);
        chmod(sub, 0555);
        rc = ck_st_writer_save(w, subfile, err, sizeof err);
        chmod(sub, 0755);
        check(rc == -1 && same_bytes(subfile, old, n), "save_into_unwritable_directory_keeps_old_file", "%s", err);
        remove(subfile);
        rmdir(sub);
    } else {
        printf("skip save_into_unwritable_directory_keeps_old_file (root ignores permissions)\n");
    }
    ck_st_writer_free(w);

    w = ck_st_writer_new();
    ck_st_writer_add(w, "ok", CK_ST_F32, 1, s2, x);
    int bad = ck_st_writer_add(w, "ids", CK_ST_I32, 1, s2, x);
    rc = ck_st_writer_save(w, path, err, sizeof err);
    check(bad == -1 && rc == -1 && strstr(err, "I32") && strstr(err, "'ids'") && same_bytes(path, old, n),
          "bad_add_makes_save_fail_and_keeps_old_file", "%s", err);
    ck_st_writer_free(w);

    w = ck_st_writer_new();
    ck_st_writer_add(w, "new", CK_ST_F32, 1, s2, x);
    rc = ck_st_writer_save(w, path, err, sizeof err);
    ck_st_file *f = ck_st_open(path, err, sizeof err);
    check(rc == 0 && f && ck_st_count(f) == 1 && ck_st_find(f, "new") && temp_files_left() == 0,
          "successful_save_replaces_old_file_and_leaves_no_temp", "%s", err);
    ck_st_close(f);
    ck_st_writer_free(w);
    free(old);
}

/* Tensors are read from the file when asked for: one cut short after it was
 * opened fails those reads with a message naming it, never reads garbage; one
 * replaced (as a save replaces it) still reads as it was when opened. */
static void files_changed_after_open(void)
{
    char path[128], spath[128], err[256];
    path_of(spath, sizeof spath, "sample.safetensors");
    path_of(path, sizeof path, "shrinks.safetensors");
    size_t n;
    unsigned char *good = read_bytes(spath, &n);
    write_bytes(path, good, n);
    ck_st_file *f = ck_st_open(path, err, sizeof err);
    const ck_st_tensor *a = f ? ck_st_find(f, "w.bf16") : NULL, *z = f ? ck_st_find(f, "w.f32") : NULL;
    /* w.bf16 comes first in the data, w.f32 last: cut inside w.f32 */
    int fd = open(path, O_WRONLY);
    int cut = a && z && fd >= 0 && ftruncate(fd, (off_t)(z->offset + 8)) == 0;
    if (fd >= 0) close(fd);
    float v[8];
    unsigned char raw[24];
    int first = a ? read_all(a, v) : -1;
    int rc = z ? ck_st_read_f32(z, v, z->numel, err, sizeof err) : 0;
    check(cut && first == 0 && v[0] == 1.0f && rc == -1 && strstr(err, path) && strstr(err, "'w.f32'") &&
              strstr(err, "truncated"),
          "a_file_truncated_after_open_fails_the_reads_it_cut_naming_the_file", "%s", err);
    rc = z ? ck_st_read_bytes(z, 0, raw, z->nbytes, err, sizeof err) : 0;
    int head = z ? ck_st_read_bytes(z, 0, raw, 8, err, sizeof err) : -1;
    check(rc == -1 && head == 0, "raw_reads_fail_past_the_cut_and_succeed_before_it", "%s", err);
    ck_st_close(f);

    /* a save renames a new file over the old one: an open file keeps its bytes */
    write_bytes(path, good, n);
    f = ck_st_open(path, err, sizeof err);
    ck_st_writer *w = ck_st_writer_new();
    float other[6] = {9, 9, 9, 9, 9, 9};
    int64_t s23[2] = {2, 3};
    ck_st_writer_add(w, "w.f32", CK_ST_F32, 2, s23, other);
    rc = ck_st_writer_save(w, path, err, sizeof err);
    ck_st_writer_free(w);
    z = f ? ck_st_find(f, "w.f32") : NULL;
    check(rc == 0 && z && read_all(z, v) == 0 && v[0] == 1.0f && v[1] == -2.5f,
          "a_file_replaced_by_a_save_reads_as_it_was_when_opened", "%s", err);
    ck_st_close(f);

    f = ck_st_open(spath, err, sizeof err);
    z = f ? ck_st_find(f, "w.f32") : NULL;
    check(z && ck_st_read_bytes(z, 20, raw, 8, err, sizeof err) == -1 && strstr(err, "outside") &&
              ck_st_read_bytes(z, 20, raw, 4, err, sizeof err) == 0 && !memcmp(raw, good + z->offset + 20, 4),
          "raw_reads_stay_inside_their_tensor", "%s", err);
    ck_st_close(f);
    free(good);
}

/* Sources for the writer: values by formula, and a log of the calls. */
#define NBIG ((int64_t)CK_ST_IO_BUFFER + 12345) /* over the buffer in every dtype */
static float *src_vals[4];
static int64_t src_n[4];
static int calls[8], ncalls, fail_at = -1;

static const float *from_table(void *ud, int index, char *err, size_t errlen)
{
    (void)ud;
    if (ncalls < 8) calls[ncalls] = index;
    ncalls++;
    if (index == fail_at) {
        snprintf(err, errlen, "the disk went away");
        return NULL;
    }
    return src_vals[index];
}

static int save_both_ways(const char *copied, const char *sourced, ck_st_dtype d, char *err, size_t errlen)
{
    static const char *names[4] = {"big", "a.special", "scalar", "empty"};
    int64_t shapes[4][2] = {{NBIG / 3, 3}, {2, 4}, {0, 0}, {0, 5}}, nd[4] = {2, 2, 0, 2};
    ck_st_writer *wc = ck_st_writer_new(), *ws = ck_st_writer_new();
    int r = 0;
    ncalls = 0;
    for (int i = 0; i < 4; i++) {
        r |= ck_st_writer_add(wc, names[i], d, (int)nd[i], shapes[i], src_vals[i]);
        r |= ck_st_writer_add_source(ws, names[i], d, (int)nd[i], shapes[i], from_table, NULL, i);
    }
    r |= ck_st_writer_meta(wc, "k", "v") | ck_st_writer_meta(ws, "k", "v");
    if (!r) r = ck_st_writer_save(wc, copied, err, errlen);
    if (!r) r = ck_st_writer_save(ws, sourced, err, errlen);
    ck_st_writer_free(wc);
    ck_st_writer_free(ws);
    return r;
}

/* The source writer converts chunk by chunk what the copying writer converts
 * at once: the files must be the same bytes, in every dtype, and read back
 * (chunk by chunk too) as the conversions say. */
static void source_writer_matches_copying_writer(void)
{
    char a[128], b[128], err[256];
    path_of(a, sizeof a, "copied.safetensors");
    path_of(b, sizeof b, "sourced.safetensors");
    static const float special[8] = {1.0f, -2.5f, 65504.0f, 1e-7f, INFINITY, NAN, -0.0f, 1.0f + 0x1p-11f};
    static const float bytes[8] = {0, 1, 2, 127, 128, 200, 254, 255};
    src_n[0] = NBIG / 3 * 3;
    src_n[1] = 8;
    src_n[2] = 1;
    src_n[3] = 0;
    src_vals[0] = malloc(sizeof(float) * (size_t)src_n[0]);
    src_vals[1] = malloc(sizeof special);
    src_vals[2] = malloc(sizeof(float));
    src_vals[3] = NULL;
    const ck_st_dtype dts[4] = {CK_ST_F32, CK_ST_F16, CK_ST_BF16, CK_ST_U8};
    for (int k = 0; k < 4; k++) {
        const ck_st_dtype d = dts[k];
        for (int64_t i = 0; i < src_n[0]; i++)
            src_vals[0][i] = d == CK_ST_U8 ? (float)(i % 256) : (float)(i % 100003) * 0.37f - 1.0e4f;
        memcpy(src_vals[1], d == CK_ST_U8 ? bytes : special, sizeof special);
        src_vals[2][0] = d == CK_ST_U8 ? 7.0f : 3.25f;
        int rc = save_both_ways(a, b, d, err, sizeof err);
        size_t na = 0, nb = 0;
        unsigned char *x = read_bytes(a, &na), *y = read_bytes(b, &nb);
        char name[96];
        snprintf(name, sizeof name, "source_writer_%s_is_bitwise_the_copying_writer", ck_st_dtype_name(d));
        check(rc == 0 && x && y && na == nb && !memcmp(x, y, na), name, "%s", rc ? err : "files differ");
        free(x);
        free(y);
        /* the sources are asked once each, in the file's (name) order, empty tensors not at all */
        snprintf(name, sizeof name, "source_writer_%s_asks_each_source_once_in_file_order", ck_st_dtype_name(d));
        check(ncalls == 3 && calls[0] == 1 && calls[1] == 0 && calls[2] == 2, name, "%d calls", ncalls);

        ck_st_file *f = ck_st_open(b, err, sizeof err);
        const ck_st_tensor *t = f ? ck_st_find(f, "big") : NULL;
        float *back = malloc(sizeof(float) * (size_t)src_n[0]);
        int ok = t && t->numel == src_n[0] && ck_st_read_f32(t, back, t->numel, err, sizeof err) == 0;
        for (int64_t i = 0; ok && i < src_n[0]; i++) {
            float want = src_vals[0][i];
            if (d == CK_ST_F16) want = ck_st_f16_to_f32(ck_st_f32_to_f16(want));
            if (d == CK_ST_BF16) want = ck_st_bf16_to_f32(ck_st_f32_to_bf16(want));
            ok = bits(back[i]) == bits(want);
        }
        snprintf(name, sizeof name, "a_%s_tensor_larger_than_the_buffer_reads_back_exactly", ck_st_dtype_name(d));
        check(ok, name, "%s", err);
        free(back);
        ck_st_close(f);
    }
    remove(a);
    remove(b);
    for (int i = 0; i < 3; i++) free(src_vals[i]);
}

/* A source that fails halfway through a save (tensors already written before
 * it) or gives values U8 cannot hold: the old file stays, byte for byte, and
 * no temp file is left. */
static void failed_streamed_saves(void)
{
    char path[128], err[256];
    path_of(path, sizeof path, "keep.safetensors");
    write_sample(path, err, sizeof err);
    size_t n;
    unsigned char *old = read_bytes(path, &n);
    float vals[4][1000];
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 1000; k++) vals[i][k] = (float)(i * 1000 + k);
        src_vals[i] = vals[i];
    }
    int64_t shape[1] = {1000};
    ck_st_writer *w = ck_st_writer_new();
    char name[16];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "t%d", i);
        ck_st_writer_add_source(w, name, CK_ST_F32, 1, shape, from_table, NULL, i);
    }
    fail_at = 2;
    ncalls = 0;
    int rc = ck_st_writer_save(w, path, err, sizeof err);
    fail_at = -1;
    check(rc == -1 && ncalls == 3 && strstr(err, path) && strstr(err, "'t2'") && strstr(err, "the disk went away") &&
              same_bytes(path, old, n) && temp_files_left() == 0,
          "a_source_failing_halfway_through_a_save_keeps_the_old_file_and_no_temp", "%s", err);
    ck_st_writer_free(w);

    w = ck_st_writer_new();
    for (int k = 0; k < 1000; k++) vals[1][k] = (float)(k % 256);
    vals[1][999] = 256.0f;
    ck_st_writer_add_source(w, "q", CK_ST_U8, 1, shape, from_table, NULL, 1);
    rc = ck_st_writer_save(w, path, err, sizeof err);
    check(rc == -1 && strstr(err, "'q'") && strstr(err, "element 999") && strstr(err, "not a byte") &&
              same_bytes(path, old, n) && temp_files_left() == 0,
          "a_source_giving_a_non_byte_for_u8_fails_the_save_and_keeps_the_old_file", "%s", err);
    ck_st_writer_free(w);
    free(old);
}

static void remove_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        remove(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ck_st_test.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    f16_conversion_matches_hand_values();
    f16_widening_is_exact();
    f16_every_value_round_trips();
    bf16_conversion_matches_hand_values();
    round_trips();
    fp8_reads();
    malformed_files();
    fuzz();
    failed_saves();
    files_changed_after_open();
    source_writer_matches_copying_writer();
    failed_streamed_saves();
    remove_dir();
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
