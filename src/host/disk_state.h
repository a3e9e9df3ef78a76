/* The optimizer state (Adam m and v, and where RAM is shorter still the
 * fp32 weights) of the layers that live on disk (host/disk.h) rather than
 * in the host store, as the optimizer and the checkpoints ask for it.
 *
 * Layer l's block on disk is [m | v], or [w | m | v] when its weights are
 * there too (the store then keeps a bf16 copy of them for the GPU, and the
 * tensors the GPU reads in fp32 exact: host/store.h), each laid out as the
 * layer's range of the store (numel floats). The optimizer updates layers in order 0, 1, ...
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

#include "host/store.h"
#include "model/params.h"
#include "util/error.h"

typedef struct mt_disk_state mt_disk_state;

/* Staging buffers a training run opens the disk state with. */
#define MT_DISK_STAGING_BUFFERS 3

/* Sizes of the disk tier when the last n layers of t keep their m and v
 * there (the optimizer updates them last, so the next forward needs them
 * last), and the last nw <= n of them their fp32 weights too: the bytes on
 * disk, and the bytes of RAM that frees less the bf16 copies and the
 * staging buffers (which can exceed it: then negative). */
void mt_disk_tier_sizes(const mt_param_table *t, int n, int nw, double *disk_bytes,
                        double *ram_freed);

/* A host store (host/store.h) whose last n layers keep their m and v on
 * disk in dirs, and the last nw <= n of them their fp32 weights, with
 * MT_DISK_STAGING_BUFFERS staging buffers; n = 0: all in RAM. The disk
 * starts as zeros: the weights of its layers are written with
 * mt_disk_layer_write. Its owner closes s->disk (mt_disk_state_close,
 * once the optimizer is done with it) before mt_host_store_free. */
int mt_disk_store_create(mt_host_store *s, const mt_param_table *t, int grads, int n, int nw,
                         const char *dirs, mt_error *err);

/* Places the state of the layers with on_disk[l] set (MT_HOME_DISK_STATE:
 * m and v; MT_HOME_DISK_WEIGHTS: w, m and v) in files on dirs
 * (comma-separated, striped), with `buffers` (>= 2) staging buffers of the
 * largest such block. The disk starts as zeros (a fresh optimizer).
 * -1 with a message when a directory cannot hold its share. */
int mt_disk_state_open(mt_disk_state **out, const mt_param_table *t, const uint8_t *on_disk,
                       const char *dirs, int buffers, mt_error *err);
void mt_disk_state_close(mt_disk_state *ds);

/* Whether layer l's m and v are on disk (ds NULL: no); its weights too. */
int mt_disk_state_on_disk(const mt_disk_state *ds, int layer);
int mt_disk_state_weights_on_disk(const mt_disk_state *ds, int layer);
/* Layers on disk (those with their weights), bytes on disk, and bytes of
 * RAM the staging takes. */
int mt_disk_state_layers(const mt_disk_state *ds);
int mt_disk_state_weight_layers(const mt_disk_state *ds);
double mt_disk_state_disk_bytes(const mt_disk_state *ds);
double mt_disk_state_ram_bytes(const mt_disk_state *ds);
/* Floats of m (and of v) in the largest disk layer; 0 for none. */
size_t mt_disk_state_max_numel(const mt_disk_state *ds);

/* The optimizer's use (one thread at a time): layer l's w (NULL when its
 * weights are in the store), m and v in RAM until put, which writes back
 * all three. On failure *m and *v are NULL and the error is recorded. */
void mt_disk_state_get(mt_disk_state *ds, int layer, float **w, float **m, float **v);
void mt_disk_state_put(mt_disk_state *ds, int layer);

/* Starts reading the first disk layers into the staging buffers free now
 * (a step's updates begin: their reads overlap the RAM layers' updates). */
void mt_disk_state_prefetch(mt_disk_state *ds);

/* Waits for every transfer: the disk holds the latest state. */
void mt_disk_state_drain(mt_disk_state *ds);

/* 0, or -1 with the first disk failure's message (naming the file). */
int mt_disk_state_error(mt_disk_state *ds, mt_error *err);

/* Whole-layer access beside the optimizer (checkpoints, a resume; from
 * two threads at once too, one transfer at a time): layer l's w, m and v
 * (numel floats each) from the disk, or to it. Drains first. read: a NULL
 * one, and w when the weights are not on disk, is not read. write: w is
 * needed when the weights are on disk (else not written); m or v NULL
 * write zeros (a fresh optimizer's). */
int mt_disk_state_read(mt_disk_state *ds, int layer, float *w, float *m, float *v,
                       mt_error *err);
int mt_disk_state_write(mt_disk_state *ds, int layer, const float *w, const float *m,
                        const float *v, mt_error *err);

/* Layer l of a store s (with or without a disk tier), wherever each part
 * lives. write: w, m and v (numel floats; m or v NULL: zeros; w NULL: the
 * weights unchanged, where they are not on disk) into the
 * store or the disk; a layer whose weights are on disk gets its bf16 copy
 * and exact tensors (mt_host_store_set_copy) from w. read: into w, m, v
 * (any of them NULL: not read). 0, or -1 with the disk's failure. */
int mt_disk_layer_write(mt_host_store *s, int l, const float *w, const float *m,
                        const float *v, mt_error *err);
int mt_disk_layer_read(const mt_host_store *s, int l, float *w, float *m, float *v,
                       mt_error *err);

/* mt_host_store_init_random of a store with a disk tier: the layers whose
 * weights are on disk made a layer at a time and written there (with a
 * fresh optimizer's m and v). */
int mt_disk_store_init_random(mt_host_store *s, uint64_t seed, float std, mt_error *err);

#endif
