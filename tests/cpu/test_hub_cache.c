/* Hub model names in the local Hugging Face cache (io/hub_cache.h), laid
 * out as huggingface_hub lays it out (models--ORG--NAME/refs/main and
 * snapshots/COMMIT/): the cache folder from HF_HUB_CACHE, HF_HOME,
 * XDG_CACHE_HOME or HOME in that order; a name found gives its snapshot, to
 * the options of a run and to `megatrain plan --model`; a name not found is
 * an error naming the cache and the download command; a path that exists
 * stays a path. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file.h"
#include "io/hub_cache.h"
#include "megatrain.h"
#include "testlib.h"

static void put(const char *dir, const char *rel, const char *text) {
    char *p = mt_path_join(dir, rel);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", p);
    cr_assert_eq(system(cmd), 0);
    FILE *f = fopen(p, "w");
    cr_assert(f, "cannot write %s", p);
    fputs(text, f);
    fclose(f);
    free(p);
}

/* A cache in hub/ of root holding acme/tiny at commit c0ffee, its
 * config.json the llama_gqa fixture's. */
static void make_cache(const char *root) {
    char *src = mt_path_join(mt_test_fixtures_dir(), "models/llama_gqa/config.json"), *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(src, &buf, &len, &err), 0, "%s", err.msg);
    put(root, "hub/models--acme--tiny/refs/main", "c0ffee");
    put(root, "hub/models--acme--tiny/snapshots/c0ffee/config.json", buf);
    free(buf), free(src);
}

static void clear_env(void) {
    const char *vars[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"};
    for (size_t i = 0; i < 4; i++) unsetenv(vars[i]);
}

Test(hub_cache, cache_folder_from_the_variables_in_huggingface_hub_order) {
    char out[4096];
    const char *where;
    clear_env();
    setenv("HOME", "/home/u", 1);
    mt_hub_cache_dir(out, sizeof out, &where);
    cr_expect_str_eq(out, "/home/u/.cache/huggingface/hub");
    setenv("XDG_CACHE_HOME", "/x", 1);
    mt_hub_cache_dir(out, sizeof out, &where);
    cr_expect_str_eq(out, "/x/huggingface/hub");
    setenv("HF_HOME", "/h", 1);
    mt_hub_cache_dir(out, sizeof out, &where);
    cr_expect_str_eq(out, "/h/hub");
    cr_expect_str_eq(where, "HF_HOME");
    setenv("HF_HUB_CACHE", "/c", 1);
    mt_hub_cache_dir(out, sizeof out, &where);
    cr_expect_str_eq(out, "/c");
}

Test(hub_cache, names_and_paths) {
    cr_expect(mt_hub_is_name("meta-llama/Llama-3.2-1B"));
    cr_expect(mt_hub_is_name("Qwen/Qwen2.5-0.5B-Instruct"));
    cr_expect_not(mt_hub_is_name("models"));
    cr_expect_not(mt_hub_is_name("/abs/path"));
    cr_expect_not(mt_hub_is_name("a/b/c"));
    cr_expect_not(mt_hub_is_name("./m"));
    cr_expect_not(mt_hub_is_name("a/.b"));
}

Test(hub_cache, a_cached_name_gives_its_snapshot) {
    char *root = mt_test_tmpdir(), out[4096], want[4200];
    make_cache(root);
    clear_env();
    setenv("HF_HOME", root, 1);
    mt_error err = {{0}};
    cr_assert_eq(mt_hub_model_dir("acme/tiny", out, sizeof out, &err), 0, "%s", err.msg);
    snprintf(want, sizeof want, "%s/hub/models--acme--tiny/snapshots/c0ffee", root);
    cr_expect_str_eq(out, want);

    /* an existing path is a path, even shaped like a name */
    put(root, "acme/tiny/config.json", "{}");
    cr_assert_eq(chdir(root), 0);
    cr_assert_eq(mt_hub_model_dir("acme/tiny", out, sizeof out, &err), 0, "%s", err.msg);
    cr_expect_str_eq(out, "acme/tiny");

    /* the options of a run take the snapshot, and the tokenizer beside it */
    mt_options *o = mt_options_new();
    cr_assert_eq(mt_options_set(o, "model", "acme/tinier"), 0);
    cr_assert_eq(mt_options_resolve(o), 0, "a name not in the cache is an error at the load only");
    mt_options_free(o);
    o = mt_options_new();
    cr_assert_eq(mt_options_set(o, "model", "acme/tiny"), 0);
    char buf[4096];
    cr_assert_eq(chdir("/"), 0);
    cr_assert_eq(mt_options_resolve(o), 0, "%s", mt_last_error());
    cr_assert_gt(mt_options_get(o, "model", buf, sizeof buf), 0);
    cr_expect_str_eq(buf, want);
    cr_assert_gt(mt_options_get(o, "tokenizer", buf, sizeof buf), 0);
    cr_expect(strstr(buf, "snapshots/c0ffee/tokenizer.json"), "%s", buf);
    mt_options_free(o);
    mt_test_rmtree(root);
    free(root);
}

Test(hub_cache, a_name_not_in_the_cache_says_how_to_download_it) {
    char *root = mt_test_tmpdir(), out[4096];
    clear_env();
    setenv("HF_HOME", root, 1);
    mt_error err = {{0}};
    cr_assert_eq(mt_hub_model_dir("acme/missing", out, sizeof out, &err), -1);
    char want[4200];
    snprintf(want, sizeof want, "model 'acme/missing' is not a folder here, nor a model in the "
             "Hugging Face cache (%s/hub, from HF_HOME): download it with `hf download "
             "acme/missing`", root);
    cr_expect(strstr(err.msg, want), "%s", err.msg);

    /* through the command: plan reads the cached config, train and eval say how to download */
    make_cache(root);
    char *plan[] = {"plan", "--model", "acme/tiny", "--gpu", "h100", NULL}, *o, *e;
    cr_expect_eq(mt_test_cli_output(plan, &o, &e), 0, "%s", e);
    cr_expect(strstr(o, "model: acme/tiny"), "%s", o);
    free(o), free(e);
    char *eval[] = {"eval", "--model", "acme/missing", "--data", "x.jsonl", NULL};
    cr_expect_eq(mt_test_cli_output(eval, &o, &e), 1);
    cr_expect(strstr(e, "hf download acme/missing"), "%s", e);
    free(o), free(e);
    mt_test_rmtree(root);
    free(root);
}
