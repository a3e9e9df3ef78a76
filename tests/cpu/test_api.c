/* The public API (include/megatrain.h) as a program using it sees it: a run
 * stepped, saved, closed and resumed gives the losses and weights of an
 * uninterrupted run bit for bit (CPU backend); options, events, errors,
 * tokenizers, data sets, evaluation and generation. Only megatrain.h is
 * included, besides the test helpers. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatrain.h"
#include "testlib.h"

/* Options of a short CPU run of the built-in tiny model in out. */
static mt_options *tiny_options(const char *out, const char *steps) {
    mt_options *o = mt_options_new();
    const char *kv[][2] = {{"out", out},          {"steps", steps},         {"device", "cpu"},
                           {"save_every", "0"},   {"sample_tokens", "0"},   {"save_dtype", "fp32"},
                           {"log_every", "4"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        cr_assert_eq(mt_options_set(o, kv[i][0], kv[i][1]), 0, "%s", mt_last_error());
    return o;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s is missing", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    cr_assert_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    buf[len] = 0;
    *n = (size_t)len;
    return buf;
}

/* Steps r until there is none; the metrics of each into m[from..]. */
static int step_all(mt_run *r, mt_step_metrics *m, int from, int cap) {
    int n = from, rc;
    while (n < cap && (rc = mt_run_step(r, &m[n])) == 0) n++;
    cr_assert_eq(mt_run_step(r, NULL), 1, "a run past its steps has none to do");
    return n;
}

Test(api, step_save_close_resume_gives_the_same_losses_and_weights_bitwise,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), a[256], b[256];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    mt_step_metrics ma[8], mb[8];

    /* a: 8 steps without stopping */
    mt_options *o = tiny_options(a, "8");
    mt_run *r = mt_run_open(o, NULL, NULL);
    cr_assert(r, "%s", mt_last_error());
    cr_assert_eq(mt_run_total_steps(r), 8);
    cr_assert_eq(step_all(r, ma, 0, 8), 8);
    cr_assert_eq(mt_run_finish(r), 0, "%s", mt_last_error());
    cr_assert_eq(mt_run_step(r, NULL), -1, "no step after finish");
    cr_assert(strstr(mt_last_error(), "finished"), "%s", mt_last_error());
    mt_run_close(r);
    mt_options_free(o);

    /* b: 3 steps, a checkpoint, closed (what a lost process leaves), resumed */
    o = tiny_options(b, "8");
    r = mt_run_open(o, NULL, NULL);
    cr_assert(r, "%s", mt_last_error());
    for (int i = 0; i < 3; i++) cr_assert_eq(mt_run_step(r, &mb[i]), 0, "%s", mt_last_error());
    cr_assert_eq(mt_run_save(r), 0, "%s", mt_last_error());
    cr_assert_eq(mt_run_step(r, &mb[3]), 0, "a step after the save is lost with the process");
    mt_run_close(r);
    cr_assert_eq(mt_options_set(o, "resume", "auto"), 0);
    r = mt_run_open(o, NULL, NULL);
    cr_assert(r, "%s", mt_last_error());
    cr_assert_eq(mt_run_steps_done(r), 3, "resumed at the checkpoint's step");
    cr_assert_eq(step_all(r, mb, 3, 8), 8);
    cr_assert_eq(mt_run_finish(r), 0, "%s", mt_last_error());
    mt_run_close(r);
    mt_options_free(o);

    for (int i = 0; i < 8; i++) {
        cr_assert_eq(mb[i].step, i + 1);
        cr_assert_eq(memcmp(&ma[i].loss, &mb[i].loss, sizeof(double)), 0,
                     "step %d: loss %.17g vs %.17g", i + 1, ma[i].loss, mb[i].loss);
        cr_assert_eq(memcmp(&ma[i].grad_norm, &mb[i].grad_norm, sizeof(double)), 0,
                     "step %d: grad norm %.17g vs %.17g", i + 1, ma[i].grad_norm, mb[i].grad_norm);
        cr_assert_eq(memcmp(&ma[i].lr, &mb[i].lr, sizeof(double)), 0, "step %d: lr", i + 1);
    }
    cr_assert_lt(ma[7].loss, ma[0].loss, "training lowers the loss");
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model/model.safetensors", b);
    size_t na, nb;
    char *x = slurp(pa, &na), *y = slurp(pb, &nb);
    cr_assert(na == nb && memcmp(x, y, na) == 0, "the final fp32 weights differ");
    free(x);
    free(y);
    mt_test_rmtree(dir);
    free(dir);
}

/* Events of a run, counted. */
typedef struct seen {
    int info, steps, lines, train_line;
    int64_t last_step;
} seen;

static void count_event(const mt_event *ev, void *user) {
    seen *s = user;
    if (ev->kind == MT_EVENT_INFO) {
        s->info++;
        if (!strncmp(ev->text, "train: ", 7)) s->train_line++;
    } else if (ev->kind == MT_EVENT_STEP) {
        s->steps++;
        s->lines += ev->text != NULL;
        s->last_step = ev->step->step;
    }
}

Test(api, a_run_reports_through_its_callback, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[256];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_options *o = tiny_options(out, "8");
    seen s = {0};
    mt_run *r = mt_run_open(o, count_event, &s);
    cr_assert(r, "%s", mt_last_error());
    cr_assert_eq(mt_run_train(r), 0, "%s", mt_last_error());
    mt_run_close(r);
    mt_options_free(o);
    cr_assert_eq(s.steps, 8, "one event per step");
    cr_assert_eq(s.last_step, 8);
    cr_assert_eq(s.lines, 2, "a progress line every log_every = 4 steps");
    cr_assert_eq(s.train_line, 2, "the plan of the run and its summary");
    cr_assert_gt(s.info, 3, "model, device, train, model saved");
    mt_test_rmtree(dir);
    free(dir);
}

Test(api, options_set_get_and_their_errors) {
    mt_options *o = mt_options_new();
    char buf[64];
    cr_assert_eq(mt_options_set(o, "batch-size", "3"), 0, "%s", mt_last_error());
    cr_assert_eq(mt_options_get(o, "batch_size", buf, sizeof buf), 1);
    cr_assert_str_eq(buf, "3");
    cr_assert_eq(mt_options_set(o, "learning_rate", "1e-4"), -1);
    cr_assert(strstr(mt_last_error(), "'lr'"), "suggests lr: %s", mt_last_error());
    cr_assert_eq(mt_options_set(o, "lr", "fast"), -1);
    cr_assert(strstr(mt_last_error(), "lr"), "%s", mt_last_error());
    cr_assert_eq(mt_options_get(o, "nope", buf, sizeof buf), -1);
    /* JSON: all or nothing */
    cr_assert_eq(mt_options_set_json(o, "{\"lr\": 0.25, \"device\": \"cpu\", \"steps\": 7}"), 0,
                 "%s", mt_last_error());
    cr_assert_eq(mt_options_get(o, "lr", buf, sizeof buf), 4);
    cr_assert_str_eq(buf, "0.25");
    cr_assert_eq(mt_options_set_json(o, "{\"steps\": 9, \"seq_len\": -1}"), -1);
    cr_assert(strstr(mt_last_error(), "seq_len"), "%s", mt_last_error());
    mt_options_get(o, "steps", buf, sizeof buf);
    cr_assert_str_eq(buf, "7", "a refused object changes nothing");
    /* YAML written and read back */
    char *dir = mt_test_tmpdir(), path[256];
    snprintf(path, sizeof path, "%s/run.yaml", dir);
    char *yaml = mt_options_to_yaml(o);
    FILE *f = fopen(path, "w");
    fputs(yaml, f);
    fclose(f);
    mt_options *p = mt_options_new();
    cr_assert_eq(mt_options_load_yaml(p, path), 0, "%s", mt_last_error());
    char *ja = mt_options_to_json(o), *jb = mt_options_to_json(p);
    cr_assert_str_eq(ja, jb);
    mt_free(yaml);
    mt_free(ja);
    mt_free(jb);
    mt_options_free(p);
    mt_options_free(o);
    mt_test_rmtree(dir);
    free(dir);
}

Test(api, options_resolved_as_a_run_will_use_them) {
    char buf[256];
    mt_options *o = mt_options_new();
    cr_assert_eq(mt_options_set(o, "steps", "5"), 0);
    cr_assert_eq(mt_options_resolve(o), 0, "%s", mt_last_error());
    mt_options_get(o, "out", buf, sizeof buf);
    cr_assert_str_eq(buf, "runs/tiny", "no model: the tiny model's out");
    mt_options_get(o, "steps", buf, sizeof buf);
    cr_assert_str_eq(buf, "5", "what was set stays");
    mt_options_free(o);
    o = mt_options_new();
    cr_assert_eq(mt_options_set(o, "model", "models/m"), 0);
    cr_assert_eq(mt_options_resolve(o), 0, "%s", mt_last_error());
    mt_options_get(o, "out", buf, sizeof buf);
    cr_assert_str_eq(buf, "runs/megatrain");
    mt_options_get(o, "tokenizer", buf, sizeof buf);
    cr_assert_str_eq(buf, "models/m/tokenizer.json");
    mt_options_free(o);
}

Test(api, the_option_table_and_the_help_text) {
    char *usage = mt_options_usage();
    size_t n = mt_options_count();
    cr_assert_gt(n, 30);
    int enums = 0;
    for (size_t i = 0; i < n; i++) {
        mt_option_info info;
        cr_assert_eq(mt_options_describe(i, &info), 0);
        char flag[80];
        snprintf(flag, sizeof flag, "%s", info.name);
        for (char *c = flag; *c; c++)
            if (*c == '_') *c = '-';
        cr_assert(strstr(usage, flag), "--help lacks %s", flag);
        if (!strcmp(info.type, "enum")) {
            enums++;
            cr_assert(info.choices && strstr(info.choices, info.default_value), "%s", info.name);
        }
        if (!strcmp(info.name, "schedule")) cr_assert_str_eq(info.choices, "cosine|linear|constant");
    }
    cr_assert_gt(enums, 3);
    mt_option_info info;
    cr_assert_eq(mt_options_describe(n, &info), -1);
    mt_free(usage);
}

Test(api, a_run_that_cannot_start_says_why) {
    char *dir = mt_test_tmpdir(), out[256];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_options *o = tiny_options(out, "3");
    cr_assert_eq(mt_options_set(o, "data", "/nonexistent/train.jsonl"), 0);
    cr_assert_null(mt_run_open(o, NULL, NULL));
    cr_assert(strstr(mt_last_error(), "/nonexistent/train.jsonl"), "%s", mt_last_error());
    mt_options_free(o);
    mt_test_rmtree(dir);
    free(dir);
}

/* A new tiny model (megatrain init) with the byte-level fixture tokenizer,
 * and prompt/completion data for it. */
static void tiny_model(const char *dir, char *model, char *data, size_t n) {
    snprintf(model, n, "%s/model", dir);
    snprintf(data, n, "%s/sft.jsonl", dir);
    char tok[512];
    snprintf(tok, sizeof tok, "%s/tokenizer/tiny_bytelevel.json", mt_test_fixtures_dir());
    mt_model_shape s;
    mt_model_shape_defaults(&s);
    s.hidden = 64, s.layers = 2, s.heads = 4, s.kv_heads = 2, s.ffn = 128, s.max_positions = 64;
    mt_model_info info;
    cr_assert_eq(mt_model_init(model, tok, &s, &info), 0, "%s", mt_last_error());
    cr_assert_eq(info.layers, 2);
    cr_assert_eq(mt_model_init(model, tok, &s, NULL), -1, "an existing directory is kept");
    cr_assert(strstr(mt_last_error(), "already exists"), "%s", mt_last_error());
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"prompt\": \"What is %d plus %d? \", \"completion\": \"It is %d.\"}\n", i,
                i + 1, 2 * i + 1);
    fclose(f);
}

