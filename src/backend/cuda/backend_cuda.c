/* The CUDA streaming backend (SPEC 1).
 *
 * GPU memory, all taken at creation from one allocation:
 *   slots[K]   a ring of weight slots, each one layer: fp32 (as copied from
 *              the host store) and, in bf16 mode, its bf16 cast
 *   gacc[2]    fp32 gradient accumulators: layer l accumulates in one while
 *              the other's previous layer drains to the host
 *   ckpt       (n_layers, M, N, C) fp32 layer inputs, per micro-batch
 *   dx         (M, N, C) fp32 residual-stream gradient, per micro-batch
 *   acts/grads one layer's activations and gradients for one micro-batch
 * Streams: h2d copies weights into slots ahead of use (the bind order of a
 * step is known in advance), compute runs the layers, d2h drains each
 * layer's gradient once per step. Only events order them. */
#include "backend/cuda/backend_cuda.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/engine_kernels.h"
#include "backend/cuda/ops_fused.h"
#include "engine/trace.h"
#include "model/rope.h"
#include "util/mem.h"

#define MAX_SLOTS 8

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
    float *q32, *k32, *v32, *qpre32, *kpre32, *qrstd, *krstd;
    void *q_op, *k_op, *v_op;
    void *att_op; float *att32; float *lse;
    float *xmid;
    void *xn2_op; float *rstd2;
    float *gate32, *up32; void *mlp_op;
    uint16_t *gate16, *up16;  /* fast path */
    float *xtmp;        /* recompute's unused output */
    /* backward */
    void *dx_op;
    float *dmlp32, *dgate32, *dup32; void *dgate_op, *dup_op;
    float *dxn32;
    float *datt32; void *datt_op;
    float *dq32, *dk32, *dv32, *dqn32, *dkn32; void *dq_op, *dk_op, *dv_op;
    float *colsum;
    void *attn_scratch;
    /* head */
    void *xf_op; float *rstdf; float *dxf32; float *row_loss; void *head_scratch;
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
    cudaStream_t s_h2d, s_comp, s_d2h;
    mt_cuda_ctx *ctx, *ctx_h2d;
    char *dev_base;
    size_t dev_bytes;
    slot slots[MAX_SLOTS];
    slot embed_slot;    /* tied models: layer 0 stays for the head */
    float *gacc[2];
    cudaEvent_t gacc_drained[2];
    cudaEvent_t grad_ready;
    float *gacc_embed;  /* tied models: layer 0's gradient, alive all backward */
    float *gacc_all;    /* gpu_grads: (total) every layer's gradient */
    float *h_stage[2];  /* gpu_grads: pinned staging for the optimizer */
    cudaStream_t s_fetch;
    cudaEvent_t fetched[2];
    cudaEvent_t embed_drained;
    float *ckpt, *dx;   /* ckpt: (n_layers, M, N, C) on the GPU, or NULL with host checkpoints */
    /* Host checkpoints: layer inputs live in h_ckpt (pinned); the GPU keeps
     * two (M, N, C) buffers, the input and the output of the layer at hand,
     * chosen by layer parity. */
    float *h_ckpt, *dck[2];
    cudaEvent_t dck_saved[2], dck_loaded[2], dck_free[2], dck_written[2];
    int attn_bf16;      /* bf16 flash kernel (HD 64/128); else fp32 attention */
    /* bf16 fast path (no q/k norm, no biases, flash attention): products
     * write bf16 and RoPE/SwiGLU work on bf16, as PyTorch's autocast does,
     * instead of fp32 intermediates and separate casts. */
    int fast;
    float *cos, *sin;
    int32_t *tokens, *targets, *emb_order, *emb_bounds;
    size_t *emb_groups; /* host (M) */
    int32_t *h_order, *h_bounds;
    double *loss_dev, *sumsq_dev, *sumsq_scratch;
    double *h_loss, *h_sumsq; /* pinned */
    acts a;
    acts *kept;         /* (n_keep * max_M) forward activations kept for backward */
    int n_keep;         /* layers kept: the last n_keep decoder blocks */
    size_t keep_unit_bytes;
    /* step state */
    int train;
    float dscale;
    const mt_batch *batch;
    int seq[4096];
    int seq_len, cur, issued;
    int slot_of[4096];
    int bound;          /* slot index of the bound layer, MAX_SLOTS = embed slot, -1 none */
    int gbuf;           /* gacc in use */
    float *g_cur;       /* accumulator of the bound layer */
    mt_weight_gate_fn gate;
    void *gate_ctx;
    cudaEvent_t ev_start, ev_fwd_end, ev_end, ev_d2h_end;
    double h2d_bytes, d2h_bytes;
    mt_cuda_step_times times;
    /* timeline (optional): spans between pairs of events, resolved at the
     * end of the step against ev_base, whose host time is trace_base_us */
    mt_trace *trace;
    cudaEvent_t *tev;       /* (2 * TRACE_SPANS) */
    struct { int track; char name[32]; } tspan[512];
    int n_tspans;
    cudaEvent_t ev_base;
    double trace_base_us;
    int span_open;          /* compute span of the bound layer */
} cuda_backend;

#define TRACE_SPANS 512

/* Starts a span on `stream`; returns its index or -1 (tracing off/full). */
static int span_begin(cuda_backend *cb, cudaStream_t stream, int track, const char *fmt, int a) {
    if (!cb->trace || cb->n_tspans >= TRACE_SPANS) return -1;
    int i = cb->n_tspans++;
    cb->tspan[i].track = track;
    snprintf(cb->tspan[i].name, sizeof cb->tspan[i].name, fmt, a);
    CUDA_CHECK(cudaEventRecord(cb->tev[2 * i], stream));
    return i;
}

static void span_end(cuda_backend *cb, cudaStream_t stream, int i) {
    if (cb->trace && i >= 0) CUDA_CHECK(cudaEventRecord(cb->tev[2 * i + 1], stream));
}

/* ---- memory plan ---- */

typedef struct bump { char *base; size_t used; } bump;

static void *take(bump *b, size_t bytes) {
    size_t at = mt_round_up(b->used, 256);
    b->used = at + bytes;
    return b->base ? b->base + at : NULL;
}
#define TAKE_F(b, n) ((float *)take((b), (size_t)(n) * sizeof(float)))

static size_t op_size(const cuda_backend *cb) { return cb->prec == MT_PREC_BF16 ? 2 : 4; }

/* An operand buffer: in fp32 mode it is the fp32 buffer itself. */
static void *take_op(bump *b, const cuda_backend *cb, size_t n, float *f32_alias) {
    if (cb->prec != MT_PREC_BF16 && f32_alias) return f32_alias;
    return take(b, n * op_size(cb));
}

