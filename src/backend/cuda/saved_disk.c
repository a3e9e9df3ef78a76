/* Saved layer inputs on disk (see saved_disk.h): the staging ring, the
 * queue of disk jobs and the thread that runs them. */
#include "backend/cuda/saved_disk.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "host/disk.h"
#include "kernels/cuda_common.h"
#include "util/mem.h"

#define MAX_JOBS 16 /* a stage has at most a write and a read queued */

enum { IDLE, UNREAD }; /* UNREAD: holds (or will hold) a read not yet copied up */

typedef struct stage {
    void *p;             /* pinned, MT_DISK_ALIGN-aligned (one block) */
    int layer;           /* the layer it holds or will hold, -1 none */
    int use;             /* IDLE or UNREAD */
    int pending;         /* disk jobs queued or running on it */
    cudaEvent_t copied;  /* its last GPU copy (D2H into it, H2D out of it) */
} stage;

typedef struct job { int stage, layer, write; } job;

struct mt_saved_disk {
    mt_disk *disk;
    const int *block;    /* (n_layers) the layer's block, -1 none (the backend's) */
    int n_layers, device;
    stage st[MT_SAVED_DISK_STAGES];
    int n_st, next;      /* stages; where the next search starts */
    int filling;         /* the stage taken for the write to come, -1 none */
    job q[MAX_JOBS];
    int q_head, q_len;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t thread;
    int running, quit;
    int failed;
    mt_error err;
};

/* One job: wait for the stage's GPU copy, then move its block. A failed
 * tier moves nothing more (the step's result is void already). */
static void run_job(mt_saved_disk *sd, job j) {
    stage *s = &sd->st[j.stage];
    CUDA_CHECK(cudaEventSynchronize(s->copied));
    if (sd->failed) return;
    mt_error e = {0};
    int t = mt_disk_submit(sd->disk, sd->block[j.layer], s->p, j.write, &e);
    if (t < 0 || mt_disk_wait(sd->disk, t, &e)) {
        pthread_mutex_lock(&sd->mu);
        if (!sd->failed) {
            sd->err = e;
            mt_error_prefix(&sd->err, j.write ? "writing a saved layer input to disk: "
                                              : "reading a saved layer input from disk: ");
            sd->failed = 1;
        }
        pthread_mutex_unlock(&sd->mu);
    }
}

static void *worker(void *arg) {
    mt_saved_disk *sd = arg;
    CUDA_CHECK(cudaSetDevice(sd->device));
    pthread_mutex_lock(&sd->mu);
    for (;;) {
        while (!sd->q_len && !sd->quit) pthread_cond_wait(&sd->work, &sd->mu);
        if (!sd->q_len) break; /* quit, and nothing left */
        job j = sd->q[sd->q_head];
        pthread_mutex_unlock(&sd->mu);
        run_job(sd, j);
        pthread_mutex_lock(&sd->mu);
        sd->q_head = (sd->q_head + 1) % MAX_JOBS;
        sd->q_len--;
        sd->st[j.stage].pending--;
        pthread_cond_broadcast(&sd->done);
    }
    pthread_mutex_unlock(&sd->mu);
    return NULL;
}

/* Queues a job on stage b (the lock held). */
static void push(mt_saved_disk *sd, int b, int layer, int write) {
    MT_ASSERT(sd->q_len < MAX_JOBS);
    sd->q[(sd->q_head + sd->q_len++) % MAX_JOBS] = (job){b, layer, write};
    sd->st[b].pending++;
    pthread_cond_signal(&sd->work);
}

static void wait_stage(mt_saved_disk *sd, int b) {
    while (sd->st[b].pending) pthread_cond_wait(&sd->done, &sd->mu);
}

int mt_saved_disk_open(mt_saved_disk **out, const char *dirs, const int *block, int n_layers,
                       int n, size_t bytes, int device, mt_error *err) {
    *out = NULL;
    mt_saved_disk *sd = mt_calloc_or_die(1, sizeof *sd);
    sd->block = block;
    sd->n_layers = n_layers;
    sd->device = device;
    sd->filling = -1;
    size_t *sizes = mt_calloc_or_die((size_t)n, sizeof *sizes);
    for (int i = 0; i < n; i++) sizes[i] = bytes;
    int rc = mt_disk_open(&sd->disk, dirs, sizes, n, err);
    free(sizes);
    if (rc) {
        free(sd);
        return mt_error_prefix(err, "saved layer inputs on disk: ");
    }
    pthread_mutex_init(&sd->mu, NULL);
    pthread_cond_init(&sd->work, NULL);
    pthread_cond_init(&sd->done, NULL);
    sd->n_st = n < MT_SAVED_DISK_STAGES ? n : MT_SAVED_DISK_STAGES;
    size_t one = mt_saved_disk_staging_bytes(1, bytes);
    for (int b = 0; b < sd->n_st; b++) {
        stage *s = &sd->st[b];
        s->layer = -1;
        /* blocking sync: the disk thread sleeps, not spins, while it waits */
        CUDA_CHECK(cudaEventCreateWithFlags(&s->copied,
                                            cudaEventDisableTiming | cudaEventBlockingSync));
        if (cudaMallocHost(&s->p, one) != cudaSuccess) { /* page-aligned: O_DIRECT's 4096 */
            (void)cudaGetLastError();
            s->p = NULL;
            mt_saved_disk_close(sd);
            return mt_errorf(err, "saved layer inputs on disk: cannot pin %d staging buffers "
                             "of %.2f GB; lower --host-mem or use fewer tokens per step",
                             MT_SAVED_DISK_STAGES, one / 1e9);
        }
    }
    if (pthread_create(&sd->thread, NULL, worker, sd)) {
        mt_saved_disk_close(sd);
        return mt_errorf(err, "saved layer inputs on disk: cannot start the disk thread");
    }
    sd->running = 1;
    *out = sd;
    return 0;
}

