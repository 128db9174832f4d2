/* The memory plan of one op list: liveness of every transient tensor and
 * workspace, then offsets in one arena (largest first, best-fit gap among the
 * buffers live at the same time). Persistent tensors sit below, at fixed offsets. */
#include "program.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 64

typedef struct buf {
    int64_t size, off;
    int first, last;
    int tensor; /* -1: the workspace of list position `first` */
} buf;

int ck_is_persistent(ck_kind k)
{
    return k == CK_KIND_PARAM || k == CK_KIND_FROZEN || k == CK_KIND_INPUT || k == CK_KIND_OPTSTATE;
}

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int by_size(const void *a, const void *b)
{
    const buf *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

static int by_off(const void *a, const void *b)
{
    const buf *x = *(buf *const *)a, *y = *(buf *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

void ck_plan_free(ck_plan *pl)
{
    free(pl->nodes);
    free(pl->off);
    free(pl->ws_off);
    free(pl->ws_bytes);
    memset(pl, 0, sizeof *pl);
}

int ck_plan_build(ck_plan *pl, const ck_graph *g, const int *nodes, int n, const int64_t *poff, size_t persistent,
                  const int *retain, int nthreads)
{
    memset(pl, 0, sizeof *pl);
    pl->n = n;
    pl->nodes = malloc(sizeof(int) * (size_t)(n ? n : 1));
    pl->off = malloc(sizeof(int64_t) * (size_t)(g->nt ? g->nt : 1));
    pl->ws_off = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    pl->ws_bytes = calloc((size_t)(n ? n : 1), sizeof(size_t));
    int *first = malloc(sizeof(int) * (size_t)(g->nt ? g->nt : 1));
    int *last = malloc(sizeof(int) * (size_t)(g->nt ? g->nt : 1));
    buf *bufs = malloc(sizeof(buf) * (size_t)(g->nt + n + 1));
    buf **live = malloc(sizeof(buf *) * (size_t)(g->nt + n + 1));
    int rc = -1;
    if (!pl->nodes || !pl->off || !pl->ws_off || !pl->ws_bytes || !first || !last || !bufs || !live) goto out;
    memcpy(pl->nodes, nodes, sizeof(int) * (size_t)n);
    for (int t = 0; t < g->nt; t++) {
        first[t] = -1;
        last[t] = -1;
        pl->off[t] = -1;
    }
    for (int i = 0; i < n; i++) {
        const ck_node *nd = &g->n[nodes[i]];
        int ids[CK_MAX_IN + CK_MAX_OUT], k = 0;
        for (int j = 0; j < nd->nin; j++) ids[k++] = nd->in[j];
        for (int j = 0; j < nd->nout; j++)
            if (nd->out[j] >= 0) ids[k++] = nd->out[j];
        for (int j = 0; j < k; j++) {
            int t = ids[j];
            if (first[t] < 0) first[t] = i;
            last[t] = i;
        }
        ck_shape ins[CK_MAX_IN], outs[CK_MAX_OUT];
        for (int j = 0; j < nd->nin; j++) ins[j] = g->t[nd->in[j]].shape;
        for (int j = 0; j < nd->nout; j++)
            outs[j] = nd->out[j] >= 0 ? g->t[nd->out[j]].shape : ins[0];
        pl->ws_bytes[i] = ck_op_workspace(nd->op, &nd->p, ins, nd->nin, outs, nthreads);
    }
    int nb = 0;
    for (int t = 0; t < g->nt; t++) {
        if (first[t] < 0) continue;
        size_t bytes = (size_t)ck_shape_numel(&g->t[t].shape) * sizeof(float);
        if (ck_is_persistent(g->t[t].kind)) {
            pl->off[t] = poff[t];
            pl->by_kind[g->t[t].kind] += bytes;
            continue;
        }
        pl->by_kind[g->t[t].kind] += bytes;
        bufs[nb++] = (buf){align_up((int64_t)(bytes ? bytes : 1)), 0, first[t], retain && retain[t] ? n : last[t], t};
    }
    for (int i = 0; i < n; i++) {
        pl->ws_off[i] = -1;
        if (pl->ws_bytes[i]) bufs[nb++] = (buf){align_up((int64_t)pl->ws_bytes[i]), 0, i, i, -1};
    }
    qsort(bufs, (size_t)nb, sizeof *bufs, by_size);
    int64_t top = 0;
    for (int b = 0; b < nb; b++) {
        int nl = 0;
        for (int c = 0; c < b; c++)
            if (bufs[c].first <= bufs[b].last && bufs[b].first <= bufs[c].last) live[nl++] = &bufs[c];
        qsort(live, (size_t)nl, sizeof *live, by_off);
        int64_t best = -1, best_gap = INT64_MAX, at = 0;
        for (int c = 0; c < nl; c++) {
            int64_t gap = live[c]->off - at;
            if (gap >= bufs[b].size && gap < best_gap) {
                best = at;
                best_gap = gap;
            }
            if (live[c]->off + live[c]->size > at) at = live[c]->off + live[c]->size;
        }
        bufs[b].off = best >= 0 ? best : at;
        if (bufs[b].off + bufs[b].size > top) top = bufs[b].off + bufs[b].size;
    }
    int64_t base = align_up((int64_t)persistent);
    for (int b = 0; b < nb; b++) {
        if (bufs[b].tensor >= 0) pl->off[bufs[b].tensor] = base + bufs[b].off;
        else pl->ws_off[bufs[b].first] = base + bufs[b].off;
    }
    /* the largest workspace that is live at one position */
    for (int i = 0; i < n; i++)
        if (pl->ws_bytes[i] > pl->workspace) pl->workspace = pl->ws_bytes[i];
    pl->transient = (size_t)top;
    pl->peak = (size_t)base + (size_t)top;
    rc = 0;
out:
    free(first);
    free(last);
    free(bufs);
    free(live);
    if (rc) ck_plan_free(pl);
    return rc;
}
