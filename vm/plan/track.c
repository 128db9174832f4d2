/* One decision's op list kept live under changes, for searches that try
 * thousands of one-tensor changes: marking or unmarking a tensor changes
 * the list only around the recomputations that depend on it, so the live
 * peak is kept up to date from those changes alone, not from a walk of the
 * whole list (vm/plan/evaluate.c).
 *
 * The list is the scheduler's (vm/plan/schedule.c): forward entries, then
 * each later entry after the recomputations it needs, depth first in slot
 * order. Those recomputations form a forest: each recompute entry is the
 * child of the entry whose input slot first needed it, and the list is the
 * forest in post order. Flipping tensor t of node p can change only the
 * recompute entries of p and of the nodes p recomputes through marked
 * inputs (A); everything else keeps its place. So a flip takes A's entries
 * out, changes what t's readers read, and puts A's entries back where the
 * scheduler would, in the order it would reach them.
 *
 * The list is a treap in list order whose nodes hold each entry's live
 * bytes (range additions, lazily, and the subtree's most); a buffer adds
 * its bytes over its entries from first to last. A buffer is a root of
 * aliases (a reshape's output is its input's buffer); its range is its
 * aliases' forward uses, the later entries touching them, and the end for a
 * retained one. */
#include "plan/evaluate_int.h"

#include "util/memory.h"

#include <stdlib.h>
#include <string.h>

#define NONE (-1)
#define FLOOR (-((int64_t)1 << 62))

/* Lists of ints by key, in one pool: head per key, then each node's value
 * and the next node (NONE ends); nodes taken out go to a free list. */
typedef struct lists {
    int *head, *val, *next;
    int n, cap, free;
} lists;

static int lists_push(lists *L, int key, int x)
{
    int k = L->free;
    if (k != NONE) {
        L->free = L->next[k];
    } else {
        if (L->n == L->cap) {
            const int cap = L->cap ? 2 * L->cap : 1024;
            int *v = ck_big_realloc(L->val, sizeof(int) * (size_t)cap), *nx = v ? ck_big_realloc(L->next, sizeof(int) * (size_t)cap) : NULL;
            if (v) L->val = v;
            if (!v || !nx) return -1;
            L->next = nx;
            L->cap = cap;
        }
        k = L->n++;
    }
    L->val[k] = x;
    L->next[k] = L->head[key];
    L->head[key] = k;
    return 0;
}

static void lists_drop(lists *L, int key, int x) /* one occurrence */
{
    for (int *at = &L->head[key]; *at != NONE; at = &L->next[*at])
        if (L->val[*at] == x) {
            const int k = *at;
            *at = L->next[k];
            L->next[k] = L->free;
            L->free = k;
            return;
        }
}

static void lists_clear(lists *L, int keys)
{
    for (int i = 0; i < keys; i++) L->head[i] = NONE;
    L->n = 0;
    L->free = NONE;
}

static void lists_free(lists *L)
{
    ck_big_free(L->head);
    ck_big_free(L->val);
    ck_big_free(L->next);
}

typedef struct tnode {
    int l, r;
    uint64_t key;          /* the entry's place in the list */
    int64_t val, mx, lazy; /* lazy: applied to val and mx here, not yet to the children */
} tnode;

/* a reader of a graph tensor in the list: node and input slot, packed */
#define READER(node, slot) ((node) * CK_MAX_IN + (slot))
#define READER_NODE(r) ((r) / CK_MAX_IN)
#define READER_SLOT(r) ((r) % CK_MAX_IN)

typedef struct event {
    int anchor, slot, target, x; /* x: the entry the recomputations go before */
    uint64_t key;
    int depth;
} event;

struct ck_tracker {
    ck_evaluator *e;
    const ck_decide_ctx *c;
    const ck_graph *g;
    int nt, nf, nb, nent, end;
    int *fwd, *bwd;            /* list order: forward nodes, later nodes */
    int *fi, *bi;              /* per graph node: index among forward / later nodes, NONE */
    int *cbase;                /* per forward index: its copies' first id above nt */
    int nids;
    unsigned char *mark;       /* per graph tensor: marked and markable */
    /* the readers of each graph tensor among the list's nodes (CSR) */
    int *rstart;
    int *readers;
    /* the list: a treap by place (keys spread out, SPACING apart when laid
     * out, a new entry taking the middle of its gap), and a linked list */
    tnode *t;
    int root, head, *prev, *next;
    int64_t *ends;             /* per entry: bytes of buffers whose last entry it is */
    /* forest, per entry (later and recompute entries) */
    int (*child)[CK_MAX_IN];   /* per later and recompute entry (CHILD) */
    int *parent, *pslot;       /* per recompute entry (PARENT, PSLOT) */
    int (*rin)[CK_MAX_IN];     /* per forward index: the ids its recompute entry reads (RIN) */
    unsigned char *io;         /* per forward index: its node's input count, and bit 3 + o set where output o is a tensor */
    unsigned char *in_r;       /* per forward index: its recompute entry is in the list */
    double rflops;
    long work;                 /* entries moved and ranges changed since reset */
    int peak_at;               /* the entry of the live peak, NONE: not yet found since the last change */
    /* ids and buffers */
    int *alias;                /* per id: the id whose buffer it is (a reshape's input), NONE */
    lists kids;                /* per id: the ids aliasing it */
    lists touch;               /* per changeable id: the later and recompute entries touching it */
    /* per id: 1 when a flip can change its buffer's range: a forward
     * activation, a copy, or what a reshape makes of one (the others' ranges
     * are laid once; their touches are not kept) */
    unsigned char *changes;
    int *rf, *rl;              /* per root id: its range's first and last entry, NONE */
    /* the roots whose range a flip changed and has not yet applied: taking
     * an entry out applies at once (no range may end at an entry that is
     * gone), putting one in waits for the flip's end, so a root applies
     * once however many of its aliases the flip touched */
    int *dirty, ndirty;
    unsigned char *is_dirty;   /* per id */
    /* scratch */
    int *stamp, gen;           /* per forward index */
    int *list;                 /* forward indices of A */
    int *back;                 /* per forward index: gen when A's entry goes back in (the floor's) */
    int *ids;                  /* a range's aliases being read */
    event *ev;
    int nev, cev;
    ck_frame *stack;
    int *order;                /* reset: entries in list order */
};

#define RIN(tr, x) (tr)->rin[(x) - (tr)->nf - (tr)->nb]
_Static_assert(CK_MAX_IN < 8 && CK_MAX_OUT <= 5, "a forward index's io byte holds its input count in 3 bits, its outputs in 5");
/* the first and last forward entry touching buffer root id (its aliases' uses
 * folded in by the evaluator's forward walk), NONE: forward entries never move */
#define FF(tr, id) ((id) < (tr)->nt && (tr)->e->root0[id] == (id) ? (tr)->e->first0[id] : NONE)
#define FL(tr, id) ((id) < (tr)->nt && (tr)->e->root0[id] == (id) ? (tr)->e->last0[id] : NONE)
#define CHILD(tr, x) (tr)->child[(x) - (tr)->nf] /* later and recompute entries have children */
#define PARENT(tr, x) (tr)->parent[(x) - (tr)->nf - (tr)->nb] /* recompute entries have parents */
#define PSLOT(tr, x) (tr)->pslot[(x) - (tr)->nf - (tr)->nb]

/* ---- the treap: entries in list order */

/* an entry's priority in the treap: a fixed mix of its index */
static uint32_t prio(int x)
{
    uint32_t h = (uint32_t)x * 0x9e3779b1u;
    h ^= h >> 15;
    h *= 0x85ebca6bu;
    return h ^ (h >> 13);
}

