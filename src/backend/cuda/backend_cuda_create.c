/* The CUDA streaming backend's creation (one device allocation carved by
 * the memory plan, pinned host buffers, streams and events), its release,
 * and the accessors of backend_cuda.h. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"

#include "backend/cpu/ops.h"
#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/nccl.h"
#include "backend/cuda/saved_disk.h"
#include "host/disk_state.h"
#include "kernels/cuda_common.h"
#include "kernels/optim/optim_kernels.h"
#include "model/rope.h"
#include "util/mem.h"

static int pin(void *p, size_t bytes, mt_error *err) {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e != cudaSuccess)
        return mt_errorf(err, "pinning %.2f GiB of host memory failed: %s; lower the memory "
                         "lock limit (ulimit -l) or use a smaller model",
                         (double)bytes / (1 << 30), cudaGetErrorString(e));
    return 0;
}

/* Registers [p, p + bytes) (on), or unregisters it. */
static int pin_range(void *p, size_t bytes, int on, mt_error *err) {
    if (on) return pin(p, bytes, err);
    cudaHostUnregister(p);
    return 0;
}

/* A layer whose fp32 weights are on disk: its bf16 copy, and the pages of
 * its range of w that hold the tensors the GPU reads in fp32 (the rest of
 * the range takes no RAM), a registration for each run of adjacent pages
 * (layers start on a page: no run crosses into another layer's). */
static int pin_copy(cuda_backend *cb, int l, int on, mt_error *err) {
    const size_t page = 4096;
    const mt_layer_desc *ld = &cb->store->table->layers[l];
    if (pin_range(cb->store->w16 + ld->offset, ld->numel * sizeof(uint16_t), on, err)) return -1;
    char *base = (char *)(cb->store->w + ld->offset);
    size_t a = 0, b = 0; /* the run of pages open, [a, b) bytes into the layer; a == b: none */
    for (int k = 0; k <= ld->n_tensors; k++) {
        const mt_tensor_desc *td = k < ld->n_tensors ? &ld->tensors[k] : NULL;
        int exact = td && mt_tensor_read_fp32(td);
        size_t s = exact ? td->offset * sizeof(float) / page * page : 0;
        size_t e = exact ? mt_round_up((td->offset + td->numel) * sizeof(float), page) : 0;
        if (exact && a < b && s <= b) { /* joins the open run */
            b = e > b ? e : b;
            continue;
        }
        if ((exact || !td) && a < b && pin_range(base + a, b - a, on, err)) return -1;
        if (exact) a = s, b = e;
    }
    return 0;
}

/* Pins the weight and gradient arrays (and the device layers' moments)
 * layer by layer: every copy stays inside one registration, and each
 * registration is one layer's range (of a layer whose weights are on
 * disk, its bf16 copy's and its exact tensors': pin_copy). */
