/* Shape, workspace and cost rules of every op: the one place that knows what an
 * op accepts. Graph construction calls ck_op_infer, the planner ck_op_workspace,
 * the policies ck_op_flops. */
#include "ops.h"
#include "adam8.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const names[] = {
#define CK_OP(E, id, ...) [CK_OP_##E] = #id,
#include "ops.def"
};
_Static_assert(sizeof names / sizeof names[0] == CK_OP_COUNT, "a name for every op in ops.def");

static const unsigned char nouts[] = {
#define CK_OP(E, id, lo, hi, nout, ...) [CK_OP_##E] = nout,
#include "ops.def"
};
_Static_assert(sizeof nouts / sizeof nouts[0] == CK_OP_COUNT, "an output count for every op in ops.def");

static const enum ck_op backward_ops[] = {
#define CK_OP(E, id, lo, hi, nout, infer, grad, bwd, ...) [CK_OP_##E] = CK_OP_##bwd,
#include "ops.def"
};
_Static_assert(sizeof backward_ops / sizeof backward_ops[0] == CK_OP_COUNT, "a backward op for every op in ops.def");

#define CK_PREC_NO 0
#define CK_PREC_F32 CK_PREC_MASK_F32
#define CK_PREC_F32_BF16 (CK_PREC_MASK_F32 | CK_PREC_MASK_BF16)
#define CK_PREC_F32_BF16_F16 (CK_PREC_MASK_F32 | CK_PREC_MASK_BF16 | CK_PREC_MASK_F16)
static const unsigned char precisions[][2] = {
#define CK_OP(E, id, lo, hi, nout, infer, grad, bwd, cheap, autocast, cpu, cuda, ...) [CK_OP_##E] = {CK_PREC_##cpu, CK_PREC_##cuda},
#include "ops.def"
};
_Static_assert(sizeof precisions / sizeof precisions[0] == CK_OP_COUNT, "precisions for every op in ops.def");

const char *ck_op_name(enum ck_op op)
{
    if (op == CK_OP_NONE || (unsigned)op >= CK_OP_COUNT) return "?";
    return names[op];
}

int ck_op_nout(enum ck_op op)
{
    if ((unsigned)op >= CK_OP_COUNT) return 1;
    return nouts[op];
}

enum ck_op ck_op_backward(enum ck_op op)
{
    if ((unsigned)op >= CK_OP_COUNT) return CK_OP_NONE;
    return backward_ops[op];
}

unsigned ck_op_precisions(enum ck_op op, int cuda)
{
    if ((unsigned)op >= CK_OP_COUNT) return 0;
    return precisions[op][cuda != 0];
}

int ck_shape_eq(const ck_shape *a, const ck_shape *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->d[i] != b->d[i]) return 0;
    return 1;
}

