/* megatrain generate: text from a model, to eyeball what it learned. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "util/args.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain generate --model DIR [options] [PROMPT]\n"
            "  --model DIR         a Hugging Face model directory (ours or any other)\n"
            "  --tokenizer PATH    tokenizer.json (default: DIR/tokenizer.json)\n"
            "  --prompt TEXT       the text to continue (or give it as the last argument)\n"
            "  --max-new-tokens N  (default 64; at most the model's max positions)\n"
            "  --temperature X     0 = greedy (default 0.8)\n"
            "  --top-p X           nucleus sampling (default 0.95)\n"
            "  --seed N            sampling seed (default 1)\n"
            "  --context N         tokens of context (default min(512, max positions))\n"
            "  --device D          auto | cpu | cuda (default auto)\n"
            "  --no-bos            do not add the tokenizer's special tokens (BOS) to the prompt\n"
            "                      (for models trained on raw text, like the built-in demo)\n");
}

int mt_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokpath = NULL, *prompt = NULL, *device = "auto";
    long n_new = 64, seed = 1, context = 0;
    double temperature = 0.8, top_p = 0.95;
    int add_special = 1;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},       {"tokenizer", required_argument, 0, 't'},
        {"prompt", required_argument, 0, 'p'},      {"max-new-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 'T'}, {"top-p", required_argument, 0, 'P'},
        {"seed", required_argument, 0, 's'},        {"context", required_argument, 0, 'c'},
        {"device", required_argument, 0, 'd'},      {"help", no_argument, 0, 'h'},
        {"no-bos", no_argument, 0, 'B'},
        {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': model = optarg; break;
        case 't': tokpath = optarg; break;
        case 'p': prompt = optarg; break;
        case 'd': device = optarg; break;
        case 'n': n_new = mt_arg_ll(optarg, &bad); break;
        case 's': seed = mt_arg_ll(optarg, &bad); break;
        case 'c': context = mt_arg_ll(optarg, &bad); break;
        case 'T': temperature = mt_arg_d(optarg, &bad); break;
        case 'P': top_p = mt_arg_d(optarg, &bad); break;
        case 'B': add_special = 0; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain generate: '%s' is not a finite decimal number\n", optarg);
            return 2;
        }
    }
    if (!prompt && optind < argc) prompt = argv[optind];
    if (!model) {
        fprintf(stderr, "megatrain generate: --model DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (n_new < 0 || !(temperature >= 0) || !(top_p > 0) || top_p > 1 || context < 0) {
        fprintf(stderr, "megatrain generate: need --max-new-tokens >= 0, --temperature >= 0, "
                "0 < --top-p <= 1, --context >= 0\n");
        return 2;
    }
    if (strcmp(device, "auto") && strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "megatrain generate: --device must be auto, cpu or cuda\n");
        return 2;
    }
    mt_generate_opts go;
    mt_generate_opts_defaults(&go);
    go.prompt = prompt ? prompt : "";
    go.max_new_tokens = n_new;
    go.temperature = temperature;
    go.top_p = top_p;
    go.seed = (uint64_t)seed;
    go.context = context;
    go.device = device;
    go.add_special = add_special;
    mt_model *m = mt_model_open(model, tokpath);
    char *text = m ? mt_model_generate(m, &go, mt_cli_print_event, NULL) : NULL;
    int rc = text ? 0 : 1;
    if (rc) fprintf(stderr, "megatrain generate: %s\n", mt_last_error());
    mt_free(text);
    mt_model_close(m);
    return rc;
}
