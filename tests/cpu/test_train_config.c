/* Tests of the train config: defaults, YAML + flags precedence, every class
 * of error (naming the key, and file:line for YAML), --help from the table,
 * and exact YAML / JSON round trips. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "train/train_config_internal.h"
#include "testlib.h"

/* Writes text to <fresh tmpdir>/name; returns the path (caller frees dir). */
static char *write_tmp(char **dir, const char *name, const char *text) {
    *dir = mt_test_tmpdir();
    char *path = malloc(strlen(*dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", *dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* parse_args on a NULL-terminated list after "train". */
static int parse(mt_train_config *cfg, mt_error *err, const char **args) {
    char *argv[32] = {"train"};
    int argc = 1;
    while (args[argc - 1]) argv[argc] = (char *)args[argc - 1], argc++;
    return mt_train_config_parse_args(cfg, argc, argv, err);
}

/* Loads YAML text over the defaults; returns the status, err filled. */
static int load_text(const char *text, mt_train_config *cfg, mt_error *err) {
    char *dir, *path = write_tmp(&dir, "run.yaml", text);
    mt_train_config_defaults(cfg);
    int rc = mt_train_config_load_yaml(cfg, path, err);
    mt_test_rmtree(dir);
    free(dir);
    free(path);
    return rc;
}

static void expect_yaml_error(const char *text, const char *s1, const char *s2) {
    mt_train_config cfg;
    mt_error err;
    cr_assert_eq(load_text(text, &cfg, &err), -1, "accepted: %s", text);
    cr_assert(strstr(err.msg, s1), "'%s' not in: %s", s1, err.msg);
    cr_assert(strstr(err.msg, s2), "'%s' not in: %s", s2, err.msg);
}

static void expect_args_error(const char **args, const char *s1, const char *s2) {
    mt_train_config cfg;
    mt_error err;
    cr_assert_eq(parse(&cfg, &err, args), -1, "accepted %s", args[0]);
    cr_assert(strstr(err.msg, s1), "'%s' not in: %s", s1, err.msg);
    cr_assert(strstr(err.msg, s2), "'%s' not in: %s", s2, err.msg);
}

Test(train_config, defaults_for_a_real_model) {
    mt_train_config cfg;
    mt_error err;
    const char *args[] = {"--model", "m/llama", NULL};
    cr_assert_eq(parse(&cfg, &err, args), 0, "%s", err.msg);
    cr_assert_eq(cfg.seq_len, 2048);
    cr_assert_eq(cfg.batch_size, 8);
    cr_assert_eq(cfg.micro_batches, 4);
    cr_assert_eq(cfg.lr, 1e-5);
    cr_assert_eq(cfg.beta2, 0.95);
    cr_assert_eq(cfg.schedule, MT_LR_COSINE);
    cr_assert_eq(cfg.precision, MT_TC_PRECISION_BF16);
    cr_assert_str_eq(cfg.tokenizer, "m/llama/tokenizer.json");
    cr_assert_eq(cfg.sample_tokens, 0);
}

Test(train_config, tiny_model_defaults_only_where_not_given) {
    mt_train_config cfg;
    mt_error err;
    const char *args[] = {"--seq-len", "128", NULL};
    cr_assert_eq(parse(&cfg, &err, args), 0, "%s", err.msg);
    cr_assert_eq(cfg.seq_len, 128); // given: kept
    cr_assert_eq(cfg.steps, 800);   // tiny default
    cr_assert_eq(cfg.lr, 1e-2);
    cr_assert_str_eq(cfg.tokenizer, "");
}

Test(train_config, flags_override_yaml_wherever_config_appears) {
    char *dir, *path = write_tmp(&dir, "run.yaml",
                                 "# a comment\nmodel: models/x\nlr: 3e-4\nbatch-size: 4\n"
                                 "schedule: linear\nskip_bad_lines: true\n");
    mt_train_config cfg;
    mt_error err;
    const char *args[] = {"--lr=1e-3", "--no-skip-bad-lines", "--config", path, "--steps", "7",
                          NULL};
    cr_assert_eq(parse(&cfg, &err, args), 0, "%s", err.msg);
    cr_assert_eq(cfg.lr, 1e-3);             // flag beats file, though given before --config
    cr_assert_eq(cfg.batch_size, 4);        // file beats default; '-' in a key
    cr_assert_eq(cfg.schedule, MT_LR_LINEAR);
    cr_assert_not(cfg.skip_bad_lines);
    cr_assert_eq(cfg.steps, 7);
    cr_assert_str_eq(cfg.model, "models/x");
    mt_test_rmtree(dir);
    free(dir);
    free(path);
}

/* host_checkpoints was the first name of host_saved_inputs: a flag, a
 * YAML key, a key of the API and a saved run's state still say it. */
Test(train_config, the_older_name_of_host_saved_inputs_is_still_read) {
    mt_train_config cfg;
    mt_error err;
    const char *args[] = {"--host-checkpoints", NULL};
    cr_assert_eq(parse(&cfg, &err, args), 0, "%s", err.msg);
    cr_assert(cfg.host_saved_inputs);
    mt_train_config_defaults(&cfg);
    cr_assert_eq(mt_train_config_set(&cfg, "host_checkpoints", "true", "run.yaml:3", &err), 0,
                 "%s", err.msg);
    cr_assert(cfg.host_saved_inputs);
    mt_train_config_defaults(&cfg);
    cr_assert_eq(mt_train_config_from_json(&cfg, "{\"host_checkpoints\": true}", &err), 0, "%s",
                 err.msg);
    cr_assert(cfg.host_saved_inputs);
}

Test(train_config, flag_forms) {
    mt_train_config cfg;
    mt_error err;
    const char *args[] = {"--host-saved-inputs", "--skip_bad_lines=yes", "--precision", "FP32",
                          "--device=cpu", "--steps", "1e3", NULL};
    cr_assert_eq(parse(&cfg, &err, args), 0, "%s", err.msg);
    cr_assert(cfg.host_saved_inputs);
    cr_assert(cfg.skip_bad_lines);
    cr_assert_eq(cfg.precision, MT_TC_PRECISION_FP32);
    cr_assert_eq(cfg.device, MT_DEVICE_CPU);
    cr_assert_eq(cfg.steps, 1000);
}

Test(train_config, help_returns_one) {
    mt_train_config cfg;
    mt_error err;
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w"); // the text itself is checked by help_lists_every_option
    const char *args[] = {"--lr", "fast", "--help", NULL};
    int rc = parse(&cfg, &err, args);
    fclose(stdout);
    stdout = saved;
    cr_assert_eq(rc, 1);
}

Test(train_config, yaml_errors_name_key_and_line) {
    expect_yaml_error("model: a\nlr: fast\n", "run.yaml:2", "lr: expected a number");
    expect_yaml_error("\nseq_len: 0\n", "run.yaml:2", "seq_len: must be >= 1");
    expect_yaml_error("lr: -1\n", "run.yaml:1", "lr: must be >= 0");
    expect_yaml_error("keep_last: 0\n", "run.yaml:1", "keep_last");
    expect_yaml_error("steps: 2.5\n", "run.yaml:1", "steps: expected an integer");
    expect_yaml_error("a: 1\n", "run.yaml:1", "unknown key");
    expect_yaml_error("\n\nlearning_rate: 1\n", "run.yaml:3", "did you mean 'lr'");
    expect_yaml_error("warmup_step: 1\n", "warmup_step", "did you mean 'warmup_steps'");
    expect_yaml_error("schedule: cosin\n", "run.yaml:1", "allowed: cosine, linear, constant");
    expect_yaml_error("precision: fp16\n", "precision", "allowed: bf16, fp32");
    expect_yaml_error("skip_bad_lines: maybe\n", "skip_bad_lines", "true or false");
    expect_yaml_error("lr: 1\nlr: 2\n", "run.yaml:2", "already set on line 1");
    expect_yaml_error("tokenizer: [a, b]\n", "run.yaml:1", "tokenizer: expected a single value");
    expect_yaml_error("lr:\n", "run.yaml:1", "lr: needs a value");
    expect_yaml_error("- lr\n", "run.yaml:1", "key: value");
}

Test(train_config, yaml_syntax_error_has_line_and_column) {
    expect_yaml_error("lr: 1\n: x\n", "run.yaml:2:1", "YAML syntax error");
    expect_yaml_error("lr: 1\nmodel: \"abc\n", "run.yaml:3:1", "quoted scalar");
    expect_yaml_error("lr: 1\n\tsteps: 2\n", "run.yaml:2:1", "tab");
}

Test(train_config, missing_config_file) {
    mt_train_config cfg;
    mt_error err;
    const char *args[] = {"--config", "no/such/file.yaml", NULL};
    cr_assert_eq(parse(&cfg, &err, args), -1);
    cr_assert(strstr(err.msg, "no/such/file.yaml"), "%s", err.msg);
    cr_assert(strstr(err.msg, "No such file"), "%s", err.msg);
}

Test(train_config, empty_yaml_is_all_defaults) {
    mt_train_config cfg, def;
    mt_error err;
    cr_assert_eq(load_text("# nothing yet\n", &cfg, &err), 0, "%s", err.msg);
    mt_train_config_defaults(&def);
    cr_assert_eq(memcmp(&cfg, &def, sizeof cfg), 0);
}

Test(train_config, flag_errors_name_the_flag) {
    expect_args_error((const char *[]){"--batchsize", "3", NULL}, "--batchsize",
                      "did you mean '--batch-size'");
    expect_args_error((const char *[]){"--lr", "fast", NULL}, "--lr", "expected a number");
    expect_args_error((const char *[]){"--seq-len", "0", NULL}, "--seq-len", ">= 1");
    expect_args_error((const char *[]){"--keep-last", "0", NULL}, "--keep-last", ">= 1");
    expect_args_error((const char *[]){"--lr", NULL}, "--lr", "needs a value");
    expect_args_error((const char *[]){"--device", "tpu", NULL}, "--device", "auto, cpu, cuda");
    expect_args_error((const char *[]){"model.yaml", NULL}, "model.yaml", "--config");
    expect_args_error((const char *[]){"--config", "a", "--config", "b", NULL}, "--config",
                      "twice");
}

/* Issue 29: strtod read --lr 0x10 as 16 (and inf, nan as numbers), and
 * --steps 9007199254740993 rounded to 2^53 and was taken. Numbers are
 * decimal; integers are read exactly and refused past 2^53. */
Test(train_config, hex_numbers_and_integers_past_2_53_are_refused) {
    expect_args_error((const char *[]){"--lr", "0x10", NULL}, "--lr", "expected a number");
    expect_args_error((const char *[]){"--lr", "inf", NULL}, "--lr", "expected a number");
    expect_args_error((const char *[]){"--lr", "nan", NULL}, "--lr", "expected a number");
    expect_args_error((const char *[]){"--steps", "0x10", NULL}, "--steps", "expected an integer");
    expect_args_error((const char *[]){"--steps", "9007199254740993", NULL}, "--steps",
                      "at most 9007199254740992");
    expect_args_error((const char *[]){"--steps", "18446744073709551619", NULL}, "--steps",
                      "at most 9007199254740992");
    expect_args_error((const char *[]){"--steps", "1e16", NULL}, "--steps", "at most");
    mt_train_config cfg;
    mt_error err;
    cr_assert_eq(parse(&cfg, &err, (const char *[]){"--steps", "9007199254740992", "--lr",
                                                    "1.5e-4", NULL}), 0, "%s", err.msg);
    cr_assert_eq(cfg.steps, 9007199254740992LL);
    cr_assert_eq(cfg.lr, 1.5e-4);
    cr_assert_eq(parse(&cfg, &err, (const char *[]){"--steps", "1e3", "--lr", ".5", NULL}), 0,
                 "%s", err.msg);
    cr_assert(cfg.steps == 1000 && cfg.lr == 0.5);
}

Test(train_config, validate_catches_programmatic_values) {
    mt_train_config cfg;
    mt_error err;
    mt_train_config_defaults(&cfg);
    cr_assert_eq(mt_train_config_validate(&cfg, &err), 0, "%s", err.msg);
    cfg.keep_last = 0;
    cr_assert_eq(mt_train_config_validate(&cfg, &err), -1);
    cr_assert(strstr(err.msg, "keep_last"), "%s", err.msg);
    mt_train_config_defaults(&cfg);
    cfg.data_format = MT_TC_DATA_CHAT;
    cr_assert_eq(mt_train_config_validate(&cfg, &err), -1);
    cr_assert(strstr(err.msg, "data"), "%s", err.msg);
}

Test(train_config, help_lists_every_option) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mt_train_config_usage(f);
    fclose(f);
    cr_assert(strstr(text, "--config FILE"));
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        char flag[80];
        snprintf(flag, sizeof flag, "%s%s ", mt_tc_options[i].type == MT_OPT_BOOL ? "--[no-]" : "--",
                 mt_tc_options[i].name);
        for (char *p = flag; *p; p++)
            if (*p == '_') *p = '-';
        if (mt_tc_options[i].type == MT_OPT_BOOL) flag[strlen(flag) - 1] = 0;
        cr_assert(strstr(text, flag), "--help lacks %s", flag);
    }
    free(text);
}

/* A config with every field away from its default, strings that need
 * quoting, and doubles with no short decimal form. */
static void unusual_config(mt_train_config *cfg) {
    mt_train_config_defaults(cfg);
    strcpy(cfg->model, "models/llama 3: \"8B\" # \\ ü");
    strcpy(cfg->tokenizer, "tok\tenizer.json");
    strcpy(cfg->data, "data/a.jsonl");
    strcpy(cfg->out, "runs/x'y");
    strcpy(cfg->resume, "auto");
    cfg->data_format = MT_TC_DATA_CHAT;
    cfg->chat_template = MT_TC_CHAT_MISTRAL;
    cfg->skip_bad_lines = true;
    cfg->seq_len = 4096, cfg->batch_size = 3, cfg->micro_batches = 5, cfg->steps = 12345;
    cfg->epochs = 3, cfg->warmup_steps = 7, cfg->seed = 9007199254740991LL;
    cfg->lr = 1.0 / 3e5, cfg->min_lr_ratio = 0.1, cfg->weight_decay = 0.01;
    cfg->beta1 = 0.85, cfg->beta2 = 0.999, cfg->eps = 1e-12, cfg->max_grad_norm = 0;
    cfg->schedule = MT_LR_CONSTANT, cfg->save_dtype = MT_SAVE_FP32;
    cfg->device = MT_DEVICE_CUDA, cfg->precision = MT_TC_PRECISION_FP32;
    cfg->host_saved_inputs = true, cfg->save_every = 0, cfg->keep_last = 4;
    cfg->log_every = 1, cfg->sample_tokens = 5;
}

static void assert_same_values(mt_train_config *a, mt_train_config *b) {
    memset(a->given, 0, sizeof a->given);
    memset(b->given, 0, sizeof b->given);
    cr_assert_str_eq(a->model, b->model);
    cr_assert_str_eq(a->tokenizer, b->tokenizer);
    cr_assert_eq(a->lr, b->lr, "lr %.17g vs %.17g", a->lr, b->lr);
    cr_assert_eq(a->seed, b->seed);
    cr_assert_eq(memcmp(a, b, sizeof *a), 0, "some field differs");
}

Test(train_config, yaml_round_trip_is_exact) {
    mt_train_config cfg, back;
    mt_error err;
    unusual_config(&cfg);
    cr_assert_eq(mt_train_config_validate(&cfg, &err), 0, "%s", err.msg);
    char *yaml = mt_train_config_to_yaml(&cfg);
    cr_assert_eq(load_text(yaml, &back, &err), 0, "%s\n%s", err.msg, yaml);
    assert_same_values(&cfg, &back);
    free(yaml);
}

Test(train_config, json_round_trip_is_exact) {
    mt_train_config cfg, back;
    mt_error err;
    unusual_config(&cfg);
    char *json = mt_train_config_to_json(&cfg);
    mt_train_config_defaults(&back);
    cr_assert_eq(mt_train_config_from_json(&back, json, &err), 0, "%s\n%s", err.msg, json);
    assert_same_values(&cfg, &back);
    free(json);
    cr_assert_eq(mt_train_config_from_json(&back, "{\"lr\":\"fast\"}", &err), -1);
    cr_assert(strstr(err.msg, "lr"), "%s", err.msg);
}

Test(train_config, saved_yaml_reloads_through_flags) {
    mt_train_config cfg, back;
    mt_error err;
    unusual_config(&cfg);
    char *dir = mt_test_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    cr_assert_eq(mt_train_config_save_yaml(&cfg, path, &err), 0, "%s", err.msg);
    const char *args[] = {"--config", path, NULL};
    cr_assert_eq(parse(&back, &err, args), 0, "%s", err.msg);
    assert_same_values(&cfg, &back);
    mt_test_rmtree(dir);
    free(dir);
}

Test(train_config, examples_and_docs_cover_the_table) {
    static const char *const examples[] = {"examples/tiny.yaml", "examples/llama3-sft.yaml",
                                           "examples/continued-pretraining.yaml"};
    for (size_t i = 0; i < sizeof examples / sizeof *examples; i++) {
        mt_train_config cfg;
        mt_error err;
        mt_train_config_defaults(&cfg);
        cr_assert_eq(mt_train_config_load_yaml(&cfg, examples[i], &err), 0, "%s", err.msg);
        mt_train_config_resolve(&cfg);
        cr_assert_eq(mt_train_config_validate(&cfg, &err), 0, "%s", err.msg);
    }
    FILE *f = fopen("docs/config.md", "rb");
    cr_assert(f, "docs/config.md missing (tests run from the repository root)");
    static char doc[1 << 16];
    doc[fread(doc, 1, sizeof doc - 1, f)] = 0;
    fclose(f);
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        char row[80];
        snprintf(row, sizeof row, "| `%s` |", mt_tc_options[i].name);
        cr_assert(strstr(doc, row), "docs/config.md has no row for %s", mt_tc_options[i].name);
    }
}

