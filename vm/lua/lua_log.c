/* The Lua side of logging: log writers (ck.log_open) over vm/logsink, records
 * made from Lua tables (numbers, strings, booleans, tables and images made by
 * ck.log_image), training steps that compute statistics or guard
 * against non-finite values (p:step{stats=, guard=}), p:enable_stats, op
 * timing (p:profile) and readers for tests and tools (ck.read_events,
 * ck.crc32c). */
#define _GNU_SOURCE /* O_PATH */
#include "formats/logsink.h"
#include "guard/term.h"
#include "guard/host.h"
#include "guard/runlimits.h"
#include "lua/lua_ck.h"
#include "run/program.h"
#include "util/text.h"

#include <lauxlib.h>
#include <lua.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define LOGGER_MT "ck.logger"
#define IMAGE_MT "ck.log_image"

/* ck.log_image's value: the size and a copy of the PNG bytes */
typedef struct limage {
    int width, height;
    size_t len;
    unsigned char png[];
} limage;

/* the largest PNG a log image holds */
#define CK_LOG_IMAGE_MAX ((size_t)64 << 20)

typedef struct llogger {
    ck_logger *lg;
    void *term; /* its hold on SIGTERM (guard/term.h), or NULL */
} llogger;

/* ---- records from Lua tables */

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void add_value(lua_State *L, ck_log_rec *r, const char *key, size_t klen, int idx, int depth);

/* The table at t: a list (keys exactly 1..n) in order, else its string keys
 * sorted; nested (key non-NULL or inside a list) it is opened and closed as a
 * JSON array or object; at the top, "step" and "time" are the header. One
 * pass collects the keys; up to 64 of them are sorted on the C stack. */
static void add_table(lua_State *L, ck_log_rec *r, int t, int top, int depth, const char *key, size_t klen)
{
    t = lua_absindex(L, t);
    if (depth > 32) ck_lua_raise(L, "log record nested too deep");
    luaL_checkstack(L, 8, "log record nested too deep");
    const char *small[64], **keys = small;
    int n = 0, cap = 64, extra = 0;
    lua_Integer ints = 0, maxi = 0;
    long long walked = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        if ((++walked & 1023) == 0) ck_limits_charge(L, 1024); /* a huge record stays interruptible */
        if (lua_type(L, -1) == LUA_TSTRING) {
            if (n == cap) { /* a bigger array, kept below the key until the walk ends */
                const char **k2 = lua_newuserdatauv(L, sizeof(char *) * (size_t)cap * 2, 0);
                memcpy(k2, keys, sizeof(char *) * (size_t)n);
                lua_insert(L, -2);
                extra++;
                keys = k2;
                cap *= 2;
            }
            keys[n++] = lua_tostring(L, -1); /* alive: the key stays in the table */
        } else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1) {
            ints++;
            if (lua_tointeger(L, -1) > maxi) maxi = lua_tointeger(L, -1);
        } else {
            ck_lua_raise(L, "log record: keys must be strings (or a list 1..n)");
        }
    }
    if (ints && (n || maxi != ints)) ck_lua_raise(L, "log record: keys must be strings (or a list 1..n)");
    if (!top) ck_log_rec_open(r, key, klen, ints > 0);
    if (ints) {
        for (lua_Integer i = 1; i <= ints; i++) {
            lua_rawgeti(L, t, i);
            add_value(L, r, NULL, 0, lua_gettop(L), depth);
            lua_pop(L, 1);
        }
    } else {
        qsort(keys, (size_t)n, sizeof *keys, cmp_key);
        for (int i = 0; i < n; i++) {
            if (top && (!strcmp(keys[i], "step") || !strcmp(keys[i], "time"))) continue;
            lua_pushstring(L, keys[i]);
            lua_rawget(L, t);
            add_value(L, r, keys[i], strlen(keys[i]), lua_gettop(L), depth);
            lua_pop(L, 1);
        }
    }
    if (!top) ck_log_rec_close(r);
    lua_pop(L, extra);
}

