/* Tests of src/io/checkpoint.{h,c}: bitwise round trips of w, m, v and the
 * trainer state, the layout (an HF model directory too), keep-last-K
 * pruning, finding the newest complete checkpoint, every kind of error
 * (config mismatch, missing / truncated files, failed writes, unwritable
 * directory), and SIGKILL in the middle of a save. Plus the signal flag of
 * src/util/signals.h. Resume compares exactly, so every comparison is bitwise
 * (memcmp): there is no tolerance. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "host/store.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "testlib.h"
#include "util/signals.h"

/* ---- helpers ----------------------------------------------------------- */

static char *tmp;  /* per-test temporary directory (each test is a process) */

static void setup(void) { tmp = mt_test_tmpdir(); }
static void teardown(void) {
    mt_test_rmtree(tmp);
    free(tmp);
}

/* A model: config, table, store with random w, m and v >= 0. */
typedef struct model {
    mt_config cfg;
    mt_param_table t;
    mt_host_store s;
} model;

static void model_init(model *md, const mt_config *cfg, unsigned long long seed) {
    mt_error err;
    md->cfg = *cfg;
    cr_assert_eq(mt_params_init(&md->t, cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_init(&md->s, &md->t, &err), 0, "%s", err.msg);
    mt_test_fill_uniform(md->s.w, md->t.total, seed, -1.0f, 1.0f);
    mt_test_fill_uniform(md->s.m, md->t.total, seed + 1, -0.1f, 0.1f);
    mt_test_fill_uniform(md->s.v, md->t.total, seed + 2, 0.0f, 0.01f);
}

static void model_tiny(model *md, unsigned long long seed) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    model_init(md, &cfg, seed);
}

static void model_free(model *md) {
    mt_host_store_free(&md->s);
    mt_params_free(&md->t);
}

/* Every parameter of a and b (w, m, v) is bitwise equal; padding is not
 * part of the checkpoint. */
static void assert_same_params(const model *a, const model *b) {
    const mt_param_table *t = &a->t;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        for (int k = 0; k < ld->n_tensors; k++) {
            size_t off = ld->offset + ld->tensors[k].offset;
            size_t bytes = ld->tensors[k].numel * sizeof(float);
            const char *name = ld->tensors[k].name;
            cr_assert(!memcmp(a->s.w + off, b->s.w + off, bytes), "w differs: %s", name);
            cr_assert(!memcmp(a->s.m + off, b->s.m + off, bytes), "m differs: %s", name);
            cr_assert(!memcmp(a->s.v + off, b->s.v + off, bytes), "v differs: %s", name);
        }
    }
}

/* A trainer state with a 64-bit RNG word that a double would round. */
static const char *STATE = "{\"step\": 7, \"rng\": 18446744073709551557,\n"
                           "  \"data\": {\"epoch\": 1, \"offset\": 123456789012345}, "
                           "\"lr\": 0.00030000000000000003}";

static char *out_dir(void) { return mt_path_join(tmp, "run"); }

static void save_ok(const char *out, int64_t step, const model *md, int keep) {
    mt_error err;
    cr_assert_eq(mt_checkpoint_save(out, step, &md->s, &md->cfg, STATE, keep, NULL, 0, &err), 0,
                 "%s", err.msg);
}

static char *ckpt_path(const char *out, int64_t step) {
    char name[64];
    snprintf(name, sizeof name, "checkpoints/step-%08lld", (long long)step);
    return mt_path_join(out, name);
}

static int dir_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Loads ckpt into a fresh model of cfg and checks it equals want bitwise. */
static void assert_loads(const char *ckpt, const model *want) {
    model got;
    mt_config cfg = want->cfg;
    mt_error err;
    cr_assert_eq(mt_params_init(&got.t, &cfg, &err), 0);
    cr_assert_eq(mt_host_store_init(&got.s, &got.t, &err), 0);
    got.cfg = cfg;
    char *state = NULL;
    cr_assert_eq(mt_checkpoint_load(ckpt, &got.s, &cfg, &state, &err), 0, "%s", err.msg);
    assert_same_params(want, &got);
    cr_assert_str_eq(state, STATE);
    free(state);
    model_free(&got);
}

