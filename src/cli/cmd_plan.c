/* megatrain plan: the placement the planner chooses for a run (where each
 * layer's gradient and checkpoint live, which layers keep activations),
 * the bytes per tier and the predicted step, against this machine or a
 * described one; refuses, before allocating anything, what fits nowhere. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/args.h"
#include "cli/commands.h"
#include "io/model_io.h"
#include "model/config.h"
#include "model/params.h"
#include "model/presets.h"
#include "plan/planner.h"

#ifdef MT_HAVE_CUDA
#include "backend/cuda/planner_probe.h"
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain plan (--model DIR | --preset NAME | --hidden N --layers N --heads N\n"
            "                       [--kv-heads N] --ffn N [--vocab N]) [options]\n"
            "  --preset NAME       a published shape: %s\n"
            "                      (with --layers N: that shape with N decoder layers)\n"
            "  --seq-len T --batch-size B --micro-batches M   (default 2048, 8, 4)\n"
            "  --precision P       bf16 | fp32 (default bf16)\n"
            "  --gpu-mem GB        GPU memory for the run (default: --gpu's, else this GPU's free\n"
            "                      memory, else 139)\n"
            "  --host-mem GB       host RAM for the run (default: MemTotal less max(4 GB, 4%%))\n"
            "  --host-grad-dtype D auto | fp32 | bf16 (default auto: fp32 when it fits)\n"
            "a machine for the step-time model (default: rates measured on an H200):\n"
            "  --gpu NAME          a described GPU, %s: its memory and assumed rates\n"
            "  --calibration FILE  rates written by megatrain calibrate\n"
            "  --pcie-gbs X --gemm-tflops X --attn-tflops X --adam-gparams X   override rates\n",
            mt_preset_names(), mt_gpu_spec_names());
}

/* When the CPU optimizer or the copies, not compute, bound the step, more
 * micro-batches per step amortise them: doubles M while the plan still fits
 * and each doubling gains at least 10% model TFLOPS, and names the last. */
static void suggest_micro_batches(const mt_plan_request *req, double tflops) {
    mt_plan_request q = *req;
    int best_M = req->M;
    double best = tflops;
    for (int i = 0; i < 4; i++) {
        q.M = best_M * 2;
        mt_plan p = {0};
        mt_error err;
        int ok = mt_plan_make(&q, &p, &err) == 0 && p.fits;
        double t = ok ? mt_config_train_flops_per_token(q.cfg, q.T) * (double)q.M * q.B * q.T /
                            p.pred.step / 1e12
                      : 0;
        mt_plan_free(&p);
        if (!ok || t < best * 1.1) break;
        best_M = q.M;
        best = t;
    }
    if (best_M > req->M)
        printf("more tokens per step: --micro-batches %d (%lld tokens) is predicted at %.0f model "
               "TFLOPS; the CPU optimizer and the weight copies take about the same time per "
               "step whatever the tokens, so more compute hides more of them\n", best_M,
               (long long)best_M * req->B * req->T, best);
}

