/* Every command's options come from its table: `--help` lists each one,
 * and a bad value is a usage error (exit 2) that names the option, before
 * any work. The lists below are the commands' options as documented in the
 * README and docs/; a table that loses one fails here. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "testlib.h"

typedef struct cli_case {
    const char *command[3];  // "eval", or "bench", "train"
    const char *flags[32];   // as --help shows them (NULL after the last)
    const char *bad[10];     // arguments with one bad value, after the command (NULL after)
    const char *named;       // what the error must name
} cli_case;

static const cli_case cases[] = {
    {{"eval"},
     {"--model DIR", "--data FILE", "--tokenizer PATH", "--data-format auto|text",
      "--chat-template", "--packing", "--seq-len T", "--batch-size B", "--micro-batches M", "--max-batches N",
      "--device auto|cpu|cuda", "--precision bf16|fp32", "--dump-logits FILE"},
     {"--model", "m", "--data", "d", "--seq-len", "-1"}, "--seq-len: must be >= 0, got -1"},
    {{"init"},
     {"--tokenizer PATH", "--out DIR", "--hidden N", "--layers N", "--heads N", "--kv-heads N",
      "--ffn N", "--max-pos N", "--rope-theta X", "--[no-]untied", "--std X", "--seed N",
      "--model-type llama|", "--experts N", "--experts-per-tok N", "--expert-ffn N",
      "--shared-expert-ffn N", "--[no-]norm-topk"},
     {"--tokenizer", "t", "--out", "o", "--rope-theta", "0"}, "--rope-theta: must be > 0"},
    {{"generate"},
     {"--model DIR", "--tokenizer PATH", "--prompt PROMPT", "--[no-]bos", "--max-new-tokens N",
      "--temperature X", "--top-p X", "--seed N", "--context N", "--device"},
     {"--model", "m", "--top-p", "2"}, "--top-p: must be > 0 and <= 1, got 2"},
    {{"plan"},
     {"--model DIR", "--preset NAME", "--hidden N", "--layers N", "--heads N", "--kv-heads N",
      "--ffn N", "--vocab N", "--seq-len T", "--batch-size B", "--micro-batches M",
      "--precision", "--gpu-mem GB", "--host-mem GB", "--host-grad-dtype auto|fp32|bf16",
      "--gpu NAME", "--calibration FILE", "--pcie-gbs X", "--gemm-tflops X", "--attn-tflops X",
      "--adam-gparams X"},
     {"--preset", "8b", "--host-grad-dtype", "fp16"}, "--host-grad-dtype: unknown value 'fp16'"},
    {{"calibrate"},
     {"--out FILE", "--preset NAME", "--seq-len T", "--batch-size B", "--micro-batches M",
      "--precision"},
     {"--out", "r.json", "--micro-batches", "0"}, "--micro-batches: must be >= 1"},
    {{"tokenize"},
     {"--tokenizer PATH", "--data IN", "--out OUT.mtok", "--data-format", "--chat-template",
      "--[no-]skip-bad-lines"},
     {"--tokenizer", "t", "--data", "d", "--out", "o", "--data-format", "xml"},
     "--data-format: unknown value 'xml'"},
    {{"plot"},
     {"--metrics METRICS.jsonl", "-o, --out OUT.png", "--title T"},
     {"m.jsonl", "--titel", "x"}, "unknown option '--titel' (did you mean '--title'?)"},
    {{"bench", "train"},
     {"--preset NAME", "--hidden N", "--layers N", "--heads N", "--kv-heads N", "--ffn N",
      "--vocab N", "--seq-len T", "--batch-size B", "--micro-batches M", "--steps N",
      "--precision", "--trace FILE", "--gpus N", "--gpu-mem GB", "--host-mem GB",
      "--host-grad-dtype", "--placement auto|all-gpu", "--calibration FILE",
      "--gpu-adam-layers N", "--slots K", "--keep-layers N", "--grads auto|gpu|host",
      "--[no-]host-saved-inputs"},
     {"--steps", "0"}, "--steps: must be >= 1, got 0"},
    {{"bench", "adamw"}, {"--params N", "--threads N"}, {"--threads", "-1"}, "--threads"},
    {{"bench", "tokenizer"},
     {"--tokenizer PATH", "--data FILE.jsonl"},
     {"--tokenizer", "t"}, "--data is required"},
    {{"bench", "moe-gemm"},
     {"--bk 32|64", "--stages 2..5"}, {"--stages", "1"}, "--stages: unknown value '1'"},
};

/* The command and then the arguments, NULL-terminated, into argv. */
static void command_line(const cli_case *c, const char *const *args, char **argv) {
    int n = 0;
    for (int i = 0; i < 3 && c->command[i]; i++) argv[n++] = (char *)c->command[i];
    for (int i = 0; args[i]; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
}

static void check_case(const cli_case *c) {
    char *argv[40], *out, *err;
    static const char *const help[] = {"--help", NULL};
    command_line(c, help, argv);
    cr_assert_eq(mt_test_cli_output(argv, &out, &err), 0, "%s --help: %s", c->command[0], err);
    cr_assert(strstr(out, "usage: megatrain "), "%s", out);
    for (size_t i = 0; i < sizeof c->flags / sizeof *c->flags && c->flags[i]; i++)
        cr_assert(strstr(out, c->flags[i]), "%s %s --help lacks '%s':\n%s", c->command[0],
                  c->command[1] ? c->command[1] : "", c->flags[i], out);
    free(out);
    free(err);
    command_line(c, c->bad, argv);
    cr_assert_eq(mt_test_cli_output(argv, &out, &err), 2, "%s: %s", c->command[0], err);
    cr_assert(strstr(err, c->named), "'%s' not in: %s", c->named, err);
    cr_assert_str_eq(out, "", "a usage error does no work");
    free(out);
    free(err);
}

Test(cli_options, every_command_lists_its_options_and_names_a_bad_value) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_case(&cases[i]);
}

