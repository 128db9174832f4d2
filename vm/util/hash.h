/* FNV-1a, 64 bits: a digest of bytes for comparing plans and values, not for security. */
#ifndef CK_HASH_H
#define CK_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CK_FNV_OFFSET 14695981039346656037ULL
#define CK_FNV_PRIME 1099511628211ULL

static inline uint64_t ck_fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * CK_FNV_PRIME;
    return h;
}

#endif
