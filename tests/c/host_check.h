/* The pass/fail lines of the embedding-host tests added with the memory
 * budget and the thread tests: check() prints one line per check (flushed,
 * so a test that hangs or dies shows how far it got) and counts it; now() is
 * a monotonic clock in seconds. */
#ifndef CK_TEST_HOST_CHECK_H
#define CK_TEST_HOST_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static int passed, failed;

static inline void check(int cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf(cond ? "ok   " : "FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (cond) passed++;
    else failed++;
}

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
