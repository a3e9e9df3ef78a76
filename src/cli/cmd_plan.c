/* megatrain plan: the placement the planner chooses for a run (where each
 * layer's gradient and saved input live, which layers keep activations),
 * the bytes per tier and the predicted step, against this machine or a
 * described one; refuses, before allocating anything, what fits nowhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device.h"
#include "cli/cli_options.h"
#include "cli/commands.h"
#include "io/hub_cache.h"
#include "io/model_io.h"
#include "model/config.h"
#include "model/params.h"
#include "model/presets.h"
#include "plan/planner.h"

typedef struct plan_args {
    const char *model, *preset, *gpu, *calibration;
    int64_t hidden, layers, heads, kv_heads, ffn, vocab, seq_len, batch_size, micro_batches;
    double gpu_mem, host_mem, pcie_gbs, gemm_tflops, attn_tflops, adam_gparams;
    int64_t gpus, nodes;
    double nvlink_gbps, net_gbps, disk_mem, disk_gbps;
    int64_t disk_saved_layers, disk_weight_layers;
    int precision, host_grad_dtype, saved_input_dtype;
    bool given[32];
} plan_args;

#define OFF(field) offsetof(plan_args, field)
#define RATE(name, what)                                                                \
    {#name, MT_OPT_FLOAT, OFF(name), "0", NULL, MT_OPT_NONNEG, NULL, "X", NULL, what \
     " (overrides the machine's rate); 0: the machine's"}
static const mt_opt options[] = {
    {"model", MT_OPT_TEXT, OFF(model), "", NULL, MT_OPT_ANY, NULL, "DIR", "The model",
     "a Hugging Face model directory (its config.json)"},
    MT_CLI_PRESET(plan_args, "", NULL),
    MT_CLI_SHAPE(plan_args, "0", "0", "0", "0", "0", NULL, ""),
    {"vocab", MT_OPT_INT, OFF(vocab), "32000", NULL, MT_OPT_AT_LEAST(1), NULL, "N", NULL,
     "vocabulary of a shape given by its flags"},
    MT_CLI_BATCH(plan_args, "2048", "8", "4", "The step"),
    MT_CLI_PRECISION(plan_args, NULL),
    MT_CLI_BUDGETS(plan_args, "Budgets", "--gpu's, else what is free on this GPU, else 139"),
    {"gpu", MT_OPT_TEXT, OFF(gpu), "", NULL, MT_OPT_ANY, NULL, "NAME",
     "The machine (default: rates measured on an H200)",
     "a described GPU, " MT_GPU_NAMES ": its memory and assumed rates"},
    MT_CLI_CALIBRATION(plan_args),
    RATE(pcie_gbs, "host<->GPU copies, GB/s each way"),
    RATE(gemm_tflops, "matrix products, TFLOPS"),
    RATE(attn_tflops, "attention forward, TFLOPS (the backward 0.7 of it)"),
    RATE(adam_gparams, "the CPU AdamW, Gparam/s"),
    {"gpus", MT_OPT_INT, OFF(gpus), "1", NULL, MT_OPT_AT_LEAST(1), NULL, "N",
     "Several GPUs (a rank each; the step's micro-batches shared among them)",
     "GPUs of each machine (its --host-mem shared among them)"},
    {"nodes", MT_OPT_INT, OFF(nodes), "1", NULL, MT_OPT_AT_LEAST(1), NULL, "K", NULL,
     "machines, each with --gpus GPUs"},
    RATE(nvlink_gbps, "collectives between the GPUs of a machine, GB/s bus bandwidth"),
    {"net_gbps", MT_OPT_FLOAT, OFF(net_gbps), "25", NULL, MT_OPT_NONNEG, NULL, "X", NULL,
     "collectives across machines, GB/s a GPU (25: 200 Gb/s a GPU, an assumption)"},
    {"disk_mem", MT_OPT_FLOAT, OFF(disk_mem), "0", NULL, MT_OPT_NONNEG, NULL, "GB",
     "The disk tier (each machine's, shared by its GPUs)",
     "disk for the Adam state of the layers the host budget cannot hold; 0: no disk tier"},
    RATE(disk_gbps, "the disk tier's reads and writes, GB/s each (2 when not measured)"),
    {"disk_saved_layers", MT_OPT_INT, OFF(disk_saved_layers), "-1", NULL, MT_OPT_AT_LEAST(-1),
     NULL, "N", NULL, "with --disk-mem: the saved inputs of the first N layers that would wait "
     "in host RAM live on disk instead (written in the forward, read back in the backward); "
     "-1: the planner's choice (none unless RAM is short)"},
    {"disk_weight_layers", MT_OPT_INT, OFF(disk_weight_layers), "-1", NULL, MT_OPT_AT_LEAST(-1),
     NULL, "N", NULL, "with --disk-mem: of the disk layers, the last N keep their fp32 weights "
     "there too and RAM a bf16 copy (bf16, one GPU); -1: the planner's choice (none unless RAM "
     "is short with every layer's m and v on disk)"},
};
#undef RATE
#undef OFF
static const mt_opt_alias aliases[] = {
    {"gpu_gb", "gpu_mem", MT_ALIAS_DEPRECATED},
    {"host_ram_gb", "host_mem", MT_ALIAS_DEPRECATED},
};
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
    int ranks = req->ranks > 1 ? req->ranks : 1; /* the option counts every GPU's */
    if (best_M > req->M)
        printf("more tokens per step: --micro-batches %d (%lld tokens%s) is predicted at %.0f "
               "model TFLOPS%s; the CPU optimizer and the weight copies take about the same time "
               "per step whatever the tokens, so more compute hides more of them\n",
               best_M * ranks, (long long)best_M * req->B * req->T, ranks > 1 ? " a GPU" : "",
               best, ranks > 1 ? " a GPU" : "");
}

