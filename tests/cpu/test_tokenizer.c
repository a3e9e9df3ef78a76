/* Tokenizer tests against Hugging Face `tokenizers` (fixtures made by
 * scripts/make_tokenizer_fixtures.py).
 *
 * tiny_*: two small tokenizers committed with full reference ids and decodes
 * of a committed text sample; they run everywhere. real_*: the Llama-2,
 * Llama-3 and Qwen3 tokenizers of the shared data on every record of
 * brown.jsonl and sentences.jsonl, compared through a 32-bit hash and the
 * length of each id sequence; skipped when the shared data is absent.
 * Ids must match exactly: there is no tolerance. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"
#include "testlib.h"

/* ---- helpers ---- */

typedef struct texts {
    char **s;  // (n) NUL-terminated
    size_t n;
} texts;

static void texts_free(texts *t) {
    for (size_t i = 0; i < t->n; i++) free(t->s[i]);
    free(t->s);
}

/* The "text" (or whole parsed object, when key is NULL) of each JSONL line. */
static cJSON **read_jsonl(const char *path, size_t *n) {
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    cJSON **v = NULL;
    size_t cap = 0, cnt = 0;
    char *line = NULL;
    size_t lcap = 0;
    while (getline(&line, &lcap, f) > 0) {
        if (cnt == cap) v = realloc(v, (cap = cap ? cap * 2 : 1024) * sizeof *v);
        v[cnt] = cJSON_Parse(line);
        cr_assert(v[cnt], "%s:%zu: bad JSON", path, cnt + 1);
        cnt++;
    }
    free(line);
    fclose(f);
    *n = cnt;
    return v;
}

static texts read_texts(const char *path) {
    size_t n;
    cJSON **v = read_jsonl(path, &n);
    texts t = {malloc((n ? n : 1) * sizeof(char *)), n};
    for (size_t i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(v[i], "text");
        cr_assert(cJSON_IsString(s), "%s:%zu: no \"text\"", path, i + 1);
        t.s[i] = strdup(s->valuestring);
        cJSON_Delete(v[i]);
    }
    free(v);
    return t;
}

static mt_tokenizer *load_or_fail(const char *path) {
    mt_error err;
    mt_tokenizer *tok = mt_tokenizer_load(path, &err);
    cr_assert(tok, "%s", err.msg);
    return tok;
}

static void encode_or_fail(mt_tok_encoder *e, const char *text, bool special, mt_tok_ids *out) {
    mt_error err;
    out->n = 0;
    cr_assert_eq(mt_tok_encode(e, text, strlen(text), special, out, &err), 0, "%s", err.msg);
}

/* Compares got with a JSON array of ids; reports the first difference. */
static void expect_ids(const mt_tok_ids *got, const cJSON *ref, size_t rec, const char *text, const char *what) {
    size_t n = (size_t)cJSON_GetArraySize(ref), i = 0;
    while (i < n && i < got->n && got->ids[i] == (int32_t)cJSON_GetArrayItem(ref, (int)i)->valuedouble) i++;
    cr_expect(i == n && n == got->n, "record %zu (%s) %s: first difference at id %zu of %zu (got %zu ids)\n"
              "text: %s", rec, what, i < n ? "differs" : "length", i, n, got->n, text);
}

static char *fixture(const char *name) {
    static char buf[4096];  // test-only scratch
    snprintf(buf, sizeof buf, "%s/tokenizer/%s", mt_test_fixtures_dir(), name);
    return buf;
}

/* ---- tiny committed tokenizers: full ids and decodes ---- */

