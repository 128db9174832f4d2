/* The plan type (vm/plan/plan.h): what a scheduled and placed op list is
 * made of, its categories, its digest, its host bytes and its freeing. The
 * passes that make one: vm/plan/schedule.c (the list), vm/plan/offload.c
 * (the transfers) and vm/plan/memplan.c (the offsets). */
#include "plan/plan.h"
#include "util/hash.h"
#include "util/memory.h"

#include <stdlib.h>
#include <string.h>

const char *const ck_plan_cat_names[CK_CAT_COUNT] = {"frozen", "trainable", "gradients", "optimizer_state", "inputs",
                                                "activations", "recomputed", "workspace"};

int ck_plan_is_persistent(ck_kind k)
{
    return k == CK_KIND_PARAM || k == CK_KIND_FROZEN || k == CK_KIND_INPUT || k == CK_KIND_OPTSTATE;
}

size_t ck_plan_tensor_bytes(const ck_plan *pl, const ck_graph *g, int id)
{
    return ck_tensor_bytes(&g->t[pl->origin[id]]);
}

ck_cat ck_plan_tensor_cat(const ck_plan *pl, const ck_graph *g, int id)
{
    if (id >= g->nt) {
        if (!pl->loc || pl->loc[id] == CK_LOC_DEVICE) return CK_CAT_RECOMPUTED;
        /* a device copy of a streamed tensor is still its tensor's bytes */
        if (!ck_plan_is_persistent(g->t[pl->origin[id]].kind)) return CK_CAT_ACTIVATIONS;
        id = pl->origin[id];
    }
    const ck_tensor *t = &g->t[id];
    switch (t->kind) {
    case CK_KIND_FROZEN: return CK_CAT_FROZEN;
    case CK_KIND_PARAM: return CK_CAT_TRAINABLE;
    case CK_KIND_GRAD: return CK_CAT_GRADIENTS;
    case CK_KIND_OPTSTATE: return CK_CAT_OPTSTATE;
    case CK_KIND_INPUT: return CK_CAT_INPUTS;
    default: break;
    }
    if (t->node >= 0 && g->n[t->node].phase != CK_PHASE_FORWARD) return CK_CAT_GRADIENTS;
    return CK_CAT_ACTIVATIONS;
}

size_t ck_plan_host_bytes(const ck_plan *pl)
{
    if (!pl->ops) return 0;
    const size_t n = (size_t)(pl->n ? pl->n : 1), nt = (size_t)(pl->ntensors ? pl->ntensors : 1);
    return ck_graph_malloc_chunk(sizeof *pl->ops * n) + ck_graph_malloc_chunk(sizeof *pl->origin * nt) +
           ck_graph_malloc_chunk(sizeof *pl->off * nt) + ck_graph_malloc_chunk(sizeof *pl->ws_off * n) +
           ck_graph_malloc_chunk(sizeof *pl->ws_bytes * n) + (pl->loc ? ck_graph_malloc_chunk(nt) : 0);
}

uint64_t ck_plan_digest(const ck_plan *pl, uint64_t h)
{
    h = ck_fnv1a(h, &pl->n, sizeof pl->n);
    for (int i = 0; i < pl->n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        const int head[4] = {r->node, (int)r->phase, r->nin, r->nout};
        h = ck_fnv1a(h, head, sizeof head);
        if (r->xfer) { /* only lists that offload hash these: other plans' digests stay what they were */
            const int x[2] = {(int)r->xfer, (int)r->slot};
            h = ck_fnv1a(h, x, sizeof x);
        }
        h = ck_fnv1a(h, r->in, sizeof *r->in * (size_t)r->nin);
        h = ck_fnv1a(h, r->out, sizeof *r->out * (size_t)r->nout);
        if (pl->ws_off) h = ck_fnv1a(h, &pl->ws_off[i], sizeof *pl->ws_off);
        if (pl->ws_bytes) h = ck_fnv1a(h, &pl->ws_bytes[i], sizeof *pl->ws_bytes);
    }
    if (pl->off) h = ck_fnv1a(h, pl->off, sizeof *pl->off * (size_t)pl->ntensors);
    const uint64_t peak = pl->peak;
    h = ck_fnv1a(h, &peak, sizeof peak);
    if (pl->loc) {
        const uint64_t host = pl->host_peak;
        h = ck_fnv1a(h, pl->loc, (size_t)pl->ntensors);
        h = ck_fnv1a(h, &host, sizeof host);
    }
    return h;
}

void ck_plan_free(ck_plan *pl)
{
    free(pl->ops);
    free(pl->origin);
    free(pl->off);
    free(pl->ws_off);
    free(pl->ws_bytes);
    free(pl->loc);
    memset(pl, 0, sizeof *pl);
}
