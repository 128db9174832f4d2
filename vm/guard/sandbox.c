/* The sandbox: an allow-list of Lua's libraries, only Lua source through any
 * loader, and file access only inside allowed directories, judged on real
 * paths (symlinks and ".." resolved) so that no path escapes by spelling. */
#include "guard/sandbox.h"
#include "ck.h"
#include "guard/host.h"
#include "guard/runlimits.h"
#include "util/where.h"

#include <lauxlib.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- paths */

int ck_sandbox_resolve(const char *path, char *out, size_t len)
{
    char rest[2 * PATH_MAX], cur[PATH_MAX], tmp[2 * PATH_MAX];
    if (!path || !*path) {
        errno = ENOENT;
        return -1;
    }
    if (path[0] == '/') {
        if (strlen(path) >= sizeof rest) goto toolong;
        strcpy(rest, path);
    } else {
        if (!getcwd(cur, sizeof cur)) return -1;
        if ((size_t)snprintf(rest, sizeof rest, "%s/%s", cur, path) >= sizeof rest) goto toolong;
    }
    cur[0] = 0; /* "" is the root; otherwise "/a/b" */
    int links = 0;
    const char *p = rest;
    while (*p) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 1 && p[0] == '.') {
            p += n;
            continue;
        }
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            char *s = strrchr(cur, '/');
            if (s) *s = 0;
            p += n;
            continue;
        }
        size_t cl = strlen(cur);
        if (cl + 1 + n >= sizeof cur) goto toolong;
        cur[cl] = '/';
        memcpy(cur + cl + 1, p, n);
        cur[cl + 1 + n] = 0;
        p += n;
        /* a component that does not exist stays as spelled: what is created
         * there is a plain file or directory */
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) continue;
        if (++links > 40) {
            errno = ELOOP;
            return -1;
        }
        char target[PATH_MAX];
        ssize_t tl = readlink(cur, target, sizeof target - 1);
        if (tl < 0) return -1;
        target[tl] = 0;
        cur[cl] = 0;
        if (target[0] == '/') cur[0] = 0;
        if ((size_t)snprintf(tmp, sizeof tmp, "%s/%s", target, p) >= sizeof tmp) goto toolong;
        strcpy(rest, tmp);
        p = rest;
    }
    if ((size_t)snprintf(out, len, "%s", cur[0] ? cur : "/") >= len) goto toolong;
    return 0;
toolong:
    errno = ENAMETOOLONG;
    return -1;
}

static char *dup_str(ck_sandbox *sb, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = sb->alloc(sb->alloc_ud, NULL, 0, n);
    if (d) memcpy(d, s, n);
    return d;
}

static void free_str(ck_sandbox *sb, char *s)
{
    if (s) sb->alloc(sb->alloc_ud, s, strlen(s) + 1, 0);
}

static int push_root(ck_sandbox *sb, char ***list, int *n, int *cap, const char *real)
{
    for (int i = 0; i < *n; i++)
        if (strcmp((*list)[i], real) == 0) return 0;
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 4;
        char **l = sb->alloc(sb->alloc_ud, *list, *list ? sizeof(char *) * (size_t)*cap : 0, sizeof(char *) * (size_t)nc);
        if (!l) {
            errno = ENOMEM;
            return -1;
        }
        *list = l;
        *cap = nc;
    }
    char *d = dup_str(sb, real);
    if (!d) {
        errno = ENOMEM;
        return -1;
    }
    (*list)[(*n)++] = d;
    return 0;
}

int ck_sandbox_allow(ck_sandbox *sb, const char *dir, int write)
{
    char real[PATH_MAX];
    if (ck_sandbox_resolve(dir, real, sizeof real)) return -1;
    return write ? push_root(sb, &sb->write, &sb->nwrite, &sb->capwrite, real)
                 : push_root(sb, &sb->read, &sb->nread, &sb->capread, real);
}

int ck_sandbox_set_lib(ck_sandbox *sb, const char *dir)
{
    char real[PATH_MAX];
    if (ck_sandbox_resolve(dir, real, sizeof real)) return -1;
    free_str(sb, sb->lib);
    sb->lib = dup_str(sb, real);
    return sb->lib ? 0 : -1;
}

