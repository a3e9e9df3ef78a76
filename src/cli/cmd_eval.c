/* megatrain eval: mean loss and perplexity of a model on a data file. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/runner.h"
#include "data/dataset.h"
#include "engine/eval.h"
#include "engine/step.h"
#include "io/safetensors.h"
#include "util/mem.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain eval --model DIR --data FILE [options]\n"
            "  --model DIR         a Hugging Face model directory\n"
            "  --data FILE         .jsonl (text, prompt/completion, chat) or .mtok\n"
            "  --tokenizer PATH    tokenizer.json (default: DIR/tokenizer.json)\n"
            "  --format F          auto | text | completion | chat | tokens (default auto)\n"
            "  --chat-template C   auto | llama3 | qwen | llama2 | mistral (default auto)\n"
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

/* Row 0's input ids (T) and logits (T, V) of the batch just evaluated. */
static int dump_logits(const mt_runner *r, const mt_config *cfg, const int32_t *tokens, long T,
                       const char *path, mt_error *err) {
    float *logits = mt_malloc_or_die((size_t)T * cfg->V * sizeof(float));
    for (long t = 0; t < T; t++) mt_runner_logits(r, t, logits + (size_t)t * cfg->V);
    mt_st_write_tensor w[2] = {
        {.name = "input_ids", .dtype = MT_DTYPE_I32, .ndim = 1, .shape = {T}, .raw = tokens},
        {.name = "logits", .dtype = MT_DTYPE_F32, .ndim = 2, .shape = {T, cfg->V}, .f32 = logits},
    };
    int rc = mt_st_write(path, w, 2, NULL, 0, err);
    free(logits);
    return rc;
}

int mt_cmd_eval(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *tokpath = NULL, *format = "auto",
               *chat = "auto", *device = "auto", *precision = "bf16", *dump = NULL;
    long T = 1024, B = 4, M = 1, max_batches = 0;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"data", required_argument, 0, 'D'},
        {"tokenizer", required_argument, 0, 't'},  {"format", required_argument, 0, 'f'},
        {"chat-template", required_argument, 0, 'c'}, {"seq-len", required_argument, 0, 'T'},
        {"batch-size", required_argument, 0, 'b'}, {"max-batches", required_argument, 0, 'n'},
        {"device", required_argument, 0, 'd'},     {"precision", required_argument, 0, 'p'},
        {"dump-logits", required_argument, 0, 'L'}, {"micro-batches", required_argument, 0, 'M'},
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
    int dev = mt_runner_parse_device(device);
    if (dev < 0 || T < 1 || B < 1 || M < 1 || M > 4096 || max_batches < 0 ||
        (strcmp(precision, "bf16") && strcmp(precision, "fp32"))) {
        fprintf(stderr, "megatrain eval: check --device (auto|cpu|cuda), --precision "
                "(bf16|fp32), --seq-len >= 1, --batch-size >= 1, 1 <= --micro-batches <= 4096\n");
        return 2;
    }
    mt_error err;
    mt_loaded_model m = {0};
    mt_dataset *ds = NULL;
    mt_runner r = {0};
    int32_t *tokens = NULL, *targets = NULL;
    int rc = 1;
    if (mt_loaded_model_open(&m, model, tokpath, &err)) goto out;
    const mt_config cfg = m.cfg;
    if (T > cfg.max_pos) {
        mt_errorf(&err, "--seq-len %ld exceeds the model's max_position_embeddings %lld", T,
                  (long long)cfg.max_pos);
        goto out;
    }
    mt_data_opts o = {.path = data, .format = format, .chat_template = chat, .seed = MT_EVAL_SEED,
                      .epochs = 1};
    if (!(ds = mt_dataset_open(&o, m.tok, cfg.V, &err))) goto out;
    mt_runner_opts ro = {.device = dev, .fp32 = !strcmp(precision, "fp32")};
    if (mt_runner_init(&r, &m.cfg, &m.table, &m.store, (int)M, B, T, &ro, &err)) goto out;
    tokens = mt_malloc_or_die((size_t)(M * B * T) * sizeof *tokens);
    targets = mt_malloc_or_die((size_t)(M * B * T) * sizeof *targets);
    double sum = 0;
    int64_t count = 0, batches = 0;
    while ((!max_batches || batches < max_batches) &&
           mt_dataset_next_batch(ds, M * B, T, tokens, targets) == 0) {
        /* the loop of mt_eval_dataset, which a run's evaluation uses */
        mt_batch b = {.M = (int)M, .B = B, .T = T, .tokens = tokens, .targets = targets};
        double ls;
        int64_t nv;
        if (mt_step_eval(r.be, m.table.n_layers, &b, &ls, &nv, &err)) goto out;
        sum += ls;
        count += nv;
        if (dump && batches == 0 && dump_logits(&r, &cfg, tokens, T, dump, &err)) goto out;
        batches++;
    }
    if (!count) {
        mt_errorf(&err, "%s: no full batch of %ld x %ld tokens with a loss; lower --seq-len or "
                  "--batch-size", data, M * B, T);
        goto out;
    }
    printf("eval: %s on %s: %lld tokens in %lld batches, loss %.6f, perplexity %.4f\n", model,
           data, (long long)count, (long long)batches, sum / count, exp(sum / count));
    rc = 0;
out:
    if (rc) fprintf(stderr, "megatrain eval: %s\n", err.msg);
    mt_runner_free(&r);
    if (ds) mt_dataset_free(ds);
    free(tokens);
    free(targets);
    mt_loaded_model_close(&m);
    return rc;
}
