/* Training metrics: metrics.jsonl (one JSON object per logged step) and the
 * progress line printed to the terminal.
 *
 * A row holds every metric; a field that does not apply (no GPU, no ETA
 * yet) is NAN (or -1 for tokens) and is left out of both the JSON line and
 * the progress line. JSON has no NaN, so a non-finite value is left out too,
 * except on a skipped step (non-finite gradients), whose loss and gradient
 * norm also appear as text: "loss_text": "nan", "grad_norm_text": "inf".
 *
 * The file is appended to, so that a resumed run continues it: opening it
 * for a run that resumes after step S first drops any line with step > S
 * (written after the checkpoint it resumes from), and any torn last line
 * (the caller says so), so that the file never holds a step twice. Every
 * write is checked; a failed one leaves no part of its row behind.
 *
 * An evaluation on held-out data (engine/heldout.h) is a row of its own, with
 * the step and the eval_* fields only (readers that want the training loss
 * take the rows that have "loss").
 *
 * With TensorBoard on, every row is also written as scalars to an event
 * file (io/tensorboard.h) in <out>/tensorboard/: each finite field under a
 * tag of mt_metrics_scalars, at the row's step. */
#ifndef MT_ENGINE_METRICS_H
#define MT_ENGINE_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/tensorboard.h"
#include "util/error.h"

/* A preference objective's metrics in a row; every field absent (NAN)
 * for other objectives. */
typedef struct mt_pref_row {
    double rewards_chosen, rewards_rejected, rewards_accuracies, rewards_margins;
    double logps_chosen, logps_rejected;
} mt_pref_row;

typedef struct mt_metrics_row {
    int64_t step;         // optimizer steps done (1 after the first)
    double epoch;         // passes over the data, fractional
    double loss, lr, grad_norm;
    int64_t tokens;       // tokens seen so far; -1 = not applicable
    double tokens_per_s, tflops, step_time_s;
    double gpu_mem_gb, host_mem_gb; // GB = 1e9 bytes
    double h2d_gbps, d2h_gbps;      // GB/s
    double eta_s;
    int64_t skipped;      // a skipped update: how many in a row (1, 2, ...); -1 = absent
    int64_t empty_batches; // batches with no loss token skipped before this step; -1 = absent
    const char *nonfinite; // the first tensor whose gradient is not finite; NULL = absent
    double eval_loss;     // mean loss per token on the held-out data
    int64_t eval_tokens;  // tokens it was measured on; -1 = absent
    double eval_time_s;
    /* Preference objectives (engine/preference.h), TRL's names: means over
     * the step's pairs, and over the held-out pairs (eval_). */
    mt_pref_row pref, eval_pref;
    int64_t skipped_pairs; // bad preference pairs left out of the data; -1 = absent
} mt_metrics_row;

/* A row with only `step` set: every other field absent. */
mt_metrics_row mt_metrics_row_make(int64_t step);

typedef struct mt_metrics_writer {
    int fd;            // -1: not open
    char path[1024];
    mt_tb_writer *tb;  // NULL: no TensorBoard file
    size_t torn;       // bytes of a torn last line mt_metrics_open dropped; 0: none
} mt_metrics_writer;

/* Opens path for appending after dropping the lines with step > keep_step
 * (0 for a fresh run: the file starts empty; the resume step otherwise)
 * and a torn last line (a write cut short: w->torn says how long it was).
 * Rewrites the file atomically (temp file, fsync, rename) when it drops. */
int mt_metrics_open(mt_metrics_writer *w, const char *path, int64_t keep_step, mt_error *err);

/* Also writes every row to a new TensorBoard event file in dir, starting
 * with the marker that drops what an earlier run logged after keep_step. */
int mt_metrics_open_tensorboard(mt_metrics_writer *w, const char *dir, int64_t keep_step,
                                mt_error *err);

/* Appends one JSON line (and the TensorBoard event), each in one write(2).
 * A write that fails (disk full, a file size limit) is an error naming the
 * file, and leaves the file as it was: the bytes of the row that did get
 * written are cut off again, so that the file ends with a whole row. */
int mt_metrics_write(mt_metrics_writer *w, const mt_metrics_row *row, mt_error *err);

/* Syncs and closes both files (err: the first failure, naming the file). */
int mt_metrics_finish(mt_metrics_writer *w, mt_error *err);

/* Closes both files, unchecked (a run given up). */
void mt_metrics_close(mt_metrics_writer *w);

/* The JSON object of a row, without newline, into buf (512 bytes suffice). */
void mt_metrics_format_json(const mt_metrics_row *row, char *buf, size_t n);

/* The finite fields of a row as TensorBoard scalars: tag "train/loss" for
 * "loss", and so on (metrics.c: `scalar_tags`). Returns how many (at most
 * MT_METRICS_MAX_SCALARS). */
#define MT_METRICS_MAX_SCALARS 32
size_t mt_metrics_scalars(const mt_metrics_row *row, mt_tb_scalar *out);

/* The progress line, e.g. `step 120/1000 | loss 2.3412 | lr 9.8e-06 |
 * grad norm 0.412 | 41.2k tok/s | 412 TFLOPS | gpu 52.1 GB | host 108 GB |
 * H2D 7.1 GB/s | D2H 6.9 GB/s | ETA 1h02m`. total_steps <= 0: no "/total". */
void mt_progress_format(const mt_metrics_row *row, int64_t total_steps, char *buf, size_t n);

/* A duration for humans: 42s, 12m05s, 1h02m, 3d04h; "?" when not finite. */
void mt_format_duration(double seconds, char *buf, size_t n);

#endif
