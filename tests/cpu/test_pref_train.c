/* Preference training end to end on the CPU (the built-in tiny model, byte
 * tokenizer): the pairs' packing, an exact resume of a DPO run, the
 * reference pass continued after a cut, and bad pairs named or skipped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megatrain.h"
#include "data/dataset.h"
#include "data/pref_data.h"
#include "data/tokenizer.h"
#include "io/file.h"
#include "testlib.h"
#include "model/config.h"
#include "model/params.h"
#include "host/store.h"
#include "train/pref_ref.h"
#include "train/runner.h"
#include "train/train_config.h"
#include "train/trainer.h"

#define BOS 256 /* the byte tokenizer's */
#define EOS 257

/* n pairs of prompts and answers of varied lengths, plus `extra` lines. */
static char *write_pairs(const char *dir, const char *name, int n, const char *extra) {
    static const char *const words = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN";
    char *p = mt_path_join(dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"prompt\": \"%.*s\", \"chosen\": \" %.*s\", \"rejected\": \" %.*s\"}\n",
                3 + i % 7, words + i % 5, 2 + (i * 3) % 11, words + 20, 1 + (i * 5) % 9,
                words + 7);
    if (extra) fputs(extra, f);
    fclose(f);
    return p;
}

static void config(mt_train_config *tc, const char *out, const char *data, const char *extra) {
    mt_error err;
    cr_assert_eq(mt_test_train_args(tc, &err, "train --out %s --data %s --sample-tokens 0 "
                                    "--log-every 1000 --seq-len 48 --batch-size 2 "
                                    "--micro-batches 2 %s", out, data, extra), 0, "%s", err.msg);
}

static char *slurp(const char *path, size_t *n) {
    char *buf = NULL;
    size_t len = 0;
    mt_error err;
    cr_assert_eq(mt_read_file(path, &buf, &len, &err), 0, "%s", err.msg);
    if (n) *n = len;
    return buf;
}

static mt_pref_data open_pairs(const char *path, int skip, int64_t B, int64_t T,
                               mt_tokenizer **tok) {
    *tok = mt_tokenizer_bytes();
    mt_pref_data_opts o = {.path = path, .skip_bad_pairs = skip, .seed = 5, .epochs = 2,
                           .B = B, .T = T};
    mt_pref_data d;
    mt_error err;
    cr_assert_eq(mt_pref_data_open(&d, &o, *tok, 258, &err), 0, "%s", err.msg);
    return d;
}

/* Each pair's answers lie in one micro-batch, their targets are exactly the
 * answer's bytes and EOS, nothing else of the batch has a target, and
 * positions restart at each document. */
Test(pref_data, pairs_pack_into_one_micro_batch_with_answer_targets_only) {
    char *dir = mt_test_tmpdir(), *p = write_pairs(dir, "pairs.jsonl", 30, NULL);
    mt_tokenizer *tok;
    enum { M = 2, B = 2, T = 40 };
    mt_pref_data d = open_pairs(p, 0, B, T, &tok);
    cr_assert_eq(d.n_pairs, 30);
    int32_t x[M * B * T], y[M * B * T], pos[M * B * T];
    mt_pref_pair pairs[M * B * T / 2];
    int64_t ids[M * B * T / 2], n, seen = 0, steps = 0;
    while (!mt_pref_data_next(&d, M, x, y, pos, pairs, &n, ids)) {
        int64_t with_target = 0, answer_tokens = 0;
        for (int i = 0; i < M * B * T; i++) with_target += y[i] != MT_IGNORE_INDEX;
        for (int64_t k = 0; k < n; k++) {
            cr_assert_eq(pairs[k].chosen.mb, pairs[k].rejected.mb);
            for (int a = 0; a < 2; a++) {
                mt_pref_span sp = a ? pairs[k].rejected : pairs[k].chosen;
                const int32_t *yy = y + sp.mb * B * T;
                int64_t doc = 2 * ids[k] + a, len = d.off[doc + 1] - d.off[doc];
                /* the answer: the tokens after the prompt, through EOS */
                int64_t first = 0;
                while (!d.keep[d.off[doc] + first]) first++;
                cr_assert_eq(sp.end - sp.start, len - first, "pair %lld answer %d",
                             (long long)ids[k], a);
                for (int64_t t = sp.start; t < sp.end; t++)
                    cr_assert_eq(yy[t], d.tok[d.off[doc] + first + (t - sp.start)]);
                cr_assert_eq(yy[sp.end - 1], EOS);
                cr_assert_eq(pos[sp.mb * B * T + sp.start - first + 1], 0, "document start");
                answer_tokens += sp.end - sp.start;
            }
        }
        cr_assert_eq(with_target, answer_tokens, "only answers have targets");
        seen += n, steps++;
    }
    cr_assert_eq(seen, 60, "2 epochs of 30 pairs, each once");
    cr_assert_eq(steps, mt_pref_data_steps(&d, M));
    mt_pref_data_free(&d);
    mt_tokenizer_free(tok);
    free(p);
    mt_test_rmtree(dir);
    free(dir);
}

