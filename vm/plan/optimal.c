/* The recompute decision by an exact solver: a mixed-integer program over the
 * list's memory, solved by CBC (coinor-libcbc) under a time limit, as the
 * reference the budget search is held against and as --checkpoint optimal.
 *
 * Positions are the entries every list has, the none list's (forward, then
 * the rest in list order): the scheduler (vm/plan/schedule.c) only inserts
 * recompute entries between them. A buffer is a forward activation with its
 * views (RESHAPE aliases one buffer, as the evaluator's roots); it can be
 * marked when every forward tensor in it is a candidate and none is
 * retained. e0 is the last forward entry touching it, f and L its first and
 * last later entry; a buffer no later entry reads is a link (a recomputation
 * that reads it recomputes it too, rather than keep it). Variables, all in
 * [0, 1]:
 *   x_h    binary: buffer h marked (all its forward tensors);
 *   R_p    node p recomputed: R_p >= x_h for a view of h p makes that a later
 *          entry reads; R_p >= R_w + x_h - 1 when w, recomputed, reads p's
 *          view of h (materialize, depth first). The least R is the set the
 *          scheduler recomputes, so the objective, sum of R_p times p's FLOPs
 *          (in percent of the forward FLOPs), is exact.
 *   N_h,j  h's copy made by breakpoint s_j < f: N_h,j >= N_h,j-1 and
 *          N_h,j >= V_g(s_j) + x_h - 1 for each buffer g made by a reader w of
 *          h (V_g(s): x_g from f_g on, else g's own N at its last breakpoint
 *          <= s); N_h,j <= x_h and <= the sum over those g of their value at
 *          their first breakpoint >= s_j (a link's beyond its last: R of its
 *          producer). s_j are the f and breakpoints of those g before f_h,
 *          at most SEGMENTS of them, evenly thinned (fewer only weakens it).
 *   O_u,i  u's original (unmarked) kept through segment i, (b_i-1, b_i], past
 *          its end (e0 of a link, else L), for a recomputation that reads it:
 *          O_u,i >= R_w - x_u - run_w(b_i) for each w reading u, where run_w(s)
 *          (w recomputed by s: 0 in the forward pass, else the sum over w's
 *          buffers of their value at their first breakpoint >= s) is an upper
 *          bound; and R_p(u) + O_u,i + run_w(b_i) >= R_w, which says the same
 *          for a fractional mark. b_i are its readers' buffers' breakpoints
 *          and f, and the last forward entry, at most USEGMENTS of them.
 * Memory at position k above the persistent bytes: none's live bytes there
 * (its workspace included), - bytes_h x_h for each non-link h with
 * e0 < k < f (the original gone; from f to L a copy stands for it),
 * + bytes_h N_h,j(k) for h with s_0 <= k < f, + bytes_u O_u,i(k) past u's end.
 * At the scheduler's values this is a lower bound of the list's live bytes at
 * every such entry (equal at most of them; test_optimal checks both): it
 * leaves out the recompute entries' own positions (a recomputation's inputs
 * and copies live together), copies made between breakpoints, a link's copy
 * read by recomputations at several entries, and the placement's
 * fragmentation. So the solver's bound is a bound on every decision of this
 * kind (a buffer marked whole) whose placed peak fits; the decision it gives is
 * checked by the evaluator's placed peak, and while that is over the budget
 * the model's budget is lowered by the excess and solved again. Memory rows
 * enter lazily: the most loaded positions under none and an even spread, then
 * those the solution breaks. The budget search's decision is the answer when
 * the solver finds none better that fits (it is not CBC's start: given as one,
 * CBC's own heuristics found worse decisions in the same time). */
#include "plan/optimal.h"
#include "plan/policy.h"

#ifdef CK_HAVE_CBC
#include <Cbc_C_Interface.h>
#endif

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEGMENTS 8       /* breakpoints kept per buffer before its first later reader */
#define USEGMENTS 12     /* segments kept per original a recomputation reads */
#define FIRST_ROWS 64    /* memory rows at the start */
#define ROWS_PER_SOLVE 128
#define GAP 1e-3         /* a solve stops within 0.1% of its bound */
#define MIB (1.0 / 1048576.0)

typedef struct grp {
    int root, prod;  /* the buffer's tensor; its producer's index in prod[] */
    int e0, f, L;
    int64_t bytes;
    int seg0, nseg;  /* breakpoints brk[seg0 ..), ascending, all < f */
    int link;        /* no later entry reads it: marked, a recomputation recomputes it too */
} grp;

typedef struct edge { int h, w; } edge; /* producer w (an index in prod[]) reads buffer h */

struct ck_optimal_model {
    const ck_decide_ctx *c;
    int P, pos0, nt;
    size_t persistent;
    int64_t *base;     /* per position: live bytes above the persistent ones under none */
    int ng, nprod, ne, nbrk;
    grp *grp;
    int *alias;        /* per graph tensor: the buffer it is a forward view of, -1 */
    int *prod_node, *prod_pos, *prod_g0, *prod_gn, *prod_by_pos; /* per producer; by_pos: producers, latest first */
    int *prod_grp;     /* the buffers of each producer, prod_g0 .. + gn */
    int *prod_of;      /* per graph node: producer index, -1 */
    double *prod_flops;
    edge *e;           /* sorted by w */
    int *brk;
    int *g_by_pos;     /* buffers, latest producer first */
    /* originals a recomputation reads: buffer u (bytes, end: its last entry
     * unless marked) read by producer w, and u's segments (b[..]: right ends) */
    int nu, nx, nub;
    int *u_root, *u_end, *u_seg0, *u_nseg, *u_grp; /* per read buffer; u_grp: its buffer index or -1 */
    int64_t *u_bytes;
    int *x_u, *x_w;    /* reads: buffer index into u_*, producer; sorted by u */
    int *x_start;      /* per read buffer: its reads x_[x_start[u] ..) */
    int *ub;
    /* which nodes recompute: producer dr_p of a view of buffer dr_h that a
     * later entry reads; producer rc_p of a view of rc_h that producer rc_w
     * reads (sorted by rc_w, which starts at rc_start[w]) */
    int nd, nrc;
    int *dr_p, *dr_h, *rc_p, *rc_w, *rc_h, *rc_start;
    double forward_flops;
    double scale;      /* the objective's unit: percent of the forward FLOPs */
};

/* the process's CPU time: what CBC's time limit counts */
__attribute__((unused)) static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ck_optimal_model_free(ck_optimal_model *m)
{
    if (!m) return;
    free(m->base), free(m->grp), free(m->alias), free(m->prod_node), free(m->prod_pos), free(m->prod_g0);
    free(m->prod_gn), free(m->prod_by_pos), free(m->prod_grp), free(m->prod_of), free(m->prod_flops), free(m->e);
    free(m->brk), free(m->g_by_pos);
    free(m->u_root), free(m->u_end), free(m->u_seg0), free(m->u_nseg), free(m->u_grp), free(m->u_bytes), free(m->x_u);
    free(m->x_w), free(m->x_start), free(m->ub);
    free(m->dr_p), free(m->dr_h), free(m->rc_p), free(m->rc_w), free(m->rc_h), free(m->rc_start);
    free(m);
}

