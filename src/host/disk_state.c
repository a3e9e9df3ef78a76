/* The optimizer state of disk layers (see disk_state.h): a ring of staging
 * buffers over the disk tier, reads ahead of the updates, writes behind. */
#include "host/disk_state.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "host/disk.h"
#include "host/store.h"
#include "util/mem.h"

enum { FREE, READING, READY, WRITING };

typedef struct buf {
    float *p;         /* the block of `layer`: [m | v], or [w | m | v] */
    int layer;        /* -1: none */
    int phase;
    int ticket;
} buf;

struct mt_disk_state {
    const mt_param_table *t;
    uint8_t *on_disk;  /* (n_layers) MT_HOME_* */
    int *block;        /* (n_layers) the layer's block in the tier, -1 */
    int n_disk, n_weights;
    mt_disk *disk;
    buf *bufs;
    int n_bufs;
    size_t buf_bytes;
    int failed;
    mt_error err;
    pthread_mutex_t whole;  /* whole-layer access (checkpoints' writers, two threads) */
};

/* Floats of layer l's block: [m | v], or [w | m | v] when its weights are
 * on disk too. */
static size_t block_floats(const mt_param_table *t, int l, int home) {
    return (home == MT_HOME_DISK_WEIGHTS ? 3 : 2) * t->layers[l].numel;
}

/* Bytes of RAM the bf16 copy and the exact tensors of layer l take. */
static double copy_bytes(const mt_param_table *t, int l) {
    const mt_layer_desc *ld = &t->layers[l];
    double bytes = (double)ld->numel * sizeof(uint16_t);
    for (int k = 0; k < ld->n_tensors; k++)
        if (mt_tensor_read_fp32(&ld->tensors[k])) bytes += (double)ld->tensors[k].numel * 4;
    return bytes;
}

/* The homes of the last n layers' m and v on disk and the last nw of
 * them their weights too (home[l]: MT_HOME_*). */
static uint8_t *last_layers_home(const mt_param_table *t, int n, int nw) {
    uint8_t *home = mt_calloc_or_die((size_t)t->n_layers, 1);
    for (int l = n < t->n_layers ? t->n_layers - n : 0; l < t->n_layers; l++)
        home[l] = l >= t->n_layers - nw ? MT_HOME_DISK_WEIGHTS : MT_HOME_DISK_STATE;
    return home;
}

void mt_disk_tier_sizes(const mt_param_table *t, int n, int nw, double *disk_bytes,
                        double *ram_freed) {
    double disk = 0, most = 0, copies = 0;
    for (int l = t->n_layers - n; l < t->n_layers; l++) {
        int home = l >= t->n_layers - nw ? MT_HOME_DISK_WEIGHTS : MT_HOME_DISK_STATE;
        double b = (double)block_floats(t, l, home) * sizeof(float);
        disk += b;
        if (b > most) most = b;
        if (home == MT_HOME_DISK_WEIGHTS) copies += copy_bytes(t, l);
    }
    *disk_bytes = disk;
    *ram_freed = disk - copies - MT_DISK_STAGING_BUFFERS * most;
}

int mt_disk_store_create(mt_host_store *s, const mt_param_table *t, int grads, int n, int nw,
                         const char *dirs, mt_error *err) {
    memset(s, 0, sizeof *s);
    if (n <= 0) return mt_host_store_create(s, t, grads, err);
    uint8_t *on_disk = last_layers_home(t, n, nw);
    mt_disk_state *ds = NULL;
    int rc = mt_disk_state_open(&ds, t, on_disk, dirs, MT_DISK_STAGING_BUFFERS, err);
    if (rc == 0) rc = mt_host_store_create_tiered(s, t, grads, on_disk, err);
    free(on_disk);
    if (rc) {
        mt_disk_state_close(ds);
        return -1;
    }
    s->disk = ds;
    return 0;
}

