/* The planner tests' request (plan_check.h). */
#include "plan_check.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "model/presets.h"

void mt_test_request(mt_test_planned *x, const char *preset, int64_t T, int M, int64_t B,
                     double gpu_budget, double host_budget) {
    mt_error err;
    memset(x, 0, sizeof *x);
    mt_preset_config(mt_preset_find(preset), T, &x->cfg);
    cr_assert_eq(mt_params_init(&x->t, &x->cfg, &err), 0, "%s", err.msg);
    x->q = (mt_plan_request){.cfg = &x->cfg, .t = &x->t, .M = M, .B = B, .T = T,
                             .precision = MT_GPU_BF16, .gpu_budget = gpu_budget,
                             .host_budget = host_budget, .host_grad_dtype = -1,
                             .keep_layers = -1, .device_optim = -1};
    mt_rates_default(&x->q.rates);
}

void mt_test_request_8b(mt_test_planned *x, int64_t T, int M, int64_t B) {
    mt_test_request(x, "8b", T, M, B, 79e9, 0);
}

void mt_test_replan(mt_test_planned *x) {
    mt_error err;
    mt_plan_free(&x->p);
    cr_assert_eq(mt_plan_make(&x->q, &x->p, &err), 0, "%s", err.msg);
}

char *mt_test_plan_text(const mt_test_planned *x) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    mt_plan_print(&x->p, &x->q, f);
    fclose(f);
    return text;
}

void mt_test_planned_free(mt_test_planned *x) {
    mt_plan_free(&x->p);
    mt_params_free(&x->t);
}
