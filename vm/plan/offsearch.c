/* The joint search: keep, recompute or offload for every saved activation,
 * for the least predicted step time whose placed peak fits a budget.
 *
 * A decision (R recomputed, O offloaded) is judged without building its
 * list: the evaluator (vm/plan/evaluate.c) walks R's list; an offloaded
 * buffer's range is then cut where ck_offload_schedule cuts it (held to its
 * copy out's wait, back from its copy back's start), which gives the live
 * peak of the list with its transfers; and the compute and copy streams are
 * simulated over the same positions, as ck_plan_step_time simulates the
 * list (vm/plan/cost.c). Only the fastest candidates are scheduled and
 * placed, to check them against the budget exactly; then the fixed choices
 * that may fit and win are placed too, so that none of them beats the pick.
 * No decision is faster than keeping everything (the same entries, no
 * recompute, no copies): a candidate that fast ends the search's moves. */
#include "plan/evaluate_int.h"
#include "plan/offload.h"
#include "plan/policy.h"

#include "util/memory.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOVES 64   /* recompute-less moves tried from each start */
#define POOL 8      /* candidates kept for the exact check */

typedef struct cand {
    unsigned char *mark; /* per graph tensor: 0, 1, CK_OFFLOAD */
    double time;
    size_t live;
    const char *from;
} cand;

typedef struct osearch {
    const ck_decide_ctx *c;
    ck_evaluator *e;
    const ck_device_speed *dev;
    size_t budget, frag;
    int d;
    double *tnode;       /* per graph node: its entry's seconds */
    unsigned char *ok;   /* per graph tensor: a root ck_offload_schedule would move (if read later) */
    unsigned char *off;  /* per graph tensor: offloaded now */
    int *fl;             /* per graph tensor: its first later position under the last walk */
    int *list, nlist;    /* the offloaded roots, rising */
    int *head, *nxt;     /* per position and kind: the offloaded roots anchored there */
    double *done;        /* per offloaded root: its copy's end */
    int64_t *delta;
    cand pool[POOL];
    int npool;
    int evals;
    double floor_time; /* none's predicted time: no decision is faster (0: not known yet) */
} osearch;

static int marked(const osearch *s, const unsigned char *R, int t) { return R[t] == 1 && s->e->markable[t]; }

/* the first later position of every root in ok, under the walk just made */
static void first_later(osearch *s, const unsigned char *R)
{
    ck_evaluator *e = s->e;
    for (int k = 0; k < s->nlist; k++) s->fl[s->list[k]] = -1;
    for (int i = e->pos0; i < e->pos; i++) {
        const ck_pnode *nd = &e->nodes[e->at[i]];
        for (int j = 0; j < nd->nin; j++) {
            const int u = nd->in[j];
            if (marked(s, R, u)) continue;
            const int b = e->root[u];
            if (b < e->nt && s->off[b] && s->fl[b] < 0) s->fl[b] = i;
        }
    }
}

enum { K_IN, K_WIN, K_OUT, K_WOUT, KINDS };

/* Judges decision (R, s->list offloaded): its live peak and predicted time.
 * Offloaded roots no later entry reads stay (as ck_offload_schedule leaves
 * them). 0, or -1 out of memory. */