void ck_sandbox_free(ck_sandbox *sb)
{
    if (!sb->alloc) return;
    for (int i = 0; i < sb->nread; i++) free_str(sb, sb->read[i]);
    for (int i = 0; i < sb->nwrite; i++) free_str(sb, sb->write[i]);
    if (sb->read) sb->alloc(sb->alloc_ud, sb->read, sizeof(char *) * (size_t)sb->capread, 0);
    if (sb->write) sb->alloc(sb->alloc_ud, sb->write, sizeof(char *) * (size_t)sb->capwrite, 0);
    free_str(sb, sb->lib);
    sb->read = sb->write = NULL;
    sb->lib = NULL;
    sb->nread = sb->nwrite = sb->capread = sb->capwrite = 0;
}

static int under(const char *path, const char *root)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return 1;
    return strncmp(path, root, n) == 0 && (path[n] == 0 || path[n] == '/');
}

static int allowed(const ck_sandbox *sb, const char *real, int access, int lib)
{
    for (int i = 0; i < sb->nwrite; i++)
        if (under(real, sb->write[i])) return 1;
    if (access & CK_ACCESS_WRITE) return 0;
    for (int i = 0; i < sb->nread; i++)
        if (under(real, sb->read[i])) return 1;
    return lib && sb->lib && under(real, sb->lib);
}

static ck_sandbox *sandbox_of(lua_State *L)
{
    ck_host *h = ck_host_of(L);
    return h && h->sb.on ? &h->sb : NULL;
}

static int raise_denied(lua_State *L)
{
    ck_limits_note(L, CK_EDENIED);
    return lua_error(L);
}

/* path made absolute against the working directory with "." and ".."
 * removed by spelling alone: no symlink is read, so it tells nothing the
 * script did not write. 0, or -1 */
static int lexical(const char *path, char *out, size_t len)
{
    char buf[2 * PATH_MAX];
    if (path[0] == '/') snprintf(buf, sizeof buf, "%s", path);
    else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return -1;
        if ((size_t)snprintf(buf, sizeof buf, "%s/%s", cwd, path) >= sizeof buf) return -1;
    }
    size_t k = 0;
    for (const char *p = buf; *p;) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            while (k > 0 && out[k - 1] != '/') k--;
            if (k > 0) k--;
        } else if (!(n == 1 && p[0] == '.')) {
            if (k + 1 + n >= len) return -1;
            out[k++] = '/';
            memcpy(out + k, p, n);
            k += n;
        }
        p += n;
    }
    if (k == 0) out[k++] = '/';
    out[k] = 0;
    return 0;
}

/* A denial names the path as the script gave it and reads the same whether
 * it exists or not, leads through symlinks or cannot be resolved at all: where
 * a symlink on the way points (it could be another process's /proc/N/cwd) is
 * never printed. The hint is the path's own directory by spelling, which the
 * flag resolves as this check does. */
static int deny_path(lua_State *L, const char *path, int access)
{
    char w[256], hint[PATH_MAX];
    ck_lua_where(L, w, sizeof w);
    if (lexical(path, hint, sizeof hint)) snprintf(hint, sizeof hint, "DIR");
    else if (!(access & CK_ACCESS_DIR)) {
        char *s = strrchr(hint, '/');
        if (s && s != hint) *s = 0;
        else if (s) s[1] = 0;
    }
    const char *verb = access & CK_ACCESS_WRITE ? "writing" : "reading";
    const char *flag = access & CK_ACCESS_WRITE ? "--allow-write" : "--allow-read";
    lua_pushfstring(L, "%s: %s '%s' is denied: it is outside the directories the sandbox allows (%s %s allows it)", w,
                    verb, path, flag, hint);
    return raise_denied(L);
}

static void check(lua_State *L, ck_sandbox *sb, const char *path, int access, int lib)
{
    char real[PATH_MAX], lex[PATH_MAX];
    if (ck_sandbox_resolve(path, real, sizeof real)) {
        /* inside the allowed directories by spelling, the reason is the
         * script's own business; outside, it would tell what is there */
        if (lexical(path, lex, sizeof lex) == 0 && allowed(sb, lex, access, lib)) {
            char w[256];
            ck_lua_where(L, w, sizeof w);
            lua_pushfstring(L, "%s: cannot resolve '%s' to check it against the sandbox: %s", w, path, strerror(errno));
            raise_denied(L);
        }
        deny_path(L, path, access);
    }
    if (!allowed(sb, real, access, lib)) deny_path(L, path, access);
}

void ck_lua_check_path(lua_State *L, const char *path, int access)
{
    ck_sandbox *sb = sandbox_of(L);
    if (sb) check(L, sb, path, access, 0);
}