const char *ck_shape_str(const ck_shape *s, char *buf, size_t len)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, len - k, "[");
    for (int i = 0; i < s->ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ", %lld" : "%lld", (long long)s->d[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

#define FAIL(...) return fail(err, errlen, __VA_ARGS__)
#define SH(s, buf) ck_shape_str((s), buf, sizeof buf)

static int want_nin(int nin, int lo, int hi, char *err, size_t errlen)
{
    if (nin < lo || nin > hi) {
        if (lo == hi) FAIL("takes %d inputs, got %d", lo, nin);
        FAIL("takes %d to %d inputs, got %d", lo, hi, nin);
    }
    return 0;
}

static int same_shape(const ck_shape *a, const ck_shape *b, const char *an, const char *bn, char *err,
                      size_t errlen)
{
    char x[96], y[96];
    if (!ck_shape_eq(a, b)) FAIL("%s has shape %s, %s has shape %s", an, SH(a, x), bn, SH(b, y));
    return 0;
}

/* numpy broadcasting, shapes aligned on the right */
static int broadcast(const ck_shape *a, const ck_shape *b, ck_shape *o, char *err, size_t errlen)
{
    char x[96], y[96];
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    o->ndim = n;
    for (int i = 0; i < n; i++) {
        int ia = a->ndim - n + i, ib = b->ndim - n + i;
        int64_t da = ia >= 0 ? a->d[ia] : 1, db = ib >= 0 ? b->d[ib] : 1;
        if (da != db && da != 1 && db != 1) FAIL("shapes %s and %s do not broadcast", SH(a, x), SH(b, y));
        o->d[i] = da == 1 ? db : da;
    }
    return 0;
}

static int conv_out(const ck_op_params *p, const ck_shape *x, const ck_shape *w, ck_shape *o, char *err,
                    size_t errlen)
{
    char a[96], b[96];
    if (x->ndim != 4) FAIL("input must be 4-D (N, C, H, W), got %s", SH(x, a));
    if (w->ndim != 4) FAIL("weight must be 4-D (O, C, KH, KW), got %s", SH(w, a));
    if (x->d[1] != w->d[1])
        FAIL("input has %lld channels, weight expects %lld", (long long)x->d[1], (long long)w->d[1]);
    if (w->d[2] < 1 || w->d[3] < 1) FAIL("kernel %s has no taps", SH(w, a));
    if (p->i[0] < 1 || p->i[1] < 1 || p->i[2] < 0 || p->i[3] < 0) FAIL("stride must be >= 1 and padding >= 0");
    int64_t hp = x->d[2] + 2 * p->i[2] - w->d[2], wp = x->d[3] + 2 * p->i[3] - w->d[3];
    if (hp < 0 || wp < 0) FAIL("kernel %s larger than padded input %s", SH(w, a), SH(x, b));
    o->ndim = 4;
    o->d[0] = x->d[0];
    o->d[1] = w->d[0];
    o->d[2] = hp / p->i[0] + 1;
    o->d[3] = wp / p->i[1] + 1;
    return 0;
}

/* gamma (and beta) may be NULL: a layer or RMS norm without them. *c gets the
 * channel count (a group norm's dim 1, otherwise the last dim). */
static int norm_check(enum ck_op op, const ck_op_params *p, const ck_shape *x, const ck_shape *gamma,
                      const ck_shape *beta, int64_t *c, char *err, size_t errlen)
{
    char a[96];
    if (op == CK_OP_GROUP_NORM || op == CK_OP_GROUP_NORM_BWD || op == CK_OP_GROUP_NORM_SILU ||
        op == CK_OP_GROUP_NORM_SILU_BWD) {
        if (x->ndim < 2) FAIL("input must be (N, C, ...), got %s", SH(x, a));
        *c = x->d[1];
        if (p->i[0] < 1 || *c % p->i[0]) FAIL("%lld channels do not split into %lld groups", (long long)*c, (long long)p->i[0]);
    } else {
        if (x->ndim < 1) FAIL("input must have at least one dim");
        *c = x->d[x->ndim - 1];
    }
    if (gamma && (gamma->ndim != 1 || gamma->d[0] != *c))
        FAIL("weight has shape %s, input has %lld channels", SH(gamma, a), (long long)*c);
    if (beta && (beta->ndim != 1 || beta->d[0] != *c))
        FAIL("bias has shape %s, input has %lld channels", SH(beta, a), (long long)*c);
    if (!(p->f[0] >= 0.0f)) FAIL("eps must be >= 0, got %g", (double)p->f[0]);
    return 0;
}

static int attn_check(const ck_op_params *p, const ck_shape *q, const ck_shape *k, const ck_shape *v, char *err,
                      size_t errlen)
{
    char a[96], b[96];
    if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3) FAIL("q, k, v must be 3-D (B, L, H*D)");
    if (q->d[0] != k->d[0] || k->d[0] != v->d[0]) FAIL("batch differs: q %s, k %s", SH(q, a), SH(k, b));
    if (!ck_shape_eq(k, v)) FAIL("k has shape %s, v has shape %s", SH(k, a), SH(v, b));
    if (q->d[2] != k->d[2]) FAIL("q has %lld features, k has %lld", (long long)q->d[2], (long long)k->d[2]);
    if (p->i[0] < 1 || q->d[2] % p->i[0])
        FAIL("%lld features do not split into %lld heads", (long long)q->d[2], (long long)p->i[0]);
    return 0;
}

static int matmul_out(const ck_op_params *p, const ck_shape *a, const ck_shape *b, ck_shape *o, char *err,
                      size_t errlen)
{
    char x[96], y[96];
    if (a->ndim < 2 || b->ndim < 2) FAIL("operands must be at least 2-D, got %s and %s", SH(a, x), SH(b, y));
    int64_t m = p->i[0] ? a->d[a->ndim - 1] : a->d[a->ndim - 2];
    int64_t ka = p->i[0] ? a->d[a->ndim - 2] : a->d[a->ndim - 1];
    int64_t kb = p->i[1] ? b->d[b->ndim - 1] : b->d[b->ndim - 2];
    int64_t n = p->i[1] ? b->d[b->ndim - 2] : b->d[b->ndim - 1];
    if (ka != kb) FAIL("inner dims differ: %s x %s", SH(a, x), SH(b, y));
    if (b->ndim > 2) {
        if (b->ndim != a->ndim) FAIL("batched operands differ in rank: %s x %s", SH(a, x), SH(b, y));
        for (int i = 0; i < a->ndim - 2; i++)
            if (a->d[i] != b->d[i]) FAIL("batch dims differ: %s x %s", SH(a, x), SH(b, y));
    }
    *o = *a;
    o->d[o->ndim - 2] = m;
    o->d[o->ndim - 1] = n;
    return 0;
}

/* The output shape broadcasts to the input shape (the backward of broadcasting). */
static int reduce_check(const ck_shape *x, const ck_shape *o, char *err, size_t errlen)
{
    char a[96], b[96];
    if (o->ndim > x->ndim) FAIL("cannot reduce %s to %s", SH(x, a), SH(o, b));
    for (int i = 0; i < o->ndim; i++) {
        int64_t dx = x->d[x->ndim - o->ndim + i];
        if (o->d[i] != dx && o->d[i] != 1) FAIL("cannot reduce %s to %s", SH(x, a), SH(o, b));
    }
    return 0;
}

static int check_dim(int64_t dim, int ndim, char *err, size_t errlen)
{
    if (dim < 0 || dim >= ndim) FAIL("dim %lld out of range for %d dims", (long long)dim, ndim);
    return 0;
}

#define RULE(name) \
    static int infer_##name(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, ck_shape *out, \
                            char *err, size_t errlen)

