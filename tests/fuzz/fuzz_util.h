/* What the VM harnesses share: a private scratch directory that is the
 * working directory while an input runs and the only place the sandbox lets
 * scripts read and write (so a fuzzed os.remove can never touch the source
 * tree), and an invariant check that aborts for libFuzzer. Between inputs the
 * working directory is libFuzzer's own, so relative corpus paths work; pass
 * an absolute -artifact_prefix so that a crash is saved where you look. */
#ifndef CK_FUZZ_UTIL_H
#define CK_FUZZ_UTIL_H

#define _XOPEN_SOURCE 700
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir[256];
static int fuzz_home = -1; /* the working directory libFuzzer started in */

static inline void fuzz_check(int cond, const char *harness, const char *what)
{
    if (!cond) {
        fprintf(stderr, "%s: invariant broken: %s\n", harness, what);
        abort();
    }
}

static inline int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    if (ftw->level > 0) remove(path);
    return 0;
}

/* at exit: the scratch directory and all in it */
static inline void fuzz_remove(void)
{
    if (fuzz_dir[0]) nftw(fuzz_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (fuzz_dir[0]) rmdir(fuzz_dir);
}

static inline void fuzz_scratch(const char *harness)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/ck%s.XXXXXX", tmp && strlen(tmp) < 128 ? tmp : "/tmp", harness);
    fuzz_home = open(".", O_RDONLY | O_DIRECTORY);
    if (!mkdtemp(fuzz_dir) || fuzz_home < 0) {
        perror("fuzz scratch directory");
        abort();
    }
    atexit(fuzz_remove);
}

static inline void fuzz_enter(void)
{
    if (chdir(fuzz_dir) != 0) abort();
}

/* back to libFuzzer's directory; clean: empty the scratch directory first
 * (depth first, links not followed) */
static inline void fuzz_leave(int clean)
{
    if (clean) nftw(fuzz_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (fchdir(fuzz_home) != 0) abort();
}

#endif
