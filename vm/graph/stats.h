/* The statistics logging steps compute, as graph transforms: one SUMSQ node
 * per trainable parameter's gradient and one STATS node per block output,
 * appended to a differentiated graph. Stat nodes have phase BACKWARD, so no
 * checkpoint policy sees them; only the logging lists (vm/run/logstats.c)
 * run them. */
#ifndef CK_STATS_H
#define CK_STATS_H

#include "graph/graph.h"

/* the statistics' groups */
enum { CK_STATS_GRADS = 1, CK_STATS_ACTS = 2, CK_STATS_ALL = 3 };

/* One statistic: a stat node of the graph reducing one tensor. */
typedef struct ck_stat {
    int group;  /* CK_STATS_GRADS: SUMSQ of a parameter's gradient; CK_STATS_ACTS: STATS of a block output */
    int node;   /* the stat node */
    int src;    /* the tensor it reduces */
    int out;    /* its output: [1] squared norm, or [3] mean, std, absmax */
    int param;  /* grads: the parameter; -1 otherwise */
    int block;  /* index into blocks */
    int placed; /* 1 when the training list makes src (the logging lists run it) */
} ck_stat;

/* The statistics of a graph and the block names they use (each owned). */
typedef struct ck_stat_set {
    ck_stat *stats;
    int nstats;
    char **blocks;
    int nblocks;
} ck_stat_set;

/* Appends to g the stat nodes of the groups asked for, and to s the
 * statistics and the blocks they name. A block is the prefix of a scope that
 * one of the patterns matches ('*' matches one dotted component), or else
 * the scope's first component. mean_grads (data parallel, one reduction a
 * step): a gradient's statistic reads the mean the update reads, the SCALE
 * of its grad_sum, instead of the rank's own gradient. 0, or -1 out of
 * memory (what was appended stays, for the caller to take back). */
int ck_graph_add_stats(ck_graph *g, ck_stat_set *s, unsigned groups, const char *const *pats, int np, int mean_grads);
/* Frees what s holds from its block nb and its statistics (all of them). */
void ck_graph_stat_set_truncate(ck_stat_set *s, int nb);

#endif
