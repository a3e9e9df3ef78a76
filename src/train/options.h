/* The public options handle (megatrain.h: mt_options) is the train config. */
#ifndef MT_TRAIN_OPTIONS_H
#define MT_TRAIN_OPTIONS_H

#include "megatrain.h"
#include "train/train_config.h"

struct mt_options {
    mt_train_config tc;
};

#endif
