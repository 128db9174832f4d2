/* ck.json_encode and ck.json_decode on jansson (vm/formats/json.h): Lua values
 * to JSON text and back. Tables are read raw; objects get sorted keys unless
 * ck.json_object gives their order; cycles, too deep nesting, non-finite
 * numbers and invalid UTF-8 are errors naming the script line and the path. */
#include "lua/lua_ck.h"

#include "formats/json.h"

#include <lauxlib.h>

#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define BOX_MT "ck.json_box"
#define OBJECT_MT "ck.json_object"
#define DEFAULT_DEPTH 100
#define MAX_DEPTH 1000

/* ck.json_null: a unique light userdata, JSON's null in both directions */
static const char null_tag;
#define NULL_TAG ((void *)&null_tag)

/* ---- jansson's allocations charged to a VM's memory budget during a parse
 * (ck_lua_json_charge_begin); elsewhere, and in other threads, plain malloc */

static _Thread_local ck_json_charge *charging;

static void *charged_malloc(size_t n)
{
    void *p = malloc(n);
    ck_json_charge *c = charging;
    if (!p || !c) return p;
    const size_t sz = malloc_usable_size(p) + sizeof(size_t); /* the block and its header */
    if (c->refused || ck_mem_take(c->budget, sz, "the values of the JSON text", c->err, sizeof c->err)) {
        c->refused = 1;
        free(p);
        return NULL;
    }
    c->charged += sz;
    return p;
}

static pthread_once_t alloc_once = PTHREAD_ONCE_INIT;
static void install_alloc(void) { json_set_alloc_funcs(charged_malloc, free); }

void ck_lua_json_charge_begin(lua_State *L, ck_json_charge *c)
{
    pthread_once(&alloc_once, install_alloc);
    memset(c, 0, sizeof *c);
    c->budget = ck_mem_budget_of(L);
    /* no collection inside jansson's allocator: the caller collects and
     * parses again when a charge is refused */
    if (c->budget) c->refusing = c->budget->refusing, c->budget->refusing = 1;
    c->prev = charging;
    charging = c;
}

void ck_lua_json_charge_end(ck_json_charge *c)
{
    charging = c->prev;
    if (c->budget) c->budget->refusing = c->refusing;
}

void ck_lua_json_give(ck_json_charge *c)
{
    ck_mem_give(c->budget, c->charged);
    c->charged = 0;
}

/* What a raise must not leak: the tree being built and the text being
 * dumped, freed by the box's __gc when an error unwinds past them, and the
 * charge for a decoded tree. */
typedef struct box {
    json_t *root;
    char *buf;
    size_t len, cap;
    ck_json_charge charge;
} box;

/* frees what the box holds and gives its charge back; the box stays usable */
static void box_gc_now(box *b)
{
    json_decref(b->root);
    b->root = NULL;
    free(b->buf);
    b->buf = NULL;
    b->len = b->cap = 0;
    ck_lua_json_give(&b->charge);
}

static int box_gc(lua_State *L)
{
    box_gc_now(luaL_checkudata(L, 1, BOX_MT));
    return 0;
}

static box *new_box(lua_State *L)
{
    box *b = lua_newuserdatauv(L, sizeof *b, 0);
    memset(b, 0, sizeof *b);
    luaL_setmetatable(L, BOX_MT);
    return b;
}

/* ---- encoding */

typedef struct enc {
    lua_State *L;
    box *box;
    int seen;          /* stack index of the set of tables on the current path */
    int max_depth;
    int nonfinite_null, whole_integers;
    int digits;        /* the most any real needs (ck_json_digits): the dump's precision */
    char path[256];
    size_t plen;
    long long work;    /* values visited: a poll of interrupts and limits every 4096 */
} enc;

static void poll(enc *e)
{
    if ((++e->work & 4095) == 0) ck_limits_charge(e->L, 4096);
}

static const char *path_of(enc *e) { return e->plen ? e->path : "the value"; }

