/* The CUDA streaming backend (SPEC 1).
 *
 * GPU memory, all taken at creation from one allocation:
 *   slots[K]   a ring of weight slots, each one layer: fp32 (as copied from
 *              the host store) and, in bf16 mode, its bf16 cast
 *   gradients  per layer (mt_layer_home), where they wait for the
 *              optimizer: host-waiting layers accumulate in gacc[2] by
 *              turns and drain to the host once per step (fp32, or rounded
 *              to bf16 on the GPU first); GPU-waiting layers each keep an
 *              fp32 accumulator in gacc_all that the optimizer fetches
 *   ckpt       per layer: fp32 layer inputs (M, N, C) on the GPU, or in
 *              pinned host memory visiting dck[2]
 *   dx         (M, N, C) fp32 residual-stream gradient, per micro-batch
 *   acts/grads one layer's activations and gradients for one micro-batch,
 *              and kept forward activations of the last layers
 * Streams: h2d copies weights into slots ahead of use (the bind order of a
 * step is known in advance), compute runs the layers, d2h drains each
 * layer's gradient once per step. Only events order them.
 * The memory plan is in backend_cuda_plan.c, the layer templates in
 * layers_cuda.c. */
#include "backend/cuda/backend_cuda.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/engine_kernels.h"
#include "model/rope.h"
#include "util/mem.h"

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

/* ---- weights ---- */

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
    cb->batch = batch;
    cb->train = train;
    cb->dscale = dscale;
    CUDA_CHECK(cudaEventRecord(cb->ev_start, cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->tokens, batch->tokens, total * 4, cudaMemcpyHostToDevice,
                               cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->targets, batch->targets, total * 4, cudaMemcpyHostToDevice,
                               cb->s_comp));
    if (mt_cuda_upload_pos(cb, batch, err)) return -1;
    CUDA_CHECK(cudaMemcpyAsync(cb->emb_order, cb->h_order, total * 4, cudaMemcpyHostToDevice,
                               cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->emb_bounds, cb->h_bounds, (size_t)batch->M * (N + 1) * 4,
                               cudaMemcpyHostToDevice, cb->s_comp));
    CUDA_CHECK(cudaMemsetAsync(cb->loss_dev, 0, sizeof(double), cb->s_comp));
    if (train && c->tie_embeddings && cb->home[0].grad_host) {
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
    cb->dck_holds[0] = cb->dck_holds[1] = -1;
    return 0;
}

static void checkpoint_traffic(cuda_backend *cb, int layer, int backward);

static void cu_bind_layer(mt_backend *be, int layer, int backward) {
    cuda_backend *cb = (cuda_backend *)be;
    MT_ASSERT(cb->cur < cb->seq_len && cb->seq[cb->cur] == layer);
    release_bound(cb);
    if (cb->n_host_ckpt) checkpoint_traffic(cb, layer, backward);
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
    /* A GPU-waiting tied embedding is cleared with the head, its first
     * contributor (a host-waiting one at the start of the step). */
    if (cb->cfg->tie_embeddings && layer == cb->t->n_layers - 1 && !cb->home[0].grad_host)
        CUDA_CHECK(cudaMemsetAsync(cb->gacc_embed, 0, cb->t->layers[0].numel * sizeof(float),
                                   cb->s_comp));
    if (uses_embed_slot(cb, layer)) {
        cb->g_cur = cb->gacc_embed;
        return;
    }
    if (!cb->home[layer].grad_host) {
        /* The optimizer fetched the last step's gradient of this layer
         * before its forward could bind it (weight gate), so clearing it
         * now is safe. */
        cb->g_cur = cb->gacc_all + cb->goff[layer];
        CUDA_CHECK(cudaMemsetAsync(cb->g_cur, 0, cb->t->layers[layer].numel * sizeof(float),
                                   cb->s_comp));
        return;
    }
    /* Alternate accumulators; wait until this one's last drain finished. */
    cb->gbuf ^= 1;
    cb->g_cur = cb->gacc[cb->gbuf];
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->gacc_drained[cb->gbuf], 0));
    CUDA_CHECK(cudaMemsetAsync(cb->g_cur, 0, cb->t->layers[layer].numel * sizeof(float),
                               cb->s_comp));
}

/* Host checkpoints: checkpoint l lives in dck[l % 2] on the GPU while
 * layers l-1 (writing it) and l (reading it) run, and in h_ckpt otherwise.
 * Forward saves each host checkpoint as the layer that reads it starts;
 * backward loads layer l-1's input while layer l computes, unless dck still
 * holds it. Events order the buffer reuse. */
