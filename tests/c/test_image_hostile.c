/* Specification of vm/formats/image against hostile files, made here
 * (tests/c/image_gen.h): a declared size past the pixel or width cap is
 * refused from the header with nothing charged; one within them but past
 * the memory budget is refused at the first step before anything big is
 * made; a PNG of millions of empty chunks (before, between and after the
 * image data) reads quickly, polls at least once per 64 KiB and stops at
 * the poll that asks; the same coefficients written as one scan, one scan per
 * component and progressive scans decode to the same pixels (4096x4096 in
 * three scans included), more than 1000 scans are refused, and the scans
 * are polled per 4096 blocks; a 28-byte lossless 4096x4096 WebP decodes on
 * its thread while the steps poll, and a stop returns at once and leaves
 * the thread to finish; 1024 text chunks read and 1025 are refused.
 *
 * With --write DIR it only writes the large hostile files that
 * tests/sh/test_decoder_interrupt.sh runs ckrun on; with --corpus DIR, the
 * small ones of tests/fuzz/corpus/image. */
#define _GNU_SOURCE
#include "formats/image.h"
#include "image_gen.h"
#include "named_check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char dir[64];

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* this thread's CPU time: a bound on work done that other processes on a
 * loaded machine do not move */
static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* what a reader charged and how it polled */
typedef struct watch {
    size_t limit, used, peak;
    long long polls, work, stop_at; /* stop_at: the poll that asks to stop (0: none) */
    int stop_when_idle;             /* ask to stop at the first poll reporting no work */
    double stop_ms;                 /* when the stop was asked */
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
    if ((w->stop_at && w->polls >= w->stop_at) || (w->stop_when_idle && work == 0)) {
        if (!w->stop_ms) w->stop_ms = now_ms();
        return 1;
    }
    return 0;
}

static watch watching(size_t limit)
{
    watch w;
    memset(&w, 0, sizeof w);
    w.limit = limit ? limit : SIZE_MAX;
    return w;
}

/* Opens and decodes path under w: 0 (the pixels copied to *rgb when rgb is
 * not NULL), or -1 with err; *opened says whether the open succeeded and
 * *steps counts the steps. The charge must be all given back at close. */
static int run(const char *path, int64_t max_pixels, watch *w, uint8_t **rgb, int *opened, int *steps, char *err,
               size_t errlen)
{
    const ck_image_charge c = {take_fn, give_fn, w, poll_fn, w};
    if (rgb) *rgb = NULL;
    ck_image_reader *r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, max_pixels, &c, err, errlen);
    if (opened) *opened = r != NULL;
    if (steps) *steps = 0;
    if (!r) return -1;
    int rc, n = 0;
    while ((rc = ck_image_read_step(r, err, errlen)) == 1) n++;
    if (steps) *steps = n + 1;
    if (rc == 0 && rgb) {
        const size_t bytes = (size_t)ck_image_width(r) * (size_t)ck_image_height(r) * 3;
        *rgb = malloc(bytes);
        memcpy(*rgb, ck_image_pixels(r), bytes);
    }
    ck_image_close(r);
    return rc;
}

