/* Held-out pairs' metrics (pref_eval.h). */
#include "train/pref_eval.h"

#include <stdlib.h>
#include <string.h>

#include "engine/step.h"
#include "util/mem.h"

int mt_pref_evaluate(mt_backend *be, int n_layers, int M, mt_pref_data *d,
                     const mt_pref_opts *o, mt_pref_metrics *m, mt_error *err) {
    int64_t N = d->o.B * d->o.T, all = (int64_t)M * N, n;
    int32_t *buf = mt_malloc_or_die(3 * (size_t)all * sizeof *buf);
    int32_t *tok = buf, *tgt = buf + all, *pos = buf + 2 * all;
    float *logp = mt_malloc_or_die((size_t)all * sizeof *logp);
    mt_pref_pair *pairs = mt_malloc_or_die((size_t)(all / 2 + 1) * sizeof *pairs);
    mt_pref_metrics sum = {0};
    int rc = 0;
    /* file order: the same pairs in the same batches at every evaluation */
    for (int64_t i = 0; i < d->n_pairs; i++) d->order[i] = i;
    d->epoch = 0, d->next = 0;
    while (rc == 0 && !mt_pref_data_next(d, M, tok, tgt, pos, pairs, &n, NULL)) {
        mt_batch b = {.M = M, .B = d->o.B, .T = d->o.T, .tokens = tok, .targets = tgt,
                      .pos = pos};
        mt_pref_step s;
        if (mt_pref_step_init(&s, o, &b, pairs, n, err) ||
            mt_step_logp(be, n_layers, &b, logp, err)) {
            rc = -1;
            break;
        }
        mt_pref_step_score(&s, logp);
        mt_pref_metrics bm = mt_pref_step_metrics(&s);
        double k = (double)bm.pairs;
        sum.loss += bm.loss * k, sum.rewards_chosen += bm.rewards_chosen * k;
        sum.rewards_rejected += bm.rewards_rejected * k, sum.accuracies += bm.accuracies * k;
        sum.margins += bm.margins * k, sum.logps_chosen += bm.logps_chosen * k;
        sum.logps_rejected += bm.logps_rejected * k, sum.pairs += bm.pairs;
        mt_pref_step_free(&s);
    }
    mt_pref_data_rewind(d);
    free(buf), free(logp), free(pairs);
    if (rc) return -1;
    double k = sum.pairs ? (double)sum.pairs : 1.0;
    *m = (mt_pref_metrics){sum.loss / k, sum.rewards_chosen / k, sum.rewards_rejected / k,
                           sum.accuracies / k, sum.margins / k, sum.logps_chosen / k,
                           sum.logps_rejected / k, sum.pairs};
    return 0;
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

