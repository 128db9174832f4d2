/* The pass/fail lines of the kernel tests (test_kernels_misc, test_kernels_bf16,
 * test_fp8): one line per check ending with the measured error or count, and
 * the count at the end; checks_done() is main's exit status. */
#ifndef CK_TEST_CHECK_H
#define CK_TEST_CHECK_H

#include <stdio.h>

static int npass, nfail;

static void check(const char *name, int ok, double err)
{
    printf("%s %s [%.3g]\n", ok ? "PASS" : "FAIL", name, err);
    if (ok)
        npass++;
    else
        nfail++;
}

static int checks_done(void)
{
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}

#endif
