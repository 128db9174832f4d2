/* ck.array: a host array of float32 values (up to 8 dims, row-major) held in
 * one userdata, so that large tensors move between programs, images and files
 * without passing through Lua tables. Its bytes live in the Lua heap, which
 * counts them; each allocation is checked against the memory limit first. */
#include "lua/lua_ck.h"

#include <lauxlib.h>

#include <stdint.h>
#include <string.h>

#define ARRAY_MT "ck.array"
#define ARRAY_MAX_DIMS 8

typedef struct larray {
    int ndim;
    int64_t d[ARRAY_MAX_DIMS];
    int64_t n;
    float x[]; /* n values */
} larray;

/* copies and fills poll every CHUNK values */
#define CHUNK ((int64_t)1 << 16)

static larray *check_array(lua_State *L, int i) { return luaL_checkudata(L, i, ARRAY_MT); }

/* Pushes a new array of shape d (values unset). The bytes are checked against
 * the memory limit before they are allocated. */
static larray *new_array(lua_State *L, int ndim, const int64_t *d)
{
    int64_t n = 1;
    for (int k = 0; k < ndim; k++) {
        if (d[k] < 0) ck_lua_raise(L, "array: dim %d is negative (%I)", k + 1, (lua_Integer)d[k]);
        if (d[k] && n > (INT64_MAX / (int64_t)sizeof(float)) / d[k])
            ck_lua_raise(L, "array: %d dims whose product is too large", ndim);
        n *= d[k];
    }
    ck_mem_check(L, n, sizeof(float), "an array of %lld values", (long long)n);
    larray *a = lua_newuserdatauv(L, sizeof *a + sizeof(float) * (size_t)n, 0);
    a->ndim = ndim;
    memset(a->d, 0, sizeof a->d);
    for (int k = 0; k < ndim; k++) a->d[k] = d[k];
    a->n = n;
    luaL_setmetatable(L, ARRAY_MT);
    return a;
}

float *ck_lua_newarray(lua_State *L, int ndim, const int64_t *d)
{
    if (ndim < 0 || ndim > ARRAY_MAX_DIMS) ck_lua_raise(L, "array: %d dims (at most %d)", ndim, ARRAY_MAX_DIMS);
    return new_array(L, ndim, d)->x;
}

float *ck_lua_toarray(lua_State *L, int idx, ck_shape *shape)
{
    larray *a = luaL_testudata(L, idx, ARRAY_MT);
    if (!a) return NULL;
    if (a->ndim > CK_MAX_DIMS)
        ck_lua_raise(L, "an array of %d dims where at most %d fit (reshape it first)", a->ndim, CK_MAX_DIMS);
    if (shape) {
        memset(shape, 0, sizeof *shape);
        shape->ndim = a->ndim;
        for (int k = 0; k < a->ndim; k++) shape->d[k] = a->d[k];
    }
    return a->x;
}

float *ck_lua_toarray_numel(lua_State *L, int idx, int64_t *numel)
{
    larray *a = luaL_testudata(L, idx, ARRAY_MT);
    if (!a) return NULL;
    if (numel) *numel = a->n;
    return a->x;
}

/* A shape list at index i, read raw: at most 8 non-negative integers. One
 * entry may be -1 when infer is given: it becomes what makes infer values. */
static int read_shape(lua_State *L, int i, int64_t *d, const int64_t *infer)
{
    luaL_checktype(L, i, LUA_TTABLE);
    const lua_Unsigned nd = lua_rawlen(L, i);
    if (nd > ARRAY_MAX_DIMS) ck_lua_raise(L, "array: a shape of %I dims (at most %d)", (lua_Integer)nd, ARRAY_MAX_DIMS);
    int free_dim = -1;
    int64_t known = 1;
    for (int k = 0; k < (int)nd; k++) {
        lua_rawgeti(L, i, k + 1);
        int isint = 0;
        const lua_Integer v = lua_tointegerx(L, -1, &isint);
        lua_pop(L, 1);
        if (!isint)
            ck_lua_raise(L, "array: shape entry %d is not an integer", k + 1);
        if (v == -1 && infer && free_dim < 0) {
            free_dim = k;
            d[k] = 1;
            continue;
        }
        if (v < 0) ck_lua_raise(L, "array: dim %d is negative (%I)", k + 1, v);
        d[k] = v;
        if (v && known > INT64_MAX / 4 / v) ck_lua_raise(L, "array: %d dims whose product is too large", (int)nd);
        known *= v;
    }
    if (free_dim >= 0) {
        if (known == 0 || *infer % known)
            ck_lua_raise(L, "reshape: %I values do not fill a shape with -1 at dim %d", (lua_Integer)*infer, free_dim + 1);
        d[free_dim] = *infer / known;
    }
    return (int)nd;
}

