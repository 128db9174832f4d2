/* The sandbox of one VM: which directories (and single files) its scripts
 * may read and write, the one door through which files are opened by name,
 * and the restricted libraries it gives them. */
#ifndef CK_SANDBOX_H
#define CK_SANDBOX_H

#include <lua.h>

#include <stddef.h>
#include <sys/types.h>

/* A root: a directory a script may read under (or write and read under), or
 * one file it may read (or write). Kept both as its real path, which a
 * script's path is judged against, and as a descriptor of the directory
 * (O_PATH), beneath which the file is then opened: whatever a path's
 * symlinks point to by the time of the open, it cannot lead out. */
typedef struct ck_root {
    char *path; /* real path of the directory, or of the one file */
    char *file; /* a file root: the file's name in the directory fd holds */
    int fd;     /* the directory (a file root: the file's); -1 until it exists */
    int write;
    int lib;    /* the stdlib: only require reads under it */
} ck_root;

typedef struct ck_sandbox {
    int on;
    lua_Alloc alloc; /* for the list below */
    void *alloc_ud;
    ck_root *roots;
    int nroots, caproots;
} ck_sandbox;

/* The real path of path: symlinks, "." and ".." resolved against the file
 * system; a tail that does not exist yet is appended to its deepest existing
 * directory (so a file about to be created is judged by where it will be).
 * 0, or -1 with errno (ELOOP, ENAMETOOLONG, ...). */
int ck_sandbox_resolve(const char *path, char *out, size_t len);
/* Adds a root (resolved now); write roots are readable too. 0, or -1 with errno. */
int ck_sandbox_allow(ck_sandbox *sb, const char *dir, int write);
/* Allows one file (which need not exist yet): that name in its directory,
 * and nothing else there; a symlink put in its place is refused. */
int ck_sandbox_allow_file(ck_sandbox *sb, const char *file, int write);
int ck_sandbox_set_lib(ck_sandbox *sb, const char *dir);
void ck_sandbox_free(ck_sandbox *sb);
/* Cuts L's libraries down to the allow-list and installs the checked io.open,
 * io.lines, os.remove, os.rename, load, require and setmetatable, which judge
 * paths by the sandbox of L's host (vm/guard/host.h). seed:
 * what math.randomseed() uses when called without a seed. Raises on out of
 * memory: call it protected. */
void ck_sandbox_install(lua_State *L, lua_Integer seed);
/* Hides the metatables of ck's userdata (registry names "ck.*") from
 * getmetatable, so a script cannot call their __gc by hand. */
void ck_sandbox_lock_metatables(lua_State *L);

/* Raises "file:line: reading 'path' is denied ... (--allow-read
 * DIR allows it)" unless the VM's sandbox is off or allows the access: the
 * judgment alone, for a refusal before any work; the open itself goes through
 * ck_lua_open or ck_lua_open_parent below. DIR: the path is a directory (the
 * hint names it rather than its parent). */
#define CK_ACCESS_READ 1
#define CK_ACCESS_WRITE 2
#define CK_ACCESS_DIR 4
void ck_lua_check_path(lua_State *L, const char *path, int access);

/* 1 when L's VM is sandboxed */
int ck_lua_sandboxed(lua_State *L);

/* The one door to files by name. Judges path as ck_lua_check_path does
 * (raising the same denial), then opens it beneath the descriptor of the
 * root that allows it (vm/util/beneath.h), so a symlink changed between the
 * judgment and the open cannot lead out: such an open is judged again, and
 * denied if it keeps leading out. The fd (O_CLOEXEC), or -1 with errno for
 * the file's own failure (ENOENT, EISDIR, ...). Outside a sandbox: open(2). */
int ck_lua_open(lua_State *L, const char *path, int access, int flags, mode_t mode);
/* The directory that holds path's last component, opened O_PATH through the
 * same door, for the *at calls that create, rename or remove that entry; the
 * component is copied to name (NAME_MAX + 1 bytes). The whole path is judged
 * first (so a symlink there is judged by where it points). -1 with errno
 * (EINVAL: path ends in "." or ".."). */
int ck_lua_open_parent(lua_State *L, const char *path, int access, char *name, size_t namelen);
/* mkdir -p through the same door (each directory made beneath the last one
 * opened); 0, or -1 with errno. */
int ck_lua_mkdirs(lua_State *L, const char *path);

#endif
