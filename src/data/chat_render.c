/* A conversation rendered with its chat template, and the bytes that carry
 * the loss (chat.h says how they are found). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat.h"
#include "util/mem.h"

/* ---- reading a conversation ---- */

static bool str_eq(mt_jv v, const char *s) {
    return v.type == MT_JV_STR && v.s.n == strlen(s) && !memcmp(v.s.p, s, v.s.n);
}

static bool known_role(mt_jv role) {
    static const char *const roles[] = {"system", "user", "assistant", "tool", "ipython", "developer", NULL};
    for (size_t i = 0; roles[i]; i++)
        if (str_eq(role, roles[i])) return true;
    return false;
}

/* Checks message i: a string role chat templates know, and content (a
 * string or a list of parts) unless an assistant message calls tools. */
static int check_message(mt_jv m, const char *what, size_t i, mt_error *err) {
    if (m.type != MT_JV_DICT) return mt_errorf(err, "%s[%zu] is not an object", what, i);
    mt_jv role = mt_jv_dict_gets(m, "role"), content = mt_jv_dict_gets(m, "content");
    if (role.type == MT_JV_UNDEF) return mt_errorf(err, "field \"role\" of %s[%zu] is missing", what, i);
    if (role.type != MT_JV_STR) return mt_errorf(err, "field \"role\" of %s[%zu] is not a string", what, i);
    if (!known_role(role))
        return mt_errorf(err, "%s[%zu].role is '%.*s': use system, user, assistant or tool "
                         "(the roles chat templates render; also ipython, developer)",
                         what, i, (int)(role.s.n < 64 ? role.s.n : 64), role.s.p);
    bool calls = mt_jv_truthy(mt_jv_dict_gets(m, "tool_calls"));
    if (content.type == MT_JV_UNDEF || content.type == MT_JV_NONE) {
        if (str_eq(role, "assistant") && calls) return 0;
        return mt_errorf(err, "field \"content\" of %s[%zu] is missing", what, i);
    }
    if (content.type != MT_JV_STR && content.type != MT_JV_LIST)
        return mt_errorf(err, "field \"content\" of %s[%zu] is not a string (or a list of parts)",
                         what, i);
    return 0;
}

/* A copy of message m as apply_chat_template hands it to the template:
 * keys whose value is null dropped, and the reasoning under the names
 * templates read ({"thinking": r, **m, "reasoning_content": r}). */
static mt_jv normalised(mt_jpool *p, mt_jv m, int32_t index) {
    static const char *const reasoning_keys[] = {"reasoning_content", "thinking", "reasoning"};
    mt_jv r = mt_jv_undef(NULL), out = mt_jv_dict_new(p, m.d->n + 2);
    for (int k = 0; k < 3 && r.type == MT_JV_UNDEF; k++) {
        mt_jv v = mt_jv_dict_gets(m, reasoning_keys[k]);
        if (v.type != MT_JV_UNDEF && v.type != MT_JV_NONE) r = v;
    }
    if (r.type != MT_JV_UNDEF) mt_jv_dict_set(p, out, mt_jv_cstr("thinking"), r);
    for (size_t i = 0; i < m.d->n; i++)
        if (m.d->v[i].type != MT_JV_NONE) mt_jv_dict_set(p, out, m.d->k[i], m.d->v[i]);
    if (r.type != MT_JV_UNDEF) mt_jv_dict_set(p, out, mt_jv_cstr("reasoning_content"), r);
    out.d->msg = index;
    return out;
}

/* An optional list field: None when absent or null. A string holding a
 * JSON list is read as that list, as TRL reads "tools" (LLaMA-Factory's
 * sharegpt files keep them so). */
static int list_field(mt_jpool *pool, mt_jv root, const char *key, mt_jv *out, mt_error *err) {
    *out = mt_jv_dict_gets(root, key);
    if (out->type == MT_JV_UNDEF || out->type == MT_JV_NONE) return *out = mt_jv_none(), 0;
    mt_error e;
    if (out->type == MT_JV_STR && mt_jv_from_json(pool, out->s.p, out->s.n, out, &e))
        return mt_errorf(err, "field \"%s\" is a string but not JSON: give an array", key);
    if (out->type != MT_JV_LIST) return mt_errorf(err, "field \"%s\" is not an array", key);
    return 0;
}

int mt_chat_conv_from_messages(mt_jpool *pool, mt_jv root, mt_jv msgs, const char *what,
                               mt_chat_conv *c, mt_error *err) {
    if (msgs.type == MT_JV_UNDEF) return mt_errorf(err, "field \"%s\" is missing", what);
    if (msgs.type != MT_JV_LIST) return mt_errorf(err, "field \"%s\" is not an array", what);
    if (msgs.l->n == 0) return mt_errorf(err, "\"%s\" is empty: a conversation needs a message", what);
    c->messages = mt_jv_list_new(pool, msgs.l->n);
    for (size_t i = 0; i < msgs.l->n; i++) {
        if (check_message(msgs.l->v[i], what, i, err)) return -1;
        mt_jv_list_push(pool, c->messages, normalised(pool, msgs.l->v[i], (int32_t)i));
    }
    if (list_field(pool, root, "tools", &c->tools, err) ||
        list_field(pool, root, "documents", &c->documents, err))
        return -1;
    c->kwargs = mt_jv_dict_gets(root, "chat_template_kwargs");
    if (c->kwargs.type != MT_JV_UNDEF && c->kwargs.type != MT_JV_DICT)
        return mt_errorf(err, "field \"chat_template_kwargs\" is not an object");
    return 0;
}