static void apply(ck_tracker *tr, int x, int64_t d)
{
    if (x == NONE) return;
    tr->t[x].val += d;
    tr->t[x].mx += d;
    tr->t[x].lazy += d;
}

static void push(ck_tracker *tr, int x)
{
    tnode *n = &tr->t[x];
    if (n->lazy) {
        apply(tr, n->l, n->lazy);
        apply(tr, n->r, n->lazy);
        n->lazy = 0;
    }
}

/* x's bounds and most from its children's (an addition pending at x is in
 * x's own value, not yet in theirs) */
static void pull(ck_tracker *tr, int x)
{
    tnode *n = &tr->t[x];
    n->mx = n->val;
    if (n->l != NONE) {
        const tnode *c = &tr->t[n->l];
        if (c->mx + n->lazy > n->mx) n->mx = c->mx + n->lazy;
    }
    if (n->r != NONE) {
        const tnode *c = &tr->t[n->r];
        if (c->mx + n->lazy > n->mx) n->mx = c->mx + n->lazy;
    }
}

/* the entries of x with keys below key into *a, the rest into *b */
static void split(ck_tracker *tr, int x, uint64_t key, int *a, int *b)
{
    if (x == NONE) {
        *a = *b = NONE;
        return;
    }
    push(tr, x);
    tnode *n = &tr->t[x];
    if (n->key < key) {
        split(tr, n->r, key, &n->r, b);
        pull(tr, x);
        *a = x;
    } else {
        split(tr, n->l, key, a, &n->l);
        pull(tr, x);
        *b = x;
    }
}

static int merge(ck_tracker *tr, int a, int b)
{
    if (a == NONE) return b;
    if (b == NONE) return a;
    if (prio(a) > prio(b)) {
        push(tr, a);
        tr->t[a].r = merge(tr, tr->t[a].r, b);
        pull(tr, a);
        return a;
    }
    push(tr, b);
    tr->t[b].l = merge(tr, a, tr->t[b].l);
    pull(tr, b);
    return b;
}

static uint64_t key_of(const ck_tracker *tr, int x) { return tr->t[x].key; }

/* puts entry x (its value whole, no addition pending) into the subtree y: down
 * to where its priority places it, the subtree there split around it */
static int insert_at(ck_tracker *tr, int y, int x)
{
    if (y == NONE) return x;
    if (prio(x) > prio(y)) {
        split(tr, y, tr->t[x].key, &tr->t[x].l, &tr->t[x].r);
        pull(tr, x);
        return x;
    }
    push(tr, y);
    if (tr->t[x].key < tr->t[y].key) tr->t[y].l = insert_at(tr, tr->t[y].l, x);
    else tr->t[y].r = insert_at(tr, tr->t[y].r, x);
    pull(tr, y);
    return y;
}

/* takes the entry with key out of the subtree y (it is there): its children merged in its place */
static int erase_at(ck_tracker *tr, int y, uint64_t key)
{
    push(tr, y);
    tnode *n = &tr->t[y];
    if (key == n->key) return merge(tr, n->l, n->r);
    if (key < n->key) n->l = erase_at(tr, n->l, key);
    else n->r = erase_at(tr, n->r, key);
    pull(tr, y);
    return y;
}

/* x's live bytes: its own and the additions pending above it, on the way
 * down to it by its key */
static int64_t value(const ck_tracker *tr, int x)
{
    const uint64_t key = tr->t[x].key;
    int64_t pending = 0;
    for (int y = tr->root; y != x; y = key < tr->t[y].key ? tr->t[y].l : tr->t[y].r) pending += tr->t[y].lazy;
    return tr->t[x].val + pending;
}

/* adds d to the entries under x (whose keys lie in [lo, hi]) with keys in [a, b];
 * an addition pending at x stays there (the children's values are relative
 * to it, and d is added to them alike) */
static void add_keys_in(ck_tracker *tr, int x, uint64_t lo, uint64_t hi, uint64_t a, uint64_t b, int64_t d)
{
    if (x == NONE || b < lo || hi < a) return;
    if (a <= lo && hi <= b) {
        apply(tr, x, d);
        return;
    }
    tnode *n = &tr->t[x];
    if (a <= n->key && n->key <= b) n->val += d;
    if (n->key > lo) add_keys_in(tr, n->l, lo, n->key - 1, a, b, d);
    if (n->key < hi) add_keys_in(tr, n->r, n->key + 1, hi, a, b, d);
    pull(tr, x);
}

static void add_keys(ck_tracker *tr, int x, uint64_t a, uint64_t b, int64_t d)
{
    add_keys_in(tr, x, 0, UINT64_MAX, a, b, d);
}

static void range_add(ck_tracker *tr, int from, int to, int64_t d)
{
    add_keys(tr, tr->root, key_of(tr, from), key_of(tr, to), d);
}

/* every node's maxima from its own value and its children's, children before
 * parents (after the values were set at a reset) */
static int pull_all(ck_tracker *tr)
{
    int *order = ck_big_alloc(sizeof(int) * 2 * (size_t)tr->nent), n = 0, sp = 0;
    if (!order) return -1;
    int *stk = order + tr->nent;
    stk[sp++] = tr->root;
    while (sp) { /* a pre order by node, right, left is a post order backwards */
        const int x = stk[--sp];
        order[n++] = x;
        if (tr->t[x].l != NONE) stk[sp++] = tr->t[x].l;
        if (tr->t[x].r != NONE) stk[sp++] = tr->t[x].r;
    }
    for (int i = n - 1; i >= 0; i--) pull(tr, order[i]);
    ck_big_free(order);
    return 0;
}

/* Keys are SPACING apart when laid out (a list of up to 2^27 entries: within
 * CK_PLAN_MAX_NODES); an entry put into a gap takes STEP of it at most, from
 * its left (entries go in in runs before one entry), so a gap holds about
 * 2^16 entries before the keys are laid out again. */
#define SPACING ((uint64_t)1 << 36)
#define STEP ((uint64_t)1 << 20)

/* new keys in list order: the treap's shape and maxima stay as they are */
static void relabel(ck_tracker *tr)
{
    uint64_t k = 0;
    for (int x = tr->head; x != NONE; x = tr->next[x]) {
        tr->t[x].key = k;
        k += SPACING;
    }
}

/* ---- buffers */

static int node_of_entry(const ck_tracker *tr, int x)
{
    if (x < tr->nf) return tr->fwd[x];
    if (x < tr->nf + tr->nb) return tr->bwd[x - tr->nf];
    return tr->fwd[x - tr->nf - tr->nb];
}

static int origin_of(const ck_tracker *tr, int id)
{
    if (id < tr->nt) return id;
    /* the copy ids of forward index f are cbase[f] .. cbase[f + 1] - 1 */
    int lo = 0, hi = tr->nf - 1;
    const int k = id - tr->nt;
    while (lo < hi) {
        const int m = (lo + hi + 1) / 2;
        if (tr->cbase[m] <= k) lo = m;
        else hi = m - 1;
    }
    return tr->e->nodes[tr->fwd[lo]].out[k - tr->cbase[lo]];
}

static int64_t bytes_of_root(const ck_tracker *tr, int r)
{
    if (r < tr->nt && tr->e->persistent[r]) return 0;
    return tr->e->bytes[origin_of(tr, r)];
}

static int root_of(const ck_tracker *tr, int id)
{
    while (tr->alias[id] != NONE) id = tr->alias[id];
    return id;
}

/* the range root r's aliases touch: its first and last entry (the end when
 * one is retained), NONE when nothing touches them */
