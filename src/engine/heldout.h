/* Loss on held-out data: the loop of `megatrain eval`, and the periodic
 * evaluation of a training run (eval_data, eval_every), which runs that
 * same loop on the training backend's current weights.
 *
 * The data is read from its start each time in the order `megatrain eval`
 * reads it (seed MT_EVAL_SEED, one epoch), as batches of M micro-batches of
 * B rows of T tokens, the last batch partial (its missing rows padded, with
 * no loss); the final partial row is left out. The loss is the sum
 * over every target with a loss divided by their count, so an evaluation
 * during training equals `megatrain eval --micro-batches M --batch-size B
 * --seq-len T` on a checkpoint saved at the same step (same backend). */
#ifndef MT_ENGINE_HELDOUT_H
#define MT_ENGINE_HELDOUT_H

#include <stdint.h>
#include <stdio.h>

#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/metrics.h"

#define MT_EVAL_SEED 1

typedef struct mt_eval_totals {
    double loss_sum;   // summed over targets with a loss
    int64_t tokens;    // targets with a loss
    int64_t batches;
    double seconds;
} mt_eval_totals;

/* The next batch of rows x T to evaluate: a full one, else the rows that
 * remain with the rest padded (token 0, target -100: no loss; position
 * 0). The rows read; 0 at the end of the data. */
int64_t mt_eval_next_batch(mt_dataset *d, int64_t rows, int64_t T, int32_t *tokens,
                           int32_t *targets, int32_t *pos);

/* Rewinds d and evaluates up to max_batches batches (0: all) of M x (B, T),
 * the last one partial (mt_eval_next_batch):
 * of each, micro-batches [mb_first, mb_first + mb_count) through be (a
 * backend made for at least mb_count micro-batches of (B, T); all of them:
 * 0 and M). tokens/targets/pos are scratch of M*B*T (pos: when d packs
 * documents, else NULL). */
int mt_eval_dataset(mt_backend *be, int n_layers, mt_dataset *d, int M, int mb_first,
                    int mb_count, int64_t B, int64_t T, int64_t max_batches, int32_t *tokens,
                    int32_t *targets, int32_t *pos, mt_eval_totals *res, mt_error *err);

/* The held-out data of a training run and when to evaluate on it. */
typedef struct mt_eval_set {
    mt_dataset *data;
    int M;
    int64_t B, T, max_batches, every;
    int32_t *tokens, *targets;  // (M, B, T) each
    int32_t *pos;               // (M, B, T) when the data packs documents, else NULL
    /* One rank of several: it evaluates micro-batches [mb_first, mb_first
     * + mb_count) of each batch (its backend is made for mb_count), and
     * sum adds a few doubles over the ranks. Alone: 0, M and NULL. */
    int mb_first, mb_count;
    int (*sum)(void *ctx, double *x, int n, mt_error *err);
    void *sum_ctx;
} mt_eval_set;

/* Opens the data of o (seed and epochs are set here) for batches of
 * M x (B, T); -1 naming the file when it holds no whole batch. every: steps
 * between evaluations, 0 = only after the last step. */
int mt_eval_set_open(mt_eval_set *e, const mt_data_opts *o, const mt_tokenizer *tok,
                     int64_t vocab_size, int M, int64_t B, int64_t T, int64_t max_batches,
                     int64_t every, mt_error *err);
void mt_eval_set_free(mt_eval_set *e);

/* Whether step (optimizer steps done) is one to evaluate at. */
int mt_eval_set_due(const mt_eval_set *e, int64_t step, int64_t total_steps);

/* Evaluates with be's current weights and writes the eval row of `step` to
 * mw (metrics.jsonl and TensorBoard; NULL: not written, a rank other than
 * the first) and its progress line into line (cap bytes, may be NULL). */
int mt_eval_set_log(mt_eval_set *e, mt_backend *be, int n_layers, int64_t step,
                    int64_t total_steps, mt_metrics_writer *mw, char *line, size_t cap,
                    mt_error *err);

#endif
