/* Jinja source -> tokens, as jinja2's lexer with transformers' settings:
 * trim_blocks (a block or comment tag eats one newline after it),
 * lstrip_blocks (whitespace from a line's start up to a block or comment
 * tag is dropped), `-` on a tag strips all whitespace on that side, `+`
 * keeps it. Newlines are normalised to \n and one trailing newline is
 * dropped (keep_trailing_newline off). String literals are decoded as
 * Python's unicode-escape codec does. Also: error positions. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja_internal.h"
#include "data/jinja/jinja_str.h"
#include "util/mem.h"

typedef struct lexer {
    const char *name;
    const char *s;  // normalised source
    size_t len, i;
    mt_jpool *pool;
    mt_jtoks *out;
    mt_error *err;
} lexer;

const char *mt_jinja_where(char *buf, size_t cap, const char *name, const char *src, size_t pos) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && src[i]; i++) {
        if (src[i] == '\n') line++, col = 1;
        else if (((unsigned char)src[i] & 0xC0) != 0x80) col++;
    }
    snprintf(buf, cap, "%s:%zu:%zu", name, line, col);
    return buf;
}

int mt_jx_fail(mt_jexec *x, uint32_t pos, const char *fmt, ...) {
    char msg[768], where[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt_jinja_where(where, sizeof where, x->t->name, x->t->toks.src, pos);
    return mt_errorf(x->err, "%s: %s", where, msg);
}

static int fail(lexer *l, size_t pos, const char *what) {
    char where[256];
    mt_jinja_where(where, sizeof where, l->name, l->s, pos);
    return mt_errorf(l->err, "%s: %s", where, what);
}

static mt_jtok *push(lexer *l, mt_jtok_type type, size_t pos) {
    mt_jtoks *o = l->out;
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 256;
        o->t = mt_realloc_or_die(o->t, o->cap * sizeof *o->t);
    }
    mt_jtok *t = &o->t[o->n++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->pos = (uint32_t)pos;
    return t;
}

/* Python's \s at s[i]: its length, or 0. */
static size_t space_at(const char *s, size_t len, size_t i) {
    size_t n;
    return i < len && mt_jstr_isspace(mt_jstr_cp(s, len, i, &n)) ? n : 0;
}

static void skip_space(lexer *l) {
    size_t n;
    while ((n = space_at(l->s, l->len, l->i))) l->i += n;
}

/* ---- template text ---- */

/* Emits s[a..b) as data after the start tag's whitespace control: sign is
 * '-', '+' or 0; lstrip applies before block and comment tags. */
static void data(lexer *l, size_t a, size_t b, char sign, bool lstrip, bool line_starting) {
    if (sign == '-') {
        size_t off = 0, n = b - a;
        mt_jstr_strip(l->s + a, &off, &n, false, true, NULL, 0);
        b = a + n;
    } else if (sign != '+' && lstrip) {
        size_t lp = a;
        for (size_t i = a; i < b; i++)
            if (l->s[i] == '\n') lp = i + 1;
        if (lp > a || line_starting) {
            size_t i = lp, n;
            while (i < b && (n = space_at(l->s, b, i))) i += n;
            if (i == b) b = lp;  // only whitespace between the line start and the tag
        }
    }
    if (b > a) {
        mt_jtok *t = push(l, MT_JT_DATA, a);
        t->s = l->s + a, t->n = b - a;
    }
}

/* After an end tag: sign '-' strips all whitespace, a plain block or
 * comment end eats one newline (trim_blocks). Returns whether the last
 * character consumed was a newline (the next line starts at l->i). */
static bool after_end(lexer *l, char sign, bool trim) {
    size_t start = l->i;
    if (sign == '-') skip_space(l);
    else if (sign != '+' && trim && l->i < l->len && l->s[l->i] == '\n') l->i++;
    return l->i > start && l->s[l->i - 1] == '\n';
}

/* ---- tokens inside a tag ---- */

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Python's unicode-escape decoding of s[0..n) into b. */
static int unescape(lexer *l, size_t pos, const char *s, size_t n, mt_jbuf *b) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            mt_jbuf_putc(b, s[i]);
            continue;
        }
        char c = s[++i];
        const char *simple = "\\'\"abfnrtv", *to = "\\'\"\a\b\f\n\r\t\v";
        const char *k = strchr(simple, c);
        if (k && c) { mt_jbuf_putc(b, to[k - simple]); continue; }
        if (c == '\n') continue;  // a line continuation
        if (c >= '0' && c <= '7') {
            unsigned v = 0;
            for (int d = 0; d < 3 && i < n && s[i] >= '0' && s[i] <= '7'; d++) v = v * 8 + (unsigned)(s[i++] - '0');
            i--;
            mt_jstr_put_cp(b, v);
            continue;
        }
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (!digits) {
            if (c == 'N') return fail(l, pos, "unsupported: the \\N{...} escape in a string literal");
            mt_jbuf_putc(b, '\\'), mt_jbuf_putc(b, c);  // unknown escapes stay as written
            continue;
        }
        uint32_t v = 0;
        for (int d = 0; d < digits; d++) {
            int h = i + 1 + (size_t)d < n ? hexval(s[i + 1 + (size_t)d]) : -1;
            if (h < 0) return fail(l, pos, "a string literal has a truncated \\x, \\u or \\U escape");
            v = v << 4 | (uint32_t)h;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000))
            return fail(l, pos, "a string literal escapes a code point text cannot hold");
        mt_jstr_put_cp(b, v);
        i += (size_t)digits;
    }
    return 0;
}

