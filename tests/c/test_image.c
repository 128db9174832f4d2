/* Specification of vm/formats/image: every reference image of
 * tests/data/image decodes to Pillow's pixels through the step protocol; the
 * pixel limit refuses from the header in each format; every prefix of a
 * file is refused, naming it, and seeded random corruptions never crash;
 * resampling against hand-computed values; PNG writing round-trips, puts its
 * text in valid tEXt/iTXt chunks before the image data, and a failed write
 * leaves the old file and no temp file (stale ones of dead processes go). */
#define _GNU_SOURCE
#include "formats/image.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "named_check.h"

static char data[1024], dir[64];

static unsigned char *read_file(const char *path, size_t *n)
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

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(p, 1, n, fp);
    return (fclose(fp) == 0 && w == n) ? 0 : -1;
}

/* Decodes path whole: 0 and the pixels in *rgb (malloc'd), or -1 and err.
 * *steps counts the read steps. */
static int decode(const char *path, int64_t max_pixels, uint8_t **rgb, int *w, int *h, int *steps, char *err,
                  size_t errlen)
{
    *rgb = NULL;
    ck_image_reader *r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, max_pixels, NULL, err, errlen);
    if (!r) return -1;
    *w = ck_image_width(r);
    *h = ck_image_height(r);
    int rc, n = 0;
    while ((rc = ck_image_read_step(r, err, errlen)) == 1) n++;
    if (steps) *steps = n + 1;
    if (rc == 0) {
        const size_t bytes = (size_t)*w * (size_t)*h * 3;
        *rgb = malloc(bytes);
        memcpy(*rgb, ck_image_pixels(r), bytes);
    }
    ck_image_close(r);
    return rc;
}

static void test_references(void)
{
    char path[1400], line[512];
    snprintf(path, sizeof path, "%s/manifest.txt", data);
    FILE *m = fopen(path, "r");
    check(m != NULL, "the manifest of reference images opens", "%s: %s", path, strerror(errno));
    if (!m) return;
    int files = 0;
    while (fgets(line, sizeof line, m)) {
        char name[256], fmt[16];
        int w, h, tol;
        if (line[0] == '#' || sscanf(line, "%255s %d %d %15s %d", name, &w, &h, fmt, &tol) != 5) continue;
        files++;
        char what[400], err[512], rpath[1500];
        snprintf(path, sizeof path, "%s/%s", data, name);
        uint8_t *rgb;
        int gw, gh, steps;
        int rc = decode(path, 0, &rgb, &gw, &gh, &steps, err, sizeof err);
        if (tol < 0) {
            snprintf(what, sizeof what, "%s is refused, naming the file", name);
            check(rc == -1 && strstr(err, path) == err && strstr(err, "CMYK"), what, "%s", err);
            continue;
        }
        snprintf(rpath, sizeof rpath, "%s.rgb", path);
        size_t n = 0;
        unsigned char *ref = read_file(rpath, &n);
        int worst = 0;
        if (rc == 0 && ref && n == (size_t)w * h * 3 && gw == w && gh == h)
            for (size_t i = 0; i < n; i++) {
                int d = abs((int)rgb[i] - (int)ref[i]);
                if (d > worst) worst = d;
            }
        else
            worst = 1000;
        snprintf(what, sizeof what, "%s (%s %dx%d) decodes to Pillow's pixels within %d, largest difference %d", name,
                 fmt, w, h, tol, worst);
        check(worst <= tol, what, "rc %d (%s), %dx%d, %zu reference bytes", rc, err, gw, gh, n);
        /* the limit, judged from the header before anything is decoded */
        ck_image_reader *r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, (int64_t)w * h - 1, NULL, err,
                                              sizeof err);
        char want[128];
        snprintf(want, sizeof want, "more than the limit of %lld", (long long)w * h - 1);
        snprintf(what, sizeof what, "%s: a pixel limit one below its size refuses it at open", name);
        check(!r && strstr(err, want) && strstr(err, path) == err, what, "%s", r ? "opened" : err);
        ck_image_close(r);
        free(rgb);
        free(ref);
    }
    fclose(m);
    check(files >= 20, "the manifest lists the reference images", "%d files", files);
}

