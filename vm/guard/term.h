/* SIGTERM for the VMs whose scripts hold a logger that asked for it
 * (ck.log_open{sigterm = true}, the default): the first hold in the process
 * installs one handler, which raises the interrupt flag of every registered
 * host that holds one at that moment; the last release puts back the
 * disposition the first hold found. A second SIGTERM kills the process. The
 * VM host (vm/embed/ck.c) registers each VM's host at open and takes it out
 * at close (vm/guard/term.c keeps the list). */
#ifndef CK_TERM_H
#define CK_TERM_H

#include <lua.h>

struct ck_host;

/* h may be stopped by SIGTERM while it holds; 0, or -1 out of memory */
int ck_term_register(struct ck_host *h);
/* h is closing: a handler that starts from now on does not touch it */
void ck_term_unregister(struct ck_host *h);
/* 1 while a SIGTERM handler runs (a closed host's memory is kept until none does) */
int ck_term_busy(void);

/* a token for ck_term_release, or NULL where L's host is not registered (a
 * stock lua5.4 that loaded ck.so: nothing to stop the run with) */
void *ck_term_hold(lua_State *L);
/* gives back one hold; NULL does nothing */
void ck_term_release(void *token);

#endif