static void save_checkpoint(cuda_backend *cb, int layer) {
    int b = layer % 2;
    size_t per = (size_t)cb->batch->M * cb->N * cb->cfg->C;
    float *host = cb->h_ckpt + (size_t)cb->ck_idx[layer] * cb->max_M * cb->N * cb->cfg->C;
    CUDA_CHECK(cudaEventRecord(cb->dck_written[b], cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_d2h, cb->dck_written[b], 0));
    int sp = span_begin(cb, cb->s_d2h, MT_TRACK_D2H, "save ckpt %d", layer);
    CUDA_CHECK(cudaMemcpyAsync(host, cb->dck[b], per * sizeof(float), cudaMemcpyDeviceToHost,
                               cb->s_d2h));
    span_end(cb, cb->s_d2h, sp);
    CUDA_CHECK(cudaEventRecord(cb->dck_saved[b], cb->s_d2h));
    cb->d2h_bytes += (double)per * sizeof(float);
}

static void load_checkpoint(cuda_backend *cb, int layer) {
    int b = layer % 2;
    size_t per = (size_t)cb->batch->M * cb->N * cb->cfg->C;
    const float *src = cb->h_ckpt + (size_t)cb->ck_idx[layer] * cb->max_M * cb->N * cb->cfg->C;
    CUDA_CHECK(cudaEventRecord(cb->dck_free[b], cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, cb->dck_free[b], 0));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, cb->dck_saved[b], 0));
    int sp = span_begin(cb, cb->s_h2d, MT_TRACK_H2D, "load ckpt %d", layer);
    CUDA_CHECK(cudaMemcpyAsync(cb->dck[b], src, per * sizeof(float), cudaMemcpyHostToDevice,
                               cb->s_h2d));
    span_end(cb, cb->s_h2d, sp);
    CUDA_CHECK(cudaEventRecord(cb->dck_loaded[b], cb->s_h2d));
    cb->h2d_bytes += (double)per * sizeof(float);
    cb->dck_holds[b] = layer;
}

static void checkpoint_traffic(cuda_backend *cb, int layer, int backward) {
    const mt_layer_home *h = cb->home;
    int head = cb->t->n_layers - 1;
    if (!backward || layer == head) {
        if (layer >= 1 && h[layer].ckpt_host) save_checkpoint(cb, layer);
        /* this layer writes checkpoint layer+1: a host one overwrites the
         * other buffer, whose old content must be saved */
        if (layer < head && h[layer + 1].ckpt_host) {
            CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->dck_saved[(layer + 1) % 2], 0));
            cb->dck_holds[(layer + 1) % 2] = layer + 1;
        }
        return;
    }
    if (layer >= 1 && h[layer].ckpt_host) {
        if (cb->dck_holds[layer % 2] != layer) load_checkpoint(cb, layer); /* not prefetched */
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->dck_loaded[layer % 2], 0));
    }
    /* prefetch the next host checkpoint the backward reads (layer-1's) */
    if (layer >= 2 && h[layer - 1].ckpt_host && cb->dck_holds[(layer - 1) % 2] != layer - 1)
        load_checkpoint(cb, layer - 1);
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
    acts *k = cb->train ? mt_cuda_kept_unit(cb, layer, mb) : NULL;
    mt_cuda_block_forward(cb, k ? k : &cb->a, layer, ckpt_at(cb, layer, mb),
                          ckpt_at(cb, layer + 1, mb));
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
    acts *k = mt_cuda_kept_unit(cb, layer, mb);
    if (!k) { /* recompute: the forward's activations were not kept */
        k = &cb->a;
        mt_cuda_block_forward(cb, k, layer, ckpt_at(cb, layer, mb), cb->a.xtmp);
    }
    mt_cuda_block_backward(cb, k, layer, ckpt_at(cb, layer, mb), dx_at(cb, mb));
}

/* Where layer l's gradient waits on the host. */
static void *host_grad_at(cuda_backend *cb, int layer) {
    if (cb->grads_to_store) return cb->store->g + cb->t->layers[layer].offset;
    size_t es = cb->o.host_grad_bf16 ? 2 : 4;
    return (char *)cb->h_grad + cb->h_goff[layer] * es;
}

