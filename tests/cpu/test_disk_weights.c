/* Tests of the fp32 weights on disk (host/disk_state.h, MT_HOME_DISK_WEIGHTS):
 * a layer's [w | m | v] round-trips through the tier; AdamW updates of such
 * layers give the bits of the same updates in RAM, leave the store the
 * round-to-nearest-even bf16 copy of the new weights and the tensors the
 * GPU reads in fp32 exact, with fewer and more disk layers than staging
 * buffers; checkpoints and the HF save read the fp32 masters from the
 * disk, and a resume puts them back. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/optimizer.h"
#include "host/disk_state.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/kernels.h"
#include "testlib.h"

typedef struct model {
    mt_config cfg;
    mt_param_table t;
    mt_host_store s;
} model;

/* The tiny model with 5 blocks (7 layers: more than the staging buffers). */
static void make_table(model *m) {
    mt_error err;
    mt_config_default_tiny(&m->cfg);
    m->cfg.L = 5;
    cr_assert_eq(mt_params_init(&m->t, &m->cfg, &err), 0, "%s", err.msg);
}

/* Random weights, moments and a gradient (seeded) in every tensor of t
 * (the padding between them 0, as in a run): every term of the update
 * matters. */
static void fill_random(const mt_param_table *t, mt_host_store *s, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int l = 0; l < t->n_layers; l++)
        for (int k = 0; k < t->layers[l].n_tensors; k++) {
            const mt_tensor_desc *td = &t->layers[l].tensors[k];
            size_t at = t->layers[l].offset + td->offset;
            for (size_t i = at; i < at + td->numel; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                const float u = (float)(x >> 40) / (float)(1 << 24); /* [0, 1) */
                s->w[i] = (u - 0.5f) * 0.1f + (td->ndim == 1 ? 1.0f : 0.0f);
                s->m[i] = (u - 0.5f) * 0.001f;
                s->v[i] = u * 1e-6f;
                s->g[i] = (0.5f - u) * 0.02f;
            }
        }
}

/* A RAM store a and a store b of the same table with the last n layers'
 * state on disk (the last nw of them with their weights), both holding the
 * same random state and gradient. */
static void make_pair(model *a, model *b, int n, int nw, const char *dir) {
    mt_error err;
    make_table(a);
    make_table(b);
    cr_assert_eq(mt_host_store_init(&a->s, &a->t, &err), 0, "%s", err.msg);
    fill_random(&a->t, &a->s, 5);
    cr_assert_eq(mt_disk_store_create(&b->s, &b->t, 1, n, nw, dir, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_disk_state_weight_layers(b->s.disk), nw);
    for (int l = 0; l < b->t.n_layers; l++) {
        size_t at = b->t.layers[l].offset;
        cr_assert_eq(mt_disk_layer_write(&b->s, l, a->s.w + at, a->s.m + at, a->s.v + at, &err),
                     0, "%s", err.msg);
    }
    memcpy(b->s.g, a->s.g, a->t.total * sizeof(float));
}

static void free_model(model *m) {
    mt_disk_state_close(m->s.disk);
    mt_host_store_free(&m->s);
    mt_params_free(&m->t);
}

/* b's layers (read through the tier) hold a's bits; where b's weights are
 * on disk, its bf16 copy is bf16(a's w) (round to nearest even) and the
 * tensors the GPU reads in fp32 are a's. */
static void expect_same_state(const model *a, const model *b) {
    const mt_param_table *t = &a->t;
    size_t most = t->max_layer_numel + 1;
    float *w = malloc(most * 4), *m = malloc(most * 4), *v = malloc(most * 4);
    mt_error err;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        size_t at = ld->offset, bytes = ld->numel * sizeof(float);
        cr_assert_eq(mt_disk_layer_read(&b->s, l, w, m, v, &err), 0, "%s", err.msg);
        cr_assert(!memcmp(w, a->s.w + at, bytes), "layer %d: weights differ", l);
        cr_assert(!memcmp(m, a->s.m + at, bytes), "layer %d: m differs", l);
        cr_assert(!memcmp(v, a->s.v + at, bytes), "layer %d: v differs", l);
        if (!mt_disk_state_weights_on_disk(b->s.disk, l)) continue;
        for (size_t i = 0; i < ld->numel; i++)
            cr_assert_eq(b->s.w16[at + i], mt_bf16_rne(a->s.w[at + i]),
                         "layer %d: bf16 copy of element %zu", l, i);
        for (int k = 0; k < ld->n_tensors; k++) {
            const mt_tensor_desc *td = &ld->tensors[k];
            if (!mt_tensor_read_fp32(td)) continue;
            cr_assert(!memcmp(b->s.w + at + td->offset, a->s.w + at + td->offset,
                              td->numel * sizeof(float)), "layer %d: %s not exact", l, td->name);
        }
    }
    free(w);
    free(m);
    free(v);
}

static mt_optimizer make_optimizer(void) {
    mt_error err;
    mt_optimizer o = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1,
                      .max_grad_norm = 1.0f, .step = 3};
    o.sched = mt_lr_schedule_make(MT_LR_COSINE, 3e-3, 2, 100);
    cr_assert_eq(mt_optim_cpu_init(&o.cpu, 0, &err), 0, "%s", err.msg);
    return o;
}

