/* megatrain init: a new Llama-architecture model with random weights, as a
 * Hugging Face directory (config.json, model.safetensors, tokenizer files),
 * to pre-train from scratch with `megatrain train --model DIR`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "util/args.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain init --tokenizer PATH --out DIR [shape options]\n"
            "  --tokenizer PATH    tokenizer.json; sets the vocabulary and BOS/EOS ids, and is\n"
            "                      copied into DIR with the tokenizer_config.json beside it\n"
            "  --out DIR           the new model directory (must not exist yet)\n"
            "  --hidden N          (default 1024)\n"
            "  --layers N          (default 12)\n"
            "  --heads N           (default 16)\n"
            "  --kv-heads N        (default 4)\n"
            "  --ffn N             (default 2816)\n"
            "  --max-pos N         max_position_embeddings (default 2048)\n"
            "  --rope-theta X      (default 500000)\n"
            "  --untied            separate lm_head (default: tied to the embedding)\n"
            "  --std X             init standard deviation of matrices (default 0.02)\n"
            "  --seed N            (default 1)\n");
}

int mt_cmd_init(int argc, char **argv) {
    const char *tokpath = NULL, *out = NULL;
    long long hidden = 1024, layers = 12, heads = 16, kv = 4, ffn = 2816, max_pos = 2048,
              seed = 1;
    double theta = 500000.0, std = 0.02;
    int untied = 0;
    static const struct option opts[] = {
        {"tokenizer", required_argument, 0, 't'}, {"out", required_argument, 0, 'o'},
        {"hidden", required_argument, 0, 'C'},    {"layers", required_argument, 0, 'L'},
        {"heads", required_argument, 0, 'H'},     {"kv-heads", required_argument, 0, 'K'},
        {"ffn", required_argument, 0, 'F'},       {"max-pos", required_argument, 0, 'P'},
        {"rope-theta", required_argument, 0, 'r'}, {"untied", no_argument, 0, 'u'},
        {"std", required_argument, 0, 's'},       {"seed", required_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 't': tokpath = optarg; break;
        case 'o': out = optarg; break;
        case 'C': hidden = mt_arg_ll(optarg, &bad); break;
        case 'L': layers = mt_arg_ll(optarg, &bad); break;
        case 'H': heads = mt_arg_ll(optarg, &bad); break;
        case 'K': kv = mt_arg_ll(optarg, &bad); break;
        case 'F': ffn = mt_arg_ll(optarg, &bad); break;
        case 'P': max_pos = mt_arg_ll(optarg, &bad); break;
        case 'S': seed = mt_arg_ll(optarg, &bad); break;
        case 'r': theta = mt_arg_d(optarg, &bad); break;
        case 's': std = mt_arg_d(optarg, &bad); break;
        case 'u': untied = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain init: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    if (!tokpath || !out) {
        fprintf(stderr, "megatrain init: --tokenizer PATH and --out DIR are required\n");
        usage(stderr);
        return 2;
    }
    struct stat st;
    if (stat(out, &st) == 0) {
        fprintf(stderr, "megatrain init: %s already exists; choose a new --out directory "
                "(nothing was written)\n", out);
        return 2;
    }
    mt_model_shape sh = {.hidden = hidden, .layers = layers, .heads = heads, .kv_heads = kv,
                         .ffn = ffn, .max_positions = max_pos, .rope_theta = theta,
                         .init_std = std, .untied = untied, .seed = (uint64_t)seed};
    mt_model_info info;
    if (mt_model_init(out, tokpath, &sh, &info)) {
        fprintf(stderr, "megatrain init: %s\n", mt_last_error());
        return 1;
    }
    printf("init: %s: llama, %.1fM parameters (hidden %lld, %lld layers, %lld/%lld heads, ffn "
           "%lld, vocab %lld%s)\n", out, info.n_params / 1e6, hidden, layers, heads, kv, ffn,
           (long long)info.vocab_size, info.tied_embeddings ? ", tied" : "");
    return 0;
}
