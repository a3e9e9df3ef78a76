/* Jinja statements: template text, {{ }} and the block tags (if, for,
 * set, macro, call, filter, generation, break, continue) into a syntax
 * tree, and the parse's entry point. Expressions: jinja_parse_expr.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja_parser.h"
#include "util/mem.h"

static mt_jnode *parse_body(parser *p, const char *const *stops);

static bool end_tag(parser *p) {
    if (cur(p)->type == MT_JT_BLOCK_END) return p->i++, true;
    mt_jp_fail(p, cur(p)->pos, "expected '%%}' here, found %s", cur(p)->type == MT_JT_OP ? cur(p)->op : mt_jp_describe(cur(p)));
    return false;
}

/* Names before '=' or 'in': one name or several (a tuple target). */
static bool parse_targets(parser *p, mt_jnode *n, const char *end_name) {
    const char *names[16];
    size_t k = 0;
    bool parens = accept_op(p, "(");
    do {
        if (k == 16) return mt_jp_fail(p, cur(p)->pos, "%s", "more than 16 names to assign"), false;
        if (!(names[k++] = mt_jp_expect_name(p))) return false;
    } while (accept_op(p, ",") && !(end_name && is_name(cur(p), end_name)));
    if (parens && !mt_jp_expect_op(p, ")")) return false;
    n->knames = mt_jpool_alloc(&p->t->pool, k * sizeof *n->knames);
    memcpy(n->knames, names, k * sizeof *names);
    n->nk = k;
    return true;
}

static mt_jnode *parse_if(parser *p, size_t pos) {
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    mt_jnode *n = mt_jp_node(p, MT_JN_IF, pos);
    n->a = mt_jp_tuple(p, false, false, NULL);
    if (!end_tag(p)) return NULL;
    n->b = parse_body(p, stops);
    if (p->failed) return NULL;
    const mt_jtok *t = next_tok(p);
    if (is_name(t, "elif")) return n->c = parse_if(p, t->pos), n;
    if (is_name(t, "else")) {
        if (!end_tag(p)) return NULL;
        n->c = parse_body(p, endif);
        if (p->failed) return NULL;
        p->i++;  // endif
    }
    return end_tag(p) ? n : NULL;
}