static void add_value(lua_State *L, ck_log_rec *r, const char *key, size_t klen, int idx, int depth)
{
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) ck_log_rec_int(r, key, klen, (int64_t)lua_tointeger(L, idx));
        else ck_log_rec_num(r, key, klen, lua_tonumber(L, idx));
        break;
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        ck_log_rec_str(r, key, klen, s, n);
        break;
    }
    case LUA_TBOOLEAN: ck_log_rec_bool(r, key, klen, lua_toboolean(L, idx)); break;
    case LUA_TTABLE: add_table(L, r, idx, 0, depth + 1, key, klen); break;
    case LUA_TUSERDATA: {
        const limage *im = luaL_testudata(L, idx, IMAGE_MT);
        if (im) {
            /* the record's own copy, which outlives the value (an async writer writes it later) */
            ck_mem_check(L, (int64_t)im->len, 1, "a log record's copy of an image (%zu bytes)", im->len);
            ck_log_rec_image(r, key, klen, im->width, im->height, im->png, im->len);
            break;
        }
    }
    /* fall through */
    default:
        ck_lua_raise(L, "log record: '%s' is a %s; records hold numbers, strings, booleans, tables and ck.log_image values",
                     key ? key : "?", luaL_typename(L, idx));
    }
}

/* ---- images */

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* a size argument: an integer in 1..65535 */
static int image_size_arg(lua_State *L, int i, const char *what)
{
    int isint = 0;
    lua_Integer v = lua_type(L, i) == LUA_TNUMBER ? lua_tointegerx(L, i, &isint) : 0;
    if (!isint || v < 1 || v > 65535) {
        const char *shown = lua_type(L, i) == LUA_TNUMBER ? lua_tostring(L, i) : luaL_typename(L, i);
        return ck_lua_raise(L, "log_image: %s must be an integer from 1 to 65535, got %s", what, shown);
    }
    return (int)v;
}

/* ck.log_image(png_bytes, width, height) -> an image value for log records:
 * a copy of the PNG bytes (a string that starts with the PNG signature and
 * whose IHDR header says width x height; at most 64 MiB). In a record given to
 * lg:write it becomes a TensorBoard image summary, and in the JSON line
 * {"width": W, "height": H, "png_bytes": N}. */
static int l_log_image(lua_State *L)
{
    if (lua_type(L, 1) != LUA_TSTRING)
        return ck_lua_raise(L, "log_image: png_bytes must be a string (the bytes of a PNG file), got %s",
                            luaL_typename(L, 1));
    size_t n;
    const unsigned char *png = (const unsigned char *)lua_tolstring(L, 1, &n);
    const int w = image_size_arg(L, 2, "width"), h = image_size_arg(L, 3, "height");
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n < 8 || memcmp(png, sig, 8))
        return ck_lua_raise(L, "log_image: png_bytes is not a PNG (%I bytes without the PNG signature)", (lua_Integer)n);
    if (n < 24 || memcmp(png + 12, "IHDR", 4))
        return ck_lua_raise(L, "log_image: png_bytes is not a PNG (no IHDR header after the signature)");
    if (be32(png + 16) != (uint32_t)w || be32(png + 20) != (uint32_t)h)
        return ck_lua_raise(L, "log_image: the PNG is %Ix%I, not the %dx%d given", (lua_Integer)be32(png + 16),
                            (lua_Integer)be32(png + 20), w, h);
    if (n > CK_LOG_IMAGE_MAX)
        return ck_lua_raise(L, "log_image: the PNG is %I bytes, more than the 64 MiB a log image holds", (lua_Integer)n);
    ck_mem_check(L, (int64_t)n, 1, "log_image: a copy of %zu PNG bytes", n);
    limage *im = lua_newuserdatauv(L, sizeof *im + n, 0);
    im->width = w;
    im->height = h;
    im->len = n;
    memcpy(im->png, png, n);
    luaL_setmetatable(L, IMAGE_MT);
    return 1;
}

