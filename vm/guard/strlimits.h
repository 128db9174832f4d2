/* ckrun's own Lua pattern matcher behind string.find, string.match,
 * string.gmatch and string.gsub, caps on the string builders (string.rep,
 * string.format, table.concat) and a heap sort for big tables. Lua's C
 * versions loop where the count hook cannot see them; these count their work
 * and charge it with ck_limits_charge, so Ctrl-C, ck_interrupt and the
 * callback budget stop them, and the builders refuse a result the Lua heap
 * limit could not hold before building it (a memory error: CK_EMEM). Lua's
 * other functions that copy or move a lot in one call (string.upper, lower,
 * reverse, sub, byte, char, pack, utf8.char, table.unpack, insert, remove,
 * move) charge their work before they run. */
#ifndef CK_STRLIMITS_H
#define CK_STRLIMITS_H

#include <lua.h>

/* Replaces those functions in L's string, table and utf8 libraries (already
 * opened).
 * The semantics are Lua 5.4's (manual, section 6.4.1); only the errors for
 * work past the limits are new. Outside a ckrun VM (no limits) nothing is
 * charged and only the size checks of Lua itself apply. */
void ck_strlimits_install(lua_State *L);

#endif
