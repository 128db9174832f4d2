/* ck.clip_tokenizer: CLIP's BPE tokenizer (vm/text/clip_bpe.h) for scripts.
 * Loads a tokenizer folder (vocab.json, merges.txt and the pad token of
 * special_tokens_map.json or tokenizer_config.json) or CLIP's
 * bpe_simple_vocab_16e6.txt.gz, and encodes captions to ids: one frame of
 * max_length (77) or kohya-ss' chunks of 77 for --max_token_length 150/225.
 * Files open through the sandbox's door; what a call allocates for its
 * input is checked against the memory budget first and held by a box that a
 * raise leaves to the collector. */
#include "lua/lua_ck.h"

#include "text/clip_bpe.h"

#include <jansson.h>
#include <lauxlib.h>
#include <zlib.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOK_MT "ck.clip_tokenizer"
#define BOX_MT "ck.clip_box"

/* the most a decompressed bpe file may hold (the real one: 1.4 MB) */
#define MAX_GUNZIP ((size_t)256 << 20)
/* the most chunks encode_chunks makes (75 tokens each) */
#define MAX_CHUNKS 32

typedef struct ltok {
    ck_clip_bpe *t;
    int32_t pad;
} ltok;

/* What a raise must not leak: file contents, scratch, the ids of a call. */
typedef struct box {
    int fd; /* a file being read, or -1 */
    char *file[2];
    size_t flen[2];
    char *gz;
    ck_clip_scratch s;
    int32_t *ids;
    size_t nids, cap;
} box;

static void box_free(box *b)
{
    if (b->fd >= 0) close(b->fd);
    for (int i = 0; i < 2; i++) free(b->file[i]);
    free(b->gz);
    ck_clip_scratch_free(&b->s);
    free(b->ids);
    memset(b, 0, sizeof *b);
    b->fd = -1;
}

static int box_gc(lua_State *L)
{
    box_free(luaL_checkudata(L, 1, BOX_MT));
    return 0;
}

static box *new_box(lua_State *L)
{
    box *b = lua_newuserdatauv(L, sizeof *b, 0);
    memset(b, 0, sizeof *b);
    b->fd = -1;
    luaL_setmetatable(L, BOX_MT);
    return b;
}

static int tok_gc(lua_State *L)
{
    ltok *k = luaL_checkudata(L, 1, TOK_MT);
    ck_clip_bpe_free(k->t);
    k->t = NULL;
    return 0;
}

static ltok *check_tok(lua_State *L, int i)
{
    ltok *k = luaL_checkudata(L, i, TOK_MT);
    if (!k->t) luaL_error(L, "clip tokenizer is closed");
    return k;
}

/* ---- files */

/* The whole of path into b->file[slot], its size checked against the
 * memory budget before it is read. 0, or -1 when it does not exist and
 * missing_ok; any other failure raises naming the file. */
