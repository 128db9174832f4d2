/* A compiled program's tensors of one kind (parameters, optimizer state),
 * their bytes one after another, for tests that compare two programs'
 * states bitwise (test_offload, test_stream, emu_capture). Include after
 * run/program.h. */
#ifndef CK_TEST_PROGRAM_TENSORS_H
#define CK_TEST_PROGRAM_TENSORS_H

#include <stdlib.h>
#include <string.h>

/* the bytes of p's tensors of kind, in tensor order, *n of them (malloc'd) */
static unsigned char *tensors_of(ck_program *p, ck_kind kind, size_t *n)
{
    size_t total = 0;
    for (int t = 0; t < p->g->nt; t++)
        if (p->g->t[t].kind == kind) total += ck_tensor_bytes(&p->g->t[t]);
    unsigned char *out = malloc(total ? total : 1), *at = out;
    for (int t = 0; out && t < p->g->nt; t++) {
        if (p->g->t[t].kind != kind) continue;
        memcpy(at, ck_program_read(p, t), ck_tensor_bytes(&p->g->t[t]));
        at += ck_tensor_bytes(&p->g->t[t]);
    }
    *n = total;
    return out;
}

#endif
