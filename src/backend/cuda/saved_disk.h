/* Saved layer inputs on disk (mt_layer_home.saved_disk) for the CUDA
 * streaming backend: a small ring of pinned staging buffers between the
 * copy streams and the disk tier (host/disk.h), and the one thread that
 * moves them to and from the disk.
 *
 * A layer's saved input goes down in its forward (D2H into a stage, then a
 * write of the stage to the layer's block) and comes up in its backward (a
 * read of the block into a stage, then H2D out of it). The backend issues
 * the copies; this file owns the stages, the disk and the ordering:
 *
 *   - a stage's GPU copy is recorded on its event (stage_copied) by the
 *     thread that drives the step, which then queues the stage's disk job;
 *   - the disk thread runs the jobs in the order they were queued: it waits
 *     for the stage's event (the D2H into it, or the H2D out of it), then
 *     writes or reads the block and marks the stage done;
 *   - the step's thread blocks (take_for_write, wait_read) only until the
 *     stage it needs is done, as it blocks on the optimizer's weight gate.
 *
 * Why a thread and not cudaLaunchHostFunc: a host function that blocked
 * for the disk would hold the driver's callback thread, which CUDA may
 * share between streams (and no CUDA call is allowed there), so one slow
 * read could stall the other streams' host work; here the copy streams
 * only ever wait on events, and the blocking is the step's thread's, which
 * runs at most the staging ring ahead of the disk, the bound the disk's
 * rate sets anyway. Jobs in order on one thread also keep the disk tier's
 * rule (one thread at a time) and a layer's read behind its write.
 *
 * A disk failure is recorded (the first, naming the file) and reported by
 * mt_saved_disk_error after the step: the step's loss and gradients are
 * then not valid and the run stops. */
#ifndef MT_BACKEND_CUDA_SAVED_DISK_H
#define MT_BACKEND_CUDA_SAVED_DISK_H

#include <stddef.h>

#include "host/disk.h"
#include "kernels/cuda_types.h"
#include "util/error.h"

/* Staging buffers (each one layer's saved input, every micro-batch): the
 * forward's writes and the backward's reads run this many layers ahead of
 * the copies that wait for them. */
#define MT_SAVED_DISK_STAGES 3

typedef struct mt_saved_disk mt_saved_disk;

/* Pinned bytes the staging of n disk layers of `bytes` each takes (0 for
 * none): min(n, MT_SAVED_DISK_STAGES) stages, rounded up for O_DIRECT.
 * (Inline: the GPU memory plan, built without CUDA too, counts it.) */
static inline size_t mt_saved_disk_staging_bytes(int n, size_t bytes) {
    int stages = n < MT_SAVED_DISK_STAGES ? n : MT_SAVED_DISK_STAGES;
    size_t one = (bytes + MT_DISK_ALIGN - 1) / MT_DISK_ALIGN * MT_DISK_ALIGN;
    return stages > 0 ? (size_t)stages * one : 0;
}

/* Opens blocks of `bytes` for the n_layers layers with block[l] >= 0 (n of
 * them) in files on dirs (comma-separated, striped), its staging, and its
 * thread (which works on `device`). -1 with a message naming the
 * directory, or the bytes that cannot be pinned. */
int mt_saved_disk_open(mt_saved_disk **out, const char *dirs, const int *block, int n_layers,
                       int n, size_t bytes, int device, mt_error *err);
/* Waits for the queued jobs, stops the thread, frees everything. */
void mt_saved_disk_close(mt_saved_disk *sd);

/* A step begins: waits until no job is queued and forgets what the stages
 * held (a step cut short leaves reads unconsumed). */
void mt_saved_disk_begin_step(mt_saved_disk *sd);

/* Forward: a stage for saved input `layer`, once its last disk job is
 * done; stream (the D2H's) waits for its last GPU copy. Returns the host
 * buffer to copy into, then call mt_saved_disk_write. */
void *mt_saved_disk_take_for_write(mt_saved_disk *sd, int layer, cudaStream_t stream);
/* Records the D2H just issued on stream and queues the stage's write. */
void mt_saved_disk_write(mt_saved_disk *sd, int layer, cudaStream_t stream);

/* Backward: queues a read of `layer` into a stage that holds no unread
 * layer; 1 when queued (or already queued), 0 when every stage holds one. */
int mt_saved_disk_read(mt_saved_disk *sd, int layer);
/* Blocks until `layer`'s read (queued now if it was not) is in its stage;
 * returns the stage's host buffer to copy from, then call
 * mt_saved_disk_loaded. */
const void *mt_saved_disk_wait_read(mt_saved_disk *sd, int layer);
/* Records the H2D just issued on stream: the stage is free for the next
 * read once it has run. */
void mt_saved_disk_loaded(mt_saved_disk *sd, int layer, cudaStream_t stream);

/* 0, or -1 with the first disk failure's message (naming the file). */
int mt_saved_disk_error(mt_saved_disk *sd, mt_error *err);

/* Bytes on disk. */
double mt_saved_disk_bytes(const mt_saved_disk *sd);

#endif
