/* The conversational layouts besides chat's "messages", read as
 * conversations (chat.h): sharegpt, alpaca and TRL's conversational
 * prompt/completion. Each builds the messages a chat template sees and
 * hands them to mt_chat_conv_from_messages, which checks and normalises
 * them as for a "messages" line.
 *
 * sharegpt's "from"/"value" become "role"/"content" as TRL's
 * maybe_convert_to_chatml renames them; its speaker names (human, gpt,
 * observation, function_call) become the roles chat templates know, as
 * LLaMA-Factory's and axolotl's sharegpt readers map them. alpaca's fields
 * make a user turn and an assistant turn as LLaMA-Factory's alpaca reader
 * makes them (instruction and input joined by a line break). */
#include <string.h>

#include "data/chat.h"

static bool str_is(mt_jv v, const char *s) {
    return v.type == MT_JV_STR && v.s.n == strlen(s) && !memcmp(v.s.p, s, v.s.n);
}

static mt_jv message(mt_jpool *p, const char *role, mt_jv content) {
    mt_jv m = mt_jv_dict_new(p, 2);
    mt_jv_dict_set(p, m, mt_jv_cstr("role"), mt_jv_cstr(role));
    mt_jv_dict_set(p, m, mt_jv_cstr("content"), content);
    return m;
}

/* A string field: -1 when it is neither a string nor (when optional)
 * absent or null; *out is "" when absent. */
static int text_field(mt_jv root, const char *key, bool optional, mt_jv *out, mt_error *err) {
    mt_jv v = mt_jv_dict_gets(root, key);
    if (v.type == MT_JV_STR) return *out = v, 0;
    if (optional && (v.type == MT_JV_UNDEF || v.type == MT_JV_NONE)) return *out = mt_jv_strn("", 0), 0;
    if (v.type == MT_JV_UNDEF) return mt_errorf(err, "field \"%s\" is missing", key);
    return mt_errorf(err, "field \"%s\" is not a string", key);
}

/* ---- sharegpt ---- */

static const struct {
    const char *from, *role;
} speakers[] = {
    {"human", "user"},          {"user", "user"},           {"gpt", "assistant"},
    {"assistant", "assistant"}, {"model", "assistant"},     {"chatgpt", "assistant"},
    {"system", "system"},       {"tool", "tool"},           {"observation", "tool"},
    {"function_response", "tool"}, {"ipython", "ipython"}, {"function_call", "assistant"},
};

/* function_call's value: the call as JSON ({"name", "arguments"}, or a
 * list of them), made an assistant message with tool_calls. */
static int call_message(mt_jpool *p, mt_jv value, size_t i, mt_jv *out, mt_error *err) {
    mt_jv calls, parsed;
    mt_error e;
    if (mt_jv_from_json(p, value.s.p, value.s.n, &parsed, &e) ||
        (parsed.type != MT_JV_DICT && parsed.type != MT_JV_LIST))
        return mt_errorf(err, "conversations[%zu] is a function_call whose value is not a JSON "
                         "object {\"name\": ..., \"arguments\": ...}", i);
    if (parsed.type == MT_JV_DICT) {
        calls = mt_jv_list_new(p, 1);
        mt_jv_list_push(p, calls, parsed);
    } else {
        calls = parsed;
    }
    mt_jv wrapped = mt_jv_list_new(p, calls.l->n);
    for (size_t k = 0; k < calls.l->n; k++) {
        mt_jv call = mt_jv_dict_new(p, 2);
        mt_jv_dict_set(p, call, mt_jv_cstr("type"), mt_jv_cstr("function"));
        mt_jv_dict_set(p, call, mt_jv_cstr("function"), calls.l->v[k]);
        mt_jv_list_push(p, wrapped, call);
    }
    *out = mt_jv_dict_new(p, 2);
    mt_jv_dict_set(p, *out, mt_jv_cstr("role"), mt_jv_cstr("assistant"));
    mt_jv_dict_set(p, *out, mt_jv_cstr("tool_calls"), wrapped);
    return 0;
}

static int sharegpt_turn(mt_jpool *p, mt_jv turn, size_t i, mt_jv *out, mt_error *err) {
    if (turn.type != MT_JV_DICT) return mt_errorf(err, "conversations[%zu] is not an object", i);
    mt_jv from = mt_jv_dict_gets(turn, "from"), value = mt_jv_dict_gets(turn, "value");
    if (from.type != MT_JV_STR)
        return mt_errorf(err, "field \"from\" of conversations[%zu] is %s", i,
                         from.type == MT_JV_UNDEF ? "missing" : "not a string");
    if (value.type != MT_JV_STR)
        return mt_errorf(err, "field \"value\" of conversations[%zu] is %s", i,
                         value.type == MT_JV_UNDEF ? "missing" : "not a string");
    for (size_t k = 0; k < sizeof speakers / sizeof *speakers; k++) {
        if (!str_is(from, speakers[k].from)) continue;
        if (!strcmp(speakers[k].from, "function_call")) return call_message(p, value, i, out, err);
        *out = message(p, speakers[k].role, value);
        return 0;
    }
    return mt_errorf(err, "conversations[%zu].from is '%.*s': use human, gpt, system, tool, "
                     "observation or function_call (also user, assistant)",
                     i, (int)(from.s.n < 64 ? from.s.n : 64), from.s.p);
}

