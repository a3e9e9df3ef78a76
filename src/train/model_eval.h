/* Evaluation: the mean loss of a model on a data file. The option and
 * result structs are the public ones (megatrain.h). */
#ifndef MT_TRAIN_MODEL_EVAL_H
#define MT_TRAIN_MODEL_EVAL_H

#include "megatrain.h"
#include "train/runner.h"
#include "util/error.h"

/* mt_model_eval's contract (megatrain.h), on a loaded model. */
int mt_eval_model(mt_loaded_model *m, const mt_eval_opts *o, mt_eval_result *res,
                  mt_error *err);

/* The same for a preference objective (o->objective not sft), on the
 * device dev (mt_runner_parse_device) with rows of T tokens
 * (model_eval_pref.c). */
int mt_eval_model_pref(mt_loaded_model *m, const mt_eval_opts *o, int dev, int64_t T,
                       mt_eval_result *res, mt_error *err);

#endif
