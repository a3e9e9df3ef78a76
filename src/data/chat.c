/* Chat templates of the model families, written out in C. Each renderer
 * mirrors its Jinja template statement by statement (the templates are
 * quoted in docs/data.md); whitespace stripping follows Python's str.strip,
 * which Jinja's trim and .strip() call. */
#include "data/chat.h"

#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

void mt_chat_out_free(mt_chat_out *o) {
    free(o->text);
    free(o->pieces);
    memset(o, 0, sizeof *o);
}

static const char *const names[] = {"llama3", "qwen", "llama2", "mistral"};

int mt_chat_template_parse(const char *name, mt_chat_template *t, mt_error *err) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) {
            *t = (mt_chat_template)i;
            return 0;
        }
    return mt_errorf(err, "unknown chat template '%s': use auto, llama3, qwen, llama2 or mistral",
                     name);
}

const char *mt_chat_template_name(mt_chat_template t) { return names[t]; }

mt_chat_template mt_chat_template_detect(const mt_tokenizer *tok) {
    if (mt_tokenizer_token_id(tok, "<|start_header_id|>") >= 0) return MT_CHAT_LLAMA3;
    if (mt_tokenizer_token_id(tok, "<|im_start|>") >= 0) return MT_CHAT_QWEN;
    return MT_CHAT_LLAMA2;
}

int mt_chat_template_check(mt_chat_template t, const mt_tokenizer *tok, mt_error *err) {
    static const char *const need[4][4] = {
        {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
        {"<|im_start|>", "<|im_end|>", NULL, NULL},
        {"<s>", "</s>", NULL, NULL},
        {"<s>", "</s>", NULL, NULL},
    };
    for (int i = 0; i < 4 && need[t][i]; i++)
        if (mt_tokenizer_token_id(tok, need[t][i]) < 0)
            return mt_errorf(err,
                             "chat template %s needs the token %s, which the tokenizer lacks: "
                             "pass the --chat-template of the model family",
                             names[t], need[t][i]);
    return 0;
}

/* ---- output ---- */

static void emit(mt_chat_out *o, const char *s, size_t len, bool special, bool train) {
    if (len == 0) return;
    if (o->len + len + 1 > o->cap) {
        o->cap = (o->len + len + 1) * 2;
        o->text = mt_realloc_or_die(o->text, o->cap);
    }
    if (o->n_pieces == o->pieces_cap) {
        o->pieces_cap = o->pieces_cap ? o->pieces_cap * 2 : 16;
        o->pieces = mt_realloc_or_die(o->pieces, o->pieces_cap * sizeof *o->pieces);
    }
    o->pieces[o->n_pieces++] = (mt_chat_piece){o->len, len, special, train};
    memcpy(o->text + o->len, s, len);
    o->len += len;
    o->text[o->len] = 0;
}

static void text(mt_chat_out *o, const char *s, bool train) { emit(o, s, strlen(s), false, train); }
static void special(mt_chat_out *o, const char *s, bool train) {
    emit(o, s, strlen(s), true, train);
}

/* ---- Python str.strip() ---- */

/* Decodes one UTF-8 code point at s[i] (length in *n; invalid bytes are one
 * non-space unit). */
static unsigned decode_cp(const unsigned char *s, size_t len, size_t i, size_t *n) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 1;
    if (i + k > len) k = 1;
    *n = k;
    if (k == 1) return c < 0x80 ? c : 0xFFFFFFFF;
    unsigned cp = c & (0x7F >> k);
    for (size_t j = 1; j < k; j++) cp = cp << 6 | (s[i + j] & 0x3F);
    return cp;
}

