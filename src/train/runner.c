/* Backend choice and creation, shared by training, evaluation and
 * generation; a model loaded for inference. */
#include "train/runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "engine/step.h"
#include "host/disk.h"
#include "io/hub_cache.h"
#include "io/model_io.h"
#include "util/mem.h"

#include "backend/device.h"
#include "plan/planner.h"
#include "util/sys.h"

int mt_loaded_model_open(mt_loaded_model *m, const char *dir, const char *tokpath, mt_error *err) {
    memset(m, 0, sizeof *m);
    char tp[4200], found[4096];
    if (mt_hub_model_dir(dir, found, sizeof found, err)) return -1;
    dir = found;
    if (!tokpath) {
        snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
        tokpath = tp;
    }
    if (mt_model_load_config(&m->cfg, dir, err) || mt_params_init(&m->table, &m->cfg, err) ||
        mt_host_store_create(&m->store, &m->table, 0, err) ||
        mt_model_load_weights(&m->store, dir, err)) {
        mt_loaded_model_close(m);
        return -1;
    }
    m->tok = !strcmp(tokpath, "bytes") ? mt_tokenizer_bytes() : mt_tokenizer_load(tokpath, err);
    if (!m->tok) {
        mt_loaded_model_close(m);
        return -1;
    }
    return 0;
}

void mt_loaded_model_close(mt_loaded_model *m) {
    if (m->tok) mt_tokenizer_free(m->tok);
    mt_host_store_free(&m->store);
    mt_params_free(&m->table);
    memset(m, 0, sizeof *m);
}

int mt_runner_parse_device(const char *name) {
    return !strcmp(name, "auto") ? 0 : !strcmp(name, "cpu") ? 1 : !strcmp(name, "cuda") ? 2 : -1;
}

int mt_runner_pick_gpu(int device, mt_error *err) {
    int have = mt_device_count() > 0;
    if (device == 1) return 0;
    if (device == 2 && !have)
        return mt_errorf(err, "--device cuda: no CUDA GPU is visible (or this build has no CUDA); "
                         "use --device cpu");
    return have;
}

int mt_runner_pick_gpu_for(int device, const mt_config *cfg, mt_error *err) {
    int gpu = mt_runner_pick_gpu(device, err);
    /* a family with CPU references only (mt_arch_cpu_only) */
    if (gpu <= 0 || !mt_arch_cpu_only(cfg->arch)) return gpu;
    if (device == 0) return 0;
    return mt_errorf(err, "--device cuda: model_type \"%s\" has no GPU kernels yet; use "
                     "--device cpu", cfg->model_type);
}

struct mt_runner_plan {
    mt_plan_request req;
    mt_plan plan;
};

/* The disk tier's part of the request: its budget, its layers, and its
 * rates (measured now, 4 GiB each way: a virtual disk's first GB can run
 * faster or slower than its sustained rate; where the rates file has none). */
static int plan_disk(mt_plan_request *req, const mt_gpu_plan_args *a, FILE *log, mt_error *err) {
    if (!a->nvme_dir || !a->nvme_dir[0] ||
        (a->disk_layers == 0 && a->disk_saved_layers == 0 && a->disk_weight_layers <= 0))
        return 0;
    req->disk_layers = a->disk_layers;
    req->disk_saved_layers = a->disk_saved_layers;
    req->disk_weight_layers = a->disk_weight_layers;
    req->disk_dirs = a->nvme_dir;
    if (a->disk_mem_gb > 0) req->disk_budget = a->disk_mem_gb * 1e9;
    else if (mt_disk_free_bytes(a->nvme_dir, &req->disk_budget, err)) return -1;
    req->disk_sharers = a->disk_sharers;
    if (a->disk_sharers > 1) req->disk_budget /= a->disk_sharers;
    mt_rates *r = &req->rates;
    if (r->disk_read_gbs > 0) return 0;
    if (a->disk_gbs[0] > 0) {
        r->disk_read_gbs = a->disk_gbs[0], r->disk_write_gbs = a->disk_gbs[1];
        r->disk_both_gbs = a->disk_gbs[2];
        return 0;
    }
    double t0 = mt_now_s();
    if (mt_disk_measure(a->nvme_dir, (size_t)4 << 30, &r->disk_write_gbs, &r->disk_read_gbs,
                        &r->disk_both_gbs, err))
        return mt_error_prefix(err, "measuring the disk tier (--nvme-dir): ");
    if (log)
        fprintf(log, "disk %s: write %.2f GB/s, read %.2f GB/s, both at once %.2f GB/s, %.1f GB "
                "free (%.1fs)\n", a->nvme_dir, r->disk_write_gbs, r->disk_read_gbs,
                r->disk_both_gbs, req->disk_budget / 1e9, mt_now_s() - t0);
    return 0;
}

