/* The JSONL formats against TRL (tests/fixtures/data/formats.json, made by
 * scripts/make_data_format_fixtures.py with TRL's SFT data preparation and
 * the real tokenizers): text (also under --text-field), prompt/completion
 * as texts and as lists of messages, chat, sharegpt and alpaca lines give
 * the token ids TRL trains on and the same loss flag on every token. Also:
 * which format a first line is taken for, and the errors that name the
 * field and the fix. Every comparison is exact. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "io/file.h"
#include "testlib.h"

static cJSON *read_json(const char *path) {
    char *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(path, &buf, &len, &err), 0, "%s", err.msg);
    cJSON *j = cJSON_ParseWithLength(buf, len);
    cr_assert(j, "%s is not JSON", path);
    free(buf);
    return j;
}

static void write_bytes(const char *path, const char *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(buf, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* A tokenizer folder in dir: the shared tokenizer `name`, its
 * tokenizer_config.json with the fixture template `tpl` as its
 * chat_template (when not NULL). */
static mt_tokenizer *tokenizer_in(const char *dir, const char *shared, const char *name,
                                  const char *tpl) {
    char rel[256], *buf;
    size_t len;
    mt_error err = {{0}};
    snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", name);
    char *src = mt_path_join(shared, rel), *dst = mt_path_join(dir, "tokenizer.json");
    cr_assert_eq(mt_read_file(src, &buf, &len, &err), 0, "%s", err.msg);
    write_bytes(dst, buf, len);
    free(buf), free(src);
    snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer_config.json", name);
    src = mt_path_join(shared, rel);
    cJSON *cfg = read_json(src);
    if (tpl) {
        snprintf(rel, sizeof rel, "chat/templates/%s.jinja", tpl);
        char *tp = mt_path_join(mt_test_fixtures_dir(), rel);
        cr_assert_eq(mt_read_file(tp, &buf, &len, &err), 0, "%s", err.msg);
        cJSON_ReplaceItemInObject(cfg, "chat_template", cJSON_CreateString(buf));
        free(buf), free(tp);
    }
    char *text = cJSON_Print(cfg), *cp = mt_path_join(dir, "tokenizer_config.json");
    write_text(cp, text);
    mt_tokenizer *tok = mt_tokenizer_load(dst, &err);
    cr_assert(tok, "%s", err.msg);
    free(text), free(cp), free(src), free(dst);
    cJSON_Delete(cfg);
    return tok;
}

/* One line of data in format fmt (text under field) read as a corpus. */
static mt_dataset *load_line(const char *dir, const char *line, const char *fmt,
                             const char *field, const mt_tokenizer *tok, mt_error *err) {
    char *path = mt_path_join(dir, "data.jsonl"), *text = malloc(strlen(line) + 2);
    sprintf(text, "%s\n", line);
    write_text(path, text);
    mt_data_opts o = {.path = path, .format = fmt, .text_field = field, .epochs = 1};
    mt_dataset *d = mt_dataset_open(&o, tok, (int64_t)mt_tokenizer_vocab_size(tok), err);
    free(path), free(text);
    return d;
}

/* Whether the case's line is rendered with a chat template (no BOS of
 * megatrain's own then). */
static bool tpl_used(const cJSON *c) {
    const char *f = cJSON_GetObjectItem(c, "format")->valuestring;
    const cJSON *line = cJSON_GetObjectItem(c, "line");
    return strcmp(f, "text") && (strcmp(f, "completion") || cJSON_IsArray(cJSON_GetObjectItem(line, "prompt")));
}

static void check_case(const cJSON *c, const char *shared, int *checked) {
    const char *name = cJSON_GetObjectItem(c, "tokenizer")->valuestring;
    const cJSON *tpl = cJSON_GetObjectItem(c, "template");
    const char *fmt = cJSON_GetObjectItem(c, "format")->valuestring;
    const char *field = cJSON_GetObjectItem(c, "text_field")->valuestring;
    const cJSON *ids = cJSON_GetObjectItem(c, "input_ids"), *loss = cJSON_GetObjectItem(c, "loss");
    char *line = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "line")), *dir = mt_test_tmpdir();
    mt_tokenizer *tok = tokenizer_in(dir, shared, name, cJSON_IsString(tpl) ? tpl->valuestring : NULL);
    char what[160];
    snprintf(what, sizeof what, "%s/%s/%s: %.60s", name, cJSON_IsString(tpl) ? tpl->valuestring : "own",
             fmt, line);
    for (int pass = 0; pass < 2; pass++) {  // the format given, then detected
        mt_error err = {{0}};
        mt_dataset *d = load_line(dir, line, pass ? "auto" : fmt, field, tok, &err);
        cr_assert(d, "%s: %s", what, err.msg);
        cr_expect_str_eq(mt_dataset_stats(d).format, fmt, "%s", what);
        const mt_mtok *m = mt_dataset_corpus(d);
        size_t n = (size_t)cJSON_GetArraySize(ids);
        /* megatrain starts a text or completion document with the BOS of
         * tokenizer_config.json; TRL with what the tokenizer's encoding
         * adds, which for the shared Llama-3 tokenizer.json is nothing
         * (docs/data.md says so). */
        uint64_t skip = !tpl_used(c) && m->n_tokens == n + 1 && mt_tokenizer_bos_id(tok) >= 0 &&
                        mt_mtok_token(m, 0) == (uint32_t)mt_tokenizer_bos_id(tok);
        cr_expect_eq(m->n_tokens - skip, n, "%s: %llu tokens, TRL %zu", what,
                     (unsigned long long)m->n_tokens, n);
        for (size_t i = 0; i < n && i + skip < m->n_tokens; i++) {
            cr_expect_eq(mt_mtok_token(m, i + skip), (uint32_t)cJSON_GetArrayItem(ids, (int)i)->valueint,
                         "%s: id %zu", what, i);
            cr_expect_eq(mt_mtok_trainable(m, i + skip), cJSON_GetArrayItem(loss, (int)i)->valueint,
                         "%s: loss flag of token %zu (id %u)", what, i, mt_mtok_token(m, i + skip));
        }
        mt_dataset_free(d);
    }
    ++*checked;
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir), free(line);
}

