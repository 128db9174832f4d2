/* Shared text helpers (vm/util/text.h). */
#include "util/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t ck_scope_match(const char *pattern, const char *name)
{
    const char *p = pattern, *s = name;
    if (!*p || !*s) return 0;
    for (;;) {
        size_t pl = strcspn(p, "."), sl = strcspn(s, ".");
        if (sl == 0) return 0;
        if (!(pl == 1 && p[0] == '*') && (pl != sl || strncmp(p, s, pl) != 0)) return 0;
        p += pl;
        s += sl;
        if (!*p) return (size_t)(s - name);
        if (!*s) return 0;
        p++;
        s++;
    }
}

void ck_bytes_text(size_t n, char *buf, size_t len)
{
    const size_t gib = (size_t)1 << 30, mib = (size_t)1 << 20;
    if (n >= gib && n % gib == 0) snprintf(buf, len, "%zu GiB", n >> 30);
    else if (n >= mib && n % mib == 0) snprintf(buf, len, "%zu MiB", n >> 20);
    else snprintf(buf, len, "%zu bytes", n);
}

long long ck_proc_kb_field(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    const size_t n = strlen(key);
    long long bytes = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            bytes = strtoll(line + n + 1, NULL, 10) * 1024;
            break;
        }
    fclose(f);
    return bytes;
}

int ck_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int ck_verrf_at(char *err, size_t errlen, const char *at, const char *fmt, va_list ap)
{
    if (!err || !errlen) return -1;
    const int k = snprintf(err, errlen, "%s: ", at);
    if (k < 0) err[0] = 0;
    else if ((size_t)k < errlen) vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
    for (char *c = err; *c; c++) /* one line: a library's message may end in a newline */
        if (*c == '\n' || *c == '\r') *c = ' ';
    return -1;
}
