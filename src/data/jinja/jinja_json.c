/* JSON in and out of Jinja values, as Python's json module: json.loads for
 * the data a template reads (a conversation line), json.dumps with
 * ensure_ascii=False for transformers' tojson filter. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja_str.h"
#include "data/jinja/jinja_value.h"

/* ---- parsing ---- */

typedef struct jp {
    mt_jpool *pool;
    const char *s;
    size_t len, i;
    int depth;
    mt_error *err;
} jp;

enum { MAX_DEPTH = 512 };

static int fail(jp *p, const char *what) {
    return mt_errorf(p->err, "not valid JSON at byte %zu: %s", p->i + 1, what);
}

static void skip_ws(jp *p) {
    while (p->i < p->len && strchr(" \t\r\n", p->s[p->i]) && p->s[p->i]) p->i++;
}

static int parse_value(jp *p, mt_jv *out);

static int hex4(jp *p, uint32_t *v) {
    if (p->i + 4 > p->len) return fail(p, "a \\u escape is cut short");
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(p, "a \\u escape needs 4 hex digits");
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

static int escape(jp *p, mt_jbuf *b) {
    char c = p->s[p->i++];
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *k = c ? strchr(from, c) : NULL;
    if (k) return mt_jbuf_putc(b, to[k - from]), 0;
    if (c != 'u') return fail(p, "an unknown escape");
    uint32_t cp;
    if (hex4(p, &cp)) return -1;
    if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
        uint32_t lo;
        if (p->i + 2 > p->len || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
            return fail(p, "a lone surrogate \\u escape (text cannot hold it)");
        p->i += 2;
        if (hex4(p, &lo)) return -1;
        if (lo < 0xDC00 || lo >= 0xE000) return fail(p, "a lone surrogate \\u escape");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp < 0xE000) {
        return fail(p, "a lone surrogate \\u escape (text cannot hold it)");
    }
    mt_jstr_put_cp(b, cp);
    return 0;
}

static int parse_string(jp *p, mt_jv *out) {
    p->i++;  // the quote
    size_t start = p->i;
    while (p->i < p->len && p->s[p->i] != '"' && p->s[p->i] != '\\') {
        if ((unsigned char)p->s[p->i] < 0x20) return fail(p, "a control character inside a string");
        p->i++;
    }
    if (p->i < p->len && p->s[p->i] == '"') {  // no escapes: point into the text
        *out = mt_jv_str_copy(p->pool, p->s + start, p->i - start);
        p->i++;
        return 0;
    }
    mt_jbuf b = {0};
    mt_jbuf_put(&b, p->s + start, p->i - start);
    int rc = 0;
    while (rc == 0) {
        if (p->i >= p->len) { rc = fail(p, "a string is not closed"); break; }
        char c = p->s[p->i];
        if (c == '"') break;
        if ((unsigned char)c < 0x20) { rc = fail(p, "a control character inside a string"); break; }
        if (c == '\\') {
            p->i++;
            if (p->i >= p->len) { rc = fail(p, "a string is not closed"); break; }
            rc = escape(p, &b);
        } else {
            mt_jbuf_putc(&b, c), p->i++;
        }
    }
    if (rc == 0) *out = mt_jv_str_copy(p->pool, b.p ? b.p : "", b.n), p->i++;
    mt_jbuf_free(&b);
    return rc;
}

static int parse_number(jp *p, mt_jv *out) {
    size_t a = p->i;
    bool is_float = false;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->len || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, "a number needs digits");
    while (p->i < p->len && strchr("0123456789.eE+-", p->s[p->i]) && p->s[p->i]) {
        if (strchr(".eE", p->s[p->i])) is_float = true;
        p->i++;
    }
    char t[64];
    size_t n = p->i - a;
    if (n >= sizeof t) n = sizeof t - 1;  // a longer number reads as its first 63 characters
    memcpy(t, p->s + a, n);
    t[n] = 0;
    char *end;
    if (!is_float) {
        long long v = strtoll(t, &end, 10);
        if (*end == 0 && v != LLONG_MAX && v != LLONG_MIN) return *out = mt_jv_int(v), 0;
    }
    double f = strtod(t, &end);
    if (*end) return fail(p, "a malformed number");
    *out = mt_jv_float(f);
    return 0;
}

