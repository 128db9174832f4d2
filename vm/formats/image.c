/* PNG, JPEG and WebP decoding to 8-bit RGB through Debian's libpng,
 * libjpeg-turbo and libwebp, read from a descriptor in steps; the resampling
 * to a training array; PNG writing with text chunks, atomically. See
 * image.h for what a decode keeps and drops. */
#define _GNU_SOURCE
#include "formats/image.h"
#include "util/atomic.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

#define IO_BUF 65536
#define STEP_PIXELS 65536

struct jpeg_err {
    struct jpeg_error_mgr pub;
    ck_image_reader *r;
};

struct ck_image_reader {
    int fd;
    char *path;
    ck_image_format format;
    int w, h;
    ck_image_charge charge;
    size_t charged;
    uint64_t size; /* the file's bytes */
    uint64_t off;  /* next byte to read */
    unsigned char buf[IO_BUF];
    char msg[400]; /* a library's error, for the longjmp back */
    char warn[200]; /* libpng's last warning, which often says why its error came */
    char mem_err[300]; /* a charge refused to libpng's allocator */
    jmp_buf jb;
    int started;
    int row, pass, passes;
    /* PNG */
    png_structp png;
    png_infop info;
    png_textp text;
    int ntext;
    /* JPEG */
    struct jpeg_decompress_struct jd;
    struct jpeg_err jerr;
    struct jpeg_source_mgr jsrc;
    int jd_made;
    /* WebP */
    WebPIDecoder *idec;
    WebPDecBuffer wout;
};

const char *ck_image_format_name(ck_image_format f)
{
    return f == CK_IMAGE_PNG ? "png" : f == CK_IMAGE_JPEG ? "jpeg" : f == CK_IMAGE_WEBP ? "webp" : "?";
}

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    if (!err || !errlen) return -1;
    int k = snprintf(err, errlen, "%s: ", path ? path : "(image)");
    if (k < 0 || (size_t)k >= errlen) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    va_end(ap);
    /* one line: a library's message may end in a newline */
    for (char *c = err; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    return -1;
}

