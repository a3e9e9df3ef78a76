/* megatrain generate: text from a model, to eyeball what it learned. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli_options.h"
#include "cli/commands.h"

typedef struct generate_args {
    const char *model, *tokenizer, *system;
    mt_generate_opts go; // the device is set after parsing
    int64_t seed;
    int device, chat_template;
    bool chat;
    bool given[20];
} generate_args;

#define OFF(field) offsetof(generate_args, field)
static const mt_opt options[] = {
    MT_CLI_MODEL(generate_args, NULL),
    {"prompt", MT_OPT_TEXT, OFF(go.prompt), "", NULL, MT_OPT_ANY, NULL, "PROMPT", NULL,
     "the text to continue (or give it as the argument)"},
    {"chat", MT_OPT_BOOL, OFF(chat), "false", NULL, MT_OPT_ANY, NULL, NULL, NULL,
     "reply to the prompt as a user message, through the model's chat template (with "
     "add_generation_prompt); only the reply is printed"},
    {"system", MT_OPT_TEXT, OFF(system), "", NULL, MT_OPT_ANY, NULL, "TEXT", NULL,
     "with --chat: a system message before the prompt"},
    {"chat_template", MT_OPT_ENUM, OFF(chat_template), "auto", NULL, MT_OPT_ANY,
     mt_tc_chat_templates, NULL, NULL, "with --chat: the model's own template (auto), or a "
     "built-in by name"},
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
/* The prompt (and system message) as a JSON list of messages. */
static char *chat_messages(const generate_args *a) {
    cJSON *list = cJSON_CreateArray();
    const char *roles[] = {"system", "user"}, *texts[] = {a->system, a->go.prompt};
    for (int i = 0; i < 2; i++) {
        if (i == 0 && (!texts[0] || !*texts[0])) continue;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", roles[i]);
        cJSON_AddStringToObject(m, "content", texts[i]);
        cJSON_AddItemToArray(list, m);
    }
    char *s = cJSON_PrintUnformatted(list);
    cJSON_Delete(list);
    return s;
}

static int run(void *args, int argc, char **argv) {
    mt_cli_warn_launcher("generate");
    generate_args *a = args;
    a->go.prompt = a->go.prompt ? a->go.prompt : "";
    a->go.seed = (uint64_t)a->seed;
    a->go.device = mt_tc_devices[a->device];
    if (!a->chat && (a->system || a->chat_template))
        return mt_cli_fail("generate", 2, "--system and --chat-template go with --chat: add "
                           "--chat to reply through the chat template");
    char *messages = a->chat ? chat_messages(a) : NULL;
    a->go.messages = messages;
    a->go.chat_template = mt_tc_chat_templates[a->chat_template];
    mt_model *m = mt_model_open(a->model, a->tokenizer);
    char *text = m ? mt_model_generate(m, &a->go, mt_cli_print_event, NULL) : NULL;
    int rc = text ? 0 : mt_cli_fail("generate", 1, "%s", mt_last_error());
    mt_free(text);
    mt_model_close(m);
    free(messages);
    return rc;
}

static const mt_opt_table table = {
    .command = "generate", MT_OPT_ROWS(options), MT_OPT_STRUCT(generate_args),
    .positional = "prompt",
    .about = "Continues a prompt with a model, printing the text as it comes; with --chat,\n"
             "replies to it as a user message through the model's chat template."};
const mt_cli_command mt_cli_generate = {"generate", "continue a prompt with a model", &table, run};
