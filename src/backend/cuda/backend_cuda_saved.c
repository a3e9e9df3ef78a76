/* Saved layer inputs that visit the GPU (host-, disk-saved and rebuilt ones) in
 * the CUDA streaming backend: saves, loads and rebuilds, ordered by events.
 * (A layer's saved input is what its backward recomputes it from; resume
 * checkpoints are io/checkpoint.h's.) */
#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/layers_cuda.h"
#include "backend/cuda/saved_disk.h"
#include "kernels/cuda_common.h"
#include "kernels/optim/optim_kernels.h"

/* Saved input `layer` in host RAM: its values' bytes (4, or 2 in bf16). */
static size_t host_saved_es(const cuda_backend *cb) { return cb->o.host_saved_bf16 ? 2 : 4; }
static char *host_saved_at(const cuda_backend *cb, int layer) {
    size_t values = (size_t)cb->max_M * cb->N * cb->cfg->C;
    return (char *)cb->h_saved + (size_t)cb->saved_idx[layer] * values * host_saved_es(cb);
}

/* Moves saved input `layer` (this step's micro-batches) between visit[layer
 * % 2] and host (h_saved's place, or a disk stage) on the copy stream of
 * its direction, as a trace span: fp32, or bf16 through the saved16 chunk
 * of that direction, each chunk's conversion and copy in stream order on
 * that stream. */
static void move_saved(cuda_backend *cb, int layer, int down, char *host) {
    cudaStream_t st = down ? cb->s_d2h : cb->s_h2d;
    size_t n = (size_t)cb->batch->M * cb->N * cb->cfg->C;
    float *dev = cb->visit[layer % 2];
    int sp = mt_cuda_span_begin(cb, st, down ? MT_TRACK_D2H : MT_TRACK_H2D,
                                down ? "save input %d" : "load input %d", layer);
    if (!cb->o.host_saved_bf16) {
        CUDA_CHECK(cudaMemcpyAsync(down ? (void *)host : (void *)dev, down ? (void *)dev : host,
                                   n * sizeof(float),
                                   down ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, st));
    } else {
        uint16_t *chunk = cb->saved16[down ? 0 : 1];
        for (size_t at = 0, k = mt_cuda_saved_chunk(cb); at < n; at += k) {
            size_t m = n - at < k ? n - at : k;
            if (down) {
                mt_cuda_cast_f32_to_bf16_on(st, chunk, dev + at, m);
                CUDA_CHECK(cudaMemcpyAsync(host + at * 2, chunk, m * 2, cudaMemcpyDeviceToHost,
                                           st));
            } else {
                CUDA_CHECK(cudaMemcpyAsync(chunk, host + at * 2, m * 2, cudaMemcpyHostToDevice,
                                           st));
                mt_cuda_cast_bf16_to_f32_on(st, dev + at, chunk, m);
            }
        }
    }
    mt_cuda_span_end(cb, st, sp);
    *(down ? &cb->d2h_bytes : &cb->h2d_bytes) += (double)n * host_saved_es(cb);
}

/* Moved saved inputs (host and disk ones): saved input l lives in visit[l
 * % 2] on the GPU while layers l-1 (writing it) and l (reading it) run, and
 * in h_saved or on disk otherwise. Forward saves each one as the layer
 * that reads it starts; backward loads layer l-1's input while layer l
 * computes, unless visit still holds it. Events order the buffer reuse.
 * A disk one goes through a stage of sdisk: saved down into it, then
 * written by the disk thread; read back into one ahead of the backward
 * (saved_disk.h), then loaded from it. Recomputed saved inputs visit the
 * same way and are never saved: the backward of their layer rebuilds them
 * from saved input l-1 (mt_cuda_recompute_input) unless visit still holds
 * them. */
