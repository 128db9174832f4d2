/* Offsets for buffers with live ranges over a list's positions (vm/plan/place.c). */
#ifndef CK_PLACE_H
#define CK_PLACE_H

#include <stdint.h>

typedef struct ck_place_buf {
    int64_t size;        /* bytes used */
    int64_t off;         /* out: the offset */
    int first, last;     /* the list positions it is live at, inclusive */
    int id;              /* the last tie-break of the order */
    uint32_t units;      /* size rounded up to the alignment, in the placement's units (ck_place sets it) */
} ck_place_buf;

/* Sorts the buffers (decreasing aligned size, then first position, then id)
 * and places each in that order at the lowest offset of the smallest gap,
 * among the buffers already placed that are live at one of its positions,
 * that holds its aligned size, or above them all; a buffer of no bytes at 0.
 * Positions are 0 .. npos-1 and offsets multiples of align (of a power of two
 * times align, when the buffers together pass 2^32 times align). Returns the
 * high-water mark (the end of the highest byte used), or -1 out of memory;
 * once the high-water mark passes stop (INT64_MAX: never), the placement ends
 * there and returns the mark so far, above stop and at most the whole
 * placement's (the buffers after it in the order are not placed). */
int64_t ck_place(ck_place_buf *bufs, int nb, int npos, int64_t align, int64_t stop);

#endif
