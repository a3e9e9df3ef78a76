/* The training run of `megatrain train`: model, data, backend, optimizer,
 * checkpoints, metrics and the final Hugging Face model, from one
 * mt_train_config. */
#ifndef MT_TRAIN_TRAINER_H
#define MT_TRAIN_TRAINER_H

#include "train/train_config.h"
#include "util/error.h"

/* Runs the training described by tc. Returns 0 when it finished, 1 when it
 * stopped on SIGINT/SIGTERM after saving a resume checkpoint, -1 on error
 * (err filled; nothing already saved is touched). */
int mt_train(const mt_train_config *tc, mt_error *err);

#endif
