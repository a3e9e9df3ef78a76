/* Internals of the CUDA streaming backend, shared by its files:
 * backend_cuda.c (slots, the step), backend_cuda_saved.c (the traffic of
 * saved layer inputs), backend_cuda_create.c (creation, accessors), backend_cuda_plan.c
 * (the GPU memory plan) and layers_cuda.c (the layer templates, declared in
 * layers_cuda.h). Not a public interface: use backend_cuda.h. */
#ifndef MT_BACKEND_CUDA_INTERNAL_H
#define MT_BACKEND_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/backend_cuda.h"
#include "dist/shard.h"
#include "engine/trace.h"
#include "kernels/cuda_ops.h"

#define MAX_SLOTS 8
#define TRACE_SPANS 512

typedef struct slot {
    int layer;          /* -1 when empty or stale */
    int64_t last_use;   /* index in the bind sequence of its last assigned use */
    float *w32;         /* (max_layer_numel) */
    uint16_t *w16;      /* (max_layer_numel) bf16 mode only */
    cudaEvent_t ready;  /* h2d: copy and cast done */
    cudaEvent_t free;   /* compute: last use done */
} slot;

/* One layer, one micro-batch. "_op" buffers hold matrix-product operands:
 * bf16 in bf16 mode, and the same memory as their fp32 source in fp32 mode. */
typedef struct acts {
    void *xn1_op; float *rstd1;
    float *mean1, *mean2;     /* LayerNorms (gpt_neox, falcon) */
    float *qkv32;             /* (N, Q + 2KV) the fused qkv product (gpt_neox, falcon) in
                               * fp32 mode; its gradient in the backward */
    void *dqkv_op;            /* that gradient as the product's operand; in bf16 mode the
                               * forward's bf16 qkv product before. Other bf16 blocks:
                               * dq_op, dk_op, dv_op's memory, as one (N, Q + 2KV) */
    float *q32, *k32, *v32, *qpre32, *kpre32, *qrstd, *krstd;
    void *q_op, *k_op, *v_op;
    void *qpre_op, *kpre_op;  /* fast path with q/k norms: bf16 q, k before the norm */
    void *att_op; float *att32; float *lse;
    float *xmid;
    void *xn2_op; float *rstd2;
    float *gate32, *up32; void *mlp_op;
    uint16_t *gate16, *up16;  /* fast path; gate16: gpt_neox's GELU input in bf16 mode */
    float *xtmp;        /* an MoE block's output in a recompute (unused) */
    /* Gemma (gemma_cuda.c): the attention's and the MLP's outputs before
     * their post-norms, (N, C) each of the operand type (bf16 in bf16 mode,
     * as the products write them), and those norms' rstd (N); the 1 + w
     * of the bound layer's RMSNorms, (4C + 2HD): input, post-attention,
     * pre- and post-feedforward, q and k norms (the head's final norm:
     * the first C) */
    void *ao_op, *mo_op; float *rstd_pa, *rstd_pf;
    float *norm_w;
    /* backward */
    void *dx_op;
    float *dmlp32, *dgate32, *dup32; void *dgate_op, *dup_op;
    void *dmlp_op;      /* Gemma on the bf16 kernels: the GeGLU's output gradient, bf16 */
    float *dxn32;
    float *datt32; void *datt_op;
    float *dq32, *dk32, *dv32, *dqn32, *dkn32; void *dq_op, *dk_op, *dv_op;
    float *colsum;
    void *attn_scratch;
    /* head */
    void *xf_op; float *rstdf, *meanf; float *dxf32; float *row_loss; void *head_scratch;
    float *row_w;       /* (N) a sequence objective's token weights (head_weighted) */
} acts;

