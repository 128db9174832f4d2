/* ck.t5_tokenizer: the T5 tokenizer (vm/text/spm_tok.h) for scripts. Reads
 * an spiece.model or a tokenizer.json (a folder: tokenizer.json first, as
 * transformers does, with the token names of tokenizer_config.json or
 * special_tokens_map.json) and encodes captions to ids and an attention mask.
 *
 * Every file opens through the sandbox's door and is read 1 MiB at a time
 * with a poll of interrupts and limits between reads, its size charged to
 * the memory budget before it is read; the model is checked by ckrun's own
 * reader (vm/text/spm_model.h) and everything built from it is charged as it
 * is made. libsentencepiece's own calls, which nothing can poll, run in a
 * worker thread while this one polls every 20 ms: an interrupt raises at
 * once and the worker, left to finish, frees what it holds. What a raise
 * must not leak is held by a box that a raise leaves to the collector. */
#define _GNU_SOURCE
#include "lua/lua_ck.h"

#include "text/spm_model.h"
#include "text/spm_shim.h"
#include "text/spm_tok.h"

#include <jansson.h>
#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TOK_MT "ck.t5_tokenizer"
#define BOX_MT "ck.t5_box"

#define READ_CHUNK ((size_t)1 << 20)
#define MAX_JSON ((size_t)128 << 20)  /* tokenizer.json (mT5's: 16 MB) */
#define MAX_CONFIG ((size_t)1 << 20)  /* tokenizer_config.json, special_tokens_map.json */
/* a piece of text longer than this goes to the library in the worker */
#define INLINE_PIECE 32768
/* what libsentencepiece holds per piece of a loaded model and per byte of a
 * piece of text it segments (measured with 0.1.97: about 400 and 140 bytes),
 * charged before the call */
#define LIB_PER_PIECE 512
#define LIB_PER_BYTE 160
#define MAX_LENGTH (1 << 24)

/* ---- a library call in a worker thread */

typedef struct job {
    atomic_int refs; /* the caller's and the worker's */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    /* load: proto (owned) -> model; encode: model (a reference), text (owned) -> ids */
    uint8_t *proto;
    size_t plen;
    ck_spmp *model;
    char *text;
    size_t tlen;
    int *ids;
    size_t nids;
    int rc;
    char err[256];
} job;