/* Reads up to n bytes at r->off into dst; the count, or -1 with errno. */
static ssize_t read_at(ck_image_reader *r, void *dst, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(r->fd, (char *)dst + got, n - got, (off_t)(r->off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        got += (size_t)k;
    }
    r->off += got;
    return (ssize_t)got;
}

static const char *TRUNCATED = "the file ends before the image does (truncated)";

static int take(ck_image_reader *r, uint64_t n, const char *what, char *err, size_t errlen)
{
    if (!r->charge.take) return 0;
    char msg[300];
    if (n > SIZE_MAX || r->charge.take(r->charge.ud, (size_t)n, what, msg, sizeof msg))
        return fail(err, errlen, r->path, "%s", n > SIZE_MAX ? "decoder memory too large" : msg);
    r->charged += (size_t)n;
    return 0;
}

/* ---- PNG */

static void png_err_fn(png_structp png, png_const_charp msg)
{
    ck_image_reader *r = png_get_error_ptr(png);
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    longjmp(r->jb, 1);
}

static void png_warn_fn(png_structp png, png_const_charp msg)
{
    ck_image_reader *r = png_get_error_ptr(png);
    if (r) snprintf(r->warn, sizeof r->warn, "%s", msg);
}

static void pngw_warn_fn(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

static void png_read_fn(png_structp png, png_bytep dst, size_t n)
{
    ck_image_reader *r = png_get_io_ptr(png);
    ssize_t k = read_at(r, dst, n);
    if (k < 0) {
        snprintf(r->msg, sizeof r->msg, "read error: %s", strerror(errno));
        longjmp(r->jb, 1);
    }
    if ((size_t)k < n) {
        snprintf(r->msg, sizeof r->msg, "%s", TRUNCATED);
        longjmp(r->jb, 1);
    }
}

/* libpng's memory (text chunks, a decompressed zTXt or iCCP, row buffers)
 * is charged as it is asked for: a small file whose chunks inflate to
 * gigabytes is refused at the limit. Each block carries its size ahead. */
#define PNG_HEAD 16

static png_voidp png_malloc_fn(png_structp png, png_alloc_size_t n)
{
    ck_image_reader *r = png_get_mem_ptr(png);
    if (n > SIZE_MAX - PNG_HEAD) return NULL;
    if (r->charge.take) {
        char msg[300];
        if (r->charge.take(r->charge.ud, n + PNG_HEAD, "the PNG decoder's memory", msg, sizeof msg)) {
            snprintf(r->mem_err, sizeof r->mem_err, "%s", msg);
            return NULL;
        }
    }
    unsigned char *p = malloc(n + PNG_HEAD);
    if (!p) {
        if (r->charge.give) r->charge.give(r->charge.ud, n + PNG_HEAD);
        return NULL;
    }
    memcpy(p, &n, sizeof n);
    return p + PNG_HEAD;
}

static void png_free_fn(png_structp png, png_voidp ptr)
{
    if (!ptr) return;
    ck_image_reader *r = png_get_mem_ptr(png);
    unsigned char *p = (unsigned char *)ptr - PNG_HEAD;
    png_alloc_size_t n;
    memcpy(&n, p, sizeof n);
    if (r->charge.give) r->charge.give(r->charge.ud, n + PNG_HEAD);
    free(p);
}

static int png_open(ck_image_reader *r, char *err, size_t errlen)
{
    r->png = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, r, png_err_fn, png_warn_fn, r, png_malloc_fn,
                                      png_free_fn);
    if (!r->png) return fail(err, errlen, r->path, "out of memory");
    r->info = png_create_info_struct(r->png);
    if (!r->info) return fail(err, errlen, r->path, "out of memory");
    if (setjmp(r->jb)) {
        if (r->mem_err[0]) return fail(err, errlen, r->path, "%s", r->mem_err);
        return fail(err, errlen, r->path, "not a valid PNG: %s%s%s%s", r->msg, r->warn[0] ? " (" : "", r->warn,
                    r->warn[0] ? ")" : "");
    }
    png_set_read_fn(r->png, r, png_read_fn);
    /* the size is judged by the caller's pixel limit, not libpng's */
    png_set_user_limits(r->png, 0x7fffffff, 0x7fffffff);
    png_read_info(r->png, r->info);
    /* libpng skips a text chunk it could not get memory for: refused here,
     * rather than read without it */
    if (r->mem_err[0]) return fail(err, errlen, r->path, "%s", r->mem_err);
    png_uint_32 w, h;
    int depth, color, interlace;
    png_get_IHDR(r->png, r->info, &w, &h, &depth, &color, &interlace, NULL, NULL);
    r->w = (int)w;
    r->h = (int)h;
    if (png_get_text(r->png, r->info, &r->text, &r->ntext) <= 0) r->ntext = 0;
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r->png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(r->png);
    if (depth == 16) png_set_strip_16(r->png);
    /* the alpha channel, and a palette's or gray image's transparency (never
     * expanded to one), are dropped as Pillow's convert("RGB") drops them */
    png_set_strip_alpha(r->png);
    if (!(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(r->png);
    r->passes = png_set_interlace_handling(r->png);
    png_read_update_info(r->png, r->info);
    if (png_get_rowbytes(r->png, r->info) != (size_t)w * 3 || png_get_bit_depth(r->png, r->info) != 8)
        return fail(err, errlen, r->path, "PNG of colour type %d, depth %d gives no 8-bit RGB", color, depth);
    return 0;
}

static int png_step(ck_image_reader *r, uint8_t *rgb, char *err, size_t errlen)
{
    if (setjmp(r->jb)) {
        if (r->mem_err[0]) return fail(err, errlen, r->path, "%s", r->mem_err);
        return fail(err, errlen, r->path, "corrupt PNG: %s", r->msg);
    }
    int rows = STEP_PIXELS / r->w;
    if (rows < 1) rows = 1;
    for (int k = 0; k < rows && r->pass < r->passes; k++) {
        png_read_row(r->png, rgb + (size_t)r->row * (size_t)r->w * 3, NULL);
        if (++r->row == r->h) {
            r->row = 0;
            r->pass++;
        }
    }
    if (r->pass < r->passes) return 1;
    /* the rest of the file up to IEND, so a file cut after its image data
     * is refused as well */
    png_read_end(r->png, NULL);
    return 0;
}

/* ---- JPEG */

static void jpeg_exit_fn(j_common_ptr c)
{
    struct jpeg_err *e = (struct jpeg_err *)c->err;
    ck_image_reader *r = e->r;
    char msg[JMSG_LENGTH_MAX];
    (*c->err->format_message)(c, msg);
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    longjmp(r->jb, 1);
}

/* Warnings that mean the pixels are wrong are errors here; notes on the
 * header that do not change them (an unknown JFIF revision, a bad ICC
 * marker, bytes between markers) are not. */
static void jpeg_emit_fn(j_common_ptr c, int level)
{
    if (level >= 0) return;
    const int code = c->err->msg_code;
    if (code == JWRN_JFIF_MAJOR || code == JWRN_BOGUS_ICC || code == JWRN_EXTRANEOUS_DATA || code == JWRN_ADOBE_XFORM)
        return;
    jpeg_exit_fn(c);
}

static void jsrc_init(j_decompress_ptr d) { (void)d; }
static void jsrc_term(j_decompress_ptr d) { (void)d; }

static boolean jsrc_fill(j_decompress_ptr d)
{
    ck_image_reader *r = ((struct jpeg_err *)d->err)->r;
    ssize_t k = read_at(r, r->buf, sizeof r->buf);
    if (k < 0) snprintf(r->msg, sizeof r->msg, "read error: %s", strerror(errno));
    if (k == 0) snprintf(r->msg, sizeof r->msg, "%s", TRUNCATED);
    if (k <= 0) longjmp(r->jb, 1);
    r->jsrc.next_input_byte = r->buf;
    r->jsrc.bytes_in_buffer = (size_t)k;
    return TRUE;
}

static void jsrc_skip(j_decompress_ptr d, long n)
{
    ck_image_reader *r = ((struct jpeg_err *)d->err)->r;
    if (n <= 0) return;
    while ((size_t)n > r->jsrc.bytes_in_buffer) {
        n -= (long)r->jsrc.bytes_in_buffer;
        jsrc_fill(d);
    }
    r->jsrc.next_input_byte += n;
    r->jsrc.bytes_in_buffer -= (size_t)n;
}

static int jpeg_open(ck_image_reader *r, char *err, size_t errlen)
{
    r->jd.err = jpeg_std_error(&r->jerr.pub);
    r->jerr.pub.error_exit = jpeg_exit_fn;
    r->jerr.pub.emit_message = jpeg_emit_fn;
    r->jerr.r = r;
    if (setjmp(r->jb)) return fail(err, errlen, r->path, "not a valid JPEG: %s", r->msg);
    jpeg_create_decompress(&r->jd);
    r->jd_made = 1;
    r->jsrc.init_source = jsrc_init;
    r->jsrc.fill_input_buffer = jsrc_fill;
    r->jsrc.skip_input_data = jsrc_skip;
    r->jsrc.resync_to_restart = jpeg_resync_to_restart;
    r->jsrc.term_source = jsrc_term;
    r->jsrc.bytes_in_buffer = 0;
    r->jsrc.next_input_byte = NULL;
    r->jd.src = &r->jsrc;
    jpeg_read_header(&r->jd, TRUE);
    r->w = (int)r->jd.image_width;
    r->h = (int)r->jd.image_height;
    /* a CMYK image's header still reads (its size, for ck.image_info);
     * decoding it is refused at the first step */
    if (r->jd.jpeg_color_space != JCS_CMYK && r->jd.jpeg_color_space != JCS_YCCK) r->jd.out_color_space = JCS_RGB;
    r->jd.dct_method = JDCT_ISLOW;
    r->jd.do_fancy_upsampling = TRUE;
    return 0;
}

static int jpeg_step(ck_image_reader *r, uint8_t *rgb, char *err, size_t errlen)
{
    if (setjmp(r->jb)) return fail(err, errlen, r->path, "corrupt JPEG: %s", r->msg);
    if (!r->started) {
        if (r->jd.jpeg_color_space == JCS_CMYK || r->jd.jpeg_color_space == JCS_YCCK)
            return fail(err, errlen, r->path, "a CMYK JPEG, which is not supported (convert it to RGB)");
        if (r->jd.num_components != 1 && r->jd.num_components != 3)
            return fail(err, errlen, r->path, "a JPEG of %d components, which is not supported", r->jd.num_components);
        r->started = 1;
        jpeg_start_decompress(&r->jd);
        if (r->jd.output_components != 3 || (int)r->jd.output_width != r->w || (int)r->jd.output_height != r->h)
            return fail(err, errlen, r->path, "the JPEG decoder gave no %dx%d RGB", r->w, r->h);
    }
    int rows = STEP_PIXELS / r->w;
    if (rows < 1) rows = 1;
    for (int k = 0; k < rows && r->jd.output_scanline < r->jd.output_height; k++) {
        JSAMPROW row = rgb + (size_t)r->jd.output_scanline * (size_t)r->w * 3;
        jpeg_read_scanlines(&r->jd, &row, 1);
    }
    if (r->jd.output_scanline < r->jd.output_height) return 1;
    jpeg_finish_decompress(&r->jd);
    return 0;
}

/* ---- WebP */

static const char *vp8_status(VP8StatusCode s)
{
    switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_NOT_ENOUGH_DATA: return TRUNCATED;
    default: return "decoding failed";
    }
}

static int webp_open(ck_image_reader *r, char *err, size_t errlen)
{
    WebPBitstreamFeatures f;
    size_t n = r->size < 4096 ? (size_t)r->size : 4096;
    r->off = 0;
    ssize_t k = read_at(r, r->buf, n);
    if (k < 0) return fail(err, errlen, r->path, "read error: %s", strerror(errno));
    VP8StatusCode s = WebPGetFeatures(r->buf, (size_t)k, &f);
    if (s != VP8_STATUS_OK) return fail(err, errlen, r->path, "not a valid WebP: %s", vp8_status(s));
    if (f.has_animation) return fail(err, errlen, r->path, "an animated WebP, which is not supported");
    /* the RIFF header's size: a file cut short of it is refused, even when
     * what is left would decode */
    const uint64_t riff = 8 + ((uint64_t)r->buf[4] | (uint64_t)r->buf[5] << 8 | (uint64_t)r->buf[6] << 16 |
                               (uint64_t)r->buf[7] << 24);
    if (r->size < riff) return fail(err, errlen, r->path, "not a valid WebP: %s", TRUNCATED);
    r->w = f.width;
    r->h = f.height;
    r->off = 0;
    /* the decoder keeps the file's bytes, and a lossless or alpha image whole */
    const int whole = f.format == 2 || f.has_alpha;
    if (r->w > 0 && r->h > 0 &&
        take(r, r->size + (whole ? (uint64_t)r->w * (uint64_t)r->h * 4 : (uint64_t)r->w * 64), "the WebP decoder's memory",
             err, errlen))
        return -1;
    return 0;
}

static int webp_step(ck_image_reader *r, uint8_t *rgb, char *err, size_t errlen)
{
    if (!r->started) {
        r->started = 1;
        WebPInitDecBuffer(&r->wout);
        r->wout.colorspace = MODE_RGB; /* no alpha: it is dropped, the colours kept as stored */
        r->wout.is_external_memory = 1;
        r->wout.width = r->w;
        r->wout.height = r->h;
        r->wout.u.RGBA.rgba = rgb;
        r->wout.u.RGBA.stride = r->w * 3;
        r->wout.u.RGBA.size = (size_t)r->w * (size_t)r->h * 3;
        r->idec = WebPINewDecoder(&r->wout);
        if (!r->idec) return fail(err, errlen, r->path, "out of memory");
    }
    /* about STEP_PIXELS pixels' worth of file: at least one buffer */
    for (int i = 0; i < 4; i++) {
        ssize_t k = read_at(r, r->buf, sizeof r->buf);
        if (k < 0) return fail(err, errlen, r->path, "read error: %s", strerror(errno));
        if (k == 0) return fail(err, errlen, r->path, "corrupt WebP: %s", TRUNCATED);
        VP8StatusCode s = WebPIAppend(r->idec, r->buf, (size_t)k);
        if (s == VP8_STATUS_OK) return 0;
        if (s != VP8_STATUS_SUSPENDED) return fail(err, errlen, r->path, "corrupt WebP: %s", vp8_status(s));
    }
    return 1;
}

/* ---- the reader */

static void reader_free(ck_image_reader *r)
{
    if (!r) return;
    if (r->png) png_destroy_read_struct(&r->png, r->info ? &r->info : NULL, NULL);
    if (r->jd_made) jpeg_destroy_decompress(&r->jd);
    if (r->idec) WebPIDelete(r->idec);
    if (r->fd >= 0) close(r->fd);
    if (r->charged && r->charge.give) r->charge.give(r->charge.ud, r->charged);
    free(r->path);
    free(r);
}

ck_image_reader *ck_image_open_fd(int fd, const char *path, int64_t max_pixels, const ck_image_charge *c, char *err,
                                  size_t errlen)
{
    int e = errno;
    if (err && errlen) err[0] = 0;
    if (!path) path = "(image)";
    if (fd < 0) {
        fail(err, errlen, path, "cannot open: %s", strerror(e));
        errno = e;
        return NULL;
    }
    if (max_pixels <= 0) max_pixels = CK_IMAGE_MAX_PIXELS;
    ck_image_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        close(fd);
        fail(err, errlen, path, "out of memory");
        return NULL;
    }
    r->fd = fd;
    if (c && c->take && c->give) r->charge = *c;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fail(err, errlen, path, "cannot stat: %s", strerror(errno));
        goto bail;
    }
    if (!S_ISREG(st.st_mode)) {
        fail(err, errlen, path, "not a regular file");
        goto bail;
    }
    r->size = (uint64_t)st.st_size;
    unsigned char m[12] = {0};
    ssize_t k = read_at(r, m, sizeof m);
    r->off = 0;
    if (k < 0) {
        fail(err, errlen, path, "read error: %s", strerror(errno));
        goto bail;
    }
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    int rc;
    if (k >= 8 && !memcmp(m, png_sig, 8)) {
        r->format = CK_IMAGE_PNG;
        rc = png_open(r, err, errlen);
    } else if (k >= 3 && m[0] == 0xff && m[1] == 0xd8 && m[2] == 0xff) {
        r->format = CK_IMAGE_JPEG;
        rc = jpeg_open(r, err, errlen);
    } else if (k >= 12 && !memcmp(m, "RIFF", 4) && !memcmp(m + 8, "WEBP", 4)) {
        r->format = CK_IMAGE_WEBP;
        rc = webp_open(r, err, errlen);
    } else {
        fail(err, errlen, path, k == 0 ? "an empty file, not an image" : "not a PNG, JPEG or WebP image");
        goto bail;
    }
    if (rc) goto bail;
    if (r->w <= 0 || r->h <= 0) {
        fail(err, errlen, path, "a %s image of size %dx%d (nothing to decode)", ck_image_format_name(r->format), r->w,
             r->h);
        goto bail;
    }
    if ((int64_t)r->w * r->h > max_pixels) {
        fail(err, errlen, path, "%dx%d = %lld pixels, more than the limit of %lld", r->w, r->h,
             (long long)r->w * r->h, (long long)max_pixels);
        goto bail;
    }
    if (r->format == CK_IMAGE_JPEG) {
        const uint64_t comps = (uint64_t)r->jd.num_components;
        uint64_t need = (uint64_t)r->w * comps * 64;
        /* a progressive JPEG holds all its coefficients until the last scan */
        if (r->jd.progressive_mode) need += (uint64_t)r->w * (uint64_t)r->h * comps * 2 * 2;
        if (take(r, need, "the JPEG decoder's memory", err, errlen)) goto bail;
        r->jd.mem->max_memory_to_use = (long)(need + ((uint64_t)16 << 20));
    }
    return r;
bail:
    reader_free(r);
    return NULL;
}