Test(pref_train, a_resumed_dpo_run_continues_bitwise, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), *p = write_pairs(dir, "pairs.jsonl", 24, NULL), a[256],
         b[256], path[1024];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    const char *opts = "--objective dpo --beta 0.5 --steps 8 --save-every 4 --save-dtype fp32 "
                       "--epochs 3";
    mt_train_config tc;
    mt_error err;
    config(&tc, a, p, opts);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    config(&tc, b, p, opts);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "rm -rf %s/checkpoints/step-00000008 %s/model", b, b);
    cr_assert_eq(system(path), 0);
    char resume[300];
    snprintf(resume, sizeof resume, "%s --resume auto", opts);
    config(&tc, b, p, resume);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    char pa[1024], pb[1024];
    size_t na, nb;
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model/model.safetensors", b);
    char *x = slurp(pa, &na), *y = slurp(pb, &nb);
    cr_assert(na == nb && !memcmp(x, y, na), "the resumed model differs");
    free(x), free(y);
    /* the same losses and rewards at every step (timings differ) */
    snprintf(pa, sizeof pa, "%s/metrics.jsonl", a);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", b);
    char *ma = slurp(pa, NULL), *mb = slurp(pb, NULL);
    int lines = 0;
    for (char *la = ma, *lb = mb; *la && *lb; lines++) {
        static const char *const keys[] = {"\"loss\"", "\"rewards/margins\"", "\"logps/chosen\""};
        for (int k = 0; k < 3; k++) {
            const char *va = strstr(la, keys[k]), *vb = strstr(lb, keys[k]);
            cr_assert(va && vb, "line %d has no %s", lines, keys[k]);
            cr_assert_eq(strncmp(va, vb, 32), 0, "line %d: %.32s vs %.32s", lines, va, vb);
        }
        la = strchr(la, '\n') + 1, lb = strchr(lb, '\n') + 1;
    }
    cr_assert_eq(lines, 8);
    free(ma), free(mb);
    mt_test_rmtree(dir);
    free(dir), free(p);
}

/* A reference pass cut short continues from its partial file, and gives
 * the file an uninterrupted pass writes. */
