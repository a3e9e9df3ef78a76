/* JSONL -> tokens: one document per line, parsed, rendered and encoded in
 * parallel (OpenMP over lines, one encoder per thread), then gathered in
 * file order so the output does not depend on the thread count.
 *
 * A document is a list of pieces of one rendered text, each either plain
 * text or a special token id, with a loss flag. Consecutive text pieces are
 * encoded as one run (so ids equal the encoding of the whole text); where
 * the loss flag changes inside a run at byte c, the tokens that the run
 * shares with the encoding of its first c bytes carry the earlier flag and
 * the rest (a token straddling c included) the later one. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat.h"
#include "data/dataset.h"
#include "util/mem.h"

enum { FMT_TEXT, FMT_COMPLETION, FMT_CHAT };
static const char *const fmt_names[] = {"text", "completion", "chat"};

typedef struct doc {
    int32_t *ids;   // (n)
    uint8_t *keep;  // (n)
    size_t n, cap;
    char *error;  // message for a bad line, else NULL
} doc;

typedef struct job {
    const mt_tokenizer *tok;
    int format;
    mt_chat_template chat;
    int32_t bos, eos;
    const char *specials[4];  // the chat template's special tokens and their ids
    int32_t special_ids[4];
} job;

static void doc_push(doc *d, int32_t id, bool keep) {
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 256;
        d->ids = mt_realloc_or_die(d->ids, d->cap * sizeof *d->ids);
        d->keep = mt_realloc_or_die(d->keep, d->cap);
    }
    d->ids[d->n] = id, d->keep[d->n] = keep, d->n++;
}

static int32_t special_id(const job *j, const char *s, size_t len) {
    for (int i = 0; i < 4 && j->specials[i]; i++)
        if (strlen(j->specials[i]) == len && !memcmp(j->specials[i], s, len)) return j->special_ids[i];
    MT_ASSERT(!"chat template emitted a special token it did not declare");
    return -1;
}

/* Encodes pieces[a..b) (text, contiguous in s) as one run into d. */
static int encode_run(mt_tok_encoder *enc, const char *s, const mt_chat_piece *pc, size_t a,
                      size_t b, doc *d, mt_tok_ids *scratch, mt_error *err) {
    size_t base = pc[a].off, len = pc[b - 1].off + pc[b - 1].len - base, n0 = d->n;
    mt_tok_ids ids = {0};
    if (mt_tok_encode(enc, s + base, len, false, &ids, err)) return -1;
    size_t k_prev = 0;
    bool flag = pc[a].train;
    for (size_t p = a + 1; p <= b; p++) {
        size_t k = ids.n;  // tokens before the flag change at piece p
        if (p < b && pc[p].train == flag) continue;
        if (p < b) {
            scratch->n = 0;
            if (mt_tok_encode(enc, s + base, pc[p].off - base, false, scratch, err)) goto fail;
            for (k = 0; k < scratch->n && k < ids.n && scratch->ids[k] == ids.ids[k];) k++;
            if (k < k_prev) k = k_prev;
        }
        for (size_t t = k_prev; t < k; t++) doc_push(d, ids.ids[t], flag);
        k_prev = k;
        if (p < b) flag = pc[p].train;
    }
    MT_ASSERT(d->n - n0 == ids.n);
    mt_tok_ids_free(&ids);
    return 0;
fail:
    mt_tok_ids_free(&ids);
    return -1;
}

static int encode_pieces(const job *j, mt_tok_encoder *enc, const mt_chat_out *r, doc *d,
                         mt_tok_ids *scratch, mt_error *err) {
    for (size_t a = 0; a < r->n_pieces;) {
        const mt_chat_piece *p = &r->pieces[a];
        if (p->special) {
            doc_push(d, special_id(j, r->text + p->off, p->len), p->train);
            a++;
            continue;
        }
        size_t b = a + 1;
        while (b < r->n_pieces && !r->pieces[b].special) b++;
        if (encode_run(enc, r->text, r->pieces, a, b, d, scratch, err)) return -1;
        a = b;
    }
    return 0;
}

static const cJSON *string_field(const cJSON *obj, const char *key, const char *where,
                                 mt_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return mt_errorf(err, "field \"%s\"%s is missing", key, where), NULL;
    if (!cJSON_IsString(v)) return mt_errorf(err, "field \"%s\"%s is not a string", key, where), NULL;
    return v;
}

