/* Filters and tests, as jinja2 3.1 defines them (jinja2/filters.py,
 * jinja2/tests.py), with transformers' tojson (json.dumps, not HTML-safe).
 * A filter or test outside these tables is refused when the template is
 * parsed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja_internal.h"
#include "data/jinja/jinja_str.h"
#include "util/mem.h"

/* soft_str: str(v), Undefined as "". */
static mt_jv sstr(mt_jexec *x, mt_jv v) { return mt_jv_to_str(x->pool, v); }

/* ---- filters on strings ---- */

typedef void (*case_fn)(mt_jbuf *, const char *, size_t);

static int f_case(mt_jexec *x, mt_jv v, case_fn f, mt_jv *out) {
    mt_jv s = sstr(x, v);
    mt_jbuf b = {0};
    f(&b, s.s.p, s.s.n);
    *out = mt_jx_str_from(x, &b);
    return 0;
}

/* jinja's title filter: each piece after a run of -, whitespace, (, {, [
 * or < gets its first character upper-cased, the rest lower-cased. */
static void title_filter(mt_jbuf *b, const char *s, size_t len) {
    size_t n;
    bool start = true;
    for (size_t i = 0; i < len; i += n) {
        uint32_t cp = mt_jstr_cp(s, len, i, &n);
        bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || mt_jstr_isspace(cp);
        if (sep) mt_jbuf_put(b, s + i, n);
        else if (start) mt_jstr_upper(b, s + i, n);
        else mt_jstr_lower(b, s + i, n);
        start = sep;
    }
}

static int f_trim(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, mt_jv *out) {
    mt_jv s = sstr(x, v), chars = mt_jarg(a, 0, "chars", mt_jv_none());
    if (chars.type != MT_JV_NONE && chars.type != MT_JV_STR) return mt_jx_fail(x, pos, "trim's chars must be a str");
    size_t off = 0, n = s.s.n;
    mt_jstr_strip(s.s.p, &off, &n, true, true, chars.type == MT_JV_STR ? chars.s.p : NULL,
                  chars.type == MT_JV_STR ? chars.s.n : 0);
    *out = mt_jv_strn(s.s.p + off, n);
    return 0;
}

static int f_replace(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, mt_jv *out) {
    mt_jv s = sstr(x, v), m;
    if (mt_jx_getattr(x, pos, s, "replace", &m)) return -1;
    mt_jv cnt = mt_jarg(a, 2, "count", mt_jv_none());
    mt_jv pargs[3] = {sstr(x, mt_jarg(a, 0, "old", mt_jv_undef(NULL))), sstr(x, mt_jarg(a, 1, "new", mt_jv_undef(NULL))),
                      cnt.type == MT_JV_NONE ? mt_jv_int(-1) : cnt};
    return mt_jx_call_builtin(x, pos, m, pargs, 3, NULL, NULL, 0, out);
}

/* Python's str.splitlines() boundaries. */
static size_t line_break(const char *s, size_t len, size_t i) {
    size_t n;
    uint32_t cp = mt_jstr_cp(s, len, i, &n);
    if (cp == '\r' && i + 1 < len && s[i + 1] == '\n') return 2;
    bool br = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
              cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    return br ? n : 0;
}

/* jinja2's indent: the lines of s + "\n" (str.splitlines) joined with a
 * newline and the indent, which blank lines get only with blank=True. */
static int f_indent(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, mt_jv *out) {
    mt_jv s = sstr(x, v), w = mt_jarg(a, 0, "width", mt_jv_int(4));
    bool first = mt_jv_truthy(mt_jarg(a, 1, "first", mt_jv_bool(false)));
    bool blank = mt_jv_truthy(mt_jarg(a, 2, "blank", mt_jv_bool(false)));
    mt_jbuf ind = {0}, b = {0};
    if (w.type == MT_JV_STR) mt_jbuf_put(&ind, w.s.p, w.s.n);
    else if (w.type == MT_JV_INT) for (int64_t i = 0; i < w.i; i++) mt_jbuf_putc(&ind, ' ');
    else return mt_jx_fail(x, pos, "indent's width must be an int or a str");
    if (first) mt_jbuf_put(&b, ind.p, ind.n);
    for (size_t i = 0, line = 0;; line++) {
        size_t st = i, br = 0;
        while (i < s.s.n && !(br = line_break(s.s.p, s.s.n, i))) i++;
        if (line > 0) {
            mt_jbuf_putc(&b, '\n');
            if (blank || i > st) mt_jbuf_put(&b, ind.p, ind.n);
        }
        mt_jbuf_put(&b, s.s.p + st, i - st);
        i += br;
        if (br == 0) break;  // the last line (s + "\n" ends it)
    }
    mt_jbuf_free(&ind);
    *out = mt_jx_str_from(x, &b);
    return 0;
}