/* str.isspace(): Unicode White_Space plus the ASCII separators 0x1C..0x1F. */
static bool py_isspace(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Strips Python whitespace (chars == NULL) or the bytes of chars from the
 * left and/or right of s[*off..*off+*len). */
static void strip(const char *s, size_t *off, size_t *len, bool left, bool right,
                  const char *chars) {
    const unsigned char *u = (const unsigned char *)s + *off;
    size_t a = 0, b = *len, n;
    while (left && a < b) {
        if (chars ? !strchr(chars, u[a]) : !py_isspace(decode_cp(u, b, a, &n))) break;
        a += chars ? 1 : n;
    }
    while (right && b > a) {
        size_t j = b - 1;
        while (!chars && j > a && (u[j] & 0xC0) == 0x80) j--;  // start of the last code point
        if (chars ? !strchr(chars, u[j]) : !py_isspace(decode_cp(u, b, j, &n))) break;
        b = j;
    }
    *off += a;
    *len = b - a;
}

static void text_stripped(mt_chat_out *o, const char *s, size_t len, bool train) {
    size_t off = 0;
    strip(s, &off, &len, true, true, NULL);
    emit(o, s + off, len, false, train);
}

/* ---- families ---- */

static bool is_role(const mt_chat_msg *m, const char *r) { return !strcmp(m->role, r); }

static void render_llama3(const mt_chat_msg *m, size_t n, mt_chat_out *o) {
    for (size_t i = 0; i < n; i++) {
        bool train = is_role(&m[i], "assistant");
        if (i == 0) special(o, "<|begin_of_text|>", false);
        special(o, "<|start_header_id|>", false);
        text(o, m[i].role, false);
        special(o, "<|end_header_id|>", false);
        text(o, "\n\n", false);
        text_stripped(o, m[i].content, m[i].content_len, train);
        special(o, "<|eot_id|>", train);
    }
    // The shared Llama-3 template always ends with a generation header.
    special(o, "<|start_header_id|>", false);
    text(o, "assistant", false);
    special(o, "<|end_header_id|>", false);
    text(o, "\n\n", false);
}

/* Finds needle in s[0..len): first (last=false) or last occurrence, or NULL. */
static const char *find(const char *s, size_t len, const char *needle, bool last) {
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; i + k <= len; i++)
        if (!memcmp(s + i, needle, k)) {
            hit = s + i;
            if (!last) break;
        }
    return hit;
}

static bool is_tool_response(const mt_chat_msg *m) {
    const char *a = "<tool_response>", *b = "</tool_response>";
    size_t la = strlen(a), lb = strlen(b), n = m->content_len;
    return n >= la && n >= lb && !memcmp(m->content, a, la) && !memcmp(m->content + n - lb, b, lb);
}

/* after: the turn follows the last user query; last: it ends the conversation. */
static void render_qwen_assistant(const mt_chat_msg *m, bool after, bool last, mt_chat_out *o) {
    const char *c = m->content;
    size_t c_off = 0, c_len = m->content_len, r_off = 0, r_len = 0;
    const char *close = find(c, m->content_len, "</think>", true);
    if (close) {  // reasoning inline in the content: split it out as the template does
        c_off = (size_t)(close - c) + strlen("</think>");
        c_len = m->content_len - c_off;
        strip(c, &c_off, &c_len, true, false, "\n");
        r_len = (size_t)(find(c, m->content_len, "</think>", false) - c);
        strip(c, &r_off, &r_len, false, true, "\n");
        const char *open = find(c, r_len, "<think>", true);
        if (open) {
            r_off = (size_t)(open - c) + strlen("<think>");
            r_len -= r_off;
        }
        strip(c, &r_off, &r_len, true, false, "\n");
    }
    special(o, "<|im_start|>", false);
    text(o, "assistant\n", false);
    if (after && (last || r_len > 0)) {
        strip(c, &r_off, &r_len, true, true, "\n");
        text(o, "<think>\n", true);
        emit(o, c + r_off, r_len, false, true);
        text(o, "\n</think>\n\n", true);
        strip(c, &c_off, &c_len, true, false, "\n");
    }
    emit(o, c + c_off, c_len, false, true);
    special(o, "<|im_end|>", true);
    text(o, "\n", false);
}