static void range_of(ck_tracker *tr, int r, int *first, int *last)
{
    int f = NONE, l = NONE, kept = 0;
    uint64_t fr = 0, lr = 0;
    int sp = 0, *stk = tr->ids;
    stk[sp++] = r;
    while (sp) {
        const int id = stk[--sp];
        if (id < tr->nt) {
            if (FF(tr, id) != NONE && (f == NONE || key_of(tr, FF(tr, id)) < fr)) {
                f = FF(tr, id);
                fr = key_of(tr, f);
            }
            if (FL(tr, id) != NONE && (l == NONE || key_of(tr, FL(tr, id)) > lr)) {
                l = FL(tr, id);
                lr = key_of(tr, l);
            }
            kept |= tr->c->retain && tr->c->retain[id];
        }
        for (int k = tr->touch.head[id]; k != NONE; k = tr->touch.next[k]) {
            const int x = tr->touch.val[k];
            const uint64_t xr = key_of(tr, x);
            if (f == NONE || xr < fr) {
                f = x;
                fr = xr;
            }
            if (l == NONE || xr > lr) {
                l = x;
                lr = xr;
            }
        }
        for (int k = tr->kids.head[id]; k != NONE; k = tr->kids.next[k]) stk[sp++] = tr->kids.val[k];
    }
    if (f != NONE && kept) l = tr->end;
    *first = f;
    *last = l;
}

static void set_range(ck_tracker *tr, int r, int f, int l)
{
    tr->work++;
    const int f0 = tr->rf[r], l0 = tr->rl[r];
    if (f0 == f && l0 == l) return;
    tr->rf[r] = f;
    tr->rl[r] = l;
    const int64_t b = bytes_of_root(tr, r);
    if (!b) return;
    if (f0 != NONE) tr->ends[l0] -= b;
    if (f != NONE) tr->ends[l] += b;
    if (f0 == NONE || f == NONE) {
        if (f0 != NONE) range_add(tr, f0, l0, -b);
        if (f != NONE) range_add(tr, f, l, b);
        return;
    }
    /* only where the two ranges differ */
    const uint64_t a0 = key_of(tr, f0), b0 = key_of(tr, l0), a1 = key_of(tr, f), b1 = key_of(tr, l);
    if (b1 < a0 || b0 < a1) {
        add_keys(tr, tr->root, a0, b0, -b);
        add_keys(tr, tr->root, a1, b1, b);
        return;
    }
    if (a1 < a0) add_keys(tr, tr->root, a1, a0 - 1, b);
    if (a0 < a1) add_keys(tr, tr->root, a0, a1 - 1, -b);
    if (b1 > b0) add_keys(tr, tr->root, b0 + 1, b1, b);
    if (b0 > b1) add_keys(tr, tr->root, b1 + 1, b0, -b);
}

static void update(ck_tracker *tr, int r)
{
    int f, l;
    range_of(tr, r, &f, &l);
    set_range(tr, r, f, l);
}

static void later(ck_tracker *tr, int r)
{
    if (tr->is_dirty[r]) return;
    tr->is_dirty[r] = 1;
    tr->dirty[tr->ndirty++] = r;
}

static void flush(ck_tracker *tr)
{
    for (int i = 0; i < tr->ndirty; i++) {
        const int r = tr->dirty[i];
        tr->is_dirty[r] = 0;
        if (tr->alias[r] == NONE) update(tr, r); /* an alias has no range of its own */
    }
    tr->ndirty = 0;
}

static int touch_add(ck_tracker *tr, int id, int x)
{
    if (!tr->changes[id]) return 0;
    if (lists_push(&tr->touch, id, x)) return -1;
    later(tr, root_of(tr, id));
    return 0;
}

static void touch_del(ck_tracker *tr, int id, int x)
{
    if (!tr->changes[id]) return;
    lists_drop(&tr->touch, id, x);
    update(tr, root_of(tr, id));
}

/* id's buffer becomes to's (a reshape's output reading to), or its own (NONE) */
static int set_alias(ck_tracker *tr, int id, int to)
{
    if (tr->alias[id] == to) return 0;
    const int was = root_of(tr, id);
    if (was == id) set_range(tr, id, NONE, NONE);
    if (tr->alias[id] != NONE) lists_drop(&tr->kids, tr->alias[id], id);
    tr->alias[id] = to;
    if (to != NONE && lists_push(&tr->kids, to, id)) return -1;
    if (was != id) update(tr, was);
    later(tr, root_of(tr, id));
    return 0;
}

/* ---- entries */

static int copy_id(const ck_tracker *tr, int t) /* the copy of graph tensor t (made by a forward node) */
{
    const int v = tr->g->t[t].node, f = tr->fi[v];
    const ck_pnode *nd = &tr->e->nodes[v];
    for (int k = 0; k < nd->nout; k++)
        if (nd->out[k] == t) return tr->nt + tr->cbase[f] + k;
    return NONE;
}

/* what an entry reads at input u: its copy when u is marked */
static int read_id(const ck_tracker *tr, int u) { return u < tr->nt && tr->mark[u] ? copy_id(tr, u) : u; }

/* inserts recompute entry x (forward index f) right before entry at, and its touches */
static int insert_entry(ck_tracker *tr, int f, int at)
{
    tr->work++;
    const int v = tr->fwd[f], x = tr->nf + tr->nb + f;
    const ck_pnode *nd = &tr->e->nodes[v];
    const int left = tr->prev[at];
    if (key_of(tr, at) - key_of(tr, left) < 2) relabel(tr);
    const uint64_t gap = key_of(tr, at) - key_of(tr, left);
    tnode *n = &tr->t[x];
    n->l = n->r = NONE;
    n->lazy = 0;
    n->key = key_of(tr, left) + (gap / 2 < STEP ? gap / 2 : STEP);
    /* the bytes live across the gap it goes into: the left entry's, less its
     * own workspace and the buffers that end there */
    n->val = n->mx = value(tr, left) - (int64_t)tr->e->ws[node_of_entry(tr, left)] - tr->ends[left] +
                     (int64_t)tr->e->ws[v];
    tr->ends[x] = 0;
    tr->root = insert_at(tr, tr->root, x);
    tr->prev[x] = left;
    tr->next[x] = at;
    tr->next[left] = x;
    tr->prev[at] = x;
    tr->in_r[f] = 1;
    tr->rflops += tr->e->flops[v];
    for (int j = 0; j < nd->nin; j++) {
        RIN(tr, x)[j] = read_id(tr, nd->in[j]);
        if (touch_add(tr, RIN(tr, x)[j], x)) return -1;
    }
    for (int q = 0; q < nd->nout; q++)
        if (nd->out[q] >= 0 && touch_add(tr, tr->nt + tr->cbase[f] + q, x)) return -1;
    if (nd->reshape && nd->out[0] >= 0 && set_alias(tr, tr->nt + tr->cbase[f], RIN(tr, x)[0])) return -1;
    return 0;
}

static void erase_entry(ck_tracker *tr, int f)
{
    tr->work++;
    const int v = tr->fwd[f], x = tr->nf + tr->nb + f;
    const ck_pnode *nd = &tr->e->nodes[v];
    if (nd->reshape && nd->out[0] >= 0) set_alias(tr, tr->nt + tr->cbase[f], NONE);
    for (int j = 0; j < nd->nin; j++) touch_del(tr, RIN(tr, x)[j], x);
    for (int q = 0; q < nd->nout; q++)
        if (nd->out[q] >= 0) touch_del(tr, tr->nt + tr->cbase[f] + q, x);
    flush(tr); /* no applied range may end at x once it is gone */
    tr->root = erase_at(tr, tr->root, key_of(tr, x));
    tr->next[tr->prev[x]] = tr->next[x];
    tr->prev[tr->next[x]] = tr->prev[x];
    if (PARENT(tr, x) != NONE) CHILD(tr, PARENT(tr, x))[PSLOT(tr, x)] = NONE;
    PARENT(tr, x) = NONE;
    for (int j = 0; j < CK_MAX_IN; j++) CHILD(tr, x)[j] = NONE;
    tr->in_r[f] = 0;
    tr->rflops -= tr->e->flops[v];
}

