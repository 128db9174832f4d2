/* The executor: runs one planned op list on the CPU kernels. Every pointer it
 * hands a kernel is an offset of the plan into the program's arena. */
#include "program.h"

#include "../ops/cpu/cpu.h"

#include <stdio.h>

static void view_of(const ck_program *p, const ck_plan *pl, int t, ck_view *v)
{
    const ck_tensor *x = &p->g->t[t];
    v->data = (float *)(p->arena + pl->off[t]);
    v->ndim = x->shape.ndim;
    for (int d = 0; d < x->shape.ndim; d++) v->shape[d] = x->shape.d[d];
}

int ck_exec(ck_program *p, const ck_plan *pl, char *err, size_t errlen)
{
    ck_kctx ctx = {p->opt.seed, p->step, p->opt.lr, NULL, 0};
    for (int i = 0; i < pl->n; i++) {
        const ck_node *n = &p->g->n[pl->nodes[i]];
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
        for (int j = 0; j < n->nin; j++) view_of(p, pl, n->in[j], &in[j]);
        for (int j = 0; j < n->nout; j++)
            if (n->out[j] >= 0) view_of(p, pl, n->out[j], &out[j]);
        ctx.ws = pl->ws_off[i] >= 0 ? p->arena + pl->ws_off[i] : NULL;
        ctx.ws_bytes = pl->ws_bytes[i];
        k(&ctx, &n->p, out, n->nout, in, n->nin);
    }
    return 0;
}
