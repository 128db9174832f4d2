/* Polling for C code that a Lua error must not unwind: a decoder inside a
 * library (libpng, libjpeg, a parser holding its own memory) asks whether to
 * stop, stops cleanly on its own error path, and the binding then raises the
 * interrupt or budget error the poll saw (ck_limits_raise_pending), with the
 * script's line, as ck_limits_charge would have. */
#ifndef CK_POLL_H
#define CK_POLL_H

#include "guard/runlimits.h"

/* Charges work units to the callback budget while a callback runs (as
 * ck_limits_charge does) and returns 1 when the run must stop: an interrupt
 * is pending, the budget is spent, or such an error is already unwinding.
 * Never raises; lim NULL (no VM): 0. */
int ck_limits_pending(ck_limits *lim, long long work);
/* The same over a void pointer to a ck_limits, for a reader's poll callback */
int ck_limits_poll_ud(void *lim, long long work);
/* Raises the error a poll reported (the interrupt, or the budget error); does
 * nothing when none is pending, so the caller raises its own error next. */
void ck_limits_raise_pending(lua_State *L);

#endif
