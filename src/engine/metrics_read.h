/* Reading a metrics.jsonl back (engine/metrics.h writes it) into arrays, as
 * `megatrain plot` draws them: the training rows (a "step" and a "loss",
 * with "lr" when present) and the evaluation rows (a "step" and an
 * "eval_loss"). A line can be both; any other line is skipped. */
#ifndef MT_ENGINE_METRICS_READ_H
#define MT_ENGINE_METRICS_READ_H

#include <stddef.h>

#include "util/error.h"

typedef struct mt_metrics_series {
    double *step, *loss, *lr;      // (n,) each: the training rows; lr NAN where absent
    size_t n, cap;
    int has_lr;                    // 1 if any training row has an "lr"
    double *eval_step, *eval_loss; // (n_eval,) each: the evaluation rows
    size_t n_eval, eval_cap;
} mt_metrics_series;

/* Reads the rows of path into *s (zero it first), in file order. A line that
 * is not JSON (a run killed mid-write leaves a torn last one) is skipped
 * with a warning on stderr, `<who>: warning: <path>:<line> is not JSON,
 * skipped` (who NULL: no warning). Returns 0, or -1 with err set and *s
 * freed for a file that cannot be opened or has no training row. */
int mt_metrics_read(const char *path, mt_metrics_series *s, const char *who, mt_error *err);

/* Frees the arrays of s (not s itself) and zeroes it. */
void mt_metrics_series_free(mt_metrics_series *s);

#endif
