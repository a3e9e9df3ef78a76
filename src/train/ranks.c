/* A process's place in a data-parallel run (see ranks.h). */
#include "train/ranks.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host/disk.h"
#include "util/mem.h"

/* err's message prefixed with "rank r: " on a rank of several. */
static int named(const mt_ranks *r, mt_error *err) {
    if (r->env.world_size > 1) {
        mt_error e = *err;
        mt_errorf(err, "rank %d: %s", r->env.rank, e.msg);
    }
    return -1;
}

/* Ranks on this machine: what the launcher says, else those whose host
 * name is this one's. */
static int count_local(mt_ranks *r, mt_error *err) {
    if (r->env.local_world_size > 0) {
        r->local_world = r->env.local_world_size;
        return 0;
    }
    char me[64] = "", *all = mt_calloc_or_die((size_t)r->env.world_size, sizeof me);
    gethostname(me, sizeof me - 1);
    int rc = mt_rdv_allgather(&r->rdv, me, sizeof me, all, err);
    r->local_world = 0;
    for (int i = 0; rc == 0 && i < r->env.world_size; i++)
        r->local_world += !strncmp(all + (size_t)i * sizeof me, me, sizeof me);
    free(all);
    return rc;
}

/* This rank's share of the cores: a launcher that bound the process
 * (mpirun, srun) decided it; otherwise ranks on one machine take
 * contiguous slices of it, so that their optimizers' threads do not
 * compete. */
static void share_cores(mt_ranks *r) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    int allowed = 0;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0) allowed = CPU_COUNT(&mask);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (allowed <= 0) allowed = online > 0 ? (int)online : 1;
    r->threads = allowed;
    if (r->local_world > 1 && allowed == online) {
        /* fewer cores than ranks: share them, a thread each */
        int k = allowed / r->local_world > 0 ? allowed / r->local_world : 1;
        r->threads = k;
        int first = (r->env.local_rank % r->local_world) * k;
        cpu_set_t mine;
        CPU_ZERO(&mine);
        for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE && seen < first + k; cpu++) {
            if (!CPU_ISSET(cpu, &mask)) continue;
            if (seen >= first) CPU_SET(cpu, &mine);
            seen++;
        }
        if (allowed >= r->local_world) sched_setaffinity(0, sizeof mine, &mine);
    }
    omp_set_num_threads(r->threads);
}

int mt_ranks_open(mt_ranks *r, int gpu, const char *config, mt_error *err) {
    memset(r, 0, sizeof *r);
    r->local_world = 1;
    if (mt_dist_bootstrap_environ(&r->env, err)) return -1;
    r->gpu = gpu;
    int several = r->env.world_size > 1;
    if (!several) {
        share_cores(r);
        return 0;
    }
    /* first, so that every CUDA call of this process goes to its GPU */
    unsigned char blob[MT_RDV_BLOB_BYTES] = {0};
    if (gpu && (mt_device_select(r->env.local_rank, err) ||
                (r->env.rank == 0 && mt_device_comm_id(blob, err))))
        return named(r, err);
    if (mt_rdv_open(&r->rdv, &r->env, config, blob, err)) return named(r, err);
    r->open = 1;
    if (count_local(r, err)) return named(r, err);
    share_cores(r);
    if (gpu && !(r->comm = mt_device_comm_open(r->rdv.blob, r->env.rank, r->env.world_size, err)))
        return named(r, err);
    if (gpu && mt_device_comm_probe(r->comm, &r->link_gbs, err)) return named(r, err);
    return 0;
}

int mt_ranks_disk_rates(mt_ranks *r, const char *dirs, size_t bytes, double gbs[3],
                        mt_error *err) {
    double x[4] = {0, 0, 0, 0}; /* read, write, both, machines */
    int rc = 0;
    if (r->env.local_rank == 0) {
        rc = mt_disk_measure(dirs, bytes, &x[1], &x[0], &x[2], err);
        x[3] = 1;
    }
    if (mt_ranks_agree(r, rc, err) || mt_ranks_sum(r, x, 4, err)) return -1;
    for (int i = 0; i < 3; i++) gbs[i] = x[i] / x[3];
    return 0;
}