int ck_optimal_model_positions(const ck_optimal_model *m) { return m->P; }

static const ck_optimal_model *sort_model;
static int by_prod_pos_desc(const void *a, const void *b)
{
    const int pa = sort_model->prod_pos[sort_model->grp[*(const int *)a].prod];
    const int pb = sort_model->prod_pos[sort_model->grp[*(const int *)b].prod];
    return (pa < pb) - (pa > pb);
}
static int by_pos_desc(const void *a, const void *b)
{
    const int pa = sort_model->prod_pos[*(const int *)a], pb = sort_model->prod_pos[*(const int *)b];
    return (pa < pb) - (pa > pb);
}
static int by_w(const void *a, const void *b)
{
    const edge *x = a, *y = b;
    return x->w != y->w ? (x->w > y->w) - (x->w < y->w) : (x->h > y->h) - (x->h < y->h);
}
static int by_int(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* the breakpoints of h: the first readers and breakpoints of the buffers its
 * readers make, before f_h, thinned to SEGMENTS */
static int breakpoints(ck_optimal_model *m, int h, int *tmp, int *cap)
{
    int n = 0;
    const grp *gh = &m->grp[h];
    /* readers of h: edges (h, w), found by scanning (edges are sorted by w) */
    for (int k = 0; k < m->ne; k++) {
        if (m->e[k].h != h) continue;
        const int w = m->e[k].w;
        for (int i = m->prod_g0[w]; i < m->prod_g0[w] + m->prod_gn[w]; i++) {
            const grp *g = &m->grp[m->prod_grp[i]];
            if (n + g->nseg + 1 > *cap) return -1;
            if (g->f < gh->f) tmp[n++] = g->f;
            for (int j = 0; j < g->nseg; j++)
                if (m->brk[g->seg0 + j] < gh->f) tmp[n++] = m->brk[g->seg0 + j];
        }
    }
    qsort(tmp, (size_t)n, sizeof *tmp, by_int);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (!u || tmp[u - 1] != tmp[i]) tmp[u++] = tmp[i];
    if (u > SEGMENTS) { /* evenly thinned, the earliest kept */
        for (int j = 0; j < SEGMENTS; j++) tmp[j] = tmp[(long)j * (u - 1) / (SEGMENTS - 1)];
        u = SEGMENTS;
    }
    return u;
}

ck_optimal_model *ck_optimal_model_new(const ck_decide_ctx *c, ck_evaluator *ev, int links, char *err, size_t errlen)
{
    const ck_graph *g = c->g;
    (void)ev;
    if (g->fused_updates || g->comm_overlap) {
        snprintf(err, errlen, "optimal: lists whose optimizer entries move (fused updates, overlapped data parallel) "
                              "are not supported");
        return NULL;
    }
    ck_optimal_model *m = calloc(1, sizeof *m);
    ck_plan pl = {0};
    int *root = NULL, *first = NULL, *last = NULL, *lastf = NULL, *firstb = NULL, *cand = NULL, *tmp = NULL;
    unsigned char *nfread = NULL;
    int64_t *delta = NULL;
    if (!m) goto oom;
    m->c = c;
    m->nt = g->nt;
    m->persistent = c->persistent;
    if (ck_schedule(&pl, g, c->nodes, c->n, NULL)) goto oom;
    const int P = m->P = pl.n;
    if (P > CK_OPTIMAL_MAX_ENTRIES) {
        snprintf(err, errlen, "optimal: the list has %d entries; the solver takes at most %d (use budget:)", P,
                 CK_OPTIMAL_MAX_ENTRIES);
        ck_plan_free(&pl);
        ck_optimal_model_free(m);
        return NULL;
    }
    const size_t nt = (size_t)(g->nt ? g->nt : 1), nn = (size_t)(g->nn ? g->nn : 1);
    root = malloc(sizeof(int) * nt), first = malloc(sizeof(int) * nt), last = malloc(sizeof(int) * nt);
    lastf = malloc(sizeof(int) * nt), firstb = malloc(sizeof(int) * nt), cand = calloc(nt, sizeof(int));
    delta = calloc((size_t)P + 2, sizeof *delta);
    nfread = calloc(nt, 1);
    m->base = malloc(sizeof *m->base * (size_t)(P ? P : 1));
    m->alias = malloc(sizeof(int) * nt);
    m->prod_of = malloc(sizeof(int) * nn);
    if (!root || !first || !last || !lastf || !firstb || !cand || !delta || !nfread || !m->base || !m->alias ||
        !m->prod_of)
        goto oom;
    for (int k = 0; k < c->ncand; k++) cand[c->cand[k]] = 1;
    /* the none list's buffers, as the evaluator's walk roots them */
    for (int t = 0; t < g->nt; t++) root[t] = t, first[t] = last[t] = lastf[t] = firstb[t] = -1, m->alias[t] = -1;
    int pos0 = 0;
    for (int i = 0; i < P; i++) {
        const ck_op_ref *r = &pl.ops[i];
        const ck_node *nd = &g->n[r->node];
        const int fwd = r->phase == CK_PHASE_FORWARD;
        if (fwd) pos0 = i + 1;
        if (nd->op == CK_OP_RESHAPE && r->out[0] >= 0) root[r->out[0]] = root[r->in[0]];
        for (int j = 0; !fwd && j < r->nin; j++) nfread[r->in[j]] = 1;
        for (int j = 0; j < r->nin + r->nout; j++) {
            const int id = j < r->nin ? r->in[j] : r->out[j - r->nin];
            if (id < 0) continue;
            const int x = root[id];
            if (first[x] < 0) first[x] = i;
            last[x] = i;
            if (fwd) lastf[x] = i;
            else if (firstb[x] < 0) firstb[x] = i;
        }
    }
    m->pos0 = pos0;
    /* cand: bit 1 a candidate, bit 2 a retained buffer */
    for (int t = 0; c->retain && t < g->nt; t++)
        if (c->retain[t] && first[root[t]] >= 0) last[root[t]] = P, cand[root[t]] |= 2;
    for (int t = 0; t < g->nt; t++) {
        if (t != root[t] || first[t] < 0 || ck_plan_is_persistent(g->t[t].kind)) continue;
        const int64_t b = (int64_t)ck_tensor_bytes(&g->t[t]);
        delta[first[t]] += b;
        delta[last[t] + 1] -= b;
    }
    int64_t live = 0;
    for (int i = 0; i < P; i++) {
        live += delta[i];
        m->base[i] = live + (int64_t)ck_plan_entry_workspace(&pl, g, i, c->be);
    }
    /* the buffers a decision can free: made forward, read later, every
     * forward view of them a candidate, none retained */
    int ng = 0;
    int *gidx = malloc(sizeof(int) * nt);
    if (!gidx) goto oom;
    for (int t = 0; t < g->nt; t++) gidx[t] = -1;
    for (int t = 0; t < g->nt; t++) {
        const int r = root[t];
        if (g->t[t].node < 0 || g->n[g->t[t].node].phase != CK_PHASE_FORWARD) continue;
        if (!(cand[t] & 1)) gidx[r] = -2; /* a forward view that is no candidate */
    }
    for (int t = 0; t < g->nt; t++) {
        if (t != root[t] || gidx[t] == -2 || first[t] < 0 || first[t] >= pos0 || (cand[t] & 2) ||
            ck_plan_is_persistent(g->t[t].kind) || g->t[t].node < 0 || (firstb[t] < 0 && !links))
            continue;
        gidx[t] = ng++;
    }
    m->grp = calloc((size_t)(ng ? ng : 1), sizeof *m->grp);
    if (!m->grp) goto oom_g;
    m->ng = ng;
    for (int i = 0; i < g->nn; i++) m->prod_of[i] = -1;
    int *pos_node = malloc(sizeof(int) * nn);
    m->prod_node = malloc(sizeof(int) * nn);
    m->prod_pos = malloc(sizeof(int) * nn);
    m->prod_flops = calloc(nn, sizeof(double));
    if (!pos_node || !m->prod_node || !m->prod_pos || !m->prod_flops) {
        free(pos_node);
        goto oom_g;
    }
    for (int i = 0; i < P; i++) pos_node[pl.ops[i].node] = i;
    for (int i = 0; i < pos0; i++) m->forward_flops += ck_plan_op_flops(&pl, g, i);
    m->scale = 100.0 / (m->forward_flops > 0 ? m->forward_flops : 1);
    for (int t = 0; t < g->nt; t++) {
        if (gidx[t] < 0 || t != root[t]) continue;
        grp *h = &m->grp[gidx[t]];
        h->root = t;
        h->e0 = lastf[t], h->f = firstb[t], h->L = last[t];
        if (firstb[t] < 0) h->f = P + 1, h->L = lastf[t], h->link = 1;
        h->bytes = (int64_t)ck_tensor_bytes(&g->t[t]);
        h->prod = -1;
    }
    /* the producers: of each buffer and of each view of it (a RESHAPE,
     * recomputed when that view is needed) */
    int nviews = 0;
    for (int t = 0; t < g->nt; t++) {
        const int r = root[t];
        if (gidx[r] < 0 || g->t[t].node < 0 || g->n[g->t[t].node].phase != CK_PHASE_FORWARD) continue;
        m->alias[t] = gidx[r];
        nviews++;
        const int v = g->t[t].node;
        if (m->prod_of[v] < 0) {
            m->prod_of[v] = m->nprod;
            m->prod_node[m->nprod] = v;
            m->prod_pos[m->nprod] = pos_node[v];
            m->prod_flops[m->nprod] = ck_plan_op_flops(&pl, g, pos_node[v]);
            m->nprod++;
        }
        if (t == r) m->grp[gidx[r]].prod = m->prod_of[v];
    }
    m->dr_p = malloc(sizeof(int) * (size_t)(nviews ? nviews : 1));
    m->dr_h = malloc(sizeof(int) * (size_t)(nviews ? nviews : 1));
    if (!m->dr_p || !m->dr_h) {
        free(pos_node);
        goto oom_g;
    }
    for (int t = 0; t < g->nt; t++)
        if (m->alias[t] >= 0 && nfread[t]) m->dr_p[m->nd] = m->prod_of[g->t[t].node], m->dr_h[m->nd++] = m->alias[t];
    /* the producers' buffers, and the chain edges: producer w reads buffer h
     * (a RESHAPE making a view of h is h itself) */
    m->prod_g0 = calloc((size_t)m->nprod + 1, sizeof(int));
    m->prod_gn = calloc((size_t)m->nprod + 1, sizeof(int));
    m->prod_grp = malloc(sizeof(int) * (size_t)(ng ? ng : 1));
    m->prod_by_pos = malloc(sizeof(int) * (size_t)(m->nprod ? m->nprod : 1));
    m->g_by_pos = malloc(sizeof(int) * (size_t)(ng ? ng : 1));
    int ecap = 0;
    for (int p = 0; p < m->nprod; p++) ecap += g->n[m->prod_node[p]].nin;
    m->e = malloc(sizeof *m->e * (size_t)(ecap ? ecap : 1));
    m->rc_p = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
    m->rc_w = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
    m->rc_h = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
    m->rc_start = calloc((size_t)m->nprod + 2, sizeof(int));
    if (!m->rc_p || !m->rc_w || !m->rc_h || !m->rc_start) {
        free(pos_node);
        goto oom_g;
    }
    if (!m->prod_g0 || !m->prod_gn || !m->prod_grp || !m->prod_by_pos || !m->g_by_pos || !m->e) {
        free(pos_node);
        goto oom_g;
    }
    for (int h = 0; h < ng; h++) m->prod_gn[m->grp[h].prod]++;
    for (int p = 0, at = 0; p < m->nprod; p++) m->prod_g0[p] = at, at += m->prod_gn[p], m->prod_gn[p] = 0;
    for (int h = 0; h < ng; h++) {
        const int p = m->grp[h].prod;
        m->prod_grp[m->prod_g0[p] + m->prod_gn[p]++] = h;
    }
    for (int p = 0; p < m->nprod; p++) { /* by producer, so rc[] is sorted by rc_w */
        const ck_node *nd = &g->n[m->prod_node[p]];
        m->rc_start[p] = m->nrc;
        for (int j = 0; j < nd->nin; j++) {
            const int h = nd->in[j] >= 0 ? m->alias[nd->in[j]] : -1;
            if (h < 0) continue;
            m->rc_p[m->nrc] = m->prod_of[g->t[nd->in[j]].node], m->rc_w[m->nrc] = p, m->rc_h[m->nrc++] = h;
            if (nd->out[0] >= 0 && m->alias[nd->out[0]] == h) continue; /* a view of h: h itself */
            int dup = 0;
            for (int k = 0; k < m->ne; k++) dup |= m->e[k].w == p && m->e[k].h == h;
            if (!dup) m->e[m->ne++] = (edge){h, p};
        }
    }
    m->rc_start[m->nprod] = m->nrc;
    free(pos_node);
    qsort(m->e, (size_t)m->ne, sizeof *m->e, by_w);
    sort_model = m;
    for (int p = 0; p < m->nprod; p++) m->prod_by_pos[p] = p;
    qsort(m->prod_by_pos, (size_t)m->nprod, sizeof(int), by_pos_desc);
    for (int h = 0; h < ng; h++) m->g_by_pos[h] = h;
    qsort(m->g_by_pos, (size_t)ng, sizeof(int), by_prod_pos_desc);
    /* breakpoints, readers' buffers first (they are made later in forward) */
    int cap = 4096;
    tmp = malloc(sizeof(int) * (size_t)cap);
    m->brk = malloc(sizeof(int) * (size_t)(ng ? ng : 1) * SEGMENTS);
    if (!tmp || !m->brk) goto oom_g;
    for (int i = 0; i < ng; i++) {
        const int h = m->g_by_pos[i];
        int n;
        while ((n = breakpoints(m, h, tmp, &cap)) < 0) {
            int *t2 = realloc(tmp, sizeof(int) * (size_t)cap * 2);
            if (!t2) goto oom_g;
            tmp = t2, cap *= 2;
        }
        m->grp[h].seg0 = m->nbrk;
        m->grp[h].nseg = n;
        memcpy(m->brk + m->nbrk, tmp, sizeof(int) * (size_t)n);
        m->nbrk += n;
    }
    /* the buffers recomputations read (as originals, when not marked), each
     * with segments after its end, to the breakpoints of its readers' buffers */
    {
        int *uidx = malloc(sizeof(int) * nt);
        m->u_root = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        m->u_end = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        m->u_seg0 = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        m->u_nseg = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        m->u_grp = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        m->u_bytes = malloc(sizeof(int64_t) * (size_t)(ecap ? ecap : 1));
        m->x_u = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        m->x_w = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        m->x_start = calloc((size_t)ecap + 2, sizeof(int));
        m->ub = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1) * USEGMENTS);
        int *xu = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        int *xw = malloc(sizeof(int) * (size_t)(ecap ? ecap : 1));
        if (!uidx || !m->u_root || !m->u_end || !m->u_seg0 || !m->u_nseg || !m->u_grp || !m->u_bytes || !m->x_u ||
            !m->x_w || !m->x_start || !m->ub || !xu || !xw) {
            free(uidx), free(xu), free(xw);
            goto oom_g;
        }
        for (int t = 0; t < g->nt; t++) uidx[t] = -1;
        for (int p = 0; p < m->nprod; p++) {
            const ck_node *nd = &g->n[m->prod_node[p]];
            for (int j = 0; j < nd->nin; j++) {
                if (nd->in[j] < 0) continue;
                const int ru = root[nd->in[j]];
                if (nd->out[0] >= 0 && root[nd->out[0]] == ru) continue; /* a view */
                if (first[ru] < 0 || first[ru] >= pos0 || ck_plan_is_persistent(g->t[ru].kind) || (cand[ru] & 2))
                    continue;
                if (uidx[ru] < 0) {
                    const int u = m->nu++;
                    uidx[ru] = u;
                    m->u_root[u] = ru;
                    m->u_grp[u] = gidx[ru] >= 0 ? gidx[ru] : -1;
                    m->u_end[u] = gidx[ru] >= 0 ? m->grp[gidx[ru]].L : last[ru];
                    m->u_bytes[u] = (int64_t)ck_tensor_bytes(&g->t[ru]);
                }
                int dup = 0;
                for (int k = 0; k < m->nx; k++) dup |= xu[k] == uidx[ru] && xw[k] == p;
                if (!dup) xu[m->nx] = uidx[ru], xw[m->nx++] = p;
            }
        }
        for (int k = 0; k < m->nx; k++) m->x_start[xu[k] + 1]++;
        for (int u = 0; u < m->nu; u++) m->x_start[u + 1] += m->x_start[u];
        int *fill_at = uidx; /* reuse: per read buffer, where its next read goes */
        for (int u = 0; u < m->nu; u++) fill_at[u] = m->x_start[u];
        for (int k = 0; k < m->nx; k++) {
            const int at = fill_at[xu[k]]++;
            m->x_u[at] = xu[k], m->x_w[at] = xw[k];
        }
        free(xu), free(xw);
        for (int u = 0; u < m->nu; u++) {
            int n = 0;
            const int end = m->u_end[u];
            if (end < pos0 - 1) tmp[n++] = pos0 - 1;
            for (int k = m->x_start[u]; k < m->x_start[u + 1]; k++) {
                const int w = m->x_w[k];
                for (int q = m->prod_g0[w]; q < m->prod_g0[w] + m->prod_gn[w]; q++) {
                    const grp *gq = &m->grp[m->prod_grp[q]];
                    if (n + gq->nseg + 1 > cap) {
                        int *t2 = realloc(tmp, sizeof(int) * (size_t)cap * 2);
                        if (!t2) {
                            free(uidx);
                            goto oom_g;
                        }
                        tmp = t2, cap *= 2;
                    }
                    if (gq->f > end) tmp[n++] = gq->f;
                    for (int j = 0; j < gq->nseg; j++)
                        if (m->brk[gq->seg0 + j] > end) tmp[n++] = m->brk[gq->seg0 + j];
                }
            }
            qsort(tmp, (size_t)n, sizeof *tmp, by_int);
            int v = 0;
            for (int i = 0; i < n; i++)
                if (!v || tmp[v - 1] != tmp[i]) tmp[v++] = tmp[i];
            if (v > USEGMENTS) {
                for (int j = 0; j < USEGMENTS; j++) tmp[j] = tmp[(long)j * (v - 1) / (USEGMENTS - 1)];
                v = USEGMENTS;
            }
            m->u_seg0[u] = m->nub;
            m->u_nseg[u] = v;
            memcpy(m->ub + m->nub, tmp, sizeof(int) * (size_t)v);
            m->nub += v;
        }
        free(uidx);
    }
    free(gidx);
    free(root), free(first), free(last), free(lastf), free(firstb), free(cand), free(delta), free(tmp), free(nfread);
    ck_plan_free(&pl);
    return m;
