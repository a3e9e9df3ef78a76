/* The training run end to end on the CPU: exact resume, fine-tuning an HF
 * directory on JSONL data, stopping on SIGTERM with a checkpoint (also in
 * the middle of a long step), the built-in model's output as a whole
 * Hugging Face directory (its tokenizer's vocabulary and files), and the
 * errors a user meets first. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "megatrain.h"
#include "data/tokenizer.h"
#include "util/sys.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "host/store.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "model/params.h"
#include "io/file.h"
#include "testlib.h"


/* A config from command-line style arguments. */
static void config(mt_train_config *tc, const char *out, const char *extra) {
    mt_error err;
    cr_assert_eq(mt_test_train_args(tc, &err, "train --out %s --sample-tokens 0 "
                                    "--log-every 1000 %s", out, extra), 0, "%s", err.msg);
}

static char *slurp(const char *path, size_t *n) {
    char *buf = NULL;
    size_t len = 0;
    mt_error err;
    cr_assert_eq(mt_read_file(path, &buf, &len, &err), 0, "%s", err.msg);
    if (n) *n = len;
    return buf;
}

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    cr_assert_eq(na, nb, "%s and %s differ in size", a, b);
    cr_assert_eq(memcmp(x, y, na), 0, "%s and %s differ", a, b);
    free(x);
    free(y);
}

Test(trainer, resume_gives_the_same_losses_and_weights_bitwise, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), a[256], b[256], path[1024];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, a, "--steps 12 --save-every 6 --save-dtype fp32");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    /* b: the same run, then its end is lost and it resumes from step 6 */
    config(&tc, b, "--steps 12 --save-every 6 --save-dtype fp32");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "rm -rf %s/checkpoints/step-00000012 %s/model", b, b);
    cr_assert_eq(system(path), 0);
    config(&tc, b, "--steps 12 --save-every 6 --save-dtype fp32 --resume auto");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model/model.safetensors", b);
    assert_same_file(pa, pb);
    /* metrics: the same losses, each step once (timings differ) */
    snprintf(pa, sizeof pa, "%s/metrics.jsonl", a);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", b);
    char *ma = slurp(pa, NULL), *mb = slurp(pb, NULL);
    int lines = 0;
    for (char *la = ma, *lb = mb; *la && *lb; lines++) {
        const char *lossa = strstr(la, "\"loss\""), *lossb = strstr(lb, "\"loss\"");
        cr_assert(lossa && lossb);
        cr_assert_eq(strncmp(lossa, lossb, 24), 0, "line %d: %.24s vs %.24s", lines, lossa, lossb);
        char *ea = strchr(la, '\n'), *eb = strchr(lb, '\n');
        cr_assert(ea && eb, "line %d is not terminated", lines);
        la = ea + 1;
        lb = eb + 1;
        cr_assert_eq(!*la, !*lb, "metrics have different line counts");
    }
    cr_assert_eq(lines, 12, "12 steps logged once each, got %d", lines);
    free(ma);
    free(mb);
    /* changing what decides the batches is refused, naming the option */
    config(&tc, b, "--steps 12 --seq-len 32 --resume auto");
    cr_assert_eq(mt_train(&tc, &err), -1);
    cr_assert(strstr(err.msg, "seq_len"), "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}

static char warnings[8192];

static void keep_warnings(const mt_event *ev, void *user) {
    if (ev->kind == MT_EVENT_WARNING)
        strncat(warnings, ev->text, sizeof warnings - strlen(warnings) - 1);
}

/* The "loss" of each row of out/metrics.jsonl, as written, one per line. */
static void metrics_losses(const char *out, char *buf, size_t cap) {
    char path[600], *text, *p;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    text = slurp(path, NULL);
    buf[0] = 0;
    for (p = text; (p = strstr(p, "\"loss\":")); p++) {
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, "%.*s\n", (int)strcspn(p, ",}"), p);
    }
    free(text);
}

/* Issue 29: valid completion data whose prompts fill whole rows made a
 * batch with no loss token, which stopped the run for good ("the batch has
 * no target tokens"; a resume met it again). Such a batch is skipped and
 * counted (a warning, "empty_batches" in the step's row); the run goes on,
 * and a resume from a checkpoint taken after skips continues bitwise. */
