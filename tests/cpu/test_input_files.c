/* Files a user hands megatrain that were taken as they came (issue 29,
 * item 15): a run lock that is a link (its target was overwritten with the
 * pid), a config.json giving a key twice (cJSON reads the first value,
 * transformers the last), a tokenizer.json with a fractional or shared id,
 * and the message of a 1-D tensor of the wrong size (it printed a stray
 * digit: [640] for [64]). Each is now refused naming what is wrong. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/tokenizer.h"
#include "host/store.h"
#include "io/file.h"
#include "io/model_io.h"
#include "io/run_lock.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "testlib.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(input_files, a_run_lock_that_is_a_link_is_refused_and_its_target_kept) {
    char *dir = mt_test_tmpdir(), out[600], target[600], lock[700];
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(target, sizeof target, "%s/precious.txt", dir);
    snprintf(lock, sizeof lock, "%s/.megatrain.lock", out);
    cr_assert_eq(mt_mkdirs(out, NULL), 0);
    write_text(target, "keep me\n");
    cr_assert_eq(symlink(target, lock), 0);
    mt_run_lock l;
    mt_error err;
    cr_assert_eq(mt_run_lock_acquire(&l, out, "test", &err), -1, "the link was followed");
    cr_assert(strstr(err.msg, lock) && strstr(err.msg, "symbolic link"), "%s", err.msg);
    size_t n;
    char *text;
    cr_assert_eq(mt_read_file(target, &text, &n, &err), 0, "%s", err.msg);
    cr_assert_str_eq(text, "keep me\n");
    free(text);
    /* a hard link writes through as well */
    cr_assert_eq(unlink(lock), 0);
    cr_assert_eq(link(target, lock), 0);
    cr_assert_eq(mt_run_lock_acquire(&l, out, "test", &err), -1);
    cr_assert(strstr(err.msg, "hard link"), "%s", err.msg);
    cr_assert_eq(unlink(lock), 0);
    cr_assert_eq(mt_run_lock_acquire(&l, out, "test", &err), 0, "%s", err.msg);
    mt_run_lock_release(&l);
    mt_test_rmtree(dir);
    free(dir);
}

Test(input_files, a_config_json_key_given_twice_is_refused_naming_it) {
    mt_config base, cfg;
    mt_config_default_tiny(&base);
    char *json = mt_config_to_json(&base);
    mt_error err;
    cr_assert_eq(mt_config_parse(&cfg, json, "config.json", &err), 0, "%s", err.msg);
    /* "hidden_size" once more, at the end: transformers would read 128 */
    char *twice = malloc(strlen(json) + 64);
    strcpy(twice, json);
    char *end = strrchr(twice, '}');
    strcpy(end, ", \"hidden_size\": 128}");
    cr_assert_eq(mt_config_parse(&cfg, twice, "config.json", &err), -1, "hidden_size %lld",
                 (long long)cfg.C);
    cr_assert(strstr(err.msg, "config.json: the key \"hidden_size\" is given twice"), "%s",
              err.msg);
    const char *nested = "{\"model_type\": \"llama\", \"rope_scaling\": {\"factor\": 2.0, "
                         "\"factor\": 4.0}}";
    cr_assert_eq(mt_config_parse(&cfg, nested, "config.json", &err), -1);
    cr_assert(strstr(err.msg, "\"rope_scaling.factor\""), "%s", err.msg);
    free(twice);
    free(json);
}

static char *tokenizer_file(const char *dir, const char *vocab) {
    static char path[700];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char json[1024];
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", \"vocab\": {%s}, "
             "\"merges\": [\"a b\"]}}", vocab);
    write_text(path, json);
    return path;
}

Test(input_files, a_tokenizer_id_that_is_shared_fractional_or_given_twice_is_refused) {
    char *dir = mt_test_tmpdir();
    mt_error err;
    mt_tokenizer *tok = mt_tokenizer_load(tokenizer_file(dir, "\"a\": 0, \"b\": 1, \"ab\": 2"),
                                          &err);
    cr_assert(tok, "%s", err.msg);
    mt_tokenizer_free(tok);
    static const struct { const char *vocab, *want; } cases[] = {
        {"\"a\": 0, \"b\": 1, \"ab\": 1", "\"b\" and \"ab\" both have id 1"},
        {"\"a\": 0, \"b\": 1.5, \"ab\": 2", "model.vocab[\"b\"]: id 1.5 is not an integer"},
        {"\"a\": 0, \"b\": \"1\", \"ab\": 2", "model.vocab[\"b\"]: the id is not a number"},
        {"\"a\": 0, \"b\": 1, \"ab\": 2, \"b\": 3", "model.vocab[\"b\"]: the token is given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_null(mt_tokenizer_load(tokenizer_file(dir, cases[i].vocab), &err), "%s loaded",
                       cases[i].vocab);
        cr_assert(strstr(err.msg, cases[i].want), "%s: %s", cases[i].vocab, err.msg);
    }
    mt_test_rmtree(dir);
    free(dir);
}

/* The tiny model's files, with one norm weight of 63 values, not 64. */
Test(input_files, a_1d_tensor_of_the_wrong_size_is_named_with_both_sizes) {
    char *dir = mt_test_tmpdir();
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    mt_host_store s;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&s, &t, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_model_save(&s, &cfg, dir, MT_DTYPE_F32, (size_t)1 << 30, &err), 0, "%s",
                 err.msg);
    mt_st_write_tensor w[64];
    int n = 0;
    const char *bad = "model.layers.0.input_layernorm.weight";
    for (int l = 0; l < t.n_layers; l++)
        for (int k = 0; k < t.layers[l].n_tensors; k++) {
            const mt_tensor_desc *td = &t.layers[l].tensors[k];
            cr_assert_lt(n, 64);
            w[n] = (mt_st_write_tensor){.name = td->name, .dtype = MT_DTYPE_F32,
                                        .ndim = td->ndim, .shape = {td->shape[0], td->shape[1]},
                                        .f32 = s.w};
            if (!strcmp(td->name, bad)) w[n].shape[0] = td->shape[0] - 1;
            n++;
        }
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(mt_st_write(path, w, n, NULL, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_model_load_weights(&s, dir, &err), -1);
    char want[300];
    snprintf(want, sizeof want, "tensor \"%s\" has shape [%lld] but config.json implies [%lld]",
             bad, (long long)cfg.C - 1, (long long)cfg.C);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    mt_host_store_free(&s);
    mt_params_free(&t);
    mt_test_rmtree(dir);
    free(dir);
}
