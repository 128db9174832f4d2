/* PNG, JPEG and WebP decoding to 8-bit RGB through Debian's libpng,
 * libjpeg-turbo and libwebp, read from a descriptor in bounded steps that
 * the caller polls and charges; the resampling to a training array; PNG
 * writing with text chunks, atomically. See image.h for what a decode keeps
 * and drops. */
#define _GNU_SOURCE
#include "formats/image.h"
#include "util/atomic.h"
#include "util/budget.h"
#include "util/text.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

#define IO_BUF 65536
#define STEP_PIXELS 65536
#define STEP_BLOCKS 4096
/* work units between two polls when nothing forces one */
#define POLL_EVERY 4096
/* a WebP file is read this much a step before its decode starts */
#define WEBP_READ_STEP ((size_t)1 << 20)
/* how long a step waits for a WebP decode before it returns to be polled */
#define WEBP_WAIT_MS 20
/* the largest chunk libpng may allocate for (a text chunk, an ICC profile,
 * once inflated): libpng's own default, set whatever the build says */
#define PNG_CHUNK_MAX 8000000
/* the most text chunks a PNG may hold before its image data (as many as
 * ck_image_write_png_at writes): libpng keeps them in an array it grows 8 at
 * a time, and drops those past its chunk cache without an error */
#define PNG_MAX_TEXT 1024

struct jpeg_err {
    struct jpeg_error_mgr pub;
    ck_image_reader *r;
};

typedef struct webp_job webp_job;

struct ck_image_reader {
    int fd;
    char *path;
    ck_image_format format;
    int w, h;
    ck_image_charge charge;
    size_t charged;
    uint64_t size; /* the file's bytes */
    /* the source: buf holds the file's bytes [off - len, off), pos is the
     * next one to give */
    uint64_t off;
    size_t pos, len;
    unsigned char buf[IO_BUF];
    long long work; /* units done since the last poll */
    int stopped;    /* poll asked to stop */
    int failed;     /* a step failed: the library's state is gone */
    int done;       /* rgb holds the whole image */
    uint8_t *rgb;   /* the decoded image, made at the first step */
    char msg[400];     /* a library's error, for the longjmp back */
    char warn[200];    /* libpng's last warning, which often says why its error came */
    char mem_err[300]; /* a charge refused to libpng's allocator */
    int cache_full;    /* libpng dropped a text chunk past PNG_MAX_TEXT */
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
    int jmulti;  /* several scans: read into the coefficients first (buffered-image mode) */
    int joutput; /* the output pass has begun */
    /* WebP */
    int webp_whole;      /* the decoder holds the whole image (lossless, alpha) */
    uint64_t riff;       /* the file's bytes that the RIFF header covers */
    unsigned char *wdata;
    uint64_t wgot;
    webp_job *job;
};

const char *ck_image_format_name(ck_image_format f)
{
    return f == CK_IMAGE_PNG ? "png" : f == CK_IMAGE_JPEG ? "jpeg" : f == CK_IMAGE_WEBP ? "webp" : "?";
}

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ck_verrf_at(err, errlen, path ? path : "(image)", fmt, ap);
    va_end(ap);
    return -1;
}

static const char *TRUNCATED = "the file ends before the image does (truncated)";
static const char *STOPPED = "stopped before the image was read (the caller asked)";

