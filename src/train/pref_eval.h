/* A preference objective's metrics over a whole set of held-out pairs (the
 * trainer's evaluation, and `megatrain eval --objective ...`), and the
 * objective's options from a train config. */
#ifndef MT_TRAIN_PREF_EVAL_H
#define MT_TRAIN_PREF_EVAL_H

#include "data/pref_data.h"
#include "engine/backend.h"
#include "engine/metrics.h"
#include "engine/preference.h"
#include "train/train_config.h"

/* The loss and its parameters that tc's objective (not sft) names. */
mt_pref_opts mt_pref_opts_of(const mt_train_config *tc);

/* Forward passes of be (M micro-batches of d's B x T) over every pair of d
 * in file order; the means over all pairs into *m. d's reference
 * log-probabilities (d->ref) are used where o's loss needs them (zeros
 * without). d's position is left at its start. */
int mt_pref_evaluate(mt_backend *be, int n_layers, int M, mt_pref_data *d,
                     const mt_pref_opts *o, mt_pref_metrics *m, mt_error *err);

/* As mt_pref_evaluate on a rank of several (r; NULL: one): each rank
 * scores the pairs of its micro-batches of every batch (M: all of them),
 * and *m is the means over all ranks' pairs, on every rank. */
int mt_pref_evaluate_ranks(mt_backend *be, int n_layers, int M, mt_pref_data *d,
                           const mt_pref_opts *o, const mt_pref_ranks *r, mt_pref_metrics *m,
                           mt_error *err);

/* The metrics row's fields of m. */
void mt_pref_row_of(const mt_pref_metrics *m, mt_pref_row *row);

#endif
