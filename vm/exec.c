/* The executor: runs one planned op list on the CPU kernels. Every pointer it
 * hands a kernel is an offset of the plan into the program's arena. */
#include "program.h"

#include "../ops/cpu/cpu.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static void view_of(const ck_program *p, const ck_plan *pl, int t, ck_view *v)
{
    const ck_shape *s = &p->g->t[pl->origin[t]].shape;
    v->data = (float *)(p->arena + pl->off[t]);
    v->ndim = s->ndim;
    for (int d = 0; d < s->ndim; d++) v->shape[d] = s->d[d];
}

static int run_entry(ck_program *p, const ck_plan *pl, int i, ck_kctx *ctx, char *err, size_t errlen)
{
    const ck_op_ref *r = &pl->ops[i];
    const ck_node *n = &p->g->n[r->node];
    /* an interrupt stops a step before its updates, never among them, so a
     * step is either applied whole or not at all */
    if (p->interrupt && *p->interrupt && r->phase != CK_PHASE_OPTIMIZER) {
        snprintf(err, errlen, "interrupted");
        return -1;
    }
    ck_view in[CK_MAX_IN], out[CK_MAX_OUT] = {{0}};
    ck_kernel_fn k = ck_cpu_kernels[n->op];
    if (!k) {
        snprintf(err, errlen, "%s: %s in %s: no CPU kernel", n->where, ck_op_name(n->op), n->scope);
        return -1;
    }
    for (int j = 0; j < r->nin; j++) view_of(p, pl, r->in[j], &in[j]);
    for (int j = 0; j < r->nout; j++)
        if (r->out[j] >= 0) view_of(p, pl, r->out[j], &out[j]);
    ctx->ws = pl->ws_off[i] >= 0 ? p->arena + pl->ws_off[i] : NULL;
    ctx->ws_bytes = pl->ws_bytes[i];
    if (!p->profile) {
        k(ctx, &n->p, out, r->nout, in, r->nin);
        return 0;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    k(ctx, &n->p, out, r->nout, in, r->nin);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    p->profile[n->op] += (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return 0;
}

int ck_exec_range(ck_program *p, const ck_plan *pl, int from, int to, char *err, size_t errlen)
{
    ck_kctx ctx = {p->opt.seed, p->step, p->opt.lr, NULL, 0};
    for (int i = from; i < to; i++)
        if (run_entry(p, pl, i, &ctx, err, errlen)) return -1;
    return 0;
}

int ck_exec(ck_program *p, const ck_plan *pl, char *err, size_t errlen)
{
    return ck_exec_range(p, pl, 0, pl->n, err, errlen);
}

int ck_all_finite(const float *x, int64_t n)
{
    /* x * 0 is 0 for every finite x and NaN otherwise; eight lanes vectorize */
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * 0.0f;
    float t = 0;
    for (; i < n; i++) t += x[i] * 0.0f;
    for (int k = 0; k < 8; k++) t += acc[k];
    return t == 0.0f;
}

static int tensor_finite(const ck_program *p, const ck_plan *pl, int t)
{
    const float *x = (const float *)(p->arena + pl->off[t]);
    return ck_all_finite(x, ck_shape_numel(&p->g->t[pl->origin[t]].shape));
}

int ck_exec_find_nonfinite(ck_program *p, const ck_plan *pl, int to, int *entry, int *input, char *err,
                           size_t errlen)
{
    ck_kctx ctx = {p->opt.seed, p->step, p->opt.lr, NULL, 0};
    *entry = *input = -1;
    for (int i = 0; i < to; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (run_entry(p, pl, i, &ctx, err, errlen)) return -1;
        int bad = 0;
        for (int j = 0; j < r->nout && !bad; j++) bad = r->out[j] >= 0 && !tensor_finite(p, pl, r->out[j]);
        if (!bad) continue;
        *entry = i;
        for (int j = 0; j < r->nin; j++) {
            int t = pl->origin[r->in[j]];
            if (p->poff[t] >= 0 && !tensor_finite(p, pl, r->in[j])) {
                *input = t;
                break;
            }
        }
        return 0;
    }
    return 0;
}

/* a NaN with a payload no kernel writes */
#define SENTINEL 0x7fa5a5a5u

void ck_arena_fill_sentinel(ck_program *p)
{
    uint32_t *w = (uint32_t *)p->arena;
    for (size_t i = p->persistent / 4, hi = p->arena_bytes / 4; i < hi; i++) w[i] = SENTINEL;
}

size_t ck_arena_high_water(const ck_program *p)
{
    const uint32_t *w = (const uint32_t *)p->arena;
    size_t lo = p->persistent / 4;
    for (size_t i = p->arena_bytes / 4; i > lo; i--)
        if (w[i - 1] != SENTINEL) return i * 4;
    return lo * 4;
}

int ck_program_step_measured(ck_program *p, size_t *high_water)
{
    if (!p->arena) return ck_program_step(p);
    ck_run_opts o = {0, 0, 1};
    ck_run_info r;
    int rc = ck_program_run(p, &o, &r);
    *high_water = r.high_water;
    return rc;
}