static void plan(cuda_backend *cb, bump *b) {
    const mt_config *c = cb->cfg;
    const mt_param_table *t = cb->t;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    size_t lw = t->max_layer_numel;
    int bf = cb->prec == MT_PREC_BF16;
    for (int k = 0; k < cb->o.slots; k++) {
        cb->slots[k].w32 = TAKE_F(b, lw);
        cb->slots[k].w16 = bf ? take(b, lw * 2) : NULL;
    }
    if (c->tie_embeddings) {
        size_t ne = t->layers[0].numel;
        cb->embed_slot.w32 = TAKE_F(b, ne);
        cb->embed_slot.w16 = bf ? take(b, ne * 2) : NULL;
    }
    if (cb->o.gpu_grads) {
        cb->gacc_all = TAKE_F(b, t->total);
        if (c->tie_embeddings) cb->gacc_embed = cb->gacc_all + t->layers[0].offset;
    } else {
        if (c->tie_embeddings) cb->gacc_embed = TAKE_F(b, t->layers[0].numel);
        cb->gacc[0] = TAKE_F(b, lw);
        cb->gacc[1] = TAKE_F(b, lw);
    }
    if (cb->o.host_checkpoints) {
        cb->dck[0] = TAKE_F(b, (size_t)cb->max_M * N * C);
        cb->dck[1] = TAKE_F(b, (size_t)cb->max_M * N * C);
    } else {
        cb->ckpt = TAKE_F(b, (size_t)t->n_layers * cb->max_M * N * C);
    }
    cb->dx = TAKE_F(b, (size_t)cb->max_M * N * C);
    cb->cos = TAKE_F(b, cb->T * c->HD / 2);
    cb->sin = TAKE_F(b, cb->T * c->HD / 2);
    cb->tokens = take(b, (size_t)cb->max_M * N * 4);
    cb->targets = take(b, (size_t)cb->max_M * N * 4);
    cb->emb_order = take(b, (size_t)cb->max_M * N * 4);
    cb->emb_bounds = take(b, (size_t)cb->max_M * (N + 1) * 4);
    cb->loss_dev = take(b, sizeof(double));
    cb->sumsq_dev = take(b, (size_t)t->n_layers * sizeof(double));
    cb->sumsq_scratch = take(b, MT_SUMSQ_PARTIALS * sizeof(double));

    acts *a = &cb->a;
    a->rstd1 = TAKE_F(b, N);
    a->xn1_op = take(b, N * C * op_size(cb));
    a->q32 = TAKE_F(b, N * Q);
    a->k32 = TAKE_F(b, N * KV);
    a->v32 = TAKE_F(b, N * KV);
    if (c->qk_norm) {
        a->qpre32 = TAKE_F(b, N * Q);
        a->kpre32 = TAKE_F(b, N * KV);
        a->qrstd = TAKE_F(b, N * c->NH);
        a->krstd = TAKE_F(b, N * c->NKV);
    }
    a->q_op = take_op(b, cb, N * Q, a->q32);
    a->k_op = take_op(b, cb, N * KV, a->k32);
    a->v_op = take_op(b, cb, N * KV, a->v32);
    cb->attn_bf16 = bf && (c->HD == 64 || c->HD == 128);
    cb->fast = cb->attn_bf16 && !c->qk_norm && !c->qkv_bias && c->HD % 8 == 0;
    a->att32 = cb->attn_bf16 ? NULL : TAKE_F(b, N * Q);
    a->att_op = bf ? take(b, N * Q * 2) : a->att32;
    a->lse = TAKE_F(b, N * c->NH);
    a->xmid = TAKE_F(b, N * C);
    a->xn2_op = take(b, N * C * op_size(cb));
    a->rstd2 = TAKE_F(b, N);
    if (cb->fast) {
        a->gate16 = take(b, N * F * 2);
        a->up16 = take(b, N * F * 2);
    } else {
        a->gate32 = TAKE_F(b, N * F);
        a->up32 = TAKE_F(b, N * F);
    }
    a->mlp_op = take(b, N * F * op_size(cb));
    a->xtmp = TAKE_F(b, N * C);
    a->dx_op = bf ? take(b, N * C * 2) : NULL; /* fp32: the dx of the micro-batch */
    a->dmlp32 = TAKE_F(b, N * F);
    if (!cb->fast) {
        a->dgate32 = TAKE_F(b, N * F);
        a->dup32 = TAKE_F(b, N * F);
    }
    a->dgate_op = take_op(b, cb, N * F, a->dgate32);
    a->dup_op = take_op(b, cb, N * F, a->dup32);
    a->dxn32 = TAKE_F(b, N * C);
    a->datt32 = TAKE_F(b, N * Q);
    a->datt_op = take_op(b, cb, N * Q, a->datt32);
    a->dq32 = TAKE_F(b, N * Q);
    a->dk32 = TAKE_F(b, N * KV);
    a->dv32 = TAKE_F(b, N * KV);
    if (c->qk_norm) {
        a->dqn32 = TAKE_F(b, N * Q);
        a->dkn32 = TAKE_F(b, N * KV);
    }
    a->dq_op = bf ? take(b, N * Q * 2) : NULL;
    a->dk_op = bf ? take(b, N * KV * 2) : NULL;
    a->dv_op = take_op(b, cb, N * KV, a->dv32);
    size_t cs = mt_cuda_colsum_scratch_floats(N, C);
    size_t shapes[][2] = {{N, Q}, {N, KV}, {N * c->NH, c->HD}, {N * c->NKV, c->HD}};
    for (size_t i = 0; i < 4; i++) {
        size_t s = mt_cuda_colsum_scratch_floats(shapes[i][0], shapes[i][1]);
        if (s > cs) cs = s;
    }
    a->colsum = TAKE_F(b, cs);
    a->attn_scratch = take(b, mt_attn_backward_scratch_bytes(cb->B, cb->T, c->NH));
    a->xf_op = take(b, N * C * op_size(cb));
    a->rstdf = TAKE_F(b, N);
    a->dxf32 = TAKE_F(b, N * C);
    a->row_loss = TAKE_F(b, N);
    size_t R = (size_t)cb->o.head_chunk < N ? (size_t)cb->o.head_chunk : N;
    a->head_scratch = take(b, mt_cuda_lm_head_scratch_bytes(cb->prec, R, c->V));
    size_t before = b->used;
    for (int u = 0; u < cb->n_keep * cb->max_M; u++) {
        acts *k = &cb->kept[u];
        k->xn1_op = take(b, N * C * 2);
        k->rstd1 = TAKE_F(b, N);
        k->q_op = take(b, N * Q * 2);
        k->k_op = take(b, N * KV * 2);
        k->v_op = take(b, N * KV * 2);
        k->att_op = take(b, N * Q * 2);
        k->lse = TAKE_F(b, N * c->NH);
        k->xmid = TAKE_F(b, N * C);
        k->xn2_op = take(b, N * C * 2);
        k->rstd2 = TAKE_F(b, N);
        k->gate16 = take(b, N * F * 2);
        k->up16 = take(b, N * F * 2);
        k->mlp_op = take(b, N * F * 2);
    }
    if (cb->n_keep) cb->keep_unit_bytes = (b->used - before) / ((size_t)cb->n_keep * cb->max_M);
}

/* Bytes of one kept (layer, micro-batch) unit of forward activations. */
static size_t keep_unit_bytes(const cuda_backend *cb) {
    const mt_config *c = cb->cfg;
    size_t N = cb->N, Q = c->NH * c->HD, KV = c->NKV * c->HD;
    return N * (c->C * 2 * 2 + c->C * 4 + (Q * 2 + KV * 2) * 2 + 3 * c->F * 2 + 8 + c->NH * 4) +
           13 * 256;
}

static void default_opts(mt_cuda_backend_opts *o, const mt_cuda_backend_opts *in) {
    *o = in ? *in : (mt_cuda_backend_opts){.precision = MT_GPU_BF16};
    if (o->slots < 2) o->slots = 3;
    if (o->slots > MAX_SLOTS) o->slots = MAX_SLOTS;
    if (o->head_chunk <= 0) o->head_chunk = 4096;
}

size_t mt_cuda_backend_bytes(const mt_config *cfg, const mt_param_table *t, int max_M,
                             int64_t B, int64_t T, const mt_cuda_backend_opts *in) {
    cuda_backend cb = {.cfg = cfg, .t = t, .max_M = max_M, .B = B, .T = T, .N = B * T};
    default_opts(&cb.o, in);
    cb.prec = cb.o.precision == MT_GPU_BF16 ? MT_PREC_BF16 : MT_PREC_FP32;
    bump b = {0};
    plan(&cb, &b);
    return b.used;
}

/* ---- weights ---- */

static void *W_op(const cuda_backend *cb, const slot *s, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    int i = ld->by_role[r];
    if (i < 0) return NULL;
    size_t off = ld->tensors[i].offset;
    return cb->prec == MT_PREC_BF16 ? (void *)(s->w16 + off) : (void *)(s->w32 + off);
}

static float *W32(const cuda_backend *cb, const slot *s, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    int i = ld->by_role[r];
    return i < 0 ? NULL : s->w32 + ld->tensors[i].offset;
}

static float *G(const cuda_backend *cb, float *gacc, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    int i = ld->by_role[r];
    return i < 0 ? NULL : gacc + ld->tensors[i].offset;
}

/* Copies layer `layer` into slot s on the h2d stream (after the slot's
 * last use), casting to bf16 there too. */