/* every prefix of a good file is refused, with the file named */
static void test_prefixes(const char *name)
{
    char src[1200], path[128], err[512];
    snprintf(src, sizeof src, "%s/%s", data, name);
    size_t n = 0;
    unsigned char *bytes = read_file(src, &n);
    snprintf(path, sizeof path, "%s/cut_%s", dir, name);
    size_t accepted = 0, unnamed = 0;
    for (size_t k = 0; bytes && k < n; k++) {
        write_file(path, bytes, k);
        uint8_t *rgb;
        int w, h;
        if (decode(path, 0, &rgb, &w, &h, NULL, err, sizeof err) == 0) {
            accepted++;
            free(rgb);
        } else if (strncmp(err, path, strlen(path)) || err[strlen(path)] != ':') {
            unnamed++;
        }
    }
    char what[300];
    snprintf(what, sizeof what, "%s: each of its %zu prefixes is refused, naming the file", name, n);
    check(bytes && n > 0 && accepted == 0 && unnamed == 0, what, "%zu accepted, %zu without the name", accepted,
          unnamed);
    unlink(path);
    free(bytes);
}

/* seeded random byte changes: never a crash; a refusal names the file */
static void test_corruption(const char *name, int tries)
{
    char src[1200], path[128], err[512];
    snprintf(src, sizeof src, "%s/%s", data, name);
    size_t n = 0;
    unsigned char *bytes = read_file(src, &n), *b = malloc(n ? n : 1);
    snprintf(path, sizeof path, "%s/bad_%s", dir, name);
    unsigned s = 12345;
    int refused = 0, unnamed = 0;
    for (int t = 0; bytes && t < tries; t++) {
        memcpy(b, bytes, n);
        int k = 1 + (int)((s = s * 1103515245u + 12345u) >> 16) % 4;
        for (int j = 0; j < k; j++) {
            s = s * 1103515245u + 12345u;
            size_t at = 8 + (s >> 8) % (n - 8);
            s = s * 1103515245u + 12345u;
            b[at] ^= (unsigned char)(1 + (s >> 16) % 255);
        }
        write_file(path, b, n);
        uint8_t *rgb;
        int w, h;
        if (decode(path, 0, &rgb, &w, &h, NULL, err, sizeof err) == 0) free(rgb);
        else {
            refused++;
            if (strncmp(err, path, strlen(path))) unnamed++;
        }
    }
    char what[300];
    snprintf(what, sizeof what, "%s: %d random corruptions decode or are refused naming the file (%d refused)", name,
             tries, refused);
    check(bytes && unnamed == 0, what, "%d without the name", unnamed);
    unlink(path);
    free(bytes);
    free(b);
}

/* a budget for the decoder's memory charge */
typedef struct budget {
    size_t limit, used, peak;
} budget;

static int take_fn(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    budget *b = ud;
    if (b->used + n > b->limit) {
        snprintf(err, errlen, "%s would pass the limit", what);
        return -1;
    }
    b->used += n;
    if (b->used > b->peak) b->peak = b->used;
    return 0;
}

static void give_fn(void *ud, size_t n) { ((budget *)ud)->used -= n; }

