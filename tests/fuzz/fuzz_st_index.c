/* model.safetensors.index.json of a sharded model (mt_st_model_open); the
 * shards it names do not exist unless it names model.safetensors. */
#include "fuzz_util.h"
#include "io/safetensors.h"

static const uint8_t empty_st[] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_file("model-00001-of-00001.safetensors", empty_st, sizeof empty_st);
    fuzz_file("model.safetensors.index.json", data, size);
    mt_st_model m;
    mt_error err;
    if (mt_st_model_open(&m, fuzz_dir(), &err) == 0) {
        mt_st_model_find(&m, "model.embed_tokens.weight");
        mt_st_model_close(&m);
    }
    return 0;
}