static void upload(cuda_backend *cb, slot *s, int layer) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    if (cb->gate) cb->gate(cb->gate_ctx, layer);
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, s->free, 0));
    int sp = span_begin(cb, cb->s_h2d, MT_TRACK_H2D, "weights L%d", layer);
    CUDA_CHECK(cudaMemcpyAsync(s->w32, cb->store->w + ld->offset, ld->numel * sizeof(float),
                               cudaMemcpyHostToDevice, cb->s_h2d));
    if (cb->prec == MT_PREC_BF16) mt_cuda_cast_f32_to_bf16(cb->ctx_h2d, s->w16, s->w32, ld->numel);
    span_end(cb, cb->s_h2d, sp);
    CUDA_CHECK(cudaEventRecord(s->ready, cb->s_h2d));
    cb->h2d_bytes += (double)ld->numel * sizeof(float);
    s->layer = layer;
}

static int uses_embed_slot(const cuda_backend *cb, int layer) {
    return cb->cfg->tie_embeddings && layer == 0;
}

/* Assigns a slot to bind j and starts its copy unless the layer is already
 * resident. Returns 0 if no slot is free yet (too far ahead). */
static int issue(cuda_backend *cb, int j) {
    int layer = cb->seq[j];
    if (uses_embed_slot(cb, layer)) {
        if (cb->embed_slot.layer != 0) upload(cb, &cb->embed_slot, 0);
        cb->slot_of[j] = MAX_SLOTS;
        return 1;
    }
    int victim = -1;
    for (int k = 0; k < cb->o.slots; k++) {
        slot *s = &cb->slots[k];
        if (s->layer == layer) {
            s->last_use = j;
            cb->slot_of[j] = k;
            return 1;
        }
        /* free: every bind assigned to it has been called already */
        if (s->last_use < cb->cur && (victim < 0 || s->last_use < cb->slots[victim].last_use))
            victim = k;
    }
    if (victim < 0) return 0;
    upload(cb, &cb->slots[victim], layer);
    cb->slots[victim].last_use = j;
    cb->slot_of[j] = victim;
    return 1;
}

static slot *bound_slot(cuda_backend *cb) {
    return cb->bound == MAX_SLOTS ? &cb->embed_slot : &cb->slots[cb->bound];
}

static void release_bound(cuda_backend *cb) {
    if (cb->bound < 0) return;
    span_end(cb, cb->s_comp, cb->span_open);
    cb->span_open = -1;
    CUDA_CHECK(cudaEventRecord(bound_slot(cb)->free, cb->s_comp));
    cb->bound = -1;
}

/* ---- step ---- */

static int cu_begin_step(mt_backend *be, const mt_batch *batch, float dscale, int train,
                         mt_error *err) {
    cuda_backend *cb = (cuda_backend *)be;
    const mt_config *c = cb->cfg;
    if (batch->M > cb->max_M || batch->B != cb->B || batch->T != cb->T)
        return mt_errorf(err, "batch of %d x (%lld, %lld) does not match the backend's %d x "
                         "(%lld, %lld)", batch->M, (long long)batch->B, (long long)batch->T,
                         cb->max_M, (long long)cb->B, (long long)cb->T);
    size_t N = cb->N, total = (size_t)batch->M * N;
    for (size_t i = 0; i < total; i++)
        if (batch->targets[i] != MT_IGNORE_INDEX && (batch->targets[i] < 0 ||
                                                     batch->targets[i] >= c->V))
            return mt_errorf(err, "target id %d at position %zu is outside the vocabulary "
                             "[0, %lld)", batch->targets[i], i, (long long)c->V);
    for (int mb = 0; mb < batch->M; mb++) {
        if (mt_embedding_backward_plan(cb->h_order + mb * N, cb->h_bounds + mb * (N + 1),
                                       &cb->emb_groups[mb], batch->tokens + mb * N, N, c->V, err))
            return -1;
    }
    if (train && !cb->o.gpu_grads && !cb->store->g)
        return mt_errorf(err, "training with gradients on the host needs a host store with a "
                         "gradient array (internal: create the store with grads)");
    cb->batch = batch;
    cb->train = train;
    cb->dscale = dscale;
    CUDA_CHECK(cudaEventRecord(cb->ev_start, cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->tokens, batch->tokens, total * 4, cudaMemcpyHostToDevice,
                               cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->targets, batch->targets, total * 4, cudaMemcpyHostToDevice,
                               cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->emb_order, cb->h_order, total * 4, cudaMemcpyHostToDevice,
                               cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->emb_bounds, cb->h_bounds, (size_t)batch->M * (N + 1) * 4,
                               cudaMemcpyHostToDevice, cb->s_comp));
    CUDA_CHECK(cudaMemsetAsync(cb->loss_dev, 0, sizeof(double), cb->s_comp));
    if (train && c->tie_embeddings && !cb->o.gpu_grads) {
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->embed_drained, 0));
        CUDA_CHECK(cudaMemsetAsync(cb->gacc_embed, 0, cb->t->layers[0].numel * sizeof(float),
                                   cb->s_comp));
    }
    /* The bind order of the step: forward 0..L, the head, backward L..0. */
    int nl = cb->t->n_layers, n = 0;
    for (int l = 0; l < nl; l++) cb->seq[n++] = l;
    if (train)
        for (int l = nl - 2; l >= 0; l--) cb->seq[n++] = l;
    cb->seq_len = n;
    cb->cur = 0;
    cb->issued = 0;
    cb->bound = -1;
    cb->h2d_bytes = cb->d2h_bytes = 0;
    cb->n_tspans = 0;
    cb->span_open = -1;
    /* Weights changed since the last step: nothing resident is valid. */
    for (int k = 0; k < cb->o.slots; k++) {
        cb->slots[k].layer = -1;
        cb->slots[k].last_use = -1;
    }
    cb->embed_slot.layer = -1;
    return 0;
}

static void checkpoint_traffic(cuda_backend *cb, int layer, int backward);

static void cu_bind_layer(mt_backend *be, int layer, int backward) {
    cuda_backend *cb = (cuda_backend *)be;
    MT_ASSERT(cb->cur < cb->seq_len && cb->seq[cb->cur] == layer);
    release_bound(cb);
    if (cb->o.host_checkpoints) checkpoint_traffic(cb, layer, backward);
    if (layer == cb->t->n_layers - 1) CUDA_CHECK(cudaEventRecord(cb->ev_fwd_end, cb->s_comp));
    /* Keep K-1 layers in flight ahead of the one in use. */
    int ahead = cb->cur + cb->o.slots - 1;
    while (cb->issued <= ahead && cb->issued < cb->seq_len && issue(cb, cb->issued)) cb->issued++;
    MT_ASSERT(cb->issued > cb->cur);
    cb->bound = cb->slot_of[cb->cur];
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, bound_slot(cb)->ready, 0));
    cb->span_open = span_begin(cb, cb->s_comp, MT_TRACK_COMPUTE,
                               layer == cb->t->n_layers - 1 ? "head (L%d)"
                               : backward                     ? "bwd L%d"
                                                              : "fwd L%d",
                               layer);
    cb->cur++;
    if (!backward) return;
    if (uses_embed_slot(cb, layer)) {
        cb->g_cur = cb->gacc_embed;
        return;
    }
    if (cb->o.gpu_grads) {
        /* The optimizer fetched the last step's gradient of this layer
         * before its forward could bind it (weight gate), so clearing it
         * now is safe; a tied embedding is cleared with the head, its
         * first contributor. */
        cb->g_cur = cb->gacc_all + cb->t->layers[layer].offset;
        CUDA_CHECK(cudaMemsetAsync(cb->g_cur, 0, cb->t->layers[layer].numel * sizeof(float),
                                   cb->s_comp));
        if (cb->cfg->tie_embeddings && layer == cb->t->n_layers - 1)
            CUDA_CHECK(cudaMemsetAsync(cb->gacc_embed, 0,
                                       cb->t->layers[0].numel * sizeof(float), cb->s_comp));
        return;
    }
    /* Alternate accumulators; wait until this one's last drain finished. */
    cb->gbuf ^= 1;
    cb->g_cur = cb->gacc[cb->gbuf];
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->gacc_drained[cb->gbuf], 0));
    CUDA_CHECK(cudaMemsetAsync(cb->g_cur, 0, cb->t->layers[layer].numel * sizeof(float),
                               cb->s_comp));
}

