/* Checkpoints of a host store sharded over ranks (dist/shard.h): one
 * directory in the style of io/checkpoint.h, each rank writing its own
 * shard file and rank 0 the rest (docs/distributed.md):
 *
 *   <out>/checkpoints/step-%08lld/
 *       config.json                          rank 0: the model config
 *       trainer_state.json                   rank 0: as in io/checkpoint.h
 *       shard-00000-of-00002.safetensors     rank 0's parts: per layer l,
 *       shard-00001-of-00002.safetensors     1-D F32 tensors "w.<l>", "m.<l>", "v.<l>"
 *       COMPLETE                             rank 0, last: "ranks", sizes, XXH3-64s
 *
 * The save is atomic as a one-process save is: everything goes into
 * .tmp-step-<n>-<pid of rank 0>/ (each file through a temporary name,
 * fsync, rename); once every rank reports its file written, rank 0 writes
 * COMPLETE, fsyncs, renames the directory to step-<n> and prunes. Any
 * rank's failure removes the temporary directory and fails the save on
 * every rank with that rank's message. Every rank must see the same
 * out_dir (one machine, or a shared file system).
 *
 * A load re-shards: a checkpoint written by n ranks loads on any number of
 * ranks, each reading (and checksumming) only the shard files that overlap
 * its parts. */
#ifndef MT_DIST_SHARD_CKPT_H
#define MT_DIST_SHARD_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "dist/rendezvous.h"
#include "dist/shard.h"
#include "model/config.h"
#include "util/error.h"

/* Saves step `step` of s (this rank's share; s->layout's ranks must be g's
 * world) under out_dir/checkpoints/. Collective: every rank of g calls it.
 * state_json (a JSON object) is read on rank 0 only. On success every
 * rank gets the final directory in saved_path (if not NULL). */
int mt_shard_ckpt_save(mt_rdv *g, const char *out_dir, int64_t step, const mt_shard_store *s,
                       const mt_config *cfg, const char *state_json, int keep_last,
                       char *saved_path, size_t cap, mt_error *err);

/* Loads this rank's parts of w, m and v (g untouched) from the sharded
 * checkpoint ckpt_dir, whatever number of ranks wrote it. Checks COMPLETE,
 * the size and checksum of every file it reads, config.json against cfg
 * (naming the first differing field) and every tensor's shape.
 * *state_json (may be NULL) receives the trainer's object (malloc'd).
 * Not collective: each rank loads on its own. */
int mt_shard_ckpt_load(const char *ckpt_dir, mt_shard_store *s, const mt_config *cfg,
                       char **state_json, mt_error *err);

/* The same checkpoint read whole, a layer at a time, for a run of one
 * process (its store over t): sink receives layer l's w, m and v (numel
 * floats each, valid during the call), and a -1 from it stops the load.
 * Holds one layer of each in RAM beside the mapped files. */
typedef int (*mt_shard_layer_sink)(void *ctx, int layer, const float *w, const float *m,
                                   const float *v, mt_error *err);
int mt_shard_ckpt_load_layers(const char *ckpt_dir, const mt_param_table *t,
                              const mt_config *cfg, char **state_json, mt_shard_layer_sink sink,
                              void *ctx, mt_error *err);

/* How many ranks wrote the checkpoint ckpt_dir (its COMPLETE's "ranks"):
 * 0 for a checkpoint of one process, -1 with a message when the marker
 * cannot be read. */
int mt_shard_ckpt_ranks(const char *ckpt_dir, mt_error *err);

#endif
