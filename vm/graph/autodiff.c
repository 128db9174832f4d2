/* Reverse-mode autodiff: walks the forward nodes backwards and appends, for
 * each, the ordinary ops that compute its input gradients. Contributions to one
 * tensor are summed with ADD in a fixed order, so gradients are deterministic. */
#include "graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ad {
    ck_graph *g;
    int *grad;      /* tensor -> accumulated gradient tensor, -1 */
    const ck_node *fwd; /* the node being differentiated (copy: g->n moves) */
} ad;

/* Appends one backward node in the scope and script line of the forward node. */
static int emit(ad *a, enum ck_op op, const int *in, int nin, const ck_op_params *p, ck_shape *outs,
                const int *want, int *out_ids)
{
    ck_graph *g = a->g;
    const char *saved = g->scope;
    g->scope = a->fwd->scope;
    int id = ck_graph_node(g, op, in, nin, p, outs, want, out_ids, a->fwd->where);
    g->scope = saved;
    if (id >= 0) g->n[id].phase = CK_PHASE_BACKWARD;
    return id;
}

static int emit1(ad *a, enum ck_op op, const int *in, int nin, const ck_op_params *p, const ck_shape *shape)
{
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (shape) outs[0] = *shape;
    if (emit(a, op, in, nin, p, outs, NULL, ids) < 0) return -1;
    return ids[0];
}

static int reshape(ad *a, int t, const ck_shape *s)
{
    static const ck_op_params none;
    if (ck_shape_eq(&a->g->t[t].shape, s)) return t;
    return emit1(a, CK_OP_RESHAPE, &t, 1, &none, s);
}

/* t viewed as a matrix of rows: (prod of leading dims, last dim). */
static int rows(ad *a, int t)
{
    ck_shape s = a->g->t[t].shape, r;
    r.ndim = 2;
    r.d[1] = s.ndim ? s.d[s.ndim - 1] : 1;
    r.d[0] = ck_shape_numel(&s) / (r.d[1] ? r.d[1] : 1);
    return reshape(a, t, &r);
}

static int matmul(ad *a, int x, int y, int ta, int tb)
{
    ck_op_params p = {0};
    p.i[0] = ta;
    p.i[1] = tb;
    int in[2] = {x, y};
    return emit1(a, CK_OP_MATMUL, in, 2, &p, NULL);
}

/* Sums a gradient down to the shape of the tensor it belongs to. */
static int reduce_to(ad *a, int dy, int target)
{
    static const ck_op_params none;
    const ck_shape *s = &a->g->t[target].shape;
    if (dy < 0 || ck_shape_eq(&a->g->t[dy].shape, s)) return dy;
    return emit1(a, CK_OP_REDUCE_TO, &dy, 1, &none, s);
}

static int accumulate(ad *a, int t, int dt)
{
    if (dt < 0) return -1;
    if (!a->g->t[t].needs_grad) return 0;
    if (a->grad[t] < 0) {
        a->grad[t] = dt;
        return 0;
    }
    static const ck_op_params none;
    int in[2] = {a->grad[t], dt};
    int s = emit1(a, CK_OP_ADD, in, 2, &none, NULL);
    if (s < 0) return -1;
    a->grad[t] = s;
    return 0;
}

static int needs(ad *a, int t) { return a->g->t[t].needs_grad; }

/* The gradient rules, one per kind of op (ops.def's grad column): each appends
 * the nodes that compute the gradients of n's inputs from the gradient dy of
 * its first output. ck_op_backward(n->op) is the op a rule emits where it
 * emits one. */
#define GRAD(kind) static int grad_##kind(ad *a, const ck_node *n, int dy)

GRAD(matmul)
{
    ck_graph *g = a->g;
    const int *in = n->in;
    int ta = (int)n->p.i[0], tb = (int)n->p.i[1];
    int A = in[0], B = in[1];
    int batched_b = g->t[B].shape.ndim > 2;
    if (ta && (g->t[A].shape.ndim != 2 || batched_b)) {
        snprintf(g->err, sizeof g->err, "matmul: no gradient for a transposed batched operand");
        return -1;
    }
    if (needs(a, A)) {
        int d;
        if (!ta) d = matmul(a, dy, B, 0, !tb);          /* dC B^T  or  dC B */
        else d = tb ? matmul(a, B, dy, 1, 1) : matmul(a, B, dy, 0, 1); /* (B dC^T) */
        if (accumulate(a, A, d)) return -1;
    }
    if (needs(a, B)) {
        int d;
        if (ta) d = tb ? matmul(a, dy, A, 1, 1) : matmul(a, A, dy, 0, 0);
        else if (batched_b) d = tb ? matmul(a, dy, A, 1, 0) : matmul(a, A, dy, 1, 0);
        else {
            int a2 = rows(a, A), d2 = rows(a, dy);
            if (a2 < 0 || d2 < 0) return -1;
            d = tb ? matmul(a, d2, a2, 1, 0) : matmul(a, a2, d2, 1, 0);
        }
        if (accumulate(a, B, d)) return -1;
    }
    return 0;
}

