/* Option tables: every command declares its options once, as a table of
 * {name, type, field, default, range or choices, placeholder, help}, and
 * this file derives the rest from it: the defaults, setting a value from
 * text (type and range checked, errors naming the option and the fix),
 * the flags (`--seq-len 8`, `--seq-len=8`, `--[no-]flag`), a close spelling
 * for an unknown one, older spellings read with a note, and the --help
 * text. `megatrain train` adds YAML and JSON on the same table
 * (train/train_config*.c); the other commands parse with mt_cli_parse
 * (cli/commands.h).
 *
 * The table writes into a struct of the command's own: each option names
 * the offset of its field, and the struct holds a `bool given[]` that
 * records which options were set (a default that depends on another option
 * is filled only where the user gave none). Nothing here prints except the
 * usage, to the FILE it is given. */
#ifndef MT_UTIL_OPTIONS_H
#define MT_UTIL_OPTIONS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "util/error.h"

/* Longest MT_OPT_STRING value, terminator included. */
#define MT_OPT_STR 1024
/* Integers must survive a round trip through JSON numbers (doubles). */
#define MT_OPT_INT_MAX 9007199254740992.0

typedef enum mt_opt_type {
    MT_OPT_STRING, // char[MT_OPT_STR], the value copied in
    MT_OPT_INT,    // int64_t; written 1000 or 1e3, not 2.5
    MT_OPT_FLOAT,  // double, finite
    MT_OPT_BOOL,   // bool; as a flag --name / --no-name
    MT_OPT_ENUM,   // int: the index of the value in choices
    MT_OPT_TEXT,   // const char *: the given text itself (argv), not copied; "" default = NULL
} mt_opt_type;

/* Bounds of numeric options; NAN = unbounded on that side. */
typedef struct mt_opt_range {
    double lo, hi;
    bool lo_open, hi_open; // true: the bound itself is not allowed
} mt_opt_range;

#define MT_OPT_ANY {NAN, NAN, false, false}
#define MT_OPT_NONNEG {0, NAN, false, false}
#define MT_OPT_AT_LEAST(x) {x, MT_OPT_INT_MAX, false, false}
#define MT_OPT_BETWEEN(lo, hi) {lo, hi, false, false}
#define MT_OPT_ABOVE(x) {x, NAN, true, false}

typedef struct mt_opt {
    const char *name;           // key, words joined by '_'; the flag is --name with '-'
    mt_opt_type type;
    size_t offset;              // of the field in the command's struct
    const char *def;            // default as text; NULL: required (no default). "" on a
                                // number, bool or enum: none, the field is left 0 and the
                                // help says what not giving it means
    const char *alt_def;        // a second default the command may apply (mt_opt_table)
    mt_opt_range range;
    const char *const *choices; // MT_OPT_ENUM: names, NULL-terminated, in enum order
    const char *meta;           // argument placeholder in --help; NULL = from the type
    const char *section;        // non-NULL on the first option of a --help section
    const char *help;
} mt_opt;

/* Other spellings: a short flag (-o), an older spelling still read with a
 * note (--host-ram-gb for --host-mem), or a key of other tools that is only
 * suggested (learning_rate -> lr). */
typedef enum mt_opt_alias_kind {
    MT_ALIAS_SHORT,
    MT_ALIAS_DEPRECATED,
    MT_ALIAS_SUGGEST,
} mt_opt_alias_kind;

typedef struct mt_opt_alias {
    const char *spelling; // a key ('_') for DEPRECATED and SUGGEST, one letter for SHORT
    const char *name;     // the option it stands for
    mt_opt_alias_kind kind;
} mt_opt_alias;

typedef struct mt_opt_table {
    const char *command;        // "eval", "bench train": messages and the --help hint
    const char *about;          // what the command does, under the usage line of --help
    const char *usage;          // the head of --help as written; NULL: the usage line (made
                                // from the table) and `about`
    const mt_opt *opts;
    size_t n;
    const mt_opt_alias *aliases;
    size_t n_aliases;
    size_t size;                // of the struct the table fills
    size_t given;               // offset of its bool given[]
    size_t n_given;             // the length of given[] (at least n)
    const char *positional;     // the option a bare argument sets, NULL = none
    const char *alt_def_name;   // what alt_def is called in --help ("tiny model")
} mt_opt_table;

/* Entries of an array. */
#define MT_OPT_COUNT(a) (sizeof(a) / sizeof *(a))
/* The fields of an mt_opt_table for the options `o`, the aliases `a`, and
 * the struct type T that they fill. */
#define MT_OPT_ROWS(o) .opts = o, .n = MT_OPT_COUNT(o)
#define MT_OPT_ALIASES(a) .aliases = a, .n_aliases = MT_OPT_COUNT(a)
#define MT_OPT_STRUCT(T) \
    .size = sizeof(T), .given = offsetof(T, given), .n_given = MT_OPT_COUNT(((T *)0)->given)

/* Notes for the user (an older spelling was read); NULL: none wanted. */
typedef void (*mt_opt_note_fn)(void *user, const char *note);

/* Every option at its default, none given. Aborts on a table whose
 * default does not parse (a bug, not an input). */
void mt_opt_defaults(const mt_opt_table *t, void *obj);

/* Option by key ('_' or '-', any case), or NULL. */
const mt_opt *mt_opt_find(const mt_opt_table *t, const char *key);

/* As mt_opt_find, also through an older spelling of an option (a
 * deprecated alias): what a file or a saved state may still say. */
const mt_opt *mt_opt_lookup(const mt_opt_table *t, const char *key);

/* Closest option name to an unknown key ("learning_rate" -> "lr",
 * "batchsize" -> "batch_size"), or NULL. */
const char *mt_opt_suggest(const mt_opt_table *t, const char *key);

/* Sets o from text and marks it given; `label` starts error messages
 * ("run.yaml:7: lr", "--lr"). An MT_OPT_TEXT field keeps `value` itself. */
int mt_opt_set(const mt_opt_table *t, void *obj, const mt_opt *o, const char *value,
               const char *label, mt_error *err);

/* Whether the option `name` was given (set since mt_opt_defaults). */
bool mt_opt_given(const mt_opt_table *t, const void *obj, const char *name);

/* Whether a numeric option's value is in its range; `label` and `text`
 * (the value as written) go into the message. */
int mt_opt_check_range(const mt_opt *o, double v, const char *text, const char *label,
                       mt_error *err);

/* The value of o as text in the config syntax (shortest exact form for
 * numbers, "" for an absent MT_OPT_TEXT). */
void mt_opt_format(const void *obj, const mt_opt *o, char *buf, size_t n);

/* The flag at argv[*i] ("--name", "--name=value", "--no-name", "-x"),
 * setting its option; advances *i past a separate value. An older
 * spelling is read and reported to note. */
int mt_opt_parse_flag(const mt_opt_table *t, void *obj, int argc, char **argv, int *i,
                      mt_opt_note_fn note, void *user, mt_error *err);

/* A whole command line, argv[0] being the command: defaults, then the
 * flags in order (a bare argument sets t->positional, once; after "--"
 * every argument is bare), then the check that every required option was
 * given. Returns 0, 1 when --help or -h was asked (nothing else done), or
 * -1 with err filled. */
int mt_opt_parse(const mt_opt_table *t, void *obj, int argc, char **argv, mt_opt_note_fn note,
                 void *user, mt_error *err);

/* The --help text: t->usage (or "usage: megatrain <command> <the required
 * options> [options]" and t->about), then every option with its
 * placeholder, help, default and other spellings, by section. */
void mt_opt_usage(const mt_opt_table *t, FILE *f);

#endif
