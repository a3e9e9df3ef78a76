/* megatrain init: a new Llama-architecture model with random weights, as a
 * Hugging Face directory (config.json, model.safetensors, tokenizer files),
 * to pre-train from scratch with `megatrain train --model DIR`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/args.h"
#include "cli/commands.h"
#include "data/tokenizer.h"
#include "host/store.h"
#include "io/model_io.h"
#include "model/config.h"
#include "model/params.h"

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
    mt_error err;
    mt_tokenizer *tok = mt_tokenizer_load(tokpath, &err);
    if (!tok) {
        fprintf(stderr, "megatrain init: %s\n", err.msg);
        return 1;
    }
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    cfg.C = hidden;
    cfg.L = layers;
    cfg.NH = heads;
    cfg.NKV = kv;
    cfg.HD = heads > 0 ? hidden / heads : 0;
    cfg.F = ffn;
    cfg.V = (int64_t)mt_tokenizer_vocab_size(tok);
    cfg.max_pos = max_pos;
    cfg.rope_theta = theta;
    cfg.rms_eps = 1e-5f;
    cfg.tie_embeddings = !untied;
    cfg.bos_id = mt_tokenizer_bos_id(tok);
    cfg.eos_id = mt_tokenizer_eos_id(tok);
    mt_tokenizer_free(tok);
    mt_param_table t = {0};
    mt_host_store s = {0};
    int rc = 1;
    if (hidden % (heads > 0 ? heads : 1)) {
        mt_errorf(&err, "--hidden %lld is not a multiple of --heads %lld", hidden, heads);
        goto out;
    }
    if (mt_config_validate(&cfg, "the model shape", &err) || mt_params_init(&t, &cfg, &err) ||
        mt_host_store_create(&s, &t, 0, &err))
        goto out;
    mt_host_store_init_random(&s, (uint64_t)seed, (float)std);
    if (mt_model_save(&s, &cfg, out, MT_DTYPE_F32, (size_t)5 << 30, &err)) goto out;
    if (mt_model_copy_tokenizer(tokpath, out, &err)) goto out;
    printf("init: %s: llama, %.1fM parameters (hidden %lld, %lld layers, %lld/%lld heads, ffn "
           "%lld, vocab %lld%s)\n", out, t.n_params / 1e6, hidden, layers, heads, kv, ffn,
           (long long)cfg.V, cfg.tie_embeddings ? ", tied" : "");
    rc = 0;
out:
    if (rc) fprintf(stderr, "megatrain init: %s\n", err.msg);
    mt_host_store_free(&s);
    mt_params_free(&t);
    return rc;
}
