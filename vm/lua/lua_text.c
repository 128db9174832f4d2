/* ck.clip_tokenizer: CLIP's BPE tokenizer (vm/text/clip_bpe.h) for scripts.
 * Loads a tokenizer folder (vocab.json and merges.txt, or the tokenizer.json
 * transformers 5 saves, with the pad token of special_tokens_map.json or
 * tokenizer_config.json), a tokenizer.json, or CLIP's
 * bpe_simple_vocab_16e6.txt.gz, and encodes captions to ids: one frame of
 * max_length (77) or kohya-ss' chunks of 77 for --max_token_length 150/225,
 * cleaned by ftfy's fix_text (caption_fix = "ftfy", the default) or not.
 * Files open through the sandbox's door and are read by vm/text/text_file.h:
 * each buffer is charged to the VM's memory budget before it is made and
 * held by a box that a raise leaves to the collector; the reading polls the
 * VM's limits without raising, and the binding raises once it has let go. */
#include "lua/lua_ck.h"

#include "text/clip_bpe.h"
#include "text/text_file.h"
#include "util/memory.h"

#include <jansson.h>
#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOK_MT "ck.clip_tokenizer"
#define BOX_MT "ck.clip_box"

/* the most chunks encode_chunks makes (75 tokens each) */
#define MAX_CHUNKS 32

typedef struct ltok {
    ck_clip_bpe *t;
    int32_t pad;
} ltok;

/* What a raise must not leak: the file being read and its contents, a
 * parsed JSON tree and its charge, the scratch of a call and its charge, the
 * ids of a call. Its guard charges the VM's budget and polls the VM's
 * limits (stopped: a poll said stop; the binding raises that once the box is
 * emptied). */
typedef struct box {
    int fd; /* a file being read, or -1 */
    ck_text_buf file[2], gz;
    json_t *json;
    ck_json_charge jc;
    ck_text_guard g;
    lua_State *L;
    int stopped;
    ck_clip_scratch s;
    size_t s_charged;
    int32_t *ids;
    size_t nids, cap;
} box;

static void box_free(box *b)
{
    if (b->fd >= 0) close(b->fd);
    b->fd = -1;
    for (int i = 0; i < 2; i++) ck_text_buf_free(&b->g, &b->file[i]);
    ck_text_buf_free(&b->g, &b->gz);
    json_decref(b->json);
    b->json = NULL;
    ck_lua_json_give(&b->jc);
    ck_clip_scratch_free(&b->s);
    ck_text_give(&b->g, b->s_charged);
    b->s_charged = 0;
    free(b->ids);
    b->ids = NULL;
    b->nids = b->cap = 0;
}

static int box_gc(lua_State *L)
{
    box_free(luaL_checkudata(L, 1, BOX_MT));
    return 0;
}

static int guard_poll(void *ud, long long work)
{
    box *b = ud;
    if (!b->stopped && ck_lua_limits_stop(b->L, work)) b->stopped = 1;
    return b->stopped;
}

static box *new_box(lua_State *L)
{
    box *b = lua_newuserdatauv(L, sizeof *b, 0);
    memset(b, 0, sizeof *b);
    b->fd = -1;
    b->L = L;
    ck_mem_budget *budget = ck_mem_budget_of(L);
    b->g = (ck_text_guard){budget ? ck_mem_take_ud : NULL, budget ? ck_mem_give_ud : NULL, budget, guard_poll, b};
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

/* Raises err about path, or, when a poll stopped the work, what stopped it
 * (the interrupt, the callback budget), once the box has let go of all it
 * held. */
static int fail(lua_State *L, box *b, const char *path, const char *err)
{
    if (b->stopped) {
        box_free(b);
        ck_lua_limits_raise(L);
    }
    return ck_lua_raise(L, "clip_tokenizer: '%s': %s", path, err);
}

/* ---- files */

/* The whole of path into *out, charged and polled. 0, or -1 when it does
 * not exist and missing_ok; any other failure raises naming the file. */
static int read_whole(lua_State *L, box *b, const char *path, ck_text_buf *out, int missing_ok)
{
    ck_text_buf_free(&b->g, out);
    b->fd = ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0);
    if (b->fd < 0) {
        if (missing_ok && errno == ENOENT) return -1;
        return ck_lua_raise(L, "clip_tokenizer: cannot open '%s': %s", path, strerror(errno));
    }
    char err[256];
    if (ck_text_read_fd(b->fd, CK_TEXT_MAX_FILE, &b->g, out, err, sizeof err)) return fail(L, b, path, err);
    close(b->fd);
    b->fd = -1;
    return 0;
}

