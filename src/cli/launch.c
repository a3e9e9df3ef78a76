/* `--gpus N` on the command line: this process starts the N ranks of the
 * run (dist/launch.h) and reports how they ended. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/commands.h"
#include "dist/launch.h"

int mt_cli_launch(int n, const char *prefix, int argc, char **argv) {
    /* the command line again: "megatrain" [prefix] argv... */
    char **full = calloc((size_t)argc + 3, sizeof *full);
    if (!full) return 1;
    int k = 0;
    full[k++] = "megatrain";
    if (prefix) full[k++] = (char *)prefix;
    for (int i = 0; i < argc; i++) full[k++] = argv[i];
    full[k] = NULL;
    int code = 1;
    mt_error err;
    if (mt_launch_ranks(n, full, stderr, &code, &err)) {
        fprintf(stderr, "megatrain: %s\n", err.msg);
        code = 1;
    }
    free(full);
    return code;
}