static void cu_layer_grads_done(mt_backend *be, int layer) {
    cuda_backend *cb = (cuda_backend *)be;
    const mt_layer_desc *ld = &cb->t->layers[layer];
    /* With tied embeddings the head's matrix gradient lives in layer 0's
     * accumulator, which drains when layer 0 is done. The norm is taken
     * from the fp32 accumulation, before any rounding. */
    mt_cuda_sumsq(cb->s_comp, cb->sumsq_dev + layer, cb->sumsq_scratch, cb->g_cur, ld->numel);
    if (!cb->home[layer].grad_host) return; /* the optimizer fetches it */
    cudaEvent_t acc_drained = uses_embed_slot(cb, layer) ? cb->embed_drained
                                                         : cb->gacc_drained[cb->gbuf];
    const void *src = cb->g_cur;
    size_t bytes = ld->numel * sizeof(float);
    cudaEvent_t src_drained = acc_drained;
    if (cb->o.host_grad_bf16) {
        /* Round on the GPU into a stage buffer; the accumulator is free
         * once the cast ran, the stage once its copy ran. */
        int b = cb->sbuf ^= 1;
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->stage_drained[b], 0));
        mt_cuda_cast_f32_to_bf16(cb->ctx, cb->g16_stage[b], cb->g_cur, ld->numel);
        CUDA_CHECK(cudaEventRecord(acc_drained, cb->s_comp));
        src = cb->g16_stage[b];
        bytes = ld->numel * 2;
        src_drained = cb->stage_drained[b];
    }
    CUDA_CHECK(cudaEventRecord(cb->grad_ready, cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_d2h, cb->grad_ready, 0));
    int sp = span_begin(cb, cb->s_d2h, MT_TRACK_D2H, "grads L%d", layer);
    CUDA_CHECK(cudaMemcpyAsync(host_grad_at(cb, layer), src, bytes, cudaMemcpyDeviceToHost,
                               cb->s_d2h));
    span_end(cb, cb->s_d2h, sp);
    cb->d2h_bytes += (double)bytes;
    CUDA_CHECK(cudaEventRecord(src_drained, cb->s_d2h));
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

/* Pinned host memory for the backend's own buffers, or a message saying
 * what it was for and how much. */
