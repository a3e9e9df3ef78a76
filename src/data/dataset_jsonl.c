/* JSONL -> tokens: one document per line, parsed, rendered and encoded in
 * parallel (OpenMP over lines, one encoder per thread), then gathered in
 * file order so the output does not depend on the thread count.
 *
 * A document is a text and the byte spans of it that carry the loss
 * (tok_spans.h): for "text" all of it, for "completion" the completion, for
 * the conversations ("chat", "sharegpt", "alpaca", and "completion" whose
 * prompt and completion are lists of messages) what the chat template's
 * render says (chat.h). BOS and EOS are added around text and completion
 * documents; a chat template writes its own. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat.h"
#include "data/data_file.h"
#include "data/dataset.h"
#include "data/tok_spans.h"
#include "util/mem.h"

enum { FMT_TEXT, FMT_COMPLETION, FMT_CHAT, FMT_ALPACA, FMT_SHAREGPT, N_FMT };
static const char *const fmt_names[N_FMT] = {"text", "completion", "chat", "alpaca", "sharegpt"};

typedef struct doc {
    int32_t *ids;   // (n)
    uint8_t *keep;  // (n)
    size_t n;
    char *error;  // message for a bad line, else NULL
} doc;

typedef struct job {
    const mt_tokenizer *tok;
    int format;
    const char *text_field;  // FMT_TEXT's key
    mt_chat_template *chat;  // the conversational formats; NULL for plain ones
    int32_t bos, eos;
} job;

/* What one thread reuses from line to line. */
typedef struct worker {
    mt_tok_encoder *enc;
    mt_tok_masked m;
    mt_chat_text text;
    mt_jpool pool;
} worker;

static const cJSON *string_field(const cJSON *obj, const char *key, mt_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return mt_errorf(err, "field \"%s\" is missing", key), NULL;
    if (!cJSON_IsString(v)) return mt_errorf(err, "field \"%s\" is not a string", key), NULL;
    return v;
}

/* A conversation (chat, sharegpt, alpaca, or a completion whose prompt is
 * a list of messages): rendered with the template, its spans encoded. */
static int encode_conv(const job *j, worker *w, const char *line, size_t len, mt_error *err) {
    mt_chat_conv c;
    mt_jv root;
    size_t n_prompt = 0;
    mt_jpool_reset(&w->pool);
    if (mt_jv_from_json(&w->pool, line, len, &root, err)) return -1;
    if (root.type != MT_JV_DICT) return mt_errorf(err, "not a JSON object");
    int rc = j->format == FMT_SHAREGPT ? mt_chat_conv_from_sharegpt(&w->pool, root, &c, err)
           : j->format == FMT_ALPACA   ? mt_chat_conv_from_alpaca(&w->pool, root, &c, err)
           : j->format == FMT_CHAT
               ? mt_chat_conv_from_messages(&w->pool, root, mt_jv_dict_gets(root, "messages"),
                                            "messages", &c, err)
               : mt_chat_conv_from_prompt_completion(&w->pool, root, &c, &n_prompt, err);
    if (rc) return -1;
    rc = j->format == FMT_COMPLETION
             ? mt_chat_render_completion(j->chat, &c, n_prompt, &w->pool, NULL, &w->text, err)
             : mt_chat_render(j->chat, &c, false, &w->pool, NULL, &w->text, err);
    if (rc) return -1;
    const mt_jbuf *t = &w->text.out.text;
    return mt_tok_encode_spans(w->enc, j->tok, t->p, t->n, w->text.spans, w->text.n_spans, &w->m, err);
}

