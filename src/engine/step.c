/* The step schedule (docs/architecture.md, "The step"): all micro-batches
 * through layer i before
 * layer i+1 (forward) and before layer i-1 (backward), so each layer's
 * weights are bound once per pass and its gradient is finished once per
 * step, whatever the number of micro-batches. */
#include "engine/step.h"

#include <stdbool.h>
#include <stdlib.h>

#include "backend/cpu/ops.h"
#include "util/mem.h"

int64_t mt_batch_count_valid(const mt_batch *b) {
    int64_t n = 0, total = (int64_t)b->M * b->B * b->T;
    for (int64_t i = 0; i < total; i++) n += b->targets[i] != MT_IGNORE_INDEX;
    return n;
}

int mt_batch_check_pos(const mt_batch *b, mt_error *err) {
    if (!b->pos) return 0;
    int64_t rows = (int64_t)b->M * b->B;
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *p = b->pos + r * b->T;
        for (int64_t t = 0; t < b->T; t++)
            if (p[t] != 0 && (t == 0 || p[t] != p[t - 1] + 1))
                return mt_errorf(err, "position %d at token %lld of batch row %lld: positions "
                                 "must start each row at 0 and then go up by 1 or restart at 0 "
                                 "(a new document)", p[t], (long long)t, (long long)r);
    }
    return 0;
}

void mt_batch_fill_random(int32_t *tokens, int32_t *targets, size_t n, int64_t V) {
    uint64_t r = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        tokens[i] = (int32_t)(r % (uint64_t)V);
        targets[i] = (int32_t)((r >> 32) % (uint64_t)V);
    }
}

/* Whether to stop before the next layer or micro-batch (and then abandon
 * the step). */
static bool stop_now(mt_backend *be, const mt_step_stop *stop) {
    if (!stop || !be->ops->abandon_step || !stop->asked(stop->ctx)) return false;
    be->ops->abandon_step(be);
    return true;
}

/* Forward through the blocks; false when stopped. */
static bool forward_layers(mt_backend *be, int n_layers, const mt_batch *batch,
                           const mt_step_stop *stop) {
    for (int l = 0; l < n_layers - 1; l++) {
        if (stop_now(be, stop)) return false;
        be->ops->bind_layer(be, l, 0);
        for (int mb = 0; mb < batch->M; mb++) {
            if (mb && stop_now(be, stop)) return false;
            be->ops->forward(be, l, mb);
        }
    }
    return true;
}

/* Backward through the blocks once the head has written every residual
 * gradient; false when stopped. */
static bool backward_layers(mt_backend *be, int n_layers, const mt_batch *batch,
                            const mt_step_stop *stop) {
    for (int l = n_layers - 2; l >= 0; l--) {
        if (stop_now(be, stop)) return false;
        be->ops->bind_layer(be, l, 1);
        for (int mb = 0; mb < batch->M; mb++) {
            if (mb && stop_now(be, stop)) return false;
            be->ops->backward(be, l, mb);
        }
        be->ops->layer_grads_done(be, l);
    }
    return true;
}

/* A training step's start, with `valid` targets: positions checked, the
 * backend's begin_step with dscale = 1 / valid (which the cross-entropy
 * head reads, and other terms of a backend's loss, e.g. an MoE router's
 * auxiliary loss). 0, or -1 with err. */
static int begin_training(mt_backend *be, const mt_batch *batch, int64_t valid, mt_error *err) {
    if (valid == 0)
        return mt_errorf(err, "the batch has no target tokens (every label is -100); check the "
                         "data's loss mask");
    if (mt_batch_check_pos(batch, err)) return -1;
    return be->ops->begin_step(be, batch, 1.0f / (float)valid, 1, err) ? -1 : 0;
}

int mt_step_forward_backward_or_stop(mt_backend *be, int n_layers, const mt_batch *batch,
                                     const mt_step_stop *stop, double *loss, mt_error *err) {
    int64_t valid = batch->n_valid ? batch->n_valid : mt_batch_count_valid(batch);
    if (begin_training(be, batch, valid, err)) return -1;
    if (!forward_layers(be, n_layers, batch, stop)) return 1;

    int head = n_layers - 1;
    if (stop_now(be, stop)) return 1;
    be->ops->bind_layer(be, head, 1);
    for (int mb = 0; mb < batch->M; mb++) be->ops->head(be, mb);
    be->ops->layer_grads_done(be, head);

    if (!backward_layers(be, n_layers, batch, stop)) return 1;
    *loss = be->ops->end_step(be) / (double)valid;
    return be->ops->step_error ? be->ops->step_error(be, err) : 0;
}

