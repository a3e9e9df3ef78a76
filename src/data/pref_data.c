/* Preference data (pref_data.h): reading and checking the pairs, and their
 * tokenization. Each good pair becomes two prompt/completion lines (its
 * chosen, then its rejected answer) that the JSONL tokenizer encodes as it
 * encodes completion data (dataset_jsonl.c), chat templates included. */
#include "data/pref_data.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "data/data_file.h"
#include "data/dataset.h"
#include "util/mem.h"

static const char *const fields[3] = {"prompt", "chosen", "rejected"};

/* A bad pair: the error, or with skip_bad_pairs counted (0). */
static int bad_pair(mt_pref_data *d, mt_error *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad_pair(mt_pref_data *d, mt_error *err, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!d->o.skip_bad_pairs)
        return mt_errorf(err, "%s; fix the pair or pass --skip-bad-pairs", msg);
    if (!d->skipped) snprintf(d->first_skipped, sizeof d->first_skipped, "%s", msg);
    d->skipped++;
    return 0;
}

/* Whether a field's value is empty: "", [], or a list of messages whose
 * contents are all "". */
static int empty_value(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring[0] == 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, v) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(c) || c->valuestring[0]) return 0;
    }
    return 1;
}

/* Checks one line; 1: a good pair, whose fields are in f; 0: skipped. */
static int check_line(mt_pref_data *d, const cJSON *obj, int64_t line, int *lists,
                      const cJSON *f[3], mt_error *err) {
    const char *path = d->path;
    if (!cJSON_IsObject(obj))
        return bad_pair(d, err, "%s:%lld: not a JSON object", path, (long long)line);
    for (int k = 0; k < 3; k++) {
        f[k] = cJSON_GetObjectItemCaseSensitive(obj, fields[k]);
        if (!f[k])
            return bad_pair(d, err, "%s:%lld: field \"%s\" is missing (a pair is {\"prompt\", "
                            "\"chosen\", \"rejected\"})", path, (long long)line, fields[k]);
        int is_list = cJSON_IsArray(f[k]);
        if (!is_list && !cJSON_IsString(f[k]))
            return bad_pair(d, err, "%s:%lld: field \"%s\" is neither a string nor a list of "
                            "messages", path, (long long)line, fields[k]);
        if (*lists < 0) *lists = is_list;
        if (is_list != *lists)
            return bad_pair(d, err, "%s:%lld: field \"%s\" is %s, unlike the file's first pair: "
                            "give every field as a string, or every one as a list of messages",
                            path, (long long)line, fields[k], is_list ? "a list" : "a string");
        if (k && empty_value(f[k]))
            return bad_pair(d, err, "%s:%lld: field \"%s\" is empty: a pair needs two answers",
                            path, (long long)line, fields[k]);
    }
    return 1;
}

/* Appends the two prompt/completion lines of a pair to out. */
static void write_lines(FILE *out, const cJSON *f[3]) {
    for (int a = 1; a <= 2; a++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "prompt", cJSON_Duplicate(f[0], 1));
        cJSON_AddItemToObject(o, "completion", cJSON_Duplicate(f[a], 1));
        char *s = cJSON_PrintUnformatted(o);
        fprintf(out, "%s\n", s);
        free(s);
        cJSON_Delete(o);
    }
}

/* The lines of the file: good pairs as prompt/completion lines into
 * *text, their line numbers into d->line. */
static int read_pairs(mt_pref_data *d, const char *buf, size_t len, char **text,
                      size_t *text_len, mt_error *err) {
    FILE *out = open_memstream(text, text_len);
    MT_ASSERT(out);
    int64_t line = 0, cap = 0;
    int lists = -1, rc = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) : len, l = e - i;
        const char *s = buf + i;
        i = e + 1, line++;
        while (l && (s[l - 1] == '\r' || s[l - 1] == ' ')) l--;
        if (l == 0) continue;
        cJSON *obj = cJSON_ParseWithLength(s, l);
        const cJSON *f[3];
        int ok = obj ? check_line(d, obj, line, &lists, f, err)
                     : bad_pair(d, err, "%s:%lld: not valid JSON", d->path, (long long)line);
        if (ok < 0) rc = -1;
        if (ok > 0) {
            write_lines(out, f);
            if (d->n_pairs == cap) {
                cap = cap ? 2 * cap : 1024;
                d->line = mt_realloc_or_die(d->line, (size_t)cap * sizeof *d->line);
            }
            d->line[d->n_pairs++] = line;
        }
        cJSON_Delete(obj);
    }
    fclose(out);
    d->format = lists > 0 ? "messages" : "text";
    if (rc == 0 && d->n_pairs == 0)
        rc = mt_errorf(err, "%s: no usable preference pair (%lld lines, %lld skipped)", d->path,
                       (long long)line, (long long)d->skipped);
    return rc;
}

/* The tokenizer's error names a line of the prompt/completion text: said
 * as the pair's line and answer instead. */