RULE(matmul)
{
    (void)op, (void)nin;
    return matmul_out(p, &in[0], &in[1], &out[0], err, errlen);
}

RULE(linear)
{
    char a[96];
    (void)op, (void)p;
    if (in[1].ndim != 2) FAIL("weight must be 2-D (out, in), got %s", SH(&in[1], a));
    if (in[0].ndim < 1 || in[0].d[in[0].ndim - 1] != in[1].d[1])
        FAIL("input has %lld features, weight expects %lld", (long long)(in[0].ndim ? in[0].d[in[0].ndim - 1] : 0),
             (long long)in[1].d[1]);
    if (nin == 3 && (in[2].ndim != 1 || in[2].d[0] != in[1].d[0]))
        FAIL("bias has shape %s, weight has %lld outputs", SH(&in[2], a), (long long)in[1].d[0]);
    out[0] = in[0];
    out[0].d[out[0].ndim - 1] = in[1].d[0];
    return 0;
}

RULE(conv2d)
{
    char a[96];
    (void)op;
    if (conv_out(p, &in[0], &in[1], &out[0], err, errlen)) return -1;
    if (nin == 3 && (in[2].ndim != 1 || in[2].d[0] != in[1].d[0]))
        FAIL("bias has shape %s, weight has %lld outputs", SH(&in[2], a), (long long)in[1].d[0]);
    return 0;
}

/* out[0] preset to x's shape */
RULE(conv2d_bwd_data)
{
    ck_shape y;
    (void)op, (void)nin;
    if (conv_out(p, &out[0], &in[1], &y, err, errlen)) return -1;
    return same_shape(&in[0], &y, "dy", "conv output", err, errlen);
}

/* out[0] preset to w's shape */
RULE(conv2d_bwd_filter)
{
    ck_shape y;
    (void)op, (void)nin;
    if (conv_out(p, &in[1], &out[0], &y, err, errlen)) return -1;
    if (same_shape(&in[0], &y, "dy", "conv output", err, errlen)) return -1;
    out[1].ndim = 1;
    out[1].d[0] = out[0].d[0];
    return 0;
}

/* x, then the optional gamma and beta (layer and RMS norms) */
RULE(norm)
{
    int64_t c = 0;
    if (norm_check(op, p, &in[0], nin > 1 ? &in[1] : NULL, nin > 2 ? &in[2] : NULL, &c, err, errlen)) return -1;
    out[0] = in[0];
    return 0;
}

/* dy, x, then the forward's gamma where it has one (GROUP_NORM_SILU_BWD takes
 * beta too: the pre-activation is recomputed); out dx and the parameters'
 * gradients, [C] each whether or not the forward has the parameter */
RULE(norm_bwd)
{
    int64_t c = 0;
    if (norm_check(op, p, &in[1], nin > 2 ? &in[2] : NULL, nin > 3 ? &in[3] : NULL, &c, err, errlen)) return -1;
    if (same_shape(&in[0], &in[1], "dy", "x", err, errlen)) return -1;
    out[0] = in[1];
    for (int k = 1; k < ck_op_nout(op); k++) {
        out[k].ndim = 1;
        out[k].d[0] = c;
    }
    return 0;
}

/* out like the one input */
RULE(same)
{
    (void)op, (void)p, (void)nin, (void)err, (void)errlen;
    out[0] = in[0];
    return 0;
}

RULE(softmax)
{
    (void)op, (void)p, (void)nin;
    if (in[0].ndim < 1) FAIL("input must have at least one dim");
    out[0] = in[0];
    return 0;
}

RULE(dropout)
{
    (void)op, (void)nin;
    if (!(p->f[0] >= 0.0f && p->f[0] < 1.0f)) FAIL("probability %g not in [0, 1)", p->f[0]);
    out[0] = in[0];
    return 0;
}

/* in dy, x of one shape; out like them */
RULE(dy_like_x)
{
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[0], &in[1], "dy", "x", err, errlen)) return -1;
    out[0] = in[0];
    return 0;
}

RULE(geglu)
{
    char a[96];
    (void)op, (void)p, (void)nin;
    if (in[0].ndim < 1 || in[0].d[in[0].ndim - 1] % 2)
        FAIL("last dim of %s must be even (value and gate halves)", SH(&in[0], a));
    out[0] = in[0];
    out[0].d[out[0].ndim - 1] /= 2;
    return 0;
}

RULE(geglu_bwd)
{
    char a[96];
    ck_shape y;
    (void)op, (void)p, (void)nin;
    if (in[1].ndim < 1 || in[1].d[in[1].ndim - 1] % 2) FAIL("last dim of %s must be even", SH(&in[1], a));
    y = in[1];
    y.d[y.ndim - 1] /= 2;
    if (same_shape(&in[0], &y, "dy", "output", err, errlen)) return -1;
    out[0] = in[1];
    return 0;
}

