/* A Jinja template engine for chat templates.
 *
 * It renders the subset of Jinja2 that the chat templates of Hugging Face
 * models use, with the semantics transformers gives them in
 * apply_chat_template: jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, the loop controls (break, continue), the
 * `{% generation %}` block, and the globals raise_exception, strftime_now,
 * namespace, dict and range; tojson is json.dumps(ensure_ascii=False).
 * The output is byte-identical to jinja2's on the templates of
 * tests/fixtures/chat (tests/cpu/test_jinja.c).
 *
 * Supported: {{ }}, {% %}, {# #} with - and + whitespace control; if/elif/
 * else, for (tuple targets, `if` filter, else, loop.*), set (names, tuples,
 * namespace attributes, blocks), macro (with defaults and caller), call
 * and filter blocks, break/continue, raw, generation; Python's operators,
 * literals, slices, conditional expressions; the filters and tests of
 * jinja_filters.c and the str/dict methods of jinja_call.c. Anything else
 * (include, import, extends, block, unknown filters, tests or methods) is
 * an error naming the template, the line and column, and what is not
 * supported.
 *
 * A parsed template is read-only: several threads may render it at once,
 * each with its own pool and output. */
#ifndef MT_DATA_JINJA_H
#define MT_DATA_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/jinja/jinja_value.h"
#include "util/error.h"

typedef struct mt_jinja mt_jinja;

/* Parses src[0..len) (UTF-8); name is how errors call the template
 * ("tokenizer_config.json chat_template"). NULL with err on a syntax error
 * or an unsupported feature. */
mt_jinja *mt_jinja_parse(const char *name, const char *src, size_t len, mt_error *err);
void mt_jinja_free(mt_jinja *t);

/* The name errors call the template by. */
const char *mt_jinja_name(const mt_jinja *t);

/* Whether the template has `{% generation %}` blocks. */
bool mt_jinja_has_generation(const mt_jinja *t);

/* A run of output bytes [off, next run's off) and where they came from:
 * msg is the index of the message being looped over when they were
 * written (the dict's mt_jdict.msg of the innermost for loop over such
 * dicts), -1 outside any; gen is whether a generation block wrote them. */
typedef struct mt_jinja_run {
    size_t off;
    int32_t msg;
    bool gen;
} mt_jinja_run;

/* What a render writes; zero-initialise, reuse, free with
 * mt_jinja_out_free. */
typedef struct mt_jinja_out {
    mt_jbuf text;
    mt_jinja_run *runs;  // (n_runs), by offset
    size_t n_runs, runs_cap;
} mt_jinja_out;

void mt_jinja_out_free(mt_jinja_out *o);

/* A variable the template sees. */
typedef struct mt_jinja_var {
    const char *name;
    mt_jv value;
} mt_jinja_var;

typedef struct mt_jinja_opts {
    int64_t now;  // strftime_now's time (seconds since 1970, local time); 0: the clock
} mt_jinja_opts;

/* Renders t with vars[0..n) into out (previous contents dropped). Values
 * the render makes go into pool. -1 with err naming the template, the
 * line and column and the problem (raise_exception's message, an
 * undefined name, a type error). */
int mt_jinja_render(const mt_jinja *t, const mt_jinja_var *vars, size_t n, mt_jpool *pool,
                    const mt_jinja_opts *opts, mt_jinja_out *out, mt_error *err);

#endif
