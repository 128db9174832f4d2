/* A file written whole and renamed into place: the data goes to
 * NAME.tmp.<pid> beside it, is fsynced, then renamed over NAME and the
 * directory synced, so a write that fails (or a process killed) at any moment
 * leaves an existing NAME as it was. Used by the safetensors writer and the
 * PNG writer. Knows nothing of Lua; messages name the caller's path. */
#ifndef CK_ATOMIC_H
#define CK_ATOMIC_H

#include <stddef.h>

typedef struct ck_atomic_file {
    int dirfd;   /* where NAME is (the caller's; not closed here) */
    int fd;      /* the temp file, open for writing; -1 once closed */
    char *name;  /* NAME.tmp.<pid> in dirfd */
    char *final; /* NAME */
    char *tmp;   /* the temp file's path, for messages */
} ck_atomic_file;

/* Removes the temp files of NAME that a killed writer left (those whose
 * process is gone, and this process's own), then creates this one (O_EXCL,
 * O_NOFOLLOW: never a file that is not ours). dirfd -1: its open failed with
 * open_errno. 0, or -1 with "PATH: cannot create temp file TMP: why". */
int ck_atomic_begin(ck_atomic_file *a, int dirfd, int open_errno, const char *name, const char *path, char *err,
                    size_t errlen);
/* fsync and close (unless the caller closed a->fd and set it to -1 after its
 * own fsync), rename over NAME, sync the directory. On failure the temp file
 * is removed. Frees what begin took either way. 0, or -1 with a message. */
int ck_atomic_commit(ck_atomic_file *a, const char *path, char *err, size_t errlen);
/* Closes and removes the temp file; frees what begin took. */
void ck_atomic_abort(ck_atomic_file *a);

#endif