/* out[0] y [..,D] = geglu(h), out[1] h [..,2D] = x w^T + b: the two rules in turn */
RULE(linear_geglu)
{
    (void)op;
    return infer_linear(CK_OP_LINEAR, p, in, nin, &out[1], err, errlen) ||
           infer_geglu(CK_OP_GEGLU, p, &out[1], 1, &out[0], err, errlen);
}

RULE(attention)
{
    (void)op, (void)nin;
    if (attn_check(p, &in[0], &in[1], &in[2], err, errlen)) return -1;
    out[0] = in[0];
    return 0;
}

RULE(attention_bwd)
{
    (void)op, (void)nin;
    if (attn_check(p, &in[1], &in[2], &in[3], err, errlen)) return -1;
    if (same_shape(&in[0], &in[1], "dout", "q", err, errlen)) return -1;
    out[0] = in[1];
    out[1] = in[2];
    out[2] = in[3];
    return 0;
}

RULE(broadcast)
{
    (void)op, (void)p, (void)nin;
    return broadcast(&in[0], &in[1], &out[0], err, errlen);
}

RULE(reduce_to)
{
    (void)op, (void)p, (void)nin;
    return reduce_check(&in[0], &out[0], err, errlen);
}

RULE(concat)
{
    char a[96], b[96];
    (void)op, (void)nin;
    if (in[0].ndim != in[1].ndim) FAIL("cannot concat %s and %s", SH(&in[0], a), SH(&in[1], b));
    if (check_dim(p->i[0], in[0].ndim, err, errlen)) return -1;
    for (int i = 0; i < in[0].ndim; i++)
        if (i != p->i[0] && in[0].d[i] != in[1].d[i])
            FAIL("cannot concat %s and %s along dim %lld", SH(&in[0], a), SH(&in[1], b), (long long)p->i[0]);
    out[0] = in[0];
    out[0].d[p->i[0]] += in[1].d[p->i[0]];
    return 0;
}

RULE(slice)
{
    char a[96];
    (void)op, (void)nin;
    if (check_dim(p->i[0], in[0].ndim, err, errlen)) return -1;
    if (p->i[1] < 0 || p->i[2] < 0 || p->i[1] + p->i[2] > in[0].d[p->i[0]])
        FAIL("slice [%lld, %lld) out of range for %s", (long long)p->i[1], (long long)(p->i[1] + p->i[2]),
             SH(&in[0], a));
    out[0] = in[0];
    out[0].d[p->i[0]] = p->i[2];
    return 0;
}

RULE(reshape)
{
    char a[96], b[96];
    (void)op, (void)p, (void)nin;
    if (ck_shape_numel(&in[0]) != ck_shape_numel(&out[0]))
        FAIL("cannot reshape %s to %s", SH(&in[0], a), SH(&out[0], b));
    return 0;
}

RULE(permute)
{
    int seen[CK_MAX_DIMS] = {0};
    (void)op, (void)nin;
    out[0].ndim = in[0].ndim;
    for (int i = 0; i < in[0].ndim; i++) {
        if (p->i[i] < 0 || p->i[i] >= in[0].ndim || seen[p->i[i]]) FAIL("not a permutation of %d dims", in[0].ndim);
        seen[p->i[i]] = 1;
        out[0].d[i] = in[0].d[p->i[i]];
    }
    return 0;
}

RULE(upsample2x)
{
    char a[96];
    (void)op, (void)p, (void)nin;
    if (in[0].ndim != 4) FAIL("input must be 4-D (N, C, H, W), got %s", SH(&in[0], a));
    out[0] = in[0];
    out[0].d[2] *= 2;
    out[0].d[3] *= 2;
    return 0;
}

RULE(upsample2x_bwd)
{
    char a[96];
    (void)op, (void)p, (void)nin;
    if (in[0].ndim != 4 || in[0].d[2] % 2 || in[0].d[3] % 2) FAIL("dy must be (N, C, 2H, 2W), got %s", SH(&in[0], a));
    out[0] = in[0];
    out[0].d[2] /= 2;
    out[0].d[3] /= 2;
    return 0;
}

RULE(mean)
{
    (void)op, (void)p, (void)nin;
    if (ck_shape_numel(&in[0]) == 0) FAIL("mean of an empty tensor");
    out[0].ndim = 0;
    return 0;
}

RULE(mean_bwd)
{
    (void)op, (void)p, (void)nin, (void)out;
    if (ck_shape_numel(&in[0]) != 1) FAIL("dy must be a scalar");
    return 0;
}

RULE(mse_loss)
{
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[0], &in[1], "prediction", "target", err, errlen)) return -1;
    out[0].ndim = 0;
    return 0;
}

RULE(mse_loss_bwd)
{
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[1], &in[2], "prediction", "target", err, errlen)) return -1;
    out[0] = in[1];
    out[1] = in[2];
    return 0;
}

RULE(timestep_embedding)
{
    char a[96];
    (void)op, (void)nin;
    if (in[0].ndim != 1) FAIL("timesteps must be 1-D (B), got %s", SH(&in[0], a));
    if (p->i[0] < 2) FAIL("embedding dim must be at least 2");
    if ((float)(p->i[0] / 2) == p->f[0]) FAIL("downscale_freq_shift equals half the dim");
    out[0].ndim = 2;
    out[0].d[0] = in[0].d[0];
    out[0].d[1] = p->i[0];
    return 0;
}

