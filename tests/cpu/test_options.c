/* The option table (util/options.h) that every command declares: one table
 * drives the parsing, the --help text and the errors; an older spelling is
 * read with a note; an unknown one gets the closest name. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/options.h"

typedef struct demo {
    char name[MT_OPT_STR];
    const char *path;
    int64_t count;
    double rate;
    bool verbose;
    int color;
    bool given[8];
} demo;

static const char *const colors[] = {"red", "green", "blue", NULL};
static const mt_opt demo_options[] = {
    {"name", MT_OPT_STRING, offsetof(demo, name), "anon", NULL, MT_OPT_ANY, NULL, NULL, "Things",
     "who"},
    {"path", MT_OPT_TEXT, offsetof(demo, path), NULL, NULL, MT_OPT_ANY, NULL, "FILE", NULL,
     "the input"},
    {"count", MT_OPT_INT, offsetof(demo, count), "3", "1", MT_OPT_BETWEEN(1, 100), NULL, NULL,
     NULL, "how many"},
    {"rate", MT_OPT_FLOAT, offsetof(demo, rate), "0.5", NULL, MT_OPT_ABOVE(0), NULL, NULL, NULL,
     "how fast"},
    {"verbose", MT_OPT_BOOL, offsetof(demo, verbose), "false", NULL, MT_OPT_ANY, NULL, NULL, NULL,
     "say more"},
    {"color", MT_OPT_ENUM, offsetof(demo, color), "red", NULL, MT_OPT_ANY, colors, NULL, "Looks",
     "the color"},
};
static const mt_opt_alias demo_aliases[] = {
    {"p", "path", MT_ALIAS_SHORT},
    {"input", "path", MT_ALIAS_DEPRECATED},
    {"colour", "color", MT_ALIAS_SUGGEST},
};
static const mt_opt_table demo_table = {
    .command = "demo", MT_OPT_ROWS(demo_options), MT_OPT_ALIASES(demo_aliases),
    MT_OPT_STRUCT(demo), .positional = "path", .alt_def_name = "small",
    .about = "A table to test the tables with."};

static char notes[512];

static void keep_note(void *user, const char *note) {
    (void)user;
    snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "%s\n", note);
}

/* mt_opt_parse of the NULL-terminated args after "demo"; notes kept. */
static int parse(demo *d, mt_error *err, const char **args) {
    char *argv[32] = {"demo"};
    int argc = 1;
    while (args[argc - 1]) argv[argc] = (char *)args[argc - 1], argc++;
    notes[0] = 0;
    return mt_opt_parse(&demo_table, d, argc, argv, keep_note, NULL, err);
}

static void expect_error(const char **args, const char *s1, const char *s2) {
    demo d;
    mt_error err;
    cr_assert_eq(parse(&d, &err, args), -1, "accepted %s %s", args[0], args[1] ? args[1] : "");
    cr_assert(strstr(err.msg, s1), "'%s' not in: %s", s1, err.msg);
    cr_assert(strstr(err.msg, s2), "'%s' not in: %s", s2, err.msg);
}

Test(options, a_table_drives_the_parsing) {
    demo d;
    mt_error err;
    const char *args[] = {"--name=bob", "--count", "1e1", "--rate", "2", "--verbose",
                          "--color", "BLUE", "in.txt", NULL};
    cr_assert_eq(parse(&d, &err, args), 0, "%s", err.msg);
    cr_assert_str_eq(d.name, "bob");
    cr_assert_eq(d.path, args[8], "a text option keeps the argument itself");
    cr_assert_eq(d.count, 10);
    cr_assert_eq(d.rate, 2.0);
    cr_assert(d.verbose);
    cr_assert_eq(d.color, 2);
    cr_assert(mt_opt_given(&demo_table, &d, "rate"));
    cr_assert_str_eq(notes, "");
    const char *more[] = {"-p", "x", "--no-verbose", "--verbose=no", NULL};
    cr_assert_eq(parse(&d, &err, more), 0, "%s", err.msg);
    cr_assert_str_eq(d.path, "x");
    cr_assert_str_eq(d.name, "anon", "the defaults come first");
    cr_assert_eq(d.count, 3);
    cr_assert_not(d.verbose);
    cr_assert_not(mt_opt_given(&demo_table, &d, "rate"));
    const char *rest[] = {"--", "--verbose", NULL}; // after "--", an argument is not a flag
    cr_assert_eq(parse(&d, &err, rest), 0, "%s", err.msg);
    cr_assert_str_eq(d.path, "--verbose");
    cr_assert_not(d.verbose);
}