static int lex_string(lexer *l) {
    size_t start = l->i;
    char q = l->s[l->i++];
    while (l->i < l->len && l->s[l->i] != q) l->i += l->s[l->i] == '\\' ? 2 : 1;
    if (l->i >= l->len) return fail(l, start, "a string literal is not closed");
    mt_jbuf b = {0};
    int rc = unescape(l, start, l->s + start + 1, l->i - start - 1, &b);
    mt_jtok *t = push(l, MT_JT_STRING, start);
    t->s = mt_jpool_strdup(l->pool, b.p ? b.p : "", b.n), t->n = b.n;
    mt_jbuf_free(&b);
    l->i++;
    return rc;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name(char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && is_digit(c));
}

/* Digits with `_` separators from l->i into t; returns how many digits. */
static size_t digits(lexer *l, char *t, size_t *k, size_t cap) {
    size_t d = 0;
    while (l->i < l->len && (is_digit(l->s[l->i]) || (l->s[l->i] == '_' && d))) {
        if (l->s[l->i] != '_' && *k + 1 < cap) t[(*k)++] = l->s[l->i], d++;
        l->i++;
    }
    return d;
}

static void lex_number(lexer *l) {
    size_t start = l->i, k = 0;
    char t[128];
    bool is_float = false;
    digits(l, t, &k, sizeof t);
    if (l->i + 1 < l->len && l->s[l->i] == '.' && is_digit(l->s[l->i + 1])) {
        t[k++] = '.', l->i++, is_float = true;
        digits(l, t, &k, sizeof t);
    }
    if (l->i < l->len && (l->s[l->i] == 'e' || l->s[l->i] == 'E')) {
        size_t save = l->i, ks = k;
        t[k++] = 'e', l->i++;
        if (l->i < l->len && (l->s[l->i] == '+' || l->s[l->i] == '-')) t[k++] = l->s[l->i++];
        if (digits(l, t, &k, sizeof t)) is_float = true;
        else l->i = save, k = ks;
    }
    t[k] = 0;
    mt_jtok *tok = push(l, is_float ? MT_JT_FLOAT : MT_JT_INT, start);
    if (is_float) tok->f = strtod(t, NULL);
    else tok->i = strtoll(t, NULL, 10);
}

static int lex_op(lexer *l) {
    static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/",
                                      "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}",
                                      ",", ".", ":", "|", NULL};
    for (int k = 0; ops[k]; k++) {
        size_t n = strlen(ops[k]);
        if (l->i + n <= l->len && !memcmp(l->s + l->i, ops[k], n)) {
            mt_jtok *t = push(l, MT_JT_OP, l->i);
            memcpy(t->op, ops[k], n);
            l->i += n;
            return 0;
        }
    }
    char what[64];
    snprintf(what, sizeof what, "unexpected character '%c' inside a tag", l->s[l->i]);
    return fail(l, l->i, what);
}

/* Whether an end delimiter (end, with an optional - or + before it) starts
 * at l->i; sets *sign. */
static bool at_end(lexer *l, const char *end, char *sign) {
    size_t n = strlen(end);
    char c = l->i < l->len ? l->s[l->i] : 0;
    bool signed_end = c == '-' || (c == '+' && end[0] == '%');
    if (signed_end && l->i + 1 + n <= l->len && !memcmp(l->s + l->i + 1, end, n)) {
        *sign = c;
        l->i += 1 + n;
        return true;
    }
    if (l->i + n <= l->len && !memcmp(l->s + l->i, end, n)) {
        *sign = 0;
        l->i += n;
        return true;
    }
    return false;
}