/* Issue 29: a start on a full disk left a 0-byte config.yaml, the resumed
 * run's options lost. The file is replaced whole (temporary file, rename) or
 * not at all: under a file size limit smaller than it, the save is an
 * error naming it and the previous file stays as it was. */
Test(train_config, a_failed_save_of_config_yaml_keeps_the_previous_one) {
    char *dir = NULL, *path = write_tmp(&dir, "config.yaml", "");
    mt_train_config cfg;
    mt_error err;
    mt_train_config_defaults(&cfg);
    cr_assert_eq(mt_train_config_save_yaml(&cfg, path, &err), 0, "%s", err.msg);
    char *before = mt_train_config_to_yaml(&cfg);
    cr_assert_gt(strlen(before), 600);
    strcpy(cfg.out, "runs/another");
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 400;
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = mt_train_config_save_yaml(&cfg, path, &err);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_eq(rc, -1);
    cr_assert(strstr(err.msg, path) && strstr(err.msg, "File too large"), "%s", err.msg);
    FILE *f = fopen(path, "rb");
    static char now[1 << 16];
    now[fread(now, 1, sizeof now - 1, f)] = 0;
    fclose(f);
    cr_assert_str_eq(now, before, "the previous config.yaml was damaged");
    free(before);
    free(path);
    mt_test_rmtree(dir);
    free(dir);
}
