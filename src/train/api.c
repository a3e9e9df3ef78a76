/* The public calls about the library itself and the options of a run
 * (megatrain.h): thin wrappers over train_config*.c that leave their errors
 * for mt_last_error. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatrain.h"
#include "train/events.h"
#include "train/options.h"
#include "train/train_config_internal.h"
#include "util/mem.h"

/* The Makefile passes the GPU code it asked nvcc for. */
#ifndef MT_CUDA_ARCHS
#define MT_CUDA_ARCHS "none (CPU only)"
#endif

const char *mt_version(void) { return MT_VERSION; }
const char *mt_cuda_archs(void) { return MT_CUDA_ARCHS; }

mt_options *mt_options_new(void) {
    mt_options *o = mt_calloc_or_die(1, sizeof *o);
    mt_train_config_defaults(&o->tc);
    return o;
}

void mt_options_free(mt_options *o) { free(o); }

int mt_options_set(mt_options *o, const char *key, const char *value) {
    mt_error err;
    if (!key || !value) return mt_set_last_error(&(mt_error){"mt_options_set: key and value must "
                                                             "not be NULL"});
    return mt_train_config_set(&o->tc, key, value, NULL, &err) ? mt_set_last_error(&err) : 0;
}

int mt_options_get(const mt_options *o, const char *key, char *buf, size_t size) {
    const mt_opt *opt = key ? mt_opt_lookup(&mt_tc_table, key) : NULL;
    if (!opt) {
        mt_error err;
        mt_train_config tmp = o->tc;
        mt_train_config_set(&tmp, key ? key : "(null)", "", NULL, &err); /* the unknown-key message */
        return mt_set_last_error(&err);
    }
    char text[MT_TC_STR];
    mt_opt_format(&o->tc, opt, text, sizeof text);
    if (size) snprintf(buf, size, "%s", text);
    return (int)strlen(text);
}

int mt_options_load_yaml(mt_options *o, const char *path) {
    mt_error err;
    return mt_train_config_load_yaml(&o->tc, path, &err) ? mt_set_last_error(&err) : 0;
}

/* One JSON member as option text: strings as they are, numbers exactly,
 * booleans as true/false; the option's own parser checks the rest. */
static int member_text(const cJSON *it, char *buf, size_t n) {
    if (cJSON_IsString(it)) snprintf(buf, n, "%s", it->valuestring);
    else if (cJSON_IsBool(it)) snprintf(buf, n, "%s", cJSON_IsTrue(it) ? "true" : "false");
    else if (cJSON_IsNumber(it)) snprintf(buf, n, "%.17g", it->valuedouble);
    else return -1;
    return 0;
}

int mt_options_set_json(mt_options *o, const char *json) {
    mt_error err;
    cJSON *root = json ? cJSON_Parse(json) : NULL;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        mt_errorf(&err, "options JSON: not a JSON object (give {\"key\": value, ...})");
        return mt_set_last_error(&err);
    }
    mt_train_config tc = o->tc; /* all or nothing */
    int rc = 0;
    for (const cJSON *it = root->child; it && !rc; it = it->next) {
        char text[MT_TC_STR];
        if (member_text(it, text, sizeof text))
            rc = mt_errorf(&err, "options JSON: %s: expected a string, a number or true/false",
                           it->string);
        else
            rc = mt_train_config_set(&tc, it->string, text, "options JSON", &err);
    }
    cJSON_Delete(root);
    if (rc) return mt_set_last_error(&err);
    o->tc = tc;
    return 0;
}

int mt_options_resolve(mt_options *o) {
    mt_error err;
    mt_train_config_resolve(&o->tc);
    return mt_train_config_validate(&o->tc, &err) ? mt_set_last_error(&err) : 0;
}

int mt_options_parse_args(mt_options *o, int argc, char **argv) {
    mt_error err;
    int rc = mt_train_config_parse_args(&o->tc, argc, argv, &err);
    return rc < 0 ? mt_set_last_error(&err) : rc;
}

char *mt_options_to_yaml(const mt_options *o) { return mt_train_config_to_yaml(&o->tc); }
char *mt_options_to_json(const mt_options *o) { return mt_train_config_to_json(&o->tc); }

char *mt_options_usage(void) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    MT_ASSERT(f);
    mt_train_config_usage(f);
    fclose(f);
    return text;
}

size_t mt_options_count(void) { return mt_tc_n_options; }

/* "a|b|c" of each enum option, made once. */
static char choices_text[MT_TC_MAX_OPTIONS][256];
static pthread_once_t choices_once = PTHREAD_ONCE_INIT;

static void make_choices(void) {
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        const char *const *c = mt_tc_options[i].choices;
        size_t used = 0;
        for (int k = 0; c && c[k] && used < sizeof choices_text[i]; k++)
            used += (size_t)snprintf(choices_text[i] + used, sizeof choices_text[i] - used,
                                     "%s%s", k ? "|" : "", c[k]);
    }
}

int mt_options_describe(size_t i, mt_option_info *info) {
    static const char *const types[] = {"string", "int", "float", "bool", "enum", "string"};
    if (i >= mt_tc_n_options) {
        mt_error err;
        mt_errorf(&err, "option %zu: there are %zu options (0 .. %zu)", i, mt_tc_n_options,
                  mt_tc_n_options - 1);
        return mt_set_last_error(&err);
    }
    pthread_once(&choices_once, make_choices);
    const mt_opt *o = &mt_tc_options[i];
    *info = (mt_option_info){.name = o->name, .type = types[o->type], .default_value = o->def,
                             .tiny_default = o->alt_def,
                             .choices = o->choices ? choices_text[i] : NULL,
                             .section = o->section, .help = o->help};
    return 0;
}
