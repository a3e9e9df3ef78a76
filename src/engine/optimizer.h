/* The optimizer step over the host store: global gradient norm, clipping
 * coefficient, learning rate from the schedule, and the fused AdamW update
 * of every tensor (weight decay on matrices only, like the Hugging Face
 * Trainer's parameter groups). */
#ifndef MT_ENGINE_OPTIMIZER_H
#define MT_ENGINE_OPTIMIZER_H

#include <stdint.h>

#include "host/store.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

typedef struct mt_optimizer {
    mt_optim_cpu cpu;
    mt_lr_schedule sched;
    double beta1, beta2, eps;
    double weight_decay;   /* for 2-D tensors; 1-D (norms, biases) get 0 */
    float max_grad_norm;   /* <= 0: no clipping */
    int64_t step;          /* updates done so far */
} mt_optimizer;

/* Results of one update, for logging. */
typedef struct mt_optim_report {
    float grad_norm;  /* before clipping */
    float clip_coef;  /* 1 when not clipped */
    double lr;
} mt_optim_report;

/* One layer's gradient as the optimizer reads it: fp32, or bf16 when it
 * waited on the host rounded (laid out like the layer's range of the
 * store either way). */
typedef struct mt_grad_view {
    const void *p;
    int bf16;
} mt_grad_view;

static inline mt_grad_view mt_grad_f32(const float *g) { return (mt_grad_view){g, 0}; }

/* Global norm of the gradient of layer l (sum of squares). */
double mt_optimizer_layer_sumsq(const mt_optimizer *o, const mt_host_store *s, int layer);

/* Updates layer l's tensors with the given coefficient and learning rate
 * from layer l's gradient g. */
void mt_optimizer_update_layer(const mt_optimizer *o, mt_host_store *s, int layer,
                               mt_grad_view g, float clip_coef, double lr);

/* The scalars of layer l's update, one per tensor (n_tensors entries), for
 * a kernel that runs it elsewhere (the GPU): the same numbers
 * mt_optimizer_update_layer uses. */
void mt_optimizer_layer_coefs(const mt_optimizer *o, const mt_param_table *t, int layer,
                              float clip_coef, double lr, mt_adamw_coefs *out);

/* Clip coefficient and learning rate of the next update from the global
 * sum of squares of the gradient. */
void mt_optimizer_plan(const mt_optimizer *o, double total_sumsq, mt_optim_report *rep);

/* The whole step: norm over all layers, then every layer's update. */
void mt_optimizer_step(mt_optimizer *o, mt_host_store *s, mt_optim_report *rep);

/* The step given the gradient's global sum of squares (several ranks: of
 * every rank's part): every layer of s updated from s's gradient. */
void mt_optimizer_apply(mt_optimizer *o, mt_host_store *s, double total_sumsq,
                        mt_optim_report *rep);

#endif
