/* The reference model's log-probabilities of a preference set (DPO): one
 * forward pass over every pair before training, kept in a file of the run
 * so that training holds only the policy.
 *
 * The file (reference_logps.bin in the run's directory, host byte order):
 *   "MTREFLP1", u64 pairs, u64 data checksum (mt_pref_data.checksum),
 *   u64 model checksum (XXH3 of the reference weights), then per pair in
 *   the data's file order two f64 (chosen, rejected), then u64 XXH3 of all
 *   that precedes it and "MTREFEND".
 * While the pass runs it appends to <file>.partial, a batch at a time; a
 * pass cut short continues from there when the header matches, and the
 * finished file is renamed into place. */
#ifndef MT_TRAIN_PREF_REF_H
#define MT_TRAIN_PREF_REF_H

#include <stdint.h>

#include "data/pref_data.h"
#include "engine/backend.h"
#include "util/error.h"

/* Reads path into d->ref: 0; 1 when there is no file; -1 (err naming path)
 * when it is damaged, or belongs to other data, or (model_sum not 0) to
 * another reference model. */
int mt_pref_ref_load(mt_pref_data *d, const char *path, uint64_t model_sum, mt_error *err);

/* The pass over all of d with be (M micro-batches of d's B x T), writing
 * path (via path.partial, continued if it is one of the same data and
 * model) and filling d->ref. *resumed: pairs found already done. path
 * NULL: no file, d->ref only. */
int mt_pref_ref_compute(mt_pref_data *d, mt_backend *be, int n_layers, int M, const char *path,
                        uint64_t model_sum, int64_t *resumed, mt_error *err);

/* As mt_pref_ref_compute on a rank of several (r; NULL: one): each rank
 * computes the pairs of its micro-batches of every batch (M: all of them),
 * the values are added over the ranks so that every rank's d->ref holds
 * all of them, and only the lead rank reads and writes path. */
int mt_pref_ref_compute_ranks(mt_pref_data *d, mt_backend *be, int n_layers, int M,
                              const mt_pref_ranks *r, const char *path, uint64_t model_sum,
                              int64_t *resumed, mt_error *err);

/* XXH3 of n floats: the model checksum of a store's weights. */
uint64_t mt_pref_ref_model_sum(const float *w, size_t n);

#endif
