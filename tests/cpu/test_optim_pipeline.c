/* The optimizer beside the GPU (engine/optim_pipeline.c): its worker must
 * give the bits of the plain step (mt_optimizer_step), and its weight gate
 * must say "written" only once a layer is. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/optim_pipeline.h"
#include "engine/optimizer.h"
#include "model/config.h"
#include "model/params.h"
#include "testlib.h"

typedef struct model {
    mt_config cfg;
    mt_param_table t;
    mt_host_store s;
} model;

/* A tiny model with random weights, moments and gradient (seeded), so that
 * every term of the update matters. */
static void make_model(model *m, uint64_t seed) {
    mt_error err;
    mt_config_default_tiny(&m->cfg);
    cr_assert_eq(mt_params_init(&m->t, &m->cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_init(&m->s, &m->t, &err), 0, "%s", err.msg);
    mt_host_store_init_random(&m->s, seed, 0.05f);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < m->t.total; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const float u = (float)(x >> 40) / (float)(1 << 24); /* [0, 1) */
        m->s.g[i] = (u - 0.5f) * 0.02f;
        m->s.m[i] = (u - 0.5f) * 0.001f;
        m->s.v[i] = u * 1e-6f;
    }
}

static void free_model(model *m) {
    mt_host_store_free(&m->s);
    mt_params_free(&m->t);
}

static mt_optimizer make_optimizer(void) {
    mt_error err;
    mt_optimizer o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1,
                      .max_grad_norm = 1.0f, .step = 3};
    o.sched = mt_lr_schedule_make(MT_LR_COSINE, 3e-4, 2, 100);
    cr_assert_eq(mt_optim_cpu_init(&o.cpu, 0, &err), 0, "%s", err.msg);
    return o;
}

/* Two updates, clipping included; the gate between them. */
Test(optim_pipeline, worker_equals_the_plain_step_and_gates) {
    model a, b;
    make_model(&a, 11);
    make_model(&b, 11);
    mt_optimizer oa = make_optimizer(), ob = make_optimizer();
    mt_optim_pipeline p;
    mt_error err;
    cr_assert_eq(mt_optim_pipeline_init(&p, &ob, &b.s, NULL, &err), 0, "%s", err.msg);
    const int last = b.t.n_layers - 1;
    /* No update running: every layer counts as written. */
    cr_assert_eq(mt_optim_pipeline_gate(&p, last, 0), 1);
    for (int step = 0; step < 2; step++) {
        mt_optim_report ra, rb;
        mt_optimizer_step(&oa, &a.s, &ra);
        double sumsq = 0;
        for (int l = 0; l < b.t.n_layers; l++) sumsq += mt_optimizer_layer_sumsq(&ob, &b.s, l);
        mt_optim_pipeline_start(&p, sumsq, &rb);
        cr_assert_lt(rb.clip_coef, 1.0f, "the test gradient should be clipped");
        cr_assert_eq(ra.clip_coef, rb.clip_coef);
        /* Waiting returns with the layer written, and so every earlier one. */
        cr_assert_eq(mt_optim_pipeline_gate(&p, last, 1), 1);
        pthread_mutex_lock(&p.mu);
        cr_assert(!p.running || p.done > last);
        pthread_mutex_unlock(&p.mu);
        cr_assert_eq(mt_optim_pipeline_gate(&p, 0, 0), 1);
        mt_optim_pipeline_wait_all(&p);
    }
    cr_assert_eq(oa.step, ob.step);
    const size_t n = a.t.total * sizeof(float);
    cr_assert(!memcmp(a.s.w, b.s.w, n), "weights differ");
    cr_assert(!memcmp(a.s.m, b.s.m, n), "first moments differ");
    cr_assert(!memcmp(a.s.v, b.s.v, n), "second moments differ");
    mt_optim_pipeline_free(&p);
    free_model(&a);
    free_model(&b);
}
