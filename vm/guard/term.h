/* SIGTERM for the VMs whose scripts hold a logger that asked for it
 * (ck.log_open{sigterm = true}, the default): the first hold in the process
 * installs one handler, which raises the interrupt flag of every open VM that
 * holds one at that moment; the last release puts back the disposition the
 * first hold found. A second SIGTERM kills the process. The VM host
 * (vm/embed/ck.c) implements it: the handler reaches VMs through its
 * registry of open handles. */
#ifndef CK_TERM_H
#define CK_TERM_H

#include <lua.h>

/* a token for ck_term_release, or NULL where L is not a VM of ck_open (a
 * stock lua5.4 that loaded ck.so: nothing to stop the run with) */
void *ck_term_hold(lua_State *L);
/* gives back one hold; NULL does nothing */
void ck_term_release(void *token);

#endif