int mt_disk_state_open(mt_disk_state **out, const mt_param_table *t, const uint8_t *on_disk,
                       const char *dirs, int buffers, mt_error *err) {
    *out = NULL;
    mt_disk_state *ds = mt_calloc_or_die(1, sizeof *ds);
    int nl = t->n_layers;
    ds->t = t;
    ds->on_disk = mt_calloc_or_die((size_t)nl, 1);
    ds->block = mt_calloc_or_die((size_t)nl, sizeof *ds->block);
    size_t *bytes = mt_calloc_or_die((size_t)nl, sizeof *bytes);
    for (int l = 0; l < nl; l++) {
        ds->on_disk[l] = on_disk[l];
        ds->block[l] = on_disk[l] ? ds->n_disk++ : -1;
        ds->n_weights += on_disk[l] == MT_HOME_DISK_WEIGHTS;
        if (!on_disk[l]) continue;
        bytes[ds->block[l]] = block_floats(t, l, on_disk[l]) * sizeof(float);
        if (bytes[ds->block[l]] > ds->buf_bytes) ds->buf_bytes = bytes[ds->block[l]];
    }
    pthread_mutex_init(&ds->whole, NULL);
    int rc = mt_disk_open(&ds->disk, dirs, bytes, ds->n_disk, err);
    free(bytes);
    if (rc) {
        mt_disk_state_close(ds);
        return -1;
    }
    ds->n_bufs = buffers < 2 ? 2 : buffers;
    ds->bufs = mt_calloc_or_die((size_t)ds->n_bufs, sizeof *ds->bufs);
    for (int i = 0; i < ds->n_bufs; i++) {
        ds->bufs[i].layer = -1;
        ds->bufs[i].p = ds->n_disk ? mt_disk_buffer(ds->buf_bytes) : NULL;
        if (ds->n_disk && !ds->bufs[i].p) {
            mt_disk_state_close(ds);
            return mt_errorf(err, "the disk tier's staging: cannot allocate %d buffers of %.2f GB",
                             buffers, ds->buf_bytes / 1e9);
        }
    }
    *out = ds;
    return 0;
}

void mt_disk_state_close(mt_disk_state *ds) {
    if (!ds) return;
    if (ds->disk) mt_disk_state_drain(ds);
    for (int i = 0; ds->bufs && i < ds->n_bufs; i++) free(ds->bufs[i].p);
    free(ds->bufs);
    mt_disk_close(ds->disk);
    free(ds->on_disk);
    free(ds->block);
    pthread_mutex_destroy(&ds->whole);
    free(ds);
}

int mt_disk_state_on_disk(const mt_disk_state *ds, int layer) {
    return ds && ds->on_disk[layer];
}

int mt_disk_state_weights_on_disk(const mt_disk_state *ds, int layer) {
    return ds && ds->on_disk[layer] == MT_HOME_DISK_WEIGHTS;
}

int mt_disk_state_layers(const mt_disk_state *ds) { return ds ? ds->n_disk : 0; }
int mt_disk_state_weight_layers(const mt_disk_state *ds) { return ds ? ds->n_weights : 0; }
double mt_disk_state_disk_bytes(const mt_disk_state *ds) {
    return ds ? (double)mt_disk_total_bytes(ds->disk) : 0;
}
double mt_disk_state_ram_bytes(const mt_disk_state *ds) {
    return ds ? (double)ds->buf_bytes * ds->n_bufs : 0;
}

size_t mt_disk_state_max_numel(const mt_disk_state *ds) {
    size_t most = 0;
    for (int l = 0; ds && l < ds->t->n_layers; l++)
        if (ds->on_disk[l] && ds->t->layers[l].numel > most) most = ds->t->layers[l].numel;
    return most;
}

/* Records the first failure. */
static void fail(mt_disk_state *ds, const mt_error *e) {
    if (!ds->failed) ds->err = *e;
    ds->failed = 1;
}

/* Ends b's transfer (blocking): a read makes it ready, a write frees it. */
static void finish(mt_disk_state *ds, buf *b) {
    if (b->phase != READING && b->phase != WRITING) return;
    mt_error e;
    if (mt_disk_wait(ds->disk, b->ticket, &e)) {
        fail(ds, &e);
        b->layer = -1;
        b->phase = FREE;
        return;
    }
    if (b->phase == WRITING) b->layer = -1;
    b->phase = b->phase == READING ? READY : FREE;
}

static void start(mt_disk_state *ds, buf *b, int layer, int write) {
    mt_error e;
    int tk = mt_disk_submit(ds->disk, ds->block[layer], b->p, write, &e);
    if (tk < 0) {
        fail(ds, &e);
        return;
    }
    b->layer = layer;
    b->ticket = tk;
    b->phase = write ? WRITING : READING;
}

