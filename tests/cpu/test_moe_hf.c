/* The CPU reference's mixture-of-experts blocks against Hugging Face
 * transformers, for the fixtures of scripts/make_moe_fixtures.py (mixtral,
 * qwen2_moe with a shared expert and a dense block, qwen3_moe): logits,
 * loss and every gradient without and with the router's auxiliary loss
 * (one micro-batch and two), a 5-step AdamW trajectory with the aux loss,
 * the fused checkpoint layout, and a model trained and saved in shards by
 * megatrain that transformers loaded. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "io/model_io.h"
#include "fixture.h"
#include "testlib.h"

/* Tolerances. fp32 on both sides: differences come from summation order
 * only (as in test_model_hf.c), and the routing is the same on both sides
 * (the script asserts a gap of at least 1e-4 between the K-th and
 * (K+1)-th routing probability, against ~1e-7 of fp32 differences; a
 * different selection would change the output by 1e-2 or more). Observed
 * (the cr_log_info lines, --verbose): logits 4e-7, loss 1.3e-7, gradients
 * 1.6e-6, weights and Adam moments after 5 steps 2.2e-6 relative; the
 * bounds leave 10-25x of margin, and a missing term (the aux loss's
 * gradient, a renormalisation) gives 1e-2. */
#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-6
#define TOL_GRAD 2e-5
#define TOL_TRAJ 2e-5

static const char *models[] = {"mixtral_moe", "qwen2_moe_shared", "qwen3_moe_qknorm"};
static int model_index[] = {0, 1, 2};

static void check_loss(double loss, float ref, const char *what, const char *model, int M) {
    cr_assert_lt(fabs(loss - ref) / fabs(ref), TOL_LOSS, "%s (M=%d): %s %.8f vs HF %.8f", model,
                 M, what, loss, ref);
}

ParameterizedTestParameters(moe_hf, logits_loss_and_gradients) {
    return cr_make_param_array(int, model_index, 3);
}

ParameterizedTest(int *which, moe_hf, logits_loss_and_gradients) {
    mt_fixture f;
    mt_fixture_open(&f, models[*which]);
    cr_assert(mt_config_is_moe(&f.cfg));
    cr_assert_not(f.cfg.moe.aux_loss, "the fixtures' config.json leaves output_router_logits off");
    mt_error err;
    size_t N = (size_t)(f.B * f.T);
    int32_t *tok = mt_fixture_i32(&f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(&f, "targets", 0, N);
    float *ref_loss = mt_fixture_f32(&f, "loss", NULL);
    float *ref_aux = mt_fixture_f32(&f, "aux.loss", NULL);

    /* Without and with the aux loss; one micro-batch of B rows, and B of
     * one row: the aux loss is over the whole step, as HF's over the batch. */
    for (int aux = 0; aux < 2; aux++)
        for (int split = 0; split < 2; split++) {
            f.cfg.moe.aux_loss = aux;
            int M = split ? (int)f.B : 1;
            int64_t B = split ? 1 : f.B;
            mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, M, B, f.T, &err);
            cr_assert_not_null(be, "%s", err.msg);
            mt_batch b = {.M = M, .B = B, .T = f.T, .tokens = tok, .targets = tgt};
            double loss;
            cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss, &err), 0,
                         "%s", err.msg);
            check_loss(loss, aux ? ref_aux[0] : ref_loss[0], aux ? "loss with aux" : "loss",
                       models[*which], M);
            double ge = mt_fixture_compare(&f, f.store.g, aux ? "aux.grad." : "grad.", TOL_GRAD,
                                           aux ? "gradient with aux" : "gradient", 0);
            cr_log_info("%s aux=%d M=%d: loss rel err %.2e, worst gradient rel err %.2e",
                        models[*which], aux, M,
                        fabs(loss - (aux ? ref_aux[0] : ref_loss[0])) / (aux ? ref_aux[0] : ref_loss[0]),
                        ge);
            if (!split && !aux) {
                double sum;
                int64_t nv;
                cr_assert_eq(mt_step_eval(be, f.table.n_layers, &b, &sum, &nv, &err), 0);
                check_loss(sum / (double)nv, ref_loss[0], "eval loss (no aux)", models[*which], M);
                size_t nl;
                float *ref = mt_fixture_f32(&f, "logits", &nl);
                cr_assert_eq(nl, N * (size_t)f.cfg.V);
                float *ours = malloc(nl * sizeof *ours);
                for (size_t r = 0; r < N; r++)
                    mt_cpu_backend_logits(be, 0, (int64_t)r, ours + r * f.cfg.V);
                double e = mt_test_rel_err(ours, ref, nl);
                cr_assert_lt(e, TOL_LOGITS, "%s: logits rel err %.3g", models[*which], e);
                cr_log_info("%s: logits rel err %.2e", models[*which], e);
                free(ours);
                free(ref);
            }
            mt_cpu_backend_free(be);
        }
    free(ref_loss);
    free(ref_aux);
    free(tok);
    free(tgt);
    mt_fixture_close(&f);
}