int mt_runner_plan_gpu(mt_plan_request *req, mt_plan *plan, const mt_config *cfg,
                       const mt_param_table *t, int M, int64_t B, int64_t T,
                       const mt_gpu_plan_args *a, FILE *log, mt_error *err) {
    *req = (mt_plan_request){.cfg = cfg, .t = t, .M = M, .B = B, .T = T,
                             .precision = a->fp32 ? MT_GPU_FP32 : MT_GPU_BF16,
                             .host_grad_dtype = a->grad_dtype, .saved_bf16 = a->saved_bf16,
                             .keep_layers = a->keep,
                             .all_gpu = a->all_gpu, .slots = a->slots,
                             .device_optim = a->gpu_adam, .rank = a->rank, .ranks = a->ranks};
    double fr = 0;
    if (mt_device_memory(&fr, NULL))
        return mt_errorf(err, "cannot read the GPU's free memory");
    /* default: what is free less 2 GB (fragmentation, other users); the
     * context already took its share of what is free, and the budget's
     * context reserve covers the libraries' workspaces */
    req->gpu_budget = a->gpu_mem_gb > 0 ? a->gpu_mem_gb * 1e9
                                        : fr - 2e9 + (double)MT_CUDA_CONTEXT_RESERVE;
    if (a->gpu_mem_gb > 0 && a->gpu_mem_gb * 1e9 > fr + MT_CUDA_CONTEXT_RESERVE)
        return mt_errorf(err, "--gpu-mem %.1f is more than this GPU has free (%.1f GB); lower it",
                         a->gpu_mem_gb, fr / 1e9);
    req->host_budget = a->host_mem_gb > 0 ? a->host_mem_gb * 1e9 : mt_plan_default_host_budget();
    double t0 = mt_now_s();
    if (a->calib) {
        if (mt_rates_load(&req->rates, a->calib, err)) return -1;
    } else if (mt_device_probe(&req->rates, cfg, M, B, T, a->fp32, err)) {
        return -1;
    }
    if (a->link_gbs > 0) req->rates.link_gbs = a->link_gbs;
    if (plan_disk(req, a, log, err)) return -1;
    if (log && a->ranks > 1)
        fprintf(log, "collectives: %d ranks, all-gather %.0f GB/s (bus bandwidth%s)\n", a->ranks,
                req->rates.link_gbs, a->link_gbs > 0 ? ", measured" : "");
    char down[48] = "";
    if (req->rates.layer_bwd_down_s > 0)
        snprintf(down, sizeof down, ", %.1f with the down output kept",
                 req->rates.layer_bwd_down_s * 1e3);
    if (log && !a->calib)
        fprintf(log, "probe: H2D %.1f GB/s, D2H %.1f GB/s (%.0f%% each with both busy), CPU "
                "AdamW %.2f Gparam/s, layer fwd %.1f ms, bwd %.1f ms (%.1f kept%s), head %.1f "
                "ms (%.1fs)\n", req->rates.h2d_gbs, req->rates.d2h_gbs, 100 * req->rates.duplex,
                req->rates.adam_gparams, req->rates.layer_fwd_s * 1e3,
                req->rates.layer_bwd_s * 1e3, req->rates.layer_bwd_kept_s * 1e3, down,
                req->rates.head_s * (double)cfg->V / req->rates.probe_V * 1e3, mt_now_s() - t0);
    if (mt_plan_make(req, plan, err)) return -1;
    if (log && plan->fits) mt_plan_print(plan, req, log);
    return 0;
}

