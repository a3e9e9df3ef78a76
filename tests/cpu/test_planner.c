/* The placement planner, on the CPU (it only counts bytes and models
 * time): plans stay within both budgets, a short host moves checkpoints
 * to the GPU, rebuilds every other one in the backward, moves gradients
 * to the GPU and rounds host gradients to bf16 only
 * when fp32 cannot fit, a GPU too small for the smallest placement is
 * refused naming that budget, the step model rewards kept layers,
 * gpt_neox's and falcon's blocks keep theirs, and Gemma's its down
 * projection's output where the GPU has room. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"
#include "plan_check.h"
#include "testlib.h"
#include "model/presets.h"

static void plan_8b_mb(mt_test_planned *x, double gpu_gb, double host_gb, int grad_dtype, int M,
                       int64_t B) {
    mt_test_request_8b(x, 2048, M, B);
    x->q.gpu_budget = gpu_gb * 1e9;
    x->q.host_budget = host_gb * 1e9;
    x->q.host_grad_dtype = grad_dtype;
    mt_test_replan(x);
}

/* 64k tokens per step as 4 micro-batches of 8 rows. */
static void plan_8b(mt_test_planned *x, double gpu_gb, double host_gb, int grad_dtype) {
    plan_8b_mb(x, gpu_gb, host_gb, grad_dtype, 4, 8);
}

static int count_gpu_grads(const mt_plan *p) {
    int n = 0;
    for (int l = 0; l < p->n_layers; l++) n += !p->homes[l].grad_host;
    return n;
}

/* The H100 case of the issue: 80 GB GPU, 125 GiB host. */
Test(planner, eight_b_fits_an_80_gb_gpu_within_both_budgets) {
    mt_test_planned x;
    plan_8b(&x, 79, 129.7, -1);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_leq(x.p.gpu_bytes, x.q.gpu_budget);
    cr_assert_leq(x.p.host_bytes, x.q.host_budget);
    cr_assert_gt(x.p.pred.step, 0);
    mt_test_planned_free(&x);
}

/* A host that cannot hold fp32 gradients for every layer: the planner
 * keeps some on the GPU (exact) when the GPU has room ... */
Test(planner, short_host_moves_gradients_to_a_roomy_gpu_before_rounding) {
    mt_test_planned x;
    plan_8b(&x, 139, 112, -1);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_eq(x.p.host_grad_bf16, 0, "fp32 fits with GPU gradients: no rounding");
    cr_assert_gt(count_gpu_grads(&x.p), 0);
    cr_assert_leq(x.p.host_bytes, x.q.host_budget);
    mt_test_planned_free(&x);
}

/* ... and rounds them to bf16 when no fp32 placement fits: at most 14 host
 * bytes per parameter for the model state and gradients. */
Test(planner, no_fp32_placement_fits_so_host_gradients_are_bf16) {
    mt_test_planned x;
    plan_8b(&x, 60, 118, -1);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_eq(x.p.host_grad_bf16, 1);
    double grads_host = 0;
    for (int l = 0; l < x.p.n_layers; l++)
        if (x.p.homes[l].grad_host) grads_host += 2.0 * x.t.layers[l].numel;
    cr_assert_leq((x.p.store_bytes + grads_host) / x.t.n_params, 14.0 + 1e-9);
    mt_test_planned_free(&x);
}

Test(planner, a_gpu_below_the_smallest_placement_is_refused_naming_it) {
    mt_test_planned x;
    plan_8b(&x, 24, 129.7, -1);
    cr_assert_not(x.p.fits);
    cr_assert(strstr(x.p.why, "GPU budget short by"), "%s", x.p.why);
    mt_test_planned_free(&x);
}

/* The --gpu-mem 24 case on the H200's host (125 GiB less the margin):
 * neither budget holds the 31 checkpoints of 1.07 GB beside the store and
 * the bf16 gradients, so every other host checkpoint is rebuilt in the
 * backward from the one before it, at the cost of a layer forward each. */