/* Values of a flat or nested list (read raw) into x, at most n of them; the
 * count found goes to *k. */
static void flatten(lua_State *L, int t, float *x, int64_t n, int64_t *k, int depth)
{
    if (depth > ARRAY_MAX_DIMS) ck_lua_raise(L, "array: values nested deeper than %d lists", ARRAY_MAX_DIMS);
    const lua_Unsigned len = lua_rawlen(L, t);
    for (lua_Unsigned j = 1; j <= len; j++) {
        if ((*k & 4095) == 4095) ck_limits_charge(L, 4096);
        const int ty = lua_rawgeti(L, t, (lua_Integer)j);
        if (ty == LUA_TNUMBER) {
            if (*k < n) x[*k] = (float)lua_tonumber(L, -1);
            ++*k;
        } else if (ty == LUA_TTABLE) {
            flatten(L, lua_gettop(L), x, n, k, depth + 1);
        } else {
            ck_lua_raise(L, "array: value %I is a %s, not a number", (lua_Integer)(*k + 1), lua_typename(L, ty));
        }
        lua_pop(L, 1);
    }
}

/* ck.array(shape [, fill | values]) -> a: zeros, every value fill, or the
 * numbers of a flat (or nested) list of exactly numel values */
static int l_array(lua_State *L)
{
    int64_t d[ARRAY_MAX_DIMS];
    lua_settop(L, 2);
    const int nd = read_shape(L, 1, d, NULL);
    larray *a = new_array(L, nd, d);
    if (lua_type(L, 2) == LUA_TTABLE) {
        int64_t k = 0;
        flatten(L, 2, a->x, a->n, &k, 1);
        if (k != a->n)
            return ck_lua_raise(L, "array: %I values for %I elements", (lua_Integer)k, (lua_Integer)a->n);
    } else {
        const float v = lua_isnoneornil(L, 2) ? 0.0f : (float)luaL_checknumber(L, 2);
        for (int64_t i = 0; i < a->n; i += CHUNK) {
            const int64_t m = a->n - i < CHUNK ? a->n - i : CHUNK;
            for (int64_t j = 0; j < m; j++) a->x[i + j] = v;
            if (i) ck_limits_charge(L, m >> 4);
        }
    }
    return 1;
}

static int64_t index_arg(lua_State *L, larray *a, int i)
{
    const lua_Integer k = luaL_checkinteger(L, i);
    if (k < 1 || k > a->n)
        ck_lua_raise(L, "array: index %I is outside 1..%I", k, (lua_Integer)a->n);
    return k - 1;
}

/* a:get(i) -> number (1-based flat index) */
static int l_get(lua_State *L)
{
    larray *a = check_array(L, 1);
    lua_pushnumber(L, a->x[index_arg(L, a, 2)]);
    return 1;
}

/* a:set(i, v) */
static int l_set(lua_State *L)
{
    larray *a = check_array(L, 1);
    const int64_t k = index_arg(L, a, 2);
    a->x[k] = (float)luaL_checknumber(L, 3);
    return 0;
}

