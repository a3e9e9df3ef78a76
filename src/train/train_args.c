/* The command line of `megatrain train`: --config FILE, then the flags
 * (`--batch-size 8`, `--batch-size=8`, `--[no-]skip-bad-lines`), and the
 * --help text, both driven by the option table (util/options.h). This file
 * reads the table (train_config.c) and the YAML file (train_config_io.c);
 * neither reads this one. */
#include <stdio.h>
#include <string.h>

#include "train/train_config_internal.h"

void mt_train_config_usage(FILE *f) { mt_opt_usage(&mt_tc_table, f); }

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
        if (argv[i][0] != '-' || argv[i][1] != '-')
            return mt_errorf(err, "unexpected argument '%s' (options start with --; a config "
                                  "file is given with --config FILE)", argv[i]);
        /* train has no older spellings to note */
        if (mt_opt_parse_flag(&mt_tc_table, cfg, argc, argv, &i, NULL, NULL, err)) return -1;
    }
    mt_train_config_resolve(cfg);
    return mt_train_config_validate(cfg, err);
}