Test(planner, short_budgets_rebuild_checkpoints_instead_of_refusing) {
    mt_test_planned x;
    plan_8b_mb(&x, 24, 128.8, -1, 32, 1);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_leq(x.p.gpu_bytes, x.q.gpu_budget);
    cr_assert_leq(x.p.host_bytes, x.q.host_budget);
    int nl = x.p.n_layers, rebuilt = 0;
    mt_layer_home *h = x.p.homes;
    for (int l = 2; l < nl - 2; l++) {
        if (!h[l].saved_recompute) continue;
        rebuilt++;
        cr_assert_not(h[l - 1].saved_recompute, "layer %d rebuilt from a rebuilt layer %d", l,
                      l - 1);
        cr_assert_not(h[l].saved_host, "layer %d: rebuilt and on the host", l);
    }
    cr_assert_gt(rebuilt, 0);
    /* the rebuilt inputs cost time: keeping them (were there room) is faster */
    mt_layer_home *kept = malloc((size_t)nl * sizeof *kept);
    memcpy(kept, h, (size_t)nl * sizeof *kept);
    for (int l = 2; l < nl - 2; l++) kept[l].saved_recompute = 0;
    mt_plan with_kept = x.p;
    with_kept.homes = kept;
    mt_step_prediction a = mt_plan_predict(&x.q, &x.p);
    mt_step_prediction b = mt_plan_predict(&x.q, &with_kept);
    cr_assert_gt(a.compute, b.compute);
    free(kept);
    mt_test_planned_free(&x);
}

/* The 20B-class shape on one H200 of a 256 GiB host (less the margin):
 * the store alone is 243.6 GB, so most gradients must wait on the GPU, and
 * GPU checkpoints are rebuilt in the backward to make room for them. */
Test(planner, a_20b_model_fits_one_h200_and_256_gib_by_rebuilding_gpu_checkpoints) {
    mt_error err;
    mt_config cfg;
    mt_param_table t;
    mt_preset_config(mt_preset_find("20b"), 2048, &cfg);
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    mt_plan_request q = {.cfg = &cfg, .t = &t, .M = 4, .B = 8, .T = 2048,
                         .precision = MT_GPU_BF16, .gpu_budget = 139e9, .host_budget = 263e9,
                         .host_grad_dtype = -1, .keep_layers = -1,
                             .device_optim = -1};
    mt_rates_default(&q.rates);
    mt_plan p;
    cr_assert_eq(mt_plan_make(&q, &p, &err), 0, "%s", err.msg);
    cr_assert(p.fits, "%s", p.why);
    cr_assert_leq(p.gpu_bytes, q.gpu_budget);
    cr_assert_leq(p.host_bytes, q.host_budget);
    cr_assert_gt(count_gpu_grads(&p), 0);
    int rebuilt_gpu_neighbours = 0;
    for (int l = 2; l < p.n_layers - 2; l++)
        rebuilt_gpu_neighbours += p.homes[l].saved_recompute && !p.homes[l - 1].saved_host;
    cr_assert_gt(rebuilt_gpu_neighbours, 0, "no GPU checkpoint was rebuilt for room");
    cr_assert_leq((p.store_bytes + p.pinned_bytes) / (double)t.n_params, 14.0);
    mt_plan_free(&p);
    mt_params_free(&t);
}

Test(planner, a_host_below_the_store_is_refused_naming_both_budgets) {
    mt_test_planned x;
    plan_8b(&x, 139, 90, -1);
    cr_assert_not(x.p.fits);
    cr_assert(strstr(x.p.why, "host needs"), "%s", x.p.why);
    mt_test_planned_free(&x);
}

