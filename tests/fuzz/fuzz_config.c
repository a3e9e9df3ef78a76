/* config.json of a Hugging Face model: parse, validate, count parameters. */
#include "fuzz_util.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = fuzz_str(data, size);
    mt_config cfg;
    mt_error err;
    if (mt_config_parse(&cfg, s, "fuzz", &err) == 0 && mt_config_validate(&cfg, "fuzz", &err) == 0)
        mt_config_num_params(&cfg);
    free(s);
    return 0;
}