/* The model's config: a directory's, a preset's or the shape's flags.
 * Returns -1, or the exit code after an error. */
static int plan_config(const plan_args *a, mt_config *cfg) {
    mt_error err;
    if (a->model) {
        char dir[4096];
        if (mt_hub_model_dir(a->model, dir, sizeof dir, &err) || mt_model_load_config(cfg, dir, &err))
            return mt_cli_fail("plan", 1, "%s", err.msg);
    } else if (a->preset) {
        const mt_preset *p = mt_cli_preset("plan", a->preset);
        if (!p) return 2;
        mt_preset_config(p, a->seq_len, cfg);
        if (a->layers) cfg->L = a->layers; /* a preset's shape with fewer or more layers */
    } else {
        if (!a->hidden || !a->layers || !a->heads || !a->ffn)
            return mt_cli_fail("plan", 2, "give --model DIR, --preset NAME, or --hidden, "
                               "--layers, --heads and --ffn");
        mt_config_default_tiny(cfg);
        cfg->C = a->hidden;
        cfg->L = a->layers;
        cfg->NH = a->heads;
        cfg->NKV = a->kv_heads ? a->kv_heads : a->heads;
        cfg->HD = a->hidden / a->heads;
        cfg->F = a->ffn;
        cfg->V = a->vocab;
        cfg->tie_embeddings = 0;
        cfg->max_pos = a->seq_len;
    }
    if (a->seq_len > cfg->max_pos) cfg->max_pos = a->seq_len;
    return -1;
}

/* The GPU budget: --gpu-mem, the described GPU's, what is free on this
 * one, or an H200's; *src says which. */
static double gpu_budget_gb(const plan_args *a, const mt_gpu_spec *gpu, const char **src) {
    *src = "given";
    if (a->gpu_mem) return a->gpu_mem;
    if (gpu) return *src = gpu->what, gpu->mem_gb;
    double fr = 0;
    if (mt_device_memory(&fr, NULL) == 0) return *src = "free on this GPU", fr / 1e9;
    *src = "assumed: no GPU here";
    return 139;
}

/* The machine's rates: a calibrate file's, the described GPU's or the
 * defaults, with the flags' over them. */