Test(trainer, a_batch_without_loss_tokens_is_skipped_and_counted, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), a[512], b[512], data[512], extra[1024], path[1200];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(data, sizeof data, "%s/sft.jsonl", dir);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 30; i++)  /* a prompt of 5 rows of 8 tokens, then 3 tokens of loss */
        fprintf(f, "{\"prompt\": \"Please repeat after me the word number %02d: \", "
                "\"completion\": \"ok\"}\n", i);
    fclose(f);
    snprintf(extra, sizeof extra, "--data %s --seq-len 8 --batch-size 1 --micro-batches 1 "
             "--steps 12 --save-every 6 --warmup-steps 2 --save-dtype fp32", data);
    mt_train_config tc;
    mt_error err;
    config(&tc, a, extra);
    mt_events ev = {.fn = keep_warnings};
    mt_run *R = mt_trainer_open(&tc, &ev, &err);
    cr_assert(R, "%s", err.msg);
    cr_assert_eq(mt_trainer_train(R, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_trainer_steps_done(R), 12);
    mt_trainer_close(R);
    cr_assert(strstr(warnings, "no loss token"), "no warning: '%s'", warnings);
    snprintf(path, sizeof path, "%s/metrics.jsonl", a);
    char *m = slurp(path, NULL);
    cr_assert(strstr(m, "\"empty_batches\":"), "%s", m);
    free(m);
    /* b: the same run, its end lost, resumed from step 6 */
    config(&tc, b, extra);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "rm -rf %s/checkpoints/step-00000012 %s/model", b, b);
    cr_assert_eq(system(path), 0);
    strcat(extra, " --resume auto");
    config(&tc, b, extra);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    char la[4096], lb[4096], pa[1200], pb[1200];
    metrics_losses(a, la, sizeof la);
    metrics_losses(b, lb, sizeof lb);
    cr_assert_str_eq(la, lb);
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model/model.safetensors", b);
    assert_same_file(pa, pb);
    mt_test_rmtree(dir);
    free(dir);
}

Test(trainer, fine_tunes_an_hf_directory_on_completion_data, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), model[256], data[256], out[256], tok[256];
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(data, sizeof data, "%s/sft.jsonl", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(tok, sizeof tok, "%s/tokenizer/tiny_bytelevel.json", mt_test_fixtures_dir());
    mt_model_shape shape;
    mt_model_shape_defaults(&shape);
    shape.hidden = 64;
    shape.layers = 2;
    shape.heads = 4;
    shape.kv_heads = 2;
    shape.ffn = 128;
    shape.max_positions = 64;
    cr_assert_eq(mt_model_init(model, tok, &shape, NULL), 0, "%s", mt_last_error());
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"prompt\": \"What is %d plus %d? \", \"completion\": \"It is %d.\"}\n",
                i, i + 1, 2 * i + 1);
    fclose(f);
    mt_train_config tc;
    mt_error err;
    char extra[1024];
    snprintf(extra, sizeof extra, "--model %s --data %s --seq-len 32 "
             "--batch-size 2 --micro-batches 2 --epochs 2 --lr 1e-3 --warmup-steps 2 "
             "--device cpu --save-dtype fp32", model, data);
    config(&tc, out, extra);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    /* The saved model is an HF directory with the trained weights. */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s/model", out);
    mt_config cfg;
    cr_assert_eq(mt_model_load_config(&cfg, saved, &err), 0, "%s", err.msg);
    mt_param_table t;
    mt_host_store s0, s1;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0);
    cr_assert_eq(mt_host_store_create(&s0, &t, 0, &err), 0);
    cr_assert_eq(mt_host_store_create(&s1, &t, 0, &err), 0);
    cr_assert_eq(mt_model_load_weights(&s0, model, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_model_load_weights(&s1, saved, &err), 0, "%s", err.msg);
    cr_assert_neq(memcmp(s0.w, s1.w, t.total * sizeof(float)), 0, "training changed nothing");
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", saved);
    struct stat st;
    cr_assert_eq(stat(tj, &st), 0, "the tokenizer is copied next to the model");
    mt_host_store_free(&s0);
    mt_host_store_free(&s1);
    mt_params_free(&t);
    mt_test_rmtree(dir);
    free(dir);
}

Test(trainer, sigterm_saves_a_checkpoint_and_resume_continues, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), out[512], metrics[600];
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        mt_train_config tc;
        mt_error err;
        config(&tc, out, "--steps 100000 --save-every 0");
        _exit(mt_train(&tc, &err) == 1 ? 42 : 1);
    }
    /* wait for a few steps, then ask it to stop */
    for (int i = 0; i < 600; i++) {
        FILE *f = fopen(metrics, "r");
        int n = 0;
        char line[4096];
        while (f && fgets(line, sizeof line, f)) n++;
        if (f) fclose(f);
        if (n >= 3) break;
        usleep(50000);
    }
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 42,
              "the run stops cleanly (status %d)", status);
    char found[1024];
    mt_error err;
    cr_assert_eq(mt_checkpoint_find_latest(out, found, sizeof found, &err), 0, "%s", err.msg);
    mt_train_config tc;
    char extra[64];
    int step = atoi(strrchr(found, '-') + 1);
    cr_assert_gt(step, 2);
    snprintf(extra, sizeof extra, "--steps %d --save-every 0 --resume auto", step + 2);
    config(&tc, out, extra);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}

