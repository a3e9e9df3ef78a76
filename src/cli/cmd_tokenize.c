/* megatrain tokenize: JSONL -> .mtok (pre-tokenized, memory-mapped at
 * training time). Prints documents, tokens, trainable tokens and speed. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli_options.h"
#include "cli/commands.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

typedef struct tokenize_args {
    const char *tokenizer, *data, *out, *text_field;
    int data_format, chat_template;
    bool skip_bad_lines;
    bool given[8];
} tokenize_args;

#define OFF(field) offsetof(tokenize_args, field)
static const mt_opt options[] = {
    {"tokenizer", MT_OPT_TEXT, OFF(tokenizer), NULL, NULL, MT_OPT_ANY, NULL, "PATH", NULL,
     "tokenizer.json, or bytes for the built-in byte tokenizer"},
    {"data", MT_OPT_TEXT, OFF(data), NULL, NULL, MT_OPT_ANY, NULL, "IN", NULL,
     ".jsonl, .jsonl.gz, .jsonl.zst, or a directory of them (one .mtok)"},
    {"out", MT_OPT_TEXT, OFF(out), NULL, NULL, MT_OPT_ANY, NULL, "OUT.mtok", NULL,
     "the token file to write"},
    MT_CLI_DATA_LAYOUT(tokenize_args),
    {"skip_bad_lines", MT_OPT_BOOL, OFF(skip_bad_lines), "false", NULL, MT_OPT_ANY, NULL, NULL,
     NULL, "skip malformed lines (counted) instead of stopping"},
};
#undef OFF
static const mt_opt_alias aliases[] = {MT_CLI_FORMAT_ALIAS};

static int run(void *args, int argc, char **argv) {
    mt_cli_warn_launcher("tokenize");
    tokenize_args *a = args;
    const char *tok_path = a->tokenizer, *out = a->out;
    mt_data_opts o = {.path = a->data, .format = mt_tc_data_formats[a->data_format],
                      .text_field = a->text_field,
                      .chat_template = mt_tc_chat_templates[a->chat_template], .epochs = 1,
                      .skip_bad_lines = a->skip_bad_lines};
    if (!strcmp(o.format, "tokens"))
        return mt_cli_fail("tokenize", 2, "--data-format tokens: the input is already "
                           "tokenized");
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

static const mt_opt_table table = {
    .command = "tokenize", MT_OPT_ROWS(options), MT_OPT_ALIASES(aliases),
    MT_OPT_STRUCT(tokenize_args),
    .about = "Tokenizes a JSONL corpus once, into a .mtok file that training memory-maps."};
const mt_cli_command mt_cli_tokenize = {
    "tokenize", "pre-tokenize a JSONL corpus to .mtok", &table, run};
