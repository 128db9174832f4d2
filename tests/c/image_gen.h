/* Image files made in memory for the hostile-input tests and the fuzz corpus:
 * PNGs whose header declares sizes past the caps, PNGs of millions of empty
 * chunks, black PNGs of any size (a deflate stream of runs), JPEGs of one
 * set of coefficients written as one interleaved scan, as one scan per
 * component and as progressive scans (any number of them), and lossless
 * WebPs that decode a whole image from a few bytes. Everything follows the
 * formats' specifications (PNG, ITU T.81, the WebP lossless bitstream), so a
 * decoder that refuses one of them refuses a valid file. */
#ifndef CK_TEST_IMAGE_GEN_H
#define CK_TEST_IMAGE_GEN_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gbuf {
    unsigned char *p;
    size_t n, cap;
} gbuf;

static void gb_put(gbuf *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "image_gen: out of memory\n");
            abort();
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void gb_byte(gbuf *b, int c)
{
    const unsigned char x = (unsigned char)c;
    gb_put(b, &x, 1);
}

static void gb_be16(gbuf *b, unsigned v)
{
    gb_byte(b, (int)(v >> 8) & 255);
    gb_byte(b, (int)v & 255);
}

static void gb_be32(gbuf *b, uint32_t v)
{
    for (int i = 3; i >= 0; i--) gb_byte(b, (int)(v >> (8 * i)) & 255);
}

static void gb_le32(gbuf *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) gb_byte(b, (int)(v >> (8 * i)) & 255);
}

static int gb_write(const gbuf *b, const char *path)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    const size_t w = fwrite(b->p, 1, b->n, fp);
    return fclose(fp) == 0 && w == b->n ? 0 : -1;
}

/* ---- PNG */

static uint32_t gen_crc32(const unsigned char *p, size_t n, uint32_t crc)
{
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 255] ^ (crc >> 8);
    return ~crc;
}

static void png_chunk(gbuf *b, const char *type, const void *data, size_t n)
{
    gb_be32(b, (uint32_t)n);
    const size_t at = b->n;
    gb_put(b, type, 4);
    if (n) gb_put(b, data, n);
    gb_be32(b, gen_crc32(b->p + at, n + 4, 0));
}

/* the signature and IHDR (deflate, adaptive filters) */
static void png_head(gbuf *b, uint32_t w, uint32_t h, int depth, int color, int interlace)
{
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    gb_put(b, sig, 8);
    unsigned char ihdr[13];
    for (int i = 0; i < 4; i++) {
        ihdr[i] = (unsigned char)(w >> (24 - 8 * i));
        ihdr[4 + i] = (unsigned char)(h >> (24 - 8 * i));
    }
    ihdr[8] = (unsigned char)depth;
    ihdr[9] = (unsigned char)color;
    ihdr[10] = 0;
    ihdr[11] = 0;
    ihdr[12] = (unsigned char)interlace;
    png_chunk(b, "IHDR", ihdr, 13);
}

/* deflate's bits, least significant first */
typedef struct zbits {
    gbuf *b;
    uint32_t acc;
    int n;
} zbits;

static void zb_put(zbits *z, uint32_t v, int len)
{
    z->acc |= v << z->n;
    z->n += len;
    while (z->n >= 8) {
        gb_byte(z->b, (int)(z->acc & 255));
        z->acc >>= 8;
        z->n -= 8;
    }
}

/* a Huffman code, sent most significant bit first */
static void zb_code(zbits *z, uint32_t code, int len)
{
    for (int i = len - 1; i >= 0; i--) zb_put(z, (code >> i) & 1, 1);
}

/* A zlib stream of n zero bytes in one block of fixed codes: a literal 0,
 * then matches of 258 at distance 1 (13 bits each), then literals. */
static void zlib_zeros(gbuf *b, uint64_t n)
{
    gb_byte(b, 0x78);
    gb_byte(b, 0x01);
    zbits z = {b, 0, 0};
    zb_put(&z, 1, 1); /* the last block */
    zb_put(&z, 1, 2); /* fixed codes */
    uint64_t left = n;
    if (left) {
        zb_code(&z, 0x30, 8); /* literal 0 */
        left--;
    }
    for (; left >= 258; left -= 258) {
        zb_code(&z, 0xc5, 8); /* length 258 */
        zb_code(&z, 0, 5);    /* distance 1 */
    }
    for (; left; left--) zb_code(&z, 0x30, 8);
    zb_code(&z, 0, 7); /* end of block */
    if (z.n) zb_put(&z, 0, 8 - z.n);
    /* Adler-32 of zeros: A stays 1, B adds it once a byte */
    gb_be32(b, (uint32_t)((n % 65521) << 16 | 1));
}

