/* Statements and the render: output (with where each byte came from),
 * scopes as jinja2 has them (each for-loop iteration starts a fresh scope
 * over the enclosing one, so a `set` inside a loop neither survives the
 * iteration nor leaks out; `if` opens none; a macro runs in a scope over
 * the one it was defined in), macros and call blocks, break/continue. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja_internal.h"
#include "util/mem.h"

enum { FLOW_OK = 0, FLOW_ERR = -1, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };
enum { MAX_MACRO_DEPTH = 64 };

/* ---- scopes ---- */

static mt_jscope *scope_new(mt_jexec *x, mt_jscope *parent) {
    mt_jscope *s = mt_jpool_alloc(x->pool, sizeof *s);
    s->parent = parent;
    return s;
}

/* name = v in scope s (replacing a binding s already has). */
static void scope_set(mt_jexec *x, mt_jscope *s, const char *name, mt_jv v) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **names = mt_jpool_alloc(x->pool, cap * sizeof *names);
        mt_jv *vals = mt_jpool_alloc(x->pool, cap * sizeof *vals);
        if (s->n) memcpy(names, s->names, s->n * sizeof *names), memcpy(vals, s->vals, s->n * sizeof *vals);
        s->names = names, s->vals = vals, s->cap = cap;
    }
    s->names[s->n] = name, s->vals[s->n] = v, s->n++;
}

/* ---- output ---- */

static void emit(mt_jexec *x, const char *s, size_t n) {
    if (n == 0) return;
    if (x->capture) return mt_jbuf_put(x->capture, s, n);
    mt_jinja_out *o = x->out;
    bool gen = x->gen > 0;
    mt_jinja_run *last = o->n_runs ? &o->runs[o->n_runs - 1] : NULL;
    if (!last || last->msg != x->msg || last->gen != gen) {
        if (o->n_runs == o->runs_cap) {
            o->runs_cap = o->runs_cap ? o->runs_cap * 2 : 16;
            o->runs = mt_realloc_or_die(o->runs, o->runs_cap * sizeof *o->runs);
        }
        o->runs[o->n_runs++] = (mt_jinja_run){o->text.n, x->msg, gen};
    }
    mt_jbuf_put(&o->text, s, n);
}

static void emit_value(mt_jexec *x, mt_jv v) {
    if (v.type == MT_JV_STR) return emit(x, v.s.p, v.s.n);
    mt_jbuf b = {0};
    mt_jv_str(&b, v);
    emit(x, b.p, b.n);
    mt_jbuf_free(&b);
}

static int exec_body(mt_jexec *x, const mt_jnode *body);

/* Runs body with its output captured into a string. */
static int capture(mt_jexec *x, const mt_jnode *body, mt_jv *out) {
    mt_jbuf b = {0}, *saved = x->capture;
    x->capture = &b;
    int rc = exec_body(x, body);
    x->capture = saved;
    *out = mt_jx_str_from(x, &b);
    return rc == FLOW_ERR ? -1 : 0;
}

/* Applies the filter nodes of a set or filter block to v. */
static int apply_filters(mt_jexec *x, const mt_jnode *n, mt_jv *v) {
    for (size_t i = 0; i < n->n; i++) {
        const mt_jnode *f = n->kids[i];
        mt_jv *args = f->n ? mt_jpool_alloc(x->pool, f->n * sizeof *args) : NULL;
        mt_jv *kw = f->nk ? mt_jpool_alloc(x->pool, f->nk * sizeof *kw) : NULL;
        for (size_t k = 0; k < f->n; k++)
            if (mt_jx_eval(x, f->kids[k], &args[k])) return -1;
        for (size_t k = 0; k < f->nk; k++)
            if (mt_jx_eval(x, f->kvals[k], &kw[k])) return -1;
        if (mt_jx_filter(x, f->pos, f->fn, *v, args, f->n, f->knames, kw, f->nk, v)) return -1;
    }
    return 0;
}

/* ---- assignment ---- */

/* Binds names[0..n) to v (unpacking a sequence when n > 1) in scope s. */
static int bind(mt_jexec *x, uint32_t pos, mt_jscope *s, const char **names, size_t n, mt_jv v) {
    if (n == 1) return scope_set(x, s, names[0], v), 0;
    mt_jv items;
    if (mt_jx_iter(x, pos, v, &items)) return -1;
    if (items.l->n != n)
        return mt_jx_fail(x, pos, "cannot unpack %zu values into %zu names", items.l->n, n);
    for (size_t i = 0; i < n; i++) scope_set(x, s, names[i], items.l->v[i]);
    return 0;
}

