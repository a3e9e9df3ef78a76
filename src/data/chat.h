/* Chat formats: a conversation ({"role", "content"} messages) rendered as the
 * chat template of a model family renders it, written out in C (no Jinja).
 *
 * Families (docs/data.md has the exact strings):
 *   llama3   the Llama-3 Instruct template: content trimmed, BOS first, a
 *            trailing "<|start_header_id|>assistant<|end_header_id|>\n\n";
 *   qwen     the Qwen3 template (<|im_start|>role\n...<|im_end|>\n, the
 *            empty <think> block on the last assistant turn);
 *   llama2   Meta's Llama-2-chat template (<s>[INST] ... [/INST] a </s>,
 *            system prompt in <<SYS>>);
 *   mistral  Mistral-Instruct v0.1 (user/assistant only).
 * The output is a list of pieces over one rendered string: a piece is either
 * a special token (tokenized by id lookup) or plain text, and carries the
 * loss flag (assistant content and its end-of-turn token). Rendering is
 * byte-identical to transformers' apply_chat_template (tests/cpu/test_dataset.c,
 * fixture from scripts/make_chat_fixture.py). */
#ifndef MT_DATA_CHAT_H
#define MT_DATA_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "data/tokenizer.h"
#include "util/error.h"

typedef enum mt_chat_template {
    MT_CHAT_LLAMA3,
    MT_CHAT_QWEN,
    MT_CHAT_LLAMA2,
    MT_CHAT_MISTRAL,
} mt_chat_template;

typedef struct mt_chat_msg {
    const char *role;     // "system", "user" or "assistant"
    const char *content;  // UTF-8, content_len bytes
    size_t content_len;
} mt_chat_msg;

typedef struct mt_chat_piece {
    size_t off, len;  // bytes of the rendered text
    bool special;     // one special token spelled text[off..off+len)
    bool train;       // carries the loss
} mt_chat_piece;

/* A rendered conversation; zero-initialise, reuse across calls, free with
 * mt_chat_out_free. */
typedef struct mt_chat_out {
    char *text;  // (len) rendered, NUL-terminated
    size_t len, cap;
    mt_chat_piece *pieces;  // (n_pieces)
    size_t n_pieces, pieces_cap;
} mt_chat_out;

void mt_chat_out_free(mt_chat_out *o);

/* "llama3", "qwen", "llama2", "mistral" -> *t; -1 with err otherwise. */
int mt_chat_template_parse(const char *name, mt_chat_template *t, mt_error *err);
const char *mt_chat_template_name(mt_chat_template t);

/* The family a tokenizer was made for: <|start_header_id|> -> llama3,
 * <|im_start|> -> qwen, else llama2. */
mt_chat_template mt_chat_template_detect(const mt_tokenizer *tok);

/* Checks that tok has every special token the template emits (-1 with err
 * naming the first missing one). */
int mt_chat_template_check(mt_chat_template t, const mt_tokenizer *tok, mt_error *err);

/* Renders msgs[0..n) into out (previous contents dropped). -1 with err when
 * the conversation is empty, a role is unknown, or the template refuses it
 * (llama2/mistral: roles must alternate user/assistant). */
int mt_chat_render(mt_chat_template t, const mt_chat_msg *msgs, size_t n, mt_chat_out *out,
                   mt_error *err);

#endif