static void render_qwen(const mt_chat_msg *m, size_t n, mt_chat_out *o) {
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;)
        if (is_role(&m[k], "user") && !is_tool_response(&m[k])) {
            last_query = k;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        if (is_role(&m[i], "assistant")) {
            render_qwen_assistant(&m[i], i > last_query, i == n - 1, o);
        } else {
            special(o, "<|im_start|>", false);
            text(o, m[i].role, false);
            text(o, "\n", false);
            emit(o, m[i].content, m[i].content_len, false, false);
            special(o, "<|im_end|>", false);
            text(o, "\n", false);
        }
    }
}

static int check_alternation(const mt_chat_msg *m, size_t n, mt_error *err) {
    for (size_t i = 0; i < n; i++)
        if (is_role(&m[i], "user") != (i % 2 == 0) || is_role(&m[i], "system"))
            return mt_errorf(err,
                             "messages[%zu] has role '%s': this chat template needs "
                             "user/assistant turns alternating, starting with user%s",
                             i, m[i].role, is_role(&m[i], "system") ? " (system only first)" : "");
    return 0;
}

static int render_llama2(const mt_chat_msg *m, size_t n, mt_chat_out *o, mt_error *err) {
    const mt_chat_msg *sys = NULL;
    if (is_role(&m[0], "system")) sys = m++, n--;
    if (n == 0) return mt_errorf(err, "the conversation has no user message");
    if (check_alternation(m, n, err)) return mt_error_prefix(err, "llama2: "), -1;
    char *buf = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        size_t len = m[i].content_len;
        if (i == 0 && sys) {  // '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + content, then strip
            const char *a = "<<SYS>>\n", *b = "\n<</SYS>>\n\n";
            size_t la = strlen(a), lb = strlen(b);
            buf = mt_malloc_or_die(la + sys->content_len + lb + len + 1);
            memcpy(buf, a, la);
            memcpy(buf + la, sys->content, sys->content_len);
            memcpy(buf + la + sys->content_len, b, lb);
            memcpy(buf + la + sys->content_len + lb, c, len);
            c = buf, len += la + sys->content_len + lb;
        }
        if (i % 2 == 0) {
            special(o, "<s>", false);
            text(o, "[INST] ", false);
            text_stripped(o, c, len, false);
            text(o, " [/INST]", false);
        } else {
            text(o, " ", true);
            text_stripped(o, c, len, true);
            text(o, " ", true);
            special(o, "</s>", true);
        }
        free(buf);
        buf = NULL;
    }
    return 0;
}

static int render_mistral(const mt_chat_msg *m, size_t n, mt_chat_out *o, mt_error *err) {
    if (check_alternation(m, n, err)) return mt_error_prefix(err, "mistral: "), -1;
    special(o, "<s>", false);
    for (size_t i = 0; i < n; i++) {
        if (i % 2 == 0) {
            text(o, "[INST] ", false);
            emit(o, m[i].content, m[i].content_len, false, false);
            text(o, " [/INST]", false);
        } else {
            emit(o, m[i].content, m[i].content_len, false, true);
            special(o, "</s>", true);
        }
    }
    return 0;
}

int mt_chat_render(mt_chat_template t, const mt_chat_msg *msgs, size_t n, mt_chat_out *out,
                   mt_error *err) {
    out->len = out->n_pieces = 0;
    if (n == 0) return mt_errorf(err, "\"messages\" is empty: a conversation needs a message");
    for (size_t i = 0; i < n; i++)
        if (!is_role(&msgs[i], "system") && !is_role(&msgs[i], "user") &&
            !is_role(&msgs[i], "assistant"))
            return mt_errorf(err, "messages[%zu].role is '%s': use system, user or assistant", i,
                             msgs[i].role);
    switch (t) {
    case MT_CHAT_LLAMA3: render_llama3(msgs, n, out); return 0;
    case MT_CHAT_QWEN: render_qwen(msgs, n, out); return 0;
    case MT_CHAT_LLAMA2: return render_llama2(msgs, n, out, err);
    case MT_CHAT_MISTRAL: return render_mistral(msgs, n, out, err);
    }
    MT_ASSERT(!"unknown chat template");
    return -1;
}
