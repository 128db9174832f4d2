/* SIGTERM for the VMs whose loggers hold it (guard/term.h): the hosts that
 * may be stopped are registered here, the handler raises the interrupt flag
 * of every registered host that holds, and the holds count the process's
 * users of the handler. The handler touches only atomics, so it is
 * async-signal-safe; it walks slots that are never freed. */
#include "guard/term.h"

#include "guard/host.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define TERM_SLOTS 64

typedef struct term_slot {
    _Atomic(ck_host *) host; /* NULL: free once holds is 0 too */
    _Atomic int holds;       /* its loggers that SIGTERM stops the run of */
} term_slot;

typedef struct term_block {
    term_slot slot[TERM_SLOTS];
    _Atomic(struct term_block *) next;
} term_block;

static term_block head;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refs;               /* holds in the whole process */
static struct sigaction old;   /* SIGTERM's disposition before the first hold */
static atomic_int inflight;    /* handlers running now */

static void on_sigterm(int sig)
{
    (void)sig;
    atomic_fetch_add(&inflight, 1);
    for (term_block *b = &head; b; b = atomic_load(&b->next))
        for (int i = 0; i < TERM_SLOTS; i++) {
            ck_host *h = atomic_load(&b->slot[i].host);
            if (h && atomic_load(&b->slot[i].holds) > 0) atomic_store(&h->lim.interrupt, 1);
        }
    atomic_fetch_sub(&inflight, 1);
}

int ck_term_register(ck_host *h)
{
    pthread_mutex_lock(&mu);
    for (term_block *b = &head;; b = atomic_load(&b->next)) {
        for (int i = 0; i < TERM_SLOTS; i++) {
            term_slot *s = &b->slot[i];
            if (!atomic_load(&s->host) && atomic_load(&s->holds) == 0) {
                atomic_store(&s->host, h);
                pthread_mutex_unlock(&mu);
                return 0;
            }
        }
        if (!atomic_load(&b->next)) {
            term_block *nb = calloc(1, sizeof *nb);
            if (!nb) {
                pthread_mutex_unlock(&mu);
                return -1;
            }
            atomic_store(&b->next, nb);
        }
    }
}

void ck_term_unregister(ck_host *h)
{
    pthread_mutex_lock(&mu);
    for (term_block *b = &head; b; b = atomic_load(&b->next))
        for (int i = 0; i < TERM_SLOTS; i++)
            if (atomic_load(&b->slot[i].host) == h) atomic_store(&b->slot[i].host, NULL);
    pthread_mutex_unlock(&mu);
}

int ck_term_busy(void) { return atomic_load(&inflight) > 0; }

void *ck_term_hold(lua_State *L)
{
    ck_host *h = ck_host_of(L);
    if (!h) return NULL;
    pthread_mutex_lock(&mu);
    term_slot *s = NULL;
    for (term_block *b = &head; b && !s; b = atomic_load(&b->next))
        for (int i = 0; i < TERM_SLOTS && !s; i++)
            if (atomic_load(&b->slot[i].host) == h) s = &b->slot[i];
    if (s) {
        atomic_fetch_add(&s->holds, 1);
        if (refs++ == 0) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = on_sigterm;
            sa.sa_flags = SA_RESETHAND; /* a second SIGTERM kills */
            sigemptyset(&sa.sa_mask);
            sigaction(SIGTERM, &sa, &old);
        }
    }
    pthread_mutex_unlock(&mu);
    return s;
}

void ck_term_release(void *token)
{
    term_slot *s = token;
    if (!s) return;
    pthread_mutex_lock(&mu);
    atomic_fetch_sub(&s->holds, 1);
    if (refs > 0 && --refs == 0) {
        /* ours, or the default a first SIGTERM reset it to: put back what
         * was there; a handler the host set since stays */
        struct sigaction now;
        sigaction(SIGTERM, NULL, &now);
        if (now.sa_handler == SIG_DFL || (!(now.sa_flags & SA_SIGINFO) && now.sa_handler == on_sigterm))
            sigaction(SIGTERM, &old, NULL);
    }
    pthread_mutex_unlock(&mu);
}
