/* What checkpoint.c (save), checkpoint_load.c (load, verify) and
 * checkpoint_dir.c (listing, pruning) share; not a public interface. */
#ifndef MT_IO_CHECKPOINT_INTERNAL_H
#define MT_IO_CHECKPOINT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/checkpoint.h"
#include "model/config.h"
#include "model/params.h"
#include "util/error.h"

/* ck/step-<8 digits>, and the temporary directory a save or a removal of
 * that step by this process uses, ck/.tmp-step-<8 digits>-<pid> (malloc'd). */
char *mt_ckpt_step_path(const char *ck, int64_t step);
char *mt_ckpt_tmp_path(const char *ck, int64_t step);

/* Moves the finished tmp directory to final. If final exists (the same
 * step saved again) the two are swapped atomically and the old one
 * removed, so that final always names a complete checkpoint. */
int mt_ckpt_publish(const char *tmp, const char *final, mt_error *err);

/* A save's temporary directory tmp inside ck (both made as needed), empty:
 * one left by an earlier failed attempt of this process is removed. */
int mt_ckpt_make_tmp(const char *ck, const char *tmp, mt_error *err);

/* The end of a save whose files are all written and synced in tmp: tmp
 * published as final (mt_ckpt_publish), ck synced, then the checkpoints in
 * out_dir beyond keep_last pruned (a failed prune only warns). */
int mt_ckpt_commit(const char *ck, const char *tmp, const char *final, const char *out_dir,
                   int keep_last, mt_error *err);

/* How a save ends, whichever way it went (rc). On success: final's path in
 * saved_path (cap; NULL: not wanted). On failure: tmp removed when
 * remove_tmp (this process made it), err prefixed with what was saved
 * ("checkpoint", "sharded checkpoint"), its step and ck. Frees ck, final and
 * tmp; returns rc. */
int mt_ckpt_save_end(int rc, bool remove_tmp, const char *what, int64_t step, char *ck,
                     char *final, char *tmp, char *saved_path, size_t cap, mt_error *err);

/* The first field in which config a (read from path) differs from b, as an
 * error naming it and both values; 0 when equal. */
int mt_ckpt_compare_configs(const mt_config *a, const mt_config *b, const char *path,
                            mt_error *err);

/* Reads dir/trainer_state.json of a checkpoint of `step` and returns the
 * trainer's object as saved (malloc'd). */
int mt_ckpt_load_state(const char *dir, int64_t step, char **out, mt_error *err);

/* Writes text to dir/name atomically (temporary name, fsync, rename). */
int mt_ckpt_write_text(const char *dir, const char *name, const char *text, mt_error *err);

/* -1 unless state_json is one JSON object (a bug in the caller). */
int mt_ckpt_check_state_json(const char *state_json, mt_error *err);
/* dir/trainer_state.json: the prefix of step, the caller's object verbatim,
 * STATE_SUFFIX (see mt_ckpt_state_prefix). */
int mt_ckpt_write_state(const char *dir, int64_t step, const char *state_json, mt_error *err);

/* Adds dir/name's size to files and its XXH3-64 (hex) to sums, the two
 * objects of a COMPLETE marker. */
struct cJSON;
int mt_ckpt_record_file(const char *dir, const char *name, struct cJSON *files,
                        struct cJSON *sums, mt_error *err);

/* A COMPLETE marker being built: {"format", "step", "ranks" (a sharded
 * checkpoint's, when ranks > 0), "files": {name: bytes}, "xxh3_64": {name:
 * hex}}. Begin it, add each file with mt_ckpt_record_file(dir, name,
 * mk.files, mk.sums, err), then mt_ckpt_complete_write: dir/COMPLETE
 * written unless rc (the adds' status) is not 0; frees the marker either
 * way and returns the first failure. */
typedef struct mt_ckpt_complete {
    struct cJSON *root, *files, *sums;
} mt_ckpt_complete;
mt_ckpt_complete mt_ckpt_complete_begin(int64_t step, int ranks);
int mt_ckpt_complete_write(mt_ckpt_complete *mk, const char *dir, int rc, mt_error *err);

/* The files of a checkpoint, in the order they are written; COMPLETE last. */
#define N_CKPT_FILES 4
static inline const char *mt_ckpt_file(int i) {
    static const char *const files[N_CKPT_FILES] = {"config.json", "model.safetensors",
                                                    "optimizer.safetensors",
                                                    "trainer_state.json"};
    return files[i];
}

/* trainer_state.json is this prefix, the caller's object verbatim, then
 * STATE_SUFFIX: verbatim so that 64-bit integers (RNG states, data
 * positions) survive, which a parse-and-print through doubles would not. */
static inline void mt_ckpt_state_prefix(char *buf, size_t cap, int64_t step) {
    snprintf(buf, cap, "{\n  \"format\": \"%s\",\n  \"layout_version\": %d,\n  \"step\": %lld,\n"
             "  \"trainer\": ", MT_CHECKPOINT_FORMAT, MT_CHECKPOINT_LAYOUT_VERSION,
             (long long)step);
}
#define STATE_SUFFIX "\n}\n"

/* Tensors of the parameter table (one safetensors tensor each). */
static inline int mt_ckpt_count_tensors(const mt_param_table *t) {
    int n = 0;
    for (int l = 0; l < t->n_layers; l++) n += t->layers[l].n_tensors;
    return n;
}

#endif