/* img.width, img.height, img.png_bytes (the count of bytes) */
static int l_image_index(lua_State *L)
{
    const limage *im = luaL_checkudata(L, 1, IMAGE_MT);
    const char *k = lua_tostring(L, 2);
    if (k && !strcmp(k, "width")) lua_pushinteger(L, im->width);
    else if (k && !strcmp(k, "height")) lua_pushinteger(L, im->height);
    else if (k && !strcmp(k, "png_bytes")) lua_pushinteger(L, (lua_Integer)im->len);
    else lua_pushnil(L);
    return 1;
}

static int l_image_tostring(lua_State *L)
{
    const limage *im = luaL_checkudata(L, 1, IMAGE_MT);
    lua_pushfstring(L, "ck.log_image (%dx%d, %I PNG bytes)", im->width, im->height, (lua_Integer)im->len);
    return 1;
}

/* ---- the logger */

static llogger *check_logger(lua_State *L, int i)
{
    llogger *l = luaL_checkudata(L, i, LOGGER_MT);
    if (!l->lg) luaL_error(L, "the logger is closed");
    return l;
}

/* t[k] read raw: an option table's metamethods never run */
static int raw_field(lua_State *L, int t, const char *k)
{
    t = lua_absindex(L, t);
    lua_pushstring(L, k);
    return lua_rawget(L, t);
}

