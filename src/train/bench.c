/* megatrain bench train: training steps of a synthetic Llama-shaped model
 * with random weights and tokens on the GPU streaming engine (the loop of
 * `megatrain bench train`; bench.h). */
#include "train/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/optim_pipeline.h"
#include "engine/step.h"
#include "engine/trace.h"
#include "host/store.h"
#include "util/sys.h"

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda.h"
#include "plan/planner.h"
#include "train/runner.h"

typedef struct gate_timer {
    mt_optim_pipeline *p;
    double waited_s;
} gate_timer;

static int timed_gate(void *ctx, int layer, int wait) {
    gate_timer *g = ctx;
    double t0 = mt_now_s();
    int written = mt_optim_pipeline_gate(g->p, layer, wait);
    g->waited_s += mt_now_s() - t0;
    return written;
}


int mt_bench_train_run(const mt_bench_opts *o, FILE *out, mt_error *err) {
    if (mt_config_validate(&o->cfg, "bench shape", err)) goto fail;
    mt_param_table table;
    if (mt_params_init(&table, &o->cfg, err)) goto fail;
    double tokens = (double)o->M * o->B * o->T;
    double flops = mt_config_train_flops_per_token(&o->cfg, o->T) * tokens;
    const mt_config *c = &o->cfg;
    fprintf(out, "model: %.2fB params, L %lld, C %lld, NH %lld, NKV %lld, F %lld, V %lld%s\n",
            table.n_params / 1e9, (long long)c->L, (long long)c->C, (long long)c->NH,
            (long long)c->NKV, (long long)c->F, (long long)c->V, c->tie_embeddings ? ", tied" : "");
    fprintf(out, "step: %d micro-batches x %lld x %lld = %.0f tokens, %s, %d slots\n", o->M,
            (long long)o->B, (long long)o->T, tokens, o->fp32 ? "fp32" : "bf16", o->slots);
    mt_cuda_backend_opts bo;
    mt_plan plan = {0};
    mt_plan_request req = {0};
    int manual = o->gpu_grads >= 0 || o->host_ckpt;
    if (manual) { /* the old global switches, for comparisons */
        bo = (mt_cuda_backend_opts){.precision = o->fp32 ? MT_GPU_FP32 : MT_GPU_BF16,
                                    .slots = o->slots, .host_checkpoints = o->host_ckpt,
                                    .keep_layers = o->keep, .gpu_grads = o->gpu_grads != 0,
                                    .host_grad_bf16 = o->grad_dtype == 1,
                                    .device_optim_layers = o->gpu_adam > 0 ? o->gpu_adam : 0};
    } else {
        if (mt_runner_plan_cuda(&req, &plan, &o->cfg, &table, o->M, o->B, o->T, o->fp32,
                                o->gpu_mem, o->host_mem, o->grad_dtype, o->keep, o->all_gpu,
                                o->slots, o->gpu_adam, o->calib, out, err))
            goto fail;
        if (!plan.fits) return mt_errorf(err, "the run does not fit: %s", plan.why);
        mt_plan_backend_opts(&plan, &req, &bo);
    }
    double t0 = mt_now_s();
    mt_host_store store;
    if (mt_host_store_create(&store, &table, 0, err)) goto fail;
    mt_host_store_init_random(&store, 1, 0.02f);
    fprintf(out, "host store: %.1f GB (%.2f bytes/param), ready in %.1fs\n", store.bytes / 1e9,
            (double)store.bytes / table.n_params, mt_now_s() - t0);
    t0 = mt_now_s();
    mt_backend *be = mt_cuda_backend_create(&o->cfg, &table, &store, o->M, o->B, o->T, &bo, err);
    if (!be) goto fail;
    size_t pinned = mt_cuda_backend_host_bytes(&o->cfg, &table, o->M, o->B, o->T, &bo);
    fprintf(out, "gpu: %.2f GB allocated, %d of %lld layers keep their activations, host pinned in "
            "%.1fs\n", mt_cuda_backend_device_bytes(be) / 1e9, mt_cuda_backend_kept_layers(be),
           (long long)o->cfg.L, mt_now_s() - t0);
    mt_optimizer opt = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                        .max_grad_norm = 1.0f};
    opt.sched = mt_lr_schedule_make(MT_LR_CONSTANT, 1e-5, 0, o->steps + 1);
    if (mt_optim_cpu_init(&opt.cpu, 0, err)) goto fail;
    mt_optim_pipeline pipe;
    mt_grad_source src = mt_cuda_backend_grad_source(be);
    if (mt_optim_pipeline_init(&pipe, &opt, &store, &src, err)) goto fail;
    gate_timer gt = {.p = &pipe};
    mt_cuda_backend_set_weight_gate(be, timed_gate, &gt);

    size_t n = (size_t)tokens;
    int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
    mt_batch_fill_random(tok, tgt, n, o->cfg.V);
    mt_batch batch = {.M = o->M, .B = o->B, .T = o->T, .tokens = tok, .targets = tgt};
    fprintf(out, "%5s %9s %9s %9s %9s %9s %9s %9s %8s %8s\n", "step", "loss", "step_s", "TFLOPS",
            "tok/s", "fwd_s", "bwd_s", "optwait_s", "H2D_GB/s", "D2H_GB/s");
    double sum_t = 0, prev = mt_now_s();
    int timed = 0;
    mt_trace trace = {0};
    for (int64_t s = 0; s <= o->steps; s++) {
        gt.waited_s = 0;
        if (o->trace_path && s == 1) mt_cuda_backend_set_trace(be, &trace);
        double loss;
        if (mt_step_forward_backward(be, table.n_layers, &batch, &loss, err)) goto fail;
        const double *sq = mt_cuda_backend_layer_sumsq(be);
        double total = 0;
        for (int l = 0; l < table.n_layers; l++) total += sq[l];
        mt_optim_report rep;
        mt_optim_pipeline_wait_updates(&pipe); /* as a step of train: no store flush */
        if (o->trace_path && s >= 2)
            for (int l = 0; l < table.n_layers; l++) {
                char name[32];
                snprintf(name, sizeof name, "adamw L%d", l);
                mt_trace_add(&trace, MT_TRACK_OPTIMIZER, name, pipe.t0_us[l],
                             pipe.t1_us[l] - pipe.t0_us[l]);
            }
        mt_optim_pipeline_start(&pipe, total, &rep);
        double t = mt_now_s(), dt = t - prev;
        prev = t;
        mt_cuda_step_times st;
        mt_cuda_backend_times(be, &st);
        fprintf(out, "%5lld %9.4f %9.3f %9.1f %9.0f %9.3f %9.3f %9.3f %8.1f %8.1f%s\n",
                (long long)s, loss, dt, flops / dt / 1e12, tokens / dt, st.forward_ms / 1e3,
                st.backward_ms / 1e3, gt.waited_s, st.h2d_bytes / (st.total_ms / 1e3) / 1e9,
                st.d2h_bytes / (st.total_ms / 1e3) / 1e9, s == 0 ? "  (warm-up)" : "");
        fflush(out);
        if (s > 0) {
            sum_t += dt;
            timed++;
        }
    }
    mt_optim_pipeline_wait_all(&pipe);
    if (o->trace_path) {
        if (mt_trace_write(&trace, o->trace_path, err)) goto fail;
        fprintf(out, "trace: %zu spans written to %s\n", trace.n, o->trace_path);
        mt_trace_free(&trace);
    }
    fprintf(out, "optimizer: %.3fs per step on the CPU (%.2f Gparam/s), overlapped with the next "
            "forward\n", pipe.busy_s, table.n_params / pipe.busy_s / 1e9);
    double avg = sum_t / timed;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    double hbpp = (double)(store.bytes + pinned) / table.n_params;
    if (!manual)
        fprintf(out, "predicted step %.3f s, measured %.3f s (%+.1f%%)\n", plan.pred.step, avg,
               100.0 * (plan.pred.step - avg) / avg);
    if (o->gpu_mem > 0 && (double)(tot - fr) > o->gpu_mem * 1e9)
        fprintf(out, "BUDGET EXCEEDED: the GPU holds %.2f GB, the budget is %.2f GB\n",
               (tot - fr) / 1e9, o->gpu_mem);
    fprintf(out, "RESULT model=%.2fB tokens/step=%.0f step_s=%.3f TFLOPS=%.1f tok/s=%.0f "
            "gpu_alloc_GB=%.2f gpu_used_GB=%.2f host_rss_GB=%.1f host_bytes_per_param=%.2f "
           "predicted_step_s=%.3f\n",
           table.n_params / 1e9, tokens, avg, flops / avg / 1e12, tokens / avg,
           mt_cuda_backend_device_bytes(be) / 1e9, (tot - fr) / 1e9, mt_host_rss_bytes() / 1e9,
           hbpp, manual ? 0.0 : plan.pred.step);
    mt_plan_free(&plan);
    mt_optim_pipeline_free(&pipe);
    mt_cuda_backend_free(be);
    mt_host_store_free(&store);
    mt_params_free(&table);
    free(tok);
    free(tgt);
    return 0;
fail:
    return -1;
}
#else
int mt_bench_train_run(const mt_bench_opts *o, FILE *out, mt_error *err) {
    return mt_errorf(err, "this build has no CUDA support");
}
#endif
