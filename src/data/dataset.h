/* Training data: documents from JSONL (text, prompt/completion, chat) or a
 * pre-tokenized .mtok file, packed into rows of T+1 tokens.
 *
 * Every epoch concatenates all documents in an order shuffled by (seed,
 * epoch) into one stream and cuts it into rows of T+1 tokens; row r is
 * stream[r*(T+1) .. (r+1)*(T+1)). Inputs are row[0..T), targets row[1..T],
 * with -100 where the target token carries no loss. The final partial row of
 * each epoch is dropped; nothing else is dropped or repeated. A batch may
 * span two epochs; the data ends when fewer than `rows` rows remain in the
 * requested epochs.
 *
 * Packing "rows": a row is one sequence, documents in it see each other.
 * Packing "documents": each piece of a document in a row is a sequence of
 * its own (the piece a row starts with included): the batch carries each
 * token's position within its piece (mt_batch.pos) and attention stays
 * inside the piece. A target that is the first token of a document gets
 * -100, since the input before it belongs to another document. Rows,
 * tokens and all other targets are those of "rows". docs/data.md describes
 * the formats. */
#ifndef MT_DATA_DATASET_H
#define MT_DATA_DATASET_H

#include <stdbool.h>
#include <stdint.h>

#include "data/token_file.h"
#include "data/tokenizer.h"
#include "util/error.h"

#define MT_IGNORE_INDEX (-100)

typedef struct mt_data_opts {
    const char *path;
    const char *format;         // "auto" (or NULL), "text", "completion", "chat", "tokens"
    const char *chat_template;  // "auto" (or NULL), "llama3", "qwen", "llama2", "mistral"
    const char *packing;        // "auto" (or NULL), "documents", "rows" (see above); auto:
                                // documents for completion and chat data and for token
                                // files with a loss mask, rows for text
    int skip_bad_lines;         // skip (and count) malformed JSONL lines instead of failing
    uint64_t seed;
    int64_t epochs;             // >= 1
} mt_data_opts;

typedef struct mt_data_stats {
    int64_t documents, tokens, trainable, skipped_lines;
    const char *format;         // the format used (after auto-detection)
    const char *chat_template;  // the chat family used, or NULL
    const char *packing;        // "documents" or "rows" (after auto)
} mt_data_stats;

typedef struct mt_data_pos {
    int64_t epoch;  // 0-based
    int64_t row;    // next row of that epoch
} mt_data_pos;

typedef struct mt_dataset mt_dataset;

/* Opens and tokenizes (JSONL) or maps (.mtok) the data. tok may be NULL for
 * .mtok. vocab_size is the model's: a token id >= vocab_size is an error.
 * NULL with err filled on failure. */
mt_dataset *mt_dataset_open(const mt_data_opts *o, const mt_tokenizer *tok, int64_t vocab_size,
                            mt_error *err);
void mt_dataset_free(mt_dataset *d);

/* Writes rows x T inputs, targets and positions: tokens (rows, T), targets
 * (rows, T), pos (rows, T) each token's position within its document piece
 * (packing documents; the contract of mt_batch.pos). pos may be NULL only
 * when the dataset packs rows. 0 ok; 1 end of data (nothing written). T
 * must stay the same across calls for data positions to keep their
 * meaning. */
int mt_dataset_next_batch(mt_dataset *d, int64_t rows, int64_t T, int32_t *tokens,
                          int32_t *targets, int32_t *pos);
/* Whether batches carry document positions (packing documents). */
bool mt_dataset_packs_documents(const mt_dataset *d);

mt_data_stats mt_dataset_stats(const mt_dataset *d);
/* Rows of T+1 tokens in one epoch (0: the data is shorter than one row). */
int64_t mt_dataset_rows_per_epoch(const mt_dataset *d, int64_t T);
/* Message of the first skipped line (skip_bad_lines), or NULL. */
const char *mt_dataset_first_skipped(const mt_dataset *d);

/* Position of the next batch; setting a saved position reproduces exactly
 * the batches that followed it. */
mt_data_pos mt_dataset_get_pos(const mt_dataset *d);
void mt_dataset_set_pos(mt_dataset *d, mt_data_pos pos);

/* The corpus as loaded (for `megatrain tokenize`). */
const mt_mtok *mt_dataset_corpus(const mt_dataset *d);

/* Tokenizes a JSONL file into an in-memory corpus (dataset_jsonl.c).
 * *format / *chat are set to the names used; *skipped counts skipped lines
 * and skip_msg (if not NULL) gets the first one's message. */
int mt_jsonl_tokenize(const mt_data_opts *o, const mt_tokenizer *tok, int64_t vocab_size,
                      mt_mtok *out, const char **format, const char **chat, int64_t *skipped,
                      mt_error *skip_msg, mt_error *err);

#endif