/* A black w x h PNG (8-bit, color type color), its image data in IDAT
 * chunks of at most 1 MiB. */
static void png_black(gbuf *b, uint32_t w, uint32_t h, int color, int interlace)
{
    png_head(b, w, h, 8, color, interlace);
    const int channels = color == 2 ? 3 : color == 6 ? 4 : color == 4 ? 2 : 1;
    uint64_t raw = (uint64_t)h * (1 + (uint64_t)w * channels);
    if (interlace) raw += (uint64_t)h * 7 + 64; /* Adam7's extra filter bytes: a few zeros more are ignored */
    gbuf z = {0};
    zlib_zeros(&z, raw);
    for (size_t at = 0; at < z.n; at += (size_t)1 << 20)
        png_chunk(b, "IDAT", z.p + at, z.n - at < ((size_t)1 << 20) ? z.n - at : (size_t)1 << 20);
    free(z.p);
    png_chunk(b, "IEND", NULL, 0);
}

/* Where png_empty_chunks puts its chunks: before the image data (unknown
 * ancillary chunks, read with the header), between two IDAT chunks (empty
 * IDATs, read with the rows) or after it (unknown chunks, read at the end). */
enum { EMPTY_BEFORE, EMPTY_IDATS, EMPTY_AFTER };

/* A 1x1 gray PNG with n empty chunks (12 bytes each) */
static void png_empty_chunks(gbuf *b, long n, int where)
{
    png_head(b, 1, 1, 8, 0, 0);
    gbuf z = {0};
    zlib_zeros(&z, 2);
    if (where == EMPTY_BEFORE)
        for (long i = 0; i < n; i++) png_chunk(b, "ckEm", NULL, 0);
    if (where == EMPTY_IDATS) {
        png_chunk(b, "IDAT", z.p, 3);
        for (long i = 0; i < n; i++) png_chunk(b, "IDAT", NULL, 0);
        png_chunk(b, "IDAT", z.p + 3, z.n - 3);
    } else {
        png_chunk(b, "IDAT", z.p, z.n);
    }
    if (where == EMPTY_AFTER)
        for (long i = 0; i < n; i++) png_chunk(b, "ckEm", NULL, 0);
    png_chunk(b, "IEND", NULL, 0);
    free(z.p);
}

/* ---- JPEG */

/* entropy-coded bits, most significant first, a 0 stuffed after each 0xFF */
typedef struct jbits {
    gbuf *b;
    uint32_t acc;
    int n;
} jbits;

static void jb_put(jbits *j, uint32_t v, int len)
{
    for (int i = len - 1; i >= 0; i--) {
        j->acc = j->acc << 1 | ((v >> i) & 1);
        if (++j->n == 8) {
            gb_byte(j->b, (int)j->acc);
            if (j->acc == 0xff) gb_byte(j->b, 0);
            j->acc = 0;
            j->n = 0;
        }
    }
}

static void jb_flush(jbits *j)
{
    if (j->n) jb_put(j, 0x7f, 8 - j->n); /* padded with 1 bits */
}

/* the DC table of ITU T.81 K.3 (luminance): category -> code */
static const uint16_t jdc_code[12] = {0x0, 0x2, 0x3, 0x4, 0x5, 0x6, 0xe, 0x1e, 0x3e, 0x7e, 0xfe, 0x1fe};
static const uint8_t jdc_len[12] = {2, 3, 3, 3, 3, 3, 4, 5, 6, 7, 8, 9};

static void jpeg_dc(jbits *j, int diff)
{
    const int a = diff < 0 ? -diff : diff;
    int s = 0;
    while ((1 << s) <= a) s++;
    jb_put(j, jdc_code[s], jdc_len[s]);
    if (s) jb_put(j, (uint32_t)(diff < 0 ? diff - 1 : diff) & ((1u << s) - 1), s);
}

/* An end-of-band run of n blocks in a progressive AC scan (EOBn symbols
 * 0x00..0xE0 have the 4-bit codes 0..14 of the AC table below); in a
 * sequential scan the code 0 is the end of block. */
static void jpeg_eobrun(jbits *j, long n)
{
    while (n > 0) {
        long run = n > 32767 ? 32767 : n;
        int k = 0;
        while ((2L << k) <= run) k++;
        jb_put(j, (uint32_t)k, 4);
        if (k) jb_put(j, (uint32_t)(run - (1L << k)), k);
        n -= run;
    }
}

typedef struct jpeg_spec {
    int w, h, ncomp;
    int hs[3], vs[3]; /* sampling factors */
} jpeg_spec;

/* the quantized DC of component c's block (bx, by): a pattern of levels */
static int jpeg_level(int c, int bx, int by) { return ((bx * 7 + by * 13 + c * 5) % 23 - 11) * 4; }

