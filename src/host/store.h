/* The host store: the home of the model. fp32 master weights, Adam m and v,
 * and the fp32 gradient, each one flat layer-major array driven by the
 * parameter table (layer l is the range [offset, offset + numel) of every
 * array), page-aligned, first-touched in parallel. */
#ifndef MT_HOST_STORE_H
#define MT_HOST_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "util/error.h"

struct mt_disk_state;

typedef struct mt_host_store {
    const mt_param_table *table;
    float *w;   /* (total) master weights */
    float *m;   /* (total) Adam first moment */
    float *v;   /* (total) Adam second moment */
    float *g;   /* (total) gradient of the current step, or NULL */
    size_t bytes;  /* of RAM the arrays take */
    /* The layers whose m and v live on disk (host/disk_state.h), NULL
     * none: their ranges of m and v are address space only, never
     * touched (no RAM), and every reader of m and v goes through it. */
    struct mt_disk_state *disk;
    size_t mv_mapped;  /* bytes of m's and v's mappings when they are reserved so */
} mt_host_store;

/* Allocates and zero-fills w, m, v and, if grads, g (without it g is NULL:
 * the gradient waits on the GPU). Fails with a message giving the bytes
 * needed when memory is short. */
int mt_host_store_create(mt_host_store *s, const mt_param_table *t, int grads, mt_error *err);

/* The same where the m and v of the layers with state_on_disk[l] set live
 * on disk (the caller attaches the disk state to s->disk): their ranges
 * take no RAM. state_on_disk NULL: mt_host_store_create. */
int mt_host_store_create_tiered(mt_host_store *s, const mt_param_table *t, int grads,
                                const uint8_t *state_on_disk, mt_error *err);

/* mt_host_store_create with the gradient array. */
int mt_host_store_init(mt_host_store *s, const mt_param_table *t, mt_error *err);
void mt_host_store_free(mt_host_store *s);

/* Layer l's range in one of the arrays. */
static inline float *mt_store_layer(float *array, const mt_param_table *t, int l) {
    return array + t->layers[l].offset;
}

/* Fills weights like a freshly initialised model: uniform with standard
 * deviation std for matrices, 1 for norm weights, 0 for biases.
 * Deterministic in seed, independent of the thread count. */
void mt_host_store_init_random(mt_host_store *s, uint64_t seed, float std);

/* Elements [begin, end) of layer l of table t as mt_host_store_init_random
 * fills them, into out (end - begin floats; padding untouched): a rank
 * fills only its part. */
void mt_host_store_random_range(const mt_param_table *t, int l, size_t begin, size_t end,
                                uint64_t seed, float std, float *out);

#endif