static int opt_bool(lua_State *L, int t, const char *k, int def)
{
    raw_field(L, t, k);
    int v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* ck.log_open{dir=, jsonl=true, jsonl_name="metrics.jsonl", tensorboard=true, async=false,
 *   flush_interval=1, queue=1024, fsync=false, sigterm=true} -> logger */
static int l_log_open(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    ck_log_opts o = {0};
    raw_field(L, 1, "dir");
    o.dir = luaL_optstring(L, -1, ".");
    raw_field(L, 1, "jsonl_name");
    o.jsonl_name = luaL_optstring(L, -1, "metrics.jsonl");
    luaL_argcheck(L, !strchr(o.jsonl_name, '/'), 1, "jsonl_name is a file name inside dir");
    o.jsonl = opt_bool(L, 1, "jsonl", 1);
    o.tensorboard = opt_bool(L, 1, "tensorboard", 1);
    o.async = opt_bool(L, 1, "async", 0);
    o.fsync = opt_bool(L, 1, "fsync", 0);
    raw_field(L, 1, "flush_interval");
    o.flush_interval = luaL_optnumber(L, -1, 1.0);
    raw_field(L, 1, "queue");
    o.queue = (int)luaL_optinteger(L, -1, 1024);
    luaL_argcheck(L, o.flush_interval > 0, 1, "flush_interval must be positive");
    luaL_argcheck(L, o.queue > 0, 1, "queue must be positive");
    ck_lua_check_path(L, o.dir, CK_ACCESS_WRITE | CK_ACCESS_DIR);
    llogger *l = lua_newuserdatauv(L, sizeof *l, 0);
    l->lg = NULL;
    l->term = NULL;
    luaL_setmetatable(L, LOGGER_MT);
    char err[512];
    /* sandboxed, the files are opened beneath the directory the door opened */
    o.confined = ck_lua_sandboxed(L);
    if (o.confined) {
        o.dir_fd = ck_lua_open(L, o.dir, CK_ACCESS_WRITE | CK_ACCESS_DIR, O_PATH | O_DIRECTORY, 0);
        if (o.dir_fd < 0) return ck_lua_raise(L, "log: cannot open the log directory '%s': %s", o.dir, strerror(errno));
    }
    l->lg = ck_log_open(&o, err, sizeof err);
    if (o.confined) close(o.dir_fd);
    if (!l->lg) return ck_lua_raise(L, "log: %s", err);
    /* SIGTERM stops the run between two ops, as Ctrl-C does, so that the
     * script unwinds and every logger flushes as it closes */
    if (opt_bool(L, 1, "sigterm", 1)) l->term = ck_term_hold(L);
    return 1;
}

static int convert_record(lua_State *L)
{
    add_table(L, lua_touserdata(L, 1), 2, 1, 0, NULL, 0);
    return 0;
}

/* lg:write(record): record.step (integer) and record.time (seconds since the
 * epoch; default now, the capture time) head the line; other fields follow,
 * keys sorted. */
static int l_log_write(lua_State *L)
{
    llogger *l = check_logger(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    raw_field(L, 2, "step");
    int64_t step = lua_isnil(L, -1) ? -1 : (int64_t)luaL_checkinteger(L, -1);
    raw_field(L, 2, "time");
    double t = lua_isnil(L, -1) ? wall_now() : luaL_checknumber(L, -1);
    lua_pop(L, 2);
    ck_log_rec r;
    ck_log_rec_init(&r, step, t);
    /* a Lua error while converting must not leak r: convert under pcall */
    lua_pushcfunction(L, convert_record);
    lua_pushlightuserdata(L, &r);
    lua_pushvalue(L, 2);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        ck_log_rec_free(&r);
        return lua_error(L);
    }
    char err[512];
    if (ck_log_submit(l->lg, &r, err, sizeof err)) return ck_lua_raise(L, "log: %s", err);
    return 0;
}

/* lg:flush([sync]): everything written so far reaches the files (sync: the disk) */
static int l_log_flush(lua_State *L)
{
    llogger *l = check_logger(L, 1);
    char err[512];
    if (ck_log_flush(l->lg, lua_toboolean(L, 2), err, sizeof err)) return ck_lua_raise(L, "log: %s", err);
    return 0;
}

static int close_logger(lua_State *L, int raise)
{
    llogger *l = luaL_checkudata(L, 1, LOGGER_MT);
    if (!l->lg) return 0;
    char err[512];
    int rc = ck_log_close(l->lg, err, sizeof err);
    l->lg = NULL;
    ck_term_release(l->term);
    l->term = NULL;
    if (rc && raise) return ck_lua_raise(L, "log: %s", err);
    return 0;
}

static int l_log_close(lua_State *L) { return close_logger(L, 1); }
static int l_log_gc(lua_State *L) { return close_logger(L, 0); }

/* lg:paths() -> the JSONL file, the event file (nil for a sink not written) */
static int l_log_paths(lua_State *L)
{
    llogger *l = check_logger(L, 1);
    const char *a = ck_log_jsonl_path(l->lg), *b = ck_log_events_path(l->lg);
    if (a) lua_pushstring(L, a);
    else lua_pushnil(L);
    if (b) lua_pushstring(L, b);
    else lua_pushnil(L);
    return 2;
}

/* lg:counts() -> records submitted, records written to the files */
static int l_log_counts(lua_State *L)
{
    llogger *l = check_logger(L, 1);
    uint64_t s, w;
    ck_log_counts(l->lg, &s, &w);
    lua_pushinteger(L, (lua_Integer)s);
    lua_pushinteger(L, (lua_Integer)w);
    return 2;
}

/* ---- statistics and guarded steps */


/* stats: true, a name, a mask, or a list of those (nested at most 4 deep) */
static unsigned stats_mask_at(lua_State *L, int idx, int depth)
{
    if (lua_isnoneornil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx))) return 0;
    if (lua_isboolean(L, idx)) return CK_STATS_ALL;
    if (lua_isinteger(L, idx)) return (unsigned)lua_tointeger(L, idx) & CK_STATS_ALL;
    if (lua_type(L, idx) == LUA_TSTRING) {
        const char *s = lua_tostring(L, idx);
        if (!strcmp(s, "grads")) return CK_STATS_GRADS;
        if (!strcmp(s, "acts")) return CK_STATS_ACTS;
        if (!strcmp(s, "all")) return CK_STATS_ALL;
        return (unsigned)ck_lua_raise(L, "unknown statistics '%s' (grads, acts, all)", s);
    }
    if (lua_istable(L, idx) && depth < 4) {
        unsigned m = 0;
        const lua_Unsigned n = lua_rawlen(L, idx);
        if (n > 64) return (unsigned)ck_lua_raise(L, "stats: a list of at most 64 names, got %d", (int)n);
        for (lua_Unsigned i = 1; i <= n; i++) {
            lua_rawgeti(L, idx, (lua_Integer)i);
            m |= stats_mask_at(L, lua_gettop(L), depth + 1);
            lua_pop(L, 1);
        }
        return m;
    }
    return (unsigned)ck_lua_raise(L, "stats must be true, a name (grads, acts) or a list of names");
}

