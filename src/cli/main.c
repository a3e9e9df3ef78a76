/* megatrain: command-line entry point. Dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const mt_cli_command commands[] = {
    {"train", mt_cmd_train, "train or fine-tune a model (default: the built-in tiny model)"},
    {"init", mt_cmd_init, "create a new model with random weights (HF directory)"},
    {"plan", mt_cmd_plan, "where each layer's buffers live, bytes per tier, predicted step"},
    {"calibrate", mt_cmd_calibrate, "measure this machine's rates for the planner"},
    {"bench", mt_cmd_bench, "measure speed, one benchmark at a time:"},
    {"tokenize", mt_cmd_tokenize, "pre-tokenize a JSONL corpus to .mtok"},
    {"generate", mt_cmd_generate, "continue a prompt with a model"},
    {"eval", mt_cmd_eval, "loss and perplexity of a model on a data file"},
    {"plot", mt_cmd_plot, "draw the loss curve of a metrics.jsonl to a PNG"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: megatrain <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
        if (commands[i].run != mt_cmd_bench) continue;
        for (size_t k = 0; k < mt_bench_n_commands; k++)
            fprintf(f, "    %-15s %s\n", mt_bench_commands[k].name, mt_bench_commands[k].help);
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
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "megatrain: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