static float *ckpt_at(cuda_backend *cb, int layer, int mb) {
    size_t per = cb->N * cb->cfg->C;
    if (cb->o.host_checkpoints) return cb->dck[layer % 2] + (size_t)mb * per;
    return cb->ckpt + ((size_t)layer * cb->max_M + mb) * per;
}

/* Host checkpoints: checkpoint l lives in dck[l % 2] on the GPU while
 * layers l-1 (writing it) and l (reading it) run, and in h_ckpt otherwise.
 * Forward saves each layer's input as the next layer starts; backward loads
 * layer l-1's input while layer l computes. Events order the buffer reuse. */
static void checkpoint_traffic(cuda_backend *cb, int layer, int backward) {
    int head = cb->t->n_layers - 1;
    size_t per = (size_t)cb->batch->M * cb->N * cb->cfg->C;
    float *host = cb->h_ckpt + (size_t)layer * cb->max_M * cb->N * cb->cfg->C;
    if (!backward || layer == head) {
        if (layer >= 1) { /* checkpoint `layer` is complete: save it */
            int b = layer % 2;
            CUDA_CHECK(cudaEventRecord(cb->dck_written[b], cb->s_comp));
            CUDA_CHECK(cudaStreamWaitEvent(cb->s_d2h, cb->dck_written[b], 0));
            int sp = span_begin(cb, cb->s_d2h, MT_TRACK_D2H, "save ckpt %d", layer);
            CUDA_CHECK(cudaMemcpyAsync(host, cb->dck[b], per * sizeof(float),
                                       cudaMemcpyDeviceToHost, cb->s_d2h));
            span_end(cb, cb->s_d2h, sp);
            CUDA_CHECK(cudaEventRecord(cb->dck_saved[b], cb->s_d2h));
            cb->d2h_bytes += (double)per * sizeof(float);
        }
        /* this layer overwrites the other buffer: its old content must be saved */
        if (layer < head) CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->dck_saved[(layer + 1) % 2], 0));
        return;
    }
    if (layer >= 1 && layer < head - 1)
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->dck_loaded[layer % 2], 0));
    if (layer >= 2) { /* bring layer-1's input into the buffer layer+1 used */
        int b = (layer - 1) % 2;
        float *src = cb->h_ckpt + (size_t)(layer - 1) * cb->max_M * cb->N * cb->cfg->C;
        CUDA_CHECK(cudaEventRecord(cb->dck_free[b], cb->s_comp));
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, cb->dck_free[b], 0));
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, cb->dck_saved[b], 0));
        int sp = span_begin(cb, cb->s_h2d, MT_TRACK_H2D, "load ckpt %d", layer - 1);
        CUDA_CHECK(cudaMemcpyAsync(cb->dck[b], src, per * sizeof(float), cudaMemcpyHostToDevice,
                                   cb->s_h2d));
        span_end(cb, cb->s_h2d, sp);
        CUDA_CHECK(cudaEventRecord(cb->dck_loaded[b], cb->s_h2d));
        cb->h2d_bytes += (double)per * sizeof(float);
    }
}

static float *dx_at(cuda_backend *cb, int mb) {
    return cb->dx + (size_t)mb * cb->N * cb->cfg->C;
}

static void to_op(cuda_backend *cb, void *dst, const float *src, size_t n) {
    if (cb->prec == MT_PREC_BF16) mt_cuda_cast_f32_to_bf16(cb->ctx, dst, src, n);
}

static mt_dt op_dt(const cuda_backend *cb) { return mt_prec_operand_dtype(cb->prec); }

static void attn_check(int rc, const mt_error *err) {
    if (rc) MT_DIE("attention: %s", err->msg);
}

/* The bf16 fast path of block_forward (see cuda_backend.fast). */
static void block_forward_fast(cuda_backend *cb, acts *a, int layer, const float *x, float *out) {
    const mt_config *c = cb->cfg;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    cudaStream_t st = cb->s_comp;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = MT_PREC_BF16;
    mt_error err;
    mt_cuda_rmsnorm_forward(ctx, a->xn1_op, MT_DT_BF16, a->rstd1, x,
                            W32(cb, s, layer, MT_T_ATTN_NORM), N, C, c->rms_eps);
    mt_cuda_matmul_forward(ctx, p, a->q_op, MT_DT_BF16, a->xn1_op, W_op(cb, s, layer, MT_T_WQ),
                           NULL, N, C, Q);
    mt_cuda_matmul_forward(ctx, p, a->k_op, MT_DT_BF16, a->xn1_op, W_op(cb, s, layer, MT_T_WK),
                           NULL, N, C, KV);
    mt_cuda_matmul_forward(ctx, p, a->v_op, MT_DT_BF16, a->xn1_op, W_op(cb, s, layer, MT_T_WV),
                           NULL, N, C, KV);
    mt_cuda_rope_forward_bf16(st, a->q_op, cb->cos, cb->sin, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_forward_bf16(st, a->k_op, cb->cos, cb->sin, cb->B, cb->T, c->NKV, c->HD);
    attn_check(mt_attn_forward_bf16(a->att_op, NULL, a->lse, a->q_op, a->k_op, a->v_op, cb->B,
                                    cb->T, c->NH, c->NKV, c->HD, st, &err), &err);
    mt_cuda_matmul_forward(ctx, p, a->xmid, MT_DT_F32, a->att_op, W_op(cb, s, layer, MT_T_WO),
                           NULL, N, Q, C);
    mt_cuda_residual_add(ctx, a->xmid, a->xmid, x, N * C);
    mt_cuda_rmsnorm_forward(ctx, a->xn2_op, MT_DT_BF16, a->rstd2, a->xmid,
                            W32(cb, s, layer, MT_T_MLP_NORM), N, C, c->rms_eps);
    mt_cuda_matmul_forward(ctx, p, a->gate16, MT_DT_BF16, a->xn2_op,
                           W_op(cb, s, layer, MT_T_WGATE), NULL, N, C, F);
    mt_cuda_matmul_forward(ctx, p, a->up16, MT_DT_BF16, a->xn2_op, W_op(cb, s, layer, MT_T_WUP),
                           NULL, N, C, F);
    mt_cuda_swiglu_forward_bf16(st, a->mlp_op, a->gate16, a->up16, N * F);
    mt_cuda_matmul_forward(ctx, p, out, MT_DT_F32, a->mlp_op, W_op(cb, s, layer, MT_T_WDOWN),
                           NULL, N, F, C);
    mt_cuda_residual_add(ctx, out, out, a->xmid, N * C);
}

/* Forward activations are read from f (the scratch after a recompute, or a
 * kept unit); gradient buffers come from the scratch. */
static void block_backward_fast(cuda_backend *cb, const acts *f, int layer, const float *x,
                                float *dx) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    cudaStream_t st = cb->s_comp;
    float *g = cb->g_cur;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = MT_PREC_BF16;
    mt_error err;
    to_op(cb, a->dx_op, dx, N * C);
    mt_cuda_matmul_backward(ctx, p, a->dmlp32, false, G(cb, g, layer, MT_T_WDOWN), a->dx_op,
                            f->mlp_op, W_op(cb, s, layer, MT_T_WDOWN), N, F, C);
    mt_cuda_swiglu_backward_bf16(st, a->dgate_op, a->dup_op, a->dmlp32, f->gate16, f->up16, N * F);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WGATE), a->dgate_op,
                            f->xn2_op, W_op(cb, s, layer, MT_T_WGATE), N, C, F);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WUP), a->dup_op,
                            f->xn2_op, W_op(cb, s, layer, MT_T_WUP), N, C, F);
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_MLP_NORM), a->colsum, a->dxn32,
                             f->xmid, W32(cb, s, layer, MT_T_MLP_NORM), f->rstd2, N, C);
    to_op(cb, a->dx_op, dx, N * C);
    mt_cuda_matmul_backward(ctx, p, a->datt32, false, G(cb, g, layer, MT_T_WO), a->dx_op,
                            f->att_op, W_op(cb, s, layer, MT_T_WO), N, Q, C);
    to_op(cb, a->datt_op, a->datt32, N * Q);
    attn_check(mt_attn_backward_bf16(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt_op,
                                     f->q_op, f->k_op, f->v_op, f->att_op, f->lse, cb->B, cb->T,
                                     c->NH, c->NKV, c->HD, st, &err), &err);
    mt_cuda_rope_backward_to_bf16(st, a->dq_op, a->dq32, cb->cos, cb->sin, cb->B, cb->T, c->NH,
                                  c->HD);
    mt_cuda_rope_backward_to_bf16(st, a->dk_op, a->dk32, cb->cos, cb->sin, cb->B, cb->T, c->NKV,
                                  c->HD);
    to_op(cb, a->dv_op, a->dv32, N * KV);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WQ), a->dq_op,
                            f->xn1_op, W_op(cb, s, layer, MT_T_WQ), N, C, Q);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WK), a->dk_op,
                            f->xn1_op, W_op(cb, s, layer, MT_T_WK), N, C, KV);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WV), a->dv_op,
                            f->xn1_op, W_op(cb, s, layer, MT_T_WV), N, C, KV);
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_ATTN_NORM), a->colsum, a->dxn32, x,
                             W32(cb, s, layer, MT_T_ATTN_NORM), f->rstd1, N, C);
}

