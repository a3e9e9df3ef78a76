/* The CUDA streaming backend (docs/architecture.md, "The CUDA backend").
 *
 * GPU memory, all taken at creation from one allocation:
 *   slots[K]   a ring of weight slots, each one layer: fp32 (as copied from
 *              the host store) and, in bf16 mode, its bf16 cast
 *   gradients  per layer (mt_layer_home), where they wait for the
 *              optimizer: host-waiting layers accumulate in gacc[2] by
 *              turns and drain to the host once per step (fp32, or rounded
 *              to bf16 on the GPU first); GPU-waiting layers each keep an
 *              fp32 accumulator in gacc_all that the optimizer fetches
 *   saved      per layer: its saved input (M, N, C) fp32, which its
 *              backward recomputes it from: on the GPU, or in pinned host
 *              memory or on disk (saved_disk.h) visiting visit[2], or
 *              rebuilt in the backward from the previous layer's
 *              (visiting visit[2] in the forward)
 *   dx         (M, N, C) fp32 residual-stream gradient, per micro-batch
 *   acts/grads one layer's activations and gradients for one micro-batch,
 *              and kept forward activations of the last layers
 * Streams: h2d copies weights into slots ahead of use (the bind order of a
 * step is known in advance), compute runs the layers, d2h drains each
 * layer's gradient once per step. Only events order them.
 * The memory plan is in backend_cuda_plan.c, the layer templates in
 * layers_cuda.c, the saved inputs' traffic in backend_cuda_saved.c, creation
 * and the accessors in backend_cuda_create.c, the timeline in
 * backend_cuda_trace.c. */
#include "backend/cuda/backend_cuda.h"

#include <cuda_runtime_api.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/layers_cuda.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/nccl.h"
#include "backend/cuda/saved_disk.h"
#include "host/disk_state.h"
#include "kernels/cuda_common.h"
#include "kernels/optim/optim_kernels.h"

/* ---- weights ---- */

/* Whether the optimizer has written layer's weights (the weight gate's
 * contract: with wait, after blocking until it has). */
static int written(cuda_backend *cb, int layer, int wait) {
    return !cb->gate || cb->gate(cb->gate_ctx, layer, wait);
}

/* A layer whose fp32 weights are on disk (host/disk_state.h; bf16 on one
 * GPU): its bf16 copy straight into the slot's w16 (half the bytes),
 * widened into w32, whose tensors the GPU reads in fp32 then get their
 * exact values from the store. The same bits as the cast of the fp32
 * weights: the copy is their round to nearest even. */
static void upload_bf16_copy(cuda_backend *cb, slot *s, int layer) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    CUDA_CHECK(cudaMemcpyAsync(s->w16, cb->store->w16 + ld->offset, ld->numel * sizeof(uint16_t),
                               cudaMemcpyHostToDevice, cb->s_h2d));
    mt_cuda_cast_bf16_to_f32(cb->ctx_h2d, s->w32, s->w16, ld->numel);
    double bytes = (double)ld->numel * sizeof(uint16_t);
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_tensor_desc *td = &ld->tensors[k];
        if (!mt_tensor_read_fp32(td)) continue;
        CUDA_CHECK(cudaMemcpyAsync(s->w32 + td->offset, cb->store->w + ld->offset + td->offset,
                                   td->numel * sizeof(float), cudaMemcpyHostToDevice, cb->s_h2d));
        bytes += (double)td->numel * sizeof(float);
    }
    cb->h2d_bytes += bytes;
}

/* Copies layer `layer` into slot s on the h2d stream (after the slot's
 * last use), casting to bf16 there too. A rank of several copies its part
 * (or, for a device layer, takes it from the GPU after its update) and
 * all-gathers the others' on the collectives stream, which casts. */
