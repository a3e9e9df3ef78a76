/* Jinja expressions: tokens -> syntax tree by jinja2's grammar
 * (jinja2/parser.py): the same precedence (or < and < not < comparisons <
 * + - < ~ < * / // % < ** < unary - + < filters, tests, calls, subscripts),
 * conditional expressions, implicit tuples, adjacent string literals
 * joined. Filter and test names are resolved here, so an unknown one fails
 * before any render. Also the parser's helpers (jinja_parser.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja_parser.h"
#include "util/mem.h"

void mt_jp_push(nodes *a, mt_jnode *n) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 8;
        a->v = mt_realloc_or_die(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = n;
}

mt_jnode **mt_jp_take(parser *p, nodes *a, size_t *n) {
    *n = a->n;
    mt_jnode **r = a->n ? mt_jpool_alloc(&p->t->pool, a->n * sizeof *r) : NULL;
    if (a->n) memcpy(r, a->v, a->n * sizeof *r);
    free(a->v);
    memset(a, 0, sizeof *a);
    return r;
}

mt_jnode *mt_jp_node(parser *p, mt_jnode_kind kind, size_t pos) {
    mt_jnode *n = mt_jpool_alloc(&p->t->pool, sizeof *n);
    n->kind = (uint8_t)kind;
    n->pos = (uint32_t)pos;
    return n;
}

mt_jnode *mt_jp_fail(parser *p, size_t pos, const char *fmt, const char *arg) {
    if (p->failed) return NULL;
    char where[256], msg[512];
    snprintf(msg, sizeof msg, fmt, arg);
    mt_jinja_where(where, sizeof where, p->t->name, p->t->toks.src, pos);
    mt_errorf(p->err, "%s: %s", where, msg);
    p->failed = true;
    return NULL;
}

const char *mt_jp_name_of(parser *p, const mt_jtok *t) { return mt_jpool_strdup(&p->t->pool, t->s, t->n); }

const char *mt_jp_describe(const mt_jtok *t) {
    switch ((mt_jtok_type)t->type) {
    case MT_JT_VAR_END: return "'}}'";
    case MT_JT_BLOCK_END: return "'%}'";
    case MT_JT_EOF: return "the end of the template";
    case MT_JT_DATA: return "template text";
    default: return "another token";
    }
}

bool mt_jp_expect_op(parser *p, const char *op) {
    if (accept_op(p, op)) return true;
    char what[64];
    snprintf(what, sizeof what, "expected '%s', found %%s", op);
    mt_jp_fail(p, cur(p)->pos, what, cur(p)->type == MT_JT_OP ? cur(p)->op : mt_jp_describe(cur(p)));
    return false;
}

const char *mt_jp_expect_name(parser *p) {
    if (cur(p)->type == MT_JT_NAME) return mt_jp_name_of(p, next_tok(p));
    mt_jp_fail(p, cur(p)->pos, "expected a name, found %s", mt_jp_describe(cur(p)));
    return NULL;
}

bool mt_jp_enter(parser *p) {
    if (++p->depth <= MAX_NESTING) return true;
    mt_jp_fail(p, cur(p)->pos, "expressions or blocks nest more than %s deep", "200");
    return false;
}

/* ---- expressions ---- */

static mt_jnode *parse_or(parser *p);
static mt_jnode *parse_unary(parser *p, bool with_filter);

