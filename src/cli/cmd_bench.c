/* megatrain bench: speed measurements as programs, never as tests; each
 * benchmark a subcommand with its own options (bench train: bench_train.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/commands.h"
#include "util/sys.h"
#include "data/tokenizer.h"
#include "io/file.h"
#include "optim/adamw.h"

#include "backend/device.h"

typedef struct tokenizer_args {
    const char *tokenizer, *data;
    bool given[2];
} tokenizer_args;

static const mt_opt tokenizer_options[] = {
    {"tokenizer", MT_OPT_TEXT, offsetof(tokenizer_args, tokenizer), NULL, NULL, MT_OPT_ANY, NULL,
     "PATH", NULL, "tokenizer.json"},
    {"data", MT_OPT_TEXT, offsetof(tokenizer_args, data), NULL, NULL, MT_OPT_ANY, NULL,
     "FILE.jsonl", NULL, "the texts: each line's \"text\", or the whole line"},
};
static const mt_opt_table tokenizer_table = {
    .command = "bench tokenizer", MT_OPT_ROWS(tokenizer_options), MT_OPT_STRUCT(tokenizer_args),
    .about = "Encoding speed on one core over the \"text\" of each line."};

/* Encoding speed on one core: every line's "text" (or the whole line when
 * it has none), encoded with one encoder, timed after loading. */
static int bench_tokenizer(void *args, int argc, char **argv) {
    const tokenizer_args *a = args;
    const char *tokpath = a->tokenizer, *data = a->data;
    mt_error err;
    char *buf = NULL;
    size_t len = 0;
    if (mt_read_file(data, &buf, &len, &err)) {
        fprintf(stderr, "megatrain bench tokenizer: %s\n", err.msg);
        return 1;
    }
    mt_tokenizer *tok = mt_tokenizer_load(tokpath, &err);
    if (!tok) {
        fprintf(stderr, "megatrain bench tokenizer: %s\n", err.msg);
        free(buf);
        return 1;
    }
    /* texts first, so that JSON parsing stays out of the timing */
    size_t n = 0, cap = 1024, bytes = 0;
    char **texts = malloc(cap * sizeof *texts);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *t = o ? cJSON_GetObjectItemCaseSensitive(o, "text") : NULL;
        if (n == cap) texts = realloc(texts, (cap *= 2) * sizeof *texts);
        texts[n] = strdup(cJSON_IsString(t) ? t->valuestring : line);
        bytes += strlen(texts[n++]);
        cJSON_Delete(o);
    }
    mt_tok_encoder *enc = mt_tok_encoder_new(tok);
    mt_tok_ids ids = {0};
    size_t tokens = 0;
    double t0 = mt_now_s();
    for (size_t i = 0; i < n; i++) {
        ids.n = 0;
        if (mt_tok_encode(enc, texts[i], strlen(texts[i]), false, &ids, &err)) {
            fprintf(stderr, "megatrain bench tokenizer: %s line %zu: %s\n", data, i + 1, err.msg);
            break;
        }
        tokens += ids.n;
    }
    double dt = mt_now_s() - t0;
    printf("tokenizer %s on %s: %zu documents, %.1f MB, %zu tokens in %.3fs: %.1f MB/s, %.2f M "
           "tokens/s (one core)\n", tokpath, data, n, bytes / 1e6, tokens, dt, bytes / dt / 1e6,
           tokens / dt / 1e6);
    mt_tok_ids_free(&ids);
    mt_tok_encoder_free(enc);
    for (size_t i = 0; i < n; i++) free(texts[i]);
    free(texts);
    mt_tokenizer_free(tok);
    free(buf);
    return 0;
}

/* The grouped expert products against cuBLAS (kernels/moe/moe_gemm.h). */
typedef struct moe_gemm_args {
    int bk, stages; // indexes into the choices
    bool given[2];
} moe_gemm_args;

