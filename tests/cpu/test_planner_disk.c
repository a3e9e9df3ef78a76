/* The planner's disk tier: the Adam m and v of the last layers go to disk
 * only when nothing cheaper makes the host budget hold the run, as few
 * layers as it needs, within the disk budget; the step model counts the
 * disk's reads and writes and says when they bound the step. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/disk_state.h"
#include "model/presets.h"
#include "plan/planner.h"
#include "plan_check.h"
#include "testlib.h"

/* The 8B preset at 64k tokens a step on an 80 GB GPU; host and disk
 * budgets in GB (disk 0: no disk tier), disk layers -1 (the planner's) or
 * fixed. */
static void plan_8b(mt_test_planned *x, double host_gb, double disk_gb, int disk_layers) {
    mt_test_request_8b(x, 2048, 4, 8);
    x->q.host_budget = host_gb * 1e9;
    x->q.disk_budget = disk_gb * 1e9;
    x->q.disk_layers = disk_layers;
    mt_test_replan(x);
}

/* Bytes of the m and v of the last n layers. */
static double mv_bytes(const mt_param_table *t, int n) {
    double b = 0;
    for (int l = t->n_layers - n; l < t->n_layers; l++) b += 8.0 * (double)t->layers[l].numel;
    return b;
}

/* The 8B's store is 96 GB (12 bytes a parameter): a 70 GB host cannot hold
 * it, with every gradient and saved input moved to the GPU. fp32 host
 * gradients, so that every plan compared rounds the same. */
Test(planner_disk, a_host_short_of_the_store_puts_the_last_layers_on_disk_as_few_as_pay) {
    mt_test_planned x;
    plan_8b(&x, 70, 1000, -1);
    x.q.host_grad_dtype = 0;
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert(x.p.n_disk > 0 && x.p.n_disk < x.p.n_layers, "%d layers on disk", x.p.n_disk);
    cr_assert(x.p.host_bytes <= x.q.host_budget, "host %.1f GB", x.p.host_bytes / 1e9);
    cr_assert_float_eq(x.p.disk_bytes, mv_bytes(&x.t, x.p.n_disk), 1.0);
    /* no plan with fewer layers on disk fits and is faster */
    int n = x.p.n_disk;
    double step = x.p.pred.step;
    for (int k = 0; k < n; k++) {
        x.q.disk_layers = k;
        mt_test_replan(&x);
        cr_assert(!x.p.fits || x.p.pred.step >= step - 1e-9,
                  "%d disk layers fit in %.3f s, the planner's %d in %.3f s", k, x.p.pred.step, n,
                  step);
    }
    x.q.disk_layers = n;
    mt_test_replan(&x);
    cr_assert(x.p.fits && x.p.n_disk == n, "%s", x.p.why);
    mt_test_planned_free(&x);
}

Test(planner_disk, without_a_disk_the_same_run_is_refused_naming_the_disk_tier) {
    mt_test_planned x;
    plan_8b(&x, 70, 0, -1);
    cr_assert(!x.p.fits);
    cr_assert(strstr(x.p.why, "--nvme-dir"), "%s", x.p.why);
    mt_test_planned_free(&x);
}

Test(planner_disk, a_host_that_holds_the_run_keeps_every_layer_in_ram) {
    mt_test_planned x;
    plan_8b(&x, 129.7, 1000, -1);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_eq(x.p.n_disk, 0);
    cr_assert_eq(x.p.pred.disk_busy, 0);
    mt_test_planned_free(&x);
}

Test(planner_disk, a_disk_budget_short_of_the_state_is_refused_naming_it) {
    mt_test_planned x;
    plan_8b(&x, 70, 1, -1);
    cr_assert(!x.p.fits);
    cr_assert(strstr(x.p.why, "disk budget"), "%s", x.p.why);
    mt_test_planned_free(&x);
}

/* The reads and writes of the disk layers' state (16 bytes a parameter a
 * step) cannot take less than their bytes at the rate of both at once,
 * and a slower disk never makes the step faster. */