static int plan_rates(const plan_args *a, const mt_gpu_spec *gpu, mt_rates *r, mt_error *err) {
    if (a->calibration) {
        if (mt_rates_load(r, a->calibration, err)) return -1;
    } else if (gpu) {
        mt_rates_for_gpu(r, gpu);
    } else {
        mt_rates_default(r);
    }
    if (a->pcie_gbs) r->h2d_gbs = r->d2h_gbs = a->pcie_gbs;
    if (a->gemm_tflops) r->gemm_tflops = a->gemm_tflops;
    if (a->attn_tflops)
        r->attn_fwd_tflops = a->attn_tflops, r->attn_bwd_tflops = a->attn_tflops * 0.7;
    if (a->adam_gparams) r->adam_gparams = a->adam_gparams;
    if (a->pcie_gbs || a->gemm_tflops || a->attn_tflops || a->adam_gparams)
        snprintf(r->source + strlen(r->source), sizeof r->source - strlen(r->source), ", flags");
    return 0;
}

/* The plan of req and what it predicts; 0, or 1 when the run fits nowhere. */
static int print_plan(const mt_plan_request *req, const mt_param_table *t) {
    mt_error err;
    mt_plan plan;
    int rc = mt_plan_make(req, &plan, &err);
    if (rc) {
        mt_cli_fail("plan", 1, "%s", err.msg);
    } else if (!plan.fits) {
        printf("\nmegatrain plan: this run does not fit: %s\n", plan.why);
        rc = 1;
    } else {
        mt_plan_print(&plan, req, stdout);
        double tok = (double)(req->M * req->B * req->T);
        double tflops = mt_config_train_flops_per_token(req->cfg, req->T) * tok / plan.pred.step /
                        1e12;
        printf("PLAN model=%.2fB host_GB=%.1f gpu_GB=%.1f host_bytes_per_param=%.2f "
               "step_s=%.2f TFLOPS=%.0f host_grads=%s kept=%d gpus=%d tok/s=%.0f\n",
               t->n_params / 1e9, plan.host_bytes / 1e9, plan.gpu_bytes / 1e9,
               (plan.store_bytes + plan.pinned_bytes) / (double)t->n_params * req->ranks,
               plan.pred.step, tflops, plan.host_grad_bf16 ? "bf16" : "fp32", plan.n_keep,
               req->ranks > 1 ? req->ranks : 1,
               tok * (req->ranks > 1 ? req->ranks : 1) / plan.pred.step);
        suggest_micro_batches(req, tflops);
    }
    mt_plan_free(&plan);
    return rc;
}

