/* ckrun's own Lua pattern matcher behind string.find, string.match,
 * string.gmatch and string.gsub, and caps on the string builders
 * (string.rep, string.format, table.concat). Lua's C versions loop where the
 * count hook cannot see them; these count their work and charge it with
 * ck_limits_charge, so Ctrl-C, ck_interrupt and the callback budget stop them,
 * and refuse a result the Lua heap limit could not hold before building it. */
#ifndef CK_STRLIMITS_H
#define CK_STRLIMITS_H

#include <lua.h>

/* Replaces those functions in L's string and table libraries (already opened).
 * The semantics are Lua 5.4's (manual, section 6.4.1); only the errors for
 * work past the limits are new. Outside a ckrun VM (no limits) nothing is
 * charged and only the size checks of Lua itself apply. */
void ck_strlimits_install(lua_State *L);

#endif