static int f_tojson(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, mt_jv *out) {
    mt_jv ind = mt_jarg(a, 1, "indent", mt_jv_none()), sep = mt_jarg(a, 2, "separators", mt_jv_none());
    mt_jbuf unit = {0}, b = {0};
    mt_jjson_opts o = {.sort_keys = mt_jv_truthy(mt_jarg(a, 4, "sort_keys", mt_jv_bool(false)))};
    if (mt_jv_truthy(mt_jarg(a, 0, "ensure_ascii", mt_jv_bool(false))))
        return mt_jx_fail(x, pos, "unsupported: tojson(ensure_ascii=True)");
    if (ind.type == MT_JV_INT) for (int64_t i = 0; i < ind.i; i++) mt_jbuf_putc(&unit, ' ');
    else if (ind.type == MT_JV_STR) mt_jbuf_put(&unit, ind.s.p, ind.s.n);
    if (ind.type == MT_JV_INT || ind.type == MT_JV_STR) o.indent = unit.p ? unit.p : "";
    if (sep.type == MT_JV_LIST && sep.l->n == 2 && sep.l->v[0].type == MT_JV_STR && sep.l->v[1].type == MT_JV_STR) {
        o.item_sep = mt_jpool_strdup(x->pool, sep.l->v[0].s.p, sep.l->v[0].s.n);
        o.key_sep = mt_jpool_strdup(x->pool, sep.l->v[1].s.p, sep.l->v[1].s.n);
    }
    mt_error e;
    int rc = mt_jv_to_json(&b, v, &o, &e);
    mt_jbuf_free(&unit);
    if (rc) {
        mt_jbuf_free(&b);
        return mt_jx_fail(x, pos, "%s", e.msg);
    }
    *out = mt_jx_str_from(x, &b);
    return 0;
}

/* ---- filters on sequences ---- */

static int f_length(mt_jexec *x, uint32_t pos, mt_jv v, mt_jv *out) {
    switch ((mt_jv_type)v.type) {
    case MT_JV_UNDEF: *out = mt_jv_int(0); return 0;
    case MT_JV_STR: *out = mt_jv_int((int64_t)mt_jstr_count(v.s.p, v.s.n)); return 0;
    case MT_JV_LIST: *out = mt_jv_int((int64_t)v.l->n); return 0;
    case MT_JV_DICT: *out = mt_jv_int((int64_t)v.d->n); return 0;
    default: return mt_jx_fail(x, pos, "object of type '%s' has no len()", mt_jv_type_name(v));
    }
}

static int f_first_last(mt_jexec *x, uint32_t pos, mt_jv v, bool last, mt_jv *out) {
    mt_jv items;
    if (mt_jx_iter(x, pos, v, &items)) return -1;
    if (items.l->n == 0) return *out = mt_jv_undef(last ? "No last item, sequence was empty." : "No first item, sequence was empty."), 0;
    *out = items.l->v[last ? items.l->n - 1 : 0];
    return 0;
}

static int f_list(mt_jexec *x, uint32_t pos, mt_jv v, mt_jv *out) {
    mt_jv items;
    if (mt_jx_iter(x, pos, v, &items)) return -1;
    *out = mt_jv_list_new(x->pool, items.l->n);
    for (size_t i = 0; i < items.l->n; i++) mt_jv_list_push(x->pool, *out, items.l->v[i]);
    return 0;
}

static int f_items(mt_jexec *x, uint32_t pos, mt_jv v, mt_jv *out) {
    if (v.type == MT_JV_UNDEF) return *out = mt_jv_list_new(x->pool, 0), 0;
    if (v.type != MT_JV_DICT) return mt_jx_fail(x, pos, "Can only get item pairs from a mapping.");
    mt_jv m;
    if (mt_jx_getattr(x, pos, v, "items", &m)) return -1;
    return mt_jx_call_builtin(x, pos, m, NULL, 0, NULL, NULL, 0, out);
}