/* raises fmt with the path and what (fmt holds two %s) */
static int enc_fail(enc *e, const char *fmt, const char *what)
{
    return ck_lua_raise(e->L, fmt, path_of(e), what);
}

/* the path grows by ".key", "[\"key\"]" or "[i]"; returns the old length */
static size_t path_push(enc *e, const char *key, size_t klen, lua_Integer i)
{
    size_t old = e->plen, room = sizeof e->path - e->plen;
    int n;
    if (e->plen >= 120) { /* a path that long is cut: its end still says where */
        if (strcmp(e->path + e->plen - 3, "...")) n = snprintf(e->path + e->plen, room, "...");
        else n = 0;
    } else if (!key) {
        n = snprintf(e->path + e->plen, room, "%s[%lld]", e->plen ? "" : "value", (long long)i);
    } else {
        int ident = klen > 0 && klen < 64 && !(key[0] >= '0' && key[0] <= '9');
        for (size_t k = 0; ident && k < klen; k++)
            ident = (key[k] >= 'a' && key[k] <= 'z') || (key[k] >= 'A' && key[k] <= 'Z') ||
                    (key[k] >= '0' && key[k] <= '9') || key[k] == '_';
        if (ident) n = snprintf(e->path + e->plen, room, "%s%.*s", e->plen ? "." : "", (int)klen, key);
        else n = snprintf(e->path + e->plen, room, "%s[\"%.*s\"]", e->plen ? "" : "value", (int)(klen < 40 ? klen : 40), key);
    }
    if (n < 0 || (size_t)n >= room) e->path[old] = 0;
    else e->plen += (size_t)n;
    return old;
}

static void path_pop(enc *e, size_t old)
{
    e->plen = old;
    e->path[old] = 0;
}

static void encode(enc *e, int idx, int depth, json_t *parent, const char *key, size_t klen);

/* v (stolen) into parent under key, or appended when key is NULL; at the top
 * (no parent) into the box. Containers hang in the tree before they are
 * filled, so a raise anywhere frees every value made so far. */
static void attach(enc *e, json_t *parent, const char *key, size_t klen, json_t *v)
{
    if (!v) luaL_error(e->L, "json_encode: out of memory");
    /* charged to the memory budget as jansson holds it: the value (null and
     * the booleans are shared) and its place in the parent, with room for
     * malloc's headers and a container's first table */
    size_t sz = json_is_string(v) ? 48 + json_string_length(v)
                : json_is_array(v) || json_is_object(v) ? 160
                : json_is_number(v) ? 48 : 0;
    if (parent) sz += key ? 64 + klen : 16;
    char err[256];
    if (ck_mem_take(e->box->charge.budget, sz, "json_encode: the values of the JSON text", err, sizeof err)) {
        /* everything made so far goes before the raise, which needs room for its message */
        json_decref(v);
        box_gc_now(e->box);
        ck_lua_raise(e->L, "%s", err);
    }
    e->box->charge.charged += sz;
    int rc = 0;
    if (!parent) e->box->root = v;
    else if (key) rc = json_object_setn_new_nocheck(parent, key, klen, v);
    else rc = json_array_append_new(parent, v);
    if (rc) luaL_error(e->L, "json_encode: out of memory");
}

/* a string key as JSON holds it: valid UTF-8 */
static const char *check_key(enc *e, int idx, size_t *klen)
{
    const char *k = lua_tolstring(e->L, idx, klen);
    if (ck_json_utf8_valid(k, *klen) != *klen) enc_fail(e, "json_encode: a key in %s is not valid UTF-8%s", "");
    return k;
}

typedef struct skey {
    const char *s;
    size_t n;
} skey;