/* The "trainer" object of a checkpoint's trainer_state.json without its
 * options (which hold --steps), as text. */
static char *trainer_state(const char *ckpt) {
    char path[1200];
    snprintf(path, sizeof path, "%s/trainer_state.json", ckpt);
    char *text = slurp(path, NULL);
    cJSON *o = cJSON_Parse(text);
    cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "trainer");
    cr_assert(cJSON_IsObject(t), "%s", text);
    cJSON_DeleteItemFromObjectCaseSensitive(t, "config");
    char *s = cJSON_PrintUnformatted(t);
    cJSON_Delete(o);
    free(text);
    return s;
}

/* Issue 29: SIGTERM waited for the step under way (a CPU run with a long
 * step still ran 10 minutes after it). Now the step stops at its next
 * layer, nothing of it applied, and the checkpoint saved is the state after
 * the last step done: the same bytes as an uninterrupted run's checkpoint
 * of that step (weights, Adam state, data position). Steps of a few seconds
 * (8 x 512 tokens x 4 micro-batches of the tiny model on JSONL data); the
 * stop must come within half a step, where finishing the step took a whole
 * one (the tiny model's step binds 7 layers, each for 4 micro-batches: a
 * check every 1/28 of it). */
Test(trainer, sigterm_during_a_long_step_stops_at_the_next_layer, .timeout = MT_TEST_LIMIT(300)) {
    char *dir = mt_test_tmpdir(), a[256], b[256], data[300], metrics[600], ca[600], cb[600];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(data, sizeof data, "%s/text.jsonl", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", b);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 2000; i++)
        fprintf(f, "{\"text\": \"Document %d: the quick brown fox jumps over the lazy dog, "
                "again and again, %d times.\"}\n", i, i * 7 % 13);
    fclose(f);
    const char *shape = "--batch-size 8 --seq-len 512 --micro-batches 4 --device cpu";
    char extra[512];
    mt_train_config tc;
    mt_error err;
    snprintf(extra, sizeof extra, "--data %s --steps 3 --save-every 0 %s", data, shape);
    pid_t pid = fork(); /* before any OpenMP work in this process (a forked pool hangs) */
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        config(&tc, b, extra);
        _exit(mt_train(&tc, &err) == 1 ? 42 : 1);
    }
    /* step 1's row: step 2 has begun */
    double step_s = 0;
    for (int i = 0; i < 6000 && step_s == 0; i++) {
        FILE *m = fopen(metrics, "r");
        char line[4096];
        if (m && fgets(line, sizeof line, m) && strchr(line, '\n')) {
            cJSON *row = cJSON_Parse(line);
            step_s = cJSON_GetObjectItemCaseSensitive(row, "step_time_s")->valuedouble;
            cJSON_Delete(row);
        }
        if (m) fclose(m);
        if (step_s == 0) usleep(20000);
    }
    if (step_s == 0) kill(pid, SIGKILL);
    cr_assert_gt(step_s, 0, "no step was done");
    double t0 = mt_now_s();
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    double stop_s = mt_now_s() - t0;
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 42,
              "the run stops cleanly (status %d)", status);
    cr_assert_lt(stop_s, step_s / 2, "the stop took %.2f s, a step %.2f s", stop_s, step_s);
    char found[1024];
    cr_assert_eq(mt_checkpoint_find_latest(b, found, sizeof found, &err), 0, "%s", err.msg);
    cr_assert(strstr(found, "step-00000001"), "the checkpoint is of step 1: %s", found);
    /* the reference: one step, its checkpoint */
    snprintf(extra, sizeof extra, "--data %s --steps 1 --save-every 1 %s", data, shape);
    config(&tc, a, extra);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(ca, sizeof ca, "%s/checkpoints/step-00000001", a);
    snprintf(cb, sizeof cb, "%s/checkpoints/step-00000001", b);
    const char *files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char pa[800], pb[800];
        snprintf(pa, sizeof pa, "%s/%s", ca, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", cb, files[i]);
        assert_same_file(pa, pb);
    }
    char *sa = trainer_state(ca), *sb = trainer_state(cb);
    cr_assert_str_eq(sa, sb, "the state after step 1 (the data position past its batch only)");
    free(sa);
    free(sb);
    size_t n;
    char *rows = slurp(metrics, &n);
    cr_assert(!strstr(rows, "\"step\":2"), "no row of the abandoned step: %s", rows);
    free(rows);
    mt_test_rmtree(dir);
    free(dir);
}