static void job_release(job *j)
{
    if (atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->proto);
    free(j->text);
    free(j->ids);
    ck_spmp_unref(j->model);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

static int job_emit(void *ud, const int *ids, size_t n)
{
    job *j = ud;
    j->ids = malloc((n ? n : 1) * sizeof *ids);
    if (!j->ids) return 1;
    memcpy(j->ids, ids, n * sizeof *ids);
    j->nids = n;
    return 0;
}

static void job_run(job *j)
{
    if (j->text) {
        j->rc = ck_spmp_encode(j->model, j->text, j->tlen, job_emit, j, j->err, sizeof j->err);
        if (j->rc == -2) snprintf(j->err, sizeof j->err, "out of memory for the ids");
    } else {
        j->model = ck_spmp_load(j->proto, j->plen, j->err, sizeof j->err);
        j->rc = j->model ? 0 : -1;
    }
}

static void *job_thread(void *ud)
{
    job *j = ud;
    job_run(j);
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_release(j);
    return NULL;
}

/* ---- what a raise must not leak */

typedef struct box {
    int fd; /* a file being read, or -1 */
    uint8_t *file;
    size_t flen, file_charged;
    json_t *root;
    ck_json_charge jc;
    ck_spm_model m;
    uint8_t *proto;
    size_t proto_charged;
    job *job;                /* a library call under way (released by the collector) */
    size_t job_charged;
    ck_spm_scratch s;
    int32_t *ids;
    size_t nids, cap, ids_charged;
    ck_spm_charge charge;
} box;

static void box_free(box *b)
{
    if (b->fd >= 0) close(b->fd);
    b->fd = -1;
    free(b->file);
    b->file = NULL;
    json_decref(b->root);
    b->root = NULL;
    ck_lua_json_give(&b->jc);
    ck_spm_model_free(&b->m);
    free(b->proto);
    b->proto = NULL;
    if (b->job) job_release(b->job);
    b->job = NULL;
    ck_spm_scratch_free(&b->s);
    free(b->ids);
    b->ids = NULL;
    b->nids = b->cap = 0;
    const size_t n = b->file_charged + b->proto_charged + b->job_charged + b->ids_charged;
    if (n && b->charge.give) b->charge.give(b->charge.ud, n);
    b->file_charged = b->proto_charged = b->job_charged = b->ids_charged = 0;
}

static int box_gc(lua_State *L)
{
    box_free(luaL_checkudata(L, 1, BOX_MT));
    return 0;
}

static void set_charge(lua_State *L, ck_spm_charge *c)
{
    ck_mem_budget *budget = ck_mem_budget_of(L);
    *c = (ck_spm_charge){budget ? ck_mem_take_ud : NULL, budget ? ck_mem_give_ud : NULL, budget};
}

static box *new_box(lua_State *L)
{
    box *b = lua_newuserdatauv(L, sizeof *b, 0);
    memset(b, 0, sizeof *b);
    b->fd = -1;
    set_charge(L, &b->charge);
    b->s.charge = &b->charge;
    luaL_setmetatable(L, BOX_MT);
    return b;
}

/* charges n bytes to b's budget under *slot, or raises with what */
static void charge(lua_State *L, box *b, size_t *slot, size_t n, const char *what, const char *path)
{
    char err[400];
    if (b->charge.take && b->charge.take(b->charge.ud, n, what, err, sizeof err)) {
        if (path) ck_lua_raise(L, "t5_tokenizer: '%s': %s", path, err);
        ck_lua_raise(L, "%s", err);
    }
    *slot += n;
}

static void poll_cb(void *ud, long long work) { ck_limits_charge((lua_State *)ud, work); }

/* waits for j (started, or run here when no thread could start), polling */
static void job_wait(lua_State *L, job *j)
{
    pthread_mutex_lock(&j->mu);
    while (!j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->done) break;
        pthread_mutex_unlock(&j->mu);
        ck_limits_charge(L, 4096); /* may raise: the box then releases the job */
        pthread_mutex_lock(&j->mu);
    }
    pthread_mutex_unlock(&j->mu);
}

static job *job_start(lua_State *L, box *b)
{
    job *j = calloc(1, sizeof *j);
    if (!j) ck_lua_raise(L, "t5_tokenizer: out of memory");
    atomic_init(&j->refs, 1);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    b->job = j;
    return j;
}

/* runs b->job in a worker (or here, where no thread starts) and waits */
static void job_go(lua_State *L, box *b)
{
    job *j = b->job;
    atomic_fetch_add(&j->refs, 1);
    pthread_attr_t at;
    pthread_t th;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    const int started = pthread_create(&th, &at, job_thread, j) == 0;
    pthread_attr_destroy(&at);
    if (!started) {
        job_run(j);
        j->done = 1;
        atomic_fetch_sub(&j->refs, 1);
        return;
    }
    job_wait(L, j);
}

/* ---- files */

/* The whole of path (at most max bytes) into b->file, charged first, read a
 * chunk at a time with a poll between chunks. 0, or -1 when it does not
 * exist and missing_ok; any other failure raises naming the file. */
