/* The CUDA streaming backend: the model lives in the host store; each layer
 * is streamed into a ring of GPU weight slots on an H2D stream, computed on
 * a compute stream, and its gradient leaves on a D2H stream, the three
 * ordered by events only. */
#ifndef MT_BACKEND_CUDA_BACKEND_H
#define MT_BACKEND_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"

typedef enum { MT_GPU_BF16 = 1, MT_GPU_FP32 = 0 } mt_gpu_precision;

typedef struct mt_cuda_backend_opts {
    mt_gpu_precision precision;
    int slots;            /* weight slots in the ring, >= 2 (default 3) */
    int head_chunk;       /* rows of logits held at once (default 4096) */
    int host_checkpoints; /* keep layer inputs in pinned host memory, not on the GPU */
    /* Layers whose forward activations stay on the GPU until their
     * backward, which then skips the recompute (bf16 fast path only).
     * -1: as many as fit in the GPU memory left after everything else. */
    int keep_layers;
    /* Where gradients wait for the optimizer. 0: the host store's g array
     * (GPU memory independent of depth; 16 host bytes per parameter).
     * 1: one fp32 accumulator per parameter on the GPU, fetched by the
     * optimizer layer by layer (12 host bytes per parameter; GPU memory
     * grows by 4 bytes per parameter). */
    int gpu_grads;
} mt_cuda_backend_opts;

/* Called (on the thread that drives the step) before layer l's weights are
 * copied to the GPU, so a caller can hold the copy until the optimizer has
 * written them. */
typedef void (*mt_weight_gate_fn)(void *ctx, int layer);

/* GPU memory the backend would take, in bytes, for the given shape. */
size_t mt_cuda_backend_bytes(const mt_config *cfg, const mt_param_table *t, int max_M,
                             int64_t B, int64_t T, const mt_cuda_backend_opts *o);

/* Allocates all GPU memory and pins the store's weight and gradient arrays.
 * NULL with a message if there is no GPU or memory is short. */
mt_backend *mt_cuda_backend_create(const mt_config *cfg, const mt_param_table *t,
                                   mt_host_store *store, int max_M, int64_t B, int64_t T,
                                   const mt_cuda_backend_opts *o, mt_error *err);
void mt_cuda_backend_free(mt_backend *be);

void mt_cuda_backend_set_weight_gate(mt_backend *be, mt_weight_gate_fn fn, void *ctx);

/* Records every later step's copies and layer computations into trace
 * (the caller writes it out with mt_trace_write). Costs a few hundred
 * events per step and a synchronisation at its end. */
struct mt_trace;
void mt_cuda_backend_set_trace(mt_backend *be, struct mt_trace *trace);

/* Squared L2 norm of each layer's gradient of the last step (n_layers),
 * computed on the GPU before the gradient left it. Valid after end_step. */
const double *mt_cuda_backend_layer_sumsq(mt_backend *be);

/* Waits until every gradient copy of the last step has reached the host. */
void mt_cuda_backend_wait_grads(mt_backend *be);

/* gpu_grads mode: starts copying layer l's gradient into one of two pinned
 * staging buffers (by the parity of l) and returns it; call
 * mt_cuda_backend_grads_wait before reading it. Safe from another thread
 * than the one driving the step. In host mode it returns the store's g. */
const float *mt_cuda_backend_grads_begin(mt_backend *be, int layer);
void mt_cuda_backend_grads_wait(mt_backend *be, int layer);

/* Per-step timings in ms of the last step, measured with events. */
typedef struct mt_cuda_step_times {
    float forward_ms, backward_ms, total_ms;
    double h2d_bytes, d2h_bytes;
} mt_cuda_step_times;
void mt_cuda_backend_times(mt_backend *be, mt_cuda_step_times *t);

/* Decoder layers whose activations are kept instead of recomputed. */
int mt_cuda_backend_kept_layers(mt_backend *be);

/* Peak device memory the backend allocated, bytes. */
size_t mt_cuda_backend_device_bytes(mt_backend *be);

/* Logits (V) of token row `row` of micro-batch mb after an eval pass. */
void mt_cuda_backend_logits(mt_backend *be, int mb, int64_t row, float *logits);

#endif
