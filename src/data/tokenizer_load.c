/* Parsing tokenizer.json (and tokenizer_config.json) into mt_tokenizer.
 *
 * Only the components whose HF behaviour megatrain reproduces are accepted;
 * anything else is refused with its JSON path, so a tokenizer never gives
 * silently different ids. */
#include "data/tokenizer_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

/* ByteLevel text -> raw bytes into out (capacity >= len); false when a
 * char is not in the alphabet. */
static bool bytelevel_to_raw(const char *s, size_t len, char *out, size_t *out_len) {
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += mt_tok_utf8_next(s + i, len - i, &cp);
        int b = mt_tok_cp_to_byte(cp);
        if (b < 0) return false;
        out[o++] = (char)b;
    }
    *out_len = o;
    return true;
}

/* ---- small JSON helpers ---- */

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool json_true(const cJSON *o, const char *key) {
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key));
}

static bool json_null_or_absent(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return v == NULL || cJSON_IsNull(v);
}

static char *dup_str(const char *s, size_t *len) {
    *len = strlen(s);
    return mt_strdup_or_die(s);
}

static int unsupported(mt_error *err, const char *where, const char *what) {
    return mt_errorf(err, "%s: %s is not supported (megatrain reproduces byte-level BPE as in "
                          "Llama-3/Qwen and SentencePiece-style BPE as in Llama-2)",
                     where, what);
}

/* ---- model ---- */

/* false when the vocab has the token already (a key given twice). */
static bool add_vocab_token(mt_tokenizer *tok, const char *s, int32_t id) {
    char stack[256];
    size_t len = strlen(s);
    char *raw = len <= sizeof stack ? stack : mt_malloc_or_die(len);
    size_t raw_len = len;
    bool fresh = true;
    memcpy(raw, s, len);
    /* tokens outside the ByteLevel alphabet never match: not kept */
    if (!tok->byte_level || bytelevel_to_raw(s, len, raw, &raw_len)) {
        fresh = mt_tok_strmap_get(&tok->vocab, raw, raw_len) < 0;
        if (fresh) mt_tok_strmap_put(&tok->vocab, raw, raw_len, id);
    }
    if (raw != stack) free(raw);
    return fresh;
}

/* An id of tokenizer.json: a whole number in [0, 2^31 - 1). A fraction
 * was cut to an integer, so that 1.5 and 1 named one token. */
static bool json_id(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < INT32_MAX &&
           v->valuedouble == (double)(int32_t)v->valuedouble;
}

/* One vocab token's key bytes as the BPE sees them; -1 if not in vocab. */
static int32_t vocab_lookup(const mt_tokenizer *tok, const char *s) {
    char stack[256];
    size_t len = strlen(s), raw_len = len;
    char *raw = len <= sizeof stack ? stack : mt_malloc_or_die(len);
    bool ok = true;
    if (tok->byte_level)
        ok = bytelevel_to_raw(s, len, raw, &raw_len);
    else
        memcpy(raw, s, len);
    int32_t id = ok ? mt_tok_strmap_get(&tok->vocab, raw, raw_len) : -1;
    if (raw != stack) free(raw);
    return id;
}

