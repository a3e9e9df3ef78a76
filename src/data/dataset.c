/* Dataset: its sources (corpus.h), the per-epoch shuffle and packing of each
 * source's documents into rows, the weighted mixing of sources, and the
 * resume position. */
#include "data/dataset.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "data/corpus.h"
#include "data/data_spec.h"
#include "util/mem.h"

/* One source read as a stream of rows. */
typedef struct stream {
    mt_corpus c;
    char *path;
    double weight;        // as given
    double share;         // mixture: the normalised weight (the share of rows)
    double cum;           // mixture: normalised weights of sources 0..this one, summed
    uint64_t seed;
    int64_t epochs;       // 0: no end (a source of a mixture)
    mt_data_pos pos;
    int64_t order_epoch;  // epoch that order/starts hold, -1 = none
    uint64_t *order;      // (n_docs) document number at each stream position
    uint64_t *starts;     // (n_docs + 1) stream offset of each position's document
} stream;

struct mt_dataset {
    stream *s;            // (n)
    size_t n;
    bool mix;             // a list of sources: rows drawn by weight
    bool documents;       // packing documents (else rows)
    int64_t epochs;
    uint64_t mix_seed;
    int64_t draws;        // mixture: rows taken so far
    int64_t T;            // row length - 1 of the batches so far (0 before the first)
    mt_data_stats stats;
    mt_mtok merged;       // mt_dataset_corpus of a directory
    bool has_merged;
};

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t doc_len(const mt_corpus *c, uint64_t d) {
    uint64_t k;
    const mt_mtok *m = &c->parts[mt_corpus_part_of(c, d, &k)];
    return m->offsets[k + 1] - m->offsets[k];
}

/* Fisher-Yates over the documents, seeded by seed and epoch. */
static void make_order(stream *st, int64_t epoch) {
    uint64_t n = st->c.n_docs, s = st->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(epoch + 1));
    for (uint64_t i = 0; i < n; i++) st->order[i] = i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = (uint64_t)(((unsigned __int128)splitmix64(&s) * i) >> 64);
        uint64_t t = st->order[i - 1];
        st->order[i - 1] = st->order[j], st->order[j] = t;
    }
    st->starts[0] = 0;
    for (uint64_t i = 0; i < n; i++) st->starts[i + 1] = st->starts[i] + doc_len(&st->c, st->order[i]);
    st->order_epoch = epoch;
}

static int64_t stream_rows(const stream *st, int64_t T) {
    return T < 1 ? 0 : (int64_t)(st->c.n_tokens / (uint64_t)(T + 1));
}

/* Copies stream[start .. start+n) of the current epoch into x, the loss
 * flags into keep, and whether each token starts a document into first. */
static void read_stream(const stream *st, uint64_t start, int64_t n, int32_t *x, uint8_t *keep,
                        uint8_t *first) {
    uint64_t lo = 0, hi = st->c.n_docs;  // last position p with starts[p] <= start
    while (hi - lo > 1) {
        uint64_t mid = (lo + hi) / 2;
        if (st->starts[mid] <= start) lo = mid; else hi = mid;
    }
    uint64_t p = lo, s = start, base = 0, local;
    const mt_mtok *m = NULL;
    for (int64_t i = 0; i < n; i++, s++) {
        while (s >= st->starts[p + 1]) p++, m = NULL;
        if (!m) {
            m = &st->c.parts[mt_corpus_part_of(&st->c, st->order[p], &local)];
            base = m->offsets[local];
        }
        uint64_t t = base + (s - st->starts[p]);
        x[i] = (int32_t)mt_mtok_token(m, t);
        keep[i] = mt_mtok_trainable(m, t);
        first[i] = s == st->starts[p];
    }
}

/* Scratch of one row (T+1) for stream_next. */
typedef struct row_scratch { int32_t *x; uint8_t *keep, *first; } row_scratch;

/* The next `rows` rows of one source; 1 when its epochs are done. pos
 * (packing documents, else NULL) gets each token's position within its
 * document piece. */
static int stream_next(stream *st, int64_t rows, int64_t T, int32_t *tokens, int32_t *targets,
                       int32_t *pos, const row_scratch *sc) {
    int64_t R = stream_rows(st, T);
    if (R == 0) return 1;
    mt_data_pos p = st->pos;
    if (p.row >= R) p.epoch++, p.row = 0;
    if (st->epochs && (p.epoch >= st->epochs || (st->epochs - p.epoch) * R - p.row < rows)) return 1;
    for (int64_t r = 0; r < rows; r++, p.row++) {
        if (p.row == R) p.epoch++, p.row = 0;
        if (st->order_epoch != p.epoch) make_order(st, p.epoch);
        read_stream(st, (uint64_t)p.row * (uint64_t)(T + 1), T + 1, sc->x, sc->keep, sc->first);
        for (int64_t t = 0; t < T; t++) {
            // Packing documents, no token predicts the first one of another document.
            bool same_doc = !pos || !sc->first[t + 1];
            tokens[r * T + t] = sc->x[t];
            targets[r * T + t] = sc->keep[t + 1] && same_doc ? sc->x[t + 1] : MT_IGNORE_INDEX;
            if (pos) pos[r * T + t] = t == 0 || sc->first[t] ? 0 : pos[r * T + t - 1] + 1;
        }
    }
    st->pos = p;
    return 0;
}