static int cmp_skey(const void *a, const void *b)
{
    const skey *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

enum { LIST, OBJECT, ORDERED };

/* what the table at t is: a json_object (its list of {key, value} pairs), an
 * object (string keys), or a list (keys 1..n; an empty table is an empty
 * list); *n: its entries */
static int table_kind(enc *e, int t, lua_Integer *n)
{
    lua_State *L = e->L;
    if (lua_getmetatable(L, t)) {
        luaL_getmetatable(L, OBJECT_MT);
        int ordered = lua_rawequal(L, -1, -2);
        lua_pop(L, 2);
        if (ordered) {
            *n = (lua_Integer)lua_rawlen(L, t);
            return ORDERED;
        }
    }
    lua_Integer strs = 0, ints = 0, maxi = 0;
    lua_pushnil(L);
    while (lua_next(L, t)) {
        lua_pop(L, 1);
        poll(e);
        if (lua_type(L, -1) == LUA_TSTRING) {
            strs++;
        } else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1) {
            ints++;
            if (lua_tointeger(L, -1) > maxi) maxi = lua_tointeger(L, -1);
        } else {
            lua_pop(L, 1);
            enc_fail(e, "json_encode: %s has a key that is neither a string nor a list index 1..n%s", "");
        }
    }
    if (strs && ints) enc_fail(e, "json_encode: %s mixes string keys and list entries%s", "");
    if (ints && maxi != ints) enc_fail(e, "json_encode: %s is a list with holes (nil entries)%s", "");
    *n = strs ? strs : ints;
    return strs ? OBJECT : LIST;
}

static void encode_table(enc *e, int t, int depth, json_t *parent, const char *key, size_t klen)
{
    lua_State *L = e->L;
    if (depth >= e->max_depth)
        ck_lua_raise(L, "json_encode: %s is nested deeper than %d tables", path_of(e), e->max_depth);
    luaL_checkstack(L, 8, "json_encode: nested too deep");
    lua_pushvalue(L, t);
    if (lua_rawget(L, e->seen) != LUA_TNIL) enc_fail(e, "json_encode: %s holds itself (a cycle)%s", "");
    lua_pop(L, 1);
    lua_Integer n;
    int kind = table_kind(e, t, &n);
    json_t *c = kind == LIST ? json_array() : json_object();
    attach(e, parent, key, klen, c);
    lua_pushvalue(L, t);
    lua_pushboolean(L, 1);
    lua_rawset(L, e->seen);
    if (kind == ORDERED) {
        for (lua_Integer i = 1; i <= n; i++) {
            poll(e);
            size_t old = path_push(e, NULL, 0, i);
            if (lua_rawgeti(L, t, i) != LUA_TTABLE)
                enc_fail(e, "json_encode: %s of a ck.json_object is not a {key, value} pair%s", "");
            int pair = lua_gettop(L);
            if (lua_rawgeti(L, pair, 1) != LUA_TSTRING)
                enc_fail(e, "json_encode: %s of a ck.json_object has no string key%s", "");
            size_t kl;
            const char *k = check_key(e, -1, &kl);
            if (lua_rawgeti(L, pair, 2) != LUA_TNIL) { /* a pair without a value is left out */
                path_pop(e, old);
                old = path_push(e, k, kl, 0);
                encode(e, lua_gettop(L), depth + 1, c, k, kl);
            }
            path_pop(e, old);
            lua_settop(L, pair - 1);
        }
    } else if (kind == LIST) {
        for (lua_Integer i = 1; i <= n; i++) {
            poll(e);
            size_t old = path_push(e, NULL, 0, i);
            lua_rawgeti(L, t, i);
            encode(e, lua_gettop(L), depth + 1, c, NULL, 0);
            lua_pop(L, 1);
            path_pop(e, old);
        }
    } else {
        /* sorted keys, so the text is the same every run; the keys stay alive
         * in the table while the array points at them */
        skey *keys = lua_newuserdatauv(L, sizeof *keys * (size_t)n, 0);
        lua_Integer k = 0;
        lua_pushnil(L);
        while (lua_next(L, t)) {
            lua_pop(L, 1);
            keys[k].s = check_key(e, -1, &keys[k].n);
            k++;
        }
        qsort(keys, (size_t)k, sizeof *keys, cmp_skey);
        for (lua_Integer i = 0; i < k; i++) {
            poll(e);
            size_t old = path_push(e, keys[i].s, keys[i].n, 0);
            lua_pushlstring(L, keys[i].s, keys[i].n);
            lua_rawget(L, t);
            encode(e, lua_gettop(L), depth + 1, c, keys[i].s, keys[i].n);
            lua_pop(L, 1);
            path_pop(e, old);
        }
        lua_pop(L, 1);
    }
    lua_pushvalue(L, t);
    lua_pushnil(L);
    lua_rawset(L, e->seen);
}