int mt_step_sequence_or_stop(mt_backend *be, int n_layers, const mt_batch *batch,
                             const mt_seq_objective *obj, const mt_step_stop *stop,
                             mt_error *err) {
    if (!be->ops->head_logp || !be->ops->head_weighted)
        return mt_errorf(err, "the %s backend has no sequence objectives (DPO and its kin); "
                         "train them with --device cpu or cuda", be->name);
    /* head_weighted reads no dscale; an MoE router's auxiliary loss may.
     * A rank's share may hold no target (the step's last pairs filled
     * fewer micro-batches than the ranks have): n_valid is the step's. */
    int64_t valid = batch->n_valid ? batch->n_valid : mt_batch_count_valid(batch);
    if (begin_training(be, batch, valid, err)) return -1;
    if (!forward_layers(be, n_layers, batch, stop)) return 1;

    /* The head twice per micro-batch: its log-probabilities give the
     * objective's weights, with which it then runs backward. */
    size_t N = (size_t)(batch->B * batch->T);
    float *logp = mt_malloc_or_die(2 * N * sizeof(float)), *w = logp + N;
    int head = n_layers - 1, rc = 0;
    if (stop_now(be, stop)) rc = 1;
    if (!rc) be->ops->bind_layer(be, head, 1);
    for (int mb = 0; !rc && mb < batch->M; mb++) {
        be->ops->head_logp(be, mb, logp);
        if (obj->weigh(obj->ctx, mb, logp, w, err)) rc = -1;
        else be->ops->head_weighted(be, mb, w);
    }
    free(logp);
    if (rc < 0 && be->ops->abandon_step) be->ops->abandon_step(be);
    if (rc < 0 && !be->ops->abandon_step) be->ops->end_step(be);
    if (rc) return rc;
    be->ops->layer_grads_done(be, head);

    if (!backward_layers(be, n_layers, batch, stop)) return 1;
    be->ops->end_step(be);
    return be->ops->step_error ? be->ops->step_error(be, err) : 0;
}

int mt_step_forward_backward(mt_backend *be, int n_layers, const mt_batch *batch, double *loss,
                             mt_error *err) {
    return mt_step_forward_backward_or_stop(be, n_layers, batch, NULL, loss, err);
}

int mt_step_eval(mt_backend *be, int n_layers, const mt_batch *batch, double *loss_sum,
                 int64_t *n_valid, mt_error *err) {
    int64_t valid = mt_batch_count_valid(batch);
    if (mt_batch_check_pos(batch, err)) return -1;
    if (be->ops->begin_step(be, batch, valid ? 1.0f / (float)valid : 0.0f, 0, err)) return -1;
    forward_layers(be, n_layers, batch, NULL);
    be->ops->bind_layer(be, n_layers - 1, 0);
    for (int mb = 0; mb < batch->M; mb++) be->ops->head(be, mb);
    *loss_sum = be->ops->end_step(be);
    *n_valid = valid;
    return be->ops->step_error ? be->ops->step_error(be, err) : 0;
}

int mt_step_logp(mt_backend *be, int n_layers, const mt_batch *batch, float *logp,
                 mt_error *err) {
    if (!be->ops->head_logp)
        return mt_errorf(err, "the %s backend has no sequence objectives (DPO and its kin); "
                         "use --device cpu or cuda", be->name);
    if (mt_batch_check_pos(batch, err)) return -1;
    if (be->ops->begin_step(be, batch, 0.0f, 0, err)) return -1;
    forward_layers(be, n_layers, batch, NULL);
    be->ops->bind_layer(be, n_layers - 1, 0);
    size_t N = (size_t)(batch->B * batch->T);
    for (int mb = 0; mb < batch->M; mb++) be->ops->head_logp(be, mb, logp + (size_t)mb * N);
    be->ops->end_step(be);
    return be->ops->step_error ? be->ops->step_error(be, err) : 0;
}