/* Number of entries of dir whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    cr_assert(d, "cannot list %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* Loads must fail with a message containing both substrings. */
static void expect_load_error(const char *ckpt, const model *md, const char *s1, const char *s2) {
    model got;
    mt_error err = {{0}};
    cr_assert_eq(mt_params_init(&got.t, &md->cfg, &err), 0);
    cr_assert_eq(mt_host_store_init(&got.s, &got.t, &err), 0);
    char *state = NULL;
    cr_assert_eq(mt_checkpoint_load(ckpt, &got.s, &md->cfg, &state, &err), -1,
                 "loaded a bad checkpoint");
    cr_assert(strstr(err.msg, s1), "message lacks '%s': %s", s1, err.msg);
    if (s2) cr_assert(strstr(err.msg, s2), "message lacks '%s': %s", s2, err.msg);
    cr_assert_null(state);
    model_free(&got);
}

/* ---- round trips and layout --------------------------------------------- */

TestSuite(checkpoint, .init = setup, .fini = teardown);

Test(checkpoint, round_trip_is_bitwise_and_layout_is_as_documented) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir(), saved[4096];
    mt_error err;
    cr_assert_eq(mt_checkpoint_save(out, 7, &md.s, &md.cfg, STATE, 3, saved, sizeof saved, &err),
                 0, "%s", err.msg);
    char *want = ckpt_path(out, 7);
    cr_assert_str_eq(saved, want);
    const char *files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                           "trainer_state.json", "COMPLETE"};
    for (int i = 0; i < 5; i++) {
        char *p = mt_path_join(saved, files[i]);
        cr_assert(mt_file_exists(p), "missing %s", p);
        free(p);
    }
    cr_assert_eq(count_prefixed(saved, "."), 2, "only . and .. besides the files");
    cr_assert_eq(count_prefixed(saved, ""), 7, "exactly the five files");
    /* The optimizer file names tensors as documented. */
    char *op = mt_path_join(saved, "optimizer.safetensors");
    mt_st_file f;
    cr_assert_eq(mt_st_open(&f, op, &err), 0, "%s", err.msg);
    cr_assert_not_null(mt_st_find(&f, "exp_avg.model.layers.1.mlp.up_proj.weight"));
    cr_assert_not_null(mt_st_find(&f, "exp_avg_sq.model.embed_tokens.weight"));
    mt_st_close(&f);
    /* trainer_state.json carries the format and layout version. */
    char *sp = mt_path_join(saved, "trainer_state.json"), *text;
    size_t len;
    cr_assert_eq(mt_read_file(sp, &text, &len, &err), 0);
    cr_assert(strstr(text, "\"format\": \"" MT_CHECKPOINT_FORMAT "\""), "%s", text);
    cr_assert(strstr(text, "\"layout_version\": 1"), "%s", text);
    assert_loads(saved, &md);
    free(text), free(sp), free(op), free(want), free(out);
    model_free(&md);
}

/* Every fixture architecture (GQA, qkv bias + tied, q/k norm + MQA,
 * mistral, phi3's fused tensors) round-trips, and the directory is an HF
 * model our loader takes. */
Test(checkpoint, round_trip_every_fixture_architecture_and_loads_as_hf_model) {
    for (int i = 0; i < MT_FIXTURE_MODELS; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/models/%s/config.json", mt_test_fixtures_dir(),
                 mt_fixture_models[i]);
        mt_config cfg;
        mt_error err;
        cr_assert_eq(mt_config_load(&cfg, path, &err), 0, "%s", err.msg);
        model md;
        model_init(&md, &cfg, 10 + (unsigned long long)i);
        char *out = out_dir(), saved[4096];
        cr_assert_eq(mt_checkpoint_save(out, i, &md.s, &cfg, STATE, 0, saved, sizeof saved, &err),
                     0, "%s: %s", mt_fixture_models[i], err.msg);
        assert_loads(saved, &md);
        if (cfg.arch == MT_ARCH_PHI3) { /* the weights under their published names */
            char *w = mt_path_join(saved, "model.safetensors");
            mt_st_file f;
            cr_assert_eq(mt_st_open(&f, w, &err), 0, "%s", err.msg);
            cr_assert_not_null(mt_st_find(&f, "model.layers.1.self_attn.qkv_proj.weight"));
            cr_assert_not_null(mt_st_find(&f, "model.layers.1.mlp.gate_up_proj.weight"));
            cr_assert_null(mt_st_find(&f, "model.layers.1.self_attn.k_proj.weight"));
            mt_st_close(&f);
            free(w);
        }
        model hf;
        model_init(&hf, &cfg, 99);
        cr_assert_eq(mt_model_load_weights(&hf.s, saved, &err), 0, "%s", err.msg);
        for (int l = 0; l < md.t.n_layers; l++) {
            const mt_layer_desc *ld = &md.t.layers[l];
            for (int k = 0; k < ld->n_tensors; k++) {
                size_t off = ld->offset + ld->tensors[k].offset;
                cr_assert(!memcmp(hf.s.w + off, md.s.w + off,
                                  ld->tensors[k].numel * sizeof(float)));
            }
        }
        model_free(&hf);
        model_free(&md);
        free(out);
    }
}