typedef struct text_sink {
    char buf[4096];
    size_t len;
} text_sink;

static void collect_text(const mt_event *ev, void *user) {
    text_sink *t = user;
    if (ev->kind != MT_EVENT_TEXT) return;
    size_t n = strlen(ev->text);
    cr_assert_lt(t->len + n, sizeof t->buf);
    memcpy(t->buf + t->len, ev->text, n + 1);
    t->len += n;
}

Test(api, a_model_is_evaluated_and_generates, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), model[512], data[512];
    tiny_model(dir, model, data, sizeof model);
    mt_model *m = mt_model_open(model, NULL);
    cr_assert(m, "%s", mt_last_error());
    mt_model_info info;
    mt_model_describe(m, &info);
    cr_assert_eq(info.vocab_size, (int64_t)mt_tokenizer_vocab_size(mt_model_tokenizer(m)));

    mt_eval_opts eo;
    mt_eval_opts_defaults(&eo);
    eo.data = data, eo.seq_len = 32, eo.batch_size = 2, eo.max_batches = 3, eo.device = "cpu";
    mt_eval_result res;
    cr_assert_eq(mt_model_eval(m, &eo, &res), 0, "%s", mt_last_error());
    cr_assert_eq(res.batches, 3);
    cr_assert_gt(res.tokens, 0);
    cr_assert_eq(res.perplexity, exp(res.loss));
    /* the same rows in batches of one: the same loss, summed in another
     * order (fp32 sums of at most 64 token losses: 64 * 6e-8 relative) */
    mt_eval_result one;
    eo.batch_size = 1, eo.max_batches = 6;
    cr_assert_eq(mt_model_eval(m, &eo, &one), 0, "%s", mt_last_error());
    cr_assert_eq(one.tokens, res.tokens);
    cr_assert_lt(fabs(one.loss - res.loss), 4e-6 * res.loss, "%.9g vs %.9g", one.loss, res.loss);
    eo.device = "tpu";
    cr_assert_eq(mt_model_eval(m, &eo, &res), -1);
    cr_assert(strstr(mt_last_error(), "tpu"), "%s", mt_last_error());

    mt_generate_opts go;
    mt_generate_opts_defaults(&go);
    go.prompt = "What is 2 plus 3? ", go.max_new_tokens = 8, go.temperature = 0,
    go.device = "cpu";
    text_sink t1 = {0}, t2 = {0};
    char *a = mt_model_generate(m, &go, collect_text, &t1);
    char *b = mt_model_generate(m, &go, collect_text, &t2);
    cr_assert(a && b, "%s", mt_last_error());
    cr_assert_str_eq(a, b, "greedy generation is deterministic");
    cr_assert(!strncmp(a, go.prompt, strlen(go.prompt)), "starts with the prompt: %s", a);
    cr_assert_eq(t1.len, strlen(a) + 1, "the stream is the text and a newline");
    cr_assert(!strncmp(t1.buf, a, strlen(a)) && t1.buf[t1.len - 1] == '\n');
    mt_free(a);
    mt_free(b);
    go.top_p = 0;
    cr_assert_null(mt_model_generate(m, &go, NULL, NULL));
    cr_assert(strstr(mt_last_error(), "top_p"), "%s", mt_last_error());
    mt_model_close(m);
    cr_assert_null(mt_model_open("/nonexistent/model", NULL));
    cr_assert(strstr(mt_last_error(), "/nonexistent/model"), "%s", mt_last_error());
    mt_test_rmtree(dir);
    free(dir);
}

