/* Chat templates against transformers (tests/fixtures/chat, made by
 * scripts/make_chat_template_fixtures.py from the real templates of
 * templates.json): every template x conversation x add_generation_prompt
 * renders the same bytes as apply_chat_template or fails where it fails;
 * the loss spans equal transformers' assistant masks where the template has
 * {% generation %} blocks, and TRL's training variant's where it has one;
 * every assistant message's content lies in a span and no other message's
 * does; with the real tokenizers the ids and loss flags equal
 * apply_chat_template(tokenize=True, return_assistant_tokens_mask=True).
 * Also: the built-ins are their published templates byte for byte, which
 * template a tokenizer folder gets, and that a trained model is saved with
 * the template its data was rendered with. Every comparison is exact. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/chat.h"
#include "data/dataset.h"
#include "data/tok_spans.h"
#include "io/file.h"
#include "megatrain.h"
#include "testlib.h"
#include "train/train_config.h"
#include "train/trainer.h"

static cJSON *load_fixture(const char *rel) {
    char *p = mt_path_join(mt_test_fixtures_dir(), rel), *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(p, &buf, &len, &err), 0, "%s", err.msg);
    cJSON *j = cJSON_ParseWithLength(buf, len);
    cr_assert(j, "%s is not JSON", p);
    free(buf), free(p);
    return j;
}

static char *read_template(const char *name) {
    char rel[256], *buf;
    snprintf(rel, sizeof rel, "chat/templates/%s.jinja", name);
    char *p = mt_path_join(mt_test_fixtures_dir(), rel);
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(p, &buf, &len, &err), 0, "%s", err.msg);
    free(p);
    return buf;
}

/* The template of a templates.json entry, with its special tokens. */
static mt_chat_template *fixture_template(const cJSON *entry) {
    const char *name = cJSON_GetObjectItem(entry, "name")->valuestring;
    const cJSON *sp = cJSON_GetObjectItem(entry, "special");
    const char *special[MT_CHAT_N_SPECIAL] = {0};
    for (int i = 0; i < MT_CHAT_N_SPECIAL; i++) {
        const cJSON *v = cJSON_GetObjectItem(sp, mt_chat_special_names[i]);
        special[i] = v ? v->valuestring : NULL;
    }
    char *src = read_template(name);
    mt_error err = {{0}};
    mt_chat_template *t = mt_chat_template_new(name, src, NULL, special, &err);
    cr_assert(t, "%s: %s", name, err.msg);
    free(src);
    return t;
}

static const cJSON *find_entry(const cJSON *manifest, const char *name) {
    const cJSON *e;
    cJSON_ArrayForEach(e, manifest)
        if (!strcmp(cJSON_GetObjectItem(e, "name")->valuestring, name)) return e;
    return NULL;
}

/* Renders the fixture conversation conv with t. */
static int render_conv(const mt_chat_template *t, const cJSON *conv, bool gen, int64_t now,
                       mt_jpool *pool, mt_chat_text *r, mt_error *err) {
    char *line = cJSON_PrintUnformatted(conv);
    mt_chat_conv c;
    mt_jinja_opts opts = {.now = now};
    mt_jpool_reset(pool);
    int rc = mt_chat_conv_from_json(pool, line, strlen(line), &c, err);
    cr_assert_eq(rc, 0, "%s", err->msg);
    rc = mt_chat_render(t, &c, gen, pool, &opts, r, err);
    free(line);
    return rc;
}

/* The reference spans of a fixture, touching ones merged (transformers
 * lists a generation block right after another as a span of its own). */
static size_t ref_spans(const cJSON *want, mt_tok_span *out, size_t cap) {
    size_t n = 0;
    const cJSON *w;
    cJSON_ArrayForEach(w, want) {
        size_t a = (size_t)cJSON_GetArrayItem(w, 0)->valuedouble, b = (size_t)cJSON_GetArrayItem(w, 1)->valuedouble;
        if (a == b) continue;
        if (n && out[n - 1].b == a) out[n - 1].b = b;
        else if (n < cap) out[n++] = (mt_tok_span){a, b};
    }
    return n;
}

