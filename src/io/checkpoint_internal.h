/* Directory helpers shared by checkpoint.c and checkpoint_dir.c; not a
 * public interface. */
#ifndef MT_IO_CHECKPOINT_INTERNAL_H
#define MT_IO_CHECKPOINT_INTERNAL_H

#include "util/error.h"

/* Removes path and everything below it, never following symlinks.
 * Best effort: returns -1 if anything stayed. */
int mt_ckpt_rmtree(const char *path);

/* Moves the finished tmp directory to final. If final exists (the same
 * step saved again) the two are swapped atomically and the old one
 * removed, so that final always names a complete checkpoint. */
int mt_ckpt_publish(const char *tmp, const char *final, mt_error *err);

#endif