int mt_cmd_plan(int argc, char **argv) {
    const char *model = NULL, *preset = NULL, *calib = NULL, *gpu_name = NULL;
    long long C = 0, L = 0, NH = 0, NKV = 0, F = 0, V = 32000, T = 2048, B = 8, M = 4;
    double host_gb = 0, gpu_gb = 0, pcie = 0, gemm = 0, attn = 0, adam = 0;
    int fp32 = 0, gdt = -1;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},  {"hidden", required_argument, 0, 'C'},
        {"layers", required_argument, 0, 'L'}, {"heads", required_argument, 0, 'H'},
        {"kv-heads", required_argument, 0, 'K'}, {"ffn", required_argument, 0, 'F'},
        {"vocab", required_argument, 0, 'V'},  {"seq-len", required_argument, 0, 't'},
        {"batch-size", required_argument, 0, 'b'}, {"micro-batches", required_argument, 0, 'n'},
        {"host-ram-gb", required_argument, 0, 'r'}, {"gpu-gb", required_argument, 0, 'g'},
        {"host-mem", required_argument, 0, 'r'}, {"gpu-mem", required_argument, 0, 'g'},
        {"preset", required_argument, 0, 'p'},  {"precision", required_argument, 0, 'P'},
        {"host-grad-dtype", required_argument, 0, 'd'}, {"calibration", required_argument, 0, 'c'},
        {"pcie-gbs", required_argument, 0, 1},  {"gemm-tflops", required_argument, 0, 2},
        {"attn-tflops", required_argument, 0, 3}, {"adam-gparams", required_argument, 0, 4},
        {"gpu", required_argument, 0, 'G'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': preset = optarg; break;
        case 'c': calib = optarg; break;
        case 'G': gpu_name = optarg; break;
        case 'C': C = mt_arg_ll(optarg, &bad); break;
        case 'L': L = mt_arg_ll(optarg, &bad); break;
        case 'H': NH = mt_arg_ll(optarg, &bad); break;
        case 'K': NKV = mt_arg_ll(optarg, &bad); break;
        case 'F': F = mt_arg_ll(optarg, &bad); break;
        case 'V': V = mt_arg_ll(optarg, &bad); break;
        case 't': T = mt_arg_ll(optarg, &bad); break;
        case 'b': B = mt_arg_ll(optarg, &bad); break;
        case 'n': M = mt_arg_ll(optarg, &bad); break;
        case 'r': host_gb = mt_arg_d(optarg, &bad); break;
        case 'g': gpu_gb = mt_arg_d(optarg, &bad); break;
        case 1: pcie = mt_arg_d(optarg, &bad); break;
        case 2: gemm = mt_arg_d(optarg, &bad); break;
        case 3: attn = mt_arg_d(optarg, &bad); break;
        case 4: adam = mt_arg_d(optarg, &bad); break;
        case 'P':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
                fprintf(stderr, "megatrain plan: --precision must be bf16 or fp32\n");
                return 2;
            }
            fp32 = !strcmp(optarg, "fp32");
            break;
        case 'd':
            if (strcmp(optarg, "auto") && strcmp(optarg, "fp32") && strcmp(optarg, "bf16")) {
                fprintf(stderr, "megatrain plan: --host-grad-dtype must be auto, fp32 or bf16\n");
                return 2;
            }
            gdt = !strcmp(optarg, "auto") ? -1 : !strcmp(optarg, "bf16");
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain plan: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    if (T < 1 || B < 1 || M < 1 || host_gb < 0 || gpu_gb < 0 || pcie < 0 || gemm < 0 ||
        attn < 0 || adam < 0) {
        fprintf(stderr, "megatrain plan: --seq-len, --batch-size, --micro-batches must be >= 1 "
                "and rates and budgets positive\n");
        return 2;
    }
    const mt_gpu_spec *gpu = NULL;
    if (gpu_name && !(gpu = mt_gpu_spec_find(gpu_name))) {
        fprintf(stderr, "megatrain plan: unknown --gpu '%s' (%s); for another GPU give "
                "--gpu-mem and the rates, or a megatrain calibrate file\n", gpu_name,
                mt_gpu_spec_names());
        return 2;
    }
    if (gpu && calib) {
        fprintf(stderr, "megatrain plan: --gpu and --calibration both give the rates; give one\n");
        return 2;
    }
    mt_error err;
    mt_config cfg;
    if (model) {
        if (mt_model_load_config(&cfg, model, &err)) {
            fprintf(stderr, "megatrain plan: %s\n", err.msg);
            return 1;
        }
    } else if (preset) {
        const mt_preset *p = mt_preset_find(preset);
        if (!p) {
            fprintf(stderr, "megatrain plan: unknown preset '%s' (%s)\n", preset,
                    mt_preset_names());
            return 2;
        }
        mt_preset_config(p, T, &cfg);
        if (L) cfg.L = L; /* a preset's shape with fewer or more layers */
    } else {
        if (!C || !L || !NH || !F) {
            fprintf(stderr, "megatrain plan: give --model DIR, --preset NAME, or --hidden, "
                    "--layers, --heads and --ffn\n");
            return 2;
        }
        mt_config_default_tiny(&cfg);
        cfg.C = C;
        cfg.L = L;
        cfg.NH = NH;
        cfg.NKV = NKV ? NKV : NH;
        cfg.HD = C / NH;
        cfg.F = F;
        cfg.V = V;
        cfg.tie_embeddings = 0;
        cfg.max_pos = T;
    }
    if (T > cfg.max_pos) cfg.max_pos = T;
    mt_param_table t;
    if (mt_config_validate(&cfg, model ? model : "the shape", &err) ||
        mt_params_init(&t, &cfg, &err)) {
        fprintf(stderr, "megatrain plan: %s\n", err.msg);
        return 1;
    }
    mt_plan_request req = {.cfg = &cfg, .t = &t, .M = (int)M, .B = B, .T = T,
                           .precision = fp32 ? MT_GPU_FP32 : MT_GPU_BF16,
                           .host_grad_dtype = gdt, .keep_layers = -1, .device_optim = -1};
    const char *gpu_src = "given";
    if (!gpu_gb && gpu) {
        gpu_gb = gpu->mem_gb;
        gpu_src = gpu->what;
    }