static int read_whole(lua_State *L, const char *path, box *b, int slot, int missing_ok)
{
    b->fd = ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0);
    if (b->fd < 0) {
        if (missing_ok && errno == ENOENT) return -1;
        return ck_lua_raise(L, "clip_tokenizer: cannot open '%s': %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(b->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return ck_lua_raise(L, "clip_tokenizer: '%s' is not a regular file", path);
    size_t size = (size_t)st.st_size;
    ck_mem_check(L, (int64_t)size + 1, 1, "clip_tokenizer: '%s' (%zu bytes)", path, size);
    free(b->file[slot]);
    b->file[slot] = malloc(size + 1);
    if (!b->file[slot]) return ck_lua_raise(L, "clip_tokenizer: out of memory reading '%s'", path);
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(b->fd, b->file[slot] + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return ck_lua_raise(L, "clip_tokenizer: reading '%s' failed: %s", path,
                                r < 0 ? strerror(errno) : "the file shrank while it was read");
        got += (size_t)r;
        ck_limits_charge(L, 64);
    }
    close(b->fd);
    b->fd = -1;
    b->file[slot][size] = 0;
    b->flen[slot] = size;
    return 0;
}

/* gunzips b->file[0] into b->gz (its length in *outlen) */
static void gunzip(lua_State *L, const char *path, box *b, size_t *outlen)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 32) != Z_OK) ck_lua_raise(L, "clip_tokenizer: zlib failed to start on '%s'", path);
    size_t cap = b->flen[0] * 4 + 4096, len = 0;
    int rc = Z_OK;
    z.next_in = (unsigned char *)b->file[0];
    z.avail_in = (uInt)(b->flen[0] > UINT32_MAX ? UINT32_MAX : b->flen[0]);
    while (rc != Z_STREAM_END) {
        if (len == cap || !b->gz) {
            if (b->gz) cap *= 2;
            if (cap > MAX_GUNZIP) {
                inflateEnd(&z);
                ck_lua_raise(L, "clip_tokenizer: '%s' holds more than %d MiB uncompressed", path, (int)(MAX_GUNZIP >> 20));
            }
            char *g = realloc(b->gz, cap + 1);
            if (!g) {
                inflateEnd(&z);
                ck_lua_raise(L, "clip_tokenizer: out of memory decompressing '%s'", path);
            }
            b->gz = g;
        }
        z.next_out = (unsigned char *)b->gz + len;
        z.avail_out = (uInt)(cap - len);
        rc = inflate(&z, Z_NO_FLUSH);
        len = cap - z.avail_out;
        if (rc != Z_OK && rc != Z_STREAM_END && !(rc == Z_BUF_ERROR && z.avail_out == 0)) {
            const char *why = z.msg ? z.msg : rc == Z_BUF_ERROR ? "it ends before the compressed data does" : "bad data";
            inflateEnd(&z);
            ck_lua_raise(L, "clip_tokenizer: '%s' is not a valid gzip file: %s", path, why);
        }
        if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
            inflateEnd(&z);
            ck_lua_raise(L, "clip_tokenizer: '%s' is not a valid gzip file: it ends before the compressed data does", path);
        }
        ck_limits_charge(L, 4096);
    }
    inflateEnd(&z);
    b->gz[len] = 0;
    *outlen = len;
}

/* the string of a special token entry in a tokenizer's config: "tok" or
 * {"content": "tok", ...}; NULL if none */
