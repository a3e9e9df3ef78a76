/* Checks of a family's CPU reference against one transformers fixture of
 * scripts/make_fixtures.py (docs/fixtures.md), shared by the families'
 * tests (test_model_hf.c, test_neox.c, test_falcon.c, test_phi3.c,
 * test_gemma.c). Each asserts with Criterion and logs the worst errors it
 * saw; the tolerances, and where their numbers come from, are the calling
 * test's. */
#ifndef MT_TEST_HF_CHECK_H
#define MT_TEST_HF_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "engine/optimizer.h"
#include "fixture.h"

struct mt_config;

/* The config.json of fixture model `model`, read into *c. */
void mt_hf_fixture_config(const char *model, struct mt_config *c);

/* The AdamW of the fixture's train.json (betas, eps, decay, clipping, the
 * schedule) in *opt, its CPU threads started; returns the steps it ran. */
int64_t mt_hf_fixture_optimizer(mt_fixture *f, mt_optimizer *opt);

/* Relative L2 errors per tensor (mt_test_rel_err) allowed. */
typedef struct mt_hf_tols {
    double logits, loss, grad; /* one forward and backward */
    double traj;               /* losses, weights, Adam m and v after the 5 AdamW steps */
} mt_hf_tols;

/* Loss and every parameter's gradient, with one micro-batch of B rows and
 * B micro-batches of one row; the logits of the first. */
void mt_hf_check_forward_backward(const char *model, const mt_hf_tols *tol);

/* The fixture's 5-step AdamW trajectory (train.json's hyperparameters):
 * each step's loss, gradient norm and learning rate (some step clipped),
 * then the weights, m and v. */
void mt_hf_check_trajectory(const char *model, const mt_hf_tols *tol);

/* What megatrain saves holds exactly the published tensor names and shapes
 * of the checkpoint it read, its config.json reads back to the same
 * config, and it reloads to bit-identical fp32 logits. */
void mt_hf_check_save_reload(const char *model);

/* The checks every family runs on each of its fixtures after the first
 * forward and backward, as Criterion tests of `suite` over the models of
 * `models` (index array `idx`, one entry a model): the 5-step AdamW
 * trajectory and the save then reload (mt_hf_check_trajectory,
 * mt_hf_check_save_reload). */
#define MT_HF_FAMILY_TESTS(suite, models, idx, tols)                                        \
    ParameterizedTestParameters(suite, five_step_adamw_trajectory) {                        \
        return cr_make_param_array(int, idx, sizeof idx / sizeof *idx);                     \
    }                                                                                       \
    ParameterizedTest(int *which, suite, five_step_adamw_trajectory) {                      \
        mt_hf_check_trajectory(models[*which], &tols);                                      \
    }                                                                                       \
    ParameterizedTestParameters(suite, save_then_reload_gives_the_same_logits) {            \
        return cr_make_param_array(int, idx, sizeof idx / sizeof *idx);                     \
    }                                                                                       \
    ParameterizedTest(int *which, suite, save_then_reload_gives_the_same_logits) {          \
        mt_hf_check_save_reload(models[*which]);                                            \
    }

/* A config.json field that must be refused, and the name the error gives. */
typedef struct mt_hf_refusal {
    const char *extra, *field;
} mt_hf_refusal;

/* Each case's extra, added to the fields of base ("\"a\": 1, ..."), makes
 * mt_config_parse fail naming the case's field. */
void mt_hf_check_refusals(const char *base, const mt_hf_refusal *cases, size_t n);

/* The shape the families' `init` tests make (hidden 64, 2 layers, 4 heads,
 * 2 kv heads, ffn 128, 64 positions, init std 0.1) as model_type. */
struct mt_model_shape;
struct mt_model_info;
void mt_hf_tiny_shape(struct mt_model_shape *s, const char *model_type);

/* `init` of shape s into the directory model, with the fixtures' byte-level
 * tokenizer: its model_type and parameter count checked, its config read
 * into *c. */
void mt_hf_init_model(const char *model, const struct mt_model_shape *s,
                      struct mt_model_info *info, struct mt_config *c);

/* The model made by init in `model` trains 16 CPU steps on repetitive text
 * (its data and run written under dir): the loss falls by more than 1 nat
 * from ~ln(V) at random init, and the saved model's config is read into
 * *saved. `label` names the model in the log. */
void mt_hf_check_trains_on_cpu(const char *model, const char *dir, const char *label,
                               struct mt_config *saved);

#endif