/* The kept activation unit of (layer, mb), or NULL. */
static acts *kept_unit(cuda_backend *cb, int layer, int mb) {
    int first = (int)cb->cfg->L - cb->n_keep + 1; /* layer index of the first kept block */
    if (!cb->n_keep || layer < first || layer > (int)cb->cfg->L) return NULL;
    return &cb->kept[(layer - first) * cb->max_M + mb];
}

static void block_forward(cuda_backend *cb, int layer, const float *x, float *out) {
    if (cb->fast) {
        block_forward_fast(cb, &cb->a, layer, x, out);
        return;
    }
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = cb->prec;
    mt_error err;
    mt_cuda_rmsnorm_forward(ctx, a->xn1_op, op_dt(cb), a->rstd1, x,
                            W32(cb, s, layer, MT_T_ATTN_NORM), N, C, c->rms_eps);
    float *q = c->qk_norm ? a->qpre32 : a->q32, *k = c->qk_norm ? a->kpre32 : a->k32;
    mt_cuda_matmul_forward(ctx, p, q, MT_DT_F32, a->xn1_op, W_op(cb, s, layer, MT_T_WQ),
                           W32(cb, s, layer, MT_T_BQ), N, C, Q);
    mt_cuda_matmul_forward(ctx, p, k, MT_DT_F32, a->xn1_op, W_op(cb, s, layer, MT_T_WK),
                           W32(cb, s, layer, MT_T_BK), N, C, KV);
    mt_cuda_matmul_forward(ctx, p, a->v32, MT_DT_F32, a->xn1_op, W_op(cb, s, layer, MT_T_WV),
                           W32(cb, s, layer, MT_T_BV), N, C, KV);
    if (c->qk_norm) {
        mt_cuda_rmsnorm_forward(ctx, a->q32, MT_DT_F32, a->qrstd, a->qpre32,
                                W32(cb, s, layer, MT_T_QNORM), N * c->NH, c->HD, c->rms_eps);
        mt_cuda_rmsnorm_forward(ctx, a->k32, MT_DT_F32, a->krstd, a->kpre32,
                                W32(cb, s, layer, MT_T_KNORM), N * c->NKV, c->HD, c->rms_eps);
    }
    mt_cuda_rope_forward(ctx, a->q32, cb->cos, cb->sin, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_forward(ctx, a->k32, cb->cos, cb->sin, cb->B, cb->T, c->NKV, c->HD);
    if (cb->attn_bf16) {
        to_op(cb, a->q_op, a->q32, N * Q);
        to_op(cb, a->k_op, a->k32, N * KV);
        to_op(cb, a->v_op, a->v32, N * KV);
        attn_check(mt_attn_forward_bf16(a->att_op, NULL, a->lse, a->q_op, a->k_op, a->v_op, cb->B,
                                        cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
    } else {
        /* fp32 mode, or head sizes the bf16 kernel lacks: fp32 attention,
         * its output rounded for the bf16 o_proj product. */
        attn_check(mt_attn_forward_f32(a->att32, a->lse, a->q32, a->k32, a->v32, cb->B, cb->T,
                                       c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
        to_op(cb, a->att_op, a->att32, N * Q);
    }
    mt_cuda_matmul_forward(ctx, p, a->xmid, MT_DT_F32, a->att_op, W_op(cb, s, layer, MT_T_WO),
                           NULL, N, Q, C);
    mt_cuda_residual_add(ctx, a->xmid, a->xmid, x, N * C);
    mt_cuda_rmsnorm_forward(ctx, a->xn2_op, op_dt(cb), a->rstd2, a->xmid,
                            W32(cb, s, layer, MT_T_MLP_NORM), N, C, c->rms_eps);
    mt_cuda_matmul_forward(ctx, p, a->gate32, MT_DT_F32, a->xn2_op,
                           W_op(cb, s, layer, MT_T_WGATE), NULL, N, C, F);
    mt_cuda_matmul_forward(ctx, p, a->up32, MT_DT_F32, a->xn2_op, W_op(cb, s, layer, MT_T_WUP),
                           NULL, N, C, F);
    mt_cuda_swiglu_forward(ctx, a->mlp_op, op_dt(cb), a->gate32, a->up32, N, F);
    mt_cuda_matmul_forward(ctx, p, out, MT_DT_F32, a->mlp_op, W_op(cb, s, layer, MT_T_WDOWN),
                           NULL, N, F, C);
    mt_cuda_residual_add(ctx, out, out, a->xmid, N * C);
}

static void block_backward(cuda_backend *cb, int layer, const float *x, float *dx) {
    if (cb->fast) {
        block_backward_fast(cb, &cb->a, layer, x, dx);
        return;
    }
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    float *g = cb->g_cur;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = cb->prec;
    mt_error err;
    void *dx_op = p == MT_PREC_BF16 ? a->dx_op : dx;

    /* MLP: out = xmid + down(silu(gate) * up) */
    to_op(cb, dx_op, dx, N * C);
    mt_cuda_matmul_backward(ctx, p, a->dmlp32, false, G(cb, g, layer, MT_T_WDOWN), dx_op,
                            a->mlp_op, W_op(cb, s, layer, MT_T_WDOWN), N, F, C);
    mt_cuda_swiglu_backward(ctx, a->dgate32, a->dup32, a->dmlp32, a->gate32, a->up32, N, F);
    to_op(cb, a->dgate_op, a->dgate32, N * F);
    to_op(cb, a->dup_op, a->dup32, N * F);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WGATE), a->dgate_op,
                            a->xn2_op, W_op(cb, s, layer, MT_T_WGATE), N, C, F);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WUP), a->dup_op,
                            a->xn2_op, W_op(cb, s, layer, MT_T_WUP), N, C, F);
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_MLP_NORM), a->colsum, a->dxn32,
                             a->xmid, W32(cb, s, layer, MT_T_MLP_NORM), a->rstd2, N, C);

    /* Attention: xmid = x + o_proj(att) */
    to_op(cb, dx_op, dx, N * C);
    mt_cuda_matmul_backward(ctx, p, a->datt32, false, G(cb, g, layer, MT_T_WO), dx_op,
                            a->att_op, W_op(cb, s, layer, MT_T_WO), N, Q, C);
    if (cb->attn_bf16) {
        to_op(cb, a->datt_op, a->datt32, N * Q);
        attn_check(mt_attn_backward_bf16(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt_op,
                                         a->q_op, a->k_op, a->v_op, a->att_op, a->lse, cb->B,
                                         cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
    } else {
        attn_check(mt_attn_backward_f32(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt32,
                                        a->q32, a->k32, a->v32, a->att32, a->lse, cb->B, cb->T,
                                        c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
    }
    mt_cuda_rope_backward(ctx, a->dq32, cb->cos, cb->sin, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_backward(ctx, a->dk32, cb->cos, cb->sin, cb->B, cb->T, c->NKV, c->HD);
    float *dq = a->dq32, *dk = a->dk32;
    if (c->qk_norm) {
        CUDA_CHECK(cudaMemsetAsync(a->dqn32, 0, N * Q * sizeof(float), cb->s_comp));
        CUDA_CHECK(cudaMemsetAsync(a->dkn32, 0, N * KV * sizeof(float), cb->s_comp));
        mt_cuda_rmsnorm_backward(ctx, a->dqn32, G(cb, g, layer, MT_T_QNORM), a->colsum, a->dq32,
                                 a->qpre32, W32(cb, s, layer, MT_T_QNORM), a->qrstd, N * c->NH,
                                 c->HD);
        mt_cuda_rmsnorm_backward(ctx, a->dkn32, G(cb, g, layer, MT_T_KNORM), a->colsum, a->dk32,
                                 a->kpre32, W32(cb, s, layer, MT_T_KNORM), a->krstd, N * c->NKV,
                                 c->HD);
        dq = a->dqn32;
        dk = a->dkn32;
    }
    if (c->qkv_bias) {
        mt_cuda_bias_backward(ctx, G(cb, g, layer, MT_T_BQ), a->colsum, dq, N, Q);
        mt_cuda_bias_backward(ctx, G(cb, g, layer, MT_T_BK), a->colsum, dk, N, KV);
        mt_cuda_bias_backward(ctx, G(cb, g, layer, MT_T_BV), a->colsum, a->dv32, N, KV);
    }
    void *dq_op = p == MT_PREC_BF16 ? a->dq_op : dq, *dk_op = p == MT_PREC_BF16 ? a->dk_op : dk;
    to_op(cb, dq_op, dq, N * Q);
    to_op(cb, dk_op, dk, N * KV);
    to_op(cb, a->dv_op, a->dv32, N * KV);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WQ), dq_op, a->xn1_op,
                            W_op(cb, s, layer, MT_T_WQ), N, C, Q);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WK), dk_op, a->xn1_op,
                            W_op(cb, s, layer, MT_T_WK), N, C, KV);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WV), a->dv_op,
                            a->xn1_op, W_op(cb, s, layer, MT_T_WV), N, C, KV);
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_ATTN_NORM), a->colsum, a->dxn32, x,
                             W32(cb, s, layer, MT_T_ATTN_NORM), a->rstd1, N, C);
}

