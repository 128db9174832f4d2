/* What a host's VM hands its scripts, in one struct reached through one
 * registry key: the limits, the sandbox, the default device and the plan
 * request. The bindings (vm/lua) read it here; a stock lua5.4 that loaded
 * ck.so has none, and every reader falls back to its default. */
#ifndef CK_HOST_H
#define CK_HOST_H

#include "guard/runlimits.h"
#include "guard/sandbox.h"

#include <lua.h>

typedef struct ck_host {
    ck_limits lim;
    ck_sandbox sb;
    char device[16];     /* programs compile for it unless compile{device=} says otherwise */
    /* the plan request (ckrun --plan): scripts see ck.plan_mode, ck.json,
     * ck.plan_policies, ck.plan_svg, ck.plan_export_graph and ck.plan_max_batch */
    int planning;        /* 0: no request (the ck fields are nil) */
    int plan_only, json;
    char *plan_policies; /* NULL: none; owned by the VM */
    char *plan_svg;
    char *plan_export_graph;
    double plan_max_batch; /* 0: none */
    int plan_world_size;   /* ckrun --plan --world-size N (ck.plan_world_size); 0: none */
} ck_host;

/* Makes h the host of L (the registry key "ck.host"). */
void ck_host_install(lua_State *L, ck_host *h);
/* The host of L's VM, or NULL (a stock lua5.4). */
ck_host *ck_host_of(lua_State *L);

#endif
