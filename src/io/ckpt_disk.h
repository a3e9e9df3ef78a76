/* The Adam m and v of the layers a run keeps on disk (host/disk_state.h),
 * as tensors a checkpoint's safetensors writer fills (io/safetensors.h):
 * read from the disk through a cache of one layer, so a writer that lists a
 * layer's tensors together reads each layer's block once per array. */
#ifndef MT_IO_CKPT_DISK_H
#define MT_IO_CKPT_DISK_H

#include <stddef.h>

#include "io/safetensors.h"

struct mt_disk_state;
typedef struct mt_ckpt_disk mt_ckpt_disk;

/* Sources for up to n tensors of the disk layers of ds. */
mt_ckpt_disk *mt_ckpt_disk_new(struct mt_disk_state *ds, int n);

/* Makes wt fill itself from layer's m (v = 0) or v (v = 1), from `offset`
 * floats into the layer on. */
void mt_ckpt_disk_source(mt_ckpt_disk *c, mt_st_write_tensor *wt, int layer, int v,
                         size_t offset);

void mt_ckpt_disk_free(mt_ckpt_disk *c);

#endif