static void encode(enc *e, int idx, int depth, json_t *parent, const char *key, size_t klen)
{
    lua_State *L = e->L;
    switch (lua_type(L, idx)) {
    case LUA_TTABLE: encode_table(e, idx, depth, parent, key, klen); return;
    case LUA_TNIL: attach(e, parent, key, klen, json_null()); return;
    case LUA_TBOOLEAN: attach(e, parent, key, klen, json_boolean(lua_toboolean(L, idx))); return;
    case LUA_TNUMBER: {
        if (lua_isinteger(L, idx)) {
            attach(e, parent, key, klen, json_integer((json_int_t)lua_tointeger(L, idx)));
            return;
        }
        double v = lua_tonumber(L, idx);
        if (!isfinite(v)) {
            if (!e->nonfinite_null)
                enc_fail(e, "json_encode: %s is not a finite number (%s); JSON has no NaN or infinity",
                         isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
            attach(e, parent, key, klen, json_null());
        } else if (e->whole_integers && v == floor(v) && fabs(v) < 0x1p63) {
            attach(e, parent, key, klen, json_integer((json_int_t)v));
        } else {
            const int d = ck_json_digits(v);
            if (d > e->digits) e->digits = d;
            attach(e, parent, key, klen, json_real(v));
        }
        return;
    }
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        size_t ok = ck_json_utf8_valid(s, n);
        if (ok != n) {
            char what[32];
            snprintf(what, sizeof what, "%zu", ok + 1);
            enc_fail(e, "json_encode: %s is not valid UTF-8 (at byte %s)", what);
        }
        attach(e, parent, key, klen, json_stringn_nocheck(s, n));
        return;
    }
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == NULL_TAG) {
            attach(e, parent, key, klen, json_null());
            return;
        }
        /* fall through */
    default:
        enc_fail(e, "json_encode: %s is a %s; JSON holds tables, strings, numbers, booleans and ck.json_null",
                 luaL_typename(L, idx));
    }
}

static int opt_field(lua_State *L, int opts, const char *name, int type)
{
    if (!opts) return 0;
    lua_pushstring(L, name);
    int t = lua_rawget(L, opts); /* raw, as every table json_encode reads */
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        return 0;
    }
    if (t != type) ck_lua_raise(L, "json_encode: option %s must be a %s", name, lua_typename(L, type));
    return 1;
}

/* ck.json_encode(value [, opts]) -> text. opts: indent = n (pretty, n spaces),
 * spaced = true (one line, ", " and ": "), nonfinite = "null" (NaN and
 * infinities as null, else an error), whole_floats = "integer" (floats that
 * hold whole numbers written as integers), ascii = true (\u escapes),
 * max_depth = n (tables nested at most n deep, default 100) */
