/* Graph construction: leaves, nodes with shape inference, scopes and script
 * lines. The tensor and node tables are large blocks (vm/util/memory.h). A
 * tensor owns its name; scopes and script lines, which thousands of
 * tensors and nodes share, are held once by the graph. A clone is a deep copy. */
#include "graph/graph.h"
#include "util/memory.h"
#include "util/hash.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dupstr(const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static uint32_t name_hash(const char *s) { return (uint32_t)ck_fnv1a(CK_FNV_OFFSET, s, strlen(s)); }

static void names_put(int *tab, int cap, const ck_tensor *t, int id)
{
    uint32_t k = name_hash(t[id].name) & (uint32_t)(cap - 1);
    while (tab[k] >= 0) k = (k + 1) & (uint32_t)(cap - 1);
    tab[k] = id;
}

/* the table's capacity for one more name, and the bytes growing to it adds */
static int names_grown(const ck_graph *g, size_t *bytes)
{
    int cap = g->names_cap;
    while (2 * (g->named + 1) > cap) cap = cap ? 2 * cap : 64;
    *bytes = cap == g->names_cap ? 0
                                 : ck_graph_malloc_chunk(sizeof(int) * (size_t)cap) -
                                       (g->names_cap ? ck_graph_malloc_chunk(sizeof(int) * (size_t)g->names_cap) : 0);
    return cap;
}

/* rebuilds g's table at cap slots from its tensors' names: 0, or -1 (out of memory) */
static int names_rebuild(ck_graph *g, int cap)
{
    int *tab = malloc(sizeof(int) * (size_t)cap);
    if (!tab) return -1;
    for (int i = 0; i < cap; i++) tab[i] = -1;
    int named = 0;
    for (int i = 0; i < g->nt; i++)
        if (g->t[i].name) names_put(tab, cap, g->t, i), named++;
    free(g->names);
    g->names = tab;
    g->names_cap = cap;
    g->named = named;
    return 0;
}

/* the graph's copy of s (NULL: out of memory), made on first use */
static const char *intern(ck_graph *g, const char *s)
{
    const uint32_t h = name_hash(s);
    if (g->strs_cap) {
        const uint32_t mask = (uint32_t)(g->strs_cap - 1);
        for (uint32_t k = h & mask; g->strs[k]; k = (k + 1) & mask)
            if (strcmp(g->strs[k], s) == 0) return g->strs[k];
    }
    if (2 * (g->nstrs + 1) > g->strs_cap) {
        const int cap = g->strs_cap ? 2 * g->strs_cap : 64;
        char **tab = calloc((size_t)cap, sizeof *tab);
        if (!tab) return NULL;
        for (int i = 0; i < g->strs_cap; i++) {
            if (!g->strs[i]) continue;
            uint32_t k = name_hash(g->strs[i]) & (uint32_t)(cap - 1);
            while (tab[k]) k = (k + 1) & (uint32_t)(cap - 1);
            tab[k] = g->strs[i];
        }
        free(g->strs);
        g->strs = tab;
        g->strs_cap = cap;
    }
    char *own = dupstr(s);
    if (!own) return NULL;
    uint32_t k = h & (uint32_t)(g->strs_cap - 1);
    while (g->strs[k]) k = (k + 1) & (uint32_t)(g->strs_cap - 1);
    g->strs[k] = own;
    g->nstrs++;
    return own;
}

ck_graph *ck_graph_new(void)
{
    ck_graph *g = calloc(1, sizeof *g);
    if (g) g->scope = g->scope_own = dupstr("");
    if (g && !g->scope) {
        free(g);
        return NULL;
    }
    return g;
}

