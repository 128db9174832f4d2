/* The arena placement (vm/plan/place.c) on random buffers and live ranges:
 * no two buffers live at one position share a byte, offsets are aligned,
 * the high-water mark is the end of the highest byte used, and every offset
 * is the one a plain quadratic best fit gives (each buffer walks every buffer
 * placed before it in offset order), to the byte. */
#include "plan/place.h"

#include "check.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 64

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int by_size(const void *pa, const void *pb)
{
    const ck_place_buf *x = pa, *y = pb;
    int64_t sx = align_up(x->size), sy = align_up(y->size);
    if (sx != sy) return sx > sy ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* the reference: the placed buffers kept sorted by offset; each new one
 * walks them all, looking only at those live at one of its positions */
static int64_t reference(ck_place_buf *b, int nb)
{
    qsort(b, (size_t)nb, sizeof *b, by_size);
    ck_place_buf **placed = malloc(sizeof *placed * (size_t)(nb + 1));
    int np = 0;
    int64_t top = 0;
    for (int i = 0; i < nb; i++) {
        int64_t best = -1, best_gap = INT64_MAX, at = 0, need = align_up(b[i].size);
        if (need == 0) {
            b[i].off = 0;
            continue;
        }
        for (int c = 0; c < np; c++) {
            const ck_place_buf *o = placed[c];
            if (o->first > b[i].last || b[i].first > o->last) continue;
            int64_t gap = o->off - at;
            if (gap >= need && gap < best_gap) {
                best = at;
                best_gap = gap;
            }
            int64_t end = o->off + align_up(o->size);
            if (end > at) at = end;
        }
        b[i].off = best >= 0 ? best : at;
        if (b[i].off + b[i].size > top) top = b[i].off + b[i].size;
        int lo = 0, hi = np;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (placed[mid]->off <= b[i].off) lo = mid + 1;
            else hi = mid;
        }
        memmove(placed + lo + 1, placed + lo, sizeof *placed * (size_t)(np - lo));
        placed[lo] = &b[i];
        np++;
    }
    free(placed);
    return top;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int by_id(const void *pa, const void *pb)
{
    const ck_place_buf *x = pa, *y = pb;
    return x->id - y->id;
}

/* nb buffers over npos positions: sizes from a few bytes to big, some equal
 * (ties), some of no bytes; ranges short and long */
static void make(ck_place_buf *b, int nb, int npos, int equal_sizes)
{
    for (int i = 0; i < nb; i++) {
        int64_t size;
        switch (next() % 8) {
        case 0: size = 0; break;
        case 1: size = 1 + (int64_t)(next() % 64); break;
        case 2: size = 4096 * (int64_t)(1 + next() % 4); break;
        default: size = equal_sizes ? 1000 * (int64_t)(1 + next() % 3) : (int64_t)(next() % 100000); break;
        }
        int first = (int)(next() % (uint64_t)npos), len = next() % 4 ? (int)(next() % 8) : (int)(next() % (uint64_t)npos);
        int last = first + len < npos ? first + len : npos - 1;
        b[i] = (ck_place_buf){size, -1, first, last, i, 0};
    }
}

/* no two buffers live at one position share a byte; offsets aligned; the
 * high-water mark is the highest byte's end */
static int valid(const ck_place_buf *b, int nb, int64_t top)
{
    int64_t hw = 0;
    for (int i = 0; i < nb; i++) {
        if (b[i].off < 0 || b[i].off % ALIGN) return 0;
        if (b[i].size && b[i].off + b[i].size > hw) hw = b[i].off + b[i].size;
        for (int j = i + 1; j < nb; j++) {
            if (!b[i].size || !b[j].size || b[i].first > b[j].last || b[j].first > b[i].last) continue;
            if (b[i].off < b[j].off + b[j].size && b[j].off < b[i].off + b[i].size) return 0;
        }
    }
    return hw == top;
}

int main(void)
{
    char name[128];
    int same = 1, ok = 1, cases = 0;
    for (int round = 0; round < 300; round++) {
        const int nb = 1 + (int)(next() % (round < 200 ? 40 : 400)), npos = 1 + (int)(next() % 200);
        ck_place_buf *a = malloc(sizeof *a * (size_t)nb), *r = malloc(sizeof *r * (size_t)nb);
        make(a, nb, npos, round % 3 == 0);
        memcpy(r, a, sizeof *a * (size_t)nb);
        const int64_t top = ck_place(a, nb, npos, ALIGN, INT64_MAX), rtop = reference(r, nb);
        qsort(a, (size_t)nb, sizeof *a, by_id);
        qsort(r, (size_t)nb, sizeof *r, by_id);
        ok &= valid(a, nb, top);
        int eq = top == rtop;
        for (int i = 0; i < nb; i++) eq &= a[i].off == r[i].off;
        if (!eq && same) {
            snprintf(name, sizeof name, "round %d (%d buffers, %d positions) differs from the reference", round, nb, npos);
            check(name, 0, (double)(top - rtop));
        }
        same &= eq;
        cases++;
        free(a);
        free(r);
    }
    /* a placement told to stop: the whole one's high-water where that is at
     * most the limit; otherwise a mark above the limit and at most the whole
     * one's, every buffer placed before it as the whole placement did */
    int stops = 0, stop_ok = 1;
    for (int round = 0; round < 300; round++) {
        const int nb = 1 + (int)(next() % 200), npos = 1 + (int)(next() % 100);
        ck_place_buf *a = malloc(sizeof *a * (size_t)nb), *w = malloc(sizeof *w * (size_t)nb);
        make(a, nb, npos, round % 3 == 0);
        memcpy(w, a, sizeof *a * (size_t)nb);
        const int64_t whole = ck_place(w, nb, npos, ALIGN, INT64_MAX);
        const int64_t limit = (int64_t)(next() % (uint64_t)(whole + whole / 4 + 1));
        for (int i = 0; i < nb; i++) a[i].off = -1;
        const int64_t top = ck_place(a, nb, npos, ALIGN, limit);
        if (whole <= limit) {
            stop_ok &= top == whole;
        } else {
            stops++;
            stop_ok &= top > limit && top <= whole;
            int i = 0; /* the same order: the buffers placed agree until the stop */
            while (i < nb && a[i].off >= 0) {
                stop_ok &= a[i].off == w[i].off && a[i].id == w[i].id;
                i++;
            }
            stop_ok &= i > 0 && (i == nb || a[i - 1].off + a[i - 1].size == top);
        }
        free(a);
        free(w);
    }
    snprintf(name, sizeof name, "300 placements with a limit (%d stopped): exact under it, above it and no more than the whole once past", stops);
    check(name, stop_ok && stops > 30, (double)stops);
    snprintf(name, sizeof name, "%d random placements: no overlap in space and time, aligned, high-water exact", cases);
    check(name, ok, 0);
    snprintf(name, sizeof name, "%d random placements equal the quadratic best fit to the byte", cases);
    check(name, same, 0);

    /* one position, many buffers: a stack of them, nothing shared */
    {
        ck_place_buf b[100];
        for (int i = 0; i < 100; i++) b[i] = (ck_place_buf){ALIGN * (i % 7 + 1), -1, 0, 0, i, 0};
        const int64_t top = ck_place(b, 100, 1, ALIGN, INT64_MAX);
        int64_t sum = 0;
        for (int i = 0; i < 100; i++) sum += ALIGN * (i % 7 + 1);
        check("buffers live at once stack up: the high-water is the sum of their sizes", valid(b, 100, top) && top == sum,
              (double)(top - sum));
    }
    /* disjoint ranges share the bottom of the arena */
    {
        ck_place_buf b[50];
        for (int i = 0; i < 50; i++) b[i] = (ck_place_buf){1000 + 10 * i, -1, i, i, i, 0};
        const int64_t top = ck_place(b, 50, 50, ALIGN, INT64_MAX);
        int zero = 1;
        for (int i = 0; i < 50; i++) zero &= b[i].off == 0;
        check("buffers never live at once all sit at offset 0", zero && top == 1490, (double)top);
    }
    /* a gap left by a freed buffer is reused by the smallest fit */
    {
        ck_place_buf b[4] = {
            {4096, -1, 0, 10, 0, 0}, /* long-lived at the bottom */
            {2048, -1, 0, 2, 1, 0},  /* dies at 2: leaves a gap above 0 */
            {1024, -1, 0, 10, 2, 0}, /* above both */
            {512, -1, 5, 10, 3, 0},  /* after 2: fits the 2048 gap */
        };
        ck_place(b, 4, 11, ALIGN, INT64_MAX);
        qsort(b, 4, sizeof *b, by_id);
        check("a gap left by a buffer no longer live is reused", b[0].off == 0 && b[1].off == 4096 &&
              b[2].off == 6144 && b[3].off == 4096, (double)b[3].off);
    }
    return checks_done();
}
