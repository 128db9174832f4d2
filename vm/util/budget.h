#ifndef CK_BUDGET_H
#define CK_BUDGET_H

#include <stddef.h>

/* One budget for the memory a VM's scripts can make the runtime take: the
 * Lua heap (read through heap) and what the runtime charges here before it
 * allocates: graphs, op lists and plans, arenas (the device bytes their plans
 * state), stages, tensors read from files. The VM owns it
 * (vm/guard/runlimits.h); objects made outside a VM point at none. */
typedef struct ck_mem_budget {
    size_t limit;       /* 0: none */
    size_t used;        /* bytes charged outside the Lua heap */
    const size_t *heap; /* the Lua heap's bytes now; NULL: not counted */
    /* frees what unreachable objects hold (a full garbage collection), tried
     * once before a charge is refused; NULL: none */
    void (*reclaim)(void *ud);
    void *reclaim_ud;
    int refusing;       /* a reclaim runs now: charges made meanwhile do not reclaim again */
    int refused;        /* a charge was refused (the host reads it to give the error CK_EMEM) */
    /* 1: the limit is the sandbox's default, the machine's memory, and the
     * device's own memory joins it when a program first compiles for one */
    int add_device;
} ck_mem_budget;

/* Charges n bytes for `what` (a phrase naming the thing and its size: "the
 * program's arena of 2.0 GiB") before the caller allocates them. 0, or -1
 * with err set to "WHAT would pass the memory limit of 64 MiB (--max-memory
 * 3GiB allows it)". b NULL or without a limit: counts, never refuses. */
int ck_mem_take(ck_mem_budget *b, size_t n, const char *what, char *err, size_t errlen);
/* Gives back n bytes a ck_mem_take charged. */
void ck_mem_give(ck_mem_budget *b, size_t n);
/* Brings what one holder has charged, *held, to now bytes: gives back what
 * it held over, or charges the rest for "WHAT (SIZE)", SIZE the bytes
 * charged. 0, or -1 with err and *held as it was. */
int ck_mem_hold(ck_mem_budget *b, size_t *held, size_t now, const char *what, char *err, size_t errlen);
/* n in words for messages: "2.0 GiB", "64 MiB", "512 bytes" */
void ck_mem_text(size_t n, char *buf, size_t len);

#endif