static int run(void *args, int argc, char **argv) {
    mt_cli_warn_launcher("plan");
    plan_args *a = args;
    const mt_gpu_spec *gpu = NULL;
    if (a->gpu && !(gpu = mt_gpu_spec_find(a->gpu)))
        return mt_cli_fail("plan", 2, "--gpu: unknown value '%s' (allowed: %s); for another GPU "
                           "give --gpu-mem and the rates, or a megatrain calibrate file", a->gpu,
                           MT_GPU_NAMES);
    if (gpu && a->calibration)
        return mt_cli_fail("plan", 2, "--gpu and --calibration both give the rates; give one");
    mt_config cfg;
    int rc;
    if ((rc = plan_config(a, &cfg)) >= 0) return rc;
    mt_error err;
    mt_param_table t;
    if (mt_config_validate(&cfg, a->model ? a->model : "the shape", &err) ||
        mt_params_init(&t, &cfg, &err))
        return mt_cli_fail("plan", 1, "%s", err.msg);
    int64_t M = a->micro_batches, B = a->batch_size, T = a->seq_len;
    int ranks = (int)(a->gpus * a->nodes);
    if (M % ranks) {
        mt_params_free(&t);
        return mt_cli_fail("plan", 2, "--micro-batches %lld cannot be shared by %d GPUs: each "
                           "takes the same number of every step's; use a multiple of %d",
                           (long long)M, ranks, ranks);
    }
    mt_plan_request req = {.cfg = &cfg, .t = &t, .M = (int)(M / ranks), .B = B, .T = T,
                           .precision = a->precision ? MT_GPU_FP32 : MT_GPU_BF16,
                           .host_grad_dtype = a->host_grad_dtype - 1,
                           .saved_bf16 = a->saved_input_dtype == 1, .keep_layers = -1,
                           .device_optim = -1, .rank = 0, .ranks = ranks};
    const char *gpu_src;
    double gpu_gb = gpu_budget_gb(a, gpu, &gpu_src);
    req.gpu_budget = gpu_gb * 1e9;
    req.host_budget = (a->host_mem ? a->host_mem * 1e9 : mt_plan_default_host_budget()) /
                      (double)a->gpus;
    if (plan_rates(a, gpu, &req.rates, &err)) {
        mt_params_free(&t);
        return mt_cli_fail("plan", 1, "%s", err.msg);
    }
    /* each machine's disk budget and rates shared by its GPUs' ranks */
    req.disk_budget = a->disk_mem * 1e9 / (double)a->gpus;
    req.disk_layers = a->disk_mem > 0 ? -1 : 0;
    req.disk_saved_layers = a->disk_mem > 0 ? (int)a->disk_saved_layers : 0;
    req.disk_weight_layers = a->disk_mem > 0 ? (int)a->disk_weight_layers : 0;
    req.disk_sharers = (int)a->gpus;
    if (a->disk_gbps) req.rates.disk_read_gbs = req.rates.disk_write_gbs = a->disk_gbps;
    /* a ring across machines runs at the network's pace */
    if (a->nvlink_gbps) req.rates.link_gbs = a->nvlink_gbps;
    if (a->nodes > 1 && a->net_gbps < req.rates.link_gbs) req.rates.link_gbs = a->net_gbps;
    printf("model: %s, %.2fB parameters, %lld layers, hidden %lld, ffn %lld, vocab %lld\n",
           a->model ? a->model : a->preset ? a->preset : "shape from flags", t.n_params / 1e9,
           (long long)cfg.L, (long long)cfg.C, (long long)cfg.F, (long long)cfg.V);
    printf("step: %lld x %lld x %lld = %lld tokens; saved layer inputs %.2f GB per layer\n",
           (long long)M, (long long)B, (long long)T, (long long)(M * B * T),
           (double)(M * B * T) * cfg.C * (a->saved_input_dtype == 1 ? 2 : 4) / 1e9);
    printf("budgets: GPU %.1f GB (%s), host %.1f GB%s\n", gpu_gb, gpu_src,
           req.host_budget / 1e9 * (double)a->gpus, a->host_mem ? "" : " (MemTotal less max(4 GB, 4%))");
    if (ranks > 1)
        printf("ranks: %lld GPUs on each of %lld machines, each GPU %d of the %lld micro-batches "
               "and 1/%d of every layer, %.1f GB of its machine's host budget; collectives at %.0f "
               "GB/s\n", (long long)a->gpus, (long long)a->nodes, req.M, (long long)M, ranks,
               req.host_budget / 1e9, req.rates.link_gbs);
    /* no GPU kernels run these blocks yet: what follows is not a run megatrain can make */
    if (mt_arch_cpu_only(cfg.arch))
        printf("note: model_type \"%s\" trains on the CPU only (no GPU kernels yet); the plan "
               "below projects a Llama-path model of the same tensors on the GPU, not a run "
               "megatrain makes today\n", cfg.model_type);
    rc = print_plan(&req, &t);
    mt_params_free(&t);
    return rc;
}

static const mt_opt_table table = {
    .command = "plan", MT_OPT_ROWS(options), MT_OPT_ALIASES(aliases), MT_OPT_STRUCT(plan_args),
    .about = "Where each layer's gradient and saved input live, the bytes per tier and the\n"
             "predicted step, for this machine or a described one; refuses what fits nowhere.\n"
             "The model: --model DIR, --preset NAME, or a shape by its flags: --hidden,\n"
             "--layers, --heads and --ffn (--kv-heads, --vocab); with --preset, --layers N\n"
             "alone gives that shape with N layers."};
const mt_cli_command mt_cli_plan = {
    "plan", "where each layer's buffers live, bytes per tier, predicted step", &table, run};
