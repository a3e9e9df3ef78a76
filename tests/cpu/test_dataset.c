/* Data pipeline tests: formats, loss masks, packing, shuffling, resume,
 * malformed lines, .mtok round trip and corruption (chat templates:
 * test_chat.c).
 * Every comparison is exact: tokens and bytes have no tolerance. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "io/file.h"
#include "testlib.h"

static char *write_tmp(const char *dir, const char *name, const char *text) {
    char *p = mt_path_join(dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return p;
}

static mt_dataset *open_data(const char *path, const char *format, const mt_tokenizer *tok,
                             int64_t vocab, int skip, mt_error *err) {
    mt_data_opts o = {.path = path, .format = format, .skip_bad_lines = skip, .seed = 7, .epochs = 2};
    return mt_dataset_open(&o, tok, vocab, err);
}

static cJSON *load_json(const char *rel) {
    char *p = mt_path_join(mt_test_fixtures_dir(), rel), *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(p, &buf, &len, &err), 0, "%s", err.msg);
    cJSON *j = cJSON_Parse(buf);
    cr_assert(j);
    free(buf), free(p);
    return j;
}

/* Corpus tokens and loss flags of a dataset, in file order. */
static void corpus_of(mt_dataset *d, int32_t *ids, int *keep, size_t n) {
    const mt_mtok *m = mt_dataset_corpus(d);
    cr_assert_eq(m->n_tokens, n);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)mt_mtok_token(m, i), keep[i] = mt_mtok_trainable(m, i);
}

