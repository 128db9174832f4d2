/* The peak and recompute FLOPs of checkpoint decisions, evaluated without
 * building their op lists (vm/plan/evaluate.c), for the searches of
 * vm/plan/policy.c. */
#ifndef CK_EVALUATE_H
#define CK_EVALUATE_H

#include "plan/plan.h"

typedef struct ck_evaluator ck_evaluator;

/* An evaluator for the decisions of c (c must outlive it); NULL out of memory. */
ck_evaluator *ck_evaluator_new(const ck_decide_ctx *c);
void ck_evaluator_free(ck_evaluator *e);

/* The decision mark (per graph tensor, 1: recompute; NULL: none) as the
 * scheduler would list it: the recompute FLOPs, and the peak: exact, the
 * arena's high-water mark as ck_plan_memory would place it; otherwise the most
 * bytes live at once (ck_plan_live_peak), a lower bound. 0, or -1 out of memory. */
int ck_evaluate(ck_evaluator *e, const unsigned char *mark, int exact, size_t *peak, double *flops);
/* ck_evaluate's exact peak where it is at most limit; otherwise a peak above
 * limit that may be below the exact one (the placement stopped once it passed
 * limit: not kept, and its fragmentation not counted in the least one). */
int ck_evaluate_under(ck_evaluator *e, const unsigned char *mark, size_t limit, size_t *peak, double *flops);

/* A lower bound of ck_evaluate's live peak for mark, found without walking
 * the list: the persistent bytes and the buffers forward entries make that
 * must outlive the turn to backward (a later entry reads one of the tensors
 * they hold, and it is not marked, or one is retained). */
size_t ck_evaluate_turn(ck_evaluator *e, const unsigned char *mark);
/* ck_evaluate_turn of each marking "the tensors whose region (per graph
 * tensor; 0: none) is a multiple of m", for m = 1 .. n, into turn[1 .. n],
 * in one pass over the turn's buffers. 0, or -1 out of memory. */
int ck_evaluate_turn_multiples(ck_evaluator *e, const int *region, int n, size_t *turn);
/* The FLOPs of node v's entry. */
double ck_evaluator_flops(const ck_evaluator *e, int v);
/* The nodes the last ck_evaluate recomputed, in list order, into nodes
 * (room for every forward node); their count. */
int ck_evaluator_recomputed(const ck_evaluator *e, int *nodes);

/* Gives back a walk's scratch (the next walk makes it again): while a
 * tracker works instead. */
void ck_evaluator_rest(ck_evaluator *e);
/* Gives back the last exact evaluation's placement (a later one makes it
 * again); with keep, all but its offsets (8 bytes a buffer), from which an
 * exact evaluation of the same buffers restores it without placing. */
void ck_evaluator_forget(ck_evaluator *e, int keep);
/* The least fragmentation (placed peak less live peak) an exact evaluation
 * has shown, SIZE_MAX before one. */
size_t ck_evaluator_least_frag(const ck_evaluator *e);
/* 1 when the last exact evaluation was of decision mark. */
int ck_evaluator_placed(const ck_evaluator *e, const unsigned char *mark);

/* The op list and memory plan of decision mark (ck_schedule, then
 * ck_plan_memory), with the workspaces and FLOPs the evaluator took once, and
 * its placement when its last exact evaluation was of mark (the same plan, to
 * the byte, without placing twice). The evaluator's last use: it gives back
 * what walks need before the plan is made (ck_evaluate fails after it).
 * 0, or -1 out of memory (pl empty). */
int ck_evaluator_plan(ck_evaluator *e, const unsigned char *mark, ck_plan *pl);

/* One decision's list kept live under one-tensor changes (vm/plan/track.c):
 * its live peak after each change costs what the change touches, not a walk.
 * NULL out of memory, or for lists whose optimizer entries move (the
 * searches then walk). */
typedef struct ck_tracker ck_tracker;
ck_tracker *ck_tracker_new(ck_evaluator *e);
void ck_tracker_free(ck_tracker *tr);
/* Starts from decision mark (NULL: none). 0, or -1 out of memory. */
int ck_tracker_reset(ck_tracker *tr, const unsigned char *mark);
/* Marks graph tensor t if it is not, unmarks it if it is (a tensor no
 * decision can mark is left alone). 0, or -1 out of memory. */
int ck_tracker_flip(ck_tracker *tr, int t);
/* ck_evaluate's live peak of the decision now; whether t is marked in it. */
size_t ck_tracker_peak(const ck_tracker *tr);
/* The recompute FLOPs of the decision now. */
double ck_tracker_flops(const ck_tracker *tr);
int ck_tracker_marked(const ck_tracker *tr, int t);
/* The entries moved and buffer ranges changed since the last reset: what
 * the flips since cost. */
long ck_tracker_work(const ck_tracker *tr);
/* A lower bound of the live peak once marked tensor t is unmarked, found
 * without changing the list (0 when none better than 0 is found): a change
 * whose bound is over a budget need not be made to be refused. */
size_t ck_tracker_unmark_floor(ck_tracker *tr, int t);
/* An estimate of what marking t lowers the bytes at the live peak's entry
 * by: t's bytes, less those of its producer's kept inputs that are not live
 * there (they would be held to its recomputation); 0 when t is not live there
 * or stays held (read there or later in forward, retained, a kept view of
 * it). A guide for searches: the change itself says what it does. */
int64_t ck_tracker_mark_gain(ck_tracker *tr, int t);
/* Lays the list's keys out evenly again, as a flip does when a gap fills
 * (for tests: a flip never needs it called). */
void ck_tracker_relabel(ck_tracker *tr);

#endif