/* Builds the rendered text and pieces of one parsed line. */
static int render_line(const job *j, const cJSON *obj, mt_chat_out *r, mt_error *err) {
    r->len = r->n_pieces = 0;
    if (j->format == FMT_CHAT) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(obj, "messages");
        if (!msgs) return mt_errorf(err, "field \"messages\" is missing");
        if (!cJSON_IsArray(msgs)) return mt_errorf(err, "field \"messages\" is not an array");
        size_t n = (size_t)cJSON_GetArraySize(msgs), i = 0;
        mt_chat_msg *m = mt_malloc_or_die((n ? n : 1) * sizeof *m);
        const cJSON *it;
        char where[64];
        cJSON_ArrayForEach(it, msgs) {
            snprintf(where, sizeof where, " of messages[%zu]", i);
            const cJSON *role = cJSON_IsObject(it) ? string_field(it, "role", where, err) : NULL;
            const cJSON *content = role ? string_field(it, "content", where, err) : NULL;
            if (!cJSON_IsObject(it)) mt_errorf(err, "messages[%zu] is not an object", i);
            if (!content) return free(m), -1;
            m[i++] = (mt_chat_msg){role->valuestring, content->valuestring, strlen(content->valuestring)};
        }
        int rc = mt_chat_render(j->chat, m, n, r, err);
        free(m);
        return rc;
    }
    // text / completion: BOS, the text(s), EOS; pieces with id -1 are BOS/EOS.
    const char *a = j->format == FMT_TEXT ? "text" : "prompt";
    const cJSON *x = string_field(obj, a, "", err), *y = NULL;
    if (!x || (j->format == FMT_COMPLETION && !(y = string_field(obj, "completion", "", err))))
        return -1;
    size_t lx = strlen(x->valuestring), ly = y ? strlen(y->valuestring) : 0;
    r->cap = lx + ly + 1;
    r->text = mt_realloc_or_die(r->text, r->cap);
    memcpy(r->text, x->valuestring, lx);
    if (y) memcpy(r->text + lx, y->valuestring, ly);
    r->len = lx + ly;
    r->text[r->len] = 0;
    if (r->pieces_cap < 2) r->pieces = mt_realloc_or_die(r->pieces, (r->pieces_cap = 2) * sizeof *r->pieces);
    if (lx) r->pieces[r->n_pieces++] = (mt_chat_piece){0, lx, false, j->format == FMT_TEXT};
    if (ly) r->pieces[r->n_pieces++] = (mt_chat_piece){lx, ly, false, true};
    return 0;
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

static void do_line(const job *j, mt_tok_encoder *enc, const char *line, size_t len,
                    mt_chat_out *r, mt_tok_ids *scratch, doc *d) {
    mt_error err = {{0}};
    if (check_nul(line, len, &err)) {
        d->error = mt_strdup_or_die(err.msg);
        return;
    }
    cJSON *obj = cJSON_ParseWithLength(line, len);
    int rc = -1;
    if (!obj) mt_errorf(&err, "not valid JSON");
    else if (!cJSON_IsObject(obj)) mt_errorf(&err, "not a JSON object");
    else if (!render_line(j, obj, r, &err)) {
        bool plain = j->format != FMT_CHAT;
        if (plain && j->bos >= 0) doc_push(d, j->bos, j->format == FMT_TEXT);
        rc = encode_pieces(j, enc, r, d, scratch, &err);
        if (!rc && plain && j->eos >= 0) doc_push(d, j->eos, true);
    }
    cJSON_Delete(obj);
    if (rc) d->error = mt_strdup_or_die(err.msg);
}

/* Format from the first line's keys ("text", "prompt"+"completion",
 * "messages"). */
static int detect_format(const char *path, const char *line, size_t len, mt_error *err) {
    cJSON *obj = cJSON_ParseWithLength(line, len);
    int f = -1;
    if (cJSON_GetObjectItemCaseSensitive(obj, "messages")) f = FMT_CHAT;
    else if (cJSON_GetObjectItemCaseSensitive(obj, "prompt") &&
             cJSON_GetObjectItemCaseSensitive(obj, "completion")) f = FMT_COMPLETION;
    else if (cJSON_GetObjectItemCaseSensitive(obj, "text")) f = FMT_TEXT;
    cJSON_Delete(obj);
    if (f < 0)
        mt_errorf(err, "%s:1: cannot tell the format from the first line (expected a JSON object with "
                       "\"text\", \"prompt\"+\"completion\" or \"messages\"): fix the line or pass "
                       "--data-format", path);
    return f;
}

