/* The training step as graph transforms: loss scaling's tensors, the
 * gradients (autodiff), gradient accumulation, data parallel's buckets,
 * clipping, and the optimizer's updates, all appended to the forward graph.
 * What the rest of the runtime needs to find again comes back in
 * ck_train_ids. */
#ifndef CK_TRAIN_H
#define CK_TRAIN_H

#include "graph/graph.h"

typedef enum ck_optim { CK_OPTIM_NONE = 0, CK_OPTIM_SGD, CK_OPTIM_ADAMW, CK_OPTIM_LION, CK_OPTIM_ADAMW8 } ck_optim;

/* Dynamic loss scaling, as torch.cuda.amp.GradScaler: backward starts from
 * the scale instead of 1 (the loss's gradient), the update reads the
 * gradients times 1/scale (after the accumulated sum, before clipping, which
 * sees the unscaled norm), and an update whose gradients hold an inf or NaN
 * is skipped, the scale times backoff_factor; after growth_interval updates
 * in a row that were applied, the scale times growth_factor. The scale and
 * the count of updates since the last change are optimizer state (the
 * persistent tensors "loss_scale" and "loss_scale.growth_tracker", saved
 * with it). Exact for scales that are powers of two. */
typedef struct ck_loss_scale {
    int on;
    float init, growth_factor, backoff_factor;
    int growth_interval;
} ck_loss_scale;

/* What the transforms read (ck_compile_opts has each, and says what it means). */
typedef struct ck_train_opts {
    int loss;
    ck_optim optim;
    float beta1, beta2, eps, weight_decay, max_grad_norm;
    int accumulate, fused_backward;
    ck_loss_scale scaler;
    int data_parallel; /* gradients summed over the ranks (world > 1, or a world of one forced) */
    int world, rank, shard;
    size_t bucket_bytes;
} ck_train_opts;

/* What the transforms made, for the programs that run them: loss scaling's
 * scale, growth tracker and 1/scale (-1 without); the gradient sums of
 * accumulation or data parallel (owned: the caller frees accums), the
 * graph's nodes that add into them [first, end), the buckets; ZeRO-1's owner
 * of each parameter's state (owned; NULL unsharded), for nowner tensors. */
typedef struct ck_train_ids {
    int scale_t, tracker_t, inv_t;
    int *accums;
    int naccum;
    int accum_nodes[2];
    int nbuckets;
    int *owner;
    int nowner;
} ck_train_ids;

/* 1 when g has a trainable parameter */
int ck_train_has_params(const ck_graph *g);
/* Appends the training step to g when o->loss names a tensor and g has a
 * trainable parameter (else changes nothing): loss scaling's tensors (when
 * on), each dropout's rank and world (data parallel), the gradients, and,
 * with an optimizer, its nodes; g->fused_updates set from fused_backward.
 * 0, or -1 with err (ids then holds what the caller frees). */
int ck_train_graph(ck_graph *g, const ck_train_opts *o, ck_train_ids *ids, char *err, size_t errlen);
/* The optimizer state of a parameter of shape ps: its count, each tensor's
 * name prefix ("exp_avg" for "exp_avg.<parameter>"), shape and dtype, and
 * the update op. AdamW's two moments, Lion's one, or 8-bit AdamW's codes
 * (bytes) and their blocks' scales; zeros at first. */
int ck_train_state(ck_optim optim, const ck_shape *ps, const char *state[2], ck_shape shape[2], ck_dtype dtype[2],
                   enum ck_op *op);

#endif
