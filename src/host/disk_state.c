/* The optimizer state of disk layers (see disk_state.h): a ring of staging
 * buffers over the disk tier, reads ahead of the updates, writes behind. */
#include "host/disk_state.h"

#include <stdlib.h>
#include <string.h>

#include "host/disk.h"
#include "host/store.h"
#include "util/mem.h"

enum { FREE, READING, READY, WRITING };

typedef struct buf {
    float *p;         /* [m | v] of `layer` */
    int layer;        /* -1: none */
    int phase;
    int ticket;
} buf;

struct mt_disk_state {
    const mt_param_table *t;
    uint8_t *on_disk;  /* (n_layers) */
    int *block;        /* (n_layers) the layer's block in the tier, -1 */
    int n_disk;
    mt_disk *disk;
    buf *bufs;
    int n_bufs;
    size_t buf_bytes;
    int failed;
    mt_error err;
};

static size_t block_bytes(const mt_param_table *t, int l) {
    return 2 * t->layers[l].numel * sizeof(float);
}

void mt_disk_tier_sizes(const mt_param_table *t, int n, double *disk_bytes, double *ram_freed) {
    double disk = 0, most = 0;
    for (int l = t->n_layers - n; l < t->n_layers; l++) {
        disk += (double)block_bytes(t, l);
        if ((double)block_bytes(t, l) > most) most = (double)block_bytes(t, l);
    }
    *disk_bytes = disk;
    *ram_freed = disk - MT_DISK_STAGING_BUFFERS * most;
}

int mt_disk_store_create(mt_host_store *s, const mt_param_table *t, int grads, int n,
                         const char *dirs, mt_error *err) {
    memset(s, 0, sizeof *s);
    if (n <= 0) return mt_host_store_create(s, t, grads, err);
    uint8_t *on_disk = mt_calloc_or_die((size_t)t->n_layers, 1);
    for (int l = n < t->n_layers ? t->n_layers - n : 0; l < t->n_layers; l++) on_disk[l] = 1;
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
        ds->on_disk[l] = on_disk[l] != 0;
        ds->block[l] = on_disk[l] ? ds->n_disk++ : -1;
        if (on_disk[l]) bytes[ds->block[l]] = block_bytes(t, l);
        if (on_disk[l] && block_bytes(t, l) > ds->buf_bytes) ds->buf_bytes = block_bytes(t, l);
    }
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
    free(ds);
}

int mt_disk_state_on_disk(const mt_disk_state *ds, int layer) {
    return ds && ds->on_disk[layer];
}

int mt_disk_state_layers(const mt_disk_state *ds) { return ds ? ds->n_disk : 0; }
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

void mt_disk_state_get(mt_disk_state *ds, int layer, float **m, float **v) {
    *m = *v = NULL;
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
    *m = b->p;
    *v = b->p + ds->t->layers[layer].numel;
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

/* Buffer 0, emptied of everything: whole-layer transfers go through it. */
static buf *scratch(mt_disk_state *ds) {
    mt_disk_state_drain(ds);
    for (int i = 0; i < ds->n_bufs; i++) ds->bufs[i].layer = -1, ds->bufs[i].phase = FREE;
    return &ds->bufs[0];
}

int mt_disk_state_read(mt_disk_state *ds, int layer, float *m, float *v, mt_error *err) {
    MT_ASSERT(ds->on_disk[layer]);
    buf *b = scratch(ds);
    start(ds, b, layer, 0);
    finish(ds, b);
    if (mt_disk_state_error(ds, err)) return -1;
    size_t n = ds->t->layers[layer].numel;
    memcpy(m, b->p, n * sizeof(float));
    memcpy(v, b->p + n, n * sizeof(float));
    b->layer = -1, b->phase = FREE;
    return 0;
}

int mt_disk_state_write(mt_disk_state *ds, int layer, const float *m, const float *v,
                        mt_error *err) {
    MT_ASSERT(ds->on_disk[layer]);
    buf *b = scratch(ds);
    size_t n = ds->t->layers[layer].numel;
    memcpy(b->p, m, n * sizeof(float));
    memcpy(b->p + n, v, n * sizeof(float));
    start(ds, b, layer, 1);
    finish(ds, b);
    return mt_disk_state_error(ds, err);
}