GRAD(linear)
{
    ck_graph *g = a->g;
    const int *in = n->in;
    int d2 = rows(a, dy);
    if (d2 < 0) return -1;
    if (needs(a, in[0])) {
        int d = matmul(a, d2, in[1], 0, 0);
        if (d < 0 || accumulate(a, in[0], reshape(a, d, &g->t[in[0]].shape))) return -1;
    }
    if (needs(a, in[1])) {
        int x2 = rows(a, in[0]);
        if (x2 < 0 || accumulate(a, in[1], matmul(a, d2, x2, 1, 0))) return -1;
    }
    if (n->nin == 3 && needs(a, in[2]) && accumulate(a, in[2], reduce_to(a, d2, in[2]))) return -1;
    return 0;
}

/* GEGLU's backward on the saved product h, then the product's gradients */
GRAD(linear_geglu)
{
    int bi[2] = {dy, n->out[1]};
    int dh = emit1(a, CK_OP_GEGLU_BWD, bi, 2, &n->p, NULL);
    return dh < 0 ? -1 : grad_linear(a, n, dh);
}

GRAD(conv2d)
{
    ck_graph *g = a->g;
    const int *in = n->in;
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT], want[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (needs(a, in[0])) {
        int bi[2] = {dy, in[1]};
        if (accumulate(a, in[0], emit1(a, CK_OP_CONV2D_BWD_DATA, bi, 2, &n->p, &g->t[in[0]].shape))) return -1;
    }
    int wb = needs(a, in[1]), bb = n->nin == 3 && needs(a, in[2]);
    if (wb || bb) {
        int bi[2] = {dy, in[0]};
        outs[0] = g->t[in[1]].shape;
        want[0] = wb;
        want[1] = bb;
        if (emit(a, CK_OP_CONV2D_BWD_FILTER, bi, 2, &n->p, outs, want, ids) < 0) return -1;
        if (wb && accumulate(a, in[1], ids[0])) return -1;
        if (bb && accumulate(a, in[2], ids[1])) return -1;
    }
    return 0;
}

/* one backward node on bi[0..nbi) whose outputs are the gradients of the
 * first nout inputs, each of them wanted where that input is there (a norm's
 * parameters are optional) and needs one */
static int grad_multi(ad *a, const ck_node *n, const int *bi, int nbi, int nout, const ck_op_params *p)
{
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT], want[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    for (int k = 0; k < nout; k++) want[k] = k < n->nin && needs(a, n->in[k]);
    if (emit(a, ck_op_backward(n->op), bi, nbi, p, outs, want, ids) < 0) return -1;
    for (int k = 0; k < nout; k++)
        if (want[k] && accumulate(a, n->in[k], ids[k])) return -1;
    return 0;
}

/* dx, dgamma, dbeta (an RMS norm: dx, dweight) from dy, x and gamma where the
 * forward has one (layer and RMS norms may have none) */
GRAD(norm)
{
    int bi[3] = {dy, n->in[0], n->nin > 1 ? n->in[1] : -1};
    return grad_multi(a, n, bi, n->nin > 1 ? 3 : 2, ck_op_nout(ck_op_backward(n->op)), &n->p);
}

/* dx, dgamma, dbeta from dy, x, gamma and beta (the pre-activation is recomputed) */
GRAD(norm_silu)
{
    int bi[4] = {dy, n->in[0], n->in[1], n->in[2]};
    return grad_multi(a, n, bi, 4, 3, &n->p);
}

GRAD(attention)
{
    int bi[4] = {dy, n->in[0], n->in[1], n->in[2]};
    return grad_multi(a, n, bi, 4, 3, &n->p);
}

/* the inverse rotation of dy by the same table */
GRAD(rope)
{
    if (needs(a, n->in[1])) {
        snprintf(a->g->err, sizeof a->g->err, "rope: no gradient for the table (a graph input)");
        return -1;
    }
    ck_op_params p = n->p;
    p.i[0] = !n->p.i[0];
    int bi[2] = {dy, n->in[1]};
    return accumulate(a, n->in[0], emit1(a, CK_OP_ROPE, bi, 2, &p, NULL));
}