static void cu_forward(mt_backend *be, int layer, int mb) {
    cuda_backend *cb = (cuda_backend *)be;
    if (layer == 0) {
        /* The lookup reads fp32 weights: the residual stream is fp32. */
        mt_cuda_embedding_forward(cb->ctx, ckpt_at(cb, 1, mb), cb->tokens + (size_t)mb * cb->N,
                                  W32(cb, bound_slot(cb), 0, MT_T_EMBED), MT_DT_F32, cb->N,
                                  cb->cfg->C);
        return;
    }
    acts *k = cb->train ? kept_unit(cb, layer, mb) : NULL;
    if (k) block_forward_fast(cb, k, layer, ckpt_at(cb, layer, mb), ckpt_at(cb, layer + 1, mb));
    else block_forward(cb, layer, ckpt_at(cb, layer, mb), ckpt_at(cb, layer + 1, mb));
}

/* The output matrix and its gradient: the head's own, or layer 0's. */
static void head_matrix(cuda_backend *cb, int head, void **w, float **g) {
    if (cb->cfg->tie_embeddings) {
        *w = W_op(cb, &cb->embed_slot, 0, MT_T_EMBED);
        *g = G(cb, cb->gacc_embed, 0, MT_T_EMBED);
    } else {
        *w = W_op(cb, bound_slot(cb), head, MT_T_LM_HEAD);
        *g = G(cb, cb->g_cur, head, MT_T_LM_HEAD);
    }
}

static void cu_head(mt_backend *be, int mb) {
    cuda_backend *cb = (cuda_backend *)be;
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    int head = cb->t->n_layers - 1;
    size_t N = cb->N, C = c->C;
    slot *s = bound_slot(cb);
    const float *x = ckpt_at(cb, head, mb);
    if (c->tie_embeddings) CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->embed_slot.ready, 0));
    void *wl;
    float *gl;
    head_matrix(cb, head, &wl, &gl);
    mt_cuda_rmsnorm_forward(cb->ctx, a->xf_op, op_dt(cb), a->rstdf, x,
                            W32(cb, s, head, MT_T_FINAL_NORM), N, C, c->rms_eps);
    size_t R = (size_t)cb->o.head_chunk < N ? (size_t)cb->o.head_chunk : N;
    mt_cuda_lm_head_loss(cb->ctx, cb->prec, cb->loss_dev, a->row_loss,
                         cb->train ? a->dxf32 : NULL, false, cb->train ? gl : NULL,
                         a->head_scratch, a->xf_op, wl, cb->targets + (size_t)mb * N, N, C, c->V,
                         R, cb->dscale);
    if (!cb->train) return;
    float *dx = dx_at(cb, mb);
    CUDA_CHECK(cudaMemsetAsync(dx, 0, N * C * sizeof(float), cb->s_comp));
    mt_cuda_rmsnorm_backward(cb->ctx, dx, G(cb, cb->g_cur, head, MT_T_FINAL_NORM), a->colsum,
                             a->dxf32, x, W32(cb, s, head, MT_T_FINAL_NORM), a->rstdf, N, C);
}

static void cu_backward(mt_backend *be, int layer, int mb) {
    cuda_backend *cb = (cuda_backend *)be;
    size_t N = cb->N;
    if (layer == 0) {
        mt_cuda_embedding_backward(cb->ctx, G(cb, cb->g_cur, 0, MT_T_EMBED), dx_at(cb, mb),
                                   cb->tokens + mb * N, cb->emb_order + mb * N,
                                   cb->emb_bounds + mb * (N + 1), cb->emb_groups[mb],
                                   cb->cfg->C);
        return;
    }
    acts *k = kept_unit(cb, layer, mb);
    if (k) { /* activations kept since the forward: no recompute */
        block_backward_fast(cb, k, layer, ckpt_at(cb, layer, mb), dx_at(cb, mb));
        return;
    }
    block_forward(cb, layer, ckpt_at(cb, layer, mb), cb->a.xtmp);
    block_backward(cb, layer, ckpt_at(cb, layer, mb), dx_at(cb, mb));
}

static void cu_layer_grads_done(mt_backend *be, int layer) {
    cuda_backend *cb = (cuda_backend *)be;
    const mt_layer_desc *ld = &cb->t->layers[layer];
    /* With tied embeddings the head's matrix gradient lives in layer 0's
     * accumulator, which drains when layer 0 is done. */
    mt_cuda_sumsq(cb->s_comp, cb->sumsq_dev + layer, cb->sumsq_scratch, cb->g_cur, ld->numel);
    if (cb->o.gpu_grads) return; /* the optimizer fetches it */
    CUDA_CHECK(cudaEventRecord(cb->grad_ready, cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_d2h, cb->grad_ready, 0));
    int sp = span_begin(cb, cb->s_d2h, MT_TRACK_D2H, "grads L%d", layer);
    CUDA_CHECK(cudaMemcpyAsync(cb->store->g + ld->offset, cb->g_cur, ld->numel * sizeof(float),
                               cudaMemcpyDeviceToHost, cb->s_d2h));
    span_end(cb, cb->s_d2h, sp);
    cb->d2h_bytes += (double)ld->numel * sizeof(float);
    CUDA_CHECK(cudaEventRecord(uses_embed_slot(cb, layer) ? cb->embed_drained
                                                          : cb->gacc_drained[cb->gbuf],
                               cb->s_d2h));
}

