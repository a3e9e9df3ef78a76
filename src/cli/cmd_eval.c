/* megatrain eval: mean loss and perplexity of a model on a data file. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "util/args.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain eval --model DIR --data FILE [options]\n"
            "  --model DIR         a Hugging Face model directory\n"
            "  --data FILE         .jsonl (text, prompt/completion, chat) or .mtok\n"
            "  --tokenizer PATH    tokenizer.json (default: DIR/tokenizer.json)\n"
            "  --format F          auto | text | completion | chat | tokens (default auto)\n"
            "  --chat-template C   auto (the model's own) | llama3 | qwen | llama2 | mistral | chatml\n"
            "  --packing P         auto | documents | rows, as in train (default auto)\n"
            "  --seq-len T         (default 1024)\n"
            "  --batch-size B      rows per micro-batch (default 4)\n"
            "  --micro-batches M   micro-batches per forward pass (default 1); with a run's\n"
            "                      seq_len, batch_size and micro_batches, the loss equals the\n"
            "                      run's eval_loss at the checkpoint's step\n"
            "  --max-batches N     stop after N batches, 0 = the whole file (default 0)\n"
            "  --device D          auto | cpu | cuda (default auto)\n"
            "  --precision P       bf16 | fp32, on the GPU (default bf16)\n"
            "  --dump-logits FILE  write the first row's input ids and logits as safetensors\n"
            "                      (to compare with another implementation)\n");
}

int mt_cmd_eval(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *tokpath = NULL, *format = "auto",
               *chat = "auto", *device = "auto", *precision = "bf16", *dump = NULL,
               *packing = "auto";
    long T = 1024, B = 4, M = 1, max_batches = 0;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"data", required_argument, 0, 'D'},
        {"tokenizer", required_argument, 0, 't'},  {"format", required_argument, 0, 'f'},
        {"chat-template", required_argument, 0, 'c'}, {"seq-len", required_argument, 0, 'T'},
        {"batch-size", required_argument, 0, 'b'}, {"max-batches", required_argument, 0, 'n'},
        {"device", required_argument, 0, 'd'},     {"precision", required_argument, 0, 'p'},
        {"dump-logits", required_argument, 0, 'L'}, {"packing", required_argument, 0, 'P'},
        {"micro-batches", required_argument, 0, 'M'},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': model = optarg; break;
        case 'D': data = optarg; break;
        case 't': tokpath = optarg; break;
        case 'f': format = optarg; break;
        case 'c': chat = optarg; break;
        case 'd': device = optarg; break;
        case 'p': precision = optarg; break;
        case 'L': dump = optarg; break;
        case 'P': packing = optarg; break;
        case 'T': T = mt_arg_ll(optarg, &bad); break;
        case 'b': B = mt_arg_ll(optarg, &bad); break;
        case 'M': M = mt_arg_ll(optarg, &bad); break;
        case 'n': max_batches = mt_arg_ll(optarg, &bad); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain eval: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    if (!model || !data) {
        fprintf(stderr, "megatrain eval: --model DIR and --data FILE are required\n");
        usage(stderr);
        return 2;
    }
    int dev_ok = !strcmp(device, "auto") || !strcmp(device, "cpu") || !strcmp(device, "cuda");
    if (!dev_ok || T < 1 || B < 1 || M < 1 || M > 4096 || max_batches < 0 ||
        (strcmp(precision, "bf16") && strcmp(precision, "fp32"))) {
        fprintf(stderr, "megatrain eval: check --device (auto|cpu|cuda), --precision "
                "(bf16|fp32), --seq-len >= 1, --batch-size >= 1, 1 <= --micro-batches <= 4096\n");
        return 2;
    }
    mt_eval_opts eo;
    mt_eval_opts_defaults(&eo);
    eo.data = data;
    eo.format = format;
    eo.chat_template = chat;
    eo.packing = packing;
    eo.seq_len = T;
    eo.batch_size = B;
    eo.micro_batches = M;
    eo.max_batches = max_batches;
    eo.device = device;
    eo.precision = precision;
    eo.dump_logits = dump;
    mt_eval_result res;
    mt_model *m = mt_model_open(model, tokpath);
    int rc = !m || mt_model_eval(m, &eo, &res) ? 1 : 0;
    if (rc) fprintf(stderr, "megatrain eval: %s\n", mt_last_error());
    else
        printf("eval: %s on %s: %lld tokens in %lld batches, loss %.6f, perplexity %.4f\n",
               model, data, (long long)res.tokens, (long long)res.batches, res.loss,
               res.perplexity);
    mt_model_close(m);
    return rc;
}
