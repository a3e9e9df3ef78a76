/* The CPU reference against Hugging Face transformers, for every fixture
 * model made by scripts/make_fixtures.py: logits, loss, every parameter's
 * gradient (one micro-batch and two), and a 5-step AdamW trajectory with
 * warmup, weight decay and clipping that triggers. */
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
#include "io/safetensors.h"
#include "fixture.h"
#include "hf_check.h"
#include "testlib.h"

/* Tolerances. The reference is PyTorch fp32 on the CPU; we are fp32 too,
 * so differences come only from summation order (matmul blocking, softmax
 * and norm reductions) and libm. Relative error of an fp32 dot product of
 * length K in a different order is about sqrt(K) * 2^-24 ~ 1e-6 for K <=
 * 100; chained through 2 layers and the backward, observed errors are below
 * 3e-6 (logits, loss) and 2e-5 (gradients). The bounds leave 5-10x margin
 * yet catch any wrong operator (which gives errors of 1e-2 or more). */
#define TOL_LOGITS 3e-5
#define TOL_LOSS 3e-6
#define TOL_GRAD 2e-4
/* After 5 Adam steps, a 1-ulp difference in a gradient can move the update
 * m/sqrt(v) by more for tiny v; lr is 1e-2, so parameters agree to ~1e-6
 * absolute; we bound relative error over each tensor. */
#define TOL_TRAJ 2e-4

static void compare_params(mt_fixture *f, const float *array, const char *prefix, double tol,
                           const char *what) {
    mt_fixture_compare(f, array, prefix, tol, what, 0);
}

static int model_index[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
_Static_assert(sizeof model_index / sizeof *model_index == MT_FIXTURE_MODELS, "every model");

ParameterizedTestParameters(hf, logits_loss_and_gradients) {
    return cr_make_param_array(int, model_index, MT_FIXTURE_MODELS);
}

ParameterizedTest(int *which, hf, logits_loss_and_gradients) {
    mt_fixture f;
    mt_fixture_open(&f, mt_fixture_models[*which]);
    mt_error err;
    size_t N = (size_t)(f.B * f.T);
    int32_t *tok = mt_fixture_i32(&f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(&f, "targets", 0, N);

    /* One micro-batch of B rows, and B micro-batches of one row: the
     * layer-major accumulation must give the same gradients. */
    for (int split = 0; split < 2; split++) {
        int M = split ? (int)f.B : 1;
        int64_t B = split ? 1 : f.B;
        mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, M, B, f.T, &err);
        cr_assert_not_null(be, "%s", err.msg);
        mt_batch b = {.M = M, .B = B, .T = f.T, .tokens = tok, .targets = tgt};
        double loss;
        cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss, &err), 0, "%s",
                     err.msg);
        float *ref_loss = mt_fixture_f32(&f, "loss", NULL);
        cr_assert_lt(fabs(loss - ref_loss[0]) / fabs(ref_loss[0]), TOL_LOSS,
                     "%s (M=%d): loss %.8f vs HF %.8f", mt_fixture_models[*which], M, loss, ref_loss[0]);
        free(ref_loss);
        compare_params(&f, f.store.g, "grad.", TOL_GRAD, "gradient");

        if (!split) {
            /* logits of every position, after an evaluation pass */
            double sum;
            int64_t nv;
            cr_assert_eq(mt_step_eval(be, f.table.n_layers, &b, &sum, &nv, &err), 0);
            size_t nl;
            float *ref = mt_fixture_f32(&f, "logits", &nl);
            cr_assert_eq(nl, N * (size_t)f.cfg.V);
            float *ours = malloc(nl * sizeof *ours);
            for (size_t r = 0; r < N; r++)
                mt_cpu_backend_logits(be, 0, (int64_t)r, ours + r * f.cfg.V);
            double e = mt_test_rel_err(ours, ref, nl);
            cr_assert_lt(e, TOL_LOGITS, "%s: logits rel err %.3g", mt_fixture_models[*which], e);
            free(ours);
            free(ref);
        }
        mt_cpu_backend_free(be);
    }
    free(tok);
    free(tgt);
    mt_fixture_close(&f);
}

ParameterizedTestParameters(hf, five_step_adamw_trajectory) {
    return cr_make_param_array(int, model_index, MT_FIXTURE_MODELS);
}

ParameterizedTest(int *which, hf, five_step_adamw_trajectory) {
    const mt_hf_tols tols = {.grad = TOL_GRAD, .traj = TOL_TRAJ};
    mt_hf_check_trajectory(mt_fixture_models[*which], &tols);
}

/* ---- pad_token_id: nn.Embedding's padding_idx ---- */

/* Row `row` of the embedding in a store array (w, g, m or v). */
static float *embed_row(mt_fixture *f, float *array, int64_t row) {
    const mt_layer_desc *ld = &f->table.layers[0];
    return mt_layer_tensor(array + ld->offset, ld, MT_T_EMBED) + (size_t)row * (size_t)f->cfg.C;
}

