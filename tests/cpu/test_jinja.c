/* The Jinja engine against jinja2: the small templates of
 * tests/fixtures/chat/jinja_cases.json (each rendered by transformers'
 * jinja2 environment, scripts/make_chat_template_fixtures.py) render to the
 * same bytes, or fail where jinja2 fails; and what the engine does not
 * support is an error naming the template, the line and column and the
 * feature. Every comparison is exact. */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/jinja/jinja.h"
#include "io/file.h"
#include "testlib.h"

static cJSON *load_fixture(const char *rel) {
    char *p = mt_path_join(mt_test_fixtures_dir(), rel), *buf;
    size_t len;
    mt_error err;
    cr_assert_eq(mt_read_file(p, &buf, &len, &err), 0, "%s", err.msg);
    cJSON *j = cJSON_ParseWithLength(buf, len);
    cr_assert(j, "%s is not JSON", p);
    free(buf), free(p);
    return j;
}

/* Renders src with the variables of the JSON object vars; 0 with *out
 * (malloc'd), or -1 with err. */
static int render(const char *name, const char *src, const cJSON *vars, int64_t now, char **out,
                  mt_error *err) {
    mt_jpool pool = {0};
    mt_jinja *t = mt_jinja_parse(name, src, strlen(src), err);
    int rc = -1;
    if (t) {
        char *js = cJSON_PrintUnformatted(vars);
        mt_jv v;
        cr_assert_eq(mt_jv_from_json(&pool, js, strlen(js), &v, err), 0, "%s", err->msg);
        free(js);
        mt_jinja_var vs[16];
        size_t n = 0;
        for (size_t i = 0; i < v.d->n && n < 16; i++)
            vs[n++] = (mt_jinja_var){mt_jpool_strdup(&pool, v.d->k[i].s.p, v.d->k[i].s.n), v.d->v[i]};
        mt_jinja_out o = {0};
        mt_jinja_opts opts = {.now = now};
        rc = mt_jinja_render(t, vs, n, &pool, &opts, &o, err);
        if (rc == 0) *out = strdup(o.text.p);
        mt_jinja_out_free(&o);
        mt_jinja_free(t);
    }
    mt_jpool_free(&pool);
    return rc;
}

Test(jinja, cases_render_as_jinja2) {
    cJSON *fx = load_fixture("chat/jinja_cases.json"), *c;
    int64_t now = (int64_t)cJSON_GetObjectItem(fx, "time")->valuedouble;
    int i = 0, ok = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "cases")) {
        const char *src = cJSON_GetObjectItem(c, "template")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "output"), *werr = cJSON_GetObjectItem(c, "error");
        char name[32], *out = NULL;
        snprintf(name, sizeof name, "case %d", i++);
        mt_error err = {{0}};
        int rc = render(name, src, cJSON_GetObjectItem(c, "vars"), now, &out, &err);
        if (werr) {
            cr_expect_eq(rc, -1, "%s: jinja2 fails (%s), the engine rendered '%s'", name, werr->valuestring, out);
            // raise_exception's message reaches the error.
            if (!strncmp(werr->valuestring, "TemplateError: ", 15))
                cr_expect(strstr(err.msg, werr->valuestring + 15), "%s: %s", name, err.msg);
        } else {
            cr_assert_eq(rc, 0, "%s: %s\n%s", name, err.msg, src);
            cr_expect_str_eq(out, want->valuestring, "%s: %s", name, src);
        }
        ok += rc == 0 || werr;
        free(out);
    }
    cr_expect_geq(i, 70, "the fixture holds the cases");
    cr_expect_eq(ok, i);
    cJSON_Delete(fx);
}

/* What is not supported fails at parse time (or at render time, for what
 * only a value tells), naming the template, line:column and the feature. */
Test(jinja, unsupported_is_an_error_naming_what_and_where) {
    struct { const char *src, *want; } cases[] = {
        {"{% include 'x.jinja' %}", "t.jinja:1:4: unsupported tag 'include'"},
        {"a\n  {% extends 'base' %}", "t.jinja:2:6: unsupported tag 'extends'"},
        {"{{ x | frobnicate }}", "t.jinja:1:8: unsupported filter 'frobnicate'"},
        {"{% if x is prime %}{% endif %}", "t.jinja:1:12: unsupported test 'prime'"},
        {"{% for x in y recursive %}{% endfor %}", "unsupported: recursive for loops"},
        {"{{ f(*args) }}", "t.jinja:1:6: unsupported: * arguments"},
        {"{% if x %}", "the template ends before {% elif %}"},
        {"{% endif %}", "'endif' without the tag it closes"},
        {"{{ 'abc }}", "a string literal is not closed"},
        {"{{ x ", "a {{ tag is not closed with }}"},
        {"{# note", "a {# comment is not closed with #}"},
        {"{{ x @ y }}", "t.jinja:1:6: unexpected character '@' inside a tag"},
        {"{{ '\\N{BULLET}' }}", "unsupported: the \\N{...} escape"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mt_error err = {{0}};
        mt_jinja *t = mt_jinja_parse("t.jinja", cases[i].src, strlen(cases[i].src), &err);
        cr_expect(!t, "'%s' parsed", cases[i].src);
        cr_expect(strstr(err.msg, cases[i].want), "'%s': %s", cases[i].src, err.msg);
        mt_jinja_free(t);
    }
    struct { const char *src, *want; } runtime[] = {
        {"{{ 'a' % 1 }}", "t.jinja:1:8: unsupported: string formatting with %"},
        {"{{ [1].append(2) }}", "t.jinja:1:14: 'list object' has no attribute 'append'"},
        {"{{ 'x'.format(1) }}", "'str object' has no attribute 'format'"},
        {"{{ x | tojson(ensure_ascii=true) }}", "unsupported: tojson(ensure_ascii=True)"},
        {"{{ range(1000000) | length }}", "range of 1000000 items is too big"},
        {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "macros call each other more than 64 deep"},
    };
    cJSON *vars = cJSON_Parse("{\"x\": 1}");
    for (size_t i = 0; i < sizeof runtime / sizeof *runtime; i++) {
        mt_error err = {{0}};
        char *out = NULL;
        cr_expect_eq(render("t.jinja", runtime[i].src, vars, 0, &out, &err), -1, "'%s' rendered", runtime[i].src);
        cr_expect(strstr(err.msg, runtime[i].want), "'%s': %s", runtime[i].src, err.msg);
        free(out);
    }
    cJSON_Delete(vars);
}

/* Nesting is bounded where the parser and renderer recurse, and a
 * namespace holding itself prints without end. */
Test(jinja, nesting_is_bounded) {
    char src[4096] = "{{ ", *q = src + 3;
    for (int i = 0; i < 1000; i++) *q++ = '(';
    *q++ = '1';
    for (int i = 0; i < 1000; i++) *q++ = ')';
    strcpy(q, " }}");
    mt_error err = {{0}};
    mt_jinja *t = mt_jinja_parse("deep", src, strlen(src), &err);
    cr_expect(!t && strstr(err.msg, "nest more than 200 deep"), "%s", err.msg);
    mt_jinja_free(t);
    cJSON *vars = cJSON_Parse("{}");
    char *out = NULL;
    cr_assert_eq(render("ns", "{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns | length }}", vars, 0, &out, &err), -1);
    cr_expect_eq(render("ns", "{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}", vars, 0, &out, &err), 0, "%s", err.msg);
    cr_expect(out && strstr(out, "..."), "%s", out);
    free(out);
    cJSON_Delete(vars);
}
