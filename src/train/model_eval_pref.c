/* `megatrain eval --objective dpo|simpo|orpo`: a preference objective's
 * metrics on held-out pairs (the trainer's evaluation, pref_eval.h), DPO's
 * against the log-probabilities of a reference model loaded beside. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/heldout.h"
#include "io/model_io.h"
#include "train/model_eval.h"
#include "train/pref_eval.h"
#include "train/pref_ref.h"

/* The train config's objective options from o's (names checked). */
static int objective_of(const mt_eval_opts *o, mt_pref_opts *po, mt_error *err) {
    mt_train_config tc;
    mt_train_config_defaults(&tc);
    if (mt_train_config_set(&tc, "objective", o->objective, "eval: objective", err) ||
        (o->loss_type && mt_train_config_set(&tc, "loss_type", o->loss_type, "eval: loss_type",
                                             err)))
        return -1;
    tc.beta = o->beta, tc.label_smoothing = o->label_smoothing, tc.gamma = o->gamma;
    tc.lambda = o->lambda;
    if (!(o->beta > 0) || !(o->label_smoothing >= 0 && o->label_smoothing < 0.5))
        return mt_errorf(err, "eval: need beta > 0 and 0 <= label_smoothing < 0.5 (got %g, %g)",
                         o->beta, o->label_smoothing);
    *po = mt_pref_opts_of(&tc);
    if (mt_pref_needs_ref(po->loss) && !(o->ref_model && o->ref_model[0]))
        return mt_errorf(err, "eval: objective dpo measures rewards against a reference model: "
                         "pass --ref-model DIR (the model before preference training)");
    return 0;
}

/* The reference model's log-probabilities of d's pairs, into d->ref. */
static int reference(const mt_loaded_model *m, const mt_eval_opts *o, int dev, int M,
                     mt_pref_data *d, mt_error *err) {
    mt_host_store rs;
    if (mt_host_store_create(&rs, &m->table, 0, err)) return -1;
    int rc = mt_model_load_weights(&rs, o->ref_model, err);
    if (rc) mt_error_prefix(err, "ref_model: ");
    mt_runner r = {0};
    mt_runner_opts ro = {.device = dev, .fp32 = o->precision && !strcmp(o->precision, "fp32")};
    int64_t resumed;
    if (rc == 0) rc = mt_runner_init(&r, &m->cfg, &m->table, &rs, M, d->o.B, d->o.T, &ro, err);
    if (rc == 0) rc = mt_pref_ref_compute(d, r.be, m->table.n_layers, M, NULL, 0, &resumed, err);
    mt_runner_free(&r);
    mt_host_store_free(&rs);
    return rc;
}

int mt_eval_model_pref(mt_loaded_model *m, const mt_eval_opts *o, int dev, int64_t T,
                       mt_eval_result *res, mt_error *err) {
    mt_pref_opts po;
    if (objective_of(o, &po, err)) return -1;
    int M = (int)o->micro_batches;
    mt_pref_data_opts dopts = {.path = o->data,
                               .chat_template = o->chat_template ? o->chat_template : "auto",
                               .skip_bad_pairs = o->skip_bad_pairs, .seed = MT_EVAL_SEED,
                               .epochs = 1, .B = o->batch_size, .T = T};
    mt_pref_data d;
    if (mt_pref_data_open(&d, &dopts, m->tok, m->cfg.V, err)) return -1;
    int rc = mt_pref_needs_ref(po.loss) ? reference(m, o, dev, M, &d, err) : 0;
    mt_runner r = {0};
    mt_runner_opts ro = {.device = dev, .fp32 = o->precision && !strcmp(o->precision, "fp32")};
    mt_pref_metrics pm;
    if (rc == 0) rc = mt_runner_init(&r, &m->cfg, &m->table, &m->store, M, o->batch_size, T, &ro, err);
    if (rc == 0) rc = mt_pref_evaluate(r.be, m->table.n_layers, M, &d, &po, &pm, err);
    if (rc == 0)
        *res = (mt_eval_result){.loss = pm.loss, .tokens = d.off[2 * d.n_pairs],
                                .batches = mt_pref_data_steps(&d, M),
                                .rewards_chosen = pm.rewards_chosen,
                                .rewards_rejected = pm.rewards_rejected,
                                .rewards_accuracies = pm.accuracies,
                                .rewards_margins = pm.margins, .logps_chosen = pm.logps_chosen,
                                .logps_rejected = pm.logps_rejected, .pairs = pm.pairs,
                                .skipped_pairs = d.skipped};
    mt_runner_free(&r);
    mt_pref_data_free(&d);
    return rc;
}