static int read_whole(lua_State *L, const char *path, box *b, size_t max, int missing_ok)
{
    b->fd = ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0);
    if (b->fd < 0) {
        if (missing_ok && errno == ENOENT) return -1;
        return ck_lua_raise(L, "t5_tokenizer: cannot open '%s': %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(b->fd, &st) != 0 || !S_ISREG(st.st_mode)) return ck_lua_raise(L, "t5_tokenizer: '%s' is not a regular file", path);
    const size_t size = (size_t)st.st_size;
    if (size > max)
        return ck_lua_raise(L, "t5_tokenizer: '%s' is %I bytes, more than the %I such a file may hold", path, (lua_Integer)size,
                            (lua_Integer)max);
    free(b->file);
    b->file = NULL;
    if (b->file_charged && b->charge.give) b->charge.give(b->charge.ud, b->file_charged);
    b->file_charged = 0;
    char what[64];
    snprintf(what, sizeof what, "the file's %zu bytes", size);
    charge(L, b, &b->file_charged, size + 1, what, path);
    b->file = malloc(size + 1);
    if (!b->file) return ck_lua_raise(L, "t5_tokenizer: out of memory reading '%s'", path);
    size_t got = 0;
    while (got < size) {
        const size_t want = size - got < READ_CHUNK ? size - got : READ_CHUNK;
        const ssize_t r = read(b->fd, b->file + got, want);
        if (r < 0 && errno == EINTR) {
            ck_limits_charge(L, 0);
            continue;
        }
        if (r <= 0)
            return ck_lua_raise(L, "t5_tokenizer: reading '%s' failed: %s", path,
                                r < 0 ? strerror(errno) : "the file shrank while it was read");
        got += (size_t)r;
        ck_limits_charge(L, (long long)r / 256 + 1);
    }
    close(b->fd);
    b->fd = -1;
    b->file[size] = 0;
    b->flen = size;
    return 0;
}

/* the interrupt and limit check between the pieces jansson reads; it must
 * not jump out of jansson, so it runs protected and a raise stops the parse */
typedef struct jreader {
    lua_State *L;
    const char *s;
    size_t n, off;
    int raised; /* 1: an error is on the stack; 2: the heap was out of memory */
} jreader;

static int poll_protected(lua_State *L)
{
    ck_limits_charge(L, 4096);
    return 0;
}

static size_t jread(void *buf, size_t len, void *ud)
{
    jreader *r = ud;
    if (r->raised) return (size_t)-1;
    if (r->off) {
        lua_pushcfunction(r->L, poll_protected);
        const int st = lua_pcall(r->L, 0, 0, 0);
        if (st != LUA_OK) {
            r->raised = st == LUA_ERRMEM ? 2 : 1;
            if (st == LUA_ERRMEM) lua_pop(r->L, 1);
            return (size_t)-1;
        }
    }
    size_t k = r->n - r->off < len ? r->n - r->off : len;
    if (k > 65536) k = 65536;
    memcpy(buf, r->s + r->off, k);
    r->off += k;
    return k;
}

/* b->file parsed into b->root (charged while it lives). A parse that the
 * memory limit stops is refused with what the whole text would take,
 * extrapolated from the part read, as ck.json_decode words it. */
static void parse_json(lua_State *L, const char *path, box *b)
{
    json_error_t je;
    jreader r = {L, (const char *)b->file, b->flen, 0, 0};
    ck_lua_json_charge_begin(L, &b->jc);
    b->root = json_load_callback(jread, &r, JSON_REJECT_DUPLICATES, &je);
    ck_lua_json_charge_end(&b->jc);
    if (r.raised == 1) {
        json_decref(b->root);
        b->root = NULL;
        ck_lua_json_give(&b->jc);
        lua_error(L); /* the interrupt or limit error */
    }
    if (b->jc.refused || r.raised == 2) {
        const size_t took = b->jc.charged, read = r.off ? r.off : 1;
        json_decref(b->root);
        b->root = NULL;
        ck_lua_json_give(&b->jc);
        ck_mem_budget *budget = ck_mem_budget_of(L);
        const double whole = (double)took * ((double)b->flen / (double)read);
        const size_t est = whole < (double)SIZE_MAX / 2 ? (size_t)whole : SIZE_MAX / 2, need = est > took ? est : took;
        char what[96], size[32], msg[300];
        ck_mem_text(b->flen, size, sizeof size);
        snprintf(what, sizeof what, "the values of %s of JSON text", size);
        if (ck_mem_take(budget, need, what, msg, sizeof msg) == 0) {
            ck_mem_give(budget, need);
            snprintf(msg, sizeof msg, "%s", b->jc.err[0] ? b->jc.err : "out of memory while parsing it");
        }
        ck_lua_raise(L, "t5_tokenizer: '%s': %s", path, msg);
    }
    if (!b->root) ck_lua_raise(L, "t5_tokenizer: '%s' is not valid JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
}

/* ---- the token names of a folder's config files */

typedef struct names {
    char pad[257], eos[257], unk[257];
    int has_pad, has_eos, has_unk;
    int extra_ids;
} names;

/* "tok" or {"content": "tok"} */
static const char *token_of(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content"))) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static void config_file(lua_State *L, const char *path, box *b, names *nm)
{
    if (read_whole(L, path, b, MAX_CONFIG, 1) < 0) return;
    parse_json(L, path, b);
    if (!json_is_object(b->root)) ck_lua_raise(L, "t5_tokenizer: '%s' is not a JSON object", path);
    static const char *const keys[] = {"pad_token", "eos_token", "unk_token"};
    char *const dst[] = {nm->pad, nm->eos, nm->unk};
    int *const has[] = {&nm->has_pad, &nm->has_eos, &nm->has_unk};
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_object_get(b->root, keys[i]);
        if (!v || json_is_null(v) || *has[i]) continue;
        const char *s = token_of(v);
        if (!s) ck_lua_raise(L, "t5_tokenizer: '%s': %s is neither a string nor {\"content\": string}", path, keys[i]);
        if (strlen(s) > 256) ck_lua_raise(L, "t5_tokenizer: '%s': %s is longer than 256 bytes", path, keys[i]);
        strcpy(dst[i], s);
        *has[i] = 1;
    }
    const json_t *e = json_object_get(b->root, "extra_ids");
    if (e && nm->extra_ids < 0) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > CK_SPM_MAX_EXTRA_IDS)
            ck_lua_raise(L, "t5_tokenizer: '%s': extra_ids is not an integer from 0 to %d", path, CK_SPM_MAX_EXTRA_IDS);
        nm->extra_ids = (int)json_integer_value(e);
    }
    json_decref(b->root);
    b->root = NULL;
    ck_lua_json_give(&b->jc);
}