int ck_image_width(const ck_image_reader *r) { return r->w; }
int ck_image_height(const ck_image_reader *r) { return r->h; }
ck_image_format ck_image_format_of(const ck_image_reader *r) { return r->format; }

int ck_image_text_at(const ck_image_reader *r, int i, const char **key, const char **value)
{
    if (i < 0 || i >= r->ntext) return -1;
    *key = r->text[i].key;
    *value = r->text[i].text ? r->text[i].text : "";
    return 0;
}

int ck_image_read_step(ck_image_reader *r, uint8_t *rgb, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    switch (r->format) {
    case CK_IMAGE_PNG: return png_step(r, rgb, err, errlen);
    case CK_IMAGE_JPEG: return jpeg_step(r, rgb, err, errlen);
    case CK_IMAGE_WEBP: return webp_step(r, rgb, err, errlen);
    }
    return fail(err, errlen, r->path, "no image");
}

void ck_image_close(ck_image_reader *r) { reader_free(r); }

/* ---- resampling */

/* One output pixel along an axis: count source pixels from start, with
 * weights w[0..count). */
typedef struct taps {
    int start, count;
} taps;

/* taps of an axis: n output pixels from offset o of the resized length d,
 * resampled from source length s; k taps of room each. */
static int axis_room(int s, int d)
{
    if (d == s) return 1;
    if (d > s) return 2;
    return (int)ceil((double)s / d) + 1;
}