static const char *token_of(json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* the pad token named by dir/special_tokens_map.json or, failing that,
 * dir/tokenizer_config.json, copied to out; 0 when neither names one */
static int config_pad(lua_State *L, const char *dir, box *b, char *out, size_t outlen)
{
    static const char *const names[] = {"special_tokens_map.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        luaL_Buffer lb;
        luaL_buffinit(L, &lb);
        luaL_addstring(&lb, dir);
        luaL_addchar(&lb, '/');
        luaL_addstring(&lb, names[i]);
        luaL_pushresult(&lb);
        const char *path = lua_tostring(L, -1);
        if (read_whole(L, path, b, 1, 1) < 0) {
            lua_pop(L, 1);
            continue;
        }
        json_error_t je;
        ck_json_charge jc;
        ck_lua_json_charge_begin(L, &jc);
        json_t *j = json_loadb(b->file[1], b->flen[1], 0, &je);
        ck_lua_json_charge_end(&jc);
        ck_lua_json_give(&jc); /* a small file, read here and freed below */
        if (jc.refused) {
            json_decref(j);
            return ck_lua_raise(L, "clip_tokenizer: '%s': %s", path, jc.err);
        }
        if (!j || !json_is_object(j)) {
            json_decref(j);
            return ck_lua_raise(L, "clip_tokenizer: '%s' is not a JSON object%s%s", path, j ? "" : ": ", j ? "" : je.text);
        }
        json_t *p = json_object_get(j, "pad_token");
        const char *s = token_of(p);
        if (p && !json_is_null(p) && !s) {
            json_decref(j);
            return ck_lua_raise(L, "clip_tokenizer: '%s': pad_token is neither a string nor {\"content\": string}", path);
        }
        if (s) {
            if (strlen(s) + 1 > outlen) {
                json_decref(j);
                return ck_lua_raise(L, "clip_tokenizer: '%s': pad_token is longer than %d bytes", path, (int)outlen - 1);
            }
            strcpy(out, s);
            json_decref(j);
            lua_pop(L, 1);
            return 1;
        }
        json_decref(j);
        lua_pop(L, 1);
    }
    return 0;
}

/* opts[key] read raw */
static int opt(lua_State *L, int t, const char *key)
{
    lua_pushstring(L, key);
    return lua_rawget(L, t);
}

/* the pad at the stack top (a token or an id) into k */
static void set_pad(lua_State *L, ltok *k, const char *where)
{
    if (lua_type(L, -1) == LUA_TSTRING) {
        size_t n;
        const char *s = lua_tolstring(L, -1, &n);
        int32_t id = ck_clip_bpe_id(k->t, s, n);
        if (id < 0) ck_lua_raise(L, "clip_tokenizer: pad token '%s'%s is not in the vocabulary", s, where);
        /* a pad token given by name is a special token, as transformers
         * makes it: split out of captions (SDXL's second tokenizer turns a
         * lone "!" into its pad id 0 so) */
        if (ck_clip_bpe_add_special(k->t, s, n))
            ck_lua_raise(L, "clip_tokenizer: pad token '%s' cannot be made a special token", s);
        k->pad = id;
    } else if (lua_isinteger(L, -1)) {
        lua_Integer id = lua_tointeger(L, -1);
        if (id < 0 || id >= ck_clip_bpe_vocab_size(k->t))
            ck_lua_raise(L, "clip_tokenizer: pad id %I is outside the vocabulary (%d entries)", id,
                         (int)ck_clip_bpe_vocab_size(k->t));
        k->pad = (int32_t)id;
    } else {
        ck_lua_raise(L, "clip_tokenizer: pad must be a token (\"!\", \"<|endoftext|>\") or an id, got %s",
                     luaL_typename(L, -1));
    }
}

/* ck.clip_tokenizer{dir = folder} or {bpe = "bpe_simple_vocab_16e6.txt.gz"} or {merges = text (what such a
 * file holds, uncompressed)} [, pad = token|id]} */
static int l_clip_tokenizer(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    int has_dir = opt(L, 1, "dir") != LUA_TNIL; /* 2 */
    int has_bpe = opt(L, 1, "bpe") != LUA_TNIL; /* 3 */
    opt(L, 1, "pad");                           /* 4 */
    const int has_text = opt(L, 1, "merges") != LUA_TNIL; /* 5 */
    if (has_dir + has_bpe + has_text != 1)
        return ck_lua_raise(L, "clip_tokenizer: give one of dir (a tokenizer folder), bpe (a .txt.gz) or merges (its text)");
    if (has_text) {
        if (lua_type(L, 5) != LUA_TSTRING) return ck_lua_raise(L, "clip_tokenizer: merges must be a string");
        lua_replace(L, 3); /* the text where bpe's path would be */
    } else {
        lua_pop(L, 1);
    }
    if (!lua_isstring(L, has_dir ? 2 : 3) || lua_type(L, has_dir ? 2 : 3) != LUA_TSTRING)
        return ck_lua_raise(L, "clip_tokenizer: %s must be a path", has_dir ? "dir" : "bpe");
    box *b = new_box(L); /* 5 */
    ltok *k = lua_newuserdatauv(L, sizeof *k, 0); /* 6 */
    k->t = NULL;
    k->pad = -1;
    luaL_setmetatable(L, TOK_MT);
    char err[512];
    if (has_dir) {
        const char *dir = lua_tostring(L, 2);
        lua_pushfstring(L, "%s/vocab.json", dir);  /* 7 */
        lua_pushfstring(L, "%s/merges.txt", dir);  /* 8 */
        read_whole(L, lua_tostring(L, 7), b, 0, 0);
        read_whole(L, lua_tostring(L, 8), b, 1, 0);
        ck_mem_check(L, (int64_t)(b->flen[0] + b->flen[1]), 8, "clip_tokenizer: the tables of '%s'", dir);
        ck_json_charge jc;
        ck_lua_json_charge_begin(L, &jc);
        k->t = ck_clip_bpe_from_files(b->file[0], b->flen[0], b->file[1], b->flen[1], err, sizeof err);
        ck_lua_json_charge_end(&jc);
        ck_lua_json_give(&jc); /* vocab.json's values, freed once its tables are built */
        if (jc.refused) {
            ck_clip_bpe_free(k->t);
            k->t = NULL;
            return ck_lua_raise(L, "clip_tokenizer: '%s': %s", lua_tostring(L, 7), jc.err);
        }
        if (!k->t) {
            /* the message names vocab.json or a merges line */
            const char *bad = strstr(err, "vocab.json") ? lua_tostring(L, 7) : lua_tostring(L, 8);
            return ck_lua_raise(L, "clip_tokenizer: '%s': %s", bad, err);
        }
        if (lua_isnil(L, 4)) {
            char pad[256];
            if (config_pad(L, dir, b, pad, sizeof pad)) {
                char where[600];
                snprintf(where, sizeof where, " (the pad_token of '%s')", dir);
                lua_pushstring(L, pad);
                set_pad(L, k, where);
                lua_pop(L, 1);
            }
        }
    } else if (has_text) {
        size_t len = 0;
        const char *text = lua_tolstring(L, 3, &len);
        ck_mem_check(L, (int64_t)len, 8, "clip_tokenizer: the tables of the merges given");
        k->t = ck_clip_bpe_from_merges(text, len, err, sizeof err);
        if (!k->t) return ck_lua_raise(L, "clip_tokenizer: the merges given: %s", err);
    } else {
        const char *path = lua_tostring(L, 3);
        read_whole(L, path, b, 0, 0);
        size_t len = 0;
        gunzip(L, path, b, &len);
        ck_mem_check(L, (int64_t)len, 8, "clip_tokenizer: the tables of '%s'", path);
        k->t = ck_clip_bpe_from_merges(b->gz, len, err, sizeof err);
        if (!k->t) return ck_lua_raise(L, "clip_tokenizer: '%s': %s", path, err);
    }
    if (!lua_isnil(L, 4)) {
        lua_pushvalue(L, 4);
        set_pad(L, k, "");
        lua_pop(L, 1);
    }
    if (k->pad < 0) k->pad = ck_clip_bpe_eos(k->t);
    box_free(b);
    lua_pushvalue(L, 6);
    return 1;
}

/* ---- encoding */

typedef struct run_ctx {
    lua_State *L;
    box *b;
    size_t stop; /* ids after which to stop (0: none) */
    int strings; /* tokenize: push token strings to the table at index tbl */
    int tbl;
    lua_Integer n;
} run_ctx;

static void poll_cb(void *ud, long long work) { ck_limits_charge(((run_ctx *)ud)->L, work); }

static int emit_cb(void *ud, int32_t id, const char *tok, size_t n)
{
    run_ctx *c = ud;
    if (c->strings) {
        lua_pushlstring(c->L, tok, n);
        lua_rawseti(c->L, c->tbl, ++c->n);
        return 0;
    }
    box *b = c->b;
    if (b->nids == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p) luaL_error(c->L, "clip tokenizer: out of memory");
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->nids++] = id;
    return c->stop && b->nids >= c->stop;
}

