/* The host memory of a training run, computed from its options before
 * anything is allocated, and the refusal of a run that would not fit:
 * a user's size is answered with the numbers and a fix, never an abort. */
#ifndef MT_TRAIN_TRAIN_MEMORY_H
#define MT_TRAIN_TRAIN_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/train_config.h"
#include "model/config.h"
#include "model/params.h"
#include "util/error.h"

/* Bytes of built-in text the trainer samples rows from when given no data. */
#define MT_BUILTIN_TEXT_BYTES ((size_t)1 << 20)

typedef struct mt_train_host_bytes {
    size_t store;   /* w, m, v (and g when the store holds gradients) */
    size_t acts;    /* the CPU backend's buffers; 0 on the GPU (it plans its own) */
    size_t batch;   /* token and target buffers of one step, and the packer's row */
    size_t data;    /* an estimate: the JSONL text and its token ids; 0 for .mtok (mapped);
                       compressed files count what they decompress to */
    bool data_partial; /* data is a lower bound: its count stopped past what was available */
    size_t total;
} mt_train_host_bytes;

/* The layers whose m and v a run keeps on disk, the last ones (the
 * optimizer updates them last, so the next forward needs them last):
 * tc->disk_layers when set; when -1 (its choice) the fewest with which its
 * host bytes fit in `available` (all of them when none does: the memory
 * check then says so); 0 without nvme_dir. */
int mt_train_disk_layers_needed(const mt_train_config *tc, const mt_config *cfg,
                                const mt_param_table *t, int store_grads, int cpu,
                                size_t available);

/* Fills *b for the run tc of the model (cfg, t); store_grads and cpu say
 * whether the store holds gradients and whether the CPU backend computes.
 * -1 when a size does not fit in 64 bits (err says which option). */
int mt_train_host_bytes_compute(const mt_train_config *tc, const mt_config *cfg,
                                const mt_param_table *t, int store_grads, int cpu,
                                mt_train_host_bytes *b, mt_error *err);

/* Refuses (-1, err with every number, the available RAM and the largest
 * --batch-size or --seq-len that fits) when the run needs more than
 * `available` bytes or than host_mem (the --host-mem budget, 0: none),
 * whichever is smaller, naming which; both 0 check only for overflow. */
int mt_train_check_host_memory(const mt_train_config *tc, const mt_config *cfg,
                               const mt_param_table *t, int store_grads, int cpu,
                               size_t available, size_t host_mem, mt_error *err);

#endif
