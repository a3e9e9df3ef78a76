/* Training data: documents from JSONL (text, prompt/completion, chat,
 * alpaca, sharegpt; plain, gzip or zstd) or pre-tokenized .mtok files,
 * packed into rows of T+1 tokens.
 *
 * A source is a file or a directory of shards (corpus.h: the files in name
 * order, as if concatenated). Every epoch of a source concatenates all its
 * documents in an order shuffled by (seed, epoch) into one stream and cuts
 * it into rows of T+1 tokens; row r is stream[r*(T+1) .. (r+1)*(T+1)).
 * Inputs are row[0..T), targets row[1..T], with -100 where the target token
 * carries no loss. The final partial row of each epoch is dropped; nothing
 * else is dropped or repeated. A batch may span two epochs; the data ends
 * when fewer than `rows` rows remain in the requested epochs.
 *
 * Several sources (a list in o->path, data_spec.h) are mixed row by row:
 * row k of the mixture comes from source i with probability w_i / sum(w),
 * drawn from a hash of (seed, k), so the choice depends on nothing but the
 * seed and k. Each source then runs through its own epochs without end (a
 * small source is repeated, a large one partly seen); the mixture ends after
 * `epochs` times the rows of all sources together.
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
#include <stdio.h>

#include "data/data_file.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "util/error.h"

#define MT_IGNORE_INDEX (-100)

typedef struct mt_data_opts {
    const char *path;           // a file, a directory of shards, or a list (data_spec.h)
    const char *format;         // "auto" (or NULL), "text", "completion", "chat", "alpaca",
                                // "sharegpt", "tokens" (docs/data.md)
    const char *text_field;     // the key of the text format's text; NULL or "": "text"
    const char *chat_template;  // "auto" (or NULL), or a built-in's name (chat.h)
    const char *packing;        // "auto" (or NULL), "documents", "rows" (see above); auto:
                                // documents when every source is completion or
                                // conversational data (chat, alpaca, sharegpt)
                                // (or token files with a loss mask), rows otherwise
    int skip_bad_lines;         // skip (and count) malformed JSONL lines instead of failing
    uint64_t seed;
    int64_t epochs;             // >= 1
} mt_data_opts;

typedef struct mt_data_stats {
    int64_t documents, tokens, trainable, skipped_lines;
    int64_t files, sources;     // data files read, sources mixed (1: no mixture)
    int64_t bytes;              // JSONL text read (after decompression)
    const char *format;         // the format used (after auto-detection), "mixed" if several
    const char *chat_template;  // "model" (the model's own) or the built-in used, or NULL
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
/* Rows of T+1 tokens in one epoch, of all sources together (0: shorter
 * than one row). */
int64_t mt_dataset_rows_per_epoch(const mt_dataset *d, int64_t T);
/* -1 with a message naming the source when a source (or the data) is
 * shorter than one row of T+1 tokens. */
int mt_dataset_check_rows(const mt_dataset *d, int64_t T, mt_error *err);
/* Message of the first skipped line (skip_bad_lines), or NULL. */
const char *mt_dataset_first_skipped(const mt_dataset *d);
/* Prints a line per source of a mixture, or the file count of a directory
 * (nothing for one file). */
void mt_dataset_print_sources(const mt_dataset *d, FILE *f);

/* Position of the next batch: epoch and row of a single source; of a
 * mixture, rows drawn so far as epochs of all sources' rows (for display).
 * Setting a saved position of a single source reproduces exactly the
 * batches that followed it. */
mt_data_pos mt_dataset_get_pos(const mt_dataset *d);
void mt_dataset_set_pos(mt_dataset *d, mt_data_pos pos);
/* Back to the start (every source at epoch 0, row 0; no rows drawn). */
void mt_dataset_rewind(mt_dataset *d);

/* The whole position as JSON, for a resume checkpoint: {"epoch", "row",
 * "tokens"} of a single source, {"draws", "sources": [...]} of a mixture.
 * tokens is the source's size: a resume refuses data that changed. */
struct cJSON *mt_dataset_pos_to_json(const mt_dataset *d);
/* Restores a position written by mt_dataset_pos_to_json (or {"epoch",
 * "row"} of older checkpoints). -1 naming what does not match. */
int mt_dataset_pos_from_json(mt_dataset *d, const struct cJSON *j, mt_error *err);

/* The corpus as loaded, all files of a directory in one (for `megatrain
 * tokenize`); NULL for a mixture. */
const mt_mtok *mt_dataset_corpus(mt_dataset *d);

/* Tokenizes the JSONL lines of `lines` (the file o->path, named in
 * messages), a block of lines at a time, into an in-memory corpus
 * (dataset_jsonl.c): memory holds the tokens and one block of text. *format
 * / *chat are set to the names used; *skipped counts skipped lines and
 * skip_msg (if not NULL) gets the first one's message. */
int mt_jsonl_tokenize(const mt_data_opts *o, mt_line_reader *lines,
                      const mt_tokenizer *tok, int64_t vocab_size, mt_mtok *out,
                      const char **format, const char **chat, int64_t *skipped,
                      mt_error *skip_msg, mt_error *err);

#endif