static int judge(osearch *s, const unsigned char *R, size_t *live, double *time)
{
    ck_evaluator *e = s->e;
    size_t lp;
    double fl;
    if (ck_evaluate(e, R, 0, &lp, &fl)) return -1;
    s->evals++;
    first_later(s, R);
    const int pos = e->pos, pos0 = e->pos0, d = s->d;
    /* the live bytes, with each moved buffer's range cut at the turn */
    memset(s->delta, 0, sizeof *s->delta * (size_t)(pos + 1));
    for (int id = 0; id < e->ids; id++) {
        if (e->first[id] < 0 || (id < e->nt && e->persistent[id])) continue;
        const int64_t b = e->bytes[id < e->nt ? id : e->origin[id]];
        if (id < e->nt && s->off[id] && s->fl[id] >= 0) {
            const int z1 = e->last0[id] + d < pos0 - 1 ? e->last0[id] + d : pos0 - 1;
            const int a2 = s->fl[id] - d > pos0 ? s->fl[id] - d : pos0;
            s->delta[e->first[id]] += b;
            s->delta[z1 + 1] -= b;
            s->delta[a2] += b;
            s->delta[e->last[id] + 1] -= b;
        } else {
            s->delta[e->first[id]] += b;
            s->delta[e->last[id] + 1] -= b;
        }
    }
    int64_t now = 0, most = 0;
    for (int i = 0; i < pos; i++) {
        now += s->delta[i];
        const int64_t here = now + (int64_t)e->ws[e->at[i]];
        if (here > most) most = here;
    }
    *live = s->c->persistent + (size_t)most;
    /* the two streams over the same positions, transfers where the list has them */
    for (int q = 0; q < KINDS * pos; q++) s->head[q] = -1;
    for (int k = s->nlist - 1; k >= 0; k--) { /* pushed in reverse: each anchor's roots rise */
        const int b = s->list[k];
        if (s->fl[b] < 0) continue;
        const int at[KINDS] = {s->fl[b] - d > pos0 ? s->fl[b] - d : pos0, s->fl[b], e->last0[b],
                               e->last0[b] + d < pos0 - 1 ? e->last0[b] + d : pos0 - 1};
        for (int q = 0; q < KINDS; q++) {
            s->nxt[KINDS * k + q] = s->head[KINDS * at[q] + q];
            s->head[KINDS * at[q] + q] = k;
        }
    }
    double tc = 0, tx = 0;
    for (int i = 0; i < pos; i++) {
        for (int k = s->head[KINDS * i + K_IN]; k >= 0; k = s->nxt[KINDS * k + K_IN]) {
            tx = (tx > tc ? tx : tc) + ck_cost_copy_seconds((size_t)e->bytes[s->list[k]], s->dev);
            s->done[k] = tx;
        }
        for (int k = s->head[KINDS * i + K_WIN]; k >= 0; k = s->nxt[KINDS * k + K_WIN])
            if (s->done[k] > tc) tc = s->done[k];
        tc += s->tnode[e->at[i]];
        for (int k = s->head[KINDS * i + K_OUT]; k >= 0; k = s->nxt[KINDS * k + K_OUT]) {
            tx = (tx > tc ? tx : tc) + ck_cost_copy_seconds((size_t)e->bytes[s->list[k]], s->dev);
            s->done[k] = tx;
        }
        for (int k = s->head[KINDS * i + K_WOUT]; k >= 0; k = s->nxt[KINDS * k + K_WOUT])
            if (s->done[k] > tc) tc = s->done[k];
    }
    *time = tc > tx ? tc : tx;
    return 0;
}

/* s->list from s->off (rising root ids) */
static void relist(osearch *s)
{
    s->nlist = 0;
    for (int t = 0; t < s->e->nt; t++)
        if (s->off[t]) s->list[s->nlist++] = t;
}

static void set_offload(osearch *s, const unsigned char *mark)
{
    for (int t = 0; t < s->e->nt; t++) s->off[t] = mark[t] == CK_OFFLOAD && s->ok[s->e->root0[t]];
    for (int t = 0; t < s->e->nt; t++)
        if (s->off[t] && s->e->root0[t] != t) {
            s->off[s->e->root0[t]] = 1; /* an alias marked moves its buffer */
            s->off[t] = 0;
        }
    relist(s);
}

/* decision mark's live peak and time (mark: 0, 1, CK_OFFLOAD) */
static int judge_mark(osearch *s, const unsigned char *mark, unsigned char *R, size_t *live, double *time)
{
    for (int t = 0; t < s->e->nt; t++) R[t] = mark[t] == 1;
    set_offload(s, mark);
    return judge(s, R, live, time);
}