static int pin_store(cuda_backend *cb, int on, mt_error *err) {
    const mt_param_table *t = cb->store->table; /* a rank of several: its parts */
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        int dev = l < cb->n_dev; /* the flush copies their moments too */
        int away = mt_disk_state_weights_on_disk(cb->store->disk, l);
        MT_ASSERT(!away || (!dev && cb->ranks <= 1 && cb->prec == MT_PREC_BF16));
        if (away && pin_copy(cb, l, on, err)) return -1;
        float *arrays[] = {away ? NULL : cb->store->w + ld->offset,
                           cb->store->g ? cb->store->g + ld->offset : NULL,
                           dev ? cb->store->m + ld->offset : NULL,
                           dev ? cb->store->v + ld->offset : NULL};
        for (int i = 0; i < 4; i++) {
            if (!arrays[i] || !ld->numel) continue;
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

/* The device layers' weights and moments between the store (this rank's
 * parts, on a rank of several) and the GPU (kind: which way), on the
 * compute stream, a copy per pinned range (a layer). */
static void copy_device_layers(cuda_backend *cb, enum cudaMemcpyKind kind) {
    float *host[] = {cb->store->w, cb->store->m, cb->store->v};
    float *dev[] = {cb->dev_w, cb->dev_m, cb->dev_v};
    int up = kind == cudaMemcpyHostToDevice;
    for (int i = 0; i < 3; i++)
        for (int l = 0; l < cb->n_dev; l++) {
            float *h = store_at(cb, host[i], l), *d = dev[i] + cb->dev_off[l];
            size_t bytes = cb->store->table->layers[l].numel * sizeof(float);
            if (bytes)
                CUDA_CHECK(cudaMemcpyAsync(up ? (void *)d : (void *)h, up ? (void *)h : (void *)d,
                                           bytes, kind, cb->s_comp));
        }
    CUDA_CHECK(cudaStreamSynchronize(cb->s_comp));
}

/* The device layers' weights and moments, from the store, and their events. */
static void load_device_layers(cuda_backend *cb) {
    if (!cb->n_dev) return;
    /* a rank's chunks past its part are all-gathered too: zeros, not garbage */
    float *arrays[] = {cb->dev_w, cb->dev_m, cb->dev_v};
    for (int i = 0; i < 3 && cb->ranks > 1; i++)
        CUDA_CHECK(cudaMemsetAsync(arrays[i], 0, cb->dev_numel * sizeof(float), cb->s_comp));
    copy_device_layers(cb, cudaMemcpyHostToDevice);
    if (cb->dev_w16) mt_cuda_cast_f32_to_bf16(cb->ctx, cb->dev_w16, cb->dev_w, cb->dev_numel);
    cb->dev_t0 = mt_calloc_or_die((size_t)cb->n_dev, sizeof *cb->dev_t0);
    cb->dev_timed = mt_calloc_or_die((size_t)cb->n_dev, sizeof *cb->dev_timed);
    for (int l = 0; l < cb->n_dev; l++) {
        make_event(&cb->dev_slot[l].ready, 1); /* timed: an update's end on the timeline */
        make_event(&cb->dev_slot[l].free, 0);
        make_event(&cb->dev_t0[l], 1);
        CUDA_CHECK(cudaEventRecord(cb->dev_slot[l].ready, cb->s_comp));
    }
}

/* Options the backend cannot take: too many layers, bf16 saved inputs of
 * an fp32 run; a rank of several needs its communicator, and a store of
 * its parts. */
static int check_options(const cuda_backend *cb, mt_error *err) {
    const mt_param_table *st = cb->store->table;
    if ((size_t)(2 * cb->t->n_layers) > sizeof cb->seq / sizeof *cb->seq)
        return mt_errorf(err, "too many layers (%d) for the CUDA backend", cb->t->n_layers);
    if (cb->o.host_saved_bf16 && cb->prec != MT_PREC_BF16)
        return mt_errorf(err, "bf16 saved inputs (--saved-input-dtype bf16) are for bf16 runs; "
                         "use --precision bf16, or fp32 saved inputs");
    if (cb->ranks <= 1) {
        if (st->total != cb->t->total)
            return mt_errorf(err, "the host store holds %zu floats, the model %zu: a store of one "
                             "rank's parts needs ranks > 1", st->total, cb->t->total);
        return 0;
    }
    if (!cb->comm || mt_nccl_world(cb->comm) != cb->ranks || mt_nccl_rank(cb->comm) != cb->rank)
        return mt_errorf(err, "rank %d of %d: the backend needs that rank's communicator",
                         cb->rank, cb->ranks);
    for (int l = 0; l < cb->t->n_layers; l++)
        if (st->n_layers != cb->t->n_layers || st->layers[l].numel != part_of(cb, l).len)
            return mt_errorf(err, "rank %d of %d: the host store is not this rank's parts of "
                             "the model (layer %d)", cb->rank, cb->ranks, l);
    return 0;
}

/* Lays the device memory out, keeps as many whole layers' activations as
 * the memory left allows (not for MoE blocks, whose backward recomputes),
 * checks the budget and allocates; the layout is then bound by the caller. */
static int place_on_device(cuda_backend *cb, bump *out, mt_error *err) {
    const mt_config *c = cb->cfg;
    int max_M = cb->max_M;
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
    /* MoE blocks keep no activations: their backward always recomputes. */
    if (cb->keeps && cb->o.keep_layers != 0 && !mt_config_is_moe(c)) {
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
        return -1;
    }
    cudaError_t e = cudaMalloc((void **)&cb->dev_base, b.used);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        mt_errorf(err, "GPU memory: need %.2f GiB, %.2f GiB free; lower --batch-size or "
                  "--seq-len, or set --gpu-mem so the planner places more on the host",
                  (double)b.used / (1 << 30), (double)fr / (1 << 30));
        return -1;
    }
    *out = b;
    return 0;
}

/* The streams, their cuBLAS contexts, the events that order them and the
 * pinned host buffers of what the layout places on the host. */
static int create_streams(cuda_backend *cb, mt_error *err) {
    const mt_config *c = cb->cfg;
    int max_M = cb->max_M;
    mt_host_store *store = cb->store;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_h2d, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_comp, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_d2h, cudaStreamNonBlocking));
    if (mt_cuda_ctx_create(&cb->ctx, cb->s_comp, 0, err) ||
        mt_cuda_ctx_create(&cb->ctx_h2d, cb->s_h2d, 1 << 20, err))
        return -1;
    if (cb->ranks > 1) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&cb->s_comm, cudaStreamNonBlocking));
        if (mt_cuda_ctx_create(&cb->ctx_comm, cb->s_comm, 1 << 20, err)) return -1;
        make_event(&cb->ev_part_up, 0);
        make_event(&cb->ev_reduced, 0);
        make_event(&cb->ev_comm_end, 0);
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
                             "gradient staging", err))
                return -1;
        }
    }
    cb->grads_to_store = store->g && !cb->o.host_grad_bf16;
    if (cb->host_grad_numel && !cb->grads_to_store &&
        pinned_alloc(&cb->h_grad, cb->host_grad_numel * (cb->o.host_grad_bf16 ? 2 : 4),
                     "host gradients", err))
        return -1;
    make_event(&cb->embed_drained, 0);
    CUDA_CHECK(cudaEventRecord(cb->embed_drained, cb->s_d2h));
    for (int i = 0; i < 2; i++) {
        make_event(&cb->visit_saved[i], 0);
        make_event(&cb->visit_loaded[i], 0);
        make_event(&cb->visit_free[i], 0);
        make_event(&cb->visit_written[i], 0);
        CUDA_CHECK(cudaEventRecord(cb->visit_saved[i], cb->s_d2h));
    }
    if (cb->n_host_saved &&
        pinned_alloc((void **)&cb->h_saved,
                     (size_t)cb->n_host_saved * max_M * cb->N * c->C *
                         (cb->o.host_saved_bf16 ? 2 : 4),
                     "host saved inputs", err))
        return -1;
    if (cb->n_disk_saved && (!cb->o.saved_disk_dirs || !cb->o.saved_disk_dirs[0]))
        return mt_errorf(err, "%d saved layer inputs are placed on disk, but no directory is "
                         "given; add --nvme-dir DIR", cb->n_disk_saved);
    if (cb->n_disk_saved &&
        mt_saved_disk_open(&cb->sdisk, cb->o.saved_disk_dirs, cb->disk_block, cb->t->n_layers,
                           cb->n_disk_saved, (size_t)max_M * cb->N * c->C *
                                                 (cb->o.host_saved_bf16 ? 2 : 4),
                           cb->device, err))
        return -1;
    make_event(&cb->ev_start, 1);
    make_event(&cb->ev_fwd_end, 1);
    make_event(&cb->ev_end, 1);
    make_event(&cb->ev_d2h_end, 0);
    return 0;
}

