/* TensorBoard event files, written by hand: TFRecord framing (little-endian
 * length, masked CRC-32C of the length, data, masked CRC-32C of the data)
 * around Event protobufs (wall_time = 1, step = 2, file_version = 3,
 * summary = 5; Summary.value = 1; Value.tag = 1, Value.simple_value = 2,
 * Value.image = 4; Image.height = 1, Image.width = 2, Image.colorspace = 3,
 * Image.encoded_image_string = 4). The reader is for tests and tools: it
 * checks every CRC. */
#include "formats/logsink.h"
#include "util/memory.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT; /* loggers of many threads start at once */

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

uint32_t ck_tb_crc32c(const void *data, size_t n)
{
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (; n >= 8; n -= 8, p += 8) { /* slicing by 8 */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
            crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
    }
    while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return c ^ 0xFFFFFFFFu;
}

uint32_t ck_tb_crc32c_masked(const void *data, size_t n)
{
    uint32_t c = ck_tb_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protobuf encoding into a growing buffer */

typedef struct pbuf {
    unsigned char *p;
    size_t len, cap;
    int failed;
} pbuf;

static void put(pbuf *b, const void *x, size_t n)
{
    if (b->failed) return;
    if (ck_grow(&b->p, &b->cap, b->len + n, 1, 256)) {
        b->failed = 1;
        return;
    }
    memcpy(b->p + b->len, x, n);
    b->len += n;
}

static size_t varint_put(unsigned char *t, uint64_t v)
{
    size_t n = 0;
    do {
        t[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) t[n] |= 0x80;
        n++;
    } while (v);
    return n;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >>= 7) n++;
    return n;
}

static void put_varint(pbuf *b, uint64_t v)
{
    unsigned char t[10];
    put(b, t, varint_put(t, v));
}

