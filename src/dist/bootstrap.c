/* Rank bootstrap from launcher environment variables (see bootstrap.h). */
#include "dist/bootstrap.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One launcher's names for rank, world size, local rank and the number of
 * ranks on this machine. */
typedef struct launcher {
    const char *source;
    const char *rank, *size, *local, *local_size;
} launcher;

static const launcher LAUNCHERS[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};
#define N_LAUNCHERS ((int)(sizeof LAUNCHERS / sizeof LAUNCHERS[0]))

/* A decimal integer in [lo, hi]: digits only, no sign, no spaces. */
static int parse_int(const char *name, const char *value, long lo, long hi, const char *fix,
                     int *out, mt_error *err) {
    const char *p = value;
    if (!*p)
        return mt_errorf(err, "%s is set but empty: %s", name, fix);
    for (; *p; p++)
        if (*p < '0' || *p > '9')
            return mt_errorf(err, "%s='%s' is not a whole number: %s", name, value, fix);
    errno = 0;
    long v = strtol(value, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi)
        return mt_errorf(err, "%s=%s is out of range (%ld to %ld): %s", name, value, lo, hi,
                         fix);
    *out = (int)v;
    return 0;
}

/* MASTER_ADDR, MASTER_PORT and MT_DIST_TIMEOUT, checked against the world size. */
static int parse_master(mt_dist_env *env, mt_env_get get, void *ctx, mt_error *err) {
    const char *addr = get(ctx, "MASTER_ADDR");
    if (env->world_size > 1) {
        if (!addr || !*addr)
            return mt_errorf(err, "%s starts %d ranks but MASTER_ADDR is %s: set MASTER_ADDR to "
                             "the host name or address of the machine of rank 0 (e.g. "
                             "MASTER_ADDR=127.0.0.1 when every rank runs on one machine)",
                             env->source, env->world_size, addr ? "empty" : "not set");
        if (strlen(addr) >= sizeof env->master_addr)
            return mt_errorf(err, "MASTER_ADDR is %zu characters long, more than %zu: give "
                             "the address of rank 0's machine", strlen(addr),
                             sizeof env->master_addr - 1);
        snprintf(env->master_addr, sizeof env->master_addr, "%s", addr);
    }
    const char *port = get(ctx, "MASTER_PORT");
    env->master_port = MT_DIST_DEFAULT_PORT;
    if (port && parse_int("MASTER_PORT", port, 1, 65535,
                          "give a free TCP port on rank 0's machine, 1 to 65535 (e.g. 29500)",
                          &env->master_port, err))
        return -1;
    const char *t = get(ctx, "MT_DIST_TIMEOUT");
    env->timeout_s = MT_DIST_DEFAULT_TIMEOUT_S;
    if (t) {
        char *end;
        errno = 0;
        double v = strtod(t, &end);
        if (!*t || *end || errno == ERANGE || !isfinite(v) || v <= 0 || v > 1e6)
            return mt_errorf(err, "MT_DIST_TIMEOUT='%s' is not a number of seconds in (0, "
                             "1e6]: give how long a rank may wait for the others (default "
                             "%g)", t, MT_DIST_DEFAULT_TIMEOUT_S);
        env->timeout_s = v;
    }
    return 0;
}

/* Rank, world size and local rank of launcher l, whose rank variable is set. */
static int parse_launcher(mt_dist_env *env, const launcher *l, mt_env_get get, void *ctx,
                          mt_error *err) {
    const char *rank = get(ctx, l->rank), *size = get(ctx, l->size), *local = get(ctx, l->local);
    char fix[256];
    if (!size)
        return mt_errorf(err, "%s=%s is set but %s is not: a %s launch sets both; set %s to "
                         "the number of processes, or unset %s for a run of one", l->rank,
                         rank, l->size, l->source, l->size, l->rank);
    snprintf(fix, sizeof fix, "%s must be the number of processes of the run, at least 1",
             l->size);
    if (parse_int(l->size, size, 1, 1 << 20, fix, &env->world_size, err)) return -1;
    snprintf(fix, sizeof fix, "%s must be this process's index, 0 to %s-1", l->rank, l->size);
    if (parse_int(l->rank, rank, 0, 1 << 20, fix, &env->rank, err)) return -1;
    if (env->rank >= env->world_size)
        return mt_errorf(err, "%s=%d is not below %s=%d: ranks run from 0 to %d; check the "
                         "launch command", l->rank, env->rank, l->size, env->world_size,
                         env->world_size - 1);
    env->local_rank = 0;
    env->local_world_size = 0;
    const char *lsize = get(ctx, l->local_size);
    if (lsize) {
        snprintf(fix, sizeof fix, "%s must be the number of processes on this machine",
                 l->local_size);
        if (parse_int(l->local_size, lsize, 1, 1 << 20, fix, &env->local_world_size, err))
            return -1;
    }
    if (local) {
        snprintf(fix, sizeof fix, "%s must be this process's index on its machine", l->local);
        if (parse_int(l->local, local, 0, 1 << 20, fix, &env->local_rank, err)) return -1;
        if (env->local_rank >= env->world_size)
            return mt_errorf(err, "%s=%d is not below %s=%d: a machine cannot hold more "
                             "ranks than the run; check the launch command", l->local,
                             env->local_rank, l->size, env->world_size);
        if (env->local_world_size && env->local_rank >= env->local_world_size)
            return mt_errorf(err, "%s=%d is not below %s=%d: check the launch command",
                             l->local, env->local_rank, l->local_size, env->local_world_size);
    }
    return 0;
}

int mt_dist_bootstrap(mt_dist_env *env, mt_env_get get, void *ctx, mt_error *err) {
    *env = (mt_dist_env){.world_size = 1, .source = "single process"};
    for (int i = 0; i < N_LAUNCHERS; i++) {
        const launcher *l = &LAUNCHERS[i];
        if (!get(ctx, l->rank)) {
            /* A world size alone is a half-configured launch of this kind. */
            const char *size = get(ctx, l->size);
            if (i == 0 && size)
                return mt_errorf(err, "WORLD_SIZE=%s is set but RANK is not: set RANK to this "
                                 "process's index (torchrun sets both), or unset WORLD_SIZE "
                                 "for a run of one", size);
            continue;
        }
        env->source = l->source;
        if (parse_launcher(env, l, get, ctx, err)) return -1;
        break;
    }
    return parse_master(env, get, ctx, err);
}

static const char *getenv_ctx(void *ctx, const char *name) {
    (void)ctx;
    return getenv(name);
}

int mt_dist_bootstrap_environ(mt_dist_env *env, mt_error *err) {
    return mt_dist_bootstrap(env, getenv_ctx, NULL, err);
}
