/* A run's out directory as the next run finds it. A run writes config.yaml,
 * metrics.jsonl, tensorboard/, checkpoints/ and model/ there (besides the
 * run lock of io/run_lock.h and the data files the Python package saves).
 * A second, new run in a directory that holds them would mix two runs: its
 * metrics after the old rows, the old run's checkpoints outliving its own
 * under keep_last and found by a later resume. So a new run is refused
 * there unless it resumes the run (--resume) or replaces it (--overwrite),
 * which removes those outputs first. */
#ifndef MT_IO_RUN_DIR_H
#define MT_IO_RUN_DIR_H

#include <stddef.h>

#include "util/error.h"

/* 0 when out_dir holds none of a run's outputs (or does not exist); else
 * -1 with a message naming out_dir, what it holds, and the ways on:
 * --resume auto, --overwrite, another --out. */
int mt_run_dir_check_new(const char *out_dir, mt_error *err);

/* -1 when path (an input of the run: `what` is its option, "model") lies in
 * an output that mt_run_dir_clear removes, naming both; 0 otherwise (also
 * when path does not exist). */
int mt_run_dir_check_input(const char *out_dir, const char *what, const char *path,
                           mt_error *err);

/* Removes a run's outputs from out_dir: the checkpoints first (so that a
 * kill part-way leaves nothing a resume would find), then the TensorBoard
 * event files, metrics.jsonl, config.yaml and model/. Anything else stays.
 * `removed` gets what was there ("checkpoints/, metrics.jsonl, ..."), ""
 * when nothing was. The caller holds the run lock. */
int mt_run_dir_clear(const char *out_dir, char *removed, size_t cap, mt_error *err);

#endif
