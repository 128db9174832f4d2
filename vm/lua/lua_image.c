/* Images from Lua: ck.image_info reads a header, ck.image_load decodes PNG,
 * JPEG or WebP (vm/formats/image.c) straight into a ck.array [3, H, W] of
 * values in [-1, 1], resized, cropped and flipped on the way; ck.write_png
 * writes such an array atomically with text chunks. Files are opened through
 * the sandbox's door; the decoder's memory and the decoded pixels are charged
 * to the VM's memory budget before they are allocated, and the reader polls
 * the interrupt and the callback budget as it goes (vm/guard/poll.h). */
#include "lua/lua_ck.h"
#include "formats/image.h"
#include "guard/poll.h"

#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define READER_MT "ck.image_reader"

/* the open reader of a binding, closed by the box's finalizer when an error
 * unwinds past it */
static int reader_gc(lua_State *L)
{
    ck_image_reader **box = luaL_checkudata(L, 1, READER_MT);
    ck_image_close(*box);
    *box = NULL;
    return 0;
}

/* Opens path through the sandbox's door and reads its header; the reader's
 * box is pushed. Raises with the file named on any problem. */
static ck_image_reader **open_image(lua_State *L, const char *path)
{
    ck_image_reader **box = lua_newuserdatauv(L, sizeof *box, 0);
    *box = NULL;
    luaL_setmetatable(L, READER_MT);
    /* the budget and the limits live as long as the VM: a reader that an
     * error leaves to the collector still gives back to them */
    ck_limits *lim = ck_limits_of(L);
    const ck_image_charge charge = {ck_mem_take_ud, ck_mem_give_ud, lim ? &lim->mem : NULL, ck_limits_poll_ud, lim};
    char err[512];
    *box = ck_image_open_fd(ck_lua_open(L, path, CK_ACCESS_READ, O_RDONLY, 0), path, 0, lim ? &charge : NULL, err,
                            sizeof err);
    if (!*box) {
        /* a stop the reader was asked for is the interrupt's or the budget's */
        ck_limits_raise_pending(L);
        ck_lua_raise(L, "%s", err);
    }
    return box;
}

/* ck.image_info(path) -> {width =, height =, format = "png"|"jpeg"|"webp",
 * text = {key = value} (PNG: the text chunks before the image data)}: the
 * header only, nothing decoded */
static int l_image_info(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    lua_settop(L, 1);
    ck_image_reader **box = open_image(L, path);
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, ck_image_width(*box));
    lua_setfield(L, -2, "width");
    lua_pushinteger(L, ck_image_height(*box));
    lua_setfield(L, -2, "height");
    lua_pushstring(L, ck_image_format_name(ck_image_format_of(*box)));
    lua_setfield(L, -2, "format");
    if (ck_image_format_of(*box) == CK_IMAGE_PNG) {
        lua_newtable(L);
        const char *k, *v;
        for (int i = 0; ck_image_text_at(*box, i, &k, &v) == 0; i++) {
            if ((i & 255) == 255) ck_limits_charge(L, 4096);
            lua_pushstring(L, v);
            lua_setfield(L, -2, k);
        }
        lua_setfield(L, -2, "text");
    }
    ck_image_close(*box);
    *box = NULL;
    return 1;
}

/* integers [1..n] of the list field `name` of the options at index o (read
 * raw) into v; 0 when the field is absent */
static int int_list(lua_State *L, int o, const char *name, int n, int *v)
{
    lua_pushstring(L, name);
    const int ty = lua_rawget(L, o);
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        return 0;
    }
    if (ty != LUA_TTABLE || lua_rawlen(L, -1) != (lua_Unsigned)n)
        ck_lua_raise(L, "image_load: %s must be a list of %d integers", name, n);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, -1, i + 1);
        int isint = 0;
        const lua_Integer x = lua_tointegerx(L, -1, &isint);
        if (!isint || x < INT_MIN || x > INT_MAX)
            ck_lua_raise(L, "image_load: %s[%d] is not an integer", name, i + 1);
        v[i] = (int)x;
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return 1;
}

static void poll_limits(void *ud) { ck_limits_charge((lua_State *)ud, 4096); }

