/* megatrain train: parses the options (defaults, --config FILE, flags) and
 * runs the training (the library's mt_run, train/trainer.c), printing what
 * it reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "dist/launch.h"

static int run(void *args, int argc, char **argv) {
    mt_options *o = mt_options_new();
    int rc = mt_options_parse_args(o, argc, argv);
    if (rc == 1) {
        char *usage = mt_options_usage();
        fputs(usage, stdout);
        mt_free(usage);
        mt_options_free(o);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "megatrain train: %s\n", mt_last_error());
        mt_options_free(o);
        return 2;
    }
    char gpus[32] = "0";
    mt_options_get(o, "gpus", gpus, sizeof gpus);
    if (atoi(gpus) > 1 && !mt_launch_is_rank()) { /* this process starts the ranks */
        mt_options_free(o);
        return mt_cli_launch(atoi(gpus), NULL, argc, argv);
    }
    /* a bar in a terminal (tqdm's habit); plain progress lines in a log */
    const char *term = getenv("TERM");
    mt_cli_progress bar = {.bar = isatty(STDOUT_FILENO) && !mt_launch_is_rank() &&
                                  !(term && !strcmp(term, "dumb"))};
    mt_run *r = mt_run_open(o, mt_cli_print_event, &bar);
    mt_options_free(o);
    rc = r ? mt_run_train(r) : -1;
    if (bar.shown) fputs("\r\033[K", stdout), fflush(stdout);
    if (rc < 0) fprintf(stderr, "megatrain train: %s\n", mt_last_error());
    mt_run_close(r);
    return rc < 0 ? 1 : rc == 1 ? 130 : 0;
}

/* No table here: train's options are the library's (mt_options, train_config.c). */
const mt_cli_command mt_cli_train = {
    "train", "train or fine-tune a model (default: the built-in tiny model)", NULL, run};
