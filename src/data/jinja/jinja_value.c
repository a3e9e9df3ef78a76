/* Values of the Jinja engine: the pool, constructors, and the Python
 * semantics of truth, equality, ordering, str() and repr() (see
 * jinja_value.h). */
#include "data/jinja/jinja_value.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja_str.h"
#include "util/mem.h"

/* ---- pool ---- */

struct mt_jpool_chunk {
    mt_jpool_chunk *next;
    size_t cap;
    _Alignas(16) char data[];
};

enum { POOL_CHUNK = 64 << 10 };

void *mt_jpool_alloc(mt_jpool *p, size_t n) {
    n = mt_round_up(n ? n : 1, 16);
    if (!p->head || p->used + n > p->cap) {
        size_t cap = n > POOL_CHUNK ? n : POOL_CHUNK;
        mt_jpool_chunk *c = mt_malloc_or_die(sizeof *c + cap);
        c->cap = cap;
        c->next = p->head;
        p->head = c;
        p->used = 0;
        p->cap = cap;
    }
    void *r = p->head->data + p->used;
    p->used += n;
    memset(r, 0, n);
    return r;
}

char *mt_jpool_strdup(mt_jpool *p, const char *s, size_t n) {
    char *r = mt_jpool_alloc(p, n + 1);
    if (n) memcpy(r, s, n);
    return r;
}

void mt_jpool_reset(mt_jpool *p) {
    if (!p->head) return;
    while (p->head->next) {  // keep the oldest chunk, free the rest
        mt_jpool_chunk *c = p->head;
        p->head = c->next;
        free(c);
    }
    p->used = 0;
    p->cap = p->head->cap;
}

void mt_jpool_free(mt_jpool *p) {
    while (p->head) {
        mt_jpool_chunk *c = p->head;
        p->head = c->next;
        free(c);
    }
    p->used = p->cap = 0;
}

/* ---- constructors ---- */

mt_jv mt_jv_cstr(const char *s) { return mt_jv_strn(s, strlen(s)); }

mt_jv mt_jv_str_copy(mt_jpool *p, const char *s, size_t n) {
    return mt_jv_strn(mt_jpool_strdup(p, s, n), n);
}

mt_jv mt_jv_list_new(mt_jpool *p, size_t cap) {
    mt_jlist *l = mt_jpool_alloc(p, sizeof *l);
    l->cap = cap;
    l->v = cap ? mt_jpool_alloc(p, cap * sizeof *l->v) : NULL;
    return (mt_jv){.type = MT_JV_LIST, .l = l};
}

void mt_jv_list_push(mt_jpool *p, mt_jv list, mt_jv item) {
    mt_jlist *l = list.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        mt_jv *v = mt_jpool_alloc(p, cap * sizeof *v);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = item;
}

mt_jv mt_jv_dict_new(mt_jpool *p, size_t cap) {
    mt_jdict *d = mt_jpool_alloc(p, sizeof *d);
    d->msg = -1;
    d->cap = cap;
    if (cap) d->k = mt_jpool_alloc(p, cap * sizeof *d->k), d->v = mt_jpool_alloc(p, cap * sizeof *d->v);
    return (mt_jv){.type = MT_JV_DICT, .d = d};
}

static long dict_find(const mt_jdict *d, mt_jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (mt_jv_equal(d->k[i], key)) return (long)i;
    return -1;
}

void mt_jv_dict_set(mt_jpool *p, mt_jv dict, mt_jv key, mt_jv val) {
    mt_jdict *d = dict.d;
    long i = dict_find(d, key);
    if (i >= 0) {
        d->v[i] = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        mt_jv *k = mt_jpool_alloc(p, cap * sizeof *k), *v = mt_jpool_alloc(p, cap * sizeof *v);
        if (d->n) memcpy(k, d->k, d->n * sizeof *k), memcpy(v, d->v, d->n * sizeof *v);
        d->k = k, d->v = v, d->cap = cap;
    }
    d->k[d->n] = key, d->v[d->n] = val, d->n++;
}

mt_jv mt_jv_dict_get(mt_jv dict, mt_jv key) {
    if (dict.type != MT_JV_DICT && dict.type != MT_JV_NS) return mt_jv_undef(NULL);
    long i = dict_find(dict.d, key);
    return i >= 0 ? dict.d->v[i] : mt_jv_undef(NULL);
}

mt_jv mt_jv_dict_gets(mt_jv dict, const char *key) { return mt_jv_dict_get(dict, mt_jv_cstr(key)); }