static char *spans_str(const mt_chat_text *r) {
    static char s[512];
    size_t k = 0;
    for (size_t i = 0; i < r->n_spans && k + 32 < sizeof s; i++)
        k += (size_t)snprintf(s + k, sizeof s - k, "[%zu,%zu) ", r->spans[i].a, r->spans[i].b);
    s[k] = 0;
    return s;
}

/* Whether r's spans are the reference's; `before` (may be NULL): text the
 * reference's spans may start with and r's not. TRL's training templates
 * mostly open the generation block after the generation prompt, as
 * megatrain's turns start; templates.json names those that open it earlier
 * (qwen2.5: before the prompt's last newline; deepseek-v3: before the
 * <｜Assistant｜> marker). */
static bool spans_match(const mt_chat_text *r, const cJSON *want, const char *before) {
    mt_tok_span ref[64];
    size_t n = ref_spans(want, ref, 64), k = before ? strlen(before) : 0;
    if (n != r->n_spans) return false;
    for (size_t i = 0; i < n; i++) {
        if (r->spans[i].b != ref[i].b) return false;
        bool same = r->spans[i].a == ref[i].a;
        bool later = k && r->spans[i].a == ref[i].a + k && !memcmp(r->out.text.p + ref[i].a, before, k);
        if (!same && !later) return false;
    }
    return true;
}

static bool in_spans(const mt_chat_text *r, size_t a, size_t b) {
    for (size_t i = 0; i < r->n_spans; i++)
        if (r->spans[i].a <= a && b <= r->spans[i].b) return true;
    return false;
}

static bool touches_spans(const mt_chat_text *r, size_t a, size_t b) {
    for (size_t i = 0; i < r->n_spans; i++)
        if (r->spans[i].a < b && a < r->spans[i].b) return true;
    return false;
}

Test(chat, real_templates_render_as_transformers) {
    cJSON *manifest = load_fixture("chat/templates.json"), *fx = load_fixture("chat/renders.json");
    const cJSON *convs = cJSON_GetObjectItem(fx, "conversations"), *c;
    int64_t now = (int64_t)cJSON_GetObjectItem(fx, "time")->valuedouble;
    mt_jpool pool = {0};
    mt_chat_text r = {0};
    int texts = 0, errors = 0, gen_spans = 0, trl = 0, contents = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "renders")) {
        const char *tpl = cJSON_GetObjectItem(c, "template")->valuestring;
        const char *conv = cJSON_GetObjectItem(c, "conversation")->valuestring;
        bool gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        const cJSON *entry = find_entry(manifest, tpl);
        mt_chat_template *t = fixture_template(entry);
        mt_error err = {{0}};
        int rc = render_conv(t, cJSON_GetObjectItem(convs, conv), gen, now, &pool, &r, &err);
        const cJSON *werr = cJSON_GetObjectItem(c, "error");
        if (werr) {
            cr_expect_eq(rc, -1, "%s/%s/%d: transformers fails (%s)", tpl, conv, gen, werr->valuestring);
            if (!strncmp(werr->valuestring, "TemplateError: ", 15))
                cr_expect(strstr(err.msg, werr->valuestring + 15), "%s/%s: %s", tpl, conv, err.msg);
            errors++;
            mt_chat_template_free(t);
            continue;
        }
        cr_assert_eq(rc, 0, "%s/%s/%d: %s", tpl, conv, gen, err.msg);
        const char *want = cJSON_GetObjectItem(c, "text")->valuestring;
        cr_expect(r.out.text.n == strlen(want) && !memcmp(r.out.text.p, want, r.out.text.n),
                  "%s/%s/%d:\n got '%s'\nwant '%s'", tpl, conv, gen, r.out.text.p, want);
        texts++;
        const cJSON *gs = cJSON_GetObjectItem(c, "generation_spans"), *ts = cJSON_GetObjectItem(c, "trl_spans");
        if (gs) {
            cr_expect(spans_match(&r, gs, NULL), "%s/%s: spans %s differ from transformers' assistant masks", tpl, conv, spans_str(&r));
            gen_spans++;
        }
        if (ts) {
            const cJSON *before = cJSON_GetObjectItem(entry, "trl_starts_before");
            cr_expect(spans_match(&r, ts, before ? before->valuestring : NULL),
                      "%s/%s: spans %s differ from TRL's training template's", tpl, conv, spans_str(&r));
            trl++;
        }
        const cJSON *cr_, *msgs = cJSON_GetObjectItem(cJSON_GetObjectItem(convs, conv), "messages");
        cJSON_ArrayForEach(cr_, cJSON_GetObjectItem(c, "contents")) {
            int m = cJSON_GetArrayItem(cr_, 0)->valueint;
            size_t a = (size_t)cJSON_GetArrayItem(cr_, 1)->valuedouble, b = (size_t)cJSON_GetArrayItem(cr_, 2)->valuedouble;
            bool assistant = !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, m), "role")->valuestring, "assistant");
            if (assistant) cr_expect(in_spans(&r, a, b), "%s/%s: messages[%d]'s content [%zu,%zu) has no loss: %s", tpl, conv, m, a, b, spans_str(&r));
            else cr_expect(!touches_spans(&r, a, b), "%s/%s: messages[%d]'s content [%zu,%zu) has loss: %s", tpl, conv, m, a, b, spans_str(&r));
            contents++;
        }
        mt_chat_template_free(t);
    }
    // What the fixture covers (a regenerated fixture must not lose it).
    cr_expect_geq(texts, 400);
    cr_expect_geq(errors, 50);
    cr_expect_geq(gen_spans, 30);
    cr_expect_geq(trl, 40);
    cr_expect_geq(contents, 300);
    mt_chat_text_free(&r);
    mt_jpool_free(&pool);
    cJSON_Delete(manifest), cJSON_Delete(fx);
}

