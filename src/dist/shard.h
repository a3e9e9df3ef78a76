/* Shard arithmetic: which part of the host store each of n ranks owns.
 *
 * Every layer's range (model/params.h: layer-major, padded) is cut into n
 * contiguous parts, one per rank, in rank order: every part but the last
 * non-empty one is exactly one chunk (mt_shard_chunk: the layer's
 * MT_SHARD_ALIGN units divided by n, rounded up), the last is the rest, and
 * ranks past the end own nothing. Every element of the layer is owned
 * exactly once, and an all-gather or reduce-scatter of the layer moves one
 * chunk per rank (the GPU buffers are sized n chunks). Cutting every layer, rather than the whole model,
 * keeps the traffic of each layer's all-gather and reduce-scatter even over
 * the ranks.
 *
 * A rank keeps its parts back to back in its own arrays (w, m, v, g: the
 * "local" layout), layer 0's part first, each part starting on a page
 * (MT_LAYER_ALIGN), as the model's layers do.
 * Optimizer, checkpoints and (later) collectives are loops over these
 * parts; a tensor boundary inside a part is found with mt_shard_pieces. */
#ifndef MT_DIST_SHARD_H
#define MT_DIST_SHARD_H

#include <stddef.h>

#include "host/store.h"
#include "model/params.h"
#include "util/error.h"

#define MT_SHARD_ALIGN MT_TENSOR_ALIGN  /* floats: 64 bytes, the optimizer's vector alignment */

/* [begin, end) in floats. */
typedef struct mt_shard_range {
    size_t begin, end;
} mt_shard_range;

/* Floats of each rank's part of a range of n floats cut among `ranks`
 * (>= 1), before the range's end shortens the last ones: a multiple of
 * MT_SHARD_ALIGN. */
size_t mt_shard_chunk(size_t n, int ranks);

/* Rank `rank`'s part of a range of n floats cut among `ranks` (>= 1):
 * [rank * chunk, (rank + 1) * chunk) clipped to n. */
mt_shard_range mt_shard_split(size_t n, int ranks, int rank);

/* One rank's parts of every layer of a table. */
typedef struct mt_shard_layout {
    const mt_param_table *table;
    int rank, ranks;
    mt_shard_range *part;   /* (n_layers) relative to the layer's start */
    size_t *local;          /* (n_layers) where the part starts in the rank's arrays */
    size_t total;           /* floats of the rank's arrays */
} mt_shard_layout;

/* Layout of rank `rank` of `ranks`; -1 with a message for a bad pair. */
int mt_shard_layout_init(mt_shard_layout *sl, const mt_param_table *t, int rank, int ranks,
                         mt_error *err);
void mt_shard_layout_free(mt_shard_layout *sl);

static inline size_t mt_shard_len(const mt_shard_layout *sl, int layer) {
    return sl->part[layer].end - sl->part[layer].begin;
}

/* The part of one tensor inside a rank's part of a layer. */
typedef struct mt_shard_piece {
    int tensor;      /* index in the layer's tensors */
    size_t first;    /* first element of the tensor in the piece */
    size_t local;    /* where the piece starts in the rank's arrays */
    size_t n;        /* elements */
} mt_shard_piece;

/* The pieces of every tensor of `layer` inside the rank's part, in order,
 * into out (the layer's n_tensors at most); returns how many. Padding between
 * tensors belongs to no piece. */
int mt_shard_pieces(const mt_shard_layout *sl, int layer, mt_shard_piece *out);

/* The rank's parts as a parameter table of their own (mt_params_free
 * frees it): layer l is the rank's part (offset: where it starts in the
 * rank's arrays, numel: its length), its tensors the pieces (name, role
 * and ndim of the whole tensor, so weight decay is decided the same; 1-D of
 * the piece's length). The host store, the optimizer and its pipeline run
 * unchanged over this table. */
int mt_shard_table_init(mt_param_table *out, const mt_shard_layout *sl, mt_error *err);

/* Copies the rank's parts of a full layer-major array (table->total) into
 * its local array (sl->total), and back. Padding of the local array between
 * parts is left alone. */
void mt_shard_take(const mt_shard_layout *sl, const float *full, float *local);
void mt_shard_put(const mt_shard_layout *sl, const float *local, float *full);

/* A rank's share of the host store: w, m, v (and g when asked) in the
 * local layout, zero-filled, 64-byte aligned, and the parts' table
 * (mt_shard_table_init) that describes them. */
struct mt_disk_state;
typedef struct mt_shard_store {
    mt_shard_layout layout;
    mt_param_table table;
    float *w, *m, *v, *g;
    /* the layers whose parts of m and v live on disk (host/disk_state.h,
     * a tier over the parts' table), NULL: none; their ranges of m and v
     * hold no memory */
    struct mt_disk_state *disk;
} mt_shard_store;

/* Fills parts (a store over sl's parts' table) with this rank's parts of
 * the weights mt_host_store_init_random(seed, std) gives the whole model:
 * the ranks' parts side by side are that store, bit for bit. */
void mt_shard_init_random(mt_host_store *parts, const mt_shard_layout *sl, uint64_t seed,
                          float std);

/* The store as the optimizer sees one: s's arrays over s->table. */
mt_host_store mt_shard_store_host(mt_shard_store *s);

int mt_shard_store_init(mt_shard_store *s, const mt_param_table *t, int rank, int ranks,
                        int grads, mt_error *err);
void mt_shard_store_free(mt_shard_store *s);

#endif