static void axis_taps(int s, int d, int o, int n, int room, taps *t, float *w)
{
    for (int j = 0; j < n; j++) {
        const int k = o + j;
        float *wj = w + (size_t)j * (size_t)room;
        if (d == s) {
            t[j].start = k;
            t[j].count = 1;
            wj[0] = 1.0f;
        } else if (d > s) {
            double x = (k + 0.5) * (double)s / d - 0.5;
            if (x < 0) x = 0;
            int i0 = (int)floor(x);
            double f = x - i0;
            if (i0 >= s - 1) {
                i0 = s - 1;
                f = 0;
            }
            t[j].start = i0;
            t[j].count = f > 0 ? 2 : 1;
            wj[0] = (float)(1 - f);
            wj[1] = (float)f;
        } else {
            const double scale = (double)s / d, a = k * scale, b = (k + 1) * scale;
            int i0 = (int)floor(a), i1 = (int)ceil(b);
            if (i1 > s) i1 = s;
            int c = 0;
            for (int i = i0; i < i1 && c < room; i++) {
                const double lo = i > a ? i : a, hi = i + 1 < b ? i + 1 : b;
                if (hi - lo <= 1e-12) {
                    if (c == 0) i0 = i + 1;
                    continue;
                }
                wj[c++] = (float)((hi - lo) / scale);
            }
            t[j].start = i0;
            t[j].count = c;
        }
    }
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

typedef struct layout {
    int rw, rh, ow, oh, roomx, roomy;
    size_t tx, wx, ty, wy, tmp, total; /* byte offsets into scratch */
} layout;

static int plan(const ck_image_xform *xf, int w, int h, layout *L, char *err, size_t errlen)
{
    memset(L, 0, sizeof *L);
    if (w <= 0 || h <= 0) return fail(err, errlen, "resize", "an image of %dx%d", w, h);
    L->rw = xf->resize_w ? xf->resize_w : w;
    L->rh = xf->resize_h ? xf->resize_h : h;
    if (xf->resize_w < 0 || xf->resize_h < 0 || L->rw > (1 << 20) || L->rh > (1 << 20) || (int64_t)L->rw * L->rh > CK_IMAGE_MAX_PIXELS)
        return fail(err, errlen, "resize", "a size of %dx%d is out of range", xf->resize_w, xf->resize_h);
    if (xf->crop_h || xf->crop_w) {
        if (xf->crop_top < 0 || xf->crop_left < 0 || xf->crop_h <= 0 || xf->crop_w <= 0 ||
            xf->crop_top > L->rh - xf->crop_h || xf->crop_left > L->rw - xf->crop_w)
            return fail(err, errlen, "crop", "%dx%d at top %d, left %d does not fit in an image of %dx%d (w x h)",
                        xf->crop_w, xf->crop_h, xf->crop_top, xf->crop_left, L->rw, L->rh);
        L->ow = xf->crop_w;
        L->oh = xf->crop_h;
    } else {
        L->ow = L->rw;
        L->oh = L->rh;
    }
    L->roomx = axis_room(w, L->rw);
    L->roomy = axis_room(h, L->rh);
    size_t at = 0;
    L->tx = at;
    at = align16(at + sizeof(taps) * (size_t)L->ow);
    L->wx = at;
    at = align16(at + sizeof(float) * (size_t)L->ow * (size_t)L->roomx);
    L->ty = at;
    at = align16(at + sizeof(taps) * (size_t)L->oh);
    L->wy = at;
    at = align16(at + sizeof(float) * (size_t)L->oh * (size_t)L->roomy);
    L->tmp = at;
    at = align16(at + sizeof(float) * 3 * (size_t)h * (size_t)L->ow);
    L->total = at;
    return 0;
}

int ck_image_xform_plan(const ck_image_xform *xf, int w, int h, int *out_w, int *out_h, size_t *scratch_bytes,
                        char *err, size_t errlen)
{
    layout L;
    if (plan(xf, w, h, &L, err, errlen)) return -1;
    *out_w = L.ow;
    *out_h = L.oh;
    *scratch_bytes = L.total;
    return 0;
}

void ck_image_to_chw(const uint8_t *rgb, int w, int h, const ck_image_xform *xf, void *scratch, float *out,
                     void (*poll)(void *ud), void *ud)
{
    layout L;
    if (plan(xf, w, h, &L, NULL, 0)) return;
    unsigned char *s = scratch;
    taps *tx = (taps *)(s + L.tx), *ty = (taps *)(s + L.ty);
    float *wx = (float *)(s + L.wx), *wy = (float *)(s + L.wy), *tmp = (float *)(s + L.tmp);
    const int cl = xf->crop_h || xf->crop_w ? xf->crop_left : 0, ct = xf->crop_h || xf->crop_w ? xf->crop_top : 0;
    axis_taps(w, L.rw, cl, L.ow, L.roomx, tx, wx);
    axis_taps(h, L.rh, ct, L.oh, L.roomy, ty, wy);
    /* rows the output needs: [y0, y1) */
    int y0 = h, y1 = 0;
    for (int j = 0; j < L.oh; j++) {
        if (ty[j].start < y0) y0 = ty[j].start;
        if (ty[j].start + ty[j].count > y1) y1 = ty[j].start + ty[j].count;
    }
    long long work = 0;
    /* horizontal: tmp[y][x][c] for the output's columns, flipped here */
    for (int y = y0; y < y1; y++) {
        const uint8_t *row = rgb + (size_t)y * (size_t)w * 3;
        float *t = tmp + (size_t)y * (size_t)L.ow * 3;
        for (int x = 0; x < L.ow; x++) {
            const int j = xf->flip ? L.ow - 1 - x : x;
            const uint8_t *p = row + (size_t)tx[j].start * 3;
            const float *wj = wx + (size_t)j * (size_t)L.roomx;
            float r = 0, g = 0, b = 0;
            for (int i = 0; i < tx[j].count; i++) {
                r += wj[i] * p[3 * i];
                g += wj[i] * p[3 * i + 1];
                b += wj[i] * p[3 * i + 2];
            }
            t[3 * x] = r;
            t[3 * x + 1] = g;
            t[3 * x + 2] = b;
        }
        work += (long long)L.ow * L.roomx;
        if (poll && work > 65536) {
            poll(ud);
            work = 0;
        }
    }
    /* vertical, into the planes */
    const size_t plane = (size_t)L.oh * (size_t)L.ow;
    for (int j = 0; j < L.oh; j++) {
        const float *wj = wy + (size_t)j * (size_t)L.roomy;
        for (int x = 0; x < L.ow; x++) {
            float r = 0, g = 0, b = 0;
            for (int i = 0; i < ty[j].count; i++) {
                const float *p = tmp + ((size_t)(ty[j].start + i) * (size_t)L.ow + (size_t)x) * 3;
                r += wj[i] * p[0];
                g += wj[i] * p[1];
                b += wj[i] * p[2];
            }
            const size_t o = (size_t)j * (size_t)L.ow + (size_t)x;
            out[o] = r / 127.5f - 1.0f;
            out[plane + o] = g / 127.5f - 1.0f;
            out[2 * plane + o] = b / 127.5f - 1.0f;
        }
        work += (long long)L.ow * L.roomy;
        if (poll && work > 65536) {
            poll(ud);
            work = 0;
        }
    }
}

/* ---- PNG writing */

struct png_wctx {
    jmp_buf jb;
    char msg[300];
};

static void pngw_err_fn(png_structp png, png_const_charp msg)
{
    struct png_wctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    longjmp(c->jb, 1);
}

static int key_ok(const char *k)
{
    const size_t n = strlen(k);
    if (n < 1 || n > 79 || k[0] == ' ' || k[n - 1] == ' ') return 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < 32 || k[i] > 126) return 0;
        if (k[i] == ' ' && k[i + 1] == ' ') return 0;
    }
    return 1;
}

