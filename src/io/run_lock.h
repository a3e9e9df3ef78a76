/* The run-directory lock: one process at a time writes a run's --out
 * directory (metrics.jsonl, checkpoints/, model/).
 *
 * The lock is an advisory flock(2) on <out>/.megatrain.lock, which also
 * holds the owner's pid and command for the message a second process gets.
 * The kernel drops the lock when its process dies however it dies (kill -9
 * included), so a lock file left behind never blocks anyone: only a live
 * holder does. flock locks belong to the open file, so a second acquire in
 * the same process is refused too, and the lock is not inherited by
 * programs exec'd later (the descriptor is close-on-exec). Local file
 * systems only: on NFS, flock may be emulated or not shared between hosts. */
#ifndef MT_IO_RUN_LOCK_H
#define MT_IO_RUN_LOCK_H

#include "util/error.h"

#define MT_RUN_LOCK_FILE ".megatrain.lock"

typedef struct mt_run_lock {
    int fd;   /* -1 when not held */
} mt_run_lock;

/* Creates out_dir if needed and takes its lock without waiting; `what`
 * (e.g. "megatrain train") is recorded for others' messages. When another
 * live process holds it, returns -1 with a message naming out_dir, that
 * process's pid and command, and what to do. */
int mt_run_lock_acquire(mt_run_lock *l, const char *out_dir, const char *what, mt_error *err);

/* Releases the lock (the file stays; it is harmless). No-op if not held. */
void mt_run_lock_release(mt_run_lock *l);

#endif