/* Arguments of a call: ( positional..., name=value... ). */
static bool parse_args(parser *p, mt_jnode *n) {
    nodes pos = {0}, kw = {0};
    const char *names[64];
    size_t nk = 0;
    if (!mt_jp_expect_op(p, "(")) return false;
    while (!p->failed && !is_op(cur(p), ")")) {
        if ((pos.n || nk) && !mt_jp_expect_op(p, ",")) break;
        if (is_op(cur(p), ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**")) {
            mt_jp_fail(p, cur(p)->pos, "unsupported: %s arguments in a call", cur(p)->op);
            break;
        }
        if (cur(p)->type == MT_JT_NAME && is_op(&p->tok[p->i + 1], "=")) {
            if (nk == 64) { mt_jp_fail(p, cur(p)->pos, "%s", "more than 64 keyword arguments"); break; }
            names[nk++] = mt_jp_name_of(p, next_tok(p));
            p->i++;
            mt_jp_push(&kw, mt_jp_expr(p, true));
        } else {
            if (nk) { mt_jp_fail(p, cur(p)->pos, "%s", "a positional argument follows keyword arguments"); break; }
            mt_jp_push(&pos, mt_jp_expr(p, true));
        }
    }
    if (!p->failed) mt_jp_expect_op(p, ")");
    n->kids = mt_jp_take(p, &pos, &n->n);
    n->kvals = mt_jp_take(p, &kw, &n->nk);
    n->knames = nk ? mt_jpool_alloc(&p->t->pool, nk * sizeof *n->knames) : NULL;
    for (size_t k = 0; k < nk; k++) n->knames[k] = names[k];
    return !p->failed;
}

/* Inside [ ]: an index or a slice a:b:c. */
static mt_jnode *parse_subscribed(parser *p) {
    size_t pos = cur(p)->pos;
    mt_jnode *args[3] = {NULL, NULL, NULL};
    if (!is_op(cur(p), ":")) {
        mt_jnode *e = mt_jp_expr(p, true);
        if (!is_op(cur(p), ":")) return e;
        args[0] = e;
    }
    p->i++;  // the first ':'
    if (!is_op(cur(p), "]") && !is_op(cur(p), ",") && !is_op(cur(p), ":")) args[1] = mt_jp_expr(p, true);
    if (accept_op(p, ":") && !is_op(cur(p), "]") && !is_op(cur(p), ",")) args[2] = mt_jp_expr(p, true);
    mt_jnode *s = mt_jp_node(p, MT_JN_SLICE, pos);
    s->a = args[0], s->b = args[1], s->c = args[2];
    return s;
}

static mt_jnode *parse_postfix(parser *p, mt_jnode *n) {
    while (!p->failed) {
        const mt_jtok *t = cur(p);
        if (is_op(t, ".")) {
            p->i++;
            if (cur(p)->type == MT_JT_INT) {
                mt_jnode *g = mt_jp_node(p, MT_JN_GETITEM, t->pos), *k = mt_jp_node(p, MT_JN_CONST, t->pos);
                k->val = mt_jv_int(next_tok(p)->i);
                g->a = n, g->b = k, n = g;
                continue;
            }
            mt_jnode *g = mt_jp_node(p, MT_JN_GETATTR, t->pos);
            g->a = n, g->name = mt_jp_expect_name(p), n = g;
        } else if (is_op(t, "[")) {
            p->i++;
            mt_jnode *g = mt_jp_node(p, MT_JN_GETITEM, t->pos);
            g->a = n, g->b = parse_subscribed(p), n = g;
            if (is_op(cur(p), ",")) return mt_jp_fail(p, cur(p)->pos, "%s", "unsupported: a tuple as an index");
            mt_jp_expect_op(p, "]");
        } else if (is_op(t, "(")) {
            mt_jnode *c = mt_jp_node(p, MT_JN_CALL, t->pos);
            c->a = n;
            parse_args(p, c);
            n = c;
        } else {
            break;
        }
    }
    return n;
}

/* A dotted filter or test name (jinja allows `a.b`). */
static const char *dotted_name(parser *p) {
    const char *name = mt_jp_expect_name(p);
    while (name && is_op(cur(p), ".")) {
        p->i++;
        const char *more = mt_jp_expect_name(p);
        if (!more) return NULL;
        size_t a = strlen(name), b = strlen(more);
        char *s = mt_jpool_alloc(&p->t->pool, a + b + 2);
        memcpy(s, name, a), s[a] = '.', memcpy(s + a + 1, more, b);
        name = s;
    }
    return name;
}

mt_jnode *mt_jp_filter(parser *p, mt_jnode *n) {
    mt_jnode *f = mt_jp_node(p, MT_JN_FILTER, cur(p)->pos);
    f->a = n;
    f->name = dotted_name(p);
    if (!f->name) return NULL;
    f->fn = mt_jinja_filter_find(f->name);
    if (f->fn < 0) return mt_jp_fail(p, f->pos, "unsupported filter '%s'", f->name);
    if (is_op(cur(p), "(")) parse_args(p, f);
    return f;
}

static mt_jnode *parse_test(parser *p, mt_jnode *n) {
    mt_jnode *t = mt_jp_node(p, MT_JN_TEST, cur(p)->pos);
    t->a = n;
    t->neg = accept_name(p, "not");
    t->name = dotted_name(p);
    if (!t->name) return NULL;
    t->fn = mt_jinja_test_find(t->name);
    if (t->fn < 0) return mt_jp_fail(p, t->pos, "unsupported test '%s'", t->name);
    const mt_jtok *c = cur(p);
    if (is_op(c, "(")) {
        parse_args(p, t);
    } else if ((c->type == MT_JT_NAME || c->type == MT_JT_STRING || c->type == MT_JT_INT ||
                c->type == MT_JT_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        mt_jnode *arg = parse_postfix(p, parse_unary(p, false));  // `is divisibleby 3`
        t->kids = mt_jpool_alloc(&p->t->pool, sizeof *t->kids);
        t->kids[0] = arg, t->n = 1;
    }
    return t;
}

static mt_jnode *parse_filter_expr(parser *p, mt_jnode *n) {
    while (!p->failed && n) {
        if (accept_op(p, "|")) n = mt_jp_filter(p, n);
        else if (accept_name(p, "is")) n = parse_test(p, n);
        else if (is_op(cur(p), "(")) n = parse_postfix(p, n);
        else break;
    }
    return n;
}

static mt_jnode *parse_list_or_dict(parser *p, bool dict) {
    mt_jnode *n = mt_jp_node(p, dict ? MT_JN_DICT : MT_JN_LIST, cur(p)->pos);
    nodes items = {0};
    p->i++;
    const char *close = dict ? "}" : "]";
    while (!p->failed && !is_op(cur(p), close)) {
        if (items.n && !mt_jp_expect_op(p, ",")) break;
        if (is_op(cur(p), close)) break;
        mt_jp_push(&items, mt_jp_expr(p, true));
        if (dict && mt_jp_expect_op(p, ":")) mt_jp_push(&items, mt_jp_expr(p, true));
    }
    if (!p->failed) mt_jp_expect_op(p, close);
    n->kids = mt_jp_take(p, &items, &n->n);
    return n;
}

static mt_jnode *parse_primary(parser *p) {
    const mt_jtok *t = cur(p);
    mt_jnode *n;
    switch ((mt_jtok_type)t->type) {
    case MT_JT_NAME:
        p->i++;
        n = mt_jp_node(p, MT_JN_CONST, t->pos);
        if (is_name(t, "true") || is_name(t, "True")) n->val = mt_jv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->val = mt_jv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->val = mt_jv_none();
        else n->kind = MT_JN_NAME, n->name = mt_jp_name_of(p, t);
        return n;
    case MT_JT_STRING: {
        mt_jbuf b = {0};
        while (cur(p)->type == MT_JT_STRING) mt_jbuf_put(&b, cur(p)->s, cur(p)->n), p->i++;
        n = mt_jp_node(p, MT_JN_CONST, t->pos);
        n->val = mt_jv_str_copy(&p->t->pool, b.p ? b.p : "", b.n);
        mt_jbuf_free(&b);
        return n;
    }
    case MT_JT_INT: case MT_JT_FLOAT:
        p->i++;
        n = mt_jp_node(p, MT_JN_CONST, t->pos);
        n->val = t->type == MT_JT_INT ? mt_jv_int(t->i) : mt_jv_float(t->f);
        return n;
    default:
        break;
    }
    if (accept_op(p, "(")) {
        n = mt_jp_tuple(p, true, true, NULL);
        mt_jp_expect_op(p, ")");
        return n;
    }
    if (is_op(t, "[")) return parse_list_or_dict(p, false);
    if (is_op(t, "{")) return parse_list_or_dict(p, true);
    return mt_jp_fail(p, t->pos, "unexpected %s in an expression", t->type == MT_JT_OP ? t->op : mt_jp_describe(t));
}

static mt_jnode *parse_unary(parser *p, bool with_filter) {
    const mt_jtok *t = cur(p);
    mt_jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->i++;
        n = mt_jp_node(p, MT_JN_UNARY, t->pos);
        n->op = t->op[0];
        if (!mt_jp_enter(p)) return NULL;
        n->a = parse_unary(p, false);
        p->depth--;
    } else {
        n = parse_primary(p);
    }
    if (!n) return NULL;
    n = parse_postfix(p, n);
    return with_filter ? parse_filter_expr(p, n) : n;
}

static mt_jnode *binop(parser *p, const mt_jtok *t, char op, mt_jnode *a, mt_jnode *b) {
    mt_jnode *n = mt_jp_node(p, MT_JN_BINOP, t->pos);
    n->op = op, n->a = a, n->b = b;
    return n;
}

static mt_jnode *parse_pow(parser *p) {
    mt_jnode *n = parse_unary(p, true);
    while (!p->failed && is_op(cur(p), "**")) {
        const mt_jtok *t = next_tok(p);
        n = binop(p, t, 'P', n, parse_unary(p, true));
    }
    return n;
}

static mt_jnode *parse_math2(parser *p) {
    mt_jnode *n = parse_pow(p);
    for (;;) {
        const mt_jtok *t = cur(p);
        char op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'F' : is_op(t, "%") ? '%' : 0;
        if (!op || p->failed) return n;
        p->i++;
        n = binop(p, t, op, n, parse_pow(p));
    }
}

static mt_jnode *parse_concat(parser *p) {
    mt_jnode *first = parse_math2(p);
    if (!is_op(cur(p), "~")) return first;
    mt_jnode *n = mt_jp_node(p, MT_JN_CONCAT, cur(p)->pos);
    nodes args = {0};
    mt_jp_push(&args, first);
    while (!p->failed && accept_op(p, "~")) mt_jp_push(&args, parse_math2(p));
    n->kids = mt_jp_take(p, &args, &n->n);
    return n;
}

static mt_jnode *parse_math1(parser *p) {
    mt_jnode *n = parse_concat(p);
    for (;;) {
        const mt_jtok *t = cur(p);
        char op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op || p->failed) return n;
        p->i++;
        n = binop(p, t, op, n, parse_concat(p));
    }
}

