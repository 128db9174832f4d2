/* Random models for the planner's tests (test_evaluate, test_optimal): a
 * pool of width-8 activations on b rows that each new op (linear, silu, add,
 * mul, a reshape round trip, layer norm, slices joined, gelu) draws its
 * inputs from, and an MSE loss on the last; next() is the tests' xorshift,
 * one stream per test. Include after graph/graph.h. */
#ifndef CK_TEST_RANDOM_MODEL_H
#define CK_TEST_RANDOM_MODEL_H

#include <stdint.h>
#include <stdio.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int node(ck_graph *g, enum ck_op op, const int *in, int nin, const ck_op_params *p, const ck_shape *want,
                int *out)
{
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (want) outs[0] = *want;
    const int v = ck_graph_node(g, op, in, nin, p, outs, NULL, ids, "model.lua:1");
    if (v >= 0 && out) *out = ids[0];
    return v;
}

/* a random model of width 8 on a batch of b rows: a pool of activations
 * that each new op draws its inputs from; the loss is the MSE of the last
 * one against a target */
static ck_graph *random_model(int b, int depth, int *loss)
{
    ck_graph *g = ck_graph_new();
    ck_shape sx = {2, {b, 8}}, sw = {2, {8, 8}}, sbias = {1, {8}};
    int pool[256], np = 0;
    pool[np++] = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "model.lua:1");
    const int target = ck_graph_leaf(g, CK_KIND_INPUT, "target", &sx, "model.lua:1");
    const int gamma = ck_graph_leaf(g, CK_KIND_FROZEN, "norm.weight", &sbias, "model.lua:1");
    const int beta = ck_graph_leaf(g, CK_KIND_FROZEN, "norm.bias", &sbias, "model.lua:1");
    for (int d = 0; d < depth && np < 250; d++) {
        const int a = pool[np - 1 - (int)(next() % (uint64_t)(np < 4 ? np : 4))];
        const int c = pool[next() % (uint64_t)np];
        ck_op_params p = {{0}, {0}};
        char name[32];
        int out = -1;
        switch (next() % 9) {
        case 0:
        case 1: {
            snprintf(name, sizeof name, "l%d.weight", d);
            const int w = ck_graph_leaf(g, next() % 2 ? CK_KIND_PARAM : CK_KIND_FROZEN, name, &sw, "model.lua:2");
            snprintf(name, sizeof name, "l%d.bias", d);
            const int bias = ck_graph_leaf(g, CK_KIND_PARAM, name, &sbias, "model.lua:2");
            const int in[3] = {a, w, bias};
            node(g, CK_OP_LINEAR, in, 3, &p, NULL, &out);
            break;
        }
        case 2: node(g, CK_OP_SILU, &a, 1, &p, NULL, &out); break;
        case 3: {
            const int in[2] = {a, c};
            node(g, CK_OP_ADD, in, 2, &p, NULL, &out);
            break;
        }
        case 4: {
            const int in[2] = {a, c};
            node(g, CK_OP_MUL, in, 2, &p, NULL, &out);
            break;
        }
        case 5: { /* through another shape and back: the planner aliases both */
            ck_shape s2 = {2, {2 * b, 4}};
            int mid = -1;
            node(g, CK_OP_RESHAPE, &a, 1, &p, &s2, &mid);
            node(g, CK_OP_SILU, &mid, 1, &p, NULL, &mid);
            node(g, CK_OP_RESHAPE, &mid, 1, &p, &sx, &out);
            break;
        }
        case 6: {
            const int in[3] = {a, gamma, beta};
            p.f[0] = 1e-5f;
            node(g, CK_OP_LAYER_NORM, in, 3, &p, NULL, &out);
            break;
        }
        case 7: { /* two halves joined */
            int lo = -1, hi = -1;
            p.i[0] = 1;
            p.i[1] = 0;
            p.i[2] = 4;
            node(g, CK_OP_SLICE, &a, 1, &p, NULL, &lo);
            p.i[1] = 4;
            node(g, CK_OP_SLICE, &c, 1, &p, NULL, &hi);
            const int in[2] = {lo, hi};
            p.i[0] = 1;
            node(g, CK_OP_CONCAT, in, 2, &p, NULL, &out);
            break;
        }
        default: node(g, CK_OP_GELU, &a, 1, &p, NULL, &out); break;
        }
        if (out >= 0) pool[np++] = out;
    }
    const int in[2] = {pool[np - 1], target};
    ck_op_params p = {{0}, {0}};
    node(g, CK_OP_MSE_LOSS, in, 2, &p, NULL, loss);
    return g;
}

#endif
