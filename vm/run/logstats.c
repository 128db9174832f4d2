/* The logging lists: the statistics' stat nodes appended to the program's
 * graph (graph/stats.c), and the lists that run them (the training list plus
 * those entries, planned like it). Steps that do not log run the plain list. */
#include "run/program.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* grows an int64 per-tensor array to g->nt entries, filling with v */
static int grow64(int64_t **a, int from, int to, int64_t v)
{
    int64_t *n = realloc(*a, sizeof(int64_t) * (size_t)(to ? to : 1));
    if (!n) return -1;
    for (int t = from; t < to; t++) n[t] = v;
    *a = n;
    return 0;
}

static int grow_int(int **a, int from, int to, int v)
{
    int *n = realloc(*a, sizeof(int) * (size_t)(to ? to : 1));
    if (!n) return -1;
    for (int t = from; t < to; t++) n[t] = v;
    *a = n;
    return 0;
}

static int grow_u8(unsigned char **a, int from, int to)
{
    unsigned char *n = realloc(*a, (size_t)(to ? to : 1));
    if (!n) return -1;
    memset(n + from, 0, (size_t)(to - from));
    *a = n;
    return 0;
}

/* undoes a failed ck_program_add_stats: the graph and the program as they were */
static void roll_back(ck_program *p, int base_nt, int base_nn, int base_nblocks)
{
    ck_graph_truncate(p->g, base_nt, base_nn);
    for (int k = 1; k <= CK_STATS_ALL; k++) ck_plan_free(&p->logplan[k]);
    ck_graph_stat_set_truncate(&p->st, base_nblocks);
    p->stat_groups = 0;
}

int ck_program_add_stats(ck_program *p, unsigned groups, const char *const *pats, int np, char *err, size_t errlen)
{
    ck_graph *g = p->g;
    groups &= CK_STATS_ALL;
    if (p->stat_groups) {
        if ((groups & ~p->stat_groups) == 0) return 0;
        snprintf(err, errlen, "statistics are already enabled for this program; enable every group at once");
        return -1;
    }
    if (!groups) return 0;
    if (p->train.n == 0) {
        snprintf(err, errlen, "statistics need a training program (a loss and a trainable parameter)");
        return -1;
    }
    const int base_nt = g->nt, base_nn = g->nn, base_nblocks = p->st.nblocks;
    int *nodes = NULL, *placed = NULL;
    ck_plan tr = {0}, ev = {0};
    if (ck_graph_add_stats(g, &p->st, groups, pats, np, p->opt.world > 1 && p->opt.accumulate <= 1)) goto oom;
    p->stat_groups = groups;

    /* per-tensor arrays follow the graph */
    if (grow_int(&p->retain, base_nt, g->nt, 0) || grow64(&p->poff, base_nt, g->nt, -1) ||
        (p->streamed && grow_u8(&p->streamed, base_nt, g->nt)))
        goto oom;
    for (int k = 0; k < p->st.nstats; k++) p->retain[p->st.stats[k].out] = 1;

    nodes = malloc(sizeof(int) * (size_t)(p->st.nstats ? p->st.nstats : 1));
    placed = malloc(sizeof(int) * (size_t)(p->st.nstats ? p->st.nstats : 1));
    if (!nodes || !placed) goto oom;
    /* the plain lists with their copies above the new tensors, so ids mean one
     * thing in every list; they replace the plain lists once all is done */
    if (ck_plan_renumbered(&p->train, base_nt, g->nt, &tr) || ck_plan_renumbered(&p->eval, base_nt, g->nt, &ev))
        goto oom;
    for (unsigned mask = 1; mask <= CK_STATS_ALL; mask++) {
        if (mask & ~groups) continue;
        int n = 0;
        for (int k = 0; k < p->st.nstats; k++)
            if (p->st.stats[k].group & (int)mask) nodes[n++] = p->st.stats[k].node;
        ck_plan *pl = &p->logplan[mask];
        if (ck_schedule_stats(pl, &tr, g, nodes, n, placed) ||
            ck_plan_memory(pl, g, p->poff, p->persistent, p->retain, p->be))
            goto oom;
        if (mask == groups)
            for (int k = 0, j = 0; k < p->st.nstats; k++)
                if (p->st.stats[k].group & (int)mask) p->st.stats[k].placed = placed[j++];
    }

    size_t need = p->arena_bytes;
    for (int k = 1; k <= CK_STATS_ALL; k++)
        if (p->logplan[k].peak > need) need = p->logplan[k].peak;
    if (p->grp->arena && need > p->grp->bytes) {
        /* the arena is sized once, at compile: growing it would hold two at once */
        snprintf(err, errlen, "the logging steps need an arena of %zu bytes, %zu more than the %zu compile sized; "
                 "give compile{stats = ...} what logging will ask for (log.stats_request(logger options))",
                 need, need - p->grp->bytes, p->grp->bytes);
        goto fail;
    }
    ck_exec_graphs_clear(p->be, &p->graphs); /* graphs of the lists replaced */
    ck_plan_free(&p->train);
    ck_plan_free(&p->eval);
    p->train = tr; /* p->last may point at either: the lists stay where they were */
    p->eval = ev;
    if (need > p->arena_bytes) p->arena_bytes = need;
    if (need > p->grp->need) p->grp->need = need;
    free(nodes);
    free(placed);
    return 0;
oom:
    snprintf(err, errlen, "out of memory while adding statistics");
fail:
    ck_plan_free(&tr);
    ck_plan_free(&ev);
    roll_back(p, base_nt, base_nn, base_nblocks);
    free(nodes);
    free(placed);
    return -1;
}