static double cu_end_step(mt_backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    release_bound(cb);
    CUDA_CHECK(cudaMemcpyAsync(cb->h_loss, cb->loss_dev, sizeof(double), cudaMemcpyDeviceToHost,
                               cb->s_comp));
    if (cb->train)
        CUDA_CHECK(cudaMemcpyAsync(cb->h_sumsq, cb->sumsq_dev,
                                   (size_t)cb->t->n_layers * sizeof(double),
                                   cudaMemcpyDeviceToHost, cb->s_comp));
    CUDA_CHECK(cudaEventRecord(cb->ev_end, cb->s_comp));
    CUDA_CHECK(cudaEventRecord(cb->ev_d2h_end, cb->s_d2h));
    CUDA_CHECK(cudaEventSynchronize(cb->ev_end));
    float fwd = 0, tot = 0;
    if (cb->train) CUDA_CHECK(cudaEventElapsedTime(&fwd, cb->ev_start, cb->ev_fwd_end));
    CUDA_CHECK(cudaEventElapsedTime(&tot, cb->ev_start, cb->ev_end));
    cb->times = (mt_cuda_step_times){.forward_ms = fwd, .backward_ms = tot - fwd, .total_ms = tot,
                                     .h2d_bytes = cb->h2d_bytes, .d2h_bytes = cb->d2h_bytes};
    if (cb->trace) {
        CUDA_CHECK(cudaEventSynchronize(cb->ev_d2h_end));
        CUDA_CHECK(cudaStreamSynchronize(cb->s_h2d));
        for (int i = 0; i < cb->n_tspans; i++) {
            float a = 0, b = 0;
            CUDA_CHECK(cudaEventElapsedTime(&a, cb->ev_base, cb->tev[2 * i]));
            CUDA_CHECK(cudaEventElapsedTime(&b, cb->ev_base, cb->tev[2 * i + 1]));
            mt_trace_add(cb->trace, cb->tspan[i].track, cb->tspan[i].name,
                         cb->trace_base_us + a * 1e3, (b - a) * 1e3);
        }
    }
    return *cb->h_loss;
}

static const mt_backend_ops cuda_ops = {
    .begin_step = cu_begin_step,
    .bind_layer = cu_bind_layer,
    .forward = cu_forward,
    .head = cu_head,
    .backward = cu_backward,
    .layer_grads_done = cu_layer_grads_done,
    .end_step = cu_end_step,
};

/* ---- lifetime ---- */

static int pin(void *p, size_t bytes, mt_error *err) {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess)
        return mt_errorf(err, "pinning %.2f GiB of host memory failed: %s; lower the memory "
                         "lock limit (ulimit -l) or use a smaller model",
                         (double)bytes / (1 << 30), cudaGetErrorString(e));
    return 0;
}

/* Pins the weight and gradient arrays layer by layer: every copy stays
 * inside one registration, and each registration is one layer's range. */
static int pin_store(cuda_backend *cb, int on, mt_error *err) {
    const mt_param_table *t = cb->t;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        float *arrays[] = {cb->store->w + ld->offset, cb->store->g ? cb->store->g + ld->offset : NULL};
        for (int i = 0; i < 2; i++) {
            if (!arrays[i]) continue;
            if (!on) {
                cudaHostUnregister(arrays[i]);
                continue;
            }
            if (pin(arrays[i], ld->numel * sizeof(float), err)) return -1;
        }
    }
    return 0;
}

static void make_event(cudaEvent_t *e, int timing) {
    CUDA_CHECK(cudaEventCreateWithFlags(e, timing ? cudaEventDefault : cudaEventDisableTiming));
}

mt_backend *mt_cuda_backend_create(const mt_config *c, const mt_param_table *t,
                                   mt_host_store *store, int max_M, int64_t B, int64_t T,
                                   const mt_cuda_backend_opts *o, mt_error *err) {
    if (mt_cuda_device_count() <= 0)
        return mt_errorf(err, "no CUDA GPU is visible; use --device cpu"), NULL;
    if (max_M <= 0 || B <= 0 || T <= 0)
        return mt_errorf(err, "micro-batch shape must be positive"), NULL;
    if (c->HD % 4 || c->C % 4)
        return mt_errorf(err, "the CUDA backend needs hidden_size and head_dim divisible by 4"),
               NULL;
    cuda_backend *cb = mt_calloc_or_die(1, sizeof *cb);
    cb->base.ops = &cuda_ops;
    cb->base.name = "cuda";
    cb->cfg = c;
    cb->t = t;
    cb->store = store;
    default_opts(&cb->o, o);
    cb->prec = cb->o.precision == MT_GPU_BF16 ? MT_PREC_BF16 : MT_PREC_FP32;
    cb->max_M = max_M;
    cb->B = B;
    cb->T = T;
    cb->N = B * T;
    if ((size_t)(2 * t->n_layers) > sizeof cb->seq / sizeof *cb->seq) {
        free(cb);
        return mt_errorf(err, "too many layers (%d) for the CUDA backend", t->n_layers), NULL;
    }
    bump b = {0};
    plan(cb, &b);
    if (cb->fast && cb->o.keep_layers != 0) {
        /* Keep whole layers (all micro-batches) with what memory is left,
         * less a margin for cuBLAS and the CUDA context. */
        size_t fr = 0, tot = 0;
        CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
        size_t margin = (size_t)4 << 30, per_layer = keep_unit_bytes(cb) * (size_t)max_M;
        int fit = fr > b.used + margin ? (int)((fr - b.used - margin) / per_layer) : 0;
        int want = cb->o.keep_layers < 0 ? (int)c->L : cb->o.keep_layers;
        cb->n_keep = want < fit ? want : fit;
        if (cb->n_keep > (int)c->L) cb->n_keep = (int)c->L;
        cb->kept = mt_calloc_or_die((size_t)(cb->n_keep ? cb->n_keep : 1) * max_M, sizeof *cb->kept);
        b = (bump){0};
        plan(cb, &b);
    }
    cb->dev_bytes = b.used;
    cudaError_t e = cudaMalloc((void **)&cb->dev_base, b.used);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        free(cb);
        return mt_errorf(err, "GPU memory: need %.2f GiB, %.2f GiB free; lower --batch-size or "
                         "--seq-len", (double)b.used / (1 << 30), (double)fr / (1 << 30)), NULL;
    }
    b = (bump){.base = cb->dev_base};
    plan(cb, &b);
    CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_h2d, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_comp, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_d2h, cudaStreamNonBlocking));
    if (mt_cuda_ctx_create(&cb->ctx, cb->s_comp, 0, err) ||
        mt_cuda_ctx_create(&cb->ctx_h2d, cb->s_h2d, 1 << 20, err)) {
        mt_cuda_backend_free(&cb->base);
        return NULL;
    }
    for (int k = 0; k < cb->o.slots; k++) {
        make_event(&cb->slots[k].ready, 0);
        make_event(&cb->slots[k].free, 0);
        CUDA_CHECK(cudaEventRecord(cb->slots[k].free, cb->s_comp));
        cb->slots[k].layer = -1;
    }
    make_event(&cb->embed_slot.ready, 0);
    make_event(&cb->embed_slot.free, 0);
    CUDA_CHECK(cudaEventRecord(cb->embed_slot.free, cb->s_comp));
    for (int i = 0; i < 2; i++) {
        make_event(&cb->gacc_drained[i], 0);
        CUDA_CHECK(cudaEventRecord(cb->gacc_drained[i], cb->s_d2h));
    }
    make_event(&cb->grad_ready, 0);
    if (cb->o.gpu_grads) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_fetch, cudaStreamNonBlocking));
        for (int i = 0; i < 2; i++) {
            make_event(&cb->fetched[i], 0);
            CUDA_CHECK(cudaMallocHost((void **)&cb->h_stage[i], t->max_layer_numel * sizeof(float)));
        }
    }
    make_event(&cb->embed_drained, 0);
    CUDA_CHECK(cudaEventRecord(cb->embed_drained, cb->s_d2h));
    for (int i = 0; i < 2; i++) {
        make_event(&cb->dck_saved[i], 0);
        make_event(&cb->dck_loaded[i], 0);
        make_event(&cb->dck_free[i], 0);
        make_event(&cb->dck_written[i], 0);
        CUDA_CHECK(cudaEventRecord(cb->dck_saved[i], cb->s_d2h));
    }
    if (cb->o.host_checkpoints) {
        size_t bytes = (size_t)t->n_layers * max_M * cb->N * c->C * sizeof(float);
        if (cudaMallocHost((void **)&cb->h_ckpt, bytes) != cudaSuccess) {
            mt_errorf(err, "host checkpoints: cannot pin %.2f GiB; use GPU checkpoints or a "
                      "smaller batch", (double)bytes / (1 << 30));
            mt_cuda_backend_free(&cb->base);
            return NULL;
        }
    }
    make_event(&cb->ev_start, 1);
    make_event(&cb->ev_fwd_end, 1);
    make_event(&cb->ev_end, 1);
    make_event(&cb->ev_d2h_end, 0);
    size_t hn = (size_t)T * c->HD / 2;
    float *cs = mt_malloc_or_die(2 * hn * sizeof(float));
    mt_rope_tables(cs, cs + hn, c, (size_t)T);
    CUDA_CHECK(cudaMemcpy(cb->cos, cs, hn * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(cb->sin, cs + hn, hn * sizeof(float), cudaMemcpyHostToDevice));
    free(cs);
    size_t N = cb->N;
    cb->h_order = mt_malloc_or_die((size_t)max_M * N * 4);
    cb->h_bounds = mt_malloc_or_die((size_t)max_M * (N + 1) * 4);
    cb->emb_groups = mt_calloc_or_die((size_t)max_M, sizeof(size_t));
    CUDA_CHECK(cudaMallocHost((void **)&cb->h_loss, sizeof(double)));
    CUDA_CHECK(cudaMallocHost((void **)&cb->h_sumsq, (size_t)t->n_layers * sizeof(double)));
    if (pin_store(cb, 1, err)) {
        mt_cuda_backend_free(&cb->base);
        return NULL;
    }
    return &cb->base;
}

