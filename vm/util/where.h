/* Where a script is: the "file:line" that errors name. The first frame
 * outside the shipped stdlib is the user's line. A leaf: the bindings and the
 * sandbox both use it, and it uses nothing of ckrun. */
#ifndef CK_WHERE_H
#define CK_WHERE_H

#include <lua.h>

#include <stddef.h>

/* whether a chunk's source (lua_Debug.source) is a module of the shipped
 * stdlib, from the source tree or an installed prefix */
int ck_lua_is_stdlib(const char *source);
/* "file:line" of the first script frame at or above level (1: the caller of
 * the running C function; 0: the running function itself) that is outside the
 * stdlib; the innermost frame with a line when every one is inside; "?" when
 * none has a line. */
void ck_lua_where_from(lua_State *L, int level, char *buf, size_t len);
/* ck_lua_where_from(L, 1, ...): the user's line of a binding's call */
void ck_lua_where(lua_State *L, char *buf, size_t len);
/* Raises "file:line: message" with the user's line (luaL_error would name the
 * caller's frame, which may be inside the stdlib). */
int ck_lua_raise(lua_State *L, const char *fmt, ...);

#endif
