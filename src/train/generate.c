/* Text generation: greedy or temperature and top-p sampling, one token
 * per forward pass over the last `context` tokens. */
#include "train/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "engine/step.h"
#include "util/mem.h"

typedef struct prob_index {
    float p;
    int32_t id;
} prob_index;

static int by_prob_desc(const void *a, const void *b) {
    float x = ((const prob_index *)a)->p, y = ((const prob_index *)b)->p;
    return (x < y) - (x > y);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Greedy, or softmax at `temperature` restricted to the smallest set of
 * tokens whose probability reaches top_p. */
static int32_t pick(float *logits, int64_t V, double temperature, double top_p, uint64_t *rng,
                    prob_index *scratch) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return (int32_t)best;
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
        scratch[v].p = (float)exp((logits[v] - logits[best]) / temperature);
        scratch[v].id = (int32_t)v;
        sum += scratch[v].p;
    }
    qsort(scratch, (size_t)V, sizeof *scratch, by_prob_desc);
    int64_t keep = 0;
    double cum = 0;
    while (keep < V && (keep == 0 || cum < top_p * sum)) cum += scratch[keep++].p;
    double u = (double)(rng_next(rng) >> 11) / 9007199254740992.0 * cum, acc = 0;
    for (int64_t k = 0; k < keep; k++) {
        acc += scratch[k].p;
        if (u < acc) return scratch[k].id;
    }
    return scratch[keep - 1].id;
}

static bool is_stop(int32_t id, int32_t eos, const mt_gen_setup *g) {
    if (id == eos) return true;
    for (size_t i = 0; i < g->n_stops; i++)
        if (id == g->stops[i]) return true;
    return false;
}

int mt_generate(mt_runner *r, const mt_config *cfg, const mt_tokenizer *tok, const char *prompt,
                bool add_special, int n_new, double temperature, double top_p, uint64_t seed,
                const mt_events *ev, char **text_out, mt_error *err) {
    mt_gen_setup g = {.prompt = prompt, .add_special = add_special, .n_new = n_new,
                      .temperature = temperature, .top_p = top_p, .seed = seed};
    return mt_generate_with(r, cfg, tok, &g, ev, text_out, err);
}

int mt_generate_with(mt_runner *r, const mt_config *cfg, const mt_tokenizer *tok,
                     const mt_gen_setup *g, const mt_events *ev, char **text_out, mt_error *err) {
    MT_ASSERT(r->M == 1 && r->B == 1);
    int32_t *ids = NULL;
    size_t n = 0;
    if (mt_tokenizer_encode(tok, g->prompt, strlen(g->prompt), g->add_special, &ids, &n, err))
        return -1;
    int64_t T = r->T, V = cfg->V;
    size_t cap = n + (size_t)g->n_new + 1, n_prompt = g->reply_only ? n : 0;
    ids = mt_realloc_or_die(ids, cap * sizeof *ids);
    int32_t *win = mt_calloc_or_die((size_t)T, sizeof *win), *tgt = mt_malloc_or_die((size_t)T * 4);
    float *logits = mt_malloc_or_die((size_t)V * sizeof *logits);
    prob_index *scratch = mt_malloc_or_die((size_t)V * sizeof *scratch);
    for (int64_t i = 0; i < T; i++) tgt[i] = MT_IGNORE_INDEX;
    uint64_t rng = g->seed * 0x9E3779B97F4A7C15ull + 1;
    int32_t eos = mt_tokenizer_eos_id(tok);
    char *text = mt_tokenizer_decode(tok, ids + n_prompt, n - n_prompt, true);
    mt_emit(ev, MT_EVENT_TEXT, text);
    size_t printed = strlen(text);
    int rc = 0;
    for (int k = 0; k < g->n_new; k++) {
        /* the last T tokens, left-aligned; padding after them is causal-invisible */
        size_t start = n > (size_t)T ? n - (size_t)T : 0, ctx = n - start;
        if (ctx == 0) break;
        for (int64_t i = 0; i < T; i++) win[i] = (size_t)i < ctx ? ids[start + i] : 0;
        mt_batch b = {.M = 1, .B = 1, .T = T, .tokens = win, .targets = tgt};
        double ls;
        int64_t nv;
        if ((rc = mt_step_eval(r->be, r->n_layers, &b, &ls, &nv, err))) break;
        mt_runner_logits(r, (int64_t)ctx - 1, logits);
        int32_t next = pick(logits, V, g->temperature, g->top_p, &rng, scratch);
        if (is_stop(next, eos, g)) break;
        ids[n++] = next;
        /* report what the new token adds to the decoded text */
        free(text);
        text = mt_tokenizer_decode(tok, ids + n_prompt, n - n_prompt, true);
        size_t len = strlen(text);
        if (len > printed) mt_emit(ev, MT_EVENT_TEXT, text + printed);
        printed = len;
    }
    mt_emit(ev, MT_EVENT_TEXT, "\n");
    if (text_out && !rc) *text_out = text;
    else free(text);
    free(ids);
    free(win);
    free(tgt);
    free(logits);
    free(scratch);
    return rc;
}