/* Ids and loss flags through the real tokenizers equal transformers'
 * apply_chat_template(tokenize=True, return_assistant_tokens_mask=True) of
 * the template (with generation blocks) or of its TRL training variant. */
Test(chat, tokens_and_masks_match_transformers) {
    const char *shared = mt_test_shared_dir();
    if (!shared) cr_skip_test("MEGATRAIN_SHARED not set: real tokenizers absent");
    cJSON *manifest = load_fixture("chat/templates.json"), *fx = load_fixture("chat/renders.json");
    const cJSON *convs = cJSON_GetObjectItem(fx, "conversations"), *c;
    int64_t now = (int64_t)cJSON_GetObjectItem(fx, "time")->valuedouble;
    mt_jpool pool = {0};
    mt_chat_text r = {0};
    mt_tok_masked m = {0};
    int checked = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "renders")) {
        const cJSON *ids = cJSON_GetObjectItem(c, "ids"), *masks = cJSON_GetObjectItem(c, "assistant_masks");
        if (!ids) continue;
        const char *tpl = cJSON_GetObjectItem(c, "template")->valuestring;
        const char *conv = cJSON_GetObjectItem(c, "conversation")->valuestring;
        char rel[256];
        snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", cJSON_GetObjectItem(c, "tokenizer")->valuestring);
        char *tp = mt_path_join(shared, rel);
        mt_error err = {{0}};
        mt_tokenizer *tok = mt_tokenizer_load(tp, &err);
        cr_assert(tok, "%s", err.msg);
        mt_chat_template *t = fixture_template(find_entry(manifest, tpl));
        cr_assert_eq(render_conv(t, cJSON_GetObjectItem(convs, conv), false, now, &pool, &r, &err), 0, "%s", err.msg);
        mt_tok_encoder *enc = mt_tok_encoder_new(tok);
        m.ids.n = 0;
        cr_assert_eq(mt_tok_encode_spans(enc, tok, r.out.text.p, r.out.text.n, r.spans, r.n_spans, &m, &err), 0, "%s", err.msg);
        size_t n = (size_t)cJSON_GetArraySize(ids);
        cr_expect_eq(m.ids.n, n, "%s/%s: %zu ids, transformers %zu", tpl, conv, m.ids.n, n);
        for (size_t i = 0; i < n && i < m.ids.n; i++)
            cr_expect_eq(m.ids.ids[i], cJSON_GetArrayItem(ids, (int)i)->valueint, "%s/%s: id %zu", tpl, conv, i);
        const cJSON *before = cJSON_GetObjectItem(find_entry(manifest, tpl), "trl_starts_before");
        for (size_t i = 0; i < n && i < m.ids.n;) {  // by runs of the reference's flags
            size_t e = i;
            int want = cJSON_GetArrayItem(masks, (int)i)->valueint;
            while (e < n && e < m.ids.n && cJSON_GetArrayItem(masks, (int)e)->valueint == want) e++;
            size_t d = 0;  // tokens at a run's start that TRL's template alone trains on
            while (before && want && i + d < e && !m.keep[i + d]) d++;
            cr_expect(d < e - i || !want, "%s/%s: tokens %zu..%zu have no loss", tpl, conv, i, e);
            for (size_t k = i + d; k < e; k++)
                cr_expect_eq(m.keep[k], want, "%s/%s: loss flag of token %zu (id %d)", tpl, conv, k, m.ids.ids[k]);
            i = e;
        }
        checked++;
        mt_tok_encoder_free(enc);
        mt_chat_template_free(t);
        mt_tokenizer_free(tok);
        free(tp);
    }
    cr_expect_geq(checked, 100, "the fixture has token-level cases");
    mt_tok_masked_free(&m);
    mt_chat_text_free(&r);
    mt_jpool_free(&pool);
    cJSON_Delete(manifest), cJSON_Delete(fx);
}

