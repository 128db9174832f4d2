/* Advisory locks on files for scripts: ck.lock(path) holds an exclusive flock
 * on path for as long as the lock (or the process) lives, so two runs that
 * share a directory of training states can tell and one of them stop. The
 * kernel drops the lock when the process ends, however it ends. */
#include "lua/lua_ck.h"

#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_MT "ck.lock"

typedef struct {
    int fd; /* -1 once released */
} llock;

static int lock_release(lua_State *L)
{
    llock *k = luaL_checkudata(L, 1, LOCK_MT);
    if (k->fd >= 0) close(k->fd); /* closing the only descriptor drops the flock */
    k->fd = -1;
    return 0;
}

/* The pid the holder wrote into the file, or 0 when it holds none (not yet
 * written, or not a number: the file is the lock, its text only a hint). */
static long holder_pid(int fd)
{
    char buf[24];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    long pid = 0;
    int i = 0;
    for (; i < n && i < 10 && buf[i] >= '0' && buf[i] <= '9'; i++) pid = pid * 10 + (buf[i] - '0');
    return i > 0 && buf[i] == '\n' ? pid : 0;
}

/* Leaves on the stack the lock this VM already holds on the file fd opened
 * (however its path was spelled) and returns 1; else pushes nothing and
 * returns 0. A flock belongs to one open file, so a second open of the same
 * file in this process would be refused as if another process held it. The
 * held locks are kept by device and inode in a weak table: a lock the script
 * let go of is dropped when it is collected, or released before. */
static int held_lock(lua_State *L, int fd, char *key, size_t keylen)
{
    struct stat st, held;
    if (fstat(fd, &st) != 0) return 0;
    snprintf(key, keylen, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    if (luaL_getsubtable(L, LUA_REGISTRYINDEX, "ck.locks.held") == 0) {
        lua_createtable(L, 0, 1);
        lua_pushliteral(L, "v");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
    }
    lua_getfield(L, -1, key);
    llock *k = luaL_testudata(L, -1, LOCK_MT);
    /* a deleted file's inode number may be given to a new one: not the same file */
    if (k && k->fd >= 0 && fstat(k->fd, &held) == 0 && held.st_nlink > 0) {
        lua_remove(L, -2);
        return 1;
    }
    lua_pop(L, 2);
    return 0;
}

/* ck.lock(path) -> lock; or false, pid (the holder's, 0 when unknown) when
 * another process holds it; or nil, message when path cannot be opened (a
 * symlink is not followed) or locked. Creates path.
 * Locking a file this VM holds gives the same lock. lock:release() drops it
 * early; otherwise it lasts until the VM closes. */
static int l_lock(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    llock *k = lua_newuserdatauv(L, sizeof *k, 0);
    k->fd = -1;
    luaL_setmetatable(L, LOCK_MT);
    /* its directory through the sandbox's door, as every file the VM writes
     * (resolved once, beneath an allowed root), then the file in it, a
     * symlink there refused */
    char name[NAME_MAX + 1];
    const int dfd = ck_lua_open_parent(L, path, CK_ACCESS_WRITE, name, sizeof name);
    int fd = dfd < 0 ? -1 : openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (dfd >= 0) {
        const int e = errno;
        close(dfd);
        errno = e;
    }
    if (fd < 0) {
        luaL_pushfail(L);
        lua_pushfstring(L, "cannot open the lock file '%s': %s", path, strerror(errno));
        return 2;
    }
    k->fd = fd; /* the box closes it if anything below raises */
    char key[48] = "";
    if (held_lock(L, fd, key, sizeof key)) {
        close(fd);
        k->fd = -1;
        return 1;
    }
    int rc;
    while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {}
    if (rc != 0) {
        int e = errno;
        if (e != EWOULDBLOCK) {
            close(fd);
            k->fd = -1;
            luaL_pushfail(L);
            lua_pushfstring(L, "cannot lock '%s': %s", path, strerror(e));
            return 2;
        }
        long pid = holder_pid(fd);
        close(fd);
        k->fd = -1;
        lua_pushboolean(L, 0);
        lua_pushinteger(L, pid);
        return 2;
    }
    /* the holder's pid, for the message a second process gives; written over
     * an empty file or an earlier holder's pid only, so that locking a file
     * that holds anything else leaves its bytes alone */
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_size == 0 || holder_pid(fd) > 0)) {
        char text[24];
        int n = snprintf(text, sizeof text, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) {
            /* the lock holds without its hint; a second process names no pid */
        }
    }
    if (key[0]) { /* known by its file from now on (fstat failing, it is not) */
        luaL_getsubtable(L, LUA_REGISTRYINDEX, "ck.locks.held");
        lua_pushvalue(L, -2);
        lua_setfield(L, -2, key);
        lua_pop(L, 1);
    }
    return 1;
}

void ck_lua_lock_register(lua_State *L, int lib)
{
    lib = lua_absindex(L, lib);
    if (luaL_newmetatable(L, LOCK_MT)) {
        static const luaL_Reg methods[] = {{"release", lock_release}, {NULL, NULL}};
        luaL_newlib(L, methods);
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, lock_release);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, lock_release);
        lua_setfield(L, -2, "__close");
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "__metatable");
    }
    lua_pop(L, 1);
    lua_pushcfunction(L, l_lock);
    lua_setfield(L, lib, "lock");
}