mt_backend *mt_cuda_backend_make(const mt_config *c, const mt_param_table *t,
                                 mt_host_store *store, int max_M, int64_t B, int64_t T,
                                 const mt_cuda_backend_opts *o, const mt_backend_ops *ops,
                                 mt_error *err) {
    if (mt_cuda_device_count() <= 0)
        return mt_errorf(err, "no CUDA GPU is visible; use --device cpu"), NULL;
    /* A thread waiting for the GPU sleeps instead of spinning: the CPU
     * AdamW runs on every core while the engine waits for copies. */
    if (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) != cudaSuccess)
        (void)cudaGetLastError(); /* a context made earlier keeps its flags */
    if (max_M <= 0 || B <= 0 || T <= 0)
        return mt_errorf(err, "micro-batch shape must be positive"), NULL;
    if (c->HD % 4 || c->C % 4)
        return mt_errorf(err, "the CUDA backend needs hidden_size and head_dim divisible by 4"),
               NULL;
    cuda_backend *cb = mt_calloc_or_die(1, sizeof *cb);
    cb->base.ops = ops;
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
    cb->rank = cb->o.rank;
    cb->ranks = cb->o.ranks;
    cb->comm = cb->o.comm;
    CUDA_CHECK(cudaGetDevice(&cb->device));
    if (check_options(cb, err)) {
        free(cb);
        return NULL;
    }
    mt_cuda_resolve_homes(cb);
    cb->o.homes = NULL; /* read at creation only: the caller may free them now */
    bump b = {0};
    if (place_on_device(cb, &b, err)) {
        mt_cuda_homes_free(cb);
        free(cb->kept);
        free(cb);
        return NULL;
    }
    b = (bump){.base = cb->dev_base};
    mt_cuda_plan(cb, &b);
    cb->moe = mt_cuda_moe_create(c, (size_t)cb->N, cb->prec, cb->moe_dev);
    if (create_streams(cb, err)) {
        mt_cuda_backend_free(&cb->base);
        return NULL;
    }
    size_t hn = (size_t)T * c->HD / 2;
    float *cs = mt_malloc_or_die(2 * hn * sizeof(float));
    mt_rope_tables(cs, cs + hn, c, (size_t)T);
    CUDA_CHECK(cudaMemcpy(cb->cos, cs, hn * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(cb->sin, cs + hn, hn * sizeof(float), cudaMemcpyHostToDevice));
    if (cb->cos_l != cb->cos) { /* Gemma 3's sliding layers */
        mt_rope_tables_local(cs, cs + hn, c, (size_t)T);
        CUDA_CHECK(cudaMemcpy(cb->cos_l, cs, hn * sizeof(float), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(cb->sin_l, cs + hn, hn * sizeof(float), cudaMemcpyHostToDevice));
    }
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
    load_device_layers(cb);
    return &cb->base;
}

void mt_cuda_backend_free(mt_backend *be) {
    if (!be) return;
    cuda_backend *cb = (cuda_backend *)be;
    CUDA_CHECK(cudaSetDevice(cb->device));
    if (cb->s_comp) {
        CUDA_CHECK(cudaDeviceSynchronize());
        pin_store(cb, 0, NULL);
        /* Unregistering ranges that were never registered (creation failed
         * half way) reports an error we expect: clear it. */
        (void)cudaGetLastError();
    }
    mt_saved_disk_close(cb->sdisk); /* before the homes: it reads disk_block */
    mt_cuda_moe_free(cb->moe);
    if (cb->ctx) mt_cuda_ctx_free(cb->ctx);
    if (cb->ctx_h2d) mt_cuda_ctx_free(cb->ctx_h2d);
    if (cb->ctx_comm) mt_cuda_ctx_free(cb->ctx_comm);
    if (cb->s_comm) cudaStreamDestroy(cb->s_comm);
    for (int k = 0; k < cb->o.slots; k++) {
        if (cb->slots[k].ready) cudaEventDestroy(cb->slots[k].ready);
        if (cb->slots[k].free) cudaEventDestroy(cb->slots[k].free);
    }
    cudaEvent_t evs[] = {cb->stage_drained[0], cb->stage_drained[1],
                         cb->embed_slot.ready, cb->embed_slot.free, cb->gacc_drained[0],
                         cb->gacc_drained[1], cb->grad_ready, cb->ev_start, cb->ev_fwd_end,
                         cb->ev_end, cb->ev_d2h_end, cb->visit_saved[0], cb->visit_saved[1],
                         cb->visit_loaded[0], cb->visit_loaded[1], cb->visit_free[0],
                         cb->visit_free[1], cb->visit_written[0], cb->visit_written[1],
                         cb->embed_drained, cb->ev_part_up, cb->ev_reduced, cb->ev_comm_end};
    for (size_t i = 0; i < sizeof evs / sizeof *evs; i++)
        if (evs[i]) cudaEventDestroy(evs[i]);
    if (cb->s_h2d) cudaStreamDestroy(cb->s_h2d);
    if (cb->s_comp) cudaStreamDestroy(cb->s_comp);
    if (cb->s_d2h) cudaStreamDestroy(cb->s_d2h);
    if (cb->h_loss) cudaFreeHost(cb->h_loss);
    if (cb->h_sumsq) cudaFreeHost(cb->h_sumsq);
    if (cb->h_saved) cudaFreeHost(cb->h_saved);
    if (cb->h_grad) cudaFreeHost(cb->h_grad);
    for (int i = 0; i < 2; i++) {
        if (cb->h_stage[i]) cudaFreeHost(cb->h_stage[i]);
        if (cb->fetched[i]) cudaEventDestroy(cb->fetched[i]);
    }
    if (cb->s_fetch) cudaStreamDestroy(cb->s_fetch);
    for (int l = 0; cb->dev_slot && l < cb->n_dev; l++) {
        if (cb->dev_slot[l].ready) cudaEventDestroy(cb->dev_slot[l].ready);
        if (cb->dev_slot[l].free) cudaEventDestroy(cb->dev_slot[l].free);
    }
    for (int l = 0; cb->dev_t0 && l < cb->n_dev; l++)
        if (cb->dev_t0[l]) cudaEventDestroy(cb->dev_t0[l]);
    free(cb->dev_t0);
    free(cb->dev_timed);
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
    mt_cuda_homes_free(cb);
    free(cb);
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
    CUDA_CHECK(cudaSetDevice(cb->device)); /* the optimizer's thread */
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
    CUDA_CHECK(cudaSetDevice(cb->device));
    if (cb->home[layer].grad_host) /* drained during the backward */
        CUDA_CHECK(cudaEventSynchronize(cb->ev_d2h_end));
    else
        CUDA_CHECK(cudaEventSynchronize(cb->fetched[layer % 2]));
}

void mt_cuda_backend_wait_grads(mt_backend *be) {
    CUDA_CHECK(cudaEventSynchronize(((cuda_backend *)be)->ev_d2h_end));
}

int mt_cuda_backend_device_layers(mt_backend *be) { return ((cuda_backend *)be)->n_dev; }

void mt_cuda_backend_update_layer(mt_backend *be, int layer, const mt_adamw_coefs *coefs) {
    cuda_backend *cb = (cuda_backend *)be;
    MT_ASSERT(layer >= 0 && layer < cb->n_dev);
    CUDA_CHECK(cudaSetDevice(cb->device)); /* the optimizer's thread */
    /* the store's table: the whole layer, or this rank's part, whose
     * reduced gradient the reduce-scatter left at its place */
    const mt_layer_desc *ld = &cb->store->table->layers[layer];
    size_t at = cb->dev_off[layer];
    const float *g = cb->gacc_all + cb->goff[layer] + part_of(cb, layer).begin;
    CUDA_CHECK(cudaEventRecord(cb->dev_t0[layer], cb->s_comp));
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_tensor_desc *td = &ld->tensors[k];
        size_t off = at + td->offset;
        mt_cuda_adamw(cb->s_comp, cb->dev_w + off, cb->dev_m + off, cb->dev_v + off,
                      g + td->offset, td->numel, &coefs[k]);
    }
    if (cb->dev_w16) mt_cuda_cast_f32_to_bf16(cb->ctx, cb->dev_w16 + at, cb->dev_w + at, ld->numel);
    CUDA_CHECK(cudaEventRecord(cb->dev_slot[layer].ready, cb->s_comp));
    cb->dev_timed[layer] = 1;
    cb->dev_stale = 1;
}

