/* Attribute and item access as jinja2's sandbox resolves them, the
 * methods of str and dict that templates call, and the global functions
 * (range, namespace, dict, raise_exception, strftime_now). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/jinja/jinja_internal.h"
#include "data/jinja/jinja_str.h"
#include "util/mem.h"

enum { MAX_RANGE = 100000 };  // jinja2's sandbox refuses larger ranges

mt_jv mt_jx_str_from(mt_jexec *x, mt_jbuf *b) {
    mt_jv r = mt_jv_str_copy(x->pool, b->p ? b->p : "", b->n);
    mt_jbuf_free(b);
    return r;
}

static const char *undef_what(mt_jexec *x, mt_jv obj, const char *name) {
    char t[256];
    snprintf(t, sizeof t, "'%s object' has no attribute '%s'", mt_jv_type_name(obj), name);
    return mt_jpool_strdup(x->pool, t, strlen(t));
}

/* ---- attributes ---- */

static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "split", "rsplit",
    "startswith", "endswith", "upper", "lower", "title", "capitalize", "replace", "find",
    "rfind", "count", "join", "isdigit", "isspace", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};

static bool in_list(const char *const *names, const char *name) {
    for (size_t k = 0; names[k]; k++)
        if (!strcmp(names[k], name)) return true;
    return false;
}

static mt_jv method(mt_jexec *x, mt_jv self, const char *name) {
    mt_jmethod *m = mt_jpool_alloc(x->pool, sizeof *m);
    m->self = self;
    m->name = name;
    return (mt_jv){.type = MT_JV_METHOD, .m = m};
}

static mt_jv loop_attr(mt_jexec *x, const mt_jloop *lp, const char *name) {
    size_t i = lp->i, n = lp->items.l->n;
    if (!strcmp(name, "index")) return mt_jv_int((int64_t)i + 1);
    if (!strcmp(name, "index0")) return mt_jv_int((int64_t)i);
    if (!strcmp(name, "revindex")) return mt_jv_int((int64_t)(n - i));
    if (!strcmp(name, "revindex0")) return mt_jv_int((int64_t)(n - i - 1));
    if (!strcmp(name, "first")) return mt_jv_bool(i == 0);
    if (!strcmp(name, "last")) return mt_jv_bool(i + 1 == n);
    if (!strcmp(name, "length")) return mt_jv_int((int64_t)n);
    if (!strcmp(name, "depth")) return mt_jv_int(1);
    if (!strcmp(name, "depth0")) return mt_jv_int(0);
    if (!strcmp(name, "previtem")) return i > 0 ? lp->items.l->v[i - 1] : mt_jv_undef("there is no previous item");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? lp->items.l->v[i + 1] : mt_jv_undef("there is no next item");
    return mt_jv_undef(undef_what(x, (mt_jv){.type = MT_JV_LOOP}, name));
}

int mt_jx_getattr(mt_jexec *x, uint32_t pos, mt_jv obj, const char *name, mt_jv *out) {
    switch ((mt_jv_type)obj.type) {
    case MT_JV_UNDEF:
        return mt_jx_fail(x, pos, "%s (reading .%s of it)", obj.undef ? obj.undef : "a value is undefined", name);
    case MT_JV_STR:
        *out = in_list(str_methods, name) ? method(x, obj, name) : mt_jv_undef(undef_what(x, obj, name));
        return 0;
    case MT_JV_DICT:
        if (in_list(dict_methods, name)) return *out = method(x, obj, name), 0;
        *out = mt_jv_dict_gets(obj, name);
        if (out->type == MT_JV_UNDEF) *out = mt_jv_undef(undef_what(x, obj, name));
        return 0;
    case MT_JV_NS:
        *out = mt_jv_dict_gets(obj, name);
        if (out->type == MT_JV_UNDEF) *out = mt_jv_undef(undef_what(x, obj, name));
        return 0;
    case MT_JV_LOOP:
        *out = loop_attr(x, obj.obj, name);
        return 0;
    default:
        *out = mt_jv_undef(undef_what(x, obj, name));
        return 0;
    }
}

/* ---- items and slices ---- */

/* A Python index (negative from the end) into n items: false when out of range. */
static bool index_of(mt_jv key, size_t n, size_t *i) {
    if (key.type != MT_JV_INT && key.type != MT_JV_BOOL) return false;
    int64_t k = key.type == MT_JV_INT ? key.i : key.b;
    if (k < 0) k += (int64_t)n;
    if (k < 0 || k >= (int64_t)n) return false;
    *i = (size_t)k;
    return true;
}