/* Saving a step that exists (a resumed run reaching it again) replaces it. */
Test(checkpoint, saving_the_same_step_again_replaces_it) {
    model a, b;
    model_tiny(&a, 1);
    model_tiny(&b, 2);
    char *out = out_dir(), *ck = mt_path_join(out, "checkpoints"), *p = ckpt_path(out, 5);
    save_ok(out, 5, &a, 0);
    save_ok(out, 5, &b, 0);
    assert_loads(p, &b);
    cr_assert_eq(count_prefixed(ck, ".tmp"), 0, "temporary directory left behind");
    free(p), free(ck), free(out);
    model_free(&a), model_free(&b);
}

Test(checkpoint, state_must_be_a_json_object) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir();
    mt_error err;
    cr_assert_eq(mt_checkpoint_save(out, 1, &md.s, &md.cfg, "[1, 2]", 0, NULL, 0, &err), -1);
    cr_assert(strstr(err.msg, "JSON object"), "%s", err.msg);
    cr_assert_eq(mt_checkpoint_save(out, 1, &md.s, &md.cfg, "{\"a\": ", 0, NULL, 0, &err), -1);
    free(out);
    model_free(&md);
}

/* ---- pruning and finding ------------------------------------------------ */

static void make_dir(const char *dir, const char *name) {
    char *p = mt_path_join(dir, name);
    cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s", p);
    free(p);
}

static void touch(const char *dir, const char *name) {
    char *p = mt_path_join(dir, name);
    FILE *fp = fopen(p, "w");
    cr_assert(fp, "cannot create %s", p);
    fputs("{}", fp);
    fclose(fp);
    free(p);
}

Test(checkpoint, keeps_last_k_and_removes_only_what_it_recognises) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir(), *ck = mt_path_join(out, "checkpoints");
    save_ok(out, 1, &md, 2);
    /* Things a save must never remove: look-alikes and an incomplete step. */
    make_dir(ck, "notes");
    make_dir(ck, "step-00000001.bak");
    make_dir(ck, "step-0000000x");
    make_dir(ck, ".tmp-mine");
    make_dir(ck, "step-00000000");  /* no COMPLETE: not counted, not removed */
    touch(ck, "step-00000002");     /* a file, not a directory */
    /* A temporary directory of a live process (this one's parent). */
    char live[64];
    snprintf(live, sizeof live, ".tmp-step-00000009-%ld", (long)getppid());
    make_dir(ck, live);
    for (int s = 2; s <= 5; s++) save_ok(out, s * 10, &md, 2);
    const char *kept[] = {"notes", "step-00000001.bak", "step-0000000x", ".tmp-mine",
                          "step-00000000", live, "step-00000040", "step-00000050"};
    for (int i = 0; i < 8; i++) {
        char *p = mt_path_join(ck, kept[i]);
        cr_assert(dir_exists(p), "%s was removed", kept[i]);
        free(p);
    }
    for (int s = 1; s <= 3; s++) {
        char *gone = ckpt_path(out, s * 10);
        cr_assert_not(dir_exists(gone), "%s should be pruned with keep_last 2", gone);
        free(gone);
    }
    char *first = ckpt_path(out, 1);
    cr_assert_not(dir_exists(first), "step 1 should be pruned with keep_last 2");
    /* keep_last <= 0 keeps everything. */
    save_ok(out, 60, &md, 0);
    for (int s = 4; s <= 6; s++) {
        char *p = ckpt_path(out, s * 10);
        cr_assert(dir_exists(p), "%s removed with keep_last 0", p);
        free(p);
    }
    free(first), free(ck), free(out);
    model_free(&md);
}

