/* Offsets for buffers with live ranges: largest first, each in the
 * best-fitting gap among the buffers live at the same time. The bytes those
 * buffers take come from a segment tree over list positions whose nodes keep
 * unions of offset ranges, so a placement costs what the unions' pieces cost,
 * not one look at every buffer placed before it. */
#include "plan/place.h"

#include "util/memory.h"

#include <stdlib.h>
#include <string.h>

/* Offsets inside the tree count units of the alignment (a coarser power of
 * two of it only when the buffers together pass 2^32 units, 256 GiB at 64
 * bytes), so that a range takes 8 bytes. */
typedef uint32_t unit;

/* A union of offset ranges [lo, hi): sorted, disjoint, touching ranges joined. */
typedef struct span {
    unit lo, hi;
} span;

/* The arrays of spans live in one pool, addressed by index (0: none); an
 * array of n spans has room for the next power of two at least n (2 at
 * least), and a free list per size takes arrays back (its link in the
 * array's first span). Hundreds of thousands of small arrays, without a
 * malloc header each, all given back at once. */
typedef struct pool {
    span *v;
    uint32_t used, cap;
    uint32_t free[32];
} pool;

static uint32_t pool_get(pool *p, int k)
{
    const uint32_t size = (uint32_t)1 << k;
    if (p->free[k]) {
        const uint32_t at = p->free[k];
        p->free[k] = p->v[at].lo;
        return at;
    }
    if ((uint64_t)p->used + size > p->cap) {
        if ((uint64_t)p->used + size > UINT32_MAX / 2) return 0;
        uint32_t cap = p->cap ? 2 * p->cap : 1 << 16;
        while ((uint64_t)p->used + size > cap) cap *= 2;
        span *v = ck_big_realloc(p->v, sizeof *v * (size_t)cap);
        if (!v) return 0;
        p->v = v;
        p->cap = cap;
    }
    const uint32_t at = p->used;
    p->used += size;
    return at;
}

static void pool_put(pool *p, uint32_t at, int k)
{
    p->v[at].lo = p->free[k];
    p->free[k] = at;
}

static int log2_of(uint32_t n)
{
    int k = 0;
    while (((uint32_t)1 << k) < n) k++;
    return k;
}

/* one union: n spans from pool index at */
typedef struct spans {
    uint32_t at, n;
} spans;

static int spans_add(pool *p, spans *s, unit lo, unit hi)
{
    span *v = p->v + s->at;
    uint32_t a = 0, b = s->n; /* the first range that ends at or after lo */
    while (a < b) {
        const uint32_t m = (a + b) / 2;
        if (v[m].hi < lo) a = m + 1;
        else b = m;
    }
    uint32_t j = a;
    for (; j < s->n && v[j].lo <= hi; j++) {
        if (v[j].lo < lo) lo = v[j].lo;
        if (v[j].hi > hi) hi = v[j].hi;
    }
    if (j == a) { /* joins none: a new range at a */
        if (s->n < 2 ? !s->at : (s->n & (s->n - 1)) == 0) { /* full: twice the room */
            const int k = s->n < 2 ? 1 : log2_of(2 * s->n);
            const uint32_t at = pool_get(p, k);
            if (!at) return -1;
            if (s->at) {
                memcpy(p->v + at, p->v + s->at, sizeof *p->v * s->n);
                pool_put(p, s->at, k - 1);
            }
            s->at = at;
            v = p->v + at;
        }
        memmove(v + a + 1, v + a, sizeof *v * (s->n - a));
        s->n++;
    } else if (j > a + 1) {
        memmove(v + a + 1, v + j, sizeof *v * (s->n - j));
        s->n -= j - a - 1;
    }
    v[a] = (span){lo, hi};
    return 0;
}

