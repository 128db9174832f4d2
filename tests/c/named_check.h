/* The pass/fail lines of the file-format and backend tests (test_safetensors,
 * test_safetensors_stream, test_backend, test_image): check() prints "ok NAME"
 * or "FAIL NAME: " and the printf-style detail, and counts it in npass/nfail. */
#ifndef CK_TEST_NAMED_CHECK_H
#define CK_TEST_NAMED_CHECK_H

#include <stdarg.h>
#include <stdio.h>

static int npass, nfail;

static void check(int ok, const char *name, const char *fmt, ...)
{
    if (ok) {
        npass++;
        printf("ok   %s\n", name);
        return;
    }
    nfail++;
    printf("FAIL %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

#endif