/* ---- opening ---- */

/* The normalised weights into each stream's share. Each weight is divided
 * by the largest before they are added: 1e308 + 1e308 overflowed to inf,
 * and every share was then nan or 0 (one source drew every row). A share
 * below 2^-53, which the 53-bit draw never reaches, is refused. */
static int normalise_weights(mt_dataset *d, const mt_data_spec *spec, mt_error *err) {
    size_t big = 0;
    for (size_t i = 1; i < spec->n; i++)
        if (spec->src[i].weight > spec->src[big].weight) big = i;
    double most = spec->src[big].weight, total = 0;
    for (size_t i = 0; i < spec->n; i++) total += spec->src[i].weight / most;  // <= n
    for (size_t i = 0; i < spec->n; i++) {
        d->s[i].share = spec->src[i].weight / most / total;
        if (!(d->s[i].share >= 0x1p-53))
            return mt_errorf(err, "data[%zu] (%s): weight %g beside data[%zu]'s %g is a share "
                             "of %g of the rows, too small: a row would never be drawn from "
                             "it; raise it or drop the source", i, spec->src[i].path,
                             spec->src[i].weight, big, most, d->s[i].share);
    }
    return 0;
}

static int open_sources(mt_dataset *d, const mt_data_opts *o, const mt_data_spec *spec,
                        const mt_tokenizer *tok, int64_t vocab_size, mt_error *err) {
    double cum = 0;
    if (normalise_weights(d, spec, err)) return -1;
    for (size_t i = 0; i < spec->n; i++) {
        stream *st = &d->s[i];
        mt_data_opts so = *o;
        so.path = spec->src[i].path;
        st->path = mt_strdup_or_die(so.path);
        st->weight = spec->src[i].weight;
        st->order_epoch = -1;
        /* sources of a mixture: own orders, no end */
        st->seed = d->mix ? o->seed + 0x632BE59BD9B4E019ull * (i + 1) : o->seed;
        st->epochs = d->mix ? 0 : o->epochs;
        if (mt_corpus_open(&st->c, &so, tok, vocab_size, err)) {
            if (d->mix) mt_error_prefix(err, "data[%zu]: ", i);
            return -1;
        }
        cum += st->share;
        st->cum = i + 1 == spec->n ? 1.0 : cum;
        st->order = mt_malloc_or_die(st->c.n_docs * sizeof *st->order);
        st->starts = mt_malloc_or_die((st->c.n_docs + 1) * sizeof *st->starts);
        const mt_data_stats *cs = &st->c.stats;
        mt_data_stats *ds = &d->stats;
        ds->documents += cs->documents, ds->tokens += cs->tokens, ds->trainable += cs->trainable;
        ds->skipped_lines += cs->skipped_lines, ds->bytes += cs->bytes;
        ds->files += (int64_t)st->c.n_parts;
        if (!ds->format) ds->format = cs->format;
        else if (strcmp(ds->format, cs->format)) ds->format = "mixed";
        if (!ds->chat_template) ds->chat_template = cs->chat_template;
    }
    d->stats.sources = (int64_t)spec->n;
    return 0;
}

/* Whether every part of a source carries a loss mask (token files). */
static bool all_masked(const mt_corpus *c) {
    for (size_t i = 0; i < c->n_parts; i++)
        if (!c->parts[i].mask) return false;
    return true;
}

/* Resolves opts' packing against the formats the sources turned out to
 * have: auto packs documents when every source is completion or
 * conversational data (or token files with a loss mask). */
