/* A training run of a preference objective (dpo, simpo, orpo;
 * docs/preference.md): its pairs instead of the dataset, the reference
 * log-probabilities before the first step, the step through the sequence
 * objective of engine/step.h, and its metrics. trainer.c calls these where
 * an sft run reads its dataset, steps and reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/model_io.h"
#include "train/pref_eval.h"
#include "train/pref_ref.h"
#include "train/trainer_internal.h"
#include "util/mem.h"
#include "util/sys.h"

int mt_run_is_pref(const mt_run *R) { return R->tc->objective != MT_TC_OBJECTIVE_SFT; }

static int open_pairs(mt_run *R, mt_pref_data *d, const char *path, int64_t epochs,
                      mt_error *err) {
    const mt_train_config *tc = R->tc;
    mt_pref_data_opts o = {.path = path,
                           .chat_template = mt_tc_chat_template_name(tc->chat_template),
                           .skip_bad_pairs = tc->skip_bad_pairs, .seed = (uint64_t)tc->seed,
                           .epochs = epochs, .B = tc->batch_size, .T = tc->seq_len};
    if (mt_pref_data_open(d, &o, R->tok, R->cfg.V, err)) return -1;
    char chat[96] = "", skipped[600] = "";
    if (d->chat) snprintf(chat, sizeof chat, ", chat template %s", d->chat);
    if (d->skipped)
        snprintf(skipped, sizeof skipped, ", %lld bad pairs left out (the first: %s)",
                 (long long)d->skipped, d->first_skipped);
    mt_emitf(&R->ev, MT_EVENT_INFO, "data: %s, %lld preference pairs (%s)%s%s", path,
             (long long)d->n_pairs, d->format, chat, skipped);
    return 0;
}

int mt_run_pref_open(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    const char *obj = mt_tc_objectives[tc->objective];
    if (!tc->data[0])
        return mt_errorf(err, "objective %s: needs preference pairs (set data: FILE.jsonl of "
                         "{prompt, chosen, rejected})", obj);
    if (R->several)
        return mt_errorf(err, "objective %s does not run on several ranks yet: train it in one "
                         "process (no --gpus, no launcher)", obj);
    mt_run_pref *p = R->pref = mt_calloc_or_die(1, sizeof *R->pref);
    p->o = mt_pref_opts_of(tc);
    if (open_pairs(R, &p->data, tc->data, tc->epochs, err)) return -1;
    size_t cap = (size_t)(tc->micro_batches * tc->batch_size * tc->seq_len / 2 + 1);
    p->pairs = mt_malloc_or_die(cap * sizeof *p->pairs);
    if (tc->eval_data[0]) {
        if (open_pairs(R, &p->eval, tc->eval_data, 1, err)) return -1;
        p->has_eval = 1;
    }
    return 0;
}

void mt_run_pref_free(mt_run *R) {
    if (!R->pref) return;
    mt_pref_data_free(&R->pref->data);
    mt_pref_data_free(&R->pref->eval);
    free(R->pref->pairs);
    free(R->pref);
    R->pref = NULL;
}

/* The file of a set's reference log-probabilities in the run. */
static void ref_path(const mt_run *R, int eval, char *path, size_t n) {
    snprintf(path, n, "%s/reference_logps%s.bin", R->tc->out, eval ? "_eval" : "");
}

/* Both sets' files: read, or (a fresh start) computed with be. */
static int reference_sets(mt_run *R, mt_backend *be, uint64_t sum, mt_error *err) {
    mt_pref_data *sets[2] = {&R->pref->data, R->pref->has_eval ? &R->pref->eval : NULL};
    for (int e = 0; e < 2; e++) {
        if (!sets[e]) continue;
        char path[4200];
        ref_path(R, e, path, sizeof path);
        int rc = mt_pref_ref_load(sets[e], path, R->ckpt_dir[0] ? 0 : sum, err);
        if (rc <= 0) {
            if (rc == 0) mt_emitf(&R->ev, MT_EVENT_INFO, "reference: %s", path);
            if (rc < 0) return -1;
            continue;
        }
        if (!be)
            return mt_errorf(err, "%s is missing: a resumed dpo run needs the reference "
                             "log-probabilities its first start computed", path);
        int64_t resumed;
        double t0 = mt_now_s();
        if (mt_pref_ref_compute(sets[e], be, R->table.n_layers, (int)R->tc->micro_batches,
                                path, sum, &resumed, err))
            return -1;
        mt_emitf(&R->ev, MT_EVENT_INFO, "reference: %lld pairs' log-probabilities in %.1fs%s, "
                 "%s", (long long)sets[e]->n_pairs, mt_now_s() - t0,
                 resumed ? " (continuing a pass cut short)" : "", path);
    }
    return 0;
}

