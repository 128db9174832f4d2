/* The evaluator's state (vm/plan/evaluate.c), shared with the tracker
 * (vm/plan/track.c), which keeps one decision's list live under changes. */
#ifndef CK_EVALUATE_INT_H
#define CK_EVALUATE_INT_H

#include "plan/evaluate.h"
#include "plan/place.h"

/* a list node, packed: what the walk reads of it */
typedef struct ck_pnode {
    signed char nin, nout, reshape;
    int in[CK_MAX_IN], out[CK_MAX_OUT];
} ck_pnode;

/* a recomputation in progress: node v, its inputs resolved up to slot j */
typedef struct ck_frame {
    int v, j;
    int ins[CK_MAX_IN];
} ck_frame;

struct ck_evaluator {
    const ck_decide_ctx *c;
    int nt, cap;        /* graph tensors; ids a list can use (tensors and copies) */
    int64_t *bytes;     /* per graph tensor */
    unsigned char *persistent, *markable; /* per graph tensor: outside the arena's transient part; a forward activation */
    ck_pnode *nodes;    /* per graph node */
    size_t *ws;         /* per graph node in the list: its entry's workspace */
    double *flops;      /* per graph node in the list */
    int *first, *last, *root, *origin, *copy; /* per id; copy per graph tensor */
    int *first0, *last0, *root0; /* the same after the forward entries, which no decision changes */
    int pos0;
    int64_t *delta;     /* per position */
    int *at;            /* per position: the node its entry runs */
    ck_frame *stack;    /* recomputations in progress, one per forward node at most */
    ck_place_buf *bufs;
    /* the last placement's offsets, kept small while a tracker works
     * (ck_evaluator_forget): each buffer's id (a workspace: -1 less its
     * position) and offset in units of the alignment; nkept of them, when
     * haskept */
    struct ck_kept {
        int key;
        uint32_t units;
    } *kept;
    int nkept, haskept;
    /* the last exact evaluation's placement (in bufs) and its decision; its
     * buffers' digest (two hashes of their sizes, ranges and ids) and high-water,
     * kept when bufs are forgotten (known) */
    int placed, known, nplaced;
    int64_t top;
    size_t least_frag;  /* the least placed peak less live peak of the exact evaluations, SIZE_MAX before one */
    uint64_t digest[2];
    unsigned char *placed_mark;
    /* the turn to backward: the buffers made by forward entries that a later
     * one may read (turn_root), each with the graph tensors aliasing it that
     * a later entry reads or that are retained (turn_t[turn_start[k] ..],
     * a retained one entered as -1) */
    int nturn;
    int *turn_root, *turn_start, *turn_t;
    int maxpos;         /* positions a list can have: every entry recomputed once */
    int nfwd;           /* forward nodes in the list */
    int fallback;       /* optimizer entries move: schedule and plan in full */
    int released;       /* ck_evaluator_plan gave back what walks need: no more walks */
    /* one walk's state */
    const unsigned char *mark;
    int pos, ids;
    double rflops;
};

#endif
