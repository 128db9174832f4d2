/* The sandbox: an allow-list of Lua's libraries, only Lua source through any
 * loader, and file access only inside allowed directories, judged on real
 * paths (symlinks and ".." resolved) so that no path escapes by spelling,
 * then opened beneath the allowed directory's descriptor so that no path
 * escapes by changing after it was judged. */
#define _GNU_SOURCE /* O_PATH */
#include "guard/sandbox.h"
#include "ck.h"
#include "guard/host.h"
#include "guard/runlimits.h"
#include "util/beneath.h"
#include "util/where.h"

#include <lauxlib.h>

#include <errno.h>
#include <fcntl.h>
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

/* A root's directory, opened when it is added, or at first use when it did
 * not exist then (a directory the script is allowed to create). */
static int root_fd(ck_root *r)
{
    if (r->fd >= 0) return r->fd;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", r->path);
    if (r->file) {
        char *s = strrchr(dir, '/');
        if (s == dir) s[1] = 0;
        else if (s) *s = 0;
    }
    int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    /* the real path has no symlinks: if the directory opened is not the
     * one named (a symlink was put on the way since), it is not the root */
    char self[64], now[PATH_MAX];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    ssize_t n = fd >= 0 ? readlink(self, now, sizeof now - 1) : -1;
    if (n >= 0) {
        now[n] = 0;
        if (strcmp(now, dir) != 0) {
            close(fd);
            fd = -1;
            errno = EXDEV;
        }
    }
    r->fd = fd;
    return r->fd;
}

static int split(const char *path, char *dir, size_t dirlen, char *name, size_t namelen);

static int push_root(ck_sandbox *sb, const char *real, int write, int file, int lib)
{
    const char *name = file ? strrchr(real, '/') + 1 : NULL;
    if (file && !*name) {
        errno = EISDIR;
        return -1;
    }
    for (int i = 0; i < sb->nroots; i++) {
        ck_root *r = &sb->roots[i];
        if (!strcmp(r->path, real) && r->write == write && !r->file == !file && r->lib == lib) return 0;
    }
    if (sb->nroots == sb->caproots) {
        int nc = sb->caproots ? 2 * sb->caproots : 4;
        ck_root *l = sb->alloc(sb->alloc_ud, sb->roots, sb->roots ? sizeof(ck_root) * (size_t)sb->caproots : 0,
                               sizeof(ck_root) * (size_t)nc);
        if (!l) {
            errno = ENOMEM;
            return -1;
        }
        sb->roots = l;
        sb->caproots = nc;
    }
    ck_root r = {dup_str(sb, real), name ? dup_str(sb, name) : NULL, -1, write, lib};
    if (!r.path || (name && !r.file)) {
        free_str(sb, r.path);
        free_str(sb, r.file);
        errno = ENOMEM;
        return -1;
    }
    root_fd(&r);
    sb->roots[sb->nroots++] = r;
    return 0;
}

int ck_sandbox_allow(ck_sandbox *sb, const char *dir, int write)
{
    char real[PATH_MAX];
    if (ck_sandbox_resolve(dir, real, sizeof real)) return -1;
    return push_root(sb, real, write, 0, 0);
}

int ck_sandbox_allow_file(ck_sandbox *sb, const char *file, int write)
{
    /* a file root is never a directory: one the root named (renamed into an
     * allowed directory) would open everything under it. A path spelled as
     * a directory (a trailing '/', or ending in "." or "..") or naming one
     * now is refused with EISDIR; one made there later is refused at each
     * use (door, parent_door) */
    size_t len = strlen(file);
    char dir[PATH_MAX], name[NAME_MAX + 1], real[PATH_MAX];
    if (len && file[len - 1] == '/') {
        errno = EISDIR;
        return -1;
    }
    if (split(file, dir, sizeof dir, name, sizeof name)) {
        if (errno == EINVAL) errno = EISDIR;
        return -1;
    }
    struct stat st;
    if (stat(file, &st) == 0 && S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        return -1;
    }
    /* the directory resolved, the name as given: a symlink there is not
     * the file (whether it was put there before or after) */
    if (ck_sandbox_resolve(dir, real, sizeof real)) return -1;
    size_t n = strlen(real);
    if (n + 1 + strlen(name) >= sizeof real) {
        errno = ENAMETOOLONG;
        return -1;
    }
    snprintf(real + n, sizeof real - n, "%s%s", n > 1 ? "/" : "", name);
    return push_root(sb, real, write, 1, 0);
}