oom_g:
    free(gidx);
oom:
    free(root), free(first), free(last), free(lastf), free(firstb), free(cand), free(delta), free(tmp), free(nfread);
    ck_plan_free(&pl);
    ck_optimal_model_free(m);
    snprintf(err, errlen, "out of memory");
    return NULL;
}

void ck_optimal_model_mark(const ck_optimal_model *m, const unsigned char *in, unsigned char *out)
{
    memset(out, 0, (size_t)m->nt);
    for (int t = 0; t < m->nt; t++)
        if (m->alias[t] >= 0 && in && in[m->grp[m->alias[t]].root]) out[t] = 1;
}

/* columns: x_h, then R_p, then N_h,j */
static int col_x(const ck_optimal_model *m, int h) { (void)m; return h; }
static int col_r(const ck_optimal_model *m, int p) { return m->ng + p; }
static int col_n(const ck_optimal_model *m, int h, int j) { return m->ng + m->nprod + m->grp[h].seg0 + j; }
static int col_o(const ck_optimal_model *m, int u, int i) { return m->ng + m->nprod + m->nbrk + m->u_seg0[u] + i; }
static int ncols(const ck_optimal_model *m) { return m->ng + m->nprod + m->nbrk + m->nub; }

/* buffer g's value at position s: its copy made by s (a column, or -1: 0) */
static int value_at(const ck_optimal_model *m, int gi, int s)
{
    const grp *g = &m->grp[gi];
    if (s >= g->f) return col_x(m, gi);
    int j = -1;
    for (int k = 0; k < g->nseg; k++)
        if (m->brk[g->seg0 + k] <= s) j = k;
    return j < 0 ? -1 : col_n(m, gi, j);
}

