/* The command line of `megatrain train`: --config FILE, then the flags
 * (`--batch-size 8`, `--batch-size=8`, `--[no-]skip-bad-lines`), and the
 * --help text, both driven by the option table. This file reads the table
 * (train_config.c) and the YAML file (train_config_io.c); neither reads
 * this one. */
#include <stdio.h>
#include <string.h>

#include "train/train_config_internal.h"

/* --help --------------------------------------------------------------- */

/* text in words after column `indent` (where the cursor is), up to `width`. */
static void print_wrapped(FILE *f, const char *text, int indent, int width) {
    int col = indent;
    while (*text) {
        int len = (int)strcspn(text, " ");
        if (col > indent && col + 1 + len > width) fprintf(f, "\n%*s", col = indent, "");
        fprintf(f, " %.*s", len, text);
        col += len + 1;
        text += len + (text[len] == ' ');
    }
    fputc('\n', f);
}

static void option_usage(FILE *f, const mt_tc_option *o) {
    char flag[96], meta[160];
    for (size_t i = 0; i <= strlen(o->name); i++)
        flag[i] = o->name[i] == '_' ? '-' : o->name[i];
    if (o->type == MT_TC_BOOL) {
        snprintf(meta, sizeof meta, "--[no-]%s", flag);
    } else {
        char choices[128] = "";
        if (o->type == MT_TC_ENUM) {
            size_t used = 0;
            for (int i = 0; o->choices[i]; i++)
                used += (size_t)snprintf(choices + used, sizeof choices - used, "%s%s",
                                         i ? "|" : "", o->choices[i]);
        }
        const char *m = o->meta ? o->meta
                        : o->type == MT_TC_ENUM ? choices
                        : o->type == MT_TC_INT  ? "N" : o->type == MT_TC_FLOAT ? "X" : "S";
        snprintf(meta, sizeof meta, "--%s %s", flag, m);
    }
    char text[512];
    int n = snprintf(text, sizeof text, "%s (default %s", o->help, o->def[0] ? o->def : "none");
    if (o->tiny_def) snprintf(text + n, sizeof text - (size_t)n, "; tiny model %s", o->tiny_def);
    strcat(text, ")");
    fprintf(f, "  %-30s", meta);
    if (strlen(meta) > 30) fprintf(f, "\n  %-30s", "");
    print_wrapped(f, text, 32, 80);
}

void mt_train_config_usage(FILE *f) {
    fprintf(f,
            "usage: megatrain train [--config FILE.yaml] [options]\n"
            "Trains (fine-tunes) a Llama-family model; with no model, the built-in tiny model\n"
            "on built-in English text. Options come from defaults, then the YAML config file\n"
            "(flat keys: `seq_len: 2048`, '_' or '-'), then these flags, which win.\n\n"
            "  %-30s read options from a YAML file first\n"
            "  %-30s this text\n",
            "--config FILE", "--help");
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        if (mt_tc_options[i].section) fprintf(f, "\n%s:\n", mt_tc_options[i].section);
        option_usage(f, &mt_tc_options[i]);
    }
}

/* Flags ----------------------------------------------------------------- */

static bool is_flag(const char *a, const char *name) {
    size_t n = strlen(name);
    return !strncmp(a, name, n) && (a[n] == 0 || a[n] == '=');
}

/* The --config file, wherever it appears; NULL if none. */
static int find_config(int argc, char **argv, const char **path, mt_error *err) {
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!is_flag(argv[i], "--config")) continue;
        if (*path) return mt_errorf(err, "--config: given twice; merge the files into one");
        if (argv[i][8] == '=') *path = argv[i] + 9;
        else if (i + 1 < argc) *path = argv[++i];
        else return mt_errorf(err, "--config needs a file (--config run.yaml)");
    }
    return 0;
}

static int unknown_flag(const char *name, mt_error *err) {
    const char *s = mt_tc_suggest(name);
    char flag[96] = "";
    for (size_t i = 0; s && i <= strlen(s) && i < sizeof flag; i++)
        flag[i] = s[i] == '_' ? '-' : s[i];
    if (s) return mt_errorf(err, "unknown option '--%s' (did you mean '--%s'?)", name, flag);
    return mt_errorf(err, "unknown option '--%s' (run 'megatrain train --help' for the list)",
                     name);
}

/* One flag at argv[*i]; advances *i past its value. */
static int parse_flag(mt_train_config *cfg, int argc, char **argv, int *i, mt_error *err) {
    const char *a = argv[*i];
    if (a[0] != '-' || a[1] != '-')
        return mt_errorf(err, "unexpected argument '%s' (options start with --; a config file "
                              "is given with --config FILE)", a);
    char name[128];
    const char *eq = strchr(a, '='), *value = eq ? eq + 1 : NULL;
    size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (len >= sizeof name) return mt_errorf(err, "unknown option '%.60s...'", a);
    memcpy(name, a + 2, len);
    name[len] = 0;
    const mt_tc_option *o = mt_tc_find(name);
    char label[160];
    snprintf(label, sizeof label, "--%s", name);
    if (!o && !strncmp(name, "no-", 3) && !value) {
        o = mt_tc_find(name + 3);
        if (o && o->type == MT_TC_BOOL) return mt_tc_set(cfg, o, "false", label, err);
        o = NULL;
    }
    if (!o) return unknown_flag(name, err);
    if (o->type == MT_TC_BOOL && !value) return mt_tc_set(cfg, o, "true", label, err);
    if (!value) {
        if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2))
            return mt_errorf(err, "%s needs a value (e.g. %s %s)", label, label, o->def[0] ? o->def : "VALUE");
        value = argv[++*i];
    }
    return mt_tc_set(cfg, o, value, label, err);
}

int mt_train_config_parse_args(mt_train_config *cfg, int argc, char **argv, mt_error *err) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    mt_train_config_defaults(cfg);
    const char *path;
    if (find_config(argc, argv, &path, err)) return -1;
    if (path && mt_train_config_load_yaml(cfg, path, err)) return -1;
    for (int i = 1; i < argc; i++) {
        if (is_flag(argv[i], "--config")) {
            i += argv[i][8] != '=';
            continue;
        }
        if (parse_flag(cfg, argc, argv, &i, err)) return -1;
    }
    mt_train_config_resolve(cfg);
    return mt_train_config_validate(cfg, err);
}
