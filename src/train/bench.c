/* megatrain bench train: training steps of a synthetic Llama-shaped model
 * with random weights and tokens on the GPU streaming engine (the loop of
 * `megatrain bench train`; bench.h). */
#include "train/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h" /* MT_IGNORE_INDEX */
#include "engine/optim_pipeline.h"
#include "engine/preference.h"
#include "engine/step.h"
#include "engine/trace.h"
#include "host/disk_state.h"
#include "host/store.h"
#include "util/sys.h"

#include "backend/device.h"
#include "dist/shard.h"
#include "plan/planner.h"
#include "train/ranks.h"
#include "train/runner.h"
#include "util/mem.h"

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


/* The run's shape and placement options as "name=value" lines: every rank
 * must have been started with the same. */
static void config_text(const mt_bench_opts *o, char *buf, size_t cap) {
    const mt_config *c = &o->cfg;
    snprintf(buf, cap, "shape=%lld,%lld,%lld,%lld,%lld,%lld,%lld\nbatch=%d,%lld,%lld\n"
             "steps=%lld\nprecision=%d\nslots=%d\nkeep=%d\ngrads=%d,%d,%d,%d,%d\n"
             "budgets=%g,%g\ngpus=%d\nsaved=%d\n", (long long)c->L, (long long)c->C,
             (long long)c->NH, (long long)c->NKV, (long long)c->F, (long long)c->V, (long long)c->moe.E, o->M,
             (long long)o->B, (long long)o->T, (long long)o->steps, o->fp32, o->slots, o->keep,
             o->gpu_grads, o->host_saved, o->grad_dtype, o->all_gpu, o->gpu_adam, o->gpu_mem,
             o->host_mem, o->gpus, o->saved_bf16);
}

/* The backend's options: the planner's placement within the budgets (a
 * rank of several: its share of this machine's RAM), or the old global
 * switches. */
static int placement(const mt_bench_opts *o, const mt_param_table *table, mt_ranks *rk,
                     mt_plan_request *req, mt_plan *plan, mt_cuda_backend_opts *bo, FILE *out,
                     mt_error *err) {
    int several = mt_ranks_several(rk);
    if (o->gpu_grads >= 0 || o->host_saved) { /* the old global switches, for comparisons */
        *bo = (mt_cuda_backend_opts){.precision = o->fp32 ? MT_GPU_FP32 : MT_GPU_BF16,
                                     .slots = o->slots, .host_saved_inputs = o->host_saved,
                                     .keep_layers = o->keep, .gpu_grads = o->gpu_grads != 0,
                                     .host_grad_bf16 = o->grad_dtype == 1,
                                     .host_saved_bf16 = o->saved_bf16,
                                     .device_optim_layers = o->gpu_adam > 0 ? o->gpu_adam : 0};
    } else {
        double host_mem = o->host_mem > 0 ? o->host_mem : mt_plan_default_host_budget() / 1e9;
        mt_gpu_plan_args a = {.fp32 = o->fp32, .gpu_mem_gb = o->gpu_mem,
                              .host_mem_gb = host_mem / rk->local_world,
                              .grad_dtype = o->grad_dtype, .saved_bf16 = o->saved_bf16,
                              .keep = o->keep, .all_gpu = o->all_gpu,
                              .slots = o->slots, .gpu_adam = o->gpu_adam, .rank = rk->env.rank,
                              .ranks = rk->env.world_size, .link_gbs = rk->link_gbs,
                              .calib = o->calib, .nvme_dir = o->nvme_dir,
                              .disk_mem_gb = o->disk_mem, .disk_layers = o->disk_layers,
                              .disk_sharers = rk->local_world,
                              .disk_saved_layers = o->disk_saved_layers,
                              .disk_weight_layers = o->disk_weight_layers};
        /* each machine's drives measured once, by its first rank */
        if (several && o->nvme_dir && o->nvme_dir[0] && o->disk_layers && !o->calib &&
            mt_ranks_disk_rates(rk, o->nvme_dir, (size_t)4 << 30, a.disk_gbs, err))
            return mt_error_prefix(err, "measuring the disk tier (--nvme-dir): ");
        if (mt_runner_plan_gpu(req, plan, &o->cfg, table, o->M, o->B, o->T, &a, out, err))
            return -1;
        if (!plan->fits) return mt_errorf(err, "the run does not fit: %s", plan->why);
        mt_plan_backend_opts(plan, req, bo);
    }
    bo->rank = rk->env.rank;
    bo->ranks = rk->env.world_size;
    bo->comm = (struct mt_nccl *)rk->comm;
    if (several && o->gpu_grads == 1)
        return mt_errorf(err, "--grads gpu: on several GPUs every gradient waits on the host "
                         "(each rank's part); drop the option");
    return 0;
}