static int depth_of(const ck_tracker *tr, int x)
{
    int d = 0;
    for (; x >= tr->nf + tr->nb && PARENT(tr, x) != NONE; x = PARENT(tr, x)) d++;
    return d;
}

/* a child of entry y at slot j, NONE where there is none or it is one of A's
 * entries (stamped gen): those are out of the list while a flip puts A back,
 * and the floor asks as if they were */
static int kept_child(const ck_tracker *tr, int y, int j, int gen)
{
    const int c = CHILD(tr, y)[j];
    return c != NONE && tr->stamp[c - tr->nf - tr->nb] != gen ? c : NONE;
}

/* where recomputations needed at input slot of entry x go: before the first
 * entry of x's first child at that slot or later, else before x (A's
 * entries, stamped gen, taken out) */
static int insertion_point(const ck_tracker *tr, int x, int slot, int gen)
{
    int c = NONE;
    for (int j = slot; j < CK_MAX_IN && c == NONE; j++) c = kept_child(tr, x, j, gen);
    if (c == NONE) return x;
    for (;;) { /* the subtree's first entry: down its first children */
        int d = NONE;
        for (int j = 0; j < CK_MAX_IN && d == NONE; j++) d = kept_child(tr, c, j, gen);
        if (d == NONE) return c;
        c = d;
    }
}

/* the entry of reader node v that can need a recomputation: its later
 * entry, or its recompute entry when in the list and not moving (stamp gen) */
static int anchor_of(const ck_tracker *tr, int v, int gen)
{
    if (tr->bi[v] != NONE) return tr->nf + tr->bi[v];
    const int f = tr->fi[v];
    if (f != NONE && tr->stamp[f] != gen && tr->in_r[f]) return tr->nf + tr->nb + f;
    return NONE;
}

static int by_when(const void *a, const void *b)
{
    const event *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->depth != y->depth) return x->depth < y->depth ? -1 : 1;
    return x->slot - y->slot;
}

static int add_event(ck_tracker *tr, event ev)
{
    if (tr->nev == tr->cev) {
        const int cap = tr->cev ? 2 * tr->cev : 64;
        event *v = ck_big_realloc(tr->ev, sizeof *v * (size_t)cap);
        if (!v) return -1;
        tr->ev = v;
        tr->cev = cap;
    }
    tr->ev[tr->nev++] = ev;
    return 0;
}

/* the recomputations of A (stamped gen) not yet back, depth first from
 * forward index f, each put before entry at; the subtree's root becomes the
 * child of entry anchor at slot */
static int recompute_from(ck_tracker *tr, int f, int anchor, int slot, int at)
{
    const int gen = tr->gen;
    int sp = 0;
    tr->stack[sp++] = (ck_frame){f, 0, {anchor, slot}};
    tr->stamp[f] = -gen; /* on its way back */
    while (sp) {
        ck_frame *fr = &tr->stack[sp - 1];
        const ck_pnode *nd = &tr->e->nodes[tr->fwd[fr->v]];
        if (fr->j == nd->nin) {
            const int x = tr->nf + tr->nb + fr->v;
            if (insert_entry(tr, fr->v, at)) return -1;
            PARENT(tr, x) = fr->ins[0];
            PSLOT(tr, x) = fr->ins[1];
            CHILD(tr, fr->ins[0])[fr->ins[1]] = x;
            sp--;
            continue;
        }
        const int j = fr->j++, u = nd->in[j];
        if (u >= tr->nt || !tr->mark[u]) continue;
        const int q = tr->fi[tr->g->t[u].node];
        if (tr->stamp[q] != gen) continue; /* back already, or not in A */
        tr->stamp[q] = -gen;
        tr->stack[sp++] = (ck_frame){q, 0, {tr->nf + tr->nb + fr->v, j}};
    }
    return 0;
}

int ck_tracker_flip(ck_tracker *tr, int t)
{
    tr->peak_at = NONE;
    const ck_graph *g = tr->g;
    if (t < 0 || t >= tr->nt || !tr->e->markable[t]) return 0;
    const int p = tr->fi[g->t[t].node];
    if (p == NONE) return 0;
    /* D, the recompute entries that move: unmarking t, p's subtree when a
     * reader of t was what first needed p (else none); marking it, p and
     * what p recomputes through marked inputs that is not yet in the list
     * before the first reader of t (else none) */
    const int gen = ++tr->gen, xp = tr->nf + tr->nb + p;
    int na = 0;
    if (tr->mark[t]) {
        const int up = PARENT(tr, xp);
        if (tr->in_r[p] && up != NONE && tr->e->nodes[node_of_entry(tr, up)].in[PSLOT(tr, xp)] == t) {
            int *stk = tr->ids, sp = 0;
            stk[sp++] = xp;
            while (sp) {
                const int x = stk[--sp];
                tr->list[na++] = x - tr->nf - tr->nb;
                tr->stamp[x - tr->nf - tr->nb] = gen;
                for (int j = 0; j < CK_MAX_IN; j++)
                    if (CHILD(tr, x)[j] != NONE) stk[sp++] = CHILD(tr, x)[j];
            }
        }
    } else {
        int any = 0; /* the key before which the first reader of t needs it */
        uint64_t first = 0;
        for (int k = tr->rstart[t]; k < tr->rstart[t + 1]; k++) {
            const int x = anchor_of(tr, READER_NODE(tr->readers[k]), gen);
            if (x == NONE) continue;
            const uint64_t r = key_of(tr, insertion_point(tr, x, READER_SLOT(tr->readers[k]), gen));
            if (!any || r < first) first = r;
            any = 1;
        }
        if (any && (!tr->in_r[p] || key_of(tr, xp) >= first)) {
            tr->list[na++] = p;
            tr->stamp[p] = gen;
            for (int i = 0; i < na; i++) {
                const ck_pnode *nd = &tr->e->nodes[tr->fwd[tr->list[i]]];
                for (int j = 0; j < nd->nin; j++) {
                    const int u = nd->in[j];
                    if (u >= tr->nt || !tr->mark[u]) continue;
                    const int q = tr->fi[g->t[u].node];
                    if (q == NONE || tr->stamp[q] == gen) continue;
                    if (tr->in_r[q] && key_of(tr, tr->nf + tr->nb + q) < first) continue; /* before: stays */
                    tr->stamp[q] = gen;
                    tr->list[na++] = q;
                }
            }
        }
    }
    for (int i = 0; i < na; i++)
        if (tr->in_r[tr->list[i]]) erase_entry(tr, tr->list[i]);
    /* t's readers outside A read the other of t and its copy */
    const int was = read_id(tr, t);
    tr->mark[t] ^= 1;
    const int now = read_id(tr, t);
    for (int k = tr->rstart[t]; k < tr->rstart[t + 1]; k++) {
        const int rnode = READER_NODE(tr->readers[k]), rslot = READER_SLOT(tr->readers[k]);
        const int x = anchor_of(tr, rnode, gen);
        if (x == NONE) continue;
        if (x >= tr->nf + tr->nb) RIN(tr, x)[rslot] = now;
        touch_del(tr, was, x);
        if (touch_add(tr, now, x)) return -1;
        const ck_pnode *nd = &tr->e->nodes[rnode];
        if (nd->reshape && rslot == 0 && nd->out[0] >= 0) {
            const int out = x < tr->nf + tr->nb ? nd->out[0] : tr->nt + tr->cbase[tr->fi[rnode]];
            if (set_alias(tr, out, now)) return -1;
        }
    }
    /* A back in: where the list's entries outside A first need a marked
     * output of A, in the order the scheduler reaches those slots */
    tr->nev = 0;
    for (int i = 0; i < na; i++) {
        const int a = tr->list[i];
        const ck_pnode *nd = &tr->e->nodes[tr->fwd[a]];
        for (int q = 0; q < nd->nout; q++) {
            const int u = nd->out[q];
            if (u < 0 || !tr->mark[u]) continue;
            for (int k = tr->rstart[u]; k < tr->rstart[u + 1]; k++) {
                const int rslot = READER_SLOT(tr->readers[k]);
                const int x = anchor_of(tr, READER_NODE(tr->readers[k]), gen);
                if (x == NONE) continue;
                const int at = insertion_point(tr, x, rslot, gen);
                if (add_event(tr, (event){x, rslot, a, at, key_of(tr, at), depth_of(tr, x)})) return -1;
            }
        }
    }
    if (tr->nev > 1) qsort(tr->ev, (size_t)tr->nev, sizeof *tr->ev, by_when);
    for (int i = 0; i < tr->nev; i++) {
        const event *ev = &tr->ev[i];
        if (tr->stamp[ev->target] != gen) continue;
        if (recompute_from(tr, ev->target, ev->anchor, ev->slot, ev->x)) return -1;
    }
    flush(tr);
    return 0;
}

