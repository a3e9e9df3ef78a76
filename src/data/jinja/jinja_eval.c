/* Expressions: names, operators with Python's semantics (int and float
 * arithmetic, str and list concatenation, chained comparisons, and/or
 * returning an operand), conditional expressions, literals, filters,
 * tests and calls. A macro call runs statements through x->call_macro. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "data/jinja/jinja_internal.h"
#include "data/jinja/jinja_str.h"

mt_jv mt_jx_lookup(mt_jexec *x, const char *name) {
    for (mt_jscope *s = x->scope; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->names[i], name)) return s->vals[i];
    mt_jv g = mt_jx_global(name);
    if (g.type != MT_JV_UNDEF) return g;
    char t[160];
    snprintf(t, sizeof t, "'%s' is undefined", name);
    return mt_jv_undef(mt_jpool_strdup(x->pool, t, strlen(t)));
}

static int undefined_use(mt_jexec *x, uint32_t pos, mt_jv v) {
    return mt_jx_fail(x, pos, "%s", v.undef ? v.undef : "a value is undefined");
}

/* ---- arithmetic ---- */

static bool is_num(mt_jv v) { return v.type == MT_JV_INT || v.type == MT_JV_FLOAT || v.type == MT_JV_BOOL; }
static bool is_intlike(mt_jv v) { return v.type == MT_JV_INT || v.type == MT_JV_BOOL; }
static int64_t ival(mt_jv v) { return v.type == MT_JV_INT ? v.i : v.b; }
static double fval(mt_jv v) { return v.type == MT_JV_FLOAT ? v.f : (double)ival(v); }

static int int_op(mt_jexec *x, uint32_t pos, char op, int64_t a, int64_t b, mt_jv *out) {
    int64_t r = 0;
    bool over = false;
    switch (op) {
    case '+': over = __builtin_add_overflow(a, b, &r); break;
    case '-': over = __builtin_sub_overflow(a, b, &r); break;
    case '*': over = __builtin_mul_overflow(a, b, &r); break;
    case 'F': case '%':
        if (b == 0) return mt_jx_fail(x, pos, "integer division or modulo by zero");
        r = op == 'F' ? a / b : a % b;
        if (op == 'F' && (a % b != 0) && ((a < 0) != (b < 0))) r--;  // floor, as Python
        if (op == '%' && r != 0 && ((r < 0) != (b < 0))) r += b;
        break;
    case 'P':
        if (b < 0) return *out = mt_jv_float(pow((double)a, (double)b)), 0;
        r = 1;
        for (int64_t i = 0; i < b && !over; i++) over = __builtin_mul_overflow(r, a, &r);
        break;
    }
    if (over) return mt_jx_fail(x, pos, "an integer result is too large");
    *out = mt_jv_int(r);
    return 0;
}

static int float_op(mt_jexec *x, uint32_t pos, char op, double a, double b, mt_jv *out) {
    double r = 0;
    switch (op) {
    case '+': r = a + b; break;
    case '-': r = a - b; break;
    case '*': r = a * b; break;
    case '/': case 'F': case '%':
        if (b == 0) return mt_jx_fail(x, pos, "float division by zero");
        if (op == '/') r = a / b;
        else if (op == 'F') r = floor(a / b);
        else r = fmod(a, b), r = r != 0 && ((r < 0) != (b < 0)) ? r + b : r;
        break;
    case 'P': r = pow(a, b); break;
    }
    *out = mt_jv_float(r);
    return 0;
}

/* s * k or list * k. */
static int repeat(mt_jexec *x, mt_jv s, int64_t k, mt_jv *out) {
    if (s.type == MT_JV_STR) {
        mt_jbuf b = {0};
        for (int64_t i = 0; i < k; i++) mt_jbuf_put(&b, s.s.p, s.s.n);
        *out = mt_jx_str_from(x, &b);
        return 0;
    }
    *out = mt_jv_list_new(x->pool, 0);
    out->tuple = s.tuple;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < s.l->n; j++) mt_jv_list_push(x->pool, *out, s.l->v[j]);
    return 0;
}