/* dx, dshift, dscale from dy, x and scale */
GRAD(modulate)
{
    int bi[3] = {dy, n->in[0], n->in[2]};
    return grad_multi(a, n, bi, 3, 3, &n->p);
}

/* x's gradient is dy; gate's and y's come from dy, gate and y */
GRAD(gate)
{
    const int *in = n->in;
    if (needs(a, in[0]) && accumulate(a, in[0], dy)) return -1;
    if (!needs(a, in[1]) && !needs(a, in[2])) return 0;
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT], want[CK_MAX_OUT] = {needs(a, in[1]), needs(a, in[2])};
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    int bi[3] = {dy, in[1], in[2]};
    if (emit(a, CK_OP_GATE_BWD, bi, 3, &n->p, outs, want, ids) < 0) return -1;
    if (want[0] && accumulate(a, in[1], ids[0])) return -1;
    if (want[1] && accumulate(a, in[2], ids[1])) return -1;
    return 0;
}

GRAD(mse_loss)
{
    static const ck_op_params none;
    int bi[3] = {dy, n->in[0], n->in[1]};
    return grad_multi(a, n, bi, 3, 2, &none);
}

/* elementwise (or GEGLU's halves): dx from dy and the input x */
GRAD(dy_x)
{
    int bi[2] = {dy, n->in[0]};
    return accumulate(a, n->in[0], emit1(a, ck_op_backward(n->op), bi, 2, &n->p, NULL));
}

/* dx from dy and the output y (softmax) */
GRAD(dy_y)
{
    int bi[2] = {dy, n->out[0]};
    return accumulate(a, n->in[0], emit1(a, ck_op_backward(n->op), bi, 2, &n->p, NULL));
}

/* dx from dy alone */
GRAD(dy)
{
    static const ck_op_params none;
    return accumulate(a, n->in[0], emit1(a, ck_op_backward(n->op), &dy, 1, &none, NULL));
}

/* dx from dy alone, of x's shape */
GRAD(mean)
{
    static const ck_op_params none;
    return accumulate(a, n->in[0], emit1(a, ck_op_backward(n->op), &dy, 1, &none, &a->g->t[n->in[0]].shape));
}

/* the op itself, with its parameters, on dy: scale, and dropout (the same key draws the same mask) */
GRAD(self)
{
    return accumulate(a, n->in[0], emit1(a, n->op, &dy, 1, &n->p, NULL));
}

GRAD(add_sub)
{
    const int *in = n->in;
    if (needs(a, in[0]) && accumulate(a, in[0], reduce_to(a, dy, in[0]))) return -1;
    if (needs(a, in[1])) {
        int d = dy;
        if (n->op == CK_OP_SUB) {
            ck_op_params p = {0};
            p.f[0] = -1.0f;
            d = emit1(a, CK_OP_SCALE, &dy, 1, &p, NULL);
        }
        if (accumulate(a, in[1], reduce_to(a, d, in[1]))) return -1;
    }
    return 0;
}

GRAD(mul)
{
    static const ck_op_params none;
    const int *in = n->in;
    for (int k = 0; k < 2; k++)
        if (needs(a, in[k])) {
            int bi[2] = {dy, in[1 - k]};
            int d = emit1(a, CK_OP_MUL, bi, 2, &none, NULL);
            if (d < 0 || accumulate(a, in[k], reduce_to(a, d, in[k]))) return -1;
        }
    return 0;
}

GRAD(concat)
{
    ck_graph *g = a->g;
    const int *in = n->in;
    int64_t dim = n->p.i[0], ca = g->t[in[0]].shape.d[dim];
    for (int k = 0; k < 2; k++)
        if (needs(a, in[k])) {
            ck_op_params p = {0};
            p.i[0] = dim;
            p.i[1] = k ? ca : 0;
            p.i[2] = g->t[in[k]].shape.d[dim];
            if (accumulate(a, in[k], emit1(a, CK_OP_SLICE, &dy, 1, &p, NULL))) return -1;
        }
    return 0;
}