ParameterizedTestParameters(moe_hf, five_step_adamw_trajectory_with_aux_loss) {
    return cr_make_param_array(int, model_index, 3);
}

ParameterizedTest(int *which, moe_hf, five_step_adamw_trajectory_with_aux_loss) {
    mt_fixture f;
    mt_fixture_open(&f, models[*which]);
    mt_error err;
    cJSON *hp = mt_fixture_train_json(&f);
    cr_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(hp, "router_aux_loss_in_trajectory")));
    cJSON *betas = cJSON_GetObjectItemCaseSensitive(hp, "betas");
    mt_optimizer opt = {
        .beta1 = cJSON_GetArrayItem(betas, 0)->valuedouble,
        .beta2 = cJSON_GetArrayItem(betas, 1)->valuedouble,
        .eps = mt_fixture_json_num(hp, "eps"),
        .weight_decay = mt_fixture_json_num(hp, "weight_decay"),
        .max_grad_norm = (float)mt_fixture_json_num(hp, "max_grad_norm"),
    };
    mt_lr_kind kind;
    cr_assert_eq(mt_lr_kind_parse(cJSON_GetObjectItemCaseSensitive(hp, "schedule")->valuestring,
                                  &kind, &err), 0, "%s", err.msg);
    int64_t S = (int64_t)mt_fixture_json_num(hp, "total_steps");
    opt.sched = mt_lr_schedule_make(kind, mt_fixture_json_num(hp, "lr"), (int64_t)mt_fixture_json_num(hp, "warmup_steps"), S);
    cr_assert_eq(mt_optim_cpu_init(&opt.cpu, 0, &err), 0, "%s", err.msg);
    cJSON_Delete(hp);

    f.cfg.moe.aux_loss = true;
    size_t N = (size_t)(f.B * f.T);
    mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, 1, f.B, f.T, &err);
    cr_assert_not_null(be, "%s", err.msg);
    float *losses = mt_fixture_f32(&f, "train.losses", NULL);
    float *norms = mt_fixture_f32(&f, "train.grad_norms", NULL);
    for (int64_t s = 0; s < S; s++) {
        int32_t *tok = mt_fixture_i32(&f, "train.input_ids", (size_t)s * N, N);
        int32_t *tgt = mt_fixture_i32(&f, "train.targets", (size_t)s * N, N);
        mt_batch b = {.M = 1, .B = f.B, .T = f.T, .tokens = tok, .targets = tgt};
        double loss;
        cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss, &err), 0);
        mt_optim_report rep;
        mt_optimizer_step(&opt, &f.store, &rep);
        cr_assert_lt(fabs(loss - losses[s]) / fabs(losses[s]), TOL_TRAJ,
                     "%s step %lld: loss %.7f vs HF %.7f", models[*which], (long long)s, loss,
                     losses[s]);
        cr_assert_lt(fabs(rep.grad_norm - norms[s]) / norms[s], TOL_GRAD,
                     "step %lld: grad norm %.6f vs HF %.6f", (long long)s, rep.grad_norm, norms[s]);
        free(tok);
        free(tgt);
    }
    double ew = mt_fixture_compare(&f, f.store.w, "final.", TOL_TRAJ, "weight after 5 steps", 1);
    double em = mt_fixture_compare(&f, f.store.m, "final_exp_avg.", TOL_TRAJ, "Adam m after 5 steps", 0);
    double ev = mt_fixture_compare(&f, f.store.v, "final_exp_avg_sq.", TOL_TRAJ, "Adam v after 5 steps", 0);
    cr_log_info("%s: after 5 steps, worst rel err of weights %.2e, m %.2e, v %.2e", models[*which],
                ew, em, ev);
    free(losses);
    free(norms);
    mt_cpu_backend_free(be);
    mt_fixture_close(&f);
}