int ck_sandbox_set_lib(ck_sandbox *sb, const char *dir)
{
    char real[PATH_MAX];
    if (ck_sandbox_resolve(dir, real, sizeof real)) return -1;
    for (int i = 0; i < sb->nroots; i++)
        if (sb->roots[i].lib) {
            ck_root *r = &sb->roots[i];
            char *d = dup_str(sb, real);
            if (!d) return -1;
            free_str(sb, r->path);
            r->path = d;
            if (r->fd >= 0) close(r->fd);
            r->fd = -1;
            root_fd(r);
            return 0;
        }
    return push_root(sb, real, 0, 0, 1);
}

void ck_sandbox_free(ck_sandbox *sb)
{
    if (!sb->alloc) return;
    for (int i = 0; i < sb->nroots; i++) {
        free_str(sb, sb->roots[i].path);
        free_str(sb, sb->roots[i].file);
        if (sb->roots[i].fd >= 0) close(sb->roots[i].fd);
    }
    if (sb->roots) sb->alloc(sb->alloc_ud, sb->roots, sizeof(ck_root) * (size_t)sb->caproots, 0);
    sb->roots = NULL;
    sb->nroots = sb->caproots = 0;
}

static int under(const char *path, const char *root)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return 1;
    return strncmp(path, root, n) == 0 && (path[n] == 0 || path[n] == '/');
}

/* A file root allows its file, and the temp files that replace it
 * atomically beside it: FILE.tmp and FILE.tmp.<digits> */
static int file_match(const ck_root *r, const char *real)
{
    size_t n = strlen(r->path);
    if (strncmp(real, r->path, n)) return 0;
    const char *t = real + n;
    if (!*t) return 1;
    if (strncmp(t, ".tmp", 4)) return 0;
    t += 4;
    if (!*t) return 1;
    if (*t++ != '.') return 0;
    return *t && strspn(t, "0123456789") == strlen(t);
}

/* The root that allows access to real (a resolved path): one whose
 * directory exists when there is a choice. NULL: none allows it. */
static ck_root *allowed(ck_sandbox *sb, const char *real, int access, int lib)
{
    ck_root *found = NULL;
    for (int i = 0; i < sb->nroots; i++) {
        ck_root *r = &sb->roots[i];
        if ((r->lib && !lib) || ((access & CK_ACCESS_WRITE) && !r->write)) continue;
        /* a file root allows a file: no directory is listed, made or walked there */
        if (r->file && (access & CK_ACCESS_DIR)) continue;
        if (r->file ? !file_match(r, real) : !under(real, r->path)) continue;
        if (root_fd(r) >= 0) return r;
        if (!found) found = r;
    }
    return found;
}

/* opens real, which r allows, beneath r's directory */
static int open_in_root(ck_root *r, const char *real, int flags, mode_t mode)
{
    if (root_fd(r) < 0) return -1;
    /* a file root is those names only, never a symlink put in their place,
     * and never a directory (made there since the root was added) */
    if (r->file) {
        int fd = ck_open_beneath(r->fd, strrchr(real, '/') + 1, flags | O_NOFOLLOW, mode);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
            close(fd);
            errno = EISDIR;
            return -1;
        }
        return fd;
    }
    const char *rel = real + strlen(r->path);
    while (*rel == '/') rel++;
    return ck_open_beneath(r->fd, *rel ? rel : ".", flags, mode);
}