int mt_jx_getitem(mt_jexec *x, uint32_t pos, mt_jv obj, mt_jv key, mt_jv *out) {
    size_t i;
    if (obj.type == MT_JV_UNDEF)
        return mt_jx_fail(x, pos, "%s (taking an item of it)", obj.undef ? obj.undef : "a value is undefined");
    if (obj.type == MT_JV_LIST && index_of(key, obj.l->n, &i)) return *out = obj.l->v[i], 0;
    if (obj.type == MT_JV_STR && index_of(key, mt_jstr_count(obj.s.p, obj.s.n), &i)) {
        size_t a = mt_jstr_offset(obj.s.p, obj.s.n, i), n;
        mt_jstr_cp(obj.s.p, obj.s.n, a, &n);
        return *out = mt_jv_strn(obj.s.p + a, n), 0;
    }
    if (obj.type == MT_JV_DICT) {
        *out = mt_jv_dict_get(obj, key);
        if (out->type != MT_JV_UNDEF) return 0;
    }
    if (key.type == MT_JV_STR) {  // jinja2 falls back to the attribute
        char *name = mt_jpool_strdup(x->pool, key.s.p, key.s.n);
        return mt_jx_getattr(x, pos, obj, name, out);
    }
    *out = mt_jv_undef("an index is out of range");
    return 0;
}

/* Python's slice.indices: start, stop for step over n items. */
static int slice_bounds(mt_jexec *x, uint32_t pos, mt_jv a, mt_jv b, int64_t step, int64_t n,
                        int64_t *start, int64_t *stop) {
    mt_jv v[2] = {a, b};
    int64_t r[2];
    for (int k = 0; k < 2; k++) {
        if (v[k].type == MT_JV_NONE || v[k].type == MT_JV_UNDEF) {
            r[k] = k == 0 ? (step > 0 ? 0 : n - 1) : (step > 0 ? n : -1);
            continue;
        }
        if (v[k].type != MT_JV_INT) return mt_jx_fail(x, pos, "slice indices must be integers or None, not %s", mt_jv_type_name(v[k]));
        int64_t i = v[k].i;
        if (i < 0) i += n;
        if (step > 0) r[k] = i < 0 ? 0 : i > n ? n : i;
        else r[k] = i < 0 ? -1 : i >= n ? n - 1 : i;
    }
    *start = r[0], *stop = r[1];
    return 0;
}

int mt_jx_slice(mt_jexec *x, uint32_t pos, mt_jv obj, mt_jv a, mt_jv b, mt_jv c, mt_jv *out) {
    int64_t step = 1, start = 0, stop = 0;
    if (c.type == MT_JV_INT) step = c.i;
    else if (c.type != MT_JV_NONE && c.type != MT_JV_UNDEF) return mt_jx_fail(x, pos, "a slice step must be an integer");
    if (step == 0) return mt_jx_fail(x, pos, "slice step cannot be zero");
    if (obj.type == MT_JV_UNDEF) return mt_jx_fail(x, pos, "%s (slicing it)", obj.undef ? obj.undef : "a value is undefined");
    bool is_str = obj.type == MT_JV_STR;
    if (!is_str && obj.type != MT_JV_LIST) return mt_jx_fail(x, pos, "'%s' object is not subscriptable", mt_jv_type_name(obj));
    int64_t n = is_str ? (int64_t)mt_jstr_count(obj.s.p, obj.s.n) : (int64_t)obj.l->n;
    if (slice_bounds(x, pos, a, b, step, n, &start, &stop)) return -1;
    if (is_str && step == 1) {
        size_t pa = mt_jstr_offset(obj.s.p, obj.s.n, (size_t)start);
        size_t pb = stop > start ? mt_jstr_offset(obj.s.p, obj.s.n, (size_t)stop) : pa;
        return *out = mt_jv_strn(obj.s.p + pa, pb - pa), 0;
    }
    mt_jbuf sb = {0};
    mt_jv list = mt_jv_list_new(x->pool, 0);
    list.tuple = !is_str && obj.tuple;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (!is_str) { mt_jv_list_push(x->pool, list, obj.l->v[i]); continue; }
        size_t off = mt_jstr_offset(obj.s.p, obj.s.n, (size_t)i), len;
        mt_jstr_cp(obj.s.p, obj.s.n, off, &len);
        mt_jbuf_put(&sb, obj.s.p + off, len);
    }
    *out = is_str ? mt_jx_str_from(x, &sb) : list;
    return 0;
}