typedef struct cuda_backend {
    mt_backend base;
    const mt_config *cfg;
    const mt_param_table *t;
    mt_host_store *store;
    mt_cuda_backend_opts o;
    mt_precision prec;
    int max_M;
    int64_t B, T, N;
    int device;         /* the GPU: set again by the calls other threads make */
    cudaStream_t s_h2d, s_comp, s_d2h;
    mt_cuda_ctx *ctx, *ctx_h2d;
    /* A rank of several (opts.comm): the collectives run on s_comm, in the
     * order every rank issues them (the step's bind and gradient order),
     * with its own context for the casts and norms that follow them. */
    struct mt_nccl *comm;
    int rank, ranks;    /* 0 and 1 on one GPU */
    cudaStream_t s_comm;
    mt_cuda_ctx *ctx_comm;
    cudaEvent_t ev_part_up, ev_reduced, ev_comm_end;
    char *dev_base;
    size_t dev_bytes;
    slot slots[MAX_SLOTS];
    slot embed_slot;    /* tied models: layer 0 stays for the head (unless bound in place) */
    /* Device layers 0..n_dev-1 (opts.device_optim_layers): weights and Adam
     * moments live here, layer l at dev_off[l] (dev_numel in all), and the
     * optimizer updates them in place. One GPU: laid out as the store's
     * range of those layers, and dev_slot[l] points into dev_w (and
     * dev_w16) for the binds. A rank of several: each holds this rank's
     * part in a chunk of its own (the padding zero), whole layers are
     * all-gathered from them into the slots like the others' parts, and
     * dev_slot[l].ready marks the end of layer l's update. */
    int n_dev;
    slot *dev_slot;     /* (n_dev) */
    size_t *dev_off;    /* (n_dev) */
    float *dev_w, *dev_m, *dev_v;
    uint16_t *dev_w16;  /* bf16 mode, one GPU */
    size_t dev_numel;
    int dev_stale;      /* the store lags them: updated since the last flush */
    cudaEvent_t *dev_t0; /* (n_dev) each one's update starts (its slot's ready: ends) */
    int *dev_timed;     /* (n_dev) an update's events not yet put on the timeline */
    /* Gradients (see mt_layer_home). Host-waiting layers accumulate in
     * gacc[2] by turns and drain to the host; GPU-waiting ones each keep an
     * accumulator in gacc_all at goff[l] that the optimizer fetches. */
    mt_layer_home *home;  /* (n_layers) */
    size_t *goff;         /* (n_layers) offset in gacc_all, GPU-waiting layers */
    float *gacc[2];       /* (max_host_grad_numel) each */
    cudaEvent_t gacc_drained[2];
    cudaEvent_t grad_ready;
    float *gacc_embed;  /* tied models: layer 0's gradient, alive all backward */
    float *gacc_all;    /* (gpu_grad_numel) */
    size_t gpu_grad_numel, max_gpu_grad_numel, host_grad_numel, max_host_grad_numel;
    float *h_stage[2];  /* GPU-waiting gradients: pinned fp32 staging for the optimizer */
    cudaStream_t s_fetch;
    cudaEvent_t fetched[2];
    cudaEvent_t embed_drained;
    /* Host-waiting gradients: into the store's g (fp32, when it has one),
     * else into h_grad at h_goff[l] (fp32, or bf16 rounded on the GPU
     * into g16_stage first). */
    void *h_grad;
    size_t *h_goff;     /* (n_layers) */
    int grads_to_store;
    uint16_t *g16_stage[2]; /* (max_stage_numel) each, bf16 mode */
    size_t max_stage_numel;
    cudaEvent_t stage_drained[2];
    int sbuf;
    /* Saved inputs (layer l's input, kept from its forward for its backward):
     * saved input l on the GPU is saved[saved_idx[l]] (max_M, N, C); on the
     * host h_saved[saved_idx[l]], visiting visit[l % 2] on the GPU while
     * layers l-1 (writing it) and l (reading it) run. */
    float *saved, *dx;  /* dx: (M, N, C) residual-stream gradient */
    int *saved_idx;     /* (n_layers) */
    int n_gpu_saved, n_host_saved, n_rebuilt_saved; /* rebuilt: saved_recompute layers */
    void *h_saved;      /* fp32, or bf16 (o.host_saved_bf16) */
    /* Saved inputs on disk (saved_disk homes): block disk_block[l] (-1 none)
     * of sdisk, through its pinned staging; they visit visit[2] as host ones
     * do, in the host's dtype. */
    int n_disk_saved;
    int *disk_block;    /* (n_layers) */
    struct mt_saved_disk *sdisk;
    float *visit[2];
    uint16_t *saved16[2]; /* bf16 host-saved inputs: a chunk of the save (0), of the load (1) */
    float *xin;         /* (N, C) a recomputed saved input, one micro-batch */
    int visit_holds[2]; /* saved input in visit[b] now, -1 none (host order of issue) */
    cudaEvent_t visit_saved[2], visit_loaded[2], visit_free[2], visit_written[2];
    int attn_bf16;      /* bf16 flash kernel (HD 64/128); else fp32 attention */
    /* bf16 fast path (flash attention): products write bf16 (biases added
     * in the product) and the q/k norms, RoPE and SwiGLU work on bf16, as
     * PyTorch's autocast does, instead of fp32 intermediates and separate
     * casts; only this path keeps activations. */
    int fast;
    /* Whether blocks can keep their activations for the backward: on the
     * fast path, and gpt_neox's and falcon's blocks on the bf16 flash
     * kernels (neox_cuda.c). */
    int keeps;
    float *cos, *sin;
    /* (T, HD/2) the rotary tables of Gemma 3's sliding layers (its
     * rope_local_theta, mt_rope_tables_local); cos, sin for every other */
    float *cos_l, *sin_l;
    int32_t *tokens, *targets, *emb_order, *emb_bounds;
    int32_t *pos;       /* (max_M, N) positions of a packed batch (mt_batch.pos) */
    int has_pos;        /* this step's batch has positions */
    /* (max_M, N) the attention's positions when the model's sliding window
     * is shorter than T (mt_cuda_window_positions), else NULL */
    int32_t *win_pos;
    size_t *emb_groups; /* host (M) */
    int32_t *h_order, *h_bounds;
    double *loss_dev, *sumsq_dev, *sumsq_scratch;
    double *h_loss, *h_sumsq; /* pinned */
    acts a;
    struct mt_cuda_moe *moe; /* MoE blocks' MLP (moe_cuda.h), NULL for a dense model */
    void *moe_dev;      /* its device range */
    acts *kept;         /* (n_keep * max_M) forward activations kept for backward */
    int n_keep;         /* layers kept: the last n_keep decoder blocks */
    /* (n_keep_down * max_M) units of mt_cuda_down_unit_bytes: the down
     * projection's output and its post-norm's rstd of the n_keep_down
     * blocks before the kept ones (Gemma, bf16 kernels) */
    char *down_kept;
    int n_keep_down;
    /* step state */
    int train;
    float dscale;
    const mt_batch *batch;
    int seq[4096];
    int seq_len, cur, issued;
    slot *slot_of[4096];
    slot *bound;        /* the bound layer's weights, NULL none */
    int gbuf;           /* gacc in use */
    float *g_cur;       /* accumulator of the bound layer */
    mt_weight_gate_fn gate;
    void *gate_ctx;
    cudaEvent_t ev_start, ev_fwd_end, ev_end, ev_d2h_end;
    double h2d_bytes, d2h_bytes, coll_bytes;
    mt_cuda_step_times times;
    /* timeline (optional): spans between pairs of events, resolved at the
     * end of the step against ev_base, whose host time is trace_base_us */
    mt_trace *trace;
    cudaEvent_t *tev;       /* (2 * TRACE_SPANS) */
    struct { int track; char name[32]; } tspan[TRACE_SPANS];
    int n_tspans;
    cudaEvent_t ev_base;
    double trace_base_us;
    int span_open;          /* compute span of the bound layer */
} cuda_backend;


