/* One training step's schedule, independent of the backend. */
#ifndef MT_ENGINE_STEP_H
#define MT_ENGINE_STEP_H

#include "engine/backend.h"

/* Runs forward (layer-major over micro-batches), the head's loss, and
 * backward (layer-major, recomputing each layer from its checkpoint).
 * Gradients of all layers are complete when it returns; the mean loss over
 * valid targets is stored in *loss (one rank's share of a step: its sum
 * over the step's batch->n_valid targets, which the ranks' add up to the
 * mean). */
int mt_step_forward_backward(mt_backend *be, int n_layers, const mt_batch *batch, double *loss,
                             mt_error *err);

/* The caller's question, asked between the layers and micro-batches of a
 * step: nonzero to stop there. */
typedef struct mt_step_stop {
    int (*asked)(void *ctx);
    void *ctx;
} mt_step_stop;

/* mt_step_forward_backward, asking stop (NULL: never) before each layer and
 * micro-batch when the backend can abandon a step (abandon_step; others
 * finish it). 1: it was abandoned there: no loss, gradients not valid,
 * nothing to apply. */
int mt_step_forward_backward_or_stop(mt_backend *be, int n_layers, const mt_batch *batch,
                                     const mt_step_stop *stop, double *loss, mt_error *err);

/* A sequence objective (engine/preference.h): a loss of the sum of some
 * tokens' log-probabilities rather than of each token's. weigh is called
 * once per micro-batch mb, in order, with logp (B*T) the log-probability of
 * each of mb's targets (0 where there is none); it writes w (B*T), the loss's
 * derivative with respect to each -logp, which scales that token's
 * cross-entropy gradient. -1 (with err): the step stops. The objective
 * keeps its loss itself. */
typedef struct mt_seq_objective {
    int (*weigh)(void *ctx, int mb, const float *logp, float *w, mt_error *err);
    void *ctx;
} mt_seq_objective;

/* mt_step_forward_backward_or_stop for a sequence objective: forward, then
 * per micro-batch the head's log-probabilities, obj's weights and the head's
 * weighted backward, then backward. 0, 1 (stopped, as there) or -1 (the
 * backend has no head_logp, or weigh failed). */
int mt_step_sequence_or_stop(mt_backend *be, int n_layers, const mt_batch *batch,
                             const mt_seq_objective *obj, const mt_step_stop *stop,
                             mt_error *err);

/* Forward only: the log-probability of every target of the batch into
 * logp (M, B, T), 0 where there is none (a reference model's pass, or an
 * evaluation of a sequence objective). */
int mt_step_logp(mt_backend *be, int n_layers, const mt_batch *batch, float *logp,
                 mt_error *err);

/* Forward only (evaluation): returns the summed loss and the valid count. */
int mt_step_eval(mt_backend *be, int n_layers, const mt_batch *batch, double *loss_sum,
                 int64_t *n_valid, mt_error *err);

/* Fills n tokens and targets with ids below V from a fixed xorshift
 * sequence: the synthetic batches of benchmarks and the planner's probe. */
void mt_batch_fill_random(int32_t *tokens, int32_t *targets, size_t n, int64_t V);

/* Counts targets that are not MT_IGNORE_INDEX. */
int64_t mt_batch_count_valid(const mt_batch *batch);

/* Checks the batch's positions (if any) against the contract of mt_batch:
 * each row starts at 0 and each next position is 0 or the previous + 1.
 * Both step functions call it before begin_step. */
int mt_batch_check_pos(const mt_batch *batch, mt_error *err);

#endif
