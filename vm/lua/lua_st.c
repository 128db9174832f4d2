/* safetensors from Lua: open a file and read its tensors and metadata, load
 * named tensors straight into a program's arena (with shape checks that name
 * the key; a slice of rows, a transpose, a reshape or blocks of rows from
 * several pieces on the way), and save a program's tensors. Values never pass
 * through Lua tables on the load and save paths, nor through a copy of the
 * file: loads read each tensor from the file into the arena (a transposed one
 * through a scratch copy), saves write each from the arena. */
#include "lua/lua_ck.h"
#include "dist/dist.h"
#include "formats/safetensors.h"
#include "guard/poll.h"

#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STFILE_MT "ck.safetensors"
#define WRITER_MT "ck.safetensors_writer"

typedef struct lstfile {
    ck_st_file *f;
    char path[512];
} lstfile;

static lstfile *check_file(lua_State *L, int i)
{
    lstfile *lf = luaL_checkudata(L, i, STFILE_MT);
    if (!lf->f) luaL_error(L, "safetensors file is closed");
    return lf;
}

/* ck.safetensors(path) -> file */
static int l_open(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    char err[512];
    lstfile *lf = lua_newuserdatauv(L, sizeof *lf, 0);
    lf->f = NULL;
    luaL_setmetatable(L, STFILE_MT);
    /* opened through the sandbox's door, then read from that descriptor;
     * its header and read buffer count in the VM's memory budget, and its
     * header's parse polls the interrupt and the callback budget */
    const ck_st_charge charge = {ck_mem_take_ud, ck_mem_give_ud, ck_mem_budget_of(L), ck_limits_poll_ud,
                                 ck_limits_of(L)};
    const ck_st_charge *c = charge.ud ? &charge : NULL;
    lf->f = ck_st_open_fd(ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0), path, c, err, sizeof err);
    if (!lf->f && (errno == EMFILE || errno == ENFILE)) {
        /* an open file holds its descriptor: files the script dropped
         * without closing give theirs back when collected */
        lua_gc(L, LUA_GCCOLLECT);
        lf->f = ck_st_open_fd(ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0), path, c, err, sizeof err);
    }
    if (!lf->f) {
        ck_limits_raise_pending(L); /* a stop the parse was asked for */
        return ck_lua_raise(L, "%s", err);
    }
    snprintf(lf->path, sizeof lf->path, "%s", path);
    return 1;
}

static int l_close(lua_State *L)
{
    lstfile *lf = luaL_checkudata(L, 1, STFILE_MT);
    ck_st_close(lf->f);
    lf->f = NULL;
    return 0;
}

static const ck_st_tensor *find(lua_State *L, lstfile *lf, const char *key)
{
    const ck_st_tensor *t = ck_st_find(lf->f, key);
    if (!t) ck_lua_raise(L, "%s: no tensor '%s'", lf->path, key);
    return t;
}

/* Each allocation below may run a collection step, and a finalizer there (in
 * a trusted script) could close the file: loops look again after each. */
static lstfile *still_open(lua_State *L, lstfile *lf, long long i)
{
    if (!lf->f) ck_lua_raise(L, "%s: the file was closed while it was read", lf->path);
    if ((i & 4095) == 4095) ck_limits_charge(L, 4096);
    return lf;
}

