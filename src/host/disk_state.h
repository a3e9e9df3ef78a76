/* The optimizer state (Adam m and v) of the layers that live on disk
 * (host/disk.h) rather than in the host store, as the optimizer and the
 * checkpoints ask for it.
 *
 * Layer l's block on disk is [m | v], each laid out as the layer's range of
 * the store (numel floats). The optimizer updates layers in order 0, 1, ...
 * and for each disk layer calls get (which blocks until its block is in a
 * staging buffer, and starts reading the next disk layers into the free
 * buffers) and then put (which starts writing it back; the buffer is busy
 * until the write is done). So reads run ahead of the updates and writes
 * behind them, overlapped with the update of the layers between, and with
 * the GPU's next forward.
 *
 * A disk failure is recorded (the first one) and reported by
 * mt_disk_state_error: the run stops there, its last checkpoint intact. */
#ifndef MT_HOST_DISK_STATE_H
#define MT_HOST_DISK_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "model/params.h"
#include "util/error.h"

typedef struct mt_disk_state mt_disk_state;

/* Staging buffers a training run opens the disk state with. */
#define MT_DISK_STAGING_BUFFERS 3

/* Sizes of the disk tier when the last n layers of t keep their m and v
 * there (the optimizer updates them last, so the next forward needs them
 * last): the bytes on disk, and the bytes of RAM that frees less the
 * staging buffers (which can exceed it: then negative). */
void mt_disk_tier_sizes(const mt_param_table *t, int n, double *disk_bytes, double *ram_freed);

/* A host store (host/store.h) whose last n layers keep their m and v on
 * disk in dirs, with MT_DISK_STAGING_BUFFERS staging buffers; n = 0: all
 * in RAM. Its owner closes s->disk (mt_disk_state_close, once the
 * optimizer is done with it) before mt_host_store_free. */
struct mt_host_store;
int mt_disk_store_create(struct mt_host_store *s, const mt_param_table *t, int grads, int n,
                         const char *dirs, mt_error *err);

/* Places the m and v of the layers with on_disk[l] set in files on dirs
 * (comma-separated, striped), with `buffers` (>= 2) staging buffers of the
 * largest such layer. The disk starts as zeros (a fresh optimizer).
 * -1 with a message when a directory cannot hold its share. */
int mt_disk_state_open(mt_disk_state **out, const mt_param_table *t, const uint8_t *on_disk,
                       const char *dirs, int buffers, mt_error *err);
void mt_disk_state_close(mt_disk_state *ds);

int mt_disk_state_on_disk(const mt_disk_state *ds, int layer);
/* Layers on disk, bytes on disk, and bytes of RAM the staging takes. */
int mt_disk_state_layers(const mt_disk_state *ds);
double mt_disk_state_disk_bytes(const mt_disk_state *ds);
double mt_disk_state_ram_bytes(const mt_disk_state *ds);
/* Floats of m (and of v) in the largest disk layer; 0 for none. */
size_t mt_disk_state_max_numel(const mt_disk_state *ds);

/* The optimizer's use (one thread at a time): layer l's m and v in RAM
 * until put. On failure *m and *v are NULL and the error is recorded. */
void mt_disk_state_get(mt_disk_state *ds, int layer, float **m, float **v);
void mt_disk_state_put(mt_disk_state *ds, int layer);

/* Starts reading the first disk layers into the staging buffers free now
 * (a step's updates begin: their reads overlap the RAM layers' updates). */
void mt_disk_state_prefetch(mt_disk_state *ds);

/* Waits for every transfer: the disk holds the latest state. */
void mt_disk_state_drain(mt_disk_state *ds);

/* 0, or -1 with the first disk failure's message (naming the file). */
int mt_disk_state_error(mt_disk_state *ds, mt_error *err);

/* Whole-layer access beside the optimizer (checkpoints, a resume): layer
 * l's m and v (numel floats each) from the disk, or to it. Drains first. */
int mt_disk_state_read(mt_disk_state *ds, int layer, float *m, float *v, mt_error *err);
int mt_disk_state_write(mt_disk_state *ds, int layer, const float *m, const float *v,
                        mt_error *err);

#endif