ck_graph *ck_graph_clone(const ck_graph *g)
{
    ck_graph *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->t = ck_big_alloc(sizeof *c->t * (size_t)(g->nt ? g->nt : 1));
    c->n = ck_big_alloc(sizeof *c->n * (size_t)(g->nn ? g->nn : 1));
    c->scope = c->scope_own = dupstr(g->scope);
    c->fused_updates = g->fused_updates;
    c->comm_overlap = g->comm_overlap;
    if (!c->t || !c->n || !c->scope) {
        ck_graph_free(c);
        return NULL;
    }
    c->nt = c->capt = g->nt;
    c->nn = c->capn = g->nn;
    if (g->nt) memcpy(c->t, g->t, sizeof *c->t * (size_t)g->nt);
    if (g->nn) memcpy(c->n, g->n, sizeof *c->n * (size_t)g->nn);
    int ok = 1;
    for (int i = 0; i < g->nt; i++) c->t[i].name = NULL; /* the copy's own, made below */
    for (int i = 0; ok && i < g->nt; i++) {
        ok = (c->t[i].scope = intern(c, g->t[i].scope)) && (c->t[i].where = intern(c, g->t[i].where)) &&
             (!g->t[i].name || (c->t[i].name = dupstr(g->t[i].name)));
    }
    for (int i = 0; ok && i < g->nn; i++)
        ok = (c->n[i].scope = intern(c, g->n[i].scope)) && (c->n[i].where = intern(c, g->n[i].where));
    if (!ok) {
        ck_graph_free(c);
        return NULL;
    }
    if (g->names_cap && names_rebuild(c, g->names_cap)) c->names_cap = 0; /* lookups then scan */
    return c;
}

size_t ck_graph_malloc_chunk(size_t n)
{
    const size_t c = (n + 8 + 15) / 16 * 16;
    return c < 32 ? 32 : c;
}

static size_t str_bytes(const char *s) { return s ? ck_graph_malloc_chunk(strlen(s) + 1) : 0; }

static size_t intern_bytes(const ck_graph *g, const char *s)
{
    if (g->strs_cap) {
        const uint32_t mask = (uint32_t)(g->strs_cap - 1);
        for (uint32_t k = name_hash(s) & mask; g->strs[k]; k = (k + 1) & mask)
            if (strcmp(g->strs[k], s) == 0) return 0;
    }
    size_t b = str_bytes(s);
    if (2 * (g->nstrs + 1) > g->strs_cap) {
        const int cap = g->strs_cap ? 2 * g->strs_cap : 64;
        b += ck_graph_malloc_chunk(sizeof *g->strs * (size_t)cap) -
             (g->strs_cap ? ck_graph_malloc_chunk(sizeof *g->strs * (size_t)g->strs_cap) : 0);
    }
    return b;
}

/* an array of cap elements of elem bytes grown, by doubling from 64, to hold
 * n + more: its new capacity, and in *bytes what that adds */
static int grown(int n, int cap, int more, size_t elem, size_t *bytes)
{
    int c = cap;
    while (n + more > c) c = c ? 2 * c : 64;
    *bytes = c == cap ? 0
                      : ck_graph_malloc_chunk(elem * (size_t)c) - (cap ? ck_graph_malloc_chunk(elem * (size_t)cap) : 0);
    return c;
}

/* charges n bytes of growth to g's budget: 0, or -1 with g->err naming the
 * graph's size as it would be */
static int charge(ck_graph *g, size_t n, int nodes, int tensors)
{
    if (!g->budget || !n) {
        g->charged += g->budget ? n : 0;
        return 0;
    }
    char what[160], size[64];
    ck_mem_text(g->charged + n, size, sizeof size);
    snprintf(what, sizeof what, "the graph, grown to %d nodes and %d tensors (%s)", g->nn + nodes, g->nt + tensors, size);
    char err[sizeof g->err];
    if (ck_mem_take(g->budget, n, what, err, sizeof err)) {
        memcpy(g->err, err, sizeof err);
        return -1;
    }
    g->charged += n;
    return 0;
}

size_t ck_graph_host_bytes(const ck_graph *g)
{
    if (!g) return 0;
    size_t b = ck_graph_malloc_chunk(sizeof *g) +
               ck_graph_malloc_chunk(sizeof *g->t * (size_t)(g->capt ? g->capt : 1)) +
               ck_graph_malloc_chunk(sizeof *g->n * (size_t)(g->capn ? g->capn : 1)) + str_bytes(g->scope);
    for (int i = 0; i < g->nt; i++) b += str_bytes(g->t[i].name);
    for (int i = 0; i < g->strs_cap; i++) b += str_bytes(g->strs[i]);
    if (g->strs_cap) b += ck_graph_malloc_chunk(sizeof *g->strs * (size_t)g->strs_cap);
    if (g->names_cap) b += ck_graph_malloc_chunk(sizeof(int) * (size_t)g->names_cap);
    return b;
}

void ck_graph_free(ck_graph *g)
{
    if (!g) return;
    ck_mem_give(g->budget, g->charged);
    for (int i = 0; g->t && i < g->nt; i++) free(g->t[i].name);
    for (int i = 0; i < g->strs_cap; i++) free(g->strs[i]);
    free(g->strs);
    ck_big_free(g->t);
    ck_big_free(g->n);
    free(g->names);
    free(g->scope_own);
    free(g);
}