static void upload(cuda_backend *cb, slot *s, int layer) {
    layer_part p = part_of(cb, layer);
    size_t n = cb->t->layers[layer].numel;
    int dev = layer < cb->n_dev;
    written(cb, layer, 1);
    s->layer = layer;
    if (!dev) {
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, s->free, 0));
        int sp = mt_cuda_span_begin(cb, cb->s_h2d, MT_TRACK_H2D, "weights L%d", layer);
        if (mt_disk_state_weights_on_disk(cb->store->disk, layer)) {
            upload_bf16_copy(cb, s, layer);
            mt_cuda_span_end(cb, cb->s_h2d, sp);
            CUDA_CHECK(cudaEventRecord(s->ready, cb->s_h2d));
            return;
        }
        if (p.len)
            CUDA_CHECK(cudaMemcpyAsync(s->w32 + p.begin, store_at(cb, cb->store->w, layer),
                                       p.len * sizeof(float), cudaMemcpyHostToDevice, cb->s_h2d));
        cb->h2d_bytes += (double)p.len * sizeof(float);
        if (cb->ranks <= 1 && cb->prec == MT_PREC_BF16)
            mt_cuda_cast_f32_to_bf16(cb->ctx_h2d, s->w16, s->w32, n);
        mt_cuda_span_end(cb, cb->s_h2d, sp);
        CUDA_CHECK(cudaEventRecord(cb->ranks <= 1 ? s->ready : cb->ev_part_up, cb->s_h2d));
        if (cb->ranks <= 1) return;
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comm, cb->ev_part_up, 0));
    } else { /* its part is on the GPU, updated on the compute stream */
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comm, s->free, 0));
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comm, cb->dev_slot[layer].ready, 0));
    }
    cb->coll_bytes += (double)p.chunk * (cb->ranks - 1) * sizeof(float);
    int sp = mt_cuda_span_begin(cb, cb->s_comm, MT_TRACK_COLLECTIVES, "all-gather L%d", layer);
    if (dev)
        mt_nccl_all_gather_from(cb->comm, cb->dev_w + cb->dev_off[layer], s->w32, p.chunk,
                                cb->s_comm);
    else
        mt_nccl_all_gather(cb->comm, s->w32, p.chunk, cb->s_comm);
    if (cb->prec == MT_PREC_BF16) mt_cuda_cast_f32_to_bf16(cb->ctx_comm, s->w16, s->w32, n);
    mt_cuda_span_end(cb, cb->s_comm, sp);
    CUDA_CHECK(cudaEventRecord(s->ready, cb->s_comm));
}

static int uses_embed_slot(const cuda_backend *cb, int layer) {
    return cb->cfg->tie_embeddings && layer == 0;
}


/* Assigns a slot to bind j and starts its copy unless the layer is already
 * resident. Returns 0 if no slot is free yet (too far ahead), or, unless
 * wait, if the optimizer has not written the layer yet. */
static int issue(cuda_backend *cb, int j, int wait) {
    int layer = cb->seq[j];
    if (bound_in_place(cb, layer)) { /* updated in place on the GPU: nothing to copy */
        if (!written(cb, layer, wait)) return 0;
        cb->slot_of[j] = &cb->dev_slot[layer];
        return 1;
    }
    if (uses_embed_slot(cb, layer)) {
        if (cb->embed_slot.layer != 0) {
            if (!wait && !written(cb, 0, 0)) return 0;
            upload(cb, &cb->embed_slot, 0);
        }
        cb->slot_of[j] = &cb->embed_slot;
        return 1;
    }
    int victim = -1;
    for (int k = 0; k < cb->o.slots; k++) {
        slot *s = &cb->slots[k];
        if (s->layer == layer) {
            s->last_use = j;
            cb->slot_of[j] = s;
            return 1;
        }
        /* free: every bind assigned to it has been called already */
        if (s->last_use < cb->cur && (victim < 0 || s->last_use < cb->slots[victim].last_use))
            victim = k;
    }
    if (victim < 0 || (!wait && !written(cb, layer, 0))) return 0;
    upload(cb, &cb->slots[victim], layer);
    cb->slots[victim].last_use = j;
    cb->slot_of[j] = &cb->slots[victim];
    return 1;
}

