/* A model ready to run on one backend (CPU or CUDA), for the commands that
 * build one: train, generate, eval. */
#ifndef MT_TRAIN_RUNNER_H
#define MT_TRAIN_RUNNER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "data/tokenizer.h"
#include "engine/backend.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"

typedef struct mt_runner {
    mt_backend *be;
    int gpu;           /* the backend is CUDA */
    int n_layers;
    int64_t B, T;
    int M;
} mt_runner;

/* The placement of a CUDA training run (the planner's), made before the
 * host store exists. */
typedef struct mt_runner_plan mt_runner_plan;

typedef struct mt_runner_opts {
    int device;        /* 0 auto, 1 cpu, 2 cuda */
    int fp32;          /* GPU precision fp32 instead of bf16 */
    int host_saved_inputs; /* no planner: every saved input on the host */
    int train;         /* gradients needed */
    double gpu_mem_gb, host_mem_gb; /* budgets, 0: the machine's */
    int host_grad_dtype;            /* -1 planner's choice, 0 fp32, 1 bf16 */
    int saved_bf16;                 /* host-saved inputs in bf16 (bf16 runs on the GPU) */
    const char *calibration;        /* rates file, or NULL: probe this machine */
    const mt_runner_plan *plan;     /* from mt_runner_plan_make, or NULL */
    /* A rank of a data-parallel run of `ranks` (0 or 1: alone): the store
     * holds its parts (dist/shard.h); comm is the GPUs' communicator
     * (train/ranks.h) */
    int rank, ranks;
    void *comm;
    double link_gbs;  /* the collectives' measured rate, for the planner */
    const char *nvme_dir;    /* the disk tier (mt_gpu_plan_args) */
    double disk_mem_gb;
    int disk_layers;
    int disk_saved_layers;
    int disk_weight_layers;
    int disk_sharers;
    double disk_gbs[3];
} mt_runner_opts;

/* A model loaded for inference: config, parameter table, weights (no
 * gradient array) and tokenizer. */
typedef struct mt_loaded_model {
    mt_config cfg;
    mt_param_table table;
    mt_host_store store;
    mt_tokenizer *tok;
} mt_loaded_model;

/* Loads the HF directory dir and its tokenizer (tokpath; NULL means
 * dir/tokenizer.json; "bytes" the built-in byte tokenizer). */
int mt_loaded_model_open(mt_loaded_model *m, const char *dir, const char *tokpath, mt_error *err);
void mt_loaded_model_close(mt_loaded_model *m);

/* "auto" -> 0, "cpu" -> 1, "cuda" -> 2, anything else -> -1. */
int mt_runner_parse_device(const char *name);

/* Whether the GPU path would be used for `device` (0 auto, 1 cpu, 2 cuda);
 * -1 with a message when cuda is asked for and absent. */
int mt_runner_pick_gpu(int device, mt_error *err);

/* mt_runner_pick_gpu for a model of cfg: the one place that would send a
 * family without GPU kernels to the CPU (every family has them now). */
int mt_runner_pick_gpu_for(int device, const mt_config *cfg, mt_error *err);

/* Creates the backend for M micro-batches of (B, T): on the GPU with
 * o->plan's placement when given. */
int mt_runner_init(mt_runner *r, const mt_config *cfg, const mt_param_table *t,
                   mt_host_store *store, int M, int64_t B, int64_t T, const mt_runner_opts *o,
                   mt_error *err);
void mt_runner_free(mt_runner *r);

/* For training on the GPU: chooses the placement within the budgets and
 * prints it to log; -1 with the planner's refusal (which budget, by how
 * much, the cheapest change) when nothing fits. *out is NULL on the CPU
 * (whose store then needs its gradient array). */
int mt_runner_plan_make(mt_runner_plan **out, const mt_config *cfg, const mt_param_table *t,
                        int M, int64_t B, int64_t T, const mt_runner_opts *o, FILE *log,
                        mt_error *err);
void mt_runner_plan_free(mt_runner_plan *p);

/* The layers whose m and v the plan keeps on disk (the last ones). */
int mt_runner_plan_disk_layers(const mt_runner_plan *p);
/* Of them, the last whose fp32 weights are on disk too (0 without a plan). */
int mt_runner_plan_disk_weight_layers(const mt_runner_plan *p);

struct mt_plan;
struct mt_plan_request;

/* What a GPU run's placement is planned from (budgets in GB, 0: the
 * machine's). */
typedef struct mt_gpu_plan_args {
    int fp32;                  /* precision fp32 instead of bf16 */
    double gpu_mem_gb, host_mem_gb;
    int grad_dtype;            /* host gradients: -1 planner's choice, 0 fp32, 1 bf16 */
    int saved_bf16;            /* host-saved inputs in bf16 */
    int keep;                  /* kept layers: -1 planner's choice */
    int all_gpu;               /* every gradient and checkpoint on the GPU */
    int slots;                 /* weight slots, 0: default */
    int gpu_adam;              /* device layers: -1 planner's choice */
    int rank, ranks;           /* a rank of several (0 or 1: alone) */
    double link_gbs;           /* the collectives' measured rate (several), 0: the rates' */
    const char *calib;         /* rates file, or NULL: probe this machine */
    /* The disk tier: directories (NULL or "": none), the bytes it may take
     * (0: their free space), and the layers it holds (-1 the planner's
     * choice); the ranks sharing those drives and bytes (a machine's; 0 or
     * 1: this one alone); its rates (GB/s read, write, both at once) from
     * calib, else disk_gbs where measured by the ranks (0: not), else
     * measured here. */
    const char *nvme_dir;
    double disk_mem_gb;
    int disk_layers;
    int disk_sharers;
    double disk_gbs[3];
    /* saved layer inputs on disk (the first N that would wait in host RAM;
     * -1 the planner's choice, 0 none: mt_plan_request.disk_saved_layers) */
    int disk_saved_layers;
    /* of the disk layers, the last whose fp32 weights live there too (-1
     * the planner's choice, 0 none: mt_plan_request.disk_weight_layers) */
    int disk_weight_layers;
} mt_gpu_plan_args;

/* The planning step itself, for the commands that drive the GPU backend
 * directly (bench train): rates from a->calib or a probe of this GPU. */
int mt_runner_plan_gpu(struct mt_plan_request *req, struct mt_plan *plan, const mt_config *cfg,
                       const mt_param_table *t, int M, int64_t B, int64_t T,
                       const mt_gpu_plan_args *a, FILE *log, mt_error *err);

/* Logits (V) of row `row` of micro-batch 0 after mt_step_eval. */
void mt_runner_logits(const mt_runner *r, int64_t row, float *logits);

#endif