static unsigned stats_mask(lua_State *L, int idx) { return stats_mask_at(L, idx, 0); }

void ck_lua_stats_request(lua_State *L, int idx, ck_compile_opts *o, const char **pats)
{
    idx = lua_absindex(L, idx);
    o->stats = 0;
    o->stat_blocks = pats;
    o->nstat_blocks = 0;
    if (lua_isnoneornil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx))) return;
    if (!lua_istable(L, idx)) {
        ck_lua_raise(L, "stats must be a table {grads = true, acts = true, blocks = {patterns}}, got %s",
                     luaL_typename(L, idx));
        return;
    }
    static const char *const groups[] = {"grads", "acts"};
    for (int k = 0; k < 2; k++) {
        lua_pushstring(L, groups[k]);
        const int ty = lua_rawget(L, idx);
        if (ty != LUA_TNIL && ty != LUA_TBOOLEAN)
            ck_lua_raise(L, "stats.%s must be true or false, got %s", groups[k], lua_typename(L, ty));
        if (ty == LUA_TNIL || lua_toboolean(L, -1)) o->stats |= k == 0 ? CK_STATS_GRADS : CK_STATS_ACTS;
        lua_pop(L, 1);
    }
    lua_pushliteral(L, "blocks");
    const int ty = lua_rawget(L, idx);
    if (ty == LUA_TTABLE) {
        const lua_Unsigned n = lua_rawlen(L, -1);
        if (n > 64) ck_lua_raise(L, "stats.blocks: at most 64 block patterns, got %d", (int)n);
        for (lua_Unsigned i = 1; i <= n; i++) {
            if (lua_rawgeti(L, -1, (lua_Integer)i) != LUA_TSTRING)
                ck_lua_raise(L, "stats.blocks[%d] must be a scope pattern (a string), got %s", (int)i,
                             luaL_typename(L, -1));
            pats[o->nstat_blocks++] = lua_tostring(L, -1);
            lua_pop(L, 1); /* alive: the string stays in the table */
        }
    } else if (ty != LUA_TNIL) {
        ck_lua_raise(L, "stats.blocks must be a list of scope patterns, got %s", lua_typename(L, ty));
    }
    /* the blocks table stays referenced from the table at idx */
    lua_pop(L, 1);
}

/* p:enable_stats{grads=true, acts=true, blocks={patterns}} -> {blocks={names},
 * grads=count, acts=count, elements={grads=, acts=} (what a logging step
 * reduces), peak={grads=, acts=, all=}}: adds the statistics and the logging
 * lists (the plain list is unchanged); the statistics compile{stats=} enabled
 * are enabled already, and others must fit the arena compile sized. */
static int l_enable_stats(lua_State *L)
{
    ck_program *p = ck_lua_program(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    const char *pats[64];
    ck_compile_opts req = {0};
    ck_lua_stats_request(L, 2, &req, pats);
    const unsigned groups = req.stats;
    const int np = req.nstat_blocks;
    char err[512];
    if (ck_program_add_stats(p, groups, pats, np, err, sizeof err)) return ck_lua_raise(L, "enable_stats: %s", err);
    lua_newtable(L);
    lua_createtable(L, p->st.nblocks, 0);
    for (int b = 0; b < p->st.nblocks; b++) {
        lua_pushstring(L, p->st.blocks[b]);
        lua_rawseti(L, -2, b + 1);
    }
    lua_setfield(L, -2, "blocks");
    int ng = 0, na = 0;
    lua_Integer eg = 0, ea = 0;
    for (int k = 0; k < p->st.nstats; k++) {
        if (!p->st.stats[k].placed) continue;
        lua_Integer numel = (lua_Integer)ck_shape_numel(&p->g->t[p->st.stats[k].src].shape);
        if (p->st.stats[k].group == CK_STATS_GRADS) ng++, eg += numel;
        else na++, ea += numel;
    }
    lua_pushinteger(L, ng);
    lua_setfield(L, -2, "grads");
    lua_pushinteger(L, na);
    lua_setfield(L, -2, "acts");
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, eg);
    lua_setfield(L, -2, "grads");
    lua_pushinteger(L, ea);
    lua_setfield(L, -2, "acts");
    lua_setfield(L, -2, "elements");
    lua_newtable(L);
    static const char *const names[] = {NULL, "grads", "acts", "all"};
    for (int m = 1; m <= CK_STATS_ALL; m++)
        if (p->logplan[m].n) {
            lua_pushinteger(L, (lua_Integer)p->logplan[m].peak);
            lua_setfield(L, -2, names[m]);
        }
    lua_setfield(L, -2, "peak");
    return 1;
}

