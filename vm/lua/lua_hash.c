/* SHA-256 for scripts: ck.sha256(string) and ck.file_sha256(path), the
 * hashes the image dataset's cache keys are made of (stdlib/ck/imagedata.lua).
 * SHA-256 is written here from FIPS 180-4 (no crypto library is linked); a
 * file is opened through the sandbox's door and read in chunks, each charged
 * to the run limits, so a huge file stays interruptible. */
#include "lua/lua_ck.h"

#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef struct sha256 {
    uint32_t h[8];
    uint64_t len;      /* bytes hashed so far */
    unsigned char buf[64];
    size_t nbuf;       /* bytes waiting in buf */
} sha256;

/* FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube
 * roots of the first 64 primes */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_init(sha256 *s)
{
    /* 5.3.3: the fractional parts of the square roots of the first 8 primes */
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->nbuf = 0;
}

/* 6.2.2: one 512-bit block into the state */
static void sha256_block(sha256 *s, const unsigned char *p)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 | (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    uint32_t e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
    s->h[5] += f;
    s->h[6] += g;
    s->h[7] += h;
}

static void sha256_update(sha256 *s, const unsigned char *p, size_t n)
{
    s->len += n;
    if (s->nbuf) {
        size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, k);
        s->nbuf += k;
        p += k;
        n -= k;
        if (s->nbuf < 64) return;
        sha256_block(s, s->buf);
        s->nbuf = 0;
    }
    for (; n >= 64; p += 64, n -= 64) sha256_block(s, p);
    memcpy(s->buf, p, n);
    s->nbuf = n;
}

/* 5.1.1 padding (a 1 bit, zeros, the length in bits as 64 bits big-endian),
 * then the digest as 64 lowercase hex digits and a NUL into hex */
static void sha256_final(sha256 *s, char hex[65])
{
    uint64_t bits = s->len * 8;
    unsigned char pad[72] = {0x80};
    size_t npad = (s->nbuf < 56 ? 56 : 120) - s->nbuf;
    for (int i = 0; i < 8; i++) pad[npad + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_update(s, pad, npad + 8);
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        unsigned v = (s->h[i / 4] >> (24 - 8 * (i % 4))) & 0xff;
        hex[2 * i] = digits[v >> 4];
        hex[2 * i + 1] = digits[v & 15];
    }
    hex[64] = 0;
}

#define CHUNK 65536

/* ck.sha256(s) -> the SHA-256 of the string's bytes, 64 lowercase hex digits */
static int l_sha256(lua_State *L)
{
    size_t n;
    const unsigned char *p = (const unsigned char *)luaL_checklstring(L, 1, &n);
    sha256 s;
    sha256_init(&s);
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t k = n - off < CHUNK ? n - off : CHUNK;
        sha256_update(&s, p + off, k);
        ck_limits_charge(L, (long long)k / 64 + 1);
    }
    char hex[65];
    sha256_final(&s, hex);
    lua_pushstring(L, hex);
    return 1;
}

#define FDBOX_MT "ck.hashfd"

/* a file being hashed and its read buffer; the descriptor is closed by the
 * box's finalizer when an error (an interrupt at a charge) unwinds past it */
typedef struct fdbox {
    int fd;
    unsigned char buf[CHUNK];
} fdbox;

static int fdbox_gc(lua_State *L)
{
    fdbox *b = luaL_checkudata(L, 1, FDBOX_MT);
    if (b->fd >= 0) close(b->fd);
    b->fd = -1;
    return 0;
}

/* ck.file_sha256(path) -> the SHA-256 of the file's bytes as 64 lowercase hex
 * digits, or nil, "cannot read 'path': reason" when it cannot be opened or
 * read; a sandbox's denial raises as every open by name does */
static int l_file_sha256(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    fdbox *b = lua_newuserdatauv(L, sizeof(fdbox), 0);
    b->fd = -1;
    if (luaL_newmetatable(L, FDBOX_MT)) {
        lua_pushcfunction(L, fdbox_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
    }
    lua_setmetatable(L, -2);
    b->fd = ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0);
    if (b->fd < 0) {
        luaL_pushfail(L);
        lua_pushfstring(L, "cannot read '%s': %s", path, strerror(errno));
        return 2;
    }
    sha256 s;
    sha256_init(&s);
    for (;;) {
        ssize_t k = read(b->fd, b->buf, sizeof b->buf);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            close(b->fd);
            b->fd = -1;
            luaL_pushfail(L);
            lua_pushfstring(L, "cannot read '%s': %s", path, strerror(e));
            return 2;
        }
        if (k == 0) break;
        sha256_update(&s, b->buf, (size_t)k);
        ck_limits_charge(L, (long long)k / 64 + 1);
    }
    close(b->fd);
    b->fd = -1;
    char hex[65];
    sha256_final(&s, hex);
    lua_pushstring(L, hex);
    return 1;
}

void ck_lua_hash_register(lua_State *L, int lib)
{
    static const luaL_Reg funcs[] = {{"sha256", l_sha256}, {"file_sha256", l_file_sha256}, {NULL, NULL}};
    lua_pushvalue(L, lib);
    luaL_setfuncs(L, funcs, 0);
    lua_pop(L, 1);
}
