/* The preference objectives on the GPU against the CPU backend (itself
 * checked against TRL by tests/cpu/test_preference.c) on the packed pairs of
 * llama_gqa's preference.safetensors: the answers' log-probabilities, each
 * objective's loss and every gradient, in fp32 and in bf16. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cuda/backend_cuda.h"
#include "engine/preference.h"
#include "engine/step.h"
#include "fixture.h"
#include "gpu_train.h"
#include "testlib.h"

enum { M = 2, B = 2, T = 16, P = 4 };
/* fp32 with TF32 off: summation order only, the bounds of test_engine.c's
 * fp32 runs against HF */
#define TOL32_LOSS 1e-5
#define TOL32_GRAD 2e-4
/* bf16 against the fp32 CPU: test_engine.c's bf16 bounds for the loss and
 * the gradients (twice autocast's distance from fp32); each token's -log p
 * is a cross-entropy, held to the loss's bound. Observed on an H100: log p
 * 8.5e-4, losses 1.1e-4 to 5.3e-3 (hinge), gradients 1.5e-2 to 2.1e-2. */
#define TOL16_LOGP 6e-3
#define TOL16_LOSS 6e-3
#define TOL16_GRAD 6e-2

static const mt_pref_opts configs[] = {
    {MT_PREF_SIGMOID, .beta = 0.5, .label_smoothing = 0.1},
    {MT_PREF_IPO, .beta = 0.5},
    {MT_PREF_HINGE, .beta = 1.0},
    {MT_PREF_SIMPO, .beta = 2.0, .label_smoothing = 0.05, .gamma = 0.5},
    {MT_PREF_ORPO, .lambda = 0.3},
};

typedef struct pairs_batch {
    int32_t *tok, *tgt, *pos;
    mt_batch b;
    mt_pref_pair pairs[P];
} pairs_batch;

static void load_batch(mt_fixture *f, pairs_batch *p) {
    mt_fixture_use_ref(f, "preference.safetensors");
    size_t n = (size_t)M * B * T;
    p->tok = mt_fixture_i32(f, "input_ids", 0, n);
    p->tgt = mt_fixture_i32(f, "targets", 0, n);
    p->pos = mt_fixture_i32(f, "position_ids", 0, n);
    p->b = (mt_batch){.M = M, .B = B, .T = T, .tokens = p->tok, .targets = p->tgt, .pos = p->pos};
    int32_t *sp = mt_fixture_i32(f, "spans", 0, P * 2 * 3);
    float *ref = mt_fixture_f32(f, "ref_logps", NULL);
    for (int i = 0; i < P; i++) {
        const int32_t *c = sp + i * 6, *r = c + 3;
        p->pairs[i] = (mt_pref_pair){{c[0], c[1], c[2]}, {r[0], r[1], r[2]}, ref[2 * i],
                                     ref[2 * i + 1]};
    }
    free(sp), free(ref);
}

/* One step of objective o on be: its loss, the gradient left in g. */
static double pref_step(mt_backend *be, mt_fixture *f, pairs_batch *p, const mt_pref_opts *o,
                        int gpu) {
    mt_pref_step s;
    mt_error err;
    cr_assert_eq(mt_pref_step_init(&s, o, &p->b, p->pairs, P, &err), 0, "%s", err.msg);
    mt_seq_objective obj = {mt_pref_weigh, &s};
    if (gpu) memset(f->store.g, 0x7f, f->table.total * sizeof(float)); /* each grad written */
    cr_assert_eq(mt_step_sequence_or_stop(be, f->table.n_layers, &p->b, &obj, NULL, &err), 0,
                 "%s", err.msg);
    if (gpu) mt_cuda_backend_wait_grads(be);
    double loss = mt_pref_step_metrics(&s).loss;
    mt_pref_step_free(&s);
    return loss;
}

static void match_the_cpu(int precision, double tol_logp, double tol_loss, double tol_grad) {
    mt_test_need_gpu();
    mt_fixture f;
    mt_fixture_open(&f, "llama_gqa");
    pairs_batch p;
    load_batch(&f, &p);
    mt_error err;
    mt_backend *cpu = mt_cpu_backend_create(&f.cfg, &f.table, &f.store, M, B, T, &err);
    cr_assert_not_null(cpu, "%s", err.msg);
    mt_cuda_backend_opts o = {.precision = precision};
    mt_backend *gpu = mt_cuda_backend_create(&f.cfg, &f.table, &f.store, M, B, T, &o, &err);
    cr_assert_not_null(gpu, "%s", err.msg);

    /* the log-probabilities of every target */
    size_t n = (size_t)M * B * T;
    float *lc = malloc(n * sizeof *lc), *lg = malloc(n * sizeof *lg);
    cr_assert_eq(mt_step_logp(cpu, f.table.n_layers, &p.b, lc, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_step_logp(gpu, f.table.n_layers, &p.b, lg, &err), 0, "%s", err.msg);
    double e = mt_test_rel_err(lg, lc, n);
    cr_assert_lt(e, tol_logp, "log-probabilities rel err %.3g", e);

    float *g_cpu = malloc(f.table.total * sizeof *g_cpu);
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        const char *name = mt_pref_loss_name(configs[c].loss);
        double loss_cpu = pref_step(cpu, &f, &p, &configs[c], 0);
        memcpy(g_cpu, f.store.g, f.table.total * sizeof *g_cpu);
        double loss_gpu = pref_step(gpu, &f, &p, &configs[c], 1);
        cr_assert_lt(fabs(loss_gpu - loss_cpu) / fabs(loss_cpu), tol_loss,
                     "%s: loss %.8f (GPU) vs %.8f (CPU)", name, loss_gpu, loss_cpu);
        double worst = 0;
        for (int l = 0; l < f.table.n_layers; l++) {
            const mt_layer_desc *ld = &f.table.layers[l];
            for (int k = 0; k < ld->n_tensors; k++) {
                size_t off = ld->offset + ld->tensors[k].offset, m = ld->tensors[k].numel;
                double et = mt_test_rel_err(f.store.g + off, g_cpu + off, m);
                cr_assert_lt(et, tol_grad, "%s: gradient of %s rel err %.3g", name,
                             ld->tensors[k].name, et);
                worst = fmax(worst, et);
            }
        }
        cr_log_info("%s %s: loss err %.2e, worst gradient err %.2e (log-probabilities %.2e)",
                    precision == MT_GPU_FP32 ? "fp32" : "bf16", name,
                    fabs(loss_gpu - loss_cpu) / fabs(loss_cpu), worst, e);
    }
    free(g_cpu), free(lc), free(lg);
    free(p.tok), free(p.tgt), free(p.pos);
    mt_cuda_backend_free(gpu);
    cpu->ops->destroy(cpu);
    mt_fixture_close(&f);
}

Test(gpu_preference, losses_and_gradients_match_the_cpu, .timeout = 120) {
    match_the_cpu(MT_GPU_FP32, TOL32_LOSS, TOL32_LOSS, TOL32_GRAD);
}

Test(gpu_preference, bf16_losses_and_gradients_stay_near_the_cpu, .timeout = 120) {
    match_the_cpu(MT_GPU_BF16, TOL16_LOGP, TOL16_LOSS, TOL16_GRAD);
}
