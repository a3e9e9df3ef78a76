/* Long sequences on the planner: bf16 saved inputs take half the host
 * bytes of fp32 ones, the 8B preset with one 131072-token sequence fits an
 * 80 GB GPU and 118 GB of host with them and part of the Adam state on
 * disk, a refusal names them, and fp32 runs refuse them. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"
#include "plan/planner_internal.h"
#include "plan_check.h"
#include "model/presets.h"

/* The 8B preset, one sequence of T tokens a step, an H100's 79 GB. */
static void request_8b(mt_test_planned *x, int64_t T, double host_gb, double disk_gb,
                       int saved_bf16) {
    mt_test_request_8b(x, T, 1, 1);
    x->q.host_budget = host_gb * 1e9;
    x->q.saved_bf16 = saved_bf16;
    x->q.disk_budget = disk_gb * 1e9;
    x->q.disk_layers = disk_gb > 0 ? -1 : 0;
}

Test(planner_long, bf16_saved_inputs_take_half_the_host_bytes) {
    mt_test_planned x;
    request_8b(&x, 131072, 500, 0, 0);
    int nl = x.t.n_layers;
    mt_layer_home h[64];
    for (int l = 0; l < nl; l++) h[l] = (mt_layer_home){.grad_host = 1, .saved_host = 1};
    mt_cuda_backend_opts o = {.precision = MT_GPU_BF16, .homes = h};
    size_t h32 = mt_cuda_backend_host_bytes(&x.cfg, &x.t, 1, 1, 131072, &o);
    size_t g32 = mt_cuda_backend_bytes(&x.cfg, &x.t, 1, 1, 131072, &o);
    o.host_saved_bf16 = 1;
    size_t h16 = mt_cuda_backend_host_bytes(&x.cfg, &x.t, 1, 1, 131072, &o);
    size_t g16 = mt_cuda_backend_bytes(&x.cfg, &x.t, 1, 1, 131072, &o);
    /* every layer but the embedding saves its input: 2 bytes a value less */
    cr_assert_eq(h32 - h16, (size_t)(nl - 1) * 131072 * 4096 * 2);
    /* the GPU's conversion chunks, one per copy direction, a few MB each */
    cr_assert(g16 > g32 && g16 - g32 <= 32u << 20, "%zu bytes more on the GPU", g16 - g32);
    mt_test_planned_free(&x);
}

Test(planner_long, one_131072_token_sequence_of_8b_fits_an_h100_host_with_them) {
    mt_test_planned a, b;
    mt_error err;
    request_8b(&a, 131072, 118, 64, 1);
    cr_assert_eq(mt_plan_make(&a.q, &a.p, &err), 0, "%s", err.msg);
    cr_assert(a.p.fits, "%s", a.p.why);
    cr_assert_leq(a.p.host_bytes, a.q.host_budget);
    cr_assert_leq(a.p.gpu_bytes, a.q.gpu_budget);
    cr_assert_gt(a.p.n_disk, 0, "118 GB cannot hold the store and the saved inputs");
    /* fp32 saved inputs need more of the state on disk, or do not fit */
    request_8b(&b, 131072, 118, 64, 0);
    cr_assert_eq(mt_plan_make(&b.q, &b.p, &err), 0, "%s", err.msg);
    cr_assert(!b.p.fits || b.p.disk_bytes > a.p.disk_bytes, "fp32 %.1f GB on disk, bf16 %.1f",
              b.p.disk_bytes / 1e9, a.p.disk_bytes / 1e9);
    mt_test_planned_free(&a);
    mt_test_planned_free(&b);
}

Test(planner_long, a_refusal_names_bf16_saved_inputs) {
    mt_test_planned x;
    mt_error err;
    request_8b(&x, 131072, 118, 0, 0);
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert(!x.p.fits);
    cr_assert(strstr(x.p.why, "--saved-input-dtype bf16"), "%s", x.p.why);
    mt_test_planned_free(&x);
}

/* When the same step fits with bf16 saved inputs, the refusal says so with
 * its prediction, before any smaller step. */
Test(planner_long, a_refusal_says_when_bf16_saved_inputs_fit) {
    mt_test_planned x;
    mt_error err;
    request_8b(&x, 131072, 118, 30, 0);
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert(!x.p.fits);
    cr_assert(strstr(x.p.why, "--saved-input-dtype bf16 fits (the same 131072 tokens a step"),
              "%s", x.p.why);
    mt_test_planned_free(&x);
}

Test(planner_long, fp32_runs_refuse_bf16_saved_inputs) {
    mt_test_planned x;
    mt_error err;
    request_8b(&x, 4096, 118, 0, 1);
    x.q.precision = MT_GPU_FP32;
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), -1);
    cr_assert(strstr(err.msg, "--saved-input-dtype bf16") && strstr(err.msg, "--precision bf16"),
              "%s", err.msg);
    mt_test_planned_free(&x);
}