static const char *const bk_choices[] = {"0", "32", "64", NULL};
static const char *const stage_choices[] = {"0", "2", "3", "4", "5", NULL};
static const mt_opt moe_gemm_options[] = {
    {"bk", MT_OPT_ENUM, offsetof(moe_gemm_args, bk), "0", NULL, MT_OPT_ANY, bk_choices, "32|64",
     NULL, "k step of the tensor-core kernel; 0: its own choice"},
    {"stages", MT_OPT_ENUM, offsetof(moe_gemm_args, stages), "0", NULL, MT_OPT_ANY,
     stage_choices, "2..5", NULL, "pipeline depth of the tensor-core kernel; 0: its own choice"},
};
static const mt_opt_table moe_gemm_table = {
    .command = "bench moe-gemm", MT_OPT_ROWS(moe_gemm_options), MT_OPT_STRUCT(moe_gemm_args),
    .about = "Grouped expert products on the GPU (Qwen3-30B-A3B, Mixtral-8x7B expert shapes)\n"
             "against cuBLAS per expert: TFLOP/s."};

static int bench_moe_gemm(void *args, int argc, char **argv) {
    const moe_gemm_args *a = args;
    mt_error err;
    if (mt_device_bench_moe_gemm(stdout, atoi(bk_choices[a->bk]), atoi(stage_choices[a->stages]),
                                 &err))
        return mt_cli_fail("bench moe-gemm", 1, "%s", err.msg);
    return 0;
}

/* The fused CPU AdamW (optim/adamw.h). */
typedef struct adamw_args {
    int64_t params, threads;
    bool given[2];
} adamw_args;

static const mt_opt adamw_options[] = {
    {"params", MT_OPT_INT, offsetof(adamw_args, params), "268435456", NULL, MT_OPT_AT_LEAST(1),
     NULL, "N", NULL, "parameters to update"},
    {"threads", MT_OPT_INT, offsetof(adamw_args, threads), "0", NULL, MT_OPT_BETWEEN(0, 65536),
     NULL, "N", NULL, "threads; 0: all cores"},
};
static const mt_opt_table adamw_table = {
    .command = "bench adamw", MT_OPT_ROWS(adamw_options), MT_OPT_STRUCT(adamw_args),
    .about = "The fused CPU AdamW update: Gparam/s and GB/s."};

static int bench_adamw(void *args, int argc, char **argv) {
    const adamw_args *a = args;
    return mt_adamw_bench((size_t)a->params, (int)a->threads, stdout) ? 1 : 0;
}

static const mt_cli_command adamw = {"adamw", "the fused CPU AdamW update: Gparam/s and GB/s",
                                     &adamw_table, bench_adamw};
static const mt_cli_command tokenizer = {"tokenizer", "tokenizer encoding speed on one core",
                                         &tokenizer_table, bench_tokenizer};
static const mt_cli_command moe_gemm = {
    "moe-gemm", "grouped expert products on the GPU against cuBLAS", &moe_gemm_table,
    bench_moe_gemm};
const mt_cli_command *const mt_bench_commands[] = {&mt_cli_bench_train, &adamw, &tokenizer,
                                                   &moe_gemm};
const size_t mt_bench_n_commands = MT_OPT_COUNT(mt_bench_commands);

static void bench_usage(FILE *f) {
    fprintf(f, "usage: megatrain bench <benchmark> [options]\n\nbenchmarks:\n");
    for (size_t i = 0; i < mt_bench_n_commands; i++)
        fprintf(f, "  %-10s %s\n", mt_bench_commands[i]->name, mt_bench_commands[i]->help);
    fprintf(f, "\nrun 'megatrain bench <benchmark> --help' for its options\n");
}

static int bench(void *args, int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < mt_bench_n_commands; i++)
        if (!strcmp(argv[1], mt_bench_commands[i]->name))
            return mt_cli_run(mt_bench_commands[i], argc - 1, argv + 1);
    fprintf(stderr, "megatrain bench: unknown benchmark '%s'\n\n", argv[1]);
    bench_usage(stderr);
    return 2;
}

const mt_cli_command mt_cli_bench = {"bench", "measure speed, one benchmark at a time:", NULL,
                                      bench};