void ck_graph_set_scope(ck_graph *g, const char *scope)
{
    char *own = dupstr(scope ? scope : "");
    if (!own) return; /* keeps the scope it had */
    free(g->scope_own);
    g->scope = g->scope_own = own;
}

/* At most 2^40 elements (4 TiB in fp32) in one tensor, so that element and
 * byte counts never overflow anywhere downstream. */
#define MAX_NUMEL ((int64_t)1 << 40)

static int too_large(const ck_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) {
        if (s->d[i] == 0) return 0;
        if (s->d[i] < 0 || s->d[i] > MAX_NUMEL || n > MAX_NUMEL / s->d[i]) return 1;
        n *= s->d[i];
    }
    return 0;
}

static int new_tensor(ck_graph *g, const ck_shape *s, ck_kind kind, const char *where)
{
    if (g->nt == g->capt) {
        int cap = g->capt ? 2 * g->capt : 64;
        ck_tensor *t = ck_big_realloc(g->t, sizeof *t * (size_t)cap);
        if (!t) return -1;
        g->t = t;
        g->capt = cap;
    }
    ck_tensor *t = &g->t[g->nt];
    memset(t, 0, sizeof *t);
    t->shape = *s;
    t->dtype = CK_F32;
    t->kind = kind;
    if (!(t->scope = intern(g, g->scope)) || !(t->where = intern(g, where ? where : "?"))) return -1;
    t->node = -1;
    t->grad = -1;
    return g->nt++;
}

const char *ck_graph_kind_name(ck_kind k)
{
    static const char *const names[CK_KIND_COUNT] = {"activation", "input", "param", "frozen", "grad",
                                                     "optimizer_state"};
    return (unsigned)k < CK_KIND_COUNT ? names[k] : "?";
}

const char *ck_graph_phase_name(ck_phase ph)
{
    static const char *const names[] = {"forward", "backward", "optimizer", "recompute"};
    return (unsigned)ph < sizeof names / sizeof *names ? names[ph] : "?";
}

void ck_graph_truncate(ck_graph *g, int nt, int nn)
{
    int named = 0;
    for (int i = nt; i < g->nt; i++) { /* scopes and lines stay the graph's */
        named += g->t[i].name != NULL;
        free(g->t[i].name);
    }
    g->nt = nt;
    g->nn = nn;
    /* the table at its size, without them (if that fails, lookups scan) */
    if (named && g->names_cap && names_rebuild(g, g->names_cap)) {
        free(g->names);
        g->names = NULL;
        g->names_cap = g->named = 0;
    }
}

int ck_graph_find(const ck_graph *g, const char *name)
{
    if (!g->names_cap) { /* a clone whose table could not be made */
        for (int i = 0; i < g->nt; i++)
            if (g->t[i].name && strcmp(g->t[i].name, name) == 0) return i;
        return -1;
    }
    const uint32_t mask = (uint32_t)(g->names_cap - 1);
    for (uint32_t k = name_hash(name) & mask;; k = (k + 1) & mask) {
        const int id = g->names[k];
        if (id < 0) return -1;
        if (strcmp(g->t[id].name, name) == 0) return id;
    }
}

int ck_graph_leaf(ck_graph *g, ck_kind kind, const char *name, const ck_shape *shape, const char *where)
{
    for (int i = 0; i < shape->ndim; i++)
        if (shape->d[i] < 0) {
            snprintf(g->err, sizeof g->err, "'%s' has a negative dim", name);
            return -1;
        }
    if (too_large(shape)) {
        char b[160];
        snprintf(g->err, sizeof g->err, "'%s' has shape %s: more than 2^40 elements is too large", name,
                 ck_shape_str(shape, b, sizeof b));
        return -1;
    }
    if (ck_graph_find(g, name) >= 0) {
        snprintf(g->err, sizeof g->err, "'%s' is already defined", name);
        return -1;
    }
    size_t need, table;
    grown(g->nt, g->capt, 1, sizeof *g->t, &need);
    const int cap = names_grown(g, &table);
    const char *line = where ? where : "?";
    size_t strs = intern_bytes(g, g->scope);
    if (strcmp(line, g->scope)) strs += intern_bytes(g, line);
    if (charge(g, need + table + strs + str_bytes(name), 0, 1)) return -1;
    char *own = dupstr(name);
    if (!own || (cap != g->names_cap && names_rebuild(g, cap))) {
        free(own);
        snprintf(g->err, sizeof g->err, "out of memory");
        return -1;
    }
    int id = new_tensor(g, shape, kind, where);
    if (id < 0) {
        free(own);
        snprintf(g->err, sizeof g->err, "out of memory");
        return -1;
    }
    g->t[id].name = own;
    names_put(g->names, g->names_cap, g->t, id);
    g->named++;
    g->t[id].needs_grad = kind == CK_KIND_PARAM;
    g->t[id].lr_scale = 1.0f;
    return id;
}