/* f:keys() -> list of tensor names in file order */
static int l_keys(lua_State *L)
{
    lstfile *lf = check_file(L, 1);
    int n = ck_st_count(lf->f);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        still_open(L, lf, i);
        lua_pushstring(L, ck_st_get(lf->f, i)->name);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int l_has(lua_State *L)
{
    lstfile *lf = check_file(L, 1);
    lua_pushboolean(L, ck_st_find(lf->f, luaL_checkstring(L, 2)) != NULL);
    return 1;
}

/* f:shape(key) -> list; f:dtype(key) -> "F32" ... */
static int l_shape(lua_State *L)
{
    lstfile *lf = check_file(L, 1);
    const ck_st_tensor *t = find(L, lf, luaL_checkstring(L, 2));
    int64_t shape[CK_ST_MAX_DIMS];
    const int nd = t->ndim < CK_ST_MAX_DIMS ? t->ndim : CK_ST_MAX_DIMS;
    for (int d = 0; d < nd; d++) shape[d] = t->shape[d];
    lua_createtable(L, nd, 0);
    for (int d = 0; d < nd; d++) {
        lua_pushinteger(L, shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    return 1;
}

static int l_dtype(lua_State *L)
{
    lstfile *lf = check_file(L, 1);
    lua_pushstring(L, ck_st_dtype_name(find(L, lf, luaL_checkstring(L, 2))->dtype));
    return 1;
}

static int l_metadata(lua_State *L)
{
    lstfile *lf = check_file(L, 1);
    lua_newtable(L);
    const char *k, *v;
    for (int i = 0; ck_st_meta_at(still_open(L, lf, i)->f, i, &k, &v) == 0; i++) {
        lua_pushstring(L, v);
        lua_setfield(L, -2, k);
    }
    return 1;
}

/* f:read(key) -> flat list of numbers (for small tensors and tests) */
static int l_read(lua_State *L)
{
    lstfile *lf = check_file(L, 1);
    const char *key = luaL_checkstring(L, 2);
    const int64_t numel = find(L, lf, key)->numel;
    char err[512];
    /* the values held twice at once: as floats, then as a list */
    ck_mem_check(L, numel, sizeof(float) + 16, "f:read of '%s' (%lld values) into a Lua list", key, (long long)numel);
    if (numel > INT_MAX)
        return ck_lua_raise(L, "f:read of '%s': %I values are more than a Lua list holds", key, (lua_Integer)numel);
    float *x = lua_newuserdatauv(L, sizeof(float) * (size_t)(numel ? numel : 1), 0);
    const ck_st_tensor *t = find(L, still_open(L, lf, 0), key); /* again: the check and the allocation may have run Lua */
    if (ck_st_read_f32(t, x, numel, err, sizeof err)) return ck_lua_raise(L, "%s", err);
    lua_createtable(L, (int)numel, 0);
    for (int64_t i = 0; i < numel; i++) {
        if ((i & 4095) == 4095) ck_limits_charge(L, 4096);
        lua_pushnumber(L, x[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static void shape_text(const int64_t *s, int nd, char *buf, size_t len)
{
    ck_shape sh = {0, {0}};
    sh.ndim = nd > CK_MAX_DIMS ? CK_MAX_DIMS : nd;
    for (int d = 0; d < sh.ndim; d++) sh.d[d] = s[d];
    ck_shape_str(&sh, buf, len);
}

/* Copies file tensor `key` into rows [index*n, index*n + n) of tensor id, where
 * n is the file tensor's size; batch = 0 means the whole tensor. */
static void load_one(lua_State *L, ck_program *p, int id, lstfile *lf, const char *key, int batch, int index)
{
    const ck_tensor *t = &p->g->t[id];
    const ck_st_tensor *s = ck_st_find(lf->f, key);
    char a[128], b[128], err[512];
    if (!s) ck_lua_raise(L, "%s: missing tensor '%s'", lf->path, key);
    ck_shape want = t->shape;
    if (batch) {
        if (want.ndim < 1 || want.d[0] != batch) ck_lua_raise(L, "'%s' has no batch dim of %d", t->name, batch);
        for (int d = 1; d < want.ndim; d++) want.d[d - 1] = want.d[d];
        want.ndim--;
    }
    int same = s->ndim == want.ndim;
    for (int d = 0; same && d < want.ndim; d++) same = s->shape[d] == want.d[d];
    if (!same) {
        shape_text(s->shape, s->ndim, a, sizeof a);
        ck_shape_str(&want, b, sizeof b);
        ck_lua_raise(L, "%s: tensor '%s' has shape %s, expected %s", lf->path, key, a, b);
    }
    if (!ck_program_data(p, id) || p->poff[id] < 0)
        ck_lua_raise(L, "'%s' is not an input or parameter", t->name ? t->name : key);
    /* a sample of a batch keeps the other samples' values */
    float *dst = ck_program_write_begin(p, id, batch != 0);
    if (!dst) ck_lua_raise(L, "%s", p->err);
    if (ck_st_read_f32(s, dst + (int64_t)index * s->numel, s->numel, err, sizeof err)) ck_lua_raise(L, "%s", err);
    if (ck_program_write_end(p, id)) ck_lua_raise(L, "%s", p->err);
}

/* Where one parameter's values come from: a file tensor, or a slice of its
 * first dim, seen transposed (2-D) or reshaped to the parameter's shape. */
typedef struct source {
    const char *key;
    int64_t first, count; /* rows [first, first + count) of dim 0, 0-based; count < 0: all */
    int transpose, reshape;
} source;

static int64_t int_field(lua_State *L, int t, lua_Integer i, const char *key)
{
    lua_rawgeti(L, t, i);
    if (!lua_isinteger(L, -1))
        ck_lua_raise(L, "p:load: source '%s': rows must be {first, count}, two integers", key);
    int64_t v = (int64_t)lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

/* The source at stack index i: a key, or {key = ..., rows = {first, count}
 * (1-based first) | transpose = true | reshape = true}, read raw; a field
 * it does not know is an error (a misspelt transform is not ignored). A
 * table's key string is left pushed, so it outlives anything the load runs. */
static source source_arg(lua_State *L, int i)
{
    source src = {NULL, 0, -1, 0, 0};
    if (lua_type(L, i) == LUA_TSTRING) {
        src.key = lua_tostring(L, i);
        return src;
    }
    if (!lua_istable(L, i))
        ck_lua_raise(L, "p:load: a source is a key or a table {key = ..., rows | transpose | reshape}, got %s",
                     luaL_typename(L, i));
    i = lua_absindex(L, i);
    lua_pushliteral(L, "key");
    if (lua_rawget(L, i) != LUA_TSTRING) ck_lua_raise(L, "p:load: a source table needs key = a tensor name");
    src.key = lua_tostring(L, -1); /* stays on the stack: the caller's settop drops it */
    lua_pushnil(L);
    while (lua_next(L, i)) {
        const char *f = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        if (f && strcmp(f, "key") == 0) {
        } else if (f && strcmp(f, "transpose") == 0) {
            src.transpose = lua_toboolean(L, -1);
        } else if (f && strcmp(f, "reshape") == 0) {
            src.reshape = lua_toboolean(L, -1);
        } else if (f && strcmp(f, "rows") == 0) {
            if (!lua_istable(L, -1) || lua_rawlen(L, -1) != 2)
                ck_lua_raise(L, "p:load: source '%s': rows must be {first, count}, two integers", src.key);
            const int t = lua_gettop(L);
            const int64_t first = int_field(L, t, 1, src.key), count = int_field(L, t, 2, src.key);
            if (first < 1 || count < 1)
                ck_lua_raise(L, "p:load: source '%s': rows {%I, %I} must start at 1 or later and hold a row or more",
                             src.key, (lua_Integer)first, (lua_Integer)count);
            src.first = first - 1;
            src.count = count;
        } else if (f) {
            ck_lua_raise(L, "p:load: source '%s': unknown field '%s' (key, rows, transpose, reshape)", src.key, f);
        } else {
            ck_lua_raise(L, "p:load: source '%s': a field keyed by a %s (key, rows, transpose, reshape)", src.key,
                         luaL_typename(L, -2));
        }
        lua_pop(L, 1);
    }
    return src;
}

static int same_shape(const int64_t *a, int na, const ck_shape *b)
{
    if (na != b->ndim) return 0;
    for (int d = 0; d < na; d++)
        if (a[d] != b->d[d]) return 0;
    return 1;
}

/* The rows src asks for of file tensor s, as a tensor of its own (all of s
 * when src names no rows); what gets " rows A to B" for messages. */
static ck_st_tensor rows_view(lua_State *L, lstfile *lf, const ck_st_tensor *s, const source *src, char *what,
                              size_t whatlen)
{
    char a[128];
    ck_st_tensor view = *s;
    if (src->count < 0) return view;
    if (s->ndim < 1 || src->count > s->shape[0] || src->first > s->shape[0] - src->count) { /* no overflow */
        shape_text(s->shape, s->ndim, a, sizeof a);
        ck_lua_raise(L, "%s: tensor '%s' has shape %s: no %I rows from row %I", lf->path, src->key, a,
                     (lua_Integer)src->count, (lua_Integer)src->first + 1);
    }
    const int64_t row = s->shape[0] ? s->numel / s->shape[0] : 0;
    const size_t esize = ck_st_dtype_size(s->dtype);
    view.shape[0] = src->count;
    view.numel = row * src->count;
    view.nbytes = view.numel * (int64_t)esize;
    view.offset = s->offset + src->first * row * (int64_t)esize;
    snprintf(what, whatlen, " rows %lld to %lld", (long long)src->first + 1, (long long)(src->first + src->count));
    return view;
}

/* Loads one parameter from src. The source's shape after the transform must
 * equal the parameter's (with reshape, only the element count); a refusal
 * names the file and the key, and one before the read (every shape or
 * bounds check) leaves the parameter as it was. */
static void load_source(lua_State *L, ck_program *p, int id, lstfile *lf, const source *src)
{
    const ck_tensor *t = &p->g->t[id];
    const ck_st_tensor *s = ck_st_find(lf->f, src->key);
    char a[128], b[128], err[512], what[96] = "";
    if (!s) ck_lua_raise(L, "%s: missing tensor '%s'", lf->path, src->key);
    if (!src->transpose && !src->reshape && src->count < 0) {
        load_one(L, p, id, lf, src->key, 0, 0);
        return;
    }
    ck_st_tensor view = rows_view(L, lf, s, src, what, sizeof what);
    int64_t shape[CK_ST_MAX_DIMS];
    for (int d = 0; d < view.ndim; d++) shape[d] = view.shape[d];
    if (src->transpose) {
        if (view.ndim != 2) {
            shape_text(view.shape, view.ndim, a, sizeof a);
            ck_lua_raise(L, "%s: tensor '%s'%s has shape %s: only a 2-D tensor transposes", lf->path, src->key,
                         what, a);
        }
        shape[0] = view.shape[1];
        shape[1] = view.shape[0];
        snprintf(what + strlen(what), sizeof what - strlen(what), " transposed");
    }
    const int ok = src->reshape ? view.numel == ck_shape_numel(&t->shape) : same_shape(shape, view.ndim, &t->shape);
    if (!ok) {
        shape_text(shape, view.ndim, a, sizeof a);
        ck_shape_str(&t->shape, b, sizeof b);
        ck_lua_raise(L, "%s: tensor '%s'%s has shape %s, expected %s%s", lf->path, src->key, what, a, b,
                     src->reshape ? " (or as many elements)" : "");
    }
    if (!ck_program_data(p, id) || p->poff[id] < 0)
        ck_lua_raise(L, "'%s' is not an input or parameter", t->name ? t->name : src->key);
    float *scratch = NULL;
    if (src->transpose) {
        /* read as stored, then written transposed */
        ck_mem_check(L, view.numel, sizeof(float), "p:load of '%s' transposed (%lld values)", src->key,
                     (long long)view.numel);
        scratch = lua_newuserdatauv(L, sizeof(float) * (size_t)(view.numel ? view.numel : 1), 0);
        s = ck_st_find(still_open(L, lf, 0)->f, src->key); /* the allocation may have run a finalizer */
        if (!s) ck_lua_raise(L, "%s: missing tensor '%s'", lf->path, src->key);
        ck_limits_charge(L, view.numel / 16);
    }
    float *dst = ck_program_write_begin(p, id, 0);
    if (!dst) ck_lua_raise(L, "%s", p->err);
    if (ck_st_read_f32(&view, scratch ? scratch : dst, view.numel, err, sizeof err)) ck_lua_raise(L, "%s", err);
    if (scratch) {
        const int64_t r = view.shape[0], c = view.shape[1];
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++) dst[j * r + i] = scratch[i * c + j];
        lua_pop(L, 1);
    }
    if (ck_program_write_end(p, id)) ck_lua_raise(L, "%s", p->err);
}

/* Most pieces one parameter is made of */
#define MAX_PIECES 16

/* Loads one parameter from the list of sources at stack index t ({{key =,
 * rows =}, ...}), laid one after another along its first dim: a parameter
 * that a file holds in pieces, or in another order (Black Forest Labs' final
 * adaLN holds (shift, scale) where diffusers' holds (scale, shift)). Every
 * piece's shape and bounds are checked before anything is read. */
static void load_pieces(lua_State *L, ck_program *p, int id, lstfile *lf, int t)
{
    const ck_tensor *pt = &p->g->t[id];
    char a[128], b[128], err[512], what[96];
    const lua_Unsigned n = lua_rawlen(L, t);
    if (n > MAX_PIECES) ck_lua_raise(L, "p:load: '%s' from %I pieces (at most %d)", pt->name, (lua_Integer)n, MAX_PIECES);
    luaL_checkstack(L, 2 * (int)n + 4, "p:load pieces");
    ck_st_tensor views[MAX_PIECES];
    const char *keys[MAX_PIECES];
    int64_t rows = 0;
    ck_shape_str(&pt->shape, b, sizeof b);
    for (int i = 0; i < (int)n; i++) {
        lua_rawgeti(L, t, i + 1); /* stays on the stack with its key: the caller's settop drops them */
        if (!lua_istable(L, -1))
            ck_lua_raise(L, "p:load: piece %d of '%s' is a %s, not {key = ..., rows = ...}", i + 1, pt->name,
                         luaL_typename(L, -1));
        const source src = source_arg(L, -1);
        if (src.transpose || src.reshape)
            ck_lua_raise(L, "p:load: piece %d of '%s' ('%s'): pieces take key and rows only", i + 1, pt->name, src.key);
        const ck_st_tensor *s = ck_st_find(lf->f, src.key);
        if (!s) ck_lua_raise(L, "%s: missing tensor '%s'", lf->path, src.key);
        what[0] = 0;
        views[i] = rows_view(L, lf, s, &src, what, sizeof what);
        keys[i] = src.key;
        int ok = views[i].ndim == pt->shape.ndim && views[i].ndim >= 1;
        for (int d = 1; ok && d < views[i].ndim; d++) ok = views[i].shape[d] == pt->shape.d[d];
        if (!ok) {
            shape_text(views[i].shape, views[i].ndim, a, sizeof a);
            ck_lua_raise(L, "%s: tensor '%s'%s has shape %s: not a block of rows of '%s' %s", lf->path, src.key, what,
                         a, pt->name, b);
        }
        rows += views[i].shape[0];
    }
    if (n == 0 || rows != (pt->shape.ndim ? pt->shape.d[0] : 0))
        ck_lua_raise(L, "%s: the pieces of '%s' %s hold %I rows, it has %I", lf->path, pt->name, b, (lua_Integer)rows,
                     (lua_Integer)(pt->shape.ndim ? pt->shape.d[0] : 0));
    if (!ck_program_data(p, id) || p->poff[id] < 0) ck_lua_raise(L, "'%s' is not an input or parameter", pt->name);
    float *dst = ck_program_write_begin(p, id, 0);
    if (!dst) ck_lua_raise(L, "%s", p->err);
    for (int i = 0; i < (int)n; i++) {
        if (!ck_st_find(lf->f, keys[i])) ck_lua_raise(L, "%s: missing tensor '%s'", lf->path, keys[i]);
        if (ck_st_read_f32(&views[i], dst, views[i].numel, err, sizeof err)) ck_lua_raise(L, "%s", err);
        dst += views[i].numel;
    }
    if (ck_program_write_end(p, id)) ck_lua_raise(L, "%s", p->err);
}

/* p:load(file, {tensor_name = source, ...}) loads each named tensor, where a
 * source is a key of the file or a table {key = ..., rows = {first, count} |
 * transpose = true | reshape = true} (read raw), or a list of {key =, rows =}
 * pieces laid one after another along the tensor's first dim; a missing or
 * misshaped key is an error that names it and the file */
static int l_load(lua_State *L)
{
    ck_program *p = ck_lua_program_pinned(L, 1, 3);
    lstfile *lf = check_file(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    long long k = 0;
    lua_pushnil(L);
    while (lua_next(L, 3)) { /* raw */
        if ((++k & 255) == 0) ck_limits_charge(L, 4096);
        int id = ck_lua_program_tensor(L, p, -2);
        const int top = lua_gettop(L);
        if (lua_istable(L, -1) && lua_rawlen(L, -1) > 0) {
            load_pieces(L, p, id, lf, top);
        } else {
            const source src = source_arg(L, -1);
            load_source(L, p, id, lf, &src);
        }
        lua_settop(L, top - 1);
    }
    return 0;
}

/* p:load_sample(tensor, index, file, key): entry `index` (1-based) of a batched input */
static int l_load_sample(lua_State *L)
{
    ck_program *p = ck_lua_program_pinned(L, 1, 5);
    int id = ck_lua_program_tensor(L, p, 2);
    lua_Integer index = luaL_checkinteger(L, 3);
    lstfile *lf = check_file(L, 4);
    const char *key = luaL_checkstring(L, 5);
    int batch = p->g->t[id].shape.ndim ? (int)p->g->t[id].shape.d[0] : 0;
    luaL_argcheck(L, index >= 1 && index <= batch, 3, "index out of the batch");
    load_one(L, p, id, lf, key, batch, (int)index - 1);
    return 0;
}

static ck_st_dtype dtype_arg(lua_State *L, const char *s)
{
    if (strcmp(s, "F32") == 0 || strcmp(s, "fp32") == 0 || strcmp(s, "float") == 0) return CK_ST_F32;
    if (strcmp(s, "F16") == 0 || strcmp(s, "fp16") == 0) return CK_ST_F16;
    if (strcmp(s, "BF16") == 0 || strcmp(s, "bf16") == 0) return CK_ST_BF16;
    ck_lua_raise(L, "unknown dtype '%s' (F32, F16, BF16)", s);
    return CK_ST_F32;
}

/* Metadata keys are strings, values strings, numbers or booleans: read raw,
 * with no __tostring (no Lua code runs while a save holds the program). */
static void add_metadata(lua_State *L, int t, ck_st_writer *w)
{
    if (!lua_istable(L, t)) return;
    long long n = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if ((++n & 255) == 0) ck_limits_charge(L, 4096);
        if (lua_type(L, -2) != LUA_TSTRING)
            ck_lua_raise(L, "metadata keys must be strings, got %s", luaL_typename(L, -2));
        const char *k = lua_tostring(L, -2);
        const int ty = lua_type(L, -1);
        if (ty == LUA_TBOOLEAN) lua_pushstring(L, lua_toboolean(L, -1) ? "true" : "false");
        else if (ty == LUA_TNUMBER || ty == LUA_TSTRING) lua_pushvalue(L, -1);
        else ck_lua_raise(L, "metadata '%s' must be a string, a number or a boolean, got %s", k, lua_typename(L, ty));
        ck_st_writer_meta(w, k, lua_tostring(L, -1)); /* converts the copy, not the key lua_next needs */
        lua_pop(L, 2);
    }
}

static ck_st_writer *guarded_writer(lua_State *L)
{
    ck_st_writer *w = ck_st_writer_new();
    if (!w) luaL_error(L, "out of memory");
    /* if anything raises later, the guard's __gc frees the writer */
    ck_st_writer **guard = lua_newuserdatauv(L, sizeof *guard, 0);
    *guard = w;
    luaL_setmetatable(L, WRITER_MT);
    return w;
}

static int save_guarded(lua_State *L, int guard_idx, const char *path)
{
    ck_st_writer **guard = lua_touserdata(L, guard_idx);
    char err[512], name[NAME_MAX + 1];
    /* the temp file and the rename go into the directory the door opened */
    int dfd = ck_lua_open_parent(L, path, CK_ACCESS_WRITE, name, sizeof name);
    int rc = ck_st_writer_save_at(*guard, dfd, name, path, err, sizeof err);
    if (dfd >= 0) close(dfd);
    ck_st_writer_free(*guard);
    *guard = NULL;
    if (rc) return ck_lua_raise(L, "%s", err);
    return 0;
}

/* The source of a saved tensor: its values read from the program when the
 * save reaches it (the arena itself on the CPU, one tensor's stage on a device) */
static const float *program_values(void *ud, int id, char *err, size_t errlen)
{
    ck_program *p = ud;
    const float *x = ck_program_read(p, id);
    if (!x) snprintf(err, errlen, "not readable%s%s", p->err[0] ? ": " : "", p->err);
    return x;
}

/* ZeRO-1 states: rank 0 saves the whole job's optimizer state, each tensor
 * another rank owns received from that rank as the save reaches it (one
 * tensor's buffer at a time), while the owners send theirs (p:send_state).
 * The file's tensors are written in name order, so each owner sends its
 * tensors in name order too, and the messages match one by one. */
typedef struct remote_state {
    int owner;
    int64_t numel;
} remote_state;

typedef struct gather_ctx {
    float *buf;          /* the largest remote tensor's values */
    remote_state *e;
    lua_State *L;
} gather_ctx;

/* the wait's poll: stop when the VM's interrupt is raised */
static int poll_interrupt(void *ud)
{
    ck_limits *lim = ck_limits_of((lua_State *)ud);
    return lim && atomic_load(&lim->interrupt);
}

static const float *remote_values(void *ud, int i, char *err, size_t errlen)
{
    gather_ctx *c = ud;
    const int rc = ck_dist_recv(c->buf, c->e[i].numel, c->e[i].owner, poll_interrupt, c->L);
    if (rc == CK_DIST_STOPPED) {
        snprintf(err, errlen, "interrupted while rank %d sent it", c->e[i].owner);
        return NULL;
    }
    if (rc) {
        snprintf(err, errlen, "rank %d cannot send it (%lld values)", c->e[i].owner, (long long)c->e[i].numel);
        return NULL;
    }
    return c->buf;
}

/* Adds to w, as sources that receive them, the optimizer state tensors of p
 * that other ranks own. Leaves a guard (the buffers) on the stack. */
static void add_remote_states(lua_State *L, ck_program *p, ck_st_writer *w)
{
    const int nt = p->nowner, me = ck_dist_rank();
    int n = 0;
    int64_t most = 1;
    char names[2][CK_STATE_NAME_MAX];
    ck_shape shape[2];
    ck_dtype dtype[2];
    for (int t = 0; t < nt; t++) {
        int owner;
        const int ns = ck_program_param_state(p, t, names, shape, dtype, &owner);
        if (owner < 0 || owner == me) continue;
        for (int k = 0; k < ns; k++) {
            const int64_t m = ck_shape_numel(&shape[k]);
            if (m > most) most = m;
            n++;
        }
    }
    ck_mem_check(L, n + 1, sizeof(remote_state), "the list of %d optimizer states other ranks hold", n);
    ck_mem_check(L, most, sizeof(float), "a buffer for optimizer states other ranks hold (%lld values)",
                 (long long)most);
    gather_ctx *c = lua_newuserdatauv(L, sizeof *c + sizeof(remote_state) * (size_t)(n + 1), 1);
    c->e = (remote_state *)(c + 1);
    c->L = L;
    c->buf = lua_newuserdatauv(L, sizeof(float) * (size_t)most, 0);
    lua_setiuservalue(L, -2, 1); /* the buffer lives as long as the context */
    int i = 0;
    for (int t = 0; t < nt; t++) {
        int owner;
        const int ns = ck_program_param_state(p, t, names, shape, dtype, &owner);
        if (owner < 0 || owner == me) continue;
        for (int k = 0; k < ns; k++) {
            c->e[i] = (remote_state){owner, ck_shape_numel(&shape[k])};
            ck_st_writer_add_source(w, names[k], dtype[k] == CK_U8 ? CK_ST_U8 : CK_ST_F32, shape[k].ndim, shape[k].d,
                                    remote_values, c, i);
            i++;
        }
    }
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* p:send_state(): on a rank of a ZeRO-1 job other than 0, while rank 0 runs
 * p:save(path, entries, {shards = true}): sends rank 0 the optimizer state
 * this rank owns, in name order (the order the file is written in). */
static int l_send_state(lua_State *L)
{
    ck_program *p = ck_lua_program_pinned(L, 1, 1);
    const int me = ck_dist_rank();
    if (!p->owner || me == 0) return 0;
    const int nt = p->nowner;
    int n = 0;
    char names[2][CK_STATE_NAME_MAX];
    ck_shape shape[2];
    ck_dtype dtype[2];
    for (int t = 0; t < nt; t++) {
        int owner;
        const int ns = ck_program_param_state(p, t, names, shape, dtype, &owner);
        if (owner == me) n += ns;
    }
    ck_mem_check(L, n + 1, sizeof(char *), "the list of %d optimizer states to send", n);
    const char **list = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n + 1), 0);
    int i = 0;
    for (int t = 0; t < nt; t++) {
        int owner;
        const int ns = ck_program_param_state(p, t, names, shape, dtype, &owner);
        if (owner != me) continue;
        for (int k = 0; k < ns; k++) {
            const int id = ck_graph_find(p->g, names[k]);
            if (id < 0) return ck_lua_raise(L, "send_state: this rank holds no '%s'", names[k]);
            list[i++] = p->g->t[id].name;
        }
    }
    qsort(list, (size_t)n, sizeof *list, cmp_names);
    for (i = 0; i < n; i++) {
        const int id = ck_graph_find(p->g, list[i]);
        const int64_t m = ck_shape_numel(&p->g->t[id].shape);
        if (!m) continue; /* the file's writer asks for no values of an empty tensor */
        const float *x = ck_program_read(p, id);
        if (!x) return ck_lua_raise(L, "send_state: '%s' is not readable%s%s", list[i], p->err[0] ? ": " : "", p->err);
        const int rc = ck_dist_send(x, m, 0, poll_interrupt, L);
        if (rc == CK_DIST_STOPPED) {
            ck_limits_charge(L, 0);
            return ck_lua_raise(L, "send_state: interrupted");
        }
        if (rc) return ck_lua_raise(L, "send_state: '%s' cannot be sent (%lld values)", list[i], (long long)m);
    }
    return 0;
}

/* p:save(path, entries, {metadata = {k = v}, dtype = "F32", shards = bool}) (byte tensors as U8) where each entry is
 * {key, tensor_or_name} or {key, value = number} (a 0-dim tensor). The file is
 * replaced atomically: a failed save leaves an existing file as it was. The
 * entries are read raw (no metamethods) into the writer, then the save runs
 * with no Lua code in between, reading each tensor only as it is written.
 * shards (ZeRO-1, rank 0): the optimizer state the other ranks own is saved
 * too, in an unsharded program's names, each tensor received from its owner
 * as the save reaches it while the owners run p:send_state(). */
static int l_save(lua_State *L)
{
    ck_program *p = ck_lua_program_pinned(L, 1, 4);
    const char *path = luaL_checkstring(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    ck_lua_check_path(L, path, CK_ACCESS_WRITE);
    ck_st_dtype dtype = CK_ST_F32;
    if (lua_istable(L, 4)) {
        lua_pushliteral(L, "dtype");
        lua_rawget(L, 4);
        if (lua_isstring(L, -1)) dtype = dtype_arg(L, lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    ck_st_writer *w = guarded_writer(L);
    int guard = lua_gettop(L);
    /* metadata first, then the entries, then the save: all read raw */
    if (lua_istable(L, 4)) {
        lua_pushliteral(L, "metadata");
        lua_rawget(L, 4);
        add_metadata(L, lua_gettop(L), w);
        lua_pop(L, 1);
    }
    const lua_Unsigned n = lua_rawlen(L, 3);
    for (lua_Unsigned i = 1; i <= n; i++) {
        if ((i & 255) == 0) ck_limits_charge(L, 4096);
        lua_rawgeti(L, 3, (lua_Integer)i);
        int e = lua_gettop(L);
        luaL_checktype(L, e, LUA_TTABLE);
        lua_rawgeti(L, e, 1);
        const char *key = luaL_checkstring(L, -1);
        lua_pushliteral(L, "value");
        lua_rawget(L, e);
        if (lua_isnumber(L, -1)) {
            float v = (float)lua_tonumber(L, -1);
            ck_st_writer_add(w, key, dtype, 0, NULL, &v);
        } else {
            lua_rawgeti(L, e, 2);
            int id = ck_lua_program_tensor(L, p, -1);
            if (!ck_program_data(p, id)) return ck_lua_raise(L, "save: tensor for '%s' is not readable", key);
            const ck_shape *s = &p->g->t[id].shape;
            /* bytes (8-bit optimizer codes) stay bytes */
            ck_st_writer_add_source(w, key, p->g->t[id].dtype == CK_U8 ? CK_ST_U8 : dtype, s->ndim, s->d,
                                    program_values, p, id);
        }
        lua_settop(L, e - 1);
    }
    if (lua_istable(L, 4)) {
        lua_pushliteral(L, "shards");
        lua_rawget(L, 4);
        const int shards = lua_toboolean(L, -1);
        lua_pop(L, 1);
        if (shards && p->owner && ck_dist_rank() == 0) add_remote_states(L, p, w);
    }
    return save_guarded(L, guard, path);
}

/* ck.write_safetensors(path, {{key, shape, values}, ...} [, metadata [, dtype]]):
 * values a flat list of numbers or a ck.array of as many; saved atomically */
static int l_write(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    ck_lua_check_path(L, path, CK_ACCESS_WRITE);
    ck_st_dtype dtype = lua_isstring(L, 4) ? dtype_arg(L, lua_tostring(L, 4)) : CK_ST_F32;
    ck_st_writer *w = guarded_writer(L);
    int guard = lua_gettop(L);
    /* read raw: the writer holds each key and buffer until the save */
    const lua_Unsigned n = lua_rawlen(L, 2);
    for (lua_Unsigned i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, (lua_Integer)i);
        int e = lua_gettop(L);
        luaL_checktype(L, e, LUA_TTABLE);
        lua_rawgeti(L, e, 1);
        const char *key = luaL_checkstring(L, -1);
        lua_rawgeti(L, e, 2);
        luaL_checktype(L, -1, LUA_TTABLE);
        int64_t shape[CK_ST_MAX_DIMS], numel = 1;
        const lua_Unsigned nd = lua_rawlen(L, -1);
        if (nd > CK_ST_MAX_DIMS) return ck_lua_raise(L, "'%s': too many dims", key);
        for (int d = 0; d < (int)nd; d++) {
            lua_rawgeti(L, -1, d + 1);
            shape[d] = luaL_checkinteger(L, -1);
            if (shape[d] < 0 || (shape[d] && numel > INT64_MAX / shape[d]))
                return ck_lua_raise(L, "'%s': dim %d is negative or too large", key, d + 1);
            numel *= shape[d];
            lua_pop(L, 1);
        }
        lua_rawgeti(L, e, 3);
        int64_t anum = 0;
        const float *arr = ck_lua_toarray_numel(L, -1, &anum); /* a ck.array, or a flat list */
        if (!arr) luaL_checktype(L, -1, LUA_TTABLE);
        const lua_Unsigned nv = arr ? (lua_Unsigned)anum : lua_rawlen(L, -1);
        if (nv != (lua_Unsigned)numel)
            return ck_lua_raise(L, "'%s': %I values for %I elements", key, (lua_Integer)nv, (lua_Integer)numel);
        ck_mem_check(L, numel, sizeof(float), "a copy of '%s' (%lld values) to write", key, (long long)numel);
        float *x = lua_newuserdatauv(L, sizeof(float) * (size_t)(numel ? numel : 1), 0);
        arr = arr ? ck_lua_toarray_numel(L, -2, &anum) : NULL; /* again: the allocation may have run Lua */
        if (arr) {
            for (int64_t k = 0; k < numel; k += 1 << 16) {
                const int64_t m = numel - k < 1 << 16 ? numel - k : 1 << 16;
                memcpy(x + k, arr + k, sizeof(float) * (size_t)m);
                ck_limits_charge(L, m >> 4);
            }
        }
        for (int64_t k = 0; !arr && k < numel; k++) {
            if ((k & 4095) == 4095) ck_limits_charge(L, 4096);
            lua_rawgeti(L, -2, k + 1);
            x[k] = (float)luaL_checknumber(L, -1);
            lua_pop(L, 1);
        }
        ck_st_writer_add(w, key, dtype, nd, shape, x);
        lua_settop(L, e - 1);
    }
    add_metadata(L, 3, w);
    return save_guarded(L, guard, path);
}

static int l_writer_gc(lua_State *L)
{
    ck_st_writer **guard = luaL_checkudata(L, 1, WRITER_MT);
    ck_st_writer_free(*guard);
    *guard = NULL;
    return 0;
}

void ck_lua_st_register(lua_State *L, int lib, int methods)
{
    static const luaL_Reg file_methods[] = {
        {"keys", l_keys},   {"has", l_has},   {"shape", l_shape}, {"dtype", l_dtype},
        {"metadata", l_metadata}, {"read", l_read}, {"close", l_close}, {NULL, NULL},
    };
    luaL_newmetatable(L, STFILE_MT);
    luaL_newlib(L, file_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_close);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
    lua_pushcfunction(L, l_open);
    lua_setfield(L, lib, "safetensors");
    lua_pushcfunction(L, l_write);
    lua_setfield(L, lib, "write_safetensors");
    static const luaL_Reg prog[] = {
        {"load", l_load}, {"load_sample", l_load_sample}, {"save", l_save}, {"send_state", l_send_state}, {NULL, NULL},
    };
    lua_pushvalue(L, methods);
    luaL_setfuncs(L, prog, 0);
    lua_pop(L, 1);
    luaL_newmetatable(L, WRITER_MT);
    lua_pushcfunction(L, l_writer_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
}