static int exec_set(mt_jexec *x, const mt_jnode *n) {
    mt_jv v;
    if (n->attr) {
        mt_jv ns = mt_jx_lookup(x, n->name);
        if (ns.type != MT_JV_NS)
            return mt_jx_fail(x, n->pos, "cannot set .%s of '%s': it is not a namespace()", n->attr, n->name);
        if (mt_jx_eval(x, n->b, &v)) return -1;
        mt_jv_dict_set(x->pool, ns, mt_jv_cstr(n->attr), v);
        return 0;
    }
    if (n->block) {
        if (capture(x, n->b, &v) || apply_filters(x, n, &v)) return -1;
    } else if (mt_jx_eval(x, n->b, &v)) {
        return -1;
    }
    return bind(x, n->pos, x->scope, n->knames, n->nk, v);
}

/* ---- loops ---- */

/* The items of n's iterable that pass its `if` filter. */
static int loop_items(mt_jexec *x, const mt_jnode *n, mt_jv *items) {
    mt_jv v, all;
    if (mt_jx_eval(x, n->a, &v) || mt_jx_iter(x, n->a->pos, v, &all)) return -1;
    if (!n->d) return *items = all, 0;
    *items = mt_jv_list_new(x->pool, all.l->n);
    mt_jscope *saved = x->scope;
    for (size_t i = 0; i < all.l->n; i++) {
        x->scope = scope_new(x, saved);
        mt_jv keep;
        int rc = bind(x, n->pos, x->scope, n->knames, n->nk, all.l->v[i]);
        if (rc == 0) rc = mt_jx_eval(x, n->d, &keep);
        x->scope = saved;
        if (rc) return -1;
        if (mt_jv_truthy(keep)) mt_jv_list_push(x->pool, *items, all.l->v[i]);
    }
    return 0;
}

static int exec_for(mt_jexec *x, const mt_jnode *n) {
    mt_jv items;
    if (loop_items(x, n, &items)) return FLOW_ERR;
    if (items.l->n == 0) return n->c ? exec_body(x, n->c) : FLOW_OK;
    mt_jloop *lp = mt_jpool_alloc(x->pool, sizeof *lp);
    lp->items = items;
    mt_jscope *saved = x->scope;
    int32_t saved_msg = x->msg;
    int rc = FLOW_OK;
    for (size_t i = 0; i < items.l->n; i++) {
        mt_jv it = items.l->v[i];
        lp->i = i;
        x->scope = scope_new(x, saved);
        scope_set(x, x->scope, "loop", (mt_jv){.type = MT_JV_LOOP, .obj = lp});
        if (it.type == MT_JV_DICT && it.d->msg >= 0) x->msg = it.d->msg;
        rc = bind(x, n->pos, x->scope, n->knames, n->nk, it);
        if (rc == FLOW_OK) rc = exec_body(x, n->b);
        x->msg = saved_msg;
        x->scope = saved;
        if (rc == FLOW_ERR || rc == FLOW_BREAK) break;
        rc = FLOW_OK;  // continue
    }
    return rc == FLOW_ERR ? FLOW_ERR : FLOW_OK;
}

/* ---- macros ---- */

static mt_jv macro_value(mt_jexec *x, const mt_jnode *def) {
    mt_jmacro *m = mt_jpool_alloc(x->pool, sizeof *m);
    m->def = def;
    m->scope = x->scope;
    return (mt_jv){.type = MT_JV_MACRO, .obj = m};
}

/* Binds a macro's parameters in s: positional, then keywords, then the
 * defaults (evaluated in s, as jinja2 does). */
static int bind_params(mt_jexec *x, uint32_t pos, const mt_jnode *def, mt_jscope *s,
                       const mt_jv *args, size_t nargs, const char **knames, const mt_jv *kvals, size_t nk) {
    const char *mname = def->name ? def->name : "caller";
    if (nargs > def->nk) return mt_jx_fail(x, pos, "macro '%s' takes %zu arguments, %zu given", mname, def->nk, nargs);
    for (size_t k = 0; k < nk; k++) {
        size_t j = 0;
        while (j < def->nk && strcmp(def->knames[j], knames[k])) j++;
        if (j == def->nk) return mt_jx_fail(x, pos, "macro '%s' takes no keyword argument '%s'", mname, knames[k]);
    }
    for (size_t j = 0; j < def->nk; j++) {
        mt_jv v = mt_jv_undef(NULL);
        bool given = j < nargs;
        if (given) v = args[j];
        for (size_t k = 0; k < nk && !given; k++)
            if (!strcmp(def->knames[j], knames[k])) v = kvals[k], given = true;
        if (!given && def->kvals[j] && mt_jx_eval(x, def->kvals[j], &v)) return -1;
        if (!given && !def->kvals[j]) {
            char t[160];
            snprintf(t, sizeof t, "parameter '%s' was not provided", def->knames[j]);
            v = mt_jv_undef(mt_jpool_strdup(x->pool, t, strlen(t)));
        }
        scope_set(x, s, def->knames[j], v);
    }
    return 0;
}