static int l_json_encode(lua_State *L)
{
    luaL_checkany(L, 1);
    int opts = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        opts = 2;
    }
    lua_settop(L, 2);
    enc e;
    memset(&e, 0, sizeof e);
    e.L = L;
    e.max_depth = DEFAULT_DEPTH;
    size_t flags = JSON_ENCODE_ANY | JSON_COMPACT;
    if (opt_field(L, opts, "indent", LUA_TNUMBER)) {
        lua_Integer n = lua_tointeger(L, -1);
        if (n < 0 || n > 31) ck_lua_raise(L, "json_encode: indent must be 0 to 31 spaces");
        flags = (flags & ~(size_t)JSON_COMPACT) | JSON_INDENT(n);
        lua_pop(L, 1);
    }
    if (opt_field(L, opts, "spaced", LUA_TBOOLEAN)) {
        if (lua_toboolean(L, -1)) flags &= ~(size_t)JSON_COMPACT;
        lua_pop(L, 1);
    }
    if (opt_field(L, opts, "ascii", LUA_TBOOLEAN)) {
        if (lua_toboolean(L, -1)) flags |= JSON_ENSURE_ASCII;
        lua_pop(L, 1);
    }
    if (opt_field(L, opts, "nonfinite", LUA_TSTRING)) {
        if (strcmp(lua_tostring(L, -1), "null")) ck_lua_raise(L, "json_encode: nonfinite must be \"null\" (or absent: an error)");
        e.nonfinite_null = 1;
        lua_pop(L, 1);
    }
    if (opt_field(L, opts, "whole_floats", LUA_TSTRING)) {
        if (strcmp(lua_tostring(L, -1), "integer")) ck_lua_raise(L, "json_encode: whole_floats must be \"integer\" (or absent)");
        e.whole_integers = 1;
        lua_pop(L, 1);
    }
    if (opt_field(L, opts, "max_depth", LUA_TNUMBER)) {
        lua_Integer n = lua_tointeger(L, -1);
        if (n < 1 || n > MAX_DEPTH) ck_lua_raise(L, "json_encode: max_depth must be 1 to %d", MAX_DEPTH);
        e.max_depth = (int)n;
        lua_pop(L, 1);
    }
    e.box = new_box(L);
    e.box->charge.budget = ck_mem_budget_of(L);
    lua_newtable(L);
    e.seen = lua_gettop(L);
    encode(&e, 1, 0, NULL, NULL, 0);
    if (e.digits) flags |= JSON_REAL_PRECISION(e.digits);
    if (ck_json_append(e.box->root, flags, &e.box->buf, &e.box->len, &e.box->cap))
        return luaL_error(L, "json_encode: out of memory");
    /* the text, charged once written (the budget refusing it frees it with the box) */
    char err[256];
    if (ck_mem_take(e.box->charge.budget, e.box->cap, "json_encode: the JSON text", err, sizeof err)) {
        box_gc_now(e.box);
        return ck_lua_raise(L, "%s", err);
    }
    e.box->charge.charged += e.box->cap;
    lua_pushlstring(L, e.box->buf, e.box->len);
    box_gc_now(e.box); /* the tree and the text go now, not when the box is collected */
    return 1;
}

/* ck.json_object{{key, value}, ...}: the list, marked as an object whose keys
 * json_encode writes in this order (a pair with no value is left out) */
static int l_json_object(lua_State *L)
{
    if (lua_isnoneornil(L, 1)) {
        lua_settop(L, 0);
        lua_newtable(L);
    }
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    luaL_setmetatable(L, OBJECT_MT);
    return 1;
}

/* ---- decoding */

/* v as a Lua value on the stack: objects as tables keyed by name, arrays as
 * lists, null as ck.json_null */
static void push_value(lua_State *L, const json_t *v, int depth, long long *work)
{
    luaL_checkstack(L, 6, "json_decode: nested too deep");
    if ((++*work & 4095) == 0) ck_limits_charge(L, 4096); /* the box frees the tree if this raises */
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        lua_createtable(L, 0, (int)json_object_size(v));
        const char *k;
        size_t kl;
        json_t *x;
        json_object_keylen_foreach((json_t *)v, k, kl, x)
        {
            lua_pushlstring(L, k, kl);
            push_value(L, x, depth + 1, work);
            lua_rawset(L, -3);
        }
        break;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        lua_createtable(L, n < 1u << 30 ? (int)n : 0, 0);
        for (size_t i = 0; i < n; i++) {
            push_value(L, json_array_get(v, i), depth + 1, work);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        break;
    }
    case JSON_STRING: lua_pushlstring(L, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: lua_pushinteger(L, (lua_Integer)json_integer_value(v)); break;
    case JSON_REAL: lua_pushnumber(L, json_real_value(v)); break;
    case JSON_TRUE: lua_pushboolean(L, 1); break;
    case JSON_FALSE: lua_pushboolean(L, 0); break;
    case JSON_NULL: lua_pushlightuserdata(L, NULL_TAG); break;
    }
}