static int pinned_alloc(void **p, size_t bytes, const char *what, mt_error *err) {
    if (cudaMallocHost(p, bytes) == cudaSuccess) return 0;
    (void)cudaGetLastError();
    *p = NULL;
    return mt_errorf(err, "%s: cannot pin %.2f GB of host memory; lower --host-mem so the "
                     "planner keeps more on the GPU, or use fewer tokens per step", what,
                     bytes / 1e9);
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
    mt_cuda_default_opts(&cb->o, o);
    cb->prec = cb->o.precision == MT_GPU_BF16 ? MT_PREC_BF16 : MT_PREC_FP32;
    cb->max_M = max_M;
    cb->B = B;
    cb->T = T;
    cb->N = B * T;
    if ((size_t)(2 * t->n_layers) > sizeof cb->seq / sizeof *cb->seq) {
        free(cb);
        return mt_errorf(err, "too many layers (%d) for the CUDA backend", t->n_layers), NULL;
    }
    mt_cuda_resolve_homes(cb);
    bump b = {0};
    mt_cuda_plan(cb, &b);
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    /* A budget counts everything on the device: the context's share is
     * already gone from what is free, so compare our part with the rest. */
    size_t avail = fr;
    if (cb->o.gpu_budget) {
        size_t ours = cb->o.gpu_budget > MT_CUDA_CONTEXT_RESERVE
                          ? cb->o.gpu_budget - MT_CUDA_CONTEXT_RESERVE : 0;
        if (ours < avail) avail = ours;
    }
    if (cb->fast && cb->o.keep_layers != 0) {
        /* Keep whole layers (all micro-batches) with what memory is left,
         * less a margin for cuBLAS and the CUDA context when no budget
         * accounts for them. */
        size_t margin = cb->o.gpu_budget ? 0 : (size_t)4 << 30;
        size_t per_layer = mt_cuda_keep_unit_bytes(cb) * (size_t)max_M;
        int fit = avail > b.used + margin ? (int)((avail - b.used - margin) / per_layer) : 0;
        int want = cb->o.keep_layers < 0 ? (int)c->L : cb->o.keep_layers;
        cb->n_keep = want < fit ? want : fit;
        if (cb->n_keep > (int)c->L) cb->n_keep = (int)c->L;
        cb->kept = mt_calloc_or_die((size_t)(cb->n_keep ? cb->n_keep : 1) * max_M, sizeof *cb->kept);
        b = (bump){0};
        mt_cuda_plan(cb, &b);
    }
    cb->dev_bytes = b.used;
    if (cb->o.gpu_budget && b.used > avail) {
        mt_errorf(err, "GPU budget: the backend needs %.2f GB and the budget leaves %.2f GB "
                  "(%.2f GB less %.2f GB for the CUDA context); raise --gpu-mem or let the "
                  "planner place gradients and checkpoints on the host", b.used / 1e9,
                  avail / 1e9, cb->o.gpu_budget / 1e9, MT_CUDA_CONTEXT_RESERVE / 1e9);
        mt_cuda_homes_free(cb);
        free(cb->kept);
        free(cb);
        return NULL;
    }
    cudaError_t e = cudaMalloc((void **)&cb->dev_base, b.used);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        mt_errorf(err, "GPU memory: need %.2f GiB, %.2f GiB free; lower --batch-size or "
                  "--seq-len, or set --gpu-mem so the planner places more on the host",
                  (double)b.used / (1 << 30), (double)fr / (1 << 30));
        mt_cuda_homes_free(cb);
        free(cb->kept);
        free(cb);
        return NULL;
    }
    b = (bump){.base = cb->dev_base};
    mt_cuda_plan(cb, &b);
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
    for (int i = 0; i < 2; i++) {
        make_event(&cb->stage_drained[i], 0);
        CUDA_CHECK(cudaEventRecord(cb->stage_drained[i], cb->s_d2h));
    }
    if (cb->max_gpu_grad_numel) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_fetch, cudaStreamNonBlocking));
        for (int i = 0; i < 2; i++) {
            make_event(&cb->fetched[i], 0);
            if (pinned_alloc((void **)&cb->h_stage[i], cb->max_gpu_grad_numel * sizeof(float),
                             "gradient staging", err)) {
                mt_cuda_backend_free(&cb->base);
                return NULL;
            }
        }
    }
    cb->grads_to_store = store->g && !cb->o.host_grad_bf16;
    if (cb->host_grad_numel && !cb->grads_to_store &&
        pinned_alloc(&cb->h_grad, cb->host_grad_numel * (cb->o.host_grad_bf16 ? 2 : 4),
                     "host gradients", err)) {
        mt_cuda_backend_free(&cb->base);
        return NULL;
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
    if (cb->n_host_ckpt &&
        pinned_alloc((void **)&cb->h_ckpt,
                     (size_t)cb->n_host_ckpt * max_M * cb->N * c->C * sizeof(float),
                     "host checkpoints", err)) {
        mt_cuda_backend_free(&cb->base);
        return NULL;
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
    cudaEvent_t evs[] = {cb->stage_drained[0], cb->stage_drained[1],
                         cb->embed_slot.ready, cb->embed_slot.free, cb->gacc_drained[0],
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
    if (cb->h_grad) cudaFreeHost(cb->h_grad);
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
    cudaFree(cb->pos);
    free(cb->h_order);
    free(cb->h_bounds);
    free(cb->emb_groups);
    free(cb->kept);
    mt_cuda_homes_free(cb);
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

mt_grad_view mt_cuda_backend_grads_begin(mt_backend *be, int layer) {
    cuda_backend *cb = (cuda_backend *)be;
    const mt_layer_desc *ld = &cb->t->layers[layer];
    if (cb->home[layer].grad_host)
        return (mt_grad_view){host_grad_at(cb, layer), cb->o.host_grad_bf16};
    float *dst = cb->h_stage[layer % 2];
    /* ev_end (the step's last compute) has completed before the optimizer
     * runs, so the accumulators are final. */
    CUDA_CHECK(cudaMemcpyAsync(dst, cb->gacc_all + cb->goff[layer], ld->numel * sizeof(float),
                               cudaMemcpyDeviceToHost, cb->s_fetch));
    CUDA_CHECK(cudaEventRecord(cb->fetched[layer % 2], cb->s_fetch));
    return mt_grad_f32(dst);
}

void mt_cuda_backend_grads_wait(mt_backend *be, int layer) {
    cuda_backend *cb = (cuda_backend *)be;
    if (cb->home[layer].grad_host) /* drained during the backward */
        CUDA_CHECK(cudaEventSynchronize(cb->ev_d2h_end));
    else
        CUDA_CHECK(cudaEventSynchronize(cb->fetched[layer % 2]));
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
