/* A worker thread that applies AdamW layer by layer and publishes how far
 * it got; the H2D side waits on that progress. */
#include "engine/optim_pipeline.h"

#include <stdlib.h>
#include <time.h>

#include "engine/trace.h"
#include "host/disk_state.h"
#include "util/mem.h"


static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static mt_grad_view grad_begin(mt_optim_pipeline *p, int layer) {
    if (p->src.begin) return p->src.begin(p->src.ctx, layer);
    return mt_grad_f32(p->store->g + p->store->table->layers[layer].offset);
}

static void grad_wait(mt_optim_pipeline *p, int layer) {
    if (p->src.wait) p->src.wait(p->src.ctx, layer);
}

/* Layer l's update on the CPU from its gradient g, or, for a device layer,
 * handed to the source with the scalars of each of its tensors. */
static void update(mt_optim_pipeline *p, int l, mt_grad_view g) {
    if (l < p->src.n_device) {
        mt_optimizer_layer_coefs(p->opt, p->store->table, l, p->coef, p->lr, p->coefs);
        p->src.update(p->src.ctx, l, p->coefs);
        return;
    }
    mt_optimizer_update_layer(p->opt, p->store, l, g, p->coef, p->lr);
}

static void *worker(void *arg) {
    mt_optim_pipeline *p = arg;
    int nd = p->src.n_device;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && !(p->running && p->done < p->n_layers)) pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) break;
        double t0 = now_s();
        mt_disk_state_prefetch(p->store->disk);
        mt_grad_view g = nd < p->n_layers ? grad_begin(p, nd) : (mt_grad_view){0};
        while (p->done < p->n_layers) {
            int l = p->done;
            pthread_mutex_unlock(&p->mu);
            p->t0_us[l] = mt_trace_now_us();
            mt_grad_view next = g;
            if (l >= nd) { /* the CPU's: fetch the next layer's gradient meanwhile */
                grad_wait(p, l);
                next = l + 1 < p->n_layers ? grad_begin(p, l + 1) : (mt_grad_view){0};
            }
            update(p, l, g);
            g = next;
            p->t1_us[l] = mt_trace_now_us();
            pthread_mutex_lock(&p->mu);
            p->done++;
            pthread_cond_broadcast(&p->cv);
        }
        p->busy_s = now_s() - t0;
        p->opt->step++;
        p->stale |= nd > 0;
        p->running = 0;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int mt_optim_pipeline_init(mt_optim_pipeline *p, mt_optimizer *opt, mt_host_store *store,
                           const mt_grad_source *src, mt_error *err) {
    *p = (mt_optim_pipeline){.opt = opt, .store = store, .n_layers = store->table->n_layers};
    if (src) p->src = *src;
    if (p->src.n_device < 0 || p->src.n_device > p->n_layers ||
        (p->src.n_device > 0 && !p->src.update))
        return mt_errorf(err, "the gradient source's device layers (%d of %d) need an update "
                         "function", p->src.n_device, p->n_layers);
    p->t0_us = mt_calloc_or_die((size_t)p->n_layers, sizeof *p->t0_us);
    p->t1_us = mt_calloc_or_die((size_t)p->n_layers, sizeof *p->t1_us);
    int most = 1;
    for (int l = 0; l < p->n_layers; l++)
        if (store->table->layers[l].n_tensors > most) most = store->table->layers[l].n_tensors;
    p->coefs = mt_calloc_or_die((size_t)most, sizeof *p->coefs);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->thread, NULL, worker, p))
        return mt_errorf(err, "cannot start the optimizer thread");
    return 0;
}

void mt_optim_pipeline_free(mt_optim_pipeline *p) {
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->t0_us);
    free(p->t1_us);
    free(p->coefs);
}

void mt_optim_pipeline_start(mt_optim_pipeline *p, double total_sumsq, mt_optim_report *rep) {
    mt_optim_pipeline_wait_updates(p);
    mt_optim_report r;
    mt_optimizer_plan(p->opt, total_sumsq, &r);
    if (rep) *rep = r;
    pthread_mutex_lock(&p->mu);
    p->coef = r.clip_coef;
    p->lr = r.lr;
    p->done = 0;
    p->running = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void mt_optim_pipeline_wait_layer(mt_optim_pipeline *p, int layer) {
    pthread_mutex_lock(&p->mu);
    while (p->running && p->done <= layer) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void mt_optim_pipeline_wait_updates(mt_optim_pipeline *p) {
    pthread_mutex_lock(&p->mu);
    while (p->running) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void mt_optim_pipeline_wait_all(mt_optim_pipeline *p) {
    mt_optim_pipeline_wait_updates(p);
    pthread_mutex_lock(&p->mu);
    int flush = p->stale && p->src.flush;
    p->stale = 0;
    pthread_mutex_unlock(&p->mu);
    if (flush) p->src.flush(p->src.ctx);
}

int mt_optim_pipeline_gate(void *ctx, int layer, int wait) {
    mt_optim_pipeline *p = ctx;
    if (wait) {
        mt_optim_pipeline_wait_layer(p, layer);
        return 1;
    }
    pthread_mutex_lock(&p->mu);
    const int written = !p->running || p->done > layer;
    pthread_mutex_unlock(&p->mu);
    return written;
}