/* A preference objective's batch over the random tokens: each row one pair
 * whose halves are the chosen and the rejected document (positions
 * restarting), each a prompt of T/8 tokens without targets and an answer;
 * reference log-probabilities 0. pairs (M*B). */
static void pref_layout(const mt_bench_opts *o, int32_t *tgt, int32_t *pos,
                        mt_pref_pair *pairs) {
    int64_t T = o->T, h = T / 2, prompt = T / 8;
    for (int64_t r = 0; r < (int64_t)o->M * o->B; r++) {
        int mb = (int)(r / o->B);
        int64_t row = (r % o->B) * T;
        for (int64_t t = 0; t < T; t++) {
            int64_t in_doc = t < h ? t : t - h, len = t < h ? h : T - h;
            pos[r * T + t] = (int32_t)in_doc;
            if (in_doc < prompt || in_doc == len - 1) tgt[r * T + t] = MT_IGNORE_INDEX;
        }
        pairs[r] = (mt_pref_pair){{mb, row + prompt, row + h - 1},
                                  {mb, row + h + prompt, row + T - 1}, 0.0, 0.0};
    }
}

/* One step of the benchmark: cross-entropy, or the preference objective
 * (a DPO sigmoid of beta 0.1, or the run's simpo or orpo) over pairs. */
static int bench_step(const mt_bench_opts *o, mt_backend *be, int n_layers,
                      const mt_batch *batch, const mt_pref_pair *pairs, double *loss,
                      mt_error *err) {
    if (!o->objective) return mt_step_forward_backward(be, n_layers, batch, loss, err);
    mt_pref_opts po = {.loss = o->objective == 2 ? MT_PREF_SIMPO
                               : o->objective == 3 ? MT_PREF_ORPO
                                                   : MT_PREF_SIGMOID,
                       .beta = 0.1, .gamma = 0.5, .lambda = 0.1};
    mt_pref_step s;
    if (mt_pref_step_init(&s, &po, batch, pairs, (int64_t)o->M * o->B, err)) return -1;
    mt_seq_objective obj = {mt_pref_weigh, &s};
    int rc = mt_step_sequence_or_stop(be, n_layers, batch, &obj, NULL, err);
    *loss = mt_pref_step_metrics(&s).loss;
    mt_pref_step_free(&s);
    return rc;
}

/* The reference pass of a preference run over the step's tokens: every
 * layer's forward and the head's log-probabilities, no gradient (what a run
 * does once over its pairs before training); one warm-up and two timed
 * passes, their tokens/s printed. */
static int ref_pass(mt_backend *be, int n_layers, const mt_batch *batch, FILE *out,
                    mt_error *err) {
    double tokens = (double)batch->M * batch->B * batch->T, t0 = 0;
    float *logp = mt_malloc_or_die((size_t)tokens * sizeof *logp);
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        if (i == 1) t0 = mt_now_s();
        rc = mt_step_logp(be, n_layers, batch, logp, err);
    }
    double dt = (mt_now_s() - t0) / 2;
    if (!rc)
        fprintf(out, "reference pass: %.3f s for %.0f tokens, %.0f tok/s\n", dt, tokens,
                tokens / dt);
    free(logp);
    return rc;
}

/* The timed loop: warm-up steps and o->steps timed ones, then, for a
 * preference objective, the reference pass. One warm-up step, or two with
 * a disk tier: the updates of the first read blocks never written, which
 * the fresh files serve without the device, so the next forward, which
 * waits for them, is not the steady state. Returns the mean step time
 * (*last: the last step's measurements), -1 with err. */