int mt_jx_iter(mt_jexec *x, uint32_t pos, mt_jv v, mt_jv *list) {
    switch ((mt_jv_type)v.type) {
    case MT_JV_UNDEF: *list = mt_jv_list_new(x->pool, 0); return 0;
    case MT_JV_LIST: *list = v; return 0;
    case MT_JV_DICT: case MT_JV_NS:
        *list = mt_jv_list_new(x->pool, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) mt_jv_list_push(x->pool, *list, v.d->k[i]);
        return 0;
    case MT_JV_STR: {
        *list = mt_jv_list_new(x->pool, v.s.n);
        size_t n;
        for (size_t i = 0; i < v.s.n; i += n) {
            mt_jstr_cp(v.s.p, v.s.n, i, &n);
            mt_jv_list_push(x->pool, *list, mt_jv_strn(v.s.p + i, n));
        }
        return 0;
    }
    default:
        return mt_jx_fail(x, pos, "'%s' object is not iterable", mt_jv_type_name(v));
    }
}

/* ---- arguments ---- */

static int need_str(mt_jexec *x, uint32_t pos, mt_jv v, const char *what) {
    if (v.type == MT_JV_STR) return 0;
    return mt_jx_fail(x, pos, "%s must be a str, not %s", what, mt_jv_type_name(v));
}

/* ---- str methods ---- */

static int m_strip(mt_jexec *x, uint32_t pos, const char *name, mt_jv s, const mt_jargs *a, mt_jv *out) {
    mt_jv chars = mt_jarg(a, 0, "chars", mt_jv_none());
    if (chars.type != MT_JV_NONE && need_str(x, pos, chars, "the characters to strip")) return -1;
    size_t off = 0, n = s.s.n;
    bool l = strcmp(name, "rstrip") != 0, r = strcmp(name, "lstrip") != 0;
    mt_jstr_strip(s.s.p, &off, &n, l, r, chars.type == MT_JV_STR ? chars.s.p : NULL,
                  chars.type == MT_JV_STR ? chars.s.n : 0);
    *out = mt_jv_strn(s.s.p + off, n);
    return 0;
}

/* str.split() / str.rsplit() without a separator: words between runs of
 * whitespace; past maxsplit words the rest is one item, keeping its
 * whitespace on the far side. */
static int split_space(mt_jexec *x, const char *p, size_t len, int64_t max, bool from_right, mt_jv *out) {
    size_t (*w)[2] = NULL, nw = 0, cap = 0, i = 0, n;
    for (;;) {
        while (i < len && mt_jstr_isspace(mt_jstr_cp(p, len, i, &n))) i += n;
        if (i >= len) break;
        size_t st = i;
        while (i < len && !mt_jstr_isspace(mt_jstr_cp(p, len, i, &n))) i += n;
        if (nw == cap) w = mt_realloc_or_die(w, (cap = cap ? cap * 2 : 16) * sizeof *w);
        w[nw][0] = st, w[nw][1] = i, nw++;
    }
    *out = mt_jv_list_new(x->pool, nw);
    size_t keep = max >= 0 && (size_t)max < nw ? (size_t)max : nw;  // words split off
    if (keep < nw && from_right) mt_jv_list_push(x->pool, *out, mt_jv_strn(p, w[nw - keep - 1][1]));
    for (size_t k = 0; k < keep; k++) {
        size_t j = from_right ? nw - keep + k : k;
        mt_jv_list_push(x->pool, *out, mt_jv_strn(p + w[j][0], w[j][1] - w[j][0]));
    }
    if (keep < nw && !from_right) mt_jv_list_push(x->pool, *out, mt_jv_strn(p + w[keep][0], len - w[keep][0]));
    free(w);
    return 0;
}

