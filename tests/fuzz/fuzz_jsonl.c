/* JSONL training data in each format (the first byte picks text,
 * completion, chat with each template, or auto, and the packing), packed
 * into batches. */
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

static const char *const formats[] = {"auto", "text", "completion", "chat", "chat", "chat"};
static const char *const templates[] = {"auto", "auto", "auto", "llama3", "qwen", "llama2"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static mt_tokenizer *tok;
    if (!tok) tok = mt_tokenizer_bytes();
    int f = data[0] % 6;
    mt_data_opts o = {.path = fuzz_file("data.jsonl", data + 1, size - 1), .format = formats[f],
                      .chat_template = templates[f], .skip_bad_lines = data[0] & 8,
                      .packing = data[0] & 64 ? "documents" : "auto",
                      .seed = 1, .epochs = 2};
    mt_error err;
    mt_dataset *d = mt_dataset_open(&o, tok, 258, &err);
    if (!d) return 0;
    int32_t x[4 * 16], y[4 * 16], pos[4 * 16];
    for (int i = 0; i < 8 && mt_dataset_rows_per_epoch(d, 16) > 0; i++)
        if (mt_dataset_next_batch(d, 4, 16, x, y, pos)) break;
    mt_dataset_free(d);
    return 0;
}