static int choose_packing(mt_dataset *d, const mt_data_opts *o, mt_error *err) {
    const char *p = o->packing && *o->packing ? o->packing : "auto";
    if (!strcmp(p, "auto")) {
        d->documents = true;
        for (size_t i = 0; i < d->n; i++) {
            const char *f = d->s[i].c.stats.format;
            d->documents &= !strcmp(f, "completion") || !strcmp(f, "chat") ||
                            !strcmp(f, "alpaca") || !strcmp(f, "sharegpt") ||
                            (!strcmp(f, "tokens") && all_masked(&d->s[i].c));
        }
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
    mt_data_spec spec;
    if (mt_data_spec_parse(o->path, "data", &spec, err)) return NULL;
    mt_dataset *d = mt_calloc_or_die(1, sizeof *d);
    d->n = spec.n;
    d->mix = spec.n > 1;
    d->s = mt_calloc_or_die(d->n, sizeof *d->s);
    d->epochs = o->epochs;
    d->mix_seed = o->seed ^ 0x2545F4914F6CDD1Dull;
    int rc = open_sources(d, o, &spec, tok, vocab_size, err) || choose_packing(d, o, err);
    mt_data_spec_free(&spec);
    if (rc) {
        mt_dataset_free(d);
        return NULL;
    }
    return d;
}

void mt_dataset_free(mt_dataset *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n; i++) {
        mt_corpus_free(&d->s[i].c);
        free(d->s[i].path);
        free(d->s[i].order);
        free(d->s[i].starts);
    }
    if (d->has_merged) mt_mtok_free(&d->merged);
    free(d->s);
    free(d);
}

/* ---- batches ---- */

int64_t mt_dataset_rows_per_epoch(const mt_dataset *d, int64_t T) {
    int64_t R = 0;
    for (size_t i = 0; i < d->n; i++) R += stream_rows(&d->s[i], T);
    return R;
}

int mt_dataset_check_rows(const mt_dataset *d, int64_t T, mt_error *err) {
    for (size_t i = 0; i < d->n; i++) {
        const stream *st = &d->s[i];
        if (stream_rows(st, T) > 0) continue;
        if (!d->mix)
            return mt_errorf(err, "%s: %lld tokens are fewer than one row of seq_len + 1 = %lld; "
                             "add data or lower seq_len", st->path, (long long)st->c.n_tokens,
                             (long long)T + 1);
        return mt_errorf(err, "data[%zu] (%s): %lld tokens are fewer than one row of seq_len + 1 "
                         "= %lld; add data to it, drop it from the list, or lower seq_len", i,
                         st->path, (long long)st->c.n_tokens, (long long)T + 1);
    }
    return 0;
}

/* The source of mixture row k: a uniform draw from a hash of (seed, k)
 * against the cumulative normalised weights. */
static size_t pick_source(const mt_dataset *d, int64_t k) {
    uint64_t s = d->mix_seed + (uint64_t)k * 0x9E3779B97F4A7C15ull;
    double u = (double)(splitmix64(&s) >> 11) * 0x1.0p-53;  // [0, 1)
    for (size_t i = 0; i + 1 < d->n; i++)
        if (u < d->s[i].cum) return i;
    return d->n - 1;
}

int mt_dataset_next_batch(mt_dataset *d, int64_t rows, int64_t T, int32_t *tokens,
                          int32_t *targets, int32_t *pos) {
    MT_ASSERT(rows >= 1 && T >= 1);
    MT_ASSERT(d->T == 0 || d->T == T);  // positions count rows of one length
    MT_ASSERT(pos || !d->documents);    // positions are part of a document-packed batch
    if (!d->documents) pos = NULL;
    int64_t R = mt_dataset_rows_per_epoch(d, T), total;
    if (R == 0) return 1;
    if (d->mix) {  // every source must have a row; the mixture ends after epochs * R rows
        for (size_t i = 0; i < d->n; i++)
            if (stream_rows(&d->s[i], T) == 0) return 1;
        if (__builtin_mul_overflow(d->epochs, R, &total)) total = INT64_MAX;
        if (total - d->draws < rows) return 1;
    }
    row_scratch sc = {mt_malloc_or_die((size_t)(T + 1) * sizeof *sc.x),
                      mt_malloc_or_die((size_t)(T + 1)), mt_malloc_or_die((size_t)(T + 1))};
    int rc = 0;
    if (!d->mix) rc = stream_next(&d->s[0], rows, T, tokens, targets, pos, &sc);
    for (int64_t r = 0; d->mix && r < rows; r++, d->draws++) {
        stream *st = &d->s[pick_source(d, d->draws)];
        MT_ASSERT(stream_next(st, 1, T, tokens + r * T, targets + r * T, pos ? pos + r * T : NULL,
                              &sc) == 0);
    }
    free(sc.x);
    free(sc.keep);
    free(sc.first);
    if (!rc) d->T = T;
    return rc;
}

bool mt_dataset_packs_documents(const mt_dataset *d) { return d->documents; }

/* ---- stats and positions ---- */

mt_data_stats mt_dataset_stats(const mt_dataset *d) { return d->stats; }

const char *mt_dataset_first_skipped(const mt_dataset *d) {
    for (size_t i = 0; i < d->n; i++)
        if (d->s[i].c.stats.skipped_lines) return d->s[i].c.first_skipped.msg;
    return NULL;
}

