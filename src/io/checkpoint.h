/* Resume checkpoints: everything needed to continue a run exactly where it
 * stopped (fp32 master weights, Adam m and v, the trainer's own state),
 * written so that a crash at any moment never destroys the last good one.
 *
 * Layout (docs/checkpoints.md):
 *   <out>/checkpoints/step-%08lld/
 *       config.json            the model config (a Hugging Face config)
 *       model.safetensors      fp32 weights under HF names: the directory is
 *                              also a model transformers can load
 *       optimizer.safetensors  "exp_avg.<hf name>" (m), "exp_avg_sq.<hf name>" (v)
 *       trainer_state.json     {"format", "layout_version", "step", "trainer": <caller's object>}
 *       COMPLETE               written last: step, byte size and XXH3-64 of every file
 *
 * A save writes all of it into <out>/checkpoints/.tmp-step-<n>-<pid>/, fsyncs
 * each file and the directory, renames it to step-<n> and fsyncs the parent.
 * Only then are older checkpoints pruned (keep the newest K) together with
 * the .tmp-* directories of processes that no longer exist. Nothing whose
 * name does not match those two patterns is ever removed. */
#ifndef MT_IO_CHECKPOINT_H
#define MT_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "host/store.h"
#include "model/config.h"
#include "util/error.h"

#define MT_CHECKPOINT_FORMAT "megatrain-checkpoint"
#define MT_CHECKPOINT_LAYOUT_VERSION 1

/* Called after each file of a save is complete in the temporary directory
 * (file = "config.json", "model.safetensors", ...; tmp_dir = where it is).
 * Returning -1 (with err filled) aborts the save as a failed write would.
 * With parallel writes it runs on the writer threads. For tests and
 * progress display. */
typedef int (*mt_checkpoint_hook)(void *ctx, const char *tmp_dir, const char *file,
                                  mt_error *err);

typedef struct mt_checkpoint_opts {
    int keep_last;             /* keep the newest K complete checkpoints; <= 0 keeps all */
    int parallel;              /* write weights and optimizer state on two threads */
    mt_checkpoint_hook hook;   /* may be NULL */
    void *hook_ctx;
} mt_checkpoint_opts;

/* Saves step `step` of the model in s (described by cfg) with the trainer
 * state state_json (a JSON object, stored verbatim) under
 * out_dir/checkpoints/, creating directories as needed, then prunes. On
 * success the final directory is copied to saved_path (if not NULL). On
 * failure the temporary directory is removed, earlier checkpoints are
 * untouched, and err names the path and the system's reason. */
int mt_checkpoint_save_opts(const char *out_dir, int64_t step, const mt_host_store *s,
                            const mt_config *cfg, const char *state_json,
                            const mt_checkpoint_opts *opts, char *saved_path, size_t cap,
                            mt_error *err);

/* The same with default options (parallel writes) and keep_last. */
int mt_checkpoint_save(const char *out_dir, int64_t step, const mt_host_store *s,
                       const mt_config *cfg, const char *state_json, int keep_last,
                       char *saved_path, size_t cap, mt_error *err);

/* Resolves what a user passes to --resume: a checkpoint directory itself,
 * a checkpoints directory, or a run's out directory (then its checkpoints/).
 * Picks the complete checkpoint with the highest step; temporary and
 * incomplete directories are ignored. Fails with a message saying where it
 * looked when there is none. */
int mt_checkpoint_find_latest(const char *path, char *found, size_t cap, mt_error *err);

/* Loads ckpt_dir into s (w, m, v; g untouched). Checks the COMPLETE marker
 * and the file sizes and checksums it records (naming the file that
 * differs), that config.json equals cfg (naming the
 * first differing field), and that every tensor of s's table is present in
 * F32 with its shape and nothing else is. *state_json receives the caller's
 * object exactly as it was saved (malloc'd; free it). */
int mt_checkpoint_load(const char *ckpt_dir, mt_host_store *s, const mt_config *cfg,
                       char **state_json, mt_error *err);

/* The same, for a checkpoint mt_checkpoint_verify (or find_intact) has
 * just checked: the files are not hashed a second time. */
int mt_checkpoint_load_verified(const char *ckpt_dir, mt_host_store *s, const mt_config *cfg,
                                char **state_json, mt_error *err);

/* Checks ckpt_dir's COMPLETE marker and every file's size and checksum
 * (one full read of the checkpoint). -1 with a message naming the file. A
 * marker without checksums (an older megatrain's) is checked by sizes, with
 * a warning on stderr. */
int mt_checkpoint_verify(const char *ckpt_dir, mt_error *err);

/* Checks one file of ckpt_dir (a name of the layout above) against its
 * COMPLETE marker: its size and checksum. What a read of a checkpoint as a
 * model does (io/model_io.h: config.json, model.safetensors). */
int mt_checkpoint_verify_file(const char *ckpt_dir, const char *name, mt_error *err);

/* Like mt_checkpoint_find_latest, but verifies the candidates newest first
 * and returns the first intact one; each one skipped is reported on stderr
 * as a warning naming the damaged file. Fails when none is intact. */
int mt_checkpoint_find_intact(const char *path, char *found, size_t cap, mt_error *err);

/* Removes stale temporary directories and all but the newest keep_last
 * complete checkpoints in out_dir/checkpoints (what a save does at its end). */
int mt_checkpoint_prune(const char *out_dir, int keep_last, mt_error *err);

/* What a run does at its start, holding the run lock (io/run_lock.h): the
 * same as a prune, except that every .tmp-* directory of another pid is
 * removed (a save killed at any moment left it; with the lock held no one
 * else is writing), and step spare_step (the checkpoint being resumed
 * from; -1 for none) is kept even when it is older than the newest
 * keep_last. A kill between a save's rename and its prune leaves one
 * checkpoint too many: this is where it goes. */
int mt_checkpoint_cleanup(const char *out_dir, int keep_last, int64_t spare_step,
                          mt_error *err);

/* Removes every checkpoint and temporary save in out_dir/checkpoints, each
 * renamed to a temporary name before its files go (as a prune does), so
 * that a kill in the middle leaves no checkpoint with part of its files.
 * For a run that replaces an earlier one in the same directory (the
 * caller holds the run lock). Other entries of checkpoints/ stay. */
int mt_checkpoint_remove_all(const char *out_dir, mt_error *err);

#endif
