/* Preference data (pref_data.h): the order of the pairs, their packing into
 * the micro-batches of a step, and the position a resume restores. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/pref_data.h"
#include "util/mem.h"

/* The pairs in epoch's order: a Fisher-Yates shuffle drawn from (seed,
 * epoch). */
static void shuffle(mt_pref_data *d) {
    uint64_t r = d->o.seed * 0x9E3779B97F4A7C15ull + (uint64_t)d->epoch * 0xD1B54A32D192ED03ull + 1;
    for (int64_t i = 0; i < d->n_pairs; i++) d->order[i] = i;
    for (int64_t i = d->n_pairs - 1; i > 0; i--) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        int64_t j = (int64_t)(r % (uint64_t)(i + 1)), t = d->order[i];
        d->order[i] = d->order[j], d->order[j] = t;
    }
}

void mt_pref_data_rewind(mt_pref_data *d) {
    if (!d->order) d->order = mt_malloc_or_die((size_t)d->n_pairs * sizeof *d->order);
    d->epoch = 0, d->next = 0;
    shuffle(d);
}

/* Positions one document takes (its last token is only a target). */
static int64_t doc_len(const mt_pref_data *d, int64_t doc) {
    return d->off[doc + 1] - d->off[doc] - 1;
}

/* The next pair, moving to the next epoch at the end of one; -1 when
 * the data is exhausted. */
static int64_t peek(mt_pref_data *d) {
    if (d->next == d->n_pairs) {
        if (d->epoch + 1 >= d->o.epochs) return -1;
        d->epoch++, d->next = 0;
        shuffle(d);
    }
    return d->order[d->next];
}

/* Rows for pair p's two documents in a micro-batch whose rows are filled
 * to fill[B]: the first with room for each; false when one has none. */
static bool place(const mt_pref_data *d, int64_t p, const int64_t *fill, int64_t row[2]) {
    int64_t B = d->o.B, T = d->o.T, f[2] = {-1, -1};
    for (int a = 0; a < 2; a++) {
        int64_t n = doc_len(d, 2 * p + a);
        row[a] = -1;
        for (int64_t b = 0; b < B && row[a] < 0; b++) {
            int64_t used = fill[b] + (a == 1 && row[0] == b ? f[0] : 0);
            if (used + n <= T) row[a] = b;
        }
        if (row[a] < 0) return false;
        f[a] = n;
    }
    return true;
}

/* Writes document doc at token t0 of row (tokens, targets, pos of one
 * row); returns its answer's span in the row. */
static void write_doc(const mt_pref_data *d, int64_t doc, int32_t *tok, int32_t *tgt,
                      int32_t *pos, int64_t t0, int64_t *a0, int64_t *a1) {
    const int32_t *x = d->tok + d->off[doc];
    const uint8_t *k = d->keep + d->off[doc];
    int64_t n = doc_len(d, doc);
    *a0 = *a1 = -1;
    for (int64_t t = 0; t < n; t++) {
        tok[t0 + t] = x[t];
        pos[t0 + t] = (int32_t)t;
        tgt[t0 + t] = k[t + 1] ? x[t + 1] : MT_IGNORE_INDEX;
        if (k[t + 1] && *a0 < 0) *a0 = t0 + t;
        if (k[t + 1]) *a1 = t0 + t + 1;
    }
}