/* The built-ins are the published templates of their fixtures, byte for byte. */
Test(chat, builtins_are_their_published_templates) {
    cJSON *manifest = load_fixture("chat/templates.json");
    const cJSON *e;
    int n = 0;
    cJSON_ArrayForEach(e, manifest) {
        const cJSON *b = cJSON_GetObjectItem(e, "builtin");
        if (!b) continue;
        char *src = read_template(cJSON_GetObjectItem(e, "name")->valuestring);
        const char *builtin = mt_chat_builtin_source(b->valuestring);
        cr_assert(builtin, "no built-in %s", b->valuestring);
        cr_expect_str_eq(builtin, src, "built-in %s", b->valuestring);
        free(src);
        n++;
    }
    cr_expect_eq(n, 7, "llama3, qwen, llama2, mistral, chatml, phi3 and gemma have fixtures");
    cr_expect_null(mt_chat_builtin_source("vicuna"));
    cJSON_Delete(manifest);
}

/* ---- which template a tokenizer folder gets ---- */

/* A tokenizer folder: tiny_bytelevel.json with the added tokens `added`
 * (NULL-terminated) and, when not NULL, tokenizer_config.json `config` and
 * chat_template.jinja `jinja`. Returns the tokenizer.json path. */
static char *tokenizer_dir(const char *dir, const char *const *added, const char *config,
                           const char *jinja) {
    char *src = mt_path_join(mt_test_fixtures_dir(), "tokenizer/tiny_bytelevel.json"), *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(src, &buf, &len, &err), 0, "%s", err.msg);
    cJSON *t = cJSON_Parse(buf);
    cJSON *list = cJSON_GetObjectItem(t, "added_tokens");
    for (int i = 0; added && added[i]; i++) {
        cJSON *a = cJSON_Duplicate(cJSON_GetArrayItem(list, 0), 1);
        cJSON_ReplaceItemInObject(a, "content", cJSON_CreateString(added[i]));
        cJSON_ReplaceItemInObject(a, "id", cJSON_CreateNumber(700 + i));
        cJSON_AddItemToArray(list, a);
    }
    char *out = mt_path_join(dir, "tokenizer.json"), *js = cJSON_PrintUnformatted(t);
    FILE *f = fopen(out, "w");
    fputs(js, f);
    fclose(f);
    const char *names[] = {"tokenizer_config.json", "chat_template.jinja"}, *texts[] = {config, jinja};
    for (int k = 0; k < 2; k++) {
        char *p = mt_path_join(dir, names[k]);
        if (texts[k]) {
            f = fopen(p, "w");
            fputs(texts[k], f);
            fclose(f);
        } else {
            remove(p);
        }
        free(p);
    }
    free(js), free(buf), free(src);
    cJSON_Delete(t);
    return out;
}