size_t ck_tracker_peak(const ck_tracker *tr)
{
    const int64_t m = tr->root == NONE ? 0 : tr->t[tr->root].mx;
    return tr->c->persistent + (size_t)(m > 0 ? m : 0);
}

double ck_tracker_flops(const ck_tracker *tr) { return tr->rflops; }

int ck_tracker_marked(const ck_tracker *tr, int t) { return tr->mark[t]; }

long ck_tracker_work(const ck_tracker *tr) { return tr->work; }

/* the entry where the live peak is (the first such, in list order), kept
 * until the next change */
static int peak_entry(ck_tracker *tr)
{
    if (tr->peak_at != NONE) return tr->peak_at;
    int x = tr->root;
    while (x != NONE) {
        push(tr, x);
        const tnode *n = &tr->t[x];
        if (n->l != NONE && tr->t[n->l].mx == n->mx) x = n->l;
        else if (n->val == n->mx) return tr->peak_at = x;
        else x = n->r;
    }
    return NONE;
}

/* 1 when root r's buffer is live at the entry whose key is k */
static int live_at(const ck_tracker *tr, int r, uint64_t k)
{
    return tr->rf[r] != NONE && key_of(tr, tr->rf[r]) <= k && k <= key_of(tr, tr->rl[r]);
}

/* 1 when root r's buffer is touched at or after the entry whose key is k by
 * something other than the recompute entries stamped gen (A): it stays live
 * there once A is gone. 0 when that cannot be told (counted as freed). */
static int stays_past(const ck_tracker *tr, int r, uint64_t k, int gen)
{
    int stk[64], sp = 0;
    stk[sp++] = r;
    while (sp) {
        const int id = stk[--sp];
        if (!tr->changes[id]) return 1; /* a range no flip changes */
        if (id < tr->nt) {
            if (FL(tr, id) != NONE && key_of(tr, FL(tr, id)) >= k) return 1;
            if (tr->c->retain && tr->c->retain[id]) return 1;
        }
        for (int j = tr->touch.head[id]; j != NONE; j = tr->touch.next[j]) {
            const int x = tr->touch.val[j];
            if (x >= tr->nf + tr->nb && tr->stamp[x - tr->nf - tr->nb] == gen) continue;
            if (key_of(tr, x) >= k) return 1;
        }
        for (int j = tr->kids.head[id]; j != NONE; j = tr->kids.next[j]) {
            if (sp == (int)(sizeof stk / sizeof stk[0])) return 0;
            stk[sp++] = tr->kids.val[j];
        }
    }
    return 0;
}

int64_t ck_tracker_mark_gain(ck_tracker *tr, int t)
{
    if (t < 0 || t >= tr->nt || tr->mark[t] || !tr->e->markable[t] || tr->alias[t] != NONE) return 0;
    if (tr->c->retain && tr->c->retain[t]) return 0;
    const int q = peak_entry(tr);
    if (q == NONE) return 0;
    const uint64_t kq = key_of(tr, q);
    if (!live_at(tr, t, kq) || (FL(tr, t) != NONE && key_of(tr, FL(tr, t)) >= kq)) return 0;
    for (int k = tr->kids.head[t]; k != NONE; k = tr->kids.next[k]) /* a kept view holds the buffer */
        if (tr->kids.val[k] >= tr->nt || !tr->mark[tr->kids.val[k]]) return 0;
    int64_t gain = bytes_of_root(tr, t);
    const ck_pnode *nd = &tr->e->nodes[tr->g->t[t].node];
    for (int j = 0; j < nd->nin; j++) {
        const int u = nd->in[j];
        if (u < 0 || u >= tr->nt || tr->mark[u]) continue; /* a marked input is recomputed after q */
        const int r = root_of(tr, u);
        if (!live_at(tr, r, kq)) gain -= bytes_of_root(tr, r);
    }
    return gain;
}

/* the most live bytes of the entries under x (keys in [lo, hi]) with keys in
 * [a, b], FLOOR for none; pending: the additions above x not yet in it */
static int64_t max_keys_in(const ck_tracker *tr, int x, uint64_t lo, uint64_t hi, uint64_t a, uint64_t b, int64_t pending)
{
    if (x == NONE || b < lo || hi < a) return FLOOR;
    const tnode *n = &tr->t[x];
    if (a <= lo && hi <= b) return n->mx + pending;
    int64_t m = a <= n->key && n->key <= b ? n->val + pending : FLOOR;
    if (n->key > lo) {
        const int64_t l = max_keys_in(tr, n->l, lo, n->key - 1, a, b, pending + n->lazy);
        if (l > m) m = l;
    }
    if (n->key < hi) {
        const int64_t r = max_keys_in(tr, n->r, n->key + 1, hi, a, b, pending + n->lazy);
        if (r > m) m = r;
    }
    return m;
}

/* Unmarking t adds t's bytes over W, the entries past t's range now and
 * before the first of the recompute entries it takes out (A, as
 * ck_tracker_flip finds it) and t's copy, up to t's last reader outside A;
 * and it can free only buffers A's entries touch. So the peak after the
 * change is at least the most W holds now, plus t's bytes, less those
 * buffers that are live in W and that nothing outside A touches past W; when
 * the live peak's entry q is in W, the peak now plus t's bytes, less those
 * live at q that nothing outside A touches from q on (or t's copy, live at q).
 * A's entries that go back in later (their marked outputs still read outside
 * A) touch what they read past W: those buffers are not freed. */