static int setup_job(job *j, const mt_data_opts *o, const mt_tokenizer *tok, const char *first,
                     size_t first_len, mt_error *err) {
    memset(j, 0, sizeof *j);
    j->tok = tok, j->bos = mt_tokenizer_bos_id(tok), j->eos = mt_tokenizer_eos_id(tok);
    const char *f = o->format && *o->format ? o->format : "auto";
    j->format = -1;
    for (int i = 0; i < 3; i++) if (!strcmp(f, fmt_names[i])) j->format = i;
    if (!strcmp(f, "auto")) j->format = detect_format(o->path, first, first_len, err);
    else if (j->format < 0)
        return mt_errorf(err, "unknown data format '%s': use auto, text, completion, chat or tokens", f);
    if (j->format < 0) return -1;
    if (j->format != FMT_CHAT) return 0;
    const char *t = o->chat_template && *o->chat_template ? o->chat_template : "auto";
    if (!strcmp(t, "auto")) j->chat = mt_chat_template_detect(tok);
    else if (mt_chat_template_parse(t, &j->chat, err)) return -1;
    if (mt_chat_template_check(j->chat, tok, err)) return mt_error_prefix(err, "%s: ", o->path);
    static const char *const sp[4][4] = {
        {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
        {"<|im_start|>", "<|im_end|>"}, {"<s>", "</s>"}, {"<s>", "</s>"}};
    for (int i = 0; i < 4 && sp[j->chat][i]; i++)
        j->specials[i] = sp[j->chat][i], j->special_ids[i] = mt_tokenizer_token_id(tok, sp[j->chat][i]);
    return 0;
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

/* Gathers the documents in file order into out; checks the vocab range. */
static int gather(const mt_data_opts *o, const mt_tokenizer *tok, int64_t vocab_size, doc *docs,
                  size_t n, mt_mtok *out, int64_t *skipped, mt_error *skip_msg, mt_error *err) {
    uint64_t n_docs = 0, n_tok = 0;
    bool any_masked = false;
    for (size_t i = 0; i < n; i++) {
        if (docs[i].error) {
            if (!o->skip_bad_lines)
                return mt_errorf(err, "%s:%zu: %s; fix the line or pass --skip-bad-lines", o->path,
                                 i + 1, docs[i].error);
            if (!*skipped && skip_msg) mt_errorf(skip_msg, "%s:%zu: %s", o->path, i + 1, docs[i].error);
            ++*skipped;
            continue;
        }
        for (size_t t = 0; t < docs[i].n; t++) {
            if (docs[i].ids[t] >= vocab_size) {
                char *s = mt_tokenizer_decode(tok, &docs[i].ids[t], 1, false);
                mt_errorf(err, "%s:%zu: token id %d (\"%s\") is outside the model's vocabulary of "
                          "%lld ids: use the tokenizer that belongs to the model",
                          o->path, i + 1, docs[i].ids[t], s ? s : "?", (long long)vocab_size);
                free(s);
                return -1;
            }
            any_masked |= !docs[i].keep[t];
        }
        n_docs++, n_tok += docs[i].n;
    }
    if (n_docs == 0)
        return mt_errorf(err, "%s: no usable documents (%zu lines, %lld skipped)", o->path, n,
                         (long long)*skipped);
    mt_mtok_alloc(out, mt_tokenizer_vocab_size(tok), n_docs, n_tok, any_masked);
    uint64_t *offs = (uint64_t *)out->offsets, k = 0, d = 0;
    uint8_t *mask = (uint8_t *)out->mask;
    for (size_t i = 0; i < n; i++) {
        if (docs[i].error) continue;
        offs[d++] = k;
        for (size_t t = 0; t < docs[i].n; t++, k++) {
            if (out->token_bytes == 2) ((uint16_t *)out->tokens)[k] = (uint16_t)docs[i].ids[t];
            else ((uint32_t *)out->tokens)[k] = (uint32_t)docs[i].ids[t];
            if (mask && docs[i].keep[t]) mask[k >> 3] |= (uint8_t)(1u << (k & 7));
            out->n_trainable += docs[i].keep[t];
        }
    }
    offs[d] = k;
    return 0;
}

int mt_jsonl_tokenize(const mt_data_opts *o, const char *buf, size_t len,
                      const mt_tokenizer *tok, int64_t vocab_size, mt_mtok *out,
                      const char **format, const char **chat, int64_t *skipped,
                      mt_error *skip_msg, mt_error *err) {
    *skipped = 0;
    const char **line;
    size_t *lens, n = split_lines(buf, len, &line, &lens);
    job j;
    int rc = -1;
    doc *docs = NULL;
    if (n == 0) {
        mt_errorf(err, "%s: the file is empty: give a JSONL file with one document per line", o->path);
        goto done;
    }
    if (setup_job(&j, o, tok, line[0], lens[0], err)) goto done;
    docs = mt_calloc_or_die(n, sizeof *docs);
#pragma omp parallel
    {
        mt_tok_encoder *enc = mt_tok_encoder_new(tok);
        mt_chat_out r = {0};
        mt_tok_ids scratch = {0};
#pragma omp for schedule(dynamic, 16)
        for (size_t i = 0; i < n; i++) do_line(&j, enc, line[i], lens[i], &r, &scratch, &docs[i]);
        mt_tok_ids_free(&scratch);
        mt_chat_out_free(&r);
        mt_tok_encoder_free(enc);
    }
    rc = gather(o, tok, vocab_size, docs, n, out, skipped, skip_msg, err);
    *format = fmt_names[j.format];
    *chat = j.format == FMT_CHAT ? mt_chat_template_name(j.chat) : NULL;
done:
    for (size_t i = 0; docs && i < n; i++) free(docs[i].ids), free(docs[i].keep), free(docs[i].error);
    free(docs);
    free(line);
    free(lens);
    return rc;
}