/* Which inputs a gradient flows through: everything but index-like inputs. */
static int differentiable(enum ck_op op)
{
    return op != CK_OP_TIMESTEP_EMBEDDING && op != CK_OP_FILL;
}

int ck_graph_node(ck_graph *g, enum ck_op op, const int *in, int nin, const ck_op_params *p, ck_shape *outs,
                  const int *want, int *out_ids, const char *where)
{
    ck_shape ins[CK_MAX_IN];
    char msg[400];
    int nout = ck_op_nout(op);
    if (nin > CK_MAX_IN) {
        snprintf(g->err, sizeof g->err, "%s: too many inputs", ck_op_name(op));
        return -1;
    }
    for (int i = 0; i < nin; i++) {
        if (in[i] < 0 || in[i] >= g->nt) {
            snprintf(g->err, sizeof g->err, "%s: input %d is not a tensor of this graph", ck_op_name(op), i + 1);
            return -1;
        }
        ins[i] = g->t[in[i]].shape;
    }
    if (ck_op_infer(op, p, ins, nin, outs, msg, sizeof msg) != 0) {
        if (g->scope[0])
            snprintf(g->err, sizeof g->err, "%s in %s: %s", ck_op_name(op), g->scope, msg);
        else
            snprintf(g->err, sizeof g->err, "%s: %s", ck_op_name(op), msg);
        return -1;
    }
    for (int k = 0; k < nout; k++)
        if (outs[k].ndim >= 0 && too_large(&outs[k])) {
            char b[160];
            snprintf(g->err, sizeof g->err, "%s%s%s: output shape %s has more than 2^40 elements: too large",
                     ck_op_name(op), g->scope[0] ? " in " : "", g->scope, ck_shape_str(&outs[k], b, sizeof b));
            return -1;
        }
    int made = 0;
    for (int k = 0; k < nout; k++) made += !want || want[k];
    size_t nodes_b, tensors_b;
    grown(g->nn, g->capn, 1, sizeof *g->n, &nodes_b);
    grown(g->nt, g->capt, made, sizeof *g->t, &tensors_b);
    const char *line = where ? where : "?";
    size_t strs = intern_bytes(g, g->scope);
    if (strcmp(line, g->scope)) strs += intern_bytes(g, line);
    if (charge(g, nodes_b + tensors_b + strs, 1, made)) return -1;
    if (g->nn == g->capn) {
        int cap = g->capn ? 2 * g->capn : 64;
        ck_node *n = ck_big_realloc(g->n, sizeof *n * (size_t)cap);
        if (!n) {
            snprintf(g->err, sizeof g->err, "out of memory");
            return -1;
        }
        g->n = n;
        g->capn = cap;
    }
    int id = g->nn;
    ck_node *n = &g->n[id];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->nin = nin;
    n->nout = nout;
    n->p = *p;
    if (nin) memcpy(n->in, in, sizeof(int) * (size_t)nin);
    int needs = 0;
    if (differentiable(op))
        for (int i = 0; i < nin; i++) needs |= g->t[in[i]].needs_grad;
    for (int k = 0; k < nout; k++) {
        n->out[k] = -1;
        if (want && !want[k]) continue;
        int t = new_tensor(g, &outs[k], CK_KIND_ACT, where);
        if (t < 0) {
            snprintf(g->err, sizeof g->err, "out of memory");
            return -1;
        }
        n = &g->n[id];
        g->t[t].node = id;
        g->t[t].needs_grad = needs;
        n->out[k] = t;
    }
    for (int k = 0; k < nout; k++)
        if (out_ids) out_ids[k] = n->out[k];
    if (!(n->scope = intern(g, g->scope)) || !(n->where = intern(g, line))) {
        snprintf(g->err, sizeof g->err, "out of memory");
        return -1;
    }
    g->nn++;
    return id;
}