/* keeps mark among the POOL fastest that fit the budget less the fragmentation */
static int offer(osearch *s, const unsigned char *mark, size_t live, double time, const char *from)
{
    if (live + s->frag > s->budget) return 0;
    int at = s->npool;
    for (int k = 0; k < s->npool; k++)
        if (!memcmp(s->pool[k].mark, mark, (size_t)s->e->nt)) return 0; /* one decision reached twice */
    if (s->npool == POOL) {
        at = POOL - 1;
        if (s->pool[at].time <= time) return 0;
    } else {
        if (!(s->pool[at].mark = malloc((size_t)s->e->nt))) return -1;
        s->npool++;
    }
    memcpy(s->pool[at].mark, mark, (size_t)s->e->nt);
    s->pool[at].time = time;
    s->pool[at].live = live;
    s->pool[at].from = from;
    for (; at > 0 && s->pool[at - 1].time > s->pool[at].time; at--) {
        const cand x = s->pool[at - 1];
        s->pool[at - 1] = s->pool[at];
        s->pool[at] = x;
    }
    return 0;
}

typedef struct keyed {
    int t;
    double key;
} keyed;

static int by_key(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->t - y->t;
}

/* the roots that decision R keeps and a later entry reads: what offload can move */
static int crossing(osearch *s, const unsigned char *R, keyed *out, int by_bytes)
{
    memcpy(s->off, s->ok, (size_t)s->e->nt);
    relist(s);
    size_t live;
    double time;
    if (judge(s, R, &live, &time)) return -1;
    int n = 0;
    for (int k = 0; k < s->nlist; k++) {
        const int b = s->list[k];
        if (s->fl[b] < 0 || marked(s, R, b)) continue;
        /* earliest made first (the most compute to hide its copies behind), or the largest first */
        out[n++] = (keyed){b, by_bytes ? -(double)s->e->bytes[b] : (double)s->e->last0[b]};
    }
    qsort(out, (size_t)n, sizeof *out, by_key);
    return n;
}

/* mark: R with the first k of order offloaded */
static void with_run(const osearch *s, const unsigned char *R, const keyed *order, int k, unsigned char *mark)
{
    for (int t = 0; t < s->e->nt; t++) mark[t] = R[t] == 1;
    for (int j = 0; j < k; j++) mark[order[j].t] = CK_OFFLOAD;
}

/* From R: the shortest run of the buffers it keeps across the turn (in one
 * order) whose offload fits, and the whole run, offered; -1 on error */
static int offload_run(osearch *s, const unsigned char *R, unsigned char *mark, keyed *order, int by_bytes,
                       const char *from)
{
    const int n = crossing(s, R, order, by_bytes);
    unsigned char *Rc = malloc((size_t)s->e->nt);
    int rc = -1;
    size_t live;
    double time;
    if (n < 0 || !Rc) goto out;
    with_run(s, R, order, n, mark);
    if (judge_mark(s, mark, Rc, &live, &time)) goto out;
    if (live + s->frag <= s->budget) {
        /* the whole run too: when copies hide behind compute it is as fast, and further under */
        if (offer(s, mark, live, time, from)) goto out;
        int lo = 0, hi = n; /* a run of hi fits */
        while (lo < hi) {
            const int mid = lo + (hi - lo) / 2;
            with_run(s, R, order, mid, mark);
            if (judge_mark(s, mark, Rc, &live, &time)) goto out;
            if (live + s->frag <= s->budget) hi = mid;
            else lo = mid + 1;
        }
        with_run(s, R, order, hi, mark);
        if (judge_mark(s, mark, Rc, &live, &time) || offer(s, mark, live, time, from)) goto out;
    }
    rc = 0;
out:
    free(Rc);
    return rc;
}