int mt_chat_conv_from_json(mt_jpool *pool, const char *line, size_t len, mt_chat_conv *c,
                           mt_error *err) {
    mt_jv root;
    if (mt_jv_from_json(pool, line, len, &root, err)) return -1;
    if (root.type != MT_JV_DICT) return mt_errorf(err, "not a JSON object");
    return mt_chat_conv_from_messages(pool, root, mt_jv_dict_gets(root, "messages"), "messages", c, err);
}

/* ---- rendering ---- */

void mt_chat_text_free(mt_chat_text *r) {
    mt_jinja_out_free(&r->out);
    mt_jinja_out_free(&r->scratch);
    free(r->spans);
    memset(r, 0, sizeof *r);
}

enum { MAX_VARS = 64 };

/* Renders messages[0..n) of c into out. */
static int render(const mt_chat_template *t, const mt_chat_conv *c, size_t n, bool gen,
                  mt_jpool *pool, const mt_jinja_opts *opts, mt_jinja_out *out, mt_error *err) {
    mt_jinja_var vars[MAX_VARS];
    size_t nv = 0;
    for (int i = 0; i < MT_CHAT_N_SPECIAL; i++) {
        const char *s = mt_chat_template_special(t, i);
        if (s) vars[nv++] = (mt_jinja_var){mt_chat_special_names[i], mt_jv_cstr(s)};
    }
    for (size_t i = 0; c->kwargs.type == MT_JV_DICT && i < c->kwargs.d->n && nv < MAX_VARS - 4; i++) {
        mt_jv k = c->kwargs.d->k[i];
        if (k.type == MT_JV_STR)
            vars[nv++] = (mt_jinja_var){mt_jpool_strdup(pool, k.s.p, k.s.n), c->kwargs.d->v[i]};
    }
    mt_jv msgs = c->messages;
    if (n < msgs.l->n) {
        msgs = mt_jv_list_new(pool, n);
        for (size_t i = 0; i < n; i++) mt_jv_list_push(pool, msgs, c->messages.l->v[i]);
    }
    vars[nv++] = (mt_jinja_var){"messages", msgs};
    vars[nv++] = (mt_jinja_var){"tools", c->tools};
    vars[nv++] = (mt_jinja_var){"documents", c->documents};
    vars[nv++] = (mt_jinja_var){"add_generation_prompt", mt_jv_bool(gen)};
    const mt_jinja *j = mt_chat_template_jinja(t, c->tools.type == MT_JV_LIST);
    return mt_jinja_render(j, vars, nv, pool, opts, out, err);
}

static void add_span(mt_chat_text *r, size_t a, size_t b) {
    if (b <= a) return;
    if (r->n_spans && r->spans[r->n_spans - 1].b == a) {
        r->spans[r->n_spans - 1].b = b;
        return;
    }
    if (r->n_spans == r->spans_cap) {
        r->spans_cap = r->spans_cap ? r->spans_cap * 2 : 8;
        r->spans = mt_realloc_or_die(r->spans, r->spans_cap * sizeof *r->spans);
    }
    r->spans[r->n_spans++] = (mt_tok_span){a, b};
}

static size_t run_end(const mt_jinja_out *o, size_t i) {
    return i + 1 < o->n_runs ? o->runs[i + 1].off : o->text.n;
}

/* The bytes the loop iteration over message k wrote: false when none. */
static bool turn_bytes(const mt_jinja_out *o, int32_t k, size_t *a, size_t *b, size_t *last_run) {
    bool found = false;
    for (size_t i = 0; i < o->n_runs; i++) {
        if (o->runs[i].msg != k) continue;
        if (!found) *a = o->runs[i].off;
        *b = run_end(o, i);
        *last_run = i;
        found = true;
    }
    return found;
}

static size_t common_prefix(const char *x, size_t nx, const char *y, size_t ny) {
    size_t i = 0;
    while (i < nx && i < ny && x[i] == y[i]) i++;
    return i;
}

/* Where assistant turn k (bytes [a, b) of the text) starts: after the
 * prompt it is generated from, when the template renders that prompt as a
 * prefix of the whole text; else after the part of the turn that equals
 * the generation prompt. */
static size_t turn_start(const mt_chat_template *t, const mt_chat_conv *c, size_t k, size_t a,
                         size_t b, mt_jpool *pool, const mt_jinja_opts *opts, mt_chat_text *r) {
    mt_error e;
    const mt_jbuf *full = &r->out.text;
    if (render(t, c, k, true, pool, opts, &r->scratch, &e)) return a;
    size_t np = r->scratch.text.n;
    if (np >= a && np < b && !memcmp(full->p, r->scratch.text.p, np)) return np;
    char *prompt = mt_jpool_strdup(pool, r->scratch.text.p, np);
    if (render(t, c, k, false, pool, opts, &r->scratch, &e)) return a;
    size_t n0 = r->scratch.text.n;
    if (n0 > np || memcmp(prompt, r->scratch.text.p, n0)) return a;
    return a + common_prefix(full->p + a, b - a, prompt + n0, np - n0);
}