static int parse_merges(mt_tokenizer *tok, const cJSON *merges, mt_error *err) {
    int n = cJSON_GetArraySize(merges);
    mt_tok_mergemap_init(&tok->merges, (size_t)n);
    char buf[1024];
    int r = 0;
    for (const cJSON *m = merges->child; m; m = m->next, r++) {  // not GetArrayItem: O(n) each
        const char *a, *b;
        if (cJSON_IsString(m)) {  // "a b"
            const char *sp = strchr(m->valuestring, ' ');
            size_t la = sp ? (size_t)(sp - m->valuestring) : 0;
            if (!sp || strchr(sp + 1, ' ') || la >= sizeof buf / 2 || strlen(sp + 1) >= sizeof buf / 2)
                return mt_errorf(err, "model.merges[%d]: \"%s\" is not two tokens separated by one space",
                                 r, m->valuestring);
            memcpy(buf, m->valuestring, la);
            buf[la] = 0;
            strcpy(buf + sizeof buf / 2, sp + 1);
            a = buf;
            b = buf + sizeof buf / 2;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) && cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring;  // ["a", "b"]
            b = cJSON_GetArrayItem(m, 1)->valuestring;
        } else {
            return mt_errorf(err, "model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", r);
        }
        size_t la = strlen(a), lb = strlen(b);
        char *ab = mt_malloc_or_die(la + lb + 1);
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb + 1);
        int32_t ia = vocab_lookup(tok, a), ib = vocab_lookup(tok, b), iab = vocab_lookup(tok, ab);
        free(ab);
        if (ia < 0 || ib < 0 || iab < 0)
            return mt_errorf(err, "model.merges[%d]: \"%s\" + \"%s\" uses a token missing from "
                                  "model.vocab; the file is inconsistent", r, a, b);
        mt_tok_mergemap_put(&tok->merges, ia, ib, (uint32_t)r, iab);
    }
    return 0;
}

static int parse_model(mt_tokenizer *tok, const cJSON *model, mt_error *err) {
    const char *type = json_str(model, "type");
    if (!type || strcmp(type, "BPE") != 0) return unsupported(err, "model.type", type ? type : "(missing)");
    if (!json_null_or_absent(model, "dropout")) return unsupported(err, "model.dropout", "BPE dropout");
    const char *pre = json_str(model, "continuing_subword_prefix");
    const char *suf = json_str(model, "end_of_word_suffix");
    if (pre && *pre) return unsupported(err, "model.continuing_subword_prefix", pre);
    if (suf && *suf) return unsupported(err, "model.end_of_word_suffix", suf);
    tok->ignore_merges = json_true(model, "ignore_merges");
    tok->byte_fallback = json_true(model, "byte_fallback");
    tok->fuse_unk = json_true(model, "fuse_unk");

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) return mt_errorf(err, "model.vocab: missing or not an object");
    if (!cJSON_IsArray(merges)) return mt_errorf(err, "model.merges: missing or not an array");
    mt_tok_strmap_init(&tok->vocab, (size_t)cJSON_GetArraySize(vocab));
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!json_id(v) && !cJSON_IsNumber(v))
            return mt_errorf(err, "model.vocab[\"%s\"]: the id is not a number", v->string);
        if (!json_id(v))
            return mt_errorf(err, "model.vocab[\"%s\"]: id %.17g is not an integer in [0, "
                             "2^31 - 1)", v->string, v->valuedouble);
        if (!add_vocab_token(tok, v->string, (int32_t)v->valuedouble))
            return mt_errorf(err, "model.vocab[\"%s\"]: the token is given twice; a tokenizer.json "
                             "gives each token once", v->string);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b, name[8];
        tok->byte_ids[b] = tok->byte_level ? mt_tok_strmap_get(&tok->vocab, &c, 1) : -1;
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->fallback_ids[b] = tok->byte_fallback ? vocab_lookup(tok, name) : -1;
    }
    const char *unk = json_str(model, "unk_token");
    tok->unk_id = unk ? vocab_lookup(tok, unk) : -1;
    if (unk && tok->unk_id < 0) return mt_errorf(err, "model.unk_token: \"%s\" is not in model.vocab", unk);
    return parse_merges(tok, merges, err);
}

/* ---- normalizer, pre-tokenizer, post-processor, decoder ---- */