/* Opens the template `choice` names for the tokenizer at path. */
static mt_chat_template *open_for(const char *path, const char *choice, mt_error *err) {
    mt_tokenizer *tok = mt_tokenizer_load(path, err);
    cr_assert(tok, "%s", err->msg);
    mt_chat_template *t = mt_chat_template_open(choice, tok, err);
    mt_tokenizer_free(tok);
    return t;
}

static char *render_line(const mt_chat_template *t, const char *line) {
    mt_jpool pool = {0};
    mt_chat_text r = {0};
    mt_chat_conv c;
    mt_error err = {{0}};
    cr_assert_eq(mt_chat_conv_from_json(&pool, line, strlen(line), &c, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_chat_render(t, &c, false, &pool, NULL, &r, &err), 0, "%s", err.msg);
    char *s = strdup(r.out.text.p);
    mt_chat_text_free(&r);
    mt_jpool_free(&pool);
    return s;
}

Test(chat, a_tokenizer_folder_gives_its_template) {
    char *dir = mt_test_tmpdir();
    mt_error err = {{0}};
    const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}";
    const char *tools = "{\"tools\": [{\"type\": \"function\"}], \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    // A template string, and the special tokens as strings or {"content": ...}.
    char *p = tokenizer_dir(dir, NULL, "{\"bos_token\": {\"content\": \"<|bos|>\"}, \"eos_token\": \"<|eos|>\", "
                            "\"chat_template\": \"{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}\"}", NULL);
    mt_chat_template *t = open_for(p, "auto", &err);
    cr_assert(t, "%s", err.msg);
    cr_expect_str_eq(mt_chat_template_name(t), "model");
    cr_expect(!mt_chat_template_is_builtin(t));
    char *s = render_line(t, line);
    cr_expect_str_eq(s, "<|bos|>user:hi<|eos|>assistant:yo<|eos|>");
    free(s);
    mt_chat_template_free(t);
    // The list of named templates: "default", and "tool_use" for a conversation with tools.
    free(p);
    p = tokenizer_dir(dir, NULL, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"{% for m in messages %}tools!{% endfor %}\"}, "
                      "{\"name\": \"default\", \"template\": \"{% for m in messages %}plain{% endfor %}\"}]}", NULL);
    t = open_for(p, NULL, &err);
    cr_assert(t, "%s", err.msg);
    s = render_line(t, line);
    cr_expect_str_eq(s, "plainplain");
    free(s);
    s = render_line(t, tools);
    cr_expect_str_eq(s, "tools!");
    free(s);
    mt_chat_template_free(t);
    // chat_template.jinja comes before the config's template, as in transformers.
    free(p);
    p = tokenizer_dir(dir, NULL, "{\"chat_template\": \"config\"}", "{% for m in messages %}file{% endfor %}\n");
    t = open_for(p, "auto", &err);
    cr_assert(t, "%s", err.msg);
    s = render_line(t, line);
    cr_expect_str_eq(s, "filefile", "one trailing newline is dropped, as jinja2 does");
    free(s);
    mt_chat_template_free(t);
    // A built-in by name, whatever the model has.
    const char *im[] = {"<|im_start|>", "<|im_end|>", NULL};
    free(p);
    p = tokenizer_dir(dir, im, "{\"chat_template\": \"config\"}", NULL);
    t = open_for(p, "chatml", &err);
    cr_assert(t, "%s", err.msg);
    cr_expect(mt_chat_template_is_builtin(t) && !strcmp(mt_chat_template_name(t), "chatml"));
    s = render_line(t, line);
    cr_expect_str_eq(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n");
    free(s);
    mt_chat_template_free(t);
    // No template: the built-in the special tokens suggest.
    free(p);
    p = tokenizer_dir(dir, im, NULL, NULL);
    t = open_for(p, "auto", &err);
    cr_assert(t, "%s", err.msg);
    cr_expect_str_eq(mt_chat_template_name(t), "qwen");
    mt_chat_template_free(t);
    const char *l3[] = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", NULL};
    free(p);
    p = tokenizer_dir(dir, l3, NULL, NULL);
    t = open_for(p, "auto", &err);
    cr_assert(t, "%s", err.msg);
    cr_expect_str_eq(mt_chat_template_name(t), "llama3");
    s = render_line(t, line);
    cr_expect_str_eq(s, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>");
    free(s);
    mt_chat_template_free(t);
    // Phi-3's turn tokens: phi3, with its BOS and EOS when the tokenizer names none.
    const char *phi[] = {"<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>", NULL};
    free(p);
    p = tokenizer_dir(dir, phi, NULL, NULL);
    t = open_for(p, "auto", &err);
    cr_assert(t, "%s", err.msg);
    cr_expect_str_eq(mt_chat_template_name(t), "phi3");
    s = render_line(t, line);
    cr_expect_str_eq(s, "<|user|>\nhi<|end|>\n<|assistant|>\nyo<|end|>\n<|endoftext|>");
    free(s);
    mt_chat_template_free(t);
    const char *gm[] = {"<bos>", "<start_of_turn>", "<end_of_turn>", NULL};
    free(p);
    p = tokenizer_dir(dir, gm, NULL, NULL);
    t = open_for(p, "auto", &err);
    cr_assert(t, "%s", err.msg);
    cr_expect_str_eq(mt_chat_template_name(t), "gemma");
    s = render_line(t, line);
    cr_expect_str_eq(s, "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo"
                        "<end_of_turn>\n");
    free(s);
    mt_chat_template_free(t);
    // What cannot be used is an error naming what it needs.
    free(p);
    p = tokenizer_dir(dir, NULL, NULL, NULL);
    cr_expect(!open_for(p, "auto", &err));
    cr_expect(strstr(err.msg, "chat template llama2 needs the token <s>, which the tokenizer lacks") &&
              strstr(err.msg, "--chat-template"), "%s", err.msg);
    cr_expect(!open_for(p, "vicuna", &err));
    cr_expect(strstr(err.msg, "unknown chat template 'vicuna'") && strstr(err.msg, "chatml"), "%s", err.msg);
    free(p);
    p = tokenizer_dir(dir, NULL, "{\"chat_template\": \"{% for m in messages %}\\n{% include 'x' %}{% endfor %}\"}", NULL);
    cr_expect(!open_for(p, "auto", &err));
    cr_expect(strstr(err.msg, "tokenizer_config.json chat_template:2:4: unsupported tag 'include'") &&
              strstr(err.msg, "pass --chat-template with a built-in"), "%s", err.msg);
    free(p);
    mt_test_rmtree(dir);
    free(dir);
}

/* A template that renders no assistant turn inside a loop over the
 * messages (and has no generation blocks) cannot say what to train on. */
Test(chat, a_template_without_turns_is_an_error_naming_the_fix) {
    mt_error err = {{0}};
    mt_chat_template *t = mt_chat_template_new("t.jinja", "{{ messages | map(attribute='content') | join(' ') }}", NULL, NULL, &err);
    cr_assert(t, "%s", err.msg);
    const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}";
    mt_jpool pool = {0};
    mt_chat_text r = {0};
    mt_chat_conv c;
    cr_assert_eq(mt_chat_conv_from_json(&pool, line, strlen(line), &c, &err), 0, "%s", err.msg);
    cr_expect_eq(mt_chat_render(t, &c, false, &pool, NULL, &r, &err), -1);
    cr_expect(strstr(err.msg, "t.jinja: messages[1] (an assistant message) is not rendered inside a loop") &&
              strstr(err.msg, "{% generation %}"), "%s", err.msg);
    // Lines the conversation reader refuses.
    struct { const char *line, *want; } bad[] = {
        {"{\"messages\": [{\"role\": \"assistant\"}]}", "field \"content\" of messages[0] is missing"},
        {"{\"messages\": [{\"role\": 3, \"content\": \"x\"}]}", "field \"role\" of messages[0] is not a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "\"content\" of messages[0] is not a string"},
        {"{\"messages\": [], \"x\": 1}", "\"messages\" is empty"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "field \"tools\" is not an array"},
        {"[1]", "not a JSON object"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]", "not valid JSON at byte"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mt_jpool_reset(&pool);
        cr_expect_eq(mt_chat_conv_from_json(&pool, bad[i].line, strlen(bad[i].line), &c, &err), -1, "%s", bad[i].line);
        cr_expect(strstr(err.msg, bad[i].want), "%s: %s", bad[i].line, err.msg);
    }
    // An assistant message that calls tools needs no content.
    const char *calls = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"f\"}}]}]}";
    mt_jpool_reset(&pool);
    cr_expect_eq(mt_chat_conv_from_json(&pool, calls, strlen(calls), &c, &err), 0, "%s", err.msg);
    cr_expect_eq(mt_jv_dict_gets(c.messages.l->v[1], "content").type, MT_JV_UNDEF, "null keys are dropped");
    mt_chat_text_free(&r);
    mt_jpool_free(&pool);
    mt_chat_template_free(t);
}

/* ---- the template of a trained model ---- */

static void train(const char *model, const char *data, const char *out, const char *more) {
    mt_train_config tc;
    mt_error err;
    cr_assert_eq(mt_test_train_args(&tc, &err, "train --out %s --sample-tokens 0 --log-every 1000 "
                                    "--model %s --data %s --seq-len 32 --batch-size 2 "
                                    "--micro-batches 1 --steps 2 --device cpu %s", out, model,
                                    data, more), 0, "%s", err.msg);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
}

/* The chat_template of dir/tokenizer_config.json (malloc'd), or NULL. */
static char *saved_template(const char *dir, cJSON **cfg) {
    char *p = mt_path_join(dir, "tokenizer_config.json"), *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(p, &buf, &len, &err), 0, "%s", err.msg);
    *cfg = cJSON_Parse(buf);
    cr_assert(*cfg, "%s is not JSON", p);
    const cJSON *ct = cJSON_GetObjectItem(*cfg, "chat_template");
    free(buf), free(p);
    return cJSON_IsString(ct) ? strdup(ct->valuestring) : NULL;
}

