/* tokenizer.json, then encode and decode of fuzzed text: the input is the
 * JSON, a NUL byte, then the text (no NUL: the text is the input itself,
 * encoded with the fixture tokenizer). */
#include "data/tokenizer.h"
#include "fuzz_util.h"

static mt_tokenizer *fixture;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_error err;
    const uint8_t *nul = memchr(data, 0, size);
    mt_tokenizer *tok = NULL;
    const char *text = (const char *)data;
    size_t len = size;
    if (nul) {
        tok = mt_tokenizer_load(fuzz_file("tokenizer.json", data, (size_t)(nul - data)), &err);
        text = (const char *)nul + 1;
        len = size - (size_t)(nul - data) - 1;
    } else {
        if (!fixture) fixture = mt_tokenizer_load("tests/fixtures/tokenizer/tiny_bytelevel.json", &err);
        if (!fixture) abort();
    }
    mt_tokenizer *use = tok ? tok : fixture;
    if (!use) return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    if (mt_tokenizer_encode(use, text, len, true, &ids, &n, &err) == 0) {
        free(mt_tokenizer_decode(use, ids, n, false));
        free(mt_tokenizer_decode(use, ids, n, true));
    }
    free(ids);
    /* ids from the input bytes, in and out of range */
    int32_t raw[64];
    size_t k = size / 4 < 64 ? size / 4 : 64;
    memcpy(raw, data, k * 4);
    free(mt_tokenizer_decode(use, raw, k, false));
    if (tok) mt_tokenizer_free(tok);
    return 0;
}