/* A segment tree over list positions, its nodes laid out depth first (the
 * node of [lo, hi] has its left child next, its right child 2 (mid - lo + 1)
 * on): 2 npos - 1 nodes. Per node: cover, the bytes of buffers whose range
 * splits onto the node (they are live at every position under it); below,
 * the bytes of every buffer split onto the node or a node under it (at a
 * leaf, cover itself). The buffers live at some position of [first, last]
 * are then those in below of the range's canonical nodes and in cover of the
 * nodes above them. */
typedef struct node {
    spans cover, below;
} node;

typedef struct tree {
    node *n;
    pool pool;
    spans found[4 * 32]; /* a query's sets: at most 2 canonical and 2 partial nodes a level */
    int nfound;
} tree;

static spans *below(node *x, int lo, int hi) { return lo == hi ? &x->cover : &x->below; }

static void collect(tree *t, int v, int lo, int hi, int first, int last)
{
    if (last < lo || hi < first) return;
    node *x = &t->n[v];
    if (first <= lo && hi <= last) {
        const spans *b = below(x, lo, hi);
        if (b->n) t->found[t->nfound++] = *b;
        return;
    }
    if (x->cover.n) t->found[t->nfound++] = x->cover;
    const int mid = lo + (hi - lo) / 2;
    collect(t, v + 1, lo, mid, first, last);
    collect(t, v + 2 * (mid - lo + 1), mid + 1, hi, first, last);
}

static int insert(tree *t, int v, int lo, int hi, int first, int last, unit a, unit b)
{
    if (last < lo || hi < first) return 0;
    node *x = &t->n[v];
    if (spans_add(&t->pool, below(x, lo, hi), a, b)) return -1;
    if (lo == hi) return 0;
    if (first <= lo && hi <= last) return spans_add(&t->pool, &x->cover, a, b);
    const int mid = lo + (hi - lo) / 2;
    return insert(t, v + 1, lo, mid, first, last, a, b) || insert(t, v + 2 * (mid - lo + 1), mid + 1, hi, first, last, a, b);
}

/* the first of v[i .. n - 1] that ends after at (n where none does) */
static uint32_t past(const span *v, uint32_t i, uint32_t n, unit at)
{
    if (i >= n || v[i].hi > at) return i;
    uint32_t step = 1, lo = i + 1; /* v[i .. lo - 1] end at or before at */
    while (lo + step - 1 < n && v[lo + step - 1].hi <= at) {
        lo += step;
        step *= 2;
    }
    uint32_t hi = lo + step - 1 < n ? lo + step - 1 : n; /* v[hi] ends after at, or hi == n */
    while (lo < hi) {
        const uint32_t m = lo + (hi - lo) / 2;
        if (v[m].hi <= at) lo = m + 1;
        else hi = m;
    }
    return lo;
}

/* the next run of v[*i .. n - 1] that ends after at, *i moved past it; 0 where none is left */
static int next_run(const span *v, uint32_t *i, uint32_t n, unit at, unit need, span *run)
{
    uint32_t j = past(v, *i, n, at);
    if (j == n) return 0;
    run->lo = v[j].lo;
    unit hi = v[j].hi;
    while (++j < n && v[j].lo - hi < need) hi = v[j].hi;
    run->hi = hi;
    *i = j;
    return 1;
}

/* The best fit for need units among the found sets' union: the lowest offset
 * of the smallest gap that holds it, or the union's end (an exact fit ends the
 * look at once). A gap of the union lies inside a gap of every set, so each
 * set is read as runs of its ranges with no gap of need units between them
 * (the union's gaps that can hold need units stay as they are), and a set's
 * ranges that end inside the part of the union already merged (at most at)
 * are stepped over by a galloping search. The sets' runs are merged by their
 * starts: a tournament of each set's next run (its start kept beside it, so
 * that a match reads no set), a run taken replaying only its set's matches. */
