/* Long sequences on the planner: bf16 saved inputs take half the host
 * bytes of fp32 ones, the 8B preset with one 131072-token sequence fits an
 * 80 GB GPU and 118 GB of host with them and part of the Adam state on
 * disk, a refusal names them, and fp32 runs refuse them. */
#include <criterion/criterion.h>

#include <string.h>

#include "plan/planner.h"
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