/* ---- the tokenizer */

typedef struct ltok {
    ck_spm_tok t;
    ck_spmp *model;
    ck_spm_charge charge; /* t's memory is charged through it */
    size_t lib_charged;   /* the estimate charged for the library's model */
} ltok;

static int tok_gc(lua_State *L)
{
    ltok *k = luaL_checkudata(L, 1, TOK_MT);
    ck_spm_tok_free(&k->t);
    ck_spmp_unref(k->model);
    k->model = NULL;
    if (k->lib_charged && k->charge.give) k->charge.give(k->charge.ud, k->lib_charged);
    k->lib_charged = 0;
    return 0;
}

static ltok *check_tok(lua_State *L, int i)
{
    ltok *k = luaL_checkudata(L, i, TOK_MT);
    if (!k->model) luaL_error(L, "t5 tokenizer is closed");
    return k;
}

static int is_dir(lua_State *L, const char *path)
{
    const int fd = ck_lua_open(L, path, CK_ACCESS_READ | CK_ACCESS_DIR, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

/* the string opts[key] (at most 256 bytes) into dst, if given */
static void opt_name(lua_State *L, int opts, const char *key, char *dst, int *has)
{
    if (opts == 0 || lua_getfield(L, opts, key) == LUA_TNIL) {
        if (opts) lua_pop(L, 1);
        return;
    }
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    if (lua_type(L, -1) != LUA_TSTRING || n > 256) ck_lua_raise(L, "t5_tokenizer: %s must be a token (a string of at most 256 bytes)", key);
    memcpy(dst, s, n + 1);
    *has = 1;
    lua_pop(L, 1);
}

/* ck.t5_tokenizer(path [, {extra_ids = 100, pad = "<pad>", eos = "</s>", unk = "<unk>"}]) */
static int l_t5_tokenizer(lua_State *L)
{
    const char *arg = luaL_checkstring(L, 1);
    int opts = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        opts = 2;
    }
    lua_settop(L, 2);
    names nm;
    memset(&nm, 0, sizeof nm);
    nm.extra_ids = -1;
    opt_name(L, opts, "pad", nm.pad, &nm.has_pad);
    opt_name(L, opts, "eos", nm.eos, &nm.has_eos);
    opt_name(L, opts, "unk", nm.unk, &nm.has_unk);
    if (opts && lua_getfield(L, opts, "extra_ids") != LUA_TNIL) {
        if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 || lua_tointeger(L, -1) > CK_SPM_MAX_EXTRA_IDS)
            return ck_lua_raise(L, "t5_tokenizer: extra_ids must be an integer from 0 to %d", CK_SPM_MAX_EXTRA_IDS);
        nm.extra_ids = (int)lua_tointeger(L, -1);
    }
    lua_settop(L, 2);
    box *b = new_box(L); /* 3 */
    ltok *k = lua_newuserdatauv(L, sizeof *k, 0); /* 4 */
    memset(k, 0, sizeof *k);
    set_charge(L, &k->charge);
    luaL_setmetatable(L, TOK_MT);

    /* the file: a folder's tokenizer.json, else its spiece.model */
    const char *path = arg;
    if (is_dir(L, arg)) {
        lua_pushfstring(L, "%s/tokenizer_config.json", arg);
        config_file(L, lua_tostring(L, -1), b, &nm);
        lua_pushfstring(L, "%s/special_tokens_map.json", arg);
        config_file(L, lua_tostring(L, -1), b, &nm);
        lua_settop(L, 4);
        lua_pushfstring(L, "%s/tokenizer.json", arg); /* 5 */
        lua_pushfstring(L, "%s/spiece.model", arg);   /* 6 */
        if (read_whole(L, lua_tostring(L, 5), b, MAX_JSON, 1) == 0) {
            path = lua_tostring(L, 5);
        } else if (read_whole(L, lua_tostring(L, 6), b, CK_SPM_MAX_FILE, 1) == 0) {
            path = lua_tostring(L, 6);
        } else {
            return ck_lua_raise(L, "t5_tokenizer: '%s' holds neither tokenizer.json nor spiece.model", arg);
        }
    } else {
        read_whole(L, arg, b, MAX_JSON, 0);
    }
    const ck_spm_config cfg = {nm.has_pad ? nm.pad : NULL, nm.has_eos ? nm.eos : NULL, nm.has_unk ? nm.unk : NULL, nm.extra_ids};
    char err[512];
    size_t first = 0;
    while (first < b->flen && strchr(" \t\r\n", b->file[first])) first++;
    int rc;
    if (first < b->flen && b->file[first] == '{') {
        parse_json(L, path, b);
        free(b->file); /* the tree holds what it needs */
        b->file = NULL;
        if (b->charge.give) b->charge.give(b->charge.ud, b->file_charged);
        b->file_charged = 0;
        rc = ck_spm_tok_from_json(&k->t, b->root, &cfg, &k->charge, poll_cb, L, err, sizeof err);
    } else {
        if (b->flen > CK_SPM_MAX_FILE)
            return ck_lua_raise(L, "t5_tokenizer: '%s' is %I bytes, more than a sentencepiece model may hold (%I)", path,
                                (lua_Integer)b->flen, (lua_Integer)CK_SPM_MAX_FILE);
        rc = ck_spm_model_read(&b->m, b->file, b->flen, &b->charge, poll_cb, L, err, sizeof err);
        if (rc == 0) rc = ck_spm_tok_from_model(&k->t, &b->m, &cfg, &k->charge, poll_cb, L, err, sizeof err);
    }
    if (rc) return ck_lua_raise(L, "t5_tokenizer: '%s': %s", path, err);
    box_free(b); /* the file and the tree */

    /* the library's model: written here, checked once more by our reader
     * (it must pass: a failure is ckrun's bug, refused rather than risked),
     * then loaded in the worker */
    const size_t plen = ck_spm_tok_proto(&k->t, NULL, 0);
    charge(L, b, &b->proto_charged, plen, "the model for libsentencepiece", path);
    b->proto = malloc(plen);
    if (!b->proto) return ck_lua_raise(L, "t5_tokenizer: out of memory");
    ck_spm_tok_proto(&k->t, b->proto, plen);
    if (ck_spm_model_read(&b->m, b->proto, plen, &b->charge, poll_cb, L, err, sizeof err))
        return ck_lua_raise(L, "t5_tokenizer: '%s': the model written for libsentencepiece is malformed: %s", path, err);
    ck_spm_model_free(&b->m);
    char what[96];
    snprintf(what, sizeof what, "libsentencepiece's model of %d pieces", k->t.n + 1);
    const size_t est = (size_t)(k->t.n + 1) * LIB_PER_PIECE + 2 * plen;
    charge(L, b, &b->job_charged, est, what, path);
    job *j = job_start(L, b);
    j->proto = b->proto; /* the job owns it from here */
    j->plen = plen;
    b->proto = NULL;
    job_go(L, b);
    if (j->rc) return ck_lua_raise(L, "t5_tokenizer: '%s': libsentencepiece refused the model: %s", path, j->err);
    k->model = j->model;
    j->model = NULL;
    k->lib_charged = est; /* the tokenizer holds the estimate from here */
    b->job_charged = 0;
    box_free(b);
    lua_settop(L, 4);
    return 1;
}