/* an upper bound of buffer g's copy being made by s (w's recomputation run
 * by s): the column of its first breakpoint at or after s, else x_g */
static int next_at(const ck_optimal_model *m, int gi, int s)
{
    const grp *g = &m->grp[gi];
    for (int k = 0; k < g->nseg; k++)
        if (m->brk[g->seg0 + k] >= s) return col_n(m, gi, k);
    /* a link's mark costs nothing by itself: its producer recomputed */
    return g->link ? col_r(m, g->prod) : col_x(m, gi);
}

static void fill_originals(const ck_optimal_model *m, double *v);

/* the least values of R and N for x (in v[col_x ..]), as the scheduler's list has them */
static void fill(const ck_optimal_model *m, double *v)
{
    for (int p = 0; p < m->nprod; p++) v[col_r(m, p)] = 0;
    for (int k = 0; k < m->nd; k++) v[col_r(m, m->dr_p[k])] = fmax(v[col_r(m, m->dr_p[k])], v[col_x(m, m->dr_h[k])]);
    for (int i = 0; i < m->nprod; i++) { /* readers first: R_w is final when its turn comes */
        const int w = m->prod_by_pos[i];
        for (int k = m->rc_start[w]; k < m->rc_start[w + 1]; k++) {
            const int p = m->rc_p[k];
            v[col_r(m, p)] = fmax(v[col_r(m, p)], v[col_r(m, w)] + v[col_x(m, m->rc_h[k])] - 1);
        }
    }
    for (int i = 0; i < m->ng; i++) { /* readers' buffers first, as the breakpoints were made */
        const int h = m->g_by_pos[i];
        const grp *gh = &m->grp[h];
        for (int j = 0; j < gh->nseg; j++) {
            double n = j ? v[col_n(m, h, j - 1)] : 0;
            const int s = m->brk[gh->seg0 + j];
            for (int k = 0; k < m->ne; k++) {
                if (m->e[k].h != h) continue;
                const int w = m->e[k].w;
                for (int q = m->prod_g0[w]; q < m->prod_g0[w] + m->prod_gn[w]; q++) {
                    const int col = value_at(m, m->prod_grp[q], s);
                    if (col >= 0) n = fmax(n, v[col] + v[col_x(m, h)] - 1);
                }
            }
            v[col_n(m, h, j)] = n;
        }
    }
    fill_originals(m, v);
}