/* the text at index i tokenized into c (ids into the box, or strings) */
static void run(lua_State *L, ltok *k, int i, run_ctx *c, const char *what)
{
    size_t n;
    const char *text = luaL_checklstring(L, i, &n);
    size_t bad = ck_clip_utf8_check(text, n);
    if (bad != n) ck_lua_raise(L, "%s: the text is not valid UTF-8 (byte %I)", what, (lua_Integer)bad + 1);
    /* the cleanup's buffers: about 40 bytes for each byte of text; the
     * result: at most one token for each byte and special token */
    ck_mem_check(L, (int64_t)n + 1, 56, "%s of %zu bytes of text", what, n);
    if (ck_clip_bpe_run(k->t, text, n, &c->b->s, emit_cb, c, poll_cb, c))
        ck_lua_raise(L, "%s: out of memory", what);
}

static void push_ids(lua_State *L, const int32_t *ids, size_t n)
{
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

/* tok:encode(text [, {max_length = 77, pad = true}]) -> {ids}: BOS, the
 * caption's tokens cut to max_length - 2, EOS, then tok.pad up to
 * max_length unless pad = false. max_length = false: every token, no cut
 * and no padding. */
static int l_encode(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    luaL_checkstring(L, 2);
    lua_Integer max_length = 77;
    int pad = 1;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        int t = opt(L, 3, "max_length");
        if (t == LUA_TBOOLEAN && !lua_toboolean(L, -1)) max_length = 0;
        else if (t != LUA_TNIL) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 2 || lua_tointeger(L, -1) > (1 << 24))
                return ck_lua_raise(L, "encode: max_length must be an integer in [2, 2^24] or false");
            max_length = lua_tointeger(L, -1);
        }
        lua_pop(L, 1);
        t = opt(L, 3, "pad");
        if (t != LUA_TNIL && t != LUA_TBOOLEAN) return ck_lua_raise(L, "encode: pad must be true or false");
        if (t != LUA_TNIL) pad = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    lua_settop(L, 2);
    box *b = new_box(L);
    run_ctx c = {L, b, max_length ? (size_t)max_length - 2 : 0, 0, 0, 0};
    if (max_length == 0 || max_length > 2) run(L, k, 2, &c, "encode");
    if (max_length == 0) {
        size_t n = b->nids;
        ck_mem_check(L, (int64_t)n + 2, 16, "encode: a list of %zu ids", n + 2);
        lua_createtable(L, (int)n + 2, 0);
        lua_pushinteger(L, ck_clip_bpe_bos(k->t));
        lua_rawseti(L, -2, 1);
        for (size_t i = 0; i < n; i++) {
            lua_pushinteger(L, b->ids[i]);
            lua_rawseti(L, -2, (lua_Integer)i + 2);
        }
        lua_pushinteger(L, ck_clip_bpe_eos(k->t));
        lua_rawseti(L, -2, (lua_Integer)n + 2);
    } else {
        ck_mem_check(L, max_length, 20, "encode: a list of %lld ids", (long long)max_length);
        int32_t *out = malloc((size_t)max_length * sizeof *out);
        if (!out) return ck_lua_raise(L, "encode: out of memory");
        int n = ck_clip_frame(k->t, b->ids, b->nids, (int)max_length, pad ? k->pad : -1, out);
        free(b->ids);
        b->ids = out; /* held by the box from here */
        b->cap = (size_t)max_length;
        push_ids(L, out, (size_t)n);
    }
    box_free(b);
    return 1;
}