/* The older spellings of an option still work, with a one-line note on
 * stderr, and do what the one spelling does. */
Test(cli_options, an_older_spelling_works_with_a_note) {
    char *old[] = {"plan", "--preset", "7b", "--gpu-gb", "139", "--host-ram-gb", "125", NULL};
    char *now[] = {"plan", "--preset", "7b", "--gpu-mem", "139", "--host-mem", "125", NULL};
    char *out_old, *err_old, *out_now, *err_now;
    cr_assert_eq(mt_test_cli_output(old, &out_old, &err_old), 0, "%s", err_old);
    cr_assert_eq(mt_test_cli_output(now, &out_now, &err_now), 0, "%s", err_now);
    cr_assert_str_eq(out_old, out_now);
    cr_assert_str_eq(err_now, "");
    cr_assert(strstr(err_old, "megatrain plan: --gpu-gb is deprecated: it is now spelt --gpu-mem"),
              "%s", err_old);
    cr_assert(strstr(err_old, "--host-ram-gb is deprecated: it is now spelt --host-mem"), "%s",
              err_old);
    free(out_old), free(err_old), free(out_now), free(err_now);
    char *format[] = {"eval", "--format", "chat", "--model", "m", "--data", "d", "--seq-len",
                      "-1", NULL};
    cr_assert_eq(mt_test_cli_output(format, &out_now, &err_now), 2);
    cr_assert(strstr(err_now, "--format is deprecated: it is now spelt --data-format"), "%s",
              err_now);
    free(out_now), free(err_now);
}

Test(cli_options, megatrain_help_lists_every_benchmark) {
    char *argv[] = {"--help", NULL}, *out, *err;
    cr_assert_eq(mt_test_cli_output(argv, &out, &err), 0);
    const char *bench = strstr(out, "\n  bench ");
    cr_assert(bench, "%s", out);
    static const char *const names[] = {"\n    train ", "\n    adamw ", "\n    tokenizer ",
                                        "\n    moe-gemm "};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_assert(strstr(bench, names[i]), "'%s' not under bench in:\n%s", names[i] + 5, out);
    free(out);
    free(err);
}

/* A one-process command started by torchrun as several says so on stderr
 * (each process does all the work alone) and does the same work. */
Test(cli_options, a_one_process_command_under_torchrun_says_so) {
    char *plan[] = {"plan", "--preset", "7b", "--gpu-mem", "139", "--host-mem", "125", NULL};
    char *out_one, *err_one, *out_two, *err_two;
    cr_assert_eq(mt_test_cli_output(plan, &out_one, &err_one), 0, "%s", err_one);
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "1", 1);
    cr_assert_eq(mt_test_cli_output(plan, &out_two, &err_two), 0, "%s", err_two);
    unsetenv("WORLD_SIZE");
    unsetenv("RANK");
    cr_assert_str_eq(out_two, out_one);
    cr_assert_str_eq(err_one, "");
    cr_assert(strstr(err_two, "megatrain plan: warning: torchrun started 2 processes") &&
              strstr(err_two, "without torchrun"), "%s", err_two);
    free(out_one), free(err_one), free(out_two), free(err_two);
}
