/* Chat templates against transformers (tests/fixtures/chat, made by
 * scripts/make_chat_template_fixtures.py from the real templates of
 * templates.json): every template x conversation x add_generation_prompt
 * renders the same bytes as apply_chat_template or fails where it fails;
 * the loss spans equal transformers' assistant masks where the template has
 * {% generation %} blocks, and TRL's training variant's where it has one;
 * every assistant message's content lies in a span and no other message's
 * does; with the real tokenizers the ids and loss flags equal
 * apply_chat_template(tokenize=True, return_assistant_tokens_mask=True).
 * Also: the built-ins are their published templates byte for byte, and
 * which template a tokenizer folder gets. Every comparison is exact. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat.h"
#include "data/dataset.h"
#include "data/tok_spans.h"
#include "io/file.h"
#include "testlib.h"

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
    cr_expect_eq(n, 5, "llama3, qwen, llama2, mistral and chatml have fixtures");
    cr_expect_null(mt_chat_builtin_source("vicuna"));
    cJSON_Delete(manifest);
}