Test(checkpoint, find_latest_ignores_temporary_and_incomplete_directories) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir(), *ck = mt_path_join(out, "checkpoints"), found[4096];
    mt_error err = {{0}};
    mkdir(out, 0755);
    cr_assert_eq(mt_checkpoint_find_latest(out, found, sizeof found, &err), -1);
    cr_assert(strstr(err.msg, "no complete checkpoint"), "%s", err.msg);
    save_ok(out, 3, &md, 0);
    save_ok(out, 12, &md, 0);
    make_dir(ck, ".tmp-step-00000020-1");
    make_dir(ck, "step-00000015");  /* incomplete: no COMPLETE */
    touch(ck, "step-00000015/trainer_state.json");
    char *p12 = ckpt_path(out, 12), *p15 = ckpt_path(out, 15);
    cr_assert_eq(mt_checkpoint_find_latest(out, found, sizeof found, &err), 0, "%s", err.msg);
    cr_assert_str_eq(found, p12);
    cr_assert_eq(mt_checkpoint_find_latest(ck, found, sizeof found, &err), 0, "%s", err.msg);
    cr_assert_str_eq(found, p12);
    cr_assert_eq(mt_checkpoint_find_latest(p12, found, sizeof found, &err), 0, "%s", err.msg);
    cr_assert_str_eq(found, p12);
    cr_assert_eq(mt_checkpoint_find_latest(p15, found, sizeof found, &err), -1);
    cr_assert(strstr(err.msg, "incomplete"), "%s", err.msg);
    expect_load_error(p15, &md, "COMPLETE", "interrupted");
    char *missing = mt_path_join(tmp, "nope");
    cr_assert_eq(mt_checkpoint_find_latest(missing, found, sizeof found, &err), -1);
    cr_assert(strstr(err.msg, missing), "%s", err.msg);
    free(missing), free(p12), free(p15), free(ck), free(out);
    model_free(&md);
}

/* ---- errors ------------------------------------------------------------- */

Test(checkpoint, config_mismatch_names_the_field) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir(), *p = ckpt_path(out, 1);
    save_ok(out, 1, &md, 0);
    model other;
    mt_config cfg = md.cfg;
    cfg.F = 128;  /* a different table */
    model_init(&other, &cfg, 2);
    expect_load_error(p, &other, "\"intermediate_size\" is 192 in the checkpoint but 128", NULL);
    model_free(&other);
    cfg = md.cfg;
    cfg.rope_theta = 500000.0;  /* same shapes, different math */
    model_init(&other, &cfg, 2);
    expect_load_error(p, &other, "\"rope_theta\"", "config.json");
    model_free(&other);
    free(p), free(out);
    model_free(&md);
}

/* gpt_neox's residual form and rotary width change the math, not the tensors. */
Test(checkpoint, gpt_neox_mismatch_names_the_field) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_config_neox_defaults(&cfg);
    model md, other;
    model_init(&md, &cfg, 1);
    char *out = out_dir(), *p = ckpt_path(out, 1);
    save_ok(out, 1, &md, 0);
    cfg.parallel_residual = false;
    model_init(&other, &cfg, 2);
    expect_load_error(p, &other, "\"use_parallel_residual\"", NULL);
    model_free(&other);
    cfg = md.cfg;
    cfg.rotary_dim = cfg.HD;
    model_init(&other, &cfg, 2);
    expect_load_error(p, &other, "\"rotary_pct", NULL);
    model_free(&other);
    free(p), free(out);
    model_free(&md);
}

/* falcon's two architectures: a resume names new_decoder_architecture, not
 * only the LayerNorms' tensors that differ with it. */