static void release_bound(cuda_backend *cb) {
    if (!cb->bound) return;
    mt_cuda_span_end(cb, cb->s_comp, cb->span_open);
    cb->span_open = -1;
    CUDA_CHECK(cudaEventRecord(cb->bound->free, cb->s_comp));
    cb->bound = NULL;
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
                                       &cb->emb_groups[mb], batch->tokens + mb * N, N, c->V,
                                       mt_config_padding_idx(c), err))
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
    mt_cuda_upload_pos(cb, batch);
    CUDA_CHECK(cudaMemcpyAsync(cb->emb_order, cb->h_order, total * 4, cudaMemcpyHostToDevice,
                               cb->s_comp));
    CUDA_CHECK(cudaMemcpyAsync(cb->emb_bounds, cb->h_bounds, (size_t)batch->M * (N + 1) * 4,
                               cudaMemcpyHostToDevice, cb->s_comp));
    CUDA_CHECK(cudaMemsetAsync(cb->loss_dev, 0, sizeof(double), cb->s_comp));
    if (cb->moe) mt_cuda_moe_begin_step(cb->moe, cb->ctx, train);
    if (train && c->tie_embeddings && cb->home[0].grad_host) {
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->embed_drained, 0));
        CUDA_CHECK(cudaMemsetAsync(cb->gacc_embed, 0, layer_extent(cb, 0) * sizeof(float),
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
    cb->bound = NULL;
    cb->h2d_bytes = cb->d2h_bytes = cb->coll_bytes = 0;
    cb->n_tspans = 0;
    cb->span_open = -1;
    /* Weights changed since the last step: nothing resident is valid. */
    for (int k = 0; k < cb->o.slots; k++) {
        cb->slots[k].layer = -1;
        cb->slots[k].last_use = -1;
    }
    cb->embed_slot.layer = -1;
    cb->visit_holds[0] = cb->visit_holds[1] = -1;
    if (cb->sdisk) mt_saved_disk_begin_step(cb->sdisk);
    return 0;
}

static void cu_bind_layer(mt_backend *be, int layer, int backward) {
    cuda_backend *cb = (cuda_backend *)be;
    MT_ASSERT(cb->cur < cb->seq_len && cb->seq[cb->cur] == layer);
    release_bound(cb);
    if (mt_cuda_saved_moving(cb)) mt_cuda_saved_traffic(cb, layer, backward);
    if (layer == cb->t->n_layers - 1) CUDA_CHECK(cudaEventRecord(cb->ev_fwd_end, cb->s_comp));
    /* Keep K-1 layers in flight ahead of the one in use. */
    int ahead = cb->cur + cb->o.slots - 1;
    while (cb->issued <= ahead && cb->issued < cb->seq_len &&
           issue(cb, cb->issued, cb->issued == cb->cur))
        cb->issued++;
    MT_ASSERT(cb->issued > cb->cur);
    cb->bound = cb->slot_of[cb->cur];
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->bound->ready, 0));
    cb->span_open = mt_cuda_span_begin(cb, cb->s_comp, MT_TRACK_COMPUTE,
                               layer == cb->t->n_layers - 1 ? "head (L%d)"
                               : backward                     ? "bwd L%d"
                                                              : "fwd L%d",
                               layer);
    cb->cur++;
    if (!backward) return;
    /* A GPU-waiting tied embedding is cleared with the head, its first
     * contributor (a host-waiting one at the start of the step). */
    if (cb->cfg->tie_embeddings && layer == cb->t->n_layers - 1 && !cb->home[0].grad_host)
        CUDA_CHECK(cudaMemsetAsync(cb->gacc_embed, 0, layer_extent(cb, 0) * sizeof(float),
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
        CUDA_CHECK(cudaMemsetAsync(cb->g_cur, 0, layer_extent(cb, layer) * sizeof(float),
                                   cb->s_comp));
        return;
    }
    /* Alternate accumulators; wait until this one's last drain finished. */
    cb->gbuf ^= 1;
    cb->g_cur = cb->gacc[cb->gbuf];
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->gacc_drained[cb->gbuf], 0));
    /* the padding too: a reduce-scatter sums it */
    CUDA_CHECK(cudaMemsetAsync(cb->g_cur, 0, layer_extent(cb, layer) * sizeof(float),
                               cb->s_comp));
}

static void cu_forward(mt_backend *be, int layer, int mb) {
    cuda_backend *cb = (cuda_backend *)be;
    if (layer == 0) {
        /* The lookup reads fp32 weights: the residual stream is fp32. */
        mt_cuda_embedding_forward(cb->ctx, saved_at(cb, 1, mb), cb->tokens + (size_t)mb * cb->N,
                                  W32(cb, bound_slot(cb), 0, MT_T_EMBED), MT_DT_F32, cb->N,
                                  cb->cfg->C);
        mt_cuda_embed_scale(cb, saved_at(cb, 1, mb));
        return;
    }
    acts *k = cb->train ? mt_cuda_kept_unit(cb, layer, mb) : NULL;
    mt_cuda_block_forward(cb, k ? k : &cb->a, layer, mb, saved_at(cb, layer, mb),
                          saved_at(cb, layer + 1, mb));
    /* the load-balancing counts: this forward, not the backward's recompute */
    if (cb->t->layers[layer].n_experts) mt_cuda_moe_count(cb->moe, cb->ctx);
}

