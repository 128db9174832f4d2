/* The script's "file:line" for error messages (vm/util/where.h). */
#include "util/where.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ck_lua_is_stdlib(const char *source)
{
    return strstr(source, "/stdlib/ck/") != NULL || strstr(source, "/lua/5.4/ck/") != NULL ||
           strstr(source, "/share/lua/5.4/ck/") != NULL;
}

void ck_lua_where_from(lua_State *L, int level, char *buf, size_t len)
{
    lua_Debug ar;
    buf[0] = 0;
    for (; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;
        if (!buf[0]) snprintf(buf, len, "%s:%d", ar.short_src, ar.currentline);
        if (!ck_lua_is_stdlib(ar.source)) {
            snprintf(buf, len, "%s:%d", ar.short_src, ar.currentline);
            return;
        }
    }
    if (!buf[0]) snprintf(buf, len, "?");
}

void ck_lua_where(lua_State *L, char *buf, size_t len) { ck_lua_where_from(L, 1, buf, len); }

int ck_lua_raise(lua_State *L, const char *fmt, ...)
{
    char w[256];
    va_list ap;
    ck_lua_where(L, w, sizeof w);
    lua_pushfstring(L, "%s: ", w);
    va_start(ap, fmt);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_concat(L, 2);
    return lua_error(L);
}