Test(checkpoint, falcon_architecture_mismatch_names_the_field) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_config_falcon_defaults(&cfg, false);
    model md, other;
    model_init(&md, &cfg, 1);
    char *out = out_dir(), *p = ckpt_path(out, 1);
    save_ok(out, 1, &md, 0);
    mt_config_falcon_defaults(&cfg, true);
    model_init(&other, &cfg, 2);
    expect_load_error(p, &other, "\"new_decoder_architecture\"", NULL);
    model_free(&other);
    free(p), free(out);
    model_free(&md);
}

/* gemma: what changes the math without changing the tensors (the soft-cap,
 * the window's layers) is named by a resume. */
Test(checkpoint, gemma_mismatch_names_the_field) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_config_gemma_defaults(&cfg, false);
    model md, other;
    model_init(&md, &cfg, 1);
    char *out = out_dir(), *p = ckpt_path(out, 1);
    save_ok(out, 1, &md, 0);
    cfg.attn_softcap = 20.0;
    model_init(&other, &cfg, 2);
    expect_load_error(p, &other, "\"attn_logit_softcapping\"", NULL);
    model_free(&other);
    cfg.attn_softcap = 50.0;
    cfg.sliding_pattern = 3;
    model_init(&other, &cfg, 2);
    expect_load_error(p, &other, "\"layer_types (sliding_window_pattern)\"", NULL);
    model_free(&other);
    free(p), free(out);
    model_free(&md);
}

static void truncate_file(const char *dir, const char *name, long keep) {
    char *p = mt_path_join(dir, name);
    cr_assert_eq(truncate(p, keep), 0, "truncate %s", p);
    free(p);
}

static void remove_file(const char *dir, const char *name) {
    char *p = mt_path_join(dir, name);
    cr_assert_eq(unlink(p), 0, "unlink %s", p);
    free(p);
}

Test(checkpoint, missing_or_corrupt_files_are_named) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir();
    const char *names[] = {"model.safetensors", "optimizer.safetensors", "trainer_state.json",
                           "config.json"};
    for (int i = 0; i < 4; i++) {
        save_ok(out, i, &md, 0);
        char *p = ckpt_path(out, i);
        truncate_file(p, names[i], 100);
        expect_load_error(p, &md, names[i], "truncated");
        remove_file(p, names[i]);
        expect_load_error(p, &md, names[i], "missing");
        free(p);
    }
    /* Same size, wrong content: the safetensors header is checked. */
    save_ok(out, 9, &md, 0);
    char *p = ckpt_path(out, 9), *mp = mt_path_join(p, "model.safetensors");
    FILE *fp = fopen(mp, "r+b");
    cr_assert(fp);
    fputs("garbage!", fp);
    fclose(fp);
    expect_load_error(p, &md, "model.safetensors", NULL);
    remove_file(p, "COMPLETE");
    expect_load_error(p, &md, "COMPLETE", NULL);
    free(mp), free(p), free(out);
    model_free(&md);
}

/* A failed save: no temporary directory left, the earlier checkpoint
 * intact and still the newest, the message names the path and errno text. */
static void assert_failed_save_left_no_trace(const char *out, const model *md) {
    char *ck = mt_path_join(out, "checkpoints"), *p1 = ckpt_path(out, 1), *p2 = ckpt_path(out, 2);
    char found[4096];
    mt_error err;
    cr_assert_eq(count_prefixed(ck, ".tmp"), 0, "temporary directory left behind");
    cr_assert_not(dir_exists(p2));
    cr_assert_eq(mt_checkpoint_find_latest(out, found, sizeof found, &err), 0, "%s", err.msg);
    cr_assert_str_eq(found, p1);
    assert_loads(p1, md);
    free(p1), free(p2), free(ck);
}

/* A real write error (EFBIG from a file size limit, as ENOSPC would be)
 * after model.safetensors succeeded, in the middle of optimizer.safetensors. */
