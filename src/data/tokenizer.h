/* Tokenizers: Hugging Face tokenizer.json (BPE) and a built-in byte tokenizer.
 *
 * mt_tokenizer_load reads a tokenizer.json and gives ids identical to HF
 * `tokenizers` Tokenizer.encode for the BPE families megatrain trains:
 *   - byte-level BPE (Llama-3, Qwen): optional NFC normalizer, pre-tokenizer
 *     Split(regex, Isolated) and/or ByteLevel, merges by rank, ignore_merges;
 *   - SentencePiece-style BPE (Llama-2): Prepend/Replace normalizer, no
 *     pre-tokenizer, byte_fallback (<0xNN>), unk with fuse_unk;
 *   - added tokens (<|begin_of_text|>, <|im_start|>, ...) matched literally
 *     before normalization; the TemplateProcessing post-processor adds
 *     BOS/EOS when add_special is true.
 * Any other component is refused at load with the JSON path that names it.
 *
 * A loaded mt_tokenizer is read-only: several threads may encode with it at
 * once, each through its own mt_tok_encoder (scratch buffers and a cache of
 * recently seen pre-tokens). */
#ifndef MT_DATA_TOKENIZER_H
#define MT_DATA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct mt_tokenizer mt_tokenizer;
typedef struct mt_tok_encoder mt_tok_encoder;

/* A growable id buffer; encoding appends to it. Zero-initialise, free with
 * mt_tok_ids_free. */
typedef struct mt_tok_ids {
    int32_t *ids;  // (n)
    size_t n, cap;
} mt_tok_ids;

void mt_tok_ids_free(mt_tok_ids *v);

/* Loads a tokenizer.json. bos/eos ids come from tokenizer_config.json in the
 * same directory when present. NULL with err filled on failure. */
mt_tokenizer *mt_tokenizer_load(const char *path, mt_error *err);

/* The built-in byte tokenizer: ids 0..255 are the bytes, 256 is BOS ("<s>"),
 * 257 is EOS ("</s>"); add_special prepends BOS. Never fails. */
mt_tokenizer *mt_tokenizer_bytes(void);

/* Writes the byte tokenizer as dir/tokenizer.json (Hugging Face byte-level
 * BPE giving its ids; a literal "<s>" in a text is the special token there)
 * and dir/tokenizer_config.json (bos <s>, eos </s>), so that a model of
 * this vocabulary is a whole Hugging Face directory. */
int mt_tokenizer_bytes_save(const char *dir, mt_error *err);

void mt_tokenizer_free(mt_tokenizer *tok);

/* The tokenizer.json the tokenizer was loaded from (its folder holds
 * tokenizer_config.json), or NULL for the byte tokenizer. */
const char *mt_tokenizer_path(const mt_tokenizer *tok);

/* The first added token (special or not, matched on the raw text as
 * encoding matches them: leftmost, then longest) in s[from..len): true
 * with its bytes [*st, *en) and *id. The byte tokenizer has none. */
bool mt_tokenizer_next_added(const mt_tokenizer *tok, const char *s, size_t len, size_t from,
                             size_t *st, size_t *en, int32_t *id);

/* Number of ids (model vocab and added tokens): max id + 1. */
size_t mt_tokenizer_vocab_size(const mt_tokenizer *tok);

/* Id of a token as spelled in tokenizer.json ("<|im_start|>", "Ġthe",
 * "<0x0A>"), or -1 if absent. A scan of the vocab: look ids up once. */
int32_t mt_tokenizer_token_id(const mt_tokenizer *tok, const char *token);

/* BOS/EOS ids (tokenizer_config.json, else the template), -1 if unknown. */
int32_t mt_tokenizer_bos_id(const mt_tokenizer *tok);
int32_t mt_tokenizer_eos_id(const mt_tokenizer *tok);

/* Per-thread encoding state for tok (which must outlive it). */
mt_tok_encoder *mt_tok_encoder_new(const mt_tokenizer *tok);
void mt_tok_encoder_free(mt_tok_encoder *enc);

/* Encodes text[0..len) (UTF-8) and appends the ids to out. add_special is
 * HF's add_special_tokens (post-processor template). Returns 0, or -1 with
 * err filled when the text is not valid UTF-8. */
int mt_tok_encode(mt_tok_encoder *enc, const char *text, size_t len, bool add_special,
                  mt_tok_ids *out, mt_error *err);

/* One-shot convenience: *ids (malloc'd, caller frees) and *n. Builds a
 * fresh encoder each call; use mt_tok_encode for bulk work. */
int mt_tokenizer_encode(const mt_tokenizer *tok, const char *text, size_t len,
                        bool add_special, int32_t **ids, size_t *n, mt_error *err);

/* Decodes ids to a NUL-terminated UTF-8 string (malloc'd, caller frees), as
 * HF Tokenizer.decode. Unknown ids are skipped; skip_special drops added
 * tokens marked special. Invalid UTF-8 becomes U+FFFD. */
char *mt_tokenizer_decode(const mt_tokenizer *tok, const int32_t *ids, size_t n,
                          bool skip_special);

#endif
