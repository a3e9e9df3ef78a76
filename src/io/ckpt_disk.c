#include "io/ckpt_disk.h"

#include <stdlib.h>
#include <string.h>

#include "host/disk_state.h"
#include "util/mem.h"

typedef struct source {
    mt_ckpt_disk *c;
    int layer, v;   /* which array */
    size_t offset;  /* the tensor's, in the layer */
} source;

struct mt_ckpt_disk {
    mt_disk_state *ds;
    int layer;      /* the one in m and v, -1 none */
    float *m, *v;   /* the largest disk layer's numel each */
    source *src;
    int n, used;
};

mt_ckpt_disk *mt_ckpt_disk_new(mt_disk_state *ds, int n) {
    mt_ckpt_disk *c = mt_calloc_or_die(1, sizeof *c);
    size_t most = mt_disk_state_max_numel(ds);
    *c = (mt_ckpt_disk){.ds = ds, .layer = -1, .m = mt_malloc_or_die(most * sizeof(float)),
                        .v = mt_malloc_or_die(most * sizeof(float)),
                        .src = mt_calloc_or_die((size_t)(n > 0 ? n : 1), sizeof(source)),
                        .n = n};
    return c;
}

static int fill(void *ctx, const mt_st_write_tensor *t, size_t first, size_t count, float *dst,
                mt_error *err) {
    (void)t;
    source *s = ctx;
    mt_ckpt_disk *c = s->c;
    if (c->layer != s->layer) {
        c->layer = -1;
        if (mt_disk_state_read(c->ds, s->layer, c->m, c->v, err)) return -1;
        c->layer = s->layer;
    }
    memcpy(dst, (s->v ? c->v : c->m) + s->offset + first, count * sizeof(float));
    return 0;
}

void mt_ckpt_disk_source(mt_ckpt_disk *c, mt_st_write_tensor *wt, int layer, int v,
                         size_t offset) {
    MT_ASSERT(c->used < c->n);
    source *s = &c->src[c->used++];
    *s = (source){.c = c, .layer = layer, .v = v, .offset = offset};
    wt->f32 = NULL;
    wt->fill = fill;
    wt->fill_ctx = s;
}

void mt_ckpt_disk_free(mt_ckpt_disk *c) {
    if (!c) return;
    free(c->m);
    free(c->v);
    free(c->src);
    free(c);
}