static char compare_op(parser *p) {
    static const char *const ops[] = {"==", "!=", "<", ">", "<=", ">="};
    const char codes[] = "=!<>lg";
    for (int k = 0; k < 6; k++)
        if (accept_op(p, ops[k])) return codes[k];
    if (accept_name(p, "in")) return 'i';
    if (is_name(cur(p), "not") && is_name(&p->tok[p->i + 1], "in")) return p->i += 2, 'n';
    return 0;
}

static mt_jnode *parse_compare(parser *p) {
    size_t pos = cur(p)->pos;
    mt_jnode *first = parse_math1(p);
    char op = compare_op(p);
    if (!op) return first;
    mt_jnode *n = mt_jp_node(p, MT_JN_COMPARE, pos);
    nodes rest = {0};
    char ops[32];
    size_t k = 0;
    n->a = first;
    for (; op && !p->failed; op = compare_op(p)) {
        if (k == sizeof ops) return mt_jp_fail(p, pos, "%s", "more than 32 comparisons in a chain");
        ops[k++] = op;
        mt_jp_push(&rest, parse_math1(p));
    }
    n->kids = mt_jp_take(p, &rest, &n->n);
    n->ops = mt_jpool_strdup(&p->t->pool, ops, k);
    return n;
}

static mt_jnode *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        mt_jnode *n = mt_jp_node(p, MT_JN_UNARY, next_tok(p)->pos);
        n->op = '!';
        if (!mt_jp_enter(p)) return NULL;
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static mt_jnode *parse_and(parser *p) {
    mt_jnode *n = parse_not(p);
    while (!p->failed && is_name(cur(p), "and")) {
        mt_jnode *a = mt_jp_node(p, MT_JN_AND, next_tok(p)->pos);
        a->a = n, a->b = parse_not(p), n = a;
    }
    return n;
}