/* Fixture llama_pad (pad_token_id 2, three times in each row of 16):
 * every gradient as transformers', and the pad row's exactly 0 as
 * transformers leaves it (untied: the lookup's is its only gradient). fp32
 * on both sides differs by summation order only: the observed worst
 * gradient error is 7e-7, so 1e-5 leaves a margin of 10 while a pad row
 * trained like any other puts the embedding's error at 0.9. */
#define TOL_PAD_GRAD 1e-5

Test(hf_pad, the_pad_row_gets_no_gradient_from_the_lookup) {
    mt_fixture f;
    mt_fixture_open(&f, "llama_pad");
    mt_error err;
    int64_t pad = mt_config_padding_idx(&f.cfg);
    cr_assert_eq(pad, 2, "config.json's pad_token_id");
    cr_assert_not(f.cfg.tie_embeddings);
    size_t N = (size_t)(f.B * f.T), n_pad = 0;
    int32_t *tok = mt_fixture_i32(&f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(&f, "targets", 0, N);
    for (size_t i = 0; i < N; i++) n_pad += tok[i] == pad;
    cr_assert_gt(n_pad, 1, "the pad token must occur in the inputs");
    mt_backend *be = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, 1, f.B, f.T, &err);
    cr_assert_not_null(be, "%s", err.msg);
    mt_batch b = {.M = 1, .B = f.B, .T = f.T, .tokens = tok, .targets = tgt};
    double loss;
    cr_assert_eq(mt_step_forward_backward(be, f.table.n_layers, &b, &loss, &err), 0, "%s",
                 err.msg);
    double worst = mt_fixture_compare(&f, f.store.g, "grad.", TOL_PAD_GRAD, "gradient", 0);
    cr_log_info("llama_pad: worst gradient rel err %.3g", worst);
    const float *g = embed_row(&f, f.store.g, pad);
    size_t n;
    float *ref = mt_fixture_f32(&f, "grad.model.embed_tokens.weight", &n);
    for (int64_t c = 0; c < f.cfg.C; c++) {
        cr_assert(ref[pad * f.cfg.C + c] == 0.0f, "transformers' pad row gradient [%lld]",
                  (long long)c);
        cr_assert(g[c] == 0.0f && !signbit(g[c]), "pad row gradient [%lld] = %g",
                  (long long)c, g[c]);
    }
    free(ref);
    mt_cpu_backend_free(be);
    free(tok);
    free(tgt);
    mt_fixture_close(&f);
}

/* Five AdamW steps of the fixture's trajectory with weight decay 0; true
 * when the pad row of the weights moved. */
static bool pad_row_moves(mt_fixture *f, int64_t pad) {
    mt_error err;
    mt_fixture_reset(f);
    mt_optimizer opt = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.0,
                        .max_grad_norm = 1.0f};
    opt.sched = mt_lr_schedule_make(MT_LR_CONSTANT, 1e-2, 0, 5);
    cr_assert_eq(mt_optim_cpu_init(&opt.cpu, 0, &err), 0, "%s", err.msg);
    size_t C = (size_t)f->cfg.C, N = (size_t)(f->B * f->T);
    float *before = malloc(C * sizeof *before);
    memcpy(before, embed_row(f, f->store.w, pad), C * sizeof *before);
    mt_backend *be = mt_cpu_backend_create(&f->cfg, &f->table, &f->store, 1, f->B, f->T, &err);
    cr_assert_not_null(be, "%s", err.msg);
    for (int64_t s = 0; s < 5; s++) {
        int32_t *tok = mt_fixture_i32(f, "train.input_ids", (size_t)s * N, N);
        int32_t *tgt = mt_fixture_i32(f, "train.targets", (size_t)s * N, N);
        mt_batch b = {.M = 1, .B = f->B, .T = f->T, .tokens = tok, .targets = tgt};
        double loss;
        cr_assert_eq(mt_step_forward_backward(be, f->table.n_layers, &b, &loss, &err), 0, "%s",
                     err.msg);
        mt_optim_report rep;
        mt_optimizer_step(&opt, &f->store, &rep);
        free(tok);
        free(tgt);
    }
    bool moved = memcmp(before, embed_row(f, f->store.w, pad), C * sizeof *before) != 0;
    mt_cpu_backend_free(be);
    free(before);
    return moved;
}

/* AdamW moves nothing whose gradient stays 0 when weight decay is 0 (m
 * and v stay 0, and 0 / (sqrt(0) + eps) = 0): the pad row of an untied
 * model keeps its bits through training. Without pad_token_id the same
 * data trains it like any other row. */
Test(hf_pad, the_pad_row_stays_through_training_and_moves_without_pad_token_id) {
    mt_fixture f;
    mt_fixture_open(&f, "llama_pad");
    int64_t pad = mt_config_padding_idx(&f.cfg);
    cr_assert_geq(pad, 0);
    cr_assert_not(pad_row_moves(&f, pad), "the pad row changed in training");
    f.cfg.has_pad = false;
    f.cfg.pad_id = -1;
    cr_assert(pad_row_moves(&f, pad), "without pad_token_id the row must train");
    mt_fixture_close(&f);
}
