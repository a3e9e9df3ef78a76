/* The placement planner (docs/placement.md): for each layer, where its gradient
 * waits for the optimizer and where its saved input lives, how many layers
 * keep their activations, and whether host gradients are rounded to bf16 —
 * chosen within a GPU budget and a host budget, fastest first by a
 * step-time model fed with measured rates (mt_rates).
 *
 * The engine's schedule does not change with the plan; only where buffers
 * live. The planner never allocates: it sizes placements with the
 * backend's own counting (mt_cuda_backend_bytes, _host_bytes: the GPU
 * memory layout, plain C, compiled in every build). Plain C itself, it
 * runs in every build, also without CUDA (megatrain plan on the machine
 * where someone sizes a purchase); what it measures on a GPU is behind
 * backend/cuda/planner_probe.h. */
#ifndef MT_PLAN_PLANNER_H
#define MT_PLAN_PLANNER_H

#include <stddef.h>
#include <stdio.h>

#include "backend/cuda/backend_cuda.h"
#include "plan/rates.h"

typedef struct mt_plan_request {
    const mt_config *cfg;
    const mt_param_table *t;
    int M;
    int64_t B, T;
    mt_gpu_precision precision;
    double gpu_budget;        /* bytes the run may take on the GPU, context included */
    double host_budget;       /* bytes of host RAM the run may take */
    int host_grad_dtype;      /* -1: planner's choice (fp32 when it fits), 0 fp32, 1 bf16 */
    int saved_bf16;           /* host-saved inputs in bf16 (mt_cuda_backend_opts) */
    int keep_layers;          /* -1: planner's choice */
    int all_gpu;              /* place every gradient and saved input on the GPU */
    int slots;                /* weight slots (0: default) */
    /* Leading layers whose AdamW runs on the GPU (mt_cuda_backend_opts.
     * device_optim_layers): -1 the planner's choice, else that many. */
    int device_optim;
    /* A rank of a data-parallel run of `ranks` GPUs (0 or 1: one GPU): its
     * store holds its part of every layer (the first rank's is the
     * largest), its gradients wait on the host, no layer's AdamW runs on
     * the GPU. */
    int rank, ranks;
    /* The disk tier: bytes of disk this rank's Adam state may take (0: no
     * disk tier), and how many of the last layers keep their m and v (this
     * rank's parts of them) there: -1 the planner's choice (none when the
     * host budget holds them, else the fewest it needs), else that many.
     * disk_sharers: the ranks whose disk tiers share the drives (a
     * machine's; 0 or 1: this one alone), each moving at that share of the
     * disk's rates. */
    double disk_budget;
    int disk_layers;
    int disk_sharers;
    /* Saved layer inputs on disk (mt_layer_home.saved_disk), in the same
     * budget at the same rates: -1 the planner's choice (none when RAM
     * holds them, else the fewest it needs, before any Adam layer goes
     * there), else the first N that would wait in host RAM (from layer 2:
     * written first in the forward and read last in the backward, the
     * most compute to hide both behind). disk_dirs: the directories, for
     * the backend (mt_plan_backend_opts). */
    int disk_saved_layers;
    const char *disk_dirs;
    /* Of the disk layers, the last ones whose fp32 weights live there too
     * (a bf16 copy in RAM, 2 bytes a parameter, and the tensors the GPU
     * reads in fp32; a bf16 run of one GPU only, never the embedding nor
     * a layer whose AdamW runs on the GPU): -1 the planner's choice (none
     * unless the host budget is short with every allowed layer's m and v
     * on disk), else that many (and at least that many disk layers). */
    int disk_weight_layers;
    mt_rates rates;
} mt_plan_request;

/* Predicted step, seconds. */
typedef struct mt_step_prediction {
    double fwd, bwd, step, opt, h2d_busy, d2h_busy, compute;
    double coll_busy;         /* several ranks: seconds of all-gathers and reduce-scatters */
    double disk_busy;         /* the disk tier: seconds it is busy (reads beside writes),
                               * the Adam state's and the saved inputs' */
    double disk_saved_busy;   /* of which the saved inputs' (written forward, read back) */
} mt_step_prediction;

typedef struct mt_plan {
    int n_layers;
    mt_layer_home *homes;     /* (n_layers) */
    int host_grad_bf16, n_keep;
    int n_dev;                /* layers 0..n_dev-1: AdamW on the GPU */
    int lean_keep;            /* kept layers rebuild their mid-block residual */
    int n_keep_down;          /* Gemma: layers before the kept ones keeping their down
                               * projection's output (mt_cuda_backend_opts) */
    double gpu_bytes;         /* the backend's allocation + the context reserve */
    double host_bytes;        /* store + pinned buffers + batch */
    double pinned_bytes;
    double store_bytes;
    int n_host_grads, n_host_saved;
    int n_disk;               /* the last n_disk layers keep their m and v on disk */
    int n_disk_w;             /* the last n_disk_w of them their fp32 weights too */
    double disk_bytes;        /* what they take there */
    int n_disk_saved;         /* saved inputs on disk (homes[l].saved_disk) */
    double disk_saved_bytes;  /* what they take there */
    mt_step_prediction pred;
    int fits;
    char why[768];            /* fits == 0: which budget, by how much, the cheapest change */
} mt_plan;

/* Chooses the placement. 0 with plan->fits set (or not, with plan->why);
 * -1 only for a broken request. */
int mt_plan_make(const mt_plan_request *req, mt_plan *plan, mt_error *err);
void mt_plan_free(mt_plan *plan);

/* The backend options that realise a plan (homes point into the plan). */
void mt_plan_backend_opts(const mt_plan *plan, const mt_plan_request *req,
                          mt_cuda_backend_opts *o);

/* Step time of a placement (homes, host gradient dtype, kept layers and
 * their units, device layers) under the request's rates. */
mt_step_prediction mt_plan_predict(const mt_plan_request *req, const mt_plan *plan);

/* Prints placement per layer group, bytes per tier and the predicted
 * breakdown. */
void mt_plan_print(const mt_plan *plan, const mt_plan_request *req, FILE *f);

/* Host bytes available by default: MemTotal less max(4 GB, 4%). */
double mt_plan_default_host_budget(void);

#endif
