/* Mixing several data sources with weights: the share of rows of each
 * source (within a binomial bound), determinism by seed, exact resume
 * through the position's JSON (and in a training run), the end of a
 * mixture, the `data` list in YAML, flags and config.yaml, and every error
 * naming the source and the fix. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_config.h"
#include "train/trainer.h"
#include "data/data_spec.h"
#include "data/dataset.h"
#include "io/file.h"
#include "testlib.h"

/* A JSONL file of n documents of the letter c (the bytes tokenizer makes
 * every token of a source's rows c, BOS or EOS), lengths 20..49. */
static char *letter_file(const char *dir, const char *name, char c, int n) {
    char *p = mt_path_join(dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"text\": \"");
        for (int k = 0; k < 20 + (i * 7) % 30; k++) fputc(c, f);
        fprintf(f, "\"}\n");
    }
    fclose(f);
    return p;
}

static mt_dataset *open_mix(const char *spec, uint64_t seed, int64_t epochs, mt_error *err) {
    static mt_tokenizer *tok;
    if (!tok) tok = mt_tokenizer_bytes();
    mt_data_opts o = {.path = spec, .format = "auto", .seed = seed, .epochs = epochs};
    return mt_dataset_open(&o, tok, 258, err);
}

/* Which letter a row holds (the first of 'a'..'z' in it). */
static int row_letter(const int32_t *x, int64_t T) {
    for (int64_t t = 0; t < T; t++)
        if (x[t] >= 'a' && x[t] <= 'z') return x[t];
    return 0;
}

Test(data_mix, weights_are_honoured_within_a_binomial_bound) {
    char *dir = mt_test_tmpdir(), *a = letter_file(dir, "a.jsonl", 'a', 40),
         *b = letter_file(dir, "b.jsonl", 'b', 300), *c = letter_file(dir, "c.jsonl", 'c', 7);
    char spec[1024];
    /* weights 1 : 2 : 5, not summing to 1; c is tiny and is repeated */
    snprintf(spec, sizeof spec, "[{path: %s, weight: 1}, {path: %s, weight: 2}, %s]", a, b, c);
    /* c as a bare path weighs 1: shares 1/4, 2/4, 1/4 */
    mt_error err = {{0}};
    mt_dataset *d = open_mix(spec, 5, 1000, &err);
    cr_assert(d, "%s", err.msg);
    cr_assert_eq(mt_dataset_stats(d).sources, 3);
    enum { T = 8, N = 40000 };
    int32_t x[T], y[T];
    long count[3] = {0};
    for (int i = 0; i < N; i++) {
        cr_assert_eq(mt_dataset_next_batch(d, 1, T, x, y, NULL), 0);
        int l = row_letter(x, T);
        cr_assert(l >= 'a' && l <= 'c', "row %d has no letter", i);
        for (int t = 0; t < T; t++)
            cr_assert(x[t] == l || x[t] >= 256, "row %d mixes sources", i);
        count[l - 'a']++;
    }
    const double p[3] = {0.25, 0.5, 0.25};
    for (int s = 0; s < 3; s++) {
        /* Binomial(N, p): a correct sampler lands within 5 standard
         * deviations with probability 1 - 6e-7 */
        double sd = sqrt(N * p[s] * (1 - p[s]));
        cr_expect(fabs((double)count[s] - N * p[s]) <= 5 * sd, "source %d: %ld rows of %d, "
                  "expected %.0f +- %.0f", s, count[s], N, N * p[s], 5 * sd);
    }
    mt_dataset_free(d);
    free(a), free(b), free(c);
    mt_test_rmtree(dir);
    free(dir);
}

/* Issue 29: weights 1e308 and 1e308 summed to inf, every share became nan
 * and one source drew every row ("-nan% of rows"). They are normalised by
 * the largest first: half the rows each. A weight too small beside another
 * for a row ever to be drawn from it is refused, naming it. */