/* the column of the recomputation of w being run by s, summed over w's
 * buffers (an upper bound), into cols; their count */
static int made_by(const ck_optimal_model *m, int w, int s, int *cols)
{
    int n = 0;
    if (s < m->pos0) return 0; /* nothing is recomputed in the forward pass */
    for (int q = m->prod_g0[w]; q < m->prod_g0[w] + m->prod_gn[w]; q++) cols[n++] = next_at(m, m->prod_grp[q], s);
    return n;
}

static void fill_originals(const ck_optimal_model *m, double *v)
{
    int cols[CK_MAX_OUT + 8];
    for (int u = 0; u < m->nu; u++)
        for (int i = 0; i < m->u_nseg[u]; i++) {
            double o = 0;
            for (int k = m->x_start[u]; k < m->x_start[u + 1]; k++) {
                const int w = m->x_w[k];
                double r = v[col_r(m, w)] - (m->u_grp[u] >= 0 ? v[col_x(m, m->u_grp[u])] : 0);
                const int n = made_by(m, w, m->ub[m->u_seg0[u] + i], cols);
                for (int j = 0; j < n; j++) r -= v[cols[j]];
                o = fmax(o, r);
            }
            v[col_o(m, u, i)] = o;
        }
}

/* the model's live bytes at position k for column values v */
static double memory_at(const ck_optimal_model *m, const double *v, int k)
{
    double b = (double)m->base[k];
    for (int h = 0; h < m->ng; h++) {
        const grp *g = &m->grp[h];
        if (g->link || k <= g->e0 || k >= g->f) continue;
        b -= (double)g->bytes * v[col_x(m, h)];
        int j = -1;
        for (int q = 0; q < g->nseg && m->brk[g->seg0 + q] <= k; q++) j = q;
        if (j >= 0) b += (double)g->bytes * v[col_n(m, h, j)];
    }
    for (int u = 0; u < m->nu; u++) {
        if (k <= m->u_end[u]) continue;
        for (int i = 0; i < m->u_nseg[u]; i++)
            if (m->ub[m->u_seg0[u] + i] >= k) {
                b += (double)m->u_bytes[u] * v[col_o(m, u, i)];
                break;
            }
    }
    return b;
}

static double objective(const ck_optimal_model *m, const double *v)
{
    double f = 0;
    for (int p = 0; p < m->nprod; p++) f += m->prod_flops[p] * v[col_r(m, p)];
    return f;
}

int ck_optimal_model_memory(const ck_optimal_model *m, const unsigned char *mark, int64_t *mem, double *flops)
{
    double *v = calloc((size_t)ncols(m) + 1, sizeof *v);
    if (!v) return -1;
    for (int h = 0; h < m->ng; h++) v[col_x(m, h)] = mark && mark[m->grp[h].root] ? 1 : 0;
    fill(m, v);
    for (int k = 0; k < m->P; k++) mem[k] = (int64_t)llround(memory_at(m, v, k));
    *flops = objective(m, v);
    free(v);
    return 0;
}

#ifdef CK_HAVE_CBC

/* ---- the solver */

typedef struct rowbuf {
    int n, cap;
    int *col;
    double *val;
} rowbuf;

static int row_put(rowbuf *r, int col, double val)
{
    if (r->n == r->cap) {
        const int cap = r->cap ? 2 * r->cap : 64;
        int *c = realloc(r->col, sizeof(int) * (size_t)cap);
        if (!c) return -1;
        r->col = c;
        double *v = realloc(r->val, sizeof(double) * (size_t)cap);
        if (!v) return -1;
        r->val = v;
        r->cap = cap;
    }
    r->col[r->n] = col, r->val[r->n++] = val;
    return 0;
}