static void put_le(pbuf *b, uint64_t v, int bytes)
{
    unsigned char t[8];
    for (int i = 0; i < bytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    put(b, t, (size_t)bytes);
}

static void put_bytes_field(pbuf *b, int field, const void *x, size_t n)
{
    put_varint(b, (uint64_t)field << 3 | 2);
    put_varint(b, n);
    put(b, x, n);
}

/* ---- walking a record: every number and image with its '/'-joined path */

/* a leaf: type 'n' with v, or 'g' with the image's sizes and bytes */
typedef struct leaf {
    char type;
    double v;
    uint32_t w, h;
    const unsigned char *png;
    size_t png_len;
} leaf;

typedef int (*leaf_fn)(void *ud, const char *tag, size_t len, const leaf *x);

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int walk_leaves(const ck_log_rec *r, leaf_fn fn, void *ud)
{
    char path[1024];
    size_t plen[64];
    int is_array[64], index[64], depth = 0;
    size_t len = 0;
    is_array[0] = 0;
    index[0] = 0;
    plen[0] = 0;
    for (size_t i = 0; i < r->len;) {
        unsigned char type = r->buf[i++];
        if (type == 'c') {
            if (depth > 0) depth--;
            len = plen[depth];
            continue;
        }
        uint32_t kl = rd32(r->buf + i);
        const char *key = (const char *)r->buf + i + 4;
        i += 4 + kl;
        /* this value's name: the key, or its 1-based index in an array */
        char num[24];
        if (is_array[depth]) {
            kl = (uint32_t)snprintf(num, sizeof num, "%d", ++index[depth]);
            key = num;
        }
        size_t base = len;
        if (base && base < sizeof path) path[base++] = '/';
        if (base + kl < sizeof path) {
            memcpy(path + base, key, kl);
            base += kl;
        }
        leaf x = {0};
        switch (type) {
        case 'o':
        case 'a':
            if (depth + 1 < 64) {
                plen[depth] = len;
                depth++;
                is_array[depth] = type == 'a';
                index[depth] = 0;
                plen[depth] = len = base;
            }
            break;
        case 'n':
            x.type = 'n';
            memcpy(&x.v, r->buf + i, 8);
            i += 8;
            if (fn(ud, path, base, &x)) return -1;
            break;
        case 'i': {
            int64_t v;
            memcpy(&v, r->buf + i, 8);
            i += 8;
            x.type = 'n';
            x.v = (double)v;
            if (fn(ud, path, base, &x)) return -1;
            break;
        }
        case 'g':
            x.type = 'g';
            x.w = rd32(r->buf + i);
            x.h = rd32(r->buf + i + 4);
            x.png_len = rd32(r->buf + i + 8);
            x.png = r->buf + i + 12;
            i += 12 + x.png_len;
            if (fn(ud, path, base, &x)) return -1;
            break;
        case 's': i += 4 + rd32(r->buf + i); break;
        case 'b': i += 1; break;
        default: return -1;
        }
    }
    return 0;
}

/* Summary.Image.colorspace from the PNG's IHDR color type (grayscale 1,
 * grayscale with alpha 2, RGB and palette 3, RGBA 4); 3 when it cannot tell */
static int png_colorspace(const unsigned char *png, size_t n)
{
    if (n < 26 || memcmp(png + 12, "IHDR", 4)) return 3;
    switch (png[25]) {
    case 0: return 1;
    case 4: return 2;
    case 6: return 4;
    default: return 3;
    }
}

/* Summary.value { tag = 1, simple_value = 2 | image = 4 } appended to the Summary */
static int add_value(void *ud, const char *tag, size_t len, const leaf *x)
{
    pbuf *summary = ud;
    if (x->type == 'g') {
        int cs = png_colorspace(x->png, x->png_len);
        size_t ilen = 1 + varint_len(x->h) + 1 + varint_len(x->w) + 1 + varint_len((uint64_t)cs) + 1 +
                      varint_len(x->png_len) + x->png_len;
        size_t vlen = 1 + varint_len(len) + len + 1 + varint_len(ilen) + ilen;
        put_varint(summary, 1 << 3 | 2); /* Summary.value */
        put_varint(summary, vlen);
        put_bytes_field(summary, 1, tag, len); /* Value.tag */
        put_varint(summary, 4 << 3 | 2);       /* Value.image */
        put_varint(summary, ilen);
        put_varint(summary, 1 << 3 | 0); /* Image.height */
        put_varint(summary, x->h);
        put_varint(summary, 2 << 3 | 0); /* Image.width */
        put_varint(summary, x->w);
        put_varint(summary, 3 << 3 | 0); /* Image.colorspace */
        put_varint(summary, (uint64_t)cs);
        put_bytes_field(summary, 4, x->png, x->png_len); /* Image.encoded_image_string */
        return summary->failed ? -1 : 0;
    }
    unsigned char head[24];
    size_t vlen = 1 + varint_len(len) + len + 1 + 4, k = 0;
    head[k++] = 1 << 3 | 2; /* Summary.value */
    k += varint_put(head + k, vlen);
    head[k++] = 1 << 3 | 2; /* Value.tag */
    k += varint_put(head + k, len);
    put(summary, head, k);
    put(summary, tag, len);
    float f = (float)x->v;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    unsigned char tail[5] = {2 << 3 | 5, (unsigned char)bits, (unsigned char)(bits >> 8), (unsigned char)(bits >> 16),
                             (unsigned char)(bits >> 24)};
    put(summary, tail, 5);
    return summary->failed ? -1 : 0;
}

int ck_tb_event(const ck_log_rec *r, const char *file_version, unsigned char **out, size_t *len, size_t *cap)
{
    pbuf ev = {0}, summary = {0};
    uint64_t bits;
    double t = r->time;
    memcpy(&bits, &t, 8);
    put_varint(&ev, 1 << 3 | 1);
    put_le(&ev, bits, 8);
    put_varint(&ev, 2 << 3 | 0);
    put_varint(&ev, (uint64_t)(r->step > 0 ? r->step : 0));
    if (file_version) {
        put_bytes_field(&ev, 3, file_version, strlen(file_version));
    } else {
        if (walk_leaves(r, add_value, &summary)) summary.failed = 1;
        if (!summary.failed && summary.len == 0) {
            free(ev.p);
            return 0;
        }
        put_bytes_field(&ev, 5, summary.p, summary.len);
    }
    int failed = ev.failed || summary.failed;
    free(summary.p);
    if (failed) {
        free(ev.p);
        return -1;
    }
    pbuf o = {*out, *len, *cap, 0};
    unsigned char head[8];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)ev.len >> (8 * i));
    put(&o, head, 8);
    put_le(&o, ck_tb_crc32c_masked(head, 8), 4);
    put(&o, ev.p, ev.len);
    put_le(&o, ck_tb_crc32c_masked(ev.p, ev.len), 4);
    free(ev.p);
    *out = o.p;
    *len = o.len;
    *cap = o.cap;
    return o.failed ? -1 : 1;
}

