/* Collectives between the GPUs of a data-parallel run, through NCCL.
 *
 * NCCL is loaded when a run first needs it (dlopen of libnccl.so.2, or the
 * file MT_NCCL_LIBRARY names), so a build runs on one GPU where NCCL is
 * absent, and a run on several says what to install. Every rank calls the
 * collectives of one communicator in the same order; each is enqueued on
 * the stream given and ordered with the rest by events, like a copy.
 *
 * Buffers are laid out as the shards of a layer (dist/shard.h): `world`
 * chunks of `chunk` floats back to back, rank r's at r * chunk. A failing
 * NCCL call is a broken invariant (a peer gone, a bad pointer): it aborts
 * naming the call, file, line, device and NCCL's message. */
#ifndef MT_BACKEND_CUDA_NCCL_H
#define MT_BACKEND_CUDA_NCCL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "util/error.h"

#define MT_NCCL_ID_BYTES 128  /* NCCL_UNIQUE_ID_BYTES: the rendezvous' blob */

typedef struct mt_nccl mt_nccl;

/* Loads NCCL (once per process); -1 with a message saying where it looked
 * and how to provide it. */
int mt_nccl_load(mt_error *err);

/* NCCL's version as "2.28.9" (after a successful load). */
const char *mt_nccl_version(void);

/* Rank 0: a new communicator id, to hand every rank (the rendezvous'
 * blob). */
int mt_nccl_unique_id(unsigned char id[MT_NCCL_ID_BYTES], mt_error *err);

/* Joins the communicator of `world` ranks named by id as `rank`, on the
 * calling thread's current device; blocks until every rank has joined. */
mt_nccl *mt_nccl_open(const unsigned char id[MT_NCCL_ID_BYTES], int rank, int world,
                      mt_error *err);

/* Leaves the communicator (after every enqueued collective completed). */
void mt_nccl_close(mt_nccl *c);

int mt_nccl_rank(const mt_nccl *c);
int mt_nccl_world(const mt_nccl *c);

/* In place: buf holds world chunks; this rank's chunk (at rank * chunk)
 * is copied into the same place of every rank's buf. */
void mt_nccl_all_gather(mt_nccl *c, float *buf, size_t chunk, cudaStream_t s);

/* The same from a chunk elsewhere: send (chunk floats) is this rank's,
 * recv (world chunks) receives every rank's. */
void mt_nccl_all_gather_from(mt_nccl *c, const float *send, float *recv, size_t chunk,
                             cudaStream_t s);

/* In place: buf holds world chunks; afterwards this rank's chunk holds the
 * sum over the ranks of their chunk at this rank's place (the other
 * chunks are left undefined). */
void mt_nccl_reduce_scatter(mt_nccl *c, float *buf, size_t chunk, cudaStream_t s);

#endif