/* A text or completion line: BOS, the text(s), EOS. */
static int encode_plain(const job *j, worker *w, const cJSON *obj, mt_error *err) {
    bool text = j->format == FMT_TEXT;
    const cJSON *x = string_field(obj, text ? j->text_field : "prompt", err), *y = NULL;
    if (!x || (!text && !(y = string_field(obj, "completion", err)))) return -1;
    size_t lx = strlen(x->valuestring), ly = y ? strlen(y->valuestring) : 0;
    char *all = mt_malloc_or_die(lx + ly + 1);
    memcpy(all, x->valuestring, lx);
    if (y) memcpy(all + lx, y->valuestring, ly);
    mt_tok_span loss = {text ? 0 : lx, lx + ly};
    if (j->bos >= 0) mt_tok_masked_push(&w->m, j->bos, text);
    int rc = mt_tok_encode_spans(w->enc, j->tok, all, lx + ly, &loss, 1, &w->m, err);
    if (rc == 0 && j->eos >= 0) mt_tok_masked_push(&w->m, j->eos, true);
    free(all);
    return rc;
}

/* Whether a completion line's prompt is a list of messages (TRL's
 * conversational prompt/completion). */
static bool conversational(const cJSON *obj) {
    return cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(obj, "prompt"));
}

static int encode_line(const job *j, worker *w, const char *line, size_t len, mt_error *err) {
    if (j->format != FMT_TEXT && j->format != FMT_COMPLETION) return encode_conv(j, w, line, len, err);
    cJSON *obj = cJSON_ParseWithLength(line, len);
    int rc = -1;
    if (!obj) mt_errorf(err, "not valid JSON");
    else if (!cJSON_IsObject(obj)) mt_errorf(err, "not a JSON object");
    else if (j->format == FMT_COMPLETION && conversational(obj) != (j->chat != NULL))
        mt_errorf(err, "\"prompt\" is %s, unlike the first line's: keep one kind of "
                  "prompt/completion per file (text, or lists of messages)",
                  j->chat ? "a text" : "a list of messages");
    else if (j->chat) rc = encode_conv(j, w, line, len, err);
    else rc = encode_plain(j, w, obj, err);
    cJSON_Delete(obj);
    return rc;
}

/* cJSON ends a string at a NUL: a "\u0000" would cut the document there
 * without a word, and a raw NUL byte (not JSON) the line. Both are refused,
 * naming the byte. Outside strings JSON has no backslash, so every
 * backslash starts an escape. */
static int check_nul(const char *line, size_t len, mt_error *err) {
    const char *raw = memchr(line, 0, len);
    if (raw)
        return mt_errorf(err, "not valid JSON: a NUL byte (0x00) at byte %zu",
                         (size_t)(raw - line) + 1);
    for (size_t i = 0; i + 1 < len; i++) {
        if (line[i] != '\\') continue;
        if (line[i + 1] == 'u' && i + 6 <= len && !memcmp(line + i + 2, "0000", 4))
            return mt_errorf(err, "a NUL character (\\u0000) at byte %zu: the text cannot "
                             "hold one (it would end the document there)", i + 1);
        i++; /* the escaped character */
    }
    return 0;
}

static void do_line(const job *j, worker *w, const char *line, size_t len, doc *d) {
    mt_error err = {{0}};
    w->m.ids.n = 0;
    int rc = check_nul(line, len, &err);
    if (rc == 0) rc = encode_line(j, w, line, len, &err);
    if (rc) {
        d->error = mt_strdup_or_die(err.msg);
        return;
    }
    d->n = w->m.ids.n;
    d->ids = mt_malloc_or_die((d->n ? d->n : 1) * sizeof *d->ids);
    d->keep = mt_malloc_or_die(d->n ? d->n : 1);
    if (d->n) memcpy(d->ids, w->m.ids.ids, d->n * sizeof *d->ids), memcpy(d->keep, w->m.keep, d->n);
}

/* Format from the first line's keys: "messages" (chat), "conversations"
 * (sharegpt), "prompt"+"completion", "instruction"+"output" (alpaca), the
 * text field. A text field other than "text" is looked for first. */
