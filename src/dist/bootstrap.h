/* Rank bootstrap: who this process is in a multi-process run, read from the
 * environment the common launchers set (docs/distributed.md):
 *
 *   torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
 *   Open MPI   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (+ MASTER_ADDR,
 *              MASTER_PORT)
 *   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
 *              (+ MASTER_ADDR, MASTER_PORT)
 *
 * The first launcher whose rank variable is set wins, in that order; with
 * none, the process is a run of one. Rank 0 listens on MASTER_ADDR:
 * MASTER_PORT for the others (dist/rendezvous.h). MT_DIST_TIMEOUT (seconds)
 * bounds every wait on a peer. */
#ifndef MT_DIST_BOOTSTRAP_H
#define MT_DIST_BOOTSTRAP_H

#include "util/error.h"

#define MT_DIST_DEFAULT_PORT 29500      /* torch.distributed's default */
#define MT_DIST_DEFAULT_TIMEOUT_S 300.0

typedef struct mt_dist_env {
    int rank;               /* 0 .. world_size-1 */
    int world_size;         /* >= 1 */
    int local_rank;         /* index among the ranks of this machine (picks the GPU) */
    int local_world_size;   /* ranks on this machine, when the launcher says (torchrun's
                               LOCAL_WORLD_SIZE, ...); 0 when it does not */
    char master_addr[256];  /* host name or address of rank 0; "" for a run of one */
    int master_port;        /* 1 .. 65535 */
    double timeout_s;       /* longest wait on a peer, > 0 */
    const char *source;     /* "torchrun", "Open MPI", "Slurm" or "single process" */
} mt_dist_env;

/* Looks a variable up: its value, or NULL when unset. */
typedef const char *(*mt_env_get)(void *ctx, const char *name);

/* Fills env from the variables get returns. Every bad or inconsistent
 * value (not a number, rank >= world size, a rank without a world size,
 * several ranks without MASTER_ADDR, a port outside 1..65535, ...) is -1
 * with a message naming the variable, its value and the fix. */
int mt_dist_bootstrap(mt_dist_env *env, mt_env_get get, void *ctx, mt_error *err);

/* mt_dist_bootstrap on this process's environment (getenv). */
int mt_dist_bootstrap_environ(mt_dist_env *env, mt_error *err);

#endif