/* ck.image_load(path [, {resize = {w, h}, crop = {top, left, h, w}, flip =
 * bool}]) -> ck.array [3, H, W] of v / 127.5 - 1. Resize first, then the crop
 * (top and left count from 0, in the resized image), then the horizontal
 * flip; see vm/formats/image.h for the resampling. */
static int l_image_load(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    if (!lua_isnoneornil(L, 2)) luaL_checktype(L, 2, LUA_TTABLE);
    lua_settop(L, 2);
    ck_image_xform xf;
    memset(&xf, 0, sizeof xf);
    if (lua_istable(L, 2)) {
        int v[4];
        if (int_list(L, 2, "resize", 2, v)) {
            if (v[0] <= 0 || v[1] <= 0) return ck_lua_raise(L, "image_load: resize {%d, %d} is not a size", v[0], v[1]);
            xf.resize_w = v[0];
            xf.resize_h = v[1];
        }
        if (int_list(L, 2, "crop", 4, v)) {
            if (v[2] <= 0 || v[3] <= 0)
                return ck_lua_raise(L, "image_load: crop {%d, %d, %d, %d} has no pixels", v[0], v[1], v[2], v[3]);
            xf.crop_top = v[0];
            xf.crop_left = v[1];
            xf.crop_h = v[2];
            xf.crop_w = v[3];
        }
        lua_pushliteral(L, "flip");
        const int ty = lua_rawget(L, 2);
        if (ty != LUA_TNIL && ty != LUA_TBOOLEAN) return ck_lua_raise(L, "image_load: flip must be a boolean");
        xf.flip = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    ck_image_reader **box = open_image(L, path);
    const int w = ck_image_width(*box), h = ck_image_height(*box);
    char err[512];
    int ow, oh;
    size_t scratch;
    if (ck_image_xform_plan(&xf, w, h, &ow, &oh, &scratch, err, sizeof err)) {
        ck_image_close(*box);
        *box = NULL;
        return ck_lua_raise(L, "%s: image_load: %s", path, err);
    }
    /* the decoded bytes (charged by the reader), the resampling's scratch
     * and the array at once */
    const int64_t bytes = (int64_t)w * h * 3 + (int64_t)scratch + (int64_t)ow * oh * 3 * 4;
    ck_mem_check(L, bytes, 1, "decoding %s (%dx%d)", path, w, h);
    int rc;
    while ((rc = ck_image_read_step(*box, err, sizeof err)) == 1) {
    }
    if (rc) {
        ck_image_close(*box);
        *box = NULL;
        ck_limits_raise_pending(L);
        return ck_lua_raise(L, "%s", err);
    }
    void *s = lua_newuserdatauv(L, scratch ? scratch : 1, 0);
    const int64_t d[3] = {3, oh, ow};
    float *out = ck_lua_newarray(L, 3, d);
    ck_image_to_chw(ck_image_pixels(*box), w, h, &xf, s, out, poll_limits, L);
    ck_image_close(*box);
    *box = NULL;
    return 1;
}

/* ck.write_png(path, array [3, H, W] in [-1, 1] [, {text = {key = value}}]):
 * values clamped and rounded to 8 bits as (x + 1) * 127.5; written to a temp
 * file beside path and renamed into place, so a failed write leaves an
 * existing file as it was */
static int l_write_png(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    ck_shape s;
    const float *x = ck_lua_toarray(L, 2, &s);
    if (!x) return luaL_typeerror(L, 2, "ck.array");
    if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
    lua_settop(L, 3);
    if (s.ndim != 3 || s.d[0] != 3 || s.d[1] < 1 || s.d[2] < 1 || s.d[1] > INT_MAX || s.d[2] > INT_MAX / 3) {
        char b[128];
        return ck_lua_raise(L, "write_png: %s: the array is %s, not [3, H, W]", path, ck_shape_str(&s, b, sizeof b));
    }
    ck_lua_check_path(L, path, CK_ACCESS_WRITE);
    /* the text chunks: keys and values (strings, or numbers as strings) held
     * by an anchor list, read raw */
    lua_newtable(L);
    const int anchor = lua_gettop(L);
    int ntext = 0;
    if (lua_istable(L, 3)) {
        lua_pushliteral(L, "text");
        const int ty = lua_rawget(L, 3);
        if (ty == LUA_TTABLE) {
            lua_pushnil(L);
            while (lua_next(L, -2)) {
                if (lua_type(L, -2) != LUA_TSTRING)
                    return ck_lua_raise(L, "write_png: %s: text keys must be strings, got %s", path,
                                        luaL_typename(L, -2));
                const int vt = lua_type(L, -1);
                if (vt != LUA_TSTRING && vt != LUA_TNUMBER)
                    return ck_lua_raise(L, "write_png: %s: text '%s' must be a string or a number, got %s", path,
                                        lua_tostring(L, -2), lua_typename(L, vt));
                if (ntext >= 1024) return ck_lua_raise(L, "write_png: %s: more than 1024 text chunks", path);
                lua_pushvalue(L, -2);
                lua_rawseti(L, anchor, 2 * ntext + 1);
                lua_pushvalue(L, -1);
                size_t vlen;
                const char *val = lua_tolstring(L, -1, &vlen); /* converts the copy */
                const char *key = lua_tostring(L, -3);
                if (strlen(val) != vlen || strlen(key) != lua_rawlen(L, -3))
                    return ck_lua_raise(L, "write_png: %s: text '%s' holds a NUL byte", path, key);
                lua_rawseti(L, anchor, 2 * ntext + 2);
                ntext++;
                lua_pop(L, 1);
            }
        } else if (ty != LUA_TNIL) {
            return ck_lua_raise(L, "write_png: %s: text must be a table of strings", path);
        }
        lua_pop(L, 1);
    }
    const char **kv = lua_newuserdatauv(L, sizeof(char *) * (size_t)(2 * ntext + 1), 0);
    for (int i = 0; i < 2 * ntext; i++) {
        lua_rawgeti(L, anchor, i + 1);
        kv[i] = lua_tostring(L, -1); /* held by the anchor */
        lua_pop(L, 1);
    }
    const char *keys[1024], *values[1024];
    for (int i = 0; i < ntext; i++) {
        keys[i] = kv[2 * i];
        values[i] = kv[2 * i + 1];
    }
    const int h = (int)s.d[1], w = (int)s.d[2];
    const size_t plane = (size_t)w * (size_t)h;
    ck_mem_check(L, (int64_t)plane * 3, 1, "the 8-bit pixels of %s (%dx%d)", path, w, h);
    uint8_t *rgb = lua_newuserdatauv(L, plane * 3, 0);
    for (size_t i = 0; i < plane; i++) {
        if ((i & 65535) == 65535) ck_limits_charge(L, 4096);
        for (int c = 0; c < 3; c++) {
            const float v = x[(size_t)c * plane + i];
            if (isnan(v))
                return ck_lua_raise(L, "write_png: %s: the array holds NaN at index %I", path,
                                    (lua_Integer)((size_t)c * plane + i + 1));
            double q = ((double)v + 1.0) * 127.5;
            q = q < 0 ? 0 : q > 255 ? 255 : q;
            rgb[3 * i + (size_t)c] = (uint8_t)floor(q + 0.5);
        }
    }
    char name[NAME_MAX + 1], err[512];
    const int dfd = ck_lua_open_parent(L, path, CK_ACCESS_WRITE, name, sizeof name);
    const int rc = ck_image_write_png_at(dfd, name, path, w, h, rgb, ntext, keys, values, err, sizeof err);
    if (dfd >= 0) close(dfd);
    if (rc) return ck_lua_raise(L, "%s", err);
    return 0;
}

void ck_lua_image_register(lua_State *L, int lib)
{
    lib = lua_absindex(L, lib);
    luaL_newmetatable(L, READER_MT);
    lua_pushcfunction(L, reader_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    lua_pushcfunction(L, l_image_info);
    lua_setfield(L, lib, "image_info");
    lua_pushcfunction(L, l_image_load);
    lua_setfield(L, lib, "image_load");
    lua_pushcfunction(L, l_write_png);
    lua_setfield(L, lib, "write_png");
}
