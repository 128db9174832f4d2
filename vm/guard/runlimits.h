/* What one VM's scripts may consume: bytes of Lua heap, bytes of memory in
 * all (the heap and what the runtime takes for them: one budget), instructions
 * in a callback, and a flag another thread raises to stop a run. A count hook
 * enforces the last two; errors it raises cannot be caught by pcall. */
#ifndef CK_RUNLIMITS_H
#define CK_RUNLIMITS_H

#include "util/budget.h"

#include <lua.h>

#include <stddef.h>
#include <stdint.h>

/* Lua instructions between two calls of the count hook */
#define CK_HOOK_EVERY 1000

typedef struct ck_limits {
    lua_Alloc alloc;        /* the allocator beneath the accounting */
    void *alloc_ud;
    size_t heap_limit;      /* 0: none */
    size_t heap_used;
    size_t heap_peak;       /* the most heap_used has been */
    int heap_refused;       /* the allocator refused since the last reset */
    /* all the memory: mem.limit caps the heap plus mem.used (0: none); its
     * heap points at heap_used, its reclaim collects garbage */
    ck_mem_budget mem;
    int mem_refused;        /* the allocator refused for mem.limit since the last reset */
    long long budget;       /* instructions per callback; < 0: none */
    long long used;         /* by the callbacks running now */
    int depth;              /* callbacks running now */
    _Atomic int interrupt;  /* set from any thread and from signal handlers (ck_interrupt, SIGTERM) */
    long long interrupt_seen_ms; /* when a big allocation first met the pending interrupt; 0: none */
    int interrupt_refused;  /* a big allocation was refused for the pending interrupt */
    int tripped;            /* CK_ELIMIT or CK_EINTR while such an error unwinds */
    lua_State *main;
    /* the last error the runtime raised with a status of its own, and that
     * status, so the host API can tell a sandbox denial from a script error */
    int noted_code;
    char noted[512];
} ck_limits;

/* lua_Alloc over lim->alloc that keeps lim->heap_used under lim->heap_limit */
void *ck_limits_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
/* Points L's extra space (which the count hook reads) at lim and installs the
 * hook. The bindings reach lim through the VM's host (vm/guard/host.h). */
void ck_limits_install(lua_State *L, ck_limits *lim);
/* For C code that loops where the count hook cannot see it (a binding's loop
 * over a table, a pattern match): raises the pending interrupt or limit error,
 * and charges work units (about one Lua instruction each) to the callback
 * budget when a callback is running. Call it every few thousand iterations;
 * it may raise, so hold nothing that would leak. Outside a VM it does nothing. */
void ck_limits_charge(lua_State *L, long long work);
/* The memory budget of L's VM (ck_graph.budget, ck_compile_opts.budget, reads
 * of tensors into Lua charge it), or NULL outside a VM. */
ck_mem_budget *ck_mem_budget_of(lua_State *L);
/* For a binding about to make count * each bytes that the Lua heap will hold
 * at once (a tensor read into Lua): raises "file:line: WHAT (SIZE) would pass
 * the memory limit ..." (WHAT from fmt) when the heap and the runtime's bytes
 * plus those would pass the memory limit after a full collection, before any
 * of it is allocated. Charges nothing: the heap counts itself. */
void ck_mem_check(lua_State *L, int64_t count, size_t each, const char *fmt, ...);
/* ck_mem_take and ck_mem_give over a void pointer to a ck_mem_budget, for
 * code that takes a charge as callbacks (ck_st_charge) */
int ck_mem_take_ud(void *budget, size_t n, const char *what, char *err, size_t errlen);
void ck_mem_give_ud(void *budget, size_t n);
/* Back to a clean state once a call has returned to the host. */
void ck_limits_reset(ck_limits *lim);
/* The limits of L's VM (its host's), or NULL (a stock lua5.4 that loaded ck.so). */
ck_limits *ck_limits_of(lua_State *L);
/* Records the string on top of the stack as an error of status code. */
void ck_limits_note(lua_State *L, int code);
/* The status of error message msg if the runtime noted it, else 0. */
int ck_limits_code_of(const ck_limits *lim, const char *msg);

/* Calls the function below the nargs arguments on top of the
 * stack like lua_call, under the VM's instruction budget for callbacks (use it
 * for every script function the runtime calls while compiling: policies,
 * cadences). Past the budget it raises "file:line: callback ran past its
 * instruction budget ..." naming the callback's line, an error pcall in the
 * script cannot swallow. Returns the number of results (nres, or all of them
 * with LUA_MULTRET). Outside a VM (a stock lua5.4) it is lua_call. */
int ck_lua_call_limited(lua_State *L, int nargs, int nres);
/* The same for C code that must not be unwound: returns lua_pcall's status,
 * with the error message on top. A budget error still reaches the host: the
 * next Lua instruction anywhere in the VM raises it again. */
int ck_lua_pcall_limited(lua_State *L, int nargs, int nres);
/* ck.call_limited(fn, ...): the same from Lua */
void ck_lua_limits_register(lua_State *L, int lib);

#endif
