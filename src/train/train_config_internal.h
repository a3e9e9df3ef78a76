/* The option table of `megatrain train`, defined in train_config.c (values,
 * validation) and read by train_config_io.c (YAML and JSON) and
 * train_args.c (flags, --help). */
#ifndef MT_TRAIN_TRAIN_CONFIG_INTERNAL_H
#define MT_TRAIN_TRAIN_CONFIG_INTERNAL_H

#include <stddef.h>

#include "train/train_config.h"

typedef enum mt_tc_type { MT_TC_STRING, MT_TC_INT, MT_TC_FLOAT, MT_TC_BOOL, MT_TC_ENUM } mt_tc_type;

/* Bounds of numeric options; NAN = unbounded on that side. */
typedef struct mt_tc_range {
    double lo, hi;
    bool lo_open, hi_open; // true: the bound itself is not allowed
} mt_tc_range;

typedef struct mt_tc_option {
    const char *name;          // YAML key; the flag is --name with '_' -> '-'
    mt_tc_type type;
    size_t offset;             // of the field in mt_train_config
    const char *def;           // default, as text in the config syntax
    const char *tiny_def;      // default for the built-in tiny model; NULL = def
    mt_tc_range range;
    const char *const *choices; // MT_TC_ENUM: names, NULL-terminated, in enum order
    const char *meta;          // argument placeholder in --help; NULL = from type
    const char *section;       // non-NULL on the first option of a --help section
    const char *help;
} mt_tc_option;

extern const mt_tc_option mt_tc_options[];
extern const size_t mt_tc_n_options;

/* Option by key ('_' or '-'), or NULL. */
const mt_tc_option *mt_tc_find(const char *key);

/* Closest known key to an unknown one ("learning_rate" -> "lr"), or NULL. */
const char *mt_tc_suggest(const char *key);

/* Sets opt from text; `label` starts error messages ("run.yaml:7: lr"). */
int mt_tc_set(mt_train_config *cfg, const mt_tc_option *opt, const char *value,
              const char *label, mt_error *err);

/* The value of opt as text in the config syntax (shortest exact form for
 * numbers), without YAML quoting. */
void mt_tc_format(const mt_train_config *cfg, const mt_tc_option *opt, char *buf, size_t n);

#endif
