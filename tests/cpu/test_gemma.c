/* gemma2 and gemma3_text on the CPU reference against Hugging Face
 * transformers, for the fixtures of scripts/make_fixtures.py:
 * gemma2_softcap (both soft-caps, query_pre_attn_scalar other than
 * head_dim, a sliding layer of 5 keys then a global one) and
 * gemma3_text_sliding (q/k norms, one kv head, a sliding layer of 6 keys on
 * its own rope base, then a global one with linearly scaled rope): logits,
 * loss, every parameter's gradient, a 5-step AdamW trajectory, save and
 * reload; and models made by `init --model-type gemma2|gemma3_text`, one
 * trained on the CPU. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>

#include "hf_check.h"
#include "io/model_io.h"
#include "megatrain.h"
#include "testlib.h"

/* Tolerances, relative L2 error per tensor (mt_test_rel_err), as for the
 * Llama family and the other CPU-only families (test_falcon.c): both sides
 * are fp32 on the CPU and differ only in summation order and libm (tanh,
 * the GELU), a few fp32 ulps at these sizes; the observed errors are
 * printed by the tests and named in docs/fixtures.md. 1e-5 keeps a 10x
 * margin over them and fails any wrong operator. */
#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-6
#define TOL_GRAD 1e-5
/* 5 AdamW steps magnify the gradients' rounding through m / sqrt(v) where
 * v is small; the weights leave out the elements whose gradient is
 * rounding noise (docs/fixtures.md), as the other families' tests do. */
#define TOL_TRAJ 2e-5

static const mt_hf_tols tols = {.logits = TOL_LOGITS, .loss = TOL_LOSS, .grad = TOL_GRAD,
                                 .traj = TOL_TRAJ};

static const char *models[] = {"gemma2_softcap", "gemma3_text_sliding"};
static int model_index[] = {0, 1};

ParameterizedTestParameters(gemma, logits_loss_and_gradients) {
    return cr_make_param_array(int, model_index, 2);
}

ParameterizedTest(int *which, gemma, logits_loss_and_gradients) {
    mt_config c;
    mt_hf_fixture_config(models[*which], &c);
    bool g3 = *which == 1;
    cr_assert_eq(c.arch, g3 ? MT_ARCH_GEMMA3_TEXT : MT_ARCH_GEMMA2);
    cr_assert(c.tie_embeddings);
    cr_assert_eq(c.qk_norm, g3);
    cr_assert_eq(c.sliding_pattern, 2, "a sliding layer, then a global one");
    cr_assert(mt_config_block_slides(&c, 0) && !mt_config_block_slides(&c, 1));
    cr_assert_lt(c.sliding_window, 16, "the window is shorter than the sequence");
    cr_assert_eq(c.attn_softcap > 0, !g3);
    cr_assert_eq(c.final_softcap > 0, !g3);
    cr_assert_eq(c.rope_kind, g3 ? MT_ROPE_LINEAR : MT_ROPE_DEFAULT);
    mt_hf_check_forward_backward(models[*which], &tols);
}

MT_HF_FAMILY_TESTS(gemma, models, model_index, tols)

/* `init --model-type gemma2|gemma3_text` makes the published configs'
 * layout with its norms at 0 (1 + w = 1); the run trains the Gemma 3 one
 * on the CPU. */
Test(gemma, a_gemma_made_by_init_trains_on_the_cpu, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), model[512];
    const char *types[] = {"gemma2", "gemma3_text"};
    mt_model_shape s;
    mt_model_info info;
    mt_config c;
    for (int i = 0; i < 2; i++) {
        snprintf(model, sizeof model, "%s/%s", dir, types[i]);
        mt_hf_tiny_shape(&s, types[i]);
        mt_hf_init_model(model, &s, &info, &c);
        cr_assert_eq(c.arch, i ? MT_ARCH_GEMMA3_TEXT : MT_ARCH_GEMMA2);
        cr_assert(c.tie_embeddings, "tied unless --untied, as the Gemma configs");
        cr_assert_eq(c.qk_norm, i == 1);
        cr_assert_float_eq(c.query_pre_attn_scalar, 16.0, 0, "head_dim");
    }
    mt_hf_check_trains_on_cpu(model, dir, "gemma3_text", &c);
    cr_assert_str_eq(c.model_type, "gemma3_text");
    cr_assert(c.qk_norm);
    mt_test_rmtree(dir);
    free(dir);
}