static int derive_spans(const mt_chat_template *t, const mt_chat_conv *c, const mt_jinja *j,
                        mt_jpool *pool, const mt_jinja_opts *opts, mt_chat_text *r, mt_error *err) {
    const mt_jinja_out *o = &r->out;
    const char *eos = mt_chat_template_special(t, 1);
    for (size_t k = 0; k < c->messages.l->n; k++) {
        mt_jv m = c->messages.l->v[k];
        if (!str_eq(mt_jv_dict_gets(m, "role"), "assistant")) continue;
        size_t a = 0, b = 0, last = 0;
        if (!turn_bytes(o, (int32_t)k, &a, &b, &last))
            return mt_errorf(err, "%s: messages[%zu] (an assistant message) is not rendered inside a "
                             "loop over the messages, so the text to train on cannot be told; add "
                             "{%% generation %%} blocks around the assistant turns to the template, or "
                             "pass --chat-template with a built-in (%s)",
                             mt_jinja_name(j), k, mt_chat_builtin_list());
        // An EOS right after the last iteration ends the last turn.
        if (eos && last + 1 < o->n_runs && o->runs[last + 1].msg < 0 && b + strlen(eos) <= o->text.n &&
            !memcmp(o->text.p + b, eos, strlen(eos)))
            b += strlen(eos);
        add_span(r, turn_start(t, c, k, a, b, pool, opts, r), b);
    }
    return 0;
}

int mt_chat_render(const mt_chat_template *t, const mt_chat_conv *c, bool add_generation_prompt,
                   mt_jpool *pool, const mt_jinja_opts *opts, mt_chat_text *r, mt_error *err) {
    r->n_spans = 0;
    if (render(t, c, c->messages.l->n, add_generation_prompt, pool, opts, &r->out, err)) return -1;
    const mt_jinja *j = mt_chat_template_jinja(t, c->tools.type == MT_JV_LIST);
    if (!mt_jinja_has_generation(j)) return derive_spans(t, c, j, pool, opts, r, err);
    for (size_t i = 0; i < r->out.n_runs; i++)
        if (r->out.runs[i].gen) add_span(r, r->out.runs[i].off, run_end(&r->out, i));
    return 0;
}

char *mt_chat_prompt(const mt_tokenizer *tok, const char *choice, const char *messages,
                     mt_error *err) {
    mt_jpool pool = {0};
    mt_chat_text r = {0};
    mt_chat_conv c;
    mt_jv root;
    char *out = NULL;
    mt_chat_template *t = mt_chat_template_open(choice, tok, err);
    if (!t) return NULL;
    if (mt_jv_from_json(&pool, messages, strlen(messages), &root, err)) {
        mt_error_prefix(err, "messages: ");
    } else if (root.type != MT_JV_LIST && root.type != MT_JV_DICT) {
        mt_errorf(err, "messages: give a JSON list of {\"role\": ..., \"content\": ...} messages");
    } else {
        mt_jv msgs = root.type == MT_JV_LIST ? root : mt_jv_dict_gets(root, "messages");
        mt_jv top = root.type == MT_JV_DICT ? root : mt_jv_dict_new(&pool, 0);
        if (mt_chat_conv_from_messages(&pool, top, msgs, "messages", &c, err) == 0 &&
            mt_chat_render(t, &c, true, &pool, NULL, &r, err) == 0) {
            out = mt_malloc_or_die(r.out.text.n + 1);
            memcpy(out, r.out.text.p, r.out.text.n);
            out[r.out.text.n] = 0;
        }
    }
    mt_chat_text_free(&r);
    mt_jpool_free(&pool);
    mt_chat_template_free(t);
    return out;
}

size_t mt_chat_turn_ends(const mt_tokenizer *tok, int32_t *ids, size_t cap) {
    static const char *const ends[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                       "<|endoftext|>", "<|end_of_text|>", "</s>",
                                       "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof ends / sizeof *ends && n < cap; i++) {
        int32_t id = mt_tokenizer_token_id(tok, ends[i]);
        if (id >= 0) ids[n++] = id;
    }
    return n;
}

int mt_chat_render_completion(const mt_chat_template *t, const mt_chat_conv *c, size_t n_prompt,
                              mt_jpool *pool, const mt_jinja_opts *opts, mt_chat_text *r,
                              mt_error *err) {
    r->n_spans = 0;
    if (render(t, c, c->messages.l->n, false, pool, opts, &r->out, err) ||
        render(t, c, n_prompt, true, pool, opts, &r->scratch, err))
        return -1;
    const mt_jbuf *full = &r->out.text, *prompt = &r->scratch.text;
    add_span(r, common_prefix(full->p, full->n, prompt->p, prompt->n), full->n);
    return 0;
}