/* A buffer for a new read: a free one, else one whose write is done (if
 * wait, the oldest write waited for), else NULL. */
static buf *free_buffer(mt_disk_state *ds, int wait) {
    for (int i = 0; i < ds->n_bufs; i++)
        if (ds->bufs[i].phase == FREE) return &ds->bufs[i];
    for (int i = 0; i < ds->n_bufs; i++) {
        buf *b = &ds->bufs[i];
        if (b->phase == WRITING && (wait || mt_disk_done(ds->disk, b->ticket))) {
            finish(ds, b);
            return b;
        }
    }
    return NULL;
}

static buf *holding(mt_disk_state *ds, int layer) {
    for (int i = 0; i < ds->n_bufs; i++)
        if (ds->bufs[i].layer == layer && ds->bufs[i].phase != WRITING) return &ds->bufs[i];
    return NULL;
}

/* Lands layer's write back if it is done, or with wait when it is; 1 if
 * it is still on its way (a read now could overtake it). */
static int write_pending(mt_disk_state *ds, int layer, int wait) {
    for (int i = 0; i < ds->n_bufs; i++) {
        buf *b = &ds->bufs[i];
        if (b->layer != layer || b->phase != WRITING) continue;
        if (!wait && !mt_disk_done(ds->disk, b->ticket)) return 1;
        finish(ds, b);
    }
    return 0;
}

/* Starts reading the disk layers after `layer` (in the optimizer's order,
 * round to the next step's first) into buffers free now, up to the first
 * whose write back is still on its way (its get waits for the write). */
static void read_ahead(mt_disk_state *ds, int layer) {
    int nl = ds->t->n_layers;
    for (int k = 1; k < nl; k++) {
        int l = (layer + k) % nl;
        if (!ds->on_disk[l] || holding(ds, l)) continue;
        if (write_pending(ds, l, 0)) return;
        buf *b = free_buffer(ds, 0);
        if (!b) return;
        start(ds, b, l, 0);
    }
}

/* Layer l's w (NULL when in RAM), m and v in its block p. */
static void parts(const mt_disk_state *ds, int l, float *p, float **w, float **m, float **v) {
    size_t n = ds->t->layers[l].numel;
    int with_w = ds->on_disk[l] == MT_HOME_DISK_WEIGHTS;
    *w = with_w ? p : NULL;
    *m = p + (with_w ? n : 0);
    *v = *m + n;
}

void mt_disk_state_get(mt_disk_state *ds, int layer, float **w, float **m, float **v) {
    *w = *m = *v = NULL;
    buf *b = holding(ds, layer);
    if (!b) {
        write_pending(ds, layer, 1); /* a write of this layer lands first */
        b = free_buffer(ds, 1);
        if (!b) { /* every buffer holds a layer read ahead: this one comes first */
            b = &ds->bufs[0];
            finish(ds, b);
            b->layer = -1;
            b->phase = FREE;
        }
        start(ds, b, layer, 0);
    }
    finish(ds, b);
    if (ds->failed || b->phase != READY) return;
    read_ahead(ds, layer);
    parts(ds, layer, b->p, w, m, v);
}

void mt_disk_state_put(mt_disk_state *ds, int layer) {
    buf *b = holding(ds, layer);
    MT_ASSERT(b && b->phase == READY);
    start(ds, b, layer, 1);
}

void mt_disk_state_prefetch(mt_disk_state *ds) {
    if (ds && ds->n_disk && !ds->failed) read_ahead(ds, ds->t->n_layers - 1);
}

void mt_disk_state_drain(mt_disk_state *ds) {
    for (int i = 0; i < ds->n_bufs; i++) finish(ds, &ds->bufs[i]);
}

int mt_disk_state_error(mt_disk_state *ds, mt_error *err) {
    if (!ds || !ds->failed) return 0;
    *err = ds->err;
    return -1;
}

/* Buffer 0, emptied of everything: whole-layer transfers go through it
 * (under ds->whole). */
static buf *scratch(mt_disk_state *ds) {
    mt_disk_state_drain(ds);
    for (int i = 0; i < ds->n_bufs; i++) ds->bufs[i].layer = -1, ds->bufs[i].phase = FREE;
    return &ds->bufs[0];
}

