/* The parser's state and the helpers that jinja_parse_expr.c (which
 * defines them, with the expressions) and jinja_parse.c (the statements)
 * share. Private to those two files. */
#ifndef MT_DATA_JINJA_PARSER_H
#define MT_DATA_JINJA_PARSER_H

#include <string.h>

#include "data/jinja/jinja_internal.h"

typedef struct parser {
    mt_jinja *t;
    const mt_jtok *tok;
    size_t i;
    mt_error *err;
    bool failed;
    int depth;  // nesting of expressions and blocks being parsed
} parser;

/* Deeper nesting is refused: the parser and the renderer recurse. */
enum { MAX_NESTING = 200 };

/* A growable array of node pointers (heap), copied into the pool when done. */
typedef struct nodes {
    mt_jnode **v;
    size_t n, cap;
} nodes;

static inline const mt_jtok *cur(parser *p) { return &p->tok[p->i]; }

static inline const mt_jtok *next_tok(parser *p) {
    const mt_jtok *t = cur(p);
    if (t->type != MT_JT_EOF) p->i++;
    return t;
}

static inline bool is_op(const mt_jtok *t, const char *op) { return t->type == MT_JT_OP && !strcmp(t->op, op); }

static inline bool is_name(const mt_jtok *t, const char *name) {
    return t->type == MT_JT_NAME && t->n == strlen(name) && !memcmp(t->s, name, t->n);
}

static inline bool accept_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) return false;
    p->i++;
    return true;
}

static inline bool accept_name(parser *p, const char *name) {
    if (!is_name(cur(p), name)) return false;
    p->i++;
    return true;
}

/* Appends n to a growable array; mt_jp_take moves the array into the pool. */
void mt_jp_push(nodes *a, mt_jnode *n);
mt_jnode **mt_jp_take(parser *p, nodes *a, size_t *n);
/* A zeroed node of the template's pool. */
mt_jnode *mt_jp_node(parser *p, mt_jnode_kind kind, size_t pos);
/* Records the first error ("NAME:LINE:COL: " + fmt with arg) and stops the
 * parse; returns NULL. */
mt_jnode *mt_jp_fail(parser *p, size_t pos, const char *fmt, const char *arg);
/* A token's name copied into the pool. */
const char *mt_jp_name_of(parser *p, const mt_jtok *t);
/* What a non-expression token is, for messages. */
const char *mt_jp_describe(const mt_jtok *t);
/* Consumes op or the name at the current token, else fails. */
bool mt_jp_expect_op(parser *p, const char *op);
const char *mt_jp_expect_name(parser *p);
/* Counts one more level of nesting; false (failed) past MAX_NESTING. The
 * caller decrements p->depth when it leaves. */
bool mt_jp_enter(parser *p);

/* An expression (with `a if b else c` when condexpr). */
mt_jnode *mt_jp_expr(parser *p, bool condexpr);
/* Expressions separated by commas up to the tag's end, `)` or end_name: one
 * expression, or a tuple (an empty one only inside parentheses). */
mt_jnode *mt_jp_tuple(parser *p, bool condexpr, bool parens, const char *end_name);
/* A filter at the current token (its name, then optional arguments),
 * applied to n (NULL in set and filter blocks). */
mt_jnode *mt_jp_filter(parser *p, mt_jnode *n);

#endif