static double run_steps(const mt_bench_opts *o, mt_ranks *rk, mt_backend *be,
                        const mt_param_table *table, mt_optim_pipeline *pipe, gate_timer *gt,
                        double *last_loss, mt_backend_stats *last, FILE *out, mt_error *err) {
    double tokens = (double)o->M * o->B * o->T, world = rk->env.world_size;
    double flops = mt_config_train_flops_per_token(&o->cfg, o->T) * tokens;
    size_t n = (size_t)tokens;
    int32_t *tok = mt_malloc_or_die(n * sizeof *tok), *tgt = mt_malloc_or_die(n * sizeof *tgt);
    mt_batch_fill_random(tok, tgt, n, o->cfg.V);
    mt_batch batch = {.M = o->M, .B = o->B, .T = o->T, .tokens = tok, .targets = tgt};
    int32_t *pos = NULL;
    mt_pref_pair *pairs = NULL;
    if (o->objective) {
        pos = mt_malloc_or_die(n * sizeof *pos);
        pairs = mt_malloc_or_die((size_t)o->M * (size_t)o->B * sizeof *pairs);
        pref_layout(o, tgt, pos, pairs);
        batch.pos = pos;
    }
    fprintf(out, "%5s %9s %9s %9s %9s %9s %9s %9s %8s %8s %8s\n", "step", "loss", "step_s",
            "TFLOPS", "tok/s", "fwd_s", "bwd_s", "optwait_s", "H2D_GB/s", "D2H_GB/s", "coll_GB");
    double sum_t = 0, prev = mt_now_s();
    int timed = 0, warm = mt_disk_state_layers(pipe->store->disk) > 0 ? 2 : 1;
    mt_trace trace = {0};
    mt_ranks_watch_start(rk);
    for (int64_t s = 0; s < o->steps + warm; s++) {
        gt->waited_s = 0;
        if (o->trace_path && s == warm) be->ops->set_trace(be, &trace);
        double loss;
        if (bench_step(o, be, table->n_layers, &batch, pairs, &loss, err)) goto fail;
        const double *sq = be->ops->layer_sumsq(be);
        double sums[2] = {0, loss / world}; /* the gradient's squares; the mean loss */
        for (int l = 0; l < table->n_layers; l++) sums[0] += sq[l];
        if (mt_ranks_sum(rk, sums, 2, err)) goto fail;
        mt_optim_report rep;
        mt_optim_pipeline_wait_updates(pipe); /* as a step of train: no store flush */
        if (o->trace_path && s > warm)
            for (int l = 0; l < table->n_layers; l++) {
                char name[32];
                snprintf(name, sizeof name, "adamw L%d", l);
                mt_trace_add(&trace, MT_TRACK_OPTIMIZER, name, pipe->t0_us[l],
                             pipe->t1_us[l] - pipe->t0_us[l]);
            }
        mt_optim_pipeline_start(pipe, sums[0], &rep);
        mt_ranks_alive(rk, s + 1);
        *last_loss = sums[1];
        double t = mt_now_s(), dt = t - prev;
        prev = t;
        mt_backend_stats st;
        be->ops->stats(be, &st);
        fprintf(out, "%5lld %9.4f %9.3f %9.1f %9.0f %9.3f %9.3f %9.3f %8.1f %8.1f %8.2f%s\n",
                (long long)s, sums[1], dt, flops / dt / 1e12, world * tokens / dt, st.forward_s,
                st.backward_s, gt->waited_s, st.h2d_bytes / st.total_s / 1e9,
                st.d2h_bytes / st.total_s / 1e9, st.coll_bytes / 1e9,
                s < warm ? "  (warm-up)" : "");
        fflush(out);
        if (s >= warm) {
            sum_t += dt;
            timed++;
        }
    }
    mt_optim_pipeline_wait_all(pipe);
    be->ops->stats(be, last);
    if (o->objective && ref_pass(be, table->n_layers, &batch, out, err)) goto fail;
    if (o->trace_path && mt_ranks_lead(rk)) {
        if (mt_trace_write(&trace, o->trace_path, err)) goto fail;
        fprintf(out, "trace: %zu spans written to %s\n", trace.n, o->trace_path);
    }
    mt_trace_free(&trace);
    free(tok), free(tgt), free(pos), free(pairs);
    return sum_t / timed;
fail:
    mt_trace_free(&trace);
    free(tok), free(tgt), free(pos), free(pairs);
    return -1;
}