static mt_jnode *parse_or(parser *p) {
    mt_jnode *n = parse_and(p);
    while (!p->failed && is_name(cur(p), "or")) {
        mt_jnode *o = mt_jp_node(p, MT_JN_OR, next_tok(p)->pos);
        o->a = n, o->b = parse_and(p), n = o;
    }
    return n;
}

mt_jnode *mt_jp_expr(parser *p, bool condexpr) {
    if (!mt_jp_enter(p)) return NULL;
    mt_jnode *n = parse_or(p);
    while (condexpr && !p->failed && is_name(cur(p), "if")) {
        mt_jnode *c = mt_jp_node(p, MT_JN_COND, next_tok(p)->pos);
        c->b = n;
        c->a = parse_or(p);
        if (accept_name(p, "else")) c->c = mt_jp_expr(p, true);
        n = c;
    }
    p->depth--;
    return n;
}

static bool tuple_end(parser *p, const char *end_name) {
    const mt_jtok *t = cur(p);
    return t->type == MT_JT_VAR_END || t->type == MT_JT_BLOCK_END || is_op(t, ")") ||
           (end_name && is_name(t, end_name)) || is_op(t, "=");
}

/* Expressions separated by commas: one expression, or a tuple. */
mt_jnode *mt_jp_tuple(parser *p, bool condexpr, bool parens, const char *end_name) {
    size_t pos = cur(p)->pos;
    nodes items = {0};
    bool is_tuple = false;
    while (!p->failed) {
        if (items.n && !mt_jp_expect_op(p, ",")) break;
        if (tuple_end(p, end_name)) break;
        mt_jp_push(&items, mt_jp_expr(p, condexpr));
        if (!is_op(cur(p), ",")) break;
        is_tuple = true;
    }
    if (p->failed) return free(items.v), NULL;
    if (!is_tuple && items.n == 1) {
        mt_jnode *n = items.v[0];
        free(items.v);
        return n;
    }
    if (!is_tuple && !parens) return free(items.v), mt_jp_fail(p, pos, "%s", "expected an expression");
    mt_jnode *n = mt_jp_node(p, MT_JN_TUPLE, pos);
    n->kids = mt_jp_take(p, &items, &n->n);
    return n;
}