static void check_tiny(const char *name, bool round_trip) {
    char path[4096];
    snprintf(path, sizeof path, "%s", fixture(name));
    strcat(path, ".json");
    mt_tokenizer *tok = load_or_fail(path);
    texts sample = read_texts(fixture("sample.jsonl"));
    snprintf(path, sizeof path, "%s", fixture(name));
    strcat(path, ".ref.jsonl");
    size_t n;
    cJSON **ref = read_jsonl(path, &n);
    cr_assert_eq(n, sample.n);
    mt_tok_encoder *e = mt_tok_encoder_new(tok);
    mt_tok_ids ids = {0};
    size_t changed_by_round_trip = 0;
    for (size_t i = 0; i < n; i++) {
        const char *text = sample.s[i];
        encode_or_fail(e, text, false, &ids);
        expect_ids(&ids, cJSON_GetObjectItem(ref[i], "ids"), i, text, "add_special=false");
        encode_or_fail(e, text, true, &ids);
        expect_ids(&ids, cJSON_GetObjectItem(ref[i], "ids_special"), i, text, "add_special=true");
        char *dec = mt_tokenizer_decode(tok, ids.ids, ids.n, false);
        char *dec_skip = mt_tokenizer_decode(tok, ids.ids, ids.n, true);
        cr_expect_str_eq(dec, cJSON_GetObjectItem(ref[i], "dec")->valuestring, "record %zu decode", i);
        cr_expect_str_eq(dec_skip, cJSON_GetObjectItem(ref[i], "dec_skip")->valuestring,
                         "record %zu decode skipping special", i);
        changed_by_round_trip += strcmp(dec_skip, text) != 0;
        free(dec);
        free(dec_skip);
        cJSON_Delete(ref[i]);
    }
    // Byte-level BPE is lossless up to NFC: only the 3 sample lines with
    // decomposed accents (e + U+0301 ...) may come back different.
    if (round_trip) cr_expect_leq(changed_by_round_trip, 3, "%zu lines changed", changed_by_round_trip);
    free(ref);
    mt_tok_ids_free(&ids);
    mt_tok_encoder_free(e);
    texts_free(&sample);
    mt_tokenizer_free(tok);
}

Test(tokenizer, tiny_bytelevel_matches_hf) { check_tiny("tiny_bytelevel", true); }
Test(tokenizer, tiny_sentencepiece_matches_hf) { check_tiny("tiny_sp", false); }