Test(planner, kept_layers_and_gpu_checkpoints_never_slow_the_model_down) {
    mt_test_planned x;
    plan_8b(&x, 139, 129.7, -1);
    mt_plan v = x.p; /* its homes; fp32 host gradients, no device layers, full units */
    v.host_grad_bf16 = v.n_dev = v.lean_keep = 0;
    v.n_keep = 0;
    mt_step_prediction none = mt_plan_predict(&x.q, &v);
    v.n_keep = 8;
    mt_step_prediction some = mt_plan_predict(&x.q, &v);
    cr_assert_lt(some.step, none.step, "8 kept layers %.3f s vs none %.3f s", some.step,
                 none.step);
    /* a slower PCIe can only lengthen the step */
    x.q.rates.h2d_gbs = x.q.rates.d2h_gbs = 5;
    mt_step_prediction slow = mt_plan_predict(&x.q, &v);
    cr_assert_gt(slow.step, some.step);
    mt_test_planned_free(&x);
}

/* With room on the GPU, the layers the next forward needs first keep their
 * optimizer state there (their gradients too), which the model rewards:
 * the step's start no longer waits for their CPU update and copies. None
 * when the request says none. */
Test(planner, a_roomy_gpu_updates_the_first_layers_there) {
    mt_test_planned x;
    plan_8b(&x, 139, 129.7, -1);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_geq(x.p.n_dev, 1, "the embedding's update stays on the CPU");
    for (int l = 0; l < x.p.n_dev; l++)
        cr_assert_not(x.p.homes[l].grad_host, "device layer %d's gradient on the host", l);
    mt_plan v = x.p;
    v.host_grad_bf16 = 0;
    mt_step_prediction with = mt_plan_predict(&x.q, &v);
    v.n_dev = 0;
    mt_step_prediction without = mt_plan_predict(&x.q, &v);
    cr_assert_lt(with.step, without.step, "%.3f s with vs %.3f s without", with.step,
                 without.step);
    cr_assert_leq(x.p.gpu_bytes, x.q.gpu_budget);
    /* the GPU holds a third of the layers' activations: lean units (the
     * mid-block residual rebuilt) let more of them skip the recompute */
    cr_assert(x.p.lean_keep, "kept units are full with %d of 32 kept", x.p.n_keep);
    mt_test_planned_free(&x);
    mt_test_request(&x, "8b", 2048, 4, 8, 139e9, 129.7e9);
    x.q.device_optim = 0;
    mt_test_replan(&x);
    cr_assert_eq(x.p.n_dev, 0);
    mt_test_planned_free(&x);
}

/* megatrain calibrate's file: what is saved is what is loaded; a broken
 * file names the field. */
/* Where every layer fits whole, lean units would only add the rebuild. */
Test(planner, lean_kept_units_only_when_memory_binds) {
    mt_test_planned x;
    mt_test_request(&x, "1b", 2048, 4, 8, 139e9, 129.7e9);
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_eq(x.p.n_keep, (int)x.cfg.L);
    cr_assert_not(x.p.lean_keep);
    mt_test_planned_free(&x);
}