/* ---- the restricted libraries */

static int stub(lua_State *L)
{
    char w[256];
    ck_lua_where(L, w, sizeof w);
    lua_pushfstring(L, "%s: %s is not available in the sandbox (ckrun --trust allows it)", w,
                    lua_tostring(L, lua_upvalueindex(1)));
    return raise_denied(L);
}

static int deny_binary(lua_State *L, const char *what)
{
    char w[256];
    ck_lua_where(L, w, sizeof w);
    lua_pushfstring(L, "%s: %s: binary chunks are refused in the sandbox; load Lua source (ckrun --trust allows them)", w,
                    what);
    return raise_denied(L);
}

/* calls upvalue 1 (the original function) with every argument */
static int call_original(lua_State *L)
{
    int n = lua_gettop(L);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, n, LUA_MULTRET);
    return lua_gettop(L);
}

static int io_open(lua_State *L)
{
    ck_sandbox *sb = sandbox_of(L);
    if (sb && lua_type(L, 1) == LUA_TSTRING) {
        const char *mode = luaL_optstring(L, 2, "r");
        check(L, sb, lua_tostring(L, 1), strpbrk(mode, "wa+") ? CK_ACCESS_WRITE : CK_ACCESS_READ, 0);
    }
    return call_original(L);
}

static int io_lines(lua_State *L)
{
    ck_sandbox *sb = sandbox_of(L);
    if (sb && lua_isnoneornil(L, 1)) {
        char w[256];
        ck_lua_where(L, w, sizeof w);
        lua_pushfstring(L, "%s: io.lines() without a file name reads standard input, which the sandbox does not allow", w);
        return raise_denied(L);
    }
    if (sb && lua_type(L, 1) == LUA_TSTRING) check(L, sb, lua_tostring(L, 1), CK_ACCESS_READ, 0);
    return call_original(L);
}

/* os.remove(path), os.rename(from, to): every path named is written */
static int os_write(lua_State *L)
{
    ck_sandbox *sb = sandbox_of(L);
    int n = (int)lua_tointeger(L, lua_upvalueindex(2));
    for (int i = 1; sb && i <= n; i++)
        if (lua_type(L, i) == LUA_TSTRING) check(L, sb, lua_tostring(L, i), CK_ACCESS_WRITE, 0);
    return call_original(L);
}

/* load(chunk [, name [, mode [, env]]]) in text mode only */
static int sb_load(lua_State *L)
{
    size_t len;
    if (lua_type(L, 1) == LUA_TSTRING) {
        const char *s = lua_tolstring(L, 1, &len);
        if (len && s[0] == LUA_SIGNATURE[0]) return deny_binary(L, "load");
    }
    if (lua_gettop(L) < 3) lua_settop(L, 3);
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    int n = call_original(L);
    if (n >= 2 && lua_isnil(L, 1) && lua_type(L, 2) == LUA_TSTRING &&
        strstr(lua_tostring(L, 2), "attempt to load a binary chunk"))
        return deny_binary(L, "load");
    return n;
}

/* a __gc metamethod runs inside the collector, where no count hook can stop it */
static int sb_setmetatable(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL) {
            char w[256];
            ck_lua_where(L, w, sizeof w);
            lua_pushfstring(L, "%s: setmetatable: __gc metamethods are not available in the sandbox (ckrun --trust allows them)",
                            w);
            return raise_denied(L);
        }
        lua_pop(L, 1);
    }
    return call_original(L);
}

/* debug.getinfo([thread,] f, what) that only describes: no 'f' (the function
 * of a frame, which could hand the script an original behind a wrapper) */
static int sb_getinfo(lua_State *L)
{
    int w = lua_type(L, 1) == LUA_TTHREAD ? 3 : 2;
    const char *what = luaL_optstring(L, w, "nSlrtu");
    if (strchr(what, 'f') || strchr(what, 'L')) {
        char where[256];
        ck_lua_where(L, where, sizeof where);
        lua_pushfstring(L, "%s: debug.getinfo with 'f' or 'L' is not available in the sandbox (ckrun --trust allows it)",
                        where);
        return raise_denied(L);
    }
    if (lua_gettop(L) < w) lua_settop(L, w);
    lua_pushstring(L, what);
    lua_replace(L, w);
    /* a level of this thread counts this wrapper's frame too */
    if (w == 2 && lua_isinteger(L, 1) && lua_tointeger(L, 1) > 0) {
        lua_pushinteger(L, lua_tointeger(L, 1) + 1);
        lua_replace(L, 1);
    }
    return call_original(L);
}