/* ---- reading */

typedef struct rd {
    const unsigned char *p, *end;
} rd;

static int get_varint(rd *r, uint64_t *v)
{
    *v = 0;
    for (int s = 0; s < 64; s += 7) {
        if (r->p >= r->end) return -1;
        unsigned char c = *r->p++;
        *v |= (uint64_t)(c & 0x7f) << s;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

/* one field: its number, wire type and payload (varint value, or bytes) */
static int get_field(rd *r, int *field, int *wire, uint64_t *v, const unsigned char **bytes)
{
    uint64_t key;
    if (get_varint(r, &key)) return -1;
    *field = (int)(key >> 3);
    *wire = (int)(key & 7);
    switch (*wire) {
    case 0: return get_varint(r, v);
    case 1:
    case 5: {
        size_t n = *wire == 1 ? 8 : 4;
        if ((size_t)(r->end - r->p) < n) return -1;
        *v = 0;
        for (size_t i = 0; i < n; i++) *v |= (uint64_t)r->p[i] << (8 * i);
        *bytes = r->p;
        r->p += n;
        return 0;
    }
    case 2:
        if (get_varint(r, v) || *v > (uint64_t)(r->end - r->p)) return -1;
        *bytes = r->p;
        r->p += *v;
        return 0;
    default: return -1;
    }
}

/* the reader's arrays, reused from event to event */
typedef struct rd_bufs {
    ck_tb_value *vals;
    size_t vcap;
    ck_tb_image *imgs;
    size_t icap;
} rd_bufs;

/* Image { height = 1, width = 2, colorspace = 3, encoded_image_string = 4 }
 * into im (other fields skipped) */
static int parse_image(const unsigned char *p, size_t n, ck_tb_image *im)
{
    rd r = {p, p + n};
    while (r.p < r.end) {
        int f, w;
        uint64_t v;
        const unsigned char *b = NULL;
        if (get_field(&r, &f, &w, &v, &b)) return -1;
        if (w == 0 && f == 1) im->height = (int64_t)v;
        else if (w == 0 && f == 2) im->width = (int64_t)v;
        else if (w == 0 && f == 3) im->colorspace = (int64_t)v;
        else if (w == 2 && f == 4) {
            im->png = b;
            im->png_len = (size_t)v;
        }
    }
    return 0;
}

/* one Summary.Value: an image when it holds one, else a number */
static int parse_value(const unsigned char *p, size_t n, ck_tb_read_event *e, rd_bufs *bufs)
{
    rd val = {p, p + n};
    ck_tb_value tv = {"", 0, 0};
    ck_tb_image im = {"", 0, 0, 0, 0, (const unsigned char *)"", 0};
    int is_image = 0;
    while (val.p < val.end) {
        int f3, w3;
        uint64_t v3;
        const unsigned char *b3 = NULL;
        if (get_field(&val, &f3, &w3, &v3, &b3)) return -1;
        if (f3 == 1 && w3 == 2) {
            tv.tag = im.tag = (const char *)b3;
            tv.tag_len = im.tag_len = (size_t)v3;
        } else if (f3 == 2 && w3 == 5) {
            uint32_t bits = (uint32_t)v3;
            memcpy(&tv.value, &bits, 4);
        } else if (f3 == 4 && w3 == 2) {
            if (parse_image(b3, (size_t)v3, &im)) return -1;
            is_image = 1;
        }
    }
    if (is_image) {
        if (ck_grow(&bufs->imgs, &bufs->icap, (size_t)e->nimages + 1, sizeof *bufs->imgs, 16)) return -2;
        e->images = bufs->imgs;
        e->images[e->nimages++] = im;
        return 0;
    }
    if (ck_grow(&bufs->vals, &bufs->vcap, (size_t)e->nvalues + 1, sizeof *bufs->vals, 64)) return -2;
    e->values = bufs->vals;
    e->values[e->nvalues++] = tv;
    return 0;
}

/* 0, -1 (not an Event), -2 (out of memory) */
static int parse_event(const unsigned char *p, size_t n, ck_tb_read_event *e, rd_bufs *bufs)
{
    rd r = {p, p + n};
    memset(e, 0, sizeof *e);
    e->values = bufs->vals;
    e->images = bufs->imgs;
    while (r.p < r.end) {
        int field, wire;
        uint64_t v;
        const unsigned char *b = NULL;
        if (get_field(&r, &field, &wire, &v, &b)) return -1;
        if (field == 1 && wire == 1) memcpy(&e->wall_time, &v, 8);
        else if (field == 2 && wire == 0) e->step = (int64_t)v;
        else if (field == 3 && wire == 2) {
            e->file_version = (const char *)b;
            e->file_version_len = (size_t)v;
        } else if (field == 5 && wire == 2) {
            rd s = {b, b + v};
            while (s.p < s.end) {
                int f2, w2;
                uint64_t v2;
                const unsigned char *b2 = NULL;
                if (get_field(&s, &f2, &w2, &v2, &b2)) return -1;
                if (f2 != 1 || w2 != 2) continue;
                int rc = parse_value(b2, (size_t)v2, e, bufs);
                if (rc) return rc;
            }
        }
    }
    return 0;
}

int ck_tb_read(const unsigned char *data, size_t n, int (*fn)(void *ud, const ck_tb_read_event *e), void *ud,
               size_t *tail, char *err, size_t errlen)
{
    size_t at = 0;
    int k = 0, rc = 0;
    rd_bufs bufs = {0};
    while (n - at >= 12) {
        const unsigned char *h = data + at;
        uint64_t len = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)h[i] << (8 * i);
        if (rd32(h + 8) != ck_tb_crc32c_masked(h, 8)) {
            snprintf(err, errlen, "record %d at byte %zu: the length's CRC does not match", k + 1, at);
            rc = -1;
            break;
        }
        if (len > n - at - 12 || n - at - 12 - len < 4) break; /* cut: a partial record */
        const unsigned char *d = h + 12;
        if (rd32(d + len) != ck_tb_crc32c_masked(d, (size_t)len)) {
            snprintf(err, errlen, "record %d at byte %zu: the data's CRC does not match", k + 1, at);
            rc = -1;
            break;
        }
        ck_tb_read_event e;
        int pe = parse_event(d, (size_t)len, &e, &bufs);
        if (pe) {
            if (pe == -2) snprintf(err, errlen, "out of memory");
            else snprintf(err, errlen, "record %d at byte %zu: not an Event protobuf", k + 1, at);
            rc = -1;
            break;
        }
        if (fn(ud, &e)) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
            break;
        }
        at += 12 + (size_t)len + 4;
        k++;
    }
    free(bufs.vals);
    free(bufs.imgs);
    if (tail) *tail = n - at;
    return rc;
}
