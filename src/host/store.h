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

typedef struct mt_host_store {
    const mt_param_table *table;
    float *w;   /* (total) master weights */
    float *m;   /* (total) Adam first moment */
    float *v;   /* (total) Adam second moment */
    float *g;   /* (total) gradient of the current step, or NULL */
    size_t bytes;
} mt_host_store;

/* Allocates and zero-fills w, m, v and, if grads, g (without it g is NULL:
 * the gradient waits on the GPU). Fails with a message giving the bytes
 * needed when memory is short. */
int mt_host_store_create(mt_host_store *s, const mt_param_table *t, int grads, mt_error *err);

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