/* str.split / str.rsplit (sep None: runs of whitespace). */
static int m_split(mt_jexec *x, uint32_t pos, bool from_right, mt_jv s, const mt_jargs *a, mt_jv *out) {
    mt_jv sep = mt_jarg(a, 0, "sep", mt_jv_none()), mx = mt_jarg(a, 1, "maxsplit", mt_jv_int(-1));
    if (sep.type != MT_JV_NONE && need_str(x, pos, sep, "the separator")) return -1;
    if (sep.type == MT_JV_STR && sep.s.n == 0) return mt_jx_fail(x, pos, "empty separator");
    int64_t max = mx.type == MT_JV_INT ? mx.i : -1, cnt = 0;
    const char *p = s.s.p;
    size_t len = s.s.n;
    if (sep.type != MT_JV_STR) return split_space(x, p, len, max, from_right, out);
    *out = mt_jv_list_new(x->pool, 0);
    if (!from_right) {
        size_t at = 0;
        long f;
        while ((max < 0 || cnt < max) && (f = mt_jstr_find(p, len, sep.s.p, sep.s.n, at)) >= 0) {
            mt_jv_list_push(x->pool, *out, mt_jv_strn(p + at, (size_t)f - at));
            at = (size_t)f + sep.s.n, cnt++;
        }
        mt_jv_list_push(x->pool, *out, mt_jv_strn(p + at, len - at));
        return 0;
    }
    size_t end = len;  // rsplit: pieces from the end, reversed at the end
    while (max < 0 || cnt < max) {
        long f = -1;
        for (long i = (long)end - (long)sep.s.n; i >= 0; i--)
            if (!memcmp(p + i, sep.s.p, sep.s.n)) { f = i; break; }
        if (f < 0) break;
        mt_jv_list_push(x->pool, *out, mt_jv_strn(p + f + sep.s.n, end - (size_t)f - sep.s.n));
        end = (size_t)f, cnt++;
    }
    mt_jv_list_push(x->pool, *out, mt_jv_strn(p, end));
    mt_jlist *r = out->l;
    for (size_t i = 0; i < r->n / 2; i++) {
        mt_jv t = r->v[i];
        r->v[i] = r->v[r->n - 1 - i], r->v[r->n - 1 - i] = t;
    }
    return 0;
}

static bool affix(mt_jv s, mt_jv p, bool end) {
    if (p.s.n > s.s.n) return false;
    return !memcmp(s.s.p + (end ? s.s.n - p.s.n : 0), p.s.p, p.s.n);
}

static int m_affix(mt_jexec *x, uint32_t pos, bool end, mt_jv s, const mt_jargs *a, mt_jv *out) {
    mt_jv p = mt_jarg(a, 0, NULL, mt_jv_undef(NULL));
    if (a->npos > 1) return mt_jx_fail(x, pos, "unsupported: start/end arguments of startswith/endswith");
    if (p.type == MT_JV_LIST && p.tuple) {
        for (size_t i = 0; i < p.l->n; i++) {
            if (need_str(x, pos, p.l->v[i], "a prefix/suffix")) return -1;
            if (affix(s, p.l->v[i], end)) return *out = mt_jv_bool(true), 0;
        }
        return *out = mt_jv_bool(false), 0;
    }
    if (need_str(x, pos, p, end ? "endswith's argument" : "startswith's argument")) return -1;
    *out = mt_jv_bool(affix(s, p, end));
    return 0;
}

static int m_replace(mt_jexec *x, uint32_t pos, mt_jv s, const mt_jargs *a, mt_jv *out) {
    mt_jv old = mt_jarg(a, 0, NULL, mt_jv_undef(NULL)), new = mt_jarg(a, 1, NULL, mt_jv_undef(NULL));
    mt_jv cnt = mt_jarg(a, 2, "count", mt_jv_int(-1));
    if (need_str(x, pos, old, "replace's old") || need_str(x, pos, new, "replace's new")) return -1;
    mt_jbuf b = {0};
    size_t at = 0, n;
    int64_t left = cnt.type == MT_JV_INT ? cnt.i : -1;
    while (left != 0 && at <= s.s.n) {
        long f = mt_jstr_find(s.s.p, s.s.n, old.s.p, old.s.n, at);
        if (f < 0) break;
        mt_jbuf_put(&b, s.s.p + at, (size_t)f - at);
        mt_jbuf_put(&b, new.s.p, new.s.n);
        if (old.s.n == 0) {  // '' matches between every character
            if ((size_t)f >= s.s.n) { at = s.s.n + 1; break; }
            mt_jstr_cp(s.s.p, s.s.n, (size_t)f, &n);
            mt_jbuf_put(&b, s.s.p + f, n);
            at = (size_t)f + n;
        } else {
            at = (size_t)f + old.s.n;
        }
        if (left > 0) left--;
    }
    if (at < s.s.n) mt_jbuf_put(&b, s.s.p + at, s.s.n - at);
    *out = mt_jx_str_from(x, &b);
    return 0;
}