void mt_dataset_print_sources(const mt_dataset *d, FILE *f) {
    for (size_t i = 0; i < d->n; i++) {
        const stream *st = &d->s[i];
        if (d->mix)
            fprintf(f, "  data[%zu] %s: weight %g (%.1f%% of rows), %lld documents, %lld tokens, "
                    "format %s", i, st->path, st->weight, 100 * st->share,
                    (long long)st->c.stats.documents, (long long)st->c.stats.tokens,
                    st->c.stats.format);
        else if (st->c.n_parts > 1 || st->c.ignored)
            fprintf(f, "  %s", st->path);
        else continue;
        if (st->c.n_parts > 1 || st->c.ignored)
            fprintf(f, ", %zu files in name order (%s .. %s)", st->c.n_parts,
                    strrchr(st->c.names[0], '/') + 1,
                    strrchr(st->c.names[st->c.n_parts - 1], '/') + 1);
        if (st->c.ignored) fprintf(f, ", %lld other entries ignored", (long long)st->c.ignored);
        fputc('\n', f);
    }
}

mt_data_pos mt_dataset_get_pos(const mt_dataset *d) {
    if (!d->mix) return d->s[0].pos;
    int64_t R = mt_dataset_rows_per_epoch(d, d->T);
    return R ? (mt_data_pos){d->draws / R, d->draws % R} : (mt_data_pos){0, d->draws};
}

void mt_dataset_set_pos(mt_dataset *d, mt_data_pos pos) {
    MT_ASSERT(!d->mix);  // a mixture's position is mt_dataset_pos_to_json's
    MT_ASSERT(pos.epoch >= 0 && pos.row >= 0);
    d->s[0].pos = pos;
}

void mt_dataset_rewind(mt_dataset *d) {
    for (size_t i = 0; i < d->n; i++) d->s[i].pos = (mt_data_pos){0, 0};
    d->draws = 0;
}

static cJSON *stream_pos_json(const stream *st) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "epoch", (double)st->pos.epoch);
    cJSON_AddNumberToObject(o, "row", (double)st->pos.row);
    cJSON_AddNumberToObject(o, "tokens", (double)st->c.n_tokens);
    return o;
}

cJSON *mt_dataset_pos_to_json(const mt_dataset *d) {
    if (!d->mix) return stream_pos_json(&d->s[0]);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "draws", (double)d->draws);
    cJSON *a = cJSON_AddArrayToObject(o, "sources");
    for (size_t i = 0; i < d->n; i++) cJSON_AddItemToArray(a, stream_pos_json(&d->s[i]));
    return o;
}

static bool count_of(const cJSON *o, const char *key, int64_t *v) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0) || j->valuedouble > 9007199254740992.0)
        return false;
    *v = (int64_t)j->valuedouble;
    return true;
}

static int stream_pos_from(stream *st, const cJSON *o, const char *what, mt_error *err) {
    mt_data_pos p;
    int64_t tokens = (int64_t)st->c.n_tokens;  // older checkpoints do not record it
    if (!cJSON_IsObject(o) || !count_of(o, "epoch", &p.epoch) || !count_of(o, "row", &p.row) ||
        (cJSON_GetObjectItemCaseSensitive(o, "tokens") && !count_of(o, "tokens", &tokens)))
        return mt_errorf(err, "no data position (epoch, row, tokens) for %s", what);
    if ((uint64_t)tokens != st->c.n_tokens)
        return mt_errorf(err, "%s (%s) held %lld tokens when it was saved and holds %llu now: a "
                         "resumed run needs the same data (restore it, or start a new run)",
                         what, st->path, (long long)tokens, (unsigned long long)st->c.n_tokens);
    st->pos = p;
    return 0;
}

int mt_dataset_pos_from_json(mt_dataset *d, const cJSON *j, mt_error *err) {
    if (!d->mix) return stream_pos_from(&d->s[0], j, "the data", err);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "sources");
    int64_t draws;
    if (!count_of(j, "draws", &draws) || !cJSON_IsArray(a) || cJSON_GetArraySize(a) != (int)d->n)
        return mt_errorf(err, "no data position of a mixture of %zu sources (draws, sources)", d->n);
    for (size_t i = 0; i < d->n; i++) {
        char what[32];
        snprintf(what, sizeof what, "data[%zu]", i);
        if (stream_pos_from(&d->s[i], cJSON_GetArrayItem(a, (int)i), what, err)) return -1;
    }
    d->draws = draws;
    return 0;
}

const mt_mtok *mt_dataset_corpus(mt_dataset *d) {
    if (d->mix) return NULL;
    const mt_corpus *c = &d->s[0].c;
    if (c->n_parts == 1) return &c->parts[0];
    if (!d->has_merged) mt_corpus_merge(c, &d->merged), d->has_merged = true;
    return &d->merged;
}