Test(data_mix, weights_that_overflow_a_sum_are_normalised_safely) {
    char *dir = mt_test_tmpdir(), *a = letter_file(dir, "a.jsonl", 'a', 40),
         *b = letter_file(dir, "b.jsonl", 'b', 40);
    char spec[1024];
    snprintf(spec, sizeof spec, "[{path: %s, weight: 1e308}, {path: %s, weight: 1e308}]", a, b);
    mt_error err = {{0}};
    mt_dataset *d = open_mix(spec, 5, 1000, &err);
    cr_assert(d, "%s", err.msg);
    enum { T = 8, N = 4000 };
    int32_t x[T], y[T];
    long count[2] = {0};
    for (int i = 0; i < N; i++) {
        cr_assert_eq(mt_dataset_next_batch(d, 1, T, x, y, NULL), 0);
        int l = row_letter(x, T);
        cr_assert(l == 'a' || l == 'b');
        count[l - 'a']++;
    }
    /* Binomial(4000, 1/2): 5 standard deviations are 158 rows */
    cr_assert(fabs((double)count[0] - N / 2.0) <= 5 * sqrt(N / 4.0), "%ld and %ld rows",
              count[0], count[1]);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mt_dataset_print_sources(d, f);
    fclose(f);
    cr_assert(strstr(text, "(50.0% of rows)") && !strstr(text, "nan"), "%s", text);
    free(text);
    mt_dataset_free(d);
    snprintf(spec, sizeof spec, "[{path: %s, weight: 1e300}, {path: %s, weight: 1e-300}]", a, b);
    cr_assert_null(open_mix(spec, 5, 1000, &err));
    cr_assert(strstr(err.msg, "data[1]") && strstr(err.msg, b) && strstr(err.msg, "never"),
              "%s", err.msg);
    free(a), free(b);
    mt_test_rmtree(dir);
    free(dir);
}

Test(data_mix, the_same_seed_gives_the_same_rows_and_resume_is_exact) {
    char *dir = mt_test_tmpdir(), *a = letter_file(dir, "a.jsonl", 'a', 30),
         *b = letter_file(dir, "b.jsonl", 'b', 11);
    char spec[1024];
    snprintf(spec, sizeof spec, "[{path: %s, weight: 0.7}, {path: %s, weight: 0.3}]", a, b);
    mt_error err = {{0}};
    enum { B = 3, T = 16, N = 60 };  // b (11 docs) runs through several epochs
    static int32_t xs[N][B * T], ys[N][B * T];
    int32_t x[B * T], y[B * T];
    mt_dataset *d = open_mix(spec, 9, 50, &err);
    cr_assert(d, "%s", err.msg);
    cJSON *saved = NULL;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(mt_dataset_next_batch(d, B, T, xs[i], ys[i], NULL), 0);
        if (i == 24) saved = mt_dataset_pos_to_json(d);
    }
    /* same seed: the same rows */
    mt_dataset *e = open_mix(spec, 9, 50, &err);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(mt_dataset_next_batch(e, B, T, x, y, NULL), 0);
        cr_assert(!memcmp(x, xs[i], sizeof x) && !memcmp(y, ys[i], sizeof y), "batch %d", i);
    }
    mt_dataset_free(e);
    /* another seed: another choice of sources */
    mt_dataset *f = open_mix(spec, 10, 50, &err);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(mt_dataset_next_batch(f, B, T, x, y, NULL), 0);
        for (int r = 0; r < B; r++) differ += row_letter(x + r * T, T) != row_letter(xs[i] + r * T, T);
    }
    cr_expect_gt(differ, 10);
    mt_dataset_free(f);
    /* a fresh dataset set to the saved position continues exactly */
    char *txt = cJSON_PrintUnformatted(saved);
    cJSON *back = cJSON_Parse(txt);
    cr_assert(cJSON_GetObjectItem(back, "draws") && cJSON_GetObjectItem(back, "sources"), "%s", txt);
    mt_dataset *g = open_mix(spec, 9, 50, &err);
    cr_assert_eq(mt_dataset_pos_from_json(g, back, &err), 0, "%s", err.msg);
    for (int i = 25; i < N; i++) {
        cr_assert_eq(mt_dataset_next_batch(g, B, T, x, y, NULL), 0);
        cr_assert(!memcmp(x, xs[i], sizeof x) && !memcmp(y, ys[i], sizeof y), "resumed batch %d", i);
    }
    /* a position of other data is refused, naming it */
    cJSON_SetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(back, "sources"), 1),
                                             "tokens"), 5);
    cr_assert_eq(mt_dataset_pos_from_json(g, back, &err), -1);
    cr_expect(strstr(err.msg, "data[1]") && strstr(err.msg, "b.jsonl") && strstr(err.msg, "same data"),
              "%s", err.msg);
    mt_dataset_free(g);
    cJSON_Delete(back), cJSON_Delete(saved), free(txt);
    mt_dataset_free(d);
    free(a), free(b);
    mt_test_rmtree(dir);
    free(dir);
}

