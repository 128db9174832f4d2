/* Images in and out: PNG (libpng), JPEG (libjpeg-turbo) and WebP (libwebp)
 * decoded to 8-bit RGB, the resampling, crop and flip that bring a decoded
 * image to a training array, and PNG written atomically with text chunks.
 * Knows nothing of Lua: errors come back as -1 and a message naming the file.
 *
 * Decoding follows what kohya's sd-scripts get from Pillow's
 * Image.open(path).convert("RGB"):
 * - alpha is dropped, not composited (RGBA, gray+alpha, a palette's or a gray
 *   image's transparency, WebP alpha): the colour values are kept as stored;
 * - gray is copied to R, G and B; a palette is looked up;
 * - 16-bit PNG samples keep their high byte (Pillow does the same for RGB;
 *   for 16-bit gray Pillow's conversion clips to 255, which is not followed);
 * - EXIF orientation is ignored (kohya does not apply it either), as are PNG
 *   gamma and colour profiles;
 * - JPEG: libjpeg-turbo's accurate integer IDCT (JDCT_ISLOW) and its default
 *   "fancy" chroma upsampling, as Pillow uses; CMYK and YCCK JPEGs are refused;
 * - animated WebP is refused. */
#ifndef CK_IMAGE_H
#define CK_IMAGE_H

#include <stddef.h>
#include <stdint.h>

typedef enum ck_image_format { CK_IMAGE_PNG = 1, CK_IMAGE_JPEG = 2, CK_IMAGE_WEBP = 3 } ck_image_format;

/* "png", "jpeg", "webp" */
const char *ck_image_format_name(ck_image_format f);

/* The default cap on width * height, checked from the header before any
 * decoding */
#define CK_IMAGE_MAX_PIXELS ((int64_t)1 << 28)
/* The widest image read: a PNG's rows are decoded whole, one call each */
#define CK_IMAGE_MAX_WIDTH (1 << 20)
/* The most scans a JPEG may hold: a progressive file has about ten, and every
 * scan is a pass over the whole image */
#define CK_IMAGE_MAX_SCANS 1000

/* What a reader answers to while it works.
 * - take / give: its memory is charged before it is allocated (the decoded
 *   pixels, libpng's allocations as they come, a JPEG's coefficient buffers,
 *   a WebP file's bytes and its decoder's image buffer, each from the
 *   header). take returns 0, or -1 with a message in err; give returns what
 *   take charged.
 * - poll(poll_ud, work): asked between pieces of work, at least once per 64
 *   KiB of file read, per 4096 blocks of a JPEG scan, per 2^16 pixels
 *   decoded and every 20 ms of a WebP decode, with the work done since the
 *   last call (about 1 unit per 16 pixels or 1 block, and 4096 per 64 KiB
 *   read); nonzero stops the reader: the open or the step fails at once with
 *   "stopped" (ck_image_stopped then says so). It must not longjmp.
 * Any of them NULL: nothing charged, never stopped. */
typedef struct ck_image_charge {
    int (*take)(void *ud, size_t n, const char *what, char *err, size_t errlen);
    void (*give)(void *ud, size_t n);
    void *ud;
    int (*poll)(void *poll_ud, long long work);
    void *poll_ud;
} ck_image_charge;

typedef struct ck_image_reader ck_image_reader;

/* Opens the image in fd (opened for reading by the caller, which the reader
 * now owns: closed on failure too) and reads its header only: the format
 * from the first bytes, the size, and (PNG) the text chunks before the image
 * data. path names the file in messages; fd -1 reports the open's failure
 * from errno. Refuses an unknown format, a zero-size image, one wider than
 * CK_IMAGE_MAX_WIDTH and one of more than max_pixels pixels (<= 0:
 * CK_IMAGE_MAX_PIXELS), from the declared size before a library allocates
 * for it. c: copied; NULL charges nothing. NULL with a message on any
 * problem. */
ck_image_reader *ck_image_open_fd(int fd, const char *path, int64_t max_pixels, const ck_image_charge *c, char *err,
                                  size_t errlen);
int ck_image_width(const ck_image_reader *r);
int ck_image_height(const ck_image_reader *r);
ck_image_format ck_image_format_of(const ck_image_reader *r);
/* PNG text chunks (tEXt, zTXt, iTXt) read with the header: i-th key and
 * value, valid until the reader closes; -1 past the last. */