/* text chunks that inflate to 64 MiB: charged as libpng allocates them */
static void test_charge(void)
{
    char path[1400], err[512];
    snprintf(path, sizeof path, "%s/ztxt_bomb.png", data);
    budget b = {32u << 20, 0, 0};
    const ck_image_charge c = {.take = take_fn, .give = give_fn, .ud = &b};
    ck_image_reader *r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, 0, &c, err, sizeof err);
    check(!r && strstr(err, path) == err && strstr(err, "the PNG decoder's memory would pass the limit") && b.used == 0,
          "text chunks inflating past a 32 MiB budget are refused at the limit, every charge given back", "%s, %zu held",
          r ? "opened" : err, b.used);
    ck_image_close(r);
    b = (budget){256u << 20, 0, 0};
    r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, 0, &c, err, sizeof err);
    const char *k = NULL, *v = NULL;
    int n = 0;
    while (r && ck_image_text_at(r, n, &k, &v) == 0) n++;
    const size_t peak = b.peak;
    ck_image_close(r);
    check(r && n == 16 && peak >= (size_t)64 << 20 && b.used == 0,
          "under 256 MiB they are read (16 chunks), the peak charge at least their 64 MiB, all of it given back",
          "%s, %d chunks, peak %zu, %zu held", r ? "opened" : err, n, peak, b.used);
    /* a lossless WebP is charged its file and its whole image from its
     * first step, and the decoded pixels */
    snprintf(path, sizeof path, "%s/lossless.webp", data);
    b = (budget){1u << 20, 0, 0};
    r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, 0, &c, err, sizeof err);
    const size_t at_open = b.used;
    while (r && ck_image_read_step(r, err, sizeof err) == 1) {
    }
    const size_t held = b.used;
    ck_image_close(r);
    check(r && at_open == 0 && held >= 17 * 11 * (4 + 3) && b.used == 0,
          "a lossless WebP's decoder memory is charged while it decodes, not for its header",
          "%zu held at open, %zu decoding, %zu after", at_open, held, b.used);
}

static int near(float a, float b) { return fabsf(a - b) <= 1e-4f * fmaxf(1.0f, fabsf(b)); }

static float byte_value(double v) { return (float)(v / 127.5 - 1.0); }

static void test_resample(void)
{
    /* 4x2 RGB image; R holds the values below, G and B a constant */
    const uint8_t r[2][4] = {{10, 20, 30, 50}, {70, 90, 0, 255}};
    uint8_t rgb[2 * 4 * 3];
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 4; x++) {
            rgb[(y * 4 + x) * 3] = r[y][x];
            rgb[(y * 4 + x) * 3 + 1] = 7;
            rgb[(y * 4 + x) * 3 + 2] = 200;
        }
    char err[256];
    float out[3 * 8 * 8];
    int ow, oh;
    size_t sb;
    /* 4x2 -> 2x1: the mean of each 2x2 block */
    ck_image_xform xf = {.resize_w = 2, .resize_h = 1};
    int rc = ck_image_xform_plan(&xf, 4, 2, &ow, &oh, &sb, err, sizeof err);
    void *s = malloc(sb);
    ck_image_to_chw(rgb, 4, 2, &xf, s, out, NULL, NULL);
    free(s);
    check(rc == 0 && ow == 2 && oh == 1 && near(out[0], byte_value((10 + 20 + 70 + 90) / 4.0)) &&
              near(out[1], byte_value((30 + 50 + 0 + 255) / 4.0)) && near(out[2], byte_value(7)) &&
              near(out[4], byte_value(200)),
          "area: 4x2 to 2x1 is the mean of each 2x2 block, per channel plane", "%g %g", out[0], out[1]);
    /* 4 -> 3 across: output k covers [4k/3, 4(k+1)/3) */
    xf = (ck_image_xform){.resize_w = 3, .resize_h = 2};
    rc = ck_image_xform_plan(&xf, 4, 2, &ow, &oh, &sb, err, sizeof err);
    s = malloc(sb);
    ck_image_to_chw(rgb, 4, 2, &xf, s, out, NULL, NULL);
    free(s);
    const double a0 = (10 * 1 + 20 * (1 / 3.0)) / (4 / 3.0), a1 = (20 * (2 / 3.0) + 30 * (2 / 3.0)) / (4 / 3.0),
                 a2 = (30 * (1 / 3.0) + 50 * 1) / (4 / 3.0);
    check(rc == 0 && ow == 3 && near(out[0], byte_value(a0)) && near(out[1], byte_value(a1)) &&
              near(out[2], byte_value(a2)),
          "area: 4 to 3 weights partial pixels by their overlap", "%g %g %g", out[0], out[1], out[2]);
    /* 2 -> 4 down (rows 10 and 70 in column 0): source y = (k + 0.5) / 2 - 0.5 */
    xf = (ck_image_xform){.resize_w = 4, .resize_h = 4};
    rc = ck_image_xform_plan(&xf, 4, 2, &ow, &oh, &sb, err, sizeof err);
    s = malloc(sb);
    ck_image_to_chw(rgb, 4, 2, &xf, s, out, NULL, NULL);
    free(s);
    check(rc == 0 && oh == 4 && near(out[0], byte_value(10)) && near(out[4], byte_value(0.75 * 10 + 0.25 * 70)) &&
              near(out[8], byte_value(0.25 * 10 + 0.75 * 70)) && near(out[12], byte_value(70)),
          "linear: 2 to 4 interpolates between pixel centres and clamps at the edges", "%g %g %g %g", out[0], out[4],
          out[8], out[12]);
    /* crop and flip without resizing: exact */
    xf = (ck_image_xform){.crop_top = 1, .crop_left = 1, .crop_h = 1, .crop_w = 3, .flip = 1};
    rc = ck_image_xform_plan(&xf, 4, 2, &ow, &oh, &sb, err, sizeof err);
    s = malloc(sb);
    ck_image_to_chw(rgb, 4, 2, &xf, s, out, NULL, NULL);
    free(s);
    check(rc == 0 && ow == 3 && oh == 1 && out[0] == 255 / 127.5f - 1.0f && out[1] == 0 / 127.5f - 1.0f &&
              out[2] == 90 / 127.5f - 1.0f,
          "crop {1, 1, 1, 3} then flip gives row 1's columns 3, 2, 1", "%g %g %g", out[0], out[1], out[2]);
    xf = (ck_image_xform){.crop_top = 1, .crop_left = 2, .crop_h = 2, .crop_w = 2};
    rc = ck_image_xform_plan(&xf, 4, 2, &ow, &oh, &sb, err, sizeof err);
    check(rc == -1 && strstr(err, "does not fit"), "a crop past the bottom edge is refused", "%s", err);
}

