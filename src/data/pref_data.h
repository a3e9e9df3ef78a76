/* Preference data: pairs of a prompt with a chosen and a rejected answer,
 * from JSONL in TRL's preference layouts, tokenized and packed into the
 * micro-batches of a step (docs/preference.md).
 *
 * A line is {"prompt": "...", "chosen": "...", "rejected": "..."} (texts:
 * BOS, prompt, answer, EOS, as completion data), or the conversational
 * layout whose prompt is a list of messages and whose chosen and rejected
 * are lists holding the assistant's turn (rendered with the chat template
 * as conversational prompt/completion data, dataset_jsonl.c). Each answer
 * makes one document: the prompt and the answer, the answer's tokens with
 * a target (the loss), the prompt's without.
 *
 * A bad pair (not JSON, a field missing, of another kind than the file's
 * first, or empty, or a pair whose documents do not fit a micro-batch of
 * B rows of T tokens) is an error naming the line and field, or with
 * skip_bad_pairs is left out and counted.
 *
 * Order and packing: every epoch takes the pairs in an order shuffled by
 * (seed, epoch). A micro-batch is filled pair by pair, each document into
 * the first of its B rows with room (positions restart at each document,
 * the rest of a row is padding without targets); a pair that does not fit
 * starts the next micro-batch, so both answers of a pair are always in one
 * micro-batch. A step may span two epochs; the data ends after `epochs`. */
#ifndef MT_DATA_PREF_DATA_H
#define MT_DATA_PREF_DATA_H

#include <stdint.h>

#include "data/tokenizer.h"
#include "engine/preference.h"
#include "util/error.h"

typedef struct mt_pref_data_opts {
    const char *path;           /* JSONL (plain, gzip or zstd) */
    const char *chat_template;  /* "auto" (or NULL) or a built-in's name (chat.h) */
    int skip_bad_pairs;
    uint64_t seed;
    int64_t epochs;             /* >= 1 */
    int64_t B, T;               /* the micro-batch every pair must fit */
} mt_pref_data_opts;

typedef struct mt_pref_data {
    char *path;
    int64_t n_pairs;            /* the pairs kept */
    int32_t *tok;               /* tokens of the 2 * n_pairs documents: chosen, rejected */
    uint8_t *keep;              /* (tokens) 1: the token is an answer's (has a target) */
    int64_t *off;               /* (2 * n_pairs + 1) each document's first token */
    int64_t *line;              /* (n_pairs) the JSONL line of each pair */
    int64_t skipped;            /* bad pairs left out */
    char first_skipped[512];    /* the first one's message */
    const char *format;         /* "text" or "messages" */
    const char *chat;           /* the chat template's name, or NULL */
    uint64_t checksum;          /* XXH3 of the tokens, masks and offsets */
    double *ref;                /* (2 * n_pairs) reference log-probabilities, or NULL */
    mt_pref_data_opts o;
    /* position */
    int64_t epoch, next;        /* the next pair: order[next] of epoch */
    int64_t *order;             /* (n_pairs) the epoch's order */
} mt_pref_data;

/* Reads, checks and tokenizes o->path. -1 with err naming the file, line
 * and field. */
int mt_pref_data_open(mt_pref_data *d, const mt_pref_data_opts *o, const mt_tokenizer *tok,
                      int64_t vocab_size, mt_error *err);
void mt_pref_data_free(mt_pref_data *d);

/* The next step's M micro-batches (M, B, T) of tokens, targets and
 * positions, and its pairs (at most M * B * T / 2) with their spans and
 * reference log-probabilities (zeros when d->ref is NULL): *n_pairs. 0;
 * 1: the data is exhausted (nothing written). */
int mt_pref_data_next(mt_pref_data *d, int M, int32_t *tokens, int32_t *targets, int32_t *pos,
                      mt_pref_pair *pairs, int64_t *n_pairs, int64_t *pair_ids);

/* Steps of M micro-batches the data makes from its start over all epochs. */
int64_t mt_pref_data_steps(const mt_pref_data *d, int M);

/* Back to the start of epoch 0. */
void mt_pref_data_rewind(mt_pref_data *d);

/* The position as JSON {"epoch", "next", "pairs", "checksum"} for a resume
 * checkpoint, and back (-1 when it belongs to other data). */
struct cJSON *mt_pref_data_pos_to_json(const mt_pref_data *d);
int mt_pref_data_pos_from_json(mt_pref_data *d, const struct cJSON *j, mt_error *err);

#endif
