/* The tokenizer object: opening a tokenizer.json (parsed by
 * tokenizer_load.c) with the BOS/EOS of the tokenizer_config.json beside it,
 * the built-in byte tokenizer, freeing, and the queries. */
#include "data/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file.h"
#include "util/mem.h"

/* bos_token / eos_token are a string or {"content": ...}. */
static int32_t config_token(const mt_tokenizer *tok, const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    const char *s = cJSON_IsString(v) ? v->valuestring : cJSON_IsString(c) ? c->valuestring : NULL;
    return s ? mt_tokenizer_token_id(tok, s) : -1;
}

static void read_config(mt_tokenizer *tok, const char *tokenizer_path) {
    const char *slash = strrchr(tokenizer_path, '/');
    size_t dir = slash ? (size_t)(slash - tokenizer_path + 1) : 0;
    char path[4096];
    if (dir + 32 > sizeof path) return;
    memcpy(path, tokenizer_path, dir);
    strcpy(path + dir, "tokenizer_config.json");
    FILE *f = fopen(path, "rb");
    if (!f) return;  // optional
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n > 0 ? mt_malloc_or_die((size_t)n) : NULL;
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    cJSON *cfg = buf ? cJSON_ParseWithLength(buf, got) : NULL;
    free(buf);
    if (!cfg) return;
    if (cJSON_GetObjectItemCaseSensitive(cfg, "bos_token")) tok->bos_id = config_token(tok, cfg, "bos_token");
    if (cJSON_GetObjectItemCaseSensitive(cfg, "eos_token")) tok->eos_id = config_token(tok, cfg, "eos_token");
    cJSON_Delete(cfg);
}

mt_tokenizer *mt_tokenizer_load(const char *path, mt_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        mt_errorf(err, "%s: cannot open tokenizer file; pass the path of a Hugging Face tokenizer.json", path);
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len == cap) buf = mt_realloc_or_die(buf, cap = cap ? cap * 2 : 1 << 20);
        got = fread(buf + len, 1, cap - len, f);
        len += got;
    } while (got > 0);
    bool read_err = ferror(f);
    fclose(f);
    if (read_err) {
        free(buf);
        mt_errorf(err, "%s: read error", path);
        return NULL;
    }
    mt_tokenizer *tok = mt_calloc_or_die(1, sizeof *tok);
    tok->unk_id = tok->bos_id = tok->eos_id = -1;
    int rc = mt_tok_parse(tok, buf, len, path, err);
    free(buf);
    if (rc) {
        mt_tokenizer_free(tok);
        return NULL;
    }
    read_config(tok, path);
    tok->path = mt_strdup_or_die(path);
    return tok;
}

mt_tokenizer *mt_tokenizer_bytes(void) {
    mt_tokenizer *tok = mt_calloc_or_die(1, sizeof *tok);
    tok->is_bytes = true;
    tok->vocab_size = 258;
    tok->unk_id = -1;
    tok->bos_id = 256;
    tok->eos_id = 257;
    return tok;
}

/* The built-in byte tokenizer as tokenizer.json: byte-level BPE with one
 * token per byte (its ByteLevel character has the byte's id) and no
 * merges, <s> and </s> as special tokens 256 and 257, and <s> before a
 * sequence when special tokens are added. It gives mt_tokenizer_bytes()'s
 * ids, except that a literal "<s>" or "</s>" in a text is the special
 * token, as in every Hugging Face tokenizer. */
