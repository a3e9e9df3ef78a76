/* Preference objectives on the CPU: the answers' log-probabilities, each
 * objective's loss, metrics and gradients against TRL's loss functions run
 * by PyTorch on the same packed pairs (scripts/make_preference_fixture.py,
 * llama_gqa's preference.safetensors, computed in float64): the gradient
 * with respect to every token's log-probability, and the parameter
 * gradients the fixture holds (every norm's, which the whole backward
 * reaches, and one matrix's). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "engine/preference.h"
#include "engine/step.h"
#include "fixture.h"
#include "testlib.h"

enum { M = 2, B = 2, T = 16, P = 4 };
/* fp32 against an exact (float64) reference: a log-probability sums a few
 * tokens' log-softmax, each good to a few ulp of its logits' size */
#define TOL_LOGP 1e-5
#define TOL_LOSS 1e-5
/* relative L2 per tensor: the gradients pass through the whole model in
 * fp32 (the SFT fixtures allow 2e-4; float64 references leave only our
 * own rounding) */
#define TOL_GRAD 1e-5

/* The objectives of the fixture, as the script's CONFIGS. */
static const struct {
    const char *name;
    mt_pref_opts o;
} configs[] = {
    {"sigmoid", {MT_PREF_SIGMOID, .beta = 0.5, .label_smoothing = 0.1}},
    {"ipo", {MT_PREF_IPO, .beta = 0.5}},
    {"hinge", {MT_PREF_HINGE, .beta = 1.0}},
    {"simpo", {MT_PREF_SIMPO, .beta = 2.0, .label_smoothing = 0.05, .gamma = 0.5}},
    {"orpo", {MT_PREF_ORPO, .lambda = 0.3}},
};

typedef struct pref_fixture {
    mt_fixture f;
    int32_t *tok, *tgt, *pos;
    mt_batch b;
    mt_pref_pair pairs[P];
    mt_backend *be;
} pref_fixture;

static void open_pref(pref_fixture *p) {
    mt_fixture_open(&p->f, "llama_gqa");
    mt_fixture_use_ref(&p->f, "preference.safetensors");
    size_t n = (size_t)M * B * T;
    p->tok = mt_fixture_i32(&p->f, "input_ids", 0, n);
    p->tgt = mt_fixture_i32(&p->f, "targets", 0, n);
    p->pos = mt_fixture_i32(&p->f, "position_ids", 0, n);
    p->b = (mt_batch){.M = M, .B = B, .T = T, .tokens = p->tok, .targets = p->tgt, .pos = p->pos};
    int32_t *sp = mt_fixture_i32(&p->f, "spans", 0, P * 2 * 3);
    float *ref = mt_fixture_f32(&p->f, "ref_logps", NULL);
    for (int i = 0; i < P; i++) {
        const int32_t *c = sp + i * 6, *r = c + 3;
        p->pairs[i] = (mt_pref_pair){{c[0], c[1], c[2]}, {r[0], r[1], r[2]}, ref[2 * i],
                                     ref[2 * i + 1]};
    }
    free(sp), free(ref);
    mt_error err;
    p->be = mt_cpu_backend_create(&p->f.cfg, &p->f.table, &p->f.store, M, B, T, &err);
    cr_assert_not_null(p->be, "%s", err.msg);
}

static void close_pref(pref_fixture *p) {
    p->be->ops->destroy(p->be);
    free(p->tok), free(p->tgt), free(p->pos);
    mt_fixture_close(&p->f);
}

/* The parameter gradients of the fixture under prefix (it holds some
 * tensors only) against the store's; returns the worst relative error. */
static double compare_grads(mt_fixture *f, const char *prefix) {
    double worst = 0;
    int seen = 0;
    for (int l = 0; l < f->table.n_layers; l++) {
        const mt_layer_desc *ld = &f->table.layers[l];
        for (int k = 0; k < ld->n_tensors; k++) {
            const mt_tensor_desc *td = &ld->tensors[k];
            char key[160];
            snprintf(key, sizeof key, "%s%s", prefix, td->name);
            if (!mt_st_find(&f->ref, key)) continue;
            size_t n;
            float *ref = mt_fixture_f32(f, key, &n);
            cr_assert_eq(n, td->numel, "size of %s", key);
            double e = mt_test_rel_err(f->store.g + ld->offset + td->offset, ref, n);
            cr_assert_lt(e, TOL_GRAD, "%s: rel err %.3g", key, e);
            worst = fmax(worst, e);
            seen++;
            free(ref);
        }
    }
    cr_assert_geq(seen, 6, "%s: the fixture's gradients (norms, one matrix)", prefix);
    return worst;
}

/* mt_pref_weigh, keeping each micro-batch's weights */
typedef struct kept_weigh {
    mt_pref_step *s;
    float w[M * B * T];
} kept_weigh;

