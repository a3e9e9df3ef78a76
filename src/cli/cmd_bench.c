/* megatrain bench: speed measurements as programs, never as tests. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "util/args.h"
#include "cli/commands.h"
#include "util/sys.h"
#include "data/tokenizer.h"
#include "io/file.h"
#include "optim/adamw.h"

#ifdef MT_HAVE_CUDA
#include "kernels/moe/moe_gemm.h"
#endif

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: megatrain bench adamw [--params N] [--threads T]\n"
            "       megatrain bench train [--help]\n"
            "       megatrain bench tokenizer --tokenizer PATH --data FILE.jsonl\n"
            "       megatrain bench moe-gemm [--bk 32|64] [--stages S]\n"
            "  tokenizer encoding speed on one core over the \"text\" of each line\n"
            "  train     training steps of a synthetic model on the GPU\n"
            "  adamw     fused CPU AdamW update: Gparam/s and GB/s\n"
            "  moe-gemm  grouped expert products on the GPU (Qwen3-30B-A3B, Mixtral-8x7B\n"
            "            expert shapes) against cuBLAS per expert: TFLOP/s\n"
            "  --params  parameters to update (default 268435456)\n"
            "  --threads threads (default: all cores)\n"
            "  --bk, --stages  moe-gemm: k step and pipeline depth (2..5) of the\n"
            "            tensor-core kernel (default: its own choice)\n");
}

/* Encoding speed on one core: every line's "text" (or the whole line when
 * it has none), encoded with one encoder, timed after loading. */
static int bench_tokenizer(int argc, char **argv) {
    const char *tokpath = NULL, *data = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokenizer")) tokpath = argv[i + 1];
        else if (!strcmp(argv[i], "--data")) data = argv[i + 1];
    }
    if (!tokpath || !data) {
        fprintf(stderr, "megatrain bench tokenizer: --tokenizer PATH and --data FILE.jsonl are "
                "required\n");
        return 2;
    }
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
static int bench_moe_gemm(int argc, char **argv) {
    long long bk = 0, stages = 0;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        if (!strcmp(argv[i], "--stages") && i + 1 < argc) stages = mt_arg_ll(argv[++i], &bad);
        else if (!strcmp(argv[i], "--bk") && i + 1 < argc) bk = mt_arg_ll(argv[++i], &bad);
        else bad = 1;
        if (bad || !(stages == 0 || (stages >= 2 && stages <= 5)) ||
            !(bk == 0 || bk == 32 || bk == 64)) {
            fprintf(stderr, "megatrain bench moe-gemm: '%s': the options are --bk 32|64 and "
                    "--stages 2..5\n", argv[i]);
            return 2;
        }
    }
#ifndef MT_HAVE_CUDA
    fprintf(stderr, "megatrain bench moe-gemm: this build has no CUDA support\n");
    return 1;
#else
    mt_error err;
    if (mt_cuda_moe_gemm_bench(stdout, (int)bk, (int)stages, &err)) {
        fprintf(stderr, "megatrain bench moe-gemm: %s\n", err.msg);
        return 1;
    }
    return 0;
#endif
}

int mt_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        bench_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *what = argv[1];
    if (!strcmp(what, "train")) return mt_bench_train(argc - 1, argv + 1);
    if (!strcmp(what, "tokenizer")) return bench_tokenizer(argc - 1, argv + 1);
    if (!strcmp(what, "moe-gemm")) return bench_moe_gemm(argc - 1, argv + 1);
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
        int bad = 0;
        switch (c) {
        case 'p': params = mt_arg_ll(optarg, &bad); break;
        case 't': threads = (int)mt_arg_ll(optarg, &bad); break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
        if (bad) {
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
