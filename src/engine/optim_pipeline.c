/* A worker thread that applies AdamW layer by layer and publishes how far
 * it got; the H2D side waits on that progress. */
#include "engine/optim_pipeline.h"

#include <stdlib.h>
#include <time.h>

#include "engine/trace.h"
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

static void *worker(void *arg) {
    mt_optim_pipeline *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && !(p->running && p->done < p->n_layers)) pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) break;
        double t0 = now_s();
        mt_grad_view g = grad_begin(p, 0);
        while (p->done < p->n_layers) {
            int l = p->done;
            pthread_mutex_unlock(&p->mu);
            p->t0_us[l] = mt_trace_now_us();
            grad_wait(p, l);
            mt_grad_view next = l + 1 < p->n_layers ? grad_begin(p, l + 1) : (mt_grad_view){0};
            mt_optimizer_update_layer(p->opt, p->store, l, g, p->coef, p->lr);
            g = next;
            p->t1_us[l] = mt_trace_now_us();
            pthread_mutex_lock(&p->mu);
            p->done++;
            pthread_cond_broadcast(&p->cv);
        }
        p->busy_s = now_s() - t0;
        p->opt->step++;
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
    p->t0_us = mt_calloc_or_die((size_t)p->n_layers, sizeof *p->t0_us);
    p->t1_us = mt_calloc_or_die((size_t)p->n_layers, sizeof *p->t1_us);
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
}

void mt_optim_pipeline_start(mt_optim_pipeline *p, double total_sumsq, mt_optim_report *rep) {
    mt_optim_pipeline_wait_all(p);
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

void mt_optim_pipeline_wait_all(mt_optim_pipeline *p) {
    pthread_mutex_lock(&p->mu);
    while (p->running) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