/* From a decision that fits: recompute less, the costliest recompute
 * first, each either kept or kept and offloaded, whichever is faster and
 * still fits; moves that do not lower the predicted time are undone. */
static int improve(osearch *s, unsigned char *mark, const char *from)
{
    const int nt = s->e->nt;
    unsigned char *R = malloc((size_t)nt);
    keyed *order = malloc(sizeof *order * (size_t)(nt ? nt : 1));
    int rc = -1, n = 0;
    if (!R || !order) goto out;
    size_t live;
    double time;
    if (judge_mark(s, mark, R, &live, &time)) goto out;
    if (live + s->frag > s->budget) {
        rc = 0;
        goto out;
    }
    /* a candidate as fast as keeping everything is there already: nothing to gain */
    if (s->floor_time > 0 && s->npool && s->pool[0].time <= s->floor_time) {
        rc = offer(s, mark, live, time, from);
        goto out;
    }
    for (int t = 0; t < nt; t++)
        if (mark[t] == 1 && s->e->markable[t]) order[n++] = (keyed){t, -s->tnode[s->c->g->t[t].node]};
    qsort(order, (size_t)n, sizeof *order, by_key);
    for (int k = 0; k < n && k < MOVES && !(s->floor_time > 0 && time <= s->floor_time); k++) {
        const int t = order[k].t;
        size_t l1 = 0, l2 = 0;
        double t1 = INFINITY, t2 = INFINITY;
        mark[t] = 0;
        if (judge_mark(s, mark, R, &l1, &t1)) goto out;
        const int b = s->e->root0[t];
        const unsigned char was = mark[b];
        int can_move = b < nt && s->ok[b];
        if (can_move) {
            mark[t] = CK_OFFLOAD;
            if (b != t) mark[b] = mark[b] == 1 ? 1 : CK_OFFLOAD;
            if (judge_mark(s, mark, R, &l2, &t2)) goto out;
        }
        const int fit1 = l1 + s->frag <= s->budget, fit2 = can_move && l2 + s->frag <= s->budget;
        if (fit1 && t1 <= time && (!fit2 || t1 <= t2)) {
            mark[t] = 0;
            if (b != t) mark[b] = was;
            time = t1, live = l1;
        } else if (fit2 && t2 < time) {
            time = t2, live = l2;
        } else {
            mark[t] = 1;
            if (b != t) mark[b] = was;
        }
    }
    rc = offer(s, mark, live, time, from);
out:
    free(R);
    free(order);
    return rc;
}

/* the exact peak of decision mark (its list scheduled, its transfers placed)
 * and the list's predicted step (ck_plan_step_time) */
static int exact(const osearch *s, const unsigned char *mark, size_t *peak, double *time)
{
    const ck_decide_ctx *c = s->c;
    unsigned char *R = malloc((size_t)c->g->nt);
    ck_plan pl;
    if (!R) return -1;
    for (int t = 0; t < c->g->nt; t++) R[t] = mark[t] == 1;
    int rc = -1;
    if (ck_schedule(&pl, c->g, c->nodes, c->n, R) == 0) {
        if (ck_offload_schedule(&pl, c->g, mark, c->retain, s->d) >= 0 &&
            ck_plan_memory(&pl, c->g, c->poff, c->persistent, c->retain, c->be) == 0) {
            ck_step_time st;
            ck_plan_step_time(&pl, c->g, s->dev, &st);
            *peak = pl.peak;
            *time = st.step;
            rc = 0;
        }
        ck_plan_free(&pl);
    }
    free(R);
    return rc;
}