/* math.randomseed() without a seed takes the VM's, so runs repeat */
static int sb_randomseed(lua_State *L)
{
    if (lua_gettop(L) == 0) lua_pushvalue(L, lua_upvalueindex(2));
    return call_original(L);
}

/* require's searcher for Lua files: package.path's candidates inside the
 * allowed directories or the stdlib, loaded as source only */
static int searcher(lua_State *L)
{
    ck_sandbox *sb = sandbox_of(L);
    const char *name = luaL_checkstring(L, 1);
    lua_getfield(L, lua_upvalueindex(1), "path");
    const char *path = lua_tostring(L, -1);
    if (!path) return luaL_error(L, "package.path must be a string");
    const char *mod = luaL_gsub(L, name, ".", "/");
    char file[PATH_MAX], real[PATH_MAX];
    const char *found = NULL;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (const char *t = path; *t && !found;) {
        const char *e = strchr(t, ';');
        size_t n = e ? (size_t)(e - t) : strlen(t);
        size_t k = 0;
        int fits = 1;
        for (size_t i = 0; i < n && fits; i++) {
            if (t[i] == '?') {
                size_t ml = strlen(mod);
                if (k + ml >= sizeof file) fits = 0;
                else {
                    memcpy(file + k, mod, ml);
                    k += ml;
                }
            } else if (k + 1 >= sizeof file) fits = 0;
            else file[k++] = t[i];
        }
        file[k] = 0;
        t += n + (e ? 1 : 0);
        if (!n || !fits) continue;
        /* a candidate outside the allowed directories is never looked at:
         * it reads "no file" whether or not it exists (no existence oracle) */
        int outside = sb && (ck_sandbox_resolve(file, real, sizeof real) != 0 || !allowed(sb, real, CK_ACCESS_READ, 1));
        if (!outside) {
            FILE *f = fopen(file, "r");
            if (f) {
                fclose(f);
                found = file;
                break;
            }
        }
        if (luaL_bufflen(&b)) luaL_addstring(&b, "\n\t");
        luaL_addstring(&b, "no file '");
        luaL_addstring(&b, file);
        luaL_addstring(&b, outside ? "' (outside the directories the sandbox allows; --allow-read DIR allows it)" : "'");
    }
    if (!found) {
        luaL_pushresult(&b);
        return 1;
    }
    luaL_pushresult(&b);
    lua_pop(L, 1);
    if (luaL_loadfilex(L, found, "t") != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        if (msg && strstr(msg, "attempt to load a binary chunk")) {
            lua_pushfstring(L, "require '%s' ('%s')", name, found);
            return deny_binary(L, lua_tostring(L, -1));
        }
        return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s", name, found, msg ? msg : "?");
    }
    lua_pushstring(L, found);
    return 2;
}

/* Keeps the keys of the table on top that `keep` lists (all when NULL) and
 * puts a stub that raises in place of each name in `stubs`. */
static void restrict_table(lua_State *L, const char *lib, const char *const *keep, const char *const *stubs)
{
    if (keep) {
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            lua_pop(L, 1);
            int ok = 0;
            if (lua_type(L, -1) == LUA_TSTRING)
                for (const char *const *k = keep; *k && !ok; k++) ok = strcmp(*k, lua_tostring(L, -1)) == 0;
            if (!ok) {
                lua_pushvalue(L, -1);
                lua_pushnil(L);
                lua_rawset(L, -4);
            }
        }
    }
    for (const char *const *s = stubs; s && *s; s++) {
        lua_pushfstring(L, "%s%s%s", lib, *lib ? "." : "", *s);
        lua_pushcclosure(L, stub, 1);
        lua_setfield(L, -2, *s);
    }
}

/* t[name] = fn with the original t[name] as upvalue 1 (and the value on top
 * of the stack as upvalue 2 when extra is set) */
static void wrap(lua_State *L, int t, const char *name, lua_CFunction fn, int extra)
{
    t = lua_absindex(L, t);
    lua_getfield(L, t, name);
    if (extra) lua_insert(L, -2);
    lua_pushcclosure(L, fn, 1 + extra);
    lua_setfield(L, t, name);
}

