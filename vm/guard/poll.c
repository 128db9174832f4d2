/* ck_limits_pending: the interrupt and the callback budget asked without
 * raising, for decoders that must leave a library on its own error path
 * before the binding raises. */
#include "guard/poll.h"

int ck_limits_pending(ck_limits *lim, long long work)
{
    if (!lim) return 0;
    if (lim->tripped || lim->interrupt) return 1;
    if (lim->depth > 0 && lim->budget >= 0 && work > 0) {
        lim->used += work;
        if (lim->used > lim->budget) return 1;
    }
    return 0;
}

int ck_limits_poll_ud(void *lim, long long work) { return ck_limits_pending(lim, work); }

void ck_limits_raise_pending(lua_State *L)
{
    ck_limits *lim = ck_limits_of(L);
    if (!lim) return;
    /* one unit more: past a spent budget, ck_limits_charge trips it */
    const int spent = lim->depth > 0 && lim->budget >= 0 && lim->used > lim->budget;
    ck_limits_charge(L, spent ? 1 : 0);
}