Test(planner_disk, the_step_counts_the_disk_traffic) {
    mt_test_planned x;
    plan_8b(&x, 70, 1000, -1);
    cr_assert(x.p.fits, "%s", x.p.why);
    double bytes = 2 * mv_bytes(&x.t, x.p.n_disk);
    /* assumed 2 GB/s each way (no measurement), reads and writes sharing the
     * drives: all the bytes at 2e9 */
    cr_assert_float_eq(x.p.pred.disk_busy, bytes / 2e9, 1e-6 * bytes / 2e9);
    /* (1 - 1e-9: the step's sum and the bytes' quotient round apart) */
    cr_assert(x.p.pred.step >= bytes / 2e9 * (1 - 1e-9), "step %.4f s", x.p.pred.step);
    x.q.rates.disk_read_gbs = 2.0;
    x.q.rates.disk_write_gbs = 2.3;
    x.q.rates.disk_both_gbs = 1.0;
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert(x.p.pred.step >= 2 * mv_bytes(&x.t, x.p.n_disk) / 1e9 * (1 - 1e-9), "step %.2f s",
              x.p.pred.step);
    double slow = x.p.pred.step;
    x.q.rates.disk_both_gbs = 4.0;
    mt_test_replan(&x);
    cr_assert(x.p.pred.step <= slow, "%.3f s with a faster disk, %.3f s before", x.p.pred.step,
              slow);
    mt_test_planned_free(&x);
}

Test(planner_disk, more_layers_on_disk_are_never_faster) {
    mt_test_planned x;
    plan_8b(&x, 129.7, 1000, 0);
    double prev = x.p.pred.step;
    for (int n = 2; n <= 32; n += 10) {
        x.q.disk_layers = n;
        mt_test_replan(&x);
        cr_assert(x.p.fits, "%s", x.p.why);
        cr_assert(x.p.pred.step >= prev - 1e-9, "%d layers: %.3f s, fewer: %.3f s", n,
                  x.p.pred.step, prev);
        prev = x.p.pred.step;
    }
    mt_test_planned_free(&x);
}

Test(planner_disk, the_plan_says_where_the_state_lives_and_what_bounds_the_step) {
    mt_test_planned x;
    plan_8b(&x, 70, 1000, -1);
    char *text = mt_test_plan_text(&x);
    cr_assert(strstr(text, "disk: the Adam m and v of layers"), "%s", text);
    cr_assert(strstr(text, "assumed: measure them with megatrain calibrate --nvme-dir"), "%s",
              text);
    /* a few of the 8B's layers on a 2 GB/s disk take longer than its step */
    cr_assert(strstr(text, "the disk bounds the step"), "%s", text);
    free(text);
    mt_test_planned_free(&x);
}

/* Seconds the disk adds to x's step. */
static double disk_adds(const mt_test_planned *x) {
    mt_plan ram = x->p;
    ram.n_disk = 0;
    return x->p.pred.step - mt_plan_predict(&x->q, &ram).step;
}

/* The N of "(--micro-batches N) would hide it" in text; 0 if none. */
static int hinted_micro_batches(const char *text) {
    const char *key = "(--micro-batches ", *h = strstr(text, key);
    return h ? atoi(h + strlen(key)) : 0;
}

/* The tokens the print says would hide the disk do: the plan of that many
 * micro-batches fits and its disk adds at most 2%, and one fewer does not
 * hide it. Where no number that fits does (the saved inputs grow with the
 * tokens), the print says so instead. */
