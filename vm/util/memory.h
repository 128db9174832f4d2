/* Large blocks for the planner's tables (vm/util/memory.c): taken straight
 * from the system and given straight back, so that a table planning lets go
 * leaves the process, and a table allocated large but filled in part holds
 * only the pages it touched. */
#ifndef CK_MEMORY_H
#define CK_MEMORY_H

#include <stddef.h>

/* As malloc, calloc, realloc and free; blocks of 256 KiB and more are
 * anonymous mappings (zeroed, resident only where written). */
void *ck_big_alloc(size_t bytes);
void *ck_big_zalloc(size_t bytes);
void *ck_big_realloc(void *p, size_t bytes);
void ck_big_free(void *p);

/* A growable buffer: pp points at the buffer's pointer (any object pointer
 * type), *cap counts the elements of each bytes it holds. Grown by doubling,
 * from first where *cap is 0, to hold at least need, its contents kept
 * (realloc). 0, or -1 out of memory or past SIZE_MAX (nothing changed). */
int ck_grow(void *pp, size_t *cap, size_t need, size_t each, size_t first);

#endif
