/* The optimizer over a rank's share of the host store: each rank updates
 * only its parts of the weights and moments (dist/shard.h), from its parts
 * of the gradient (what a reduce-scatter leaves it), with the clip
 * coefficient of the global gradient norm.
 *
 * A step is: mt_shard_optim_sumsq on every rank; the sums added over the
 * ranks (an all-reduce; dist/rendezvous.h has one); mt_shard_optim_apply on
 * every rank with that total. AdamW is elementwise, so the parts updated by
 * n ranks, put side by side, are bitwise the unsharded update given the
 * same clip coefficient (tests/cpu/test_dist_optim.c). The total sum of
 * squares differs from the unsharded one only by the order of fp64
 * additions. */
#ifndef MT_DIST_SHARD_OPTIM_H
#define MT_DIST_SHARD_OPTIM_H

#include "dist/shard.h"
#include "engine/optimizer.h"

/* Sum of squares of this rank's parts of the gradient g (local layout,
 * s->layout.total floats; padding must be 0), in double. */
double mt_shard_optim_sumsq(const mt_optimizer *o, const mt_shard_store *s, const float *g);

/* Updates this rank's parts of every layer's tensors from g (local layout)
 * with the clip coefficient and learning rate that total_sumsq (the sum of
 * every rank's mt_shard_optim_sumsq) and o's schedule give, then counts the
 * step. rep (may be NULL) receives them, for logging. */
void mt_shard_optim_apply(mt_optimizer *o, mt_shard_store *s, const float *g, double total_sumsq,
                          mt_optim_report *rep);

#endif