static void put(gbuf *b, const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    if (gb_write(b, path)) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    free(b->p);
    memset(b, 0, sizeof *b);
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* ---- declared sizes */

static void test_declared_sizes(void)
{
    struct {
        const char *name, *want;
        int64_t max_pixels;
    } cases[] = {
        {"png_2147483647x1", "a png image 2147483647 pixels wide, more than the limit of 1048576", 0},
        {"png_1048577x1", "a png image 1048577 pixels wide, more than the limit of 1048576", 0},
        {"png_1x2147483647", "1x2147483647 = 2147483647 pixels, more than the limit of 268435456", 0},
        {"png_65536x65536", "65536x65536 = 4294967296 pixels, more than the limit of 268435456", 0},
        {"png_16384x16385", "16384x16385 = 268451840 pixels, more than the limit of 268435456", 0},
        {"png_text_first", "not a valid PNG: its first chunk is not a 13-byte IHDR", 0},
        {"jpeg_65500x65500", "65500x65500 = 4290250000 pixels, more than the limit of 268435456", 0},
        {"webp_16384x16384", "16384x16384 = 268435456 pixels, more than the limit of 134217728", (int64_t)1 << 27},
        {"webpx_16384x16384", "16384x16384 = 268435456 pixels, more than the limit of 134217728", (int64_t)1 << 27},
        {"webpx_canvas", "not a valid WebP: its canvas of 16384x16383 is not its image's 16384x16384", 0},
        {"webp_chunk_past_riff", "not a valid WebP: its 'VP8L' chunk of 4294967295 bytes runs past the end", 0},
        {"webp_first_chunk", "not a valid WebP: its first chunk is 'ALPH', not VP8, VP8L or VP8X", 0},
        {"webpx_animated", "an animated WebP, which is not supported", 0},
    };
    gbuf b = {0};
    char path[200], err[512];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *n = cases[i].name;
        if (!strcmp(n, "png_2147483647x1") || !strcmp(n, "png_1048577x1") || !strcmp(n, "png_1x2147483647") ||
            !strcmp(n, "png_65536x65536") || !strcmp(n, "png_16384x16385")) {
            unsigned long w, h;
            sscanf(n, "png_%lux%lu", &w, &h);
            png_head(&b, (uint32_t)w, (uint32_t)h, 16, 6, 0);
            gbuf z = {0};
            zlib_zeros(&z, 64);
            png_chunk(&b, "IDAT", z.p, z.n);
            free(z.p);
            png_chunk(&b, "IEND", NULL, 0);
        } else if (!strcmp(n, "png_text_first")) {
            png_head(&b, 1, 1, 8, 0, 0);
            /* the IHDR's place taken by a text chunk */
            const size_t at = 8;
            memcpy(b.p + at + 4, "tEXt", 4);
        } else if (!strcmp(n, "jpeg_65500x65500")) {
            jpeg_header_only(&b, 65500, 65500);
        } else {
            webp_zero_bits(&b, 16384, 16384, !strncmp(n, "webpx", 5));
            if (!strcmp(n, "webpx_canvas")) b.p[27] = 0xfe;  /* canvas height - 1: 16382 */
            if (!strcmp(n, "webp_chunk_past_riff")) memset(b.p + 16, 0xff, 4);
            if (!strcmp(n, "webp_first_chunk")) memcpy(b.p + 12, "ALPH", 4);
            if (!strcmp(n, "webpx_animated")) b.p[20] |= 0x02;
        }
        put(&b, n, path, sizeof path);
        watch w = watching(0);
        int opened;
        const int rc = run(path, cases[i].max_pixels, &w, NULL, &opened, NULL, err, sizeof err);
        char what[300];
        snprintf(what, sizeof what, "%s: refused at open from its header, naming the file, nothing charged", n);
        check(rc == -1 && !opened && strstr(err, path) == err && strstr(err, cases[i].want) && !strchr(err, '\n') &&
                  w.peak < 65536 && w.used == 0,
              what, "%s; peak charge %zu", err, w.peak);
        unlink(path);
    }
}

/* ---- the memory budget, before anything big is made */

