#define _GNU_SOURCE
#include "util/atomic.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "PATH: WHAT TMP[ AFTER]: why" */
static int failf(char *err, size_t errlen, const char *path, const char *what, const char *tmp, const char *after,
                 int e)
{
    if (err && errlen)
        snprintf(err, errlen, "%s: %s %s%s: %s", path, what, tmp, after, e ? strerror(e) : "unknown error");
    return -1;
}

/* The pid of a temp file of name ("name.tmp.PID"), or 0 for any other name. */
static long temp_pid(const char *entry, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(entry, name, n) || strncmp(entry + n, ".tmp.", 5)) return 0;
    const char *d = entry + n + 5;
    if (!*d || *d == '0' || strspn(d, "0123456789") != strlen(d) || strlen(d) > 9) return 0;
    return strtol(d, NULL, 10);
}

/* only "name.tmp.PID" entries whose process is gone (or is this one) */
static void remove_stale_temps(int dirfd, const char *name)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return;
    }
    const long self = (long)getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        const long pid = temp_pid(e->d_name, name);
        if (pid > 0 && (pid == self || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))) unlinkat(dirfd, e->d_name, 0);
    }
    closedir(d);
}

static void release(ck_atomic_file *a)
{
    free(a->name);
    free(a->final);
    free(a->tmp);
    a->name = a->final = a->tmp = NULL;
}

int ck_atomic_begin(ck_atomic_file *a, int dirfd, int open_errno, const char *name, const char *path, char *err,
                    size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->fd = -1;
    a->dirfd = dirfd;
    const size_t nlen = strlen(name), plen = strlen(path);
    a->name = malloc(nlen + 32);
    a->final = strdup(name);
    a->tmp = malloc(plen + 32);
    if (!a->name || !a->final || !a->tmp) {
        release(a);
        if (err && errlen) snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    snprintf(a->name, nlen + 32, "%s.tmp.%ld", name, (long)getpid());
    snprintf(a->tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    if (dirfd < 0) {
        failf(err, errlen, path, "cannot create temp file", a->tmp, "", open_errno);
        release(a);
        return -1;
    }
    remove_stale_temps(dirfd, name);
    a->fd = openat(dirfd, a->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (a->fd < 0) {
        failf(err, errlen, path, "cannot create temp file", a->tmp, "", errno);
        release(a);
        return -1;
    }
    return 0;
}

int ck_atomic_commit(ck_atomic_file *a, const char *path, char *err, size_t errlen)
{
    const char *what = NULL, *after = "";
    int e = 0;
    if (a->fd >= 0) {
        if (fsync(a->fd) != 0) e = errno, what = "cannot fsync temp file";
        const int fd = a->fd;
        a->fd = -1;
        if (close(fd) != 0 && !what) e = errno, what = "cannot close temp file";
    }
    if (!what && renameat(a->dirfd, a->name, a->dirfd, a->final) != 0)
        e = errno, what = "cannot rename temp file", after = " over it";
    if (what) {
        failf(err, errlen, path, what, a->tmp, after, e);
        unlinkat(a->dirfd, a->name, 0);
        release(a);
        return -1;
    }
    /* durable once the directory entry is synced; a filesystem that refuses
     * to fsync a directory has the file in place by then all the same */
    int dfd = openat(a->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    release(a);
    return 0;
}

void ck_atomic_abort(ck_atomic_file *a)
{
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
    if (a->name) unlinkat(a->dirfd, a->name, 0);
    release(a);
}