void mt_saved_disk_close(mt_saved_disk *sd) {
    if (!sd) return;
    if (sd->running) {
        pthread_mutex_lock(&sd->mu);
        sd->quit = 1;
        pthread_cond_signal(&sd->work);
        pthread_mutex_unlock(&sd->mu);
        pthread_join(sd->thread, NULL);
    }
    for (int b = 0; b < sd->n_st; b++) {
        if (sd->st[b].p) CUDA_CHECK(cudaFreeHost(sd->st[b].p));
        if (sd->st[b].copied) CUDA_CHECK(cudaEventDestroy(sd->st[b].copied));
    }
    if (sd->disk) {
        pthread_mutex_destroy(&sd->mu);
        pthread_cond_destroy(&sd->work);
        pthread_cond_destroy(&sd->done);
    }
    mt_disk_close(sd->disk);
    free(sd);
}

void mt_saved_disk_begin_step(mt_saved_disk *sd) {
    pthread_mutex_lock(&sd->mu);
    while (sd->q_len) pthread_cond_wait(&sd->done, &sd->mu);
    for (int b = 0; b < sd->n_st; b++) sd->st[b].layer = -1, sd->st[b].use = IDLE;
    sd->next = 0;
    sd->filling = -1;
    pthread_mutex_unlock(&sd->mu);
}

/* The next stage in turn that holds no unread layer, -1 none (the lock
 * held). */
static int free_stage(mt_saved_disk *sd) {
    for (int k = 0; k < sd->n_st; k++) {
        int b = (sd->next + k) % sd->n_st;
        if (sd->st[b].use == IDLE) {
            sd->next = (b + 1) % sd->n_st;
            return b;
        }
    }
    return -1;
}

static int stage_of(const mt_saved_disk *sd, int layer, int use) {
    for (int b = 0; b < sd->n_st; b++)
        if (sd->st[b].layer == layer && sd->st[b].use == use) return b;
    return -1;
}

void *mt_saved_disk_take_for_write(mt_saved_disk *sd, int layer, cudaStream_t stream) {
    pthread_mutex_lock(&sd->mu);
    int b = free_stage(sd);
    MT_ASSERT(b >= 0); /* the forward reads nothing back */
    wait_stage(sd, b);
    sd->st[b].layer = layer;
    sd->filling = b;
    pthread_mutex_unlock(&sd->mu);
    /* its last H2D (the backward's) may still be running on the other stream */
    CUDA_CHECK(cudaStreamWaitEvent(stream, sd->st[b].copied, 0));
    return sd->st[b].p;
}

void mt_saved_disk_write(mt_saved_disk *sd, int layer, cudaStream_t stream) {
    pthread_mutex_lock(&sd->mu);
    int b = sd->filling;
    MT_ASSERT(b >= 0 && sd->st[b].layer == layer && !sd->st[b].pending);
    sd->filling = -1;
    /* recorded only with no job on the stage: the thread waits for no older copy */
    CUDA_CHECK(cudaEventRecord(sd->st[b].copied, stream));
    push(sd, b, layer, 1);
    pthread_mutex_unlock(&sd->mu);
}

int mt_saved_disk_read(mt_saved_disk *sd, int layer) {
    pthread_mutex_lock(&sd->mu);
    int queued = stage_of(sd, layer, UNREAD) >= 0, b = queued ? -1 : free_stage(sd);
    if (b >= 0) { /* behind the stage's write, if any: the jobs run in order */
        sd->st[b].layer = layer;
        sd->st[b].use = UNREAD;
        push(sd, b, layer, 0);
    }
    pthread_mutex_unlock(&sd->mu);
    return queued || b >= 0;
}

const void *mt_saved_disk_wait_read(mt_saved_disk *sd, int layer) {
    int ok = mt_saved_disk_read(sd, layer);
    MT_ASSERT(ok); /* the backward consumes its reads in the order it queued them */
    pthread_mutex_lock(&sd->mu);
    int b = stage_of(sd, layer, UNREAD);
    wait_stage(sd, b);
    pthread_mutex_unlock(&sd->mu);
    return sd->st[b].p;
}

void mt_saved_disk_loaded(mt_saved_disk *sd, int layer, cudaStream_t stream) {
    pthread_mutex_lock(&sd->mu);
    int b = stage_of(sd, layer, UNREAD);
    MT_ASSERT(b >= 0 && !sd->st[b].pending);
    CUDA_CHECK(cudaEventRecord(sd->st[b].copied, stream));
    sd->st[b].use = IDLE;
    sd->st[b].layer = -1;
    pthread_mutex_unlock(&sd->mu);
}

int mt_saved_disk_error(mt_saved_disk *sd, mt_error *err) {
    if (!sd) return 0;
    pthread_mutex_lock(&sd->mu);
    int failed = sd->failed;
    if (failed) *err = sd->err;
    pthread_mutex_unlock(&sd->mu);
    return failed ? -1 : 0;
}

double mt_saved_disk_bytes(const mt_saved_disk *sd) {
    return sd ? (double)mt_disk_total_bytes(sd->disk) : 0;
}