static int parse_normalizer(mt_tokenizer *tok, const cJSON *n, const char *where, mt_error *err) {
    const char *type = json_str(n, "type");
    if (!type) return mt_errorf(err, "%s: missing \"type\"", where);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        char sub[256];
        for (int i = 0; i < cJSON_GetArraySize(list); i++) {
            snprintf(sub, sizeof sub, "%s.normalizers[%d]", where, i);
            if (parse_normalizer(tok, cJSON_GetArrayItem(list, i), sub, err)) return -1;
        }
        return 0;
    }
    mt_tok_norm nm = {0};
    if (strcmp(type, "NFC") == 0) {
        nm.kind = MT_NORM_NFC;
    } else if (strcmp(type, "Prepend") == 0 && json_str(n, "prepend")) {
        nm.kind = MT_NORM_PREPEND;
        nm.a = dup_str(json_str(n, "prepend"), &nm.alen);
    } else if (strcmp(type, "Replace") == 0) {
        const char *pat = json_str(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String");
        const char *content = json_str(n, "content");
        if (!pat || !*pat || !content) return unsupported(err, where, "Replace without a plain String pattern");
        nm.kind = MT_NORM_REPLACE;
        nm.a = dup_str(pat, &nm.alen);
        nm.b = dup_str(content, &nm.blen);
    } else {
        return unsupported(err, where, type);
    }
    tok->norms = mt_realloc_or_die(tok->norms, (tok->n_norms + 1) * sizeof *tok->norms);
    tok->norms[tok->n_norms++] = nm;
    return 0;
}

static int add_split(mt_tokenizer *tok, const cJSON *p, const char *where, mt_error *err) {
    const char *re = json_str(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "Regex");
    const char *behavior = json_str(p, "behavior");
    if (!re) return unsupported(err, where, "Split without a Regex pattern");
    if (!behavior || strcmp(behavior, "Isolated") != 0 || json_true(p, "invert"))
        return unsupported(err, where, "Split other than behavior Isolated, invert false");
    if (tok->byte_level) return unsupported(err, where, "Split after ByteLevel");
    if (tok->n_splits == MT_TOK_MAX_SPLITS) return unsupported(err, where, "more than 4 Splits");
    int code;
    PCRE2_SIZE off;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    if (!c) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return mt_errorf(err, "%s.pattern.Regex: PCRE2 cannot compile it at offset %zu: %s",
                         where, (size_t)off, (char *)msg);
    }
    /* the encoder matches in windows, partly (tokenizer.c); falls back to the
     * interpreter if JIT is unavailable */
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    tok->splits[tok->n_splits++] = c;
    return 0;
}

static int parse_pretokenizer(mt_tokenizer *tok, const cJSON *p, const char *where, mt_error *err) {
    const char *type = json_str(p, "type");
    if (!type) return mt_errorf(err, "%s: missing \"type\"", where);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        char sub[256];
        for (int i = 0; i < cJSON_GetArraySize(list); i++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", where, i);
            if (parse_pretokenizer(tok, cJSON_GetArrayItem(list, i), sub, err)) return -1;
        }
        return 0;
    }
    if (strcmp(type, "Split") == 0) return add_split(tok, p, where, err);
    if (strcmp(type, "ByteLevel") == 0) {
        if (json_true(p, "add_prefix_space") || json_true(p, "use_regex"))
            return unsupported(err, where, "ByteLevel with add_prefix_space or use_regex true");
        if (tok->byte_level) return unsupported(err, where, "a second ByteLevel");
        tok->byte_level = true;
        return 0;
    }
    return unsupported(err, where, type);
}

/* Appends the ids of template items before ("A" not yet seen) or after. */
static int parse_template(mt_tokenizer *tok, const cJSON *p, const char *where, mt_error *err) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    bool seen_a = false;
    for (int i = 0; i < cJSON_GetArraySize(single); i++) {
        const cJSON *item = cJSON_GetArrayItem(single, i);
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        if (seq) {
            const char *id = json_str(seq, "id");
            if (seen_a || !id || strcmp(id, "A") != 0)
                return unsupported(err, where, "a single template with a sequence other than one $A");
            seen_a = true;
            continue;
        }
        const char *name = json_str(sp, "id");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(specials, name ? name : ""), "ids");
        if (!name || !cJSON_IsArray(ids))
            return mt_errorf(err, "%s.single[%d]: special token not listed in special_tokens", where, i);
        for (int k = 0; k < cJSON_GetArraySize(ids); k++) {
            int32_t id = (int32_t)cJSON_GetArrayItem(ids, k)->valuedouble;
            int32_t **v = seen_a ? &tok->suffix_ids : &tok->prefix_ids;
            size_t *nv = seen_a ? &tok->n_suffix : &tok->n_prefix;
            *v = mt_realloc_or_die(*v, (*nv + 1) * sizeof **v);
            (*v)[(*nv)++] = id;
        }
    }
    if (!seen_a) return mt_errorf(err, "%s.single: the template has no $A", where);
    return 0;
}

