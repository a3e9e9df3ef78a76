/* Internals shared by the files of the Jinja engine (not a public header).
 *
 * jinja_str.c      Python's str methods on UTF-8 bytes
 * jinja_value.c    values, the pool, truth, equality, str() and repr()
 * jinja_json.c     json.loads into values, json.dumps out of them
 * jinja_lex.c      source -> tokens (whitespace control, trim/lstrip_blocks)
 * jinja_call.c     attribute and item access, methods, global functions
 * jinja_filters.c  filters and tests
 * jinja_parse_expr.c  tokens -> expressions (and the parser's helpers,
 *                  jinja_parser.h)
 * jinja_parse.c    tokens -> statements (mt_jinja_parse)
 * jinja_eval.c     expressions
 * jinja_exec.c     statements, scopes, output (mt_jinja_render)
 *
 * Each file uses only those listed before it, except that an expression
 * calling a macro runs statements: jinja_eval.c does so through
 * mt_jexec.call_macro, which jinja_exec.c sets. */
#ifndef MT_DATA_JINJA_INTERNAL_H
#define MT_DATA_JINJA_INTERNAL_H

#include <string.h>

#include "data/jinja/jinja.h"

/* ---- tokens (jinja_lex.c) ---- */

typedef enum mt_jtok_type {
    MT_JT_DATA,         // template text (s, n: with whitespace control applied)
    MT_JT_VAR_BEGIN,    // {{
    MT_JT_VAR_END,      // }}
    MT_JT_BLOCK_BEGIN,  // {%
    MT_JT_BLOCK_END,    // %}
    MT_JT_NAME,         // s, n: the identifier
    MT_JT_STRING,       // s, n: the decoded literal
    MT_JT_INT,          // i
    MT_JT_FLOAT,        // f
    MT_JT_OP,           // op: "+", "//", "==", "(", ...
    MT_JT_EOF,
} mt_jtok_type;

typedef struct mt_jtok {
    uint8_t type;
    char op[3];
    uint32_t pos;  // byte offset in the (newline-normalised) source
    const char *s;
    size_t n;
    int64_t i;
    double f;
} mt_jtok;

typedef struct mt_jtoks {
    mt_jtok *t;  // (n), the last MT_JT_EOF
    size_t n, cap;
    char *src;   // the source with newlines normalised, as positions count
    size_t len;
} mt_jtoks;

/* Tokenises src (newlines normalised to \n and one trailing newline
 * dropped, as jinja2 does); strings live in pool. -1 with err. */
int mt_jinja_lex(const char *name, const char *src, size_t len, mt_jpool *pool, mt_jtoks *out,
                 mt_error *err);
void mt_jtoks_free(mt_jtoks *t);
/* "NAME:LINE:COL" of byte pos of src, into buf. */
const char *mt_jinja_where(char *buf, size_t cap, const char *name, const char *src, size_t pos);

/* ---- syntax tree (jinja_parse.c, jinja_parse_expr.c) ---- */

typedef enum mt_jnode_kind {
    // expressions
    MT_JN_CONST,    // val
    MT_JN_NAME,     // name
    MT_JN_GETATTR,  // a.name
    MT_JN_GETITEM,  // a[b]; b may be a MT_JN_SLICE
    MT_JN_SLICE,    // a:b:c (each may be NULL)
    MT_JN_CALL,     // a(kids..., knames=kvals...)
    MT_JN_FILTER,   // a | name(kids..., kw...); fn: the filter
    MT_JN_TEST,     // a is [not] name(kids...); fn: the test
    MT_JN_BINOP,    // a op b; op: + - * / % ~ F (//) P (**)
    MT_JN_UNARY,    // op a; op: - + !
    MT_JN_AND,      // a and b
    MT_JN_OR,       // a or b
    MT_JN_COMPARE,  // a ops[0] kids[0] ops[1] kids[1] ...; ops: = ! < > l g i n
    MT_JN_COND,     // b if a else c
    MT_JN_LIST,     // [kids]
    MT_JN_TUPLE,    // (kids)
    MT_JN_DICT,     // {kids[0]: kids[1], ...}
    MT_JN_CONCAT,   // kids[0] ~ kids[1] ~ ...
    // statements
    MT_JN_BODY,     // kids: statements in order
    MT_JN_DATA,     // val: template text
    MT_JN_PRINT,    // {{ a }}
    MT_JN_IF,       // if a: b else c (c: a body, an elif's MT_JN_IF, or NULL)
    MT_JN_FOR,      // for knames in a [if d]: b else c
    MT_JN_SET,      // set knames = b | set name.attr = b | set knames[0] (kids: filters) = body b
    MT_JN_MACRO,    // macro name(knames = kvals defaults): b
    MT_JN_CALLBLOCK,// call(knames) a: b
    MT_JN_FILTERBLOCK, // filter kids: b
    MT_JN_BREAK,
    MT_JN_CONTINUE,
    MT_JN_GENERATION,  // generation: b
} mt_jnode_kind;