static int detect_format(const char *path, const char *field, const char *line, size_t len,
                         mt_error *err) {
    cJSON *obj = cJSON_ParseWithLength(line, len);
#define HAS(key) (cJSON_GetObjectItemCaseSensitive(obj, key) != NULL)
    int f = -1;
    if (strcmp(field, "text") && HAS(field)) f = FMT_TEXT;
    else if (HAS("messages")) f = FMT_CHAT;
    else if (HAS("conversations")) f = FMT_SHAREGPT;
    else if (HAS("prompt") && HAS("completion")) f = FMT_COMPLETION;
    else if (HAS("instruction") && HAS("output")) f = FMT_ALPACA;
    else if (HAS(field)) f = FMT_TEXT;
#undef HAS
    cJSON_Delete(obj);
    if (f < 0)
        mt_errorf(err, "%s:1: cannot tell the format from the first line (expected a JSON object "
                  "with \"%s\", \"prompt\"+\"completion\", \"messages\", \"conversations\" "
                  "(sharegpt) or \"instruction\"+\"output\" (alpaca)): fix the line, pass "
                  "--data-format, or --text-field FIELD for text under another key", path, field);
    return f;
}

/* Whether the first line is a completion whose prompt is a list of
 * messages. */
static bool first_conversational(const char *line, size_t len) {
    cJSON *obj = cJSON_ParseWithLength(line, len);
    bool c = obj && conversational(obj);
    cJSON_Delete(obj);
    return c;
}

static int setup_job(job *j, const mt_data_opts *o, const mt_tokenizer *tok, const char *first,
                     size_t first_len, mt_error *err) {
    memset(j, 0, sizeof *j);
    j->tok = tok, j->bos = mt_tokenizer_bos_id(tok), j->eos = mt_tokenizer_eos_id(tok);
    j->text_field = o->text_field && *o->text_field ? o->text_field : "text";
    const char *f = o->format && *o->format ? o->format : "auto";
    j->format = -1;
    for (int i = 0; i < N_FMT; i++) if (!strcmp(f, fmt_names[i])) j->format = i;
    if (!strcmp(f, "auto")) j->format = detect_format(o->path, j->text_field, first, first_len, err);
    else if (j->format < 0)
        return mt_errorf(err, "unknown data format '%s': use auto, text, completion, chat, "
                         "alpaca, sharegpt or tokens", f);
    if (j->format < 0) return -1;
    if (j->format == FMT_TEXT || (j->format == FMT_COMPLETION && !first_conversational(first, first_len)))
        return 0;
    j->chat = mt_chat_template_open(o->chat_template, tok, err);
    return j->chat ? 0 : mt_error_prefix(err, "%s: ", o->path);
}

/* Splits buf into lines (a final line without '\n' counts; '\r' before
 * '\n' is dropped). */
static size_t split_lines(const char *buf, size_t len, const char ***start, size_t **lens) {
    size_t n = 0, cap = 1024;
    *start = mt_malloc_or_die(cap * sizeof **start);
    *lens = mt_malloc_or_die(cap * sizeof **lens);
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len, l = e - i;
        if (l && buf[e - 1] == '\r') l--;
        if (n == cap) {
            cap *= 2;
            *start = mt_realloc_or_die(*start, cap * sizeof **start);
            *lens = mt_realloc_or_die(*lens, cap * sizeof **lens);
        }
        (*start)[n] = buf + i, (*lens)[n] = l, n++;
        i = e + 1;
    }
    return n;
}

/* The corpus as it grows, a block of lines at a time: token ids at their
 * final width, a loss bit per token, document offsets. Grown with "try"
 * allocations, so that data too large for memory is an error naming the
 * line, not an abort. */
typedef struct builder {
    uint32_t token_bytes;
    void *tokens;          // (cap_tok) u16 or u32
    uint8_t *keep;         // (cap_tok / 8) loss bits
    uint64_t *offsets;     // (cap_docs + 1)
    uint64_t n_tok, cap_tok, n_docs, cap_docs, n_trainable;
    bool any_masked;
} builder;