void mt_cuda_backend_flush_store(mt_backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb->dev_stale) return;
    CUDA_CHECK(cudaSetDevice(cb->device));
    copy_device_layers(cb, cudaMemcpyDeviceToHost); /* after the updates: same stream */
    cb->dev_stale = 0;
}

static mt_grad_view src_begin(void *be, int layer) { return mt_cuda_backend_grads_begin(be, layer); }
static void src_wait(void *be, int layer) { mt_cuda_backend_grads_wait(be, layer); }
static void src_update(void *be, int layer, const mt_adamw_coefs *coefs) {
    mt_cuda_backend_update_layer(be, layer, coefs);
}
static void src_flush(void *be) { mt_cuda_backend_flush_store(be); }

mt_grad_source mt_cuda_backend_grad_source(mt_backend *be) {
    return (mt_grad_source){.ctx = be, .begin = src_begin, .wait = src_wait,
                            .n_device = mt_cuda_backend_device_layers(be), .update = src_update,
                            .flush = src_flush};
}

void mt_cuda_backend_times(mt_backend *be, mt_cuda_step_times *t) {
    *t = ((cuda_backend *)be)->times;
}

size_t mt_cuda_backend_device_bytes(mt_backend *be) { return ((cuda_backend *)be)->dev_bytes; }

