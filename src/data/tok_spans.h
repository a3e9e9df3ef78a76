/* A text encoded with a loss flag per token, the flags given as byte spans
 * of the text: what the JSONL formats hand the tokenizer (a completion
 * after its prompt, the assistant turns of a rendered conversation).
 *
 * The ids are those of encoding the whole text (mt_tok_encode). A token
 * carries the loss when its bytes lie in a span; a token that straddles a
 * span's edge carries it too, as transformers' assistant masks mark the
 * tokens holding a span's first and last characters. Where a span's edge
 * falls inside a run of text, the tokens shared with the encoding of the
 * text up to the edge are taken to lie before it. */
#ifndef MT_DATA_TOK_SPANS_H
#define MT_DATA_TOK_SPANS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "util/error.h"

typedef struct mt_tok_span {
    size_t a, b;  // bytes [a, b)
} mt_tok_span;

/* Ids and loss flags; zero-initialise, reuse, free with mt_tok_masked_free. */
typedef struct mt_tok_masked {
    mt_tok_ids ids;
    uint8_t *keep;  // (ids.n) 1: the token carries the loss
    size_t keep_cap;
    mt_tok_ids scratch;
} mt_tok_masked;

void mt_tok_masked_free(mt_tok_masked *m);

/* Appends the encoding of text[0..len) to out, each id flagged by
 * spans[0..n) (sorted, disjoint). -1 with err when the text is not valid
 * UTF-8. */
int mt_tok_encode_spans(mt_tok_encoder *enc, const mt_tokenizer *tok, const char *text, size_t len,
                        const mt_tok_span *spans, size_t n, mt_tok_masked *out, mt_error *err);

/* Appends one id with its flag. */
void mt_tok_masked_push(mt_tok_masked *m, int32_t id, bool keep);

#endif