static int parse_postprocessor(mt_tokenizer *tok, const cJSON *p, const char *where, mt_error *err) {
    const char *type = json_str(p, "type");
    if (!type) return mt_errorf(err, "%s: missing \"type\"", where);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "processors");
        char sub[256];
        for (int i = 0; i < cJSON_GetArraySize(list); i++) {
            snprintf(sub, sizeof sub, "%s.processors[%d]", where, i);
            if (parse_postprocessor(tok, cJSON_GetArrayItem(list, i), sub, err)) return -1;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) return 0;  // changes offsets only, never ids
    if (strcmp(type, "TemplateProcessing") == 0) {
        if (tok->n_prefix || tok->n_suffix) return unsupported(err, where, "a second TemplateProcessing");
        return parse_template(tok, p, where, err);
    }
    return unsupported(err, where, type);
}

static int parse_decoder(mt_tokenizer *tok, const cJSON *d, const char *where, mt_error *err) {
    const char *type = json_str(d, "type");
    if (!type) return mt_errorf(err, "%s: missing \"type\"", where);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        char sub[256];
        for (int i = 0; i < cJSON_GetArraySize(list); i++) {
            snprintf(sub, sizeof sub, "%s.decoders[%d]", where, i);
            if (parse_decoder(tok, cJSON_GetArrayItem(list, i), sub, err)) return -1;
        }
        return 0;
    }
    mt_tok_dec dc = {0};
    if (strcmp(type, "ByteLevel") == 0) {
        dc.kind = MT_DEC_BYTELEVEL;
    } else if (strcmp(type, "ByteFallback") == 0) {
        dc.kind = MT_DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
        dc.kind = MT_DEC_FUSE;
    } else if (strcmp(type, "Replace") == 0) {
        const char *pat = json_str(cJSON_GetObjectItemCaseSensitive(d, "pattern"), "String");
        const char *content = json_str(d, "content");
        if (!pat || !*pat || !content) return unsupported(err, where, "Replace without a plain String pattern");
        dc.kind = MT_DEC_REPLACE;
        dc.a = dup_str(pat, &dc.alen);
        dc.b = dup_str(content, &dc.blen);
    } else if (strcmp(type, "Strip") == 0 && json_str(d, "content")) {
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start");
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(d, "stop");
        dc.kind = MT_DEC_STRIP;
        dc.a = dup_str(json_str(d, "content"), &dc.alen);
        dc.start = cJSON_IsNumber(start) ? (size_t)start->valuedouble : 0;
        dc.stop = cJSON_IsNumber(stop) ? (size_t)stop->valuedouble : 0;
    } else {
        return unsupported(err, where, type);
    }
    tok->decs = mt_realloc_or_die(tok->decs, (tok->n_decs + 1) * sizeof *tok->decs);
    tok->decs[tok->n_decs++] = dc;
    return 0;
}

/* ---- added tokens and the id table ---- */