/* out[0] preset */
RULE(fill)
{
    (void)op, (void)p, (void)in, (void)nin, (void)out, (void)err, (void)errlen;
    return 0;
}

RULE(sgd_step)
{
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[0], &in[1], "parameter", "gradient", err, errlen)) return -1;
    out[0] = in[0];
    return 0;
}

RULE(adamw_step)
{
    (void)op, (void)p, (void)nin;
    for (int i = 1; i < 4; i++)
        if (same_shape(&in[0], &in[i], "parameter", "state", err, errlen)) return -1;
    out[0] = out[1] = out[2] = in[0];
    return 0;
}

RULE(lion_step)
{
    (void)op, (void)p, (void)nin;
    for (int i = 1; i < 3; i++)
        if (same_shape(&in[0], &in[i], "parameter", i == 1 ? "gradient" : "state", err, errlen)) return -1;
    out[0] = out[1] = in[0];
    return 0;
}

RULE(adamw8_step)
{
    char a[96], b[96];
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[0], &in[1], "parameter", "gradient", err, errlen)) return -1;
    const int64_t n = ck_shape_numel(&in[0]), nb = (n + CK_ADAM8_BLOCK - 1) / CK_ADAM8_BLOCK;
    if (in[2].ndim != 1 || in[2].d[0] != 2 * n || in[3].ndim != 1 || in[3].d[0] != 2 * nb)
        FAIL("the state must be [%lld] codes and [%lld] scales for %lld values, got %s and %s", (long long)(2 * n),
             (long long)(2 * nb), (long long)n, SH(&in[2], a), SH(&in[3], b));
    out[0] = in[0];
    out[1] = in[2];
    out[2] = in[3];
    return 0;
}

RULE(stats)
{
    (void)op, (void)p, (void)nin;
    if (ck_shape_numel(&in[0]) == 0) FAIL("statistics of an empty tensor");
    out[0].ndim = 1;
    out[0].d[0] = 3;
    return 0;
}

RULE(sumsq)
{
    char a[96];
    (void)op;
    if (p->i[0] != 0 && p->i[0] != 1) FAIL("i0 must be 0 or 1 (a running total first), got %d", p->i[0]);
    if (p->i[0] && nin < 2) FAIL("a running total needs a tensor to add the squares of");
    if (p->i[0] && ck_shape_numel(&in[0]) != 1) FAIL("the running total must be a scalar, got %s", SH(&in[0], a));
    out[0].ndim = 0;
    return 0;
}

RULE(clip_factor)
{
    char a[96];
    (void)op, (void)nin;
    if (ck_shape_numel(&in[0]) != 1) FAIL("takes a scalar, got %s", SH(&in[0], a));
    if (!(p->f[0] > 0.0f)) FAIL("the largest norm must be positive, got %g", (double)p->f[0]);
    out[0].ndim = 0;
    return 0;
}

/* ids [..], table [V, D] -> [.., D] */
RULE(embedding)
{
    char a[96];
    (void)op, (void)p, (void)nin;
    if (in[1].ndim != 2) FAIL("the table must be 2-D (rows, dim), got %s", SH(&in[1], a));
    if (in[0].ndim >= CK_MAX_DIMS) FAIL("ids have %d dims; at most %d leave room for the row", in[0].ndim, CK_MAX_DIMS - 1);
    out[0] = in[0];
    out[0].d[out[0].ndim++] = in[1].d[1];
    return 0;
}

/* x [..,L,F], table [L,D] */
static int rope_check(const ck_shape *x, const ck_shape *t, char *err, size_t errlen)
{
    char a[96], b[96];
    if (x->ndim < 2) FAIL("input must be (.., L, F), got %s", SH(x, a));
    if (t->ndim != 2 || t->d[1] < 2 || t->d[1] % 2)
        FAIL("the table must be (L, D) with D even and at least 2 (a cosine and a sine per pair), got %s", SH(t, a));
    if (t->d[0] != x->d[x->ndim - 2])
        FAIL("the table has %lld positions, the input %lld (its dim %d) in %s", (long long)t->d[0],
             (long long)x->d[x->ndim - 2], x->ndim - 2, SH(x, b));
    if (x->d[x->ndim - 1] % t->d[1])
        FAIL("input %s: its last dim %lld is no multiple of the table's head dim %lld", SH(x, b),
             (long long)x->d[x->ndim - 1], (long long)t->d[1]);
    return 0;
}

RULE(rope)
{
    (void)op, (void)nin;
    if (p->i[0] != 0 && p->i[0] != 1) FAIL("i0 must be 0 (rotate) or 1 (the inverse), got %lld", (long long)p->i[0]);
    if (rope_check(&in[0], &in[1], err, errlen)) return -1;
    out[0] = in[0];
    return 0;
}

