/* The training run's tokenizer, data and batches (trainer_internal.h):
 * opening the training and held-out data, taking a step's batch (skipping
 * batches without a loss token), this rank's micro-batches of it, and what
 * taking a batch moves, for a step that is abandoned. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/builtin_text.h"
#include "train/train_memory.h"
#include "train/trainer_internal.h"
#include "util/mem.h"

/* The sources of a mixture or the files of a directory, a line each. */
static void emit_sources(mt_run *R) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    mt_dataset_print_sources(R->data, f);
    fclose(f);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        mt_emit(&R->ev, MT_EVENT_INFO, line);
    free(text);
}

static int sum_over_ranks(void *ctx, double *x, int n, mt_error *err) {
    return mt_ranks_sum(&((mt_run *)ctx)->rk, x, n, err);
}

/* Rows of T+1 bytes of the built-in text at random offsets. */
static void builtin_batch(mt_run *R, int64_t rows, int64_t T) {
    for (int64_t r = 0; r < rows; r++) {
        uint64_t *s = &R->rng;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        size_t off = *s % (R->text_len - (size_t)T - 1);
        for (int64_t t = 0; t < T; t++) {
            R->tokens[r * T + t] = (unsigned char)R->text[off + t];
            R->targets[r * T + t] = (unsigned char)R->text[off + t + 1];
        }
    }
}

/* The step's batch, in R->tokens/targets/pos. */
static mt_batch step_batch(const mt_run *R) {
    const mt_train_config *tc = R->tc;
    return (mt_batch){.M = (int)tc->micro_batches, .B = tc->batch_size, .T = tc->seq_len,
                      .tokens = R->tokens, .targets = R->targets, .pos = R->pos};
}

int mt_run_load_tokenizer(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (R->tok) return 0; /* the built-in model's own, loaded with its config */
    if (!tc->tokenizer[0] || !strcmp(tc->tokenizer, "bytes")) {
        if (tc->model[0] && !tc->tokenizer[0])
            return mt_errorf(err, "no tokenizer: pass --tokenizer PATH/tokenizer.json");
        R->tok = mt_tokenizer_bytes();
    } else {
        R->tok = mt_tokenizer_load(tc->tokenizer, err);
        if (!R->tok) return -1;
    }
    if ((int64_t)mt_tokenizer_vocab_size(R->tok) > R->cfg.V)
        mt_emitf(&R->ev, MT_EVENT_WARNING, "note: the tokenizer has %zu ids, the model %lld; "
                 "data with ids >= %lld will be refused", mt_tokenizer_vocab_size(R->tok),
                 (long long)R->cfg.V, (long long)R->cfg.V);
    return 0;
}

int mt_run_open_data(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (mt_run_is_pref(R)) return mt_run_pref_open(R, err);
    if (!tc->data[0]) {
        if (tc->model[0])
            return mt_errorf(err, "no training data: pass --data FILE.jsonl (or .mtok)");
        if (tc->tokenizer[0] && strcmp(tc->tokenizer, "bytes"))
            return mt_errorf(err, "tokenizer %s: the built-in text is bytes, which only the "
                             "built-in tokenizer reads; pass --data FILE to train with this "
                             "tokenizer", tc->tokenizer);
        R->text = mt_builtin_text(MT_BUILTIN_TEXT_BYTES, 7, &R->text_len);
        R->rng = (uint64_t)tc->seed * 0x9E3779B97F4A7C15ull + 1;
        return 0;
    }
    mt_data_opts o = {.path = tc->data, .format = mt_tc_data_format_name(tc->data_format),
                      .text_field = tc->text_field,
                      .chat_template = mt_tc_chat_template_name(tc->chat_template),
                      .packing = mt_tc_packing_name(tc->packing),
                      .skip_bad_lines = tc->skip_bad_lines, .seed = (uint64_t)tc->seed,
                      .epochs = tc->epochs};
    R->data = mt_dataset_open(&o, R->tok, R->cfg.V, err);
    if (!R->data) return -1;
    mt_data_stats st = mt_dataset_stats(R->data);
    char skipped[64] = "", chat[96] = "";
    if (st.skipped_lines)
        snprintf(skipped, sizeof skipped, ", %lld malformed lines skipped",
                 (long long)st.skipped_lines);
    if (st.chat_template && !strcmp(st.chat_template, "model"))
        snprintf(chat, sizeof chat, " with the model's chat template");
    else if (st.chat_template)
        snprintf(chat, sizeof chat, " with the built-in chat template %s", st.chat_template);
    mt_emitf(&R->ev, MT_EVENT_INFO, "data: %s, %lld documents, %lld tokens (%lld with loss), "
             "format %s%s, packing %s%s", tc->data, (long long)st.documents, (long long)st.tokens,
             (long long)st.trainable, st.format, chat, st.packing, skipped);
    emit_sources(R);
    return mt_dataset_check_rows(R->data, tc->seq_len, err);
}