struct mt_ranks_watch {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double last, longest, timeout;
    long long step;
    int rank, quit, paused;
};

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *watchdog(void *arg) {
    mt_ranks_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->quit) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&w->cv, &w->mu, &until);
        double limit = w->timeout > 4 * w->longest ? w->timeout : 4 * w->longest;
        double idle = mono_s() - w->last;
        if (!w->quit && !w->paused && idle > limit) {
            fprintf(stderr, "megatrain: rank %d: no step has ended for %.0f s (after step %lld; "
                    "the longest took %.1f s): a rank is stuck or gone, stopping this one; "
                    "MT_DIST_TIMEOUT sets how long to wait\n", w->rank, idle, w->step,
                    w->longest);
            _exit(3);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void mt_ranks_watch_start(mt_ranks *r) {
    if (!mt_ranks_several(r) || r->watch) return;
    mt_ranks_watch *w = mt_calloc_or_die(1, sizeof *w);
    w->last = mono_s();
    w->timeout = r->env.timeout_s;
    w->rank = r->env.rank;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, watchdog, w)) {
        free(w); /* no watchdog: the launcher's and the rendezvous' timeouts remain */
        return;
    }
    r->watch = w;
}

void mt_ranks_alive(mt_ranks *r, long long step) {
    mt_ranks_watch *w = r->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    double now = mono_s();
    if (now - w->last > w->longest) w->longest = now - w->last;
    w->last = now;
    w->step = step;
    pthread_mutex_unlock(&w->mu);
}

void mt_ranks_watch_pause(mt_ranks *r, int on) {
    mt_ranks_watch *w = r->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->paused = on;
    w->last = mono_s();
    pthread_mutex_unlock(&w->mu);
}

static void watch_stop(mt_ranks *r) {
    mt_ranks_watch *w = r->watch;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    r->watch = NULL;
}

void mt_ranks_close(mt_ranks *r) {
    watch_stop(r);
    mt_device_comm_close(r->comm);
    r->comm = NULL;
    if (r->open) mt_rdv_close(&r->rdv);
    r->open = 0;
}

typedef struct outcome {
    int32_t rc;
    char msg[500];
} outcome;

int mt_ranks_agree(mt_ranks *r, int rc, mt_error *err) {
    if (!mt_ranks_several(r)) return rc ? -1 : 0;
    outcome mine = {.rc = rc ? -1 : 0}, *all;
    if (rc) snprintf(mine.msg, sizeof mine.msg, "%.499s", err->msg);
    all = mt_calloc_or_die((size_t)r->env.world_size, sizeof *all);
    mt_error e;
    if (mt_rdv_allgather(&r->rdv, &mine, sizeof mine, all, &e)) {
        free(all);
        *err = e;
        return named(r, err);
    }
    int bad = -1;
    for (int i = 0; i < r->env.world_size && bad < 0; i++)
        if (all[i].rc) bad = i;
    if (bad >= 0 && bad != r->env.rank) {
        all[bad].msg[sizeof all[bad].msg - 1] = 0;
        mt_errorf(err, "rank %d: %s", bad, all[bad].msg);
    } else if (bad >= 0) {
        named(r, err);
    }
    free(all);
    return bad >= 0 ? -1 : 0;
}

int mt_ranks_sum(mt_ranks *r, double *x, int n, mt_error *err) {
    if (!mt_ranks_several(r)) return 0;
    return mt_rdv_sum_n(&r->rdv, x, (size_t)n, err) ? named(r, err) : 0;
}

int mt_ranks_parts(const mt_ranks *r, const mt_param_table *t, mt_shard_layout *sl,
                   mt_param_table *parts, mt_error *err) {
    if (mt_shard_layout_init(sl, t, r->env.rank, r->env.world_size, err)) return -1;
    if (mt_shard_table_init(parts, sl, err)) {
        mt_shard_layout_free(sl);
        return -1;
    }
    return 0;
}
