/* The pre-tokenizer's regex matches looked for in windows of the text
 * ahead (tokenizer.c split_words; issue 29, item 11): `[a-z]*[0-9]|.` on a
 * long line of letters was quadratic (200 KB: 21 s) and is now refused
 * quickly naming the line; and the windows change no id. The second is a
 * differential test: random texts with long runs (letters, digits, spaces,
 * line breaks, punctuation, multi-byte characters) encoded with first
 * windows of 4, 7, 16 and 256 bytes must give the ids of a window larger
 * than the text (where nothing is cut), under the fixture's Llama-3-style
 * regex and regexes chosen for what a window's end could change: lookahead
 * at a run's end, \b, $, lookbehind, empty matches. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/tokenizer_internal.h"
#include "io/file.h"
#include "util/sys.h"
#include "testlib.h"

/* The fixture tiny_bytelevel.json with its Split regex replaced (NULL:
 * kept), written into dir. */
static mt_tokenizer *with_regex(const char *dir, const char *regex) {
    char *src = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_bytelevel.json"), *text;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(src, &text, &len, &err), 0, "%s", err.msg);
    cJSON *j = cJSON_Parse(text);
    cJSON *split = cJSON_GetArrayItem(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "pre_tokenizer"), "pretokenizers"), 0);
    cJSON *pattern = cJSON_GetObjectItem(split, "pattern");
    cr_assert(pattern, "the fixture's first pre-tokenizer is a Split");
    if (regex) cJSON_ReplaceItemInObject(pattern, "Regex", cJSON_CreateString(regex));
    char *out = cJSON_Print(j), path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    fputs(out, f);
    fclose(f);
    mt_tokenizer *tok = mt_tokenizer_load(path, &err);
    cr_assert(tok, "%s: %s", regex, err.msg);
    free(out);
    cJSON_Delete(j);
    free(text);
    free(src);
    return tok;
}

/* A line of 200 KB of letters in a JSONL file: the data is refused in well
 * under a second with the line named. */
Test(tokenizer_regex, a_quadratic_regex_on_a_long_line_is_refused_quickly,
     .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), data[600];
    mt_tokenizer *tok = with_regex(dir, "[a-z]*[0-9]|.");
    snprintf(data, sizeof data, "%s/line.jsonl", dir);
    FILE *f = fopen(data, "w");
    fputs("{\"text\": \"short 123\"}\n{\"text\": \"", f);
    for (int i = 0; i < 200000; i++) fputc('a', f);
    fputs("\"}\n", f);
    fclose(f);
    mt_data_opts o = {.path = data, .seed = 1, .epochs = 1};
    mt_error err;
    double t0 = mt_now_s();
    mt_dataset *d = mt_dataset_open(&o, tok, 1 << 20, &err);
    double dt = mt_now_s() - t0;
    cr_assert_null(d);
    char want[700];
    snprintf(want, sizeof want, "%s:2: the tokenizer's pre-tokenizer regex (Split 0) takes "
             "quadratic time on this text", data);
    cr_assert(strstr(err.msg, want), "%s", err.msg);
    cr_assert_lt(dt, 5.0, "%.2f s", dt); /* the refusal costs about 200 matches of 200 KB */
    /* the same text a few KB long is quadratic too, but cheap: encoded */
    mt_tok_encoder *enc = mt_tok_encoder_new(tok);
    char line[4001];
    memset(line, 'a', 4000);
    mt_tok_ids ids = {0};
    cr_assert_eq(mt_tok_encode(enc, line, 4000, false, &ids, &err), 0, "%s", err.msg);
    cr_assert_eq(ids.n, 4000);
    mt_tok_ids_free(&ids);
    mt_tok_encoder_free(enc);
    mt_tokenizer_free(tok);
    mt_test_rmtree(dir);
    free(dir);
}

static const char *const pieces[] = {
    "a", "Z", "é", "中", "\xF0\x9F\x98\x80", "0", "7", " ", "  ", "\t", "\n", "\r\n", ".", ",",
    "'s", "'ll", "-", "$", "_", "x",
};

/* A random text of about n bytes, with runs up to 600 of one piece. */
static size_t random_text(char *buf, size_t cap, size_t n, unsigned long long *r) {
    size_t len = 0;
    while (len < n) {
        *r ^= *r << 13, *r ^= *r >> 7, *r ^= *r << 17;
        const char *p = pieces[*r % (sizeof pieces / sizeof *pieces)];
        size_t run = (*r >> 20) % 8 == 0 ? (*r >> 32) % 600 + 1 : (*r >> 32) % 4 + 1;
        for (size_t k = 0; k < run && len + strlen(p) < cap; k++) {
            memcpy(buf + len, p, strlen(p));
            len += strlen(p);
        }
        if (len + 4 >= cap) break;
    }
    return len;
}

static void encode_with_window(mt_tokenizer *tok, size_t window, const char *text, size_t len,
                               mt_tok_ids *out) {
    mt_tok_encoder *enc = mt_tok_encoder_new(tok);
    mt_tok_encoder_set_window(enc, window);
    mt_error err;
    cr_assert_eq(mt_tok_encode(enc, text, len, false, out, &err), 0, "%s", err.msg);
    mt_tok_encoder_free(enc);
}

Test(tokenizer_regex, windows_change_no_id, .timeout = MT_TEST_LIMIT(120)) {
    static const char *const regexes[] = {
        NULL, /* the fixture's own, Llama-3-style */
        "\\s+(?!\\S)|\\s+|\\S+",
        "[a-z]*[0-9]|.",
        "\\b\\w+\\b|\\W",
        "\\w+$|\\w+|.",
        "(?<=a)a+|a|[^a]+",
        "x*",
        "\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+",
    };
    static const size_t windows[] = {4, 7, 16, 256};
    char *dir = mt_test_tmpdir();
    static char text[8192];
    unsigned long long r = 88172645463325252ull;
    for (size_t k = 0; k < sizeof regexes / sizeof *regexes; k++) {
        mt_tokenizer *tok = with_regex(dir, regexes[k]);
        for (int t = 0; t < 40; t++) {
            size_t len = random_text(text, sizeof text, 200 + (size_t)t * 150, &r);
            mt_tok_ids want = {0};
            encode_with_window(tok, (size_t)1 << 40, text, len, &want);
            for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
                mt_tok_ids got = {0};
                encode_with_window(tok, windows[w], text, len, &got);
                cr_assert(got.n == want.n && !memcmp(got.ids, want.ids, want.n * sizeof *want.ids),
                          "regex %s, window %zu, text %d (%zu bytes): %zu ids, %zu without "
                          "windows", regexes[k] ? regexes[k] : "(the fixture's)", windows[w], t,
                          len, got.n, want.n);
                mt_tok_ids_free(&got);
            }
            mt_tok_ids_free(&want);
        }
        mt_tokenizer_free(tok);
    }
    mt_test_rmtree(dir);
    free(dir);
}