/* ---- encoding */

typedef struct enc {
    lua_State *L;
    ltok *k;
    box *b;
    size_t stop;  /* ids after which to stop (0: none) */
    int failed;   /* the error is in err */
    char err[400];
} enc;

/* room for n more ids in the box, charged */
static int ids_room(enc *e, size_t n)
{
    box *b = e->b;
    if (b->nids + n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->nids + n) cap *= 2;
    if (b->charge.take && b->charge.take(b->charge.ud, (cap - b->cap) * sizeof(int32_t), "the caption's ids", e->err, sizeof e->err)) {
        e->failed = 1;
        return -1;
    }
    b->ids_charged += (cap - b->cap) * sizeof(int32_t);
    int32_t *p = realloc(b->ids, cap * sizeof *p);
    if (!p) {
        snprintf(e->err, sizeof e->err, "out of memory for the caption's ids");
        e->failed = 1;
        return -1;
    }
    b->ids = p;
    b->cap = cap;
    return 0;
}

static int enc_special(void *ud, int32_t id)
{
    enc *e = ud;
    if (ids_room(e, 1)) return 1;
    e->b->ids[e->b->nids++] = id;
    return e->stop && e->b->nids >= e->stop;
}

/* the library's ids into the box (room made before the call): its id n is
 * the vocabulary's unknown entry spelled out */
