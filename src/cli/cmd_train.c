/* megatrain train: the training loop around the step schedule.
 *
 * Today it trains the built-in tiny model on built-in English text with a
 * byte-level vocabulary, on the CPU; the options that select models, data
 * and devices grow here. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "cli/commands.h"
#include "data/builtin_text.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"

typedef struct train_opts {
    int64_t steps, warmup, B, T;
    int M;
    double lr, weight_decay;
    float max_grad_norm;
    uint64_t seed;
    const char *schedule;
    int log_every;
    int sample_tokens;
} train_opts;

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: megatrain train [options]\n"
            "Trains the built-in tiny Llama-architecture model on built-in English text\n"
            "(byte-level vocabulary) on the CPU, then prints a generated sample.\n\n"
            "  --steps N           optimizer steps (default 300)\n"
            "  --lr X              peak learning rate (default 1e-2)\n"
            "  --warmup N          warmup steps (default 30)\n"
            "  --schedule S        cosine | linear | constant (default cosine)\n"
            "  --weight-decay X    AdamW decoupled decay on matrices (default 0.1)\n"
            "  --max-grad-norm X   global gradient-norm clipping, 0 = off (default 1.0)\n"
            "  --batch-size B      rows per micro-batch (default 8)\n"
            "  --seq-len T         tokens per row (default 64)\n"
            "  --micro-batches M   micro-batches per optimizer step (default 2)\n"
            "  --seed N            seed for initialisation and data order (default 1)\n"
            "  --log-every N       progress line every N steps (default 10)\n"
            "  --sample-tokens N   length of the generated sample (default 120)\n");
}

static int parse_i64(const char *flag, const char *s, int64_t min, int64_t *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || end == s || v < min) {
        fprintf(stderr, "megatrain train: %s expects an integer >= %lld, got '%s'\n", flag,
                (long long)min, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_f64(const char *flag, const char *s, double min, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (*end || end == s || !(v >= min)) {
        fprintf(stderr, "megatrain train: %s expects a number >= %g, got '%s'\n", flag, min, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_opts(int argc, char **argv, train_opts *o) {
    *o = (train_opts){.steps = 300, .warmup = 30, .B = 8, .T = 64, .M = 2, .lr = 1e-2,
                      .weight_decay = 0.1, .max_grad_norm = 1.0f, .seed = 1,
                      .schedule = "cosine", .log_every = 10, .sample_tokens = 120};
    static const struct option opts[] = {
        {"steps", required_argument, 0, 's'},       {"lr", required_argument, 0, 'l'},
        {"warmup", required_argument, 0, 'w'},      {"schedule", required_argument, 0, 'S'},
        {"weight-decay", required_argument, 0, 'd'}, {"max-grad-norm", required_argument, 0, 'g'},
        {"batch-size", required_argument, 0, 'b'},  {"seq-len", required_argument, 0, 't'},
        {"micro-batches", required_argument, 0, 'm'}, {"seed", required_argument, 0, 'r'},
        {"log-every", required_argument, 0, 'L'},   {"sample-tokens", required_argument, 0, 'n'},
        {"help", no_argument, 0, 'h'},              {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    int64_t i64;
    double f;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 's': bad = parse_i64("--steps", optarg, 1, &o->steps); break;
        case 'w': bad = parse_i64("--warmup", optarg, 0, &o->warmup); break;
        case 'b': bad = parse_i64("--batch-size", optarg, 1, &o->B); break;
        case 't': bad = parse_i64("--seq-len", optarg, 2, &o->T); break;
        case 'm': bad = parse_i64("--micro-batches", optarg, 1, &i64); o->M = (int)i64; break;
        case 'r': bad = parse_i64("--seed", optarg, 0, &i64); o->seed = (uint64_t)i64; break;
        case 'L': bad = parse_i64("--log-every", optarg, 1, &i64); o->log_every = (int)i64; break;
        case 'n': bad = parse_i64("--sample-tokens", optarg, 0, &i64); o->sample_tokens = (int)i64; break;
        case 'l': bad = parse_f64("--lr", optarg, 0, &o->lr); break;
        case 'd': bad = parse_f64("--weight-decay", optarg, 0, &o->weight_decay); break;
        case 'g': bad = parse_f64("--max-grad-norm", optarg, 0, &f); o->max_grad_norm = (float)f; break;
        case 'S': o->schedule = optarg; break;
        case 'h': train_usage(stdout); exit(0);
        default: train_usage(stderr); return -1;
        }
        if (bad) return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "megatrain train: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Windows of T+1 bytes at random offsets: inputs and next-byte targets. */
static void fill_batch(const char *text, size_t len, int64_t rows, int64_t T, uint64_t *rng,
                       int32_t *tokens, int32_t *targets) {
    for (int64_t r = 0; r < rows; r++) {
        size_t off = rng_next(rng) % (len - (size_t)T - 1);
        for (int64_t t = 0; t < T; t++) {
            tokens[r * T + t] = (unsigned char)text[off + t];
            targets[r * T + t] = (unsigned char)text[off + t + 1];
        }
    }
}

