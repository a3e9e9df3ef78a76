/* Which chat template a dataset renders with: the model's own, read from
 * beside its tokenizer.json as transformers reads it, or a built-in
 * (chat_builtin.c), with the special tokens the template sees. */
#include "data/chat.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/chat_builtin.h"
#include "io/file.h"
#include "util/mem.h"

const char *const mt_chat_special_names[MT_CHAT_N_SPECIAL] = {
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};

struct mt_chat_template {
    char *name;
    char *source;
    mt_jinja *tpl, *tool_tpl;  // tool_tpl: for conversations with tools, or NULL
    char *special[MT_CHAT_N_SPECIAL];
    const char *builtin;  // the built-in's name, or NULL
};

void mt_chat_template_free(mt_chat_template *t) {
    if (!t) return;
    mt_jinja_free(t->tpl);
    mt_jinja_free(t->tool_tpl);
    for (int i = 0; i < MT_CHAT_N_SPECIAL; i++) free(t->special[i]);
    free(t->name);
    free(t->source);
    free(t);
}

mt_chat_template *mt_chat_template_new(const char *name, const char *source,
                                       const char *tool_source,
                                       const char *const special[MT_CHAT_N_SPECIAL],
                                       mt_error *err) {
    mt_chat_template *t = mt_calloc_or_die(1, sizeof *t);
    t->name = mt_strdup_or_die(name);
    t->source = mt_strdup_or_die(source);
    for (int i = 0; i < MT_CHAT_N_SPECIAL; i++)
        if (special && special[i]) t->special[i] = mt_strdup_or_die(special[i]);
    t->tpl = mt_jinja_parse(name, source, strlen(source), err);
    if (t->tpl && tool_source) {
        char tool_name[512];
        snprintf(tool_name, sizeof tool_name, "%s (tool_use)", name);
        t->tool_tpl = mt_jinja_parse(tool_name, tool_source, strlen(tool_source), err);
        if (!t->tool_tpl) mt_jinja_free(t->tpl), t->tpl = NULL;
    }
    if (!t->tpl) {
        mt_chat_template_free(t);
        return NULL;
    }
    return t;
}

const char *mt_chat_template_name(const mt_chat_template *t) { return t->builtin ? t->builtin : "model"; }
const char *mt_chat_template_source(const mt_chat_template *t) { return t->source; }
bool mt_chat_template_is_builtin(const mt_chat_template *t) { return t->builtin != NULL; }

const mt_jinja *mt_chat_template_jinja(const mt_chat_template *t, bool tools) {
    return tools && t->tool_tpl ? t->tool_tpl : t->tpl;
}
const char *mt_chat_template_special(const mt_chat_template *t, int i) { return t->special[i]; }

/* ---- the model's own template ---- */

/* What transformers reads beside tokenizer.json: the special tokens of
 * tokenizer_config.json (else special_tokens_map.json), the templates of
 * chat_template.jinja or of tokenizer_config.json's chat_template. */
typedef struct model_files {
    char dir[4096];
    char *special[MT_CHAT_N_SPECIAL];
    char *source, *tool_source;
    const char *from;  // the file the template came from
} model_files;

static void files_free(model_files *m) {
    for (int i = 0; i < MT_CHAT_N_SPECIAL; i++) free(m->special[i]);
    free(m->source);
    free(m->tool_source);
}

static cJSON *read_json(const char *dir, const char *name) {
    char *path = mt_path_join(dir, name), *buf = NULL;
    size_t len;
    mt_error e;
    cJSON *j = NULL;
    if (mt_file_exists(path) && mt_read_file(path, &buf, &len, &e) == 0) {
        j = cJSON_ParseWithLength(buf, len);
        free(buf);
    }
    free(path);
    return j;
}

/* A special token is a string or {"content": ...}. */
static void read_special(model_files *m, const cJSON *cfg) {
    for (int i = 0; i < MT_CHAT_N_SPECIAL; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, mt_chat_special_names[i]);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        const char *s = cJSON_IsString(v) ? v->valuestring : cJSON_IsString(c) ? c->valuestring : NULL;
        if (s && !m->special[i]) m->special[i] = mt_strdup_or_die(s);
    }
}