static mt_jnode *parse_for(parser *p, size_t pos) {
    static const char *const stops[] = {"endfor", "else", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    mt_jnode *n = mt_jp_node(p, MT_JN_FOR, pos);
    if (!parse_targets(p, n, "in")) return NULL;
    if (!accept_name(p, "in")) return mt_jp_fail(p, cur(p)->pos, "%s", "expected 'in' in a for tag");
    n->a = mt_jp_tuple(p, false, false, "recursive");
    if (accept_name(p, "if")) n->d = mt_jp_expr(p, true);
    if (is_name(cur(p), "recursive")) return mt_jp_fail(p, cur(p)->pos, "%s", "unsupported: recursive for loops");
    if (!end_tag(p)) return NULL;
    n->b = parse_body(p, stops);
    if (p->failed) return NULL;
    if (is_name(next_tok(p), "else")) {
        if (!end_tag(p)) return NULL;
        n->c = parse_body(p, endfor);
        if (p->failed) return NULL;
        p->i++;
    }
    return end_tag(p) ? n : NULL;
}

static mt_jnode *parse_set(parser *p, size_t pos) {
    static const char *const endset[] = {"endset", NULL};
    mt_jnode *n = mt_jp_node(p, MT_JN_SET, pos);
    if (cur(p)->type == MT_JT_NAME && is_op(&p->tok[p->i + 1], ".")) {  // set ns.attr = value
        n->name = mt_jp_expect_name(p);
        p->i++;
        n->attr = mt_jp_expect_name(p);
        if (!n->attr || !mt_jp_expect_op(p, "=")) return NULL;
        n->b = mt_jp_tuple(p, true, false, NULL);
        return end_tag(p) ? n : NULL;
    }
    if (!parse_targets(p, n, NULL)) return NULL;
    if (accept_op(p, "=")) {
        n->b = mt_jp_tuple(p, true, false, NULL);
        return end_tag(p) ? n : NULL;
    }
    if (n->nk != 1) return mt_jp_fail(p, pos, "%s", "a set block assigns one name");
    n->block = true;
    nodes filters = {0};
    while (!p->failed && accept_op(p, "|")) mt_jp_push(&filters, mt_jp_filter(p, NULL));
    n->kids = mt_jp_take(p, &filters, &n->n);
    if (!end_tag(p)) return NULL;
    n->b = parse_body(p, endset);
    if (p->failed) return NULL;
    p->i++;
    return end_tag(p) ? n : NULL;
}

/* Parameters of a macro or call block: (name [= default], ...). */
static bool parse_params(parser *p, mt_jnode *n) {
    const char *names[32];
    mt_jnode *defs[32];
    size_t k = 0;
    if (!mt_jp_expect_op(p, "(")) return false;
    while (!p->failed && !is_op(cur(p), ")")) {
        if (k && !mt_jp_expect_op(p, ",")) return false;
        if (k == 32) return mt_jp_fail(p, cur(p)->pos, "%s", "more than 32 parameters"), false;
        names[k] = mt_jp_expect_name(p);
        defs[k] = accept_op(p, "=") ? mt_jp_expr(p, true) : NULL;
        k++;
    }
    if (p->failed || !mt_jp_expect_op(p, ")")) return false;
    n->nk = k;
    n->knames = mt_jpool_alloc(&p->t->pool, (k ? k : 1) * sizeof *n->knames);
    n->kvals = mt_jpool_alloc(&p->t->pool, (k ? k : 1) * sizeof *n->kvals);
    memcpy(n->knames, names, k * sizeof *names);
    memcpy(n->kvals, defs, k * sizeof *defs);
    return true;
}

static mt_jnode *parse_macro(parser *p, size_t pos) {
    static const char *const end[] = {"endmacro", NULL};
    mt_jnode *n = mt_jp_node(p, MT_JN_MACRO, pos);
    n->name = mt_jp_expect_name(p);
    if (!n->name || !parse_params(p, n) || !end_tag(p)) return NULL;
    n->b = parse_body(p, end);
    if (p->failed) return NULL;
    p->i++;
    return end_tag(p) ? n : NULL;
}

static mt_jnode *parse_call_block(parser *p, size_t pos) {
    static const char *const end[] = {"endcall", NULL};
    mt_jnode *n = mt_jp_node(p, MT_JN_CALLBLOCK, pos);
    if (is_op(cur(p), "(") && !parse_params(p, n)) return NULL;
    n->a = mt_jp_expr(p, true);
    if (p->failed) return NULL;
    if (!n->a || n->a->kind != MT_JN_CALL) return mt_jp_fail(p, pos, "%s", "a call block needs a macro call");
    if (!end_tag(p)) return NULL;
    n->b = parse_body(p, end);
    if (p->failed) return NULL;
    p->i++;
    return end_tag(p) ? n : NULL;
}

/* Statements that hold a body closed by one end tag: filter, generation. */
static mt_jnode *parse_wrapper(parser *p, size_t pos, mt_jnode_kind kind, const char *end_name) {
    const char *const end[] = {end_name, NULL};
    mt_jnode *n = mt_jp_node(p, kind, pos);
    if (kind == MT_JN_FILTERBLOCK) {
        nodes filters = {0};
        do mt_jp_push(&filters, mt_jp_filter(p, NULL));
        while (!p->failed && accept_op(p, "|"));
        n->kids = mt_jp_take(p, &filters, &n->n);
    }
    if (p->failed || !end_tag(p)) return NULL;
    n->b = parse_body(p, end);
    if (p->failed) return NULL;
    p->i++;
    return end_tag(p) ? n : NULL;
}

static mt_jnode *parse_statement_named(parser *p, const mt_jtok *t);

static mt_jnode *parse_statement(parser *p) {
    const mt_jtok *t = cur(p);
    if (t->type != MT_JT_NAME) return mt_jp_fail(p, t->pos, "expected a tag name after '{%%', found %s", mt_jp_describe(t));
    p->i++;
    if (!mt_jp_enter(p)) return NULL;
    mt_jnode *n = parse_statement_named(p, t);
    p->depth--;
    return n;
}

static mt_jnode *parse_statement_named(parser *p, const mt_jtok *t) {
    if (is_name(t, "if")) return parse_if(p, t->pos);
    if (is_name(t, "for")) return parse_for(p, t->pos);
    if (is_name(t, "set")) return parse_set(p, t->pos);
    if (is_name(t, "macro")) return parse_macro(p, t->pos);
    if (is_name(t, "call")) return parse_call_block(p, t->pos);
    if (is_name(t, "filter")) return parse_wrapper(p, t->pos, MT_JN_FILTERBLOCK, "endfilter");
    if (is_name(t, "generation")) {
        p->t->has_generation = true;
        return parse_wrapper(p, t->pos, MT_JN_GENERATION, "endgeneration");
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        mt_jnode *n = mt_jp_node(p, is_name(t, "break") ? MT_JN_BREAK : MT_JN_CONTINUE, t->pos);
        return end_tag(p) ? n : NULL;
    }
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(t->n < 60 ? t->n : 60), t->s);
    if (!strncmp(name, "end", 3) || !strcmp(name, "else") || !strcmp(name, "elif"))
        return mt_jp_fail(p, t->pos, "'%s' without the tag it closes", name);
    return mt_jp_fail(p, t->pos, "unsupported tag '%s'", name);
}

