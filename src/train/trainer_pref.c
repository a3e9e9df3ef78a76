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
    if (R->several && tc->ref_model[0] && tc->objective == MT_TC_OBJECTIVE_DPO)
        return mt_errorf(err, "ref_model does not run on several ranks yet: train with it in "
                         "one process (no --gpus, no launcher), or drop ref_model (the "
                         "reference is then the starting weights)");
    mt_run_pref *p = R->pref = mt_calloc_or_die(1, sizeof *R->pref);
    p->o = mt_pref_opts_of(tc);
    if (open_pairs(R, &p->data, tc->data, tc->epochs, err)) return -1;
    size_t cap = (size_t)(tc->micro_batches * tc->batch_size * tc->seq_len / 2 + 1);
    p->pairs = mt_malloc_or_die(cap * sizeof *p->pairs);
    p->mine = mt_malloc_or_die(cap * sizeof *p->mine);
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
    free(R->pref->mine);
    free(R->pref);
    R->pref = NULL;
}

static int sum_over_ranks(void *ctx, double *x, int n, mt_error *err) {
    return mt_ranks_sum(&((mt_run *)ctx)->rk, x, n, err);
}

/* This rank's share of every batch of pairs. */
static mt_pref_ranks ranks_share(mt_run *R) {
    return (mt_pref_ranks){.mb_first = R->mb_first, .M = R->M, .lead = mt_ranks_lead(&R->rk),
                           .sum = sum_over_ranks, .ctx = R};
}

/* The file of a set's reference log-probabilities in the run. */
static void ref_path(const mt_run *R, int eval, char *path, size_t n) {
    snprintf(path, n, "%s/reference_logps%s.bin", R->tc->out, eval ? "_eval" : "");
}

/* Both sets' files: read, or (a fresh start) computed with be. */
static int reference_sets(mt_run *R, mt_backend *be, uint64_t sum, mt_error *err) {
    mt_pref_ranks share = ranks_share(R);
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
        if (mt_pref_ref_compute_ranks(sets[e], be, R->table.n_layers,
                                      (int)R->tc->micro_batches, R->several ? &share : NULL,
                                      path, sum, &resumed, err))
            return -1;
        mt_emitf(&R->ev, MT_EVENT_INFO, "reference: %lld pairs' log-probabilities in %.1fs%s, "
                 "%s", (long long)sets[e]->n_pairs, mt_now_s() - t0,
                 resumed ? " (continuing a pass cut short)" : "", path);
    }
    return 0;
}

/* XXH3 of the ranks' XXH3s of their parts of the weights, in rank order:
 * the reference model's checksum on several ranks (a run of another
 * number of ranks has another). */
static int ranks_model_sum(mt_run *R, uint64_t *sum, mt_error *err) {
    int n = R->rk.env.world_size, r = R->rk.env.rank;
    double *x = mt_calloc_or_die(2 * (size_t)n, sizeof *x);
    uint64_t mine = mt_pref_ref_model_sum(R->store.w, mt_run_store_table(R)->total);
    x[2 * r] = (double)(mine >> 32), x[2 * r + 1] = (double)(mine & 0xffffffffu);
    int rc = mt_ranks_sum(&R->rk, x, 2 * n, err);
    uint64_t *all = mt_malloc_or_die((size_t)n * sizeof *all);
    for (int i = 0; i < n; i++) all[i] = (uint64_t)x[2 * i] << 32 | (uint64_t)x[2 * i + 1];
    *sum = mt_pref_ref_model_sum((const float *)all, (size_t)n * 2);
    free(x), free(all);
    return rc;
}

int mt_run_pref_reference_ranks(mt_run *R, mt_error *err) {
    if (!R->several || !R->pref || !mt_pref_needs_ref(R->pref->o.loss) || R->ckpt_dir[0])
        return 0;
    uint64_t sum;
    return ranks_model_sum(R, &sum, err) || reference_sets(R, R->r.be, sum, err) ? -1 : 0;
}

int mt_run_pref_reference(mt_run *R, int gpu, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (!R->pref || !mt_pref_needs_ref(R->pref->o.loss)) return 0;
    if (R->ckpt_dir[0]) return reference_sets(R, NULL, 0, err);
    if (R->several) return 0; /* mt_run_pref_reference_ranks, on the run's backend */
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
    mt_batch all = {.M = (int)tc->micro_batches, .B = tc->batch_size, .T = tc->seq_len,
                    .tokens = R->tokens, .targets = R->targets, .pos = R->pos};
    size_t skip = (size_t)R->mb_first * (size_t)(tc->batch_size * tc->seq_len);
    mt_batch b = {.M = R->M, .B = tc->batch_size, .T = tc->seq_len, .tokens = R->tokens + skip,
                  .targets = R->targets + skip, .pos = R->pos + skip,
                  .n_valid = R->several ? mt_batch_count_valid(&all) : 0};
    int64_t k = mt_pref_share_pairs(p->pairs, p->n_pairs, R->mb_first, R->M, p->mine, NULL);
    mt_pref_step s;
    if (mt_pref_step_init(&s, &p->o, &b, p->mine, k, err)) return -1;
    mt_pref_step_share(&s, p->n_pairs, mt_pref_chosen_tokens(&all, p->pairs, p->n_pairs));
    mt_seq_objective obj = {mt_pref_weigh, &s};
    /* several ranks finish the step together (their collectives) */
    int rc = mt_step_sequence_or_stop(R->r.be, R->table.n_layers, &b, &obj,
                                      R->several ? NULL : stop, err);
    mt_pref_metrics sum = s.sum;
    double mine = s.sum.loss / (double)p->n_pairs;
    mt_pref_step_free(&s);
    mt_pref_ranks share = ranks_share(R);
    if (rc == 0 && R->several && mt_pref_metrics_sum(&share, &sum, err)) rc = -1;
    p->m = mt_pref_metrics_mean(sum);
    /* the trainer adds the ranks' losses: each gives its part of the mean */
    *loss = R->several ? mine : p->m.loss;
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
    mt_pref_ranks share = ranks_share(R);
    if (mt_pref_evaluate_ranks(R->r.be, R->table.n_layers, (int)R->tc->micro_batches, &p->eval,
                               &p->o, R->several ? &share : NULL, &m, err))
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