/* This rank's part of a layer: elements [begin, begin + len) of the layer,
 * and the chunk each rank's part takes in a collective (dist/shard.h). On
 * one GPU, the whole layer. */
typedef struct layer_part {
    size_t begin, len, chunk;
} layer_part;

/* A bump allocator over one device allocation; with base NULL it only
 * counts, so the same plan sizes and then carves the memory. */
typedef struct bump { char *base; size_t used; } bump;

/* The GPU memory plan (backend_cuda_plan.c). */
void mt_cuda_default_opts(mt_cuda_backend_opts *o, const mt_cuda_backend_opts *in);
/* Fills home, goff, h_goff, saved_idx and the gradient and saved-input counts
 * from the options (allocates the arrays; mt_cuda_homes_free frees them). */
void mt_cuda_resolve_homes(cuda_backend *cb);
void mt_cuda_homes_free(cuda_backend *cb);
void mt_cuda_plan(cuda_backend *cb, bump *b);
size_t mt_cuda_keep_unit_bytes(const cuda_backend *cb);
size_t mt_cuda_down_unit_bytes(const cuda_backend *cb);
/* The down-kept unit of (layer, mb) (cb->down_kept): its down projection's
 * output (N, C, the operand type) into *mo and that post-norm's rstd (N)
 * into *rstd; 0 with both NULL when the layer keeps none. */
