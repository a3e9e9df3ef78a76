/* Subcommands of the megatrain binary. Each takes argc/argv starting at
 * the subcommand's name and returns the process exit code. */
#ifndef MT_CLI_COMMANDS_H
#define MT_CLI_COMMANDS_H

#include "megatrain.h"

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

/* Starts n ranks of this command line ("megatrain" [prefix] argv...) on
 * this machine and waits for them (dist/launch.h); returns the exit code:
 * 0, 130 when a signal stopped them, 1 when a rank failed (named on
 * stderr). */
int mt_cli_launch(int n, const char *prefix, int argc, char **argv);

/* An mt_event_fn that prints (print.c): INFO and progress lines to stdout,
 * WARNING to stderr after "megatrain: ", TEXT as it is. */
void mt_cli_print_event(const mt_event *ev, void *user);

#endif