int ck_lua_limits_stop(lua_State *L, long long work)
{
    ck_limits *lim = ck_limits_of(L);
    if (!lim) return 0;
    if (lim->tripped || lim->interrupt) return 1;
    if (lim->depth > 0 && lim->budget >= 0 && work > 0) {
        lim->used += work;
        if (lim->used > lim->budget) return 1;
    }
    return 0;
}

void ck_lua_limits_raise(lua_State *L)
{
    ck_limits_charge(L, 1);
    luaL_error(L, "interrupted");
}

/* the text handed to jansson a piece at a time (it asks for 1 KiB), so that
 * a parse stopped by the memory limit tells how much of it the values so far
 * came from; every 64 KiB the VM's limits are polled, and a stop ends the
 * parse (the caller frees what it made, then raises) */
typedef struct reader {
    const char *s;
    size_t n, off, since;
    lua_State *L;
    int stopped;
} reader;

static size_t read_piece(void *buf, size_t len, void *ud)
{
    reader *r = ud;
    if (r->since >= 65536) {
        if (ck_lua_limits_stop(r->L, (long long)r->since)) {
            r->stopped = 1;
            return (size_t)-1;
        }
        r->since = 0;
    }
    size_t k = r->n - r->off < len ? r->n - r->off : len;
    if (k > 65536) k = 65536;
    memcpy(buf, r->s + r->off, k);
    r->off += k;
    r->since += k;
    return k;
}

/* ck.json_decode(text) -> value; malformed text (duplicate keys included) is
 * an error naming the line and column */
static int l_json_decode(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    box *b = new_box(L);
    json_error_t err;
    /* the tree is charged to the memory budget while it lives; refused, once
     * more after a full collection */
    for (int tries = 0;; tries++) {
        reader r = {s, n, 0, 0, L, 0};
        ck_lua_json_charge_begin(L, &b->charge);
        b->root = json_load_callback(read_piece, &r, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
        ck_lua_json_charge_end(&b->charge);
        if (r.stopped) {
            box_gc_now(b);
            ck_lua_limits_raise(L);
        }
        if (!b->charge.refused) break;
        json_decref(b->root);
        b->root = NULL;
        /* what the whole text would take, from what the part read took */
        const size_t read = r.off > 0 ? r.off : 1, took = b->charge.charged;
        ck_lua_json_give(&b->charge);
        if (tries) {
            const double whole = (double)took * ((double)n / (double)read);
            const size_t est = whole < (double)SIZE_MAX / 2 ? (size_t)whole : SIZE_MAX / 2, need = est > took ? est : took;
            char what[96], size[32], msg[256];
            ck_mem_text(n, size, sizeof size);
            snprintf(what, sizeof what, "the values of %s of JSON text", size);
            if (ck_mem_take(b->charge.budget, need, what, msg, sizeof msg) == 0) {
                ck_mem_give(b->charge.budget, need);
                return ck_lua_raise(L, "json_decode: %s", b->charge.err);
            }
            return ck_lua_raise(L, "json_decode: %s", msg);
        }
        lua_gc(L, LUA_GCCOLLECT);
    }
    if (!b->root) return ck_lua_raise(L, "json_decode: %s (line %d, column %d)", err.text, err.line, err.column);
    long long work = 0;
    push_value(L, b->root, 0, &work);
    json_decref(b->root);
    b->root = NULL;
    ck_lua_json_give(&b->charge);
    return 1;
}

void ck_lua_json_register(lua_State *L, int lib)
{
    lib = lua_absindex(L, lib);
    luaL_newmetatable(L, BOX_MT);
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    luaL_newmetatable(L, OBJECT_MT);
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {
        {"json_encode", l_json_encode}, {"json_decode", l_json_decode}, {"json_object", l_json_object}, {NULL, NULL},
    };
    lua_pushvalue(L, lib);
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
    lua_pushlightuserdata(L, NULL_TAG);
    lua_setfield(L, lib, "json_null");
}