static int parse_array(jp *p, mt_jv *out) {
    p->i++;
    *out = mt_jv_list_new(p->pool, 0);
    skip_ws(p);
    if (p->i < p->len && p->s[p->i] == ']') return p->i++, 0;
    for (;;) {
        mt_jv v;
        if (parse_value(p, &v)) return -1;
        mt_jv_list_push(p->pool, *out, v);
        skip_ws(p);
        if (p->i < p->len && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->len && p->s[p->i] == ']') return p->i++, 0;
        return fail(p, "expected , or ] in an array");
    }
}

static int parse_object(jp *p, mt_jv *out) {
    p->i++;
    *out = mt_jv_dict_new(p->pool, 0);
    skip_ws(p);
    if (p->i < p->len && p->s[p->i] == '}') return p->i++, 0;
    for (;;) {
        mt_jv k, v;
        skip_ws(p);
        if (p->i >= p->len || p->s[p->i] != '"') return fail(p, "expected a string key");
        if (parse_string(p, &k)) return -1;
        skip_ws(p);
        if (p->i >= p->len || p->s[p->i] != ':') return fail(p, "expected : after a key");
        p->i++;
        if (parse_value(p, &v)) return -1;
        mt_jv_dict_set(p->pool, *out, k, v);
        skip_ws(p);
        if (p->i < p->len && p->s[p->i] == ',') { p->i++; continue; }
        if (p->i < p->len && p->s[p->i] == '}') return p->i++, 0;
        return fail(p, "expected , or } in an object");
    }
}

static bool word(jp *p, const char *w) {
    size_t n = strlen(w);
    if (p->i + n > p->len || memcmp(p->s + p->i, w, n)) return false;
    p->i += n;
    return true;
}

static int parse_value(jp *p, mt_jv *out) {
    skip_ws(p);
    if (p->i >= p->len) return fail(p, "the text ends where a value should be");
    if (++p->depth > MAX_DEPTH) return fail(p, "nested too deeply");
    int rc = 0;
    char c = p->s[p->i];
    if (c == '"') rc = parse_string(p, out);
    else if (c == '[') rc = parse_array(p, out);
    else if (c == '{') rc = parse_object(p, out);
    else if (c == '-' || (c >= '0' && c <= '9')) rc = parse_number(p, out);
    else if (word(p, "true")) *out = mt_jv_bool(true);
    else if (word(p, "false")) *out = mt_jv_bool(false);
    else if (word(p, "null")) *out = mt_jv_none();
    else if (word(p, "NaN")) *out = mt_jv_float(NAN);
    else if (word(p, "Infinity")) *out = mt_jv_float(INFINITY);
    else if (word(p, "-Infinity")) *out = mt_jv_float(-INFINITY);
    else rc = fail(p, "an unexpected character");
    p->depth--;
    return rc;
}

int mt_jv_from_json(mt_jpool *pool, const char *json, size_t len, mt_jv *out, mt_error *err) {
    jp p = {pool, json, len, 0, 0, err};
    if (parse_value(&p, out)) return -1;
    skip_ws(&p);
    if (p.i < p.len) return fail(&p, "text after the value");
    return 0;
}

/* ---- dumping ---- */

static void dump_string(mt_jbuf *b, const char *s, size_t n) {
    mt_jbuf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                      : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char t[8];
        if (!e && c < 0x20) snprintf(t, sizeof t, "\\u%04x", c), e = t;
        if (e) mt_jbuf_puts(b, e);
        else mt_jbuf_putc(b, (char)c);
    }
    mt_jbuf_putc(b, '"');
}

static void dump_float(mt_jbuf *b, double f) {
    if (isnan(f)) mt_jbuf_puts(b, "NaN");
    else if (isinf(f)) mt_jbuf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else mt_jv_float_repr(b, f);
}

typedef struct dumper {
    mt_jbuf *b;
    const mt_jjson_opts *o;
    const char *item_sep, *key_sep;
    mt_error *err;
} dumper;

static void newline(dumper *d, int level) {
    if (!d->o->indent) return;
    mt_jbuf_putc(d->b, '\n');
    for (int i = 0; i < level; i++) mt_jbuf_puts(d->b, d->o->indent);
}