static void test_memory_budget(void)
{
    gbuf b = {0};
    char path[200], err[512];
    struct {
        const char *name, *want;
        size_t limit, peak_at_most;
    } cases[] = {
        {"black_8192.png", "the decoded pixels of 8192x8192 (192 MiB) would pass the limit", 64u << 20, 1u << 20},
        {"three_scans_4096.jpg", "the JPEG decoder's memory (96.8 MiB) would pass the limit", 96u << 20, 1u << 20},
        {"lossless_16384.webp", "the WebP decoder's memory (1.0 GiB) would pass the limit", 1u << 30, 1u << 20},
    };
    png_black(&b, 8192, 8192, 2, 0);
    put(&b, cases[0].name, path, sizeof path);
    const jpeg_spec big = {4096, 4096, 3, {1, 1, 1}, {1, 1, 1}};
    jpeg_make(&b, &big, JPEG_PER_COMPONENT, 0);
    put(&b, cases[1].name, path, sizeof path);
    webp_zero_bits(&b, 16384, 16384, 0);
    put(&b, cases[2].name, path, sizeof path);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, cases[i].name);
        watch w = watching(cases[i].limit);
        int opened, steps;
        const int rc = run(path, 0, &w, NULL, &opened, &steps, err, sizeof err);
        char what[300];
        snprintf(what, sizeof what, "%s: under a budget of %zu MiB, refused at its first step before its buffers "
                 "are made, all given back", cases[i].name, cases[i].limit >> 20);
        check(rc == -1 && opened && steps == 1 && strstr(err, path) == err && strstr(err, cases[i].want) &&
                  w.peak <= cases[i].peak_at_most && w.used == 0,
              what, "%s; %d steps, peak charge %zu", err, steps, w.peak);
        unlink(path);
    }
}

/* ---- PNG chunks */

static void test_png_chunks(void)
{
    static const char *where[] = {"before the image data", "as empty IDATs within it", "after it"};
    gbuf b = {0};
    char path[200], err[512];
    for (int k = 0; k < 3; k++) {
        png_empty_chunks(&b, 2000000, k);
        const size_t size = b.n;
        put(&b, "chunks.png", path, sizeof path);
        watch w = watching(0);
        int opened;
        uint8_t *rgb;
        const double t0 = cpu_ms();
        int rc = run(path, 0, &w, &rgb, &opened, NULL, err, sizeof err);
        const double ms = cpu_ms() - t0;
        char what[300];
        snprintf(what, sizeof what, "2M empty chunks %s (24 MB) read in under 1.5 s of CPU, polled at least every 64 KiB",
                 where[k]);
        check(rc == 0 && rgb && rgb[0] == 0 && ms < 1500 && w.polls >= (long long)(size / 65536) && w.used == 0, what,
              "rc %d (%s), %.0f ms, %lld polls for %zu bytes", rc, err, ms, w.polls, size);
        free(rgb);
        w = watching(0);
        w.stop_at = 3;
        rc = run(path, 0, &w, NULL, &opened, NULL, err, sizeof err);
        snprintf(what, sizeof what, "2M empty chunks %s: a stop asked at the 3rd poll ends the read there (%s)",
                 where[k], k == 0 ? "in the open" : "in a step");
        check(rc == -1 && opened == (k != 0) && strstr(err, path) == err && strstr(err, "stopped") && w.polls == 3 &&
                  w.used == 0,
              what, "rc %d, opened %d, %lld polls: %s", rc, opened, w.polls, err);
        unlink(path);
    }
    /* 1024 text chunks are read; one more is refused, not dropped */
    for (int n = 1024; n <= 1025; n++) {
        png_head(&b, 1, 1, 8, 0, 0);
        for (int i = 0; i < n; i++) {
            char t[32];
            const int len = snprintf(t, sizeof t, "key%d", i);
            t[len + 1] = 'v';
            png_chunk(&b, "tEXt", t, (size_t)len + 2);
        }
        gbuf z = {0};
        zlib_zeros(&z, 2);
        png_chunk(&b, "IDAT", z.p, z.n);
        free(z.p);
        png_chunk(&b, "IEND", NULL, 0);
        put(&b, "text.png", path, sizeof path);
        ck_image_reader *r = ck_image_open_fd(open(path, O_RDONLY | O_CLOEXEC), path, 0, NULL, err, sizeof err);
        int got = 0;
        const char *key, *value;
        while (r && ck_image_text_at(r, got, &key, &value) == 0) got++;
        ck_image_close(r);
        if (n == 1024)
            check(r && got == 1024, "a PNG of 1024 text chunks gives all of them", "%s, %d chunks", r ? "" : err, got);
        else
            check(!r && strstr(err, "a PNG of more than 1024 text chunks, which is not supported"),
                  "a PNG of 1025 text chunks is refused, not read without one", "%s", r ? "opened" : err);
        unlink(path);
    }
}