static ck_sandbox *sandbox_of(lua_State *L)
{
    ck_host *h = ck_host_of(L);
    return h && h->sb.on ? &h->sb : NULL;
}

int ck_lua_sandboxed(lua_State *L) { return sandbox_of(L) != NULL; }

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

/* What judging a path found: allowed (the root that allows it), denied, or
 * inside the allowed directories by spelling but unresolvable (a loop). */
enum { ALLOWED, DENIED, UNRESOLVABLE };

static int judge(ck_sandbox *sb, const char *path, int access, int lib, char *real, ck_root **root)
{
    char lex[PATH_MAX];
    *root = NULL;
    if (ck_sandbox_resolve(path, real, PATH_MAX)) {
        /* inside the allowed directories by spelling, the reason is the
         * script's own business; outside, it would tell what is there */
        int e = errno;
        int inside = lexical(path, lex, sizeof lex) == 0 && allowed(sb, lex, access, lib);
        errno = e;
        return inside ? UNRESOLVABLE : DENIED;
    }
    *root = allowed(sb, real, access, lib);
    return *root ? ALLOWED : DENIED;
}

static void raise_verdict(lua_State *L, int verdict, const char *path, int access)
{
    if (verdict == UNRESOLVABLE) {
        char w[256];
        ck_lua_where(L, w, sizeof w);
        lua_pushfstring(L, "%s: cannot resolve '%s' to check it against the sandbox: %s", w, path, strerror(errno));
        raise_denied(L);
    }
    deny_path(L, path, access);
}

static void check(lua_State *L, ck_sandbox *sb, const char *path, int access, int lib)
{
    char real[PATH_MAX];
    ck_root *r;
    int v = judge(sb, path, access, lib, real, &r);
    if (v != ALLOWED) raise_verdict(L, v, path, access);
}

void ck_lua_check_path(lua_State *L, const char *path, int access)
{
    ck_sandbox *sb = sandbox_of(L);
    if (sb) check(L, sb, path, access, 0);
}

/* The door: judge, then open beneath the root that allowed it. An open that
 * the kernel finds leading out (EXDEV, or ELOOP for a symlink where the
 * judgment saw none) means the path changed since it was judged: it is
 * judged again, a few times, then denied. fd, or -1 with *verdict ALLOWED
 * and errno the file's own, or -1 with the verdict to raise. */
static int door(ck_sandbox *sb, const char *path, int access, int lib, int flags, mode_t mode, int *verdict)
{
    char real[PATH_MAX];
    for (int tries = 0;; tries++) {
        ck_root *r;
        *verdict = judge(sb, path, access, lib, real, &r);
        if (*verdict != ALLOWED) return -1;
        int fd = open_in_root(r, real, flags, mode);
        if (fd >= 0 || (errno != EXDEV && errno != ELOOP)) return fd;
        if (tries == 3) {
            *verdict = DENIED;
            return -1;
        }
    }
}

int ck_lua_open(lua_State *L, const char *path, int access, int flags, mode_t mode)
{
    ck_sandbox *sb = sandbox_of(L);
    if (!sb) return open(path, flags | O_CLOEXEC, mode);
    int verdict;
    int fd = door(sb, path, access, 0, flags, mode, &verdict);
    if (fd < 0 && verdict != ALLOWED) raise_verdict(L, verdict, path, access);
    return fd;
}

/* path's directory part ("." for none, "/" for the root) and its last
 * component; -1 with EINVAL when that is "", "." or "..", ENAMETOOLONG */
static int split(const char *path, char *dir, size_t dirlen, char *name, size_t namelen)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    size_t k = n - b;
    if (k == 0 || (k == 1 && path[b] == '.') || (k == 2 && path[b] == '.' && path[b + 1] == '.')) {
        errno = EINVAL;
        return -1;
    }
    if (k >= namelen || b + 2 > dirlen) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(name, path + b, k);
    name[k] = 0;
    if (b == 0) strcpy(dir, ".");
    else {
        size_t d = b;
        while (d > 1 && path[d - 1] == '/') d--;
        memcpy(dir, path, d);
        dir[d] = 0;
    }
    return 0;
}