/* The output matrix and its gradient: the head's own, or layer 0's. */
static void head_matrix(cuda_backend *cb, int head, void **w, float **g) {
    if (cb->cfg->tie_embeddings) {
        *w = W_op(cb, embed_weights(cb), 0, MT_T_EMBED);
        *g = G(cb, cb->gacc_embed, 0, MT_T_EMBED);
    } else {
        *w = W_op(cb, bound_slot(cb), head, MT_T_LM_HEAD);
        *g = G(cb, cb->g_cur, head, MT_T_LM_HEAD);
    }
}

/* The head of mb: cross-entropy scaled by dscale; or with w (host, N),
 * token t's gradient scaled by w[t]; or with logp (host, N), no gradient
 * and each token's log-probability into logp. */
static void head_pass(cuda_backend *cb, int mb, const float *w, float *logp) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    int head = cb->t->n_layers - 1, grad = cb->train && !logp;
    size_t N = cb->N, C = c->C;
    slot *s = bound_slot(cb);
    const float *x = saved_at(cb, head, mb);
    const int32_t *tgt = cb->targets + (size_t)mb * N;
    if (c->tie_embeddings) CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, embed_weights(cb)->ready, 0));
    void *wl;
    float *gl;
    head_matrix(cb, head, &wl, &gl);
    if (c->layernorm) /* gpt_neox, falcon */
        mt_cuda_layernorm_forward(cb->ctx, a->xf_op, op_dt(cb), a->meanf, a->rstdf, x,
                                  W32(cb, s, head, MT_T_FINAL_NORM),
                                  W32(cb, s, head, MT_T_FINAL_NORM_B), N, C, c->rms_eps);
    else /* gemma's by 1 + w */
        mt_cuda_rmsnorm_forward(cb->ctx, a->xf_op, op_dt(cb), a->rstdf, x,
                                mt_cuda_norm_w(cb, head, MT_T_FINAL_NORM), N, C, c->rms_eps);
    float cap = (float)c->final_softcap; /* Gemma 2's logit soft-cap; 0: none */
    size_t R = mt_cuda_head_rows(cb);
    if (w) /* pageable: copied out of w before the call returns */
        CUDA_CHECK(cudaMemcpyAsync(a->row_w, w, N * sizeof(float), cudaMemcpyHostToDevice,
                                   cb->s_comp));
    if (w || logp)
        mt_cuda_lm_head_loss_weighted(cb->ctx, cb->prec, a->row_loss, grad ? a->dxf32 : NULL,
                                      false, grad ? gl : NULL, a->head_scratch, a->xf_op, wl,
                                      tgt, w ? a->row_w : NULL, N, C, c->V, R, cap);
    else
        mt_cuda_lm_head_loss(cb->ctx, cb->prec, cb->loss_dev, a->row_loss,
                             grad ? a->dxf32 : NULL, false, grad ? gl : NULL, a->head_scratch,
                             a->xf_op, wl, tgt, N, C, c->V, R, cb->dscale, cap);
    if (logp) {
        CUDA_CHECK(cudaMemcpyAsync(logp, a->row_loss, N * sizeof(float), cudaMemcpyDeviceToHost,
                                   cb->s_comp));
        CUDA_CHECK(cudaStreamSynchronize(cb->s_comp));
        for (size_t i = 0; i < N; i++) logp[i] = -logp[i];
    }
    if (!grad) return;
    float *dx = dx_at(cb, mb);
    CUDA_CHECK(cudaMemsetAsync(dx, 0, N * C * sizeof(float), cb->s_comp));
    if (c->layernorm)
        mt_cuda_layernorm_backward(cb->ctx, dx, G(cb, cb->g_cur, head, MT_T_FINAL_NORM),
                                   G(cb, cb->g_cur, head, MT_T_FINAL_NORM_B), a->colsum,
                                   a->dxf32, x, W32(cb, s, head, MT_T_FINAL_NORM), a->meanf,
                                   a->rstdf, N, C);
    else
        mt_cuda_rmsnorm_backward(cb->ctx, dx, G(cb, cb->g_cur, head, MT_T_FINAL_NORM),
                                 a->colsum, a->dxf32, x,
                                 mt_cuda_norm_w(cb, head, MT_T_FINAL_NORM), a->rstdf, N, C);
}