/* item.a.b as jinja's attribute getters resolve a dotted name (getitem). */
static int attr_path(mt_jexec *x, uint32_t pos, mt_jv item, mt_jv path, mt_jv *out) {
    if (path.type == MT_JV_INT) return mt_jx_getitem(x, pos, item, path, out);
    if (path.type != MT_JV_STR) return mt_jx_fail(x, pos, "an attribute name must be a str");
    const char *p = path.s.p, *end = p + path.s.n;
    *out = item;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        mt_jv key = mt_jv_str_copy(x->pool, p, (size_t)(dot - p));
        if (out->type == MT_JV_UNDEF) return 0;
        if (mt_jx_getitem(x, pos, *out, key, out)) return -1;
        p = dot + 1;
    }
    return 0;
}

static int f_join(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, mt_jv *out) {
    mt_jv items, sep = sstr(x, mt_jarg(a, 0, "d", mt_jv_cstr(""))), attr = mt_jarg(a, 1, "attribute", mt_jv_none());
    if (mt_jx_iter(x, pos, v, &items)) return -1;
    mt_jbuf b = {0};
    for (size_t i = 0; i < items.l->n; i++) {
        mt_jv it = items.l->v[i];
        if (attr.type != MT_JV_NONE && attr_path(x, pos, it, attr, &it)) return mt_jbuf_free(&b), -1;
        if (i) mt_jbuf_put(&b, sep.s.p, sep.s.n);
        mt_jv_str(&b, it);
    }
    *out = mt_jx_str_from(x, &b);
    return 0;
}

static int f_default(mt_jv v, const mt_jargs *a, mt_jv *out) {
    mt_jv d = mt_jarg(a, 0, "default_value", mt_jv_cstr(""));
    bool boolean = mt_jv_truthy(mt_jarg(a, 1, "boolean", mt_jv_bool(false)));
    *out = v.type == MT_JV_UNDEF || (boolean && !mt_jv_truthy(v)) ? d : v;
    return 0;
}