int mt_pref_data_next(mt_pref_data *d, int M, int32_t *tokens, int32_t *targets, int32_t *pos,
                      mt_pref_pair *pairs, int64_t *n_pairs, int64_t *pair_ids) {
    int64_t B = d->o.B, T = d->o.T, N = B * T, n = 0;
    int64_t *fill = mt_calloc_or_die((size_t)B, sizeof *fill);
    for (int64_t i = 0; i < (int64_t)M * N; i++)
        tokens[i] = 0, targets[i] = MT_IGNORE_INDEX, pos[i] = (int32_t)(i % T);
    int64_t p = peek(d);
    for (int mb = 0; mb < M && p >= 0; mb++) {
        memset(fill, 0, (size_t)B * sizeof *fill);
        int64_t row[2];
        while (p >= 0 && place(d, p, fill, row)) {
            mt_pref_pair *q = &pairs[n];
            for (int a = 0; a < 2; a++) {
                int64_t base = (int64_t)mb * N + row[a] * T, a0, a1;
                write_doc(d, 2 * p + a, tokens + base, targets + base, pos + base, fill[row[a]],
                          &a0, &a1);
                mt_pref_span sp = {mb, row[a] * T + a0, row[a] * T + a1};
                if (a) q->rejected = sp;
                else q->chosen = sp;
                fill[row[a]] += doc_len(d, 2 * p + a);
            }
            q->ref_chosen = d->ref ? d->ref[2 * p] : 0.0;
            q->ref_rejected = d->ref ? d->ref[2 * p + 1] : 0.0;
            if (pair_ids) pair_ids[n] = p;
            n++, d->next++;
            p = peek(d);
        }
        /* padding: a document of its own, positions from 0 */
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = fill[b]; t < T; t++) pos[(int64_t)mb * N + b * T + t] = (int32_t)(t - fill[b]);
    }
    free(fill);
    *n_pairs = n;
    return n == 0;
}

int64_t mt_pref_data_steps(const mt_pref_data *d, int M) {
    /* a copy walks the data (the arrays shared, the order its own) */
    mt_pref_data w = *d;
    w.order = mt_malloc_or_die((size_t)d->n_pairs * sizeof *w.order);
    w.ref = NULL;
    mt_pref_data_rewind(&w);
    int64_t B = d->o.B, steps = 0;
    int64_t *fill = mt_malloc_or_die((size_t)B * sizeof *fill), row[2];
    for (int64_t p = peek(&w); p >= 0;) {
        for (int mb = 0; mb < M && p >= 0; mb++) {
            memset(fill, 0, (size_t)B * sizeof *fill);
            while (p >= 0 && place(&w, p, fill, row)) {
                for (int a = 0; a < 2; a++) fill[row[a]] += doc_len(&w, 2 * p + a);
                w.next++;
                p = peek(&w);
            }
        }
        steps++;
    }
    free(fill);
    free(w.order);
    return steps;
}

cJSON *mt_pref_data_pos_to_json(const mt_pref_data *d) {
    cJSON *j = cJSON_CreateObject();
    char sum[17];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)d->checksum);
    cJSON_AddNumberToObject(j, "epoch", (double)d->epoch);
    cJSON_AddNumberToObject(j, "next", (double)d->next);
    cJSON_AddNumberToObject(j, "pairs", (double)d->n_pairs);
    cJSON_AddStringToObject(j, "checksum", sum);
    return j;
}

int mt_pref_data_pos_from_json(mt_pref_data *d, const cJSON *j, mt_error *err) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "epoch"),
                *n = cJSON_GetObjectItemCaseSensitive(j, "next"),
                *s = cJSON_GetObjectItemCaseSensitive(j, "checksum");
    char sum[17];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)d->checksum);
    if (!cJSON_IsNumber(e) || !cJSON_IsNumber(n) || !cJSON_IsString(s))
        return mt_errorf(err, "the checkpoint's preference data position is not readable");
    if (strcmp(s->valuestring, sum))
        return mt_errorf(err, "%s is not the preference data the checkpoint was trained on (its "
                         "tokens' checksum is %s, the checkpoint's %s): resume with the same "
                         "data, tokenizer, chat template and seq_len", d->path, sum,
                         s->valuestring);
    if (e->valuedouble < 0 || e->valuedouble >= (double)d->o.epochs || n->valuedouble < 0 ||
        n->valuedouble > (double)d->n_pairs)
        return mt_errorf(err, "the checkpoint's preference data position (epoch %g, pair %g) "
                         "lies outside %s", e->valuedouble, n->valuedouble, d->path);
    d->epoch = (int64_t)e->valuedouble;
    shuffle(d);
    d->next = (int64_t)n->valuedouble;
    return 0;
}