Test(data_formats, ids_and_loss_flags_match_trl) {
    const char *shared = mt_test_shared_dir();
    if (!shared) cr_skip_test("MEGATRAIN_SHARED not set: real tokenizers absent");
    char *p = mt_path_join(mt_test_fixtures_dir(), "data/formats.json");
    cJSON *fx = read_json(p), *c;
    int checked = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "cases")) check_case(c, shared, &checked);
    cr_expect_geq(checked, 30, "the fixture's cases were all read");
    cJSON_Delete(fx);
    free(p);
}

/* A byte-level tokenizer in dir whose chat template prints each turn as
 * "role: content". */
static mt_tokenizer *tiny_tokenizer(const char *dir) {
    char *src = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_bytelevel.json"), *buf;
    char *dst = mt_path_join(dir, "tokenizer.json"), *cfg = mt_path_join(dir, "tokenizer_config.json");
    size_t len;
    mt_error err = {{0}};
    cr_assert_eq(mt_read_file(src, &buf, &len, &err), 0, "%s", err.msg);
    write_bytes(dst, buf, len);
    write_text(cfg, "{\"chat_template\": \"{% for m in messages %}{{ m.role }}: {{ m.content }}\\n"
                    "{% endfor %}\"}");
    mt_tokenizer *tok = mt_tokenizer_load(dst, &err);
    cr_assert(tok, "%s", err.msg);
    free(buf), free(src), free(dst), free(cfg);
    return tok;
}

/* The error a one-line file in format fmt gives. */
static void expect_error(const char *line, const char *fmt, const char *want) {
    char *dir = mt_test_tmpdir();
    mt_tokenizer *tok = tiny_tokenizer(dir);
    char *path = mt_path_join(dir, "data.jsonl"), text[1024];
    snprintf(text, sizeof text, "%s\n", line);
    write_text(path, text);
    mt_data_opts o = {.path = path, .format = fmt, .epochs = 1};
    mt_error err = {{0}};
    mt_dataset *d = mt_dataset_open(&o, tok, (int64_t)mt_tokenizer_vocab_size(tok), &err);
    cr_expect_null(d, "%s: accepted", line);
    cr_expect(strstr(err.msg, want), "%s: got '%s', want '%s'", line, err.msg, want);
    mt_dataset_free(d);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir), free(path);
}

Test(data_formats, errors_name_the_field_and_the_fix) {
    expect_error("{\"body\": \"x\"}", "auto",
                 "cannot tell the format from the first line (expected a JSON object with \"text\"");
    expect_error("{\"body\": \"x\"}", "auto", "--data-format, or --text-field FIELD");
    expect_error("{\"conversations\": [{\"from\": \"robot\", \"value\": \"x\"}]}", "auto",
                 "conversations[0].from is 'robot': use human, gpt, system, tool");
    expect_error("{\"conversations\": [{\"from\": \"human\"}]}", "sharegpt",
                 "field \"value\" of conversations[0] is missing");
    expect_error("{\"conversations\": [{\"from\": \"function_call\", \"value\": \"f(x)\"}]}", "sharegpt",
                 "conversations[0] is a function_call whose value is not a JSON object");
    expect_error("{\"instruction\": \"x\", \"input\": 3, \"output\": \"y\"}", "auto",
                 "field \"input\" is not a string");
    expect_error("{\"instruction\": \"x\"}", "alpaca", "field \"output\" is missing");
    expect_error("{\"instruction\": \"x\", \"output\": \"y\", \"history\": [[\"a\"]]}", "alpaca",
                 "history[0] is not a pair [\"question\", \"answer\"] of strings");
    expect_error("{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}], \"completion\": \"y\"}", "auto",
                 "field \"completion\" is not an array");
    expect_error("{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}], \"completion\": []}", "auto",
                 "\"completion\" is empty");
    expect_error("{\"prompt\": [{\"role\": \"bot\", \"content\": \"x\"}], \"completion\": [{\"role\": "
                 "\"assistant\", \"content\": \"y\"}]}", "auto", "prompt[0].role is 'bot'");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": \"[oops\"}", "auto",
                 "field \"tools\" is a string but not JSON");
    expect_error("{\"text\": \"x\"}", "csv", "unknown data format 'csv': use auto, text, completion, "
                 "chat, alpaca, sharegpt or tokens");
}

/* A file of plain prompts whose later line is conversational is refused at
 * that line, and the other way round. */
Test(data_formats, one_kind_of_prompt_per_file) {
    char *dir = mt_test_tmpdir(), *path = mt_path_join(dir, "data.jsonl");
    mt_tokenizer *tok = tiny_tokenizer(dir);
    write_text(path, "{\"prompt\": \"a\", \"completion\": \"b\"}\n"
                     "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"completion\": "
                     "[{\"role\": \"assistant\", \"content\": \"b\"}]}\n");
    mt_data_opts o = {.path = path, .epochs = 1};
    mt_error err = {{0}};
    cr_expect_null(mt_dataset_open(&o, tok, (int64_t)mt_tokenizer_vocab_size(tok), &err));
    cr_expect(strstr(err.msg, "data.jsonl:2: \"prompt\" is a list of messages, unlike the first "
                     "line's: keep one kind of prompt/completion per file"), "%s", err.msg);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir), free(path);
}