Test(pref_train, the_reference_pass_continues_after_a_cut) {
    char *dir = mt_test_tmpdir(), *p = write_pairs(dir, "pairs.jsonl", 20, NULL);
    mt_tokenizer *tok;
    mt_pref_data d = open_pairs(p, 0, 2, 48, &tok);
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    mt_host_store s;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&s, &t, 0, &err), 0, "%s", err.msg);
    mt_host_store_init_random(&s, 3, 0.02f);
    mt_runner r;
    mt_runner_opts ro = {.device = 1};
    cr_assert_eq(mt_runner_init(&r, &cfg, &t, &s, 1, 2, 48, &ro, &err), 0, "%s", err.msg);
    char *full = mt_path_join(dir, "ref.bin"), part[600];
    snprintf(part, sizeof part, "%s.partial", full);
    uint64_t sum = mt_pref_ref_model_sum(s.w, t.total);
    int64_t resumed;
    cr_assert_eq(mt_pref_ref_compute(&d, r.be, t.n_layers, 1, full, sum, &resumed, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(resumed, 0);
    size_t n_whole;
    char *whole = slurp(full, &n_whole);
    /* a pass cut after 7 pairs: the header and 7 pairs' values */
    FILE *f = fopen(part, "wb");
    cr_assert(f);
    fwrite(whole, 1, 32 + 7 * 16, f);
    fclose(f);
    unlink(full);
    cr_assert_eq(mt_pref_ref_compute(&d, r.be, t.n_layers, 1, full, sum, &resumed, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(resumed, 7);
    size_t n_again;
    char *again = slurp(full, &n_again);
    cr_assert(n_again == n_whole && !memcmp(whole, again, n_whole));
    /* loading checks the data and the model; a damaged file is refused */
    cr_assert_eq(mt_pref_ref_load(&d, full, sum, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_pref_ref_load(&d, full, sum + 1, &err), -1);
    cr_assert(strstr(err.msg, "reference weights"), "%s", err.msg);
    again[40] ^= 1;
    f = fopen(full, "wb");
    fwrite(again, 1, n_again, f);
    fclose(f);
    cr_assert_eq(mt_pref_ref_load(&d, full, sum, &err), -1);
    cr_assert(strstr(err.msg, "damaged"), "%s", err.msg);
    free(whole), free(again), free(full), free(p);
    mt_runner_free(&r);
    mt_host_store_free(&s);
    mt_params_free(&t);
    mt_pref_data_free(&d);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* Each kind of bad pair is an error naming its line and field; with
 * --skip-bad-pairs the run trains on the rest and counts them. */
Test(pref_train, bad_pairs_are_named_or_skipped_and_counted, .timeout = MT_TEST_LIMIT(60)) {
    static const struct {
        const char *line, *want;
    } bad[] = {
        {"{\"prompt\": \"Hi\", \"chosen\": \" yes\"}\n", "pairs.jsonl:21: field \"rejected\" is missing"},
        {"{\"prompt\": \"Hi\", \"chosen\": \"\", \"rejected\": \" no\"}\n",
         "pairs.jsonl:21: field \"chosen\" is empty"},
        {"{\"prompt\": \"Hi there, this prompt is long\", \"chosen\": \" and this answer is long "
         "too\", \"rejected\": \" no\"}\n", "pairs.jsonl:21: the pair is longer than --seq-len"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"chosen\": \" a\", "
         "\"rejected\": \" b\"}\n", "pairs.jsonl:21: field \"prompt\" is a list, unlike"},
        {"not json\n", "pairs.jsonl:21: not valid JSON"},
    };
    char *dir = mt_test_tmpdir(), out[600];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *p = write_pairs(dir, "pairs.jsonl", 20, bad[i].line);
        config(&tc, out, p, "--objective simpo --steps 2 --batch-size 1 --overwrite");
        cr_assert_eq(mt_train(&tc, &err), -1, "line %zu", i);
        cr_assert(strstr(err.msg, bad[i].want) && strstr(err.msg, "--skip-bad-pairs"),
                  "%s\nwant: %s", err.msg, bad[i].want);
        free(p);
    }
    char all[2048] = "";
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) strcat(all, bad[i].line);
    char *p = write_pairs(dir, "pairs.jsonl", 20, all);
    config(&tc, out, p, "--objective simpo --steps 2 --batch-size 1 --overwrite "
           "--skip-bad-pairs");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    char mp[700];
    snprintf(mp, sizeof mp, "%s/metrics.jsonl", out);
    char *m = slurp(mp, NULL);
    cr_assert(strstr(m, "\"skipped_pairs\":5"), "%s", m);
    free(m), free(p);
    mt_test_rmtree(dir);
    free(dir);
}

/* The number after "key": in the last line of text holding it. */
static double last_value(const char *text, const char *key) {
    const char *p = NULL, *q = text;
    while ((q = strstr(q, key))) p = q++;
    cr_assert(p, "no %s", key);
    return atof(p + strlen(key) + 1);
}

/* `megatrain eval --objective simpo` of the saved model gives the run's
 * last evaluation of the same held-out pairs. */
Test(pref_train, eval_of_the_saved_model_repeats_the_runs_last_evaluation,
     .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), *p = write_pairs(dir, "pairs.jsonl", 16, NULL), out[600];
    char *held = write_pairs(dir, "held.jsonl", 9, NULL);
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    char extra[900];
    snprintf(extra, sizeof extra, "--objective simpo --beta 2 --steps 6 --save-dtype fp32 "
             "--epochs 2 --eval-data %s", held);
    config(&tc, out, p, extra);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    char path[700];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    char *m = slurp(path, NULL);
    snprintf(path, sizeof path, "%s/model", out);
    mt_model *model = mt_model_open(path, NULL);
    cr_assert(model, "%s", mt_last_error());
    mt_eval_opts eo;
    mt_eval_opts_defaults(&eo);
    eo.data = held, eo.objective = "simpo", eo.beta = 2, eo.device = "cpu";
    eo.seq_len = 48, eo.batch_size = 2, eo.micro_batches = 2;
    mt_eval_result res;
    cr_assert_eq(mt_model_eval(model, &eo, &res), 0, "%s", mt_last_error());
    cr_assert_eq(res.pairs, 9);
    cr_assert_float_eq(res.loss, last_value(m, "\"eval_loss\""), 1e-6);
    cr_assert_float_eq(res.rewards_margins, last_value(m, "\"eval_rewards/margins\""), 1e-6);
    cr_assert_float_eq(res.rewards_accuracies, last_value(m, "\"eval_rewards/accuracies\""), 1e-9);
    cr_assert_float_eq(res.logps_chosen, last_value(m, "\"eval_logps/chosen\""), 1e-6);
    mt_model_close(model);
    free(m), free(p), free(held);
    mt_test_rmtree(dir);
    free(dir);
}

/* A byte-level tokenizer in dir whose chat template prints each turn as
 * "role: content" (as test_data_formats.c's). */
static mt_tokenizer *chat_tokenizer(const char *dir) {
    char *src = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_bytelevel.json"), *buf;
    char *dst = mt_path_join(dir, "tokenizer.json"), *cfg = mt_path_join(dir, "tokenizer_config.json");
    size_t len;
    mt_error err = {{0}};
    cr_assert_eq(mt_read_file(src, &buf, &len, &err), 0, "%s", err.msg);
    FILE *f = fopen(dst, "wb");
    fwrite(buf, 1, len, f);
    fclose(f);
    f = fopen(cfg, "wb");
    fputs("{\"chat_template\": \"{% for m in messages %}{{ m.role }}: {{ m.content }}\\n"
          "{% endfor %}\"}", f);
    fclose(f);
    mt_tokenizer *tok = mt_tokenizer_load(dst, &err);
    cr_assert(tok, "%s", err.msg);
    free(buf), free(src), free(dst), free(cfg);
    return tok;
}

/* TRL's conversational pairs: each answer's document is the conversational
 * prompt/completion document of the prompt and that answer, tokens and
 * loss flags alike; a bad message is named by the pair's line and answer. */
Test(pref_data, conversational_pairs_render_as_prompt_completion) {
    char *dir = mt_test_tmpdir();
    mt_tokenizer *tok = chat_tokenizer(dir);
    int64_t V = (int64_t)mt_tokenizer_vocab_size(tok);
    const char *prompt = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                         "\"content\": \"Sky?\"}]";
    const char *ans[2] = {"[{\"role\": \"assistant\", \"content\": \"Blue.\"}]",
                          "[{\"role\": \"assistant\", \"content\": \"Green, I think.\"}]"};
    char line[1024], *p = mt_path_join(dir, "pairs.jsonl"), *c = mt_path_join(dir, "c.jsonl");
    snprintf(line, sizeof line, "{\"prompt\": %s, \"chosen\": %s, \"rejected\": %s}\n", prompt,
             ans[0], ans[1]);
    FILE *f = fopen(p, "wb");
    fputs(line, f);
    fclose(f);
    mt_pref_data_opts o = {.path = p, .epochs = 1, .B = 1, .T = 200};
    mt_pref_data d;
    mt_error err = {{0}};
    cr_assert_eq(mt_pref_data_open(&d, &o, tok, V, &err), 0, "%s", err.msg);
    cr_assert_str_eq(d.format, "messages");
    for (int a = 0; a < 2; a++) {
        f = fopen(c, "wb");
        fprintf(f, "{\"prompt\": %s, \"completion\": %s}\n", prompt, ans[a]);
        fclose(f);
        mt_data_opts co = {.path = c, .epochs = 1};
        mt_dataset *ds = mt_dataset_open(&co, tok, V, &err);
        cr_assert(ds, "%s", err.msg);
        const mt_mtok *m = mt_dataset_corpus(ds);
        cr_assert_eq((int64_t)m->n_tokens, d.off[a + 1] - d.off[a], "answer %d", a);
        for (uint64_t t = 0; t < m->n_tokens; t++) {
            cr_assert_eq((int32_t)mt_mtok_token(m, t), d.tok[d.off[a] + (int64_t)t]);
            cr_assert_eq(mt_mtok_trainable(m, t), d.keep[d.off[a] + (int64_t)t] != 0);
        }
        mt_dataset_free(ds);
    }
    mt_pref_data_free(&d);
    f = fopen(p, "wb");
    fputs(line, f);
    fputs("{\"prompt\": [{\"role\": \"bot\", \"content\": \"x\"}], \"chosen\": [{\"role\": "
          "\"assistant\", \"content\": \"y\"}], \"rejected\": [{\"role\": \"assistant\", "
          "\"content\": \"z\"}]}\n", f);
    fclose(f);
    cr_assert_eq(mt_pref_data_open(&d, &o, tok, V, &err), -1);
    cr_assert(strstr(err.msg, "pairs.jsonl:2: field \"chosen\": prompt[0].role is 'bot'"), "%s",
              err.msg);
    mt_tokenizer_free(tok);
    free(p), free(c);
    mt_test_rmtree(dir);
    free(dir);
}
