/* The executor: runs one planned op list on the CPU kernels. Every pointer it
 * hands a kernel is an offset of the plan into the program's arena. */
#include "program.h"

#include "../ops/cpu/cpu.h"

#include <stdio.h>
#include <string.h>

static void view_of(const ck_program *p, const ck_plan *pl, int t, ck_view *v)
{
    const ck_shape *s = &p->g->t[pl->origin[t]].shape;
    v->data = (float *)(p->arena + pl->off[t]);
    v->ndim = s->ndim;
    for (int d = 0; d < s->ndim; d++) v->shape[d] = s->d[d];
}

int ck_exec(ck_program *p, const ck_plan *pl, char *err, size_t errlen)
{
    ck_kctx ctx = {p->opt.seed, p->step, p->opt.lr, NULL, 0};
    for (int i = 0; i < pl->n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        const ck_node *n = &p->g->n[r->node];
        if (p->interrupt && *p->interrupt) {
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
        ctx.ws = pl->ws_off[i] >= 0 ? p->arena + pl->ws_off[i] : NULL;
        ctx.ws_bytes = pl->ws_bytes[i];
        k(&ctx, &n->p, out, r->nout, in, r->nin);
    }
    return 0;
}

/* a NaN with a payload no kernel writes */
#define SENTINEL 0x7fa5a5a5u

int ck_program_step_measured(ck_program *p, size_t *high_water)
{
    if (!p->arena) return ck_program_step(p);
    uint32_t *w = (uint32_t *)p->arena;
    size_t lo = p->persistent / 4, hi = p->arena_bytes / 4;
    for (size_t i = lo; i < hi; i++) w[i] = SENTINEL;
    int rc = ck_program_step(p);
    size_t top = lo;
    for (size_t i = hi; i > lo; i--)
        if (w[i - 1] != SENTINEL) {
            top = i;
            break;
        }
    *high_water = top * 4;
    return rc;
}
