/* Dataset: opening (JSONL or .mtok), the per-epoch shuffle and packing of
 * documents into rows, and the resume position. */
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

struct mt_dataset {
    mt_mtok corpus;
    mt_data_stats stats;
    mt_error first_skipped;
    uint64_t seed;
    int64_t epochs;
    bool documents;   // packing documents (else rows)
    mt_data_pos pos;
    int64_t T;        // row length - 1 of the batches so far (0 before the first)
    int64_t order_epoch;  // epoch that order/starts hold, -1 = none
    uint64_t *order;   // (n_docs) document index at each stream position
    uint64_t *starts;  // (n_docs + 1) stream offset of each position's document
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fisher-Yates over the documents, seeded by seed and epoch. */
static void make_order(mt_dataset *d, int64_t epoch) {
    uint64_t n = d->corpus.n_docs, s = d->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(epoch + 1));
    for (uint64_t i = 0; i < n; i++) d->order[i] = i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = (uint64_t)(((unsigned __int128)splitmix64(&s) * i) >> 64);
        uint64_t t = d->order[i - 1];
        d->order[i - 1] = d->order[j], d->order[j] = t;
    }
    d->starts[0] = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = d->order[i];
        d->starts[i + 1] = d->starts[i] + (d->corpus.offsets[k + 1] - d->corpus.offsets[k]);
    }
    d->order_epoch = epoch;
}

static int open_corpus(mt_dataset *d, const mt_data_opts *o, const mt_tokenizer *tok,
                       int64_t vocab_size, mt_error *err) {
    const char *fmt = o->format && *o->format ? o->format : "auto";
    bool is_mtok = !strcmp(fmt, "tokens");
    if (!strcmp(fmt, "auto")) {  // a .mtok starts with its magic
        FILE *f = fopen(o->path, "rb");
        char magic[4] = {0};
        if (!f) return mt_errorf(err, "%s: cannot open: %m", o->path);
        is_mtok = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "MTOK", 4);
        fclose(f);
    }
    if (!is_mtok) {
        if (!tok) return mt_errorf(err, "%s: JSONL data needs a tokenizer", o->path);
        return mt_jsonl_tokenize(o, tok, vocab_size, &d->corpus, &d->stats.format,
                                 &d->stats.chat_template, &d->stats.skipped_lines,
                                 &d->first_skipped, err);
    }
    if (mt_mtok_open(o->path, &d->corpus, err)) return -1;
    d->stats.format = "tokens";
    if (d->corpus.vocab_size > (uint64_t)vocab_size) {  // find the first id the model lacks
        for (uint64_t i = 0; i < d->corpus.n_tokens; i++)
            if (mt_mtok_token(&d->corpus, i) >= (uint64_t)vocab_size)
                return mt_errorf(err,
                                 "%s: token %llu has id %u, outside the model's vocabulary of "
                                 "%lld ids: tokenize with the model's own tokenizer",
                                 o->path, (unsigned long long)i, mt_mtok_token(&d->corpus, i),
                                 (long long)vocab_size);
    }
    return 0;
}

/* Resolves opts' packing against the format the data turned out to have. */
static int choose_packing(mt_dataset *d, const mt_data_opts *o, mt_error *err) {
    const char *p = o->packing && *o->packing ? o->packing : "auto";
    if (!strcmp(p, "auto")) {
        const char *f = d->stats.format;
        d->documents = !strcmp(f, "completion") || !strcmp(f, "chat") ||
                       (!strcmp(f, "tokens") && d->corpus.mask);
    } else if (!strcmp(p, "documents") || !strcmp(p, "rows")) {
        d->documents = !strcmp(p, "documents");
    } else {
        return mt_errorf(err, "unknown packing '%s': use auto, documents or rows", p);
    }
    d->stats.packing = d->documents ? "documents" : "rows";
    return 0;
}

mt_dataset *mt_dataset_open(const mt_data_opts *o, const mt_tokenizer *tok, int64_t vocab_size,
                            mt_error *err) {
    if (o->epochs < 1) {
        mt_errorf(err, "%s: epochs is %lld: use 1 or more", o->path, (long long)o->epochs);
        return NULL;
    }
    mt_dataset *d = mt_calloc_or_die(1, sizeof *d);
    d->seed = o->seed, d->epochs = o->epochs, d->order_epoch = -1;
    if (open_corpus(d, o, tok, vocab_size, err) || choose_packing(d, o, err)) {
        mt_dataset_free(d);
        return NULL;
    }
    d->stats.documents = (int64_t)d->corpus.n_docs;
    d->stats.tokens = (int64_t)d->corpus.n_tokens;
    d->stats.trainable = (int64_t)d->corpus.n_trainable;
    d->order = mt_malloc_or_die(d->corpus.n_docs * sizeof *d->order);
    d->starts = mt_malloc_or_die((d->corpus.n_docs + 1) * sizeof *d->starts);
    return d;
}