Test(planner_disk, the_tokens_said_to_hide_the_disk_hide_it) {
    const double gbps[] = {2, 32};
    int hinted = 0;
    for (int i = 0; i < 2; i++) {
        mt_test_planned x;
        plan_8b(&x, 75, 1000, -1);
        x.q.rates.disk_read_gbs = x.q.rates.disk_write_gbs = gbps[i];
        mt_test_replan(&x);
        cr_assert(x.p.fits, "%s", x.p.why);
        char *text = mt_test_plan_text(&x);
        cr_assert(strstr(text, "the disk bounds the step"), "%.0f GB/s: %s", gbps[i], text);
        int M = hinted_micro_batches(text);
        if (!M) {
            cr_assert(strstr(text, "no number of tokens that fits the budgets hides it"), "%s",
                      text);
        } else {
            cr_assert_gt(M, 4);
            x.q.M = M;
            mt_test_replan(&x);
            cr_assert(x.p.fits, "%d micro-batches: %s", M, x.p.why);
            cr_assert_leq(disk_adds(&x), 0.02 * x.p.pred.step, "%d micro-batches", M);
            x.q.M = M - 1;
            mt_test_replan(&x);
            cr_assert(!x.p.fits || disk_adds(&x) > 0.02 * x.p.pred.step, "%d", M - 1);
            hinted++;
        }
        free(text);
        mt_test_planned_free(&x);
    }
    cr_assert_gt(hinted, 0, "no rate gave a number of tokens: the test checks nothing");
}

/* A layer's AdamW runs either on the GPU (the first layers, their moments
 * copied there) or on the CPU beside the disk (the last ones), never both. */
Test(planner_disk, device_layers_stop_where_disk_layers_start) {
    mt_test_planned x;
    plan_8b(&x, 129.7, 1000, 10);
    x.q.device_optim = 30;
    x.q.gpu_budget = 1000e9; /* a GPU that would hold 30 layers' state */
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_eq(x.p.n_disk, 10);
    cr_assert_eq(x.p.n_dev, x.p.n_layers - 10);
    for (int l = 0; l < x.p.n_dev; l++) cr_assert(!x.p.homes[l].grad_host, "layer %d", l);
    x.q.device_optim = -1; /* the planner's choice, with room for every layer */
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert(x.p.n_dev + x.p.n_disk <= x.p.n_layers, "%d device and %d disk layers of %d",
              x.p.n_dev, x.p.n_disk, x.p.n_layers);
    mt_test_planned_free(&x);
}

/* The ranks of one machine each keep their parts of the disk layers' m and
 * v on its drives, and move them in the same moments of their steps: a
 * rank's disk bytes are its part (rank 0's, the largest, about a quarter
 * of 4), and its disk is busy as long as one GPU's with the whole state,
 * its share of the rates being a quarter too; ranks on machines of their
 * own (one sharer each) are done in about a quarter of it. */
Test(planner_disk, the_ranks_of_a_machine_share_its_disk) {
    mt_test_planned one, four;
    plan_8b(&one, 140, 1000, 12);
    one.q.host_grad_dtype = 0;
    mt_test_replan(&one);
    cr_assert(one.p.fits && one.p.n_disk == 12, "%s", one.p.why);
    plan_8b(&four, 140.0 / 4, 1000.0 / 4, 12);
    four.q.host_grad_dtype = 0;
    four.q.M = 1; /* the step's 4 micro-batches, one a rank */
    four.q.ranks = 4;
    four.q.disk_sharers = 4;
    mt_test_replan(&four);
    cr_assert(four.p.fits && four.p.n_disk == 12, "%s", four.p.why);
    double part = four.p.disk_bytes / one.p.disk_bytes;
    cr_assert(part >= 0.25 && part < 0.2501, "rank 0's disk bytes: %.5f of one GPU's", part);
    double busy = four.p.pred.disk_busy / one.p.pred.disk_busy;
    /* the same bytes through the machine at the same rates, the first
     * rank's part a hair over a quarter */
    cr_assert(busy >= 0.999 && busy < 1.001, "a rank's disk busy %.3f s, one GPU's %.3f s",
              four.p.pred.disk_busy, one.p.pred.disk_busy);
    four.q.disk_sharers = 1;
    mt_test_replan(&four);
    busy = four.p.pred.disk_busy / one.p.pred.disk_busy;
    cr_assert(busy >= 0.25 && busy < 0.2501, "a drive of its own: busy %.4f of one GPU's", busy);
    mt_test_planned_free(&one);
    mt_test_planned_free(&four);
}