static void save_input(cuda_backend *cb, int layer) {
    int b = layer % 2, disk = cb->home[layer].saved_disk;
    if (disk && !cb->train) return; /* an evaluation has no backward to read it */
    CUDA_CHECK(cudaEventRecord(cb->visit_written[b], cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_d2h, cb->visit_written[b], 0));
    char *host = disk ? mt_saved_disk_take_for_write(cb->sdisk, layer, cb->s_d2h)
                      : host_saved_at(cb, layer);
    move_saved(cb, layer, 1, host);
    if (disk) mt_saved_disk_write(cb->sdisk, layer, cb->s_d2h);
    CUDA_CHECK(cudaEventRecord(cb->visit_saved[b], cb->s_d2h));
}

/* Starts reading the disk-saved inputs below `layer` that the backward
 * needs next (in its order, down to layer 1) into the stages free now;
 * not those visit still holds (the last block's and the head's input),
 * which the backward never loads. */
static void read_ahead(cuda_backend *cb, int layer) {
    for (int l = layer - 1; l >= 1; l--)
        if (cb->home[l].saved_disk && cb->visit_holds[l % 2] != l &&
            !mt_saved_disk_read(cb->sdisk, l))
            return;
}

static void load_input(cuda_backend *cb, int layer) {
    int b = layer % 2, disk = cb->home[layer].saved_disk;
    CUDA_CHECK(cudaEventRecord(cb->visit_free[b], cb->s_comp));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, cb->visit_free[b], 0));
    CUDA_CHECK(cudaStreamWaitEvent(cb->s_h2d, cb->visit_saved[b], 0));
    /* a disk one: the host blocks here until its read is in (see saved_disk.h) */
    char *host = disk ? (char *)mt_saved_disk_wait_read(cb->sdisk, layer)
                      : host_saved_at(cb, layer);
    move_saved(cb, layer, 0, host);
    if (disk) {
        mt_saved_disk_loaded(cb->sdisk, layer, cb->s_h2d);
        read_ahead(cb, layer);
    }
    CUDA_CHECK(cudaEventRecord(cb->visit_loaded[b], cb->s_h2d));
    cb->visit_holds[b] = layer;
}

void mt_cuda_saved_traffic(cuda_backend *cb, int layer, int backward) {
    int head = cb->t->n_layers - 1;
    if (!backward || layer == head) {
        if (layer >= 1 && saved_moves(cb, layer)) save_input(cb, layer);
        /* this layer writes saved input layer+1: a visiting one overwrites
         * the other buffer, whose old content must be saved */
        if (layer < head && saved_visits(cb, layer + 1)) {
            CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->visit_saved[(layer + 1) % 2], 0));
            cb->visit_holds[(layer + 1) % 2] = layer + 1;
        }
        /* the backward starts: its first disk reads, behind the forward's writes */
        if (backward && cb->sdisk) read_ahead(cb, head);
        return;
    }
    if (layer >= 1 && saved_moves(cb, layer)) {
        if (cb->visit_holds[layer % 2] != layer) load_input(cb, layer); /* not prefetched */
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->visit_loaded[layer % 2], 0));
    }
    /* prefetch the next moved saved input the backward reads (layer-1's) */
    if (layer >= 2 && saved_moves(cb, layer - 1) && cb->visit_holds[(layer - 1) % 2] != layer - 1)
        load_input(cb, layer - 1);
    /* a recomputed input is rebuilt from it now */
    if (cb->home[layer].saved_recompute && cb->visit_holds[layer % 2] != layer && layer >= 2 &&
        saved_moves(cb, layer - 1))
        CUDA_CHECK(cudaStreamWaitEvent(cb->s_comp, cb->visit_loaded[(layer - 1) % 2], 0));
}

/* Layer `layer`'s input for micro-batch mb, rebuilt from saved input
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
        mt_cuda_embed_scale(cb, cb->xin);
        return cb->xin;
    }
    slot *bound = cb->bound;
    cb->bound = ps;
    mt_cuda_block_forward(cb, &cb->a, prev, mb, saved_at(cb, prev, mb), cb->xin);
    cb->bound = bound;
    return cb->xin;
}
