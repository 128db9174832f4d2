/* The statistics logging steps compute: one SUMSQ node per trainable
 * parameter's gradient and one STATS node per block output, appended to the
 * program's graph, and the logging lists that run them (the training list plus
 * those entries, planned like it). Steps that do not log run the plain list. */
#include "run/program.h"
#include "util/text.h"


#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the block of a dotted name: a pattern's match, else the first component */
static size_t block_len(const char *name, const char *const *pats, int np)
{
    for (int k = 0; k < np; k++) {
        size_t m = ck_scope_match(pats[k], name);
        if (m) return m;
    }
    return strcspn(name, ".");
}

static int block_id(ck_program *p, const char *name, size_t len)
{
    for (int b = 0; b < p->nblocks; b++)
        if (strlen(p->blocks[b]) == len && strncmp(p->blocks[b], name, len) == 0) return b;
    char **nb = realloc(p->blocks, sizeof(char *) * (size_t)(p->nblocks + 1));
    if (!nb) return -1;
    p->blocks = nb;
    if (!(nb[p->nblocks] = malloc(len + 1))) return -1;
    memcpy(nb[p->nblocks], name, len);
    nb[p->nblocks][len] = 0;
    return p->nblocks++;
}

static int add_stat(ck_program *p, enum ck_op op, int src, int param, int block, int group)
{
    ck_graph *g = p->g;
    static const ck_op_params none;
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    ck_graph_set_scope(g, g->t[src].scope);
    int id = ck_graph_node(g, op, &src, 1, &none, outs, NULL, ids, g->t[src].where);
    if (id < 0) return -1;
    g->n[id].phase = CK_PHASE_BACKWARD;
    ck_stat *s = realloc(p->stats, sizeof *s * (size_t)(p->nstats + 1));
    if (!s) return -1;
    p->stats = s;
    s[p->nstats++] = (ck_stat){group, id, src, ids[0], param, block, 0};
    return 0;
}

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
    for (int b = base_nblocks; b < p->nblocks; b++) free(p->blocks[b]);
    p->nblocks = base_nblocks;
    free(p->stats);
    p->stats = NULL;
    p->nstats = 0;
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
    const int base_nt = g->nt, base_nn = g->nn, base_nblocks = p->nblocks;
    char *saved_scope = strdup(g->scope ? g->scope : "");
    int *nodes = NULL, *placed = NULL, *out_node = NULL, *mean_of = NULL;
    ck_plan tr = {0}, ev = {0};
    if (!saved_scope) goto oom;
    if (groups & CK_STATS_GRADS) {
        /* Data parallel, one reduction a step: the norms of the mean
         * gradients the update reads (the SCALE of each summed grad_sum,
         * after the allreduce waits), which one process at the job's global
         * batch logs; not this rank's own gradients. With accumulate the sums
         * travel once per update, so a step's norms are the rank's own. */
        if (p->opt.world > 1 && p->opt.accumulate <= 1) {
            if (!(mean_of = malloc(sizeof(int) * (size_t)(base_nt ? base_nt : 1)))) goto oom;
            for (int t = 0; t < base_nt; t++) mean_of[t] = -1;
            for (int i = 0; i < base_nn; i++) {
                const ck_node *nd = &g->n[i];
                if (nd->op == CK_OP_SCALE && nd->phase == CK_PHASE_OPTIMIZER && nd->in[0] >= 0 &&
                    g->t[nd->in[0]].kind == CK_KIND_OPTSTATE)
                    mean_of[nd->in[0]] = nd->out[0];
            }
        }
        for (int t = 0; t < base_nt; t++) {
            if (g->t[t].kind != CK_KIND_PARAM || g->t[t].grad < 0) continue;
            const char *name = g->t[t].name ? g->t[t].name : "";
            int src = g->t[t].grad;
            if (mean_of) {
                char sum[1024];
                snprintf(sum, sizeof sum, "grad_sum.%s", name);
                const int acc = ck_graph_find(g, sum);
                if (acc >= 0 && acc < base_nt && mean_of[acc] >= 0) src = mean_of[acc];
            }
            int b = block_id(p, name, block_len(name, pats, np));
            if (b < 0 || add_stat(p, CK_OP_SUMSQ, src, t, b, CK_STATS_GRADS)) goto oom;
        }
    }
    if (groups & CK_STATS_ACTS) {
        /* a block's output: what the last forward node inside it makes */
        int cap = 0;
        for (int i = 0; i < base_nn; i++) {
            const ck_node *nd = &g->n[i];
            if (nd->phase != CK_PHASE_FORWARD || !nd->scope || !*nd->scope || nd->out[0] < 0) continue;
            int b = block_id(p, nd->scope, block_len(nd->scope, pats, np));
            if (b < 0) goto oom;
            if (b >= cap) {
                int nc = 2 * b + 16, *o = realloc(out_node, sizeof(int) * (size_t)nc);
                if (!o) goto oom;
                for (int k = cap; k < nc; k++) o[k] = -1;
                out_node = o;
                cap = nc;
            }
            out_node[b] = i;
        }
        for (int b = 0; b < cap; b++)
            if (out_node[b] >= 0 && add_stat(p, CK_OP_STATS, g->n[out_node[b]].out[0], -1, b, CK_STATS_ACTS)) goto oom;
    }
    ck_graph_set_scope(g, saved_scope);
    p->stat_groups = groups;

    /* per-tensor arrays follow the graph */
    if (grow_int(&p->retain, base_nt, g->nt, 0) || grow64(&p->poff, base_nt, g->nt, -1) ||
        (p->streamed && grow_u8(&p->streamed, base_nt, g->nt)))
        goto oom;
    for (int k = 0; k < p->nstats; k++) p->retain[p->stats[k].out] = 1;

    nodes = malloc(sizeof(int) * (size_t)(p->nstats ? p->nstats : 1));
    placed = malloc(sizeof(int) * (size_t)(p->nstats ? p->nstats : 1));
    if (!nodes || !placed) goto oom;
    /* the plain lists with their copies above the new tensors, so ids mean one
     * thing in every list; they replace the plain lists once all is done */
    if (ck_plan_renumbered(&p->train, base_nt, g->nt, &tr) || ck_plan_renumbered(&p->eval, base_nt, g->nt, &ev))
        goto oom;
    for (unsigned mask = 1; mask <= CK_STATS_ALL; mask++) {
        if (mask & ~groups) continue;
        int n = 0;
        for (int k = 0; k < p->nstats; k++)
            if (p->stats[k].group & (int)mask) nodes[n++] = p->stats[k].node;
        ck_plan *pl = &p->logplan[mask];
        if (ck_schedule_stats(pl, &tr, g, nodes, n, placed) ||
            ck_plan_memory(pl, g, p->poff, p->persistent, p->retain, p->be))
            goto oom;
        if (mask == groups)
            for (int k = 0, j = 0; k < p->nstats; k++)
                if (p->stats[k].group & (int)mask) p->stats[k].placed = placed[j++];
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
    free(out_node);
    free(mean_of);
    free(saved_scope);
    return 0;
oom:
    snprintf(err, errlen, "out of memory while adding statistics");
fail:
    ck_plan_free(&tr);
    ck_plan_free(&ev);
    if (saved_scope) ck_graph_set_scope(g, saved_scope);
    roll_back(p, base_nt, base_nn, base_nblocks);
    free(nodes);
    free(placed);
    free(out_node);
    free(mean_of);
    free(saved_scope);
    return -1;
}