/* transformers 5's save_pretrained(save_original_format=False) writes the
 * experts fused ((E, 2 FE, C) gate_up_proj, (E, C, FE) down_proj) and
 * mixtral's block under mlp.: the same weights, bit for bit. */
Test(moe_hf, the_fused_layout_loads_to_the_same_weights) {
    const char *fused[] = {"mixtral_moe", "qwen2_moe_shared"};
    for (size_t i = 0; i < 2; i++) {
        mt_fixture f;
        mt_fixture_open(&f, fused[i]);
        float *other = malloc(f.table.total * sizeof *other);
        memcpy(other, f.store.w, f.table.total * sizeof *other);
        memset(f.store.w, 0, f.table.total * sizeof *other);
        char dir[640];
        snprintf(dir, sizeof dir, "%s/fused", f.dir);
        mt_error err;
        cr_assert_eq(mt_model_load_weights(&f.store, dir, &err), 0, "%s", err.msg);
        cr_assert_eq(memcmp(other, f.store.w, f.table.total * sizeof *other), 0,
                     "%s: the fused layout gives other weights", fused[i]);
        free(other);
        mt_fixture_close(&f);
    }
}

/* A qwen3_moe made by `megatrain init`, trained 30 steps on the CPU by
 * `megatrain train --router-aux-loss` and saved in shards of 20 kB; the
 * script loaded that directory with from_pretrained and kept its logits. */
Test(moe_hf, a_trained_and_sharded_model_gives_the_logits_transformers_gives) {
    char dir[512], path[640];
    snprintf(dir, sizeof dir, "%s/models/qwen3_moe_trained", mt_test_fixtures_dir());
    mt_error err;
    mt_config cfg;
    mt_param_table t;
    mt_host_store s;
    cr_assert_eq(mt_model_load_config(&cfg, dir, &err), 0, "%s", err.msg);
    cr_assert_eq(cfg.arch, MT_ARCH_QWEN3_MOE);
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_init(&s, &t, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_model_load_weights(&s, dir, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/hf_logits.safetensors", dir);
    mt_st_file ref;
    cr_assert_eq(mt_st_open(&ref, path, &err), 0, "%s", err.msg);
    const mt_st_tensor_info *ids = mt_st_find(&ref, "input_ids"), *lg = mt_st_find(&ref, "logits");
    cr_assert(ids && lg);
    int64_t T = ids->shape[0];
    int64_t *ids64 = malloc((size_t)T * sizeof *ids64);
    cr_assert_eq(mt_st_read_i64(ids, ids64, (size_t)T, &err), 0);
    int32_t *tok = malloc((size_t)T * sizeof *tok), *tgt = malloc((size_t)T * sizeof *tgt);
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)ids64[i], tgt[i] = MT_IGNORE_INDEX;
    size_t nl = (size_t)T * (size_t)cfg.V;
    float *want = malloc(nl * sizeof *want), *ours = malloc(nl * sizeof *ours);
    cr_assert_eq(mt_st_read_f32(lg, want, nl, &err), 0, "%s", err.msg);
    mt_backend *be = mt_cpu_backend_create(&cfg, &t, &s, 1, 1, T, &err);
    cr_assert_not_null(be, "%s", err.msg);
    mt_batch b = {.M = 1, .B = 1, .T = T, .tokens = tok, .targets = tgt};
    double sum;
    int64_t nv;
    cr_assert_eq(mt_step_eval(be, t.n_layers, &b, &sum, &nv, &err), 0, "%s", err.msg);
    for (int64_t r = 0; r < T; r++) mt_cpu_backend_logits(be, 0, r, ours + r * cfg.V);
    /* the bound the script checked megatrain's own output against (fp32 on
     * both sides: summation order only) */
    double e = mt_test_rel_err(ours, want, nl);
    cr_assert_leq(e, 1e-5, "logits rel err %.3g against transformers", e);
    mt_cpu_backend_free(be);
    free(ids64);
    free(tok);
    free(tgt);
    free(want);
    free(ours);
    mt_st_close(&ref);
    mt_host_store_free(&s);
    mt_params_free(&t);
}
