/* A tokenizer's files read with their sizes checked, their buffers charged
 * and their work polled (vm/text/text_file.h). */
#include "text/text_file.h"
#include "util/text.h"

#include <zlib.h>

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* a read, a decompression or a parse goes a piece of this size between polls */
#define PIECE ((size_t)1 << 20)
#define JSON_PIECE ((size_t)64 << 10)

int ck_text_take(const ck_text_guard *g, size_t n, const char *what, char *err, size_t errlen)
{
    if (!g || !g->take || n == 0) return 0;
    return g->take(g->ud, n, what, err, errlen);
}

void ck_text_give(const ck_text_guard *g, size_t n)
{
    if (g && g->give && n) g->give(g->ud, n);
}

int ck_text_poll(const ck_text_guard *g, long long work, char *err, size_t errlen)
{
    if (!g || !g->poll || !g->poll(g->pud, work)) return 0;
    ck_errf(err, errlen, "%s", CK_TEXT_STOPPED);
    return -1;
}

void ck_text_buf_free(const ck_text_guard *g, ck_text_buf *b)
{
    free(b->p);
    ck_text_give(g, b->charged);
    memset(b, 0, sizeof *b);
}

/* b->p grown to cap + 1 bytes (the extra one for a NUL), the growth charged first */
static int buf_reserve(const ck_text_guard *g, ck_text_buf *b, size_t cap, const char *what, char *err, size_t errlen)
{
    if (cap + 1 <= b->charged) return 0;
    size_t more = cap + 1 - b->charged;
    char msg[96];
    snprintf(msg, sizeof msg, "%s (%zu bytes)", what, cap + 1);
    if (ck_text_take(g, more, msg, err, errlen)) return -1;
    char *p = realloc(b->p, cap + 1);
    if (!p) {
        ck_text_give(g, more);
        ck_errf(err, errlen, "out of memory for %s (%zu bytes)", what, cap + 1);
        return -1;
    }
    b->p = p;
    b->charged += more;
    return 0;
}

int ck_text_read_fd(int fd, size_t cap, const ck_text_guard *g, ck_text_buf *out, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ck_errf(err, errlen, "not a regular file");
        return -1;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > cap) {
        ck_errf(err, errlen, "%lld bytes: more than the %zu MiB a tokenizer file may hold", (long long)st.st_size, cap >> 20);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (buf_reserve(g, out, size, "the file's text", err, errlen)) return -1;
    size_t got = 0;
    while (got < size) {
        size_t want = size - got < PIECE ? size - got : PIECE;
        ssize_t r = read(fd, out->p + got, want);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            ck_errf(err, errlen, "reading failed: %s", r < 0 ? strerror(errno) : "the file shrank while it was read");
            return -1;
        }
        got += (size_t)r;
        if (ck_text_poll(g, r, err, errlen)) return -1;
    }
    char extra;
    ssize_t r;
    while ((r = read(fd, &extra, 1)) < 0 && errno == EINTR) {}
    if (r > 0) {
        ck_errf(err, errlen, "the file grew while it was read");
        return -1;
    }
    out->p[size] = 0;
    out->len = size;
    return 0;
}

int ck_text_is_gzip(const char *s, size_t n) { return n >= 2 && (unsigned char)s[0] == 0x1F && (unsigned char)s[1] == 0x8B; }