static int cmp_added(const void *pa, const void *pb) {
    const mt_tok_added *a = pa, *b = pb;
    unsigned char ca = (unsigned char)a->content[0], cb = (unsigned char)b->content[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    return a->len > b->len ? -1 : a->len < b->len;  // longest first: leftmost-longest matching
}

static void addedset_finish(mt_tok_addedset *s) {
    if (s->n) qsort(s->tok, s->n, sizeof *s->tok, cmp_added);
    size_t k = 0;
    for (int c = 0; c < 257; c++) {
        while (k < s->n && (unsigned char)s->tok[k].content[0] < c) k++;
        s->bucket[c] = (uint32_t)k;
    }
}

static int parse_added(mt_tokenizer *tok, const cJSON *list, mt_error *err) {
    for (int i = 0; i < cJSON_GetArraySize(list); i++) {
        const cJSON *a = cJSON_GetArrayItem(list, i);
        const char *content = json_str(a, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!content || !*content || !json_id(id))
            return mt_errorf(err, "added_tokens[%d]: needs a non-empty \"content\" and an \"id\" "
                             "in [0, 2^31 - 1)", i);
        if (json_true(a, "single_word") || json_true(a, "lstrip") || json_true(a, "rstrip"))
            return unsupported(err, "added_tokens", "single_word, lstrip or rstrip true");
        mt_tok_addedset *s = json_true(a, "normalized") ? &tok->added_norm : &tok->added_raw;
        s->tok = mt_realloc_or_die(s->tok, (s->n + 1) * sizeof *s->tok);
        mt_tok_added *t = &s->tok[s->n++];
        t->content = dup_str(content, &t->len);
        t->id = (int32_t)id->valuedouble;
        t->special = json_true(a, "special");
    }
    addedset_finish(&tok->added_raw);
    addedset_finish(&tok->added_norm);
    return 0;
}

/* Ids may leave gaps (unused ids), but the id table has one entry per id
 * up to the largest: an id far beyond the number of tokens would make it
 * huge for nothing (2.4 GB for an id of 3e8), so it is refused. */
#define MT_TOK_ID_SLACK 65536

/* id -> spelling, from the vocab and the added tokens (these win). */
static int build_id_table(mt_tokenizer *tok, const cJSON *vocab, mt_error *err) {
    size_t n = 0, entries = 0;
    for (const cJSON *v = vocab->child; v; v = v->next, entries++)
        if ((size_t)v->valuedouble + 1 > n) n = (size_t)v->valuedouble + 1;
    const mt_tok_addedset *sets[2] = {&tok->added_raw, &tok->added_norm};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sets[k]->n; i++, entries++)
            if ((size_t)sets[k]->tok[i].id + 1 > n) n = (size_t)sets[k]->tok[i].id + 1;
    if (n > 2 * entries + MT_TOK_ID_SLACK)
        return mt_errorf(err, "token id %zu is far beyond the %zu tokens of model.vocab and "
                         "added_tokens (ids above %zu are refused); check the file's ids",
                         n - 1, entries, 2 * entries + MT_TOK_ID_SLACK - 1);
    tok->vocab_size = n;
    const char **str = mt_calloc_or_die(n ? n : 1, sizeof *str);
    for (const cJSON *v = vocab->child; v; v = v->next) {
        size_t id = (size_t)v->valuedouble;
        if (str[id]) {
            mt_errorf(err, "model.vocab: \"%s\" and \"%s\" both have id %zu; each token has "
                      "an id of its own", str[id], v->string, id);
            free(str);
            return -1;
        }
        str[id] = v->string;
    }
    tok->id_special = mt_calloc_or_die(n ? n : 1, sizeof *tok->id_special);
    tok->id_exists = mt_calloc_or_die(n ? n : 1, sizeof *tok->id_exists);
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sets[k]->n; i++) {
            str[sets[k]->tok[i].id] = sets[k]->tok[i].content;
            tok->id_special[sets[k]->tok[i].id] = sets[k]->tok[i].special;
        }
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += str[i] ? strlen(str[i]) : 0;
    tok->id_arena = mt_malloc_or_die(total + 1);
    tok->id_off = mt_malloc_or_die((n + 1) * sizeof *tok->id_off);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        tok->id_off[i] = off;
        tok->id_exists[i] = str[i] != NULL;
        size_t len = str[i] ? strlen(str[i]) : 0;
        memcpy(tok->id_arena + off, str[i] ? str[i] : "", len);
        off += len;
    }
    tok->id_off[n] = off;
    free(str);
    return 0;
}

/* ---- SentencePiece chunking ---- */

/* True when s[i..] starts with "▁" and the char before it is not "▁". */
static bool mark_after_other(const char *s, size_t i) {
    const size_t k = MT_TOK_SP_MARK_LEN;
    return i > 0 && memcmp(s + i, MT_TOK_SP_MARK, k) == 0 && (i < k || memcmp(s + i - k, MT_TOK_SP_MARK, k) != 0);
}

