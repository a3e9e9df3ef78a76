/* Subcommands of the megatrain binary. Each takes argc/argv starting at
 * the subcommand's name and returns the process exit code: 0, 1 when the
 * work failed, 2 on a usage error. Each declares its options in a table
 * (util/options.h; rows several share: cli/cli_options.h) and reads them
 * with mt_cli_parse. */
#ifndef MT_CLI_COMMANDS_H
#define MT_CLI_COMMANDS_H

#include "megatrain.h"
#include "model/presets.h"
#include "util/options.h"

/* A command, or a subcommand of bench: its name, what runs it, one line
 * for the list of `megatrain --help`. */
typedef struct mt_cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} mt_cli_command;

/* The benchmarks of `megatrain bench` (cmd_bench.c). */
extern const mt_cli_command mt_bench_commands[];
extern const size_t mt_bench_n_commands;

int mt_cmd_train(int argc, char **argv);
int mt_cmd_bench(int argc, char **argv);
int mt_bench_train(int argc, char **argv);
int mt_cmd_tokenize(int argc, char **argv);
int mt_cmd_plot(int argc, char **argv);
int mt_cmd_generate(int argc, char **argv);
int mt_cmd_eval(int argc, char **argv);
int mt_cmd_init(int argc, char **argv);
int mt_cmd_plan(int argc, char **argv);
int mt_cmd_calibrate(int argc, char **argv);

/* Reads argv into obj by the table t (parse.c): after --help prints the
 * usage to stdout and returns 0; after a bad argument prints its error to
 * stderr and returns 2; prints a note on stderr for an older spelling.
 * Returns -1 when the command goes on with obj filled. */
int mt_cli_parse(const mt_opt_table *t, void *obj, int argc, char **argv);

/* Prints "megatrain <command>: <message>" to stderr and returns code. */
int mt_cli_fail(const char *command, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The preset called name, or NULL after saying so (a usage error, 2). */
const mt_preset *mt_cli_preset(const char *command, const char *name);

/* Starts n ranks of this command line ("megatrain" [prefix] argv...) on
 * this machine and waits for them (dist/launch.h); returns the exit code:
 * 0, 130 when a signal stopped them, 1 when a rank failed (named on
 * stderr). */
int mt_cli_launch(int n, const char *prefix, int argc, char **argv);

/* An mt_event_fn that prints (print.c): INFO and progress lines to stdout,
 * WARNING to stderr after "megatrain: ", TEXT as it is. */
void mt_cli_print_event(const mt_event *ev, void *user);

#endif