/* eval without seq_len takes the model's length (at most 1024), and reads
 * the data to its last row, the last batch partial: the rows of batches of
 * one, with their tokens and loss. */
Test(api, eval_takes_the_model_length_and_a_partial_batch, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), model[512], data[512];
    tiny_model(dir, model, data, sizeof model);
    mt_model *m = mt_model_open(model, NULL);
    cr_assert(m, "%s", mt_last_error());
    mt_eval_opts eo;
    mt_eval_opts_defaults(&eo);
    eo.data = data, eo.device = "cpu";
    cr_assert_eq(eo.seq_len, 0);
    mt_eval_result dflt, full, one;
    cr_assert_eq(mt_model_eval(m, &eo, &dflt), 0, "%s", mt_last_error());
    eo.seq_len = 64;  // tiny_model's max_positions
    cr_assert_eq(mt_model_eval(m, &eo, &full), 0, "%s", mt_last_error());
    cr_assert_eq(dflt.tokens, full.tokens);
    cr_assert_eq(dflt.loss, full.loss);
    eo.batch_size = 1;
    cr_assert_eq(mt_model_eval(m, &eo, &one), 0, "%s", mt_last_error());
    cr_assert_neq(one.batches % 4, 0, "the data must end in a partial batch of 4 rows");
    cr_assert_eq(full.batches, (one.batches + 3) / 4);
    cr_assert_eq(full.tokens, one.tokens);
    /* fp32 sums of at most 4 x 64 token losses: 256 * 6e-8 relative */
    cr_assert_lt(fabs(one.loss - full.loss), 2e-5 * full.loss, "%.9g vs %.9g", one.loss, full.loss);
    /* data shorter than one row is an error naming the file and the fix */
    eo.seq_len = 64, eo.batch_size = 4;
    char small[600];
    snprintf(small, sizeof small, "%s/small.jsonl", dir);
    FILE *f = fopen(small, "w");
    fputs("{\"text\": \"too short\"}\n", f);
    fclose(f);
    eo.data = small;
    cr_assert_eq(mt_model_eval(m, &eo, &one), -1);
    cr_assert(strstr(mt_last_error(), "small.jsonl") && strstr(mt_last_error(), "lower --seq-len"),
              "%s", mt_last_error());
    /* the seq_len it names reads the data */
    const char *fit = strstr(mt_last_error(), "lower --seq-len to ");
    cr_assert(fit, "%s", mt_last_error());
    eo.seq_len = strtoll(fit + strlen("lower --seq-len to "), NULL, 10);
    cr_assert_eq(mt_model_eval(m, &eo, &one), 0, "seq_len %lld: %s", (long long)eo.seq_len,
                 mt_last_error());
    cr_assert_eq(one.batches, 1);
    mt_model_close(m);

    /* a model of 2048 positions: rows of 1024 */
    char long_model[600], tok[512], path[600];
    snprintf(long_model, sizeof long_model, "%s/long", dir);
    snprintf(tok, sizeof tok, "%s/tokenizer/tiny_bytelevel.json", mt_test_fixtures_dir());
    mt_model_shape s;
    mt_model_shape_defaults(&s);
    s.hidden = 32, s.layers = 1, s.heads = 2, s.kv_heads = 1, s.ffn = 64, s.max_positions = 2048;
    cr_assert_eq(mt_model_init(long_model, tok, &s, NULL), 0, "%s", mt_last_error());
    cr_assert(m = mt_model_open(long_model, NULL), "%s", mt_last_error());
    snprintf(path, sizeof path, "%s/long.jsonl", dir);  // about 3,700 tokens: 3 rows of 1025
    f = fopen(path, "w");
    for (int i = 0; i < 40; i++) fprintf(f, "{\"text\": \"%080d\"}\n", i);
    fclose(f);
    eo.data = path, eo.seq_len = 0, eo.batch_size = 1;
    cr_assert_eq(mt_model_eval(m, &eo, &dflt), 0, "%s", mt_last_error());
    eo.seq_len = 1024;
    cr_assert_eq(mt_model_eval(m, &eo, &full), 0, "%s", mt_last_error());
    cr_assert_eq(dflt.tokens, full.tokens);
    cr_assert_eq(dflt.loss, full.loss);
    mt_model_close(m);
    mt_test_rmtree(dir);
    free(dir);
}