/* ---- truth, equality, order ---- */

bool mt_jv_truthy(mt_jv v) {
    switch ((mt_jv_type)v.type) {
    case MT_JV_UNDEF: case MT_JV_NONE: return false;
    case MT_JV_BOOL: return v.b;
    case MT_JV_INT: return v.i != 0;
    case MT_JV_FLOAT: return v.f != 0;
    case MT_JV_STR: return v.s.n > 0;
    case MT_JV_LIST: return v.l->n > 0;
    case MT_JV_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(mt_jv v) { return v.type == MT_JV_BOOL || v.type == MT_JV_INT || v.type == MT_JV_FLOAT; }
static double num(mt_jv v) { return v.type == MT_JV_FLOAT ? v.f : v.type == MT_JV_INT ? (double)v.i : v.b; }
static int64_t inum(mt_jv v) { return v.type == MT_JV_INT ? v.i : v.b; }

bool mt_jv_equal(mt_jv a, mt_jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.type != MT_JV_FLOAT && b.type != MT_JV_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a.type != b.type) return false;
    switch ((mt_jv_type)a.type) {
    case MT_JV_UNDEF: case MT_JV_NONE: return true;
    case MT_JV_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case MT_JV_LIST:
        if (a.tuple != b.tuple || a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!mt_jv_equal(a.l->v[i], b.l->v[i])) return false;
        return true;
    case MT_JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            mt_jv w = mt_jv_dict_get(b, a.d->k[i]);
            if (w.type == MT_JV_UNDEF || !mt_jv_equal(a.d->v[i], w)) return false;
        }
        return true;
    case MT_JV_METHOD: return a.m == b.m;
    case MT_JV_FUNC: return a.fn == b.fn;
    default: return a.obj == b.obj;  // identity (namespaces, macros, loops)
    }
}

int mt_jv_less(mt_jv a, mt_jv b, bool *lt) {
    if (is_num(a) && is_num(b)) {
        if (a.type != MT_JV_FLOAT && b.type != MT_JV_FLOAT) *lt = inum(a) < inum(b);
        else *lt = num(a) < num(b);
        return 0;
    }
    if (a.type == MT_JV_STR && b.type == MT_JV_STR) {  // UTF-8 byte order is code point order
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = memcmp(a.s.p, b.s.p, n);
        *lt = c < 0 || (c == 0 && a.s.n < b.s.n);
        return 0;
    }
    if (a.type == MT_JV_LIST && b.type == MT_JV_LIST && a.tuple == b.tuple) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (mt_jv_equal(a.l->v[i], b.l->v[i])) continue;
            return mt_jv_less(a.l->v[i], b.l->v[i], lt);
        }
        *lt = a.l->n < b.l->n;
        return 0;
    }
    return -1;
}

const char *mt_jv_type_name(mt_jv v) {
    switch ((mt_jv_type)v.type) {
    case MT_JV_UNDEF: return "Undefined";
    case MT_JV_NONE: return "NoneType";
    case MT_JV_BOOL: return "bool";
    case MT_JV_INT: return "int";
    case MT_JV_FLOAT: return "float";
    case MT_JV_STR: return "str";
    case MT_JV_LIST: return v.tuple ? "tuple" : "list";
    case MT_JV_DICT: return "dict";
    case MT_JV_NS: return "Namespace";
    case MT_JV_FUNC: return "function";
    case MT_JV_METHOD: return "method";
    case MT_JV_MACRO: return "Macro";
    case MT_JV_LOOP: return "LoopContext";
    }
    return "?";
}

/* ---- str and repr ---- */

/* The shortest digits that read back as f (Python's repr): into d (no
 * dot), returns the decimal exponent of the first digit. */
static int shortest_digits(double f, char *d, size_t *nd) {
    char t[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, f);
        if (strtod(t, NULL) == f || p == 17) break;
    }
    const char *s = t + (t[0] == '-');
    size_t n = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') d[n++] = *s;
    while (n > 1 && d[n - 1] == '0') n--;
    d[n] = 0;
    *nd = n;
    return atoi(s + 1);
}

