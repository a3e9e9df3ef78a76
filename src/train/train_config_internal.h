/* The option table of `megatrain train`, defined in train_config.c (values,
 * validation) and read by train_config_io.c (YAML and JSON) and
 * train_args.c (flags, --help); util/options.h is what a table drives. */
#ifndef MT_TRAIN_TRAIN_CONFIG_INTERNAL_H
#define MT_TRAIN_TRAIN_CONFIG_INTERNAL_H

#include <stddef.h>

#include "train/train_config.h"
#include "util/options.h"

/* The options in table order (the order of --help, YAML and JSON), and
 * the table over mt_train_config: other trainers' keys are suggested, the
 * tiny model's defaults are each option's alt_def. */
extern const mt_opt mt_tc_options[];
extern const size_t mt_tc_n_options;
extern const mt_opt_table mt_tc_table;

#endif