/* The tokens and loss flags of data under the tokenizer of dir. */
static mt_dataset *tokens_of(const char *data, const char *dir, mt_tokenizer **tok) {
    char *p = mt_path_join(dir, "tokenizer.json");
    mt_error err = {{0}};
    *tok = mt_tokenizer_load(p, &err);
    cr_assert(*tok, "%s", err.msg);
    mt_data_opts o = {.path = data, .format = "chat", .chat_template = "auto", .epochs = 1};
    mt_dataset *d = mt_dataset_open(&o, *tok, (int64_t)mt_tokenizer_vocab_size(*tok), &err);
    cr_assert(d, "%s", err.msg);
    free(p);
    return d;
}

static void same_corpus(mt_dataset *a, mt_dataset *b) {
    const mt_mtok *x = mt_dataset_corpus(a), *y = mt_dataset_corpus(b);
    cr_assert_eq(x->n_tokens, y->n_tokens);
    cr_expect_eq(x->n_trainable, y->n_trainable);
    for (uint64_t i = 0; i < x->n_tokens; i++)
        cr_assert(mt_mtok_token(x, i) == mt_mtok_token(y, i) && mt_mtok_trainable(x, i) == mt_mtok_trainable(y, i),
                  "token %llu", (unsigned long long)i);
}