/* Tokens of a {{ }} or {% %} tag up to its end; *sign: the end's. */
static int lex_tag(lexer *l, size_t open, const char *end, char *sign) {
    for (;;) {
        skip_space(l);
        if (l->i >= l->len)
            return fail(l, open, end[0] == '}' ? "a {{ tag is not closed with }}" : "a {% tag is not closed with %}");
        if (at_end(l, end, sign)) return 0;
        char c = l->s[l->i];
        if (c == '\'' || c == '"') {
            if (lex_string(l)) return -1;
        } else if (is_digit(c)) {
            lex_number(l);
        } else if (is_name(c, true)) {
            size_t a = l->i;
            while (l->i < l->len && is_name(l->s[l->i], false)) l->i++;
            mt_jtok *t = push(l, MT_JT_NAME, a);
            t->s = l->s + a, t->n = l->i - a;
        } else if (lex_op(l)) {
            return -1;
        }
    }
}

/* {% raw %}...{% endraw %}: the text up to the endraw tag, verbatim. */
static int lex_raw(lexer *l, size_t open, bool *line_starting) {
    for (size_t i = l->i; i + 1 < l->len; i++) {
        if (l->s[i] != '{' || l->s[i + 1] != '%') continue;
        size_t j = i + 2;
        char sign = j < l->len && (l->s[j] == '-' || l->s[j] == '+') ? l->s[j++] : 0;
        while (space_at(l->s, l->len, j)) j += space_at(l->s, l->len, j);
        if (j + 6 > l->len || memcmp(l->s + j, "endraw", 6)) continue;
        data(l, l->i, i, sign, true, *line_starting);
        l->i = j + 6;
        skip_space(l);
        char esign;
        if (!at_end(l, "%}", &esign)) return fail(l, i, "the endraw tag is not closed with %}");
        *line_starting = after_end(l, esign, true);
        return 0;
    }
    return fail(l, open, "a raw block has no {% endraw %}");
}

/* The source with \r\n and \r turned into \n, less one trailing newline. */
static char *normalise(const char *src, size_t len, size_t *out_len) {
    char *s = mt_malloc_or_die(len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k && s[k - 1] == '\n') k--;
    s[k] = 0;
    *out_len = k;
    return s;
}

/* A tag starting at l->i: "{{", "{%" or "{#" and its sign. */
static int lex_one_tag(lexer *l, bool *line_starting) {
    size_t open = l->i;
    char kind = l->s[open + 1], sign = 0;
    l->i += 2;
    if (l->i < l->len && (l->s[l->i] == '-' || l->s[l->i] == '+')) l->i++;
    if (kind == '#') {
        for (size_t e = l->i; e + 1 < l->len; e++) {
            if (l->s[e] != '#' || l->s[e + 1] != '}') continue;
            sign = e > l->i && (l->s[e - 1] == '-' || l->s[e - 1] == '+') ? l->s[e - 1] : 0;
            l->i = e + 2;
            *line_starting = after_end(l, sign, true);
            return 0;
        }
        return fail(l, open, "a {# comment is not closed with #}");
    }
    bool block = kind == '%';
    push(l, block ? MT_JT_BLOCK_BEGIN : MT_JT_VAR_BEGIN, open);
    size_t first = l->out->n;
    if (lex_tag(l, open, block ? "%}" : "}}", &sign)) return -1;
    push(l, block ? MT_JT_BLOCK_END : MT_JT_VAR_END, l->i - 2);
    *line_starting = after_end(l, sign, block);
    mt_jtok *t = &l->out->t[first];
    if (block && l->out->n == first + 2 && t->type == MT_JT_NAME && t->n == 3 && !memcmp(t->s, "raw", 3)) {
        l->out->n -= 3;  // the raw tag itself leaves no tokens
        return lex_raw(l, open, line_starting);
    }
    return 0;
}

int mt_jinja_lex(const char *name, const char *src, size_t len, mt_jpool *pool, mt_jtoks *out,
                 mt_error *err) {
    memset(out, 0, sizeof *out);
    out->src = normalise(src, len, &out->len);
    lexer l = {name, out->src, out->len, 0, pool, out, err};
    bool line_starting = true;
    while (l.i < l.len) {
        size_t t = l.i;
        while (t + 1 < l.len && !(l.s[t] == '{' && strchr("{%#", l.s[t + 1]) && l.s[t + 1])) t++;
        if (t + 1 >= l.len) {  // no tag left
            data(&l, l.i, l.len, 0, false, line_starting);
            break;
        }
        char kind = l.s[t + 1], sign = t + 2 < l.len && strchr("-+", l.s[t + 2]) && l.s[t + 2] ? l.s[t + 2] : 0;
        data(&l, l.i, t, sign, kind != '{', line_starting);
        l.i = t;
        if (lex_one_tag(&l, &line_starting)) return -1;
    }
    push(&l, MT_JT_EOF, l.len);
    return 0;
}

void mt_jtoks_free(mt_jtoks *t) {
    free(t->t);
    free(t->src);
    memset(t, 0, sizeof *t);
}
