/* The planner tests' request: a preset's shape and its parameter table,
 * the request, and the plan made from it. */
#ifndef MT_TEST_PLAN_CHECK_H
#define MT_TEST_PLAN_CHECK_H

#include <stdint.h>

#include "plan/planner.h"

typedef struct mt_test_planned {
    mt_config cfg;
    mt_param_table t;
    mt_plan_request q;
    mt_plan p;
} mt_test_planned;

/* A preset at T tokens a row, M micro-batches of B rows, bf16, within
 * gpu_budget and host_budget bytes (0: the planner's default) with the
 * H200's assumed rates; every choice the planner's (disk and the rest for
 * the caller to set). No plan yet: x->p is empty until mt_test_replan. */
void mt_test_request(mt_test_planned *x, const char *preset, int64_t T, int M, int64_t B,
                     double gpu_budget, double host_budget);

/* The 8B preset so, on an 80 GB GPU (79 GB budget), the host budget the
 * planner's. */
void mt_test_request_8b(mt_test_planned *x, int64_t T, int M, int64_t B);

/* (Re)makes x->p from x->q (a plan that does not fit is made too). */
void mt_test_replan(mt_test_planned *x);

/* The placement text mt_plan_print writes for x (freed by the caller). */
char *mt_test_plan_text(const mt_test_planned *x);

void mt_test_planned_free(mt_test_planned *x);

#endif
