/* Chat templates: the first byte picks what the rest is. Even: a Jinja
 * template, parsed and rendered (with its loss spans) over a conversation
 * with a system prompt, tool calls and a tool result. Odd: a JSONL chat
 * line, read and rendered with the built-in qwen template (Qwen3's, the
 * most involved of the built-ins). */
#include "data/chat.h"
#include "fuzz_util.h"

static const char conversation[] =
    "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}], "
    "\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi \\u00e9\"}, "
    "{\"role\": \"assistant\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
    "\"arguments\": {\"x\": 1.5}}}]}, {\"role\": \"tool\", \"content\": \"42\"}, "
    "{\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\nok\", \"reasoning_content\": \"r\"}]}";

static void render(const mt_chat_template *t, const char *line, size_t len) {
    mt_jpool pool = {0};
    mt_chat_text r = {0};
    mt_chat_conv c;
    mt_error err;
    mt_jinja_opts opts = {.now = 1721995200};
    if (mt_chat_conv_from_json(&pool, line, len, &c, &err) == 0)
        for (int gen = 0; gen < 2; gen++) mt_chat_render(t, &c, gen, &pool, &opts, &r, &err);
    mt_chat_text_free(&r);
    mt_jpool_free(&pool);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *s = fuzz_str(data + 1, size - 1);
    const char *special[MT_CHAT_N_SPECIAL] = {"<s>", "</s>"};
    mt_error err;
    if (data[0] % 2 == 0) {
        mt_chat_template *t = mt_chat_template_new("fuzz", s, NULL, special, &err);
        if (t) render(t, conversation, sizeof conversation - 1);
        mt_chat_template_free(t);
    } else {
        mt_chat_template *t = mt_chat_template_new("qwen", mt_chat_builtin_source("qwen"), NULL, special, &err);
        render(t, s, size - 1);
        mt_chat_template_free(t);
    }
    free(s);
    return 0;
}