static void jpeg_seg(gbuf *b, int marker, const unsigned char *p, size_t n)
{
    gb_byte(b, 0xff);
    gb_byte(b, marker);
    gb_be16(b, (unsigned)(n + 2));
    gb_put(b, p, n);
}

/* blocks of component c: in its own (non-interleaved) scans, and padded to
 * whole MCUs in interleaved ones */
static void jpeg_blocks(const jpeg_spec *s, int c, int *bw, int *bh, int *mw, int *mh)
{
    int hmax = 1, vmax = 1;
    for (int i = 0; i < s->ncomp; i++) {
        if (s->hs[i] > hmax) hmax = s->hs[i];
        if (s->vs[i] > vmax) vmax = s->vs[i];
    }
    const int cw = (s->w * s->hs[c] + hmax - 1) / hmax, ch = (s->h * s->vs[c] + vmax - 1) / vmax;
    *bw = (cw + 7) / 8;
    *bh = (ch + 7) / 8;
    *mw = (s->w + 8 * hmax - 1) / (8 * hmax) * s->hs[c];
    *mh = (s->h + 8 * vmax - 1) / (8 * vmax) * s->vs[c];
}

enum { JPEG_INTERLEAVED, JPEG_PER_COMPONENT, JPEG_PROGRESSIVE };

/* A JPEG of the pattern jpeg_level (DC only, every AC coefficient 0, all
 * quantizers 8) written as one interleaved baseline scan, as one baseline
 * scan per component, or progressive: an interleaved DC scan and then
 * ac_scans scans of the AC band (1..63) over the components in turn, each
 * an end-of-band run (the first sets the band to 0, the rest repeat it).
 * All three decode to the same pixels. */
/* SOI, the quantizers (all 8), the frame header and the Huffman tables: DC
 * table 0 of T.81 K.3, AC table 0 of EOB0..EOB14 with the codes 0..14 of 4
 * bits */