/* Copies n floats from src to dst, or zeros where src is NULL. */
static void copy_or_zero(float *dst, const float *src, size_t n) {
    if (src) memcpy(dst, src, n * sizeof(float));
    else memset(dst, 0, n * sizeof(float));
}

int mt_disk_state_read(mt_disk_state *ds, int layer, float *w, float *m, float *v,
                       mt_error *err) {
    MT_ASSERT(ds->on_disk[layer]);
    pthread_mutex_lock(&ds->whole);
    buf *b = scratch(ds);
    start(ds, b, layer, 0);
    finish(ds, b);
    int rc = mt_disk_state_error(ds, err);
    size_t n = ds->t->layers[layer].numel;
    float *bw, *bm, *bv;
    parts(ds, layer, b->p, &bw, &bm, &bv);
    if (rc == 0 && w && bw) memcpy(w, bw, n * sizeof(float));
    if (rc == 0 && m) memcpy(m, bm, n * sizeof(float));
    if (rc == 0 && v) memcpy(v, bv, n * sizeof(float));
    b->layer = -1, b->phase = FREE;
    pthread_mutex_unlock(&ds->whole);
    return rc;
}

int mt_disk_state_write(mt_disk_state *ds, int layer, const float *w, const float *m,
                        const float *v, mt_error *err) {
    MT_ASSERT(ds->on_disk[layer]);
    pthread_mutex_lock(&ds->whole);
    buf *b = scratch(ds);
    size_t n = ds->t->layers[layer].numel;
    float *bw, *bm, *bv;
    parts(ds, layer, b->p, &bw, &bm, &bv);
    MT_ASSERT(!bw || w);
    if (bw) memcpy(bw, w, n * sizeof(float));
    copy_or_zero(bm, m, n);
    copy_or_zero(bv, v, n);
    start(ds, b, layer, 1);
    finish(ds, b);
    pthread_mutex_unlock(&ds->whole);
    return mt_disk_state_error(ds, err);
}

int mt_disk_layer_write(mt_host_store *s, int l, const float *w, const float *m,
                        const float *v, mt_error *err) {
    const mt_layer_desc *ld = &s->table->layers[l];
    size_t bytes = ld->numel * sizeof(float);
    int away_w = mt_disk_state_weights_on_disk(s->disk, l);
    MT_ASSERT(w || !away_w);
    if (away_w) mt_host_store_set_copy(s, l, w);
    else if (w) memcpy(mt_store_layer(s->w, s->table, l), w, bytes);
    if (mt_disk_state_on_disk(s->disk, l))
        return mt_disk_state_write(s->disk, l, away_w ? w : NULL, m, v, err);
    copy_or_zero(mt_store_layer(s->m, s->table, l), m, ld->numel);
    copy_or_zero(mt_store_layer(s->v, s->table, l), v, ld->numel);
    return 0;
}

int mt_disk_store_init_random(mt_host_store *s, uint64_t seed, float std, mt_error *err) {
    const mt_param_table *t = s->table;
    float *layer = mt_calloc_or_die(t->max_layer_numel + 1, sizeof(float));
    int rc = 0;
    for (int l = 0; l < t->n_layers && rc == 0; l++) {
        int away = mt_disk_state_weights_on_disk(s->disk, l);
        if (away) memset(layer, 0, t->layers[l].numel * sizeof(float)); /* the padding: 0 */
        mt_host_store_random_range(t, l, 0, t->layers[l].numel, seed, std,
                                   away ? layer : mt_store_layer(s->w, t, l));
        if (away) rc = mt_disk_layer_write(s, l, layer, NULL, NULL, err);
    }
    free(layer);
    return rc;
}

int mt_disk_layer_read(const mt_host_store *s, int l, float *w, float *m, float *v,
                       mt_error *err) {
    const mt_layer_desc *ld = &s->table->layers[l];
    size_t bytes = ld->numel * sizeof(float);
    int away_w = mt_disk_state_weights_on_disk(s->disk, l);
    if (w && !away_w) memcpy(w, mt_store_layer(s->w, s->table, l), bytes);
    if (mt_disk_state_on_disk(s->disk, l))
        return mt_disk_state_read(s->disk, l, w, m, v, err);
    if (m) memcpy(m, mt_store_layer(s->m, s->table, l), bytes);
    if (v) memcpy(v, mt_store_layer(s->v, s->table, l), bytes);
    return 0;
}
