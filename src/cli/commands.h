/* The commands of the megatrain binary. Each is an mt_cli_command: its
 * options as a table (util/options.h; rows several commands share:
 * cli/cli_options.h), and a run function that gets them parsed. main.c
 * lists them; mt_cli_run reads the arguments by the table (--help, errors
 * naming the option, notes on older spellings) and calls run, which
 * returns the exit code: 0, 1 when the work failed, 2 on a usage error. */
#ifndef MT_CLI_COMMANDS_H
#define MT_CLI_COMMANDS_H

#include "megatrain.h"
#include "model/presets.h"
#include "util/options.h"

typedef struct mt_cli_command {
    const char *name;            // as typed: "eval"; "train" under bench
    const char *help;            // its line in the list of `megatrain --help`
    const mt_opt_table *options; // NULL: run reads argv itself (train, bench)
    /* The work: args is the struct of the options, filled (NULL without
     * a table); argv[0] is the name; returns the exit code. */
    int (*run)(void *args, int argc, char **argv);
} mt_cli_command;

extern const mt_cli_command mt_cli_train, mt_cli_init, mt_cli_plan, mt_cli_calibrate,
    mt_cli_bench, mt_cli_tokenize, mt_cli_generate, mt_cli_eval, mt_cli_plot;
/* The benchmarks of `megatrain bench` (cmd_bench.c; train: bench_train.c). */
extern const mt_cli_command mt_cli_bench_train;
extern const mt_cli_command *const mt_bench_commands[];
extern const size_t mt_bench_n_commands;

/* Runs c with argv (argv[0] its name): the arguments read into a new
 * struct by its table, then c->run. After --help prints the usage to
 * stdout and returns 0; after a bad argument prints its error to stderr and
 * returns 2; prints a note on stderr for an older spelling. */
int mt_cli_run(const mt_cli_command *c, int argc, char **argv);

/* Prints "megatrain <command>: <message>" to stderr and returns code. */
int mt_cli_fail(const char *command, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A command of one process (eval, generate, plan, ...) started by torchrun
 * as several (WORLD_SIZE > 1 with RANK set): says on stderr that each
 * process does the whole work alone, rather than ignoring the variables. */
void mt_cli_warn_launcher(const char *command);

/* The preset called name, or NULL after saying so (a usage error, 2). */
const mt_preset *mt_cli_preset(const char *command, const char *name);

/* Starts n ranks of this command line ("megatrain" [prefix] argv...) on
 * this machine and waits for them (dist/launch.h); returns the exit code:
 * 0, 130 when a signal stopped them, 1 when a rank failed (named on
 * stderr). */
int mt_cli_launch(int n, const char *prefix, int argc, char **argv);

/* Training's progress bar: drawn at every step when bar is set (stdout
 * is a terminal); shown while one is on the line. */
typedef struct mt_cli_progress {
    bool bar, shown;
} mt_cli_progress;

/* An mt_event_fn that prints (print.c): INFO and progress lines to stdout,
 * WARNING to stderr after "megatrain: ", TEXT as it is; user NULL, or an
 * mt_cli_progress for the bar. */
void mt_cli_print_event(const mt_event *ev, void *user);

/* The bar of a step, at most width - 1 characters: "42% [####------]
 * 42/100 | loss 2.3456 | 12.3k tok/s | ETA 3m05s". */
void mt_cli_progress_bar(const mt_step_metrics *m, int width, char *buf, size_t n);

#endif
