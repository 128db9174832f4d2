#define _GNU_SOURCE /* mremap */
/* Large blocks taken straight from the system. The C library keeps freed
 * blocks under its mmap threshold, which glibc raises to the size of each
 * large block freed, in its heap, resident; and calloc writes every page of a
 * block from the heap. The planner's tables (trees, lists, per-tensor arrays)
 * are made and dropped step after step of one compile: as mappings, each one
 * holds only the pages it writes and is gone when freed. Each block carries
 * its size and kind in a 16-byte header. */
#include "util/memory.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define LARGE ((size_t)256 << 10)
#define HEADER 16

typedef struct header {
    size_t bytes;  /* the caller's */
    size_t mapped; /* the mapping's length, 0 for a malloc block */
} header;

static size_t pages(size_t n)
{
    const size_t page = 4096;
    return (n + page - 1) / page * page;
}

static void *take(size_t bytes, int zero)
{
    if (bytes > SIZE_MAX - HEADER - 4096) return NULL;
    header *h;
    if (bytes >= LARGE) {
        const size_t len = pages(bytes + HEADER);
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return NULL;
        h = m;
        h->mapped = len;
    } else {
        h = zero ? calloc(1, bytes + HEADER) : malloc(bytes + HEADER);
        if (!h) return NULL;
        h->mapped = 0;
    }
    h->bytes = bytes;
    return (char *)h + HEADER;
}

void *ck_big_alloc(size_t bytes) { return take(bytes, 0); }

void *ck_big_zalloc(size_t bytes) { return take(bytes, 1); }

void ck_big_free(void *p)
{
    if (!p) return;
    header *h = (header *)((char *)p - HEADER);
    if (h->mapped) munmap(h, h->mapped);
    else free(h);
}

void *ck_big_realloc(void *p, size_t bytes)
{
    if (!p) return take(bytes, 0);
    header *h = (header *)((char *)p - HEADER);
    if (h->mapped && bytes >= LARGE) {
        if (bytes > SIZE_MAX - HEADER - 4096) return NULL;
        const size_t len = pages(bytes + HEADER);
        void *m = mremap(h, h->mapped, len, MREMAP_MAYMOVE);
        if (m == MAP_FAILED) return NULL;
        h = m;
        h->mapped = len;
        h->bytes = bytes;
        return (char *)h + HEADER;
    }
    if (!h->mapped && bytes < LARGE) {
        header *n = realloc(h, bytes + HEADER);
        if (!n) return NULL;
        n->bytes = bytes;
        return (char *)n + HEADER;
    }
    void *q = take(bytes, 0); /* across the line: a copy */
    if (!q) return NULL;
    memcpy(q, p, h->bytes < bytes ? h->bytes : bytes);
    ck_big_free(p);
    return q;
}

int ck_grow(void *pp, size_t *cap, size_t need, size_t each, size_t first)
{
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : first;
    while (n < need) {
        if (n > SIZE_MAX / 2) return -1;
        n *= 2;
    }
    if (n > SIZE_MAX / each) return -1;
    void *old;
    memcpy(&old, pp, sizeof old);
    void *grown = realloc(old, n * each);
    if (!grown) return -1;
    memcpy(pp, &grown, sizeof grown);
    *cap = n;
    return 0;
}