size_t ck_tracker_unmark_floor(ck_tracker *tr, int t)
{
    const ck_graph *g = tr->g;
    if (t < 0 || t >= tr->nt || !tr->mark[t] || tr->alias[t] != NONE || tr->root == NONE) return 0;
    const int p = tr->fi[g->t[t].node], q = peak_entry(tr);
    const int64_t b = bytes_of_root(tr, t);
    if (p == NONE || q == NONE || b <= 0 || tr->rf[t] == NONE) return 0;
    const uint64_t lo = key_of(tr, tr->rl[t]); /* t's buffer is live up to it now */
    const int gen = ++tr->gen, xp = tr->nf + tr->nb + p;
    uint64_t hi = tr->in_r[p] ? key_of(tr, xp) : UINT64_MAX; /* W is (lo, hi) */
    int na = 0;
    const int up = tr->in_r[p] ? PARENT(tr, xp) : NONE;
    if (up != NONE && tr->e->nodes[node_of_entry(tr, up)].in[PSLOT(tr, xp)] == t) {
        int *stk = tr->ids, sp = 0;
        stk[sp++] = xp;
        while (sp) {
            const int x = stk[--sp];
            if (key_of(tr, x) < hi) hi = key_of(tr, x);
            tr->list[na++] = x;
            tr->stamp[x - tr->nf - tr->nb] = gen;
            for (int j = 0; j < CK_MAX_IN; j++)
                if (CHILD(tr, x)[j] != NONE) stk[sp++] = CHILD(tr, x)[j];
        }
    }
    /* t's buffer then lives to its last reader outside A */
    uint64_t last = 0;
    int reads = 0;
    for (int k = tr->rstart[t]; k < tr->rstart[t + 1]; k++) {
        const int x = anchor_of(tr, READER_NODE(tr->readers[k]), gen);
        if (x == NONE) continue;
        if (!reads || key_of(tr, x) > last) last = key_of(tr, x);
        reads = 1;
    }
    if (!reads || last <= lo) return 0;
    if (last < hi - 1) hi = last + 1;
    if (hi <= lo + 1) return 0; /* W is empty */
    const uint64_t kq = key_of(tr, q);
    const int at_q = lo < kq && kq < hi;
    const int64_t most = at_q ? tr->t[tr->root].mx : max_keys_in(tr, tr->root, 0, UINT64_MAX, lo + 1, hi - 1, 0);
    if (most == FLOOR) return 0;
    const uint64_t from = at_q ? kq : hi - 1; /* touched from here on: live wherever it was in W up to here */
    int64_t freed = 0;
    int *seen = tr->ids, ns = 0; /* the stack above is done with; is_dirty (clear between flips) marks them */
    /* A's entries that go back in (ck_tracker_flip's events: a marked output
     * read outside A; and what they recompute through A) go before the first
     * such reader's insertion point or later: when that is past from, the
     * buffers they read are touched past from and stay (those A makes are
     * not live in W or at q either way: A lies past them) */
    int *backs = tr->list + tr->nf, nback = 0; /* A takes at most nf of list */
    uint64_t first_back = UINT64_MAX;
    for (int i = 0; i < na; i++) {
        const int f = tr->list[i] - tr->nf - tr->nb;
        const ck_pnode *nd = &tr->e->nodes[tr->fwd[f]];
        int needed = 0;
        for (int o = 0; o < nd->nout; o++) {
            const int u = nd->out[o];
            if (u < 0 || u == t || !tr->mark[u]) continue;
            for (int k = tr->rstart[u]; k < tr->rstart[u + 1]; k++) {
                const int y = anchor_of(tr, READER_NODE(tr->readers[k]), gen);
                if (y == NONE) continue;
                const uint64_t at = key_of(tr, insertion_point(tr, y, READER_SLOT(tr->readers[k]), gen));
                if (at < first_back) first_back = at;
                needed = 1;
            }
        }
        if (needed) {
            tr->back[f] = gen;
            backs[nback++] = f;
        }
    }
    for (int i = 0; i < nback; i++) {
        const ck_pnode *nd = &tr->e->nodes[tr->fwd[backs[i]]];
        for (int j = 0; j < nd->nin; j++) {
            const int u = nd->in[j];
            if (u >= tr->nt || u == t || !tr->mark[u]) continue;
            const int q = tr->fi[g->t[u].node];
            if (q == NONE || tr->stamp[q] != gen || tr->back[q] == gen) continue;
            tr->back[q] = gen;
            backs[nback++] = q;
        }
    }
    if (first_back > from)
        for (int i = 0; i < nback; i++) {
            const int x = tr->nf + tr->nb + backs[i];
            for (int j = 0; j < (tr->io[backs[i]] & 7); j++) {
                const int r = root_of(tr, RIN(tr, x)[j]);
                if (tr->is_dirty[r]) continue;
                tr->is_dirty[r] = 1; /* stays: not freed */
                seen[ns++] = r;
            }
        }
    const int copy = copy_id(tr, t);
    for (int i = -1; i < na; i++) {
        int ids[CK_MAX_IN + CK_MAX_OUT], n = 0;
        if (i < 0) {
            if (copy != NONE) ids[n++] = copy;
        } else {
            const int x = tr->list[i], f = x - tr->nf - tr->nb, io = tr->io[f];
            for (int j = 0; j < (io & 7); j++) ids[n++] = RIN(tr, x)[j];
            for (int o = 0; o < CK_MAX_OUT; o++)
                if (io & (8 << o)) ids[n++] = tr->nt + tr->cbase[f] + o;
        }
        for (int j = 0; j < n; j++) {
            const int r = root_of(tr, ids[j]);
            if (tr->is_dirty[r]) continue;
            if (at_q ? !live_at(tr, r, kq)
                     : tr->rf[r] == NONE || key_of(tr, tr->rl[r]) <= lo || key_of(tr, tr->rf[r]) >= hi)
                continue;
            if (i >= 0 && stays_past(tr, r, from, gen)) continue;
            tr->is_dirty[r] = 1;
            seen[ns++] = r;
            freed += bytes_of_root(tr, r);
        }
    }
    for (int s = 0; s < ns; s++) tr->is_dirty[seen[s]] = 0;
    const int64_t m = most + b - freed;
    return tr->c->persistent + (size_t)(m > 0 ? m : 0);
}

void ck_tracker_relabel(ck_tracker *tr) { relabel(tr); }



/* ---- a whole decision */

/* the list of decision mark in order, with the forest and what recompute
 * entries read, as the scheduler makes it */
static int build_order(ck_tracker *tr)
{
    int n = 0;
    for (int f = 0; f < tr->nf; f++) tr->order[n++] = f;
    for (int b = 0; b < tr->nb; b++) {
        const int v = tr->bwd[b], xb = tr->nf + b;
        const ck_pnode *nd = &tr->e->nodes[v];
        for (int j = 0; j < nd->nin; j++) {
            const int u = nd->in[j];
            if (u >= tr->nt || !tr->mark[u]) continue;
            const int f0 = tr->fi[tr->g->t[u].node];
            if (tr->in_r[f0]) continue;
            int sp = 0;
            tr->stack[sp++] = (ck_frame){f0, 0, {xb, j}};
            tr->in_r[f0] = 2; /* on its way */
            while (sp) {
                ck_frame *fr = &tr->stack[sp - 1];
                const ck_pnode *pn = &tr->e->nodes[tr->fwd[fr->v]];
                if (fr->j == pn->nin) {
                    const int x = tr->nf + tr->nb + fr->v;
                    tr->in_r[fr->v] = 1;
                    PARENT(tr, x) = fr->ins[0];
                    PSLOT(tr, x) = fr->ins[1];
                    CHILD(tr, fr->ins[0])[fr->ins[1]] = x;
                    for (int i = 0; i < pn->nin; i++) RIN(tr, x)[i] = read_id(tr, pn->in[i]);
                    tr->rflops += tr->e->flops[tr->fwd[fr->v]];
                    tr->order[n++] = x;
                    sp--;
                    continue;
                }
                const int i = fr->j++, w = pn->in[i];
                if (w >= tr->nt || !tr->mark[w]) continue;
                const int q = tr->fi[tr->g->t[w].node];
                if (tr->in_r[q]) continue;
                tr->in_r[q] = 2;
                tr->stack[sp++] = (ck_frame){q, 0, {tr->nf + tr->nb + fr->v, i}};
            }
        }
        tr->order[n++] = xb;
    }
    tr->order[n++] = tr->end;
    return n;
}

