/* Held-out pairs' metrics (pref_eval.h). */
#include "train/pref_eval.h"

#include <stdlib.h>
#include <string.h>

#include "engine/step.h"
#include "util/mem.h"

/* The pairs of batch b (all micro-batches) that are this rank's, scored
 * from a forward pass of its micro-batches, added to *sum. */
static int score_share(mt_backend *be, int n_layers, const mt_batch *b, const mt_pref_pair *pairs,
                       int64_t n, const mt_pref_ranks *r, const mt_pref_opts *o, float *logp,
                       mt_pref_pair *mine, mt_pref_metrics *sum, mt_error *err) {
    size_t skip = (size_t)r->mb_first * (size_t)(b->B * b->T);
    mt_batch local = {.M = r->M, .B = b->B, .T = b->T, .tokens = b->tokens + skip,
                      .targets = b->targets + skip, .pos = b->pos + skip};
    int64_t k = mt_pref_share_pairs(pairs, n, r->mb_first, r->M, mine, NULL);
    mt_pref_step s;
    if (mt_pref_step_init(&s, o, &local, mine, k, err)) return -1;
    mt_pref_step_share(&s, n, mt_pref_chosen_tokens(b, pairs, n));
    int rc = mt_step_logp(be, n_layers, &local, logp, err);
    if (rc == 0) {
        mt_pref_step_score(&s, logp);
        sum->loss += s.sum.loss, sum->rewards_chosen += s.sum.rewards_chosen;
        sum->rewards_rejected += s.sum.rewards_rejected, sum->accuracies += s.sum.accuracies;
        sum->margins += s.sum.margins, sum->logps_chosen += s.sum.logps_chosen;
        sum->logps_rejected += s.sum.logps_rejected, sum->pairs += s.sum.pairs;
    }
    mt_pref_step_free(&s);
    return rc;
}

int mt_pref_evaluate_ranks(mt_backend *be, int n_layers, int M, mt_pref_data *d,
                           const mt_pref_opts *o, const mt_pref_ranks *r, mt_pref_metrics *m,
                           mt_error *err) {
    mt_pref_ranks one = {.mb_first = 0, .M = M, .lead = 1};
    const mt_pref_ranks *share = r ? r : &one;
    int64_t N = d->o.B * d->o.T, all = (int64_t)M * N, n;
    int32_t *buf = mt_malloc_or_die(3 * (size_t)all * sizeof *buf);
    int32_t *tok = buf, *tgt = buf + all, *pos = buf + 2 * all;
    float *logp = mt_malloc_or_die((size_t)share->M * (size_t)N * sizeof *logp);
    mt_pref_pair *pairs = mt_malloc_or_die(2 * (size_t)(all / 2 + 1) * sizeof *pairs);
    mt_pref_metrics sum = {0};
    int rc = 0;
    /* file order: the same pairs in the same batches at every evaluation */
    for (int64_t i = 0; i < d->n_pairs; i++) d->order[i] = i;
    d->epoch = 0, d->next = 0;
    while (rc == 0 && !mt_pref_data_next(d, M, tok, tgt, pos, pairs, &n, NULL)) {
        mt_batch b = {.M = M, .B = d->o.B, .T = d->o.T, .tokens = tok, .targets = tgt,
                      .pos = pos};
        rc = score_share(be, n_layers, &b, pairs, n, share, o, logp, pairs + all / 2 + 1, &sum,
                         err);
    }
    mt_pref_data_rewind(d);
    free(buf), free(logp), free(pairs);
    if (rc || mt_pref_metrics_sum(r, &sum, err)) return -1;
    *m = mt_pref_metrics_mean(sum);
    return 0;
}

int mt_pref_evaluate(mt_backend *be, int n_layers, int M, mt_pref_data *d,
                     const mt_pref_opts *o, mt_pref_metrics *m, mt_error *err) {
    return mt_pref_evaluate_ranks(be, n_layers, M, d, o, NULL, m, err);
}

mt_pref_opts mt_pref_opts_of(const mt_train_config *tc) {
    static const mt_pref_loss dpo[] = {MT_PREF_SIGMOID, MT_PREF_IPO, MT_PREF_HINGE};
    mt_pref_loss l = tc->objective == MT_TC_OBJECTIVE_SIMPO ? MT_PREF_SIMPO
                     : tc->objective == MT_TC_OBJECTIVE_ORPO ? MT_PREF_ORPO
                                                             : dpo[tc->loss_type];
    return (mt_pref_opts){.loss = l, .beta = tc->beta, .label_smoothing = tc->label_smoothing,
                          .gamma = tc->gamma, .lambda = tc->lambda};
}

void mt_pref_row_of(const mt_pref_metrics *m, mt_pref_row *row) {
    *row = (mt_pref_row){m->rewards_chosen, m->rewards_rejected, m->accuracies, m->margins,
                         m->logps_chosen, m->logps_rejected};
}