void mt_cuda_backend_free(mt_backend *be) {
    if (!be) return;
    cuda_backend *cb = (cuda_backend *)be;
    if (cb->s_comp) {
        CUDA_CHECK(cudaDeviceSynchronize());
        pin_store(cb, 0, NULL);
        /* Unregistering ranges that were never registered (creation failed
         * half way) reports an error we expect: clear it. */
        (void)cudaGetLastError();
    }
    if (cb->ctx) mt_cuda_ctx_free(cb->ctx);
    if (cb->ctx_h2d) mt_cuda_ctx_free(cb->ctx_h2d);
    for (int k = 0; k < cb->o.slots; k++) {
        if (cb->slots[k].ready) cudaEventDestroy(cb->slots[k].ready);
        if (cb->slots[k].free) cudaEventDestroy(cb->slots[k].free);
    }
    cudaEvent_t evs[] = {cb->embed_slot.ready, cb->embed_slot.free, cb->gacc_drained[0],
                         cb->gacc_drained[1], cb->grad_ready, cb->ev_start, cb->ev_fwd_end,
                         cb->ev_end, cb->ev_d2h_end, cb->dck_saved[0], cb->dck_saved[1],
                         cb->dck_loaded[0], cb->dck_loaded[1], cb->dck_free[0], cb->dck_free[1],
                         cb->dck_written[0], cb->dck_written[1], cb->embed_drained};
    for (size_t i = 0; i < sizeof evs / sizeof *evs; i++)
        if (evs[i]) cudaEventDestroy(evs[i]);
    if (cb->s_h2d) cudaStreamDestroy(cb->s_h2d);
    if (cb->s_comp) cudaStreamDestroy(cb->s_comp);
    if (cb->s_d2h) cudaStreamDestroy(cb->s_d2h);
    if (cb->h_loss) cudaFreeHost(cb->h_loss);
    if (cb->h_sumsq) cudaFreeHost(cb->h_sumsq);
    if (cb->h_ckpt) cudaFreeHost(cb->h_ckpt);
    for (int i = 0; i < 2; i++) {
        if (cb->h_stage[i]) cudaFreeHost(cb->h_stage[i]);
        if (cb->fetched[i]) cudaEventDestroy(cb->fetched[i]);
    }
    if (cb->s_fetch) cudaStreamDestroy(cb->s_fetch);
    if (cb->tev) {
        for (int i = 0; i < 2 * TRACE_SPANS; i++) cudaEventDestroy(cb->tev[i]);
        cudaEventDestroy(cb->ev_base);
        free(cb->tev);
    }
    cudaFree(cb->dev_base);
    free(cb->h_order);
    free(cb->h_bounds);
    free(cb->emb_groups);
    free(cb->kept);
    free(cb);
}

void mt_cuda_backend_set_trace(mt_backend *be, mt_trace *trace) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb->tev) {
        cb->tev = mt_calloc_or_die(2 * TRACE_SPANS, sizeof *cb->tev);
        for (int i = 0; i < 2 * TRACE_SPANS; i++) make_event(&cb->tev[i], 1);
        make_event(&cb->ev_base, 1);
    }
    /* One moment seen by both clocks: the event, then the host, at once. */
    CUDA_CHECK(cudaEventRecord(cb->ev_base, cb->s_comp));
    CUDA_CHECK(cudaEventSynchronize(cb->ev_base));
    cb->trace_base_us = mt_trace_now_us();
    cb->trace = trace;
}

void mt_cuda_backend_set_weight_gate(mt_backend *be, mt_weight_gate_fn fn, void *ctx) {
    cuda_backend *cb = (cuda_backend *)be;
    cb->gate = fn;
    cb->gate_ctx = ctx;
}

const double *mt_cuda_backend_layer_sumsq(mt_backend *be) {
    return ((cuda_backend *)be)->h_sumsq;
}

const float *mt_cuda_backend_grads_begin(mt_backend *be, int layer) {
    cuda_backend *cb = (cuda_backend *)be;
    const mt_layer_desc *ld = &cb->t->layers[layer];
    if (!cb->o.gpu_grads) return cb->store->g + ld->offset;
    float *dst = cb->h_stage[layer % 2];
    /* ev_end (the step's last compute) has completed before the optimizer
     * runs, so the accumulators are final. */
    CUDA_CHECK(cudaMemcpyAsync(dst, cb->gacc_all + ld->offset, ld->numel * sizeof(float),
                               cudaMemcpyDeviceToHost, cb->s_fetch));
    CUDA_CHECK(cudaEventRecord(cb->fetched[layer % 2], cb->s_fetch));
    return dst;
}

void mt_cuda_backend_grads_wait(mt_backend *be, int layer) {
    cuda_backend *cb = (cuda_backend *)be;
    if (cb->o.gpu_grads) CUDA_CHECK(cudaEventSynchronize(cb->fetched[layer % 2]));
}

void mt_cuda_backend_wait_grads(mt_backend *be) {
    CUDA_CHECK(cudaEventSynchronize(((cuda_backend *)be)->ev_d2h_end));
}

void mt_cuda_backend_times(mt_backend *be, mt_cuda_step_times *t) {
    *t = ((cuda_backend *)be)->times;
}

size_t mt_cuda_backend_device_bytes(mt_backend *be) { return ((cuda_backend *)be)->dev_bytes; }

int mt_cuda_backend_kept_layers(mt_backend *be) { return ((cuda_backend *)be)->n_keep; }

void mt_cuda_backend_logits(mt_backend *be, int mb, int64_t row, float *logits) {
    cuda_backend *cb = (cuda_backend *)be;
    const mt_config *c = cb->cfg;
    int head = cb->t->n_layers - 1;
    MT_ASSERT(row >= 0 && row < cb->N && mb >= 0 && mb < cb->max_M);
    /* Rare and small: upload what the row needs into scratch, compute on
     * the compute stream, read back. Uses the CPU reference for the tiny
     * product so the GPU path stays free of one-row special cases. */
    size_t C = c->C, V = c->V;
    float *x = mt_malloc_or_die(C * sizeof(float)), *xn = mt_malloc_or_die(C * sizeof(float));
    CUDA_CHECK(cudaMemcpy(x, ckpt_at(cb, head, mb) + (size_t)row * C, C * sizeof(float),
                          cudaMemcpyDeviceToHost));
    const mt_layer_desc *hl = &cb->t->layers[head];
    const float *wn = cb->store->w + hl->offset + hl->tensors[hl->by_role[MT_T_FINAL_NORM]].offset;
    float rstd;
    mt_cpu_rmsnorm_forward(xn, &rstd, x, wn, 1, C, c->rms_eps);
    const float *wl;
    if (c->tie_embeddings) {
        const mt_layer_desc *el = &cb->t->layers[0];
        wl = cb->store->w + el->offset + el->tensors[el->by_role[MT_T_EMBED]].offset;
    } else {
        wl = cb->store->w + hl->offset + hl->tensors[hl->by_role[MT_T_LM_HEAD]].offset;
    }
    mt_cpu_matmul_forward(logits, xn, wl, NULL, 1, C, V);
    free(x);
    free(xn);
}