/* the program as it is built: rows by triplets, loaded into CBC at once
 * (CBC's row-at-a-time interface copies the matrix on every row) */
typedef struct lp {
    int nrow, nz, cap, rcap;
    int *row, *col;
    double *val, *lo, *hi;
} lp;

static void lp_free(lp *L) { free(L->row), free(L->col), free(L->val), free(L->lo), free(L->hi); }

static int lp_row(lp *L, int n, const int *cols, const double *vals, char sense, double rhs)
{
    if (L->nz + n > L->cap) {
        const int cap = 2 * (L->nz + n) + 1024;
        int *rw = realloc(L->row, sizeof(int) * (size_t)cap);
        if (!rw) return -1;
        L->row = rw;
        int *cl = realloc(L->col, sizeof(int) * (size_t)cap);
        if (!cl) return -1;
        L->col = cl;
        double *vl = realloc(L->val, sizeof(double) * (size_t)cap);
        if (!vl) return -1;
        L->val = vl;
        L->cap = cap;
    }
    if (L->nrow == L->rcap) {
        const int cap = 2 * L->rcap + 1024;
        double *lo = realloc(L->lo, sizeof(double) * (size_t)cap);
        if (!lo) return -1;
        L->lo = lo;
        double *hi = realloc(L->hi, sizeof(double) * (size_t)cap);
        if (!hi) return -1;
        L->hi = hi;
        L->rcap = cap;
    }
    for (int j = 0; j < n; j++) L->row[L->nz] = L->nrow, L->col[L->nz] = cols[j], L->val[L->nz++] = vals[j];
    L->lo[L->nrow] = sense == 'L' ? -DBL_MAX : rhs;
    L->hi[L->nrow] = sense == 'G' ? DBL_MAX : rhs;
    L->nrow++;
    return 0;
}

/* L's rows by column, with m's columns: x binary, the others in [0, 1], R's FLOPs as the objective */
static Cbc_Model *lp_load(const ck_optimal_model *m, const lp *L)
{
    const int nc = ncols(m);
    CoinBigIndex *start = calloc((size_t)nc + 1, sizeof *start);
    int *index = malloc(sizeof(int) * (size_t)(L->nz ? L->nz : 1));
    double *value = malloc(sizeof(double) * (size_t)(L->nz ? L->nz : 1));
    double *lb = calloc((size_t)nc + 1, sizeof(double)), *ub = malloc(sizeof(double) * ((size_t)nc + 1));
    double *obj = calloc((size_t)nc + 1, sizeof(double));
    Cbc_Model *s = NULL;
    if (!start || !index || !value || !lb || !ub || !obj) goto out;
    for (int k = 0; k < L->nz; k++) start[L->col[k] + 1]++;
    for (int c = 0; c < nc; c++) start[c + 1] += start[c], ub[c] = 1;
    for (int k = 0; k < L->nz; k++) { /* placed by a second count, column by column in row order */
        const CoinBigIndex at = start[L->col[k]]++;
        index[at] = L->row[k], value[at] = L->val[k];
    }
    for (int c = nc; c > 0; c--) start[c] = start[c - 1];
    start[0] = 0;
    for (int p = 0; p < m->nprod; p++) obj[col_r(m, p)] = m->prod_flops[p] * m->scale;
    if (!(s = Cbc_newModel())) goto out;
    Cbc_loadProblem(s, nc, L->nrow, start, index, value, lb, ub, obj, L->lo, L->hi);
    for (int h = 0; h < m->ng; h++) Cbc_setInteger(s, col_x(m, h));
out:
    free(start), free(index), free(value), free(lb), free(ub), free(obj);
    return s;
}

/* the CBC model: columns, the structural rows, and the memory rows at the
 * positions chosen (their right-hand side: limit, bytes above the persistent ones) */
static Cbc_Model *build(const ck_optimal_model *m, const unsigned char *chosen, double limit, rowbuf *r)
{
    lp L = {0};
    lp *s = &L;
    int cols[CK_MAX_OUT + 8];
    double vals[CK_MAX_OUT + 8];
    for (int u = 0; u < m->nu; u++) /* O_u,i >= R_w - x_u - (w run by the segment's end) */
        for (int i = 0; i < m->u_nseg[u]; i++)
            for (int k = m->x_start[u]; k < m->x_start[u + 1]; k++) {
                const int w = m->x_w[k];
                int n = made_by(m, w, m->ub[m->u_seg0[u] + i], cols);
                for (int j = 0; j < n; j++) vals[j] = 1;
                cols[n] = col_o(m, u, i), vals[n++] = 1;
                cols[n] = col_r(m, w), vals[n++] = -1;
                if (m->u_grp[u] >= 0) cols[n] = col_x(m, m->u_grp[u]), vals[n++] = 1;
                if (lp_row(s, n, cols, vals, 'G', 0)) goto fail;
                /* the same, by what a marked u costs: w recomputed after the segment keeps u or recomputes it,
                 * R_p(u) + O_u,i + (w run by its end) >= R_w (the rows above alone let a half mark pay neither) */
                if (m->u_grp[u] >= 0) {
                    n--;
                    cols[n++] = col_r(m, m->grp[m->u_grp[u]].prod);
                    for (int j = 0; j < n; j++) vals[j] = 1;
                    vals[n - 2] = -1; /* R_w */
                    if (lp_row(s, n, cols, vals, 'G', 0)) goto fail;
                }
            }
    for (int k = 0; k < m->nd; k++) { /* R_p >= x_h: a view of h a later entry reads */
        const int c2[2] = {col_r(m, m->dr_p[k]), col_x(m, m->dr_h[k])};
        const double v2[2] = {1, -1};
        if (lp_row(s, 2, c2, v2, 'G', 0)) goto fail;
    }
    for (int k = 0; k < m->nrc; k++) { /* R_p >= R_w + x_h - 1: w recomputed reads p's view of h */
        const int c3[3] = {col_r(m, m->rc_p[k]), col_r(m, m->rc_w[k]), col_x(m, m->rc_h[k])};
        const double v3[3] = {1, -1, -1};
        if (c3[0] != c3[1]) if (lp_row(s, 3, c3, v3, 'G', -1)) goto fail;
    }
    for (int h = 0; h < m->ng; h++) {
        const grp *gh = &m->grp[h];
        for (int j = 0; j < gh->nseg; j++) {
            if (j) {
                const int cols[2] = {col_n(m, h, j), col_n(m, h, j - 1)};
                const double vals[2] = {1, -1};
                if (lp_row(s, 2, cols, vals, 'G', 0)) goto fail;
            }
            const int at = m->brk[gh->seg0 + j];
            { /* made by s_j only if marked, and only if a reader's buffer is made by then */
                const int c2[2] = {col_n(m, h, j), col_x(m, h)};
                const double v2[2] = {1, -1};
                if (lp_row(s, 2, c2, v2, 'L', 0)) goto fail;
                r->n = 0;
                if (row_put(r, col_n(m, h, j), 1)) goto fail;
                for (int k = 0; k < m->ne; k++) {
                    if (m->e[k].h != h) continue;
                    const int w = m->e[k].w;
                    for (int q = m->prod_g0[w]; q < m->prod_g0[w] + m->prod_gn[w]; q++)
                        if (row_put(r, next_at(m, m->prod_grp[q], at), -1)) goto fail;
                }
                if (lp_row(s, r->n, r->col, r->val, 'L', 0)) goto fail;
            }
            for (int k = 0; k < m->ne; k++) {
                if (m->e[k].h != h) continue;
                const int w = m->e[k].w;
                for (int q = m->prod_g0[w]; q < m->prod_g0[w] + m->prod_gn[w]; q++) {
                    const int col = value_at(m, m->prod_grp[q], at);
                    if (col < 0) continue;
                    const int cols[3] = {col_n(m, h, j), col, col_x(m, h)};
                    const double vals[3] = {1, -1, -1};
                    if (lp_row(s, 3, cols, vals, 'G', -1)) goto fail;
                }
            }
        }
    }
    for (int k = 0; k < m->P; k++) {
        if (!chosen[k]) continue;
        r->n = 0;
        for (int h = 0; h < m->ng; h++) {
            const grp *g = &m->grp[h];
            if (g->link || k <= g->e0 || k >= g->f) continue;
            if (row_put(r, col_x(m, h), -(double)g->bytes * MIB)) goto fail;
            int j = -1;
            for (int q = 0; q < g->nseg && m->brk[g->seg0 + q] <= k; q++) j = q;
            if (j >= 0 && row_put(r, col_n(m, h, j), (double)g->bytes * MIB)) goto fail;
        }
        for (int u = 0; u < m->nu; u++) {
            if (k <= m->u_end[u]) continue;
            for (int i = 0; i < m->u_nseg[u]; i++)
                if (m->ub[m->u_seg0[u] + i] >= k) {
                    if (row_put(r, col_o(m, u, i), (double)m->u_bytes[u] * MIB)) goto fail;
                    break;
                }
        }
        if (lp_row(s, r->n, r->col, r->val, 'L', (limit - (double)m->base[k]) * MIB)) goto fail;
    }
    Cbc_Model *cbc = lp_load(m, s);
    lp_free(s);
    return cbc;
fail:
    lp_free(s);
    return NULL;
}