/* the starts offered for a budget (with the fragmentation s->frag assumed) */
static int starts(osearch *s, const unsigned char *budget_answer, int have_answer, unsigned char *mark, keyed *order)
{
    const ck_decide_ctx *c = s->c;
    const int nt = c->g->nt;
    unsigned char *R = calloc((size_t)nt, 1);
    if (!R) return -1;
    int rc = -1;
    size_t live;
    double time;
    /* none, and offload alone in two orders */
    memset(mark, 0, (size_t)nt);
    if (judge_mark(s, mark, R, &live, &time) || offer(s, mark, live, time, "none")) goto out;
    s->floor_time = time;
    memset(R, 0, (size_t)nt);
    if (offload_run(s, R, mark, order, 0, "offload alone, earliest made first") ||
        offload_run(s, R, mark, order, 1, "offload alone, largest first"))
        goto out;
    /* the budget search's answer, as it is and improved */
    if (have_answer) {
        memcpy(mark, budget_answer, (size_t)nt);
        if (judge_mark(s, mark, R, &live, &time) || offer(s, mark, live, time, "recompute (the budget search)") ||
            improve(s, mark, "recompute, then less of it with offload"))
            goto out;
    }
    /* the fixed policies, alone and with what they keep offloaded, improved */
    const ck_policy fixed[] = {
        ck_policy_diffusers(),
        {.kind = CK_POLICY_SQRT_N},
        {.kind = CK_POLICY_SELECTIVE},
    };
    static const char *const names[] = {"diffusers", "sqrt_n", "selective"};
    static const char *const run[] = {"diffusers, then the shortest run of what it keeps offloaded that fits",
                                      "sqrt_n, then the shortest run of what it keeps offloaded that fits",
                                      "selective, then the shortest run of what it keeps offloaded that fits"};
    static const char *const less[] = {"diffusers, then less recompute with offload",
                                       "sqrt_n, then less recompute with offload",
                                       "selective, then less recompute with offload"};
    ck_decide_ctx plain = *c;
    plain.offload = 0;
    for (size_t f = 0; f < sizeof fixed / sizeof *fixed; f++) {
        ck_policy pol = fixed[f];
        char ignore[256];
        if (pol.kind == CK_POLICY_SELECTIVE) ck_policy_selective_default(pol.ops);
        memset(R, 0, (size_t)nt);
        if (ck_policy_fixed(&pol, &plain, R, ignore, sizeof ignore)) continue;
        memcpy(mark, R, (size_t)nt);
        if (judge_mark(s, mark, R, &live, &time) || offer(s, mark, live, time, names[f])) goto out;
        if (offload_run(s, R, mark, order, 0, run[f]) || improve(s, mark, less[f])) goto out;
    }
    rc = 0;
out:
    free(R);
    return rc;
}

static void osearch_free(osearch *s)
{
    for (int k = 0; k < s->npool; k++) free(s->pool[k].mark);
    s->npool = 0;
    free(s->tnode), free(s->ok), free(s->off), free(s->fl), free(s->list), free(s->head), free(s->nxt);
    free(s->done), free(s->delta);
}

/* 0, or -1 out of memory */
static int osearch_init(osearch *s, const ck_decide_ctx *c, ck_evaluator *ev, size_t budget)
{
    const ck_graph *g = c->g;
    const int nt = g->nt, maxpos = ev->maxpos;
    memset(s, 0, sizeof *s);
    s->c = c;
    s->e = ev;
    s->budget = budget;
    s->d = c->prefetch > 0 ? c->prefetch : CK_PREFETCH_DEFAULT;
    s->dev = c->speed ? c->speed : ck_cost_device_find("H100");
    s->tnode = malloc(sizeof *s->tnode * (size_t)(g->nn ? g->nn : 1));
    s->ok = calloc((size_t)nt, 1);
    s->off = calloc((size_t)nt, 1);
    s->fl = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
    s->list = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
    s->head = malloc(sizeof(int) * (size_t)KINDS * (size_t)(maxpos + 1));
    s->nxt = malloc(sizeof(int) * (size_t)KINDS * (size_t)(nt ? nt : 1));
    s->done = malloc(sizeof(double) * (size_t)(nt ? nt : 1));
    s->delta = malloc(sizeof *s->delta * (size_t)(maxpos + 2));
    if (!s->tnode || !s->ok || !s->off || !s->fl || !s->list || !s->head || !s->nxt || !s->done || !s->delta) {
        osearch_free(s);
        return -1;
    }
    for (int i = 0; i < c->n; i++)
        s->tnode[c->nodes[i]] = ck_cost_node_seconds(g, c->nodes[i], ev->flops[c->nodes[i]], s->dev);
    /* the buffers ck_offload_schedule can move: forward activations' roots, not retained */
    for (int k = 0; k < c->ncand; k++) {
        const int b = ev->root0[c->cand[k]];
        if (b < nt && !ev->persistent[b] && ev->markable[b] && ev->last0[b] >= 0) s->ok[b] = 1;
    }
    for (int t = 0; c->retain && t < nt; t++)
        if (c->retain[t]) s->ok[ev->root0[t]] = 0;
    return 0;
}

