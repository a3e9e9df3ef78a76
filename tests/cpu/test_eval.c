/* Held-out evaluation in a training run: eval rows every N steps and after
 * the last, each equal to the evaluation of the checkpoint saved at that
 * step by a separate inference backend (what `megatrain eval` builds), and
 * the errors of eval data that cannot make a batch. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/runner.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "engine/heldout.h"
#include "io/file.h"
#include "testlib.h"

/* Deterministic English-like JSONL: n lines of about 80 bytes. */
static char *held_out(const char *dir, const char *name, int n) {
    static const char *const w[] = {"the", "jury", "said", "that", "city", "was", "fine",
                                    "and", "old", "man", "went", "home"};
    char *p = mt_path_join(dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"text\": \"");
        for (int k = 0; k < 14; k++) fprintf(f, "%s%s", k ? " " : "", w[(i * 7 + k * 5) % 12]);
        fprintf(f, " (%d).\"}\n", i);
    }
    fclose(f);
    return p;
}

static int run_train(const char *extra, mt_error *err) {
    mt_train_config tc;
    if (mt_test_train_args(&tc, err, "train --device cpu --sample-tokens 0 --log-every 1000 "
                           "--no-tensorboard %s", extra))
        return -2;
    return mt_train(&tc, err);
}

/* Loss of the checkpoint at step on data, through an inference backend of
 * M x (B, T), as `megatrain eval --micro-batches M` builds one. */
static double eval_checkpoint(const char *out, int64_t step, const char *data, int M, int64_t B,
                              int64_t T, int64_t *tokens) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/checkpoints/step-%08lld", out, (long long)step);
    mt_loaded_model m;
    mt_error err;
    cr_assert_eq(mt_loaded_model_open(&m, dir, "bytes", &err), 0, "%s", err.msg);
    mt_runner r;
    mt_runner_opts ro = {.device = 1};
    cr_assert_eq(mt_runner_init(&r, &m.cfg, &m.table, &m.store, M, B, T, &ro, &err), 0, "%s", err.msg);
    mt_data_opts o = {.path = data, .format = "auto", .seed = MT_EVAL_SEED, .epochs = 1};
    mt_dataset *d = mt_dataset_open(&o, m.tok, m.cfg.V, &err);
    cr_assert(d, "%s", err.msg);
    int32_t *x = malloc((size_t)(M * B * T) * sizeof *x), *y = malloc((size_t)(M * B * T) * sizeof *y);
    mt_eval_totals res;
    cr_assert_eq(mt_eval_dataset(r.be, m.table.n_layers, d, M, 0, M, B, T, 0, x, y, NULL, &res, &err), 0,
                 "%s", err.msg);
    free(x), free(y);
    mt_dataset_free(d);
    mt_runner_free(&r);
    mt_loaded_model_close(&m);
    *tokens = res.tokens;
    return res.loss_sum / (double)res.tokens;
}

Test(eval, eval_rows_equal_the_evaluation_of_each_checkpoint, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), *valid = held_out(dir, "valid.jsonl", 40), extra[2048], out[1024];
    snprintf(out, sizeof out, "%s/run", dir);
    /* the tiny model's rows: 2 micro-batches of 8 rows of 64 tokens */
    snprintf(extra, sizeof extra, "--out %s --steps 7 --save-every 3 --keep-last 10 "
             "--eval-data %s --eval-every 3", out, valid);
    mt_error err;
    cr_assert_eq(run_train(extra, &err), 0, "%s", err.msg);
    char path[1200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    char *text;
    size_t len;
    cr_assert_eq(mt_read_file(path, &text, &len, &err), 0, "%s", err.msg);
    int64_t want_steps[] = {3, 6, 7}, n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *ev = cJSON_GetObjectItem(j, "eval_loss");
        if (ev) {
            cr_assert_lt(n, 3, "more eval rows than expected");
            int64_t step = (int64_t)cJSON_GetObjectItem(j, "step")->valuedouble, tokens;
            cr_expect_eq(step, want_steps[n], "eval row %lld at step %lld", (long long)n, (long long)step);
            cr_expect_null(cJSON_GetObjectItem(j, "loss"), "an eval row has no training loss");
            double want = eval_checkpoint(out, step, valid, 2, 8, 64, &tokens);
            /* metrics.jsonl prints %.9g: the same text is the same number at that precision */
            char a[64], b[64];
            snprintf(a, sizeof a, "%.9g", want);
            snprintf(b, sizeof b, "%.9g", ev->valuedouble);
            cr_expect_str_eq(b, a, "step %lld", (long long)step);
            cr_expect_eq((int64_t)cJSON_GetObjectItem(j, "eval_tokens")->valuedouble, tokens);
            n++;
        }
        cJSON_Delete(j);
    }
    cr_expect_eq(n, 3);
    free(text);
    free(valid);
    mt_test_rmtree(dir);
    free(dir);
}

/* Held-out data of fewer rows than a batch (2 micro-batches of 8 rows) is
 * evaluated, its last batch partial; data shorter than one row is an
 * error at the start. */
Test(eval, eval_data_shorter_than_a_row_is_an_error) {
    char *dir = mt_test_tmpdir(), *valid = held_out(dir, "small.jsonl", 3), extra[2048];
    mt_error err;
    snprintf(extra, sizeof extra, "--out %s/run --steps 2 --eval-data %s", dir, valid);
    cr_assert_eq(run_train(extra, &err), 0, "%s", err.msg);
    char *tiny = mt_path_join(dir, "tiny.jsonl");
    FILE *f = fopen(tiny, "wb");
    cr_assert(f);
    fputs("{\"text\": \"the jury said\"}\n", f);
    fclose(f);
    snprintf(extra, sizeof extra, "--out %s/run2 --steps 2 --eval-data %s", dir, tiny);
    cr_assert_eq(run_train(extra, &err), -1);
    cr_expect(strstr(err.msg, "eval_data: ") && strstr(err.msg, "tiny.jsonl") &&
              strstr(err.msg, "less than one row"), "%s", err.msg);
    snprintf(extra, sizeof extra, "--out %s/run3 --steps 2 --eval-data %s/none.jsonl", dir, dir);
    cr_assert_eq(run_train(extra, &err), -1);
    cr_expect(strstr(err.msg, "eval_data: ") && strstr(err.msg, "none.jsonl: cannot open"), "%s",
              err.msg);
    free(tiny);
    free(valid);
    mt_test_rmtree(dir);
    free(dir);
}
