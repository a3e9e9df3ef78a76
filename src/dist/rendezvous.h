/* Rendezvous of the ranks of a run over TCP, and the small collectives of
 * the control path (broadcast, gather, sum, barrier) over the same sockets.
 *
 * Rank 0 listens on MASTER_ADDR:MASTER_PORT (dist/bootstrap.h); every other
 * rank connects, retrying until the timeout, and sends a hello: its rank,
 * the world size, and its run configuration (one "name=value" line per
 * option, with an XXH3-64 digest compared first). Rank 0 checks them all
 * and answers each rank with either a refusal naming what is wrong (a rank
 * twice, a world size or an option that differs: the first differing
 * option with both values) or acceptance and a blob of MT_RDV_BLOB_BYTES:
 * NCCL's unique id, from which every rank will make its communicator.
 *
 * The sockets stay open for the control collectives, which go through
 * rank 0 (a star): enough for a few numbers per step and per checkpoint,
 * not for tensors. Every wait is bounded by the timeout, and a peer that
 * closes its socket (it died) is an error naming that rank: no hang. */
#ifndef MT_DIST_RENDEZVOUS_H
#define MT_DIST_RENDEZVOUS_H

#include <stddef.h>

#include "dist/bootstrap.h"
#include "util/error.h"

#define MT_RDV_BLOB_BYTES 128  /* NCCL_UNIQUE_ID_BYTES */

typedef struct mt_rdv {
    int rank, world;
    double timeout_s;
    int *fd;   /* rank 0: (world) the socket of each other rank, fd[0] = -1;
                  others: (1) the socket to rank 0; NULL for a run of one */
    unsigned char blob[MT_RDV_BLOB_BYTES];  /* rank 0's blob, on every rank */
} mt_rdv;

/* Meets the other ranks of env (env->world_size 1: returns at once). config
 * is this rank's configuration text (lines "name=value", same order on
 * every rank); blob is rank 0's (read on rank 0 only). Fails, on every rank
 * that is still there, with a message naming the rank at fault and the
 * fix: a peer missing after env->timeout_s, rank 0 unreachable, a
 * mismatched configuration, a rank given twice, a port in use. */
int mt_rdv_open(mt_rdv *g, const mt_dist_env *env, const char *config,
                const unsigned char blob[MT_RDV_BLOB_BYTES], mt_error *err);
void mt_rdv_close(mt_rdv *g);

/* Every collective below must be called by every rank in the same order;
 * each fails (naming the rank) when a peer closes its socket or does not
 * answer within the timeout. */

/* buf (n bytes) of rank 0 copied to every rank. */
int mt_rdv_bcast(mt_rdv *g, void *buf, size_t n, mt_error *err);

/* Every rank's n bytes of send into rank 0's recv (world * n bytes, in
 * rank order); recv is unused elsewhere (may be NULL). */
int mt_rdv_gather(mt_rdv *g, const void *send, size_t n, void *recv, mt_error *err);

/* Every rank's n bytes of send into every rank's recv (world * n bytes, in
 * rank order). */
int mt_rdv_allgather(mt_rdv *g, const void *send, size_t n, void *recv, mt_error *err);

/* *x replaced by the sum over the ranks, added in rank order on rank 0:
 * the same bits on every rank. */
int mt_rdv_sum(mt_rdv *g, double *x, mt_error *err);

/* The same for each of n doubles, and for n floats (summed in float, rank
 * 0's first): tensors of a test-sized model, not of a real one. */
int mt_rdv_sum_n(mt_rdv *g, double *x, size_t n, mt_error *err);
int mt_rdv_sum_f32(mt_rdv *g, float *x, size_t n, mt_error *err);

/* Returns once every rank has called it. */
int mt_rdv_barrier(mt_rdv *g, mt_error *err);

#endif