static int emit_ids(void *ud, const int *ids, size_t n)
{
    enc *e = ud;
    box *b = e->b;
    if (b->nids + n > b->cap) return 1; /* more ids than bytes: cannot happen */
    for (size_t i = 0; i < n; i++) b->ids[b->nids++] = ids[i] == e->k->t.n ? e->k->t.unk : ids[i];
    return 0;
}

static int enc_piece(void *ud, const char *s, size_t len)
{
    enc *e = ud;
    box *b = e->b;
    if (ids_room(e, len)) return 1; /* each id takes at least one byte */
    if (len <= INLINE_PIECE) {
        const int rc = ck_spmp_encode(e->k->model, s, len, emit_ids, e, e->err, sizeof e->err);
        if (rc) {
            if (rc == -2) snprintf(e->err, sizeof e->err, "more ids than bytes from libsentencepiece");
            e->failed = 1;
            return 1;
        }
    } else {
        /* a long word: in the worker, what the library takes charged first */
        char what[96];
        snprintf(what, sizeof what, "libsentencepiece's search over a word of %zu bytes", len);
        if (b->charge.take && b->charge.take(b->charge.ud, len * LIB_PER_BYTE, what, e->err, sizeof e->err)) {
            e->failed = 1;
            return 1;
        }
        b->job_charged += len * LIB_PER_BYTE;
        job *j = job_start(e->L, b);
        j->text = malloc(len);
        if (!j->text) {
            snprintf(e->err, sizeof e->err, "out of memory");
            e->failed = 1;
            return 1;
        }
        memcpy(j->text, s, len);
        j->tlen = len;
        ck_spmp_ref(e->k->model);
        j->model = e->k->model;
        job_go(e->L, b); /* may raise: the box releases the job */
        if (j->rc) {
            snprintf(e->err, sizeof e->err, "%s", j->err);
            e->failed = 1;
            return 1;
        }
        emit_ids(e, j->ids, j->nids);
        job_release(j);
        b->job = NULL;
        if (b->charge.give) b->charge.give(b->charge.ud, b->job_charged);
        b->job_charged = 0;
    }
    return e->stop && b->nids >= e->stop;
}

/* opts[key] read raw */
static int opt(lua_State *L, int t, const char *key)
{
    lua_pushstring(L, key);
    return lua_rawget(L, t);
}