void mt_dataset_free(mt_dataset *d) {
    if (!d) return;
    mt_mtok_free(&d->corpus);
    free(d->order);
    free(d->starts);
    free(d);
}

int64_t mt_dataset_rows_per_epoch(const mt_dataset *d, int64_t T) {
    return T < 1 ? 0 : (int64_t)(d->corpus.n_tokens / (uint64_t)(T + 1));
}

/* Copies stream[start .. start+n) of the current epoch into x, the loss
 * flags into keep, and whether each token starts a document into first. */
static void read_stream(mt_dataset *d, uint64_t start, int64_t n, int32_t *x, uint8_t *keep,
                        uint8_t *first) {
    uint64_t lo = 0, hi = d->corpus.n_docs;  // last position p with starts[p] <= start
    while (hi - lo > 1) {
        uint64_t mid = (lo + hi) / 2;
        if (d->starts[mid] <= start) lo = mid; else hi = mid;
    }
    uint64_t p = lo, s = start;
    for (int64_t i = 0; i < n; i++, s++) {
        while (s >= d->starts[p + 1]) p++;
        uint64_t t = d->corpus.offsets[d->order[p]] + (s - d->starts[p]);
        x[i] = (int32_t)mt_mtok_token(&d->corpus, t);
        keep[i] = mt_mtok_trainable(&d->corpus, t);
        first[i] = s == d->starts[p];
    }
}

int mt_dataset_next_batch(mt_dataset *d, int64_t rows, int64_t T, int32_t *tokens,
                          int32_t *targets, int32_t *pos) {
    MT_ASSERT(rows >= 1 && T >= 1);
    MT_ASSERT(pos || !d->documents);  // positions are part of a document-packed batch
    MT_ASSERT(d->T == 0 || d->T == T);  // positions count rows of one length
    int64_t R = mt_dataset_rows_per_epoch(d, T);
    if (R == 0) return 1;
    mt_data_pos p = d->pos;
    if (p.row >= R) p.epoch++, p.row = 0;
    if (p.epoch >= d->epochs || (d->epochs - p.epoch) * R - p.row < rows) return 1;
    d->T = T;
    int32_t *x = mt_malloc_or_die((size_t)(T + 1) * sizeof *x);  // (T+1)
    uint8_t *keep = mt_malloc_or_die((size_t)(T + 1));         // (T+1)
    uint8_t *first = mt_malloc_or_die((size_t)(T + 1));        // (T+1)
    for (int64_t r = 0; r < rows; r++, p.row++) {
        if (p.row == R) p.epoch++, p.row = 0;
        if (d->order_epoch != p.epoch) make_order(d, p.epoch);
        read_stream(d, (uint64_t)p.row * (uint64_t)(T + 1), T + 1, x, keep, first);
        for (int64_t t = 0; t < T; t++) {
            // Packing documents, no token predicts the first one of another document.
            bool same_doc = !d->documents || !first[t + 1];
            tokens[r * T + t] = x[t];
            targets[r * T + t] = keep[t + 1] && same_doc ? x[t + 1] : MT_IGNORE_INDEX;
            if (d->documents) pos[r * T + t] = t == 0 || first[t] ? 0 : pos[r * T + t - 1] + 1;
        }
    }
    free(x);
    free(keep);
    free(first);
    d->pos = p;
    return 0;
}

mt_data_stats mt_dataset_stats(const mt_dataset *d) { return d->stats; }

bool mt_dataset_packs_documents(const mt_dataset *d) { return d->documents; }

const char *mt_dataset_first_skipped(const mt_dataset *d) {
    return d->stats.skipped_lines ? d->first_skipped.msg : NULL;
}

mt_data_pos mt_dataset_get_pos(const mt_dataset *d) { return d->pos; }

void mt_dataset_set_pos(mt_dataset *d, mt_data_pos pos) {
    MT_ASSERT(pos.epoch >= 0 && pos.row >= 0);
    d->pos = pos;
}

const mt_mtok *mt_dataset_corpus(const mt_dataset *d) { return &d->corpus; }
