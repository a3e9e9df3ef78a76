/* Tests of src/dist/shard_optim.{h,c}: n ranks' AdamW over their shards
 * against the one-process optimizer (src/engine/optimizer.c) on the same
 * store and gradients. AdamW is elementwise, so the updated shards put side
 * by side must equal the unsharded update bitwise; the global sum of
 * squares, added over shards, differs only by the order of fp64 additions. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dist/shard_optim.h"
#include "host/store.h"
#include "testlib.h"

static void make_opt(mt_optimizer *o) {
    mt_error err;
    memset(o, 0, sizeof *o);
    cr_assert_eq(mt_optim_cpu_init(&o->cpu, 1, &err), 0, "%s", err.msg);
    o->sched = mt_lr_schedule_make(MT_LR_COSINE, 1e-3, 1, 10);
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->max_grad_norm = 1.0f;  /* the gradients below have norms ~100: clipping is active */
}

/* A gradient: uniform on every tensor, 0 on the padding (as backward leaves it). */
static void fill_grad(const mt_param_table *t, float *g, unsigned long long seed) {
    memset(g, 0, t->total * sizeof(float));
    for (int l = 0; l < t->n_layers; l++)
        for (int k = 0; k < t->layers[l].n_tensors; k++) {
            const mt_tensor_desc *td = &t->layers[l].tensors[k];
            mt_test_fill_uniform(g + t->layers[l].offset + td->offset, td->numel,
                                 seed * 100 + (unsigned long long)(l * 16 + k), -1.0f, 1.0f);
        }
}

/* Bound on |a - b| for two fp64 sums, in different orders, of the same
 * N >= 1 non-negative terms with exact sum S: each is within (N-1)*u*S of S
 * (u = 2^-53; recursive summation, Higham, "Accuracy and Stability of
 * Numerical Algorithms", 2nd ed., eq. 4.4). The terms are squares of
 * floats, exact in double, so addition is the only error. */
static double sum_bound(size_t n, double s) { return 2.0 * (double)(n - 1) * 0x1p-53 * s; }

static void check_config(const mt_config *cfg, int ranks, int steps) {
    mt_error err;
    mt_param_table t;
    cr_assert_eq(mt_params_init(&t, cfg, &err), 0, "%s", err.msg);
    mt_host_store ref;
    cr_assert_eq(mt_host_store_init(&ref, &t, &err), 0, "%s", err.msg);
    mt_test_fill_uniform(ref.w, t.total, 1, -1.0f, 1.0f);
    mt_test_fill_uniform(ref.m, t.total, 2, -0.1f, 0.1f);
    mt_test_fill_uniform(ref.v, t.total, 3, 0.0f, 0.01f);
    mt_shard_store *sh = calloc((size_t)ranks, sizeof *sh);
    mt_optimizer *so = calloc((size_t)ranks, sizeof *so);
    for (int r = 0; r < ranks; r++) {
        cr_assert_eq(mt_shard_store_init(&sh[r], &t, r, ranks, 1, &err), 0, "%s", err.msg);
        mt_shard_take(&sh[r].layout, ref.w, sh[r].w);
        mt_shard_take(&sh[r].layout, ref.m, sh[r].m);
        mt_shard_take(&sh[r].layout, ref.v, sh[r].v);
        make_opt(&so[r]);
    }
    mt_optimizer o;
    make_opt(&o);
    for (int step = 0; step < steps; step++) {
        fill_grad(&t, ref.g, (unsigned long long)step + 10);
        double want = 0;
        for (int l = 0; l < t.n_layers; l++) want += mt_optimizer_layer_sumsq(&o, &ref, l);
        mt_optim_report want_rep;
        mt_optimizer_step(&o, &ref, &want_rep);
        /* each rank's sum of squares of its gradient shard, added in rank order */
        double total = 0;
        for (int r = 0; r < ranks; r++) {
            mt_shard_take(&sh[r].layout, ref.g, sh[r].g);
            total += mt_shard_optim_sumsq(&so[r], &sh[r], sh[r].g);
        }
        cr_assert(fabs(total - want) <= sum_bound(t.total, want),
                  "%d ranks step %d: sum of squares %.17g, unsharded %.17g", ranks, step, total,
                  want);
        for (int r = 0; r < ranks; r++) {
            mt_optim_report rep;
            mt_shard_optim_apply(&so[r], &sh[r], sh[r].g, total, &rep);
            cr_assert_eq(rep.clip_coef, want_rep.clip_coef, "%d ranks step %d", ranks, step);
            cr_assert_eq(rep.lr, want_rep.lr);
            cr_assert_eq(so[r].step, o.step);
        }
    }
    /* the shards side by side are the unsharded store, bit for bit */
    float *got = malloc(t.total * sizeof(float));
    float *want_arrays[3] = {ref.w, ref.m, ref.v};
    const char *names[3] = {"w", "m", "v"};
    for (int a = 0; a < 3; a++) {
        memset(got, 0xFF, t.total * sizeof(float));
        for (int r = 0; r < ranks; r++) {
            float *local[3] = {sh[r].w, sh[r].m, sh[r].v};
            mt_shard_put(&sh[r].layout, local[a], got);
        }
        cr_assert(!memcmp(got, want_arrays[a], t.total * sizeof(float)),
                  "%d ranks: %s differs from the unsharded update", ranks, names[a]);
    }
    free(got);
    for (int r = 0; r < ranks; r++) mt_shard_store_free(&sh[r]);
    free(sh);
    free(so);
    mt_host_store_free(&ref);
    mt_params_free(&t);
}

Test(dist_optim, shards_equal_unsharded_bitwise) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    for (int ranks = 1; ranks <= 5; ranks++) check_config(&cfg, ranks, 3);
}

Test(dist_optim, untied_with_biases_and_qk_norms) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    cfg.tie_embeddings = false;
    cfg.qkv_bias = true;
    cfg.qk_norm = true;
    cfg.V = 1001;
    for (int ranks = 2; ranks <= 7; ranks += 5) check_config(&cfg, ranks, 2);
}
