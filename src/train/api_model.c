/* The public calls on tokenizers, data sets and models (megatrain.h):
 * wrappers over data/, train/model_eval.c, train/generate.c and
 * train/model_init.c that leave their errors for mt_last_error. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "megatrain.h"
#include "train/events.h"
#include "train/generate.h"
#include "train/model_eval.h"
#include "train/model_init.h"
#include "train/runner.h"
#include "util/mem.h"

/* ---- tokenizers ---- */

mt_tokenizer *mt_tokenizer_open(const char *path) {
    mt_error err;
    if (!path) {
        mt_errorf(&err, "tokenizer: no path; give a tokenizer.json or \"bytes\"");
        mt_set_last_error(&err);
        return NULL;
    }
    if (!strcmp(path, "bytes")) return mt_tokenizer_bytes();
    mt_tokenizer *tok = mt_tokenizer_load(path, &err);
    if (!tok) mt_set_last_error(&err);
    return tok;
}

int mt_tokenizer_tokenize(const mt_tokenizer *tok, const char *text, size_t len,
                          bool add_special, int32_t **ids, size_t *n) {
    mt_error err;
    return mt_tokenizer_encode(tok, text, len, add_special, ids, n, &err)
               ? mt_set_last_error(&err) : 0;
}

/* ---- data sets ---- */

void mt_dataset_opts_defaults(mt_dataset_opts *o) {
    *o = (mt_dataset_opts){.format = "auto", .chat_template = "auto", .seed = 1, .epochs = 1};
}

mt_dataset *mt_dataset_load(const char *path, const mt_tokenizer *tok, const mt_dataset_opts *o) {
    mt_dataset_opts def;
    mt_dataset_opts_defaults(&def);
    if (!o) o = &def;
    mt_error err;
    if (!path || (!tok && o->vocab_size <= 0) || o->epochs < 1) {
        mt_errorf(&err, "dataset: need a path, epochs >= 1, and a tokenizer or a vocab_size");
        mt_set_last_error(&err);
        return NULL;
    }
    mt_data_opts d = {.path = path, .format = o->format ? o->format : "auto",
                      .chat_template = o->chat_template ? o->chat_template : "auto",
                      .packing = o->packing ? o->packing : "auto", .text_field = o->text_field,
                      .skip_bad_lines = o->skip_bad_lines, .seed = o->seed, .epochs = o->epochs};
    int64_t V = o->vocab_size > 0 ? o->vocab_size : (int64_t)mt_tokenizer_vocab_size(tok);
    mt_dataset *ds = mt_dataset_open(&d, tok, V, &err);
    if (!ds) mt_set_last_error(&err);
    return ds;
}

int mt_dataset_save(const mt_dataset *d, const char *path) {
    mt_error err;
    if (!path) {
        mt_errorf(&err, "dataset: no path to save to; give a .mtok file name");
        return mt_set_last_error(&err);
    }
    /* the merged corpus of a shard directory is cached in d; its batches do not change */
    const mt_mtok *c = mt_dataset_corpus((mt_dataset *)d);
    if (!c) {
        mt_errorf(&err, "a mixture of several sources has no single token file to save; save "
                  "each source");
        return mt_set_last_error(&err);
    }
    return mt_mtok_write(path, c, &err) ? mt_set_last_error(&err) : 0;
}

int mt_dataset_describe(const mt_dataset *d, mt_dataset_info *info) {
    mt_data_stats st = mt_dataset_stats(d);
    *info = (mt_dataset_info){.documents = st.documents, .tokens = st.tokens,
                              .trainable = st.trainable, .skipped_lines = st.skipped_lines,
                              .format = st.format, .chat_template = st.chat_template,
                              .packing = st.packing};
    return 0;
}

/* ---- models ---- */

struct mt_model {
    mt_loaded_model m;
};