static int m_find(mt_jexec *x, uint32_t pos, const char *name, mt_jv s, const mt_jargs *a, mt_jv *out) {
    mt_jv sub = mt_jarg(a, 0, NULL, mt_jv_undef(NULL));
    if (need_str(x, pos, sub, "the substring")) return -1;
    long hit = -1, f;
    int64_t count = 0;
    for (size_t at = 0; at <= s.s.n && (f = mt_jstr_find(s.s.p, s.s.n, sub.s.p, sub.s.n, at)) >= 0;) {
        if (hit < 0 || strcmp(name, "find")) hit = f;
        count++;
        if (!strcmp(name, "find")) break;
        at = (size_t)f + (sub.s.n ? sub.s.n : 1);
    }
    if (!strcmp(name, "count")) return *out = mt_jv_int(count), 0;
    *out = mt_jv_int(hit < 0 ? -1 : (int64_t)mt_jstr_count(s.s.p, (size_t)hit));
    return 0;
}

static int m_join(mt_jexec *x, uint32_t pos, mt_jv s, const mt_jargs *a, mt_jv *out) {
    mt_jv items;
    if (mt_jx_iter(x, pos, mt_jarg(a, 0, NULL, mt_jv_undef(NULL)), &items)) return -1;
    mt_jbuf b = {0};
    for (size_t i = 0; i < items.l->n; i++) {
        if (items.l->v[i].type != MT_JV_STR) {
            mt_jbuf_free(&b);
            return mt_jx_fail(x, pos, "sequence item %zu: expected str instance, %s found", i, mt_jv_type_name(items.l->v[i]));
        }
        if (i) mt_jbuf_put(&b, s.s.p, s.s.n);
        mt_jbuf_put(&b, items.l->v[i].s.p, items.l->v[i].s.n);
    }
    *out = mt_jx_str_from(x, &b);
    return 0;
}

static int m_class(mt_jv s, bool digit, mt_jv *out) {
    size_t n;
    bool all = s.s.n > 0;
    for (size_t i = 0; i < s.s.n && all; i += n) {
        uint32_t cp = mt_jstr_cp(s.s.p, s.s.n, i, &n);
        all = digit ? cp >= '0' && cp <= '9' : mt_jstr_isspace(cp);
    }
    *out = mt_jv_bool(all);
    return 0;
}

static int str_method(mt_jexec *x, uint32_t pos, const char *name, mt_jv s, const mt_jargs *a, mt_jv *out) {
    mt_jbuf b = {0};
    if (strstr(name, "strip")) return m_strip(x, pos, name, s, a, out);
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) return m_split(x, pos, name[0] == 'r', s, a, out);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) return m_affix(x, pos, name[0] == 'e', s, a, out);
    if (!strcmp(name, "replace")) return m_replace(x, pos, s, a, out);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "count")) return m_find(x, pos, name, s, a, out);
    if (!strcmp(name, "join")) return m_join(x, pos, s, a, out);
    if (!strcmp(name, "isdigit") || !strcmp(name, "isspace")) return m_class(s, name[2] == 'd', out);
    if (!strcmp(name, "upper")) mt_jstr_upper(&b, s.s.p, s.s.n);
    else if (!strcmp(name, "lower")) mt_jstr_lower(&b, s.s.p, s.s.n);
    else if (!strcmp(name, "title")) mt_jstr_title(&b, s.s.p, s.s.n);
    else mt_jstr_capitalize(&b, s.s.p, s.s.n);
    *out = mt_jx_str_from(x, &b);
    return 0;
}

static int dict_method(mt_jexec *x, const char *name, mt_jv d, const mt_jargs *a, mt_jv *out) {
    if (!strcmp(name, "get")) {
        *out = mt_jv_dict_get(d, mt_jarg(a, 0, NULL, mt_jv_none()));
        if (out->type == MT_JV_UNDEF) *out = mt_jarg(a, 1, NULL, mt_jv_none());
        return 0;
    }
    *out = mt_jv_list_new(x->pool, d.d->n);
    for (size_t i = 0; i < d.d->n; i++) {
        mt_jv item = d.d->k[i];
        if (!strcmp(name, "values")) item = d.d->v[i];
        if (!strcmp(name, "items")) {
            item = mt_jv_list_new(x->pool, 2);
            item.tuple = true;
            mt_jv_list_push(x->pool, item, d.d->k[i]);
            mt_jv_list_push(x->pool, item, d.d->v[i]);
        }
        mt_jv_list_push(x->pool, *out, item);
    }
    return 0;
}

/* ---- global functions ---- */

static const char *const globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

