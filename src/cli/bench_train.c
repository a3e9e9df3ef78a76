/* megatrain bench train: training steps of a synthetic Llama-shaped model
 * with random weights and tokens, on the GPU streaming engine. Reports
 * model TFLOPS (SPEC 6: 6 * params * tokens + 12 * layers * hidden * seq
 * per token, with the active parameters of an MoE model: docs/moe.md; over
 * the whole step time including the optimizer), tokens/s,
 * the step breakdown, GPU and host memory, and the copy rates. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/args.h"
#include "cli/commands.h"
#include "util/sys.h"
#include "engine/optim_pipeline.h"
#include "engine/step.h"
#include "engine/trace.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"
#include "model/presets.h"

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/planner.h"
#include "train/runner.h"
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain bench train [--preset NAME] [shape options] [options]\n"
            "  --preset P          model shape (default 7b = Llama-2-7B; 1b 3b 8b 13b 20b 34b 70b\n"
            "                      123b 405b)\n"
            "  --layers N --hidden N --heads N --kv-heads N --ffn N --vocab N  override\n"
            "  --seq-len T         (default 2048)\n"
            "  --batch-size B      rows per micro-batch (default 8)\n"
            "  --micro-batches M   per optimizer step (default 4)\n"
            "  --steps N           timed steps after one warm-up step (default 4)\n"
            "  --precision P       bf16 | fp32 (default bf16)\n"
            "  --slots K           GPU weight slots (default 3)\n"
            "  --host-checkpoints  keep layer inputs in host memory, not on the GPU\n"
            "  --keep-layers N     layers whose activations skip the recompute (-1 = as many\n"
            "                      as fit, the default; 0 = recompute all)\n"
            "  --trace FILE        write a Chrome trace (chrome://tracing) of the timed steps\n"
            "placement (default: the planner's, within the budgets):\n"
            "  --gpu-mem GB        GPU memory the run may take, context included (default: free)\n"
            "  --host-mem GB       host RAM the run may take (default: MemTotal less max(4 GB, 4%%))\n"
            "  --host-grad-dtype D fp32 | bf16 for gradients waiting on the host (default: fp32\n"
            "                      when it fits, else bf16)\n"
            "  --placement all-gpu every gradient and checkpoint on the GPU\n"
            "  --calibration FILE  rates for the step-time model (megatrain calibrate); default:\n"
            "                      a short probe of this machine\n"
            "  --grads gpu|host    force where every gradient waits (no planner)\n");
}

#ifdef MT_HAVE_CUDA
typedef struct gate_timer {
    mt_optim_pipeline *p;
    double waited_s;
} gate_timer;

static void timed_gate(void *ctx, int layer) {
    gate_timer *g = ctx;
    double t0 = mt_now_s();
    mt_optim_pipeline_wait_layer(g->p, layer);
    g->waited_s += mt_now_s() - t0;
}

static mt_grad_view grads_begin(void *be, int layer) {
    return mt_cuda_backend_grads_begin(be, layer);
}

static void grads_wait(void *be, int layer) { mt_cuda_backend_grads_wait(be, layer); }

#endif

int mt_bench_train(int argc, char **argv) {
    const mt_preset *ps = mt_preset_find("7b");
    int64_t over[6] = {0}; /* layers hidden heads kv ffn vocab */
    int64_t T = 2048, B = 8, steps = 4;
    int M = 4, slots = 3, fp32 = 0, host_ckpt = 0, keep = -1, gpu_grads = -1, all_gpu = 0;
    int grad_dtype = -1;
    double gpu_mem = 0, host_mem = 0;
    const char *trace_path = NULL, *calib = NULL;
    static const struct option opts[] = {
        {"preset", required_argument, 0, 'p'},  {"layers", required_argument, 0, 'L'},
        {"hidden", required_argument, 0, 'C'},  {"heads", required_argument, 0, 'H'},
        {"kv-heads", required_argument, 0, 'K'}, {"ffn", required_argument, 0, 'F'},
        {"vocab", required_argument, 0, 'V'},   {"seq-len", required_argument, 0, 't'},
        {"batch-size", required_argument, 0, 'b'}, {"micro-batches", required_argument, 0, 'm'},
        {"steps", required_argument, 0, 's'},   {"precision", required_argument, 0, 'P'},
        {"slots", required_argument, 0, 'k'},   {"help", no_argument, 0, 'h'},
        {"host-checkpoints", no_argument, 0, 'c'}, {"trace", required_argument, 0, 'T'},
        {"keep-layers", required_argument, 0, 'K' + 256},
        {"grads", required_argument, 0, 'G' + 256},
        {"gpu-mem", required_argument, 0, 'g' + 256},
        {"host-mem", required_argument, 0, 'h' + 256},
        {"host-grad-dtype", required_argument, 0, 'd' + 256},
        {"placement", required_argument, 0, 'p' + 256},
        {"calibration", required_argument, 0, 'c' + 256},
        {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'p':
            ps = mt_preset_find(optarg);
            if (!ps) {
                fprintf(stderr, "megatrain bench train: unknown preset '%s' (%s)\n", optarg,
                        mt_preset_names());
                return 2;
            }
            break;
        case 'L': over[0] = mt_arg_ll(optarg, &bad); break;
        case 'C': over[1] = mt_arg_ll(optarg, &bad); break;
        case 'H': over[2] = mt_arg_ll(optarg, &bad); break;
        case 'K': over[3] = mt_arg_ll(optarg, &bad); break;
        case 'F': over[4] = mt_arg_ll(optarg, &bad); break;
        case 'V': over[5] = mt_arg_ll(optarg, &bad); break;
        case 't': T = mt_arg_ll(optarg, &bad); break;
        case 'b': B = mt_arg_ll(optarg, &bad); break;
        case 'm': M = (int)mt_arg_ll(optarg, &bad); break;
        case 's': steps = mt_arg_ll(optarg, &bad); break;
        case 'k': slots = (int)mt_arg_ll(optarg, &bad); break;
        case 'c': host_ckpt = 1; break;
        case 'K' + 256: keep = (int)mt_arg_ll(optarg, &bad); break;
        case 'G' + 256:
            if (strcmp(optarg, "gpu") && strcmp(optarg, "host")) {
                fprintf(stderr, "megatrain bench train: --grads must be gpu or host\n");
                return 2;
            }
            gpu_grads = !strcmp(optarg, "gpu");
            break;
        case 'T': trace_path = optarg; break;
        case 'g' + 256: gpu_mem = mt_arg_d(optarg, &bad); break;
        case 'h' + 256: host_mem = mt_arg_d(optarg, &bad); break;
        case 'c' + 256: calib = optarg; break;
        case 'd' + 256:
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
                fprintf(stderr, "megatrain bench train: --host-grad-dtype must be fp32 or bf16\n");
                return 2;
            }
            grad_dtype = !strcmp(optarg, "bf16");
            break;
        case 'p' + 256:
            if (strcmp(optarg, "all-gpu") && strcmp(optarg, "auto")) {
                fprintf(stderr, "megatrain bench train: --placement must be auto or all-gpu\n");
                return 2;
            }
            all_gpu = !strcmp(optarg, "all-gpu");
            break;
        case 'P':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
                fprintf(stderr, "megatrain bench train: --precision must be bf16 or fp32\n");
                return 2;
            }
            fp32 = !strcmp(optarg, "fp32");
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain bench train: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    if (T <= 0 || B <= 0 || M <= 0 || steps <= 0 || gpu_mem < 0 || host_mem < 0) {
        fprintf(stderr, "megatrain bench train: sizes, budgets and --steps must be positive\n");
        return 2;
    }
