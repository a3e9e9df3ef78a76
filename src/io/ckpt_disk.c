#include "io/ckpt_disk.h"

#include <stdlib.h>
#include <string.h>

#include "host/disk_state.h"
#include "util/mem.h"

typedef struct source {
    mt_ckpt_disk *c;
    int layer, array;
    size_t offset;  /* the tensor's, in the layer */
} source;

struct mt_ckpt_disk {
    mt_disk_state *ds;
    int layer;        /* the one in the cache, -1 none */
    float *cache[3];  /* w, or m and v: the largest disk layer's numel each */
    source *src;
    int n, used;
};

mt_ckpt_disk *mt_ckpt_disk_new(mt_disk_state *ds, int n, int weights) {
    mt_ckpt_disk *c = mt_calloc_or_die(1, sizeof *c);
    size_t most = mt_disk_state_max_numel(ds);
    *c = (mt_ckpt_disk){.ds = ds, .layer = -1,
                        .src = mt_calloc_or_die((size_t)(n > 0 ? n : 1), sizeof(source)), .n = n};
    for (int a = weights ? MT_CKPT_W : MT_CKPT_M; a <= (weights ? MT_CKPT_W : MT_CKPT_V); a++)
        c->cache[a] = mt_malloc_or_die((most ? most : 1) * sizeof(float));
    return c;
}

int mt_ckpt_disk_copy(mt_ckpt_disk *c, int layer, int array, size_t offset, size_t count,
                      float *dst, mt_error *err) {
    MT_ASSERT(c->cache[array]);
    if (c->layer != layer) {
        c->layer = -1;
        if (mt_disk_state_read(c->ds, layer, c->cache[MT_CKPT_W], c->cache[MT_CKPT_M],
                               c->cache[MT_CKPT_V], err))
            return -1;
        c->layer = layer;
    }
    memcpy(dst, c->cache[array] + offset, count * sizeof(float));
    return 0;
}

int mt_ckpt_disk_has_weights(const mt_ckpt_disk *c, int layer) {
    return c->cache[MT_CKPT_W] && mt_disk_state_weights_on_disk(c->ds, layer);
}

static int fill(void *ctx, const mt_st_write_tensor *t, size_t first, size_t count, float *dst,
                mt_error *err) {
    (void)t;
    source *s = ctx;
    return mt_ckpt_disk_copy(s->c, s->layer, s->array, s->offset + first, count, dst, err);
}

void mt_ckpt_disk_source(mt_ckpt_disk *c, mt_st_write_tensor *wt, int layer, int array,
                         size_t offset) {
    MT_ASSERT(c->used < c->n);
    source *s = &c->src[c->used++];
    *s = (source){.c = c, .layer = layer, .array = array, .offset = offset};
    wt->f32 = NULL;
    wt->fill = fill;
    wt->fill_ctx = s;
}

void mt_ckpt_disk_free(mt_ckpt_disk *c) {
    if (!c) return;
    for (int a = 0; a < 3; a++) free(c->cache[a]);
    free(c->src);
    free(c);
}