int ck_image_text_at(const ck_image_reader *r, int i, const char **key, const char **value);

/* Decodes the next part of the image into the reader's pixels: 1 when there
 * is more to do, 0 when the image is complete, -1 with a message (a truncated
 * or corrupt file, a charge refused, a stop asked by poll). The first step
 * charges and allocates the pixels and the decoder's buffers. A step does a
 * bounded piece of work: about 2^16 pixels, 4096 blocks of a JPEG scan (a
 * JPEG of several scans is read scan by scan into its coefficients, then
 * output), 1 MiB of a WebP file, or up to 20 ms of waiting for a WebP, which
 * decodes on a thread of its own (libwebp has no way to stop a decode). */
int ck_image_read_step(ck_image_reader *r, char *err, size_t errlen);
/* The decoded image once ck_image_read_step has returned 0: height * width *
 * 3 bytes (row-major, R G B), valid until the reader closes; NULL before. */
const uint8_t *ck_image_pixels(const ck_image_reader *r);
/* 1 when the last failure was a stop asked by poll */
int ck_image_stopped(const ck_image_reader *r);
/* Closes the reader and gives back all it charged. A WebP decode still
 * running on its thread is left to finish there and free its own memory
 * (at most a few seconds: its work is bounded by the pixel limit). */
void ck_image_close(ck_image_reader *r);
/* Waits until every WebP decode left running by ck_image_close has ended
 * (for tests and for hosts that unload the library). */
void ck_image_wait_abandoned(void);

/* How a decoded w x h image becomes an array [3, crop_h, crop_w] of values
 * v / 127.5 - 1 in [-1, 1]: first resized to resize_w x resize_h (0: kept),
 * then cropped to crop_h x crop_w at (crop_top, crop_left), counted from 0
 * (crop_h 0: the whole image), then flipped left to right (flip).
 *
 * Resizing is separable, per axis: an axis that shrinks is area-averaged
 * (each output pixel the mean of the source interval [k*s, (k+1)*s), s =
 * source/target, partial pixels weighted by their overlap: OpenCV's
 * INTER_AREA, which kohya uses); an axis that grows is interpolated linearly
 * between pixel centres (source x = (k + 0.5) * s - 0.5, clamped to the
 * edges: OpenCV's INTER_LINEAR). Values are computed in float and not
 * rounded back to 8 bits. */
typedef struct ck_image_xform {
    int resize_w, resize_h;
    int crop_top, crop_left, crop_h, crop_w;
    int flip;
} ck_image_xform;

/* Checks xf against a w x h image (a crop inside the resized image, sizes in
 * range) and gives the output size and the scratch bytes ck_image_to_chw
 * needs. 0, or -1 with a message. */
int ck_image_xform_plan(const ck_image_xform *xf, int w, int h, int *out_w, int *out_h, size_t *scratch_bytes,
                        char *err, size_t errlen);
/* Fills out [3, out_h, out_w] from rgb (w x h) by xf, with scratch of the
 * planned size (aligned for floats). poll(ud) is called every few thousand
 * pixels' work and may not return (a longjmp): nothing is held but what the
 * caller gave. */
void ck_image_to_chw(const uint8_t *rgb, int w, int h, const ck_image_xform *xf, void *scratch, float *out,
                     void (*poll)(void *ud), void *ud);

/* Writes an 8-bit RGB PNG of rgb (w x h, row-major R G B) as name in the
 * directory dirfd, path naming it in messages: to name.tmp.<pid> there
 * (created with O_EXCL, after removing temp files of name whose process is
 * gone), fsynced, then renamed over name, so a failed write leaves an
 * existing file as it was. keys[i], values[i]: text chunks, written before
 * the image data: tEXt for an ASCII value, iTXt (UTF-8) otherwise; a key is
 * 1 to 79 printable ASCII characters with no leading, trailing or double
 * spaces. dirfd -1: its open failed (errno says why). 0, or -1 with a
 * message. */
int ck_image_write_png_at(int dirfd, const char *name, const char *path, int w, int h, const uint8_t *rgb, int ntext,
                          const char *const *keys, const char *const *values, char *err, size_t errlen);

#endif