#ifndef MT_HAVE_CUDA
    fprintf(stderr, "megatrain bench train: this build has no CUDA support\n");
    return 1;
#else
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    cfg.C = over[1] ? over[1] : ps->C;
    cfg.L = over[0] ? over[0] : ps->L;
    cfg.NH = over[2] ? over[2] : ps->NH;
    cfg.NKV = over[3] ? over[3] : (over[2] ? cfg.NH : ps->NKV);
    cfg.F = over[4] ? over[4] : ps->F;
    cfg.V = over[5] ? over[5] : ps->V;
    cfg.HD = cfg.C / cfg.NH;
    cfg.tie_embeddings = ps->tied;
    cfg.max_pos = T;
    cfg.rms_eps = 1e-5f;
    mt_error err;
    if (mt_config_validate(&cfg, "bench shape", &err)) goto fail;
    mt_param_table table;
    if (mt_params_init(&table, &cfg, &err)) goto fail;
    double tokens = (double)M * B * T;
    double flops = mt_config_train_flops_per_token(&cfg, T) * tokens;
    printf("model: %.2fB params, L %lld, C %lld, NH %lld, NKV %lld, F %lld, V %lld%s\n",
           table.n_params / 1e9, (long long)cfg.L, (long long)cfg.C, (long long)cfg.NH,
           (long long)cfg.NKV, (long long)cfg.F, (long long)cfg.V, cfg.tie_embeddings ? ", tied" : "");
    printf("step: %d micro-batches x %lld x %lld = %.0f tokens, %s, %d slots\n", M, (long long)B,
           (long long)T, tokens, fp32 ? "fp32" : "bf16", slots);
    mt_cuda_backend_opts bo;
    mt_plan plan = {0};
    mt_plan_request req = {0};
    int manual = gpu_grads >= 0 || host_ckpt;
    if (manual) { /* the old global switches, for comparisons */
        bo = (mt_cuda_backend_opts){.precision = fp32 ? MT_GPU_FP32 : MT_GPU_BF16, .slots = slots,
                                    .host_checkpoints = host_ckpt, .keep_layers = keep,
                                    .gpu_grads = gpu_grads != 0,
                                    .host_grad_bf16 = grad_dtype == 1};
    } else {
        if (mt_runner_plan_cuda(&req, &plan, &cfg, &table, M, B, T, fp32, gpu_mem, host_mem,
                           grad_dtype, keep, all_gpu, slots, calib, stdout, &err))
            goto fail;
        if (!plan.fits) {
            fprintf(stderr, "megatrain bench train: the run does not fit: %s\n", plan.why);
            return 1;
        }
        mt_plan_backend_opts(&plan, &req, &bo);
    }
    double t0 = mt_now_s();
    mt_host_store store;
    if (mt_host_store_create(&store, &table, 0, &err)) goto fail;
    mt_host_store_init_random(&store, 1, 0.02f);
    printf("host store: %.1f GB (%.2f bytes/param), ready in %.1fs\n", store.bytes / 1e9,
           (double)store.bytes / table.n_params, mt_now_s() - t0);
    t0 = mt_now_s();
    mt_backend *be = mt_cuda_backend_create(&cfg, &table, &store, M, B, T, &bo, &err);
    if (!be) goto fail;
    size_t pinned = mt_cuda_backend_host_bytes(&cfg, &table, M, B, T, &bo);
    printf("gpu: %.2f GB allocated, %d of %lld layers keep their activations, host pinned in "
           "%.1fs\n", mt_cuda_backend_device_bytes(be) / 1e9, mt_cuda_backend_kept_layers(be),
           (long long)cfg.L, mt_now_s() - t0);
    mt_optimizer opt = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                        .max_grad_norm = 1.0f};
    opt.sched = mt_lr_schedule_make(MT_LR_CONSTANT, 1e-5, 0, steps + 1);
    if (mt_optim_cpu_init(&opt.cpu, 0, &err)) goto fail;
    mt_optim_pipeline pipe;
    mt_grad_source src = {be, grads_begin, grads_wait};
    if (mt_optim_pipeline_init(&pipe, &opt, &store, &src, &err)) goto fail;
    gate_timer gt = {.p = &pipe};
    mt_cuda_backend_set_weight_gate(be, timed_gate, &gt);

    size_t n = (size_t)tokens;
    int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
    mt_batch_fill_random(tok, tgt, n, cfg.V);
    mt_batch batch = {.M = M, .B = B, .T = T, .tokens = tok, .targets = tgt};
    printf("%5s %9s %9s %9s %9s %9s %9s %9s %8s %8s\n", "step", "loss", "step_s", "TFLOPS",
           "tok/s", "fwd_s", "bwd_s", "optwait_s", "H2D_GB/s", "D2H_GB/s");
    double sum_t = 0, prev = mt_now_s();
    int timed = 0;
    mt_trace trace = {0};
    for (int64_t s = 0; s <= steps; s++) {
        gt.waited_s = 0;
        if (trace_path && s == 1) mt_cuda_backend_set_trace(be, &trace);
        double loss;
        if (mt_step_forward_backward(be, table.n_layers, &batch, &loss, &err)) goto fail;
        const double *sq = mt_cuda_backend_layer_sumsq(be);
        double total = 0;
        for (int l = 0; l < table.n_layers; l++) total += sq[l];
        mt_optim_report rep;
        mt_optim_pipeline_wait_all(&pipe);
        if (trace_path && s >= 2)
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
        printf("%5lld %9.4f %9.3f %9.1f %9.0f %9.3f %9.3f %9.3f %8.1f %8.1f%s\n", (long long)s,
               loss, dt, flops / dt / 1e12, tokens / dt, st.forward_ms / 1e3,
               st.backward_ms / 1e3, gt.waited_s, st.h2d_bytes / (st.total_ms / 1e3) / 1e9,
               st.d2h_bytes / (st.total_ms / 1e3) / 1e9, s == 0 ? "  (warm-up)" : "");
        fflush(stdout);
        if (s > 0) {
            sum_t += dt;
            timed++;
        }
    }
    mt_optim_pipeline_wait_all(&pipe);
    if (trace_path) {
        if (mt_trace_write(&trace, trace_path, &err)) goto fail;
        printf("trace: %zu spans written to %s\n", trace.n, trace_path);
        mt_trace_free(&trace);
    }
    printf("optimizer: %.3fs per step on the CPU (%.2f Gparam/s), overlapped with the next "
           "forward\n", pipe.busy_s, table.n_params / pipe.busy_s / 1e9);
    double avg = sum_t / timed;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    double hbpp = (double)(store.bytes + pinned) / table.n_params;
    if (!manual)
        printf("predicted step %.3f s, measured %.3f s (%+.1f%%)\n", plan.pred.step, avg,
               100.0 * (plan.pred.step - avg) / avg);
    if (gpu_mem > 0 && (double)(tot - fr) > gpu_mem * 1e9)
        printf("BUDGET EXCEEDED: the GPU holds %.2f GB, the budget is %.2f GB\n",
               (tot - fr) / 1e9, gpu_mem);
    printf("RESULT model=%.2fB tokens/step=%.0f step_s=%.3f TFLOPS=%.1f tok/s=%.0f "
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
    fprintf(stderr, "megatrain bench train: %s\n", err.msg);
    return 1;
#endif
}