void mt_cuda_backend_stats(mt_backend *be, mt_backend_stats *st) {
    cuda_backend *cb = (cuda_backend *)be;
    *st = (mt_backend_stats){.forward_s = cb->times.forward_ms / 1e3,
                             .backward_s = cb->times.backward_ms / 1e3,
                             .total_s = cb->times.total_ms / 1e3,
                             .h2d_bytes = cb->times.h2d_bytes, .d2h_bytes = cb->times.d2h_bytes,
                             .coll_bytes = cb->times.coll_bytes,
                             .device_bytes = (double)cb->dev_bytes,
                             .host_bytes = (double)mt_cuda_host_bytes_of(cb),
                             .kept_layers = cb->n_keep};
}

int mt_cuda_backend_kept_layers(mt_backend *be) { return ((cuda_backend *)be)->n_keep; }
int mt_cuda_backend_down_kept_layers(mt_backend *be) {
    return ((cuda_backend *)be)->n_keep_down;
}

void mt_cuda_backend_logits(mt_backend *be, int mb, int64_t row, float *logits) {
    cuda_backend *cb = (cuda_backend *)be;
    MT_ASSERT(cb->ranks <= 1); /* reads the whole head from the store */
    MT_ASSERT(!mt_disk_state_weight_layers(cb->store->disk)); /* its fp32 weights, in RAM */
    mt_cuda_backend_flush_store(be); /* the head's weights are read from the store */
    const mt_config *c = cb->cfg;
    int head = cb->t->n_layers - 1;
    MT_ASSERT(row >= 0 && row < cb->N && mb >= 0 && mb < cb->max_M);
    /* Rare and small: upload what the row needs into scratch, compute on
     * the compute stream, read back. Uses the CPU reference for the tiny
     * product so the GPU path stays free of one-row special cases. */
    size_t C = c->C, V = c->V;
    float *x = mt_malloc_or_die(C * sizeof(float)), *xn = mt_malloc_or_die(C * sizeof(float));
    CUDA_CHECK(cudaMemcpy(x, saved_at(cb, head, mb) + (size_t)row * C, C * sizeof(float),
                          cudaMemcpyDeviceToHost));
    const mt_layer_desc *hl = &cb->t->layers[head];
    const float *wn = cb->store->w + hl->offset + hl->tensors[hl->by_role[MT_T_FINAL_NORM]].offset;
    if (c->layernorm) /* gpt_neox, falcon */
        mt_cpu_layernorm_forward(xn, NULL, NULL, x, wn,
                                 cb->store->w + hl->offset +
                                     hl->tensors[hl->by_role[MT_T_FINAL_NORM_B]].offset,
                                 1, C, c->rms_eps);
    else if (cb->t->norm_offset) /* gemma: by 1 + w */
        mt_cpu_rmsnorm1p_forward(xn, NULL, x, wn, 1, C, c->rms_eps);
    else
        mt_cpu_rmsnorm_forward(xn, NULL, x, wn, 1, C, c->rms_eps);
    const float *wl;
    if (c->tie_embeddings) {
        const mt_layer_desc *el = &cb->t->layers[0];
        wl = cb->store->w + el->offset + el->tensors[el->by_role[MT_T_EMBED]].offset;
    } else {
        wl = cb->store->w + hl->offset + hl->tensors[hl->by_role[MT_T_LM_HEAD]].offset;
    }
    mt_cpu_matmul_forward(logits, xn, wl, NULL, 1, C, V);
    float cap = (float)c->final_softcap; /* Gemma 2, as backend_cpu.c */
    if (cap != 0.0f)
        for (size_t i = 0; i < V; i++) logits[i] = tanhf(logits[i] / cap) * cap;
    free(x);
    free(xn);
}