void mt_jv_float_repr(mt_jbuf *b, double f) {
    if (isnan(f)) return mt_jbuf_puts(b, "nan");
    if (isinf(f)) return mt_jbuf_puts(b, f < 0 ? "-inf" : "inf");
    if (signbit(f)) mt_jbuf_putc(b, '-'), f = -f;
    if (f == 0) return mt_jbuf_puts(b, "0.0");
    char d[32];
    size_t n;
    int e = shortest_digits(f, d, &n);
    if (e >= -4 && e < 16) {
        if (e < 0) {
            mt_jbuf_puts(b, "0.");
            for (int i = -1; i > e; i--) mt_jbuf_putc(b, '0');
            mt_jbuf_put(b, d, n);
            return;
        }
        for (int i = 0; i <= e; i++) mt_jbuf_putc(b, (size_t)i < n ? d[i] : '0');
        mt_jbuf_putc(b, '.');
        if ((size_t)e + 1 < n) mt_jbuf_put(b, d + e + 1, n - (size_t)e - 1);
        else mt_jbuf_putc(b, '0');
        return;
    }
    mt_jbuf_putc(b, d[0]);
    if (n > 1) mt_jbuf_putc(b, '.'), mt_jbuf_put(b, d + 1, n - 1);
    char t[16];
    snprintf(t, sizeof t, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    mt_jbuf_puts(b, t);
}

/* Nesting that repr follows: a namespace can hold itself. */
enum { MAX_REPR_DEPTH = 512 };

static void repr_at(mt_jbuf *b, mt_jv v, int depth);

static void repr_seq(mt_jbuf *b, mt_jv v, int depth) {
    mt_jbuf_putc(b, v.tuple ? '(' : '[');
    for (size_t i = 0; i < v.l->n; i++) {
        if (i) mt_jbuf_puts(b, ", ");
        repr_at(b, v.l->v[i], depth + 1);
    }
    if (v.tuple && v.l->n == 1) mt_jbuf_putc(b, ',');
    mt_jbuf_putc(b, v.tuple ? ')' : ']');
}

static void repr_dict(mt_jbuf *b, const mt_jdict *d, int depth) {
    mt_jbuf_putc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) mt_jbuf_puts(b, ", ");
        repr_at(b, d->k[i], depth + 1);
        mt_jbuf_puts(b, ": ");
        repr_at(b, d->v[i], depth + 1);
    }
    mt_jbuf_putc(b, '}');
}

static void str_at(mt_jbuf *b, mt_jv v, int depth) {
    char t[32];
    if (depth > MAX_REPR_DEPTH) return mt_jbuf_puts(b, "...");
    switch ((mt_jv_type)v.type) {
    case MT_JV_UNDEF: return;
    case MT_JV_NONE: return mt_jbuf_puts(b, "None");
    case MT_JV_BOOL: return mt_jbuf_puts(b, v.b ? "True" : "False");
    case MT_JV_INT: snprintf(t, sizeof t, "%" PRId64, v.i); return mt_jbuf_puts(b, t);
    case MT_JV_FLOAT: return mt_jv_float_repr(b, v.f);
    case MT_JV_STR: return mt_jbuf_put(b, v.s.p, v.s.n);
    case MT_JV_LIST: return repr_seq(b, v, depth);
    case MT_JV_DICT: return repr_dict(b, v.d, depth);
    case MT_JV_NS: mt_jbuf_puts(b, "<Namespace "); repr_dict(b, v.d, depth); return mt_jbuf_putc(b, '>');
    case MT_JV_METHOD: mt_jbuf_puts(b, "<built-in method "); mt_jbuf_puts(b, v.m->name); return mt_jbuf_putc(b, '>');
    default: mt_jbuf_putc(b, '<'); mt_jbuf_puts(b, mt_jv_type_name(v)); return mt_jbuf_putc(b, '>');
    }
}

static void repr_at(mt_jbuf *b, mt_jv v, int depth) {
    if (v.type == MT_JV_STR) return mt_jstr_repr(b, v.s.p, v.s.n);
    if (v.type == MT_JV_UNDEF) return mt_jbuf_puts(b, "Undefined");
    str_at(b, v, depth);
}

void mt_jv_str(mt_jbuf *b, mt_jv v) { str_at(b, v, 0); }
void mt_jv_repr(mt_jbuf *b, mt_jv v) { repr_at(b, v, 0); }

mt_jv mt_jv_to_str(mt_jpool *p, mt_jv v) {
    if (v.type == MT_JV_STR) return v;
    mt_jbuf b = {0};
    mt_jv_str(&b, v);
    mt_jv r = mt_jv_str_copy(p, b.p ? b.p : "", b.n);
    mt_jbuf_free(&b);
    return r;
}
