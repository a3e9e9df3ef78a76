/* A CPU rank of a data-parallel run: the CPU reference backend (which
 * binds a layer by pointing into a whole store) over a copy of the weights
 * assembled from every rank's part at the start of each step, and the
 * gradient summed over the ranks at its end, each rank keeping its part in
 * its own store. The traffic goes through the rendezvous' sockets and rank
 * 0 (dist/rendezvous.h): meant for small models and for testing a run of
 * several ranks on a machine without GPUs, not for speed. */
#ifndef MT_DIST_CPU_RANKS_H
#define MT_DIST_CPU_RANKS_H

#include "dist/rendezvous.h"
#include "dist/shard.h"
#include "engine/backend.h"
#include "host/store.h"
#include "model/config.h"

/* parts: this rank's store over the parts' table of sl (with a gradient
 * array: end_step leaves this rank's part of the summed gradient there).
 * The backend borrows cfg, sl, parts and g; it allocates a whole copy of
 * the weights and gradient, and the CPU backend's buffers for M x (B, T);
 * its destroy frees them all. */
mt_backend *mt_cpu_ranks_backend_create(const mt_config *cfg, const mt_shard_layout *sl,
                                        mt_host_store *parts, mt_rdv *g, int max_M, int64_t B,
                                        int64_t T, mt_error *err);

#endif
