/* The processes of a data-parallel run as one of them sees it: who it is
 * (dist/bootstrap.h: the launcher's variables), the others (the
 * rendezvous: control collectives over TCP), its share of this machine
 * (cores, RAM), its GPU and the communicator between the GPUs, and its part
 * of every layer of the model (dist/shard.h).
 *
 * A process started alone is a run of one: world 1, no sockets, no
 * communicator, the whole model as its part; every call below then does
 * nothing or the obvious, so the run's code is the same either way. */
#ifndef MT_TRAIN_RANKS_H
#define MT_TRAIN_RANKS_H

#include "backend/device.h"
#include "dist/bootstrap.h"
#include "dist/rendezvous.h"
#include "dist/shard.h"
#include "util/error.h"

typedef struct mt_ranks_watch mt_ranks_watch;

typedef struct mt_ranks {
    mt_dist_env env;        /* rank, world_size, local_rank, ... */
    mt_ranks_watch *watch;  /* mt_ranks_watch_start's, or NULL */
    mt_rdv rdv;             /* the others; world 1: no sockets */
    int open;               /* rdv is open */
    int local_world;        /* ranks on this machine (this one included) */
    int threads;            /* CPU threads this rank's work may use */
    int gpu;                /* ranks drive GPUs: rank r the GPU local_rank */
    mt_device_comm *comm;   /* between the GPUs (several ranks on GPUs), else NULL */
    double link_gbs;        /* the collectives' bus bandwidth measured at the start, GB/s */
} mt_ranks;

/* Becomes this process's rank: reads the launcher's variables, pins the
 * process to its share of the machine's cores (unless the launcher did),
 * with gpu selects the GPU local_rank, meets the other ranks (config: this
 * rank's options as "name=value" lines, which must be every rank's), and
 * on GPUs joins their communicator. Fails on every rank still there with
 * a message naming the rank and variable at fault. */
int mt_ranks_open(mt_ranks *r, int gpu, const char *config, mt_error *err);
void mt_ranks_close(mt_ranks *r);

static inline int mt_ranks_several(const mt_ranks *r) { return r->env.world_size > 1; }
static inline int mt_ranks_lead(const mt_ranks *r) { return r->env.rank == 0; }

/* Every rank's outcome of the same piece of work: 0 on every rank when
 * all succeeded (rc 0), else -1 on every rank with the failing rank's
 * message ("rank 2: ..."; this rank's own when it failed). */
int mt_ranks_agree(mt_ranks *r, int rc, mt_error *err);

/* *x replaced by its sum over the ranks (added in rank order: the same
 * bits everywhere); n doubles. */
int mt_ranks_sum(mt_ranks *r, double *x, int n, mt_error *err);

/* The disk tier's rates on dirs (host/disk.h's measurement of `bytes`),
 * GB/s read, write and both at once, the same on every rank: each
 * machine's first rank measures while the others wait (their ranks share
 * the drives), and the machines' rates are averaged. A run of one
 * measures. */
int mt_ranks_disk_rates(mt_ranks *r, const char *dirs, size_t bytes, double gbs[3],
                        mt_error *err);

/* A rank of several stuck in a collective waits for the others forever: a
 * watchdog thread ends this process (status 3, naming the rank, the step
 * and how long) when no step has ended for the rendezvous' timeout
 * (MT_DIST_TIMEOUT), or 4 times the longest step seen if that is longer.
 * The launcher then stops the other ranks. mt_ranks_alive marks a step's
 * end (step: steps done). Nothing for a run of one. */
void mt_ranks_watch_start(mt_ranks *r);
void mt_ranks_alive(mt_ranks *r, long long step);
/* While a save runs (on = 1), which its own collectives bound, the
 * watchdog waits; on = 0 counts from then. */
void mt_ranks_watch_pause(mt_ranks *r, int on);

/* This rank's part of every layer of t: layout and the parts' table. */
int mt_ranks_parts(const mt_ranks *r, const mt_param_table *t, mt_shard_layout *sl,
                   mt_param_table *parts, mt_error *err);

#endif
