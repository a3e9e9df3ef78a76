/* The YAML run config of `train --config`: load, resolve, validate. */
#include "train/train_config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_train_config cfg;
    mt_error err;
    mt_train_config_defaults(&cfg);
    if (mt_train_config_load_yaml(&cfg, fuzz_file("run.yaml", data, size), &err) == 0) {
        mt_train_config_resolve(&cfg);
        mt_train_config_validate(&cfg, &err);
    }
    return 0;
}