int ck_offload_judge(const ck_decide_ctx *c, ck_evaluator *ev, const unsigned char *mark, size_t *live, double *time)
{
    if (ev->fallback || ev->released) return -1;
    osearch s;
    if (osearch_init(&s, c, ev, 0)) return -1;
    unsigned char *R = malloc((size_t)(c->g->nt ? c->g->nt : 1));
    const int rc = R ? judge_mark(&s, mark, R, live, time) : -1;
    free(R);
    osearch_free(&s);
    return rc;
}

/* The fixed choices placed exactly, each as it is and with every buffer it
 * keeps across the turn offloaded: none, diffusers' blocks, sqrt_n,
 * every_n:1-3, selective, and the budget search's answer (answer, if
 * have). The fastest whose peak fits the budget goes to g (g->mark NULL:
 * none fits), its peak to *gpeak; *least gets the smallest peak of those
 * placed. With a bound (the search's pick's time; 0: none), a choice whose
 * judged live peak is over the budget or whose judged time is not under
 * the bound is not placed; with a bound below 0, only the choices with all
 * they keep offloaded are placed (for *least alone). What the search chose is held against g, so no fixed choice beats
 * it at the budget, and g is what a budget the search's starts miss gets.
 * 0, or -1 out of memory. */
static int fixed_choices(osearch *s, const unsigned char *answer, int have, unsigned char *mark, keyed *order,
                         double bound, cand *g, size_t *gpeak, size_t *least)
{
    const ck_decide_ctx *c = s->c;
    const int nt = c->g->nt;
    unsigned char *R = calloc((size_t)nt, 1), *Rj = malloc((size_t)(nt ? nt : 1));
    if (!R || !Rj) {
        free(R), free(Rj);
        return -1;
    }
    static const char *const names[] = {"none", "diffusers", "sqrt_n", "every_n:1", "every_n:2", "every_n:3",
                                        "selective", "recompute (the budget search)"};
    static const char *const offloaded[] = {"none, all kept offloaded", "diffusers, all it keeps offloaded",
                                            "sqrt_n, all it keeps offloaded", "every_n:1, all it keeps offloaded",
                                            "every_n:2, all it keeps offloaded", "every_n:3, all it keeps offloaded",
                                            "selective, all it keeps offloaded",
                                            "recompute (the budget search), all it keeps offloaded"};
    const ck_policy fixed[] = {
        {.kind = CK_POLICY_NONE},
        ck_policy_diffusers(),
        {.kind = CK_POLICY_SQRT_N},
        {.kind = CK_POLICY_EVERY_N, .n = 1},
        {.kind = CK_POLICY_EVERY_N, .n = 2},
        {.kind = CK_POLICY_EVERY_N, .n = 3},
        {.kind = CK_POLICY_SELECTIVE},
    };
    const int nfixed = (int)(sizeof fixed / sizeof *fixed);
    ck_decide_ctx plain = *c;
    plain.offload = 0;
    plain.why = NULL;
    *least = 0;
    int rc = -1;
    for (int f = 0; f <= nfixed; f++) {
        memset(R, 0, (size_t)nt);
        if (f == nfixed) {
            if (!have) continue;
            for (int t = 0; t < nt; t++) R[t] = answer[t] == 1;
        } else {
            ck_policy pol = fixed[f];
            char ignore[256];
            if (pol.kind == CK_POLICY_SELECTIVE) ck_policy_selective_default(pol.ops);
            if (ck_policy_fixed(&pol, &plain, R, ignore, sizeof ignore)) continue; /* e.g. no block matches */
        }
        const int n = crossing(s, R, order, 0);
        if (n < 0) goto out;
        for (int v = bound < 0; v < 2; v++) {
            size_t peak;
            double time;
            with_run(s, R, order, v ? n : 0, mark);
            if (bound > 0) { /* judged first: placed only if it may fit and win (the judgement is the list's) */
                size_t live;
                if (judge_mark(s, mark, Rj, &live, &time)) goto out;
                if (live > s->budget || time >= bound || (g->mark && time >= g->time)) {
                    if (!n) break;
                    continue;
                }
            }
            if (exact(s, mark, &peak, &time)) goto out;
            if (!*least || peak < *least) *least = peak;
            if (peak <= s->budget && (!g->mark || time < g->time)) {
                if (!g->mark && !(g->mark = malloc((size_t)nt))) goto out;
                memcpy(g->mark, mark, (size_t)nt);
                g->time = time;
                g->from = v ? offloaded[f] : names[f];
                *gpeak = peak;
            }
            if (!n) break;
        }
    }
    rc = 0;
out:
    free(R), free(Rj);
    return rc;
}

