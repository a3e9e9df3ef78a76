/* The planner's weights on disk (mt_plan_request.disk_weight_layers): the
 * fp32 weights of the last disk layers go there only when the host budget
 * is short with every layer's m and v on disk already; the step model moves
 * 12 bytes a parameter of those layers on the disk instead of 8 and half
 * their H2D bytes; a request it cannot run is refused naming the option
 * and why. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "host/disk_state.h"
#include "plan/planner.h"
#include "plan_check.h"
#include "testlib.h"

/* The 8B preset at 64k tokens a step on an 80 GB GPU, fp32 host gradients,
 * a 1000 GB disk: a 45 GB host fits it only with weights on disk (with
 * every m and v there the host needs 48.9 GB), a 50 GB one without. */
static void plan_8b(mt_test_planned *x, double host_gb, int weight_layers) {
    mt_test_request_8b(x, 2048, 4, 8);
    x->q.host_grad_dtype = 0;
    x->q.host_budget = host_gb * 1e9;
    x->q.disk_budget = 1000e9;
    x->q.disk_layers = -1;
    x->q.disk_weight_layers = weight_layers;
    mt_test_replan(x);
}

Test(planner_disk_weights, a_host_that_fits_only_with_weights_on_disk_gets_them) {
    mt_test_planned x;
    plan_8b(&x, 45, 0);
    cr_assert(!x.p.fits, "fits without weights on disk: %.1f GB host", x.p.host_bytes / 1e9);
    plan_8b(&x, 45, -1);
    cr_assert(x.p.fits, "%s", x.p.why);
    int nl = x.p.n_layers;
    cr_assert(x.p.n_disk == nl && x.p.n_disk_w > 0 && x.p.n_disk_w < nl, "%d of %d layers",
              x.p.n_disk_w, x.p.n_disk);
    cr_assert(x.p.host_bytes <= x.q.host_budget, "host %.1f GB", x.p.host_bytes / 1e9);
    /* as few as fit */
    x.q.disk_weight_layers = x.p.n_disk_w - 1;
    int n = x.p.n_disk_w;
    mt_test_replan(&x);
    cr_assert(!x.p.fits, "%d weight layers fit too, the planner took %d", n - 1, n);
    x.q.disk_weight_layers = -1;
    mt_test_replan(&x);
    char *text = mt_test_plan_text(&x);
    char want[64];
    snprintf(want, sizeof want, "the fp32 weights of layers %d-%d too", nl - n, nl - 1);
    cr_assert(strstr(text, want) && strstr(text, "bf16 copy"), "%s", text);
    free(text);
    /* a host that holds the weights keeps them */
    plan_8b(&x, 50, -1);
    cr_assert(x.p.fits && x.p.n_disk_w == 0, "%d weight layers on disk", x.p.n_disk_w);
    mt_test_planned_free(&x);
}

/* 4 more bytes a parameter of those layers on disk, each way; 2 fewer
 * over PCIe each pass. */
Test(planner_disk_weights, the_step_model_moves_their_bytes) {
    mt_test_planned x;
    plan_8b(&x, 200, 0);
    x.q.disk_layers = 10;
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    mt_plan base = x.p;
    x.p.homes = NULL;
    x.q.disk_weight_layers = 4;
    mt_test_replan(&x);
    cr_assert(x.p.fits && x.p.n_disk == 10 && x.p.n_disk_w == 4, "%s", x.p.why);
    double params = 0;
    for (int l = x.p.n_layers - 4; l < x.p.n_layers; l++) params += (double)x.t.layers[l].numel;
    cr_assert_float_eq(x.p.disk_bytes - base.disk_bytes, 4.0 * params, 1.0);
    cr_assert(x.p.pred.disk_busy > base.pred.disk_busy, "disk %.3f s, was %.3f s",
              x.p.pred.disk_busy, base.pred.disk_busy);
    cr_assert(x.p.pred.h2d_busy < base.pred.h2d_busy, "H2D %.3f s, was %.3f s",
              x.p.pred.h2d_busy, base.pred.h2d_busy);
    /* the RAM: the weights less their bf16 copy, less the larger staging (host/disk_state.h) */
    double disk, freed_w, freed_0;
    mt_disk_tier_sizes(&x.t, 10, 4, &disk, &freed_w);
    mt_disk_tier_sizes(&x.t, 10, 0, &disk, &freed_0);
    cr_assert_float_eq(base.store_bytes - x.p.store_bytes, freed_w - freed_0, 1.0,
                       "store %.2f GB, was %.2f GB", x.p.store_bytes / 1e9,
                       base.store_bytes / 1e9);
    mt_plan_free(&base);
    mt_test_planned_free(&x);
}

/* What cannot run is refused before planning, naming the option and why. */
Test(planner_disk_weights, refusals_name_the_option_and_why) {
    mt_test_planned x;
    plan_8b(&x, 200, 0);
    mt_plan p;
    mt_error err;
    x.q.disk_weight_layers = 2;
    x.q.ranks = 2;
    cr_assert_eq(mt_plan_make(&x.q, &p, &err), -1);
    cr_assert(strstr(err.msg, "--disk-weight-layers 2") && strstr(err.msg, "--gpus 2"), "%s",
              err.msg);
    x.q.ranks = 1;
    x.q.precision = MT_GPU_FP32;
    cr_assert_eq(mt_plan_make(&x.q, &p, &err), -1);
    cr_assert(strstr(err.msg, "--precision fp32"), "%s", err.msg);
    x.q.precision = MT_GPU_BF16;
    x.q.disk_weight_layers = x.t.n_layers;
    cr_assert_eq(mt_plan_make(&x.q, &p, &err), -1);
    cr_assert(strstr(err.msg, "embedding"), "%s", err.msg);
    /* the planner's choice never takes them there */
    x.q.disk_weight_layers = -1;
    x.q.ranks = 2;
    x.q.host_budget = 45e9;
    mt_test_replan(&x);
    cr_assert_eq(x.p.n_disk_w, 0);
    mt_test_planned_free(&x);
}