/* the decision of column values v */
static void mark_of(const ck_optimal_model *m, const double *v, unsigned char *mark)
{
    memset(mark, 0, (size_t)m->nt);
    for (int t = 0; t < m->nt; t++)
        if (m->alias[t] >= 0 && v[col_x(m, m->alias[t])] > 0.5) mark[t] = 1;
}

static const double *polish_flops;
static int by_flops_desc(const void *a, const void *b)
{
    const double x = polish_flops[*(const int *)a], y = polish_flops[*(const int *)b];
    return (x < y) - (x > y);
}

/* The decision in best, its marks taken back one buffer at a time, the one
 * whose producer costs most first, while the placed peak still fits (the
 * model's memory is a lower bound, so a solved decision can keep slack).
 * try: scratch. 0, or -1 out of memory. */
static int polish(const ck_optimal_model *m, ck_evaluator *ev, size_t budget, double deadline, unsigned char *best,
                  unsigned char *try, double *flops, size_t *peak)
{
    int *order = malloc(sizeof(int) * (size_t)(m->ng ? m->ng : 1)), n = 0;
    double *cost = malloc(sizeof(double) * (size_t)(m->ng ? m->ng : 1));
    if (!order || !cost) {
        free(order), free(cost);
        return -1;
    }
    for (int h = 0; h < m->ng; h++) {
        cost[h] = m->prod_flops[m->grp[h].prod];
        if (best[m->grp[h].root]) order[n++] = h;
    }
    polish_flops = cost;
    qsort(order, (size_t)n, sizeof *order, by_flops_desc);
    int rc = 0;
    for (int i = 0; i < n && now() < deadline; i++) {
        memcpy(try, best, (size_t)m->nt);
        for (int t = 0; t < m->nt; t++)
            if (m->alias[t] == order[i]) try[t] = 0;
        size_t live, placed;
        double f, g;
        if (ck_evaluate(ev, try, 0, &live, &f)) {
            rc = -1;
            break;
        }
        if (live > budget || f >= *flops) continue;
        if (ck_evaluate(ev, try, 1, &placed, &g)) {
            rc = -1;
            break;
        }
        if (placed > budget) continue;
        memcpy(best, try, (size_t)m->nt);
        *flops = g, *peak = placed;
    }
    free(order), free(cost);
    return rc;
}

