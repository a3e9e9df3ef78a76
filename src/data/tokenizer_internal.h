/* Internals shared by the tokenizer sources (not a public header).
 *
 * tokenizer_utf8.c   the ByteLevel alphabet, UTF-8 decoding and validation
 * tokenizer_map.c    hash maps: token bytes -> id, (id, id) -> merge
 * tokenizer_load.c   parses tokenizer.json into struct mt_tokenizer
 * tokenizer_open.c   opening a file (and tokenizer_config.json), free, queries
 * tokenizer.c        the encoding pipeline, BPE merge loop
 * tokenizer_decode.c ids -> text through the decoder chain
 *
 * Each depends only on the files listed before it (the two maps and the
 * characters are leaves; encoding and decoding read a loaded tokenizer).
 *
 * Encoding follows HF `tokenizers`: split the text on added tokens, then per
 * remaining piece normalize, pre-tokenize into words, BPE each word, and
 * finally wrap with the post-processor template. */
#ifndef MT_DATA_TOKENIZER_INTERNAL_H
#define MT_DATA_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/tokenizer.h"

/* ---- hash maps (tokenizer_map.c) ---- */

uint64_t mt_tok_hash(const char *s, size_t len);

typedef struct mt_tok_strslot {
    uint64_t hash;
    uint32_t off, len;  // key bytes in the map's arena
    int32_t val;        // < 0: empty slot
} mt_tok_strslot;

/* Byte string -> int32, open addressing; keys copied into one arena. */
typedef struct mt_tok_strmap {
    mt_tok_strslot *slots;  // (mask + 1)
    size_t mask, n;
    char *arena;
    size_t arena_len, arena_cap;
} mt_tok_strmap;

void mt_tok_strmap_init(mt_tok_strmap *m, size_t expected);
void mt_tok_strmap_free(mt_tok_strmap *m);
/* Sets key -> val (overwrites). */
void mt_tok_strmap_put(mt_tok_strmap *m, const char *key, size_t len, int32_t val);
/* val, or -1 when absent. */
int32_t mt_tok_strmap_get(const mt_tok_strmap *m, const char *key, size_t len);

typedef struct mt_tok_mergeslot {
    uint64_t key;  // (left id << 32) | right id; UINT64_MAX: empty
    uint32_t rank;
    int32_t new_id;
} mt_tok_mergeslot;

/* (left id, right id) -> (rank, merged id). */
typedef struct mt_tok_mergemap {
    mt_tok_mergeslot *slots;  // (mask + 1)
    size_t mask, n;
} mt_tok_mergemap;

