/* megatrain: command-line entry point. Dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const mt_cli_command *const commands[] = {
    &mt_cli_train, &mt_cli_init, &mt_cli_plan, &mt_cli_calibrate, &mt_cli_bench,
    &mt_cli_tokenize, &mt_cli_generate, &mt_cli_eval, &mt_cli_plot,
};

static void usage(FILE *f) {
    fprintf(f, "usage: megatrain <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        fprintf(f, "  %-9s %s\n", commands[i]->name, commands[i]->help);
        if (commands[i] != &mt_cli_bench) continue;
        for (size_t k = 0; k < mt_bench_n_commands; k++)
            fprintf(f, "    %-15s %s\n", mt_bench_commands[k]->name, mt_bench_commands[k]->help);
    }
    fprintf(f, "\nrun 'megatrain <command> --help' (or 'megatrain bench <benchmark> --help') for\n"
               "its options; 'megatrain --version' for the version and the GPUs this build runs "
               "on\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("megatrain %s\nCUDA architectures: %s\n", mt_version(), mt_cuda_archs());
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i]->name)) return mt_cli_run(commands[i], argc - 1, argv + 1);
    fprintf(stderr, "megatrain: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
