/* The CUDA streaming backend: the model lives in the host store; each layer
 * is streamed into a ring of GPU weight slots on an H2D stream, computed on
 * a compute stream, and its gradient leaves on a D2H stream, the three
 * ordered by events only. */
#ifndef MT_BACKEND_CUDA_BACKEND_H
#define MT_BACKEND_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/optim_pipeline.h"
#include "engine/optimizer.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"

typedef enum { MT_GPU_BF16 = 1, MT_GPU_FP32 = 0 } mt_gpu_precision;

/* Where one layer's step-long buffers live (the planner's choice). */
typedef struct mt_layer_home {
    uint8_t grad_host;  /* 1: the layer's gradient waits for the optimizer in pinned host
                         * memory (drained once per step during the backward); 0: in a
                         * GPU fp32 accumulator the optimizer fetches */
    uint8_t saved_host; /* 1: saved input l (the layer's input, every micro-batch, which
                         * its backward recomputes the layer from) lives in pinned host
                         * memory between its forward and backward; 0: GPU */
    uint8_t saved_recompute; /* 1: saved input l is not kept past the forward (saved_host
                         * is ignored): the backward of layer l recomputes it from saved
                         * input l-1 with layer l-1's weights, one more layer forward per
                         * micro-batch. Free for the head's input and the last block's,
                         * which are still on the GPU when their backward runs. Layer
                         * l-1 must keep its own saved input. */
    uint8_t saved_disk; /* 1: saved input l lives on disk (opts.saved_disk_dirs) between
                         * its forward and backward (saved_host is ignored; saved_recompute
                         * wins): written once through pinned staging, read back once
                         * ahead of its backward (backend/cuda/saved_disk.h) */
} mt_layer_home;

typedef struct mt_cuda_backend_opts {
    mt_gpu_precision precision;
    int slots;            /* weight slots in the ring, >= 2 (default 3) */
    int head_chunk;       /* rows of logits held at once; 0: mt_cuda_head_rows' choice */
    /* Per-layer homes (n_layers entries, read at creation). NULL: every
     * layer as the two flags below say. */
    const mt_layer_home *homes;
    int host_saved_inputs; /* homes == NULL: every saved input on the host */
    /* homes == NULL: where gradients wait for the optimizer. 0: the host
     * (GPU memory independent of depth); 1: one fp32 accumulator per
     * parameter on the GPU (GPU memory grows by 4 bytes per parameter). */
    int gpu_grads;
    /* Gradients waiting on the host are rounded to bf16 (round to nearest
     * even) from the fp32 GPU accumulation: 2 host bytes per parameter
     * instead of 4. The per-layer norms for clipping use the fp32 values.
     * Without it, host gradients go to the store's g array when it has one,
     * else to a pinned fp32 buffer of the backend's. */
    int host_grad_bf16;
    /* Saved inputs waiting in host RAM are rounded to bf16 (round to
     * nearest even) from the fp32 residual stream on their way down, and
     * widened on their way up: 2 host bytes per value instead of 4, and
     * half the PCIe traffic. The forward goes on with the fp32 values; the
     * backward recomputes the layer from the rounded input (bf16 precision
     * only). Saved inputs on the GPU stay fp32. */
    int host_saved_bf16;
    /* Directories (comma-separated, striped) of the saved inputs whose home
     * is saved_disk; NULL or "" when none is. Those take the dtype above too. */
    const char *saved_disk_dirs;
    /* Layers whose forward activations stay on the GPU until their
     * backward, which then skips the recompute (bf16 fast path only).
     * -1: as many as fit in the GPU memory left after everything else
     * (within gpu_budget when set). */
    int keep_layers;
    /* Kept layers leave out the mid-block residual (fp32, 4 bytes per
     * hidden unit and token, a sixth of a Llama unit): their backward
     * rebuilds it with the output projection, one more product per kept
     * layer and micro-batch, so that more layers fit. */
    int lean_keep;
    /* Gemma blocks on the bf16 kernels: of the layers before the kept
     * ones, the last keep_down_layers keep their down projection's output
     * (fp32, the post-norm's input) and that norm's rstd until their
     * backward, whose recompute then stops after the GeGLU: 4 bytes per
     * hidden unit and token, a ninth of a Gemma unit, for a quarter of the
     * recompute's products. 0: none; ignored for other blocks. */
    int keep_down_layers;
    /* Device bytes the backend may take in all (0: what is free), counting
     * a reserve for the CUDA context and libraries (MT_CUDA_CONTEXT_RESERVE). */
    size_t gpu_budget;
    /* The first device_optim_layers layers (layer 0 is the embedding, then
     * the first blocks: those the next forward needs first) keep their fp32
     * weights and Adam moments on the GPU, and their AdamW runs there
     * (mt_cuda_backend_update_layer), so the next step's forward waits for
     * no gradient copy, CPU update or weight copy of theirs. Their
     * gradients wait on the GPU whatever homes says. 12 GPU bytes per
     * parameter of those layers (14 in bf16 mode) and no weight copies;
     * the store holds their new state after mt_cuda_backend_flush_store. */
    int device_optim_layers;
    /* A rank of a data-parallel run of `ranks` GPUs (0 or 1: one GPU), and
     * its communicator (nccl.h; sizing alone, mt_cuda_backend_bytes, needs
     * none). The store then holds only this rank's part of every layer
     * (its table is the parts' table of dist/shard.h, cut from t):
     * a layer's part is copied up and all-gathered from the other GPUs
     * into the slot, and its gradient is reduce-scattered, so that this
     * rank's part, summed over the ranks, is what leaves for the host (and
     * what the layer's sum of squares covers). Every gradient then waits
     * on the host, and device_optim_layers is ignored. */
    int rank, ranks;
    struct mt_nccl *comm;
} mt_cuda_backend_opts;