size_t ck_offload_floor(const ck_decide_ctx *c, ck_evaluator *ev)
{
    if (ev->fallback || ev->released) return 0;
    osearch s;
    const int nt = c->g->nt;
    unsigned char *mark = calloc((size_t)(nt ? nt : 1), 1);
    keyed *order = malloc(sizeof *order * (size_t)(nt ? nt : 1));
    cand fx = {NULL, 0, 0, NULL};
    size_t gpeak = 0, least = 0;
    if (mark && order && !osearch_init(&s, c, ev, 0)) {
        if (fixed_choices(&s, NULL, 0, mark, order, -1, &fx, &gpeak, &least)) least = 0;
        osearch_free(&s);
    }
    free(fx.mark), free(mark), free(order);
    return least;
}

int ck_offload_decide(const ck_decide_ctx *c, ck_evaluator *ev, size_t budget, unsigned char *out, const char *what,
                      char *err, size_t errlen)
{
    const ck_graph *g = c->g;
    const int nt = g->nt;
    osearch s;
    memset(&s, 0, sizeof s);
    unsigned char *answer = calloc((size_t)nt, 1), *mark = calloc((size_t)nt, 1);
    keyed *order = malloc(sizeof *order * (size_t)(nt ? nt : 1));
    int rc = -1, have = 0;
    size_t floor_r = 0, floor_o = 0;
    if (!answer || !mark || !order) goto oom;
    /* the recompute answer first: the search starts from it, and a plan at least as fast */
    have = ck_policy_budget_search(c, ev, budget, answer, &floor_r, err, errlen);
    if (have < 0) goto out;
    if (ev->fallback || ev->released) { /* lists whose optimizer entries move: recompute alone */
        if (!have) goto none_fits;
        for (int k = 0; k < c->ncand; k++) out[c->cand[k]] = answer[c->cand[k]];
        if (c->why)
            snprintf(c->why, c->whylen, "%s: recompute only (fused updates move optimizer entries: offload is not "
                     "searched)", what);
        rc = 0;
        goto out;
    }
    if (osearch_init(&s, c, ev, budget)) goto oom;
    /* the starts under an assumed fragmentation, the fastest placed; when
     * none fits placed, the fragmentation they showed is assumed, and again */
    size_t best_peak = 0;
    double w_time = 0;
    int found = -1;
    for (int round = 0; round < 3 && found < 0; round++) {
        for (int k = 0; k < s.npool; k++) free(s.pool[k].mark);
        s.npool = 0;
        if (starts(&s, answer, have, mark, order)) goto oom;
        for (int k = 0; k < s.npool && found < 0; k++) {
            size_t peak;
            double time; /* the placed list's, for the pick (what the fixed choices must beat) */
            if (exact(&s, s.pool[k].mark, &peak, &time)) goto oom;
            if (!floor_o || peak < floor_o) floor_o = peak;
            if (peak <= budget) {
                found = k;
                best_peak = peak;
                w_time = time;
            } else if (peak - s.pool[k].live > s.frag) {
                s.frag = peak - s.pool[k].live;
            }
        }
        if (!s.npool) break;
    }
    /* the fixed choices placed: the fastest of them when it beats the
     * search's pick (or the search found nothing that fits placed) */
    cand fx = {NULL, 0, 0, NULL};
    size_t fx_peak = 0, least = 0;
    if (fixed_choices(&s, answer, have, mark, order, found >= 0 ? w_time : 0, &fx, &fx_peak, &least)) {
        free(fx.mark);
        goto oom;
    }
    if (least && (!floor_o || least < floor_o)) floor_o = least;
    if (fx.mark && (found < 0 || fx.time < w_time)) {
        for (int k = 0; k < s.npool; k++) free(s.pool[k].mark);
        s.npool = 1;
        s.pool[0] = fx;
        found = 0;
        best_peak = fx_peak;
        w_time = fx.time;
    } else {
        free(fx.mark);
    }
    if (found < 0) goto none_fits;
    {
        const cand *w = &s.pool[found];
        int nrec = 0, noff = 0;
        size_t moved = 0;
        for (int k = 0; k < c->ncand; k++) out[c->cand[k]] = w->mark[c->cand[k]];
        for (int t = 0; t < nt; t++) nrec += w->mark[t] == 1 && ev->markable[t];
        set_offload(&s, w->mark);
        for (int k = 0; k < s.nlist; k++) moved += (size_t)ev->bytes[s.list[k]];
        noff = s.nlist;
        double t_rec = 0;
        if (have) { /* the recompute answer's time: what offload bought */
            unsigned char *R = calloc((size_t)nt, 1);
            size_t live;
            if (!R || judge_mark(&s, answer, R, &live, &t_rec)) {
                free(R);
                goto oom;
            }
            free(R);
        }
        char against[96] = "";
        if (have) snprintf(against, sizeof against, " (recompute alone: %.4g s)", t_rec);
        if (c->why)
            snprintf(c->why, c->whylen, "%s: %s; %d recomputed, %d offloaded (%.1f MiB each way); peak %.1f of %.1f "
                     "MiB; predicted step %.4g s on %s%s; %d decisions judged",
                     what, w->from, nrec, noff, moved / 1048576.0, best_peak / 1048576.0, budget / 1048576.0, w_time,
                     s.dev->name, against, s.evals);
    }
    rc = 0;
    goto out;
none_fits:
    if (!floor_o || floor_o > floor_r) floor_o = floor_r;
    if (c->report) {
        c->report->floor = floor_o;
        c->report->floor_without = floor_r;
    }
    snprintf(err, errlen, "%s: nothing fits in %.1f MiB; the smallest peak ckrun can plan is %.1f MiB (%zu bytes) with "
             "offload, %.1f MiB (%zu bytes) without",
             what, budget / 1048576.0, ceil(floor_o / 104857.6) / 10, floor_o, ceil(floor_r / 104857.6) / 10, floor_r);
    rc = -1;
    goto out;
oom:
    snprintf(err, errlen, "out of memory");
out:
    osearch_free(&s);
    free(answer), free(mark), free(order);
    return rc;
}
