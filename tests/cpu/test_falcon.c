/* falcon on the CPU reference against Hugging Face transformers, for the
 * fixtures of scripts/make_fixtures.py: falcon_mq (Falcon-7B's
 * architecture: one LayerNorm, one kv head, tied lm_head) and
 * falcon_new_decoder (Falcon-40B/180B's: ln_attn and ln_mlp, two kv heads
 * grouped in the fused qkv, untied lm_head): logits, loss, every
 * parameter's gradient, a 5-step AdamW trajectory, save and reload; and
 * models made by `init --model-type falcon`, one trained on the CPU. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "hf_check.h"
#include "io/model_io.h"
#include "megatrain.h"
#include "testlib.h"

/* Tolerances, relative L2 error per tensor (mt_test_rel_err), as for
 * gpt_neox (test_neox.c), whose block neox.c runs: both sides are fp32 on
 * the CPU and differ only in summation order and libm, a few fp32 ulps at
 * these sizes: observed (printed by the tests) 3.0e-7 on the logits, 5.9e-8
 * on the loss, 5.4e-7 on the worst gradient tensor. 1e-5 keeps a 10x
 * margin and fails any wrong operator: Falcon-7B's LayerNorm given only the
 * MLP's gradient, not the attention's too, is off by 0.68 on the
 * embeddings' gradient. */
#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-6
#define TOL_GRAD 1e-5
/* 5 AdamW steps magnify the gradients' rounding through m / sqrt(v) where
 * v is small (observed 6.5e-7 on weights, m and v); the weights leave out
 * the elements whose gradient is rounding noise (docs/fixtures.md), as the
 * Llama and gpt_neox tests do. */
#define TOL_TRAJ 2e-5

static const mt_hf_tols tols = {.logits = TOL_LOGITS, .loss = TOL_LOSS, .grad = TOL_GRAD,
                                 .traj = TOL_TRAJ};

static const char *models[] = {"falcon_mq", "falcon_new_decoder"};
static int model_index[] = {0, 1};

ParameterizedTestParameters(falcon, logits_loss_and_gradients) {
    return cr_make_param_array(int, model_index, 2);
}

ParameterizedTest(int *which, falcon, logits_loss_and_gradients) {
    mt_config c;
    mt_hf_fixture_config(models[*which], &c);
    cr_assert_eq(c.arch, MT_ARCH_FALCON);
    cr_assert_eq(c.new_decoder, *which == 1);
    cr_assert_eq(c.NKV, *which == 1 ? 2 : 1, "multi_query: one kv head");
    cr_assert_eq(c.tie_embeddings, *which == 0);
    mt_hf_check_forward_backward(models[*which], &tols);
}

MT_HF_FAMILY_TESTS(falcon, models, model_index, tols)

/* `init --model-type falcon` makes Falcon-7B's layout with one kv head and
 * the new decoder's with more; the run trains the latter on the CPU. */
Test(falcon, a_falcon_made_by_init_trains_on_the_cpu, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), model[512];
    mt_model_shape s;
    mt_hf_tiny_shape(&s, "falcon");
    mt_model_info info;
    mt_config c;
    for (int kv = 1; kv <= 2; kv++) {
        snprintf(model, sizeof model, "%s/model%d", dir, kv);
        s.kv_heads = kv;
        mt_hf_init_model(model, &s, &info, &c);
        cr_assert_eq(c.arch, MT_ARCH_FALCON);
        cr_assert_eq(c.NKV, kv);
        cr_assert_eq(c.new_decoder, kv > 1, "one kv head: Falcon-7B's layout");
        cr_assert(c.tie_embeddings, "tied unless --untied, as FalconConfig");
    }
    mt_hf_check_trains_on_cpu(model, dir, "falcon", &c);
    cr_assert_str_eq(c.model_type, "falcon");
    cr_assert(c.new_decoder);
    mt_test_rmtree(dir);
    free(dir);
}