Test(data_mix, a_mixture_ends_after_epochs_times_its_rows) {
    char *dir = mt_test_tmpdir(), *a = letter_file(dir, "a.jsonl", 'a', 10),
         *b = letter_file(dir, "b.jsonl", 'b', 10);
    char spec[1024];
    snprintf(spec, sizeof spec, "[%s, %s]", a, b);
    mt_error err = {{0}};
    mt_dataset *d = open_mix(spec, 1, 3, &err);
    cr_assert(d, "%s", err.msg);
    enum { T = 9 };
    int64_t R = mt_dataset_rows_per_epoch(d, T), rows = 0;
    cr_assert_gt(R, 40);
    int32_t x[2 * T], y[2 * T];
    while (mt_dataset_next_batch(d, 2, T, x, y, NULL) == 0) rows += 2;
    cr_expect_eq(rows, 3 * R / 2 * 2, "%lld rows of %lld x 3", (long long)rows, (long long)R);
    mt_data_pos p = mt_dataset_get_pos(d);
    cr_expect(p.epoch == 3 * R / 2 * 2 / R && p.row == 3 * R / 2 * 2 % R);
    mt_dataset_free(d);
    free(a), free(b);
    mt_test_rmtree(dir);
    free(dir);
}

static void expect_spec_error(const char *spec, const char *s1, const char *s2) {
    mt_error err = {{0}};
    mt_dataset *d = open_mix(spec, 1, 1, &err);
    cr_assert_null(d, "accepted %s", spec);
    cr_assert(strstr(err.msg, s1), "'%s' not in: %s", s1, err.msg);
    cr_assert(strstr(err.msg, s2), "'%s' not in: %s", s2, err.msg);
}

