/* Encoding a text with loss spans (see tok_spans.h). The text is cut at
 * the tokenizer's added tokens, as encoding cuts it, so each run of plain
 * text between them encodes alone to the same ids; a run that a span edge
 * crosses is encoded once more up to the edge to tell which tokens lie
 * before it. */
#include "data/tok_spans.h"

#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

void mt_tok_masked_free(mt_tok_masked *m) {
    mt_tok_ids_free(&m->ids);
    mt_tok_ids_free(&m->scratch);
    free(m->keep);
    memset(m, 0, sizeof *m);
}

void mt_tok_masked_push(mt_tok_masked *m, int32_t id, bool keep) {
    mt_tok_ids *v = &m->ids;
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 256;
        v->ids = mt_realloc_or_die(v->ids, v->cap * sizeof *v->ids);
    }
    if (v->n == m->keep_cap) {
        m->keep_cap = v->cap;
        m->keep = mt_realloc_or_die(m->keep, m->keep_cap);
    }
    m->keep[v->n] = keep;
    v->ids[v->n++] = id;
}

/* Whether any byte of [a, b) lies in a span. */
static bool overlaps(const mt_tok_span *sp, size_t n, size_t a, size_t b) {
    for (size_t i = 0; i < n; i++)
        if (sp[i].a < b && a < sp[i].b) return true;
    return false;
}

/* The first span edge strictly inside (from, e), or e. */
static size_t next_edge(const mt_tok_span *sp, size_t n, size_t from, size_t e) {
    size_t best = e;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].a > from && sp[i].a < best) best = sp[i].a;
        if (sp[i].b > from && sp[i].b < best) best = sp[i].b;
    }
    return best;
}

/* Plain text text[s..e) (no added token inside). */
static int encode_run(mt_tok_encoder *enc, const char *text, size_t s, size_t e,
                      const mt_tok_span *sp, size_t n, mt_tok_masked *out, mt_error *err) {
    if (e == s) return 0;
    mt_tok_ids whole = {0};
    if (mt_tok_encode(enc, text + s, e - s, false, &whole, err)) { /* whole may hold some */
        mt_tok_ids_free(&whole);
        return -1;
    }
    bool flag = overlaps(sp, n, s, s + 1);
    size_t done = 0;
    for (size_t c = next_edge(sp, n, s, e); c < e; c = next_edge(sp, n, c, e)) {
        bool next = overlaps(sp, n, c, c + 1);
        if (next == flag) continue;
        out->scratch.n = 0;
        if (mt_tok_encode(enc, text + s, c - s, false, &out->scratch, err)) {
            mt_tok_ids_free(&whole);
            return -1;
        }
        size_t k = 0;
        while (k < out->scratch.n && k < whole.n && out->scratch.ids[k] == whole.ids[k]) k++;
        if (flag && k < out->scratch.n) k++;  // the token across the span's end keeps the loss
        if (k > whole.n) k = whole.n;
        if (k < done) k = done;
        for (; done < k; done++) mt_tok_masked_push(out, whole.ids[done], flag);
        flag = next;
    }
    for (; done < whole.n; done++) mt_tok_masked_push(out, whole.ids[done], flag);
    mt_tok_ids_free(&whole);
    return 0;
}

int mt_tok_encode_spans(mt_tok_encoder *enc, const mt_tokenizer *tok, const char *text, size_t len,
                        const mt_tok_span *spans, size_t n, mt_tok_masked *out, mt_error *err) {
    size_t pos = 0, st, en;
    int32_t id;
    while (mt_tokenizer_next_added(tok, text, len, pos, &st, &en, &id)) {
        if (encode_run(enc, text, pos, st, spans, n, out, err)) return -1;
        mt_tok_masked_push(out, id, overlaps(spans, n, st, en));
        pos = en;
    }
    return encode_run(enc, text, pos, len, spans, n, out, err);
}