Test(tokenizer, tiny_special_tokens_and_lookup) {
    mt_tokenizer *tok = load_or_fail(fixture("tiny_bytelevel.json"));
    int32_t bos = mt_tokenizer_token_id(tok, "<|bos|>");
    cr_assert_eq(bos, 0);
    cr_assert_eq(mt_tokenizer_token_id(tok, "no such token"), -1);
    cr_assert_eq(mt_tokenizer_bos_id(tok), bos);  // no tokenizer_config.json: from the template
    cr_assert_eq(mt_tokenizer_vocab_size(tok), 660);  // 256 bytes + 400 merges + 2 special + 2 added

    int32_t *ids;
    size_t n;
    mt_error err;
    const char *text = "<|bos|>hi<think>x</think><|eos|>";
    cr_assert_eq(mt_tokenizer_encode(tok, text, strlen(text), true, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(ids[0], bos);  // from the template
    cr_assert_eq(ids[1], bos);  // from the text
    cr_assert_eq(ids[n - 1], mt_tokenizer_token_id(tok, "<|eos|>"));
    char *all = mt_tokenizer_decode(tok, ids, n, false);
    char *plain = mt_tokenizer_decode(tok, ids, n, true);
    cr_assert_str_eq(all, "<|bos|><|bos|>hi<think>x</think><|eos|>");
    cr_assert_str_eq(plain, "hi<think>x</think>");  // <think> is added but not special
    free(all);
    free(plain);
    free(ids);
    mt_tokenizer_free(tok);
}

/* ---- errors ---- */

static char *write_temp(const char *dir, const char *json) {
    static char path[4096];  // test-only scratch
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(json, f);
    fclose(f);
    return path;
}

Test(tokenizer, refuses_unsupported_components_naming_them) {
    char *dir = mt_test_tmpdir();
    const char *model = "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}";
    struct { const char *extra, *path_in_msg; } cases[] = {
        {"\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Lowercase\"}]}",
         "normalizer.normalizers[1]: Lowercase"},
        {"\"pre_tokenizer\":{\"type\":\"Metaspace\"}", "pre_tokenizer: Metaspace"},
        {"\"decoder\":{\"type\":\"WordPiece\"}", "decoder: WordPiece"},
        {"\"post_processor\":{\"type\":\"BertProcessing\"}", "post_processor: BertProcessing"},
    };
    char json[2048];
    mt_error err;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, "{%s,%s}", model, cases[i].extra);
        cr_expect_null(mt_tokenizer_load(write_temp(dir, json), &err));
        cr_expect(strstr(err.msg, cases[i].path_in_msg), "message \"%s\" lacks \"%s\"", err.msg,
                  cases[i].path_in_msg);
    }
    snprintf(json, sizeof json, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}");
    cr_expect_null(mt_tokenizer_load(write_temp(dir, json), &err));
    cr_expect(strstr(err.msg, "model.merges[0]"), "%s", err.msg);
    cr_expect_null(mt_tokenizer_load("/nonexistent/tokenizer.json", &err));
    /* found by fuzzing: one id of 3e8 made the id table 2.4 GB */
    snprintf(json, sizeof json, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,"
             "\"ab\":3e8},\"merges\":[\"a b\"]}}");
    cr_expect_null(mt_tokenizer_load(write_temp(dir, json), &err));
    cr_expect(strstr(err.msg, "token id 300000000 is far beyond the 3 tokens"), "%s", err.msg);

    snprintf(json, sizeof json, "{%s}", model);  // a minimal valid file
    mt_tokenizer *tok = mt_tokenizer_load(write_temp(dir, json), &err);
    cr_assert(tok, "%s", err.msg);
    int32_t *ids;
    size_t n;
    cr_assert_eq(mt_tokenizer_encode(tok, "ab", 2, false, &ids, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 1);
    cr_assert_eq(ids[0], 2);
    free(ids);
    cr_expect_eq(mt_tokenizer_encode(tok, "a\xC3(", 3, false, &ids, &n, &err), -1);
    cr_expect(strstr(err.msg, "UTF-8 at byte 1"), "%s", err.msg);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

/* ---- the built-in byte tokenizer ---- */

Test(tokenizer, bytes_tokenizer) {
    mt_tokenizer *tok = mt_tokenizer_bytes();
    cr_assert_eq(mt_tokenizer_vocab_size(tok), 258);
    cr_assert_eq(mt_tokenizer_bos_id(tok), 256);
    cr_assert_eq(mt_tokenizer_eos_id(tok), 257);
    const char *text = "h\xC3\xA9!";  // "hé!"
    int32_t *ids;
    size_t n;
    mt_error err;
    cr_assert_eq(mt_tokenizer_encode(tok, text, strlen(text), true, &ids, &n, &err), 0);
    int32_t want[] = {256, 'h', 0xC3, 0xA9, '!'};
    cr_assert_eq(n, 5);
    cr_assert_arr_eq(ids, want, sizeof want);
    char *s = mt_tokenizer_decode(tok, ids, n, true);
    cr_assert_str_eq(s, text);
    free(s);
    s = mt_tokenizer_decode(tok, ids, n, false);
    cr_assert_str_eq(s, "<s>h\xC3\xA9!");
    free(s);
    int32_t broken[] = {'a', 0xC3, 257};  // a cut character decodes to U+FFFD
    s = mt_tokenizer_decode(tok, broken, 3, true);
    cr_assert_str_eq(s, "a\xEF\xBF\xBD");
    free(s);
    free(ids);
    mt_tokenizer_free(tok);
}

/* ---- real tokenizers on the shared corpora ---- */

static uint32_t fnv1a32_of_ids(const int32_t *ids, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xFF;  // little-endian bytes, as the script
            h *= 0x100000001B3ull;
        }
    return (uint32_t)h;
}

typedef struct ref_rec {
    uint32_t hash;
    uint16_t len;
} ref_rec;

/* Reads <tok>_<corpus>.ids.bin: n plain records then n_special with BOS. */
static ref_rec *read_ref(const char *path, size_t *n, size_t *n_special) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s (run scripts/make_tokenizer_fixtures.py)", path);
    unsigned char h[16];
    cr_assert_eq(fread(h, 1, 16, f), 16);
    cr_assert(memcmp(h, "MTTK", 4) == 0, "%s: bad magic", path);
    uint32_t ver, cnt, cnt_s;
    memcpy(&ver, h + 4, 4);
    memcpy(&cnt, h + 8, 4);
    memcpy(&cnt_s, h + 12, 4);
    cr_assert_eq(ver, 1);
    ref_rec *r = malloc(((size_t)cnt + cnt_s) * sizeof *r);
    for (size_t i = 0; i < (size_t)cnt + cnt_s; i++) {
        unsigned char b[6];
        cr_assert_eq(fread(b, 1, 6, f), 6, "%s: truncated", path);
        memcpy(&r[i].hash, b, 4);
        memcpy(&r[i].len, b + 4, 2);
    }
    fclose(f);
    *n = cnt;
    *n_special = cnt_s;
    return r;
}

