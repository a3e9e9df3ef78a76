/* The training run of `megatrain train`: model, data, backend, optimizer,
 * checkpoints, metrics and the final Hugging Face model, from one
 * mt_train_config. megatrain.h's mt_run_* calls are these, with the error
 * left for mt_last_error; their contracts are there. */
#ifndef MT_TRAIN_TRAINER_H
#define MT_TRAIN_TRAINER_H

#include <stdint.h>

#include "megatrain.h"
#include "train/events.h"
#include "train/train_config.h"
#include "util/error.h"

/* tc is copied; ev (may be NULL) is where the run reports. */
mt_run *mt_trainer_open(const mt_train_config *tc, const mt_events *ev, mt_error *err);
/* mt_run_step's codes, and 2: a signal caught by mt_trainer_train's
 * handlers came during the step, which was abandoned (only there: the
 * handlers are installed for its duration). */
int mt_trainer_step(mt_run *R, mt_step_metrics *m, mt_error *err);
int mt_trainer_save(mt_run *R, mt_error *err);
int mt_trainer_finish(mt_run *R, mt_error *err);
int mt_trainer_train(mt_run *R, mt_error *err);
int64_t mt_trainer_steps_done(const mt_run *R);
int64_t mt_trainer_total_steps(const mt_run *R);
void mt_trainer_close(mt_run *R);

/* Runs the training described by tc, reporting nothing. Returns 0 when it
 * finished, 1 when it stopped on SIGINT/SIGTERM after saving a resume
 * checkpoint, -1 on error (err filled; nothing already saved is touched). */
int mt_train(const mt_train_config *tc, mt_error *err);

#endif