Test(checkpoint, failed_write_removes_temp_dir_and_keeps_previous) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir();
    save_ok(out, 1, &md, 0);
    size_t w_bytes = (size_t)md.t.n_params * sizeof(float);
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = w_bytes + w_bytes / 2;  /* weights fit, m + v (2x) do not */
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    mt_error err;
    for (int parallel = 0; parallel < 2; parallel++) {
        mt_checkpoint_opts o = {.keep_last = 1, .parallel = parallel};
        cr_assert_eq(mt_checkpoint_save_opts(out, 2, &md.s, &md.cfg, STATE, &o, NULL, 0, &err),
                     -1, "save should fail");
        cr_assert(strstr(err.msg, "optimizer.safetensors"), "%s", err.msg);
        cr_assert(strstr(err.msg, "File too large"), "%s", err.msg);
        cr_assert(strstr(err.msg, "untouched"), "%s", err.msg);
        assert_failed_save_left_no_trace(out, &md);
    }
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    free(out);
    model_free(&md);
}

static int failing_hook(void *ctx, const char *tmp_dir, const char *file, mt_error *err) {
    return strcmp(file, (const char *)ctx) ? 0 : mt_errorf(err, "injected failure");
}

Test(checkpoint, failure_at_each_stage_keeps_previous) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir();
    save_ok(out, 1, &md, 0);
    const char *stages[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                            "trainer_state.json"};
    for (int i = 0; i < 4; i++) {
        mt_checkpoint_opts o = {.keep_last = 1, .parallel = 1, .hook = failing_hook,
                                .hook_ctx = (void *)stages[i]};
        mt_error err;
        cr_assert_eq(mt_checkpoint_save_opts(out, 2, &md.s, &md.cfg, STATE, &o, NULL, 0, &err),
                     -1);
        cr_assert(strstr(err.msg, "injected failure"), "%s", err.msg);
        cr_assert(strstr(err.msg, stages[i]), "%s", err.msg);
        assert_failed_save_left_no_trace(out, &md);
    }
    free(out);
    model_free(&md);
}

Test(checkpoint, unwritable_out_dir_is_reported_with_path) {
    model md;
    model_tiny(&md, 1);
    touch(tmp, "afile");
    char *out = mt_path_join(tmp, "afile/run");  /* below a regular file */
    mt_error err;
    cr_assert_eq(mt_checkpoint_save(out, 1, &md.s, &md.cfg, STATE, 1, NULL, 0, &err), -1);
    cr_assert(strstr(err.msg, out), "%s", err.msg);
    cr_assert(strstr(err.msg, "not a directory"), "%s", err.msg);
    free(out);
    model_free(&md);
}

/* ---- SIGKILL during a save ---------------------------------------------- */

/* After the crash: the previous checkpoint is the newest and loads bitwise;
 * the next save works and removes the dead process's temporary directory. */
static void assert_recovers_after_crash(const char *out, const model *md, pid_t child) {
    char *ck = mt_path_join(out, "checkpoints"), *p1 = ckpt_path(out, 1), *p2 = ckpt_path(out, 2);
    char found[4096], tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-step-00000002-%ld", (long)child);
    char *stale = mt_path_join(ck, tmp_name);
    mt_error err;
    cr_assert(dir_exists(stale), "the killed save's directory should still be there");
    cr_assert_not(dir_exists(p2), "the killed save must not be published");
    cr_assert_eq(mt_checkpoint_find_latest(out, found, sizeof found, &err), 0, "%s", err.msg);
    cr_assert_str_eq(found, p1);
    assert_loads(p1, md);
    save_ok(out, 3, md, 5);
    cr_assert_not(dir_exists(stale), "stale temporary directory not cleaned");
    cr_assert_eq(mt_checkpoint_find_latest(out, found, sizeof found, &err), 0, "%s", err.msg);
    char *p3 = ckpt_path(out, 3);
    cr_assert_str_eq(found, p3);
    assert_loads(p1, md);
    free(p3), free(stale), free(p1), free(p2), free(ck);
}

static void kill_and_reap(pid_t pid) {
    cr_assert_eq(kill(pid, SIGKILL), 0);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "the child finished (status %d) before it was killed", status);
}

/* Hook of the child: once model.safetensors is complete, tell the parent
 * and wait to be killed; the optimizer file may be half written. */
static int report_and_wait(void *ctx, const char *tmp_dir, const char *file, mt_error *err) {
    if (strcmp(file, "model.safetensors") != 0) return 0;
    int fd = *(int *)ctx;
    if (write(fd, "x", 1) != 1) _exit(3);
    for (;;) pause();
}