/* Encodes every record on all threads (one encoder each: the tokenizer is
 * shared read-only) and expects no mismatch. */
static void check_real(const char *tok_name, const char *corpus, bool round_trip) {
    const char *shared = mt_test_shared_dir();
    if (!shared) cr_skip_test("shared data not found: set MEGATRAIN_SHARED to the data directory");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json", shared, tok_name);
    mt_tokenizer *tok = load_or_fail(path);
    snprintf(path, sizeof path, "%s/corpus/%s.jsonl", shared, corpus);
    texts t = read_texts(path);
    char name[256];
    snprintf(name, sizeof name, "%s_%s.ids.bin", tok_name, corpus);
    size_t n, n_special;
    ref_rec *ref = read_ref(fixture(name), &n, &n_special);
    cr_assert_eq(n, t.n, "%s has %zu records, the fixture %zu", corpus, t.n, n);
    size_t bad = 0, bad_round_trip = 0;
#pragma omp parallel reduction(+ : bad, bad_round_trip)
    {
        mt_tok_encoder *e = mt_tok_encoder_new(tok);
        mt_tok_ids ids = {0};
#pragma omp for schedule(dynamic, 64)
        for (size_t i = 0; i < n + n_special; i++) {
            size_t rec = i < n ? i : i - n;
            bool special = i >= n;
            mt_error err;
            ids.n = 0;
            if (mt_tok_encode(e, t.s[rec], strlen(t.s[rec]), special, &ids, &err)) {
                fprintf(stderr, "%s/%s record %zu: %s\n", tok_name, corpus, rec, err.msg);
                bad++;
                continue;
            }
            if (ids.n != ref[i].len || fnv1a32_of_ids(ids.ids, ids.n) != ref[i].hash) {
                if (bad < 5)
                    fprintf(stderr, "%s/%s record %zu (add_special=%d): %zu ids, HF %u (hash differs: %d)\n"
                            "text: %.300s\n", tok_name, corpus, rec, special, ids.n, ref[i].len,
                            fnv1a32_of_ids(ids.ids, ids.n) != ref[i].hash, t.s[rec]);
                bad++;
            }
            if (round_trip && !special) {
                char *s = mt_tokenizer_decode(tok, ids.ids, ids.n, false);
                bad_round_trip += strcmp(s, t.s[rec]) != 0;
                free(s);
            }
        }
        mt_tok_ids_free(&ids);
        mt_tok_encoder_free(e);
    }
    cr_expect_eq(bad, 0, "%s on %s: %zu of %zu records differ from HF", tok_name, corpus, bad, n + n_special);
    cr_expect_eq(bad_round_trip, 0, "%s on %s: decode(encode(x)) != x for %zu records", tok_name, corpus,
                 bad_round_trip);
    free(ref);
    texts_free(&t);
    mt_tokenizer_free(tok);
}

Test(tokenizer, real_llama3_brown, .timeout = MT_TEST_LIMIT(120)) {
    check_real("llama3", "brown", true);
}
Test(tokenizer, real_llama3_sentences, .timeout = MT_TEST_LIMIT(120)) {
    check_real("llama3", "sentences", true);
}
Test(tokenizer, real_qwen3_brown, .timeout = MT_TEST_LIMIT(120)) {
    check_real("qwen3", "brown", false);
}
Test(tokenizer, real_qwen3_sentences, .timeout = MT_TEST_LIMIT(120)) {
    check_real("qwen3", "sentences", false);
}
Test(tokenizer, real_llama2_brown, .timeout = MT_TEST_LIMIT(120)) {
    check_real("llama2", "brown", false);
}
Test(tokenizer, real_llama2_sentences, .timeout = MT_TEST_LIMIT(120)) {
    check_real("llama2", "sentences", false);
}

