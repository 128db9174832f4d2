/* Offsets for buffers with live ranges: largest first, each in the
 * best-fitting gap among the buffers live at the same time. The bytes those
 * buffers take come from a segment tree over list positions whose nodes keep
 * unions of offset ranges, so a placement costs what the union's pieces cost,
 * not one look at every buffer placed before it. */
#include "plan/place.h"

#include <stdlib.h>
#include <string.h>

/* A union of offset ranges: sorted, disjoint, touching ranges joined. */
typedef struct span {
    int64_t lo, hi;
} span;

typedef struct spans {
    span *v;
    int n, cap;
} spans;

static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

static int spans_add(spans *s, int64_t lo, int64_t hi)
{
    int a = 0, b = s->n; /* the first range that ends at or after lo */
    while (a < b) {
        int m = (a + b) / 2;
        if (s->v[m].hi < lo) a = m + 1;
        else b = m;
    }
    int j = a;
    for (; j < s->n && s->v[j].lo <= hi; j++) {
        if (s->v[j].lo < lo) lo = s->v[j].lo;
        if (s->v[j].hi > hi) hi = s->v[j].hi;
    }
    if (j == a) { /* joins none: a new range at a */
        if (s->n == s->cap) {
            int cap = s->cap ? 2 * s->cap : 2;
            span *v = realloc(s->v, sizeof *v * (size_t)cap);
            if (!v) return -1;
            s->v = v;
            s->cap = cap;
        }
        memmove(s->v + a + 1, s->v + a, sizeof *s->v * (size_t)(s->n - a));
        s->n++;
    } else if (j > a + 1) {
        memmove(s->v + a + 1, s->v + j, sizeof *s->v * (size_t)(s->n - j));
        s->n -= j - a - 1;
    }
    s->v[a] = (span){lo, hi};
    return 0;
}

/* Per tree node: cover, the bytes of buffers whose range splits onto the
 * node (they are live at every position under it); below, the bytes of
 * every buffer split onto the node or a node under it. The buffers live at
 * some position of [first, last] are then those in below of the range's
 * canonical nodes and in cover of the nodes above them. */
typedef struct tree {
    int leaves;
    spans *cover, *below;
    const spans *found[4 * 32]; /* a query's sets: at most 2 canonical and 2 partial nodes a level */
    int nfound;
} tree;

static void collect(tree *t, int v, int lo, int hi, int first, int last)
{
    if (last < lo || hi < first) return;
    if (first <= lo && hi <= last) {
        if (t->below[v].n) t->found[t->nfound++] = &t->below[v];
        return;
    }
    if (t->cover[v].n) t->found[t->nfound++] = &t->cover[v];
    int mid = lo + (hi - lo) / 2;
    collect(t, 2 * v, lo, mid, first, last);
    collect(t, 2 * v + 1, mid + 1, hi, first, last);
}

static int insert(tree *t, int v, int lo, int hi, int first, int last, int64_t a, int64_t b)
{
    if (last < lo || hi < first) return 0;
    if (spans_add(&t->below[v], a, b)) return -1;
    if (first <= lo && hi <= last) return spans_add(&t->cover[v], a, b);
    int mid = lo + (hi - lo) / 2;
    return insert(t, 2 * v, lo, mid, first, last, a, b) || insert(t, 2 * v + 1, mid + 1, hi, first, last, a, b);
}

/* The best fit for need bytes among the found sets' union: the lowest offset
 * of the smallest gap that holds it, or the union's end. The sets are merged
 * by their ranges' starts (a heap of each set's next range). */
static int64_t best_fit(const tree *t, int64_t need)
{
    int heap[4 * 32], pos[4 * 32], hn = 0;
    const spans *const *f = t->found;
    for (int q = 0; q < t->nfound; q++) {
        pos[q] = 0;
        int x = hn++;
        while (x && f[heap[(x - 1) / 2]]->v[0].lo > f[q]->v[0].lo) {
            heap[x] = heap[(x - 1) / 2];
            x = (x - 1) / 2;
        }
        heap[x] = q;
    }
    int64_t at = 0, best = -1, best_gap = INT64_MAX;
    while (hn) {
        int q = heap[0];
        const span s = f[q]->v[pos[q]++];
        const int64_t gap = s.lo - at;
        if (gap >= need && gap < best_gap) {
            best = at;
            best_gap = gap;
        }
        if (s.hi > at) at = s.hi;
        if (pos[q] == f[q]->n && (q = heap[--hn], hn == 0)) break;
        const int64_t key = f[q]->v[pos[q]].lo;
        int i = 0;
        for (;;) {
            int c = 2 * i + 1;
            if (c >= hn) break;
            if (c + 1 < hn && f[heap[c + 1]]->v[pos[heap[c + 1]]].lo < f[heap[c]]->v[pos[heap[c]]].lo) c++;
            if (f[heap[c]]->v[pos[heap[c]]].lo >= key) break;
            heap[i] = heap[c];
            i = c;
        }
        heap[i] = q;
    }
    return best >= 0 ? best : at;
}

static int by_size(const void *pa, const void *pb)
{
    const ck_place_buf *x = pa, *y = pb;
    if (x->need != y->need) return x->need > y->need ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int64_t ck_place(ck_place_buf *bufs, int nb, int npos, int64_t align)
{
    for (int b = 0; b < nb; b++) bufs[b].need = align_up(bufs[b].size, align);
    qsort(bufs, (size_t)nb, sizeof *bufs, by_size);
    int leaves = 1;
    while (leaves < npos) leaves *= 2;
    tree t = {leaves, calloc(2 * (size_t)leaves, sizeof(spans)), calloc(2 * (size_t)leaves, sizeof(spans)), {0}, 0};
    int64_t top = -1;
    if (!t.cover || !t.below) goto out;
    top = 0;
    for (int b = 0; b < nb; b++) {
        const int64_t need = bufs[b].need;
        if (need == 0) { /* a buffer of no bytes takes none */
            bufs[b].off = 0;
            continue;
        }
        t.nfound = 0;
        collect(&t, 1, 0, leaves - 1, bufs[b].first, bufs[b].last);
        bufs[b].off = best_fit(&t, need);
        /* the high-water mark counts the bytes used, not the alignment after them */
        if (bufs[b].off + bufs[b].size > top) top = bufs[b].off + bufs[b].size;
        if (insert(&t, 1, 0, leaves - 1, bufs[b].first, bufs[b].last, bufs[b].off, bufs[b].off + need)) {
            top = -1;
            goto out;
        }
    }
out:
    for (int v = 0; t.cover && t.below && v < 2 * leaves; v++) {
        free(t.cover[v].v);
        free(t.below[v].v);
    }
    free(t.cover);
    free(t.below);
    return top;
}
