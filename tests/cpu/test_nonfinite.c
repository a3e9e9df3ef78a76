/* Non-finite losses and gradients: the first layer and tensor are named;
 * --on-nonfinite stop|skip, skips counted in metrics.jsonl, --max-skips. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_config.h"
#include "train/train_nonfinite.h"
#include "train/trainer.h"
#include "io/file.h"
#include "model/config.h"
#include "model/params.h"
#include "testlib.h"

static void config(mt_train_config *tc, const char *out, const char *extra) {
    mt_error err;
    cr_assert_eq(mt_test_train_args(tc, &err, "train --out %s --sample-tokens 0 "
                                    "--log-every 1000 %s", out, extra), 0, "%s", err.msg);
}

Test(nonfinite, the_first_non_finite_layer_and_tensor_are_found) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    float *g = calloc(t.total, sizeof *g);
    mt_nonfinite nf = {0};
    cr_assert_eq(mt_nonfinite_find(&nf, &t, g), 0);
    /* poison the last tensor of layer 2 and the first of the last layer */
    const mt_layer_desc *l2 = &t.layers[2], *ll = &t.layers[t.n_layers - 1];
    const mt_tensor_desc *td = &l2->tensors[l2->n_tensors - 1];
    g[l2->offset + td->offset + td->numel - 1] = INFINITY;
    g[ll->offset + ll->tensors[0].offset] = NAN;
    cr_assert_eq(mt_nonfinite_find(&nf, &t, g), 1);
    cr_assert_eq(nf.layer, 2);
    cr_assert_str_eq(nf.tensor, td->name);
    cr_assert(isinf(mt_grad_norm(&t, g)) || isnan(mt_grad_norm(&t, g)));
    /* from per-layer sums of squares (the GPU's): the layer, then the tensor from g */
    double *sq = calloc((size_t)t.n_layers, sizeof *sq);
    sq[2] = INFINITY;
    cr_assert_eq(mt_nonfinite_find_sumsq(&nf, &t, sq, NULL), 1);
    cr_assert_eq(nf.layer, 2);
    cr_assert_str_eq(nf.tensor, "");
    cr_assert_eq(mt_nonfinite_find_sumsq(&nf, &t, sq, g), 1);
    cr_assert_str_eq(nf.tensor, td->name);
    free(sq);
    free(g);
    mt_params_free(&t);
}

/* lr 1e30 blows the weights up after the first update. */
Test(nonfinite, a_diverging_run_stops_naming_the_tensor_or_skips_and_counts,
     .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512], path[700];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 8 --lr 1e30 --warmup-steps 0 --schedule constant --save-every 0");
    cr_assert_eq(mt_train(&tc, &err), -1, "a diverging run must stop");
    cr_assert(strstr(err.msg, "is not finite") && strstr(err.msg, "--on-nonfinite skip"), "%s",
              err.msg);
    cr_assert(strstr(err.msg, "gradient of model.") || strstr(err.msg, "the loss"), "%s", err.msg);
    config(&tc, out, "--steps 8 --lr 1e30 --warmup-steps 0 --schedule constant --save-every 0 "
           "--on-nonfinite skip --max-skips 3 --overwrite");
    cr_assert_eq(mt_train(&tc, &err), -1, "3 skips in a row, then a stop");
    cr_assert(strstr(err.msg, "steps in a row (--max-skips 3)"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    char *m;
    size_t n;
    cr_assert_eq(mt_read_file(path, &m, &n, &err), 0, "%s", err.msg);
    cr_assert(strstr(m, "\"skipped\":1,") && strstr(m, "\"skipped\":3,"), "%s", m);
    cr_assert(strstr(m, "\"loss_text\":") && strstr(m, "\"grad_norm_text\":"), "%s", m);
    cr_assert_null(strstr(m, "\"skipped\":4,"), "%s", m);
    free(m);
    mt_test_rmtree(dir);
    free(dir);
}