Test(tokenizer, real_config_special_ids) {
    const char *shared = mt_test_shared_dir();
    if (!shared) cr_skip_test("shared data not found: set MEGATRAIN_SHARED to the data directory");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/llama3/tokenizer.json", shared);
    mt_tokenizer *tok = load_or_fail(path);
    cr_expect_eq(mt_tokenizer_vocab_size(tok), 128256);
    cr_expect_eq(mt_tokenizer_bos_id(tok), 128000);  // <|begin_of_text|>
    cr_expect_eq(mt_tokenizer_eos_id(tok), 128001);  // <|end_of_text|>
    mt_tokenizer_free(tok);
    snprintf(path, sizeof path, "%s/tokenizers/qwen3/tokenizer.json", shared);
    tok = load_or_fail(path);
    cr_expect_eq(mt_tokenizer_bos_id(tok), -1);      // Qwen has no BOS
    cr_expect_eq(mt_tokenizer_eos_id(tok), 151645);  // <|im_end|>
    cr_expect_eq(mt_tokenizer_token_id(tok, "<|im_start|>"), 151644);
    mt_tokenizer_free(tok);
    snprintf(path, sizeof path, "%s/tokenizers/llama2/tokenizer.json", shared);
    tok = load_or_fail(path);
    cr_expect_eq(mt_tokenizer_bos_id(tok), 1);
    cr_expect_eq(mt_tokenizer_eos_id(tok), 2);
    cr_expect_eq(mt_tokenizer_token_id(tok, "<0x0A>"), 13);
    mt_tokenizer_free(tok);
}

/* The byte tokenizer saved as tokenizer.json (the built-in model's output
 * carries it) gives the ids of the built-in one on random UTF-8 text, the
 * same BOS/EOS, and decodes them back the same. */
Test(tokenizer, the_saved_byte_tokenizer_gives_the_bytes_ids) {
    char *dir = mt_test_tmpdir(), path[600];
    mt_error err;
    cr_assert_eq(mt_tokenizer_bytes_save(dir, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    mt_tokenizer *saved = mt_tokenizer_load(path, &err), *bytes = mt_tokenizer_bytes();
    cr_assert(saved, "%s", err.msg);
    cr_assert_eq(mt_tokenizer_vocab_size(saved), 258);
    cr_assert_eq(mt_tokenizer_bos_id(saved), 256);
    cr_assert_eq(mt_tokenizer_eos_id(saved), 257);
    static const char *const pieces[] = {"a", "Z", " ", "\n", "\t", "0", "\xC3\xA9", "\xE4\xB8\xAD",
                                         "\xF0\x9F\x98\x80", "'s", "<", ">", "\x7F", "~"};
    unsigned long long r = 12345;
    char text[2048];
    for (int k = 0; k < 200; k++) {
        size_t len = 0;
        for (int i = 0; i < 1 + k * 3 % 300; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            const char *p = pieces[r % (sizeof pieces / sizeof *pieces)];
            if (len + strlen(p) >= sizeof text) break;
            memcpy(text + len, p, strlen(p));
            len += strlen(p);
        }
        for (int special = 0; special < 2; special++) {
            int32_t *x, *y;
            size_t nx, ny;
            cr_assert_eq(mt_tokenizer_encode(saved, text, len, special, &x, &nx, &err), 0, "%s",
                         err.msg);
            cr_assert_eq(mt_tokenizer_encode(bytes, text, len, special, &y, &ny, &err), 0);
            cr_assert(nx == ny && !memcmp(x, y, nx * sizeof *x), "text %d: ids differ", k);
            char *dx = mt_tokenizer_decode(saved, x, nx, true);
            char *dy = mt_tokenizer_decode(bytes, y, ny, true);
            cr_assert_str_eq(dx, dy);
            free(dx), free(dy), free(x), free(y);
        }
    }
    mt_tokenizer_free(saved);
    mt_tokenizer_free(bytes);
    mt_test_rmtree(dir);
    free(dir);
}