/* What is measured: the model's shape, the step and the ranks. */
static void print_shape(const mt_bench_opts *o, const mt_ranks *rk, const mt_param_table *table,
                        FILE *out) {
    double tokens = (double)o->M * o->B * o->T;
    int world = rk->env.world_size;
    const mt_config *c = &o->cfg;
    fprintf(out, "model: %.2fB params, L %lld, C %lld, NH %lld, NKV %lld, F %lld, V %lld%s\n",
            table->n_params / 1e9, (long long)c->L, (long long)c->C, (long long)c->NH,
            (long long)c->NKV, (long long)c->F, (long long)c->V, c->tie_embeddings ? ", tied" : "");
    fprintf(out, "step: %d micro-batches x %lld x %lld = %.0f tokens%s, %s, %d slots\n", o->M,
            (long long)o->B, (long long)o->T, tokens, world > 1 ? " per GPU" : "",
            o->fp32 ? "fp32" : "bf16", o->slots);
    if (o->objective)
        fprintf(out, "objective: %s, %lld pairs a step (each row one), the head run twice per "
                "micro-batch\n", o->objective == 2 ? "simpo" : o->objective == 3 ? "orpo"
                                                                            : "dpo sigmoid",
                (long long)o->M * o->B);
    if (world > 1)
        fprintf(out, "ranks: %d GPUs, %d on this machine, %d CPU threads each; each holds 1/%d "
                "of every layer\n", rk->env.world_size, rk->local_world, rk->threads,
                rk->env.world_size);
}

static int bench(const mt_bench_opts *o, mt_ranks *rk, const mt_param_table *table, FILE *out,
                 mt_error *err) {
    double tokens = (double)o->M * o->B * o->T, world = rk->env.world_size;
    double flops = mt_config_train_flops_per_token(&o->cfg, o->T) * tokens;
    print_shape(o, rk, table, out);
    mt_cuda_backend_opts bo;
    mt_plan plan = {0};
    mt_plan_request req = {0};
    mt_shard_layout sl = {0};
    mt_param_table parts = {0};
    mt_host_store store = {0};
    mt_backend *be = NULL;
    mt_optim_pipeline pipe;
    int pipe_on = 0, rc = -1;
    int manual = o->gpu_grads >= 0 || o->host_saved;
    if (placement(o, table, rk, &req, &plan, &bo, out, err) ||
        mt_ranks_parts(rk, table, &sl, &parts, err))
        goto out;
    double t0 = mt_now_s();
    int n_disk = !o->nvme_dir || !o->nvme_dir[0] ? 0 : manual ? o->disk_layers : plan.n_disk;
    int n_disk_w = n_disk > 0 && !manual ? plan.n_disk_w : 0;
    if (mt_disk_store_create(&store, &parts, 0, n_disk > 0 ? n_disk : 0, n_disk_w, o->nvme_dir,
                             err))
        goto out;
    if (n_disk_w && mt_disk_store_init_random(&store, 1, 0.02f, err)) goto out;
    if (!n_disk_w) mt_shard_init_random(&store, &sl, 1, 0.02f);
    fprintf(out, "host store: %.1f GB (%.2f bytes/param), ready in %.1fs\n", store.bytes / 1e9,
            (double)store.bytes / table->n_params, mt_now_s() - t0);
    if (plan.n_disk_saved)
        fprintf(out, "disk tier: the saved inputs of %d layers on %s, %.2f GB\n",
                plan.n_disk_saved, o->nvme_dir, plan.disk_saved_bytes / 1e9);
    if (store.disk)
        fprintf(out, "disk tier: the m and v of the last %d layers on %s, %.2f GB (%.2f GB of RAM "
                "for their staging)\n", n_disk, o->nvme_dir,
                mt_disk_state_disk_bytes(store.disk) / 1e9,
                mt_disk_state_ram_bytes(store.disk) / 1e9);
    if (n_disk_w)
        fprintf(out, "disk tier: the fp32 weights of the last %d layers too (a bf16 copy of them "
                "in RAM)\n", n_disk_w);
    t0 = mt_now_s();
    be = mt_device_backend_create(&o->cfg, table, &store, o->M, o->B, o->T, &bo, err);
    if (mt_ranks_agree(rk, be ? 0 : -1, err)) goto out;
    mt_backend_stats bs;
    be->ops->stats(be, &bs);
    fprintf(out, "gpu: %.2f GB allocated, %d of %lld layers keep their activations, host pinned in "
            "%.1fs\n", bs.device_bytes / 1e9, bs.kept_layers, (long long)o->cfg.L,
            mt_now_s() - t0);
    mt_optimizer opt = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                        .max_grad_norm = 1.0f};
    opt.sched = mt_lr_schedule_make(MT_LR_CONSTANT, 1e-5, 0, o->steps + 1);
    if (mt_optim_cpu_init(&opt.cpu, world > 1 ? rk->threads : 0, err)) goto out;
    mt_grad_source src = be->ops->grad_source(be);
    if (mt_optim_pipeline_init(&pipe, &opt, &store, &src, err)) goto out;
    pipe_on = 1;
    gate_timer gt = {.p = &pipe};
    be->ops->set_weight_gate(be, timed_gate, &gt);
    double last_loss = 0;
    mt_backend_stats last; /* the last step's traffic, per GPU */
    double avg = run_steps(o, rk, be, table, &pipe, &gt, &last_loss, &last, out, err);
    if (avg < 0) goto out;
    fprintf(out, "optimizer: %.3fs per step on the CPU (%.2f Gparam/s%s), overlapped with the "
            "next forward\n", pipe.busy_s, parts.n_params / pipe.busy_s / 1e9,
            world > 1 ? " on this rank's part" : "");
    double fr = 0, tot = 0;
    mt_device_memory(&fr, &tot);
    /* host memory of every rank together */
    double staging = store.disk ? mt_disk_state_ram_bytes(store.disk) : 0;
    double host[2] = {(double)store.bytes + bs.host_bytes + staging, mt_host_rss_bytes() / 1e9};
    if (mt_ranks_sum(rk, host, 2, err)) goto out;
    double hbpp = host[0] / table->n_params;
    if (!manual)
        fprintf(out, "predicted step %.3f s, measured %.3f s (%+.1f%%)\n", plan.pred.step, avg,
               100.0 * (plan.pred.step - avg) / avg);
    if (o->gpu_mem > 0 && (double)(tot - fr) > o->gpu_mem * 1e9)
        fprintf(out, "BUDGET EXCEEDED: the GPU holds %.2f GB, the budget is %.2f GB\n",
               (tot - fr) / 1e9, o->gpu_mem);
    fprintf(out, "RESULT model=%.2fB gpus=%d tokens/step=%.0f step_s=%.3f TFLOPS=%.1f tok/s=%.0f "
            "gpu_alloc_GB=%.2f gpu_used_GB=%.2f host_rss_GB=%.1f host_bytes_per_param=%.2f "
           "predicted_step_s=%.3f loss=%.9g h2d_GB=%.2f d2h_GB=%.2f coll_GB=%.2f disk_layers=%d\n",
           table->n_params / 1e9, rk->env.world_size, world * tokens, avg, flops / avg / 1e12,
           world * tokens / avg, bs.device_bytes / 1e9, (tot - fr) / 1e9,
           host[1], hbpp, manual ? 0.0 : plan.pred.step, last_loss, last.h2d_bytes / 1e9,
           last.d2h_bytes / 1e9, last.coll_bytes / 1e9, n_disk > 0 ? n_disk : 0);
    rc = 0;