static int binop(mt_jexec *x, uint32_t pos, char op, mt_jv a, mt_jv b, mt_jv *out) {
    if (a.type == MT_JV_UNDEF) return undefined_use(x, pos, a);
    if (b.type == MT_JV_UNDEF) return undefined_use(x, pos, b);
    if (is_num(a) && is_num(b)) {
        if (op != '/' && is_intlike(a) && is_intlike(b)) return int_op(x, pos, op, ival(a), ival(b), out);
        return float_op(x, pos, op, fval(a), fval(b), out);
    }
    if (op == '+' && a.type == MT_JV_STR && b.type == MT_JV_STR) {
        mt_jbuf s = {0};
        mt_jbuf_put(&s, a.s.p, a.s.n);
        mt_jbuf_put(&s, b.s.p, b.s.n);
        *out = mt_jx_str_from(x, &s);
        return 0;
    }
    if (op == '+' && a.type == MT_JV_LIST && b.type == MT_JV_LIST && a.tuple == b.tuple) {
        *out = mt_jv_list_new(x->pool, a.l->n + b.l->n);
        out->tuple = a.tuple;
        for (size_t i = 0; i < a.l->n; i++) mt_jv_list_push(x->pool, *out, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) mt_jv_list_push(x->pool, *out, b.l->v[i]);
        return 0;
    }
    if (op == '*' && (a.type == MT_JV_STR || a.type == MT_JV_LIST) && is_intlike(b)) return repeat(x, a, ival(b), out);
    if (op == '*' && (b.type == MT_JV_STR || b.type == MT_JV_LIST) && is_intlike(a)) return repeat(x, b, ival(a), out);
    if (op == '%' && a.type == MT_JV_STR) return mt_jx_fail(x, pos, "unsupported: string formatting with %%");
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char *ops = "+-*/F%P";
    return mt_jx_fail(x, pos, "unsupported operand type(s) for %s: '%s' and '%s'",
                      names[strchr(ops, op) - ops], mt_jv_type_name(a), mt_jv_type_name(b));
}

/* ---- comparisons ---- */

static int compare(mt_jexec *x, uint32_t pos, char op, mt_jv a, mt_jv b, bool *r) {
    bool lt;
    switch (op) {
    case '=': *r = mt_jv_equal(a, b); return 0;
    case '!': *r = !mt_jv_equal(a, b); return 0;
    case 'i': case 'n':
        if (mt_jx_test(x, pos, mt_jinja_test_find("in"), a, &b, 1, r)) return -1;
        if (op == 'n') *r = !*r;
        return 0;
    }
    bool swap = op == '>' || op == 'l';  // a > b is b < a; a <= b is not (b < a)
    if (mt_jv_less(swap ? b : a, swap ? a : b, &lt)) {
        const char *sym = op == '<' ? "<" : op == '>' ? ">" : op == 'l' ? "<=" : ">=";
        return mt_jx_fail(x, pos, "'%s' not supported between instances of '%s' and '%s'", sym,
                          mt_jv_type_name(a), mt_jv_type_name(b));
    }
    *r = op == 'l' || op == 'g' ? !lt : lt;
    return 0;
}

static int eval_compare(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jv left, right;
    if (mt_jx_eval(x, n->a, &left)) return -1;
    for (size_t i = 0; i < n->n; i++) {
        bool r;
        if (mt_jx_eval(x, n->kids[i], &right) || compare(x, n->kids[i]->pos, n->ops[i], left, right, &r)) return -1;
        if (!r) return *out = mt_jv_bool(false), 0;
        left = right;
    }
    *out = mt_jv_bool(true);
    return 0;
}

/* ---- calls, filters, tests ---- */

/* Evaluates n's positional and keyword arguments into pool arrays. */
static int eval_args(mt_jexec *x, const mt_jnode *n, mt_jv **pos, mt_jv **kw) {
    *pos = n->n ? mt_jpool_alloc(x->pool, n->n * sizeof **pos) : NULL;
    *kw = n->nk ? mt_jpool_alloc(x->pool, n->nk * sizeof **kw) : NULL;
    for (size_t i = 0; i < n->n; i++)
        if (mt_jx_eval(x, n->kids[i], &(*pos)[i])) return -1;
    for (size_t i = 0; i < n->nk; i++)
        if (mt_jx_eval(x, n->kvals[i], &(*kw)[i])) return -1;
    return 0;
}

static int eval_call(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jv fn, *pos, *kw;
    if (mt_jx_eval(x, n->a, &fn) || eval_args(x, n, &pos, &kw)) return -1;
    switch ((mt_jv_type)fn.type) {
    case MT_JV_MACRO:
        return x->call_macro(x, n->pos, fn, pos, n->n, n->knames, kw, n->nk, out);
    case MT_JV_FUNC: case MT_JV_METHOD:
        return mt_jx_call_builtin(x, n->pos, fn, pos, n->n, n->knames, kw, n->nk, out);
    case MT_JV_UNDEF:
        return undefined_use(x, n->pos, fn);
    default:
        return mt_jx_fail(x, n->pos, "'%s' object is not callable", mt_jv_type_name(fn));
    }
}

static int eval_filter(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jv v, *pos, *kw;
    if (mt_jx_eval(x, n->a, &v) || eval_args(x, n, &pos, &kw)) return -1;
    return mt_jx_filter(x, n->pos, n->fn, v, pos, n->n, n->knames, kw, n->nk, out);
}

