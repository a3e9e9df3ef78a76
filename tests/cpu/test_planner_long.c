/* Long sequences on the planner: bf16 saved inputs take half the host
 * bytes of fp32 ones, the 8B preset with one 131072-token sequence fits an
 * 80 GB GPU and 118 GB of host with them and part of the Adam state on
 * disk, a refusal names them, and fp32 runs refuse them. */
#include <criterion/criterion.h>

#include <string.h>

#include "plan/planner.h"
#include "model/presets.h"

typedef struct planned {
    mt_config cfg;
    mt_param_table t;
    mt_plan_request q;
    mt_plan p;
} planned;

/* The 8B preset, one sequence of T tokens a step, an H100's 79 GB. */
static void request_8b(planned *x, int64_t T, double host_gb, double disk_gb, int saved_bf16) {
    mt_error err;
    mt_preset_config(mt_preset_find("8b"), T, &x->cfg);
    cr_assert_eq(mt_params_init(&x->t, &x->cfg, &err), 0, "%s", err.msg);
    x->q = (mt_plan_request){.cfg = &x->cfg, .t = &x->t, .M = 1, .B = 1, .T = T,
                             .precision = MT_GPU_BF16, .gpu_budget = 79e9,
                             .host_budget = host_gb * 1e9, .host_grad_dtype = -1,
                             .saved_bf16 = saved_bf16, .keep_layers = -1, .device_optim = -1,
                             .disk_budget = disk_gb * 1e9, .disk_layers = disk_gb > 0 ? -1 : 0};
    mt_rates_default(&x->q.rates);
    memset(&x->p, 0, sizeof x->p);
}

static void done(planned *x) {
    mt_plan_free(&x->p);
    mt_params_free(&x->t);
}

Test(planner_long, bf16_saved_inputs_take_half_the_host_bytes) {
    planned x;
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
    done(&x);
}

Test(planner_long, one_131072_token_sequence_of_8b_fits_an_h100_host_with_them) {
    planned a, b;
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
    done(&a);
    done(&b);
}

Test(planner_long, a_refusal_names_bf16_saved_inputs) {
    planned x;
    mt_error err;
    request_8b(&x, 131072, 118, 0, 0);
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert(!x.p.fits);
    cr_assert(strstr(x.p.why, "--saved-input-dtype bf16"), "%s", x.p.why);
    done(&x);
}

/* When the same step fits with bf16 saved inputs, the refusal says so with
 * its prediction, before any smaller step. */
Test(planner_long, a_refusal_says_when_bf16_saved_inputs_fit) {
    planned x;
    mt_error err;
    request_8b(&x, 131072, 118, 30, 0);
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), 0, "%s", err.msg);
    cr_assert(!x.p.fits);
    cr_assert(strstr(x.p.why, "--saved-input-dtype bf16 fits (the same 131072 tokens a step"),
              "%s", x.p.why);
    done(&x);
}

Test(planner_long, fp32_runs_refuse_bf16_saved_inputs) {
    planned x;
    mt_error err;
    request_8b(&x, 4096, 118, 0, 1);
    x.q.precision = MT_GPU_FP32;
    cr_assert_eq(mt_plan_make(&x.q, &x.p, &err), -1);
    cr_assert(strstr(err.msg, "--saved-input-dtype bf16") && strstr(err.msg, "--precision bf16"),
              "%s", err.msg);
    done(&x);
}