out:
    if (pipe_on) mt_optim_pipeline_free(&pipe);
    if (be) be->ops->destroy(be);
    mt_plan_free(&plan);
    mt_disk_state_close(store.disk); /* after the optimizer: its last writes land */
    mt_host_store_free(&store);
    mt_params_free(&parts);
    mt_shard_layout_free(&sl);
    return rc;
}

int mt_bench_train_run(const mt_bench_opts *o, FILE *out, mt_error *err) {
    if (mt_config_validate(&o->cfg, "bench shape", err)) return -1;
    if (mt_device_count() <= 0)
        return mt_errorf(err, "bench train measures the GPU engine, and no CUDA GPU is visible "
                         "(or this build has no CUDA support)");
    char conf[1024];
    config_text(o, conf, sizeof conf);
    mt_ranks rk;
    if (mt_ranks_open(&rk, 1, conf, err)) return -1;
    int rc = -1;
    mt_param_table table = {0};
    FILE *quiet = NULL;
    if (o->gpus > 0 && rk.env.world_size != o->gpus) {
        mt_errorf(err, "--gpus %d, but this process is one of %d ranks (%s); start it with %d "
                  "or drop --gpus", o->gpus, rk.env.world_size, rk.env.source, o->gpus);
        goto out;
    }
    if (!mt_ranks_lead(&rk)) out = quiet = fopen("/dev/null", "w"); /* rank 0 reports */
    if (!out || mt_params_init(&table, &o->cfg, err)) goto out;
    rc = bench(o, &rk, &table, out, err);
out:
    if (quiet) fclose(quiet);
    mt_params_free(&table);
    mt_ranks_close(&rk);
    return rc;
}
