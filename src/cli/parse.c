/* How every command reads its arguments: its option table (util/options.h)
 * parses them, and this file says the outcome on the terminal: the usage
 * for --help, a bad argument's error, the note on an older spelling. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "model/presets.h"
#include "util/mem.h"

static void print_note(void *command, const char *note) {
    fprintf(stderr, "megatrain %s: %s\n", (const char *)command, note);
}

int mt_cli_run(const mt_cli_command *c, int argc, char **argv) {
    const mt_opt_table *t = c->options;
    if (!t) return c->run(NULL, argc, argv);
    void *args = mt_calloc_or_die(1, t->size);
    mt_error err;
    int rc = mt_opt_parse(t, args, argc, argv, print_note, (void *)t->command, &err);
    if (rc == 1) {
        mt_opt_usage(t, stdout);
        rc = 0;
    } else if (rc < 0) {
        rc = mt_cli_fail(t->command, 2, "%s", err.msg);
    } else {
        rc = c->run(args, argc, argv);
    }
    free(args);
    return rc;
}

int mt_cli_fail(const char *command, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "megatrain %s: ", command);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

void mt_cli_warn_launcher(const char *command) {
    const char *world = getenv("WORLD_SIZE"), *rank = getenv("RANK");
    long n = world ? strtol(world, NULL, 10) : 0;
    if (n > 1 && rank)
        fprintf(stderr, "megatrain %s: warning: torchrun started %ld processes (WORLD_SIZE=%s, "
                "RANK=%s), but %s runs in one: each of them does all of it alone; run it once, "
                "without torchrun (only train and bench train use several)\n",
                command, n, world, rank, command);
}

const mt_preset *mt_cli_preset(const char *command, const char *name) {
    const mt_preset *p = mt_preset_find(name);
    if (!p)
        mt_cli_fail(command, 2, "--preset: unknown value '%s' (allowed: %s)", name,
                    MT_PRESET_NAMES);
    return p;
}