int mt_cuda_down_unit(const cuda_backend *cb, int layer, int mb, void **mo, float **rstd);
/* The pinned host bytes of a backend whose homes are resolved (what
 * mt_cuda_backend_host_bytes counts), from its own counts: opts.homes is
 * read at creation only. */
size_t mt_cuda_host_bytes_of(const cuda_backend *cb);
/* The rows of logits the head holds at once (the option, or by the vocabulary). */
size_t mt_cuda_head_rows(const cuda_backend *cb);

/* Creation (backend_cuda_create.c): everything mt_cuda_backend_create
 * does, with the operations table it is given (backend_cuda.c holds it). */
mt_backend *mt_cuda_backend_make(const mt_config *c, const mt_param_table *t,
                                 mt_host_store *store, int max_M, int64_t B, int64_t T,
                                 const mt_cuda_backend_opts *o, const mt_backend_ops *ops,
                                 mt_error *err);

/* Timeline spans (backend_cuda_trace.c): begin returns the span's index or -1
 * (tracing off or full). */
int mt_cuda_span_begin(cuda_backend *cb, cudaStream_t stream, int track, const char *fmt, int a);
void mt_cuda_span_end(cuda_backend *cb, cudaStream_t stream, int i);

/* Saved-input traffic at the bind of `layer` (backend_cuda_saved.c): saves
 * and loads of host- and disk-saved inputs, waits for rebuilt ones' sources. */
void mt_cuda_saved_traffic(cuda_backend *cb, int layer, int backward);
/* Whether any saved input has traffic (moved or rebuilt ones). */
static inline int mt_cuda_saved_moving(const cuda_backend *cb) {
    return cb->n_host_saved || cb->n_rebuilt_saved || cb->n_disk_saved;
}
/* Values of a bf16 host-saved input converted at once on a copy stream: the
 * size of the saved16 chunks. */
#define MT_SAVED_CHUNK ((size_t)4 << 20)
static inline size_t mt_cuda_saved_chunk(const cuda_backend *cb) {
    size_t all = (size_t)cb->max_M * cb->N * cb->cfg->C;
    return all < MT_SAVED_CHUNK ? all : MT_SAVED_CHUNK;
}
/* Layer `layer`'s input for micro-batch mb, rebuilt from checkpoint
 * layer-1 into cb->xin (its saved input is saved_recompute). */
const float *mt_cuda_recompute_input(cuda_backend *cb, int layer, int mb);

/* ---- accessors ---- */