/* The JSON text in buf parsed into b->json, its values charged to the
 * budget (refused: once more after a full collection; then the refusal
 * names what the whole text would take, from what the part read took).
 * Raises naming path. */
static json_t *parse_json(lua_State *L, box *b, const char *path, const ck_text_buf *buf)
{
    char err[256];
    for (int tries = 0;; tries++) {
        size_t read = 0;
        ck_lua_json_charge_begin(L, &b->jc);
        b->json = ck_text_json(buf->p, buf->len, &b->g, &read, err, sizeof err);
        ck_lua_json_charge_end(&b->jc);
        if (!b->jc.refused) break;
        json_decref(b->json);
        b->json = NULL;
        const size_t took = b->jc.charged;
        ck_lua_json_give(&b->jc);
        if (tries) {
            const double whole = (double)took * ((double)buf->len / (double)(read ? read : 1));
            const size_t need = whole > (double)took ? (whole < (double)SIZE_MAX / 2 ? (size_t)whole : SIZE_MAX / 2) : took;
            char what[96], size[32], msg[320];
            ck_mem_text(buf->len, size, sizeof size);
            snprintf(what, sizeof what, "the values of its %s of JSON", size);
            if (ck_text_take(&b->g, need, what, msg, sizeof msg) == 0) {
                ck_text_give(&b->g, need);
                snprintf(msg, sizeof msg, "%s", b->jc.err);
            }
            ck_lua_raise(L, "clip_tokenizer: '%s': %s", path, msg);
            return NULL;
        }
        lua_gc(L, LUA_GCCOLLECT);
    }
    if (!b->json) {
        char msg[320];
        snprintf(msg, sizeof msg, "not JSON (%s)", err);
        fail(L, b, path, msg);
    }
    return b->json;
}

