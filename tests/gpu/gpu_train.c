/* Training loops shared by the GPU tests (gpu_train.h). */
#include "gpu_train.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "engine/optim_pipeline.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "kernels/cuda_ops.h"
#include "testlib.h"

void mt_test_need_gpu(void) {
    if (mt_cuda_device_count() <= 0) cr_skip_test("no CUDA device: GPU test skipped");
}

void mt_test_make_batch(const mt_config *cfg, int64_t n, uint64_t seed, int32_t *tok,
                        int32_t *tgt) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        tok[i] = (int32_t)(s % (uint64_t)cfg->V);
        tgt[i] = (s >> 40) % 5 == 0 ? MT_IGNORE_INDEX : (int32_t)((s >> 20) % (uint64_t)cfg->V);
    }
}

void mt_test_optimizer(mt_optimizer *opt, int steps) {
    mt_error err;
    *opt = (mt_optimizer){.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                          .max_grad_norm = 1.0f};
    opt->sched = mt_lr_schedule_make(MT_LR_COSINE, 3e-3, 3, steps);
    cr_assert_eq(mt_optim_cpu_init(&opt->cpu, 0, &err), 0);
}

void mt_test_train_steps(const mt_config *cfg, const mt_param_table *t, mt_host_store *st,
                         int64_t T, const mt_cuda_backend_opts *o, mt_optimizer *opt,
                         int first, int steps, double *losses) {
    mt_error err;
    int M = 2;
    int64_t B = 1, n = M * B * T;
    mt_backend *be;
    mt_optim_pipeline pipe;
    if (o) {
        be = mt_cuda_backend_create(cfg, t, st, M, B, T, o, &err);
        cr_assert_not_null(be, "%s", err.msg);
        mt_grad_source src = mt_cuda_backend_grad_source(be);
        cr_assert_eq(mt_optim_pipeline_init(&pipe, opt, st, &src, &err), 0);
        mt_cuda_backend_set_weight_gate(be, mt_optim_pipeline_gate, &pipe);
    } else {
        be = mt_cpu_backend_create(cfg, t, st, M, B, T, &err);
        cr_assert_not_null(be, "%s", err.msg);
    }
    int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
    for (int s = first; s < first + steps; s++) {
        mt_test_make_batch(cfg, n, (uint64_t)s + 1, tok, tgt);
        mt_batch b = {.M = M, .B = B, .T = T, .tokens = tok, .targets = tgt};
        cr_assert_eq(mt_step_forward_backward(be, t->n_layers, &b, &losses[s - first], &err), 0,
                     "%s", err.msg);
        if (o) {
            const double *sq = mt_cuda_backend_layer_sumsq(be);
            double total = 0;
            for (int l = 0; l < t->n_layers; l++) total += sq[l];
            mt_optim_pipeline_start(&pipe, total, NULL);
        } else {
            mt_optimizer_step(opt, st, NULL);
        }
    }
    if (o) {
        mt_optim_pipeline_wait_all(&pipe); /* the store holds every layer's state */
        mt_optim_pipeline_free(&pipe);
        mt_cuda_backend_free(be);
    } else {
        mt_cpu_backend_free(be);
    }
    free(tok);
    free(tgt);
}

void mt_test_train(const mt_config *cfg, const mt_param_table *t, mt_host_store *st, int64_t T,
                   int gpu, mt_gpu_precision prec, int gpu_grads, const mt_layer_home *homes,
                   int grad_bf16, int steps, double *losses) {
    mt_optimizer opt;
    mt_test_optimizer(&opt, steps);
    mt_cuda_backend_opts o = {.precision = prec, .gpu_grads = gpu_grads, .homes = homes,
                              .host_grad_bf16 = grad_bf16};
    mt_test_train_steps(cfg, t, st, T, gpu ? &o : NULL, &opt, 0, steps, losses);
}

double mt_test_gpu_step(mt_fixture *f, mt_gpu_precision prec, int M, int host_saved) {
    double loss;
    mt_error err;
    size_t N = (size_t)(f->B * f->T);
    int32_t *tok = mt_fixture_i32(f, "input_ids", 0, N);
    int32_t *tgt = mt_fixture_i32(f, "targets", 0, N);
    mt_cuda_backend_opts o = {.precision = prec, .host_saved_inputs = host_saved};
    int64_t B = f->B / M;
    mt_backend *be = mt_cuda_backend_create(&f->cfg, &f->table, &f->store, M, B, f->T, &o, &err);
    cr_assert_not_null(be, "%s", err.msg);
    memset(f->store.g, 0x7f, f->table.total * sizeof(float)); /* poison: every grad is written */
    mt_batch b = {.M = M, .B = B, .T = f->T, .tokens = tok, .targets = tgt};
    cr_assert_eq(mt_step_forward_backward(be, f->table.n_layers, &b, &loss, &err), 0, "%s",
                 err.msg);
    mt_cuda_backend_wait_grads(be);
    /* The per-layer norms the GPU computed agree with the host copy. */
    const double *sq = mt_cuda_backend_layer_sumsq(be);
    for (int l = 0; l < f->table.n_layers; l++) {
        const mt_layer_desc *ld = &f->table.layers[l];
        double ref = 0;
        for (size_t i = 0; i < ld->numel; i++) ref += (double)f->store.g[ld->offset + i] *
                                                     f->store.g[ld->offset + i];
        cr_assert_lt(fabs(sq[l] - ref), 1e-9 + 1e-9 * ref, "layer %d sumsq %.12g vs %.12g", l,
                     sq[l], ref);
    }
    if (prec == MT_GPU_FP32 && M == 1 && !f->cfg.moe.aux_loss) {
        double sum;
        int64_t nv;
        cr_assert_eq(mt_step_eval(be, f->table.n_layers, &b, &sum, &nv, &err), 0);
        size_t nl;
        float *ref = mt_fixture_f32(f, "logits", &nl);
        float *ours = malloc(nl * sizeof *ours);
        for (size_t r = 0; r < N; r++) mt_cuda_backend_logits(be, 0, (int64_t)r, ours + r * f->cfg.V);
        double e = mt_test_rel_err(ours, ref, nl);
        cr_assert_lt(e, MT_TEST_TOL32_LOGITS, "%s: logits rel err %.3g", f->dir, e);
        cr_log_info("%s: logits rel err %.2e", f->dir, e);
        free(ours);
        free(ref);
    }
    mt_cuda_backend_free(be);
    free(tok);
    free(tgt);
    return loss;
}
