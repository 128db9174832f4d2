/* Offload (vm/plan/offload.c): saved activations kept in pinned host memory
 * between their forward and backward uses, as transfer entries of the op
 * list; and the cost model (vm/plan/cost.c) that predicts a list's step time
 * on a device with a copy stream. */
#ifndef CK_OFFLOAD_H
#define CK_OFFLOAD_H

#include "plan/plan.h"

/* The prefetch distance when none is given: entries between a copy and the
 * wait that needs it done. */
#define CK_PREFETCH_DEFAULT 8

/* Inserts into scheduled list pl (ck_schedule's, no transfers yet) the
 * transfers of the buffers of the graph tensors marked CK_OFFLOAD in mark:
 * after a buffer's last forward use its copy out to a host id, prefetch
 * entries later (not past the forward part) the wait that frees it; prefetch
 * entries before its first later use (not before the forward part ends) the
 * copy back into a device copy, and right before that use the wait. Later
 * entries read the copy (a reshape of the buffer read later is made again
 * from it, as recompute does). A buffer no later entry reads, or that is
 * retained, stays. pl->loc, nslots, offload_bytes and prefetch are set; the
 * memory plan (ck_plan_memory) places the host ids in the host region.
 * A persistent tensor marked CK_OFFLOAD (a frozen or trainable weight, an
 * optimizer state) is streamed: it stays in pinned host memory (the caller
 * gives it a persistent offset there, not in the arena), and each group of
 * its uses (the forward part and the entries after it; a trainable weight's
 * and an optimizer state's updates a group of their own) reads a device copy
 * brought in prefetch entries before the group's first use (not before the
 * group starts) and freed after its last; a group that writes it (an update)
 * copies it back out after its last use and holds the copy until that
 * copy's wait; forward-only lists stream too. pl->stream_bytes gets the
 * bytes brought in per run.
 * Returns the buffers offloaded and weight copies made, or -1 out of memory
 * (pl unchanged where the failing part began). */
int ck_offload_schedule(ck_plan *pl, const ck_graph *g, const unsigned char *mark, const int *retain, int prefetch);

/* The most bytes of streamed frozen weights' device copies live at once in
 * list pl (ck_offload_schedule's), from each copy's transfer in to its last
 * reader: 0 without streamed weights, (size_t)-1 out of memory. */
size_t ck_offload_stream_copies_most(const ck_plan *pl, const ck_graph *g);

/* ---- the cost model (vm/plan/cost.c) */

/* A device's throughput: FLOP/s for products and convolutions (tensor cores
 * for 16-bit storage, fp32 otherwise), bytes/s of its memory for everything
 * else, and the host link's bytes/s each way; launch: seconds per entry. */
typedef struct ck_device_speed {
    const char *name;
    double flops_f32, flops_16, mem_bw, link_bw, launch;
} ck_device_speed;

/* The table's entry whose name is a case-insensitive substring of name
 * ("NVIDIA H100 80GB HBM3" finds "H100"), or NULL. */
const ck_device_speed *ck_cost_device_find(const char *name);
/* The table itself, ended by an entry with a NULL name. */
const ck_device_speed *ck_cost_device_table(void);
/* The speeds of the device a backend runs on as far as the plan knows them:
 * the CPU's fixed figures on the CPU backend; NULL on a GPU (its name picks
 * an entry: compile{gpu = NAME}). */
const ck_device_speed *ck_cost_backend_speed(const struct ck_backend *be);

/* The predicted times of one list, by a simulation of two streams: the
 * compute stream runs the entries in order, each for the longer of its
 * FLOPs at the device's rate and its bytes at memory bandwidth, plus the
 * launch; the copy stream runs the transfers in order, each starting when
 * the compute stream has reached it and the previous copy is done, for its
 * bytes at link bandwidth; a wait holds the compute stream until its copy
 * is done. */
typedef struct ck_step_time {
    double step;     /* the compute stream's end: the predicted step time */
    double compute;  /* the entries' own time (no waits) */
    double recompute; /* of that, recompute entries' */
    double copies;   /* the copy stream's busy time */
    double stalled;  /* time the compute stream waited for copies */
} ck_step_time;
void ck_plan_step_time(const ck_plan *pl, const ck_graph *g, const ck_device_speed *dev, ck_step_time *out);
/* The model's time of graph node v's entry (flops: its FLOPs), and of a
 * copy of bytes over the link: what ck_plan_step_time adds up. */
double ck_cost_node_seconds(const ck_graph *g, int v, double flops, const ck_device_speed *dev);
double ck_cost_copy_seconds(size_t bytes, const ck_device_speed *dev);

/* ---- the joint search (vm/plan/offsearch.c) */

/* The decision of least predicted step time whose placed peak fits budget,
 * over keep, recompute and CK_OFFLOAD for every candidate of c (c->offload
 * set), into mark; c->why (if any) gets a line on what it chose and what it
 * beat. Candidates: the budget search's recompute answer, offload alone (the
 * kept buffers crossing the turn, in two orders, the shortest run that
 * fits), the fixed policies with everything they keep offloaded; each
 * improved by moves that recompute less (a recomputed tensor kept, or kept
 * and offloaded) while the live peak fits; the fastest placed and checked
 * exactly. Then the fixed choices (none, diffusers' blocks, sqrt_n,
 * every_n:1-3, selective, the recompute answer, each as it is and with all it
 * keeps offloaded) are placed, and the fastest that fits wins if it is
 * faster: no fixed choice beats the pick on predicted time at the budget.
 * what names the policy in errors; a budget nothing fits gets one line
 * naming the smallest peak found with offload and without.
 * 0, or -1 with err. */
struct ck_evaluator;
int ck_offload_decide(const ck_decide_ctx *c, struct ck_evaluator *ev, size_t budget, unsigned char *mark,
                      const char *what, char *err, size_t errlen);
/* The smallest placed peak of the fixed choices (as ck_offload_decide
 * tries them) with all they keep offloaded: what offload would reach where
 * the budget search found nothing (c->offload unset); 0 when unknown (out of
 * memory, or lists whose optimizer entries move). */
size_t ck_offload_floor(const ck_decide_ctx *c, struct ck_evaluator *ev);
/* The joint search's judgement of decision mark (0, 1, CK_OFFLOAD per graph
 * tensor), without building its list: the live peak (ck_plan.live_peak of
 * the list ck_schedule and ck_offload_schedule make, at c->prefetch) and
 * the predicted step on c->speed (ck_plan_step_time of that list). 0, or -1
 * out of memory or for lists whose optimizer entries move. */
int ck_offload_judge(const ck_decide_ctx *c, struct ck_evaluator *ev, const unsigned char *mark, size_t *live,
                     double *time);

#endif
