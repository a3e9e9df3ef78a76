/* The train config as files: a flat YAML mapping read with libyaml (errors
 * name file:line), the effective config written back as YAML (the run's
 * config.yaml) and as JSON (checkpoint trainer state), both exact. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

#include "train/train_config_internal.h"
#include "data/data_spec.h"
#include "io/file.h"

/* YAML reading ----------------------------------------------------------- */

typedef struct yaml_reader {
    yaml_parser_t parser;
    const char *path;
    int line_of[MT_TC_MAX_OPTIONS]; // line where each option was set, 0 = not yet
} yaml_reader;

static int next_event(yaml_reader *r, yaml_event_t *ev, mt_error *err) {
    if (yaml_parser_parse(&r->parser, ev)) return 0;
    const yaml_parser_t *p = &r->parser;
    return mt_errorf(err, "%s:%zu:%zu: YAML syntax error: %s%s%s (check indentation, ':' after "
                          "each key, and quotes)",
                     r->path, p->problem_mark.line + 1, p->problem_mark.column + 1,
                     p->problem ? p->problem : "unreadable input", p->context ? " " : "",
                     p->context ? p->context : "");
}

static size_t line_of(const yaml_event_t *ev) { return ev->start_mark.line + 1; }

static const char *node_kind(yaml_event_type_t t) {
    return t == YAML_MAPPING_START_EVENT    ? "a mapping"
           : t == YAML_SEQUENCE_START_EVENT ? "a list"
           : t == YAML_ALIAS_EVENT          ? "an alias"
                                            : "a single value";
}

static bool is_null(const yaml_event_t *ev) {
    const char *v = (const char *)ev->data.scalar.value;
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

/* One `key: value` pair whose key event is `key`. */
static int read_pair(yaml_reader *r, mt_train_config *cfg, const yaml_event_t *key,
                     mt_error *err) {
    const char *name = (const char *)key->data.scalar.value;
    size_t line = line_of(key);
    char where[MT_TC_STR + 32];
    snprintf(where, sizeof where, "%s:%zu", r->path, line);
    const mt_opt *o = mt_opt_lookup(&mt_tc_table, name);
    yaml_event_t val;
    if (next_event(r, &val, err)) return -1;
    int rc = -1;
    if (!o) {
        mt_train_config_set(cfg, name, "", where, err); // fills the unknown-key message
    } else if (r->line_of[o - mt_tc_options]) {
        mt_errorf(err, "%s: %s: already set on line %d; keep one of them", where, name,
                  r->line_of[o - mt_tc_options]);
    } else if (val.type == YAML_SEQUENCE_START_EVENT && o->offset == offsetof(mt_train_config, data)) {
        char text[MT_TC_STR], label[MT_TC_STR + 96]; /* a weighted list of sources */
        snprintf(label, sizeof label, "%s: %s", where, name);
        rc = mt_data_spec_read_yaml(&r->parser, r->path, name, text, sizeof text, err) ||
             mt_opt_set(&mt_tc_table, cfg, o, text, label, err) ? -1 : 0;
        r->line_of[o - mt_tc_options] = (int)line;
    } else if (val.type != YAML_SCALAR_EVENT) {
        mt_errorf(err, "%s: %s: expected a single value, got %s", where, name,
                  node_kind(val.type));
    } else if (is_null(&val) && o->type != MT_OPT_STRING) {
        mt_errorf(err, "%s: %s: needs a value (or remove the line for the default %s)", where,
                  name, o->def);
    } else {
        char label[MT_TC_STR + 96];
        snprintf(label, sizeof label, "%s: %s", where, name);
        const char *text = is_null(&val) ? "" : (const char *)val.data.scalar.value;
        rc = mt_opt_set(&mt_tc_table, cfg, o, text, label, err);
        r->line_of[o - mt_tc_options] = (int)line;
    }
    yaml_event_delete(&val);
    return rc;
}

/* The pairs of the top-level mapping, up to its end. */
static int read_mapping(yaml_reader *r, mt_train_config *cfg, mt_error *err) {
    for (;;) {
        yaml_event_t ev;
        if (next_event(r, &ev, err)) return -1;
        int rc = 0;
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return 0;
        }
        if (ev.type != YAML_SCALAR_EVENT)
            rc = mt_errorf(err, "%s:%zu: expected an option name, got %s", r->path,
                           line_of(&ev), node_kind(ev.type));
        else
            rc = read_pair(r, cfg, &ev, err);
        yaml_event_delete(&ev);
        if (rc) return -1;
    }
}

/* Stream start, one document holding one mapping (or nothing), stream end. */
static int read_stream(yaml_reader *r, mt_train_config *cfg, mt_error *err) {
    yaml_event_t ev;
    int docs = 0;
    for (;;) {
        if (next_event(r, &ev, err)) return -1;
        yaml_event_type_t t = ev.type;
        size_t line = line_of(&ev);
        int rc = 0;
        if (t == YAML_DOCUMENT_START_EVENT && docs++)
            rc = mt_errorf(err, "%s:%zu: a second YAML document ('---'); put all options in one",
                           r->path, line);
        else if (t == YAML_MAPPING_START_EVENT)
            rc = read_mapping(r, cfg, err);
        else if (t == YAML_SEQUENCE_START_EVENT || t == YAML_ALIAS_EVENT ||
                 (t == YAML_SCALAR_EVENT && !is_null(&ev)))
            rc = mt_errorf(err, "%s:%zu: expected options as `key: value` lines, got %s",
                           r->path, line, node_kind(t));
        yaml_event_delete(&ev);
        if (rc) return -1;
        if (t == YAML_STREAM_END_EVENT) return 0;
    }
}

