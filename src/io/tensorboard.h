/* TensorBoard event files: scalars written as TensorBoard's own readers
 * expect them, with no TensorFlow.
 *
 * A file `events.out.tfevents.<unix time, 10 digits>.<host>` (".1", ".2"...
 * appended if that name exists) in a directory holds TFRecord records, each
 *     u64 length (little-endian), u32 masked CRC32C of those 8 bytes,
 *     length bytes of data, u32 masked CRC32C of the data,
 * where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 and CRC32C is the
 * Castagnoli CRC (ISA-L's crc32_iscsi). Each record is a serialized
 * tensorboard.Event (src/io/tensorboard.proto, encoded with protobuf-c):
 * first {wall_time, file_version "brain.Event:2"}, then one Event per
 * logged step whose Summary holds a {tag, simple_value} per scalar. */
#ifndef MT_IO_TENSORBOARD_H
#define MT_IO_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef struct mt_tb_writer mt_tb_writer;

typedef struct mt_tb_scalar {
    const char *tag;  // e.g. "train/loss"
    float value;
} mt_tb_scalar;

/* Creates dir (and its parents) and a new event file in it, and writes the
 * file-version event. restart_step >= 1 also writes SessionLog START at
 * that step, the marker by which TensorBoard drops the events an earlier
 * run of the same directory logged at steps >= restart_step (a resumed run
 * passes its resume step + 1; a fresh one 1). NULL with err on failure. */
mt_tb_writer *mt_tb_open(const char *dir, int64_t restart_step, mt_error *err);

/* Appends one Event at `step` (wall time now) holding the n scalars, in
 * one write(2). A failed write is an error naming the file and leaves the
 * file as it was (no torn record, which would hide every later one). */
int mt_tb_write_scalars(mt_tb_writer *w, int64_t step, const mt_tb_scalar *s, size_t n,
                        mt_error *err);

/* The path of the event file (for messages and tests). */
const char *mt_tb_path(const mt_tb_writer *w);

/* Syncs and closes the file, then frees w; -1 (err filled when not NULL)
 * when either failed. */
int mt_tb_finish(mt_tb_writer *w, mt_error *err);

/* Closes the file, unchecked, and frees w. */
void mt_tb_close(mt_tb_writer *w);

/* CRC32C of n bytes, and TFRecord's mask of a CRC (exposed for tests). */
uint32_t mt_crc32c(const void *p, size_t n);
uint32_t mt_tb_mask_crc(uint32_t crc);

#endif