int mt_run_pref_reference(mt_run *R, int gpu, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (!R->pref || !mt_pref_needs_ref(R->pref->o.loss)) return 0;
    if (R->ckpt_dir[0]) return reference_sets(R, NULL, 0, err);
    if (tc->ref_model[0] && mt_model_load_weights(&R->store, tc->ref_model, err))
        return mt_error_prefix(err, "ref_model: ");
    uint64_t sum = mt_pref_ref_model_sum(R->store.w, R->table.total);
    mt_runner g;
    mt_runner_opts ro = {.device = gpu ? 2 : 1, .fp32 = tc->precision == MT_TC_PRECISION_FP32};
    int rc = mt_runner_init(&g, &R->cfg, &R->table, &R->store, (int)tc->micro_batches,
                            tc->batch_size, tc->seq_len, &ro, err);
    if (rc == 0) {
        rc = reference_sets(R, g.be, sum, err);
        mt_runner_free(&g);
    }
    /* the policy starts from the run's own weights again */
    if (tc->ref_model[0] && rc == 0) rc = mt_run_init_weights(R, err);
    return rc;
}

int mt_run_pref_next(mt_run *R) {
    mt_run_pref *p = R->pref;
    return mt_pref_data_next(&p->data, (int)R->tc->micro_batches, R->tokens, R->targets, R->pos,
                             p->pairs, &p->n_pairs, NULL);
}

int mt_run_pref_step(mt_run *R, const mt_step_stop *stop, double *loss, mt_error *err) {
    mt_run_pref *p = R->pref;
    const mt_train_config *tc = R->tc;
    mt_batch b = {.M = (int)tc->micro_batches, .B = tc->batch_size, .T = tc->seq_len,
                  .tokens = R->tokens, .targets = R->targets, .pos = R->pos};
    mt_pref_step s;
    if (mt_pref_step_init(&s, &p->o, &b, p->pairs, p->n_pairs, err)) return -1;
    mt_seq_objective obj = {mt_pref_weigh, &s};
    int rc = mt_step_sequence_or_stop(R->r.be, R->table.n_layers, &b, &obj, stop, err);
    p->m = mt_pref_step_metrics(&s);
    *loss = p->m.loss;
    mt_pref_step_free(&s);
    return rc;
}

void mt_run_pref_row(const mt_run *R, mt_metrics_row *row) {
    mt_pref_row_of(&R->pref->m, &row->pref);
    if (R->pref->data.skipped) row->skipped_pairs = R->pref->data.skipped;
}

int mt_run_pref_eval(mt_run *R, char *line, size_t n, mt_error *err) {
    mt_run_pref *p = R->pref;
    double t0 = mt_now_s();
    mt_pref_metrics m;
    if (mt_pref_evaluate(R->r.be, R->table.n_layers, (int)R->tc->micro_batches, &p->eval, &p->o,
                         &m, err))
        return mt_error_prefix(err, "evaluation at step %lld: ", (long long)R->step);
    mt_metrics_row row = mt_metrics_row_make(R->step);
    row.eval_loss = m.loss;
    mt_pref_row_of(&m, &row.eval_pref);
    row.eval_time_s = mt_now_s() - t0;
    if (R->mw.fd >= 0 && mt_metrics_write(&R->mw, &row, err)) return -1;
    snprintf(line, n, "eval: step %lld/%lld | loss %.4f | rewards/accuracies %.3f | "
             "rewards/margins %.4f | %lld pairs in %.1fs", (long long)R->step,
             (long long)R->total_steps, m.loss, m.accuracies, m.margins, (long long)m.pairs,
             row.eval_time_s);
    return 0;
}