static int stop_fail(ck_image_reader *r, char *err, size_t errlen)
{
    return fail(err, errlen, r->path, "%s", STOPPED);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* Reports work to the caller's poll once POLL_EVERY units have gathered, or
 * at once with force; 1 once it has asked to stop. */
static int tick(ck_image_reader *r, long long units, int force)
{
    if (r->stopped) return 1;
    r->work += units;
    if (!r->charge.poll || (!force && r->work < POLL_EVERY)) return 0;
    const long long w = r->work;
    r->work = 0;
    if (r->charge.poll(r->charge.poll_ud, w)) r->stopped = 1;
    return r->stopped;
}

/* Up to n bytes of fd at off, past EINTR; the count, or -1 with errno. */
static ssize_t pread_full(int fd, void *dst, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, (char *)dst + got, n - got, (off_t)(off + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* The file's next n bytes through the buffer, which is refilled IO_BUF bytes
 * at a time, each refill polled: libpng asks for a few bytes at a time, and
 * a file of millions of empty chunks is millions of asks. The count (short
 * at the end of the file), -1 with errno, or -2 when poll asked to stop. */
static ssize_t src_read(ck_image_reader *r, void *dst, size_t n)
{
    size_t got = 0;
    while (got < n) {
        if (r->pos == r->len) {
            if (tick(r, IO_BUF / 16, 1)) return -2;
            ssize_t k = pread_full(r->fd, r->buf, IO_BUF, r->off);
            if (k < 0) return -1;
            r->off += (uint64_t)k;
            r->pos = 0;
            r->len = (size_t)k;
            if (k == 0) break;
        }
        size_t c = r->len - r->pos < n - got ? r->len - r->pos : n - got;
        memcpy((char *)dst + got, r->buf + r->pos, c);
        r->pos += c;
        got += c;
    }
    return (ssize_t)got;
}

/* skips n bytes of the source */
static void src_skip(ck_image_reader *r, uint64_t n)
{
    if (n <= r->len - r->pos) {
        r->pos += (size_t)n;
        return;
    }
    r->off = r->off - (r->len - r->pos) + n;
    r->pos = r->len = 0;
}

/* charges n bytes for what, named with its size in a refusal */
static int take(ck_image_reader *r, uint64_t n, const char *what, char *err, size_t errlen)
{
    if (!r->charge.take) return 0;
    char msg[300], named[240], size[64];
    ck_mem_text(n > SIZE_MAX ? SIZE_MAX : (size_t)n, size, sizeof size);
    snprintf(named, sizeof named, "%s (%s)", what, size);
    if (n > SIZE_MAX || r->charge.take(r->charge.ud, (size_t)n, named, msg, sizeof msg))
        return fail(err, errlen, r->path, "%s", n > SIZE_MAX ? "decoder memory too large" : msg);
    r->charged += (size_t)n;
    return 0;
}

static void give(ck_image_reader *r, size_t n)
{
    if (!r->charge.give || !n) return;
    n = n < r->charged ? n : r->charged;
    r->charge.give(r->charge.ud, n);
    r->charged -= n;
}

/* A declared size against the caps, before a library allocates for it. */
static int size_ok(ck_image_reader *r, uint64_t w, uint64_t h, int64_t max_pixels, char *err, size_t errlen)
{
    const char *f = ck_image_format_name(r->format);
    if (w == 0 || h == 0)
        return fail(err, errlen, r->path, "a %s image of size %llux%llu (nothing to decode)", f,
                    (unsigned long long)w, (unsigned long long)h);
    if (w > CK_IMAGE_MAX_WIDTH)
        return fail(err, errlen, r->path, "a %s image %llu pixels wide, more than the limit of %d", f,
                    (unsigned long long)w, CK_IMAGE_MAX_WIDTH);
    if (h > (uint64_t)INT64_MAX / w || (int64_t)(w * h) > max_pixels)
        return fail(err, errlen, r->path, "%llux%llu = %llu pixels, more than the limit of %lld", (unsigned long long)w,
                    (unsigned long long)h, (unsigned long long)(w * h), (long long)max_pixels);
    r->w = (int)w;
    r->h = (int)h;
    return 0;
}

/* The decoded pixels, charged and made by a format's first step after its
 * decoder's own charge, so that a refusal allocates nothing. */
static int make_pixels(ck_image_reader *r, char *err, size_t errlen)
{
    char what[96];
    snprintf(what, sizeof what, "the decoded pixels of %dx%d", r->w, r->h);
    if (take(r, (uint64_t)r->w * (uint64_t)r->h * 3, what, err, errlen)) return -1;
    if (!(r->rgb = malloc((size_t)r->w * (size_t)r->h * 3)))
        return fail(err, errlen, r->path, "out of memory for %s", what);
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
    if (!r) return;
    snprintf(r->warn, sizeof r->warn, "%s", msg);
    if (strstr(msg, "no space in chunk cache")) r->cache_full = 1;
}

static void pngw_warn_fn(png_structp png, png_const_charp msg)
{
    (void)png;
    (void)msg;
}

static void png_read_fn(png_structp png, png_bytep dst, size_t n)
{
    ck_image_reader *r = png_get_io_ptr(png);
    ssize_t k = src_read(r, dst, n);
    if (k == -2 || tick(r, 1, 0)) {
        snprintf(r->msg, sizeof r->msg, "%s", STOPPED);
        longjmp(r->jb, 1);
    }
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

/* why libpng stopped: the caller, a refused charge, or the file */
static int png_failure(ck_image_reader *r, const char *what, char *err, size_t errlen)
{
    if (r->stopped) return stop_fail(r, err, errlen);
    if (r->mem_err[0]) return fail(err, errlen, r->path, "%s", r->mem_err);
    return fail(err, errlen, r->path, "%s: %s%s%s%s", what, r->msg, r->warn[0] ? " (" : "", r->warn,
                r->warn[0] ? ")" : "");
}

static int png_open(ck_image_reader *r, int64_t max_pixels, char *err, size_t errlen)
{
    /* IHDR, read here before libpng sees the file: libpng sizes its row
     * buffers from it before any limit of ours could look */
    unsigned char h[33];
    ssize_t k = pread_full(r->fd, h, sizeof h, 0);
    if (k < 0) return fail(err, errlen, r->path, "read error: %s", strerror(errno));
    if (k < (ssize_t)sizeof h) return fail(err, errlen, r->path, "not a valid PNG: %s", TRUNCATED);
    if (be32(h + 8) != 13 || memcmp(h + 12, "IHDR", 4))
        return fail(err, errlen, r->path, "not a valid PNG: its first chunk is not a 13-byte IHDR");
    if (size_ok(r, be32(h + 16), be32(h + 20), max_pixels, err, errlen)) return -1;
    r->png = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, r, png_err_fn, png_warn_fn, r, png_malloc_fn,
                                      png_free_fn);
    if (!r->png) return fail(err, errlen, r->path, "out of memory");
    r->info = png_create_info_struct(r->png);
    if (!r->info) return fail(err, errlen, r->path, "out of memory");
    if (setjmp(r->jb)) return png_failure(r, "not a valid PNG", err, errlen);
    png_set_read_fn(r->png, r, png_read_fn);
    png_set_user_limits(r->png, CK_IMAGE_MAX_WIDTH, 0x7fffffff);
    png_set_chunk_malloc_max(r->png, PNG_CHUNK_MAX);
    /* libpng stores up to its cache less 2 and warns at the next */
    png_set_chunk_cache_max(r->png, PNG_MAX_TEXT + 2);
    png_read_info(r->png, r->info);
    if (r->cache_full)
        return fail(err, errlen, r->path, "a PNG of more than %d text chunks, which is not supported", PNG_MAX_TEXT);
    /* libpng skips a text chunk it could not get memory for: refused here,
     * rather than read without it */
    if (r->mem_err[0]) return fail(err, errlen, r->path, "%s", r->mem_err);
    png_uint_32 w, hh;
    int depth, color, interlace;
    png_get_IHDR(r->png, r->info, &w, &hh, &depth, &color, &interlace, NULL, NULL);
    if ((int)w != r->w || (int)hh != r->h) return fail(err, errlen, r->path, "not a valid PNG: its IHDR changed");
    if (png_get_text(r->png, r->info, &r->text, &r->ntext) <= 0) r->ntext = 0;
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r->png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(r->png);
    if (depth == 16) png_set_strip_16(r->png);
    /* the alpha channel, and a palette's or gray image's transparency (never
     * expanded to one), are dropped as Pillow's convert("RGB") drops them */
    png_set_strip_alpha(r->png);
    if (!(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(r->png);
    return 0;
}

static int png_step(ck_image_reader *r, char *err, size_t errlen)
{
    if (setjmp(r->jb)) return png_failure(r, "corrupt PNG", err, errlen);
    if (!r->started) {
        /* the row buffers, charged through the allocator as libpng makes them */
        r->started = 1;
        if (make_pixels(r, err, errlen)) return -1;
        r->passes = png_set_interlace_handling(r->png);
        png_read_update_info(r->png, r->info);
        if (png_get_rowbytes(r->png, r->info) != (size_t)r->w * 3 || png_get_bit_depth(r->png, r->info) != 8)
            return fail(err, errlen, r->path, "PNG of colour type %d, depth %d gives no 8-bit RGB",
                        png_get_color_type(r->png, r->info), png_get_bit_depth(r->png, r->info));
    }
    int rows = STEP_PIXELS / r->w;
    if (rows < 1) rows = 1;
    int k = 0;
    for (; k < rows && r->pass < r->passes; k++) {
        png_read_row(r->png, r->rgb + (size_t)r->row * (size_t)r->w * 3, NULL);
        if (++r->row == r->h) {
            r->row = 0;
            r->pass++;
        }
    }
    if (tick(r, (long long)k * r->w / 16, 1)) return stop_fail(r, err, errlen);
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

/* libjpeg's input, IO_BUF bytes a call, each call polled: markers are read
 * in loops of libjpeg's own (a file of a million comments is one call) */
static boolean jsrc_fill(j_decompress_ptr d)
{
    ck_image_reader *r = ((struct jpeg_err *)d->err)->r;
    if (tick(r, IO_BUF / 16, 1)) {
        snprintf(r->msg, sizeof r->msg, "%s", STOPPED);
        longjmp(r->jb, 1);
    }
    ssize_t k = pread_full(r->fd, r->buf, sizeof r->buf, r->off);
    if (k < 0) snprintf(r->msg, sizeof r->msg, "read error: %s", strerror(errno));
    if (k == 0) snprintf(r->msg, sizeof r->msg, "%s", TRUNCATED);
    if (k <= 0) longjmp(r->jb, 1);
    r->off += (uint64_t)k;
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

static int jpeg_failure(ck_image_reader *r, const char *what, char *err, size_t errlen)
{
    if (r->stopped) return stop_fail(r, err, errlen);
    return fail(err, errlen, r->path, "%s: %s", what, r->msg);
}

static int jpeg_open(ck_image_reader *r, int64_t max_pixels, char *err, size_t errlen)
{
    r->jd.err = jpeg_std_error(&r->jerr.pub);
    r->jerr.pub.error_exit = jpeg_exit_fn;
    r->jerr.pub.emit_message = jpeg_emit_fn;
    r->jerr.r = r;
    if (setjmp(r->jb)) return jpeg_failure(r, "not a valid JPEG", err, errlen);
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
    /* the header up to the first scan: small tables only, nothing sized by
     * the image */
    jpeg_read_header(&r->jd, TRUE);
    if (size_ok(r, r->jd.image_width, r->jd.image_height, max_pixels, err, errlen)) return -1;
    /* a CMYK image's header still reads (its size, for ck.image_info);
     * decoding it is refused at the first step */
    if (r->jd.jpeg_color_space != JCS_CMYK && r->jd.jpeg_color_space != JCS_YCCK) r->jd.out_color_space = JCS_RGB;
    r->jd.dct_method = JDCT_ISLOW;
    r->jd.do_fancy_upsampling = TRUE;
    return 0;
}

/* What libjpeg allocates for a decode, from the header: about 64 rows of
 * samples, and for a file of several scans every coefficient of the image
 * (a block of 64 per 8x8 pixels of each component, in whole MCUs), as
 * libjpeg's realize_virt_arrays sizes them. */
static uint64_t jpeg_need(const struct jpeg_decompress_struct *d, int multi)
{
    uint64_t need = (uint64_t)d->image_width * (uint64_t)d->num_components * 64;
    for (int c = 0; multi && c < d->num_components; c++) {
        const jpeg_component_info *ci = &d->comp_info[c];
        const uint64_t hs = (uint64_t)ci->h_samp_factor, vs = (uint64_t)ci->v_samp_factor;
        const uint64_t bw = (ci->width_in_blocks + hs - 1) / hs * hs, bh = (ci->height_in_blocks + vs - 1) / vs * vs;
        need += bw * bh * sizeof(JBLOCK);
    }
    return need;
}

/* the blocks one iMCU row of the current scan holds */
static long long jpeg_row_blocks(const struct jpeg_decompress_struct *d)
{
    const long long v = d->comps_in_scan == 1 ? d->cur_comp_info[0]->v_samp_factor : 1;
    return (long long)d->MCUs_per_row * d->blocks_in_MCU * v;
}

static int jpeg_step(ck_image_reader *r, char *err, size_t errlen)
{
    if (setjmp(r->jb)) return jpeg_failure(r, "corrupt JPEG", err, errlen);
    if (!r->started) {
        if (r->jd.jpeg_color_space == JCS_CMYK || r->jd.jpeg_color_space == JCS_YCCK)
            return fail(err, errlen, r->path, "a CMYK JPEG, which is not supported (convert it to RGB)");
        if (r->jd.num_components != 1 && r->jd.num_components != 3)
            return fail(err, errlen, r->path, "a JPEG of %d components, which is not supported", r->jd.num_components);
        r->started = 1;
        /* A file of several scans (progressive, or one scan per component)
         * is read in buffered-image mode: its scans go into the coefficients
         * a piece at a time (jpeg_consume_input, one iMCU row a call, polled
         * between), and the image is output once from the last of them, as
         * jpeg_start_decompress would have, but in steps. */
        r->jmulti = jpeg_has_multiple_scans(&r->jd);
        const uint64_t need = jpeg_need(&r->jd, r->jmulti);
        if (take(r, need, "the JPEG decoder's memory", err, errlen) || make_pixels(r, err, errlen)) return -1;
        /* libjpeg has no backing store here: the coefficients must fit in
         * memory, and this is what it may take for them */
        r->jd.mem->max_memory_to_use = (long)(need + ((uint64_t)16 << 20));
        r->jd.buffered_image = r->jmulti ? TRUE : FALSE;
        jpeg_start_decompress(&r->jd);
        if (r->jd.output_components != 3 || (int)r->jd.output_width != r->w || (int)r->jd.output_height != r->h)
            return fail(err, errlen, r->path, "the JPEG decoder gave no %dx%d RGB", r->w, r->h);
        r->joutput = !r->jmulti;
    }
    if (!r->joutput) {
        long long blocks = 0;
        while (blocks < STEP_BLOCKS) {
            const int rc = jpeg_consume_input(&r->jd);
            if (rc == JPEG_REACHED_EOI) {
                r->joutput = 1;
                jpeg_start_output(&r->jd, r->jd.input_scan_number);
                break;
            }
            if (rc == JPEG_SUSPENDED) /* the source never suspends: it fails instead */
                return fail(err, errlen, r->path, "corrupt JPEG: the decoder stopped reading");
            if (rc == JPEG_REACHED_SOS && r->jd.input_scan_number > CK_IMAGE_MAX_SCANS)
                return fail(err, errlen, r->path, "a JPEG of more than %d scans, which is not supported (a "
                            "progressive file has about ten)", CK_IMAGE_MAX_SCANS);
            blocks += rc == JPEG_ROW_COMPLETED || rc == JPEG_SCAN_COMPLETED ? jpeg_row_blocks(&r->jd) : 1;
        }
        if (tick(r, blocks, 1)) return stop_fail(r, err, errlen);
        return 1;
    }
    int rows = STEP_PIXELS / r->w;
    if (rows < 1) rows = 1;
    int k = 0;
    for (; k < rows && r->jd.output_scanline < r->jd.output_height; k++) {
        JSAMPROW row = r->rgb + (size_t)r->jd.output_scanline * (size_t)r->w * 3;
        jpeg_read_scanlines(&r->jd, &row, 1);
    }
    if (tick(r, (long long)k * r->w / 16, 1)) return stop_fail(r, err, errlen);
    if (r->jd.output_scanline < r->jd.output_height) return 1;
    if (r->jmulti) jpeg_finish_output(&r->jd);
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

/* A decode on a thread of its own: libwebp decodes a whole image in one
 * call that nothing can stop (a 28-byte lossless file of 16384x16384 takes
 * seconds), so the reader's steps wait for it a slice at a time and poll
 * between. A reader closed before the decode ends leaves the job to the
 * thread, which frees it when done. */
struct webp_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, orphaned;
    VP8StatusCode status;
    unsigned char *data;
    size_t n;
    uint8_t *rgb;
    int w, h;
};

static pthread_mutex_t abandoned_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t abandoned_cv = PTHREAD_COND_INITIALIZER;
static int abandoned; /* jobs left to their threads and still running */

static void job_free(webp_job *j)
{
    if (!j) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->data);
    free(j->rgb);
    free(j);
}

static void *webp_work(void *arg)
{
    webp_job *j = arg;
    WebPDecoderConfig cfg;
    VP8StatusCode s = VP8_STATUS_INVALID_PARAM;
    if (WebPInitDecoderConfig(&cfg)) {
        cfg.output.colorspace = MODE_RGB; /* no alpha: it is dropped, the colours kept as stored */
        cfg.output.is_external_memory = 1;
        cfg.output.width = j->w;
        cfg.output.height = j->h;
        cfg.output.u.RGBA.rgba = j->rgb;
        cfg.output.u.RGBA.stride = j->w * 3;
        cfg.output.u.RGBA.size = (size_t)j->w * (size_t)j->h * 3;
        s = WebPDecode(j->data, j->n, &cfg);
        WebPFreeDecBuffer(&cfg.output);
    }
    pthread_mutex_lock(&j->mu);
    j->status = s;
    j->done = 1;
    const int orphan = j->orphaned;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (orphan) {
        job_free(j);
        pthread_mutex_lock(&abandoned_mu);
        abandoned--;
        pthread_cond_broadcast(&abandoned_cv);
        pthread_mutex_unlock(&abandoned_mu);
    }
    return NULL;
}

void ck_image_wait_abandoned(void)
{
    pthread_mutex_lock(&abandoned_mu);
    while (abandoned > 0) pthread_cond_wait(&abandoned_cv, &abandoned_mu);
    pthread_mutex_unlock(&abandoned_mu);
}

/* reads n bytes of a chunk's payload for the walk */
static int webp_read(ck_image_reader *r, void *dst, size_t n, char *err, size_t errlen)
{
    ssize_t k = src_read(r, dst, n);
    if (k == -2) return stop_fail(r, err, errlen);
    if (k < 0) return fail(err, errlen, r->path, "read error: %s", strerror(errno));
    if ((size_t)k < n) return fail(err, errlen, r->path, "not a valid WebP: %s", TRUNCATED);
    return 0;
}

/* The RIFF container walked here, chunk by chunk, before libwebp sees the
 * file: every chunk inside the RIFF data, the first one VP8, VP8L or VP8X,
 * no animation, and the size taken from the image chunk's own header (a
 * VP8X canvas must agree with it), so the caps judge the size the decoder
 * will allocate for. */
static int webp_open(ck_image_reader *r, int64_t max_pixels, char *err, size_t errlen)
{
    unsigned char h[12];
    if (webp_read(r, h, 12, err, errlen)) return -1;
    r->riff = 8 + (uint64_t)le32(h + 4);
    /* a file cut short of its RIFF size is refused, even when what is left
     * would decode */
    if (r->size < r->riff) return fail(err, errlen, r->path, "not a valid WebP: %s", TRUNCATED);
    uint64_t at = 12, cw = 0, ch = 0;
    int vp8x = 0, flags = 0;
    for (;;) {
        if (at + 8 > r->riff) return fail(err, errlen, r->path, "not a valid WebP: no VP8 or VP8L image chunk");
        unsigned char c[8];
        if (webp_read(r, c, 8, err, errlen)) return -1;
        const uint64_t n = le32(c + 4), next = at + 8 + n + (n & 1);
        if (at + 8 + n > r->riff)
            return fail(err, errlen, r->path, "not a valid WebP: its '%.4s' chunk of %llu bytes runs past the end of "
                        "the RIFF data", (const char *)c, (unsigned long long)n);
        const int image = !memcmp(c, "VP8 ", 4) || !memcmp(c, "VP8L", 4);
        if (at == 12 && !image && memcmp(c, "VP8X", 4))
            return fail(err, errlen, r->path, "not a valid WebP: its first chunk is '%.4s', not VP8, VP8L or VP8X",
                        (const char *)c);
        if (!memcmp(c, "ANIM", 4) || !memcmp(c, "ANMF", 4))
            return fail(err, errlen, r->path, "an animated WebP, which is not supported");
        if (!memcmp(c, "VP8X", 4)) {
            unsigned char x[10];
            if (at != 12 || n < 10) return fail(err, errlen, r->path, "not a valid WebP: a misplaced VP8X chunk");
            if (webp_read(r, x, 10, err, errlen)) return -1;
            flags = x[0];
            if (flags & 0x02) return fail(err, errlen, r->path, "an animated WebP, which is not supported");
            cw = 1 + ((uint64_t)x[4] | (uint64_t)x[5] << 8 | (uint64_t)x[6] << 16);
            ch = 1 + ((uint64_t)x[7] | (uint64_t)x[8] << 8 | (uint64_t)x[9] << 16);
            vp8x = 1;
            src_skip(r, next - at - 18);
        } else if (image) {
            unsigned char v[10];
            const int lossless = c[3] == 'L';
            if (n < (lossless ? 5u : 10u))
                return fail(err, errlen, r->path, "not a valid WebP: its image chunk is too short");
            if (webp_read(r, v, lossless ? 5 : 10, err, errlen)) return -1;
            uint64_t w, hh;
            int alpha;
            if (lossless) {
                const uint32_t bits = le32(v + 1);
                if (v[0] != 0x2f || bits >> 29)
                    return fail(err, errlen, r->path, "not a valid WebP: a bad lossless header");
                w = 1 + (bits & 0x3fff);
                hh = 1 + ((bits >> 14) & 0x3fff);
                alpha = vp8x ? flags & 0x10 : (int)(bits >> 28 & 1);
            } else {
                if ((v[0] & 1) || v[3] != 0x9d || v[4] != 0x01 || v[5] != 0x2a)
                    return fail(err, errlen, r->path, "not a valid WebP: a bad lossy header (not a key frame)");
                w = ((uint64_t)v[6] | (uint64_t)v[7] << 8) & 0x3fff;
                hh = ((uint64_t)v[8] | (uint64_t)v[9] << 8) & 0x3fff;
                alpha = flags & 0x10;
            }
            if (vp8x && (w != cw || hh != ch))
                return fail(err, errlen, r->path, "not a valid WebP: its canvas of %llux%llu is not its image's "
                            "%llux%llu", (unsigned long long)cw, (unsigned long long)ch, (unsigned long long)w,
                            (unsigned long long)hh);
            r->webp_whole = lossless || alpha;
            return size_ok(r, w, hh, max_pixels, err, errlen);
        } else {
            src_skip(r, next - at - 8);
        }
        at = next;
        if (tick(r, 1, 0)) return stop_fail(r, err, errlen);
    }
}

static int webp_step(ck_image_reader *r, char *err, size_t errlen)
{
    if (!r->started) {
        /* the decoder keeps the file's bytes, and a lossless or alpha image whole */
        const uint64_t wh = (uint64_t)r->w * (uint64_t)r->h;
        if (take(r, r->riff + (r->webp_whole ? wh * 4 : (uint64_t)r->w * 64), "the WebP decoder's memory", err, errlen) ||
            make_pixels(r, err, errlen))
            return -1;
        r->started = 1;
        if (!(r->wdata = malloc((size_t)r->riff))) return fail(err, errlen, r->path, "out of memory");
        r->wgot = 0;
    }
    if (!r->job) {
        for (size_t step = 0; step < WEBP_READ_STEP && r->wgot < r->riff; step += IO_BUF) {
            if (tick(r, IO_BUF / 16, 1)) return stop_fail(r, err, errlen);
            const size_t n = r->riff - r->wgot < IO_BUF ? (size_t)(r->riff - r->wgot) : IO_BUF;
            ssize_t k = pread_full(r->fd, r->wdata + r->wgot, n, r->wgot);
            if (k < 0) return fail(err, errlen, r->path, "read error: %s", strerror(errno));
            if ((size_t)k < n) return fail(err, errlen, r->path, "corrupt WebP: %s", TRUNCATED);
            r->wgot += (uint64_t)k;
        }
        if (r->wgot < r->riff) return 1;
        /* the whole decode, charged as it starts: it is one call */
        if (tick(r, (long long)r->w * r->h / 16, 1)) return stop_fail(r, err, errlen);
        webp_job *j = calloc(1, sizeof *j);
        if (!j) return fail(err, errlen, r->path, "out of memory");
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_mutex_init(&j->mu, NULL);
        pthread_cond_init(&j->cv, &ca);
        pthread_condattr_destroy(&ca);
        j->data = r->wdata;
        j->n = (size_t)r->riff;
        j->rgb = r->rgb;
        j->w = r->w;
        j->h = r->h;
        pthread_attr_t ta;
        pthread_t th;
        pthread_attr_init(&ta);
        pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
        const int e = pthread_create(&th, &ta, webp_work, j);
        pthread_attr_destroy(&ta);
        if (e) {
            j->data = NULL;
            j->rgb = NULL;
            job_free(j);
            return fail(err, errlen, r->path, "cannot start the WebP decoder's thread: %s", strerror(e));
        }
        r->wdata = NULL;
        r->rgb = NULL;
        r->job = j;
        return 1;
    }
    webp_job *j = r->job;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += WEBP_WAIT_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&j->mu);
    while (!j->done && pthread_cond_timedwait(&j->cv, &j->mu, &until) != ETIMEDOUT) {
    }
    const int done = j->done;
    pthread_mutex_unlock(&j->mu);
    if (!done) return tick(r, 0, 1) ? stop_fail(r, err, errlen) : 1;
    r->rgb = j->rgb;
    j->rgb = NULL;
    const VP8StatusCode s = j->status;
    job_free(j);
    r->job = NULL;
    if (s != VP8_STATUS_OK) return fail(err, errlen, r->path, "corrupt WebP: %s", vp8_status(s));
    return 0;
}

/* ---- the reader */

static void reader_free(ck_image_reader *r)
{
    if (!r) return;
    if (r->png) png_destroy_read_struct(&r->png, r->info ? &r->info : NULL, NULL);
    if (r->jd_made) jpeg_destroy_decompress(&r->jd);
    if (r->job) {
        webp_job *j = r->job;
        pthread_mutex_lock(&j->mu);
        if (j->done) {
            pthread_mutex_unlock(&j->mu);
            job_free(j);
        } else {
            /* counted before the thread can see it, so that its end is too */
            pthread_mutex_lock(&abandoned_mu);
            abandoned++;
            pthread_mutex_unlock(&abandoned_mu);
            j->orphaned = 1;
            pthread_mutex_unlock(&j->mu);
        }
    }
    if (r->fd >= 0) close(r->fd);
    give(r, r->charged);
    free(r->wdata);
    free(r->rgb);
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
    if (c && c->take && c->give) {
        r->charge.take = c->take;
        r->charge.give = c->give;
        r->charge.ud = c->ud;
    }
    if (c && c->poll) {
        r->charge.poll = c->poll;
        r->charge.poll_ud = c->poll_ud;
    }
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
    ssize_t k = pread_full(fd, m, sizeof m, 0);
    if (k < 0) {
        fail(err, errlen, path, "read error: %s", strerror(errno));
        goto bail;
    }
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    int rc;
    if (k >= 8 && !memcmp(m, png_sig, 8)) {
        r->format = CK_IMAGE_PNG;
        rc = png_open(r, max_pixels, err, errlen);
    } else if (k >= 3 && m[0] == 0xff && m[1] == 0xd8 && m[2] == 0xff) {
        r->format = CK_IMAGE_JPEG;
        rc = jpeg_open(r, max_pixels, err, errlen);
    } else if (k >= 12 && !memcmp(m, "RIFF", 4) && !memcmp(m + 8, "WEBP", 4)) {
        r->format = CK_IMAGE_WEBP;
        rc = webp_open(r, max_pixels, err, errlen);
    } else {
        fail(err, errlen, path, k == 0 ? "an empty file, not an image" : "not a PNG, JPEG or WebP image");
        goto bail;
    }
    if (rc) goto bail;
    return r;
bail:
    reader_free(r);
    return NULL;
}

int ck_image_width(const ck_image_reader *r) { return r->w; }
int ck_image_height(const ck_image_reader *r) { return r->h; }
ck_image_format ck_image_format_of(const ck_image_reader *r) { return r->format; }
const uint8_t *ck_image_pixels(const ck_image_reader *r) { return r->done ? r->rgb : NULL; }
int ck_image_stopped(const ck_image_reader *r) { return r->stopped; }

int ck_image_text_at(const ck_image_reader *r, int i, const char **key, const char **value)
{
    if (i < 0 || i >= r->ntext) return -1;
    *key = r->text[i].key;
    *value = r->text[i].text ? r->text[i].text : "";
    return 0;
}

int ck_image_read_step(ck_image_reader *r, char *err, size_t errlen)
{
    if (err && errlen) err[0] = 0;
    if (r->done) return 0;
    /* libpng and libjpeg cannot go on once they have failed */
    if (r->failed) return r->stopped ? stop_fail(r, err, errlen) : fail(err, errlen, r->path, "decoding failed before");
    int rc = -1;
    switch (r->format) {
    case CK_IMAGE_PNG: rc = png_step(r, err, errlen); break;
    case CK_IMAGE_JPEG: rc = jpeg_step(r, err, errlen); break;
    case CK_IMAGE_WEBP: rc = webp_step(r, err, errlen); break;
    }
    if (rc == 0) r->done = 1;
    if (rc < 0) r->failed = 1;
    return rc;
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