void mt_tok_mergemap_init(mt_tok_mergemap *m, size_t expected);
void mt_tok_mergemap_free(mt_tok_mergemap *m);
void mt_tok_mergemap_put(mt_tok_mergemap *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
/* The slot for (a, b), or NULL. */
const mt_tok_mergeslot *mt_tok_mergemap_get(const mt_tok_mergemap *m, int32_t a, int32_t b);

/* ---- components parsed from tokenizer.json ---- */

enum { MT_NORM_NFC, MT_NORM_PREPEND, MT_NORM_REPLACE };
typedef struct mt_tok_norm {
    int kind;
    char *a, *b;  // PREPEND: a; REPLACE: a -> b
    size_t alen, blen;
} mt_tok_norm;

enum { MT_DEC_BYTELEVEL, MT_DEC_REPLACE, MT_DEC_BYTEFALLBACK, MT_DEC_FUSE, MT_DEC_STRIP };
typedef struct mt_tok_dec {
    int kind;
    char *a, *b;  // REPLACE: a -> b; STRIP: a is the character stripped
    size_t alen, blen;
    size_t start, stop;  // STRIP: how many to strip at each end
} mt_tok_dec;

typedef struct mt_tok_added {
    char *content;
    size_t len;
    int32_t id;
    bool special;
} mt_tok_added;

/* A set of added tokens matched leftmost-longest: tokens sorted by first
 * byte then decreasing length, bucket[c] .. bucket[c+1] those starting
 * with byte c. */
typedef struct mt_tok_addedset {
    mt_tok_added *tok;  // (n)
    size_t n;
    uint32_t bucket[257];
} mt_tok_addedset;

#define MT_TOK_MAX_SPLITS 4

struct mt_tokenizer {
    bool is_bytes;  // the built-in byte tokenizer: nothing below is used
    size_t vocab_size;
    char *path;     // the tokenizer.json it was loaded from (NULL: bytes)

    // id -> token as spelled in tokenizer.json (decode, token_id)
    char *id_arena;
    size_t *id_off;   // (vocab_size + 1); id i is id_arena[id_off[i]..id_off[i+1])
    bool *id_exists;  // (vocab_size)
    bool *id_special; // (vocab_size) added token marked special

    // BPE model; with byte_level the keys are raw bytes (ByteLevel mapping
    // undone), else UTF-8 as in the file.
    mt_tok_strmap vocab;
    mt_tok_mergemap merges;
    bool byte_level, ignore_merges, byte_fallback, fuse_unk;
    bool sp_chunks;            // words may be cut before a "▁" (see mt_tok_sp_chunks_exact)
    int32_t unk_id;            // -1: none
    int32_t byte_ids[256];     // byte_level: id of each single byte, -1 absent
    int32_t fallback_ids[256]; // id of "<0xNN>", -1 absent

    mt_tok_norm *norms;  // (n_norms) applied in order
    size_t n_norms;
    pcre2_code *splits[MT_TOK_MAX_SPLITS];  // Split(regex, Isolated), in order
    size_t n_splits;
    mt_tok_dec *decs;  // (n_decs)
    size_t n_decs;
    bool has_decoder;

    mt_tok_addedset added_raw;   // normalized = false: matched on raw text
    mt_tok_addedset added_norm;  // normalized = true: matched after normalizing

    int32_t *prefix_ids, *suffix_ids;  // template around the sequence
    size_t n_prefix, n_suffix;
    int32_t bos_id, eos_id;
};

/* Parses the tokenizer.json text json (len bytes) into tok, which holds
 * unk/bos/eos = -1 and nothing else; errors are prefixed with path. On
 * error tok may hold parts, freed by mt_tokenizer_free. In tokenizer_load.c. */
int mt_tok_parse(mt_tokenizer *tok, const char *json, size_t len, const char *path, mt_error *err);

/* The SentencePiece marker "▁" (U+2581) in UTF-8. */
#define MT_TOK_SP_MARK "\xE2\x96\x81"
#define MT_TOK_SP_MARK_LEN 3

/* Whether cutting a BPE word just before each "▁" that follows a char other
 * than "▁", and encoding the chunks alone, gives the same ids as the whole
 * word; the reasoning is at the definition (tokenizer_load.c). */
bool mt_tok_sp_chunks_exact(const mt_tokenizer *tok);

/* The first window of text a pre-tokenizer regex match is looked for in
 * (tokenizer.c: split_words), 256 bytes; tests set it smaller or larger to
 * check that the matches do not depend on it. */
void mt_tok_encoder_set_window(mt_tok_encoder *e, size_t bytes);

/* ---- characters (tokenizer_utf8.c) ---- */

/* ByteLevel alphabet: byte -> code point and back (-1 if not an image). */
uint32_t mt_tok_byte_to_cp(uint8_t b);
int mt_tok_cp_to_byte(uint32_t cp);
/* Decodes one UTF-8 sequence at s (len > 0, assumed valid); returns its
 * length and sets *cp. */
size_t mt_tok_utf8_next(const char *s, size_t len, uint32_t *cp);
/* Offset of the first byte of s that is not valid UTF-8 (as Rust's str: no
 * overlongs, surrogates, > U+10FFFF), or len when s is valid. */
size_t mt_tok_utf8_invalid_at(const char *s, size_t len);

#endif
