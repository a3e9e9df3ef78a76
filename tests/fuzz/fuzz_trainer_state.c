/* The "config" object of a checkpoint's trainer_state.json, which a resume
 * parses (mt_train_config_from_json), and the state's JSON round trip. */
#include "train/train_config.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = fuzz_str(data, size);
    mt_train_config cfg;
    mt_error err;
    mt_train_config_defaults(&cfg);  /* as the trainer's resume does */
    if (mt_train_config_from_json(&cfg, s, &err) == 0) free(mt_train_config_to_json(&cfg));
    free(s);
    return 0;
}