/* A chat reply: the messages rendered with the model's template and
 * add_generation_prompt, then continued; only the reply is returned, and
 * it is the continuation of the rendered text given as a prompt. */
Test(api, generate_replies_through_the_chat_template, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), model[512], data[512], path[600];
    tiny_model(dir, model, data, sizeof model);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model);
    FILE *f = fopen(path, "w");
    fputs("{\"chat_template\": \"{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\\n"
          "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}\"}\n", f);
    fclose(f);
    mt_model *m = mt_model_open(model, NULL);
    cr_assert(m, "%s", mt_last_error());
    mt_generate_opts go;
    mt_generate_opts_defaults(&go);
    go.messages = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                  "{\"role\": \"user\", \"content\": \"What is 2 plus 3?\"}]";
    go.max_new_tokens = 12, go.temperature = 0, go.device = "cpu";
    text_sink t = {0};
    char *reply = mt_model_generate(m, &go, collect_text, &t);
    cr_assert(reply, "%s", mt_last_error());
    cr_assert_eq(t.len, strlen(reply) + 1, "the stream is the reply and a newline");
    go.messages = NULL, go.add_special = false;
    go.prompt = "<|system|>Be brief.\n<|user|>What is 2 plus 3?\n<|assistant|>";
    char *plain = mt_model_generate(m, &go, NULL, NULL);
    cr_assert(plain, "%s", mt_last_error());
    size_t np = strlen(go.prompt);
    cr_assert(!strncmp(plain, go.prompt, np) && !strncmp(plain + np, reply, strlen(reply)),
              "the reply '%s' continues the rendered prompt: '%s'", reply, plain);
    mt_free(plain);
    mt_free(reply);
    go.messages = "[{\"role\": \"user\", \"content\": \"Hi\"}]", go.max_new_tokens = 0;
    reply = mt_model_generate(m, &go, NULL, NULL);
    cr_assert(reply && !strcmp(reply, ""), "no new token, no reply: '%s'", reply);
    mt_free(reply);
    go.messages = "{\"role\": \"user\"";
    cr_assert_null(mt_model_generate(m, &go, NULL, NULL));
    cr_assert(strstr(mt_last_error(), "messages"), "%s", mt_last_error());
    mt_model_close(m);

    /* the command: --chat prints the reply only; --system needs --chat */
    char *argv[] = {"generate", "--model", model, "--chat", "--system", "Be brief.",
                    "--temperature", "0", "--max-new-tokens", "12", "--device", "cpu",
                    "What is 2 plus 3?", NULL}, *out, *err;
    cr_assert_eq(mt_test_cli_output(argv, &out, &err), 0, "%s", err);
    cr_assert(!strstr(out, "<|user|>") && !strstr(out, "What is 2 plus 3?"), "%s", out);
    free(out), free(err);
    char *bad[] = {"generate", "--model", model, "--system", "Be brief.", "Hi", NULL};
    cr_assert_eq(mt_test_cli_output(bad, &out, &err), 2);
    cr_assert(strstr(err, "--chat"), "%s", err);
    free(out), free(err);
    mt_test_rmtree(dir);
    free(dir);
}

