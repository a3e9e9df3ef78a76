/* Text generation from a model on a runner (train/runner.h). */
#ifndef MT_TRAIN_GENERATE_H
#define MT_TRAIN_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "model/config.h"
#include "train/events.h"
#include "train/runner.h"
#include "util/error.h"

/* Generates up to n_new tokens after `prompt` (greedy when temperature is
 * 0, else temperature and top-p sampling); stops at the tokenizer's
 * end-of-sequence token. The text goes to ev as MT_EVENT_TEXT pieces as it
 * grows: the decoded prompt, what each token adds, then "\n". On success
 * *text_out (when not NULL; caller frees) is the whole text without that
 * newline. add_special: encode the prompt with the tokenizer's special
 * tokens (BOS), as the model saw its documents in training. The runner
 * must have M = 1, B = 1. */
int mt_generate(mt_runner *r, const mt_config *cfg, const mt_tokenizer *tok, const char *prompt,
                bool add_special, int n_new, double temperature, double top_p, uint64_t seed,
                const mt_events *ev, char **text_out, mt_error *err);

/* What mt_generate_with does: mt_generate's arguments, and for a chat
 * reply the tokens that end a turn besides EOS, and whether only the
 * reply (not the prompt) is reported and returned. */
typedef struct mt_gen_setup {
    const char *prompt;
    bool add_special, reply_only;
    const int32_t *stops;  // (n_stops)
    size_t n_stops;
    int n_new;
    double temperature, top_p;
    uint64_t seed;
} mt_gen_setup;

int mt_generate_with(mt_runner *r, const mt_config *cfg, const mt_tokenizer *tok,
                     const mt_gen_setup *g, const mt_events *ev, char **text_out, mt_error *err);

#endif
