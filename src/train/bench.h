/* The training benchmark behind `megatrain bench train`: warm-up and timed
 * steps of a synthetic model (random weights and tokens) on the GPU
 * streaming engine, placed by the planner within budgets (or by the global
 * switches, for comparisons). Reports model TFLOPS (docs/metrics.md: 6 *
 * params * tokens + 12 * layers * hidden * seq per token, with the active
 * parameters of an MoE model: docs/moe.md; over the whole step time
 * including the optimizer), tokens/s, the step breakdown, GPU and host
 * memory, the copy rates, and the planner's predicted step next to the
 * measured one. */
#ifndef MT_TRAIN_BENCH_H
#define MT_TRAIN_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "model/config.h"
#include "util/error.h"

typedef struct mt_bench_opts {
    mt_config cfg;          /* the shape (a preset, overridden) */
    int M;                  /* micro-batches per step */
    int64_t B, T, steps;    /* rows per micro-batch, sequence length, timed steps */
    int fp32, slots, keep;  /* precision, weight slots, kept layers (-1: as many as fit) */
    int gpu_grads;          /* -1: the planner; 0/1: every gradient on the host / GPU */
    int host_saved;          /* with gpu_grads >= 0: every saved input on the host */
    int grad_dtype;         /* host gradients: -1 planner's choice, 0 fp32, 1 bf16 */
    int saved_bf16;         /* host-saved inputs in bf16 */
    int all_gpu;            /* every gradient and checkpoint on the GPU */
    int gpu_adam;           /* leading layers whose AdamW runs on the GPU: -1 the planner's
                             * choice, else that many (0 none) */
    double gpu_mem, host_mem; /* budgets in GB, 0: the defaults */
    const char *calib;      /* rates file for the step-time model, or NULL (probe) */
    const char *trace_path; /* Chrome trace of the timed steps, or NULL */
    int gpus;               /* ranks of the run (0: as launched, one without a launcher);
                             * each runs M x B x T tokens a step on its own GPU */
    const char *nvme_dir;   /* the disk tier's directories, or NULL */
    double disk_mem;        /* GB of disk it may take, 0: their free space */
    int disk_layers;        /* last layers with m and v on disk: -1 the planner's choice */
    int disk_saved_layers;  /* saved inputs on disk (the first): -1 the planner's choice */
    int disk_weight_layers; /* of the disk layers, the last with fp32 weights there: -1 the
                             * planner's choice */
    int objective;          /* 0: cross-entropy; else a preference objective's step at the
                             * same tokens (train_config.h's mt_tc_objective): each row one
                             * pair, its halves the chosen and the rejected answer */
} mt_bench_opts;

/* Runs warm-up steps (one, two with a disk tier) and o->steps timed ones
 * and writes the plan, a line per step and the RESULT line to out. -1 with
 * err (a run that does not fit, no GPU, a build without CUDA). Run as one
 * rank of several (train/ranks.h: a launcher's variables), every rank
 * holds its part of the model and steps on its GPU; rank 0 writes the
 * report, with tokens/s of all the GPUs and model TFLOPS per GPU. */
int mt_bench_train_run(const mt_bench_opts *o, FILE *out, mt_error *err);

#endif