static uint32_t crc_table[256];

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    if (!crc_table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            crc_table[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

static int count_temps(const char *name)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, name, strlen(name)) && strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static void test_write(void)
{
    const int W = 401, H = 203;
    uint8_t *rgb = malloc((size_t)W * H * 3);
    unsigned s = 99;
    for (int i = 0; i < W * H * 3; i++) rgb[i] = (uint8_t)((s = s * 1103515245u + 12345u) >> 16);
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/out.png", dir);
    int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    /* a stale temp file of a process that is gone, and a name that is no temp */
    char stale[160], other[160];
    snprintf(stale, sizeof stale, "%s/out.png.tmp.999999999", dir);
    snprintf(other, sizeof other, "%s/out.png.tmp.x", dir);
    write_file(stale, "old", 3);
    write_file(other, "keep", 4);
    const char *keys[] = {"parameters", "Comment"}, *values[] = {"a cat, Steps: 20", "caf\xc3\xa9"};
    int rc = ck_image_write_png_at(dfd, "out.png", path, W, H, rgb, 2, keys, values, err, sizeof err);
    check(rc == 0, "a 401x203 PNG with two text chunks is written", "%s", err);
    struct stat st;
    check(stat(stale, &st) != 0 && stat(other, &st) == 0, "the write removed the dead process's temp file, nothing else",
          "stale %s, other %s", stat(stale, &st) == 0 ? "kept" : "gone", stat(other, &st) == 0 ? "kept" : "gone");
    unlink(other);
    uint8_t *back;
    int w, h, steps;
    rc = decode(path, 0, &back, &w, &h, &steps, err, sizeof err);
    check(rc == 0 && w == W && h == H && !memcmp(back, rgb, (size_t)W * H * 3) && steps > 1,
          "it reads back bit-exact, in more than one step", "rc %d, %dx%d, %d steps", rc, w, h, steps);
    free(back);
    /* the chunks: valid CRCs, the text before the image data */
    size_t n = 0;
    unsigned char *f = read_file(path, &n);
    int crc_ok = 1, text_at = -1, itxt_at = -1, idat_at = -1, k = 0;
    for (size_t at = 8; f && at + 12 <= n; k++) {
        const uint32_t len = be32(f + at);
        if (at + 12 + len > n) {
            crc_ok = 0;
            break;
        }
        crc_ok &= crc32_of(f + at + 4, len + 4) == be32(f + at + 8 + len);
        if (!memcmp(f + at + 4, "tEXt", 4) && len == 27 && !memcmp(f + at + 8, "parameters\0a cat, Steps: 20", 27))
            text_at = k;
        if (!memcmp(f + at + 4, "iTXt", 4) && !memcmp(f + at + 8, "Comment\0", 8)) itxt_at = k;
        if (!memcmp(f + at + 4, "IDAT", 4) && idat_at < 0) idat_at = k;
        at += 12 + len;
    }
    check(f && crc_ok && text_at > 0 && itxt_at > 0 && idat_at > text_at && idat_at > itxt_at,
          "tEXt (ASCII) and iTXt (UTF-8) chunks come before IDAT, every CRC valid", "crc %d, tEXt %d, iTXt %d, IDAT %d",
          crc_ok, text_at, itxt_at, idat_at);
    ck_image_reader *r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, 0, NULL, err, sizeof err);
    const char *key = NULL, *val = NULL, *key2 = NULL, *val2 = NULL;
    if (r) {
        ck_image_text_at(r, 0, &key, &val);
        ck_image_text_at(r, 1, &key2, &val2);
    }
    check(r && key && !strcmp(key, "parameters") && !strcmp(val, "a cat, Steps: 20") && key2 &&
              !strcmp(val2, "caf\xc3\xa9") && ck_image_text_at(r, 2, &key, &val) == -1,
          "the reader gives the text back from the header", "%s", r ? "" : err);
    ck_image_close(r);
    /* failed writes: the old file stays, no temp file is left */
    const char *bad_keys[] = {"two  spaces"};
    rc = ck_image_write_png_at(dfd, "out.png", path, 2, 2, rgb, 1, bad_keys, values, err, sizeof err);
    size_t n2 = 0;
    unsigned char *f2 = read_file(path, &n2);
    check(rc == -1 && strstr(err, path) == err && f2 && n2 == n && !memcmp(f, f2, n) && count_temps("out.png") == 0,
          "a bad key fails the write, naming the file; the old file is byte-identical, no temp file left", "%s", err);
    free(f2);
    rc = ck_image_write_png_at(-1, "out.png", path, 2, 2, rgb, 0, NULL, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "cannot open its directory"), "a directory that did not open fails the write", "%s",
          err);
    /* a read-only directory: the temp file cannot be made */
    char ro[128];
    snprintf(ro, sizeof ro, "%s/ro", dir);
    mkdir(ro, 0700);
    int rfd = open(ro, O_PATH | O_DIRECTORY | O_CLOEXEC);
    rc = ck_image_write_png_at(rfd, "x.png", "ro/x.png", 2, 2, rgb, 0, NULL, NULL, err, sizeof err);
    check(rc == 0, "a write into an empty directory works", "%s", err);
    chmod(ro, 0500);
    if (geteuid() != 0) {
        rc = ck_image_write_png_at(rfd, "x.png", "ro/x.png", 2, 2, rgb + 3, 0, NULL, NULL, err, sizeof err);
        check(rc == -1 && strstr(err, "ro/x.png: cannot create temp file"), "a directory that refuses the temp file",
              "%s", err);
    }
    chmod(ro, 0700);
    char x[160];
    snprintf(x, sizeof x, "%s/x.png", ro);
    unlink(x);
    rmdir(ro);
    close(rfd);
    free(f);
    close(dfd);
    unlink(path);
    free(rgb);
}

int main(void)
{
    /* the data beside this source file: tests/c/ -> tests/data/image */
    snprintf(data, sizeof data, "%s", __FILE__);
    char *c = strstr(data, "tests/c/test_image.c");
    if (c) snprintf(c, sizeof data - (size_t)(c - data), "tests/data/image");
    else snprintf(data, sizeof data, "../tests/data/image");
    snprintf(dir, sizeof dir, "/tmp/ck_test_image.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_references();
    const char *cut[] = {"rgb8.png", "rgba16_interlaced.png", "palette4_trns.png", "rgb420.jpg", "progressive.jpg",
                         "gray.jpg", "lossless.webp", "lossy_alpha.webp"};
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) test_prefixes(cut[i]);
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) test_corruption(cut[i], 300);
    test_resample();
    test_charge();
    test_write();
    rmdir(dir);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