static void set_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* the statistics of the list that just ran into the table on top */
static void push_stats(lua_State *L, ck_program *p, unsigned mask, double loss_scale)
{
    if (mask & CK_STATS_GRADS) {
        double *sq = calloc((size_t)(p->st.nblocks ? p->st.nblocks : 1), sizeof(double));
        char *seen = calloc((size_t)(p->st.nblocks ? p->st.nblocks : 1), 1);
        if (!sq || !seen) {
            free(sq);
            free(seen);
            luaL_error(L, "out of memory");
        }
        double total = 0;
        for (int k = 0; k < p->st.nstats; k++) {
            const ck_stat *s = &p->st.stats[k];
            if (s->group != CK_STATS_GRADS || !s->placed) continue;
            const float *x = ck_program_read(p, s->out);
            if (!x) continue;
            sq[s->block] += x[0];
            seen[s->block] = 1;
            total += x[0];
        }
        /* the gradients' norms as the update sees them: unscaled */
        set_num(L, "grad_norm", (float)(sqrt(total) / loss_scale));
        lua_newtable(L);
        for (int b = 0; b < p->st.nblocks; b++)
            if (seen[b]) set_num(L, p->st.blocks[b], (float)(sqrt(sq[b]) / loss_scale));
        lua_setfield(L, -2, "grad_norms");
        free(sq);
        free(seen);
    }
    if (mask & CK_STATS_ACTS) {
        lua_newtable(L);
        for (int k = 0; k < p->st.nstats; k++) {
            const ck_stat *s = &p->st.stats[k];
            if (s->group != CK_STATS_ACTS || !s->placed) continue;
            const float *x = ck_program_read(p, s->out);
            if (!x) continue;
            lua_createtable(L, 0, 3);
            set_num(L, "mean", x[0]);
            set_num(L, "std", x[1]);
            set_num(L, "absmax", x[2]);
            lua_setfield(L, -2, p->st.blocks[s->block]);
        }
        lua_setfield(L, -2, "acts");
    }
}

/* p:step([{stats=, guard=, measure=}]) (lr already applied by l_step) ->
 * loss, info. One shape whatever the options: loss (nil without one) first, as
 * torch's loss.item(); info a table: plan_peak always, high_water with measure,
 * grads/acts with stats, skipped and nonfinite when a guarded step skipped;
 * with loss scaling, loss_scale (the scale the step ran with) and, when its
 * gradients overflowed, skipped and overflow. */
