/* Shard arithmetic and a rank's share of the host store (see shard.h). */
#include "dist/shard.h"

#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

size_t mt_shard_chunk(size_t n, int ranks) {
    MT_ASSERT(ranks >= 1);
    size_t units = (n + MT_SHARD_ALIGN - 1) / MT_SHARD_ALIGN;
    return (units + (size_t)ranks - 1) / (size_t)ranks * MT_SHARD_ALIGN;
}

mt_shard_range mt_shard_split(size_t n, int ranks, int rank) {
    MT_ASSERT(ranks >= 1 && rank >= 0 && rank < ranks);
    /* Equal chunks in rank order, the last ones short or empty: a
     * collective then moves the same count for every rank. */
    size_t chunk = mt_shard_chunk(n, ranks);
    size_t begin = (size_t)rank * chunk, end = begin + chunk;
    if (begin > n) begin = n;
    if (end > n) end = n;
    return (mt_shard_range){begin, end};
}

int mt_shard_layout_init(mt_shard_layout *sl, const mt_param_table *t, int rank, int ranks,
                         mt_error *err) {
    memset(sl, 0, sizeof *sl);
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return mt_errorf(err, "rank %d of %d: a rank runs from 0 to the number of ranks - 1",
                         rank, ranks);
    sl->table = t;
    sl->rank = rank;
    sl->ranks = ranks;
    sl->part = mt_calloc_or_die((size_t)t->n_layers, sizeof *sl->part);
    sl->local = mt_calloc_or_die((size_t)t->n_layers, sizeof *sl->local);
    size_t at = 0;
    for (int l = 0; l < t->n_layers; l++) {
        sl->part[l] = mt_shard_split(t->layers[l].numel, ranks, rank);
        sl->local[l] = at;
        /* page-aligned, as the model's layers: each part is pinned (and
         * copied) on its own */
        at = mt_round_up(at + mt_shard_len(sl, l), MT_LAYER_ALIGN);
    }
    sl->total = at;
    return 0;
}

int mt_shard_table_init(mt_param_table *out, const mt_shard_layout *sl, mt_error *err) {
    const mt_param_table *t = sl->table;
    memset(out, 0, sizeof *out);
    out->n_layers = t->n_layers;
    out->layers = mt_calloc_or_die((size_t)t->n_layers, sizeof *out->layers);
    out->total = sl->total;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *full = &t->layers[l];
        mt_layer_desc *ld = &out->layers[l];
        ld->kind = full->kind;
        ld->block = full->block;
        ld->offset = sl->local[l];
        ld->numel = mt_shard_len(sl, l);
        for (int r = 0; r < MT_T_COUNT; r++) ld->by_role[r] = -1;
        mt_shard_piece *pc = mt_calloc_or_die((size_t)(full->n_tensors ? full->n_tensors : 1),
                                              sizeof *pc);
        ld->n_tensors = mt_shard_pieces(sl, l, pc);
        ld->tensors = mt_calloc_or_die((size_t)(ld->n_tensors ? ld->n_tensors : 1),
                                       sizeof *ld->tensors);
        for (int k = 0; k < ld->n_tensors; k++) {
            mt_tensor_desc *td = &ld->tensors[k];
            *td = full->tensors[pc[k].tensor]; /* name, role, expert, ndim: weight decay */
            td->shape[0] = (int64_t)pc[k].n;
            td->shape[1] = 1;
            td->numel = pc[k].n;
            td->offset = pc[k].local - sl->local[l];
            out->n_params += (int64_t)pc[k].n;
        }
        free(pc);
        if (ld->numel > out->max_layer_numel) out->max_layer_numel = ld->numel;
    }
    (void)err;
    return 0;
}

void mt_shard_layout_free(mt_shard_layout *sl) {
    free(sl->part);
    free(sl->local);
    memset(sl, 0, sizeof *sl);
}

int mt_shard_pieces(const mt_shard_layout *sl, int layer, mt_shard_piece *out) {
    const mt_layer_desc *ld = &sl->table->layers[layer];
    const mt_shard_range p = sl->part[layer];
    int n = 0;
    for (int k = 0; k < ld->n_tensors; k++) {
        size_t tb = ld->tensors[k].offset, te = tb + ld->tensors[k].numel;
        size_t b = tb > p.begin ? tb : p.begin, e = te < p.end ? te : p.end;
        if (b >= e) continue;
        out[n++] = (mt_shard_piece){
            .tensor = k, .first = b - tb, .local = sl->local[layer] + (b - p.begin), .n = e - b};
    }
    return n;
}

void mt_shard_take(const mt_shard_layout *sl, const float *full, float *local) {
    for (int l = 0; l < sl->table->n_layers; l++)
        memcpy(local + sl->local[l], full + sl->table->layers[l].offset + sl->part[l].begin,
               mt_shard_len(sl, l) * sizeof(float));
}

void mt_shard_put(const mt_shard_layout *sl, const float *local, float *full) {
    for (int l = 0; l < sl->table->n_layers; l++)
        memcpy(full + sl->table->layers[l].offset + sl->part[l].begin, local + sl->local[l],
               mt_shard_len(sl, l) * sizeof(float));
}

int mt_shard_store_init(mt_shard_store *s, const mt_param_table *t, int rank, int ranks,
                        int grads, mt_error *err) {
    memset(s, 0, sizeof *s);
    if (mt_shard_layout_init(&s->layout, t, rank, ranks, err) ||
        mt_shard_table_init(&s->table, &s->layout, err))
        return -1;
    size_t bytes = mt_round_up(s->layout.total, MT_SHARD_ALIGN) * sizeof(float);
    if (bytes == 0) bytes = 64;
    float **arrays[] = {&s->w, &s->m, &s->v, &s->g};
    int n = grads ? 4 : 3;
    for (int i = 0; i < n; i++) {
        *arrays[i] = mt_aligned_alloc_try(64, bytes);
        if (!*arrays[i]) {
            mt_shard_store_free(s);
            return mt_errorf(err, "rank %d of %d: cannot allocate its share of the host store "
                             "(%d arrays of %zu bytes): free memory or use more ranks",
                             rank, ranks, n, bytes);
        }
        memset(*arrays[i], 0, bytes);
    }
    return 0;
}

void mt_shard_store_free(mt_shard_store *s) {
    free(s->w);
    free(s->m);
    free(s->v);
    free(s->g);
    mt_params_free(&s->table);
    mt_shard_layout_free(&s->layout);
    memset(s, 0, sizeof *s);
}

mt_host_store mt_shard_store_host(mt_shard_store *s) {
    return (mt_host_store){.table = &s->table, .w = s->w, .m = s->m, .v = s->v, .g = s->g,
                           .bytes = s->table.total * sizeof(float) * (s->g ? 4 : 3)};
}

void mt_shard_init_random(mt_host_store *parts, const mt_shard_layout *sl, uint64_t seed,
                          float std) {
    const mt_param_table *t = sl->table;
    for (int l = 0; l < t->n_layers; l++) {
        float *out = parts->w + parts->table->layers[l].offset;
        memset(out, 0, mt_shard_len(sl, l) * sizeof(float));
        mt_host_store_random_range(t, l, sl->part[l].begin, sl->part[l].end, seed, std, out);
    }
}