static int tokenize_error(const mt_pref_data *d, mt_error *err) {
    unsigned long long k;
    int at = 0;
    char msg[sizeof err->msg];
    if (sscanf(err->msg, "preference pairs:%llu: %n", &k, &at) == 1 && at && k >= 1 &&
        k <= 2ull * (unsigned long long)d->n_pairs) {
        snprintf(msg, sizeof msg, "%s", err->msg + at);
        char *cut = strstr(msg, "; fix the line or pass --skip-bad-lines");
        if (cut) *cut = 0;
        return mt_errorf(err, "%s:%lld: field \"%s\": %s", d->path,
                         (long long)d->line[(k - 1) / 2], k % 2 ? "chosen" : "rejected", msg);
    }
    return -1;
}

/* The corpus of 2 * n_pairs documents into d's arrays, leaving out (or
 * refusing) pairs that do not fit a micro-batch. */
static int keep_fitting(mt_pref_data *d, const mt_mtok *m, mt_error *err) {
    d->tok = mt_malloc_or_die((m->n_tokens ? m->n_tokens : 1) * sizeof *d->tok);
    d->keep = mt_malloc_or_die(m->n_tokens ? m->n_tokens : 1);
    d->off = mt_malloc_or_die((2 * (size_t)d->n_pairs + 1) * sizeof *d->off);
    int64_t n = 0, kept = 0, T = d->o.T;
    d->off[0] = 0;
    for (int64_t i = 0; i < d->n_pairs; i++) {
        /* a document of n tokens takes n - 1 positions (its last is only a target) */
        int64_t lc = (int64_t)(m->offsets[2 * i + 1] - m->offsets[2 * i]) - 1;
        int64_t lr = (int64_t)(m->offsets[2 * i + 2] - m->offsets[2 * i + 1]) - 1;
        if (lc > T || lr > T || (d->o.B == 1 && lc + lr > T)) {
            if (bad_pair(d, err, "%s:%lld: the pair is longer than --seq-len: %lld and %lld "
                         "tokens (chosen, rejected) do not fit %s of %lld tokens; raise "
                         "--seq-len", d->path, (long long)d->line[i], (long long)lc + 1,
                         (long long)lr + 1, d->o.B == 1 ? "a row" : "rows", (long long)T))
                return -1;
            continue;
        }
        for (uint64_t t = m->offsets[2 * i]; t < m->offsets[2 * i + 2]; t++) {
            d->tok[n] = (int32_t)mt_mtok_token(m, t);
            d->keep[n++] = mt_mtok_trainable(m, t);
            if (t + 1 == m->offsets[2 * i + 1]) d->off[2 * kept + 1] = n;
        }
        d->off[2 * kept + 2] = n;
        d->line[kept++] = d->line[i];
    }
    d->n_pairs = kept;
    if (kept == 0)
        return mt_errorf(err, "%s: no pair fits --seq-len %lld (%lld skipped)", d->path,
                         (long long)T, (long long)d->skipped);
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, d->tok, (size_t)n * sizeof *d->tok);
    XXH3_64bits_update(h, d->keep, (size_t)n);
    XXH3_64bits_update(h, d->off, (2 * (size_t)kept + 1) * sizeof *d->off);
    d->checksum = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return 0;
}

static int tokenize(mt_pref_data *d, const char *text, size_t len, const mt_tokenizer *tok,
                    int64_t vocab_size, mt_error *err) {
    mt_line_reader *r = mt_line_reader_open_memory("preference pairs", text, len,
                                                   MT_DATA_MAX_LINE, err);
    if (!r) return -1;
    mt_data_opts o = {.path = "preference pairs", .format = "completion",
                      .chat_template = d->o.chat_template};
    mt_mtok m = {0};
    const char *format;
    int64_t skipped;
    int rc = mt_jsonl_tokenize(&o, r, tok, vocab_size, &m, &format, &d->chat, &skipped, NULL,
                               err);
    mt_line_reader_close(r);
    if (rc) return tokenize_error(d, err);
    MT_ASSERT(m.n_docs == 2 * (uint64_t)d->n_pairs);
    rc = keep_fitting(d, &m, err);
    mt_mtok_free(&m);
    return rc;
}

int mt_pref_data_open(mt_pref_data *d, const mt_pref_data_opts *o, const mt_tokenizer *tok,
                      int64_t vocab_size, mt_error *err) {
    memset(d, 0, sizeof *d);
    d->o = *o;
    d->path = mt_strdup_or_die(o->path);
    d->o.path = d->path;
    char *buf = NULL, *text = NULL;
    size_t len = 0, text_len = 0;
    int rc = mt_data_file_read(o->path, &buf, &len, err);
    if (rc == 0) rc = read_pairs(d, buf, len, &text, &text_len, err);
    free(buf);
    if (rc == 0) rc = tokenize(d, text, text_len, tok, vocab_size, err);
    free(text);
    if (rc) {
        mt_pref_data_free(d);
        return -1;
    }
    mt_pref_data_rewind(d);
    return 0;
}

void mt_pref_data_free(mt_pref_data *d) {
    free(d->path), free(d->tok), free(d->keep), free(d->off), free(d->line);
    free(d->ref), free(d->order);
    memset(d, 0, sizeof *d);
}
