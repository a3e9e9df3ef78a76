/* A CPU rank of several (see cpu_ranks.h): the CPU backend over a whole
 * copy of the model, gathered and reduced around each step. */
#include "dist/cpu_ranks.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "util/mem.h"

typedef struct cpu_ranks {
    mt_backend base;
    mt_backend *inner;          /* the CPU backend over `whole` */
    const mt_shard_layout *sl;
    mt_host_store *parts;
    mt_rdv *g;
    mt_host_store whole;        /* the model's table: weights and gradient */
    float *buf;                 /* (ranks * largest chunk) a layer's parts side by side */
    int train;
    int failed;                 /* a collective failed: the step's result is not valid */
    mt_error err;
} cpu_ranks;

/* Every rank's part of layer l, gathered into the whole copy: the parts
 * travel as equal chunks (padded), rank r's at r * chunk. */
static int gather_layer(cpu_ranks *cr, int l, mt_error *err) {
    const mt_layer_desc *ld = &cr->sl->table->layers[l];
    size_t chunk = mt_shard_chunk(ld->numel, cr->sl->ranks), len = mt_shard_len(cr->sl, l);
    float *mine = mt_calloc_or_die(chunk ? chunk : 1, sizeof *mine);
    memcpy(mine, cr->parts->w + cr->parts->table->layers[l].offset, len * sizeof(float));
    int rc = mt_rdv_allgather(cr->g, mine, chunk * sizeof(float), cr->buf, err);
    free(mine);
    if (rc == 0) memcpy(cr->whole.w + ld->offset, cr->buf, ld->numel * sizeof(float));
    return rc;
}

/* Layer l's gradient summed over the ranks; this rank keeps its part. */
static int reduce_layer(cpu_ranks *cr, int l, mt_error *err) {
    const mt_layer_desc *ld = &cr->sl->table->layers[l];
    float *g = cr->whole.g + ld->offset;
    if (mt_rdv_sum_f32(cr->g, g, ld->numel, err)) return -1;
    memcpy(cr->parts->g + cr->parts->table->layers[l].offset, g + cr->sl->part[l].begin,
           mt_shard_len(cr->sl, l) * sizeof(float));
    return 0;
}

static int cr_begin_step(mt_backend *be, const mt_batch *batch, float dscale, int train,
                         mt_error *err) {
    cpu_ranks *cr = (cpu_ranks *)be;
    cr->train = train;
    cr->failed = 0;
    for (int l = 0; l < cr->sl->table->n_layers; l++)
        if (gather_layer(cr, l, err)) return -1;
    return cr->inner->ops->begin_step(cr->inner, batch, dscale, train, err);
}

static void cr_bind_layer(mt_backend *be, int layer, int backward) {
    cpu_ranks *cr = (cpu_ranks *)be;
    cr->inner->ops->bind_layer(cr->inner, layer, backward);
}

static void cr_forward(mt_backend *be, int layer, int mb) {
    cpu_ranks *cr = (cpu_ranks *)be;
    cr->inner->ops->forward(cr->inner, layer, mb);
}

static void cr_head(mt_backend *be, int mb) {
    cpu_ranks *cr = (cpu_ranks *)be;
    cr->inner->ops->head(cr->inner, mb);
}

static void cr_backward(mt_backend *be, int layer, int mb) {
    cpu_ranks *cr = (cpu_ranks *)be;
    cr->inner->ops->backward(cr->inner, layer, mb);
}

/* A tied model's head adds to layer 0's gradient until layer 0 is done,
 * so the sums wait for the step's end. */
static void cr_layer_grads_done(mt_backend *be, int layer) {
    cpu_ranks *cr = (cpu_ranks *)be;
    cr->inner->ops->layer_grads_done(cr->inner, layer);
}

static double cr_end_step(mt_backend *be) {
    cpu_ranks *cr = (cpu_ranks *)be;
    double loss = cr->inner->ops->end_step(cr->inner);
    for (int l = 0; cr->train && !cr->failed && l < cr->sl->table->n_layers; l++)
        if (reduce_layer(cr, l, &cr->err)) cr->failed = 1;
    return loss;
}

static int cr_step_error(mt_backend *be, mt_error *err) {
    cpu_ranks *cr = (cpu_ranks *)be;
    if (!cr->failed) return 0;
    *err = cr->err;
    return -1;
}

static void cr_logits(mt_backend *be, int mb, int64_t row, float *logits) {
    cpu_ranks *cr = (cpu_ranks *)be;
    cr->inner->ops->logits(cr->inner, mb, row, logits);
}

static const mt_backend_ops cpu_ranks_ops = {
    .begin_step = cr_begin_step,
    .bind_layer = cr_bind_layer,
    .forward = cr_forward,
    .head = cr_head,
    .backward = cr_backward,
    .layer_grads_done = cr_layer_grads_done,
    .end_step = cr_end_step,
    .step_error = cr_step_error,
    .logits = cr_logits,
    .destroy = mt_cpu_ranks_backend_free,
};

mt_backend *mt_cpu_ranks_backend_create(const mt_config *cfg, const mt_shard_layout *sl,
                                        mt_host_store *parts, mt_rdv *g, int max_M, int64_t B,
                                        int64_t T, mt_error *err) {
    if (!parts->g)
        return mt_errorf(err, "a CPU rank's store needs its gradient array"), NULL;
    cpu_ranks *cr = mt_calloc_or_die(1, sizeof *cr);
    cr->base.ops = &cpu_ranks_ops;
    cr->base.name = "cpu";
    cr->sl = sl;
    cr->parts = parts;
    cr->g = g;
    if (mt_host_store_create(&cr->whole, sl->table, 1, err)) {
        free(cr);
        return NULL;
    }
    size_t most = 0;
    for (int l = 0; l < sl->table->n_layers; l++) {
        size_t c = mt_shard_chunk(sl->table->layers[l].numel, sl->ranks);
        if (c > most) most = c;
    }
    cr->buf = mt_calloc_or_die(most * (size_t)sl->ranks + 1, sizeof *cr->buf);
    cr->inner = mt_cpu_backend_create(cfg, sl->table, &cr->whole, max_M, B, T, err);
    if (!cr->inner) {
        mt_cpu_ranks_backend_free(&cr->base);
        return NULL;
    }
    return &cr->base;
}

void mt_cpu_ranks_backend_free(mt_backend *be) {
    if (!be) return;
    cpu_ranks *cr = (cpu_ranks *)be;
    mt_cpu_backend_free(cr->inner);
    mt_host_store_free(&cr->whole);
    free(cr->buf);
    free(cr);
}
