/* Built-in checkpoint policies over one mechanism: a policy marks forward
 * activations for recompute; the evaluator (vm/plan/evaluate.c) tells what a
 * marking costs in bytes and FLOPs. Region policies (blocks,
 * every_n, sqrt_n) give forward nodes a region and recompute what a region
 * makes and only it reads, as torch.utils.checkpoint keeps a function's inputs
 * and recomputes its inside. budget searches markings for the least FLOPs that
 * fit: exhaustively when the candidates are few, otherwise from the fixed
 * policies and a greedy order, so it is never worse than any of them. */
#include "plan/policy.h"
#include "plan/evaluate.h"
#include "util/memory.h"
#include "util/text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the blocks diffusers' gradient checkpointing recomputes, in every family
 * ckrun knows: the UNet's ResnetBlock2D and BasicTransformerBlock, and the
 * Flux transformer's double and single blocks (a scope matches at most one) */
static const char *const diffusers_blocks[] = {
    "*.*.resnets.*",
    "mid_block.resnets.*",
    "*.*.attentions.*.transformer_blocks.*",
    "mid_block.attentions.*.transformer_blocks.*",
    "transformer_blocks.*",
    "single_transformer_blocks.*",
};
#define NDIFFUSERS ((int)(sizeof diffusers_blocks / sizeof diffusers_blocks[0]))

const char *ck_policy_block_of(const char *scope, char *buf, size_t len)
{
    buf[0] = 0;
    for (int k = 0; k < NDIFFUSERS; k++) {
        size_t m = ck_scope_match(diffusers_blocks[k], scope);
        if (m) {
            snprintf(buf, len, "%.*s", (int)m, scope);
            break;
        }
    }
    return buf;
}

void ck_policy_selective_default(unsigned char *ops)
{
    /* ops.def's cheap column */
    static const unsigned char cheap[] = {
#define CK_OP(E, id, lo, hi, nout, infer, grad, bwd, cheap, ...) [CK_OP_##E] = cheap,
#include "../../ops/ops.def"
    };
    _Static_assert(sizeof cheap == CK_OP_COUNT, "ops.def gives every op's cheap flag");
    memcpy(ops, cheap, CK_OP_COUNT);
}

/* ---- regions */

typedef struct regions {
    int *of_node;   /* per graph node: region id, 0 for none */
    char **names;   /* region instance names, index id - 1 */
    int n;
    size_t cap;
    int last;       /* the id found last (nodes of a block come together) */
} regions;

static void regions_free(regions *r)
{
    for (int i = 0; i < r->n; i++) free(r->names[i]);
    free(r->names);
    free(r->of_node);
    memset(r, 0, sizeof *r);
}

static int same_name(const char *a, const char *name, size_t len) { return strncmp(a, name, len) == 0 && !a[len]; }

static int region_id(regions *r, const char *name, size_t len)
{
    if (r->last && same_name(r->names[r->last - 1], name, len)) return r->last;
    for (int i = r->n - 1; i >= 0; i--)
        if (same_name(r->names[i], name, len)) return r->last = i + 1;
    if (ck_grow(&r->names, &r->cap, (size_t)r->n + 1, sizeof *r->names, 32)) return -1;
    r->names[r->n] = malloc(len + 1);
    if (!r->names[r->n]) return -1;
    memcpy(r->names[r->n], name, len);
    r->names[r->n][len] = 0;
    return r->last = ++r->n;
}

/* Regions of forward nodes: each distinct scope instance a pattern matches.
 * Fails when some pattern matches no forward node, or with any set when none
 * does (a list naming several families' blocks). */
