/* Tests of SentencePiece chunking (tokenizer.c bpe_chunks): a word is cut
 * before each "▁" that follows another char only when the load-time check
 * (mt_tok_sp_chunks_exact) proves that gives the same ids.
 *
 * Two tiny SentencePiece-style tokenizers: one with the token "a▁b", which
 * must turn chunking off, and one without. Their expected ids are what HF
 * `tokenizers` Tokenizer.encode gives for the same tokenizer.json (checked
 * by hand when writing this test). Ids must match exactly. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"
#include "testlib.h"

#define SP_HEAD                                                                                          \
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"normalized\":false,\"special\":true}],"       \
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"}," \
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"                   \
    "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"

// "a▁" merges first (rank 0), then "a▁" + "b": "▁a▁b" becomes ▁ a▁b, which
// no cut before the second "▁" could give.
static const char *JSON_CROSSING = SP_HEAD
    "\"vocab\":{\"<unk>\":0,\"\\u2581\":1,\"a\":2,\"b\":3,\"\\u2581a\":4,\"\\u2581b\":5,"
    "\"a\\u2581\":6,\"a\\u2581b\":7},"
    "\"merges\":[\"a \\u2581\",\"a\\u2581 b\",\"\\u2581 a\",\"\\u2581 b\"]}}";

// Only "▁" after "▁" ("▁▁", "▁▁a"): chunking is exact.
static const char *JSON_CLEAN = SP_HEAD
    "\"vocab\":{\"<unk>\":0,\"\\u2581\":1,\"a\":2,\"b\":3,\"\\u2581a\":4,\"\\u2581b\":5,"
    "\"\\u2581\\u2581\":6,\"\\u2581\\u2581a\":7},"
    "\"merges\":[\"\\u2581 a\",\"\\u2581 b\",\"\\u2581 \\u2581\",\"\\u2581\\u2581 a\"]}}";

// No "▁" token: "▁" itself would be <unk> and fuse with the char before.
static const char *JSON_NO_MARK = SP_HEAD "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"ab\":3},\"merges\":[\"a b\"]}}";

typedef struct sp_case {
    const char *text;
    int32_t ids[8];
    size_t n;
} sp_case;

static mt_tokenizer *load_json(const char *json) {
    char *dir = mt_test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(json, f);
    fclose(f);
    mt_error err;
    mt_tokenizer *tok = mt_tokenizer_load(path, &err);
    cr_assert(tok, "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
    return tok;
}

static void expect_cases(mt_tokenizer *tok, const sp_case *cases, size_t n_cases) {
    mt_tok_encoder *e = mt_tok_encoder_new(tok);
    mt_tok_ids ids = {0};
    mt_error err;
    for (size_t c = 0; c < n_cases; c++) {
        ids.n = 0;
        cr_assert_eq(mt_tok_encode(e, cases[c].text, strlen(cases[c].text), false, &ids, &err), 0, "%s",
                     err.msg);
        bool same = ids.n == cases[c].n && memcmp(ids.ids, cases[c].ids, ids.n * sizeof *ids.ids) == 0;
        cr_expect(same, "\"%s\": got %zu ids (first %d), want %zu (first %d)", cases[c].text, ids.n,
                  ids.n ? ids.ids[0] : -1, cases[c].n, cases[c].ids[0]);
    }
    mt_tok_ids_free(&ids);
    mt_tok_encoder_free(e);
}

Test(tokenizer_chunks, token_with_mark_after_other_char_disables_chunking) {
    mt_tokenizer *tok = load_json(JSON_CROSSING);
    cr_expect(!tok->sp_chunks, "the vocab has \"a\\u2581b\": chunking must be off");
    const sp_case cases[] = {
        {"a b", {1, 7}, 2},  // chunked would give ▁a ▁b = 4 5
        {"a  b", {1, 6, 5}, 3},
        {"xa b", {1, 0, 7}, 3},
        {"a b a", {1, 7, 4}, 3},
        {"ab a", {4, 3, 4}, 3},
        {"xx  yy", {1, 0, 1, 1, 0}, 5},
    };
    expect_cases(tok, cases, sizeof cases / sizeof cases[0]);
    mt_tokenizer_free(tok);
}

Test(tokenizer_chunks, clean_vocab_chunks_with_the_same_ids) {
    mt_tokenizer *tok = load_json(JSON_CLEAN);
    cr_expect(tok->sp_chunks, "no token has \"\\u2581\" after another char: chunking must be on");
    const sp_case cases[] = {
        {"a b", {4, 5}, 2},
        {"a  b", {4, 1, 5}, 3},
        {"xa b", {1, 0, 2, 5}, 4},  // x is unknown; "a" has no merge with "x"
        {"a   a", {4, 6, 4}, 3},    // "▁▁▁a" is one chunk
        {"x y", {1, 0, 1, 0}, 4},   // fuse_unk does not join across "▁"
        {"xx  yy", {1, 0, 6, 0}, 4},
    };
    expect_cases(tok, cases, sizeof cases / sizeof cases[0]);
    mt_tokenizer_free(tok);
}

Test(tokenizer_chunks, no_mark_token_disables_chunking) {
    mt_tokenizer *tok = load_json(JSON_NO_MARK);
    cr_expect(!tok->sp_chunks);
    mt_tokenizer_free(tok);
}

/* The committed tiny SentencePiece tokenizer chunks; its ids on the sample
 * must be those of the unchunked path (flag cleared by hand). */
Test(tokenizer_chunks, tiny_sp_chunked_equals_unchunked) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/tiny_sp.json", mt_test_fixtures_dir());
    mt_error err;
    mt_tokenizer *tok = mt_tokenizer_load(path, &err);
    cr_assert(tok, "%s", err.msg);
    cr_assert(tok->sp_chunks);
    snprintf(path, sizeof path, "%s/tokenizer/sample.jsonl", mt_test_fixtures_dir());
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    char *line = NULL;
    size_t cap = 0, lines = 0;
    mt_tok_ids a = {0}, b = {0};
    while (getline(&line, &cap, f) > 0) {  // the raw JSON line is text enough for this
        size_t len = strlen(line);
        a.n = b.n = 0;
        tok->sp_chunks = true;
        mt_tok_encoder *e = mt_tok_encoder_new(tok);
        cr_assert_eq(mt_tok_encode(e, line, len, true, &a, &err), 0, "%s", err.msg);
        mt_tok_encoder_free(e);
        tok->sp_chunks = false;
        e = mt_tok_encoder_new(tok);
        cr_assert_eq(mt_tok_encode(e, line, len, true, &b, &err), 0, "%s", err.msg);
        mt_tok_encoder_free(e);
        cr_expect(a.n == b.n && memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0, "line %zu differs", lines + 1);
        lines++;
    }
    cr_expect_gt(lines, 0);
    free(line);
    fclose(f);
    mt_tok_ids_free(&a);
    mt_tok_ids_free(&b);
    mt_tokenizer_free(tok);
}