Test(api, tokenizers_and_data_sets) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/tiny_bytelevel.json", mt_test_fixtures_dir());
    mt_tokenizer *tok = mt_tokenizer_open(path);
    cr_assert(tok, "%s", mt_last_error());
    int32_t *ids;
    size_t n;
    const char *text = "It is 7.";
    cr_assert_eq(mt_tokenizer_tokenize(tok, text, strlen(text), false, &ids, &n), 0);
    cr_assert_gt(n, 0);
    char *back = mt_tokenizer_decode(tok, ids, n, false);
    cr_assert_str_eq(back, text);
    mt_free(back);
    mt_free(ids);
    cr_assert_eq(mt_tokenizer_tokenize(tok, "\xff", 1, false, &ids, &n), -1);
    cr_assert(strstr(mt_last_error(), "UTF-8"), "%s", mt_last_error());
    mt_tokenizer *bytes = mt_tokenizer_open("bytes");
    cr_assert_eq(mt_tokenizer_vocab_size(bytes), 258);
    cr_assert_eq(mt_tokenizer_bos_id(bytes), 256);
    mt_tokenizer_free(bytes);
    cr_assert_null(mt_tokenizer_open("/nonexistent/tokenizer.json"));
    cr_assert(strstr(mt_last_error(), "/nonexistent/tokenizer.json"), "%s", mt_last_error());

    char *dir = mt_test_tmpdir(), data[512];
    snprintf(data, sizeof data, "%s/text.jsonl", dir);
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 20; i++) fprintf(f, "{\"text\": \"Document number %d.\"}\n", i);
    fclose(f);
    mt_dataset *d = mt_dataset_load(data, tok, NULL);
    cr_assert(d, "%s", mt_last_error());
    mt_dataset_info di;
    mt_dataset_describe(d, &di);
    cr_assert_eq(di.documents, 20);
    cr_assert_str_eq(di.format, "text");
    cr_assert_str_eq(di.packing, "rows");
    int32_t tokens[4 * 16], targets[4 * 16];
    int batches = 0;
    while (mt_dataset_next_batch(d, 4, 16, tokens, targets, NULL) == 0) batches++;
    /* one epoch of di.tokens tokens in rows of 17, 4 rows a batch */
    cr_assert_eq(batches, di.tokens / 17 / 4);
    /* saved as .mtok: the bytes `megatrain tokenize` writes */
    char mine[512], cli[512];
    snprintf(mine, sizeof mine, "%s/api.mtok", dir);
    snprintf(cli, sizeof cli, "%s/cli.mtok", dir);
    cr_assert_eq(mt_dataset_save(d, mine), 0, "%s", mt_last_error());
    cr_assert_eq(mt_test_cli((char *[]){"tokenize", "--tokenizer", path, "--data", data, "--out",
                                        cli, NULL}), 0);
    size_t na, nb;
    char *a = slurp(mine, &na), *b = slurp(cli, &nb);
    cr_assert(na == nb && !memcmp(a, b, na), "mt_dataset_save and megatrain tokenize differ");
    free(a);
    free(b);
    cr_assert_eq(mt_dataset_save(d, "/nonexistent/dir/x.mtok"), -1);
    cr_assert(strstr(mt_last_error(), "/nonexistent/dir/x.mtok"), "%s", mt_last_error());
    mt_dataset_free(d);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

Test(api, version_and_build) {
    cr_assert_str_eq(mt_version(), MT_VERSION);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", MT_VERSION_MAJOR, MT_VERSION_MINOR, MT_VERSION_PATCH);
    cr_assert_str_eq(v, MT_VERSION);
#ifdef MT_HAVE_CUDA
    cr_assert(!strncmp(mt_cuda_archs(), "sm_", 3) || !strncmp(mt_cuda_archs(), "compute_", 8),
              "%s", mt_cuda_archs());
#else
    cr_assert_str_eq(mt_cuda_archs(), "none (CPU only)");
#endif
    cr_assert_str_eq(mt_last_error(), "", "a fresh thread has no error");
}