/* The text of 12 new tokens of the model in dir, greedy, without BOS. */
static char *generate_text(const char *dir, const char *tokenizer) {
    mt_model *m = mt_model_open(dir, tokenizer);
    cr_assert(m, "%s", mt_last_error());
    mt_generate_opts go;
    mt_generate_opts_defaults(&go);
    go.prompt = "The";
    go.max_new_tokens = 12;
    go.temperature = 0;
    go.add_special = false;
    go.device = "cpu";
    char *text = mt_model_generate(m, &go, NULL, NULL);
    cr_assert(text, "%s", mt_last_error());
    mt_model_close(m);
    return text;
}

/* Issue 29: the built-in model trained with --tokenizer kept its 258 ids
 * and was saved beside a tokenizer of 32000: eval and generate on it
 * failed. Its vocabulary is now the tokenizer's, eval and generate work on
 * what it saves; the built-in text (bytes) with another tokenizer is
 * refused; and the model of the byte tokenizer is saved with a
 * tokenizer.json of its own, which generates the text the byte tokenizer
 * does. */
Test(trainer, the_builtin_model_is_saved_with_its_tokenizers_vocabulary_and_files,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), a[256], b[256], c[256], data[300], path[700], extra[1024];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(c, sizeof c, "%s/c", dir);
    snprintf(data, sizeof data, "%s/text.jsonl", dir);
    char *tok = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_bytelevel.json");
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 200; i++)
        fprintf(f, "{\"text\": \"The quick brown fox %d jumps over the lazy dog.\"}\n", i);
    fclose(f);
    mt_train_config tc;
    mt_error err;
    snprintf(extra, sizeof extra, "--tokenizer %s --steps 2", tok);
    config(&tc, a, extra);
    cr_assert_eq(mt_train(&tc, &err), -1, "the built-in text trained with %s", tok);
    cr_assert(strstr(err.msg, "built-in text is bytes") && strstr(err.msg, "--data"), "%s",
              err.msg);
    snprintf(extra, sizeof extra, "--tokenizer %s --data %s --steps 2 --seq-len 32 "
             "--batch-size 2 --save-every 0", tok, data);
    config(&tc, b, extra);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model", b);
    mt_config cfg;
    cr_assert_eq(mt_model_load_config(&cfg, path, &err), 0, "%s", err.msg);
    mt_tokenizer *t = mt_tokenizer_load(tok, &err);
    cr_assert_eq(cfg.V, (int64_t)mt_tokenizer_vocab_size(t));
    mt_tokenizer_free(t);
    mt_model *m = mt_model_open(path, NULL); /* model/tokenizer.json */
    cr_assert(m, "%s", mt_last_error());
    mt_eval_opts eo;
    mt_eval_opts_defaults(&eo);
    eo.data = data;
    eo.seq_len = 32;
    eo.batch_size = 2;
    eo.max_batches = 2;
    eo.device = "cpu";
    mt_eval_result res;
    cr_assert_eq(mt_model_eval(m, &eo, &res), 0, "%s", mt_last_error());
    mt_model_close(m);
    free(generate_text(path, NULL));
    /* the byte tokenizer's model: its tokenizer.json gives the same text */
    config(&tc, c, "--steps 2 --save-every 0");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model", c);
    char *x = generate_text(path, NULL), *y = generate_text(path, "bytes");
    cr_assert_str_eq(x, y);
    free(x), free(y);
    free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

Test(trainer, clear_errors_for_bad_inputs) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--data /nonexistent/train.jsonl --steps 3");
    cr_assert_eq(mt_train(&tc, &err), -1);
    cr_assert(strstr(err.msg, "/nonexistent/train.jsonl"), "%s", err.msg);
    config(&tc, out, "--model /nonexistent/model --steps 3");
    cr_assert_eq(mt_train(&tc, &err), -1);
    cr_assert(strstr(err.msg, "/nonexistent/model"), "%s", err.msg);
    config(&tc, out, "--resume /nonexistent/ckpt --steps 3");
    cr_assert_eq(mt_train(&tc, &err), -1);
    cr_assert(strstr(err.msg, "/nonexistent/ckpt"), "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}
