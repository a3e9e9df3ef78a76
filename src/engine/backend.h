/* The interface between the step schedule (engine/step.c) and a compute
 * backend (CPU reference, CUDA streaming).
 *
 * The engine owns the ORDER of work: layer-major forward over all
 * micro-batches, the head's loss and gradient, layer-major backward with
 * recompute, then the optimizer. A backend owns WHERE things live: weights
 * (bound per layer), layer-boundary checkpoints (one per layer and
 * micro-batch), the residual-stream gradient of each micro-batch, and the
 * per-layer gradient accumulators. The CPU backend binds a layer by pointing
 * into the host store; the CUDA backend streams it into a GPU slot.
 *
 * Besides the step, a backend may offer what a run asks of it (the
 * gradient's norms, the optimizer's view of the gradient, measurements):
 * those calls are NULL where a backend has none, so a caller never needs
 * to know which backend it holds. */
#ifndef MT_ENGINE_BACKEND_H
#define MT_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/optim_pipeline.h"
#include "util/error.h"

typedef struct mt_backend mt_backend;
struct mt_trace;

/* Called (on the thread that drives the step) before layer l's weights are
 * copied to the device, so a caller can hold the copy until the optimizer has
 * written them: returns whether they are written; with wait, first blocks
 * until they are. A layer copied ahead of its use is asked without wait
 * and, if not ready, copied at a later call, so that the layers already on
 * the device get computed meanwhile. */
typedef int (*mt_weight_gate_fn)(void *ctx, int layer, int wait);

/* Measurements of a backend's last step and of its memory. */
typedef struct mt_backend_stats {
    double forward_s, backward_s, total_s;  /* the last step, timed on the device */
    double h2d_bytes, d2h_bytes;            /* host <-> device traffic of the last step */
    double coll_bytes;                      /* a rank of several: bytes its collectives
                                             * brought in or sent out, the last step */
    double device_bytes;                    /* device memory the backend allocated */
    double host_bytes;                      /* pinned host memory it took beside the store */
    int kept_layers;                        /* layers whose activations skip the recompute */
} mt_backend_stats;

/* One optimizer step's tokens: M micro-batches of (B, T) tokens each.
 *
 * pos, when not NULL, packs several documents into a row: pos[m,b,t] is
 * token t's position within its document (0 where a document starts, else
 * the previous token's + 1; every row starts a document). Attention then
 * stays within each document (causal inside it) and RoPE takes these
 * positions. NULL: every row is one sequence, positions 0..T-1. */
typedef struct mt_batch {
    int M;                    /* micro-batches */
    int64_t B, T;             /* rows and sequence length of one micro-batch */
    const int32_t *tokens;    /* (M, B, T) */
    const int32_t *targets;   /* (M, B, T); MT_IGNORE_INDEX where no loss */
    const int32_t *pos;       /* (M, B, T) or NULL, see above */
    /* Targets with a loss in the whole step when this batch is one rank's
     * share of it (the loss is the mean over all of them); 0: this
     * batch's own count. */
    int64_t n_valid;
} mt_batch;