static int build(ck_tracker *tr, int n)
{
    /* touches and aliases of the later and recompute entries, in list order:
     * each id's first and last position among them, and the touches of the
     * ids whose range can change */
    int *tf = tr->rf, *tl = tr->rl; /* a root's range is written after its aliases' positions are read */
    for (int id = 0; id < tr->nids; id++) tf[id] = tl[id] = NONE;
#define TOUCH(id, x, i)                                                                  \
    do {                                                                                 \
        if (tf[id] == NONE) tf[id] = (i);                                                \
        tl[id] = (i);                                                                    \
        if (tr->changes[id] && lists_push(&tr->touch, (id), (x))) goto oom;              \
    } while (0)
    for (int i = tr->nf; i < n - 1; i++) {
        const int x = tr->order[i], v = node_of_entry(tr, x);
        const ck_pnode *nd = &tr->e->nodes[v];
        const int rec = x >= tr->nf + tr->nb;
        int ins[CK_MAX_IN], outs[CK_MAX_OUT];
        for (int j = 0; j < nd->nin; j++) ins[j] = rec ? RIN(tr, x)[j] : read_id(tr, nd->in[j]);
        for (int q = 0; q < nd->nout; q++)
            outs[q] = nd->out[q] < 0 ? NONE : rec ? tr->nt + tr->cbase[x - tr->nf - tr->nb] + q : nd->out[q];
        for (int j = 0; j < nd->nin; j++) TOUCH(ins[j], x, i);
        for (int q = 0; q < nd->nout; q++)
            if (outs[q] != NONE) TOUCH(outs[q], x, i);
        if (nd->reshape && outs[0] != NONE) {
            tr->alias[outs[0]] = ins[0];
            if (lists_push(&tr->kids, ins[0], outs[0])) goto oom;
        }
    }
#undef TOUCH
    /* the treap, built in order, values from the ranges (their ends' changes
     * summed up in each node's lazy first: nothing is pending yet) */
    tr->root = NONE;
    int *right = tr->list; /* the right spine, for a linear build */
    int sp = 0;
    tr->head = tr->order[0];
    for (int i = 0; i < n; i++) {
        const int x = tr->order[i];
        tnode *nd = &tr->t[x];
        nd->l = nd->r = NONE;
        nd->lazy = 0;
        nd->key = (uint64_t)i * SPACING;
        tr->prev[x] = i ? tr->order[i - 1] : NONE;
        tr->next[x] = i + 1 < n ? tr->order[i + 1] : NONE;
        int last = NONE;
        while (sp && prio(right[sp - 1]) < prio(x)) last = right[--sp];
        nd->l = last;
        if (sp) tr->t[right[sp - 1]].r = x;
        right[sp++] = x;
    }
    tr->root = right[0];
    /* ranks are positions until the first change: ranges from them */
    for (int id = 0; id < tr->nids; id++) {
        if (tr->alias[id] != NONE) continue; /* an alias's range stays NONE: its positions are its root's */
        int f = NONE, l = NONE, fr = 0, lr = -1, kept = 0, stk_n = 0;
        int *stk = tr->order + n; /* room past the list */
        stk[stk_n++] = id;
        while (stk_n) {
            const int y = stk[--stk_n];
            if (y < tr->nt) {
                if (FF(tr, y) != NONE && (f == NONE || FF(tr, y) < fr)) f = fr = FF(tr, y);
                if (FL(tr, y) != NONE && FL(tr, y) > lr) l = lr = FL(tr, y);
                kept |= tr->c->retain && tr->c->retain[y];
            }
            if (tf[y] != NONE && (f == NONE || tf[y] < fr)) {
                f = tr->order[tf[y]];
                fr = tf[y];
            }
            if (tl[y] != NONE && tl[y] > lr) {
                l = tr->order[tl[y]];
                lr = tl[y];
            }
            for (int k = tr->kids.head[y]; k != NONE; k = tr->kids.next[k]) stk[stk_n++] = tr->kids.val[k];
        }
        if (f == NONE) continue;
        if (kept) {
            l = tr->end;
            lr = n - 1;
        }
        tr->rf[id] = f;
        tr->rl[id] = l;
        const int64_t b = bytes_of_root(tr, id);
        tr->t[tr->order[fr]].lazy += b;
        if (lr + 1 < n) tr->t[tr->order[lr + 1]].lazy -= b;
        tr->ends[l] += b;
    }
    for (int id = 0; id < tr->nids; id++) /* the positions the aliases lent */
        if (tr->alias[id] != NONE) tr->rf[id] = tr->rl[id] = NONE;
    int64_t live = 0;
    for (int i = 0; i < n; i++) {
        const int x = tr->order[i];
        live += tr->t[x].lazy;
        tr->t[x].lazy = 0;
        tr->t[x].val = x == tr->end ? FLOOR : live + (int64_t)tr->e->ws[node_of_entry(tr, x)];
    }
    return pull_all(tr); /* maxima bottom up */
oom:
    return -1;
}

int ck_tracker_reset(ck_tracker *tr, const unsigned char *mark)
{
    for (int t = 0; t < tr->nt; t++) tr->mark[t] = mark && mark[t] && tr->e->markable[t];
    lists_clear(&tr->touch, tr->nids);
    lists_clear(&tr->kids, tr->nids);
    for (int id = 0; id < tr->nids; id++) tr->alias[id] = NONE;
    for (int x = 0; x < tr->nent; x++) {
        tr->ends[x] = 0;
        if (x >= tr->nf + tr->nb && x != tr->end) PARENT(tr, x) = NONE;
        if (x >= tr->nf && x != tr->end)
            for (int j = 0; j < CK_MAX_IN; j++) CHILD(tr, x)[j] = NONE;
    }
    memset(tr->in_r, 0, (size_t)(tr->nf ? tr->nf : 1));
    tr->rflops = 0;
    /* the forward entries' aliases, which no decision changes */
    for (int f = 0; f < tr->nf; f++) {
        const ck_pnode *nd = &tr->e->nodes[tr->fwd[f]];
        if (nd->reshape && nd->out[0] >= 0) {
            tr->alias[nd->out[0]] = nd->in[0];
            if (lists_push(&tr->kids, nd->in[0], nd->out[0])) return -1;
        }
    }
    if (!(tr->order = ck_big_alloc(sizeof(int) * ((size_t)tr->nent + (size_t)tr->nids)))) return -1; /* the list, then a stack */
    const int rc = build(tr, build_order(tr));
    tr->work = 0;
    tr->peak_at = NONE;
    ck_big_free(tr->order); /* only laying the list out needs it */
    tr->order = NULL;
    return rc;
}