/* a:table() -> flat list of the values (for tests and small arrays) */
static int l_table(lua_State *L)
{
    larray *a = check_array(L, 1);
    ck_mem_check(L, a->n, 16, "a list of %lld array values", (long long)a->n);
    if (a->n > INT32_MAX) return ck_lua_raise(L, "array: %I values are more than a Lua list holds", (lua_Integer)a->n);
    lua_createtable(L, (int)a->n, 0);
    for (int64_t i = 0; i < a->n; i++) {
        if ((i & 4095) == 4095) ck_limits_charge(L, 4096);
        lua_pushnumber(L, a->x[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* copies n values from src to dst, polling between chunks */
static void copy_values(lua_State *L, float *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += CHUNK) {
        const int64_t m = n - i < CHUNK ? n - i : CHUNK;
        memcpy(dst + i, src + i, sizeof(float) * (size_t)m);
        if (i) ck_limits_charge(L, m >> 4);
    }
}

/* a:reshape(shape) -> a new array (a copy) of the same values in another
 * shape with as many elements; one dim may be -1 (inferred) */
static int l_reshape(lua_State *L)
{
    larray *a = check_array(L, 1);
    int64_t d[ARRAY_MAX_DIMS], n = 1;
    const int nd = read_shape(L, 2, d, &a->n);
    for (int k = 0; k < nd; k++) n *= d[k];
    if (n != a->n)
        return ck_lua_raise(L, "reshape: %I values cannot take a shape of %I elements", (lua_Integer)a->n, (lua_Integer)n);
    larray *b = new_array(L, nd, d);
    copy_values(L, b->x, a->x, a->n);
    return 1;
}

/* a:slice(dim, start, count) -> a new array: entries start .. start+count-1
 * (1-based) along dim (1-based), all of every other dim */
static int l_slice(lua_State *L)
{
    larray *a = check_array(L, 1);
    const lua_Integer dim = luaL_checkinteger(L, 2), start = luaL_checkinteger(L, 3), count = luaL_checkinteger(L, 4);
    if (dim < 1 || dim > a->ndim) return ck_lua_raise(L, "slice: dim %I of an array of %d dims", dim, a->ndim);
    const int64_t len = a->d[dim - 1];
    if (count < 0 || start < 1 || start - 1 > len - count)
        return ck_lua_raise(L, "slice: entries %I..%I of dim %I, which has %I", start, start + count - 1, dim,
                            (lua_Integer)len);
    int64_t d[ARRAY_MAX_DIMS], outer = 1, inner = 1;
    for (int k = 0; k < a->ndim; k++) {
        d[k] = a->d[k];
        if (k < dim - 1) outer *= a->d[k];
        if (k > dim - 1) inner *= a->d[k];
    }
    d[dim - 1] = count;
    larray *b = new_array(L, a->ndim, d);
    const int64_t run = count * inner;
    for (int64_t o = 0; o < outer; o++) {
        if ((o & 255) == 255) ck_limits_charge(L, 4096);
        copy_values(L, b->x + o * run, a->x + (o * len + start - 1) * inner, run);
    }
    return 1;
}

static int l_len(lua_State *L)
{
    lua_pushinteger(L, check_array(L, 1)->n);
    return 1;
}

static int l_tostring(lua_State *L)
{
    larray *a = check_array(L, 1);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "ck.array [");
    for (int k = 0; k < a->ndim; k++) {
        if (k) luaL_addstring(&b, ", ");
        lua_pushinteger(L, a->d[k]);
        luaL_addvalue(&b);
    }
    luaL_addstring(&b, "]");
    luaL_pushresult(&b);
    return 1;
}

/* a.shape -> a new list of the dims; other keys: the methods */
static int l_index(lua_State *L)
{
    larray *a = check_array(L, 1);
    if (lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), "shape") == 0) {
        lua_createtable(L, a->ndim, 0);
        for (int k = 0; k < a->ndim; k++) {
            lua_pushinteger(L, a->d[k]);
            lua_rawseti(L, -2, k + 1);
        }
        return 1;
    }
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    return 1;
}

/* p:array(tensor|name) -> a copy of a program tensor (an input, a parameter
 * or an output the last run kept) as an array of its shape */
static int l_program_array(lua_State *L)
{
    ck_program *p = ck_lua_program_pinned(L, 1, 2);
    const int id = ck_lua_program_tensor(L, p, 2);
    const ck_shape s = p->g->t[id].shape;
    const char *where = p->g->t[id].where;
    int64_t d[ARRAY_MAX_DIMS];
    for (int k = 0; k < s.ndim; k++) d[k] = s.d[k];
    larray *a = new_array(L, s.ndim, d);
    /* read after the allocation, which may have run a collection */
    const float *x = ck_program_read(p, id);
    if (!x && p->err[0]) return ck_lua_raise(L, "%s", p->err);
    if (!x)
        return ck_lua_raise(L, "%s: tensor from this line was not kept by the last run; list it in compile{outputs=...}",
                            where ? where : "?");
    copy_values(L, a->x, x, a->n);
    return 1;
}

void ck_lua_array_register(lua_State *L, int lib, int methods)
{
    static const luaL_Reg array_methods[] = {
        {"get", l_get}, {"set", l_set}, {"table", l_table}, {"reshape", l_reshape}, {"slice", l_slice}, {NULL, NULL},
    };
    lib = lua_absindex(L, lib);
    methods = lua_absindex(L, methods);
    luaL_newmetatable(L, ARRAY_MT);
    luaL_newlib(L, array_methods);
    lua_pushcclosure(L, l_index, 1);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_len);
    lua_setfield(L, -2, "__len");
    lua_pushcfunction(L, l_tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
    lua_pushcfunction(L, l_array);
    lua_setfield(L, lib, "array");
    lua_pushcfunction(L, l_program_array);
    lua_setfield(L, methods, "array");
}