typedef struct mt_jnode mt_jnode;
struct mt_jnode {
    uint8_t kind;
    char op;
    bool neg;             // MT_JN_TEST: `is not`
    bool block;           // MT_JN_SET: a {% set %}...{% endset %} block
    int fn;               // MT_JN_FILTER / MT_JN_TEST: index in the table
    uint32_t pos;
    mt_jv val;
    const char *name, *attr;
    mt_jnode *a, *b, *c, *d;
    mt_jnode **kids;      // (n)
    size_t n;
    char *ops;            // MT_JN_COMPARE: (n)
    const char **knames;  // (nk)
    mt_jnode **kvals;     // (nk); NULL entries: no default
    size_t nk;
};

struct mt_jinja {
    char *name;
    mt_jtoks toks;    // the normalised source, for positions
    mt_jpool pool;    // nodes and constants
    mt_jnode *root;   // MT_JN_BODY
    bool has_generation;
};

/* ---- execution (jinja_exec.c, jinja_eval.c) ---- */

typedef struct mt_jscope mt_jscope;
struct mt_jscope {
    mt_jscope *parent;
    const char **names;
    mt_jv *vals;  // (n)
    size_t n, cap;
};

typedef struct mt_jmacro {
    const mt_jnode *def;  // MT_JN_MACRO
    mt_jscope *scope;     // where it was defined
} mt_jmacro;

typedef struct mt_jloop {
    mt_jv items;  // a list
    size_t i;     // current index
} mt_jloop;

typedef struct mt_jexec mt_jexec;
struct mt_jexec {
    const mt_jinja *t;
    mt_jpool *pool;
    mt_jscope *scope;      // innermost; its last parent holds the render's variables
    mt_jinja_out *out;     // top-level output
    mt_jbuf *capture;      // non-NULL: output goes here (set blocks, macros)
    int32_t msg;           // message index of the innermost loop over messages, -1
    int gen;               // depth of generation blocks
    int depth;             // macro calls in progress
    int64_t now;
    mt_error *err;
    mt_jv caller;          // the caller() of the macro being run by a call block
    /* Runs macro m with the arguments (jinja_exec.c); 0 with *out. */
    int (*call_macro)(mt_jexec *x, uint32_t pos, mt_jv m, const mt_jv *args, size_t nargs,
                      const char **knames, const mt_jv *kvals, size_t nk, mt_jv *out);
};

/* Fills x->err with "NAME:LINE:COL: message" and returns -1. */
int mt_jx_fail(mt_jexec *x, uint32_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- attribute and item access, calls (jinja_call.c) ---- */

/* obj.name as jinja2's sandbox resolves it: a method of str/dict, a dict
 * item, a namespace attribute, a loop attribute; Undefined when missing,
 * an error on an Undefined obj. */
int mt_jx_getattr(mt_jexec *x, uint32_t pos, mt_jv obj, const char *name, mt_jv *out);
/* obj[key]: list/str index (negative from the end), dict item; Undefined
 * when missing. */
int mt_jx_getitem(mt_jexec *x, uint32_t pos, mt_jv obj, mt_jv key, mt_jv *out);
/* obj[a:b:c] (a, b, c: None or int) of a str, list or tuple. */
int mt_jx_slice(mt_jexec *x, uint32_t pos, mt_jv obj, mt_jv a, mt_jv b, mt_jv c, mt_jv *out);
/* Calls a method or global function with positional and keyword args. */
int mt_jx_call_builtin(mt_jexec *x, uint32_t pos, mt_jv fn, const mt_jv *args, size_t nargs,
                       const char **knames, const mt_jv *kvals, size_t nk, mt_jv *out);
/* The global function called name (range, namespace, ...), or an Undefined. */
mt_jv mt_jx_global(const char *name);
/* The items of an iterable (list, tuple, str characters, dict keys) as a
 * list; an Undefined iterates as empty. -1 naming the type otherwise. */
int mt_jx_iter(mt_jexec *x, uint32_t pos, mt_jv v, mt_jv *list);
/* A string made in the buffer, moved into the pool. */
mt_jv mt_jx_str_from(mt_jexec *x, mt_jbuf *b);

/* ---- filters and tests (jinja_filters.c) ---- */

/* Index of the filter / test called name, or -1. */
int mt_jinja_filter_find(const char *name);
int mt_jinja_test_find(const char *name);
int mt_jx_filter(mt_jexec *x, uint32_t pos, int fn, mt_jv v, const mt_jv *args, size_t nargs,
                 const char **knames, const mt_jv *kvals, size_t nk, mt_jv *out);
int mt_jx_test(mt_jexec *x, uint32_t pos, int fn, mt_jv v, const mt_jv *args, size_t nargs,
               bool *out);

/* ---- expressions (jinja_eval.c) ---- */

int mt_jx_eval(mt_jexec *x, const mt_jnode *n, mt_jv *out);
/* Looks name up from the innermost scope out; an Undefined when absent. */
mt_jv mt_jx_lookup(mt_jexec *x, const char *name);

/* The arguments of a call (a function's, a filter's after its value, a
 * test's): positional, then keyword. */
typedef struct mt_jargs {
    const mt_jv *pos;
    size_t npos;
    const char **knames;
    const mt_jv *kvals;
    size_t nk;
} mt_jargs;

/* Argument i (positional) or name (keyword), else dflt. */
static inline mt_jv mt_jarg(const mt_jargs *a, size_t i, const char *name, mt_jv dflt) {
    if (i < a->npos) return a->pos[i];
    for (size_t k = 0; name && k < a->nk; k++)
        if (!strcmp(a->knames[k], name)) return a->kvals[k];
    return dflt;
}

#endif