/* x [B,..,C] and a per-sample row v [B,C] (a shift, scale or gate) */
static int row_check(const ck_shape *x, const ck_shape *v, const char *vn, char *err, size_t errlen)
{
    char a[96], b[96];
    if (x->ndim < 2) FAIL("input must be (B, .., C), got %s", SH(x, a));
    if (v->ndim != 2 || v->d[0] != x->d[0] || v->d[1] != x->d[x->ndim - 1])
        FAIL("%s has shape %s, input %s wants [%lld, %lld]", vn, SH(v, a), SH(x, b), (long long)x->d[0],
             (long long)x->d[x->ndim - 1]);
    return 0;
}

/* x, shift, scale */
RULE(modulate)
{
    (void)op, (void)p, (void)nin;
    if (row_check(&in[0], &in[1], "shift", err, errlen) || row_check(&in[0], &in[2], "scale", err, errlen)) return -1;
    out[0] = in[0];
    return 0;
}

/* dy, x, scale; out dx, dshift, dscale */
RULE(modulate_bwd)
{
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[0], &in[1], "dy", "x", err, errlen) || row_check(&in[1], &in[2], "scale", err, errlen))
        return -1;
    out[0] = in[1];
    out[1] = out[2] = in[2];
    return 0;
}

/* x, gate, y */
RULE(gate)
{
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[0], &in[2], "x", "y", err, errlen) || row_check(&in[0], &in[1], "gate", err, errlen))
        return -1;
    out[0] = in[0];
    return 0;
}

/* dy, gate, y; out dgate, dy_y */
RULE(gate_bwd)
{
    (void)op, (void)p, (void)nin;
    if (same_shape(&in[0], &in[2], "dy", "y", err, errlen) || row_check(&in[2], &in[1], "gate", err, errlen))
        return -1;
    out[0] = in[1];
    out[1] = in[2];
    return 0;
}

typedef int infer_fn(enum ck_op, const ck_op_params *, const ck_shape *, int, ck_shape *, char *, size_t);
#define infer_none NULL

static const struct rule {
    infer_fn *infer;
    int nin_lo, nin_hi;
} rules[] = {
#define CK_OP(E, id, lo, hi, nout, infer, ...) [CK_OP_##E] = {infer_##infer, lo, hi},
#include "ops.def"
};
_Static_assert(sizeof rules / sizeof rules[0] == CK_OP_COUNT, "a rule for every op in ops.def");

int ck_op_infer(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, ck_shape *out, char *err,
                size_t errlen)
{
    if ((unsigned)op >= CK_OP_COUNT || !rules[op].infer) FAIL("unknown op %d", (int)op);
    if (want_nin(nin, rules[op].nin_lo, rules[op].nin_hi, err, errlen)) return -1;
    return rules[op].infer(op, p, in, nin, out, err, errlen);
}

size_t ck_op_workspace(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out,
                       int nthreads)
{
    (void)p;
    (void)nin;
    switch (op) {
    case CK_OP_CONV2D: /* x, w -> y: columns of one image */
        return (size_t)(in[0].d[1] * in[1].d[2] * in[1].d[3] * out[0].d[2] * out[0].d[3]) * sizeof(float);
    case CK_OP_CONV2D_BWD_DATA: /* dy, w -> dx */
        return (size_t)(out[0].d[1] * in[1].d[2] * in[1].d[3] * in[0].d[2] * in[0].d[3]) * sizeof(float);
    case CK_OP_CONV2D_BWD_FILTER: /* dy, x -> dw */
        return (size_t)(in[1].d[1] * out[0].d[2] * out[0].d[3] * in[0].d[2] * in[0].d[3]) * sizeof(float);
    case CK_OP_ATTENTION:
    case CK_OP_ATTENTION_BWD: {
        /* per thread one (two for the backward) block of scores: rows of LQ as
         * ops/cpu/attention.c's block_rows picks them, times LK */
        const int bwd = op == CK_OP_ATTENTION_BWD;
        const int64_t lq = in[bwd].d[1], lk = in[bwd + 1].d[1];
        int64_t rows = lk > 0 ? 65536 / lk : lq;
        if (rows < 16) rows = 16;
        if (rows > 1024) rows = 1024;
        if (rows > lq) rows = lq;
        return (size_t)nthreads * (size_t)(bwd + 1) * (size_t)(rows * lk) * sizeof(float);
    }
    default: return 0;
    }
}

/* The workspace each CUDA kernel can use, sized for what it does with it
 * (ops/cuda): convolutions the columns of one image as on the CPU, but at most
 * CONV_WS_CAP (and at least one column): cuDNN's implicit-GEMM algorithms,
 * which the deterministic choice prefers, need far less, and our im2col path
 * runs in as many column chunks as the workspace needs; fused attention (head
 * size up to 128, fp32, bf16 and fp16 alike) no workspace forward and row statistics
 * (lse and delta, 2 LQ floats) of every head backward; wider heads score
 * matrices of as many heads as fit in 64 MiB, at least one. The rule sees no
 * dtypes: with 16-bit storage, heads of 129 to 256 run the tensor-core kernels,
 * which use only the row statistics of that workspace, so there the plan
 * holds more than the kernel touches (SDXL's heads are 64). */
#define CONV_WS_CAP ((size_t)32 << 20)