typedef struct mt_backend_ops {
    /* Takes the step's tokens, targets and positions (pos already checked
     * by mt_batch_check_pos); dscale = 1 / valid targets. The batch stays
     * valid until end_step. train = 0: forward and loss only (evaluation),
     * no gradients. */
    int (*begin_step)(mt_backend *be, const mt_batch *batch, float dscale, int train,
                      mt_error *err);
    /* Makes layer l's weights usable by the calls that follow (forward or
     * backward pass) and, for backward, its gradient accumulator zero. */
    void (*bind_layer)(mt_backend *be, int layer, int backward);
    /* Forward of layer l for micro-batch mb: reads checkpoint l, writes
     * checkpoint l+1. Layer 0 reads tokens instead. */
    void (*forward)(mt_backend *be, int layer, int mb);
    /* The head: loss of micro-batch mb (summed over valid targets) is added
     * to the step loss; when training, writes the residual gradient of mb
     * and accumulates the head's weight gradients (with tied embeddings,
     * into layer 0's accumulator, which backward must not clear). */
    void (*head)(mt_backend *be, int mb);
    /* Backward of layer l for mb: recomputes the layer from checkpoint l,
     * consumes and replaces mb's residual gradient, accumulates weight
     * gradients. */
    void (*backward)(mt_backend *be, int layer, int mb);
    /* Layer l's gradient is complete for this step (all micro-batches):
     * the backend moves it to where the optimizer reads it. */
    void (*layer_grads_done)(mt_backend *be, int layer);
    /* Ends the step; returns the summed loss over valid targets. When
     * training with the router's auxiliary loss on (MoE models), the sum
     * also holds coef * aux / dscale, so that dividing by the valid targets
     * gives cross-entropy + coef * aux, the loss transformers reports. */
    double (*end_step)(mt_backend *be);

    /* ---- optional: NULL where a backend has none ---- */

    /* After end_step: 0, or -1 with a message when the step's work could
     * not complete (a rank of several lost its peers): its loss and
     * gradients are then not valid. NULL: never. */
    int (*step_error)(mt_backend *be, mt_error *err);
    /* Ends a step cut short after begin_step, at any call boundary (the
     * caller is stopping): no loss, the gradients not valid. The backend is
     * then ready for begin_step, or to be freed. NULL: the backend cannot
     * stop inside a step (the engine then finishes it). */
    void (*abandon_step)(mt_backend *be);
    /* Squared L2 norm of each layer's gradient of the last step (n_layers;
     * a rank of several: of its parts), valid after end_step. NULL: the
     * gradient is in the store's g, whose norms the caller takes. */
    const double *(*layer_sumsq)(mt_backend *be);
    /* Blocks until every gradient of the last step has reached where the
     * optimizer reads it. NULL: it is there at end_step. */
    void (*wait_grads)(mt_backend *be);
    /* Where the optimizer finds each layer's gradient, and which layers it
     * updates in the backend's own memory (engine/optim_pipeline.h); the
     * gate the backend asks before copying a layer's weights. NULL: the
     * optimizer reads the store's g after the step. */
    mt_grad_source (*grad_source)(mt_backend *be);
    void (*set_weight_gate)(mt_backend *be, mt_weight_gate_fn fn, void *ctx);
    /* Measurements of the last step and of the backend's memory. NULL:
     * none (zeros). */
    void (*stats)(mt_backend *be, mt_backend_stats *st);
    /* Records every later step's work into trace (engine/trace.h). NULL:
     * no timeline. */
    void (*set_trace)(mt_backend *be, struct mt_trace *trace);
    /* Sequence objectives (engine/preference.h), once every block has run
     * forward for mb: writes logp (B*T), log p(target) of each token of mb,
     * 0 where the target is MT_IGNORE_INDEX. Forward only: no gradient, the
     * step's loss unchanged. NULL: the backend has no sequence objectives
     * (then head_weighted is NULL too). */
    void (*head_logp)(mt_backend *be, int mb, float *logp);
    /* The head of a training step for mb with token t's cross-entropy
     * gradient scaled by w[t] (B*T; host memory, read before it returns)
     * instead of dscale: writes mb's residual gradient and accumulates the
     * head's weight gradients as head does; adds nothing to the loss. */
    void (*head_weighted)(mt_backend *be, int mb, const float *w);

    /* ---- every backend ---- */

    /* Logits (V) of token row `row` of micro-batch mb after an eval pass
     * (mt_step_eval): for generation. */
    void (*logits)(mt_backend *be, int mb, int64_t row, float *logits);
    /* Releases everything the backend took (be is gone after it). */
    void (*destroy)(mt_backend *be);
} mt_backend_ops;

struct mt_backend {
    const mt_backend_ops *ops;
    const char *name;
};

#endif