/* A model whose template is Zephyr's is trained with it and saved with it,
 * so the saved model renders (and tokenizes) its data as it was trained;
 * a built-in chosen instead is written into the saved tokenizer_config.json
 * in place of the model's, the other keys kept. */
Test(chat, a_trained_model_keeps_the_template_it_was_trained_with, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), *zephyr = read_template("zephyr");
    char tokdir[512], model[512], data[512], out[512], out2[512];
    snprintf(tokdir, sizeof tokdir, "%s/tok", dir);
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(data, sizeof data, "%s/chat.jsonl", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(out2, sizeof out2, "%s/run2", dir);
    mkdir(tokdir, 0755);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "eos_token", "<|eos|>");
    cJSON_AddStringToObject(cfg, "chat_template", zephyr);
    cJSON_AddNumberToObject(cfg, "model_max_length", 1e30);
    char *cfg_text = cJSON_Print(cfg);
    const char *im[] = {"<|im_start|>", "<|im_end|>", NULL};
    char *tp = tokenizer_dir(tokdir, im, cfg_text, NULL);
    mt_model_shape shape;
    mt_model_shape_defaults(&shape);
    shape.hidden = 32, shape.layers = 1, shape.heads = 2, shape.kv_heads = 2, shape.ffn = 64, shape.max_positions = 64;
    cr_assert_eq(mt_model_init(model, tp, &shape, NULL), 0, "%s", mt_last_error());
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 24; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                   "{\"role\": \"user\", \"content\": \"%d plus %d?\"}, {\"role\": \"assistant\", \"content\": \"%d\"}]}\n",
                i, i, 2 * i);
    fclose(f);

    train(model, data, out, "");
    char saved[600];
    snprintf(saved, sizeof saved, "%s/model", out);
    cJSON *scfg;
    char *st = saved_template(saved, &scfg);
    cr_assert(st && !strcmp(st, zephyr), "the saved model keeps Zephyr's template");
    free(st);
    cJSON_Delete(scfg);
    mt_tokenizer *ta, *tb;
    mt_dataset *a = tokens_of(data, model, &ta), *b = tokens_of(data, saved, &tb);
    cr_expect_str_eq(mt_dataset_stats(b).chat_template, "model");
    same_corpus(a, b);
    mt_dataset_free(b), mt_tokenizer_free(tb);

    train(model, data, out2, "--chat-template chatml");
    snprintf(saved, sizeof saved, "%s/model", out2);
    st = saved_template(saved, &scfg);
    cr_expect(st && !strcmp(st, mt_chat_builtin_source("chatml")), "the built-in replaces the model's template");
    cr_expect_str_eq(cJSON_GetObjectItem(scfg, "eos_token")->valuestring, "<|eos|>");
    free(st);
    cJSON_Delete(scfg);
    char *raw, *p = mt_path_join(saved, "tokenizer_config.json");
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(p, &raw, &len, &err), 0);
    cr_expect(strstr(raw, "\"model_max_length\":\t1e+30") || strstr(raw, "\"model_max_length\": 1e+30"),
              "the other keys keep their text: %s", raw);
    free(raw), free(p);
    mt_dataset *c = tokens_of(data, saved, &tb);
    cr_expect_str_eq(mt_dataset_stats(c).chat_template, "model");
    mt_data_opts o = {.path = data, .format = "chat", .chat_template = "chatml", .epochs = 1};
    mt_dataset *d = mt_dataset_open(&o, ta, (int64_t)mt_tokenizer_vocab_size(ta), &err);
    cr_assert(d, "%s", err.msg);
    same_corpus(c, d);
    mt_dataset_free(a), mt_dataset_free(c), mt_dataset_free(d);
    mt_tokenizer_free(ta), mt_tokenizer_free(tb);
    cJSON_Delete(cfg);
    free(cfg_text), free(tp), free(zephyr);
    mt_test_rmtree(dir);
    free(dir);
}