/* ---- JPEG scans */

static int decode_same(const jpeg_spec *s, const char *what_spec)
{
    gbuf b = {0};
    char path[200], err[512], what[300];
    uint8_t *ref = NULL;
    static const char *modes[] = {"one interleaved scan", "one scan per component", "progressive scans",
                                  "500 progressive scans"};
    int ok_all = 1;
    for (int m = 0; m < 4; m++) {
        jpeg_make(&b, s, m == 3 ? JPEG_PROGRESSIVE : m, m == 3 ? 499 : s->ncomp);
        put(&b, "same.jpg", path, sizeof path);
        watch w = watching(0);
        uint8_t *rgb;
        const int rc = run(path, 0, &w, &rgb, NULL, NULL, err, sizeof err);
        if (m == 0) {
            ref = rgb;
            /* the pattern's levels show: not one flat colour */
            int distinct = 0;
            for (size_t i = 3; rgb && i < (size_t)s->w * s->h * 3; i += 3) distinct |= memcmp(rgb, rgb + i, 3) != 0;
            snprintf(what, sizeof what, "%s as %s decodes to a pattern", what_spec, modes[m]);
            check(rc == 0 && distinct, what, "rc %d: %s", rc, err);
            ok_all &= rc == 0;
            continue;
        }
        snprintf(what, sizeof what, "%s as %s decodes to the same pixels as one scan", what_spec, modes[m]);
        const int same = rc == 0 && ref && !memcmp(rgb, ref, (size_t)s->w * s->h * 3);
        check(same && w.used == 0, what, "rc %d: %s", rc, err);
        ok_all &= same;
        free(rgb);
        unlink(path);
    }
    free(ref);
    return ok_all;
}

static void test_jpeg_scans(void)
{
    const jpeg_spec s420 = {61, 37, 3, {2, 1, 1}, {2, 1, 1}}, s444 = {40, 24, 3, {1, 1, 1}, {1, 1, 1}},
                    gray = {33, 17, 1, {1}, {1}};
    decode_same(&s420, "a 61x37 4:2:0 JPEG");
    decode_same(&s444, "a 40x24 4:4:4 JPEG");
    decode_same(&gray, "a 33x17 gray JPEG");
    /* the file libjpeg refused with 'Backing store not supported': its
     * coefficients (96 MiB) are charged and allowed */
    gbuf b = {0};
    char path[200], err[512];
    const jpeg_spec big = {4096, 4096, 3, {1, 1, 1}, {1, 1, 1}};
    uint8_t *one = NULL, *three = NULL;
    jpeg_make(&b, &big, JPEG_INTERLEAVED, 0);
    put(&b, "one_4096.jpg", path, sizeof path);
    watch w = watching(0);
    int rc1 = run(path, 0, &w, &one, NULL, NULL, err, sizeof err);
    unlink(path);
    jpeg_make(&b, &big, JPEG_PER_COMPONENT, 0);
    put(&b, "three_4096.jpg", path, sizeof path);
    w = watching(0);
    int rc3 = run(path, 0, &w, &three, NULL, NULL, err, sizeof err);
    unlink(path);
    check(rc1 == 0 && rc3 == 0 && !memcmp(one, three, (size_t)4096 * 4096 * 3) && w.peak >= (size_t)96 << 20,
          "a 4096x4096 JPEG of three scans decodes, as its one-scan form does, its 96 MiB of coefficients charged",
          "rc %d, %d: %s; peak %zu", rc1, rc3, err, w.peak);
    free(one);
    free(three);

    /* 1024x1024 gray: 16384 blocks a scan */
    const jpeg_spec g = {1024, 1024, 1, {1}, {1}};
    for (int k = 0; k < 2; k++) {
        const long ac = k == 0 ? 999 : 1000; /* scans: one DC scan and these */
        jpeg_make(&b, &g, JPEG_PROGRESSIVE, ac);
        put(&b, "scans.jpg", path, sizeof path);
        w = watching(0);
        uint8_t *rgb;
        const int rc = run(path, 0, &w, &rgb, NULL, NULL, err, sizeof err);
        if (k == 0) {
            check(rc == 0 && rgb, "a progressive JPEG of 1000 scans decodes", "rc %d: %s", rc, err);
            check(w.work >= 1000LL * 16384 && w.polls >= 1000LL * 16384 / 8192,
                  "its scans are charged a unit a block and polled at least every 8192 blocks",
                  "%lld units, %lld polls", w.work, w.polls);
        } else {
            check(rc == -1 && strstr(err, path) == err &&
                      strstr(err, "a JPEG of more than 1000 scans, which is not supported") && w.used == 0,
                  "a JPEG of 1001 scans is refused at its 1001st, everything given back", "rc %d: %s", rc, err);
        }
        free(rgb);
        if (k == 1) {
            w = watching(0);
            w.stop_at = 20;
            const int rs = run(path, 0, &w, NULL, NULL, NULL, err, sizeof err);
            check(rs == -1 && strstr(err, "stopped") && w.polls == 20 && w.used == 0,
                  "a stop asked at the 20th poll of a 1001-scan JPEG ends the decode there", "rc %d, %lld polls: %s",
                  rs, w.polls, err);
        }
        unlink(path);
    }
}

