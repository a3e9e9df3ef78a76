/* megatrain bench: speed measurements as programs, never as tests. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "optim/adamw.h"

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: megatrain bench adamw [--params N] [--threads T]\n"
            "       megatrain bench train [--help]\n"
            "  train     training steps of a synthetic model on the GPU\n"
            "  adamw     fused CPU AdamW update: Gparam/s and GB/s\n"
            "  --params  parameters to update (default 268435456)\n"
            "  --threads threads (default: all cores)\n");
}

int mt_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *what = argv[1];
    if (!strcmp(what, "train")) return mt_bench_train(argc - 1, argv + 1);
    long long params = 1ll << 28;
    int threads = 0;
    static const struct option opts[] = {
        {"params", required_argument, 0, 'p'},
        {"threads", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'p': params = strtoll(optarg, &end, 10); break;
        case 't': threads = (int)strtol(optarg, &end, 10); break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
        if (end && *end) {
            fprintf(stderr, "megatrain bench: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    if (!strcmp(what, "adamw")) {
        if (params <= 0) {
            fprintf(stderr, "megatrain bench adamw: --params must be positive\n");
            return 2;
        }
        return mt_adamw_bench((size_t)params, threads, stdout) ? 1 : 0;
    }
    fprintf(stderr, "megatrain bench: unknown benchmark '%s'\n", what);
    bench_usage(stderr);
    return 2;
}