static void jpeg_head(gbuf *b, const jpeg_spec *s, int progressive)
{
    gb_byte(b, 0xff);
    gb_byte(b, 0xd8);
    unsigned char q[65];
    q[0] = 0;
    memset(q + 1, 8, 64);
    jpeg_seg(b, 0xdb, q, 65);
    unsigned char sof[6 + 3 * 3];
    sof[0] = 8;
    sof[1] = (unsigned char)(s->h >> 8);
    sof[2] = (unsigned char)s->h;
    sof[3] = (unsigned char)(s->w >> 8);
    sof[4] = (unsigned char)s->w;
    sof[5] = (unsigned char)s->ncomp;
    for (int c = 0; c < s->ncomp; c++) {
        sof[6 + 3 * c] = (unsigned char)(c + 1);
        sof[7 + 3 * c] = (unsigned char)(s->hs[c] << 4 | s->vs[c]);
        sof[8 + 3 * c] = 0;
    }
    jpeg_seg(b, progressive ? 0xc2 : 0xc0, sof, 6 + 3 * (size_t)s->ncomp);
    unsigned char dht[1 + 16 + 15];
    const unsigned char dc_bits[16] = {0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    dht[0] = 0x00;
    memcpy(dht + 1, dc_bits, 16);
    for (int i = 0; i < 12; i++) dht[17 + i] = (unsigned char)i;
    jpeg_seg(b, 0xc4, dht, 29);
    dht[0] = 0x10;
    memset(dht + 1, 0, 16);
    dht[4] = 15;
    for (int i = 0; i < 15; i++) dht[17 + i] = (unsigned char)(i << 4);
    jpeg_seg(b, 0xc4, dht, 32);
}

/* A header whose first scan has no data: enough for a reader's open */
static void jpeg_header_only(gbuf *b, int w, int h)
{
    const jpeg_spec s = {w, h, 1, {1}, {1}};
    jpeg_head(b, &s, 0);
    const unsigned char sos[6] = {1, 1, 0x00, 0, 63, 0};
    jpeg_seg(b, 0xda, sos, 6);
    gb_byte(b, 0xff);
    gb_byte(b, 0xd9);
}

static void jpeg_make(gbuf *b, const jpeg_spec *s, int mode, long ac_scans)
{
    jpeg_head(b, s, mode == JPEG_PROGRESSIVE);
    int bw[3], bh[3], mw[3], mh[3];
    for (int c = 0; c < s->ncomp; c++) jpeg_blocks(s, c, &bw[c], &bh[c], &mw[c], &mh[c]);
    if (mode != JPEG_PER_COMPONENT) {
        /* one interleaved scan: every component's blocks MCU by MCU */
        unsigned char sos[1 + 2 * 3 + 3];
        sos[0] = (unsigned char)s->ncomp;
        for (int c = 0; c < s->ncomp; c++) {
            sos[1 + 2 * c] = (unsigned char)(c + 1);
            sos[2 + 2 * c] = 0x00;
        }
        unsigned char *t = sos + 1 + 2 * s->ncomp;
        t[0] = 0;
        t[1] = mode == JPEG_PROGRESSIVE ? 0 : 63;
        t[2] = 0;
        jpeg_seg(b, 0xda, sos, 4 + 2 * (size_t)s->ncomp);
        jbits j = {b, 0, 0};
        int pred[3] = {0, 0, 0};
        const int mcus_x = mw[0] / s->hs[0], mcus_y = mh[0] / s->vs[0];
        for (int my = 0; my < mcus_y; my++)
            for (int mx = 0; mx < mcus_x; mx++)
                for (int c = 0; c < s->ncomp; c++)
                    for (int v = 0; v < s->vs[c]; v++)
                        for (int u = 0; u < s->hs[c]; u++) {
                            const int d = jpeg_level(c, mx * s->hs[c] + u, my * s->vs[c] + v);
                            jpeg_dc(&j, d - pred[c]);
                            pred[c] = d;
                            if (mode != JPEG_PROGRESSIVE) jb_put(&j, 0, 4); /* end of block */
                        }
        jb_flush(&j);
    } else {
        for (int c = 0; c < s->ncomp; c++) {
            const unsigned char sos[6] = {1, (unsigned char)(c + 1), 0x00, 0, 63, 0};
            jpeg_seg(b, 0xda, sos, 6);
            jbits j = {b, 0, 0};
            int pred = 0;
            for (int y = 0; y < bh[c]; y++)
                for (int x = 0; x < bw[c]; x++) {
                    const int d = jpeg_level(c, x, y);
                    jpeg_dc(&j, d - pred);
                    pred = d;
                    jb_put(&j, 0, 4);
                }
            jb_flush(&j);
        }
    }
    for (long i = 0; mode == JPEG_PROGRESSIVE && i < ac_scans; i++) {
        const int c = (int)(i % s->ncomp);
        const unsigned char sos[6] = {1, (unsigned char)(c + 1), 0x00, 1, 63, 0};
        jpeg_seg(b, 0xda, sos, 6);
        jbits j = {b, 0, 0};
        jpeg_eobrun(&j, (long)bw[c] * bh[c]);
        jb_flush(&j);
    }
    gb_byte(b, 0xff);
    gb_byte(b, 0xd9);
}

/* ---- WebP */

/* A lossless WebP of w x h (at most 16384 each) whose pixels cost no bits:
 * no transform, no colour cache, and five prefix codes of one symbol each,
 * so every pixel is transparent black. vp8x: inside a VP8X container
 * declaring the same canvas. */
static void webp_zero_bits(gbuf *b, int w, int h, int vp8x)
{
    gbuf v = {0};
    zbits z = {&v, 0, 0};
    zb_put(&z, 0x2f, 8);
    zb_put(&z, (uint32_t)(w - 1), 14);
    zb_put(&z, (uint32_t)(h - 1), 14);
    zb_put(&z, 1, 1); /* alpha is used */
    zb_put(&z, 0, 3); /* version */
    zb_put(&z, 0, 1); /* no transform */
    zb_put(&z, 0, 1); /* no colour cache */
    zb_put(&z, 0, 1); /* no meta prefix codes */
    for (int i = 0; i < 5; i++) {
        zb_put(&z, 1, 1); /* a simple code */
        zb_put(&z, 0, 1); /* of one symbol */
        zb_put(&z, 0, 1); /* of 1 bit */
        zb_put(&z, 0, 1); /* symbol 0 */
    }
    if (z.n) zb_put(&z, 0, 8 - z.n);
    const uint32_t pad = (uint32_t)(v.n & 1);
    const uint32_t body = 4 + (vp8x ? 8 + 10 : 0) + 8 + (uint32_t)v.n + pad;
    gb_put(b, "RIFF", 4);
    gb_le32(b, body);
    gb_put(b, "WEBP", 4);
    if (vp8x) {
        gb_put(b, "VP8X", 4);
        gb_le32(b, 10);
        const unsigned char x[10] = {0x10, 0, 0, 0, (unsigned char)(w - 1), (unsigned char)((w - 1) >> 8),
                                     (unsigned char)((w - 1) >> 16), (unsigned char)(h - 1),
                                     (unsigned char)((h - 1) >> 8), (unsigned char)((h - 1) >> 16)};
        gb_put(b, x, 10);
    }
    gb_put(b, "VP8L", 4);
    gb_le32(b, (uint32_t)v.n);
    gb_put(b, v.p, v.n);
    if (pad) gb_byte(b, 0);
    free(v.p);
}

#endif