/* Device memory the CUDA context, cuBLAS and the kernels' workspaces take
 * beside the backend's own allocation, reserved by budgets (measured on
 * the H100/H200: 0.5-0.9 GB after the first step). */
#define MT_CUDA_CONTEXT_RESERVE ((size_t)1 << 30)

/* GPU memory the backend would take, in bytes, for the given shape
 * (its one allocation; the context reserve not included). */
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
 * computed on the GPU before the gradient left it (a rank of several: of
 * its part). Valid after end_step. */
const double *mt_cuda_backend_layer_sumsq(mt_backend *be);

/* Pinned host bytes the backend takes beside the store: host gradients
 * (unless they go to the store's g), host checkpoints, staging. */
size_t mt_cuda_backend_host_bytes(const mt_config *cfg, const mt_param_table *t, int max_M,
                                  int64_t B, int64_t T, const mt_cuda_backend_opts *o);

/* Waits until every gradient copy of the last step has reached the host. */
void mt_cuda_backend_wait_grads(mt_backend *be);

/* Layer l's gradient of the last step, for the optimizer: a GPU-resident
 * one starts copying into one of two pinned fp32 staging buffers (by the
 * parity of l); a host one is where the backward drained it (fp32 or
 * bf16). Call mt_cuda_backend_grads_wait before reading it. Safe from
 * another thread than the one driving the step. */
mt_grad_view mt_cuda_backend_grads_begin(mt_backend *be, int layer);
void mt_cuda_backend_grads_wait(mt_backend *be, int layer);

/* Layers whose optimizer state lives on the GPU (0..n-1). */
int mt_cuda_backend_device_layers(mt_backend *be);

/* Enqueues the AdamW step of layer l (< mt_cuda_backend_device_layers)
 * from its gradient of the last step, coefs[k] for its tensor k
 * (mt_optimizer_layer_coefs), after the step's work on the compute
 * stream, so every later bind of the layer sees the new weights. Call it
 * after end_step and before the layer's next forward binds it (the weight
 * gate orders the two). Safe from another thread than the one driving the
 * step. */
void mt_cuda_backend_update_layer(mt_backend *be, int layer, const mt_adamw_coefs *coefs);

/* Copies the GPU-updated layers' weights and moments into the store
 * (blocks; nothing to do when no update ran since the last flush). */
void mt_cuda_backend_flush_store(mt_backend *be);

/* The optimizer pipeline's view of this backend: where each layer's
 * gradient is (grads_begin/wait), and the GPU update and flush of the
 * device layers. */
mt_grad_source mt_cuda_backend_grad_source(mt_backend *be);

/* Per-step timings in ms of the last step, measured with events. */
typedef struct mt_cuda_step_times {
    float forward_ms, backward_ms, total_ms;
    double h2d_bytes, d2h_bytes, coll_bytes;
} mt_cuda_step_times;
void mt_cuda_backend_times(mt_backend *be, mt_cuda_step_times *t);

/* Decoder layers whose activations are kept instead of recomputed. */
int mt_cuda_backend_kept_layers(mt_backend *be);
/* The layers before those whose down projection's output is kept. */
int mt_cuda_backend_down_kept_layers(mt_backend *be);

/* The last step's times and traffic, the device bytes, pinned host bytes
 * and kept layers (the backend's stats call). */
void mt_cuda_backend_stats(mt_backend *be, mt_backend_stats *st);

/* Peak device memory the backend allocated, bytes. */
size_t mt_cuda_backend_device_bytes(mt_backend *be);

/* Logits (V) of token row `row` of micro-batch mb after an eval pass. */
void mt_cuda_backend_logits(mt_backend *be, int mb, int64_t row, float *logits);

#endif
