/* .mtok pre-tokenized files: header and index validation (mt_mtok_parse). */
#include "data/token_file.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_mtok m;
    mt_error err;
    if (mt_mtok_parse(data, size, "fuzz.mtok", &m, &err) == 0) mt_mtok_free(&m);
    return 0;
}