void ck_sandbox_install(lua_State *L, lua_Integer seed)
{
    static const char *const base_keep[] = {
        "assert", "collectgarbage", "error", "getmetatable", "ipairs", "load", "next", "pairs", "pcall", "print",
        "rawequal", "rawget", "rawlen", "rawset", "require", "select", "setmetatable", "tonumber", "tostring", "type",
        "xpcall", "warn", "_G", "_VERSION", "coroutine", "table", "string", "math", "utf8", "io", "os", "package",
        "debug", NULL};
    static const char *const base_stubs[] = {"dofile", "loadfile", NULL};
    static const char *const os_keep[] = {"clock", "date", "difftime", "time", "remove", "rename", NULL};
    static const char *const os_stubs[] = {"execute", "exit", "getenv", "tmpname", "setlocale", NULL};
    static const char *const io_keep[] = {"write", "close", "type", "stdout", "stderr", "open", "lines", NULL};
    static const char *const io_stubs[] = {"popen", "tmpfile", "input", "output", "read", NULL};
    static const char *const pkg_keep[] = {"loaded", "preload", "path", "cpath", "config", "searchers", NULL};
    static const char *const pkg_stubs[] = {"loadlib", "searchpath", NULL};
    static const char *const debug_keep[] = {"traceback", "getinfo", NULL};
    static const char *const debug_stubs[] = {
        "debug", "gethook", "getlocal", "getmetatable", "getregistry", "getupvalue", "getuservalue",
        "sethook", "setcstacklimit", "setlocal", "setmetatable", "setupvalue", "setuservalue", "upvalueid",
        "upvaluejoin", NULL};
    static const char *const string_stubs[] = {"dump", NULL};

    lua_pushglobaltable(L);
    restrict_table(L, "", base_keep, base_stubs);
    wrap(L, -1, "load", sb_load, 0);
    wrap(L, -1, "setmetatable", sb_setmetatable, 0);
    lua_pop(L, 1);

    lua_getglobal(L, "os");
    restrict_table(L, "os", os_keep, os_stubs);
    lua_pushinteger(L, 1);
    wrap(L, -2, "remove", os_write, 1);
    lua_pushinteger(L, 2);
    wrap(L, -2, "rename", os_write, 1);
    lua_pop(L, 1);

    lua_getglobal(L, "io");
    restrict_table(L, "io", io_keep, io_stubs);
    wrap(L, -1, "open", io_open, 0);
    wrap(L, -1, "lines", io_lines, 0);
    lua_pop(L, 1);

    lua_getglobal(L, "package");
    restrict_table(L, "package", pkg_keep, pkg_stubs);
    lua_createtable(L, 2, 0);
    lua_getfield(L, -2, "searchers");
    lua_rawgeti(L, -1, 1); /* the preload searcher: require "ck" */
    lua_rawseti(L, -3, 1);
    lua_pop(L, 1);
    lua_pushvalue(L, -2);
    lua_pushcclosure(L, searcher, 1);
    lua_rawseti(L, -2, 2);
    lua_setfield(L, -2, "searchers");
    lua_pop(L, 1);

    lua_getglobal(L, "debug");
    restrict_table(L, "debug", debug_keep, debug_stubs);
    wrap(L, -1, "getinfo", sb_getinfo, 0);
    lua_pop(L, 1);

    lua_getglobal(L, "string");
    restrict_table(L, "string", NULL, string_stubs);
    lua_pop(L, 1);

    lua_getglobal(L, "math");
    lua_pushinteger(L, seed);
    wrap(L, -2, "randomseed", sb_randomseed, 1);
    lua_pop(L, 1);

    /* the files io hands out (io.stdout, io.stderr, io.open's) share one
     * metatable, whose __gc is already armed: a script that reached it could
     * swap in a finalizer of its own, which Lua runs with hooks off (no
     * budget, no interrupt). getmetatable gives false, setmetatable refuses. */
    if (lua_getfield(L, LUA_REGISTRYINDEX, LUA_FILEHANDLE) == LUA_TTABLE) {
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
    }
    lua_pop(L, 1);
}

void ck_sandbox_lock_metatables(lua_State *L)
{
    lua_pushnil(L);
    while (lua_next(L, LUA_REGISTRYINDEX)) {
        if (lua_type(L, -2) == LUA_TSTRING && strncmp(lua_tostring(L, -2), "ck.", 3) == 0 && lua_istable(L, -1)) {
            if (lua_getfield(L, -1, "__name") == LUA_TSTRING) {
                lua_pushboolean(L, 0);
                lua_setfield(L, -3, "__metatable");
            }
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
}