mt_jv mt_jx_global(const char *name) {
    for (int k = 0; globals[k]; k++)
        if (!strcmp(globals[k], name)) return (mt_jv){.type = MT_JV_FUNC, .fn = k};
    return mt_jv_undef(NULL);
}

static int g_range(mt_jexec *x, uint32_t pos, const mt_jargs *a, mt_jv *out) {
    int64_t v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3 || a->nk) return mt_jx_fail(x, pos, "range takes 1 to 3 integers");
    for (size_t i = 0; i < a->npos; i++) {
        if (a->pos[i].type != MT_JV_INT) return mt_jx_fail(x, pos, "range takes integers, not %s", mt_jv_type_name(a->pos[i]));
        v[a->npos == 1 ? 1 : i] = a->pos[i].i;
    }
    if (v[2] == 0) return mt_jx_fail(x, pos, "range() arg 3 must not be zero");
    int64_t n = v[2] > 0 ? (v[1] - v[0] + v[2] - 1) / v[2] : (v[0] - v[1] - v[2] - 1) / -v[2];
    if (n > MAX_RANGE) return mt_jx_fail(x, pos, "range of %lld items is too big (the sandbox allows %d)", (long long)n, MAX_RANGE);
    *out = mt_jv_list_new(x->pool, n > 0 ? (size_t)n : 0);
    for (int64_t i = 0; i < n; i++) mt_jv_list_push(x->pool, *out, mt_jv_int(v[0] + i * v[2]));
    return 0;
}

/* namespace(...) and dict(...): a mapping and/or keyword arguments. */
static int g_mapping(mt_jexec *x, uint32_t pos, bool ns, const mt_jargs *a, mt_jv *out) {
    *out = mt_jv_dict_new(x->pool, a->nk);
    if (ns) out->type = MT_JV_NS;
    if (a->npos > 1) return mt_jx_fail(x, pos, "%s takes at most one positional argument", ns ? "namespace" : "dict");
    if (a->npos == 1) {
        mt_jv m = a->pos[0];
        if (m.type != MT_JV_DICT && m.type != MT_JV_NS) return mt_jx_fail(x, pos, "%s takes a mapping, not %s", ns ? "namespace" : "dict", mt_jv_type_name(m));
        for (size_t i = 0; i < m.d->n; i++) mt_jv_dict_set(x->pool, *out, m.d->k[i], m.d->v[i]);
    }
    for (size_t k = 0; k < a->nk; k++) mt_jv_dict_set(x->pool, *out, mt_jv_cstr(a->knames[k]), a->kvals[k]);
    return 0;
}

static int g_strftime(mt_jexec *x, uint32_t pos, const mt_jargs *a, mt_jv *out) {
    mt_jv fmt = mt_jarg(a, 0, NULL, mt_jv_undef(NULL));
    if (need_str(x, pos, fmt, "strftime_now's format")) return -1;
    time_t now = x->now ? (time_t)x->now : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char f[256], t[512];
    snprintf(f, sizeof f, "%.*s", (int)fmt.s.n, fmt.s.p);
    size_t n = strftime(t, sizeof t, f, &tm);
    *out = mt_jv_str_copy(x->pool, t, n);
    return 0;
}

static int call_global(mt_jexec *x, uint32_t pos, int fn, const mt_jargs *a, mt_jv *out) {
    switch (fn) {
    case 0: return g_range(x, pos, a, out);
    case 1: case 2: return g_mapping(x, pos, fn == 1, a, out);
    case 3: {
        mt_jbuf b = {0};
        mt_jv_str(&b, mt_jarg(a, 0, "message", mt_jv_undef(NULL)));
        int rc = mt_jx_fail(x, pos, "the template raised an error: %s", b.p ? b.p : "");
        mt_jbuf_free(&b);
        return rc;
    }
    default: return g_strftime(x, pos, a, out);
    }
}

int mt_jx_call_builtin(mt_jexec *x, uint32_t pos, mt_jv fn, const mt_jv *pargs, size_t nargs,
                       const char **knames, const mt_jv *kvals, size_t nk, mt_jv *out) {
    mt_jargs a = {pargs, nargs, knames, kvals, nk};
    if (fn.type == MT_JV_FUNC) return call_global(x, pos, fn.fn, &a, out);
    MT_ASSERT(fn.type == MT_JV_METHOD);
    if (fn.m->self.type == MT_JV_STR) return str_method(x, pos, fn.m->name, fn.m->self, &a, out);
    return dict_method(x, fn.m->name, fn.m->self, &a, out);
}
