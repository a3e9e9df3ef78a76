/* The state of the layers a run keeps on disk (host/disk_state.h): the
 * Adam m and v, or the fp32 weights, as tensors a checkpoint's or a
 * model's safetensors writer fills (io/safetensors.h): read from the disk
 * through a cache of one layer, so a writer that lists a layer's tensors
 * together reads each layer's block once per array. */
#ifndef MT_IO_CKPT_DISK_H
#define MT_IO_CKPT_DISK_H

#include <stddef.h>

#include "io/safetensors.h"

struct mt_disk_state;
typedef struct mt_ckpt_disk mt_ckpt_disk;

/* The arrays of a layer's state (numbered as sources name them). */
enum { MT_CKPT_W = 0, MT_CKPT_M = 1, MT_CKPT_V = 2 };

/* Sources for up to n tensors of the disk layers of ds: of their weights
 * (weights set; the layers whose weights are on disk) or of their m and v.
 * Each writer thread has its own. */
mt_ckpt_disk *mt_ckpt_disk_new(struct mt_disk_state *ds, int n, int weights);

/* Makes wt fill itself from layer's `array` (MT_CKPT_*), from `offset`
 * floats into the layer on. */
void mt_ckpt_disk_source(mt_ckpt_disk *c, mt_st_write_tensor *wt, int layer, int array,
                         size_t offset);

/* Whether c (made with weights) is where layer's weights are read. */
int mt_ckpt_disk_has_weights(const mt_ckpt_disk *c, int layer);

/* count floats of layer's `array` from `offset` on into dst (a filler that
 * gathers a tensor from parts: io/model_io.c). 0, or -1 with the disk's
 * failure. */
int mt_ckpt_disk_copy(mt_ckpt_disk *c, int layer, int array, size_t offset, size_t count,
                      float *dst, mt_error *err);

void mt_ckpt_disk_free(mt_ckpt_disk *c);

#endif
