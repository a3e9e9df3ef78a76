/* A new model with random weights, and the description of a model. The
 * structs are the public ones (megatrain.h: mt_model_shape, mt_model_info). */
#ifndef MT_TRAIN_MODEL_INIT_H
#define MT_TRAIN_MODEL_INIT_H

#include "megatrain.h"
#include "model/config.h"
#include "model/params.h"
#include "util/error.h"

/* The model types mt_model_create makes (mt_model_shape.model_type),
 * NULL-terminated. */
extern const char *const mt_model_init_types[];

/* mt_model_init's contract (megatrain.h). */
int mt_model_create(const char *dir, const char *tokenizer, const mt_model_shape *s,
                    mt_model_info *info, mt_error *err);

/* What mt_model_describe reports of a config and its parameter table
 * (info->model_type points into cfg). */
void mt_model_info_fill(mt_model_info *info, const mt_config *cfg, const mt_param_table *t);

#endif