Test(checkpoint, sigkill_between_files_leaves_previous_loadable) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir();
    save_ok(out, 1, &md, 5);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fds[0]);
        mt_checkpoint_opts o = {.keep_last = 5, .parallel = 1, .hook = report_and_wait,
                                .hook_ctx = &fds[1]};
        mt_error err;
        mt_checkpoint_save_opts(out, 2, &md.s, &md.cfg, STATE, &o, NULL, 0, &err);
        _exit(2);  /* not reached: the hook never returns */
    }
    close(fds[1]);
    char c;
    cr_assert_eq(read(fds[0], &c, 1), 1, "the child died before writing the weights");
    close(fds[0]);
    kill_and_reap(pid);
    assert_recovers_after_crash(out, &md, pid);
    free(out);
    model_free(&md);
}

/* The size of the first regular file below dir whose name contains ".tmp-"
 * (a safetensors file being written), or -1. */
static long long partial_file_size(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    long long size = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && size < 0) {
        if (!strstr(e->d_name, ".safetensors.tmp-")) continue;
        char *p = mt_path_join(dir, e->d_name);
        struct stat st;
        if (stat(p, &st) == 0) size = st.st_size;
        free(p);
    }
    closedir(d);
    return size;
}

/* The child saves a ~45M-parameter model (540 MB); the parent kills it as
 * soon as a safetensors file in its temporary directory passes 1 MiB, i.e.
 * in the middle of writing tensor data. The child allocates its store
 * itself with calloc (no OpenMP after fork). */
Test(checkpoint, sigkill_in_the_middle_of_a_large_write_leaves_previous_loadable,
     .timeout = MT_TEST_LIMIT(120)) {
    model md;
    model_tiny(&md, 1);
    char *out = out_dir();
    save_ok(out, 1, &md, 5);
    mt_config big = md.cfg;
    big.C = 1024, big.L = 1, big.NH = 16, big.NKV = 16, big.HD = 64, big.F = 2816, big.V = 32000;
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        mt_param_table t;
        mt_error err;
        if (mt_params_init(&t, &big, &err)) _exit(3);
        mt_host_store s = {.table = &t};
        s.w = calloc(t.total, sizeof(float));
        s.m = calloc(t.total, sizeof(float));
        s.v = calloc(t.total, sizeof(float));
        if (!s.w || !s.m || !s.v) _exit(4);
        for (size_t i = 0; i < t.total; i++) s.w[i] = (float)(i % 1000) * 1e-3f;
        mt_checkpoint_save(out, 2, &s, &big, STATE, 5, NULL, 0, &err);
        _exit(0);
    }
    char *ck = mt_path_join(out, "checkpoints"), tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-step-00000002-%ld", (long)pid);
    char *tdir = mt_path_join(ck, tmp_name);
    struct timespec nap = {0, 200 * 1000};  /* 0.2 ms between looks, for 30 s at most */
    time_t deadline = time(NULL) + 30;
    while (partial_file_size(tdir) < (1 << 20) && time(NULL) < deadline) nanosleep(&nap, NULL);
    cr_assert_geq(partial_file_size(tdir), 1 << 20, "the child never started writing");
    kill_and_reap(pid);
    assert_recovers_after_crash(out, &md, pid);
    free(tdir), free(ck), free(out);
    model_free(&md);
}

/* ---- signals ------------------------------------------------------------ */

Test(signals, sigterm_sets_the_flag) {
    mt_signals_install();
    cr_assert_eq(mt_signals_pending(), 0);
    cr_assert_eq(mt_signals_last(), 0);
    raise(SIGTERM);
    cr_assert_eq(mt_signals_pending(), 1);
    cr_assert_eq(mt_signals_last(), SIGTERM);
    mt_signals_install();  /* re-arm */
    cr_assert_eq(mt_signals_pending(), 0);
    raise(SIGINT);
    cr_assert_eq(mt_signals_last(), SIGINT);
}

/* The first SIGINT is caught; the second ends the process (force quit). */
Test(signals, second_sigint_kills) {
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        mt_signals_install();
        raise(SIGINT);
        if (!mt_signals_pending()) _exit(1);
        raise(SIGINT);
        _exit(2);  /* survived the second one: wrong */
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "status %d", status);
}
