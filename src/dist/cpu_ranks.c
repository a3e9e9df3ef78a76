/* A CPU rank of several (see cpu_ranks.h): the CPU backend over a whole
 * copy of the model, gathered and reduced around each step. */
#include "dist/cpu_ranks.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "util/mem.h"

typedef struct cpu_ranks {
    const mt_shard_layout *sl;
    mt_host_store *parts;
    mt_rdv *g;
    mt_host_store whole;        /* the model's table: weights and gradient */
    float *buf;                 /* (ranks * largest chunk) a layer's parts side by side */
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

/* Before each step: the weights, gathered. */
static int gather_all(void *ctx, int train, mt_error *err) {
    cpu_ranks *cr = ctx;
    for (int l = 0; l < cr->sl->table->n_layers; l++)
        if (gather_layer(cr, l, err)) return -1;
    return 0;
}

/* After a training step: the gradient, reduced. A tied model's head adds
 * to layer 0's gradient until the step's end, so the sums wait for it. */
static int reduce_all(void *ctx, int train, mt_error *err) {
    cpu_ranks *cr = ctx;
    for (int l = 0; train && l < cr->sl->table->n_layers; l++)
        if (reduce_layer(cr, l, err)) return -1;
    return 0;
}

static void cpu_ranks_free(void *ctx) {
    cpu_ranks *cr = ctx;
    mt_host_store_free(&cr->whole);
    free(cr->buf);
    free(cr);
}

mt_backend *mt_cpu_ranks_backend_create(const mt_config *cfg, const mt_shard_layout *sl,
                                        mt_host_store *parts, mt_rdv *g, int max_M, int64_t B,
                                        int64_t T, mt_error *err) {
    if (!parts->g)
        return mt_errorf(err, "a CPU rank's store needs its gradient array"), NULL;
    cpu_ranks *cr = mt_calloc_or_die(1, sizeof *cr);
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
    mt_cpu_step_hooks hooks = {gather_all, reduce_all, cpu_ranks_free, cr};
    mt_backend *be = mt_cpu_backend_create_hooked(cfg, sl->table, &cr->whole, max_M, B, T,
                                                  &hooks, err);
    if (!be) cpu_ranks_free(cr);
    return be;
}
