/* Files, directories and clocks for scripts: the only ways a script reaches
 * the file system besides safetensors (vm/lua/lua_st.c) and the sandbox's checked
 * io.open (vm/guard/sandbox.c). Every path goes through the sandbox's door
 * (ck_lua_open, ck_lua_mkdirs), which judges it and opens it beneath the
 * allowed directory's descriptor. */
#include "lua/lua_ck.h"

#include <lauxlib.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

#define DIRBOX_MT "ck.dirbox"

/* the open directory of a listdir, closed by the box's finalizer when an
 * error (out of memory) unwinds past it */
static int dirbox_gc(lua_State *L)
{
    DIR **box = luaL_checkudata(L, 1, DIRBOX_MT);
    if (*box) closedir(*box);
    *box = NULL;
    return 0;
}

/* ck.listdir(dir) -> sorted list of entry names (no "." or ".."), or nil, message */
static int l_listdir(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    DIR **box = lua_newuserdatauv(L, sizeof(DIR *), 0);
    *box = NULL;
    if (luaL_newmetatable(L, DIRBOX_MT)) {
        lua_pushcfunction(L, dirbox_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
    }
    lua_setmetatable(L, -2);
    int fd = ck_lua_open(L, path, CK_ACCESS_READ | CK_ACCESS_DIR, O_RDONLY | O_DIRECTORY, 0);
    DIR *d = *box = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) {
            int e = errno;
            close(fd);
            errno = e;
        }
        luaL_pushfail(L);
        lua_pushfstring(L, "cannot read directory '%s': %s", path, strerror(errno));
        return 2;
    }
    lua_newtable(L);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            lua_pushstring(L, e->d_name);
            lua_rawseti(L, -2, ++n);
        }
    *box = NULL;
    closedir(d);
    const char **names = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n ? n : 1), 0);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, -2, i + 1);
        names[i] = lua_tostring(L, -1);
        lua_pop(L, 1); /* the string stays alive in the table */
    }
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* ck.mkdir(path): creates the directory and its parents; true, or nil, message */
static int l_mkdir(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    if (ck_lua_mkdirs(L, path)) {
        luaL_pushfail(L);
        lua_pushfstring(L, "cannot create directory '%s': %s", path, strerror(errno));
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* ck.now() -> seconds on a monotonic clock */
static int l_now(lua_State *L)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + 1e-9 * (lua_Number)ts.tv_nsec);
    return 1;
}

static int l_isatty(lua_State *L)
{
    lua_pushboolean(L, isatty(1));
    return 1;
}

void ck_lua_fs_register(lua_State *L, int lib)
{
    static const luaL_Reg funcs[] = {
        {"isatty", l_isatty}, {"now", l_now}, {"listdir", l_listdir}, {"mkdir", l_mkdir}, {NULL, NULL},
    };
    lua_pushvalue(L, lib);
    luaL_setfuncs(L, funcs, 0);
    lua_pop(L, 1);
    /* ck.call_limited (vm/guard/runlimits.c) rides along until luaopen_ck registers it */
    ck_lua_limits_register(L, lua_absindex(L, lib));
}