int mt_chat_conv_from_sharegpt(mt_jpool *pool, mt_jv root, mt_chat_conv *c, mt_error *err) {
    mt_jv turns = mt_jv_dict_gets(root, "conversations"), system;
    if (turns.type == MT_JV_UNDEF) return mt_errorf(err, "field \"conversations\" is missing");
    if (turns.type != MT_JV_LIST) return mt_errorf(err, "field \"conversations\" is not an array");
    if (text_field(root, "system", true, &system, err)) return -1;
    mt_jv msgs = mt_jv_list_new(pool, turns.l->n + 1);
    if (system.s.n) mt_jv_list_push(pool, msgs, message(pool, "system", system));
    for (size_t i = 0; i < turns.l->n; i++) {
        mt_jv m;
        if (sharegpt_turn(pool, turns.l->v[i], i, &m, err)) return -1;
        mt_jv_list_push(pool, msgs, m);
    }
    return mt_chat_conv_from_messages(pool, root, msgs, "conversations", c, err);
}

/* ---- alpaca ---- */

/* [user, assistant] pairs of earlier turns. */
static int alpaca_history(mt_jpool *p, mt_jv root, mt_jv msgs, mt_error *err) {
    mt_jv h = mt_jv_dict_gets(root, "history");
    if (h.type == MT_JV_UNDEF || h.type == MT_JV_NONE) return 0;
    if (h.type != MT_JV_LIST) return mt_errorf(err, "field \"history\" is not an array");
    for (size_t i = 0; i < h.l->n; i++) {
        mt_jv pair = h.l->v[i];
        if (pair.type != MT_JV_LIST || pair.l->n != 2 || pair.l->v[0].type != MT_JV_STR ||
            pair.l->v[1].type != MT_JV_STR)
            return mt_errorf(err, "history[%zu] is not a pair [\"question\", \"answer\"] of strings", i);
        mt_jv_list_push(p, msgs, message(p, "user", pair.l->v[0]));
        mt_jv_list_push(p, msgs, message(p, "assistant", pair.l->v[1]));
    }
    return 0;
}

int mt_chat_conv_from_alpaca(mt_jpool *pool, mt_jv root, mt_chat_conv *c, mt_error *err) {
    mt_jv instruction, input, output, system;
    if (text_field(root, "instruction", false, &instruction, err) ||
        text_field(root, "input", true, &input, err) ||
        text_field(root, "output", false, &output, err) ||
        text_field(root, "system", true, &system, err))
        return -1;
    mt_jv msgs = mt_jv_list_new(pool, 4);
    if (system.s.n) mt_jv_list_push(pool, msgs, message(pool, "system", system));
    if (alpaca_history(pool, root, msgs, err)) return -1;
    mt_jv user = instruction;
    if (input.s.n && instruction.s.n) {
        size_t n = instruction.s.n + 1 + input.s.n;
        char *s = mt_jpool_alloc(pool, n + 1);
        memcpy(s, instruction.s.p, instruction.s.n);
        s[instruction.s.n] = '\n';
        memcpy(s + instruction.s.n + 1, input.s.p, input.s.n);
        user = mt_jv_strn(s, n);
    } else if (input.s.n) {
        user = input;
    }
    mt_jv_list_push(pool, msgs, message(pool, "user", user));
    mt_jv_list_push(pool, msgs, message(pool, "assistant", output));
    return mt_chat_conv_from_messages(pool, root, msgs, "instruction", c, err);
}

/* ---- TRL's conversational prompt/completion ---- */

int mt_chat_conv_from_prompt_completion(mt_jpool *pool, mt_jv root, mt_chat_conv *c,
                                        size_t *n_prompt, mt_error *err) {
    mt_chat_conv prompt;
    if (mt_chat_conv_from_messages(pool, root, mt_jv_dict_gets(root, "prompt"), "prompt", &prompt, err) ||
        mt_chat_conv_from_messages(pool, root, mt_jv_dict_gets(root, "completion"), "completion", c, err))
        return -1;
    size_t np = prompt.messages.l->n, nc = c->messages.l->n;
    mt_jv all = mt_jv_list_new(pool, np + nc);
    for (size_t i = 0; i < np; i++) mt_jv_list_push(pool, all, prompt.messages.l->v[i]);
    for (size_t i = 0; i < nc; i++) {
        mt_jv m = c->messages.l->v[i];
        m.d->msg = (int32_t)(np + i);  // its index in the whole conversation
        mt_jv_list_push(pool, all, m);
    }
    c->messages = all;
    *n_prompt = np;
    return 0;
}