/* Greedy continuation of `prompt` with a backend of one row. */
static void sample(const mt_config *cfg, const mt_param_table *t, mt_host_store *store,
                   int64_t T, const char *prompt, int n_new) {
    mt_error err;
    mt_backend *be = mt_cpu_backend_create(cfg, t, store, 1, 1, T, &err);
    if (!be) {
        fprintf(stderr, "megatrain train: sampling: %s\n", err.msg);
        return;
    }
    int32_t *tok = calloc((size_t)T, sizeof *tok), *tgt = malloc((size_t)T * sizeof *tgt);
    float *logits = malloc((size_t)cfg->V * sizeof *logits);
    size_t plen = strlen(prompt);
    char *out = malloc(plen + (size_t)n_new + 1);
    memcpy(out, prompt, plen);
    size_t n = plen;
    for (int64_t i = 0; i < T; i++) tgt[i] = MT_IGNORE_INDEX;
    for (int k = 0; k < n_new; k++) {
        size_t start = n > (size_t)T ? n - (size_t)T : 0, ctx = n - start;
        for (size_t i = 0; i < (size_t)T; i++)
            tok[i] = i < ctx ? (unsigned char)out[start + i] : 0;
        mt_batch b = {.M = 1, .B = 1, .T = T, .tokens = tok, .targets = tgt};
        double ls;
        int64_t nv;
        if (mt_step_eval(be, t->n_layers, &b, &ls, &nv, &err)) break;
        mt_cpu_backend_logits(be, 0, (int64_t)ctx - 1, logits);
        int best = 0;
        for (int v = 1; v < 256; v++)
            if (logits[v] > logits[best]) best = v;
        out[n++] = (char)best;
    }
    out[n] = 0;
    printf("sample: %s\n", out);
    free(out);
    free(logits);
    free(tok);
    free(tgt);
    mt_cpu_backend_free(be);
}

int mt_cmd_train(int argc, char **argv) {
    train_opts o;
    if (parse_opts(argc, argv, &o)) return 2;
    mt_error err;
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    if (o.T > cfg.max_pos) cfg.max_pos = o.T;
    mt_param_table table;
    if (mt_params_init(&table, &cfg, &err)) goto fail;
    mt_host_store store;
    if (mt_host_store_init(&store, &table, &err)) goto fail;
    mt_host_store_init_random(&store, o.seed, 0.02f);

    mt_optimizer opt = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                        .weight_decay = o.weight_decay, .max_grad_norm = o.max_grad_norm};
    mt_lr_kind kind;
    if (mt_lr_kind_parse(o.schedule, &kind, &err) || mt_optim_cpu_init(&opt.cpu, 0, &err))
        goto fail;
    opt.sched = mt_lr_schedule_make(kind, o.lr, o.warmup, o.steps);

    mt_backend *be = mt_cpu_backend_create(&cfg, &table, &store, o.M, o.B, o.T, &err);
    if (!be) goto fail;

    size_t text_len;
    char *text = mt_builtin_text(1 << 20, 7, &text_len);
    int64_t rows = (int64_t)o.M * o.B, ntok = rows * o.T;
    int32_t *tokens = malloc((size_t)ntok * sizeof *tokens);
    int32_t *targets = malloc((size_t)ntok * sizeof *targets);
    uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull + 1;

    printf("megatrain: built-in %s model, %.2fM parameters, %d layers, hidden %lld, vocab %lld\n",
           cfg.model_type, table.n_params / 1e6, (int)cfg.L, (long long)cfg.C, (long long)cfg.V);
    printf("megatrain: device cpu, %lld steps of %d x %lld x %lld tokens, host store %.1f MB\n",
           (long long)o.steps, o.M, (long long)o.B, (long long)o.T, store.bytes / 1e6);
    double t0 = now_s(), first_loss = NAN, loss = NAN, window = 0;
    int window_n = 0;
    for (int64_t step = 0; step < o.steps; step++) {
        fill_batch(text, text_len, rows, o.T, &rng, tokens, targets);
        mt_batch b = {.M = o.M, .B = o.B, .T = o.T, .tokens = tokens, .targets = targets};
        if (mt_step_forward_backward(be, table.n_layers, &b, &loss, &err)) goto fail;
        mt_optim_report rep;
        mt_optimizer_step(&opt, &store, &rep);
        if (step == 0) first_loss = loss;
        window += loss;
        window_n++;
        if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) {
            double el = now_s() - t0, tps = (double)(step + 1) * ntok / el;
            double eta = el / (double)(step + 1) * (double)(o.steps - step - 1);
            printf("step %5lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.1fk tok/s | "
                   "ETA %.0fs\n",
                   (long long)step + 1, (long long)o.steps, window / window_n, rep.lr,
                   rep.grad_norm, tps / 1e3, eta);
            fflush(stdout);
            window = 0;
            window_n = 0;
        }
    }
    printf("megatrain: loss %.4f -> %.4f in %.1fs\n", first_loss, loss, now_s() - t0);
    if (o.sample_tokens > 0) sample(&cfg, &table, &store, o.T, "The old man", o.sample_tokens);
    free(tokens);
    free(targets);
    free(text);
    mt_cpu_backend_free(be);
    mt_host_store_free(&store);
    mt_params_free(&table);
    return 0;
fail:
    fprintf(stderr, "megatrain train: %s\n", err.msg);
    return 1;
}