static char *bytes_tokenizer_json(void) {
    cJSON *o = cJSON_CreateObject(), *added = cJSON_AddArrayToObject(o, "added_tokens");
    cJSON_AddStringToObject(o, "version", "1.0");
    static const char *const names[] = {"<s>", "</s>"};
    for (int i = 0; i < 2; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", 256 + i);
        cJSON_AddStringToObject(t, "content", names[i]);
        cJSON_AddFalseToObject(t, "single_word");
        cJSON_AddFalseToObject(t, "lstrip");
        cJSON_AddFalseToObject(t, "rstrip");
        cJSON_AddFalseToObject(t, "normalized");
        cJSON_AddTrueToObject(t, "special");
        cJSON_AddItemToArray(added, t);
    }
    cJSON_AddNullToObject(o, "normalizer");
    const char *bytelevel = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                            "\"trim_offsets\": true, \"use_regex\": false}";
    cJSON_AddItemToObject(o, "pre_tokenizer", cJSON_Parse(bytelevel));
    cJSON_AddItemToObject(o, "post_processor", cJSON_Parse(
        "{\"type\": \"TemplateProcessing\", "
        "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
        "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
        "\"pair\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
        "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
        "{\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
        "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [256], "
        "\"tokens\": [\"<s>\"]}}}"));
    cJSON_AddItemToObject(o, "decoder", cJSON_Parse(bytelevel));
    cJSON *model = cJSON_AddObjectToObject(o, "model"), *vocab;
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddFalseToObject(model, "fuse_unk");
    cJSON_AddFalseToObject(model, "byte_fallback");
    cJSON_AddFalseToObject(model, "ignore_merges");
    vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char ch[8] = {0};
        uint32_t cp = mt_tok_byte_to_cp((uint8_t)b);  // below U+0800: two bytes at most
        if (cp < 0x80) ch[0] = (char)cp;
        else ch[0] = (char)(0xC0 | cp >> 6), ch[1] = (char)(0x80 | (cp & 0x3F));
        cJSON_AddNumberToObject(vocab, ch, b);
    }
    cJSON_AddArrayToObject(model, "merges");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

int mt_tokenizer_bytes_save(const char *dir, mt_error *err) {
    static const char config[] =
        "{\n  \"bos_token\": \"<s>\",\n  \"eos_token\": \"</s>\",\n"
        "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n";
    char *json = bytes_tokenizer_json();
    const char *names[] = {"tokenizer.json", "tokenizer_config.json"};
    const char *texts[] = {json, config};
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        char *path = mt_path_join(dir, names[i]);
        mt_atomic_file f;
        if (mt_atomic_open(&f, path, err)) {
            rc = -1;
        } else if (mt_write_all(f.fd, texts[i], strlen(texts[i]), path, err)) {
            mt_atomic_abort(&f);
            rc = -1;
        } else {
            rc = mt_atomic_commit(&f, err);
        }
        free(path);
    }
    free(json);
    return rc ? -1 : 0;
}

static void free_addedset(mt_tok_addedset *s) {
    for (size_t i = 0; i < s->n; i++) free(s->tok[i].content);
    free(s->tok);
}

void mt_tokenizer_free(mt_tokenizer *tok) {
    if (!tok) return;
    free(tok->path);
    free(tok->id_arena);
    free(tok->id_off);
    free(tok->id_exists);
    free(tok->id_special);
    mt_tok_strmap_free(&tok->vocab);
    mt_tok_mergemap_free(&tok->merges);
    for (size_t i = 0; i < tok->n_norms; i++) {
        free(tok->norms[i].a);
        free(tok->norms[i].b);
    }
    free(tok->norms);
    for (size_t i = 0; i < tok->n_splits; i++) pcre2_code_free(tok->splits[i]);
    for (size_t i = 0; i < tok->n_decs; i++) {
        free(tok->decs[i].a);
        free(tok->decs[i].b);
    }
    free(tok->decs);
    free_addedset(&tok->added_raw);
    free_addedset(&tok->added_norm);
    free(tok->prefix_ids);
    free(tok->suffix_ids);
    free(tok);
}

size_t mt_tokenizer_vocab_size(const mt_tokenizer *tok) { return tok->vocab_size; }
const char *mt_tokenizer_path(const mt_tokenizer *tok) { return tok->path; }
int32_t mt_tokenizer_bos_id(const mt_tokenizer *tok) { return tok->bos_id; }
int32_t mt_tokenizer_eos_id(const mt_tokenizer *tok) { return tok->eos_id; }

int32_t mt_tokenizer_token_id(const mt_tokenizer *tok, const char *token) {
    size_t len = strlen(token);
    if (tok->is_bytes) {
        if (strcmp(token, "<s>") == 0) return 256;
        if (strcmp(token, "</s>") == 0) return 257;
        return len == 1 ? (unsigned char)token[0] : -1;
    }
    // Spellings are unique per id, so a scan is exact; this is not a hot path.
    for (size_t i = 0; i < tok->vocab_size; i++) {
        size_t n = tok->id_off[i + 1] - tok->id_off[i];
        if (tok->id_exists[i] && n == len && memcmp(tok->id_arena + tok->id_off[i], token, len) == 0)
            return (int32_t)i;
    }
    return -1;
}