static int eval_test(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jv v, *pos, *kw;
    bool r;
    if (mt_jx_eval(x, n->a, &v) || eval_args(x, n, &pos, &kw)) return -1;
    if (mt_jx_test(x, n->pos, n->fn, v, pos, n->n, &r)) return -1;
    *out = mt_jv_bool(r != n->neg);
    return 0;
}

/* ---- literals ---- */

static int eval_items(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    if (n->kind == MT_JN_DICT) {
        *out = mt_jv_dict_new(x->pool, n->n / 2);
        for (size_t i = 0; i + 1 < n->n; i += 2) {
            mt_jv k, v;
            if (mt_jx_eval(x, n->kids[i], &k) || mt_jx_eval(x, n->kids[i + 1], &v)) return -1;
            mt_jv_dict_set(x->pool, *out, k, v);
        }
        return 0;
    }
    *out = mt_jv_list_new(x->pool, n->n);
    out->tuple = n->kind == MT_JN_TUPLE;
    for (size_t i = 0; i < n->n; i++) {
        mt_jv v;
        if (mt_jx_eval(x, n->kids[i], &v)) return -1;
        mt_jv_list_push(x->pool, *out, v);
    }
    return 0;
}

static int eval_concat(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jbuf b = {0};
    for (size_t i = 0; i < n->n; i++) {
        mt_jv v;
        if (mt_jx_eval(x, n->kids[i], &v)) return mt_jbuf_free(&b), -1;
        mt_jv_str(&b, v);
    }
    *out = mt_jx_str_from(x, &b);
    return 0;
}

static int eval_getitem(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jv obj, key;
    if (mt_jx_eval(x, n->a, &obj)) return -1;
    const mt_jnode *s = n->b;
    if (s->kind != MT_JN_SLICE) return mt_jx_eval(x, s, &key) || mt_jx_getitem(x, n->pos, obj, key, out);
    mt_jv v[3] = {mt_jv_none(), mt_jv_none(), mt_jv_none()};
    const mt_jnode *parts[3] = {s->a, s->b, s->c};
    for (int k = 0; k < 3; k++)
        if (parts[k] && mt_jx_eval(x, parts[k], &v[k])) return -1;
    return mt_jx_slice(x, n->pos, obj, v[0], v[1], v[2], out);
}

static int eval_unary(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jv v;
    if (mt_jx_eval(x, n->a, &v)) return -1;
    if (n->op == '!') return *out = mt_jv_bool(!mt_jv_truthy(v)), 0;
    if (v.type == MT_JV_UNDEF) return undefined_use(x, n->pos, v);
    if (!is_num(v)) return mt_jx_fail(x, n->pos, "bad operand type for unary %c: '%s'", n->op, mt_jv_type_name(v));
    if (n->op == '+') *out = v.type == MT_JV_BOOL ? mt_jv_int(v.b) : v;
    else *out = v.type == MT_JV_FLOAT ? mt_jv_float(-v.f) : mt_jv_int(-ival(v));
    return 0;
}

int mt_jx_eval(mt_jexec *x, const mt_jnode *n, mt_jv *out) {
    mt_jv a, b;
    switch ((mt_jnode_kind)n->kind) {
    case MT_JN_CONST: *out = n->val; return 0;
    case MT_JN_NAME: *out = mt_jx_lookup(x, n->name); return 0;
    case MT_JN_GETATTR: return mt_jx_eval(x, n->a, &a) || mt_jx_getattr(x, n->pos, a, n->name, out);
    case MT_JN_GETITEM: return eval_getitem(x, n, out);
    case MT_JN_CALL: return eval_call(x, n, out);
    case MT_JN_FILTER: return eval_filter(x, n, out);
    case MT_JN_TEST: return eval_test(x, n, out);
    case MT_JN_BINOP:
        return mt_jx_eval(x, n->a, &a) || mt_jx_eval(x, n->b, &b) || binop(x, n->pos, n->op, a, b, out);
    case MT_JN_UNARY: return eval_unary(x, n, out);
    case MT_JN_AND: case MT_JN_OR:
        if (mt_jx_eval(x, n->a, &a)) return -1;
        if (mt_jv_truthy(a) == (n->kind == MT_JN_OR)) return *out = a, 0;
        return mt_jx_eval(x, n->b, out);
    case MT_JN_COMPARE: return eval_compare(x, n, out);
    case MT_JN_COND:
        if (mt_jx_eval(x, n->a, &a)) return -1;
        if (mt_jv_truthy(a)) return mt_jx_eval(x, n->b, out);
        if (n->c) return mt_jx_eval(x, n->c, out);
        *out = mt_jv_undef("the conditional expression has no else branch");
        return 0;
    case MT_JN_LIST: case MT_JN_TUPLE: case MT_JN_DICT: return eval_items(x, n, out);
    case MT_JN_CONCAT: return eval_concat(x, n, out);
    default:
        MT_ASSERT(!"a statement where an expression belongs");
        return -1;
    }
}
