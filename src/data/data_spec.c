/* The `data` option: a path, or a YAML list of {path, weight} read with
 * libyaml from the config file or from the option's text; see
 * data_spec.h. */
#include "data/data_spec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/args.h"
#include "util/mem.h"

bool mt_data_spec_is_list(const char *text) {
    while (*text == ' ' || *text == '\t' || *text == '\n' || *text == '\r') text++;
    return *text == '[';
}

void mt_data_spec_free(mt_data_spec *spec) {
    for (size_t i = 0; i < spec->n; i++) free(spec->src[i].path);
    free(spec->src);
    memset(spec, 0, sizeof *spec);
}

static void push(mt_data_spec *spec, const char *path, double weight) {
    spec->src = mt_realloc_or_die(spec->src, (spec->n + 1) * sizeof *spec->src);
    spec->src[spec->n++] = (mt_data_source){mt_strdup_or_die(path), weight};
}

/* Where an item is, for messages: "run.yaml:7: data[1]" or "data[1]". */
typedef struct loc {
    const char *file, *what;
} loc;

static void item_label(const loc *l, const yaml_event_t *ev, size_t i, char *buf, size_t n) {
    if (l->file) snprintf(buf, n, "%s:%zu: %s[%zu]", l->file, ev->start_mark.line + 1, l->what, i);
    else snprintf(buf, n, "%s[%zu]", l->what, i);
}

static int parse_error(yaml_parser_t *p, const loc *l, mt_error *err) {
    if (l->file)
        return mt_errorf(err, "%s:%zu:%zu: YAML syntax error in %s: %s (write each source as "
                         "{path: FILE, weight: W})", l->file, p->problem_mark.line + 1,
                         p->problem_mark.column + 1, l->what, p->problem ? p->problem : "?");
    return mt_errorf(err, "%s: not a valid list at column %zu: %s (write it as [{path: a.jsonl, "
                     "weight: 0.7}, {path: dir/, weight: 0.3}])", l->what,
                     p->problem_mark.column + 1, p->problem ? p->problem : "?");
}

static int next(yaml_parser_t *p, yaml_event_t *ev, const loc *l, mt_error *err) {
    return yaml_parser_parse(p, ev) ? 0 : parse_error(p, l, err);
}

static int parse_weight(const char *s, const char *label, const char *path, double *w,
                        mt_error *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!mt_decimal_text(s) || end == s || *end || !isfinite(v))
        return mt_errorf(err, "%s (%s): weight '%s' is not a number: give a positive number "
                         "such as 0.3", label, path, s);
    if (!(v > 0))
        return mt_errorf(err, "%s (%s): weight %s is not positive: give every source a weight "
                         "> 0 (weights are normalised to sum to 1), or drop the source", label,
                         path, s);
    *w = v;
    return 0;
}

/* One {path: ..., weight: ...} mapping, after its MAPPING-START event. */
static int read_item(yaml_parser_t *p, const loc *l, const char *label, mt_data_spec *spec,
                     mt_error *err) {
    char *path = NULL, *weight = NULL;
    int rc = -1;
    for (;;) {
        yaml_event_t k, v;
        if (next(p, &k, l, err)) goto out;
        if (k.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&k);
            break;
        }
        if (k.type != YAML_SCALAR_EVENT) {
            yaml_event_delete(&k);
            mt_errorf(err, "%s: expected `path:` and `weight:` keys", label);
            goto out;
        }
        const char *key = (const char *)k.data.scalar.value;
        char **dst = !strcmp(key, "path") ? &path : !strcmp(key, "weight") ? &weight : NULL;
        if (!dst) {
            mt_errorf(err, "%s: unknown key '%s' (a source has `path` and `weight`)", label, key);
            yaml_event_delete(&k);
            goto out;
        }
        if (*dst) {
            mt_errorf(err, "%s: `%s` is given twice", label, key);
            yaml_event_delete(&k);
            goto out;
        }
        yaml_event_delete(&k);
        if (next(p, &v, l, err)) goto out;
        if (v.type != YAML_SCALAR_EVENT) {
            yaml_event_delete(&v);
            mt_errorf(err, "%s: `%s` needs a single value", label, dst == &path ? "path" : "weight");
            goto out;
        }
        *dst = mt_strdup_or_die((const char *)v.data.scalar.value);
        yaml_event_delete(&v);
    }
    if (!path || !*path) {
        mt_errorf(err, "%s: no `path` (write {path: FILE_OR_DIR, weight: W})", label);
        goto out;
    }
    double w = 1;
    if (weight && parse_weight(weight, label, path, &w, err)) goto out;
    push(spec, path, w);
    rc = 0;
out:
    free(path);
    free(weight);
    return rc;
}

