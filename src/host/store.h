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

/* Where a layer's arrays live when some are on disk
 * (mt_host_store_create_tiered): all in RAM; its Adam m and v on disk;
 * its fp32 weights on disk too, with a bf16 copy of them in RAM (w16) and
 * its 1-D tensors (norms, biases) exact in w. */
enum { MT_HOME_RAM = 0, MT_HOME_DISK_STATE = 1, MT_HOME_DISK_WEIGHTS = 2 };

typedef struct mt_host_store {
    const mt_param_table *table;
    float *w;   /* (total) master weights; of a layer whose weights are on disk
                 * only its 1-D tensors (the rest address space, never touched) */
    float *m;   /* (total) Adam first moment */
    float *v;   /* (total) Adam second moment */
    float *g;   /* (total) gradient of the current step, or NULL */
    size_t bytes;  /* of RAM the arrays take */
    /* The layers whose m and v live on disk (host/disk_state.h), NULL
     * none: their ranges of m and v are address space only, never
     * touched (no RAM), and every reader of m and v goes through it. */
    struct mt_disk_state *disk;
    size_t mv_mapped;  /* bytes of m's and v's mappings when they are reserved so */
    /* (total) bf16 copy (round to nearest even) of the weights of the
     * layers whose fp32 weights live on disk, for the GPU's streaming;
     * NULL: none. Address space where other layers are (never touched). */
    uint16_t *w16;
    size_t w_mapped, w16_mapped;  /* bytes of w's and w16's mappings when reserved */
} mt_host_store;

/* Allocates and zero-fills w, m, v and, if grads, g (without it g is NULL:
 * the gradient waits on the GPU). Fails with a message giving the bytes
 * needed when memory is short. */
int mt_host_store_create(mt_host_store *s, const mt_param_table *t, int grads, mt_error *err);

/* The same where layer l's arrays live as home[l] says (MT_HOME_*; the
 * caller attaches the disk state to s->disk): the ranges of what is on
 * disk take no RAM; w16 holds the layers whose weights are there. home
 * NULL: mt_host_store_create. */
int mt_host_store_create_tiered(mt_host_store *s, const mt_param_table *t, int grads,
                                const uint8_t *home, mt_error *err);

/* mt_host_store_create with the gradient array. */
int mt_host_store_init(mt_host_store *s, const mt_param_table *t, mt_error *err);
void mt_host_store_free(mt_host_store *s);

/* Layer l's range in one of the arrays. */
static inline float *mt_store_layer(float *array, const mt_param_table *t, int l) {
    return array + t->layers[l].offset;
}

/* The RAM side of layer l when its fp32 weights live on disk, from those
 * weights w (numel floats): keep_exact copies the tensors the GPU reads in
 * fp32 (mt_tensor_read_fp32) into s->w; set_copy also writes the bf16
 * copy, w16 = bf16(w) rounded to nearest even, as the GPU's own cast of
 * the fp32 weights gives it. */
void mt_host_store_keep_exact(mt_host_store *s, int l, const float *w);
void mt_host_store_set_copy(mt_host_store *s, int l, const float *w);

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
