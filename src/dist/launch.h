/* Starting the ranks of a run on this machine: `megatrain train --gpus N`
 * runs this process's own command N times, as ranks 0..N-1 of one run,
 * with the variables a launcher sets (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: dist/bootstrap.h),
 * and watches them:
 *
 *   - rank 0 writes to this process's output; the others' standard output
 *     is dropped (progress and metrics come from rank 0), their errors
 *     are kept;
 *   - a rank that fails or dies is named, and the others are asked to stop
 *     (SIGTERM), then killed after a grace period;
 *   - SIGINT and SIGTERM sent to this process are passed to every rank,
 *     which stop together (the run's own rules for a signal).
 *
 * The launcher holds no GPU and no model; it returns when every rank has
 * ended. */
#ifndef MT_DIST_LAUNCH_H
#define MT_DIST_LAUNCH_H

#include <stdio.h>

#include "util/error.h"

/* Whether this process was started as one rank of several (a launcher's
 * RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID is set): then it runs as that
 * rank rather than launching. */
int mt_launch_is_rank(void);

/* Runs argv (argv[0] is ignored: this program is run again) as n ranks
 * and waits for them. Returns 0 when every rank ended well: *exit_code is
 * 0, or 130 when a signal passed on stopped them (as one process stopped
 * by a signal exits); else -1 with a message naming the first rank that
 * failed and how. log receives the launcher's own lines (which ranks
 * were told to stop), may be NULL. */
int mt_launch_ranks(int n, char **argv, FILE *log, int *exit_code, mt_error *err);

/* Seconds a rank has to stop after SIGTERM before it is killed. */
#define MT_LAUNCH_GRACE_S 30

#endif