static bool has_mark_after_other(const char *s, size_t len) {
    for (size_t i = 1; i + MT_TOK_SP_MARK_LEN <= len; i++)
        if (mark_after_other(s, i)) return true;
    return false;
}

/* Let p be a place in a word where "▁" follows a char c other than "▁".
 * Initial symbols: "▁" is in the vocab, so the "▁" at p is a symbol of its
 * own; a pending <unk> is emitted before it (fuse_unk never joins across p)
 * and byte fallback is per char. So the word's initial symbols are its
 * chunks' initial symbols, concatenated. Merges: the pair (x, y) merges into
 * the vocab token spelled x+y (parse_merges looks it up). Across p, y's
 * spelling starts with "▁" and x's ends with c, or with the end of "<0xNN>"
 * or of the <unk> token; none is "▁" (checked), so x+y would be a token with
 * "▁" after another char, and there is none (checked): no pair across p
 * ever merges. Within a chunk the pair of lowest rank (leftmost on ties) is
 * then the same as alone, so each chunk merges exactly as on its own.
 * ignore_merges is excluded: a chunk that is a token would be emitted whole
 * where the whole word is not. Byte-level vocabularies are excluded: they
 * are pre-tokenized anyway and no corpus test covers them. */
bool mt_tok_sp_chunks_exact(const mt_tokenizer *tok) {
    if (tok->is_bytes || tok->byte_level || tok->ignore_merges) return false;
    if (mt_tok_strmap_get(&tok->vocab, MT_TOK_SP_MARK, MT_TOK_SP_MARK_LEN) < 0) return false;
    const mt_tok_strmap *v = &tok->vocab;
    for (size_t i = 0; i <= v->mask; i++) {
        const mt_tok_strslot *sl = &v->slots[i];
        if (sl->val < 0) continue;
        const char *key = v->arena + sl->off;
        if (has_mark_after_other(key, sl->len)) return false;
        if (sl->val == tok->unk_id && sl->len >= MT_TOK_SP_MARK_LEN &&
            memcmp(key + sl->len - MT_TOK_SP_MARK_LEN, MT_TOK_SP_MARK, MT_TOK_SP_MARK_LEN) == 0)
            return false;
    }
    return true;
}

/* ---- entry points ---- */

static int parse_root(mt_tokenizer *tok, const cJSON *root, mt_error *err) {
    if (!json_null_or_absent(root, "truncation")) return unsupported(err, "truncation", "truncation");
    if (!json_null_or_absent(root, "padding")) return unsupported(err, "padding", "padding");
    const cJSON *c;
    if (!json_null_or_absent(root, "normalizer") &&
        parse_normalizer(tok, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer", err))
        return -1;
    // The pre-tokenizer first: it decides whether vocab keys are ByteLevel text.
    if (!json_null_or_absent(root, "pre_tokenizer") &&
        parse_pretokenizer(tok, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer", err))
        return -1;
    c = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(c)) return mt_errorf(err, "model: missing");
    if (parse_model(tok, c, err)) return -1;
    if (!json_null_or_absent(root, "post_processor") &&
        parse_postprocessor(tok, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), "post_processor", err))
        return -1;
    tok->has_decoder = !json_null_or_absent(root, "decoder");
    if (tok->has_decoder && parse_decoder(tok, cJSON_GetObjectItemCaseSensitive(root, "decoder"), "decoder", err))
        return -1;
    if (parse_added(tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), err)) return -1;
    if (build_id_table(tok, cJSON_GetObjectItemCaseSensitive(c, "vocab"), err)) return -1;
    tok->bos_id = tok->n_prefix ? tok->prefix_ids[0] : -1;
    tok->eos_id = -1;
    tok->sp_chunks = mt_tok_sp_chunks_exact(tok);
    return 0;
}

int mt_tok_parse(mt_tokenizer *tok, const char *json, size_t len, const char *path, mt_error *err) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return mt_errorf(err, "%s: not valid JSON (near byte %zu)", path,
                                (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : 0));
    int rc = parse_root(tok, root, err);
    cJSON_Delete(root);
    if (rc) mt_error_prefix(err, "%s: ", path);
    return rc;
}