static int dump(dumper *d, mt_jv v, int level);

/* A dict key as json.dumps writes it: strings as they are, numbers, bools
 * and None as their JSON text. */
static int dump_key(dumper *d, mt_jv k) {
    if (k.type == MT_JV_STR) return dump_string(d->b, k.s.p, k.s.n), 0;
    mt_jbuf t = {0};
    int rc = 0;
    if (k.type == MT_JV_NONE) mt_jbuf_puts(&t, "null");
    else if (k.type == MT_JV_BOOL) mt_jbuf_puts(&t, k.b ? "true" : "false");
    else if (k.type == MT_JV_INT || k.type == MT_JV_FLOAT) mt_jv_str(&t, k);
    else rc = mt_errorf(d->err, "tojson: keys must be str, int, float, bool or None, not %s",
                        mt_jv_type_name(k));
    if (rc == 0) dump_string(d->b, t.p, t.n);
    mt_jbuf_free(&t);
    return rc;
}

static int key_cmp(const void *a, const void *b) {
    bool lt;
    const mt_jv *x = a, *y = b;
    if (mt_jv_less(*x, *y, &lt) == 0 && lt) return -1;
    if (mt_jv_less(*y, *x, &lt) == 0 && lt) return 1;
    return 0;
}

static int dump_dict(dumper *d, const mt_jdict *m, int level) {
    if (m->n == 0) return mt_jbuf_puts(d->b, "{}"), 0;
    size_t *order = malloc(m->n * sizeof *order);
    for (size_t i = 0; i < m->n; i++) order[i] = i;
    if (d->o->sort_keys)  // insertion sort by key: dicts are small
        for (size_t i = 1; i < m->n; i++)
            for (size_t j = i; j > 0 && key_cmp(&m->k[order[j]], &m->k[order[j - 1]]) < 0; j--) {
                size_t t = order[j];
                order[j] = order[j - 1], order[j - 1] = t;
            }
    mt_jbuf_putc(d->b, '{');
    int rc = 0;
    for (size_t i = 0; i < m->n && rc == 0; i++) {
        if (i) mt_jbuf_puts(d->b, d->item_sep);
        newline(d, level + 1);
        rc = dump_key(d, m->k[order[i]]);
        if (rc == 0) mt_jbuf_puts(d->b, d->key_sep), rc = dump(d, m->v[order[i]], level + 1);
    }
    free(order);
    newline(d, level);
    mt_jbuf_putc(d->b, '}');
    return rc;
}

static int dump(dumper *d, mt_jv v, int level) {
    if (level > MAX_DEPTH) return mt_errorf(d->err, "tojson: the value is nested too deeply");
    switch ((mt_jv_type)v.type) {
    case MT_JV_NONE: mt_jbuf_puts(d->b, "null"); return 0;
    case MT_JV_BOOL: mt_jbuf_puts(d->b, v.b ? "true" : "false"); return 0;
    case MT_JV_INT: mt_jv_str(d->b, v); return 0;
    case MT_JV_FLOAT: dump_float(d->b, v.f); return 0;
    case MT_JV_STR: dump_string(d->b, v.s.p, v.s.n); return 0;
    case MT_JV_DICT: case MT_JV_NS: return dump_dict(d, v.d, level);
    case MT_JV_LIST:
        if (v.l->n == 0) return mt_jbuf_puts(d->b, "[]"), 0;
        mt_jbuf_putc(d->b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) mt_jbuf_puts(d->b, d->item_sep);
            newline(d, level + 1);
            if (dump(d, v.l->v[i], level + 1)) return -1;
        }
        newline(d, level);
        mt_jbuf_putc(d->b, ']');
        return 0;
    default:
        return mt_errorf(d->err, "tojson: Object of type %s is not JSON serializable",
                         mt_jv_type_name(v));
    }
}

int mt_jv_to_json(mt_jbuf *b, mt_jv v, const mt_jjson_opts *o, mt_error *err) {
    dumper d = {b, o, o->item_sep, o->key_sep, err};
    if (!d.item_sep) d.item_sep = o->indent ? "," : ", ";
    if (!d.key_sep) d.key_sep = ": ";
    return dump(&d, v, 0);
}
