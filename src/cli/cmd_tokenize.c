/* megatrain tokenize: JSONL -> .mtok (pre-tokenized, memory-mapped at
 * training time). Prints documents, tokens, trainable tokens and speed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/dataset.h"
#include "data/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: megatrain tokenize --tokenizer PATH --data IN --out OUT.mtok\n"
               "         [--format auto|text|completion|chat] [--chat-template auto|llama3|qwen|llama2|mistral|chatml]\n"
               "         [--skip-bad-lines]\n"
               "  --tokenizer  tokenizer.json (or 'bytes' for the built-in byte tokenizer)\n"
               "  --data       .jsonl, .jsonl.gz, .jsonl.zst, or a directory of them (one .mtok)\n");
}

int mt_cmd_tokenize(int argc, char **argv) {
    const char *tok_path = NULL, *out = NULL;
    mt_data_opts o = {.format = "auto", .chat_template = "auto", .epochs = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 0;
        if (!strcmp(a, "--skip-bad-lines")) { o.skip_bad_lines = 1; continue; }
        const char **dst = !strcmp(a, "--tokenizer") ? &tok_path : !strcmp(a, "--data") ? &o.path
                         : !strcmp(a, "--out") ? &out : !strcmp(a, "--format") ? &o.format
                         : !strcmp(a, "--chat-template") ? &o.chat_template : NULL;
        if (!dst || !v) {
            fprintf(stderr, "megatrain tokenize: %s '%s'\n", dst ? "missing value for" : "unknown option", a);
            return usage(stderr), 2;
        }
        *dst = v, i++;
    }
    if (!tok_path || !o.path || !out) {
        fprintf(stderr, "megatrain tokenize: --tokenizer, --data and --out are required\n");
        return usage(stderr), 2;
    }
    if (!strcmp(o.format, "tokens")) {
        fprintf(stderr, "megatrain tokenize: --format tokens: the input is already tokenized\n");
        return 2;
    }
    mt_error err = {{0}};
    mt_tokenizer *tok = !strcmp(tok_path, "bytes") ? mt_tokenizer_bytes() : mt_tokenizer_load(tok_path, &err);
    if (!tok) return fprintf(stderr, "megatrain tokenize: %s\n", err.msg), 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mt_dataset *d = mt_dataset_open(&o, tok, (int64_t)mt_tokenizer_vocab_size(tok), &err);
    int rc = 1;
    if (d && mt_dataset_stats(d).format && !strcmp(mt_dataset_stats(d).format, "tokens")) {
        fprintf(stderr, "megatrain tokenize: %s is already a .mtok file\n", o.path);
    } else if (d && !mt_dataset_corpus(d)) {
        fprintf(stderr, "megatrain tokenize: --data is a list: tokenize one file or directory at a time\n");
    } else if (d && !mt_mtok_write(out, mt_dataset_corpus(d), &err)) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        mt_data_stats ds = mt_dataset_stats(d);
        double mb = (double)ds.bytes / 1e6;  // JSONL text, decompressed
        char chat[96] = "";
        if (ds.chat_template && !strcmp(ds.chat_template, "model"))
            snprintf(chat, sizeof chat, " with the model's chat template");
        else if (ds.chat_template)
            snprintf(chat, sizeof chat, " with the built-in chat template %s", ds.chat_template);
        printf("%s: %lld documents, %lld tokens, %lld trainable, format %s%s, %lld lines skipped\n",
               out, (long long)ds.documents, (long long)ds.tokens, (long long)ds.trainable, ds.format,
               chat, (long long)ds.skipped_lines);
        if (ds.skipped_lines) printf("first skipped line: %s\n", mt_dataset_first_skipped(d));
        printf("%.1f MB in %.2f s: %.1f MB/s, %.0f tokens/s\n", mb, s, mb / s, (double)ds.tokens / s);
        rc = 0;
    }
    if (rc && err.msg[0]) fprintf(stderr, "megatrain tokenize: %s\n", err.msg);
    mt_dataset_free(d);
    mt_tokenizer_free(tok);
    return rc;
}
