/* Pre-tokenized corpora (.mtok): documents of token ids with an optional
 * per-token loss mask, memory-mapped for training.
 *
 * Layout (all integers little-endian; docs/data.md is the reference):
 *   0  char[4] magic "MTOK"       32 u64 n_tokens
 *   4  u32 version (1)            40 u64 flags (bit 0: loss mask present)
 *   8  u32 header_size (64)       48 u64 n_trainable (tokens with loss)
 *   12 u32 token_bytes (2 or 4)   56 u64 reserved (0)
 *   16 u64 vocab_size
 *   24 u64 n_docs
 *   header_size: u64 offsets[n_docs + 1]  // token index of each document start; last = n_tokens
 *   then tokens[n_tokens]                 // u16 if vocab_size <= 65535, else u32
 *   then, if flags bit 0, mask[ceil(n_tokens / 8)]: bit i%8 of byte i/8 is token i's loss flag
 * and nothing after. An mt_mtok is the same view, whether it comes from a
 * mapped file or from tokenizing JSONL in memory, so both train alike. */
#ifndef MT_DATA_TOKEN_FILE_H
#define MT_DATA_TOKEN_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define MT_MTOK_VERSION 1
#define MT_MTOK_HEADER_SIZE 64
#define MT_MTOK_FLAG_MASK 1u

typedef struct mt_mtok {
    uint64_t vocab_size, n_docs, n_tokens, n_trainable;
    uint32_t token_bytes;     // 2 or 4
    const uint64_t *offsets;  // (n_docs + 1)
    const void *tokens;       // (n_tokens) u16 or u32
    const uint8_t *mask;      // (ceil(n_tokens / 8)) bitmap, NULL = every token has loss
    void *map;                // the mapped file (map_len bytes), or NULL
    size_t map_len;
    void *owned[3];           // malloc'd blocks holding offsets, tokens, mask (one or more)
} mt_mtok;

static inline uint32_t mt_mtok_token(const mt_mtok *m, uint64_t i) {
    return m->token_bytes == 2 ? ((const uint16_t *)m->tokens)[i]
                               : ((const uint32_t *)m->tokens)[i];
}

static inline bool mt_mtok_trainable(const mt_mtok *m, uint64_t i) {
    return !m->mask || (m->mask[i >> 3] >> (i & 7) & 1);
}

/* Token width for a vocabulary: 2 bytes up to 65535 ids, else 4. */
static inline uint32_t mt_mtok_token_bytes(uint64_t vocab_size) {
    return vocab_size <= 65535 ? 2 : 4;
}

/* Allocates an in-memory corpus of n_docs / n_tokens (offsets, tokens and,
 * if with_mask, a zeroed mask); the caller fills them. */
void mt_mtok_alloc(mt_mtok *m, uint64_t vocab_size, uint64_t n_docs, uint64_t n_tokens,
                   bool with_mask);

/* Validates an image of a .mtok (name is for messages) and points m into
 * it: every header field against size, offsets monotone, every token below
 * vocab_size, n_trainable against the mask. m does not own buf. */
int mt_mtok_parse(const void *buf, size_t size, const char *name, mt_mtok *m, mt_error *err);

/* Maps and validates a .mtok file. */
int mt_mtok_open(const char *path, mt_mtok *m, mt_error *err);

/* Writes m to path atomically (temporary file + fsync + rename). */
int mt_mtok_write(const char *path, const mt_mtok *m, mt_error *err);

void mt_mtok_free(mt_mtok *m);

#endif
