/* gpt_neox (Pythia, GPT-NeoX-20B) on the CPU reference against Hugging Face
 * transformers, for the fixtures neox_parallel (use_parallel_residual,
 * rotary_pct 0.25, erf GELU) and neox_sequential (sequential residual,
 * rotary_pct 1.0, tanh GELU) of scripts/make_fixtures.py: logits, loss,
 * every parameter's gradient, a 5-step AdamW trajectory, save and reload;
 * and a model made by `init --model-type gpt_neox` trained on the CPU. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "megatrain.h"
#include "fixture.h"
#include "hf_check.h"
#include "testlib.h"

/* Tolerances, relative L2 error per tensor (mt_test_rel_err). Both sides
 * are fp32 on the CPU; they differ only in summation order (matmul
 * blocking, the norms' sums, which megatrain takes in double) and in libm
 * (erf, tanh, exp). For these sizes (dot products of K <= 96 terms, two
 * blocks) that is a few fp32 ulps: observed (printed by the tests) 3.5e-7
 * on the logits, 1.1e-7 on the loss, 7.2e-7 on the worst gradient tensor.
 * 1e-5 leaves over 10x margin and still fails any wrong operator, which
 * moves the result by 1e-3 or more (a wrong rotary pair or a missing
 * bias: 1e-2). */
#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-6
#define TOL_GRAD 1e-5
/* After 5 AdamW steps the gradients' rounding differences reach the
 * weights through Adam's m / sqrt(v), which magnifies them where v is
 * small; observed 6.9e-7 on weights, m and v. Weights compare with the
 * elements whose gradient is rounding noise left out (their update is lr
 * * sign(noise); docs/fixtures.md), as the Llama tests do. */
#define TOL_TRAJ 2e-5

static const mt_hf_tols tols = {.logits = TOL_LOGITS, .loss = TOL_LOSS, .grad = TOL_GRAD,
                                 .traj = TOL_TRAJ};

static const char *models[] = {"neox_parallel", "neox_sequential"};
static int model_index[] = {0, 1};

ParameterizedTestParameters(neox, logits_loss_and_gradients) {
    return cr_make_param_array(int, model_index, 2);
}

ParameterizedTest(int *which, neox, logits_loss_and_gradients) {
    mt_config c;
    mt_hf_fixture_config(models[*which], &c);
    cr_assert_eq(c.arch, MT_ARCH_GPT_NEOX);
    cr_assert_eq(c.parallel_residual, *which == 0);
    cr_assert_eq(c.rotary_dim, *which == 0 ? 4 : 16);
    mt_hf_check_forward_backward(models[*which], &tols);
}

MT_HF_FAMILY_TESTS(neox, models, model_index, tols)

/* `init --model-type gpt_neox` makes Pythia's layout (untied, NKV = NH,
 * rotary_pct 0.25), and the run trains it on the CPU and saves it. */
Test(neox, a_gpt_neox_made_by_init_trains_on_the_cpu, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), model[512];
    snprintf(model, sizeof model, "%s/model", dir);
    mt_model_shape s;
    mt_hf_tiny_shape(&s, "gpt_neox");
    mt_model_info info;
    mt_config c;
    mt_hf_init_model(model, &s, &info, &c);
    cr_assert_eq(c.arch, MT_ARCH_GPT_NEOX);
    cr_assert_eq(c.NKV, 4, "gpt_neox has no grouped kv heads: --kv-heads does not apply");
    cr_assert_not(c.tie_embeddings);
    cr_assert_eq(c.rotary_dim, 4);
    mt_hf_check_trains_on_cpu(model, dir, "gpt_neox", &c);
    cr_assert_str_eq(c.model_type, "gpt_neox");
    mt_test_rmtree(dir);
    free(dir);
}
