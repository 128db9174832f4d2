/* Small text helpers shared across the runtime: dotted scope patterns, byte
 * counts in words, error messages and the kernel's "Key: N kB" files. A leaf: it uses nothing
 * of ckrun. */
#ifndef CK_TEXT_H
#define CK_TEXT_H

#include <stdarg.h>
#include <stddef.h>

/* Length of the prefix of name that pattern matches component by component
 * ('*' matches one dotted component), or 0: "down_blocks.*.resnets.*"
 * matches "down_blocks.1.resnets.0.conv1" in its first 22 characters. */
size_t ck_scope_match(const char *pattern, const char *name);
/* n as "N GiB" or "N MiB" when it is a whole number of them, else "N bytes" */
void ck_bytes_text(size_t n, char *buf, size_t len);
/* A message into err (errlen bytes, printf's format); returns -1, so that a
 * failing function can return it. */
int ck_errf(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* "AT: message" into err (AT: a file's path, or what stands for it), on one
 * line (newlines and carriage returns become spaces); returns -1. */
int ck_verrf_at(char *err, size_t errlen, const char *at, const char *fmt, va_list ap);
/* The "key:   N kB" line of a /proc file (/proc/meminfo, /proc/self/status) in
 * bytes, or -1 when the file or the line is missing. */
long long ck_proc_kb_field(const char *path, const char *key);

#endif