/* the parsed tree let go, and its charge */
static void drop_json(box *b)
{
    json_decref(b->json);
    b->json = NULL;
    ck_lua_json_give(&b->jc);
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
        const char *path = lua_pushfstring(L, "%s/%s", dir, names[i]);
        if (read_whole(L, b, path, &b->file[1], 1) < 0) {
            lua_pop(L, 1);
            continue;
        }
        json_t *j = parse_json(L, b, path, &b->file[1]);
        ck_text_buf_free(&b->g, &b->file[1]);
        if (!json_is_object(j)) return ck_lua_raise(L, "clip_tokenizer: '%s' is not a JSON object", path);
        json_t *p = json_object_get(j, "pad_token");
        const char *s = token_of(p);
        if (p && !json_is_null(p) && !s)
            return ck_lua_raise(L, "clip_tokenizer: '%s': pad_token is neither a string nor {\"content\": string}", path);
        if (s) {
            if (strlen(s) + 1 > outlen)
                return ck_lua_raise(L, "clip_tokenizer: '%s': pad_token is longer than %d bytes", path, (int)outlen - 1);
            strcpy(out, s);
            drop_json(b);
            lua_pop(L, 1);
            return 1;
        }
        drop_json(b);
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

/* the tables of a tokenizer folder: vocab.json and merges.txt (the slow
 * tokenizer's files) where both are there, else tokenizer.json */
static ck_clip_bpe *load_dir(lua_State *L, box *b, const char *dir, char *err, size_t errlen, const char **bad)
{
    const char *vpath = lua_pushfstring(L, "%s/vocab.json", dir);
    const char *mpath = lua_pushfstring(L, "%s/merges.txt", dir);
    const char *jpath = lua_pushfstring(L, "%s/tokenizer.json", dir); /* these stay on the stack */
    int has_v = read_whole(L, b, vpath, &b->file[0], 1) == 0;
    int has_m = read_whole(L, b, mpath, &b->file[1], 1) == 0;
    if (has_v && has_m) {
        parse_json(L, b, vpath, &b->file[0]);
        ck_text_buf_free(&b->g, &b->file[0]);
        ck_clip_bpe *t = ck_clip_bpe_from_vocab(b->json, b->file[1].p, b->file[1].len, &b->g, err, errlen);
        /* the message names vocab.json or a merges line */
        *bad = strstr(err, "merges") ? mpath : vpath;
        return t;
    }
    if (read_whole(L, b, jpath, &b->file[0], 1) < 0) {
        if (has_v || has_m)
            ck_lua_raise(L, "clip_tokenizer: cannot open '%s': %s (and '%s' has no tokenizer.json)", has_v ? mpath : vpath,
                         strerror(ENOENT), dir);
        ck_lua_raise(L, "clip_tokenizer: '%s' holds no tokenizer: neither vocab.json and merges.txt nor tokenizer.json", dir);
    }
    ck_text_buf_free(&b->g, &b->file[1]);
    parse_json(L, b, jpath, &b->file[0]);
    ck_text_buf_free(&b->g, &b->file[0]);
    *bad = jpath;
    return ck_clip_bpe_from_tokenizer_json(b->json, &b->g, err, errlen);
}

/* the tiny random text encoders' vocabulary, gzip's bytes (CMakeLists.txt
 * builds them in from tests/data/tokenizer/bpe_small.txt.gz) */
extern const unsigned char ck_tiny_vocab_gz[];
extern const size_t ck_tiny_vocab_gz_len;

/* ck.clip_tokenizer{dir = folder} or {json = "tokenizer.json"} or {bpe =
 * "bpe_simple_vocab_16e6.txt.gz"} or {merges = text (what such a file holds,
 * uncompressed)} or {tiny = true} (the first 3000 merges of open_clip's
 * vocabulary, which the tiny random text encoders use) [, pad = token|id]
 * [, caption_fix = "ftfy"|"none"]} */
static int l_clip_tokenizer(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    static const char *const sources[] = {"dir", "json", "bpe", "merges", "tiny"};
    int which = -1, given = 0;
    for (int i = 0; i < 5; i++)
        if (opt(L, 1, sources[i]) != LUA_TNIL) which = i, given++;
    lua_settop(L, 1);
    if (given != 1)
        return ck_lua_raise(L, "clip_tokenizer: give one of dir (a tokenizer folder), json (a tokenizer.json), bpe (a "
                               ".txt.gz), merges (its text) or tiny = true");
    if (which == 4 ? opt(L, 1, "tiny") != LUA_TBOOLEAN || !lua_toboolean(L, 2) : opt(L, 1, sources[which]) != LUA_TSTRING) /* 2 */
        return ck_lua_raise(L, "clip_tokenizer: %s must be %s", sources[which],
                            which == 4 ? "true" : which == 3 ? "a string" : "a path");
    opt(L, 1, "pad"); /* 3 */
    int fix = CK_CLIP_FIX_FTFY;
    int tf = opt(L, 1, "caption_fix"); /* 4 */
    if (tf != LUA_TNIL) {
        const char *f = tf == LUA_TSTRING ? lua_tostring(L, 4) : "";
        if (!strcmp(f, "none")) fix = CK_CLIP_FIX_NONE;
        else if (strcmp(f, "ftfy")) return ck_lua_raise(L, "clip_tokenizer: caption_fix must be \"ftfy\" or \"none\"");
    }
    box *b = new_box(L);                         /* 5 */
    ltok *k = lua_newuserdatauv(L, sizeof *k, 0); /* 6 */
    k->t = NULL;
    k->pad = -1;
    luaL_setmetatable(L, TOK_MT);
    char err[512] = "";
    const char *src = lua_tostring(L, 2), *bad = src;
    if (which == 0) {
        k->t = load_dir(L, b, src, err, sizeof err, &bad);
    } else if (which == 1) {
        read_whole(L, b, src, &b->file[0], 0);
        parse_json(L, b, src, &b->file[0]);
        ck_text_buf_free(&b->g, &b->file[0]);
        k->t = ck_clip_bpe_from_tokenizer_json(b->json, &b->g, err, sizeof err);
    } else if (which == 2) {
        read_whole(L, b, src, &b->file[0], 0);
        if (!ck_text_is_gzip(b->file[0].p, b->file[0].len)) return fail(L, b, src, "not a valid gzip file");
        if (ck_text_gunzip(b->file[0].p, b->file[0].len, CK_TEXT_MAX_FILE, &b->g, &b->gz, err, sizeof err))
            return fail(L, b, src, err);
        ck_text_buf_free(&b->g, &b->file[0]);
        k->t = ck_clip_bpe_from_merges(b->gz.p, b->gz.len, &b->g, err, sizeof err);
    } else if (which == 3) {
        size_t len;
        const char *text = lua_tolstring(L, 2, &len);
        k->t = ck_clip_bpe_from_merges(text, len, &b->g, err, sizeof err);
        bad = "the merges given";
    } else {
        bad = "the tiny vocabulary";
        if (ck_text_gunzip((const char *)ck_tiny_vocab_gz, ck_tiny_vocab_gz_len, CK_TEXT_MAX_FILE, &b->g, &b->gz, err,
                           sizeof err) == 0)
            k->t = ck_clip_bpe_from_merges(b->gz.p, b->gz.len, &b->g, err, sizeof err);
    }
    drop_json(b);
    if (!k->t) {
        if (which == 3 && !b->stopped) return ck_lua_raise(L, "clip_tokenizer: the merges given: %s", err);
        return fail(L, b, bad, err);
    }
    ck_clip_bpe_set_fix(k->t, fix);
    if (which == 0 && lua_isnil(L, 3)) {
        char pad[256];
        if (config_pad(L, src, b, pad, sizeof pad)) {
            char where[600];
            snprintf(where, sizeof where, " (the pad_token of '%s')", src);
            lua_pushstring(L, pad);
            set_pad(L, k, where);
            lua_pop(L, 1);
        }
    }
    if (!lua_isnil(L, 3)) {
        lua_pushvalue(L, 3);
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
    if (ck_grow(&b->ids, &b->cap, b->nids + 1, sizeof *b->ids, 256)) luaL_error(c->L, "clip tokenizer: out of memory");
    b->ids[b->nids++] = id;
    return c->stop && b->nids >= c->stop;
}

/* The scratch a call on n bytes of text may grow to, charged to the budget
 * while the call runs (the box gives it back): the cleanup's buffers, about
 * 40 bytes for each byte of text, and ftfy's, about 100 more; the result at
 * most one token for each byte and special token. */
static void charge_scratch(lua_State *L, box *b, ltok *k, size_t n, const char *what)
{
    size_t each = ck_clip_bpe_fix(k->t) == CK_CLIP_FIX_FTFY ? 160 : 56, bytes = (n + 1) * each;
    if (n + 1 > SIZE_MAX / each) bytes = SIZE_MAX;
    char msg[128], err[400], size[32];
    ck_mem_text(bytes, size, sizeof size);
    snprintf(msg, sizeof msg, "%s of %zu bytes of text (%s)", what, n, size);
    if (ck_text_take(&b->g, bytes, msg, err, sizeof err)) ck_lua_raise(L, "%s", err);
    b->s_charged = bytes;
}

/* the text at index i tokenized into c (ids into the box, or strings) */
static void run(lua_State *L, ltok *k, int i, run_ctx *c, const char *what)
{
    size_t n;
    const char *text = luaL_checklstring(L, i, &n);
    size_t bad = ck_clip_utf8_check(text, n);
    if (bad != n) ck_lua_raise(L, "%s: the text is not valid UTF-8 (byte %I)", what, (lua_Integer)bad + 1);
    charge_scratch(L, c->b, k, n, what);
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

/* tok:clean(text) -> the text as the pattern sees it: the caption fixed
 * (caption_fix), cleaned and lower-cased; special tokens are not split out */
static int l_clean(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    size_t n;
    const char *text = luaL_checklstring(L, 2, &n);
    lua_settop(L, 2);
    size_t bad = ck_clip_utf8_check(text, n);
    if (bad != n) ck_lua_raise(L, "clean: the text is not valid UTF-8 (byte %I)", (lua_Integer)bad + 1);
    box *b = new_box(L);
    charge_scratch(L, b, k, n, "clean");
    run_ctx c = {L, b, 0, 0, 0, 0};
    size_t len;
    const char *out = ck_clip_clean(text, n, ck_clip_bpe_fix(k->t), &b->s, &len, poll_cb, &c);
    if (!out) return ck_lua_raise(L, "clean: out of memory");
    lua_pushlstring(L, out, len);
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
    else if (!strcmp(key, "caption_fix")) lua_pushstring(L, ck_clip_bpe_fix(k->t) == CK_CLIP_FIX_FTFY ? "ftfy" : "none");
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
        {"clean", l_clean},
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
