/* The tokenizer object: opening a tokenizer.json (parsed by
 * tokenizer_load.c) with the BOS/EOS of the tokenizer_config.json beside it,
 * the built-in byte tokenizer, freeing, and the queries. */
#include "data/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