/* path's directory through the door, without raising: -1 with *verdict.
 * *file_root (when not NULL): 1 when a file root allowed the path. */
static int parent_door(ck_sandbox *sb, const char *path, int access, char *name, size_t namelen, int *verdict,
                       int *file_root)
{
    char dir[PATH_MAX], real[PATH_MAX];
    *verdict = ALLOWED;
    if (file_root) *file_root = 0;
    if (split(path, dir, sizeof dir, name, namelen)) return -1;
    if (!sb) return open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    /* a file root's names live in its directory, which allows nothing else;
     * a directory found at one of them is not the file (it would be renamed
     * or removed with all it holds) */
    ck_root *r;
    if (judge(sb, path, access, 0, real, &r) == ALLOWED && r->file) {
        const char *base = strrchr(real, '/') + 1;
        if (strlen(base) >= namelen || root_fd(r) < 0) return -1;
        strcpy(name, base);
        struct stat st;
        if (fstatat(r->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
            errno = EISDIR;
            return -1;
        }
        if (file_root) *file_root = 1;
        return openat(r->fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    int fd = door(sb, dir, access | CK_ACCESS_DIR, 0, O_PATH | O_DIRECTORY, 0, verdict);
    /* the path was allowed, its directory not (a file root, or a race): the
     * denial names the path as given, as for any other */
    if (*verdict == UNRESOLVABLE) *verdict = DENIED;
    return fd;
}

int ck_lua_open_parent(lua_State *L, const char *path, int access, char *name, size_t namelen)
{
    ck_sandbox *sb = sandbox_of(L);
    if (sb) check(L, sb, path, access, 0);
    int verdict;
    int fd = parent_door(sb, path, access, name, namelen, &verdict, NULL);
    if (fd < 0 && verdict != ALLOWED) raise_verdict(L, verdict, path, access);
    return fd;
}

/* mkdir -p by name, as the path is spelled: outside a sandbox */
static int mkdirs_plain(const char *path)
{
    char buf[PATH_MAX];
    if (strlen(path) >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(buf, path);
    for (char *q = buf + 1;; q++) {
        char c = *q;
        if (c == '/' || c == 0) {
            *q = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
            *q = c;
        }
        if (!c) break;
    }
    return 0;
}

/* creates each component of rel beneath dirfd: 0, or -1 with errno */
static int mkdirs_beneath(int dirfd, const char *rel)
{
    int cur = dirfd, rc = 0;
    char name[NAME_MAX + 1];
    for (const char *p = rel; *p && !rc;) {
        while (*p == '/') p++;
        size_t n = strcspn(p, "/");
        if (!n) break;
        if (n > NAME_MAX) {
            errno = ENAMETOOLONG;
            rc = -1;
            break;
        }
        memcpy(name, p, n);
        name[n] = 0;
        p += n;
        if (mkdirat(cur, name, 0777) != 0 && errno != EEXIST) {
            rc = -1;
            break;
        }
        int nfd = ck_open_beneath(cur, name, O_PATH | O_DIRECTORY, 0);
        if (nfd < 0) rc = -1;
        int e = errno;
        if (cur != dirfd) close(cur);
        errno = e;
        cur = nfd;
    }
    if (cur != dirfd && cur >= 0) close(cur);
    return rc;
}

int ck_lua_mkdirs(lua_State *L, const char *path)
{
    ck_sandbox *sb = sandbox_of(L);
    if (!sb) return mkdirs_plain(path);
    char real[PATH_MAX];
    for (int tries = 0;; tries++) {
        ck_root *r;
        int v = judge(sb, path, CK_ACCESS_WRITE | CK_ACCESS_DIR, 0, real, &r);
        /* the directories that lead to a file the sandbox allows may be made */
        if (v == DENIED && !ck_sandbox_resolve(path, real, sizeof real))
            for (int i = 0; i < sb->nroots; i++) {
                ck_root *f = &sb->roots[i];
                if (f->file && f->write && under(f->path, real) && strcmp(f->path, real)) {
                    if (mkdirs_plain(real)) return -1;
                    root_fd(f);
                    return 0;
                }
            }
        if (v != ALLOWED) raise_verdict(L, v, path, CK_ACCESS_WRITE | CK_ACCESS_DIR);
        /* a root the host named that does not exist yet is made as named */
        if (root_fd(r) < 0 && errno == ENOENT && !r->file && mkdirs_plain(r->path)) return -1;
        if (root_fd(r) < 0) return -1;
        const char *rel = r->file ? r->file : real + strlen(r->path);
        if (!mkdirs_beneath(r->fd, rel)) return 0;
        if (errno != EXDEV && errno != ELOOP) return -1;
        if (tries == 3) deny_path(L, path, CK_ACCESS_WRITE | CK_ACCESS_DIR);
    }
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

/* ---- files by name, through the door. The path checked is the string the
 * open uses: a number argument is converted first, as Lua converts it. */

/* io.open's mode: "r", "w" or "a", then an optional "+", then any "b" */
static int mode_flags(const char *mode)
{
    int flags;
    switch (mode[0]) {
    case 'r': flags = 0; break;
    case 'w': flags = O_CREAT | O_TRUNC; break;
    case 'a': flags = O_CREAT | O_APPEND; break;
    default: return -1;
    }
    const char *p = mode + 1;
    int plus = *p == '+';
    if (plus) p++;
    p += strspn(p, "b");
    if (*p) return -1;
    return flags | (plus ? O_RDWR : mode[0] == 'r' ? O_RDONLY : O_WRONLY);
}

static int stream_close(lua_State *L)
{
    luaL_Stream *s = luaL_checkudata(L, 1, LUA_FILEHANDLE);
    int ok = fclose(s->f) == 0;
    return luaL_fileresult(L, ok, NULL);
}

/* a Lua file (io's own kind, as io.open makes) on top of the stack, not yet
 * open: closef NULL marks it closed until it holds a stream */
static luaL_Stream *new_stream(lua_State *L)
{
    luaL_Stream *s = lua_newuserdatauv(L, sizeof *s, 0);
    s->f = NULL;
    s->closef = NULL;
    luaL_setmetatable(L, LUA_FILEHANDLE);
    return s;
}

/* opens path as mode into s through the door; 0, or -1 with errno */
static int open_stream(lua_State *L, luaL_Stream *s, const char *path, const char *mode)
{
    int flags = mode_flags(mode);
    int write = (flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT);
    int fd = ck_lua_open(L, path, write ? CK_ACCESS_WRITE : CK_ACCESS_READ, flags, 0666);
    if (fd < 0) return -1;
    s->f = fdopen(fd, mode);
    if (!s->f) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    s->closef = stream_close;
    return 0;
}

/* io.open(path [, mode]) -> file, or fail, message, errno */
static int sb_io_open(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    const char *mode = luaL_optstring(L, 2, "r");
    luaL_argcheck(L, mode_flags(mode) >= 0, 2, "invalid mode");
    luaL_Stream *s = new_stream(L);
    if (open_stream(L, s, path, mode)) return luaL_fileresult(L, 0, path);
    return 1;
}

/* the iterator of io.lines: upvalues the file, its read and close methods,
 * the number of formats and the formats */
static int lines_next(lua_State *L)
{
    luaL_Stream *s = lua_touserdata(L, lua_upvalueindex(1));
    if (!s->closef) return luaL_error(L, "file is already closed");
    int n = (int)lua_tointeger(L, lua_upvalueindex(4));
    int base = lua_gettop(L);
    luaL_checkstack(L, n + 2, "too many formats");
    lua_pushvalue(L, lua_upvalueindex(2));
    lua_pushvalue(L, lua_upvalueindex(1));
    for (int i = 1; i <= n; i++) lua_pushvalue(L, lua_upvalueindex(4 + i));
    lua_call(L, n + 1, LUA_MULTRET);
    int got = lua_gettop(L) - base;
    if (got > 0 && !lua_isnil(L, base + 1)) return got;
    if (got > 1 && lua_type(L, base + 2) == LUA_TSTRING) return luaL_error(L, "%s", lua_tostring(L, base + 2));
    /* the end: io.lines closes the file it opened */
    lua_settop(L, base);
    lua_pushvalue(L, lua_upvalueindex(3));
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_call(L, 1, 0);
    luaL_pushfail(L);
    return 1;
}

/* io.lines(path, ...) -> iterator, nil, nil, file; raises when it cannot open */
static int sb_io_lines(lua_State *L)
{
    if (lua_isnoneornil(L, 1)) {
        char w[256];
        ck_lua_where(L, w, sizeof w);
        lua_pushfstring(L, "%s: io.lines() without a file name reads standard input, which the sandbox does not allow", w);
        return raise_denied(L);
    }
    const char *path = luaL_checkstring(L, 1);
    int n = lua_gettop(L) - 1;
    luaL_argcheck(L, n <= 250, 252, "too many arguments");
    luaL_Stream *s = new_stream(L);
    int file = lua_gettop(L);
    if (open_stream(L, s, path, "r")) return luaL_error(L, "cannot open file '%s' (%s)", path, strerror(errno));
    luaL_getmetatable(L, LUA_FILEHANDLE);
    lua_getfield(L, -1, "__index");
    luaL_checktype(L, -1, LUA_TTABLE);
    lua_pushvalue(L, file);
    lua_getfield(L, -2, "read");
    lua_getfield(L, -3, "close");
    lua_remove(L, -4);
    lua_remove(L, -4);
    lua_pushinteger(L, n);
    for (int i = 2; i <= n + 1; i++) lua_pushvalue(L, i);
    lua_pushcclosure(L, lines_next, 4 + n);
    lua_pushnil(L);
    lua_pushnil(L);
    lua_pushvalue(L, file);
    return 4;
}

/* os.remove(path) -> true, or fail, message, errno: a file or an empty directory */
static int sb_os_remove(lua_State *L)
{
    const char *path = luaL_checkstring(L, 1);
    char name[NAME_MAX + 1];
    int dfd = ck_lua_open_parent(L, path, CK_ACCESS_WRITE, name, sizeof name);
    int ok = 0;
    if (dfd >= 0) {
        ok = unlinkat(dfd, name, 0) == 0 || (errno == EISDIR && unlinkat(dfd, name, AT_REMOVEDIR) == 0);
        int e = errno;
        close(dfd);
        errno = e;
    }
    return luaL_fileresult(L, ok, path);
}

/* os.rename(from, to) -> true, or fail, message, errno */
static int sb_os_rename(lua_State *L)
{
    const char *from = luaL_checkstring(L, 1);
    const char *to = luaL_checkstring(L, 2);
    ck_sandbox *sb = sandbox_of(L);
    if (sb) {
        check(L, sb, from, CK_ACCESS_WRITE, 0);
        check(L, sb, to, CK_ACCESS_WRITE, 0);
    }
    char nfrom[NAME_MAX + 1], nto[NAME_MAX + 1];
    int ok = 0, vfrom, vto = ALLOWED, e, file_to = 0;
    int dfrom = parent_door(sb, from, CK_ACCESS_WRITE, nfrom, sizeof nfrom, &vfrom, NULL);
    e = errno;
    if (dfrom >= 0) {
        int dto = parent_door(sb, to, CK_ACCESS_WRITE, nto, sizeof nto, &vto, &file_to);
        struct stat st;
        if (dto >= 0 && file_to && fstatat(dfrom, nfrom, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
            /* a directory put where a file root names its file */
            e = EISDIR;
            close(dto);
        } else if (dto >= 0) {
            ok = renameat(dfrom, nfrom, dto, nto) == 0;
            e = errno;
            close(dto);
        } else e = errno;
        close(dfrom);
    }
    if (vfrom != ALLOWED) raise_verdict(L, vfrom, from, CK_ACCESS_WRITE);
    if (vto != ALLOWED) raise_verdict(L, vto, to, CK_ACCESS_WRITE);
    errno = e;
    return luaL_fileresult(L, ok, NULL);
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

/* lua_load's reader over an open file, skipping what a file loader skips:
 * a UTF-8 byte order mark, and a first line starting with '#' (its newline
 * kept, so line numbers stay the file's) */
typedef struct chunk_reader {
    FILE *f;
    int started;
    char buf[4096];
} chunk_reader;

static const char *read_chunk(lua_State *L, void *ud, size_t *size)
{
    (void)L;
    chunk_reader *r = ud;
    if (!r->started) {
        r->started = 1;
        int c = getc(r->f);
        if (c == 0xEF) {
            int c2 = getc(r->f), c3 = c2 == 0xBB ? getc(r->f) : EOF;
            if (c2 == 0xBB && c3 == 0xBF) c = getc(r->f);
            else {
                /* not a mark: hand back what was read */
                size_t k = 0;
                r->buf[k++] = (char)0xEF;
                if (c2 != EOF) r->buf[k++] = (char)c2;
                if (c3 != EOF) r->buf[k++] = (char)c3;
                *size = k;
                return r->buf;
            }
        }
        if (c == '#') {
            while ((c = getc(r->f)) != EOF && c != '\n') {}
            if (c == '\n') {
                r->buf[0] = '\n';
                *size = 1;
                return r->buf;
            }
        } else if (c != EOF) {
            r->buf[0] = (char)c;
            *size = 1;
            return r->buf;
        }
    }
    *size = fread(r->buf, 1, sizeof r->buf, r->f);
    return *size ? r->buf : NULL;
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
    char file[PATH_MAX];
    const char *found = NULL;
    /* the candidate found, held where an error raised meanwhile closes it */
    luaL_Stream *src = new_stream(L);
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
        int verdict = ALLOWED;
        int fd = sb ? door(sb, file, CK_ACCESS_READ, 1, O_RDONLY, 0, &verdict) : open(file, O_RDONLY | O_CLOEXEC);
        int outside = verdict != ALLOWED;
        if (fd >= 0) {
            src->f = fdopen(fd, "r");
            if (!src->f) close(fd);
            else {
                src->closef = stream_close;
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
    /* loaded from the file the door opened, not by its name again */
    lua_pushfstring(L, "@%s", found);
    chunk_reader cr = {src->f, 0, {0}};
    int st = lua_load(L, read_chunk, &cr, lua_tostring(L, -1), "t");
    int rerr = ferror(src->f);
    fclose(src->f);
    src->f = NULL;
    src->closef = NULL;
    lua_remove(L, -2);
    if (st == LUA_OK && rerr) {
        lua_pop(L, 1);
        return luaL_error(L, "error loading module '%s' from file '%s':\n\tcannot read it", name, found);
    }
    if (st != LUA_OK) {
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
    lua_pushcfunction(L, sb_os_remove);
    lua_setfield(L, -2, "remove");
    lua_pushcfunction(L, sb_os_rename);
    lua_setfield(L, -2, "rename");
    lua_pop(L, 1);

    lua_getglobal(L, "io");
    restrict_table(L, "io", io_keep, io_stubs);
    lua_pushcfunction(L, sb_io_open);
    lua_setfield(L, -2, "open");
    lua_pushcfunction(L, sb_io_lines);
    lua_setfield(L, -2, "lines");
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