Test(disk_weights, a_layer_round_trips_its_weights_and_state) {
    char *dir = mt_test_tmpdir();
    model a, b;
    make_pair(&a, &b, 4, 2, dir);
    expect_same_state(&a, &b);
    /* what stays in RAM: the bf16 copy and the exact tensors, not the rest */
    size_t ram = 0;
    for (int l = 0; l < a.t.n_layers; l++) ram += a.t.layers[l].numel * 4 * 4;
    cr_assert_lt(b.s.bytes, ram, "the store of b takes %zu bytes, a RAM one %zu", b.s.bytes, ram);
    free_model(&a);
    free_model(&b);
    mt_test_rmtree(dir);
    free(dir);
}

/* Three steps of both stores, fp32 then bf16 gradients, with n disk layers
 * and the weights of nw of them on disk. */
static void updates_match(int n, int nw) {
    char *dir = mt_test_tmpdir();
    model a, b;
    make_pair(&a, &b, n, nw, dir);
    mt_optimizer oa = make_optimizer(), ob = make_optimizer();
    for (int step = 0; step < 3; step++) {
        mt_optim_report ra, rb;
        mt_optimizer_step(&oa, &a.s, &ra);
        mt_optimizer_step(&ob, &b.s, &rb);
        cr_assert_eq(ra.clip_coef, rb.clip_coef);
    }
    uint16_t *g16 = malloc(a.t.total * sizeof *g16);
    for (size_t i = 0; i < a.t.total; i++) g16[i] = mt_bf16_rne(a.s.g[i]);
    for (int l = 0; l < a.t.n_layers; l++) {
        mt_grad_view g = {g16 + a.t.layers[l].offset, 1};
        mt_optimizer_update_layer(&oa, &a.s, l, g, 0.5f, 1e-3);
        mt_optimizer_update_layer(&ob, &b.s, l, g, 0.5f, 1e-3);
    }
    free(g16);
    mt_error err;
    cr_assert_eq(mt_disk_state_error(b.s.disk, &err), 0, "%s", err.msg);
    expect_same_state(&a, &b);
    free_model(&a);
    free_model(&b);
    mt_test_rmtree(dir);
    free(dir);
}

Test(disk_weights, updates_give_the_ram_bits_fewer_layers_than_buffers) { updates_match(2, 2); }
Test(disk_weights, updates_give_the_ram_bits_one_weight_layer) { updates_match(2, 1); }
Test(disk_weights, updates_give_the_ram_bits_more_layers_than_buffers) { updates_match(6, 5); }

/* A checkpoint of a store with weights on disk, loaded into a fresh one
 * and into a RAM store, holds the fp32 weights, m and v; the HF save holds
 * the fp32 weights. */
Test(disk_weights, checkpoints_and_the_hf_save_read_the_masters_from_disk) {
    char *dir = mt_test_tmpdir(), out[600], nv[600], nv2[600], hf[600], saved[1200];
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(nv, sizeof nv, "%s", dir);
    snprintf(hf, sizeof hf, "%s/hf", dir);
    model a, b, c, d;
    make_pair(&a, &b, 4, 3, nv);
    mt_error err;
    cr_assert_eq(mt_checkpoint_save(out, 7, &b.s, &b.cfg, "{}", 0, saved, sizeof saved, &err), 0,
                 "%s", err.msg);
    /* into a fresh store with the same tier, and into one all in RAM */
    snprintf(nv2, sizeof nv2, "%s/out", dir);
    make_table(&c);
    cr_assert_eq(mt_disk_store_create(&c.s, &c.t, 0, 4, 3, nv2, &err), 0, "%s", err.msg);
    char *js = NULL;
    cr_assert_eq(mt_checkpoint_load(saved, &c.s, &c.cfg, &js, &err), 0, "%s", err.msg);
    free(js);
    expect_same_state(&a, &c);
    make_table(&d);
    cr_assert_eq(mt_host_store_create(&d.s, &d.t, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_checkpoint_load(saved, &d.s, &d.cfg, &js, &err), 0, "%s", err.msg);
    free(js);
    expect_same_state(&a, &d);
    /* the HF model: the fp32 masters */
    cr_assert_eq(mt_model_save(&b.s, &b.cfg, hf, MT_DTYPE_F32, (size_t)1 << 30, &err), 0, "%s",
                 err.msg);
    memset(d.s.w, 0, d.t.total * sizeof(float));
    cr_assert_eq(mt_model_load_weights(&d.s, hf, &err), 0, "%s", err.msg);
    cr_assert(!memcmp(d.s.w, a.s.w, a.t.total * sizeof(float)), "the HF save's weights differ");
    free_model(&a);
    free_model(&b);
    free_model(&c);
    free_model(&d);
    mt_test_rmtree(dir);
    free(dir);
}

/* The CPU backend computes with the fp32 weights in RAM: train refuses
 * weights on disk there, naming the option and the fix. */
Test(disk_weights, the_cpu_refuses_them_by_name, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[600];
    snprintf(out, sizeof out, "%s/out", dir);
    char *argv[] = {"train", "--device", "cpu", "--steps", "1", "--out", out, "--nvme-dir", dir,
                    "--disk-weight-layers", "1", NULL};
    char *o = NULL, *e = NULL;
    cr_assert_neq(mt_test_cli_output(argv, &o, &e), 0, "%s", o);
    cr_assert(strstr(e, "--disk-weight-layers 1") && strstr(e, "--device cuda"), "%s", e);
    free(o);
    free(e);
    mt_test_rmtree(dir);
    free(dir);
}
