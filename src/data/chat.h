/* Chat templates: a conversation ({"messages": [...]}) rendered as the
 * model's own Jinja chat template renders it in transformers'
 * apply_chat_template (data/jinja/jinja.h), and which bytes of the text
 * carry the loss.
 *
 * The template (mt_chat_template_open): by default the model's own, read
 * beside the tokenizer.json as transformers reads it (chat_template.jinja,
 * else tokenizer_config.json's chat_template: a string, or a list of named
 * templates whose "default" is used, and "tool_use" for a conversation with
 * tools); a tokenizer without one gets the built-in its special tokens
 * suggest. The built-ins are the published templates of their families:
 *   llama3   Meta's Llama-3 Instruct template
 *   qwen     Qwen3's template (<think> blocks)
 *   llama2   Meta's Llama-2-chat template
 *   mistral  Mistral/Mixtral-Instruct v0.1 ([INST] ... [/INST])
 *   chatml   ChatML (<|im_start|>role\n...<|im_end|>\n; Qwen2/2.5 without
 *            their default system prompt)
 *   gemma    Gemma 3's template (<start_of_turn>role\n...<end_of_turn>\n, the
 *            assistant's role "model"; Gemma 2's turns alike)
 *
 * The loss (mt_chat_render): with `{% generation %}` blocks in the
 * template, the bytes they write (transformers' assistant masks). Without
 * them, each assistant message's turn as the model would write it: from
 * the end of the prompt it is generated after, render(messages[:k],
 * add_generation_prompt=True), through the end of the loop iteration that
 * rendered message k (and an EOS token written right after the last
 * message). When the template does not render messages[:k] as a prefix of
 * the whole conversation, the turn starts after the part of its iteration
 * that equals the generation prompt. docs/data.md has the details. */
#ifndef MT_DATA_CHAT_H
#define MT_DATA_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "data/jinja/jinja.h"
#include "data/tok_spans.h"
#include "data/tokenizer.h"
#include "util/error.h"

/* The special tokens a template sees, as transformers passes them. */
enum { MT_CHAT_N_SPECIAL = 7 };
extern const char *const mt_chat_special_names[MT_CHAT_N_SPECIAL];  // "bos_token", ...

typedef struct mt_chat_template mt_chat_template;

/* The template that choice names for tok: "auto" (or NULL) or a built-in's
 * name. NULL with err: an unknown name, a built-in whose special tokens the
 * tokenizer lacks, a model template that does not parse (naming the file,
 * line and column and what is not supported). */
mt_chat_template *mt_chat_template_open(const char *choice, const mt_tokenizer *tok, mt_error *err);

/* A template from its source; tool_source (may be NULL) is used for
 * conversations with tools; special[i] (may be NULL) is the value of
 * mt_chat_special_names[i]. name is what errors call it. */
mt_chat_template *mt_chat_template_new(const char *name, const char *source,
                                       const char *tool_source,
                                       const char *const special[MT_CHAT_N_SPECIAL],
                                       mt_error *err);
void mt_chat_template_free(mt_chat_template *t);

/* "model" for the model's own template, else the built-in's name. */
const char *mt_chat_template_name(const mt_chat_template *t);
/* The Jinja text of the template (of the default one, when named). */
const char *mt_chat_template_source(const mt_chat_template *t);
/* Whether it is a built-in (the model's own template was not used). */
bool mt_chat_template_is_builtin(const mt_chat_template *t);

/* The parsed template for a conversation with tools or without. */
const mt_jinja *mt_chat_template_jinja(const mt_chat_template *t, bool tools);
/* The value of mt_chat_special_names[i] for t, or NULL. */
const char *mt_chat_template_special(const mt_chat_template *t, int i);

/* "llama3, qwen, llama2, mistral, chatml, gemma", for messages and help. */
const char *mt_chat_builtin_list(void);
/* The Jinja text of a built-in, or NULL when there is no such name. */
const char *mt_chat_builtin_source(const char *name);

/* ---- rendering ---- */

/* A conversation, as the template sees it. */
typedef struct mt_chat_conv {
    mt_jv messages;   // list of dicts, each dict's msg its index
    mt_jv tools;      // list or None
    mt_jv documents;  // list or None
    mt_jv kwargs;     // dict of more variables (chat_template_kwargs), or Undefined
} mt_chat_conv;