static int ascii(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80) return 0;
    return 1;
}

/* the part of a write that libpng may leave by longjmp: nothing allocated
 * here but what png_destroy_write_struct frees */
static int png_write_file(FILE *fp, int w, int h, const uint8_t *rgb, int ntext, const char *const *keys,
                          const char *const *values, png_textp text, char *msg, size_t msglen)
{
    struct png_wctx c;
    c.msg[0] = 0;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &c, pngw_err_fn, pngw_warn_fn);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, info ? &info : NULL);
        snprintf(msg, msglen, "out of memory");
        return -1;
    }
    if (setjmp(c.jb)) {
        png_destroy_write_struct(&png, &info);
        snprintf(msg, msglen, "%s", c.msg);
        return -1;
    }
    png_init_io(png, fp);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    for (int i = 0; i < ntext; i++) {
        memset(&text[i], 0, sizeof text[i]);
        text[i].key = (char *)keys[i];
        text[i].text = (char *)values[i];
        if (ascii(values[i])) {
            text[i].compression = PNG_TEXT_COMPRESSION_NONE;
            text[i].text_length = strlen(values[i]);
        } else {
            text[i].compression = PNG_ITXT_COMPRESSION_NONE;
            text[i].itxt_length = strlen(values[i]);
            text[i].lang = (char *)"";
            text[i].lang_key = (char *)"";
        }
    }
    if (ntext) png_set_text(png, info, text, ntext);
    png_write_info(png, info);
    for (int y = 0; y < h; y++) png_write_row(png, (png_const_bytep)(rgb + (size_t)y * (size_t)w * 3));
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    return 0;
}

