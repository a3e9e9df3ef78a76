/* The optimizer running beside the GPU: after a step's backward, a worker
 * thread updates layers 0, 1, ... in the order the next forward needs them,
 * and the copy of layer l's weights to the GPU waits only for layer l.
 * Layers whose state lives on the GPU are handed to the source's update
 * first. */
#ifndef MT_ENGINE_OPTIM_PIPELINE_H
#define MT_ENGINE_OPTIM_PIPELINE_H

#include <pthread.h>

#include "engine/optimizer.h"

/* Where the worker finds layer l's gradient: begin(l) starts making it
 * available and returns where it will be, wait(l) blocks until it is.
 * Two layers may be in flight (l and l+1). NULL: the store's g array. */
typedef struct mt_grad_source {
    void *ctx;
    mt_grad_view (*begin)(void *ctx, int layer);
    void (*wait)(void *ctx, int layer);
    /* Layers 0..n_device-1 are updated where their state lives (the GPU),
     * not in the store: update(l, coefs) starts layer l's step with the
     * scalars of each of its tensors, and flush brings their state into
     * the store. */
    int n_device;
    void (*update)(void *ctx, int layer, const mt_adamw_coefs *coefs);
    void (*flush)(void *ctx);
} mt_grad_source;

typedef struct mt_optim_pipeline {
    mt_optimizer *opt;
    mt_host_store *store;
    mt_grad_source src;
    int n_layers;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running;      /* an update is in progress */
    int done;         /* layers of it finished */
    int quit;
    float coef;
    double lr;
    double busy_s;    /* time the worker spent updating, last step */
    double *t0_us, *t1_us; /* (n_layers) when each layer's update ran, last step */
    mt_adamw_coefs *coefs; /* (most tensors of a layer) the device layers' scalars */
    int stale;        /* the store lags the device layers' state (flush due) */
} mt_optim_pipeline;

int mt_optim_pipeline_init(mt_optim_pipeline *p, mt_optimizer *opt, mt_host_store *store,
                           const mt_grad_source *src, mt_error *err);
void mt_optim_pipeline_free(mt_optim_pipeline *p);

/* Starts the update of every layer from the gradient in the store, given
 * the global sum of squares; fills rep. Returns at once. */
void mt_optim_pipeline_start(mt_optim_pipeline *p, double total_sumsq, mt_optim_report *rep);

/* Blocks until layer l of the running update is written (no-op when none). */
void mt_optim_pipeline_wait_layer(mt_optim_pipeline *p, int layer);
/* Blocks until the running update is written, and the store holds every
 * layer's new state (device layers flushed): before saving, evaluating
 * or reading the store. */
void mt_optim_pipeline_wait_all(mt_optim_pipeline *p);
/* Blocks until the running update is written, device layers where they
 * live (no flush): between steps. */
void mt_optim_pipeline_wait_updates(mt_optim_pipeline *p);

/* Adapter for mt_cuda_backend_set_weight_gate (its contract). */
int mt_optim_pipeline_gate(void *p, int layer, int wait);

#endif