Test(data_mix, bad_lists_are_errors_naming_the_source_and_the_fix) {
    char *dir = mt_test_tmpdir(), *a = letter_file(dir, "a.jsonl", 'a', 10);
    char spec[1200];
    snprintf(spec, sizeof spec, "[{path: %s, weight: 0}, {path: x, weight: 1}]", a);
    expect_spec_error(spec, "data[0]", "weight 0 is not positive");
    snprintf(spec, sizeof spec, "[{path: %s, weight: 1}, {path: x, weight: -0.3}]", a);
    expect_spec_error(spec, "data[1] (x)", "weight > 0");
    expect_spec_error("[{path: x, weight: lots}]", "data[0] (x)", "not a number");
    expect_spec_error("[{path: x, weight: .nan}]", "data[0] (x)", "not a number");
    expect_spec_error("[]", "the list is empty", "{path: FILE, weight: W}");
    expect_spec_error("[{weight: 1}]", "data[0]", "no `path`");
    expect_spec_error("[{path: a, wieght: 1}]", "unknown key 'wieght'", "path` and `weight`");
    expect_spec_error("[{path: a, path: b}]", "data[0]", "given twice");
    expect_spec_error("[{path: [a, b]}]", "data[0]", "needs a single value");
    expect_spec_error("[{path: a, weight: 1}", "not a valid list", "[{path: a.jsonl, weight: 0.7}");
    expect_spec_error("[a] [b]", "data", "");
    snprintf(spec, sizeof spec, "[%s, %s/missing.jsonl]", a, dir);
    expect_spec_error(spec, "data[1]: ", "missing.jsonl: cannot open");
    /* a source shorter than one row */
    char *tiny = mt_path_join(dir, "tiny.jsonl");
    FILE *f = fopen(tiny, "wb");
    fputs("{\"text\": \"hi\"}\n", f);
    fclose(f);
    snprintf(spec, sizeof spec, "[%s, {path: %s, weight: 0.1}]", a, tiny);
    mt_error err = {{0}};
    mt_dataset *d = open_mix(spec, 1, 1, &err);
    cr_assert(d, "%s", err.msg);
    cr_assert_eq(mt_dataset_check_rows(d, 16, &err), -1);
    cr_expect(strstr(err.msg, "data[1]") && strstr(err.msg, "tiny.jsonl") &&
              strstr(err.msg, "fewer than one row"), "%s", err.msg);
    int32_t x[16], y[16];
    cr_expect_eq(mt_dataset_next_batch(d, 1, 16, x, y, NULL), 1, "no row from a source without rows");
    mt_dataset_free(d);
    free(tiny), free(a);
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- the `data` option ---- */

static int parse_args(mt_train_config *cfg, mt_error *err, const char *a1, const char *a2,
                      const char *a3, const char *a4) {
    char *argv[] = {"train", (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL};
    int argc = 1;
    while (argv[argc]) argc++;
    return mt_train_config_parse_args(cfg, argc, argv, err);
}

Test(data_mix, the_data_list_in_yaml_flags_and_config_yaml) {
    char *dir = mt_test_tmpdir(), *yaml = mt_path_join(dir, "run.yaml");
    FILE *f = fopen(yaml, "wb");
    fputs("data:\n  - path: web.jsonl.zst\n    weight: 0.7\n  - {path: \"code dir/\", weight: 3e-1}\n"
          "  - extra.jsonl\nseq_len: 32\n", f);
    fclose(f);
    const char *canon = "[{path: \"web.jsonl.zst\", weight: 0.7}, {path: \"code dir/\", weight: 0.3}, "
                        "{path: \"extra.jsonl\", weight: 1}]";
    mt_train_config cfg, back;
    mt_error err = {{0}};
    cr_assert_eq(parse_args(&cfg, &err, "--config", yaml, NULL, NULL), 0, "%s", err.msg);
    cr_expect_str_eq(cfg.data, canon);
    /* the flag, spelt otherwise, gives the same canonical text */
    cr_assert_eq(parse_args(&cfg, &err, "--data", "[ {weight: .7, path: web.jsonl.zst},"
                            "{path: 'code dir/', weight: 0.30}, extra.jsonl ]", NULL, NULL), 0,
                 "%s", err.msg);
    cr_expect_str_eq(cfg.data, canon);
    /* config.yaml writes the list as YAML, which reads back the same */
    char *out = mt_path_join(dir, "config.yaml");
    cr_assert_eq(mt_train_config_save_yaml(&cfg, out, &err), 0, "%s", err.msg);
    size_t len;
    char *text;
    cr_assert_eq(mt_read_file(out, &text, &len, &err), 0);
    cr_expect(strstr(text, "\ndata: [{path:"), "%s", text);
    mt_train_config_defaults(&back);
    cr_assert_eq(mt_train_config_load_yaml(&back, out, &err), 0, "%s", err.msg);
    cr_expect_str_eq(back.data, canon);
    free(text);
    /* a plain path stays a path */
    cr_assert_eq(parse_args(&cfg, &err, "--data", "my data.jsonl", NULL, NULL), 0, "%s", err.msg);
    cr_expect_str_eq(cfg.data, "my data.jsonl");
    /* errors name the option, the file and line */
    f = fopen(yaml, "wb");
    fputs("seq_len: 32\ndata:\n  - {path: a.jsonl, weight: 0.5}\n  - {path: b/, weight: 0}\n", f);
    fclose(f);
    cr_assert_eq(parse_args(&cfg, &err, "--config", yaml, NULL, NULL), -1);
    cr_expect(strstr(err.msg, "run.yaml:4: data[1] (b/)") && strstr(err.msg, "not positive"), "%s", err.msg);
    cr_assert_eq(parse_args(&cfg, &err, "--data", "[{path: a, weight: -1}]", NULL, NULL), -1);
    cr_expect(strstr(err.msg, "data[0] (a): weight -1 is not positive"), "%s", err.msg);
    cr_assert_eq(parse_args(&cfg, &err, "--eval-data", "[a, b]", NULL, NULL), -1);
    cr_expect(strstr(err.msg, "eval_data: give one file or directory"), "%s", err.msg);
    cr_assert_eq(parse_args(&cfg, &err, "--eval-every", "10", NULL, NULL), -1);
    cr_expect(strstr(err.msg, "eval_every: set eval_data"), "%s", err.msg);
    free(out), free(yaml);
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- in a training run ---- */

static void train(const char *out, const char *data, const char *extra) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s --out %s --steps 12 --save-every 6 --save-dtype fp32 "
             "--sample-tokens 0 --log-every 1000 --seq-len 32 --epochs 10 --no-tensorboard", extra, out);
    char *argv[64] = {"train", "--data", (char *)data};
    int argc = 3;
    for (char *tok = strtok(buf, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
    mt_train_config tc;
    mt_error err;
    cr_assert_eq(mt_train_config_parse_args(&tc, argc, argv, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
}

static char *slurp(const char *path) {
    char *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(path, &buf, &len, &err), 0, "%s", err.msg);
    return buf;
}

/* The "loss" fields of metrics.jsonl, in order. */
static void losses(const char *out, char *buf, size_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    char *m = slurp(p), *q = m;
    size_t used = 0;
    buf[0] = 0;
    while ((q = strstr(q, "\"loss\":"))) {
        size_t k = strcspn(q, ",}");
        used += (size_t)snprintf(buf + used, n - used, "%.*s;", (int)k, q);
        q += k;
    }
    free(m);
}

Test(data_mix, a_resumed_mixed_run_repeats_the_uninterrupted_one, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), *a = letter_file(dir, "a.jsonl", 'a', 60),
         *b = letter_file(dir, "b.jsonl", 'b', 25);
    char spec[1024], ra[1024], rb[1024], cmd[2200];
    snprintf(spec, sizeof spec, "[{path: %s, weight: 0.6}, {path: %s, weight: 0.4}]", a, b);
    snprintf(ra, sizeof ra, "%s/a", dir);
    snprintf(rb, sizeof rb, "%s/b", dir);
    train(ra, spec, "");
    train(rb, spec, "");
    snprintf(cmd, sizeof cmd, "rm -rf %s/checkpoints/step-00000012 %s/model", rb, rb);
    cr_assert_eq(system(cmd), 0);
    train(rb, spec, "--resume auto");
    static char la[1 << 14], lb[1 << 14];
    losses(ra, la, sizeof la);
    losses(rb, lb, sizeof lb);
    cr_expect_str_eq(la, lb);
    char pa[1100], pb[1100];
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", ra);
    snprintf(pb, sizeof pb, "%s/model/model.safetensors", rb);
    char *wa, *wb;
    size_t na, nb;
    mt_error err;
    cr_assert_eq(mt_read_file(pa, &wa, &na, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_read_file(pb, &wb, &nb, &err), 0, "%s", err.msg);
    cr_expect(na == nb && !memcmp(wa, wb, na), "final weights differ");
    free(wa), free(wb);
    free(a), free(b);
    mt_test_rmtree(dir);
    free(dir);
}