static void cu_head(mt_backend *be, int mb) { head_pass((cuda_backend *)be, mb, NULL, NULL); }

static void cu_head_logp(mt_backend *be, int mb, float *logp) {
    head_pass((cuda_backend *)be, mb, NULL, logp);
}

static void cu_head_weighted(mt_backend *be, int mb, const float *w) {
    head_pass((cuda_backend *)be, mb, w, NULL);
}

static void cu_backward(mt_backend *be, int layer, int mb) {
    cuda_backend *cb = (cuda_backend *)be;
    size_t N = cb->N;
    if (layer == 0) {
        mt_cuda_embed_scale(cb, dx_at(cb, mb)); /* through Gemma's scale; dx is spent after */
        mt_cuda_embedding_backward(cb->ctx, G(cb, cb->g_cur, 0, MT_T_EMBED), dx_at(cb, mb),
                                   cb->tokens + mb * N, cb->emb_order + mb * N,
                                   cb->emb_bounds + mb * (N + 1), cb->emb_groups[mb],
                                   cb->cfg->C);
        return;
    }
    const float *x = cb->home[layer].saved_recompute && cb->visit_holds[layer % 2] != layer
                         ? mt_cuda_recompute_input(cb, layer, mb)
                         : saved_at(cb, layer, mb);
    acts *k = mt_cuda_kept_unit(cb, layer, mb);
    if (!k) { /* recompute: the forward's activations were not kept */
        k = &cb->a;
        mt_cuda_block_forward(cb, k, layer, mb, x, NULL);
    }
    mt_cuda_block_backward(cb, k, layer, mb, x, dx_at(cb, mb));
}

/* A rank of several: sums layer l's accumulator over the ranks into this
 * rank's part (in place, on the collectives stream, after the step's
 * compute of it) and takes the part's sum of squares there. Returns the
 * part, for what follows on that stream. */
static float *reduce_part(cuda_backend *cb, int layer, layer_part p) {
    CUDA_CHECK(cudaEventRecord(cb->grad_ready, cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_comm, cb->grad_ready, 0));
    int sp = mt_cuda_span_begin(cb, cb->s_comm, MT_TRACK_COLLECTIVES, "reduce-scatter L%d", layer);
    mt_nccl_reduce_scatter(cb->comm, cb->g_cur, p.chunk, cb->s_comm);
    cb->coll_bytes += (double)p.chunk * (cb->ranks - 1) * sizeof(float);
    mt_cuda_span_end(cb, cb->s_comm, sp);
    float *part = cb->g_cur + p.begin;
    mt_cuda_sumsq(cb->s_comm, cb->sumsq_dev + layer, cb->sumsq_scratch, part, p.len);
    return part;
}

static void cu_layer_grads_done(mt_backend *be, int layer) {
    cuda_backend *cb = (cuda_backend *)be;
    layer_part p = part_of(cb, layer);
    int several = cb->ranks > 1;
    /* the stream the gradient is final on: compute, or after the ranks' sum */
    cudaStream_t s = several ? cb->s_comm : cb->s_comp;
    mt_cuda_ctx *ctx = several ? cb->ctx_comm : cb->ctx;
    /* With tied embeddings the head's matrix gradient lives in layer 0's
     * accumulator, which drains when layer 0 is done. The norm is taken
     * from the fp32 accumulation, before any rounding. */
    const float *g = cb->g_cur;
    if (several)
        g = reduce_part(cb, layer, p);
    else
        mt_cuda_sumsq(s, cb->sumsq_dev + layer, cb->sumsq_scratch, g, p.len);
    if (!cb->home[layer].grad_host) return; /* the optimizer fetches it */
    cudaEvent_t acc_drained = uses_embed_slot(cb, layer) ? cb->embed_drained
                                                         : cb->gacc_drained[cb->gbuf];
    const void *src = g;
    size_t bytes = p.len * sizeof(float);
    cudaEvent_t src_drained = acc_drained;
    if (cb->o.host_grad_bf16) {
        /* Round on the GPU into a stage buffer; the accumulator is free
         * once the cast ran, the stage once its copy ran. */
        int b = cb->sbuf ^= 1;
        CUDA_CHECK(cudaStreamWaitEvent(s, cb->stage_drained[b], 0));
        mt_cuda_cast_f32_to_bf16(ctx, cb->g16_stage[b], g, p.len);
        CUDA_CHECK(cudaEventRecord(acc_drained, s));
        src = cb->g16_stage[b];
        bytes = p.len * 2;
        src_drained = cb->stage_drained[b];
    }
    CUDA_CHECK(cudaEventRecord(cb->grad_ready, s));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_d2h, cb->grad_ready, 0));
    int sp = mt_cuda_span_begin(cb, cb->s_d2h, MT_TRACK_D2H, "grads L%d", layer);
    if (bytes)
        CUDA_CHECK(cudaMemcpyAsync(host_grad_at(cb, layer), src, bytes, cudaMemcpyDeviceToHost,
                                   cb->s_d2h));
    mt_cuda_span_end(cb, cb->s_d2h, sp);
    cb->d2h_bytes += (double)bytes;
    CUDA_CHECK(cudaEventRecord(src_drained, cb->s_d2h));
}