/* Reads a JSONL line ({"messages": [...], "tools"?, "documents"?,
 * "chat_template_kwargs"?}) into c, with values in pool, as
 * apply_chat_template prepares messages (keys whose value is null are
 * dropped; reasoning_content, thinking and reasoning are copied to one
 * another). -1 with err naming the field: no messages, a message without a
 * string role, a role chat templates do not have, a message without
 * content (only an assistant message with tool_calls may lack it). */
int mt_chat_conv_from_json(mt_jpool *pool, const char *line, size_t len, mt_chat_conv *c,
                           mt_error *err);

/* The conversation of a parsed line (root, a dict) whose messages are
 * msgs, its field `what` ("messages"; errors name it): the checks and
 * normalisation of mt_chat_conv_from_json. tools, documents and
 * chat_template_kwargs are read from root. */
int mt_chat_conv_from_messages(mt_jpool *pool, mt_jv root, mt_jv msgs, const char *what,
                               mt_chat_conv *c, mt_error *err);

/* The other conversational layouts (chat_formats.c), read from a parsed
 * line as conversations:
 *   sharegpt   {"conversations": [{"from": "human", "value": "..."}, ...],
 *               "system"?: "...", "tools"?: [...]}: from human/user -> user,
 *               gpt/assistant/model -> assistant, system, tool/observation ->
 *               tool, function_call -> an assistant message calling a tool
 *   alpaca     {"instruction", "input"?, "output", "system"?, "history"?}:
 *               [system], the history's [user, assistant] pairs, user =
 *               instruction, a line break and input when input is not empty,
 *               assistant = output
 *   prompt/completion (TRL's conversational layout) {"prompt": [messages],
 *               "completion": [messages]}: *n_prompt gets the number of
 *               prompt messages (render with mt_chat_render_completion)
 * -1 with err naming the field and what to give. */
int mt_chat_conv_from_sharegpt(mt_jpool *pool, mt_jv root, mt_chat_conv *c, mt_error *err);
int mt_chat_conv_from_alpaca(mt_jpool *pool, mt_jv root, mt_chat_conv *c, mt_error *err);
int mt_chat_conv_from_prompt_completion(mt_jpool *pool, mt_jv root, mt_chat_conv *c,
                                        size_t *n_prompt, mt_error *err);

/* A rendered conversation; zero-initialise, reuse, free with
 * mt_chat_text_free. */
typedef struct mt_chat_text {
    mt_jinja_out out;       // out.text: the rendered conversation
    mt_jinja_out scratch;   // renderings of prefixes
    mt_tok_span *spans;     // (n_spans) the bytes with loss, in order
    size_t n_spans, spans_cap;
} mt_chat_text;

void mt_chat_text_free(mt_chat_text *r);

/* Renders c with t (add_generation_prompt as given) into r, and, without
 * the generation prompt, the spans that carry the loss. pool holds c's
 * values and the render's. -1 with err: the template's own error (with
 * file, line and column), or a template whose assistant turns cannot be
 * found (naming the fix). */
int mt_chat_render(const mt_chat_template *t, const mt_chat_conv *c, bool add_generation_prompt,
                   mt_jpool *pool, const mt_jinja_opts *opts, mt_chat_text *r, mt_error *err);

/* The prompt of a chat reply: messages (JSON text: a list of {"role",
 * "content"} messages, or an object with "messages" and perhaps "tools")
 * rendered with the template choice names for tok (mt_chat_template_open)
 * and add_generation_prompt. Malloc'd; NULL with err naming what is
 * wrong. */
char *mt_chat_prompt(const mt_tokenizer *tok, const char *choice, const char *messages,
                     mt_error *err);

/* The ids of the tokens that end a turn in the chat templates of the
 * families (<|eot_id|>, <|im_end|>, <end_of_turn>, ...) that tok has, at
 * most cap, into ids; how many. */
size_t mt_chat_turn_ends(const mt_tokenizer *tok, int32_t *ids, size_t cap);

/* Renders c (the prompt's n_prompt messages, then the completion's) as
 * TRL trains a conversational prompt/completion: the text of the whole
 * conversation, and one span from where it departs from the prompt
 * rendered with add_generation_prompt to its end (TRL's completion mask:
 * everything after the common prefix of the two). */
int mt_chat_render_completion(const mt_chat_template *t, const mt_chat_conv *c, size_t n_prompt,
                              mt_jpool *pool, const mt_jinja_opts *opts, mt_chat_text *r,
                              mt_error *err);

#endif