/* tokenizer_config.json's chat_template: a string, or [{name, template}]. */
static void read_config_template(model_files *m, const cJSON *cfg) {
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *it;
    if (cJSON_IsString(ct)) {
        m->source = mt_strdup_or_die(ct->valuestring);
        return;
    }
    if (!cJSON_IsArray(ct)) return;
    cJSON_ArrayForEach(it, ct) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(it, "template");
        if (!cJSON_IsString(n) || !cJSON_IsString(s)) continue;
        if (!strcmp(n->valuestring, "default") && !m->source) m->source = mt_strdup_or_die(s->valuestring);
        if (!strcmp(n->valuestring, "tool_use") && !m->tool_source) m->tool_source = mt_strdup_or_die(s->valuestring);
    }
}

static void read_model_files(model_files *m, const char *tokenizer_path) {
    memset(m, 0, sizeof *m);
    const char *slash = tokenizer_path ? strrchr(tokenizer_path, '/') : NULL;
    snprintf(m->dir, sizeof m->dir, "%.*s", slash ? (int)(slash - tokenizer_path) : 1,
             slash ? tokenizer_path : ".");
    cJSON *cfg = read_json(m->dir, "tokenizer_config.json");
    cJSON *map = read_json(m->dir, "special_tokens_map.json");
    read_special(m, cfg);
    read_special(m, map);
    char *jinja = mt_path_join(m->dir, "chat_template.jinja"), *buf;
    size_t len;
    mt_error e;
    if (mt_file_exists(jinja) && mt_read_file(jinja, &buf, &len, &e) == 0) {
        m->source = buf;  // it takes priority over the config's, as in transformers
        m->from = "chat_template.jinja";
    } else {
        read_config_template(m, cfg);
        if (m->source) m->from = "tokenizer_config.json chat_template";
    }
    free(jinja);
    cJSON_Delete(cfg);
    cJSON_Delete(map);
}

/* ---- built-ins ---- */

/* <|start_header_id|> -> llama3, <|im_start|> -> qwen, <start_of_turn> ->
 * gemma, else llama2. */
static const char *suggested_builtin(const mt_tokenizer *tok) {
    if (mt_tokenizer_token_id(tok, "<|start_header_id|>") >= 0) return "llama3";
    if (mt_tokenizer_token_id(tok, "<|im_start|>") >= 0) return "qwen";
    if (mt_tokenizer_token_id(tok, "<|user|>") >= 0 && mt_tokenizer_token_id(tok, "<|end|>") >= 0)
        return "phi3";
    if (mt_tokenizer_token_id(tok, "<start_of_turn>") >= 0) return "gemma";
    return "llama2";
}

static mt_chat_template *open_builtin(const mt_chat_builtin *b, const model_files *m,
                                      const mt_tokenizer *tok, mt_error *err) {
    for (int i = 0; i < 4 && b->needs[i]; i++)
        if (mt_tokenizer_token_id(tok, b->needs[i]) < 0)
            return mt_errorf(err, "chat template %s needs the token %s, which the tokenizer lacks: "
                             "pass --chat-template with the template of the model's family (%s)",
                             b->name, b->needs[i], mt_chat_builtin_list()), NULL;
    const char *special[MT_CHAT_N_SPECIAL];
    for (int i = 0; i < MT_CHAT_N_SPECIAL; i++) special[i] = m->special[i];
    if (!special[0]) special[0] = b->bos;
    if (!special[1]) special[1] = b->eos;
    char name[64];
    snprintf(name, sizeof name, "built-in chat template %s", b->name);
    mt_chat_template *t = mt_chat_template_new(name, b->source, NULL, special, err);
    MT_ASSERT(t);  // the built-ins parse (tested)
    t->builtin = b->name;
    return t;
}

mt_chat_template *mt_chat_template_open(const char *choice, const mt_tokenizer *tok, mt_error *err) {
    if (!choice || !*choice) choice = "auto";
    model_files m;
    read_model_files(&m, mt_tokenizer_path(tok));
    mt_chat_template *t = NULL;
    if (strcmp(choice, "auto")) {
        const mt_chat_builtin *b = mt_chat_builtin_find(choice);
        if (b) t = open_builtin(b, &m, tok, err);
        else mt_errorf(err, "unknown chat template '%s': use auto (the model's own template) or one of %s",
                       choice, mt_chat_builtin_list());
    } else if (m.source) {
        char name[4200];
        snprintf(name, sizeof name, "%s/%s", m.dir, m.from);
        t = mt_chat_template_new(name, m.source, m.tool_source, (const char *const *)m.special, err);
        if (!t) mt_error_suffix(err, "; pass --chat-template with a built-in template (%s) to train "
                                "without the model's own", mt_chat_builtin_list());
    } else {
        t = open_builtin(mt_chat_builtin_find(suggested_builtin(tok)), &m, tok, err);
    }
    files_free(&m);
    return t;
}