/* ---- saved inputs on disk (mt_layer_home.saved_disk) ---- */

/* 262144 tokens need an H200's GPU (139 GB budget: one layer's activations
 * for them take more than an H100 has). */
static void request_8b_h200(mt_test_planned *x, double host_gb, double disk_gb) {
    request_8b(x, 262144, host_gb, disk_gb, 0);
    x->q.gpu_budget = 139e9;
}

/* One 262144-token sequence of the 8B in fp32 saved inputs (4.29 GB a
 * layer) on an H200 with 118 GB of host and 2 TB of disk: the Adam state alone on disk
 * is not enough, the saved inputs on disk too are. */
Test(planner_long, a_long_sequence_refused_without_saved_inputs_on_disk_fits_with_them) {
    mt_test_planned x;
    mt_error err;
    request_8b_h200(&x, 118, 2000);
    x.q.disk_saved_layers = 0;
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert(!x.p.fits, "fits with %d Adam layers on disk", x.p.n_disk);
    mt_plan_free(&x.p);
    x.q.disk_saved_layers = -1;
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_gt(x.p.n_disk_saved, 0);
    cr_assert_leq(x.p.host_bytes, x.q.host_budget);
    cr_assert_leq(x.p.disk_bytes + x.p.disk_saved_bytes, x.q.disk_budget);
    for (int l = 0; l < x.p.n_layers; l++)
        cr_assert(!x.p.homes[l].saved_disk || (l >= 1 && l < x.p.n_layers - 2 &&
                                                !x.p.homes[l].saved_host &&
                                                !x.p.homes[l].saved_recompute),
                  "layer %d: on disk and elsewhere, or without a saved input", l);
    mt_test_planned_free(&x);
}

/* The saved inputs share the drives with the Adam state: a block moves in
 * the gaps the Adam state's transfers leave (5 s of transfer issued at 0
 * beside Adam spans [0, 10] and [12, 20]: 2 s in the gap, 3 s after, done
 * at 23), starts at once on an idle disk, and queues behind the one before
 * it. */
Test(planner_long, saved_inputs_move_in_the_gaps_of_the_adam_state) {
    double at[] = {0, 10, 12, 20};
    mt_disk_spans adam = {.at = at, .n = 2, .cap = 2};
    mt_saved_disk_sim s = {.rd = 1e9, .wr = 1e9, .bytes = 5e9, .n_st = 3, .adam = &adam};
    mt_saved_disk_sim_write(&s, 0.0);
    cr_assert_float_eq(s.free_at, 23.0, 1e-9, "ends at %.3f", s.free_at);
    mt_saved_disk_sim_write(&s, 0.0); /* behind it, past the spans */
    cr_assert_float_eq(s.free_at, 28.0, 1e-9, "ends at %.3f", s.free_at);
    mt_saved_disk_sim idle = {.rd = 1e9, .wr = 1e9, .bytes = 5e9, .n_st = 3};
    mt_saved_disk_sim_write(&idle, 1.0);
    cr_assert_float_eq(idle.free_at, 6.0, 1e-9);
    cr_assert_float_eq(s.busy, 10.0, 1e-9, "busy counts its own transfers only");
}

/* The planner's own count of saved inputs on disk is the fastest that fits:
 * no count forced with --disk-saved-layers gives a shorter predicted step
 * (at 262144 tokens in 118 GB of host, more of them on disk than the
 * fewest that fit means fewer rebuilt ones and less Adam state on disk). */
Test(planner_long, the_planner_takes_the_fastest_count_of_saved_inputs_on_disk) {
    mt_test_planned x;
    mt_error err;
    request_8b_h200(&x, 118, 2000);
    x.q.disk_saved_layers = -1; /* the planner's choice */
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert(x.p.fits, "%s", x.p.why);
    double best = x.p.pred.step;
    int chosen = x.p.n_disk_saved, fitting = 0;
    mt_plan_free(&x.p);
    for (int k = 1; k < 34; k++) {
        x.q.disk_saved_layers = k;
        cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
        if (x.p.fits) {
            fitting++;
            cr_assert_geq(x.p.pred.step, best * (1 - 1e-12),
                          "%d saved inputs on disk: %.3f s, the planner's %d: %.3f s", k,
                          x.p.pred.step, chosen, best);
        }
        mt_plan_free(&x.p);
    }
    cr_assert_gt(fitting, 5, "only %d forced counts fit", fitting);
    mt_test_planned_free(&x);
}

/* The 8B at 262144 tokens on an H200 with 400 GB of host and 2 TB of disk,
 * the saved inputs of 6 layers on disk and no Adam state there. */
