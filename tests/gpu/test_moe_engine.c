/* The CUDA engine on mixture-of-experts models: against the transformers
 * fixtures of scripts/make_moe_fixtures.py (mixtral, qwen2_moe with a
 * shared expert and a dense block, qwen3_moe) in fp32 and bf16, with and
 * without the router's auxiliary loss, one micro-batch and two; and
 * against the CPU reference over training steps on a shape that takes the
 * bf16 fast path (flash attention, tensor-core expert products), run twice
 * for determinism (random batches: the loss need not fall in 8 steps;
 * tests/gpu/hf_roundtrip.sh trains on text and checks that it does). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "engine/step.h"
#include "fixture.h"
#include "gpu_train.h"
#include "kernels/cuda_ops.h"
#include "testlib.h"

/* fp32: TF32 off, so the GPU differs from transformers' fp32 only by
 * summation order, and the routing is the same (the fixture script keeps a
 * gap of at least 1e-4 between the K-th and (K+1)-th routing probability,
 * against ~1e-7 of fp32 differences). The CPU reference's own bounds
 * against the same fixtures (test_moe_hf.c: loss 1e-6, gradients 2e-5,
 * logits 1e-5) with the engine test's margin for GPU reductions
 * (test_engine.c: 1e-5, 2e-4; logits: MT_TEST_TOL32_LOGITS). */
#define TOL32_LOSS 1e-5
#define TOL32_GRAD 2e-4
/* bf16 against the fp32 reference: as test_engine.c's bf16 bounds (twice
 * the fixtures' own bf16-autocast distance), which a wrong operator (1e-1
 * and more) still fails. */
#define TOL16_LOSS 6e-3
#define TOL16_GRAD 6e-2

static const char *models[] = {"mixtral_moe", "qwen2_moe_shared", "qwen3_moe_qknorm"};
static int model_index[] = {0, 1, 2};

ParameterizedTestParameters(moe_engine, matches_hf) {
    return cr_make_param_array(int, model_index, 3);
}

ParameterizedTest(int *which, moe_engine, matches_hf) {
    mt_test_need_gpu();
    mt_fixture f;
    mt_fixture_open(&f, models[*which]);
    float *ref_loss = mt_fixture_f32(&f, "loss", NULL);
    float *ref_aux = mt_fixture_f32(&f, "aux.loss", NULL);
    struct { mt_gpu_precision p; int M, host; double tl, tg; } runs[] = {
        {MT_GPU_FP32, 1, 0, TOL32_LOSS, TOL32_GRAD},
        {MT_GPU_FP32, 2, 1, TOL32_LOSS, TOL32_GRAD}, /* 2 micro-batches, host checkpoints */
        {MT_GPU_BF16, 1, 0, TOL16_LOSS, TOL16_GRAD},
        {MT_GPU_BF16, 2, 1, TOL16_LOSS, TOL16_GRAD},
    };
    for (int aux = 0; aux < 2; aux++)
        for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
            f.cfg.moe.aux_loss = aux;
            double loss = mt_test_gpu_step(&f, runs[i].p, runs[i].M, runs[i].host);
            double ref = aux ? ref_aux[0] : ref_loss[0];
            cr_assert_lt(fabs(loss - ref) / ref, runs[i].tl, "%s aux=%d run %zu: loss %.7f vs HF "
                         "%.7f", models[*which], aux, i, loss, ref);
            double worst = mt_fixture_compare(&f, f.store.g, aux ? "aux.grad." : "grad.",
                                              runs[i].tg, "gradient", 0);
            cr_log_info("%s aux=%d run %zu: loss err %.2e, worst grad err %.2e", models[*which],
                        aux, i, fabs(loss - ref) / ref, worst);
        }
    free(ref_loss);
    free(ref_aux);
    mt_fixture_close(&f);
}

/* A mixtral-like shape on the fast path: head dim 64 (flash attention),
 * sizes that are multiples of the tensor-core tiles, 8 experts, top 2,
 * the aux loss on (2 micro-batches per step: the counts span both). */
static void fast_moe_config(mt_config *c) {
    mt_config_default_tiny(c);
    c->arch = MT_ARCH_MIXTRAL;
    snprintf(c->model_type, sizeof c->model_type, "mixtral");
    c->C = 256;
    c->NH = 4;
    c->NKV = 2;
    c->HD = 64;
    c->F = 384;
    c->V = 512;
    c->L = 2;
    c->max_pos = 128;
    c->tie_embeddings = false;
    c->moe = (mt_moe_config){.E = 8, .K = 2, .FE = 384, .norm_topk = true, .sparse_step = 1,
                             .aux_coef = 0.02, .aux_loss = true};
}

Test(moe_engine, training_follows_the_cpu_and_repeats_exactly, .timeout = 180) {
    mt_test_need_gpu();
    enum { S = 8 };
    mt_config cfg;
    fast_moe_config(&cfg);
    mt_error err;
    mt_param_table t;
    mt_host_store s;
    cr_assert_eq(mt_config_validate(&cfg, "test shape", &err), 0, "%s", err.msg);
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_init(&s, &t, &err), 0, "%s", err.msg);
    double cpu[S], g32[S], g16[S], g16b[S];
    struct { int gpu; mt_gpu_precision p; double *out; } runs[] = {
        {0, MT_GPU_FP32, cpu}, {1, MT_GPU_FP32, g32}, {1, MT_GPU_BF16, g16}, {1, MT_GPU_BF16, g16b},
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        mt_host_store_init_random(&s, 11, 0.05f); /* the weights; the moments start at 0 */
        memset(s.m, 0, t.total * sizeof(float));
        memset(s.v, 0, t.total * sizeof(float));
        mt_test_train(&cfg, &t, &s, 128, runs[i].gpu, runs[i].p, 0, NULL, 0, S, runs[i].out);
    }
    for (int k = 0; k < S; k++) {
        /* fp32: summation order only, amplified a little by Adam steps (as
         * test_engine.c's 1e-4 over 20 steps); bf16: its 2e-2. */
        cr_assert_lt(fabs(g32[k] - cpu[k]) / cpu[k], 1e-4, "step %d fp32 %.7f vs cpu %.7f", k,
                     g32[k], cpu[k]);
        cr_assert_lt(fabs(g16[k] - cpu[k]) / cpu[k], 2e-2, "step %d bf16 %.7f vs cpu %.7f", k,
                     g16[k], cpu[k]);
        cr_assert_eq(g16[k], g16b[k], "step %d: two identical runs differ: %.9g vs %.9g", k,
                     g16[k], g16b[k]);
        cr_log_info("step %d: cpu %.7f fp32 %.7f bf16 %.7f", k, cpu[k], g32[k], g16[k]);
    }
    mt_host_store_free(&s);
    mt_params_free(&t);
}