static int call_macro(mt_jexec *x, uint32_t pos, mt_jv m, const mt_jv *args, size_t nargs,
                      const char **knames, const mt_jv *kvals, size_t nk, mt_jv *out) {
    const mt_jmacro *jm = m.obj;
    if (x->depth >= MAX_MACRO_DEPTH) return mt_jx_fail(x, pos, "macros call each other more than %d deep", MAX_MACRO_DEPTH);
    mt_jscope *saved = x->scope, *s = scope_new(x, jm->scope);
    mt_jv caller = x->caller;
    x->caller = mt_jv_undef(NULL);
    x->scope = s;
    if (caller.type == MT_JV_MACRO) scope_set(x, s, "caller", caller);
    int rc = bind_params(x, pos, jm->def, s, args, nargs, knames, kvals, nk);
    x->depth++;
    if (rc == 0) rc = capture(x, jm->def->b, out);
    x->depth--;
    x->scope = saved;
    return rc;
}

static int exec_call_block(mt_jexec *x, const mt_jnode *n) {
    mt_jv out;
    x->caller = macro_value(x, n);  // caller() runs the block's body
    int rc = mt_jx_eval(x, n->a, &out);
    x->caller = mt_jv_undef(NULL);
    if (rc) return FLOW_ERR;
    emit_value(x, out);
    return FLOW_OK;
}

/* ---- statements ---- */

static int exec_stmt(mt_jexec *x, const mt_jnode *n) {
    mt_jv v;
    int rc;
    switch ((mt_jnode_kind)n->kind) {
    case MT_JN_DATA: emit(x, n->val.s.p, n->val.s.n); return FLOW_OK;
    case MT_JN_PRINT:
        if (mt_jx_eval(x, n->a, &v)) return FLOW_ERR;
        emit_value(x, v);
        return FLOW_OK;
    case MT_JN_IF:
        if (mt_jx_eval(x, n->a, &v)) return FLOW_ERR;
        if (mt_jv_truthy(v)) return exec_body(x, n->b);
        if (!n->c) return FLOW_OK;
        return n->c->kind == MT_JN_IF ? exec_stmt(x, n->c) : exec_body(x, n->c);
    case MT_JN_FOR: return exec_for(x, n);
    case MT_JN_SET: return exec_set(x, n) ? FLOW_ERR : FLOW_OK;
    case MT_JN_MACRO: scope_set(x, x->scope, n->name, macro_value(x, n)); return FLOW_OK;
    case MT_JN_CALLBLOCK: return exec_call_block(x, n);
    case MT_JN_FILTERBLOCK:
        if (capture(x, n->b, &v) || apply_filters(x, n, &v)) return FLOW_ERR;
        emit_value(x, v);
        return FLOW_OK;
    case MT_JN_BREAK: return FLOW_BREAK;
    case MT_JN_CONTINUE: return FLOW_CONTINUE;
    case MT_JN_GENERATION:
        x->gen++;
        rc = exec_body(x, n->b);
        x->gen--;
        return rc;
    default:
        MT_ASSERT(!"an expression where a statement belongs");
        return FLOW_ERR;
    }
}

static int exec_body(mt_jexec *x, const mt_jnode *body) {
    for (size_t i = 0; i < body->n; i++) {
        int rc = exec_stmt(x, body->kids[i]);
        if (rc != FLOW_OK) return rc;
    }
    return FLOW_OK;
}

int mt_jinja_render(const mt_jinja *t, const mt_jinja_var *vars, size_t n, mt_jpool *pool,
                    const mt_jinja_opts *opts, mt_jinja_out *out, mt_error *err) {
    out->text.n = 0;
    out->n_runs = 0;
    mt_jbuf_put(&out->text, "", 0);  // text.p is a string even when nothing is written
    mt_jexec x = {.t = t, .pool = pool, .out = out, .msg = -1, .now = opts ? opts->now : 0,
                  .err = err, .caller = mt_jv_undef(NULL), .call_macro = call_macro};
    x.scope = scope_new(&x, NULL);
    for (size_t i = 0; i < n; i++) scope_set(&x, x.scope, vars[i].name, vars[i].value);
    return exec_body(&x, t->root) == FLOW_ERR ? -1 : 0;
}

void mt_jinja_out_free(mt_jinja_out *o) {
    mt_jbuf_free(&o->text);
    free(o->runs);
    memset(o, 0, sizeof *o);
}
