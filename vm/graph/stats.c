/* The statistics' stat nodes (graph/stats.h). */
#include "graph/stats.h"
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

static int block_id(ck_stat_set *set, const char *name, size_t len)
{
    for (int b = 0; b < set->nblocks; b++)
        if (strlen(set->blocks[b]) == len && strncmp(set->blocks[b], name, len) == 0) return b;
    char **nb = realloc(set->blocks, sizeof(char *) * (size_t)(set->nblocks + 1));
    if (!nb) return -1;
    set->blocks = nb;
    if (!(nb[set->nblocks] = malloc(len + 1))) return -1;
    memcpy(nb[set->nblocks], name, len);
    nb[set->nblocks][len] = 0;
    return set->nblocks++;
}

static int add_stat(ck_graph *g, ck_stat_set *set, enum ck_op op, int src, int param, int block, int group)
{
    static const ck_op_params none;
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    ck_graph_set_scope(g, g->t[src].scope);
    int id = ck_graph_node(g, op, &src, 1, &none, outs, NULL, ids, g->t[src].where);
    if (id < 0) return -1;
    g->n[id].phase = CK_PHASE_BACKWARD;
    ck_stat *s = realloc(set->stats, sizeof *s * (size_t)(set->nstats + 1));
    if (!s) return -1;
    set->stats = s;
    s[set->nstats++] = (ck_stat){group, id, src, ids[0], param, block, 0};
    return 0;
}


int ck_graph_add_stats(ck_graph *g, ck_stat_set *set, unsigned groups, const char *const *pats, int np, int mean_grads)
{
    const int base_nt = g->nt, base_nn = g->nn;
    int *out_node = NULL, *mean_of = NULL, rc = -1;
    char *saved_scope = strdup(g->scope ? g->scope : ""); /* the stat nodes take their sources' scopes */
    if (!saved_scope) return -1;
    if (groups & CK_STATS_GRADS) {
        /* Data parallel, one reduction a step: the norms of the mean
         * gradients the update reads (the SCALE of each summed grad_sum,
         * after the allreduce waits), which one process at the job's global
         * batch logs; not this rank's own gradients. With accumulate the sums
         * travel once per update, so a step's norms are the rank's own. */
        if (mean_grads) {
            if (!(mean_of = malloc(sizeof(int) * (size_t)(base_nt ? base_nt : 1)))) goto out;
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
            int b = block_id(set, name, block_len(name, pats, np));
            if (b < 0 || add_stat(g, set, CK_OP_SUMSQ, src, t, b, CK_STATS_GRADS)) goto out;
        }
    }
    if (groups & CK_STATS_ACTS) {
        /* a block's output: what the last forward node inside it makes */
        int cap = 0;
        for (int i = 0; i < base_nn; i++) {
            const ck_node *nd = &g->n[i];
            if (nd->phase != CK_PHASE_FORWARD || !nd->scope || !*nd->scope || nd->out[0] < 0) continue;
            int b = block_id(set, nd->scope, block_len(nd->scope, pats, np));
            if (b < 0) goto out;
            if (b >= cap) {
                int nc = 2 * b + 16, *o = realloc(out_node, sizeof(int) * (size_t)nc);
                if (!o) goto out;
                for (int k = cap; k < nc; k++) o[k] = -1;
                out_node = o;
                cap = nc;
            }
            out_node[b] = i;
        }
        for (int b = 0; b < cap; b++)
            if (out_node[b] >= 0 && add_stat(g, set, CK_OP_STATS, g->n[out_node[b]].out[0], -1, b, CK_STATS_ACTS)) goto out;
    }
    rc = 0;
out:
    ck_graph_set_scope(g, saved_scope);
    free(saved_scope);
    free(out_node);
    free(mean_of);
    return rc;
}

void ck_graph_stat_set_truncate(ck_stat_set *s, int nb)
{
    for (int b = nb; b < s->nblocks; b++) free(s->blocks[b]);
    if (nb < s->nblocks) s->nblocks = nb;
    free(s->stats);
    s->stats = NULL;
    s->nstats = 0;
}