static int match_regions(const ck_decide_ctx *c, const char *const *pats, int np, int any, regions *r, char *err,
                         size_t errlen)
{
    const ck_graph *g = c->g;
    memset(r, 0, sizeof *r);
    r->of_node = calloc((size_t)(g->nn ? g->nn : 1), sizeof(int));
    char *used = calloc((size_t)(np ? np : 1), 1);
    if (!r->of_node || !used) {
        free(used);
        regions_free(r);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < c->n; i++) {
        const ck_node *nd = &g->n[c->nodes[i]];
        if (nd->phase != CK_PHASE_FORWARD) continue;
        for (int k = 0; k < np; k++) {
            size_t m = ck_scope_match(pats[k], nd->scope);
            if (!m) continue;
            used[k] = 1;
            int id = region_id(r, nd->scope, m);
            if (id < 0) {
                free(used);
                regions_free(r);
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            r->of_node[c->nodes[i]] = id;
            break;
        }
    }
    int nused = 0;
    for (int k = 0; k < np; k++) nused += used[k];
    for (int k = 0; k < np; k++)
        if (!used[k] && (!any || !nused)) {
            snprintf(err, errlen, "blocks: pattern '%s' matches no scope of the model", pats[k]);
            free(used);
            regions_free(r);
            return -1;
        }
    free(used);
    return 0;
}

/* The block sequence: diffusers' blocks in forward order, or, for a model
 * without them, its top-level scopes. */
static int block_sequence(const ck_decide_ctx *c, regions *r, char *err, size_t errlen)
{
    const ck_graph *g = c->g;
    int any = 0;
    for (int i = 0; i < c->n && !any; i++) {
        char b[512];
        any = g->n[c->nodes[i]].phase == CK_PHASE_FORWARD && *ck_policy_block_of(g->n[c->nodes[i]].scope, b, sizeof b);
    }
    if (any) {
        memset(r, 0, sizeof *r);
        r->of_node = calloc((size_t)(g->nn ? g->nn : 1), sizeof(int));
        if (!r->of_node) goto oom;
        for (int i = 0; i < c->n; i++) {
            const ck_node *nd = &g->n[c->nodes[i]];
            char b[512];
            if (nd->phase != CK_PHASE_FORWARD || !*ck_policy_block_of(nd->scope, b, sizeof b)) continue;
            int id = region_id(r, b, strlen(b));
            if (id < 0) goto oom;
            r->of_node[c->nodes[i]] = id;
        }
        return 0;
    }
    static const char *const top[] = {"*"};
    if (match_regions(c, top, 1, 0, r, err, errlen) == 0) return 0;
    snprintf(err, errlen, "the model has no blocks (no scopes) to checkpoint");
    return -1;
oom:
    regions_free(r);
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* Marks each candidate made in a region and read by no forward node outside it. */
static void mark_regions(const ck_decide_ctx *c, const int *of_node, unsigned char *recompute)
{
    const ck_graph *g = c->g;
    for (int k = 0; k < c->ncand; k++) {
        int t = c->cand[k];
        recompute[t] = of_node[g->t[t].node] != 0;
    }
    for (int i = 0; i < c->n; i++) {
        const ck_node *nd = &g->n[c->nodes[i]];
        if (nd->phase != CK_PHASE_FORWARD) continue;
        for (int j = 0; j < nd->nin; j++) {
            int t = nd->in[j];
            if (recompute[t] && of_node[g->t[t].node] != of_node[c->nodes[i]]) recompute[t] = 0;
        }
    }
}

/* every_n's regions: those of the block sequence whose number n divides
 * (out may be seq) */
static void every_n_regions(const ck_graph *g, const int *seq, int n, int *out)
{
    for (int i = 0; i < g->nn; i++) out[i] = seq[i] % n == 0 ? seq[i] : 0;
}

static int decide_regions(const ck_policy *pol, const ck_decide_ctx *c, unsigned char *recompute, char *err,
                          size_t errlen)
{
    regions r;
    if (pol->kind == CK_POLICY_BLOCKS) {
        if (match_regions(c, pol->patterns, pol->npatterns, pol->any_pattern, &r, err, errlen)) return -1;
    } else {
        if (block_sequence(c, &r, err, errlen)) return -1;
        int m = r.n;
        if (pol->kind == CK_POLICY_EVERY_N) {
            every_n_regions(c->g, r.of_node, pol->n > 0 ? pol->n : 1, r.of_node);
        } else { /* sqrt_n: contiguous segments of ceil(sqrt(m)) blocks in forward order */
            int k = (int)ceil(sqrt((double)m)), seg = 0;
            for (int i = 0; i < c->n; i++) {
                int id = c->nodes[i];
                if (c->g->n[id].phase != CK_PHASE_FORWARD) continue;
                if (r.of_node[id]) seg = (r.of_node[id] - 1) / (k ? k : 1) + 1;
                r.of_node[id] = seg;
            }
        }
    }
    mark_regions(c, r.of_node, recompute);
    regions_free(&r);
    return 0;
}

/* Recomputes the outputs of the listed ops, but only where that holds nothing
 * new: each input must be a leaf, kept for backward anyway, or itself
 * recomputed. (Recomputing x + y where neither x nor y is otherwise kept would
 * hold both to save one.) Candidates come in graph order, inputs first. */
static int decide_selective(const unsigned char *ops, const ck_decide_ctx *c, unsigned char *recompute)
{
    const ck_graph *g = c->g;
    unsigned char *kept = calloc((size_t)(g->nt ? g->nt : 1), 1);
    if (!kept) return -1;
    for (int i = 0; i < c->n; i++) {
        const ck_node *nd = &g->n[c->nodes[i]];
        if (nd->phase == CK_PHASE_FORWARD) continue;
        for (int j = 0; j < nd->nin; j++) kept[nd->in[j]] = 1;
    }
    for (int k = 0; k < c->ncand; k++) {
        int t = c->cand[k];
        const ck_node *nd = &g->n[g->t[t].node];
        int ok = ops[nd->op];
        for (int j = 0; ok && j < nd->nin; j++) {
            int u = nd->in[j];
            ok = g->t[u].kind != CK_KIND_ACT || recompute[u] || kept[u];
        }
        recompute[t] = (unsigned char)ok;
    }
    free(kept);
    return 0;
}

ck_policy ck_policy_diffusers(void)
{
    return (ck_policy){.kind = CK_POLICY_BLOCKS, .patterns = diffusers_blocks, .npatterns = NDIFFUSERS,
                       .any_pattern = 1};
}

int ck_policy_fixed(const ck_policy *pol, const ck_decide_ctx *c, unsigned char *recompute, char *err, size_t errlen)
{
    switch (pol->kind) {
    case CK_POLICY_NONE: return 0;
    case CK_POLICY_BLOCKS:
    case CK_POLICY_EVERY_N:
    case CK_POLICY_SQRT_N: return decide_regions(pol, c, recompute, err, errlen);
    case CK_POLICY_SELECTIVE:
        if (decide_selective(pol->ops, c, recompute)) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        return 0;
    default: break;
    }
    snprintf(err, errlen, "policy kind %d is not a fixed policy", (int)pol->kind);
    return -1;
}

/* ---- budget
 *
 * The search, for the least recompute FLOPs whose placed peak fits:
 *  - starting decisions: every fixed policy (none, diffusers, selective,
 *    sqrt_n, every_n for every n up to the block count) and prefixes of a
 *    greedy order (the most bytes per recompute FLOP first): the shortest
 *    whose live peak fits, and longer ones;
 *  - in order of their FLOPs, the first start that fits when placed is
 *    pruned: the marked tensors that cost the most to recompute are kept,
 *    one at a time, while the live peak plus the start's fragmentation fits
 *    (a start's placed peak less its live peak; once a start has missed, or
 *    is taken to, the least any placement showed, none's included);
 *  - all the prunings placed, or failing that the longest run of them that
 *    fits;
 *  - exchanges from that answer: kept tensors whose marking lowers the live
 *    peak marked where that lets recomputations that cost more be kept
 *    (exchange()).
 * Decisions are judged first on the bytes that cross the turn to backward
 * (a lower bound found without walking the list), then on live peaks (one
 * walk, ck_evaluate), and only a decision that can be the answer is placed. */

typedef struct best {
    unsigned char *mark; /* per graph tensor */
    size_t peak;
    double flops;
    int found;
    size_t floor;        /* the smallest exact peak seen */
} best;

/* Evaluates a marking exactly and keeps it if it fits with fewer FLOPs (at
 * equal FLOPs, a lower peak). 1 if it fits, 0 if not, -1 on error. Where
 * bounded, the placement stops once it passes the budget (a miss then has
 * no exact peak: *placed is only above the budget, and the floor is not
 * lowered). */
static int consider_under(const ck_decide_ctx *c, ck_evaluator *ev, const unsigned char *mark, size_t budget, best *b,
                          size_t *placed, int bounded)
{
    size_t peak;
    double flops;
    if ((bounded ? ck_evaluate_under(ev, mark, budget, &peak, &flops) : ck_evaluate(ev, mark, 1, &peak, &flops)))
        return -1;
    if (placed) *placed = peak;
    if (bounded && peak > budget) return 0;
    if (!b->floor || peak < b->floor) b->floor = peak;
    if (peak > budget) return 0;
    if (!b->found || flops < b->flops || (flops == b->flops && peak < b->peak)) {
        memcpy(b->mark, mark, (size_t)c->g->nt);
        b->peak = peak;
        b->flops = flops;
        b->found = 1;
    }
    return 1;
}

static int consider(const ck_decide_ctx *c, ck_evaluator *ev, const unsigned char *mark, size_t budget, best *b)
{
    return consider_under(c, ev, mark, budget, b, NULL, 0);
}

typedef struct scored {
    int t;
    double score;
} scored;

static int by_score(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->t - y->t;
}

#define EXHAUSTIVE_MAX 14
#define PRUNE_TRIALS 128
#define PRUNE_WORK 32

/* FLOPs to recompute t once from its inputs */
static double producer_flops(const ck_graph *g, int t)
{
    const ck_node *nd = &g->n[g->t[t].node];
    ck_shape ins[CK_MAX_IN], out = g->t[t].shape;
    for (int j = 0; j < nd->nin; j++) ins[j] = g->t[nd->in[j]].shape;
    return ck_op_flops(nd->op, &nd->p, ins, nd->nin, &out);
}

/* The marked candidates into order, the costliest to recompute first; their count. */
static int marked_by_cost(const ck_decide_ctx *c, const unsigned char *mark, scored *order)
{
    int n = 0;
    for (int k = 0; k < c->ncand; k++)
        if (mark[c->cand[k]]) order[n++] = (scored){c->cand[k], producer_flops(c->g, c->cand[k])};
    if (n > 1) qsort(order, (size_t)n, sizeof *order, by_score);
    return n;
}

/* A starting decision: a fixed policy's marking of the candidates (every_n
 * by its n over the regions' candidates), or a prefix of the greedy order;
 * its FLOPs and turn bound, and its live peak once walked. */
typedef struct start {
    unsigned char *cand; /* per candidate, or NULL */
    int every_n;         /* > 0: every_n's n (cand NULL) */
    int prefix;          /* >= 0: the greedy order's first prefix entries (cand NULL, every_n 0) */
    double flops;
    size_t turn, live;
    int walked;
} start;

typedef struct starts {
    start *s;
    int n;
    int *region;    /* per candidate: the block region every_n's region marking marks it for, 0 none */
    scored *order;  /* the greedy order */
} starts;

static void starts_free(starts *ss)
{
    for (int i = 0; i < ss->n; i++) free(ss->s[i].cand);
    free(ss->s);
    free(ss->region);
    free(ss->order);
    memset(ss, 0, sizeof *ss);
}

static void start_mark(const ck_decide_ctx *c, const starts *ss, const start *s, unsigned char *mark)
{
    memset(mark, 0, (size_t)c->g->nt);
    if (s->cand)
        for (int k = 0; k < c->ncand; k++) mark[c->cand[k]] = s->cand[k];
    else if (s->every_n)
        for (int k = 0; k < c->ncand; k++) mark[c->cand[k]] = ss->region[k] && ss->region[k] % s->every_n == 0;
    else
        for (int k = 0; k < s->prefix; k++) mark[ss->order[k].t] = 1;
}

static start *add_start(starts *ss)
{
    start *grown = realloc(ss->s, sizeof *grown * (size_t)(ss->n + 1));
    if (!grown) return NULL;
    ss->s = grown;
    start *s = &grown[ss->n++];
    memset(s, 0, sizeof *s);
    s->prefix = -1;
    return s;
}

/* its live peak (and exact FLOPs), walked once */
static int walk_start(const ck_decide_ctx *c, ck_evaluator *ev, const starts *ss, start *s, unsigned char *mark)
{
    if (s->walked) return 0;
    start_mark(c, ss, s, mark);
    if (ck_evaluate(ev, mark, 0, &s->live, &s->flops)) return -1;
    s->walked = 1;
    return 0;
}

/* The fixed policies' markings: none, diffusers, sqrt_n and selective
 * walked; every_n for every n up to the length of the block sequence
 * (beyond it every_n is none) from the regions: a block's candidates are
 * recomputed from inside it alone, so every_n's FLOPs are the sum of its
 * blocks' (taken from one walk of every_n:1), and its marking is the
 * candidates of the blocks whose number n divides (the turns of all of them
 * from one pass over the turn's buffers). A policy the model has
 * nothing for (no diffusers blocks) is left out. */
static int fixed_starts(const ck_decide_ctx *c, ck_evaluator *ev, starts *ss)
{
    const ck_graph *g = c->g;
    const ck_policy fixed[] = {
        {.kind = CK_POLICY_NONE},
        ck_policy_diffusers(),
        {.kind = CK_POLICY_SQRT_N},
        {.kind = CK_POLICY_SELECTIVE},
    };
    unsigned char *mark = calloc((size_t)g->nt, 1);
    int *nodes = malloc(sizeof(int) * (size_t)(g->nn ? g->nn : 1));
    double *flops = NULL;
    size_t *turns = NULL;
    int *region = NULL;
    regions seq = {0};
    char ignore[256];
    int rc = -1;
    ss->region = calloc((size_t)(c->ncand ? c->ncand : 1), sizeof(int));
    if (!mark || !nodes || !ss->region) goto out;
    for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++) {
        ck_policy pol = fixed[f];
        if (pol.kind == CK_POLICY_SELECTIVE) ck_policy_selective_default(pol.ops);
        memset(mark, 0, (size_t)g->nt);
        if (ck_policy_fixed(&pol, c, mark, ignore, sizeof ignore)) continue;
        start *s = add_start(ss);
        if (!s || !(s->cand = malloc((size_t)(c->ncand ? c->ncand : 1)))) goto out;
        for (int k = 0; k < c->ncand; k++) s->cand[k] = mark[c->cand[k]];
        s->turn = ck_evaluate_turn(ev, mark);
        if (walk_start(c, ev, ss, s, mark)) goto out;
    }
    if (block_sequence(c, &seq, ignore, sizeof ignore) == 0 && seq.n > 0) {
        memset(mark, 0, (size_t)g->nt);
        mark_regions(c, seq.of_node, mark);
        for (int k = 0; k < c->ncand; k++)
            ss->region[k] = mark[c->cand[k]] ? seq.of_node[g->t[c->cand[k]].node] : 0;
        size_t live;
        double all;
        flops = calloc((size_t)seq.n + 1, sizeof *flops);
        turns = malloc(sizeof *turns * ((size_t)seq.n + 1));
        region = calloc((size_t)g->nt, sizeof *region); /* per tensor */
        if (!flops || !turns || !region || ck_evaluate(ev, mark, 0, &live, &all)) goto out;
        for (int k = 0; k < c->ncand; k++) region[c->cand[k]] = ss->region[k];
        if (ck_evaluate_turn_multiples(ev, region, seq.n, turns)) goto out;
        const int nrec = ck_evaluator_recomputed(ev, nodes);
        for (int i = 0; i < nrec; i++) flops[seq.of_node[nodes[i]]] += ck_evaluator_flops(ev, nodes[i]);
        for (int n = 1; n <= seq.n; n++) {
            start *s = add_start(ss);
            if (!s) goto out;
            s->every_n = n;
            for (int r = n; r <= seq.n; r += n) s->flops += flops[r];
            s->turn = turns[n];
            if (n == 1) {
                s->live = live;
                s->flops = all;
                s->walked = 1;
            }
        }
    }
    rc = 0;
out:
    regions_free(&seq);
    free(turns);
    free(region);
    free(flops);
    free(nodes);
    free(mark);
    return rc;
}

static int by_flops(const void *a, const void *b)
{
    const start *x = a, *y = b;
    if (x->flops != y->flops) return x->flops < y->flops ? -1 : 1;
    return x->turn < y->turn ? -1 : x->turn > y->turn;
}

static int by_turn(const void *a, const void *b)
{
    const start *x = a, *y = b;
    if (x->turn != y->turn) return x->turn < y->turn ? -1 : 1;
    return x->flops < y->flops ? -1 : x->flops > y->flops;
}

/* Keeps marked tensor t on the tracked list when its live peak plus frag
 * still fits the budget (refused unmade where the tracker's floor for it is
 * over): 1 kept, 0 refused (the list as it was), -1 out of memory. */
static int try_keep(ck_tracker *tr, int t, size_t frag, size_t budget)
{
    if (ck_tracker_unmark_floor(tr, t) + frag > budget) return 0;
    if (ck_tracker_flip(tr, t)) return -1;
    if (ck_tracker_peak(tr) + frag <= budget) return 1;
    return ck_tracker_flip(tr, t) ? -1 : 0;
}

/* The changes made to a start, in order, in steps (a repair, a pruning, an
 * exchange): the tensors each step flipped are flips[ends[k - 1] .. ends[k] - 1]. */
typedef struct steps {
    int *flips, *ends;
    int nflips, n;
    size_t cflips, cends;
} steps;

static int step_add(steps *L, const int *t, int n)
{
    if (ck_grow(&L->flips, &L->cflips, (size_t)(L->nflips + n), sizeof *L->flips, 16) ||
        ck_grow(&L->ends, &L->cends, (size_t)L->n + 1, sizeof *L->ends, 16))
        return -1;
    memcpy(L->flips + L->nflips, t, sizeof *t * (size_t)n);
    L->nflips += n;
    L->ends[L->n++] = L->nflips;
    return 0;
}

/* from with its first k steps made */
static void steps_apply(const ck_decide_ctx *c, const steps *L, const unsigned char *from, int k, unsigned char *mark)
{
    memcpy(mark, from, (size_t)c->g->nt);
    for (int i = 0; i < (k ? L->ends[k - 1] : 0); i++) mark[L->flips[i]] ^= 1;
}

/* The kept candidate not yet tried whose marking the tracker estimates to
 * lower the bytes at the live peak the most per FLOP of its recomputation;
 * -1 when none lowers them. *scans counts the candidates looked at. */
static int kept_at_peak(const ck_decide_ctx *c, ck_tracker *tr, const unsigned char *mark,
                        const unsigned char *tried, long *scans)
{
    int u = -1;
    double most = -1;
    for (int k = 0; k < c->ncand; k++) {
        const int t = c->cand[k];
        if (mark[t] || tried[t]) continue;
        ++*scans;
        const int64_t gain = ck_tracker_mark_gain(tr, t);
        if (gain <= 0) continue;
        const double per = (double)gain / (producer_flops(c->g, t) + 1.0);
        if (per > most) {
            most = per;
            u = t;
        }
    }
    return u;
}

#define SWAP_FAILS 16
#define SWAP_MARKS 16
#define SWAP_ROOM 50
#define SWAP_WORK 32
#define SWAP_PASS 24
#define SWAP_ROUNDS 3
/* One pass of exchanges on the tracked list of mark: kept candidates live at
 * the live peak (those that lower it the most per FLOP first; up to
 * SWAP_MARKS, until the peak is 1/SWAP_ROOM of the budget under it, the
 * estimate made again after each) are marked, which may lower the peak
 * enough for recomputations to be taken back (costliest first, refused
 * unmade by the tracker's floor, kept while the live peak plus frag fits).
 * An exchange stays (a step of L) when the decision then recomputes fewer
 * FLOPs, else it is undone. The pass stops after SWAP_FAILS exchanges in a
 * row that did not pay, when no candidate is left to try, or once its
 * changes and the candidates it looked at have spent *work or SWAP_PASS per
 * entry of the list (what is left of *work stays in it). -1 out of memory. */
static int exchange(const ck_decide_ctx *c, ck_tracker *tr, unsigned char *mark, size_t budget, size_t frag,
                    scored *order, unsigned char *tried, int *taken, steps *L, long *work)
{
    const int n = marked_by_cost(c, mark, order);
    int marked_now[SWAP_MARKS];
    memset(tried, 0, (size_t)c->g->nt);
    const long w0 = ck_tracker_work(tr);
    long scans = 0;
    const long cap = *work < SWAP_PASS * (long)c->n ? *work : SWAP_PASS * (long)c->n;
#define SPENT (ck_tracker_work(tr) - w0 + scans)
    for (int fails = 0; fails < SWAP_FAILS && SPENT < cap;) {
        const double before = ck_tracker_flops(tr);
        int nu = 0, nt = 0;
        do {
            const int u = kept_at_peak(c, tr, mark, tried, &scans);
            if (u < 0) break;
            tried[u] = 1;
            if (ck_tracker_flip(tr, u)) return -1;
            mark[u] = 1;
            marked_now[nu++] = u;
        } while (nu < SWAP_MARKS && ck_tracker_peak(tr) + frag + budget / SWAP_ROOM > budget);
        if (!nu) break;
        /* taken back: the recomputations the pass started with, not those just marked */
        for (int k = 0; k < n && SPENT < cap; k++) {
            const int v = order[k].t;
            if (!mark[v] || tried[v]) continue;
            scans++;
            const int kept = try_keep(tr, v, frag, budget);
            if (kept < 0) return -1;
            if (kept) {
                mark[v] = 0;
                taken[nt++] = v;
            }
        }
        if (nt && ck_tracker_flops(tr) < before) {
            memcpy(taken + nt, marked_now, sizeof *taken * (size_t)nu);
            if (step_add(L, taken, nt + nu)) return -1;
            fails = 0;
            continue;
        }
        while (nt--) { /* undone */
            if (ck_tracker_flip(tr, taken[nt])) return -1;
            mark[taken[nt]] = 1;
        }
        while (nu--) {
            if (ck_tracker_flip(tr, marked_now[nu])) return -1;
            mark[marked_now[nu]] = 0;
        }
        fails++;
    }
    *work -= SPENT;
#undef SPENT
    return 0;
}

/* Where what all the steps of L made of from (which fits) did not fit once
 * placed (frag: the fragmentation it showed, or more), the longest run of
 * the steps whose live peak plus frag fits is placed, and then the longest
 * run that fits is searched between by placements (the more steps, the
 * fewer FLOPs). -1 on error. */
static int settle(const ck_decide_ctx *c, ck_evaluator *ev, const unsigned char *from, size_t budget, size_t frag,
                  const steps *L, best *b, unsigned char *mark)
{
    size_t live;
    double flops;
    int fit, lo = 0, hi = L->n; /* a run of lo fits, of hi not (once placed) */
    int a = 0, z = L->n;        /* a run whose live peak fits with frag, by walks */
    while (a < z - 1) {
        const int mid = a + (z - a) / 2;
        steps_apply(c, L, from, mid, mark);
        if (ck_evaluate(ev, mark, 0, &live, &flops)) return -1;
        if (live + frag <= budget) a = mid;
        else z = mid;
    }
    if (a > 0) {
        steps_apply(c, L, from, a, mark);
        if ((fit = consider(c, ev, mark, budget, b)) < 0) return -1;
        if (fit) lo = a;
        else hi = a;
    }
    while (lo < hi - 1) {
        const int mid = lo + (hi - lo) / 2;
        steps_apply(c, L, from, mid, mark);
        if ((fit = consider(c, ev, mark, budget, b)) < 0) return -1;
        if (fit) lo = mid;
        else hi = mid;
    }
    return 0;
}

/* From a start (placed and found to fit when fits; frag: its placed peak
 * less its live peak, or an estimate), on its list tracked: its
 * recomputations are taken back, the costliest first, each judged on the
 * tracked list (refused unmade when the tracker's floor for it is over the
 * budget), while the changes have moved fewer than PRUNE_WORK entries and
 * ranges per entry of the list; then exchanges, again while a pass pays
 * (SWAP_ROUNDS passes, SWAP_WORK changes and looks per entry in all). Where
 * the list cannot be tracked, the costliest PRUNE_TRIALS recomputations are
 * tried, each judged by a walk, and there are no exchanges. What it ends
 * with is placed once. Its fragmentation is not the start's: where it
 * misses, the whole is done again from the start with the fragmentation it
 * showed and the bytes it missed by as a margin (where that finds nothing
 * better, the longest run of its steps that fits is placed, settle());
 * where it fits with more than 1/SETTLE_ROOM of the budget to spare, again
 * with the fragmentation it showed; SETTLE_TRIES deep. A start not placed
 * is placed where nothing was changed, and before the runs of steps are
 * settled (from it: nothing where it does not fit). -1 on error. */
#define SETTLE_TRIES 2
#define SETTLE_ROOM 4096
static int descend(const ck_decide_ctx *c, ck_evaluator *ev, const unsigned char *from, int fits, size_t budget,
                   size_t frag, best *b, unsigned char *mark, scored *order, int depth)
{
    const ck_graph *g = c->g;
    memcpy(mark, from, (size_t)g->nt);
    steps L = {0};
    int rc = -1;
    unsigned char *tried = calloc((size_t)g->nt, 1);
    int *taken = malloc(sizeof(int) * (size_t)(c->ncand + SWAP_MARKS + 1));
    /* not held beside the tracker: the start's placement and a walk's scratch */
    ck_tracker *tr = tried && taken ? ck_tracker_new(ev) : NULL;
    if (!tried || !taken) goto out;
    if (tr) {
        ck_evaluator_forget(ev, 0);
        ck_evaluator_rest(ev);
        if (ck_tracker_reset(tr, mark)) goto out;
    }
    const int n = marked_by_cost(c, mark, order);
    const long w0 = tr ? ck_tracker_work(tr) : 0;
    for (int k = 0; k < n && (tr ? ck_tracker_work(tr) - w0 < PRUNE_WORK * (long)c->n : k < PRUNE_TRIALS); k++) {
        int kept;
        if (tr) {
            if ((kept = try_keep(tr, order[k].t, frag, budget)) < 0) goto out;
        } else {
            size_t live;
            double flops;
            mark[order[k].t] = 0;
            if (ck_evaluate(ev, mark, 0, &live, &flops)) goto out;
            kept = live + frag <= budget;
        }
        mark[order[k].t] = (unsigned char)!kept;
        if (kept && step_add(&L, &order[k].t, 1)) goto out;
    }
    long work = SWAP_WORK * (long)c->n;
    for (int round = 0; tr && round < SWAP_ROUNDS && work > 0; round++) {
        const double was = ck_tracker_flops(tr);
        if (exchange(c, tr, mark, budget, frag, order, tried, taken, &L, &work)) goto out;
        if (ck_tracker_flops(tr) >= was) break;
    }
    ck_tracker_free(tr); /* not held while the placements below are made */
    tr = NULL;
    rc = 0;
    if (!L.n) {
        if (!fits) rc = consider(c, ev, from, budget, b) < 0 ? -1 : 0;
        goto out;
    }
    size_t peak, live;
    double flops;
    steps_apply(c, &L, from, L.n, mark);
    int fit = consider_under(c, ev, mark, budget, b, &peak, 0);
    if (fit < 0 || ck_evaluate(ev, mark, 0, &live, &flops)) {
        rc = -1;
    } else if (fit) {
        if (depth < SETTLE_TRIES && budget - peak > budget / SETTLE_ROOM)
            rc = descend(c, ev, from, fits, budget, peak - live, b, mark, order, depth + 1);
    } else {
        const double was = b->found ? b->flops : HUGE_VAL;
        const size_t shown = peak - live > frag ? peak - live : frag;
        if (depth < SETTLE_TRIES)
            rc = descend(c, ev, from, fits, budget, shown + (peak - budget), b, mark, order, depth + 1);
        const int better = b->found && b->flops < was;
        if (!rc && !better && !fits) /* settling needs a start that fits */
            rc = (fits = consider(c, ev, from, budget, b)) < 0 ? -1 : 0;
        if (!rc && !better && fits) rc = settle(c, ev, from, budget, shown, &L, b, mark);
    }
out:
    ck_tracker_free(tr);
    free(tried);
    free(taken);
    free(L.flips);
    free(L.ends);
    return rc;
}

static int search(const ck_decide_ctx *c, ck_evaluator *ev, size_t budget, best *b, char *err, size_t errlen)
{
    const ck_graph *g = c->g;
    unsigned char *mark = calloc((size_t)g->nt, 1), *from = calloc((size_t)g->nt, 1);
    scored *order = malloc(sizeof *order * (size_t)(c->ncand ? c->ncand : 1));
    starts ss = {0};
    int rc = -1;
    if (!mark || !from || !order) goto out;
    if (c->ncand <= EXHAUSTIVE_MAX) {
        for (long s = 0; s < (1L << c->ncand); s++) {
            for (int k = 0; k < c->ncand; k++) mark[c->cand[k]] = (unsigned char)((s >> k) & 1);
            if (consider(c, ev, mark, budget, b) < 0) goto out;
        }
        rc = 0;
        goto out;
    }
    if (fixed_starts(c, ev, &ss)) goto out;
    /* the greedy order, and the shortest prefix whose live peak fits */
    ss.order = malloc(sizeof *ss.order * (size_t)c->ncand);
    if (!ss.order) goto out;
    for (int k = 0; k < c->ncand; k++) {
        const int t = c->cand[k];
        ss.order[k] = (scored){t, (double)ck_shape_numel(&g->t[t].shape) / (producer_flops(g, t) + 1.0)};
    }
    if (c->ncand > 1) qsort(ss.order, (size_t)c->ncand, sizeof *ss.order, by_score);
    int lo = 0, hi = c->ncand;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        start p = {.prefix = mid};
        if (walk_start(c, ev, &ss, &p, mark)) goto out;
        if (p.live <= budget) hi = mid;
        else lo = mid + 1;
    }
    /* that prefix and longer ones, in case it does not fit when placed */
    for (int k = lo, step = 1 + c->ncand / 256;; k += step, step *= 2) {
        if (k > c->ncand) k = c->ncand;
        start *p = add_start(&ss);
        if (!p) goto out;
        p->prefix = k;
        if (walk_start(c, ev, &ss, p, mark)) goto out;
        p->turn = p->live;
        if (k == c->ncand) break;
    }
    if (ss.n > 1) qsort(ss.s, (size_t)ss.n, sizeof *ss.s, by_flops);
    /* the first start whose live peak fits is placed, unless it is a greedy
     * prefix (the shortest that fits sits at the budget by its making) whose
     * live peak plus the least fragmentation a placement has shown (none's,
     * where the budget is a share of it) passes the budget: that one is taken
     * to miss unplaced (a fixed policy's start is always placed: the answer
     * recomputes no more than any that fits). Once one has missed, the next
     * whose live peak fits with that least fragmentation is descended from
     * without being placed (a start that does not is placed, as it may fit
     * all the same). A start whose live peak fits with that least
     * fragmentation to spare is placed only until it passes the budget: where
     * it misses, its fragmentation is more than the least and is not needed
     * (the smallest peak for the error where nothing fits is found below) */
    size_t shown = SIZE_MAX;
    for (int i = 0; i < ss.n && !b->found; i++) {
        start *s = &ss.s[i];
        if (s->turn > budget) continue;
        if (walk_start(c, ev, &ss, s, mark)) goto out;
        if (s->live > budget) continue;
        start_mark(c, &ss, s, from);
        if (shown != SIZE_MAX && s->live + shown <= budget) {
            if (descend(c, ev, from, 0, budget, shown, b, mark, order, 0)) goto out;
            continue;
        }
        const size_t least = ck_evaluator_least_frag(ev);
        if (s->prefix >= 0 && least != SIZE_MAX && s->live + least > budget) {
            shown = least;
            continue;
        }
        size_t peak;
        const int fit = consider_under(c, ev, from, budget, b, &peak, least != SIZE_MAX && s->live + least <= budget);
        if (fit < 0 || (fit && descend(c, ev, from, 1, budget, peak - s->live, b, mark, order, 0))) goto out;
        if (!fit) shown = ck_evaluator_least_frag(ev);
    }
    /* nothing fits: the error names the smallest peak, so place every start
     * in order of its lower bounds while one may be below it */
    if (!b->found) {
        if (ss.n > 1) qsort(ss.s, (size_t)ss.n, sizeof *ss.s, by_turn);
        for (int i = 0; i < ss.n && (!b->floor || ss.s[i].turn < b->floor); i++) {
            if (walk_start(c, ev, &ss, &ss.s[i], mark)) goto out;
            if (b->floor && ss.s[i].live >= b->floor) continue;
            start_mark(c, &ss, &ss.s[i], mark);
            if (consider(c, ev, mark, budget, b) < 0) goto out;
        }
    }
    rc = 0;
out:
    if (rc) snprintf(err, errlen, "out of memory");
    starts_free(&ss);
    free(mark);
    free(from);
    free(order);
    return rc;
}

int ck_policy_budget_search(const ck_decide_ctx *c, ck_evaluator *ev, size_t budget, unsigned char *mark,
                            size_t *floor, char *err, size_t errlen)
{
    best b = {calloc((size_t)c->g->nt, 1), 0, 0, 0, 0};
    if (!b.mark) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const int rc = search(c, ev, budget, &b, err, errlen);
    if (rc == 0 && b.found) memcpy(mark, b.mark, (size_t)c->g->nt);
    *floor = b.floor;
    free(b.mark);
    return rc < 0 ? -1 : b.found;
}