void ck_tracker_free(ck_tracker *tr)
{
    if (!tr) return;
    lists_free(&tr->touch);
    lists_free(&tr->kids);
    ck_big_free(tr->fwd);
    ck_big_free(tr->bwd);
    ck_big_free(tr->fi);
    ck_big_free(tr->bi);
    ck_big_free(tr->cbase);
    ck_big_free(tr->mark);
    ck_big_free(tr->rstart);
    ck_big_free(tr->readers);
    ck_big_free(tr->t);
    ck_big_free(tr->prev);
    ck_big_free(tr->next);
    ck_big_free(tr->ends);
    ck_big_free(tr->child);
    ck_big_free(tr->parent);
    ck_big_free(tr->pslot);
    ck_big_free(tr->rin);
    ck_big_free(tr->io);
    ck_big_free(tr->in_r);
    ck_big_free(tr->alias);
    ck_big_free(tr->rf);
    ck_big_free(tr->rl);
    ck_big_free(tr->dirty);
    ck_big_free(tr->is_dirty);
    ck_big_free(tr->changes);
    ck_big_free(tr->stamp);
    ck_big_free(tr->list);
    ck_big_free(tr->back);
    ck_big_free(tr->ids);
    ck_big_free(tr->ev);
    ck_big_free(tr->stack);
    ck_big_free(tr->order);
    ck_big_free(tr);
}

ck_tracker *ck_tracker_new(ck_evaluator *e)
{
    if (e->fallback) return NULL;
    ck_tracker *tr = ck_big_zalloc(sizeof *tr);
    if (!tr) return NULL;
    const ck_decide_ctx *c = e->c;
    const ck_graph *g = c->g;
    tr->e = e;
    tr->c = c;
    tr->g = g;
    tr->nt = g->nt;
    const size_t nn = (size_t)(g->nn ? g->nn : 1), nt = (size_t)(g->nt ? g->nt : 1);
    tr->fwd = ck_big_alloc(sizeof(int) * (size_t)(c->n ? c->n : 1));
    tr->bwd = ck_big_alloc(sizeof(int) * (size_t)(c->n ? c->n : 1));
    tr->fi = ck_big_alloc(sizeof(int) * nn);
    tr->bi = ck_big_alloc(sizeof(int) * nn);
    if (!tr->fwd || !tr->bwd || !tr->fi || !tr->bi) goto oom;
    for (int v = 0; v < g->nn; v++) tr->fi[v] = tr->bi[v] = NONE;
    for (int i = 0; i < c->n; i++) {
        const int v = c->nodes[i];
        if (g->n[v].phase == CK_PHASE_FORWARD) {
            tr->fi[v] = tr->nf;
            tr->fwd[tr->nf++] = v;
        } else {
            tr->bi[v] = tr->nb;
            tr->bwd[tr->nb++] = v;
        }
    }
    tr->nent = tr->nf + tr->nb + tr->nf + 1;
    tr->end = tr->nent - 1;
    tr->cbase = ck_big_alloc(sizeof(int) * (size_t)(tr->nf + 1));
    tr->io = ck_big_alloc((size_t)(tr->nf ? tr->nf : 1));
    if (!tr->cbase || !tr->io) goto oom;
    int nc = 0;
    for (int f = 0; f < tr->nf; f++) {
        const ck_pnode *nd = &e->nodes[tr->fwd[f]];
        tr->cbase[f] = nc;
        nc += nd->nout;
        tr->io[f] = (unsigned char)nd->nin;
        for (int o = 0; o < nd->nout; o++)
            if (nd->out[o] >= 0) tr->io[f] |= (unsigned char)(8 << o);
    }
    tr->cbase[tr->nf] = nc;
    tr->nids = g->nt + nc;
    const size_t nent = (size_t)tr->nent, nids = (size_t)(tr->nids ? tr->nids : 1);
    /* readers of each graph tensor among the list's nodes */
    tr->rstart = ck_big_zalloc((nt + 1) * (sizeof(int)));
    if (!tr->rstart) goto oom;
    for (int i = 0; i < c->n; i++) {
        const ck_pnode *nd = &e->nodes[c->nodes[i]];
        for (int j = 0; j < nd->nin; j++) tr->rstart[nd->in[j] + 1]++;
    }
    for (int t = 0; t < g->nt; t++) tr->rstart[t + 1] += tr->rstart[t];
    tr->readers = ck_big_alloc(sizeof *tr->readers * (size_t)(tr->rstart[g->nt] ? tr->rstart[g->nt] : 1));
    int *fill = ck_big_zalloc((nt) * (sizeof(int)));
    if (!tr->readers || !fill) {
        ck_big_free(fill);
        goto oom;
    }
    for (int i = 0; i < c->n; i++) {
        const ck_pnode *nd = &e->nodes[c->nodes[i]];
        for (int j = 0; j < nd->nin; j++) tr->readers[tr->rstart[nd->in[j]] + fill[nd->in[j]]++] = READER(c->nodes[i], j);
    }
    ck_big_free(fill);
    tr->mark = ck_big_alloc(nt);
    tr->t = ck_big_alloc(sizeof *tr->t * nent);
    tr->prev = ck_big_alloc(sizeof(int) * nent);
    tr->next = ck_big_alloc(sizeof(int) * nent);
    tr->ends = ck_big_alloc(sizeof *tr->ends * nent);
    tr->child = ck_big_alloc(sizeof *tr->child * (size_t)(tr->nb + tr->nf + 1));
    tr->parent = ck_big_alloc(sizeof(int) * (size_t)(tr->nf ? tr->nf : 1));
    tr->pslot = ck_big_alloc(sizeof(int) * (size_t)(tr->nf ? tr->nf : 1));
    tr->rin = ck_big_alloc(sizeof *tr->rin * (size_t)(tr->nf ? tr->nf : 1));
    tr->in_r = ck_big_alloc((size_t)(tr->nf ? tr->nf : 1));
    tr->alias = ck_big_alloc(sizeof(int) * nids);
    tr->kids.head = ck_big_alloc(sizeof(int) * nids);
    tr->touch.head = ck_big_alloc(sizeof(int) * nids);
    tr->rf = ck_big_alloc(sizeof(int) * nids);
    tr->rl = ck_big_alloc(sizeof(int) * nids);
    tr->dirty = ck_big_alloc(sizeof(int) * nids);
    tr->is_dirty = ck_big_zalloc((nids) * (1));
    tr->changes = ck_big_alloc(nids);
    tr->stamp = ck_big_zalloc(((size_t)(tr->nf ? tr->nf : 1)) * (sizeof(int)));
    tr->list = ck_big_alloc(sizeof(int) * (nent > nids ? nent : nids));
    tr->back = ck_big_zalloc(sizeof(int) * (size_t)(tr->nf ? tr->nf : 1));
    tr->ids = ck_big_alloc(sizeof(int) * nids);
    tr->stack = ck_big_alloc(sizeof *tr->stack * (size_t)(tr->nf ? tr->nf : 1));
    if (!tr->mark || !tr->t || !tr->prev || !tr->next || !tr->ends || !tr->child || !tr->parent || !tr->pslot || !tr->rin || !tr->in_r ||
        !tr->alias || !tr->kids.head || !tr->touch.head || !tr->rf || !tr->rl || !tr->stamp || !tr->list || !tr->back ||
        !tr->stack || !tr->ids || !tr->dirty || !tr->is_dirty || !tr->changes)
        goto oom;
    /* the ids whose range a flip can change */
    for (int id = 0; id < tr->nids; id++) tr->changes[id] = id >= g->nt || e->markable[id];
    for (int i = 0; i < c->n; i++) {
        const ck_pnode *nd = &e->nodes[c->nodes[i]];
        if (nd->reshape && nd->out[0] >= 0 && tr->changes[nd->in[0]]) tr->changes[nd->out[0]] = 1;
    }
    return tr;
oom:
    ck_tracker_free(tr);
    return NULL;
}