static int f_number(mt_jexec *x, mt_jv v, const mt_jargs *a, bool to_int, mt_jv *out) {
    mt_jv d = mt_jarg(a, 0, "default", to_int ? mt_jv_int(0) : mt_jv_float(0));
    double f = 0;
    bool ok = true;
    if (v.type == MT_JV_INT || v.type == MT_JV_BOOL) f = v.type == MT_JV_INT ? (double)v.i : v.b;
    else if (v.type == MT_JV_FLOAT) f = v.f;
    else if (v.type == MT_JV_STR) {
        char *s = mt_jpool_strdup(x->pool, v.s.p, v.s.n), *end;
        f = strtod(s, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        ok = end != s && *end == 0;
    } else ok = false;
    if (!ok) return *out = d, 0;
    if (to_int && v.type == MT_JV_INT) return *out = v, 0;
    *out = to_int ? mt_jv_int((int64_t)trunc(f)) : mt_jv_float(f);
    return 0;
}

static int apply_test(mt_jexec *x, uint32_t pos, const char *name, mt_jv v, const mt_jv *args, size_t n, bool *r) {
    int t = mt_jinja_test_find(name);
    if (t < 0) return mt_jx_fail(x, pos, "unsupported test '%s'", name);
    return mt_jx_test(x, pos, t, v, args, n, r);
}

/* select / reject / selectattr / rejectattr. */
static int f_select(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, bool want, bool by_attr, mt_jv *out) {
    mt_jv items, attr = by_attr ? mt_jarg(a, 0, NULL, mt_jv_undef(NULL)) : mt_jv_none();
    size_t first = by_attr ? 1 : 0;
    mt_jv test = mt_jarg(a, first, NULL, mt_jv_none());
    if (test.type != MT_JV_NONE && test.type != MT_JV_STR) return mt_jx_fail(x, pos, "a test name must be a str");
    char *tname = test.type == MT_JV_STR ? mt_jpool_strdup(x->pool, test.s.p, test.s.n) : NULL;
    const mt_jv *targs = a->npos > first + 1 ? a->pos + first + 1 : NULL;
    size_t ntargs = a->npos > first + 1 ? a->npos - first - 1 : 0;
    if (mt_jx_iter(x, pos, v, &items)) return -1;
    *out = mt_jv_list_new(x->pool, items.l->n);
    for (size_t i = 0; i < items.l->n; i++) {
        mt_jv it = items.l->v[i], probe = it;
        if (by_attr && attr_path(x, pos, it, attr, &probe)) return -1;
        bool r = mt_jv_truthy(probe);
        if (tname && apply_test(x, pos, tname, probe, targs, ntargs, &r)) return -1;
        if (r == want) mt_jv_list_push(x->pool, *out, it);
    }
    return 0;
}

static int f_map(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, mt_jv *out) {
    mt_jv items, attr = mt_jarg(a, 99, "attribute", mt_jv_none()), dflt = mt_jarg(a, 99, "default", mt_jv_undef(NULL));
    if (mt_jx_iter(x, pos, v, &items)) return -1;
    int f = -1;
    if (attr.type == MT_JV_NONE) {
        mt_jv name = mt_jarg(a, 0, NULL, mt_jv_none());
        if (name.type != MT_JV_STR) return mt_jx_fail(x, pos, "map needs a filter name or attribute=");
        f = mt_jinja_filter_find(mt_jpool_strdup(x->pool, name.s.p, name.s.n));
        if (f < 0) return mt_jx_fail(x, pos, "unsupported filter '%.*s' in map", (int)name.s.n, name.s.p);
    }
    *out = mt_jv_list_new(x->pool, items.l->n);
    for (size_t i = 0; i < items.l->n; i++) {
        mt_jv r;
        if (f >= 0) {
            if (mt_jx_filter(x, pos, f, items.l->v[i], a->pos + 1, a->npos - 1, NULL, NULL, 0, &r)) return -1;
        } else {
            if (attr_path(x, pos, items.l->v[i], attr, &r)) return -1;
            if (r.type == MT_JV_UNDEF && dflt.type != MT_JV_UNDEF) r = dflt;
        }
        mt_jv_list_push(x->pool, *out, r);
    }
    return 0;
}

static int f_reverse(mt_jexec *x, uint32_t pos, mt_jv v, mt_jv *out) {
    mt_jv items;
    if (v.type == MT_JV_STR) {
        mt_jv none = mt_jv_none();
        return mt_jx_slice(x, pos, v, none, none, mt_jv_int(-1), out);
    }
    if (mt_jx_iter(x, pos, v, &items)) return -1;
    *out = mt_jv_list_new(x->pool, items.l->n);
    for (size_t i = items.l->n; i-- > 0;) mt_jv_list_push(x->pool, *out, items.l->v[i]);
    return 0;
}

/* dictsort: items sorted by key (or value), case-insensitively unless asked. */
static int f_dictsort(mt_jexec *x, uint32_t pos, mt_jv v, const mt_jargs *a, mt_jv *out) {
    bool cs = mt_jv_truthy(mt_jarg(a, 0, "case_sensitive", mt_jv_bool(false)));
    mt_jv by = mt_jarg(a, 1, "by", mt_jv_cstr("key"));
    bool rev = mt_jv_truthy(mt_jarg(a, 2, "reverse", mt_jv_bool(false)));
    int col = by.type == MT_JV_STR && by.s.n == 5 && !memcmp(by.s.p, "value", 5);
    if (f_items(x, pos, v, out)) return -1;
    mt_jlist *l = out->l;
    for (size_t i = 1; i < l->n; i++)  // insertion sort: stable, dicts are small
        for (size_t j = i; j > 0; j--) {
            mt_jv p = l->v[j - 1].l->v[col], q = l->v[j].l->v[col];
            if (!cs && p.type == MT_JV_STR) { mt_jbuf b = {0}; mt_jstr_lower(&b, p.s.p, p.s.n); p = mt_jx_str_from(x, &b); }
            if (!cs && q.type == MT_JV_STR) { mt_jbuf b = {0}; mt_jstr_lower(&b, q.s.p, q.s.n); q = mt_jx_str_from(x, &b); }
            bool lt;
            if (mt_jv_less(rev ? p : q, rev ? q : p, &lt)) return mt_jx_fail(x, pos, "dictsort: the keys cannot be ordered");
            if (!lt) break;
            mt_jv t = l->v[j];
            l->v[j] = l->v[j - 1], l->v[j - 1] = t;
        }
    return 0;
}

/* ---- the filter table ---- */

enum { F_ABS, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_FIRST, F_FLOAT, F_INDENT,
       F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_REJECT, F_REJECTATTR,
       F_REPLACE, F_REVERSE, F_SAFE, F_SELECT, F_SELECTATTR, F_STRING, F_TITLE, F_TOJSON,
       F_TRIM, F_UPPER, F_N };

static const char *const filter_names[F_N] = {"abs", "capitalize", "count", "d", "default",
    "dictsort", "first", "float", "indent", "int", "items", "join", "last", "length", "list",
    "lower", "map", "reject", "rejectattr", "replace", "reverse", "safe", "select",
    "selectattr", "string", "title", "tojson", "trim", "upper"};

int mt_jinja_filter_find(const char *name) {
    for (int k = 0; k < F_N; k++)
        if (!strcmp(filter_names[k], name)) return k;
    return -1;
}

int mt_jx_filter(mt_jexec *x, uint32_t pos, int fn, mt_jv v, const mt_jv *args, size_t nargs,
                 const char **knames, const mt_jv *kvals, size_t nk, mt_jv *out) {
    mt_jargs a = {args, nargs, knames, kvals, nk};
    switch (fn) {
    case F_ABS:
        if (v.type == MT_JV_INT) return *out = mt_jv_int(v.i < 0 ? -v.i : v.i), 0;
        if (v.type == MT_JV_FLOAT) return *out = mt_jv_float(fabs(v.f)), 0;
        return mt_jx_fail(x, pos, "bad operand type for abs(): '%s'", mt_jv_type_name(v));
    case F_CAPITALIZE: return f_case(x, v, mt_jstr_capitalize, out);
    case F_COUNT: case F_LENGTH: return f_length(x, pos, v, out);
    case F_D: case F_DEFAULT: return f_default(v, &a, out);
    case F_DICTSORT: return f_dictsort(x, pos, v, &a, out);
    case F_FIRST: case F_LAST: return f_first_last(x, pos, v, fn == F_LAST, out);
    case F_FLOAT: case F_INT: return f_number(x, v, &a, fn == F_INT, out);
    case F_INDENT: return f_indent(x, pos, v, &a, out);
    case F_ITEMS: return f_items(x, pos, v, out);
    case F_JOIN: return f_join(x, pos, v, &a, out);
    case F_LIST: return f_list(x, pos, v, out);
    case F_LOWER: return f_case(x, v, mt_jstr_lower, out);
    case F_MAP: return f_map(x, pos, v, &a, out);
    case F_REJECT: case F_SELECT: return f_select(x, pos, v, &a, fn == F_SELECT, false, out);
    case F_REJECTATTR: case F_SELECTATTR: return f_select(x, pos, v, &a, fn == F_SELECTATTR, true, out);
    case F_REPLACE: return f_replace(x, pos, v, &a, out);
    case F_REVERSE: return f_reverse(x, pos, v, out);
    case F_SAFE: *out = v; return 0;
    case F_STRING: *out = sstr(x, v); return 0;
    case F_TITLE: return f_case(x, v, title_filter, out);
    case F_TOJSON: return f_tojson(x, pos, v, &a, out);
    case F_TRIM: return f_trim(x, pos, v, &a, out);
    case F_UPPER: return f_case(x, v, mt_jstr_upper, out);
    }
    MT_ASSERT(!"unknown filter index");
    return -1;
}

/* ---- tests ---- */

enum { T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_EQ2, T_EQUALTO, T_EVEN, T_FALSE,
       T_FLOAT, T_GE, T_GT, T_GREATERTHAN, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LESSTHAN, T_LT,
       T_MAPPING, T_NE, T_NE2, T_NONE, T_NUMBER, T_ODD, T_SAMEAS, T_SEQUENCE, T_STRING, T_TRUE,
       T_UNDEFINED, T_N };

static const char *const test_names[T_N] = {"boolean", "callable", "defined", "divisibleby",
    "eq", "==", "equalto", "even", "false", "float", "ge", "gt", "greaterthan", "in", "integer",
    "iterable", "le", "lessthan", "lt", "mapping", "ne", "!=", "none", "number", "odd",
    "sameas", "sequence", "string", "true", "undefined"};

int mt_jinja_test_find(const char *name) {
    for (int k = 0; k < T_N; k++)
        if (!strcmp(test_names[k], name)) return k;
    return -1;
}

static int t_compare(mt_jexec *x, uint32_t pos, int fn, mt_jv a, mt_jv b, bool *r) {
    bool swap = fn == T_GT || fn == T_GREATERTHAN || fn == T_LE;  // a > b is b < a, a <= b is not b < a
    mt_jv p = swap ? b : a, q = swap ? a : b;
    bool lt;
    if (mt_jv_less(p, q, &lt))
        return mt_jx_fail(x, pos, "'<' not supported between %s and %s", mt_jv_type_name(p), mt_jv_type_name(q));
    *r = fn == T_LE || fn == T_GE ? !lt : lt;
    return 0;
}

static int t_in(mt_jexec *x, uint32_t pos, mt_jv v, mt_jv seq, bool *r) {
    if (seq.type == MT_JV_STR) {
        if (v.type != MT_JV_STR) return mt_jx_fail(x, pos, "'in <string>' requires string as left operand, not %s", mt_jv_type_name(v));
        return *r = mt_jstr_find(seq.s.p, seq.s.n, v.s.p, v.s.n, 0) >= 0, 0;
    }
    if (seq.type == MT_JV_DICT) return *r = mt_jv_dict_get(seq, v).type != MT_JV_UNDEF, 0;
    mt_jv items;
    if (mt_jx_iter(x, pos, seq, &items)) return -1;
    *r = false;
    for (size_t i = 0; i < items.l->n && !*r; i++) *r = mt_jv_equal(items.l->v[i], v);
    return 0;
}

int mt_jx_test(mt_jexec *x, uint32_t pos, int fn, mt_jv v, const mt_jv *args, size_t nargs, bool *out) {
    mt_jv a0 = nargs ? args[0] : mt_jv_undef(NULL);
    bool is_int = v.type == MT_JV_INT;
    switch (fn) {
    case T_BOOLEAN: *out = v.type == MT_JV_BOOL; return 0;
    case T_CALLABLE: *out = v.type == MT_JV_FUNC || v.type == MT_JV_METHOD || v.type == MT_JV_MACRO; return 0;
    case T_DEFINED: *out = v.type != MT_JV_UNDEF; return 0;
    case T_UNDEFINED: *out = v.type == MT_JV_UNDEF; return 0;
    case T_DIVISIBLEBY:
        if (!is_int || a0.type != MT_JV_INT || a0.i == 0) return mt_jx_fail(x, pos, "divisibleby needs integers");
        *out = v.i % a0.i == 0;
        return 0;
    case T_EVEN: case T_ODD:
        if (!is_int) return mt_jx_fail(x, pos, "%s needs an integer", test_names[fn]);
        *out = (v.i % 2 == 0) == (fn == T_EVEN);
        return 0;
    case T_EQ: case T_EQ2: case T_EQUALTO: *out = mt_jv_equal(v, a0); return 0;
    case T_NE: case T_NE2: *out = !mt_jv_equal(v, a0); return 0;
    case T_FALSE: *out = v.type == MT_JV_BOOL && !v.b; return 0;
    case T_TRUE: *out = v.type == MT_JV_BOOL && v.b; return 0;
    case T_FLOAT: *out = v.type == MT_JV_FLOAT; return 0;
    case T_INTEGER: *out = is_int; return 0;
    case T_NUMBER: *out = is_int || v.type == MT_JV_FLOAT || v.type == MT_JV_BOOL; return 0;
    case T_GE: case T_GT: case T_GREATERTHAN: case T_LE: case T_LESSTHAN: case T_LT:
        return t_compare(x, pos, fn, v, a0, out);
    case T_IN: return t_in(x, pos, v, a0, out);
    case T_ITERABLE: *out = v.type == MT_JV_UNDEF || v.type == MT_JV_STR || v.type == MT_JV_LIST || v.type == MT_JV_DICT; return 0;
    case T_SEQUENCE: *out = v.type == MT_JV_UNDEF || v.type == MT_JV_STR || v.type == MT_JV_LIST || v.type == MT_JV_DICT; return 0;
    case T_MAPPING: *out = v.type == MT_JV_DICT; return 0;
    case T_NONE: *out = v.type == MT_JV_NONE; return 0;
    case T_SAMEAS:
        if (v.type != a0.type) return *out = false, 0;
        *out = v.type == MT_JV_NONE || v.type == MT_JV_UNDEF || (v.type == MT_JV_BOOL ? v.b == a0.b : v.type == MT_JV_STR ? v.s.p == a0.s.p && v.s.n == a0.s.n : v.obj == a0.obj);
        return 0;
    case T_STRING: *out = v.type == MT_JV_STR; return 0;
    }
    MT_ASSERT(!"unknown test index");
    return -1;
}
