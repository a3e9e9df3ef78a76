/* The step schedule, seen through a backend that records every call:
 * layer-major order, one bind per layer and pass, every micro-batch per
 * layer, recompute-before-backward order, one gradient hand-off per layer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "engine/step.h"

typedef struct rec_backend {
    mt_backend base;
    char log[8192];
    size_t n;
    int train;
} rec_backend;

static void rec(rec_backend *r, const char *fmt, int a, int b) {
    int w = snprintf(r->log + r->n, sizeof r->log - r->n, fmt, a, b);
    cr_assert(w > 0 && (size_t)w < sizeof r->log - r->n);
    r->n += (size_t)w;
}

static int r_begin(mt_backend *be, const mt_batch *b, float dscale, int train, mt_error *err) {
    rec_backend *r = (rec_backend *)be;
    r->train = train;
    rec(r, "S%d%d ", train, b->M);
    return 0;
}
static void r_bind(mt_backend *be, int l, int bw) { rec((rec_backend *)be, "B%d%d ", l, bw); }
static void r_fwd(mt_backend *be, int l, int mb) { rec((rec_backend *)be, "F%d.%d ", l, mb); }
static void r_head(mt_backend *be, int mb) { rec((rec_backend *)be, "H%d ", mb, 0); }
static void r_bwd(mt_backend *be, int l, int mb) { rec((rec_backend *)be, "G%d.%d ", l, mb); }
static void r_done(mt_backend *be, int l) { rec((rec_backend *)be, "D%d ", l, 0); }
static double r_end(mt_backend *be) { return 6.0; }

static const mt_backend_ops rec_ops = {.begin_step = r_begin, .bind_layer = r_bind,
                                       .forward = r_fwd, .head = r_head, .backward = r_bwd,
                                       .layer_grads_done = r_done, .end_step = r_end};

Test(schedule, layer_major_forward_and_backward) {
    rec_backend r = {.base = {.ops = &rec_ops, .name = "rec"}};
    int32_t tok[2 * 1 * 3] = {1, 2, 3, 4, 5, 6};
    int32_t tgt[6] = {2, 3, MT_IGNORE_INDEX, 5, 6, MT_IGNORE_INDEX};
    mt_batch b = {.M = 2, .B = 1, .T = 3, .tokens = tok, .targets = tgt};
    double loss = 0;
    mt_error err;
    /* 4 layers: embedding, two blocks, head. */
    cr_assert_eq(mt_step_forward_backward(&r.base, 4, &b, &loss, &err), 0);
    cr_assert_str_eq(r.log,
                     "S12 B00 F0.0 F0.1 B10 F1.0 F1.1 B20 F2.0 F2.1 "
                     "B31 H0 H1 D3 "
                     "B21 G2.0 G2.1 D2 B11 G1.0 G1.1 D1 B01 G0.0 G0.1 D0 ");
    cr_assert_float_eq(loss, 6.0 / 4, 1e-12, "mean over the 4 valid targets");
}

Test(schedule, eval_runs_forward_and_head_only) {
    rec_backend r = {.base = {.ops = &rec_ops, .name = "rec"}};
    int32_t tok[2] = {1, 2}, tgt[2] = {2, 3};
    mt_batch b = {.M = 1, .B = 1, .T = 2, .tokens = tok, .targets = tgt};
    double sum = 0;
    int64_t nv = 0;
    mt_error err;
    cr_assert_eq(mt_step_eval(&r.base, 3, &b, &sum, &nv, &err), 0);
    cr_assert_str_eq(r.log, "S01 B00 F0.0 B10 F1.0 B20 H0 ");
    cr_assert_eq(nv, 2);
}

Test(schedule, batch_without_targets_is_refused) {
    rec_backend r = {.base = {.ops = &rec_ops, .name = "rec"}};
    int32_t tok[2] = {1, 2}, tgt[2] = {MT_IGNORE_INDEX, MT_IGNORE_INDEX};
    mt_batch b = {.M = 1, .B = 1, .T = 2, .tokens = tok, .targets = tgt};
    double loss;
    mt_error err;
    cr_assert_eq(mt_step_forward_backward(&r.base, 3, &b, &loss, &err), -1);
    cr_assert(strstr(err.msg, "-100"));
    cr_assert_eq(r.n, 0, "nothing ran");
}

static void r_abandon(mt_backend *be) { rec((rec_backend *)be, "X ", 0, 0); }

static const mt_backend_ops rec_stop_ops = {
    .begin_step = r_begin, .bind_layer = r_bind, .forward = r_fwd, .head = r_head,
    .backward = r_bwd, .layer_grads_done = r_done, .end_step = r_end,
    .abandon_step = r_abandon};

/* Says stop once `after` questions were asked. */
static int stop_after(void *ctx) {
    int *left = ctx;
    return (*left)-- <= 0;
}

/* A stop asked during a step (a signal): the step is abandoned at the next
 * layer or micro-batch, with nothing after abandon_step (no end_step, no
 * gradient handed off); a backend without abandon_step finishes the step. */
Test(schedule, a_stop_abandons_the_step_at_the_next_layer_or_micro_batch) {
    int32_t tok[6] = {1, 2, 3, 4, 5, 6}, tgt[6] = {2, 3, 4, 5, 6, 7};
    mt_batch b = {.M = 2, .B = 1, .T = 3, .tokens = tok, .targets = tgt};
    double loss = -1;
    mt_error err;
    rec_backend r = {.base = {.ops = &rec_stop_ops, .name = "rec"}};
    int left = 2; /* asked before B00, F0.1, then B10: stop there */
    mt_step_stop stop = {stop_after, &left};
    cr_assert_eq(mt_step_forward_backward_or_stop(&r.base, 4, &b, &stop, &loss, &err), 1);
    cr_assert_str_eq(r.log, "S12 B00 F0.0 F0.1 X ");
    cr_assert_eq(loss, -1, "no loss");
    rec_backend q = {.base = {.ops = &rec_stop_ops, .name = "rec"}};
    left = 8; /* in the backward, between micro-batches */
    cr_assert_eq(mt_step_forward_backward_or_stop(&q.base, 4, &b, &stop, &loss, &err), 1);
    cr_assert_str_eq(q.log, "S12 B00 F0.0 F0.1 B10 F1.0 F1.1 B20 F2.0 F2.1 B31 H0 H1 D3 "
                            "B21 G2.0 X ");
    rec_backend full = {.base = {.ops = &rec_ops, .name = "rec"}};
    left = 0;
    cr_assert_eq(mt_step_forward_backward_or_stop(&full.base, 4, &b, &stop, &loss, &err), 0);
    cr_assert_float_eq(loss, 1.0, 1e-12, "6 / 6 valid targets: the step finished");
}