static void plan_six_saved_on_disk(mt_test_planned *x) {
    request_8b_h200(x, 400, 2000);
    x->q.disk_layers = 0;
    x->q.disk_saved_layers = 6;
}

/* Forced: the first N host-saved inputs (layers 2.., layer 1 is rebuilt
 * from the tokens) on disk, each written once and read once a step at the
 * disk's rates: N * block * (1/write + 1/read) seconds of the disk busy,
 * block = T * C * 4 bytes (a multiple of 4096 already), and a step at
 * least that long. Checked against the hand computation, then on a disk
 * ten times slower, where the disk bounds the step. */
Test(planner_long, saved_inputs_on_disk_are_the_first_ones_and_their_traffic_is_counted) {
    mt_test_planned x;
    plan_six_saved_on_disk(&x);
    x.q.rates.disk_read_gbs = 3.0, x.q.rates.disk_write_gbs = 1.5;
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    cr_assert_eq(x.p.n_disk_saved, 6);
    for (int l = 2; l < 8; l++) cr_assert(x.p.homes[l].saved_disk, "layer %d not on disk", l);
    double block = 262144.0 * 4096 * 4;
    cr_assert_float_eq(x.p.disk_saved_bytes, 6 * block, 1.0);
    double busy = 6 * block / 1.5e9 + 6 * block / 3e9; /* 6.872 s */
    cr_assert_float_eq(x.p.pred.disk_saved_busy, busy, 1e-9 * busy);
    cr_assert_float_eq(x.p.pred.disk_busy, busy, 1e-9 * busy, "no Adam layer on disk");
    cr_assert_geq(x.p.pred.step, busy);
    x.q.rates.disk_read_gbs = 0.3, x.q.rates.disk_write_gbs = 0.15;
    mt_step_prediction slow = mt_plan_predict(&x.q, &x.p);
    cr_assert_float_eq(slow.disk_saved_busy, 10 * busy, 1e-9 * busy);
    cr_assert_geq(slow.step, 10 * busy, "step %.1f s, disk busy %.1f s", slow.step, 10 * busy);
    mt_test_planned_free(&x);
}

/* The placement text names the disk-saved layers and their bytes. */
Test(planner_long, the_plan_says_which_saved_inputs_live_on_disk) {
    mt_test_planned x;
    plan_six_saved_on_disk(&x);
    mt_test_replan(&x);
    cr_assert(x.p.fits, "%s", x.p.why);
    char *text = mt_test_plan_text(&x);
    cr_assert(strstr(text, "layers 2-7       gradient host  saved input disk"), "%s", text);
    cr_assert(strstr(text, "disk: the saved inputs of 6 layers from layer 2, 25.77 GB (4.29 GB "
                           "each;"), "%s", text);
    cr_assert(strstr(text, "12.88 GB of pinned staging"), "%s", text);
    free(text);
    mt_test_planned_free(&x);
}

/* The ranks of several GPUs keep their saved inputs off the disk (they have
 * not run with them there): where one rank's host is short and the planner
 * would move saved inputs to disk, it does not, and asking for them is
 * refused by name. */
Test(planner_long, several_gpus_keep_their_saved_inputs_off_the_disk) {
    mt_test_planned x;
    mt_error err;
    request_8b_h200(&x, 110, 2000);
    x.q.rank = 0;
    x.q.ranks = 2;
    x.q.disk_saved_layers = -1;
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert_eq(x.p.n_disk_saved, 0, "%d saved inputs on disk", x.p.n_disk_saved);
    cr_assert_gt(x.p.n_disk, 0, "the host is not short: nothing tested");
    mt_plan_free(&x.p);
    x.q.disk_saved_layers = 2;
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), -1);
    cr_assert(strstr(err.msg, "--disk-saved-layers 2") && strstr(err.msg, "--gpus 2"), "%s",
              err.msg);
    mt_test_planned_free(&x);
}

/* A refusal without a disk names the disk tier: for one GPU its two uses,
 * for a rank of several the Adam state's only (its saved inputs stay off
 * the disk). */
Test(planner_long, a_refusal_names_the_disk_tier_each_can_use) {
    mt_test_planned x;
    mt_error err;
    request_8b_h200(&x, 40, 0);
    for (int ranks = 1; ranks <= 2; ranks++) {
        x.q.ranks = ranks;
        cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
        cr_assert(!x.p.fits, "40 GB of host fits the 8B");
        const char *want = ranks > 1 ? "the disk tier for the optimizer state (--nvme-dir)"
                                     : "the disk tier for the optimizer state and saved inputs";
        cr_assert(strstr(x.p.why, want), "%d ranks: %s", ranks, x.p.why);
        mt_plan_free(&x.p);
    }
    mt_test_planned_free(&x);
}
