/* Opening beneath a directory descriptor: openat2's RESOLVE_BENEATH where
 * the kernel has it, else a walk that opens one component at a time with
 * O_NOFOLLOW. Either way the kernel resolves the path once, at the open, so
 * no check made earlier can be raced. */
#define _GNU_SOURCE /* O_PATH */
#include "util/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

static int walk_mode = -1; /* -1: not decided yet */

int ck_beneath_walks(void)
{
    int w = __atomic_load_n(&walk_mode, __ATOMIC_RELAXED);
    if (w < 0) {
        const char *e = getenv("CK_BENEATH_WALK");
        w = e && !strcmp(e, "1");
        __atomic_store_n(&walk_mode, w, __ATOMIC_RELAXED);
    }
    return w;
}

/* after an ENOTDIR: was name a symlink (which O_NOFOLLOW refused)? */
static int is_link(int dirfd, const char *name)
{
    struct stat st;
    return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

static int walk(int dirfd, const char *rel, int flags, mode_t mode)
{
    if (rel[0] == '/') {
        errno = EXDEV;
        return -1;
    }
    int cur = dirfd, fd = -1;
    const char *p = rel;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const char *next = e;
        while (next && *next == '/') next++;
        int last = !next || !*next;
        char name[NAME_MAX + 1];
        if (n > NAME_MAX) {
            errno = ENAMETOOLONG;
            break;
        }
        memcpy(name, p, n);
        name[n] = 0;
        if (n == 0) strcpy(name, ".");
        if (!strcmp(name, "..")) {
            errno = EXDEV;
            break;
        }
        if (last) {
            fd = openat(cur, name, flags | O_NOFOLLOW | O_CLOEXEC, mode);
            if (fd < 0 && errno == ENOTDIR && is_link(cur, name)) errno = ELOOP;
            /* O_PATH with O_NOFOLLOW opens a symlink itself: refuse that too */
            struct stat st;
            if (fd >= 0 && (flags & O_PATH) && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
                close(fd);
                fd = -1;
                errno = ELOOP;
            }
            break;
        }
        int nfd = openat(cur, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (nfd < 0) {
            if (errno == ENOTDIR && is_link(cur, name)) errno = ELOOP;
            break;
        }
        if (cur != dirfd) close(cur);
        cur = nfd;
        p = next;
    }
    if (cur != dirfd) {
        int e = errno;
        close(cur);
        errno = e;
    }
    return fd;
}

int ck_open_beneath(int dirfd, const char *rel, int flags, mode_t mode)
{
    if (!rel || !*rel) rel = ".";
    if (!ck_beneath_walks()) {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = (unsigned long long)(flags | O_CLOEXEC);
        how.mode = flags & (O_CREAT | O_TMPFILE) ? mode : 0;
        how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
        for (int tries = 0;; tries++) {
            long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
            if (fd >= 0) return (int)fd;
            /* EAGAIN: a rename raced the lookup; the kernel asks for a retry */
            if (errno == EAGAIN && tries < 8) continue;
            if (errno != ENOSYS) return -1;
            break;
        }
        __atomic_store_n(&walk_mode, 1, __ATOMIC_RELAXED);
    }
    return walk(dirfd, rel, flags, mode);
}
