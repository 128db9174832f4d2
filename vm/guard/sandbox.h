/* The sandbox of one VM: which directories its scripts may read and write
 * (kept as resolved real paths), and the restricted libraries it gives them. */
#ifndef CK_SANDBOX_H
#define CK_SANDBOX_H

#include <lua.h>

#include <stddef.h>

typedef struct ck_sandbox {
    int on;
    lua_Alloc alloc; /* for the lists below */
    void *alloc_ud;
    char **read;     /* roots a script may read under */
    int nread, capread;
    char **write;    /* roots a script may write (and read) under */
    int nwrite, capwrite;
    char *lib;       /* the stdlib: require may load from it */
} ck_sandbox;

/* The real path of path: symlinks, "." and ".." resolved against the file
 * system; a tail that does not exist yet is appended to its deepest existing
 * directory (so a file about to be created is judged by where it will be).
 * 0, or -1 with errno (ELOOP, ENAMETOOLONG, ...). */
int ck_sandbox_resolve(const char *path, char *out, size_t len);
/* Adds a root (resolved now); write roots are readable too. 0, or -1 with errno. */
int ck_sandbox_allow(ck_sandbox *sb, const char *dir, int write);
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
 * DIR allows it)" unless the VM's sandbox is off or allows the access; every
 * function that opens a file by name calls it first. DIR: the path is a
 * directory (the hint names it rather than its parent). */
#define CK_ACCESS_READ 1
#define CK_ACCESS_WRITE 2
#define CK_ACCESS_DIR 4
void ck_lua_check_path(lua_State *L, const char *path, int access);

#endif