static unit best_fit(const tree *t, unit need)
{
    enum { MAXF = 4 * 32 };
    const unit NONE_LEFT = UINT32_MAX; /* no run starts there: ranges end below 2^32 units */
    unit key[MAXF];                    /* each set's next run's start; NONE_LEFT once it has none */
    int loser[MAXF], win[2 * MAXF];    /* a tournament over the sets: each match's loser; the winner at 0 */
    span cur[MAXF];
    uint32_t pos[MAXF];
    const span *v = t->pool.v;
    const spans *f = t->found;
    const int nf = t->nfound;
    int p = 1;
    while (p < nf) p *= 2;
    for (int q = 0; q < p; q++) {
        pos[q] = 0;
        key[q] = q < nf && next_run(v + f[q].at, &pos[q], f[q].n, 0, need, &cur[q]) ? cur[q].lo : NONE_LEFT;
        win[p + q] = q;
    }
    for (int x = p - 1; x >= 1; x--) {
        const int a = win[2 * x], b = win[2 * x + 1];
        win[x] = key[b] < key[a] ? b : a;
        loser[x] = key[b] < key[a] ? a : b;
    }
    loser[0] = win[1];
    unit at = 0, best = 0, best_gap = 0;
    int found = 0;
    for (;;) {
        int q = loser[0];
        if (key[q] == NONE_LEFT) break;
        const span s = cur[q];
        if (s.lo >= at && s.lo - at >= need && (!found || s.lo - at < best_gap)) {
            best = at;
            best_gap = s.lo - at;
            found = 1;
            if (best_gap == need) break; /* no gap is smaller, and later ones lie higher */
        }
        if (s.hi > at) at = s.hi;
        key[q] = next_run(v + f[q].at, &pos[q], f[q].n, at, need, &cur[q]) ? cur[q].lo : NONE_LEFT;
        for (int x = (p + q) / 2; x >= 1; x /= 2) /* q's matches played again */
            if (key[loser[x]] < key[q]) {
                const int w = loser[x];
                loser[x] = q;
                q = w;
            }
        loser[0] = q;
    }
    return found ? best : at;
}

static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

static int by_size(const void *pa, const void *pb)
{
    const ck_place_buf *x = pa, *y = pb;
    const uint32_t nx = x->units, ny = y->units;
    if (nx != ny) return nx > ny ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int64_t ck_place(ck_place_buf *bufs, int nb, int npos, int64_t align, int64_t stop)
{
    int64_t total = 0; /* the most any offset can be */
    for (int b = 0; b < nb; b++) total += align_up(bufs[b].size, align);
    int64_t grid = align;
    while (total / grid >= (int64_t)UINT32_MAX) grid *= 2;
    /* each below the total, so below 2^32 units */
    for (int b = 0; b < nb; b++) bufs[b].units = (uint32_t)(align_up(bufs[b].size, grid) / grid);
    if (nb > 1) qsort(bufs, (size_t)nb, sizeof *bufs, by_size);
    const int nodes = npos > 0 ? 2 * npos - 1 : 1;
    tree t = {ck_big_zalloc(((size_t)nodes) * (sizeof(node))), {0}, {{0}}, 0};
    t.pool.used = 1; /* index 0 stays unused: it means none */
    if (!t.n) return -1;
    int64_t top = 0;
    for (int b = 0; b < nb; b++) {
        const unit need = bufs[b].units;
        if (need == 0) { /* a buffer of no bytes takes none */
            bufs[b].off = 0;
            continue;
        }
        t.nfound = 0;
        collect(&t, 0, 0, npos - 1, bufs[b].first, bufs[b].last);
        const unit off = best_fit(&t, need);
        bufs[b].off = (int64_t)off * grid;
        /* the high-water mark counts the bytes used, not the alignment after them */
        if (bufs[b].off + bufs[b].size > top) top = bufs[b].off + bufs[b].size;
        if (top > stop) break;
        if (insert(&t, 0, 0, npos - 1, bufs[b].first, bufs[b].last, off, off + need)) {
            top = -1;
            break;
        }
    }
    ck_big_free(t.pool.v);
    ck_big_free(t.n);
    return top;
}