int ck_image_write_png_at(int dirfd, const char *name, const char *path, int w, int h, const uint8_t *rgb, int ntext,
                          const char *const *keys, const char *const *values, char *err, size_t errlen)
{
    const int open_errno = errno;
    if (err && errlen) err[0] = 0;
    if (!path) path = name ? name : "(png)";
    if (w <= 0 || h <= 0 || w > 0x7fffffff / 3) return fail(err, errlen, path, "cannot write a PNG of %dx%d", w, h);
    for (int i = 0; i < ntext; i++) {
        if (!key_ok(keys[i]))
            return fail(err, errlen, path,
                        "text key '%.80s' is not 1 to 79 printable ASCII characters without leading, trailing or "
                        "double spaces",
                        keys[i]);
        for (int j = 0; j < i; j++)
            if (!strcmp(keys[i], keys[j])) return fail(err, errlen, path, "text key '%s' given twice", keys[i]);
    }
    if (dirfd < 0) return fail(err, errlen, path, "cannot open its directory: %s", strerror(open_errno));
    png_textp text = calloc((size_t)(ntext ? ntext : 1), sizeof *text);
    if (!text) return fail(err, errlen, path, "out of memory");
    ck_atomic_file af;
    if (ck_atomic_begin(&af, dirfd, open_errno, name, path, err, errlen)) {
        free(text);
        return -1;
    }
    /* libpng writes through stdio on a copy of the descriptor; the commit
     * fsyncs and closes the temp file's own */
    char msg[320] = "";
    const int dup_fd = dup(af.fd);
    FILE *fp = dup_fd >= 0 ? fdopen(dup_fd, "wb") : NULL;
    if (!fp) {
        fail(err, errlen, path, "cannot write temp file %s: %s", af.tmp, strerror(errno));
        if (dup_fd >= 0) close(dup_fd);
        ck_atomic_abort(&af);
        free(text);
        return -1;
    }
    const int wrote = png_write_file(fp, w, h, rgb, ntext, keys, values, text, msg, sizeof msg) == 0 &&
                      fflush(fp) == 0 && !ferror(fp);
    const int e = errno;
    const int closed = fclose(fp) == 0;
    free(text);
    if (!wrote || !closed) {
        fail(err, errlen, path, "cannot write: %s", msg[0] ? msg : strerror(e));
        ck_atomic_abort(&af);
        return -1;
    }
    return ck_atomic_commit(&af, path, err, errlen);
}