int ck_lua_log_step(lua_State *L, ck_program *p)
{
    ck_run_opts o = {0, 0, 0};
    if (lua_istable(L, 2)) {
        raw_field(L, 2, "stats");
        o.stats = stats_mask(L, lua_gettop(L));
        lua_pop(L, 1);
        o.guard = opt_bool(L, 2, "guard", 0);
        o.measure = opt_bool(L, 2, "measure", 0);
    }
    if (o.stats && (o.stats & ~p->stat_groups))
        return ck_lua_raise(L, "step: these statistics are not enabled; call p:enable_stats{...} before the first step");
    ck_run_info r;
    if (ck_program_run(p, &o, &r)) return ck_lua_raise(L, "%s", p->err);
    const float *loss = p->loss >= 0 ? ck_program_read(p, p->loss) : NULL;
    if (!loss && p->loss >= 0 && p->err[0]) return ck_lua_raise(L, "%s", p->err);
    if (loss) lua_pushnumber(L, loss[0]);
    else lua_pushnil(L);
    lua_newtable(L);
    lua_pushinteger(L, (lua_Integer)r.plan->peak);
    lua_setfield(L, -2, "plan_peak");
    if (o.measure) {
        lua_pushinteger(L, (lua_Integer)r.high_water);
        lua_setfield(L, -2, "high_water");
    }
    push_stats(L, p, o.stats, r.loss_scale);
    if (p->scale_t >= 0) { /* the scale this step's gradients carried */
        lua_pushnumber(L, r.loss_scale);
        lua_setfield(L, -2, "loss_scale");
    }
    if (r.overflow) { /* loss scaling's skip: the gradients overflowed, the scale backed off */
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "skipped");
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "overflow");
    }
    if (r.nonfinite) {
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "skipped");
        lua_newtable(L);
        lua_pushboolean(L, r.loss_nonfinite);
        lua_setfield(L, -2, "loss");
        if (r.bad_entry >= 0) {
            const ck_op_ref *e = &r.plan->ops[r.bad_entry];
            const ck_node *n = &p->g->n[e->node];
            lua_pushstring(L, ck_op_name(n->op));
            lua_setfield(L, -2, "op");
            lua_pushstring(L, n->scope ? n->scope : "");
            lua_setfield(L, -2, "scope");
            lua_pushstring(L, n->where ? n->where : "?");
            lua_setfield(L, -2, "where");
            lua_pushstring(L, ck_graph_phase_name(e->phase));
            lua_setfield(L, -2, "phase");
            lua_pushinteger(L, r.bad_entry + 1);
            lua_setfield(L, -2, "entry");
        }
        if (r.bad_input >= 0) {
            const ck_tensor *t = &p->g->t[r.bad_input];
            lua_pushstring(L, t->name ? t->name : "?");
            lua_setfield(L, -2, "input");
        }
        lua_setfield(L, -2, "nonfinite");
    }
    return 2;
}

/* p:profile(true): from now on, time every op by kind; p:profile(false): stop;
 * p:profile() -> {op name = seconds since profiling started} */
static int l_profile(lua_State *L)
{
    ck_program *p = ck_lua_program(L, 1);
    if (lua_isboolean(L, 2)) {
        free(p->profile);
        p->profile = NULL;
        if (lua_toboolean(L, 2) && !(p->profile = calloc(CK_OP_COUNT, sizeof(double)))) return luaL_error(L, "out of memory");
        return 0;
    }
    lua_newtable(L);
    if (!p->profile) return 1;
    for (int op = 1; op < CK_OP_COUNT; op++)
        if (p->profile[op] > 0) set_num(L, ck_op_name((enum ck_op)op), p->profile[op]);
    return 1;
}

/* ---- readers and clocks */

static int push_event(void *ud, const ck_tb_read_event *e)
{
    lua_State *L = ud;
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, e->wall_time);
    lua_setfield(L, -2, "wall_time");
    lua_pushinteger(L, (lua_Integer)e->step);
    lua_setfield(L, -2, "step");
    if (e->file_version) {
        lua_pushlstring(L, e->file_version, e->file_version_len);
        lua_setfield(L, -2, "file_version");
    }
    if (e->nvalues) {
        lua_createtable(L, 0, e->nvalues);
        for (int i = 0; i < e->nvalues; i++) {
            lua_pushlstring(L, e->values[i].tag, e->values[i].tag_len);
            lua_pushnumber(L, e->values[i].value);
            lua_rawset(L, -3);
        }
        lua_setfield(L, -2, "values");
    }
    if (e->nimages) {
        lua_createtable(L, 0, e->nimages);
        for (int i = 0; i < e->nimages; i++) {
            const ck_tb_image *im = &e->images[i];
            lua_pushlstring(L, im->tag, im->tag_len);
            lua_createtable(L, 0, 4);
            lua_pushinteger(L, (lua_Integer)im->width);
            lua_setfield(L, -2, "width");
            lua_pushinteger(L, (lua_Integer)im->height);
            lua_setfield(L, -2, "height");
            lua_pushinteger(L, (lua_Integer)im->colorspace);
            lua_setfield(L, -2, "colorspace");
            lua_pushlstring(L, (const char *)im->png, im->png_len);
            lua_setfield(L, -2, "png");
            lua_rawset(L, -3);
        }
        lua_setfield(L, -2, "images");
    }
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    return 0;
}