/* The device layers' updates that ran before this step's work (the
 * optimizer thread enqueued them; their events are complete by now). */
static void trace_device_updates(cuda_backend *cb) {
    for (int l = 0; l < cb->n_dev; l++) {
        if (!cb->dev_timed[l]) continue;
        float a = 0, b = 0;
        CUDA_CHECK(cudaEventElapsedTime(&a, cb->ev_base, cb->dev_t0[l]));
        CUDA_CHECK(cudaEventElapsedTime(&b, cb->ev_base, cb->dev_slot[l].ready));
        char name[32];
        snprintf(name, sizeof name, "adamw L%d", l);
        mt_trace_add(cb->trace, MT_TRACK_COMPUTE, name, cb->trace_base_us + a * 1e3,
                     (b - a) * 1e3);
        cb->dev_timed[l] = 0;
    }
}

static double cu_end_step(mt_backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    release_bound(cb);
    /* loss / valid targets = cross-entropy + coef * aux, as on the CPU */
    if (cb->moe && cb->train)
        mt_cuda_moe_add_aux_loss(cb->moe, cb->ctx, cb->loss_dev, 1.0 / cb->dscale);
    CUDA_CHECK(cudaMemcpyAsync(cb->h_loss, cb->loss_dev, sizeof(double), cudaMemcpyDeviceToHost,
                               cb->s_comp));
    if (cb->train && cb->ranks > 1) { /* the norms were taken after the ranks' sums */
        CUDA_CHECK(cudaEventRecord(cb->ev_comm_end, cb->s_comm));
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->ev_comm_end, 0));
    }
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
                                     .h2d_bytes = cb->h2d_bytes, .d2h_bytes = cb->d2h_bytes,
                                     .coll_bytes = cb->coll_bytes};
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
        trace_device_updates(cb);
    }
    return *cb->h_loss;
}

/* A disk-saved input that could not be written or read: the step's loss
 * and gradients are not valid (the run stops, its last checkpoint intact). */
static int cu_step_error(mt_backend *be, mt_error *err) {
    return mt_saved_disk_error(((cuda_backend *)be)->sdisk, err);
}

static const mt_backend_ops cuda_ops = {
    .begin_step = cu_begin_step,
    .bind_layer = cu_bind_layer,
    .forward = cu_forward,
    .head = cu_head,
    .backward = cu_backward,
    .layer_grads_done = cu_layer_grads_done,
    .end_step = cu_end_step,
    .step_error = cu_step_error,
    .layer_sumsq = mt_cuda_backend_layer_sumsq,
    .wait_grads = mt_cuda_backend_wait_grads,
    .grad_source = mt_cuda_backend_grad_source,
    .set_weight_gate = mt_cuda_backend_set_weight_gate,
    .stats = mt_cuda_backend_stats,
    .set_trace = mt_cuda_backend_set_trace,
    .head_logp = cu_head_logp,
    .head_weighted = cu_head_weighted,
    .logits = mt_cuda_backend_logits,
    .destroy = mt_cuda_backend_free,
};

mt_backend *mt_cuda_backend_create(const mt_config *c, const mt_param_table *t,
                                   mt_host_store *store, int max_M, int64_t B, int64_t T,
                                   const mt_cuda_backend_opts *o, mt_error *err) {
    if (mt_arch_cpu_only(c->arch))
        return mt_errorf(err, "model_type \"%s\" is not supported on the GPU yet; train it "
                         "on the CPU with --device cpu", c->model_type), NULL;
    return mt_cuda_backend_make(c, t, store, max_M, B, T, o, &cuda_ops, err);
}
