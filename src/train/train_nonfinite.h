/* Non-finite losses and gradients: find the first layer and tensor whose
 * gradient holds a NaN or an infinity, and decide, per --on-nonfinite,
 * whether the run stops (naming them) or skips the update (counting the
 * skips, stopping after --max-skips in a row). */
#ifndef MT_TRAIN_TRAIN_NONFINITE_H
#define MT_TRAIN_TRAIN_NONFINITE_H

#include <stdint.h>

#include "train/train_config.h"
#include "model/params.h"
#include "util/error.h"

typedef struct mt_nonfinite {
    int layer;            /* first layer with a non-finite gradient; -1: none found */
    char tensor[128];     /* its first such tensor (HF name); "" when only the layer is known */
    int64_t in_a_row;     /* skipped steps in a row so far */
    int64_t total;        /* skipped steps in this process */
    char warning[512];    /* what mt_nonfinite_decide says about a skipped step */
} mt_nonfinite;

/* Scans the layer-major gradient array g of table t in layer order and
 * records the first non-finite tensor in nf. Returns 1 if one was found. */
int mt_nonfinite_find(mt_nonfinite *nf, const mt_param_table *t, const float *g);

/* The same from per-layer sums of squares (n_layers of them, e.g. the GPU
 * backend's): the first layer whose sum is not finite, tensor unknown;
 * then, when g is not NULL (gradients on the host), the tensor in it. */
int mt_nonfinite_find_sumsq(mt_nonfinite *nf, const mt_param_table *t, const double *sumsq,
                            const float *g);

/* Step `step` had a non-finite loss or gradient. Returns 0 when the update
 * is to be skipped (tc->on_nonfinite skip, fewer than max_skips in a row;
 * nf->warning says so, for the caller to report), -1 with err naming the
 * step, loss, norm, layer and tensor, and what to do, when the run must
 * stop. can_skip = 0: this backend cannot skip (stop regardless). */
int mt_nonfinite_decide(mt_nonfinite *nf, const mt_train_config *tc, int64_t step, double loss,
                        double grad_norm, int can_skip, mt_error *err);

/* The global gradient norm of g (what a skipped step reports). */
double mt_grad_norm(const mt_param_table *t, const float *g);

/* A finite step: the count of skips in a row restarts. */
static inline void mt_nonfinite_ok(mt_nonfinite *nf) { nf->in_a_row = 0; }

#endif