/* ---- WebP */

static void test_webp(void)
{
    gbuf b = {0};
    char path[200], err[512];
    /* 28 bytes of 4096x4096: the whole image from no bits at all */
    webp_zero_bits(&b, 4096, 4096, 0);
    const size_t size = b.n;
    put(&b, "zero_bits.webp", path, sizeof path);
    watch w = watching(0);
    uint8_t *rgb;
    int steps;
    int rc = run(path, 0, &w, &rgb, NULL, &steps, err, sizeof err);
    check(rc == 0 && size == 28 && rgb && all_zero(rgb, (size_t)4096 * 4096 * 3) &&
              w.peak >= (size_t)4096 * 4096 * (4 + 3) && w.work >= 4096LL * 4096 / 16 && w.used == 0,
          "a 28-byte lossless WebP of 4096x4096 decodes (black), its decoder's whole image and the pixels charged, "
          "the decode charged as it starts",
          "rc %d: %s; %zu bytes, peak %zu, %lld units, %d steps", rc, err, size, w.peak, w.work, steps);
    free(rgb);
    unlink(path);
    /* a stop while the thread decodes (8192x8192, so that it is still
     * decoding at the first wait on a fast machine): the step returns at
     * once, the thread is left to finish and free its memory */
    webp_zero_bits(&b, 8192, 8192, 0);
    put(&b, "zero_bits.webp", path, sizeof path);
    w = watching(0);
    w.stop_when_idle = 1;
    rc = run(path, 0, &w, NULL, NULL, &steps, err, sizeof err);
    const double after = now_ms() - w.stop_ms;
    check(rc == -1 && strstr(err, "stopped") && w.stop_ms > 0 && after < 100 && w.used == 0,
          "a stop asked while the WebP thread decodes returns within 100 ms, everything given back",
          "rc %d: %s; returned %.0f ms after the stop", rc, err, after);
    const double t0 = now_ms();
    ck_image_wait_abandoned();
    check(now_ms() - t0 < 20000, "the abandoned decode ends on its thread", "%.0f ms", now_ms() - t0);
    unlink(path);
    /* the same in a VP8X container, smaller */
    webp_zero_bits(&b, 300, 200, 1);
    put(&b, "zero_bits_x.webp", path, sizeof path);
    w = watching(0);
    rc = run(path, 0, &w, &rgb, NULL, NULL, err, sizeof err);
    check(rc == 0 && rgb && all_zero(rgb, 300 * 200 * 3), "the same in a VP8X container decodes", "rc %d: %s", rc, err);
    free(rgb);
    unlink(path);
}