Test(dataset, text_and_completion_with_byte_tokenizer) {
    char *dir = mt_test_tmpdir();
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_error err = {{0}};
    char *p = write_tmp(dir, "t.jsonl", "{\"text\": \"ab\"}\n{\"text\": \"c\"}\n");
    mt_dataset *d = open_data(p, "auto", tok, 258, 0, &err);
    cr_assert(d, "%s", err.msg);
    int32_t ids[7], want[7] = {256, 'a', 'b', 257, 256, 'c', 257};
    int keep[7];
    corpus_of(d, ids, keep, 7);
    for (int i = 0; i < 7; i++) cr_expect(ids[i] == want[i] && keep[i], "token %d", i);
    mt_data_stats s = mt_dataset_stats(d);
    cr_expect(s.documents == 2 && s.tokens == 7 && s.trainable == 7 && !strcmp(s.format, "text"));
    mt_dataset_free(d);
    free(p);

    p = write_tmp(dir, "c.jsonl", "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n");
    d = open_data(p, "auto", tok, 258, 0, &err);
    cr_assert(d, "%s", err.msg);
    int32_t want2[6] = {256, 'a', 'b', 'c', 'd', 257};
    int keep2[6] = {0, 0, 0, 1, 1, 1};  // loss on the completion and its EOS only
    corpus_of(d, ids, keep, 6);
    for (int i = 0; i < 6; i++) cr_expect(ids[i] == want2[i] && keep[i] == keep2[i], "token %d", i);
    cr_expect_eq(mt_dataset_stats(d).trainable, 3);
    int32_t x[5], y[5], pos[5];
    cr_expect(!strcmp(mt_dataset_stats(d).packing, "documents"), "completions pack documents");
    cr_assert_eq(mt_dataset_next_batch(d, 1, 5, x, y, pos), 0);
    int32_t wy[5] = {-100, -100, 'c', 'd', 257};  // targets of inputs BOS a b c d
    for (int i = 0; i < 5; i++)
        cr_expect(x[i] == want2[i] && y[i] == wy[i] && pos[i] == i, "position %d", i);
    mt_dataset_free(d);
    free(p);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* tiny_sp (SentencePiece-style): the completion split must not change ids. */
Test(dataset, completion_ids_equal_whole_text_encoding) {
    char *dir = mt_test_tmpdir();
    char *tp = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_sp.json");
    mt_error err = {{0}};
    mt_tokenizer *tok = mt_tokenizer_load(tp, &err);
    cr_assert(tok, "%s", err.msg);
    char *p = write_tmp(dir, "c.jsonl", "{\"prompt\": \"The jury said\", \"completion\": \" the city was fine.\"}\n");
    mt_dataset *d = open_data(p, "completion", tok, (int64_t)mt_tokenizer_vocab_size(tok), 0, &err);
    cr_assert(d, "%s", err.msg);
    int32_t *whole;
    size_t n;
    const char *all = "The jury said the city was fine.";
    cr_assert_eq(mt_tokenizer_encode(tok, all, strlen(all), false, &whole, &n, &err), 0);
    const mt_mtok *m = mt_dataset_corpus(d);
    size_t has_bos = mt_tokenizer_bos_id(tok) >= 0, has_eos = mt_tokenizer_eos_id(tok) >= 0;
    cr_assert(has_bos, "tiny_sp has <s> as BOS");
    cr_assert_eq(m->n_tokens, n + has_bos + has_eos, "BOS + text (+ EOS)");
    for (size_t i = 0; i < n; i++) cr_expect_eq((int32_t)mt_mtok_token(m, i + 1), whole[i]);
    // The trainable tokens decode to the completion.
    int32_t tr[64];
    size_t k = 0;
    for (size_t i = 0; i + has_eos < m->n_tokens; i++)
        if (mt_mtok_trainable(m, i)) tr[k++] = (int32_t)mt_mtok_token(m, i);
    char *s = mt_tokenizer_decode(tok, tr, k, false);
    cr_expect(strstr(s, "city was fine.") && !strstr(s, "jury"), "trainable text: '%s'", s);
    free(s);
    free(whole);
    mt_dataset_free(d);
    mt_tokenizer_free(tok);
    free(p), free(tp);
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- packing, shuffle, epochs, resume ---- */

static char *many_docs(const char *dir, int n) {
    size_t cap = (size_t)n * 64;
    char *s = malloc(cap), *q = s;
    for (int i = 0; i < n; i++) q += sprintf(q, "{\"text\": \"doc %d %.*s\"}\n", i, i % 17, "abcdefghijklmnopq");
    char *p = write_tmp(dir, "many.jsonl", s);
    free(s);
    return p;
}

Test(dataset, packing_keeps_every_token_once_per_epoch) {
    char *dir = mt_test_tmpdir(), *p = many_docs(dir, 50);
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_error err = {{0}};
    mt_dataset *d = open_data(p, "text", tok, 258, 0, &err);
    cr_assert(d, "%s", err.msg);
    const mt_mtok *m = mt_dataset_corpus(d);
    const int64_t T = 7, R = mt_dataset_rows_per_epoch(d, T);
    cr_assert_eq(R, (int64_t)m->n_tokens / (T + 1));
    int64_t corpus_count[258] = {0};
    for (uint64_t i = 0; i < m->n_tokens; i++) corpus_count[mt_mtok_token(m, i)]++;
    int32_t x[7], y[7], first[2][7];
    for (int e = 0; e < 2; e++) {
        int64_t seen[258] = {0};
        for (int64_t r = 0; r < R; r++) {
            cr_assert_eq(mt_dataset_next_batch(d, 1, T, x, y, NULL), 0);
            if (r == 0) memcpy(first[e], x, sizeof x);
            for (int t = 0; t < T; t++) seen[x[t]]++;
            seen[y[T - 1]]++;  // the row's last token (every target has loss in "text")
            for (int t = 0; t + 1 < T; t++) cr_assert_eq(y[t], x[t + 1]);
        }
        // Only the final partial row (< T+1 tokens) is dropped.
        int64_t missing = 0;
        for (int v = 0; v < 258; v++) {
            cr_assert_leq(seen[v], corpus_count[v], "token %d repeated in epoch %d", v, e);
            missing += corpus_count[v] - seen[v];
        }
        cr_expect_eq(missing, (int64_t)m->n_tokens - R * (T + 1));
    }
    cr_expect(memcmp(first[0], first[1], sizeof x), "epochs are shuffled differently");
    cr_expect_eq(mt_dataset_next_batch(d, 1, T, x, y, NULL), 1, "two epochs, then end of data");
    mt_dataset_free(d);
    // Same seed: same order.
    mt_dataset *d2 = open_data(p, "text", tok, 258, 0, &err);
    cr_assert_eq(mt_dataset_next_batch(d2, 1, T, x, y, NULL), 0);
    cr_expect(!memcmp(x, first[0], sizeof x));
    mt_dataset_free(d2);
    mt_tokenizer_free(tok);
    free(p);
    mt_test_rmtree(dir);
    free(dir);
}

Test(dataset, resume_position_reproduces_batches) {
    char *dir = mt_test_tmpdir(), *p = many_docs(dir, 40);
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_error err = {{0}};
    mt_dataset *a = open_data(p, "text", tok, 258, 0, &err);
    cr_assert(a, "%s", err.msg);
    enum { B = 3, T = 16, N = 20 };  // 20 batches cross the epoch boundary (R = 40 rows)
    int32_t xa[N][B * T], ya[N][B * T], x[B * T], y[B * T];
    mt_data_pos saved = {0};
    int n = 0;
    for (; n < N && mt_dataset_next_batch(a, B, T, xa[n], ya[n], NULL) == 0; n++)
        if (n == 9) saved = mt_dataset_get_pos(a);
    cr_assert_gt(n, 14);
    mt_dataset *b = open_data(p, "text", tok, 258, 0, &err);
    mt_dataset_set_pos(b, saved);
    for (int i = 10; i < n; i++) {
        cr_assert_eq(mt_dataset_next_batch(b, B, T, x, y, NULL), 0);
        cr_expect(!memcmp(x, xa[i], sizeof x) && !memcmp(y, ya[i], sizeof y), "batch %d", i);
    }
    cr_expect_eq(mt_dataset_next_batch(b, B, T, x, y, NULL),
                 mt_dataset_next_batch(a, B, T, x, y, NULL));
    mt_dataset_free(a), mt_dataset_free(b);
    mt_tokenizer_free(tok);
    free(p);
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- errors ---- */

Test(dataset, malformed_lines_name_file_line_field) {
    char *dir = mt_test_tmpdir();
    mt_tokenizer *tok = mt_tokenizer_bytes();
    struct { const char *fmt, *line2, *expect; } cases[] = {
        {"text", "{\"text\": ", "not valid JSON"},
        {"text", "{\"txt\": \"x\"}", "\"text\" is missing"},
        {"text", "{\"text\": 3}", "\"text\" is not a string"},
        {"completion", "{\"prompt\": \"x\"}", "\"completion\" is missing"},
        {"chat", "{\"messages\": []}", "\"messages\" is empty"},
        {"chat", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "'robot'"},
        {"chat", "{\"messages\": [{\"role\": \"user\"}]}", "\"content\" of messages[0] is missing"},
    };
    const char *good[] = {"{\"text\": \"ok\"}", "{\"prompt\": \"a\", \"completion\": \"b\"}",
                          "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}"};
    mt_tokenizer *sp = NULL;
    char *tp = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_sp.json");
    mt_error err = {{0}};
    sp = mt_tokenizer_load(tp, &err);
    cr_assert(sp);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *g = !strcmp(cases[i].fmt, "text") ? good[0] : !strcmp(cases[i].fmt, "completion") ? good[1] : good[2];
        const mt_tokenizer *t = !strcmp(cases[i].fmt, "chat") ? sp : tok;
        char text[512];
        snprintf(text, sizeof text, "%s\n%s\n%s\n", g, cases[i].line2, g);
        char *p = write_tmp(dir, "bad.jsonl", text), want[600];
        snprintf(want, sizeof want, "%s:2: ", p);
        mt_dataset *d = open_data(p, "auto", t, (int64_t)mt_tokenizer_vocab_size(t), 0, &err);
        cr_expect(!d, "case %zu accepted", i);
        cr_expect(strstr(err.msg, want) && strstr(err.msg, cases[i].expect), "case %zu: %s", i, err.msg);
        mt_dataset_free(d);
        d = open_data(p, "auto", t, (int64_t)mt_tokenizer_vocab_size(t), 1, &err);
        cr_assert(d, "case %zu: %s", i, err.msg);
        cr_expect(mt_dataset_stats(d).skipped_lines == 1 && mt_dataset_stats(d).documents == 2);
        cr_expect(strstr(mt_dataset_first_skipped(d), want), "case %zu", i);
        mt_dataset_free(d);
        free(p);
    }
    char *p = write_tmp(dir, "empty.jsonl", "");
    cr_expect(!open_data(p, "auto", tok, 258, 1, &err) && strstr(err.msg, "empty"), "%s", err.msg);
    free(p);
    p = write_tmp(dir, "allbad.jsonl", "{\"text\": 1}\n");
    cr_expect(!open_data(p, "text", tok, 258, 1, &err) && strstr(err.msg, "no usable documents"), "%s", err.msg);
    free(p);
    p = write_tmp(dir, "v.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"aZ\"}\n");
    // A model of 256 ids lacks the byte tokenizer's BOS (256): the first bad token.
    cr_expect(!open_data(p, "text", tok, 256, 0, &err) && strstr(err.msg, "token id 256 (\"<s>\")") &&
              strstr(err.msg, ".jsonl:1:"), "%s", err.msg);
    free(p), free(tp);
    mt_tokenizer_free(sp);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* Issue 29: cJSON ends a string at a NUL, so "\u0000" in a text silently
 * cut the document there, and a raw NUL byte (not JSON) cut the line. Both
 * are refused naming the line (and skipped with skip_bad_lines); an escaped
 * backslash before "u0000" is text like any other. */
Test(dataset, a_nul_in_a_line_is_refused_not_cut) {
    char *dir = mt_test_tmpdir();
    mt_tokenizer *tok = mt_tokenizer_bytes();
    mt_error err = {{0}};
    static const struct { const char *line; size_t len; const char *expect; } cases[] = {
        {"{\"text\": \"ab\\u0000cd\"}", 22, "NUL character (\\u0000)"},
        {"{\"prompt\": \"a\", \"completion\": \"b\\u0000\"}", 40, "NUL character (\\u0000)"},
        {"{\"text\": \"ab\0cd\"}", 17, "a NUL byte"},
        {"{\"text\": \"ab\"}\0{\"text\": \"cd\"}", 29, "a NUL byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *p = mt_path_join(dir, "nul.jsonl"), want[600];
        FILE *f = fopen(p, "wb");
        const char *good = strstr(cases[i].line, "prompt") ? "{\"prompt\": \"a\", \"completion\": \"b\"}\n"
                                                          : "{\"text\": \"ok\"}\n";
        fputs(good, f);
        fwrite(cases[i].line, 1, cases[i].len, f);
        fputs("\n", f);
        fputs(good, f);
        fclose(f);
        snprintf(want, sizeof want, "%s:2: ", p);
        mt_dataset *d = open_data(p, "auto", tok, 258, 0, &err);
        cr_expect(!d, "case %zu was accepted (cut at its NUL)", i);
        cr_expect(strstr(err.msg, want) && strstr(err.msg, cases[i].expect), "case %zu: %s", i,
                  err.msg);
        mt_dataset_free(d);
        d = open_data(p, "auto", tok, 258, 1, &err);
        cr_assert(d, "case %zu: %s", i, err.msg);
        cr_expect(mt_dataset_stats(d).skipped_lines == 1 && mt_dataset_stats(d).documents == 2);
        mt_dataset_free(d);
        free(p);
    }
    /* "a\\u0000b" is a, a backslash, u0000, b: 8 bytes between BOS and EOS */
    char *p = write_tmp(dir, "esc.jsonl", "{\"text\": \"a\\\\u0000b\"}\n");
    mt_dataset *d = open_data(p, "text", tok, 258, 0, &err);
    cr_assert(d, "%s", err.msg);
    cr_expect_eq(mt_dataset_stats(d).tokens, 10);
    mt_dataset_free(d);
    free(p);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- .mtok ---- */

static void batches_equal(mt_dataset *a, mt_dataset *b, int64_t T) {
    int32_t xa[4 * 64], ya[4 * 64], pa[4 * 64], xb[4 * 64], yb[4 * 64], pb[4 * 64];
    int n = 0;
    cr_assert_eq(mt_dataset_packs_documents(a), mt_dataset_packs_documents(b));
    for (;; n++) {
        int ra = mt_dataset_next_batch(a, 4, T, xa, ya, pa),
            rb = mt_dataset_next_batch(b, 4, T, xb, yb, pb);
        cr_assert_eq(ra, rb);
        if (ra) break;
        size_t bytes = sizeof(int32_t) * 4 * T;
        cr_assert(!memcmp(xa, xb, bytes) && !memcmp(ya, yb, bytes), "batch %d", n);
        cr_assert(!mt_dataset_packs_documents(a) || !memcmp(pa, pb, bytes), "batch %d", n);
    }
    cr_expect_gt(n, 1);
}

Test(dataset, mtok_round_trip_and_corruption) {
    char *dir = mt_test_tmpdir();
    char *tp = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_sp.json");
    mt_error err = {{0}};
    mt_tokenizer *tok = mt_tokenizer_load(tp, &err);
    cr_assert(tok);
    char text[8192], *q = text;
    for (int i = 0; i < 40; i++)
        q += sprintf(q, "{\"messages\": [{\"role\": \"user\", \"content\": \"question %d\"}, "
                        "{\"role\": \"assistant\", \"content\": \"the answer is %d\"}]}\n", i, i * 7);
    char *p = write_tmp(dir, "chat.jsonl", text), *out = mt_path_join(dir, "chat.mtok");
    int64_t V = (int64_t)mt_tokenizer_vocab_size(tok);
    mt_dataset *a = open_data(p, "auto", tok, V, 0, &err);
    cr_assert(a, "%s", err.msg);
    cr_expect(!strcmp(mt_dataset_stats(a).chat_template, "llama2"));
    cr_assert_eq(mt_mtok_write(out, mt_dataset_corpus(a), &err), 0, "%s", err.msg);
    mt_dataset *b = open_data(out, "auto", NULL, V, 0, &err);
    cr_assert(b, "%s", err.msg);
    mt_data_stats sa = mt_dataset_stats(a), sb = mt_dataset_stats(b);
    cr_expect(sa.documents == sb.documents && sa.tokens == sb.tokens && sa.trainable == sb.trainable);
    cr_expect(sa.trainable < sa.tokens);
    // A token file with a loss mask packs documents, as its chat source does.
    cr_expect(!strcmp(sa.packing, "documents") && !strcmp(sb.packing, "documents"));
    batches_equal(a, b, 16);
    mt_dataset_free(a), mt_dataset_free(b);
    // The model's vocabulary is smaller than the file's ids.
    cr_expect(!open_data(out, "tokens", NULL, 5, 0, &err) && strstr(err.msg, "outside the model"), "%s", err.msg);

    char *img;
    size_t len;
    cr_assert_eq(mt_read_file(out, &img, &len, &err), 0);
    struct { size_t off; uint8_t val; size_t trunc; const char *expect; } bad[] = {
        {0, 'X', 0, "magic"},          {4, 9, 0, "version"},
        {12, 4, 0, "token_bytes"},     {24, 200, 0, "does not match its header"},
        {0, 0, 1, "magic"},        {0, 0, len - 10, "truncated"},
        {40, 3, 0, "flags"},           {48, 1, 0, "trainable"},
        {64 + 8 + 7, 0x7F, 0, "negative length"},  // offsets[1] high byte
    };
    char *bp = mt_path_join(dir, "bad.mtok");
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *c = malloc(len);
        memcpy(c, img, len);
        if (!bad[i].trunc) c[bad[i].off] = (char)(c[bad[i].off] + bad[i].val);
        FILE *f = fopen(bp, "wb");
        fwrite(c, 1, bad[i].trunc ? bad[i].trunc : len, f);
        fclose(f);
        mt_mtok m;
        cr_expect_eq(mt_mtok_open(bp, &m, &err), -1, "case %zu accepted", i);
        cr_expect(strstr(err.msg, bad[i].expect) && strstr(err.msg, bp), "case %zu: %s", i, err.msg);
        free(c);
    }
    // A token id past vocab_size.
    const uint64_t *hdr = (const uint64_t *)img;
    size_t tok0 = 64 + 8 * (hdr[3] + 1);
    img[tok0] = (char)0xFF, img[tok0 + 1] = (char)0xFF;
    FILE *f = fopen(bp, "wb");
    fwrite(img, 1, len, f);
    fclose(f);
    mt_mtok m;
    cr_expect(mt_mtok_open(bp, &m, &err) == -1 && strstr(err.msg, "65535"), "%s", err.msg);
    free(img), free(bp), free(p), free(out), free(tp);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* brown.jsonl with Llama-3: HF's id count (fixture) plus BOS and EOS per document. */
Test(dataset, brown_llama3_token_count_matches_hf) {
    const char *shared = mt_test_shared_dir();
    if (!shared) cr_skip_test("MEGATRAIN_SHARED not set: real tokenizers absent");
    cJSON *fx = load_json("data/brown_llama3_count.json");
    char *tp = mt_path_join(shared, "tokenizers/llama3/tokenizer.json");
    char *dp = mt_path_join(shared, "corpus/brown.jsonl");
    mt_error err = {{0}};
    mt_tokenizer *tok = mt_tokenizer_load(tp, &err);
    cr_assert(tok, "%s", err.msg);
    mt_dataset *d = open_data(dp, "auto", tok, (int64_t)mt_tokenizer_vocab_size(tok), 0, &err);
    cr_assert(d, "%s", err.msg);
    int64_t docs = cJSON_GetObjectItem(fx, "documents")->valueint;
    int64_t ids = (int64_t)cJSON_GetObjectItem(fx, "ids_without_special")->valuedouble;
    mt_data_stats s = mt_dataset_stats(d);
    cr_expect_eq(s.documents, docs);
    cr_expect_eq(s.tokens, ids + 2 * docs);
    cr_expect_eq(s.trainable, s.tokens);
    mt_dataset_free(d);
    mt_tokenizer_free(tok);
    free(tp), free(dp);
    cJSON_Delete(fx);
}