Test(planner, calibration_files_round_trip_and_bad_ones_are_refused) {
    char *dir = mt_test_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/rates.json", dir);
    mt_rates r, back;
    mt_error err;
    mt_rates_default(&r);
    r.h2d_gbs = 51.5;
    r.layer_fwd_s = 0.0472;
    r.probe_V = 16384;
    cr_assert_eq(mt_rates_save(&r, path, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_rates_load(&back, path, &err), 0, "%s", err.msg);
    cr_assert_eq(back.h2d_gbs, 51.5);
    cr_assert_eq(back.layer_fwd_s, 0.0472);
    cr_assert_eq(back.probe_V, 16384);
    FILE *f = fopen(path, "w");
    fputs("{\"h2d_gbs\": \"fast\"}", f);
    fclose(f);
    cr_assert_neq(mt_rates_load(&back, path, &err), 0);
    cr_assert(strstr(err.msg, "h2d_gbs"), "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}
/* The dense Qwen presets carry their architecture: parameter counts equal
 * those of the published checkpoints (model.safetensors.index.json
 * total_size / 2 bytes: 15231233024 for Qwen2.5-7B, 16381470720 for
 * Qwen3-8B), qkv biases or q/k norms, and they plan like Llama shapes. */
Test(planner, qwen_presets_have_the_published_shapes) {
    static const struct { const char *name; int64_t params; int bias, qk_norm; } want[] = {
        {"qwen2.5-7b", 7615616512, 1, 0},
        {"qwen3-8b", 8190735360, 0, 1},
    };
    for (int i = 0; i < 2; i++) {
        mt_error err;
        mt_config cfg;
        mt_param_table t;
        mt_preset_config(mt_preset_find(want[i].name), 2048, &cfg);
        cr_assert_eq(mt_config_validate(&cfg, want[i].name, &err), 0, "%s", err.msg);
        cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
        cr_assert_eq(t.n_params, want[i].params, "%s: %lld", want[i].name,
                     (long long)t.n_params);
        cr_assert_eq(cfg.qkv_bias, want[i].bias);
        cr_assert_eq(cfg.qk_norm, want[i].qk_norm);
        mt_plan_request q = {.cfg = &cfg, .t = &t, .M = 4, .B = 8, .T = 2048,
                             .precision = MT_GPU_BF16, .gpu_budget = 139e9,
                             .host_budget = 125.0 * (1 << 30), .host_grad_dtype = -1,
                             .keep_layers = -1,
                             .device_optim = -1};
        mt_rates_default(&q.rates);
        mt_plan p;
        cr_assert_eq(mt_plan_make(&q, &p, &err), 0, "%s", err.msg);
        cr_assert(p.fits, "%s: %s", want[i].name, p.why);
        cr_assert_gt(p.n_keep, 0, "%s: the bf16 fast path keeps activations", want[i].name);
        mt_plan_free(&p);
        mt_params_free(&t);
    }
}

/* The Qwen3-30B-A3B shape (128 experts, top 8) with 12 of its 48 blocks on
 * one H200 of a 125 GiB host: the layers are 0.62B parameters each, so a
 * slot and an accumulator are large, and the model TFLOPS count only the
 * active parameters (docs/moe.md). */
Test(planner, twelve_qwen3_30b_a3b_blocks_fit_one_h200_and_125_gib) {
    mt_error err;
    mt_config cfg;
    mt_param_table t;
    mt_preset_config(mt_preset_find("qwen3-30b-a3b"), 2048, &cfg);
    cfg.L = 12;
    cr_assert(mt_config_is_moe(&cfg));
    cr_assert_eq(mt_config_validate(&cfg, "qwen3-30b-a3b", &err), 0, "%s", err.msg);
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_gt(t.max_layer_numel, (size_t)600000000);
    mt_plan_request q = {.cfg = &cfg, .t = &t, .M = 4, .B = 8, .T = 2048,
                         .precision = MT_GPU_BF16, .gpu_budget = 139e9, .host_budget = 125.0 * (1 << 30),
                         .host_grad_dtype = -1, .keep_layers = -1,
                             .device_optim = -1};
    mt_rates_default(&q.rates);
    mt_plan p;
    cr_assert_eq(mt_plan_make(&q, &p, &err), 0, "%s", err.msg);
    cr_assert(p.fits, "%s", p.why);
    cr_assert_leq(p.gpu_bytes, q.gpu_budget);
    cr_assert_leq(p.host_bytes, q.host_budget);
    cr_assert_eq(p.n_keep, 0, "MoE blocks keep no activations");
    mt_plan_free(&p);
    mt_params_free(&t);
}

/* The described GPUs: h200 is the defaults, every entry has its memory and
 * positive rates, and the host's rates stay the defaults'. */
Test(planner, the_gpu_table_describes_every_named_gpu) {
    mt_rates def, r;
    mt_rates_default(&def);
    const mt_gpu_spec *h200 = mt_gpu_spec_find("H200");
    cr_assert_not_null(h200);
    mt_rates_for_gpu(&r, h200);
    cr_assert(r.gemm_tflops == def.gemm_tflops && r.attn_fwd_tflops == def.attn_fwd_tflops &&
              r.attn_bwd_tflops == def.attn_bwd_tflops && r.h2d_gbs == def.h2d_gbs &&
              r.d2h_gbs == def.d2h_gbs && r.hbm_gbs == def.hbm_gbs);
    const char *names[] = {"h100", "h200", "a100", "l40s", "4090"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const mt_gpu_spec *g = mt_gpu_spec_find(names[i]);
        cr_assert_not_null(g, "%s", names[i]);
        cr_assert(strstr(mt_gpu_spec_names(), names[i]) != NULL);
        mt_rates_for_gpu(&r, g);
        cr_assert(g->mem_gb > 0 && r.gemm_tflops > 0 && r.attn_fwd_tflops > 0 &&
                  r.attn_bwd_tflops > 0 && r.h2d_gbs > 0 && r.d2h_gbs > 0 && r.hbm_gbs > 0,
                  "%s", names[i]);
        cr_assert(r.adam_gparams == def.adam_gparams && r.duplex == def.duplex);
    }
    cr_assert_null(mt_gpu_spec_find("v100"));
}

/* A rank of four: its store is a quarter of the model's, only non-device
 * layers' gradients wait on the host, the prediction counts the
 * collectives, and the same request for one GPU predicts no collectives. */
Test(planner, a_rank_of_four_plans_its_quarter_and_the_collectives) {
    mt_error err;
    mt_test_planned one, four;
    plan_8b(&one, 79, 129.7, -1);
    four.cfg = one.cfg;
    cr_assert_eq(mt_params_init(&four.t, &four.cfg, &err), 0, "%s", err.msg);
    four.q = one.q;
    four.q.cfg = &four.cfg;
    four.q.t = &four.t;
    four.q.ranks = 4;
    four.q.rank = 0;
    four.q.host_budget = 129.7e9 / 4; /* the machine's budget shared by its ranks */
    cr_assert_eq(mt_plan_make(&four.q, &four.p, &err), 0, "%s", err.msg);
    cr_assert(four.p.fits, "%s", four.p.why);
    /* rank 0's parts hold a quarter of the model, the first ranks' parts being whole chunks */
    cr_assert(four.p.store_bytes > one.p.store_bytes / 4 * 0.99 &&
              four.p.store_bytes < one.p.store_bytes / 4 * 1.01,
              "store %.2f GB, one GPU's %.2f GB", four.p.store_bytes / 1e9,
              one.p.store_bytes / 1e9);
    for (int l = four.p.n_dev; l < four.p.n_layers; l++)
        cr_assert(four.p.homes[l].grad_host, "layer %d: a rank's reduced part waits on the host", l);
    cr_assert_eq(one.p.pred.coll_busy, 0);
    /* 2 all-gathers and a reduce-scatter of the 8B's layers (8.03B params, fp32, 3/4 of each
     * arriving at 300 GB/s), less the resident turns' */
    double want = 3 * 8.03e9 * 4 * 0.75 / 300e9;
    cr_assert(four.p.pred.coll_busy > 0.8 * want && four.p.pred.coll_busy < 1.05 * want,
              "collectives %.3f s, about %.3f expected", four.p.pred.coll_busy, want);
    mt_test_planned_free(&one);
    mt_test_planned_free(&four);
}

/* Pythia-6.9B and Falcon-7B at 64k tokens on an 80 GB GPU: the blocks keep
 * activations where they fit (full units: theirs have no lean form), and a
 * kept layer costs what its units hold: per token the LayerNorms'
 * statistics, q, k, v and the attention's output in bf16, the lse and the
 * GELU's input in bf16 (a parallel block keeps no mid-block residual),
 * each buffer rounded up to 256 bytes. */
Test(planner, pythia_and_falcon_blocks_keep_their_activations) {
    const char *names[] = {"pythia-6.9b", "falcon-7b"};
    for (int i = 0; i < 2; i++) {
        mt_test_planned x;
        mt_test_request(&x, names[i], 2048, 4, 8, 79e9, 500e9);
        mt_test_replan(&x);
        cr_assert(x.p.fits, "%s: %s", names[i], x.p.why);
        cr_assert_gt(x.p.n_keep, 0, "%s keeps no layer", names[i]);
        cr_assert_not(x.p.lean_keep, "%s: lean units", names[i]);
        cr_assert_leq(x.p.gpu_bytes, x.q.gpu_budget);
        const mt_config *c = &x.cfg;
        mt_cuda_backend_opts none = {.precision = MT_GPU_BF16},
                             two = {.precision = MT_GPU_BF16, .keep_layers = 2};
        size_t b0 = mt_cuda_backend_bytes(c, &x.t, 4, 8, 2048, &none);
        size_t b2 = mt_cuda_backend_bytes(c, &x.t, 4, 8, 2048, &two);
        size_t N = 8 * 2048, Q = (size_t)(c->NH * c->HD), KV = (size_t)(c->NKV * c->HD);
        size_t unit = N * (16 + (2 * Q + 2 * KV) * 2 + (size_t)c->NH * 4 + (size_t)c->F * 2);
        cr_assert(c->parallel_residual);
        cr_assert_geq(b2 - b0, 2 * 4 * unit, "%s: %zu bytes for 8 units of %zu", names[i],
                      b2 - b0, unit);
        cr_assert_leq(b2 - b0, 2 * 4 * (unit + 11 * 256) + 256, "%s: %zu bytes for 8 units of %zu",
                      names[i], b2 - b0, unit);
        mt_test_planned_free(&x);
    }
}

/* Gemma's recompute runs the down projection (its post-norm's backward
 * reads the output): with room on the GPU the plan keeps that output for
 * layers before the kept ones (a quarter of the recompute's products for
 * N * C bf16 values and N floats a micro-batch), the model rewards it, and the backend
 * counts those bytes. Other blocks' recompute stops before the product:
 * they keep none. */
Test(planner, gemma_keeps_its_down_outputs_where_the_gpu_has_room) {
    mt_test_planned x;
    mt_test_request(&x, "gemma2-9b", 2048, 4, 8, 139e9, 124e9);
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_gt(x.p.n_keep_down, 0, "no down output kept (%d kept layers)", x.p.n_keep);
    cr_assert_leq(x.p.n_keep + x.p.n_keep_down, (int)x.cfg.L);
    cr_assert_leq(x.p.gpu_bytes, x.q.gpu_budget);
    mt_plan v = x.p;
    mt_step_prediction with = mt_plan_predict(&x.q, &v);
    v.n_keep_down = 0;
    mt_step_prediction without = mt_plan_predict(&x.q, &v);
    cr_assert_lt(with.step, without.step, "%.3f s with vs %.3f s without", with.step,
                 without.step);
    mt_cuda_backend_opts none = {.precision = MT_GPU_BF16},
                         three = {.precision = MT_GPU_BF16, .keep_down_layers = 3};
    size_t b0 = mt_cuda_backend_bytes(&x.cfg, &x.t, 4, 8, 2048, &none);
    size_t b3 = mt_cuda_backend_bytes(&x.cfg, &x.t, 4, 8, 2048, &three);
    size_t N = 8 * 2048, unit = N * (size_t)x.cfg.C * 2 + N * 4;
    cr_assert_geq(b3 - b0, 3 * 4 * unit, "%zu bytes for 12 units of %zu", b3 - b0, unit);
    cr_assert_leq(b3 - b0, 3 * 4 * (unit + 256) + 256, "%zu bytes for 12 units of %zu",
                  b3 - b0, unit);
    mt_test_planned_free(&x);
    mt_test_request(&x, "8b", 2048, 4, 8, 139e9, 124e9); /* the same request, Llama's block */
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_eq(x.p.n_keep_down, 0, "Llama keeps %d down outputs", x.p.n_keep_down);
    cr_assert_eq(mt_cuda_backend_bytes(&x.cfg, &x.t, 4, 8, 2048, &three),
                 mt_cuda_backend_bytes(&x.cfg, &x.t, 4, 8, 2048, &none));
    mt_test_planned_free(&x);
}