int ck_optimal_solve(const ck_decide_ctx *c, ck_evaluator *ev, size_t budget, double seconds, unsigned char *mark,
                     ck_optimal_result *res, char *err, size_t errlen)
{
    const double t0 = now(), deadline = t0 + 0.9 * seconds; /* the last tenth polishes */
    memset(res, 0, sizeof *res);
    ck_optimal_model *m = ck_optimal_model_new(c, ev, 1, err, errlen);
    if (!m) return -1;
    const int nt = c->g->nt, nc = ncols(m);
    unsigned char *best = calloc((size_t)nt, 1), *try = calloc((size_t)nt, 1), *chosen = calloc((size_t)m->P + 1, 1);
    double *v = calloc((size_t)nc + 1, sizeof *v), *load = malloc(sizeof(double) * (size_t)(m->P + 1));
    rowbuf rb = {0};
    int rc = -1, found = 0;
    double best_flops = INFINITY;
    size_t best_peak = 0;
    if (!best || !try || !chosen || !v || !load) goto oom;
    res->forward_flops = m->forward_flops;
    /* the budget search's answer: the start, and the answer if nothing beats it */
    size_t floor;
    const int sr = ck_policy_budget_search(c, ev, budget, try, &floor, err, errlen);
    if (sr < 0) goto out;
    if (sr == 1) {
        double f;
        if (ck_evaluate(ev, try, 1, &best_peak, &f)) goto oom;
        memcpy(best, try, (size_t)nt);
        best_flops = f;
        found = 1;
        res->from_search = 1;
    }
    /* the first memory rows: the most loaded positions under none, and an even spread */
    for (int k = 0; k < m->P; k++) load[k] = (double)m->base[k];
    for (int n = 0; n < FIRST_ROWS / 2 && m->P; n++) {
        int at = -1;
        for (int k = 0; k < m->P; k++)
            if (!chosen[k] && (at < 0 || load[k] > load[at])) at = k;
        if (at < 0) break;
        chosen[at] = 1;
    }
    for (int n = 0; n < FIRST_ROWS / 2 && m->P; n++) chosen[(long)n * (m->P - 1) / (FIRST_ROWS / 2 - 1)] = 1;
    double limit = (double)budget - (double)c->persistent;
    int tightened = 0;
    res->bound = 0;
    /* nothing to recompute: the search's decision (none) is optimal; no buffer to free: nothing to solve */
    if ((found && best_flops == 0) || m->ng == 0) limit = -1;
    for (; limit >= 0;) {
        const double left = deadline - now();
        if (left <= 0.2) break;
        Cbc_Model *s = build(m, chosen, limit, &rb);
        if (!s) goto oom;
        Cbc_setLogLevel(s, 0);
        /* a fifth kept back, so that a decision over the budget can be solved again */
        Cbc_setMaximumSeconds(s, res->solves ? left : left * 0.8);
        Cbc_setAllowableFractionGap(s, GAP);
        Cbc_setParameter(s, "threads", "1");
        Cbc_solve(s);
        res->solves++;
        const double *sol = Cbc_bestSolution(s);
        const int proven = Cbc_isProvenOptimal(s), infeasible = Cbc_isProvenInfeasible(s);
        if (!tightened) {
            const double b = infeasible ? INFINITY : Cbc_getBestPossibleObjValue(s) / m->scale;
            if (b > res->bound) res->bound = b;
        }
        if (!sol) {
            Cbc_deleteModel(s);
            break;
        }
        memcpy(v, sol, sizeof *v * (size_t)nc);
        /* the rows the answer breaks, the most broken first */
        int added = 0;
        for (int k = 0; k < m->P; k++) load[k] = chosen[k] ? -INFINITY : memory_at(m, v, k) - limit;
        while (added < ROWS_PER_SOLVE) {
            int at = -1;
            for (int k = 0; k < m->P; k++)
                if (load[k] > 64 && (at < 0 || load[k] > load[at])) at = k;
            if (at < 0) break;
            chosen[at] = 1;
            load[at] = -INFINITY;
            added++;
        }
        Cbc_deleteModel(s);
        if (added && now() < deadline) continue;
        /* the answer as the list has it: placed */
        mark_of(m, v, try);
        size_t peak;
        double f;
        if (ck_evaluate(ev, try, 1, &peak, &f)) goto oom;
        if (peak <= budget && f < best_flops) {
            memcpy(best, try, (size_t)nt);
            best_flops = f, best_peak = peak;
            found = 1;
            res->from_search = 0;
        }
        if (peak <= budget) {
            res->proven = proven && !tightened;
            break;
        }
        /* over the budget: the model's budget lowered by the excess */
        limit -= (double)(peak - budget);
        tightened = 1;
        if (limit <= 0) break;
    }
    /* what placement left over, given back: the decision's marks taken back while it fits */
    const double before = best_flops;
    if (found && polish(m, ev, budget, t0 + seconds, best, try, &best_flops, &best_peak)) goto oom;
    res->polished = best_flops < before;
    if (found && best_flops <= res->bound * (1 + 1e-9)) res->proven = 1;
    res->seconds = now() - t0;
    rc = found;
    if (found) {
        memcpy(mark, best, (size_t)nt);
        res->flops = best_flops;
        res->peak = best_peak;
        double f;
        size_t p;
        /* the plan reuses the placement of the decision placed last: the answer's */
        if (!ck_evaluator_placed(ev, best) && ck_evaluate(ev, best, 1, &p, &f)) goto oom;
    } else {
        res->peak = floor;
    }
    goto out;
oom:
    snprintf(err, errlen, "out of memory");
    rc = -1;
out:
    free(best), free(try), free(chosen), free(v), free(load), free(rb.col), free(rb.val);
    ck_optimal_model_free(m);
    return rc;
}

#else

int ck_optimal_solve(const ck_decide_ctx *c, ck_evaluator *ev, size_t budget, double seconds, unsigned char *mark,
                     ck_optimal_result *res, char *err, size_t errlen)
{
    (void)c, (void)ev, (void)budget, (void)seconds, (void)mark;
    memset(res, 0, sizeof *res);
    snprintf(err, errlen, "optimal: this ckrun was built without CBC (apt-get install coinor-libcbc-dev, then "
                          "build again)");
    return -1;
}

#endif

int ck_optimal_decide(const ck_decide_ctx *c, double bytes, double fraction, double seconds, unsigned char *recompute,
                      char *err, size_t errlen)
{
    ck_evaluator *own = c->ev ? NULL : ck_evaluator_new(c), *ev = c->ev ? c->ev : own;
    unsigned char *mark = calloc((size_t)(c->g->nt ? c->g->nt : 1), 1);
    size_t none = 0;
    double f;
    int rc = -1;
    if (!ev || !mark || (fraction > 0 && ck_evaluate(ev, NULL, 1, &none, &f))) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    const double room = fraction > 0 ? fraction * (double)none : bytes;
    if (c->report) c->report->budget = (size_t)room;
    const size_t budget = (double)c->cut < room ? (size_t)(room - (double)c->cut) : 0; /* ck_decide_ctx's cut */
    ck_optimal_result r;
    const double limit = seconds > 0 ? seconds : CK_OPTIMAL_SECONDS;
    const int found = ck_optimal_solve(c, ev, budget, limit, mark, &r, err, errlen);
    if (found < 0) goto out;
    if (!found) {
        snprintf(err, errlen, "optimal: nothing fits in %.1f MiB; the smallest peak ckrun can plan is %.1f MiB (%zu bytes)",
                 budget / 1048576.0, ceil(r.peak / 104857.6) / 10, r.peak);
        goto out;
    }
    for (int k = 0; k < c->ncand; k++) recompute[c->cand[k]] = mark[c->cand[k]];
    if (c->why && c->whylen) {
        const double fw = r.forward_flops > 0 ? 100.0 / r.forward_flops : 0;
        snprintf(c->why, c->whylen,
                 "optimal: recomputes %.2f%% of forward FLOPs %.6g, lower bound %.2f%%, %s%s%s; peak %zu of %zu bytes; "
                 "%d solves in %.1f s",
                 r.flops * fw, r.forward_flops, r.bound * fw, r.proven ? "proven" : "time limit",
                 r.from_search ? ", the budget search's decision" : ", the solver's decision",
                 r.polished ? " polished" : "",
                 r.peak, budget, r.solves, r.seconds);
    }
    rc = 0;
out:
    free(mark);
    ck_evaluator_free(own);
    return rc;
}