/* zeros before and after the slice, concatenated around dy */
GRAD(slice)
{
    int64_t dim = n->p.i[0], start = n->p.i[1], len = n->p.i[2];
    /* a copy: each node emitted may move the graph's tensor table */
    const ck_shape xs = a->g->t[n->in[0]].shape;
    int d = dy;
    ck_op_params zero = {0}, cat = {0};
    cat.i[0] = dim;
    if (start > 0) {
        ck_shape s = xs;
        s.d[dim] = start;
        int z = emit1(a, CK_OP_FILL, NULL, 0, &zero, &s);
        int bi[2] = {z, d};
        d = z < 0 ? -1 : emit1(a, CK_OP_CONCAT, bi, 2, &cat, NULL);
    }
    if (d >= 0 && start + len < xs.d[dim]) {
        ck_shape s = xs;
        s.d[dim] = xs.d[dim] - start - len;
        int z = emit1(a, CK_OP_FILL, NULL, 0, &zero, &s);
        int bi[2] = {d, z};
        d = z < 0 ? -1 : emit1(a, CK_OP_CONCAT, bi, 2, &cat, NULL);
    }
    return accumulate(a, n->in[0], d);
}

GRAD(reshape) { return accumulate(a, n->in[0], reshape(a, dy, &a->g->t[n->in[0]].shape)); }

GRAD(permute)
{
    ck_op_params p = {0};
    for (int i = 0; i < a->g->t[n->in[0]].shape.ndim; i++) p.i[n->p.i[i]] = i;
    return accumulate(a, n->in[0], emit1(a, CK_OP_PERMUTE, &dy, 1, &p, NULL));
}

typedef int grad_fn(ad *, const ck_node *, int);
#define grad_none NULL

static grad_fn *const grad_rules[] = {
#define CK_OP(E, id, lo, hi, nout, infer, grad, ...) [CK_OP_##E] = grad_##grad,
#include "../../ops/ops.def"
};
_Static_assert(sizeof grad_rules / sizeof grad_rules[0] == CK_OP_COUNT, "a gradient rule (or none) for every op");

/* Gradients of the inputs of node n from the gradient dy of its first output. */
static int backward(ad *a, const ck_node *n, int dy)
{
    if ((unsigned)n->op >= CK_OP_COUNT || !grad_rules[n->op]) {
        snprintf(a->g->err, sizeof a->g->err, "%s: no gradient rule", ck_op_name(n->op));
        return -1;
    }
    return grad_rules[n->op](a, n, dy);
}

int ck_autodiff(ck_graph *g, int loss, int seed_t)
{
    if (loss < 0 || loss >= g->nt || ck_shape_numel(&g->t[loss].shape) != 1) {
        snprintf(g->err, sizeof g->err, "the loss must be a tensor with one element");
        return -1;
    }
    ad a = {g, NULL, NULL};
    int cap = g->nt * 4 + 64, rc = -1;
    a.grad = malloc(sizeof(int) * (size_t)cap);
    if (!a.grad) return -1;
    for (int i = 0; i < cap; i++) a.grad[i] = -1;

    int nfwd = g->nn;
    if (g->t[loss].needs_grad && seed_t >= 0) {
        a.grad[loss] = seed_t;
    } else if (g->t[loss].needs_grad) {
        ck_node seed = {0};
        ck_op_params one = {0};
        one.f[0] = 1.0f;
        seed.scope = g->t[loss].scope;
        seed.where = g->t[loss].where;
        a.fwd = &seed;
        a.grad[loss] = emit1(&a, CK_OP_FILL, NULL, 0, &one, &g->t[loss].shape);
        if (a.grad[loss] < 0) goto out;
    }
    for (int i = nfwd - 1; i >= 0; i--) {
        ck_node n = g->n[i];
        int y = n.out[0];
        if (y < 0 || a.grad[y] < 0 || !g->t[y].needs_grad) continue;
        if (g->nt + 64 > cap) {
            int ncap = 2 * (g->nt + 64);
            int *gr = realloc(a.grad, sizeof(int) * (size_t)ncap);
            if (!gr) goto out;
            for (int k = cap; k < ncap; k++) gr[k] = -1;
            a.grad = gr;
            cap = ncap;
        }
        a.fwd = &n;
        if (backward(&a, &n, a.grad[y])) goto out;
    }
    for (int t = 0; t < g->nt; t++) {
        if (g->t[t].kind != CK_KIND_PARAM) continue;
        int d = t < cap ? a.grad[t] : -1;
        if (d < 0) { /* a parameter the loss does not reach: its gradient is zero */
            ck_node seed = {0};
            ck_op_params zero = {0};
            seed.scope = g->t[t].scope;
            seed.where = g->t[t].where;
            a.fwd = &seed;
            d = emit1(&a, CK_OP_FILL, NULL, 0, &zero, &g->t[t].shape);
            if (d < 0) goto out;
        }
        g->t[t].grad = d;
        g->t[d].kind = CK_KIND_GRAD;
    }
    rc = 0;
out:
    free(a.grad);
    return rc;
}