Test(options, help_returns_one_and_parses_nothing) {
    demo d;
    mt_error err;
    cr_assert_eq(parse(&d, &err, (const char *[]){"--count", "bad", "--help", NULL}), 1);
    cr_assert_eq(parse(&d, &err, (const char *[]){"-h", NULL}), 1);
}

Test(options, errors_name_the_option_and_the_fix) {
    expect_error((const char *[]){"x", "--count", "0", NULL}, "--count", ">= 1 and <= 100, got 0");
    expect_error((const char *[]){"x", "--count", "2.5", NULL}, "--count", "expected an integer");
    expect_error((const char *[]){"x", "--rate", "0", NULL}, "--rate", "must be > 0");
    expect_error((const char *[]){"x", "--rate", "fast", NULL}, "--rate", "expected a number");
    expect_error((const char *[]){"x", "--color", "purple", NULL}, "--color",
                 "allowed: red, green, blue");
    expect_error((const char *[]){"x", "--verbose=maybe", NULL}, "--verbose", "true or false");
    expect_error((const char *[]){"x", "--count", NULL}, "--count needs a value", "--count 3");
    expect_error((const char *[]){"x", "--name", "--count", "2", NULL}, "--name", "needs a value");
    expect_error((const char *[]){"--count", "2", NULL}, "FILE is required", "megatrain demo FILE");
    expect_error((const char *[]){"x", "y", NULL}, "unexpected argument 'y'", "'x'");
    expect_error((const char *[]){"x", "-q", NULL}, "unknown option '-q'", "megatrain demo --help");
}

Test(options, a_misspelled_option_gets_the_closest_name) {
    expect_error((const char *[]){"x", "--cont", "2", NULL}, "unknown option '--cont'",
                 "did you mean '--count'?");
    expect_error((const char *[]){"x", "--colour", "red", NULL}, "--colour",
                 "did you mean '--color'?");
    expect_error((const char *[]){"x", "--shape", "round", NULL}, "unknown option '--shape'",
                 "run 'megatrain demo --help' for the list");
    cr_assert_str_eq(mt_opt_suggest(&demo_table, "Verbos"), "verbose");
    cr_assert_str_eq(mt_opt_suggest(&demo_table, "verb"), "verbose", "the start of one name");
    cr_assert_null(mt_opt_suggest(&demo_table, "zzzzzzzz"));
}

Test(options, an_older_spelling_works_and_says_so) {
    demo d;
    mt_error err;
    cr_assert_eq(parse(&d, &err, (const char *[]){"--input", "a.txt", NULL}), 0, "%s", err.msg);
    cr_assert_str_eq(d.path, "a.txt");
    cr_assert(strstr(notes, "--input is deprecated"), "%s", notes);
    cr_assert(strstr(notes, "--path"), "%s", notes);
    cr_assert_eq(strchr(notes, '\n'), notes + strlen(notes) - 1, "one line: %s", notes);
}

Test(options, help_lists_every_option_from_the_table) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mt_opt_usage(&demo_table, f);
    fclose(f);
    static const char *const want[] = {
        "usage: megatrain demo [options] FILE\nA table to test the tables with.\n",
        "  --help ", "\nThings:\n", "  --name S ", "who (default anon)", "  -p, --path FILE ",
        "the input (required; deprecated spelling:\n", " --input)\n", "  --count N ",
        "how many (default 3; small 1)", "  --rate X ", "  --[no-]verbose ", "\nLooks:\n",
        "  --color red|green|blue ", "the color (default red)"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(text, want[i]), "'%s' not in:\n%s", want[i], text);
    free(text);
}

Test(options, values_read_back_as_they_were_set) {
    demo d;
    mt_error err;
    mt_opt_defaults(&demo_table, &d);
    cr_assert_null(d.path);
    static const char *const values[] = {"a b", "p", "42", "1.0e-05", "true", "green"};
    for (size_t i = 0; i < demo_table.n; i++) {
        char text[64];
        const mt_opt *o = &demo_options[i];
        cr_assert_eq(mt_opt_set(&demo_table, &d, o, values[i], o->name, &err), 0, "%s", err.msg);
        mt_opt_format(&d, o, text, sizeof text);
        cr_assert_str_eq(text, values[i]);
    }
    cr_assert_eq(mt_opt_find(&demo_table, "COLOR"), &demo_options[5]);
    cr_assert_null(mt_opt_find(&demo_table, "colour"), "a suggestion is not a spelling");
}
