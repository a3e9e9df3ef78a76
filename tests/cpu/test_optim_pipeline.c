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

/* The global sum of squares the engine hands the pipeline. */
static double total_sumsq(const mt_optimizer *o, const model *m) {
    double sumsq = 0;
    for (int l = 0; l < m->t.n_layers; l++) sumsq += mt_optimizer_layer_sumsq(o, &m->s, l);
    return sumsq;
}

static void expect_same_state(const model *a, const model *b) {
    const size_t n = a->t.total * sizeof(float);
    cr_assert(!memcmp(a->s.w, b->s.w, n), "weights differ");
    cr_assert(!memcmp(a->s.m, b->s.m, n), "first moments differ");
    cr_assert(!memcmp(a->s.v, b->s.v, n), "second moments differ");
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
        mt_optim_pipeline_start(&p, total_sumsq(&ob, &b), &rb);
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
    expect_same_state(&a, &b);
    mt_optim_pipeline_free(&p);
    free_model(&a);
    free_model(&b);
}

/* A device that keeps the first layers' state: here a copy of the store's
 * arrays that it updates with the scalars the worker hands it, as the GPU
 * kernel does, and copies back on flush. */
typedef struct fake_device {
    model *m;
    mt_optimizer *o;
    mt_host_store dev;  /* the device layers' weights and moments */
    const mt_optim_report *rep; /* the step's clip coefficient and rate */
    int updates, flushes;
    mt_adamw_coefs coefs[64];
} fake_device;

static void fake_update(void *ctx, int layer, const mt_adamw_coefs *coefs) {
    fake_device *d = ctx;
    const mt_layer_desc *ld = &d->m->t.layers[layer];
    /* the scalars the CPU update of this layer uses */
    mt_optimizer_layer_coefs(d->o, &d->m->t, layer, d->rep->clip_coef, d->rep->lr, d->coefs);
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_adamw_coefs *a = &d->coefs[k], *b = &coefs[k];
        cr_assert(a->gscale == b->gscale && a->decay == b->decay && a->m_weight == b->m_weight &&
                      a->m_base_is_g == b->m_base_is_g && a->beta2 == b->beta2 &&
                      a->one_minus_beta2 == b->one_minus_beta2 && a->bc2_sqrt == b->bc2_sqrt &&
                      a->eps == b->eps && a->neg_step_size == b->neg_step_size,
                  "layer %d tensor %d: the worker's scalars differ from the optimizer's", layer,
                  k);
    }
    mt_optimizer_update_layer(d->o, &d->dev, layer, mt_grad_f32(d->m->s.g + ld->offset),
                              d->rep->clip_coef, d->rep->lr);
    d->updates++;
}

static void fake_flush(void *ctx) {
    fake_device *d = ctx;
    size_t n = d->m->t.layers[2].offset * sizeof(float); /* layers 0 and 1 */
    memcpy(d->m->s.w, d->dev.w, n);
    memcpy(d->m->s.m, d->dev.m, n);
    memcpy(d->m->s.v, d->dev.v, n);
    d->flushes++;
}

/* Layers 0 and 1 go to the device's update (not the store's), the rest to
 * the CPU; waiting for the updates alone leaves the store behind, waiting
 * for all flushes it once, and the result is the plain step's bit for bit. */
Test(optim_pipeline, device_layers_are_handed_over_and_flushed) {
    model a, b;
    make_model(&a, 5);
    make_model(&b, 5);
    mt_optimizer oa = make_optimizer(), ob = make_optimizer();
    mt_error err;
    fake_device d = {.m = &b, .o = &ob};
    cr_assert_eq(mt_host_store_init(&d.dev, &b.t, &err), 0, "%s", err.msg);
    size_t bytes = b.t.total * sizeof(float);
    memcpy(d.dev.w, b.s.w, bytes);
    memcpy(d.dev.m, b.s.m, bytes);
    memcpy(d.dev.v, b.s.v, bytes);
    mt_grad_source src = {.ctx = &d, .n_device = 2, .update = fake_update, .flush = fake_flush};
    mt_optim_pipeline p;
    cr_assert_eq(mt_optim_pipeline_init(&p, &ob, &b.s, &src, &err), 0, "%s", err.msg);
    float w0 = b.s.w[0];
    for (int step = 0; step < 2; step++) {
        mt_optim_report ra, rb;
        mt_optimizer_step(&oa, &a.s, &ra);
        d.rep = &rb;
        mt_optim_pipeline_start(&p, total_sumsq(&ob, &b), &rb);
        mt_optim_pipeline_wait_updates(&p);
        cr_assert_eq(d.updates, 2 * (step + 1));
        if (step == 0) {
            cr_assert_eq(d.flushes, 0, "waiting for the updates flushed");
            cr_assert_eq(b.s.w[0], w0, "a device layer was updated in the store");
        }
    }
    mt_optim_pipeline_wait_all(&p);
    mt_optim_pipeline_wait_all(&p);
    cr_assert_eq(d.flushes, 1, "one flush per run of updates");
    cr_assert_eq(oa.step, ob.step);
    expect_same_state(&a, &b);
    mt_optim_pipeline_free(&p);
    mt_host_store_free(&d.dev);
    free_model(&a);
    free_model(&b);
}

Test(optim_pipeline, device_layers_without_an_update_are_refused) {
    model b;
    make_model(&b, 5);
    mt_optimizer ob = make_optimizer();
    mt_error err;
    mt_grad_source src = {.n_device = 2};
    mt_optim_pipeline p;
    cr_assert_eq(mt_optim_pipeline_init(&p, &ob, &b.s, &src, &err), -1);
    cr_assert(strstr(err.msg, "update function"), "%s", err.msg);
    free_model(&b);
}