size_t ck_op_workspace_cuda(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out,
                        int nthreads)
{
    (void)nthreads;
    if (op == CK_OP_CONV2D || op == CK_OP_CONV2D_BWD_DATA || op == CK_OP_CONV2D_BWD_FILTER) {
        const size_t all = ck_op_workspace(op, p, in, nin, out, 1);
        /* C*KH*KW: the input's channels (forward: x; data gradient: dx; filter gradient: x) times the taps */
        const ck_shape *w = op == CK_OP_CONV2D_BWD_FILTER ? &out[0] : &in[1];
        const int64_t c = op == CK_OP_CONV2D ? in[0].d[1] : op == CK_OP_CONV2D_BWD_DATA ? out[0].d[1] : in[1].d[1];
        const size_t column = (size_t)(c * w->d[2] * w->d[3]) * sizeof(float);
        if (all <= CONV_WS_CAP) return all;
        return column > CONV_WS_CAP ? column : CONV_WS_CAP;
    }
    if (op == CK_OP_GROUP_NORM || op == CK_OP_GROUP_NORM_BWD || op == CK_OP_GROUP_NORM_SILU ||
        op == CK_OP_GROUP_NORM_SILU_BWD) {
        /* ops/cuda/norm.cu: four partial sums per piece of 4096 positions of a
         * channel (GN_PIECE), then two statistics per (image, group) */
        const ck_shape *x = &in[op == CK_OP_GROUP_NORM || op == CK_OP_GROUP_NORM_SILU ? 0 : 1];
        int64_t s = 1;
        for (int d = 2; d < x->ndim; d++) s *= x->d[d];
        const int64_t n = x->ndim >= 2 ? x->d[0] : 0, c = x->ndim >= 2 ? x->d[1] : 0, g = p->i[0] > 0 ? p->i[0] : 1;
        return sizeof(float) * (size_t)(4 * n * c * ((s + 4095) / 4096) + 2 * n * g);
    }
    if (op == CK_OP_MODULATE_BWD || op == CK_OP_GATE_BWD) {
        /* ops/cuda/modulate.cu: per sample, chunk of rows and column, the
         * partial sums (two for MODULATE_BWD: dshift's and dscale's, one for
         * GATE_BWD) that a second pass adds in chunk order */
        const ck_shape *x = &in[op == CK_OP_MODULATE_BWD ? 1 : 2];
        const int64_t B = x->ndim >= 2 ? x->d[0] : 0, C = x->ndim >= 2 ? x->d[x->ndim - 1] : 0;
        const int64_t M = B > 0 && C > 0 ? ck_shape_numel(x) / (B * C) : 0;
        return sizeof(float) * (size_t)((op == CK_OP_MODULATE_BWD ? 2 : 1) * B * ck_row_chunks(M) * C);
    }
    if (op != CK_OP_ATTENTION && op != CK_OP_ATTENTION_BWD) return ck_op_workspace(op, p, in, nin, out, 1);
    const int bwd = op == CK_OP_ATTENTION_BWD;
    const ck_shape *q = &in[bwd], *k = &in[bwd + 1];
    const int64_t B = q->d[0], LQ = q->d[1], HD = q->d[2], LK = k->d[1], H = p->i[0] > 0 ? p->i[0] : 1;
    const int64_t D = HD / H;
    if (D <= 128) {
        if (!bwd) return 0;
        int64_t chunk = B * H < 65535 ? B * H : 65535;
        if (chunk < 1) chunk = 1;
        return (size_t)(2 * LQ * chunk) * sizeof(float);
    }
    const size_t per_head = (size_t)((bwd + 1) * LQ * LK) * sizeof(float);
    int64_t heads = per_head ? (int64_t)(((size_t)64 << 20) / per_head) : H;
    if (heads > H) heads = H;
    if (heads < 1) heads = 1;
    return per_head * (size_t)heads;
}

/* 16-bit products (bf16, fp16) run through cuBLASLt, whose heuristic takes the workspace it
 * is offered: 4 bytes per output element (room for one fp32 partial of a
 * split-K product), at most LT_WS_CAP (what cuBLAS itself sets aside on
 * Hopper). Elsewhere the fp32 rule: the convolutions' stated rule stands for
 * the algorithm a device picks per shape (ops/cuda/conv2d.cu) when a plan is
 * made without one. */
#define LT_WS_CAP ((size_t)32 << 20)

size_t ck_op_workspace_cuda_bf16(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                                 const ck_shape *out, int nthreads)
{
    if (op == CK_OP_MATMUL || op == CK_OP_LINEAR || op == CK_OP_LINEAR_GEGLU) {
        /* the product's output: D, or LINEAR_GEGLU's h */
        const size_t b = (size_t)ck_shape_numel(&out[op == CK_OP_LINEAR_GEGLU]) * sizeof(float);
        return b < LT_WS_CAP ? b : LT_WS_CAP;
    }
    return ck_op_workspace_cuda(op, p, in, nin, out, nthreads);
}

/* The CPU's bf16 and fp16 products and convolutions (ops/cpu/products_bf16.c) widen
 * their operands into the workspace: the fp32 copies of the inputs and of the
 * wanted outputs (a filter gradient's db is wanted when it is given its [O]
 * shape; an unwanted output stands in with the first input's), each rounded
 * up to 64 bytes, then the fp32 kernel's workspace. Elsewhere the fp32 rule. */
