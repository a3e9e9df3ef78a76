/* Training loops shared by the GPU tests (gpu_train.h). */
#include "gpu_train.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "engine/optim_pipeline.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "backend/cuda/cuda_ops.h"

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

static mt_grad_view src_begin(void *be, int layer) { return mt_cuda_backend_grads_begin(be, layer); }
static void src_wait(void *be, int layer) { mt_cuda_backend_grads_wait(be, layer); }

void mt_test_train(const mt_config *cfg, const mt_param_table *t, mt_host_store *st, int64_t T,
                   int gpu, mt_gpu_precision prec, int gpu_grads, const mt_layer_home *homes,
                   int grad_bf16, int steps, double *losses) {
    mt_error err;
    int M = 2;
    int64_t B = 1, n = M * B * T;
    mt_optimizer opt = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                        .max_grad_norm = 1.0f};
    opt.sched = mt_lr_schedule_make(MT_LR_COSINE, 3e-3, 3, steps);
    cr_assert_eq(mt_optim_cpu_init(&opt.cpu, 0, &err), 0);
    mt_backend *be;
    mt_optim_pipeline pipe;
    if (gpu) {
        mt_cuda_backend_opts o = {.precision = prec, .gpu_grads = gpu_grads, .homes = homes,
                                  .host_grad_bf16 = grad_bf16};
        be = mt_cuda_backend_create(cfg, t, st, M, B, T, &o, &err);
        cr_assert_not_null(be, "%s", err.msg);
        mt_grad_source src = {be, src_begin, src_wait};
        cr_assert_eq(mt_optim_pipeline_init(&pipe, &opt, st, &src, &err), 0);
        mt_cuda_backend_set_weight_gate(be, mt_optim_pipeline_gate, &pipe);
    } else {
        be = mt_cpu_backend_create(cfg, t, st, M, B, T, &err);
        cr_assert_not_null(be, "%s", err.msg);
    }
    int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
    for (int s = 0; s < steps; s++) {
        mt_test_make_batch(cfg, n, (uint64_t)s + 1, tok, tgt);
        mt_batch b = {.M = M, .B = B, .T = T, .tokens = tok, .targets = tgt};
        cr_assert_eq(mt_step_forward_backward(be, t->n_layers, &b, &losses[s], &err), 0,
                     "%s", err.msg);
        if (gpu) {
            const double *sq = mt_cuda_backend_layer_sumsq(be);
            double total = 0;
            for (int l = 0; l < t->n_layers; l++) total += sq[l];
            mt_optim_pipeline_start(&pipe, total, NULL);
        } else {
            mt_optimizer_step(&opt, st, NULL);
        }
    }
    if (gpu) {
        mt_optim_pipeline_wait_all(&pipe);
        mt_optim_pipeline_free(&pipe);
        mt_cuda_backend_free(be);
    } else {
        mt_cpu_backend_free(be);
    }
    free(tok);
    free(tgt);
}
