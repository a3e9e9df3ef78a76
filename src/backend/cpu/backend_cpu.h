/* The CPU reference backend: the whole model in host memory, layers bound
 * by pointer into the host store, fp32 throughout. */
#ifndef MT_BACKEND_CPU_BACKEND_H
#define MT_BACKEND_CPU_BACKEND_H

#include "engine/backend.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"

/* Creates a backend for micro-batches of (B, T) tokens, up to max_M of them
 * per step. Allocates every buffer now; nothing is allocated per step. */
mt_backend *mt_cpu_backend_create(const mt_config *cfg, const mt_param_table *t,
                                  mt_host_store *store, int max_M, int64_t B, int64_t T,
                                  mt_error *err);
void mt_cpu_backend_free(mt_backend *be);

/* Work around each step, for a backend over a copy of the model that others
 * keep (dist/cpu_ranks.c): before runs first in begin_step (it fills the
 * weights), after at the end of end_step (it reduces the gradient); a
 * failure of either is the step's error (step_error). done runs when the
 * backend is freed. */
typedef struct mt_cpu_step_hooks {
    int (*before)(void *ctx, int train, mt_error *err);
    int (*after)(void *ctx, int train, mt_error *err);
    void (*done)(void *ctx);
    void *ctx;
} mt_cpu_step_hooks;

/* mt_cpu_backend_create with hooks (copied); when it fails, done is not
 * called: ctx stays the caller's. */
mt_backend *mt_cpu_backend_create_hooked(const mt_config *cfg, const mt_param_table *t,
                                         mt_host_store *store, int max_M, int64_t B, int64_t T,
                                         const mt_cpu_step_hooks *hooks, mt_error *err);

/* The bytes mt_cpu_backend_create(cfg, t, ..., max_M, B, T) allocates, into
 * *bytes; -1 when they do not fit a size_t (a user's absurd size). Lets a
 * caller refuse a run before allocating anything. */
int mt_cpu_backend_bytes(const mt_config *cfg, const mt_param_table *t, int max_M, int64_t B,
                         int64_t T, size_t *bytes);

/* Logits (V) of token row `row` (0..B*T-1) of micro-batch mb, after a
 * forward pass (mt_step_eval). For generation. */
void mt_cpu_backend_logits(mt_backend *be, int mb, int64_t row, float *logits);

#endif