size_t ck_op_workspace_cpu_bf16(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin,
                                const ck_shape *out, int nthreads)
{
    const size_t own = ck_op_workspace(op, p, in, nin, out, nthreads);
    if (!ck_op_autocast(op)) return own;
    size_t b = 0;
    for (int j = 0; j < nin; j++) b += ((size_t)ck_shape_numel(&in[j]) * sizeof(float) + 63) / 64 * 64;
    for (int k = 0; k < ck_op_nout(op); k++) {
        if (op == CK_OP_CONV2D_BWD_FILTER && k == 1 && out[1].ndim != 1) continue;
        b += ((size_t)ck_shape_numel(&out[k]) * sizeof(float) + 63) / 64 * 64;
    }
    return b + own;
}

static const unsigned char autocasts[] = {
#define CK_OP(E, id, lo, hi, nout, infer, grad, bwd, cheap, autocast, ...) [CK_OP_##E] = autocast,
#include "ops.def"
};
_Static_assert(sizeof autocasts / sizeof autocasts[0] == CK_OP_COUNT, "autocast for every op in ops.def");

int ck_op_autocast(enum ck_op op) { return (unsigned)op < CK_OP_COUNT && autocasts[op]; }

unsigned ck_op_f32_inputs(enum ck_op op) { return op == CK_OP_ROPE ? 1u << 1 : 0u; }

int ck_cuda_bf16_op(enum ck_op op) { return (ck_op_precisions(op, 1) & CK_PREC_MASK_BF16) != 0; }
int ck_cuda_f16_op(enum ck_op op) { return (ck_op_precisions(op, 1) & CK_PREC_MASK_F16) != 0; }

double ck_op_flops(enum ck_op op, const ck_op_params *p, const ck_shape *in, int nin, const ck_shape *out)
{
    (void)nin;
    double n = out[0].ndim >= 0 ? (double)ck_shape_numel(&out[0]) : 0.0;
    switch (op) {
    case CK_OP_MATMUL: {
        int64_t k = p->i[0] ? in[0].d[in[0].ndim - 2] : in[0].d[in[0].ndim - 1];
        return 2.0 * n * (double)k;
    }
    case CK_OP_LINEAR: return 2.0 * n * (double)in[1].d[1];
    /* the product's (h has 2 n elements) and the GEGLU's */
    case CK_OP_LINEAR_GEGLU: return 4.0 * n * (double)in[1].d[1] + 4.0 * n;
    case CK_OP_CONV2D: return 2.0 * n * (double)(in[1].d[1] * in[1].d[2] * in[1].d[3]);
    case CK_OP_CONV2D_BWD_DATA: return 2.0 * (double)ck_shape_numel(&in[0]) * (double)(in[1].d[1] * in[1].d[2] * in[1].d[3]);
    case CK_OP_CONV2D_BWD_FILTER: return 2.0 * (double)ck_shape_numel(&in[0]) * (double)(out[0].d[1] * out[0].d[2] * out[0].d[3]);
    case CK_OP_ATTENTION: return 4.0 * (double)ck_shape_numel(&in[0]) * (double)in[1].d[1];
    case CK_OP_ATTENTION_BWD: return 10.0 * (double)ck_shape_numel(&in[1]) * (double)in[2].d[1];
    case CK_OP_GROUP_NORM:
    case CK_OP_LAYER_NORM: return 8.0 * n;
    case CK_OP_GROUP_NORM_BWD:
    case CK_OP_LAYER_NORM_BWD: return 14.0 * n;
    /* the pair's counts; the backward recomputes the pre-activation too */
    case CK_OP_GROUP_NORM_SILU: return 12.0 * n;
    case CK_OP_GROUP_NORM_SILU_BWD: return 26.0 * n;
    case CK_OP_MEAN:
    case CK_OP_MSE_LOSS:
    case CK_OP_STATS: return 3.0 * (double)ck_shape_numel(&in[0]);
    case CK_OP_SUMSQ: {
        double f = 0;
        for (int k = p->i[0] ? 1 : 0; k < nin; k++) f += 2.0 * (double)ck_shape_numel(&in[k]);
        return f;
    }
    case CK_OP_RMS_NORM: return 5.0 * n;
    case CK_OP_RMS_NORM_BWD: return 10.0 * n;
    /* two products and a sum an element */
    case CK_OP_ROPE: return 3.0 * n;
    case CK_OP_MODULATE: return 3.0 * n;
    case CK_OP_MODULATE_BWD: return 6.0 * (double)ck_shape_numel(&in[0]);
    case CK_OP_GATE: return 2.0 * n;
    case CK_OP_GATE_BWD: return 3.0 * (double)ck_shape_numel(&in[0]);
    case CK_OP_ADAMW_STEP: return 12.0 * n;
    case CK_OP_LION_STEP: return 8.0 * n;
    case CK_OP_ADAMW8_STEP: return 16.0 * n;
    default: return 4.0 * n;
    }
}