static bool is_stop(const mt_jtok *t, const char *const *stops) {
    for (size_t k = 0; stops && stops[k]; k++)
        if (is_name(t, stops[k])) return true;
    return false;
}

/* Statements up to a {% tag whose name is in stops (left as the current
 * token), or the end of the template when stops is NULL. */
static mt_jnode *parse_body(parser *p, const char *const *stops) {
    mt_jnode *body = mt_jp_node(p, MT_JN_BODY, cur(p)->pos);
    nodes items = {0};
    while (!p->failed) {
        const mt_jtok *t = cur(p);
        if (t->type == MT_JT_EOF) {
            if (stops) mt_jp_fail(p, t->pos, "the template ends before {%% %s %%}", stops[0]);
            break;
        }
        if (t->type == MT_JT_DATA) {
            mt_jnode *d = mt_jp_node(p, MT_JN_DATA, t->pos);
            d->val = mt_jv_strn(t->s, t->n);
            mt_jp_push(&items, d);
            p->i++;
        } else if (t->type == MT_JT_VAR_BEGIN) {
            p->i++;
            mt_jnode *n = mt_jp_node(p, MT_JN_PRINT, t->pos);
            n->a = mt_jp_tuple(p, true, false, NULL);
            if (!p->failed && cur(p)->type != MT_JT_VAR_END)
                mt_jp_fail(p, cur(p)->pos, "expected '}}' here, found %s", cur(p)->type == MT_JT_OP ? cur(p)->op : mt_jp_describe(cur(p)));
            p->i++;
            mt_jp_push(&items, n);
        } else if (t->type == MT_JT_BLOCK_BEGIN) {
            if (is_stop(&p->tok[p->i + 1], stops)) {
                p->i++;
                break;
            }
            p->i++;
            mt_jp_push(&items, parse_statement(p));
        } else {
            mt_jp_fail(p, t->pos, "unexpected %s", mt_jp_describe(t));
        }
    }
    body->kids = mt_jp_take(p, &items, &body->n);
    return body;
}

mt_jinja *mt_jinja_parse(const char *name, const char *src, size_t len, mt_error *err) {
    mt_jinja *t = mt_calloc_or_die(1, sizeof *t);
    t->name = mt_strdup_or_die(name);
    if (mt_jinja_lex(name, src, len, &t->pool, &t->toks, err)) {
        mt_jinja_free(t);
        return NULL;
    }
    parser p = {t, t->toks.t, 0, err, false, 0};
    t->root = parse_body(&p, NULL);
    if (p.failed) {
        mt_jinja_free(t);
        return NULL;
    }
    return t;
}

void mt_jinja_free(mt_jinja *t) {
    if (!t) return;
    mt_jtoks_free(&t->toks);
    mt_jpool_free(&t->pool);
    free(t->name);
    free(t);
}

bool mt_jinja_has_generation(const mt_jinja *t) { return t->has_generation; }
const char *mt_jinja_name(const mt_jinja *t) { return t->name; }