/* tok:encode_chunks(text, max_token_length) -> k lists of 77 ids
 * (k = max_token_length / 75), as kohya-ss sd-scripts makes them for
 * --max_token_length 150 or 225 (ck_clip_chunks) */
static int l_encode_chunks(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    luaL_checkstring(L, 2);
    if (!lua_isinteger(L, 3) || lua_tointeger(L, 3) < 75 || lua_tointeger(L, 3) % 75 ||
        lua_tointeger(L, 3) > 75 * MAX_CHUNKS)
        return ck_lua_raise(L, "encode_chunks: max_token_length must be 75, 150, 225, ... (a multiple of 75, at most %d)",
                            75 * MAX_CHUNKS);
    int nk = (int)(lua_tointeger(L, 3) / 75);
    lua_settop(L, 3);
    box *b = new_box(L);
    run_ctx c = {L, b, (size_t)75 * nk, 0, 0, 0};
    run(L, k, 2, &c, "encode_chunks");
    int32_t out[77 * MAX_CHUNKS];
    ck_clip_chunks(k->t, b->ids, b->nids, nk, k->pad, out);
    lua_createtable(L, nk, 0);
    for (int i = 0; i < nk; i++) {
        push_ids(L, out + 77 * i, 77);
        lua_rawseti(L, -2, i + 1);
    }
    box_free(b);
    return 1;
}

/* tok:tokenize(text) -> {token strings} (the BPE symbols, "</w>" marking a
 * word's end; no BOS or EOS) */
static int l_tokenize(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    luaL_checkstring(L, 2);
    lua_settop(L, 2);
    box *b = new_box(L); /* 3 */
    lua_newtable(L);      /* 4 */
    run_ctx c = {L, b, 0, 1, 4, 0};
    run(L, k, 2, &c, "tokenize");
    box_free(b);
    return 1;
}

static int tok_index(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    const char *key = luaL_checkstring(L, 2);
    if (!strcmp(key, "vocab_size")) lua_pushinteger(L, ck_clip_bpe_vocab_size(k->t));
    else if (!strcmp(key, "bos")) lua_pushinteger(L, ck_clip_bpe_bos(k->t));
    else if (!strcmp(key, "eos")) lua_pushinteger(L, ck_clip_bpe_eos(k->t));
    else if (!strcmp(key, "pad")) lua_pushinteger(L, k->pad);
    else {
        lua_pushvalue(L, 2);
        lua_rawget(L, lua_upvalueindex(1));
    }
    return 1;
}

void ck_lua_text_register(lua_State *L, int lib)
{
    static const luaL_Reg methods[] = {
        {"encode", l_encode},
        {"encode_chunks", l_encode_chunks},
        {"tokenize", l_tokenize},
        {NULL, NULL},
    };
    luaL_newmetatable(L, BOX_MT);
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    luaL_newmetatable(L, TOK_MT);
    luaL_newlib(L, methods);
    lua_pushcclosure(L, tok_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, tok_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    lua_pushcfunction(L, l_clip_tokenizer);
    lua_setfield(L, lib, "clip_tokenizer");
}