int mt_train_config_load_yaml(mt_train_config *cfg, const char *path, mt_error *err) {
    struct stat st;
    if (stat(path, &st))
        return mt_errorf(err, "config file '%s': %s (check the path given to --config)", path,
                         strerror(errno));
    if (!S_ISREG(st.st_mode))
        return mt_errorf(err, "config file '%s' is not a regular file (give a .yaml file)", path);
    FILE *f = fopen(path, "rb");
    if (!f) return mt_errorf(err, "config file '%s': %s", path, strerror(errno));
    yaml_reader r = {.path = path};
    if (!yaml_parser_initialize(&r.parser)) {
        fclose(f);
        return mt_errorf(err, "config file '%s': out of memory", path);
    }
    yaml_parser_set_input_file(&r.parser, f);
    int rc = read_stream(&r, cfg, err);
    yaml_parser_delete(&r.parser);
    fclose(f);
    return rc;
}

/* Writing ------------------------------------------------------------------ */

/* s as a YAML double-quoted scalar. */
static void yaml_quote(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

char *mt_train_config_to_yaml(const mt_train_config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    MT_ASSERT(f);
    fprintf(f, "# megatrain train: the effective options of this run.\n"
               "# Run again with: megatrain train --config config.yaml\n");
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        const mt_opt *o = &mt_tc_options[i];
        char text[MT_TC_STR];
        mt_opt_format(cfg, o, text, sizeof text);
        if (o->section) fprintf(f, "\n# %s\n", o->section);
        fprintf(f, "%s: ", o->name);
        if (o->offset == offsetof(mt_train_config, overwrite)) {
            /* it deleted the run that was in out; a run repeated from this
             * file must not delete this one unasked */
            fputs("false  # what was in out is deleted only when asked anew\n", f);
            continue;
        }
        if (o->type == MT_OPT_STRING && !(o->offset == offsetof(mt_train_config, data) &&
                                         mt_data_spec_is_list(text)))
            yaml_quote(f, text);
        else fputs(text, f);
        fputc('\n', f);
    }
    fclose(f);
    return buf;
}

int mt_train_config_save_yaml(const mt_train_config *cfg, const char *path, mt_error *err) {
    /* atomically: a full disk must not leave a resumed run's config.yaml empty */
    char *y = mt_train_config_to_yaml(cfg);
    mt_atomic_file f;
    int rc = mt_atomic_open(&f, path, err);
    if (rc == 0 && mt_write_all(f.fd, y, strlen(y), path, err)) {
        mt_atomic_abort(&f);
        rc = -1;
    } else if (rc == 0) {
        rc = mt_atomic_commit(&f, err);
    }
    free(y);
    return rc;
}

char *mt_train_config_to_json(const mt_train_config *cfg) {
    cJSON *root = cJSON_CreateObject();
    MT_ASSERT(root);
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        const mt_opt *o = &mt_tc_options[i];
        const void *p = (const char *)cfg + o->offset;
        char text[MT_TC_STR];
        mt_opt_format(cfg, o, text, sizeof text);
        /* Numbers as our own exact text: cJSON prints 15 digits when they
         * come close, which loses the last bit of a double. */
        if (o->type == MT_OPT_INT || o->type == MT_OPT_FLOAT) cJSON_AddRawToObject(root, o->name, text);
        else if (o->type == MT_OPT_BOOL) cJSON_AddBoolToObject(root, o->name, *(const bool *)p);
        else cJSON_AddStringToObject(root, o->name, text);
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    MT_ASSERT(s);
    return s;
}

/* One JSON member as text in the config syntax, for mt_tc_set. */
static int json_text(const cJSON *it, const mt_opt *o, char *buf, size_t n) {
    if (o->type == MT_OPT_STRING || o->type == MT_OPT_ENUM) {
        if (!cJSON_IsString(it)) return -1;
        snprintf(buf, n, "%s", it->valuestring);
    } else if (o->type == MT_OPT_BOOL) {
        if (!cJSON_IsBool(it)) return -1;
        snprintf(buf, n, "%s", cJSON_IsTrue(it) ? "true" : "false");
    } else {
        if (!cJSON_IsNumber(it)) return -1;
        snprintf(buf, n, "%.17g", it->valuedouble); // exact for doubles
    }
    return 0;
}

int mt_train_config_from_json(mt_train_config *cfg, const char *json, mt_error *err) {
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mt_errorf(err, "trainer state config: not a JSON object");
    }
    int rc = 0;
    for (const cJSON *it = root->child; it && !rc; it = it->next) {
        const mt_opt *o = mt_opt_lookup(&mt_tc_table, it->string);
        char text[MT_TC_STR], label[160];
        snprintf(label, sizeof label, "trainer state config: %s", it->string);
        if (!o) rc = mt_errorf(err, "%s: unknown key (written by another megatrain version?)", label);
        else if (json_text(it, o, text, sizeof text))
            rc = mt_errorf(err, "%s: wrong JSON type", label);
        else rc = mt_opt_set(&mt_tc_table, cfg, o, text, label, err);
    }
    cJSON_Delete(root);
    return rc;
}

char *mt_train_config_to_lines(const mt_train_config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    MT_ASSERT(f);
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        char text[MT_TC_STR];
        mt_opt_format(cfg, &mt_tc_options[i], text, sizeof text);
        fprintf(f, "%s=%s\n", mt_tc_options[i].name, text);
    }
    fclose(f);
    return buf;
}
