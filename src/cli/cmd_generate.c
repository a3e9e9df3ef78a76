/* megatrain generate: text from a model, to eyeball what it learned. */
#include <stdio.h>

#include "cli/cli_options.h"
#include "cli/commands.h"

typedef struct generate_args {
    const char *model, *tokenizer;
    mt_generate_opts go; // the device is set after parsing
    int64_t seed;
    int device;
    bool given[16];
} generate_args;

#define OFF(field) offsetof(generate_args, field)
static const mt_opt options[] = {
    MT_CLI_MODEL(generate_args, NULL),
    {"prompt", MT_OPT_TEXT, OFF(go.prompt), "", NULL, MT_OPT_ANY, NULL, "PROMPT", NULL,
     "the text to continue (or give it as the argument)"},
    {"bos", MT_OPT_BOOL, OFF(go.add_special), "true", NULL, MT_OPT_ANY, NULL, NULL, NULL,
     "add the tokenizer's special tokens (BOS) to the prompt; --no-bos for models trained on "
     "raw text, like the built-in demo"},
    {"max_new_tokens", MT_OPT_INT, OFF(go.max_new_tokens), "64", NULL, MT_OPT_NONNEG, NULL,
     "N", "Sampling", "tokens to generate at most (fewer at EOS; at most the model's max positions)"},
    {"temperature", MT_OPT_FLOAT, OFF(go.temperature), "0.8", NULL, MT_OPT_NONNEG, NULL, NULL,
     NULL, "0: greedy"},
    {"top_p", MT_OPT_FLOAT, OFF(go.top_p), "0.95", NULL, {0, 1, true, false}, NULL, NULL, NULL,
     "nucleus sampling: the smallest set of tokens of that total probability"},
    {"seed", MT_OPT_INT, OFF(seed), "1", NULL, MT_OPT_NONNEG, NULL, NULL, NULL,
     "sampling seed"},
    {"context", MT_OPT_INT, OFF(go.context), "0", NULL, MT_OPT_NONNEG, NULL, "N", NULL,
     "tokens of context; 0: min(512, max positions)"},
    MT_CLI_DEVICE(generate_args, "Device"),
};
#undef OFF
static int run(void *args, int argc, char **argv) {
    generate_args *a = args;
    a->go.prompt = a->go.prompt ? a->go.prompt : "";
    a->go.seed = (uint64_t)a->seed;
    a->go.device = mt_tc_devices[a->device];
    mt_model *m = mt_model_open(a->model, a->tokenizer);
    char *text = m ? mt_model_generate(m, &a->go, mt_cli_print_event, NULL) : NULL;
    int rc = text ? 0 : mt_cli_fail("generate", 1, "%s", mt_last_error());
    mt_free(text);
    mt_model_close(m);
    return rc;
}

static const mt_opt_table table = {
    .command = "generate", MT_OPT_ROWS(options), MT_OPT_STRUCT(generate_args),
    .positional = "prompt",
    .about = "Continues a prompt with a model, printing the text as it comes."};
const mt_cli_command mt_cli_generate = {"generate", "continue a prompt with a model", &table, run};
