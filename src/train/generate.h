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

#endif