static inline layer_part part_of(const cuda_backend *cb, int layer) {
    size_t n = cb->t->layers[layer].numel;
    if (cb->ranks <= 1) return (layer_part){0, n, n};
    size_t chunk = mt_shard_chunk(n, cb->ranks);
    mt_shard_range r = mt_shard_split(n, cb->ranks, cb->rank);
    return (layer_part){r.begin, r.end - r.begin, chunk};
}

/* Floats a layer takes in a GPU buffer: the whole layer, and on a rank
 * of several the padding up to the ranks' chunks, which its collectives
 * move. */
static inline size_t layer_extent(const cuda_backend *cb, int layer) {
    layer_part p = part_of(cb, layer);
    return cb->ranks <= 1 ? p.len : p.chunk * (size_t)cb->ranks;
}

/* Layer l's range of one of the store's arrays (the store's own table:
 * a rank's parts, or the whole model). */
static inline float *store_at(const cuda_backend *cb, float *array, int layer) {
    return array + cb->store->table->layers[layer].offset;
}

static inline void *W_op(const cuda_backend *cb, const slot *s, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    int i = ld->by_role[r];
    if (i < 0) return NULL;
    size_t off = ld->tensors[i].offset;
    return cb->prec == MT_PREC_BF16 ? (void *)(s->w16 + off) : (void *)(s->w32 + off);
}

static inline float *W32(const cuda_backend *cb, const slot *s, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    int i = ld->by_role[r];
    return i < 0 ? NULL : s->w32 + ld->tensors[i].offset;
}

static inline float *G(const cuda_backend *cb, float *gacc, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    int i = ld->by_role[r];
    return i < 0 ? NULL : gacc + ld->tensors[i].offset;
}

static inline slot *bound_slot(cuda_backend *cb) { return cb->bound; }

/* Layer 0's weights, which a tied model's head reads too. */
static inline slot *embed_weights(cuda_backend *cb) {
    return cb->n_dev && cb->ranks <= 1 ? &cb->dev_slot[0] : &cb->embed_slot;
}

/* Whether layer l is bound in place from the device layers' state (one
 * GPU) rather than through a slot. */
static inline int bound_in_place(const cuda_backend *cb, int layer) {
    return layer < cb->n_dev && cb->ranks <= 1;
}

/* Whether saved input l leaves the GPU between its forward and backward
 * (host or disk ones), moved by backend_cuda_saved.c. */
static inline int saved_moves(const cuda_backend *cb, int layer) {
    return cb->home[layer].saved_host || cb->home[layer].saved_disk;
}

/* Whether saved input l visits visit[l % 2] (moved or recomputed ones). */
static inline int saved_visits(const cuda_backend *cb, int layer) {
    return saved_moves(cb, layer) || cb->home[layer].saved_recompute;
}

static inline float *saved_at(cuda_backend *cb, int layer, int mb) {
    size_t per = cb->N * cb->cfg->C;
    if (saved_visits(cb, layer)) return cb->visit[layer % 2] + (size_t)mb * per;
    return cb->saved + ((size_t)cb->saved_idx[layer] * cb->max_M + mb) * per;
}

static inline float *dx_at(cuda_backend *cb, int mb) {
    return cb->dx + (size_t)mb * cb->N * cb->cfg->C;
}

/* Where layer l's gradient waits on the host. */
static inline void *host_grad_at(cuda_backend *cb, int layer) {
    if (cb->grads_to_store) return store_at(cb, cb->store->g, layer);
    size_t es = cb->o.host_grad_bf16 ? 2 : 4;
    return (char *)cb->h_grad + cb->h_goff[layer] * es;
}

static inline void to_op(cuda_backend *cb, void *dst, const float *src, size_t n) {
    if (cb->prec == MT_PREC_BF16) mt_cuda_cast_f32_to_bf16(cb->ctx, dst, src, n);
}

static inline mt_dt op_dt(const cuda_backend *cb) { return mt_prec_operand_dtype(cb->prec); }

static inline void attn_check(int rc, const mt_error *err) {
    if (rc) MT_DIE("attention: %s", err->msg);
}


#endif