/* Room for one more document of n tokens. */
static bool builder_reserve(builder *b, uint64_t n) {
    if (b->n_tok + n > b->cap_tok) {
        uint64_t c = b->cap_tok ? b->cap_tok : 4096;  // a multiple of 8: whole bytes of bits
        while (c < b->n_tok + n) c *= 2;
        size_t tb;
        if (!mt_mul_size((size_t)c, b->token_bytes, &tb)) return false;
        void *t = realloc(b->tokens, tb);
        if (!t) return false;
        b->tokens = t;
        uint8_t *k = realloc(b->keep, (size_t)(c / 8));
        if (!k) return false;
        memset(k + b->cap_tok / 8, 0, (size_t)((c - b->cap_tok) / 8));  // loss bits start clear
        b->keep = k;
        b->cap_tok = c;
    }
    if (b->n_docs + 2 > b->cap_docs) {
        uint64_t c = b->cap_docs ? 2 * b->cap_docs : 1024;
        uint64_t *o = realloc(b->offsets, (size_t)c * sizeof *o);
        if (!o) return false;
        b->offsets = o;
        b->cap_docs = c;
    }
    return true;
}

static void builder_free(builder *b) {
    free(b->tokens);
    free(b->keep);
    free(b->offsets);
}

/* The documents of one block of lines (line numbers from first_line) into
 * b, in file order; checks the vocab range. */
static int gather(const mt_data_opts *o, const mt_tokenizer *tok, int64_t vocab_size,
                  const doc *docs, size_t n, uint64_t first_line, builder *b, int64_t *skipped,
                  mt_error *skip_msg, mt_error *err) {
    for (size_t i = 0; i < n; i++) {
        unsigned long long line = (unsigned long long)(first_line + i);
        if (docs[i].error) {
            if (!o->skip_bad_lines)
                return mt_errorf(err, "%s:%llu: %s; fix the line or pass --skip-bad-lines",
                                 o->path, line, docs[i].error);
            if (!*skipped && skip_msg)
                mt_errorf(skip_msg, "%s:%llu: %s", o->path, line, docs[i].error);
            ++*skipped;
            continue;
        }
        for (size_t t = 0; t < docs[i].n; t++) {
            if (docs[i].ids[t] >= vocab_size) {
                char *s = mt_tokenizer_decode(tok, &docs[i].ids[t], 1, false);
                mt_errorf(err, "%s:%llu: token id %d (\"%s\") is outside the model's vocabulary "
                          "of %lld ids: use the tokenizer that belongs to the model",
                          o->path, line, docs[i].ids[t], s ? s : "?", (long long)vocab_size);
                free(s);
                return -1;
            }
        }
        if (!builder_reserve(b, docs[i].n))
            return mt_errorf(err, "%s:%llu: out of memory after %llu tokens of %llu documents "
                             "(%.2f GB of token ids): the data does not fit in this machine's "
                             "RAM (or the process's limit); use less data, or split it into "
                             "sources of a mixture", o->path, line,
                             (unsigned long long)b->n_tok, (unsigned long long)b->n_docs,
                             (double)b->n_tok * b->token_bytes / 1e9);
        b->offsets[b->n_docs++] = b->n_tok;
        for (size_t t = 0; t < docs[i].n; t++, b->n_tok++) {
            uint64_t k = b->n_tok;
            if (b->token_bytes == 2) ((uint16_t *)b->tokens)[k] = (uint16_t)docs[i].ids[t];
            else ((uint32_t *)b->tokens)[k] = (uint32_t)docs[i].ids[t];
            if (docs[i].keep[t]) b->keep[k >> 3] |= (uint8_t)(1u << (k & 7));
            else b->any_masked = true;
            b->n_trainable += docs[i].keep[t];
        }
    }
    return 0;
}