/* the large files tests/sh/test_image_interrupt.sh runs ckrun on */
static int write_large(const char *to)
{
    snprintf(dir, sizeof dir, "%s", to);
    gbuf b = {0};
    char path[200];
    const jpeg_spec g = {8192, 8192, 1, {1}, {1}};
    jpeg_make(&b, &g, JPEG_PROGRESSIVE, 20000);
    put(&b, "scans.jpg", path, sizeof path);
    webp_zero_bits(&b, 16384, 16384, 0);
    put(&b, "big.webp", path, sizeof path);
    png_black(&b, 16384, 16384, 2, 0);
    put(&b, "black.png", path, sizeof path);
    png_empty_chunks(&b, 2000000, EMPTY_BEFORE);
    put(&b, "chunks.png", path, sizeof path);
    png_head(&b, 2147483647u, 1, 8, 2, 0);
    gbuf z = {0};
    zlib_zeros(&z, 4);
    png_chunk(&b, "IDAT", z.p, z.n);
    free(z.p);
    png_chunk(&b, "IEND", NULL, 0);
    put(&b, "wide.png", path, sizeof path);
    return 0;
}

/* small files of each shape for tests/fuzz/corpus/image (besides the
 * reference images of tests/data/image) */
static int write_corpus(const char *to)
{
    snprintf(dir, sizeof dir, "%s", to);
    gbuf b = {0};
    char path[200];
    const jpeg_spec s420 = {61, 37, 3, {2, 1, 1}, {2, 1, 1}}, gray = {64, 64, 1, {1}, {1}};
    jpeg_make(&b, &s420, JPEG_INTERLEAVED, 0);
    put(&b, "jpeg_one_scan_420.jpg", path, sizeof path);
    jpeg_make(&b, &s420, JPEG_PER_COMPONENT, 0);
    put(&b, "jpeg_three_scans_420.jpg", path, sizeof path);
    jpeg_make(&b, &s420, JPEG_PROGRESSIVE, 3);
    put(&b, "jpeg_progressive_420.jpg", path, sizeof path);
    jpeg_make(&b, &gray, JPEG_PROGRESSIVE, 40);
    put(&b, "jpeg_progressive_41_scans.jpg", path, sizeof path);
    jpeg_header_only(&b, 65500, 65500);
    put(&b, "jpeg_header_65500.jpg", path, sizeof path);
    for (int k = 0; k < 3; k++) {
        static const char *names[] = {"png_empty_chunks_before.png", "png_empty_idats.png", "png_empty_chunks_after.png"};
        png_empty_chunks(&b, 200, k);
        put(&b, names[k], path, sizeof path);
    }
    png_black(&b, 40, 30, 2, 1);
    put(&b, "png_black_interlaced.png", path, sizeof path);
    png_black(&b, 3, 70, 4, 0);
    put(&b, "png_black_gray_alpha.png", path, sizeof path);
    png_head(&b, 2147483647u, 1, 16, 6, 0);
    png_chunk(&b, "IEND", NULL, 0);
    put(&b, "png_header_2147483647x1.png", path, sizeof path);
    webp_zero_bits(&b, 64, 48, 0);
    put(&b, "webp_zero_bits.webp", path, sizeof path);
    webp_zero_bits(&b, 64, 48, 1);
    put(&b, "webp_zero_bits_vp8x.webp", path, sizeof path);
    webp_zero_bits(&b, 16384, 16384, 0);
    put(&b, "webp_zero_bits_16384.webp", path, sizeof path);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write")) return write_large(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--corpus")) return write_corpus(argv[2]);
    snprintf(dir, sizeof dir, "/tmp/ck_test_image_hostile.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_declared_sizes();
    test_memory_budget();
    test_png_chunks();
    test_jpeg_scans();
    test_webp();
    rmdir(dir);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