/* The items of a list, after its SEQUENCE-START event, to its end. */
static int read_items(yaml_parser_t *p, const loc *l, mt_data_spec *spec, mt_error *err) {
    spec->is_list = true;
    for (size_t i = 0;; i++) {
        yaml_event_t ev;
        if (next(p, &ev, l, err)) return -1;
        char label[1200];
        item_label(l, &ev, i, label, sizeof label);
        int rc = 0;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            if (spec->n == 0)
                return mt_errorf(err, "%s%s%s: the list is empty: give at least one {path: FILE, "
                                 "weight: W}", l->file ? l->file : "", l->file ? ": " : "", l->what);
            return 0;
        }
        if (ev.type == YAML_SCALAR_EVENT && ev.data.scalar.length)
            push(spec, (const char *)ev.data.scalar.value, 1.0);  // a bare path
        else if (ev.type == YAML_MAPPING_START_EVENT)
            rc = read_item(p, l, label, spec, err);
        else
            rc = mt_errorf(err, "%s: expected {path: FILE, weight: W} or a path", label);
        yaml_event_delete(&ev);
        if (rc) return -1;
    }
}

int mt_data_spec_parse(const char *text, const char *what, mt_data_spec *spec, mt_error *err) {
    memset(spec, 0, sizeof *spec);
    if (!*text) return mt_errorf(err, "%s: empty: give a file, a directory or a list", what);
    if (!mt_data_spec_is_list(text)) {
        push(spec, text, 1.0);
        return 0;
    }
    yaml_parser_t p;
    MT_ASSERT(yaml_parser_initialize(&p));
    yaml_parser_set_input_string(&p, (const unsigned char *)text, strlen(text));
    loc l = {NULL, what};
    int rc = -1;
    /* stream start, document start, the list, document end, stream end */
    for (int step = 0; step < 5; step++) {
        yaml_event_t ev;
        if (next(&p, &ev, &l, err)) goto out;
        yaml_event_type_t t = ev.type;
        yaml_event_delete(&ev);
        static const yaml_event_type_t want[5] = {YAML_STREAM_START_EVENT, YAML_DOCUMENT_START_EVENT,
                                                  YAML_SEQUENCE_START_EVENT, YAML_DOCUMENT_END_EVENT,
                                                  YAML_STREAM_END_EVENT};
        if (t != want[step]) {
            mt_errorf(err, "%s: not one list: write it as [{path: a.jsonl, weight: 0.7}, {path: "
                      "dir/, weight: 0.3}]", what);
            goto out;
        }
        if (step == 2 && read_items(&p, &l, spec, err)) goto out;
    }
    rc = 0;
out:
    yaml_parser_delete(&p);
    if (rc) mt_data_spec_free(spec);
    return rc;
}

int mt_data_spec_read_yaml(yaml_parser_t *parser, const char *file, const char *what, char *buf,
                           size_t cap, mt_error *err) {
    mt_data_spec spec = {0};
    loc l = {file, what};
    int rc = read_items(parser, &l, &spec, err) ||
             mt_data_spec_format(&spec, what, buf, cap, err) ? -1 : 0;
    mt_data_spec_free(&spec);
    return rc;
}

/* Shortest decimal text that reads back to exactly v. */
static void format_weight(double v, char *buf, size_t n) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

int mt_data_spec_format(const mt_data_spec *spec, const char *what, char *buf, size_t cap,
                        mt_error *err) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    MT_ASSERT(f);
    fputc('[', f);
    for (size_t i = 0; i < spec->n; i++) {
        fprintf(f, "%s{path: \"", i ? ", " : "");
        for (const unsigned char *c = (const unsigned char *)spec->src[i].path; *c; c++) {
            if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
            else if (*c < 0x20 || *c == 0x7f) fprintf(f, "\\x%02x", *c);
            else fputc(*c, f);
        }
        char w[32];
        format_weight(spec->src[i].weight, w, sizeof w);
        fprintf(f, "\", weight: %s}", w);
    }
    fputc(']', f);
    fclose(f);
    int rc = 0;
    if (len >= cap)
        rc = mt_errorf(err, "%s: the list takes %zu bytes, more than %zu: put the files of a "
                       "source in one directory (a directory of shards is one source) or "
                       "shorten the paths", what, len, cap - 1);
    else memcpy(buf, text, len + 1);
    free(text);
    return rc;
}

int mt_data_spec_check(const char *text, const char *what, bool allow_list, mt_error *err) {
    if (!*text || !mt_data_spec_is_list(text)) return 0;
    if (!allow_list)
        return mt_errorf(err, "%s: give one file or directory, not a list", what);
    mt_data_spec spec;
    if (mt_data_spec_parse(text, what, &spec, err)) return -1;
    mt_data_spec_free(&spec);
    return 0;
}

void mt_data_spec_canonicalize(char *text, size_t cap) {
    if (!mt_data_spec_is_list(text)) return;
    mt_data_spec spec;
    mt_error err;
    if (mt_data_spec_parse(text, "data", &spec, &err)) return;
    char *buf = mt_malloc_or_die(cap);
    if (!mt_data_spec_format(&spec, "data", buf, cap, &err)) memcpy(text, buf, strlen(buf) + 1);
    free(buf);
    mt_data_spec_free(&spec);
}
