/* megatrain init: a new model with random weights (Llama by default, or
 * another type, mixture-of-experts included), as a Hugging Face directory
 * (config.json, model.safetensors, tokenizer files), to pre-train from
 * scratch with `megatrain train --model DIR`. */
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
            "  --seed N            (default 1)\n"
            "  --model-type T      llama (default), mistral, qwen2, qwen3, or mixture-of-experts:\n"
            "                      mixtral, qwen2_moe, qwen3_moe\n"
            "  --experts N         MoE: routed experts per layer (default 8)\n"
            "  --experts-per-tok N MoE: experts each token is sent to (default 2)\n"
            "  --expert-ffn N      MoE: an expert's inner size (default: --ffn; mixtral: --ffn)\n"
            "  --shared-expert-ffn N  qwen2_moe: the shared expert's inner size (default --ffn)\n"
            "  --norm-topk, --no-norm-topk  qwen MoE: renormalise the top-k weights (default:\n"
            "                      qwen3_moe yes, qwen2_moe no; mixtral always)\n");
}

int mt_cmd_init(int argc, char **argv) {
    const char *tokpath = NULL, *out = NULL;
    long long hidden = 1024, layers = 12, heads = 16, kv = 4, ffn = 2816, max_pos = 2048,
              seed = 1;
    double theta = 500000.0, std = 0.02;
    int untied = 0, norm_topk = -1;
    const char *type = "llama";
    long long experts = 8, per_tok = 2, expert_ffn = 0, shared_ffn = 0;
    static const struct option opts[] = {
        {"tokenizer", required_argument, 0, 't'}, {"out", required_argument, 0, 'o'},
        {"hidden", required_argument, 0, 'C'},    {"layers", required_argument, 0, 'L'},
        {"heads", required_argument, 0, 'H'},     {"kv-heads", required_argument, 0, 'K'},
        {"ffn", required_argument, 0, 'F'},       {"max-pos", required_argument, 0, 'P'},
        {"rope-theta", required_argument, 0, 'r'}, {"untied", no_argument, 0, 'u'},
        {"std", required_argument, 0, 's'},       {"seed", required_argument, 0, 'S'},
        {"model-type", required_argument, 0, 'm'}, {"experts", required_argument, 0, 'E'},
        {"experts-per-tok", required_argument, 0, 'k'},
        {"expert-ffn", required_argument, 0, 'f'},
        {"shared-expert-ffn", required_argument, 0, 'x'},
        {"norm-topk", no_argument, 0, 'n'},       {"no-norm-topk", no_argument, 0, 'N'},
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
        case 'm': type = optarg; break;
        case 'E': experts = mt_arg_ll(optarg, &bad); break;
        case 'k': per_tok = mt_arg_ll(optarg, &bad); break;
        case 'f': expert_ffn = mt_arg_ll(optarg, &bad); break;
        case 'x': shared_ffn = mt_arg_ll(optarg, &bad); break;
        case 'n': norm_topk = 1; break;
        case 'N': norm_topk = 0; break;
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
                         .init_std = std, .untied = untied, .seed = (uint64_t)seed,
                         .model_type = type, .experts = experts, .experts_per_tok = per_tok,
                         .expert_ffn = expert_ffn, .shared_expert_ffn = shared_ffn,
                         .norm_topk = norm_topk};
    mt_model_info info;
    if (mt_model_init(out, tokpath, &sh, &info)) {
        fprintf(stderr, "megatrain init: %s\n", mt_last_error());
        return 1;
    }
    char moe[96] = "";
    if (info.experts)
        snprintf(moe, sizeof moe, ", %lld experts, %lld per token, %.2fM active",
                 (long long)info.experts, (long long)info.experts_per_tok,
                 info.active_params / 1e6);
    printf("init: %s: %s, %.1fM parameters (hidden %lld, %lld layers, %lld/%lld heads, ffn "
           "%lld, vocab %lld%s%s)\n", out, info.model_type, info.n_params / 1e6, hidden, layers,
           heads, kv, ffn, (long long)info.vocab_size, info.tied_embeddings ? ", tied" : "", moe);
    return 0;
}