#ifdef MT_HAVE_CUDA
    double fr = 0;
    if (!gpu_gb && mt_cuda_gpu_free_bytes(&fr) == 0) {
        gpu_gb = fr / 1e9;
        gpu_src = "free on this GPU";
    }
#endif
    if (!gpu_gb) {
        gpu_gb = 139;
        gpu_src = "assumed: no GPU here";
    }
    req.gpu_budget = gpu_gb * 1e9;
    req.host_budget = host_gb ? host_gb * 1e9 : mt_plan_default_host_budget();
    if (calib) {
        if (mt_rates_load(&req.rates, calib, &err)) {
            fprintf(stderr, "megatrain plan: %s\n", err.msg);
            mt_params_free(&t);
            return 1;
        }
    } else if (gpu) {
        mt_rates_for_gpu(&req.rates, gpu);
    } else {
        mt_rates_default(&req.rates);
    }
    if (pcie) req.rates.h2d_gbs = req.rates.d2h_gbs = pcie;
    if (gemm) req.rates.gemm_tflops = gemm;
    if (attn) req.rates.attn_fwd_tflops = attn, req.rates.attn_bwd_tflops = attn * 0.7;
    if (adam) req.rates.adam_gparams = adam;
    if (pcie || gemm || attn || adam)
        snprintf(req.rates.source + strlen(req.rates.source),
                 sizeof req.rates.source - strlen(req.rates.source), ", flags");
    printf("model: %s, %.2fB parameters, %lld layers, hidden %lld, ffn %lld, vocab %lld\n",
           model ? model : preset ? preset : "shape from flags", t.n_params / 1e9,
           (long long)cfg.L, (long long)cfg.C, (long long)cfg.F, (long long)cfg.V);
    printf("step: %lld x %lld x %lld = %lld tokens; checkpoints %.2f GB per layer\n", M, B, T,
           M * B * T, (double)(M * B * T) * cfg.C * 4 / 1e9);
    printf("budgets: GPU %.1f GB (%s), host %.1f GB%s\n", gpu_gb, gpu_src,
           req.host_budget / 1e9, host_gb ? "" : " (MemTotal less max(4 GB, 4%))");
    mt_plan plan;
    int rc = mt_plan_make(&req, &plan, &err);
    if (rc) {
        fprintf(stderr, "megatrain plan: %s\n", err.msg);
    } else if (!plan.fits) {
        printf("\nmegatrain plan: this run does not fit: %s\n", plan.why);
        rc = 1;
    } else {
        mt_plan_print(&plan, &req, stdout);
        double tok = (double)(M * B * T);
        double flops = mt_config_train_flops_per_token(&cfg, T) * tok;
        printf("PLAN model=%.2fB host_GB=%.1f gpu_GB=%.1f host_bytes_per_param=%.2f "
               "step_s=%.2f TFLOPS=%.0f host_grads=%s kept=%d\n", t.n_params / 1e9,
               plan.host_bytes / 1e9, plan.gpu_bytes / 1e9,
               (plan.store_bytes + plan.pinned_bytes) / (double)t.n_params, plan.pred.step,
               flops / plan.pred.step / 1e12, plan.host_grad_bf16 ? "bf16" : "fp32", plan.n_keep);
        suggest_micro_batches(&req, flops / plan.pred.step / 1e12);
    }
    mt_plan_free(&plan);
    mt_params_free(&t);
    return rc;
}
