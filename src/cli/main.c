/* megatrain: command-line entry point. Dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain <command> [options]\n"
            "commands:\n"
            "  train     train or fine-tune a model\n"
            "  bench     measure speed\n"
            "run 'megatrain <command> --help' for the options of a command\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "megatrain: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