int ck_text_gunzip(const char *in, size_t n, size_t cap, const ck_text_guard *g, ck_text_buf *out, char *err, size_t errlen)
{
    if (!ck_text_is_gzip(in, n) || n < 18) {
        ck_errf(err, errlen, "not a gzip file");
        return -1;
    }
    /* the last member's ISIZE (its length mod 2^32): refused past the cap
     * before anything is made, where the input could hold that much
     * (deflate makes at most 1032 bytes of one; else the file is cut short
     * or lies, which inflating tells). A member whose data says otherwise
     * still stops at the cap below. The first buffer: that size, but never
     * more than the input can make. */
    const unsigned char *t = (const unsigned char *)in + n - 4;
    size_t declared = (size_t)t[0] | (size_t)t[1] << 8 | (size_t)t[2] << 16 | (size_t)t[3] << 24;
    if (declared > cap && (n >= SIZE_MAX / 1032 || 1032 * n > cap)) {
        ck_errf(err, errlen, "it declares %zu bytes uncompressed: more than the %zu MiB a tokenizer file may hold", declared,
             cap >> 20);
        return -1;
    }
    size_t first = n < SIZE_MAX / 1032 && declared > 1032 * n ? 1032 * n : declared;
    if (first < 4096) first = 4096;
    if (first > cap) first = cap;
    if (buf_reserve(g, out, first, "the decompressed text", err, errlen)) return -1;
    size_t room = first, len = 0;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 16) != Z_OK) {
        ck_errf(err, errlen, "zlib failed to start");
        return -1;
    }
    z.next_in = (unsigned char *)in;
    size_t in_left = n;
    int rc = Z_OK;
    for (;;) {
        if (z.avail_in == 0 && in_left) {
            z.avail_in = (uInt)(in_left < PIECE ? in_left : PIECE);
            in_left -= z.avail_in;
        }
        if (len == room) {
            if (room == cap) {
                inflateEnd(&z);
                ck_errf(err, errlen, "it holds more than the %zu MiB a tokenizer file may hold, uncompressed", cap >> 20);
                return -1;
            }
            size_t grown = room > cap / 2 ? cap : room * 2;
            if (buf_reserve(g, out, grown, "the decompressed text", err, errlen)) {
                inflateEnd(&z);
                return -1;
            }
            room = grown;
        }
        size_t want = room - len < PIECE ? room - len : PIECE;
        z.next_out = (unsigned char *)out->p + len;
        z.avail_out = (uInt)want;
        rc = inflate(&z, Z_NO_FLUSH);
        len += want - z.avail_out;
        if (rc == Z_STREAM_END) {
            /* another member may follow (gzip -c a b > c), or zeros that pad the file */
            const unsigned char *rest = z.next_in;
            size_t nrest = z.avail_in + in_left, k = 0;
            while (k < nrest && rest[k] == 0) k++;
            if (k == nrest) break;
            if (inflateReset(&z) != Z_OK) {
                inflateEnd(&z);
                ck_errf(err, errlen, "zlib failed");
                return -1;
            }
            continue;
        }
        if (rc == Z_BUF_ERROR && z.avail_in == 0 && in_left == 0) {
            inflateEnd(&z);
            ck_errf(err, errlen, "not a valid gzip file: it ends before the compressed data does");
            return -1;
        }
        if (rc != Z_OK && rc != Z_BUF_ERROR) {
            const char *why = z.msg ? z.msg : "bad data";
            char msg[128];
            snprintf(msg, sizeof msg, "%s", why);
            inflateEnd(&z);
            ck_errf(err, errlen, "not a valid gzip file: %s", msg);
            return -1;
        }
        if (ck_text_poll(g, (long long)(want - z.avail_out) + 1, err, errlen)) {
            inflateEnd(&z);
            return -1;
        }
    }
    inflateEnd(&z);
    out->p[len] = 0;
    out->len = len;
    return 0;
}

/* the text handed to jansson (which asks for 1 KiB at a time), with a poll
 * every JSON_PIECE bytes */
typedef struct reader {
    const char *s;
    size_t n, off, since;
    const ck_text_guard *g;
    int stopped;
} reader;

static size_t read_piece(void *buf, size_t len, void *ud)
{
    reader *r = ud;
    if (r->since >= JSON_PIECE) {
        if (r->g && r->g->poll && r->g->poll(r->g->pud, (long long)r->since)) {
            r->stopped = 1;
            return (size_t)-1;
        }
        r->since = 0;
    }
    size_t k = r->n - r->off < len ? r->n - r->off : len;
    memcpy(buf, r->s + r->off, k);
    r->off += k;
    r->since += k;
    return k;
}

json_t *ck_text_json(const char *s, size_t n, const ck_text_guard *g, size_t *read, char *err, size_t errlen)
{
    reader r = {s, n, 0, 0, g, 0};
    json_error_t je;
    json_t *j = json_load_callback(read_piece, &r, JSON_REJECT_DUPLICATES, &je);
    if (read) *read = r.off;
    if (r.stopped) {
        json_decref(j);
        ck_errf(err, errlen, "%s", CK_TEXT_STOPPED);
        return NULL;
    }
    if (!j) ck_errf(err, errlen, "line %d: %s", je.line, je.text);
    return j;
}