int mt_runner_plan_make(mt_runner_plan **out, const mt_config *cfg, const mt_param_table *t,
                        int M, int64_t B, int64_t T, const mt_runner_opts *o, FILE *log,
                        mt_error *err) {
    *out = NULL;
    int gpu = mt_runner_pick_gpu_for(o->device, cfg, err);
    if (gpu < 0) return -1;
    if (!gpu || !o->train || o->host_saved_inputs) return 0;
    mt_runner_plan *p = mt_calloc_or_die(1, sizeof *p);
    mt_gpu_plan_args a = {.fp32 = o->fp32, .gpu_mem_gb = o->gpu_mem_gb,
                          .host_mem_gb = o->host_mem_gb, .grad_dtype = o->host_grad_dtype,
                          .saved_bf16 = o->saved_bf16,
                          .keep = -1, .gpu_adam = -1, .rank = o->rank, .ranks = o->ranks,
                          .link_gbs = o->link_gbs, .calib = o->calibration,
                          .nvme_dir = o->nvme_dir, .disk_mem_gb = o->disk_mem_gb,
                          .disk_layers = o->disk_layers, .disk_sharers = o->disk_sharers,
                          .disk_gbs = {o->disk_gbs[0], o->disk_gbs[1], o->disk_gbs[2]},
                          .disk_saved_layers = o->disk_saved_layers,
                          .disk_weight_layers = o->disk_weight_layers};
    if (mt_runner_plan_gpu(&p->req, &p->plan, cfg, t, M, B, T, &a, log, err)) {
        free(p);
        return -1;
    }
    if (!p->plan.fits) {
        mt_errorf(err, "the run does not fit: %s", p->plan.why);
        mt_runner_plan_free(p);
        return -1;
    }
    *out = p;
    return 0;
}

int mt_runner_plan_disk_layers(const mt_runner_plan *p) { return p ? p->plan.n_disk : 0; }
int mt_runner_plan_disk_weight_layers(const mt_runner_plan *p) {
    return p ? p->plan.n_disk_w : 0;
}

void mt_runner_plan_free(mt_runner_plan *p) {
    if (!p) return;
    mt_plan_free(&p->plan);
    free(p);
}

/* Without a planner (host saved inputs, gradients to the store's g), the
 * saved inputs of layers 1..N on disk instead with disk_saved_layers N
 * (homes that differ from the plain run's in that only: what the GPU test
 * of the disk tier compares bit for bit); NULL when there are none. */
static mt_layer_home *disk_saved_homes(const mt_runner_opts *o, int n_layers,
                                       mt_cuda_backend_opts *bo) {
    if (!o->host_saved_inputs || o->disk_saved_layers <= 0 || !o->nvme_dir || !o->nvme_dir[0])
        return NULL;
    mt_layer_home *h = mt_calloc_or_die((size_t)n_layers, sizeof *h);
    for (int l = 0; l < n_layers; l++)
        h[l] = (mt_layer_home){.grad_host = 1, .saved_host = 1,
                               .saved_disk = l >= 1 && l <= o->disk_saved_layers};
    bo->homes = h;
    bo->saved_disk_dirs = o->nvme_dir;
    return h;
}

int mt_runner_init(mt_runner *r, const mt_config *cfg, const mt_param_table *t,
                   mt_host_store *store, int M, int64_t B, int64_t T, const mt_runner_opts *o,
                   mt_error *err) {
    memset(r, 0, sizeof *r);
    r->n_layers = t->n_layers;
    r->M = M;
    r->B = B;
    r->T = T;
    int gpu = mt_runner_pick_gpu_for(o->device, cfg, err);
    if (gpu < 0) return -1;
    if (!gpu) {
        r->be = mt_cpu_backend_create(cfg, t, store, M, B, T, err);
        return r->be ? 0 : -1;
    }
    r->gpu = 1;
    mt_cuda_backend_opts bo = {.precision = o->fp32 ? MT_GPU_FP32 : MT_GPU_BF16,
                               .host_saved_inputs = o->host_saved_inputs,
                               .host_saved_bf16 = o->saved_bf16,
                               .keep_layers = o->train ? -1 : 0};
    if (o->plan) mt_plan_backend_opts(&o->plan->plan, &o->plan->req, &bo);
    bo.rank = o->rank;
    bo.ranks = o->ranks;
    bo.comm = (struct mt_nccl *)o->comm;
    mt_layer_home *homes = o->plan ? NULL : disk_saved_homes(o, t->n_layers, &bo);
    r->be = mt_device_backend_create(cfg, t, store, M, B, T, &bo, err);
    free(homes); /* the backend read them */
    return r->be ? 0 : -1;
}

void mt_runner_free(mt_runner *r) {
    if (!r->be) return;
    r->be->ops->destroy(r->be);
    r->be = NULL;
}

void mt_runner_logits(const mt_runner *r, int64_t row, float *logits) {
    r->be->ops->logits(r->be, 0, row, logits);
}