mt_model *mt_model_open(const char *dir, const char *tokenizer) {
    mt_model *m = mt_calloc_or_die(1, sizeof *m);
    mt_error err;
    if (!dir) {
        mt_errorf(&err, "model: no directory; give a Hugging Face model directory");
    } else if (mt_loaded_model_open(&m->m, dir, tokenizer, &err) == 0) {
        return m;
    }
    mt_set_last_error(&err);
    free(m);
    return NULL;
}

void mt_model_close(mt_model *m) {
    if (!m) return;
    mt_loaded_model_close(&m->m);
    free(m);
}

int mt_model_describe(const mt_model *m, mt_model_info *info) {
    mt_model_info_fill(info, &m->m.cfg, &m->m.table);
    return 0;
}

const mt_tokenizer *mt_model_tokenizer(const mt_model *m) { return m->m.tok; }

int mt_model_init(const char *dir, const char *tokenizer, const mt_model_shape *s,
                  mt_model_info *info) {
    mt_error err;
    mt_model_shape def;
    mt_model_shape_defaults(&def);
    return mt_model_create(dir, tokenizer, s ? s : &def, info, &err) ? mt_set_last_error(&err)
                                                                     : 0;
}

int mt_model_eval(mt_model *m, const mt_eval_opts *o, mt_eval_result *res) {
    mt_error err;
    return mt_eval_model(&m->m, o, res, &err) ? mt_set_last_error(&err) : 0;
}

void mt_generate_opts_defaults(mt_generate_opts *o) {
    *o = (mt_generate_opts){.max_new_tokens = 64, .temperature = 0.8, .top_p = 0.95, .seed = 1,
                            .add_special = true};
}

char *mt_model_generate(mt_model *m, const mt_generate_opts *o, mt_event_fn fn, void *user) {
    mt_error err;
    int dev = mt_runner_parse_device(o->device ? o->device : "auto");
    const mt_config *cfg = &m->m.cfg;
    if (dev < 0 || o->max_new_tokens < 0 || !(o->temperature >= 0) || !isfinite(o->temperature) ||
        !(o->top_p > 0) || o->top_p > 1 || o->context < 0) {
        mt_errorf(&err, "generate: need device auto, cpu or cuda, max_new_tokens >= 0, "
                  "a finite temperature >= 0, 0 < top_p <= 1, context >= 0");
        mt_set_last_error(&err);
        return NULL;
    }
    /* the model has positions for so many tokens: more is not a text of it */
    if (o->max_new_tokens > cfg->max_pos) {
        mt_errorf(&err, "generate: max_new_tokens %lld is more than the model's %lld positions "
                  "(max_position_embeddings); ask for at most %lld", (long long)o->max_new_tokens,
                  (long long)cfg->max_pos, (long long)cfg->max_pos);
        mt_set_last_error(&err);
        return NULL;
    }
    int64_t T = o->context ? o->context : (cfg->max_pos < 512 ? cfg->max_pos : 512);
    mt_gen_setup g = {.prompt = o->prompt ? o->prompt : "", .add_special = o->add_special,
                      .n_new = (int)o->max_new_tokens, .temperature = o->temperature,
                      .top_p = o->top_p, .seed = o->seed};
    int32_t stops[16];
    char *chat = NULL;
    if (o->messages) {  /* the template writes its own BOS */
        if (!(chat = mt_chat_prompt(m->m.tok, o->chat_template, o->messages, &err)))
            return mt_set_last_error(&err), NULL;
        g.prompt = chat, g.add_special = false, g.reply_only = true;
        g.stops = stops, g.n_stops = mt_chat_turn_ends(m->m.tok, stops, 16);
    }
    mt_runner r;
    mt_runner_opts ro = {.device = dev};
    char *text = NULL;
    mt_events ev = {fn, user};
    if (mt_runner_init(&r, cfg, &m->m.table, &m->m.store, 1, 1, T, &ro, &err) ||
        mt_generate_with(&r, cfg, m->m.tok, &g, &ev, &text, &err))
        mt_set_last_error(&err);
    mt_runner_free(&r);
    free(chat);
    return text;
}