int mt_run_open_eval(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    mt_data_opts o = {.path = tc->eval_data, .format = mt_tc_data_format_name(tc->data_format),
                      .text_field = tc->text_field,
                      .chat_template = mt_tc_chat_template_name(tc->chat_template),
                      .packing = mt_tc_packing_name(tc->packing),
                      .skip_bad_lines = tc->skip_bad_lines};
    if (mt_eval_set_open(&R->eval, &o, R->tok, R->cfg.V, (int)tc->micro_batches,
                         tc->batch_size, tc->seq_len, tc->eval_batches, tc->eval_every, err))
        return -1;
    R->eval.mb_first = R->mb_first; /* the micro-batches of every batch this rank evaluates */
    R->eval.mb_count = R->M;
    if (R->several) R->eval.sum = sum_over_ranks, R->eval.sum_ctx = R;
    return 0;
}

/* 0: a batch with a loss token is in R->tokens/targets; 1: the data is
 * exhausted. A batch without one (chat or completion data whose prompts
 * fill whole rows) would give no gradient, and the engine refuses it: it
 * is skipped and counted in R->empty_batches. The data position moves past
 * it like past any batch, so a resume continues after it. */
int mt_run_next_batch(mt_run *R) {
    const mt_train_config *tc = R->tc;
    int64_t rows = tc->micro_batches * tc->batch_size;
    R->empty_batches = 0;
    if (R->pref) return mt_run_pref_next(R);
    if (!R->data) {
        builtin_batch(R, rows, tc->seq_len);
        return 0;
    }
    for (;;) {
        if (mt_dataset_next_batch(R->data, rows, tc->seq_len, R->tokens, R->targets, R->pos))
            return 1;
        mt_batch b = step_batch(R);
        if (mt_batch_count_valid(&b) > 0) return 0;
        R->empty_batches++;
        R->empty_batches_run++;
    }
}

/* Skipped batches said once in full, then in a count with the progress
 * lines (every log_every steps): a warning, not a flood. */
void mt_run_warn_empty_batches(mt_run *R) {
    int64_t fresh = R->empty_batches_run - R->empty_batches_said, step = R->step + 1;
    if (fresh == 0 || (R->empty_batches_said && step % R->tc->log_every != 0)) return;
    if (!R->empty_batches_said)
        mt_emitf(&R->ev, MT_EVENT_WARNING, "warning: step %lld: skipped %lld batch%s with no loss "
                 "token (every target -100: prompts that fill whole rows? a longer seq_len "
                 "keeps more of each answer); counted in metrics.jsonl's empty_batches",
                 (long long)step, (long long)fresh, fresh > 1 ? "es" : "");
    else
        mt_emitf(&R->ev, MT_EVENT_WARNING, "warning: step %lld: %lld more batch%s with no loss "
                 "token skipped, %lld in all", (long long)step, (long long)fresh,
                 fresh > 1 ? "es" : "", (long long)R->empty_batches_run);
    R->empty_batches_said = R->empty_batches_run;
}

/* Only a run that can abandon a step needs it. */
mt_run_batch_state mt_run_batch_state_get(const mt_run *R) {
    mt_run_batch_state s = {NULL, R->rng, R->empty_batches_run, R->empty_batches_said};
    if (R->data && !R->several && R->r.be->ops->abandon_step)
        s.data = mt_dataset_pos_to_json(R->data);
    if (R->pref && R->r.be->ops->abandon_step) s.data = mt_pref_data_pos_to_json(&R->pref->data);
    return s;
}

void mt_run_batch_state_free(mt_run_batch_state *s) {
    cJSON_Delete(s->data);
    s->data = NULL;
}

void mt_run_batch_state_set(mt_run *R, mt_run_batch_state *s) {
    mt_error err;
    /* the position this dataset itself wrote: never refused */
    MT_ASSERT(!R->data || (s->data && mt_dataset_pos_from_json(R->data, s->data, &err) == 0));
    MT_ASSERT(!R->pref || (s->data && mt_pref_data_pos_from_json(&R->pref->data, s->data,
                                                                 &err) == 0));
    R->rng = s->rng;
    R->empty_batches_run = s->empty_run;
    R->empty_batches_said = s->empty_said;
    mt_run_batch_state_free(s);
}

/* This rank's micro-batches of the step, whose loss is a mean over the
 * whole step's targets. */
mt_batch mt_run_rank_batch(const mt_run *R) {
    const mt_train_config *tc = R->tc;
    size_t skip = (size_t)R->mb_first * (size_t)tc->batch_size * (size_t)tc->seq_len;
    mt_batch all = step_batch(R);
    return (mt_batch){.M = R->M, .B = tc->batch_size, .T = tc->seq_len,
                      .tokens = R->tokens + skip, .targets = R->targets + skip,
                      .pos = R->pos ? R->pos + skip : NULL,
                      .n_valid = R->several ? mt_batch_count_valid(&all) : 0};
}