static int weigh_and_keep(void *ctx, int mb, const float *logp, float *w, mt_error *err) {
    kept_weigh *k = ctx;
    int rc = mt_pref_weigh(k->s, mb, logp, w, err);
    memcpy(k->w + (size_t)mb * B * T, w, B * T * sizeof *w);
    return rc;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

Test(preference, answer_logps_match_pytorch) {
    pref_fixture p;
    open_pref(&p);
    float *logp = malloc((size_t)M * B * T * sizeof *logp), *ref = mt_fixture_f32(&p.f, "logps", NULL);
    mt_error err;
    cr_assert_eq(mt_step_logp(p.be, p.f.table.n_layers, &p.b, logp, &err), 0, "%s", err.msg);
    for (int i = 0; i < P; i++)
        for (int a = 0; a < 2; a++) {
            mt_pref_span sp = a ? p.pairs[i].rejected : p.pairs[i].chosen;
            size_t off = (size_t)sp.mb * B * T;
            double got = mt_pref_span_logp(logp + off, p.tgt + off, sp);
            cr_assert_lt(rel(got, ref[2 * i + a]), TOL_LOGP, "pair %d answer %d: %.8f vs %.8f",
                         i, a, got, ref[2 * i + a]);
        }
    free(logp), free(ref);
    close_pref(&p);
}

/* metrics in the script's order */
static void check_metrics(const mt_pref_metrics *m, const float *ref, const char *name) {
    double got[7] = {m->loss, m->rewards_chosen, m->rewards_rejected, m->accuracies,
                     m->margins, m->logps_chosen, m->logps_rejected};
    static const char *what[7] = {"loss", "rewards/chosen", "rewards/rejected",
                                  "rewards/accuracies", "rewards/margins", "logps/chosen",
                                  "logps/rejected"};
    for (int k = 0; k < 7; k++)
        cr_assert_lt(fabs(got[k] - ref[k]), TOL_LOSS * fmax(1.0, fabs(ref[k])),
                     "%s: %s %.8f vs %.8f", name, what[k], got[k], ref[k]);
}

Test(preference, losses_metrics_and_gradients_match_trl) {
    pref_fixture p;
    open_pref(&p);
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        const char *name = configs[c].name;
        char key[64];
        mt_pref_step s;
        mt_error err;
        cr_assert_eq(mt_pref_step_init(&s, &configs[c].o, &p.b, p.pairs, P, &err), 0, "%s",
                     err.msg);
        kept_weigh kw = {&s, {0}};
        mt_seq_objective obj = {weigh_and_keep, &kw};
        cr_assert_eq(mt_step_sequence_or_stop(p.be, p.f.table.n_layers, &p.b, &obj, NULL, &err),
                     0, "%s", err.msg);
        mt_pref_metrics m = mt_pref_step_metrics(&s);
        snprintf(key, sizeof key, "%s.loss", name);
        float *loss = mt_fixture_f32(&p.f, key, NULL);
        cr_assert_lt(rel(m.loss, loss[0]), TOL_LOSS, "%s: loss %.8f vs %.8f", name, m.loss,
                     loss[0]);
        snprintf(key, sizeof key, "%s.metrics", name);
        float *met = mt_fixture_f32(&p.f, key, NULL);
        check_metrics(&m, met, name);
        /* the token weights are the loss's derivatives in -logp */
        snprintf(key, sizeof key, "%s.dlogp", name);
        float *dlogp = mt_fixture_f32(&p.f, key, NULL);
        for (int i = 0; i < M * B * T; i++) dlogp[i] = -dlogp[i];
        double ew = mt_test_rel_err(kw.w, dlogp, M * B * T);
        cr_assert_lt(ew, TOL_GRAD, "%s: token weights rel err %.3g", name, ew);
        snprintf(key, sizeof key, "%s.grad.", name);
        double e = compare_grads(&p.f, key);
        cr_log_info("%s: loss rel err %.2g, token weights %.2g, worst gradient %.2g", name,
                    rel(m.loss, loss[0]), ew, e);
        free(dlogp);
        mt_pref_step_free(&s);

        /* evaluation: the same metrics from a forward pass alone */
        float *logp = malloc((size_t)M * B * T * sizeof *logp);
        cr_assert_eq(mt_pref_step_init(&s, &configs[c].o, &p.b, p.pairs, P, &err), 0);
        cr_assert_eq(mt_step_logp(p.be, p.f.table.n_layers, &p.b, logp, &err), 0, "%s", err.msg);
        mt_pref_step_score(&s, logp);
        mt_pref_metrics me = mt_pref_step_metrics(&s);
        check_metrics(&me, met, name);
        mt_pref_step_free(&s);
        free(logp), free(loss), free(met);
    }
    close_pref(&p);
}

Test(preference, an_answer_without_targets_is_refused) {
    pref_fixture p;
    open_pref(&p);
    mt_pref_pair bad = p.pairs[1];
    bad.rejected.end = bad.rejected.start; /* empty */
    mt_pref_step s;
    mt_error err = {{0}};
    mt_pref_opts o = {MT_PREF_SIGMOID, .beta = 0.1};
    cr_assert_eq(mt_pref_step_init(&s, &o, &p.b, &bad, 1, &err), -1);
    cr_assert(strstr(err.msg, "rejected"), "%s", err.msg);
    bad = p.pairs[1];
    bad.rejected.start = 0, bad.rejected.end = 1; /* a prompt token: no target */
    cr_assert_eq(mt_pref_step_init(&s, &o, &p.b, &bad, 1, &err), -1);
    cr_assert(strstr(err.msg, "no token with a target"), "%s", err.msg);
    bad = p.pairs[1];
    bad.rejected.mb = 1 - bad.chosen.mb;
    cr_assert_eq(mt_pref_step_init(&s, &o, &p.b, &bad, 1, &err), -1);
    close_pref(&p);
}

Test(preference, loss_names_round_trip) {
    for (int l = MT_PREF_SIGMOID; l <= MT_PREF_ORPO; l++)
        cr_assert_eq(mt_pref_loss_parse(mt_pref_loss_name((mt_pref_loss)l)), l);
    cr_assert_eq(mt_pref_loss_parse("kto"), -1);
    cr_assert(mt_pref_needs_ref(MT_PREF_IPO) && !mt_pref_needs_ref(MT_PREF_ORPO));
}
