/* The disk tier: per-layer blocks of working state (the optimizer's m and v
 * of the layers that do not fit in RAM) kept in files on one or more
 * directories, striped across them as a RAID 0 would, and moved to and
 * from RAM with io_uring and O_DIRECT.
 *
 * Layer l has a block of bytes[l] bytes (rounded up to MT_DISK_ALIGN);
 * stripe k of a block (MT_DISK_STRIPE bytes, the last one shorter) lives in
 * directory k % D. Each directory holds one file, created at open and
 * unlinked at once: the state vanishes with the process, a killed run
 * leaves nothing behind, and every run rebuilds its disk state from its
 * start (the model, or a resume checkpoint, which stays complete and
 * separate). The whole size is allocated at open, so a disk that is too
 * small is refused before any training starts.
 *
 * Transfers are asynchronous: a submit returns a ticket at once, a wait
 * blocks until that transfer is done. A thread of the tier's own keeps the
 * drives busy, queueing the stripes of every transfer in flight in turn
 * (a read and a write submitted together move together, as the planner's
 * "both at once" rate assumes), while the callers compute. Any thread may
 * submit and wait. */
#ifndef MT_HOST_DISK_H
#define MT_HOST_DISK_H

#include <stddef.h>

#include "util/error.h"

#define MT_DISK_ALIGN ((size_t)4096)          /* O_DIRECT: buffers, offsets, sizes */
#define MT_DISK_STRIPE ((size_t)4 << 20)      /* bytes of a block in one directory in a row */

typedef struct mt_disk mt_disk;

/* Opens the tier over dirs (comma-separated directories) for n blocks of
 * bytes[i] bytes (0: the block has no place on disk). -1 with a message
 * naming the directory and the bytes missing when one cannot hold its
 * share, or cannot do O_DIRECT or io_uring. */
int mt_disk_open(mt_disk **out, const char *dirs, const size_t *bytes, int n, mt_error *err);
void mt_disk_close(mt_disk *d);

/* Bytes of block i on disk (its size rounded up to MT_DISK_ALIGN), and in
 * all. */
size_t mt_disk_block_bytes(const mt_disk *d, int i);
size_t mt_disk_total_bytes(const mt_disk *d);
int mt_disk_dirs(const mt_disk *d);

/* A buffer for block transfers: MT_DISK_ALIGN-aligned, bytes rounded up
 * (free with free()). NULL when memory is short. */
void *mt_disk_buffer(size_t bytes);

/* Starts moving block i between buf (mt_disk_buffer of at least
 * mt_disk_block_bytes(d, i)) and the disk: write = 1 from buf to disk,
 * 0 from disk to buf. Returns a ticket (>= 0), -1 with a message. buf must
 * stay untouched until the ticket is waited for. */
int mt_disk_submit(mt_disk *d, int i, void *buf, int write, mt_error *err);

/* Whether the transfer of ticket is done, without blocking (it still needs
 * its mt_disk_wait, which then returns at once). */
int mt_disk_done(mt_disk *d, int ticket);

/* Blocks until the transfer of ticket is done; -1 with a message naming
 * the file, the offset and the system's reason when it failed. */
int mt_disk_wait(mt_disk *d, int ticket, mt_error *err);

/* The bytes the tier can hold on dirs: the stripes spread evenly, so the
 * directory with the least free space times their number (directories on
 * one file system count its space once each: give distinct drives). */
int mt_disk_free_bytes(const char *dirs, double *bytes, mt_error *err);

/* Measures the tier on dirs with `bytes` of blocks of 64 MiB, written once
 * first (as the tier's blocks are after its first step): rewriting them
 * all, reading them all, and reading and writing at once, a few blocks of
 * each in flight (each GB/s of the bytes moved). What the planner's disk
 * rates mean. */
int mt_disk_measure(const char *dirs, size_t bytes, double *write_gbs, double *read_gbs,
                    double *both_gbs, mt_error *err);

#endif