/* tok:encode(text [, {max_length = N|false, pad = true}]) -> ids, mask: the
 * caption's ids and </s>; with max_length, the first max_length - 1 ids and
 * </s>, then <pad> up to max_length unless pad = false; mask 1 for each id
 * and 0 for each pad, as transformers' attention_mask */
static int l_encode(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    size_t n;
    const char *text = luaL_checklstring(L, 2, &n);
    lua_Integer max_length = 0;
    int pad = 1;
    if (!lua_isnoneornil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        int t = opt(L, 3, "max_length");
        if (t != LUA_TNIL && !(t == LUA_TBOOLEAN && !lua_toboolean(L, -1))) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > MAX_LENGTH)
                return ck_lua_raise(L, "encode: max_length must be an integer in [1, 2^24] or false");
            max_length = lua_tointeger(L, -1);
        }
        lua_pop(L, 1);
        t = opt(L, 3, "pad");
        if (t != LUA_TNIL && t != LUA_TBOOLEAN) return ck_lua_raise(L, "encode: pad must be true or false");
        if (t != LUA_TNIL) pad = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    const size_t bad = ck_spm_utf8_check((const uint8_t *)text, n);
    if (bad != n) return ck_lua_raise(L, "encode: the text is not valid UTF-8 (byte %I)", (lua_Integer)bad + 1);
    lua_settop(L, 2);
    box *b = new_box(L); /* 3 */
    enc e = {L, k, b, max_length ? (size_t)max_length - 1 : 0, 0, ""};
    if (!max_length || max_length > 1) {
        const ck_spm_sink sink = {enc_special, enc_piece, &e};
        char err[400];
        const int rc = ck_spm_tok_split(&k->t, text, n, &b->s, &sink, poll_cb, L, err, sizeof err);
        if (rc < 0) return ck_lua_raise(L, "encode: %s", err);
        if (e.failed) return ck_lua_raise(L, "encode: %s", e.err);
    }
    size_t nids = b->nids;
    if (max_length && nids > (size_t)max_length - 1) nids = (size_t)max_length - 1;
    const size_t total = max_length && pad ? (size_t)max_length : nids + 1;
    ck_mem_check(L, (int64_t)total, 32, "encode: two lists of %zu entries", total);
    const int hint = total < (1u << 30) ? (int)total : 0;
    lua_createtable(L, hint, 0); /* 4: ids */
    lua_createtable(L, hint, 0); /* 5: mask */
    for (size_t i = 0; i < total; i++) {
        const int32_t id = i < nids ? b->ids[i] : i == nids ? k->t.eos : k->t.pad;
        lua_pushinteger(L, id);
        lua_rawseti(L, 4, (lua_Integer)i + 1);
        lua_pushinteger(L, i <= nids);
        lua_rawseti(L, 5, (lua_Integer)i + 1);
        if ((i & 4095) == 4095) ck_limits_charge(L, 4096);
    }
    box_free(b);
    return 2;
}

/* tok:piece(id) -> the vocabulary's string for id (nil outside it) */
static int l_piece(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    const lua_Integer id = luaL_checkinteger(L, 2);
    if (id < 0 || id >= k->t.n) return 0;
    lua_pushlstring(L, k->t.str + k->t.e[id].off, k->t.e[id].len);
    return 1;
}

static int tok_index(lua_State *L)
{
    ltok *k = check_tok(L, 1);
    const char *key = luaL_checkstring(L, 2);
    if (!strcmp(key, "vocab_size")) lua_pushinteger(L, k->t.n);
    else if (!strcmp(key, "eos")) lua_pushinteger(L, k->t.eos);
    else if (!strcmp(key, "pad")) lua_pushinteger(L, k->t.pad);
    else if (!strcmp(key, "unk")) lua_pushinteger(L, k->t.unk);
    else {
        lua_pushvalue(L, 2);
        lua_rawget(L, lua_upvalueindex(1));
    }
    return 1;
}

void ck_lua_spm_register(lua_State *L, int lib)
{
    lib = lua_absindex(L, lib);
    static const luaL_Reg methods[] = {{"encode", l_encode}, {"piece", l_piece}, {NULL, NULL}};
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
    lua_pushcfunction(L, l_t5_tokenizer);
    lua_setfield(L, lib, "t5_tokenizer");
}