/* ck.read_events(path) -> list of {wall_time, step, file_version | values = {tag = value},
 * images = {tag = {width=, height=, colorspace=, png = bytes}}}, bytes of a
 * cut tail; or nil, message when a CRC or an Event is bad */
static int l_read_events(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    int fd = ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        luaL_pushfail(L);
        lua_pushfstring(L, "cannot open '%s'", path);
        return 2;
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) luaL_addlstring(&b, chunk, k);
    fclose(f);
    luaL_pushresult(&b);
    size_t n;
    const unsigned char *data = (const unsigned char *)lua_tolstring(L, -1, &n);
    lua_newtable(L);
    size_t tail = 0;
    char err[256];
    if (ck_tb_read(data, n, push_event, L, &tail, err, sizeof err)) {
        luaL_pushfail(L);
        lua_pushfstring(L, "%s: %s", path, err);
        return 2;
    }
    lua_pushinteger(L, (lua_Integer)tail);
    return 2;
}

static int l_crc32c(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    lua_pushinteger(L, (lua_Integer)ck_tb_crc32c(s, n));
    lua_pushinteger(L, (lua_Integer)ck_tb_crc32c_masked(s, n));
    return 2;
}

/* ck.wall_time() -> seconds since the epoch (what records carry) */
static int l_wall_time(lua_State *L)
{
    lua_pushnumber(L, wall_now());
    return 1;
}

/* ck.rss() -> resident bytes now, and the most the process has held */
static int l_rss(lua_State *L)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    lua_pushinteger(L, (lua_Integer)resident * sysconf(_SC_PAGESIZE));
    lua_pushinteger(L, (lua_Integer)ru.ru_maxrss * 1024);
    return 2;
}

/* ck.host_memory() -> available, total bytes of the machine's memory: the
 * kernel's MemAvailable and MemTotal, read here from /proc/meminfo (so a
 * sandboxed script need not be allowed /proc), else free and physical pages */
static int l_host_memory(lua_State *L)
{
    long long avail = ck_proc_kb_field("/proc/meminfo", "MemAvailable"),
              total = ck_proc_kb_field("/proc/meminfo", "MemTotal");
    const long long page = sysconf(_SC_PAGESIZE);
    if (avail < 0) avail = (long long)sysconf(_SC_AVPHYS_PAGES) * page;
    if (total < 0) total = (long long)sysconf(_SC_PHYS_PAGES) * page;
    lua_pushinteger(L, (lua_Integer)avail);
    lua_pushinteger(L, (lua_Integer)total);
    return 2;
}

void ck_lua_log_register(lua_State *L, int lib, int methods)
{
    static const luaL_Reg logger_methods[] = {
        {"write", l_log_write}, {"flush", l_log_flush}, {"close", l_log_close},
        {"paths", l_log_paths}, {"counts", l_log_counts}, {NULL, NULL},
    };
    static const luaL_Reg funcs[] = {
        {"log_open", l_log_open}, {"log_image", l_log_image}, {"read_events", l_read_events}, {"crc32c", l_crc32c},
        {"wall_time", l_wall_time}, {"rss", l_rss}, {"host_memory", l_host_memory}, {NULL, NULL},
    };
    lib = lua_absindex(L, lib);
    methods = lua_absindex(L, methods);
    luaL_newmetatable(L, LOGGER_MT);
    luaL_newlib(L, logger_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_log_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_log_gc);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
    luaL_newmetatable(L, IMAGE_MT);
    lua_pushcfunction(L, l_image_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_image_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
    lua_pushvalue(L, lib);
    luaL_setfuncs(L, funcs, 0);
    lua_pop(L, 1);
    lua_pushcfunction(L, l_enable_stats);
    lua_setfield(L, methods, "enable_stats");
    lua_pushcfunction(L, l_profile);
    lua_setfield(L, methods, "profile");
}
