/* Checkpoints that visit the GPU (host and rebuilt ones) in the CUDA
 * streaming backend: saves, loads and rebuilds, ordered by events. */
#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/layers_cuda.h"
#include "kernels/cuda_common.h"
#include "kernels/optim/optim_kernels.h"

/* Host checkpoints: checkpoint l lives in dck[l % 2] on the GPU while
 * layers l-1 (writing it) and l (reading it) run, and in h_ckpt otherwise.
 * Forward saves each host checkpoint as the layer that reads it starts;
 * backward loads layer l-1's input while layer l computes, unless dck still
 * holds it. Events order the buffer reuse. Recomputed checkpoints visit
 * dck the same way and are never saved: the backward of their layer
 * rebuilds them from checkpoint l-1 (mt_cuda_recompute_input) unless dck still
 * holds them. */
static void save_checkpoint(cuda_backend *cb, int layer) {
    int b = layer % 2;
    size_t per = (size_t)cb->batch->M * cb->N * cb->cfg->C;
    float *host = cb->h_ckpt + (size_t)cb->ck_idx[layer] * cb->max_M * cb->N * cb->cfg->C;
    CUDA_CHECK(cudaEventRecord(cb->dck_written[b], cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_d2h, cb->dck_written[b], 0));
    int sp = mt_cuda_span_begin(cb, cb->s_d2h, MT_TRACK_D2H, "save ckpt %d", layer);
    CUDA_CHECK(cudaMemcpyAsync(host, cb->dck[b], per * sizeof(float), cudaMemcpyDeviceToHost,
                               cb->s_d2h));
    mt_cuda_span_end(cb, cb->s_d2h, sp);
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
    int sp = mt_cuda_span_begin(cb, cb->s_h2d, MT_TRACK_H2D, "load ckpt %d", layer);
    CUDA_CHECK(cudaMemcpyAsync(cb->dck[b], src, per * sizeof(float), cudaMemcpyHostToDevice,
                               cb->s_h2d));
    mt_cuda_span_end(cb, cb->s_h2d, sp);
    CUDA_CHECK(cudaEventRecord(cb->dck_loaded[b], cb->s_h2d));
    cb->h2d_bytes += (double)per * sizeof(float);
    cb->dck_holds[b] = layer;
}

void mt_cuda_checkpoint_traffic(cuda_backend *cb, int layer, int backward) {
    const mt_layer_home *h = cb->home;
    int head = cb->t->n_layers - 1;
    if (!backward || layer == head) {
        if (layer >= 1 && h[layer].ckpt_host) save_checkpoint(cb, layer);
        /* this layer writes checkpoint layer+1: a visiting one overwrites
         * the other buffer, whose old content must be saved */
        if (layer < head && ckpt_visits(cb, layer + 1)) {
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
    /* a recomputed input is rebuilt from it now */
    if (h[layer].ckpt_recompute && cb->dck_holds[layer % 2] != layer && layer >= 2 &&
        h[layer - 1].ckpt_host)
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->dck_loaded[(layer - 1) % 2], 0));
}

/* Layer `layer`'s input for micro-batch mb, rebuilt from checkpoint
 * layer-1 with layer-1's weights: the next bind's slot, already issued
 * (slots >= 2). The same kernels on the same input give the forward's
 * values bit for bit. */
const float *mt_cuda_recompute_input(cuda_backend *cb, int layer, int mb) {
    int prev = layer - 1, j = cb->cur; /* cur is one past the bound bind */
    MT_ASSERT(j < cb->seq_len && cb->seq[j] == prev && cb->issued > j);
    slot *ps = cb->slot_of[j];
    if (mb == 0) CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, ps->ready, 0));
    if (prev == 0) {
        mt_cuda_embedding_forward(cb->ctx, cb->xin, cb->tokens + (size_t)mb * cb->N,
                                  W32(cb, ps, 0, MT_T_EMBED), MT_DT_F32, cb->N, cb->cfg->C);
        return cb->xin;
    }
    slot *bound = cb->bound;
    cb->bound = ps;
    mt_cuda_block_forward(cb, &cb->a, prev, mb, ckpt_at(cb, prev, mb), cb->xin);
    cb->bound = bound;
    return cb->xin;
}