/* b as the corpus out (which owns its arrays from then on). */
static void builder_finish(builder *b, uint64_t vocab_size, mt_mtok *out) {
    memset(out, 0, sizeof *out);
    out->vocab_size = vocab_size, out->n_docs = b->n_docs, out->n_tokens = b->n_tok;
    out->n_trainable = b->n_trainable;
    out->token_bytes = b->token_bytes;
    b->offsets[b->n_docs] = b->n_tok;
    /* shrink to size (in place: no copy of the corpus) */
    void *t = realloc(b->tokens, b->n_tok ? (size_t)b->n_tok * b->token_bytes : 1);
    void *o = realloc(b->offsets, (size_t)(b->n_docs + 1) * sizeof *b->offsets);
    void *k = realloc(b->keep, (size_t)(b->n_tok / 8 + 1));
    out->tokens = out->owned[0] = t ? t : b->tokens;
    out->offsets = out->owned[1] = o ? o : b->offsets;
    if (b->any_masked) out->mask = out->owned[2] = k ? k : b->keep;
    else free(k ? k : b->keep);
    memset(b, 0, sizeof *b);
}

/* Lines per block: enough text to keep every thread busy, little enough
 * that the block's documents are a small part of memory. */
#define BLOCK_BYTES ((size_t)32 << 20)

/* Tokenizes one block of lines (numbered from first_line) into b. */
static int tokenize_block(const mt_data_opts *o, const job *j, const char *buf, size_t len,
                          uint64_t first_line, int64_t vocab_size, builder *b, int64_t *skipped,
                          mt_error *skip_msg, mt_error *err) {
    const char **line;
    size_t *lens, n = split_lines(buf, len, &line, &lens);
    doc *docs = mt_calloc_or_die(n ? n : 1, sizeof *docs);
#pragma omp parallel
    {
        worker w = {.enc = mt_tok_encoder_new(j->tok)};
#pragma omp for schedule(dynamic, 16)
        for (size_t i = 0; i < n; i++) do_line(j, &w, line[i], lens[i], &docs[i]);
        mt_tok_masked_free(&w.m);
        mt_chat_text_free(&w.text);
        mt_jpool_free(&w.pool);
        mt_tok_encoder_free(w.enc);
    }
    int rc = gather(o, j->tok, vocab_size, docs, n, first_line, b, skipped, skip_msg, err);
    for (size_t i = 0; i < n; i++) free(docs[i].ids), free(docs[i].keep), free(docs[i].error);
    free(docs);
    free(line);
    free(lens);
    return rc;
}

int mt_jsonl_tokenize(const mt_data_opts *o, mt_line_reader *lines, const mt_tokenizer *tok,
                      int64_t vocab_size, mt_mtok *out, const char **format, const char **chat,
                      int64_t *skipped, mt_error *skip_msg, mt_error *err) {
    *skipped = 0;
    job j = {0};
    builder b = {.token_bytes = mt_mtok_token_bytes(mt_tokenizer_vocab_size(tok))};
    const char *buf;
    size_t len;
    int got, rc = -1;
    uint64_t first_line = 1;
    while ((got = mt_line_reader_next(lines, BLOCK_BYTES, &buf, &len, err)) == 0) {
        if (first_line == 1) {
            const char *nl = memchr(buf, '\n', len);
            size_t l0 = nl ? (size_t)(nl - buf) : len;
            if (l0 && buf[l0 - 1] == '\r') l0--;
            if (setup_job(&j, o, tok, buf, l0, err)) goto done;
        }
        if (tokenize_block(o, &j, buf, len, first_line, vocab_size, &b, skipped, skip_msg, err))
            goto done;
        first_line = mt_line_reader_lines(lines) + 1;
    }
    if (got < 0) goto done;
    if (first_line == 1) {
        mt_errorf(err, "%s: the file is empty: give a JSONL file with one document per line",
                  o->path);
        goto done;
    }
    if (b.n_docs == 0) {
        mt_errorf(err, "%s: no usable documents (%llu lines, %lld skipped)", o->path,
                  (unsigned long long)(first_line - 1), (long long)*skipped);
        goto done;
    }
    builder_finish(&b, mt_tokenizer_vocab_size(tok), out);
    *format = fmt_names[j.format];
    *chat = j.chat ? mt_chat_template_name(j.chat) : NULL;
    rc = 0;
done:
    builder_free(&b);
    mt_chat_template_free(j.chat);
    return rc;
}
