/* Typed config.json fields and Python-style floats (config_internal.h). */
#include "model/config_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The field `key` when it holds a value; NULL when absent or null. */
static const cJSON *given(const cJSON *root, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

/* Reads an integer field. Missing: *out = dflt, or an error if dflt < 0
 * means "required". */
int mt_cfg_int(const cJSON *root, const char *key, int64_t dflt, int64_t *out, const char *src,
               mt_error *err) {
    const cJSON *it = given(root, key);
    if (!it) {
        if (dflt == -1)
            return mt_errorf(err, "%s: required field \"%s\" is missing; add it to config.json",
                             src, key);
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        fabs(it->valuedouble) > 9.0e15)
        return mt_errorf(err, "%s: field \"%s\" must be an integer", src, key);
    *out = (int64_t)it->valuedouble;
    return 0;
}

int mt_cfg_num(const cJSON *root, const char *key, double dflt, double *out, const char *src,
               mt_error *err) {
    const cJSON *it = given(root, key);
    if (it && !cJSON_IsNumber(it))
        return mt_errorf(err, "%s: field \"%s\" must be a number", src, key);
    *out = it ? it->valuedouble : dflt;
    return 0;
}

int mt_cfg_bool(const cJSON *root, const char *key, bool dflt, bool *out, const char *src,
                mt_error *err) {
    const cJSON *it = given(root, key);
    if (it && !cJSON_IsBool(it))
        return mt_errorf(err, "%s: field \"%s\" must be true or false", src, key);
    *out = it ? cJSON_IsTrue(it) : dflt;
    return 0;
}

/* The GELU of the field `key` (gpt_neox: hidden_act, falcon: activation,
 * gemma: hidden_activation), "gelu" when absent. */
int mt_cfg_gelu(mt_config *cfg, const cJSON *root, const char *key, const char *src,
                mt_error *err) {
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, key);
    const char *a = act && cJSON_IsString(act) ? act->valuestring : act ? "" : "gelu";
    if (!strcmp(a, "gelu")) cfg->act = MT_ACT_GELU;
    else if (!strcmp(a, "gelu_new") || !strcmp(a, "gelu_fast") || !strcmp(a, "gelu_pytorch_tanh"))
        cfg->act = MT_ACT_GELU_TANH;
    else
        return mt_errorf(err, "%s: %s \"%s\" is not supported for model_type \"%s\"; "
                         "megatrain implements \"gelu\" and the tanh forms \"gelu_new\", "
                         "\"gelu_fast\", \"gelu_pytorch_tanh\"", src, key, a, cfg->model_type);
    return 0;
}

int mt_cfg_token_id(const cJSON *root, const char *key, int64_t *out, const char *src,
                    mt_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = -1;
    if (!it || cJSON_IsNull(it)) return 0;
    if (cJSON_IsArray(it)) it = cJSON_GetArrayItem(it, 0);
    if (!it) return 0;
    /* the same range as mt_cfg_int: a double beyond int64 is undefined to convert */
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        fabs(it->valuedouble) > 9.0e15)
        return mt_errorf(err, "%s: field \"%s\" must be an integer", src, key);
    *out = (int64_t)it->valuedouble;
    return 0;
}

int mt_cfg_pad_token(mt_config *cfg, const cJSON *root, int64_t dflt, const char *src,
                     mt_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "pad_token_id");
    cfg->has_pad = it ? !cJSON_IsNull(it) : dflt >= 0;
    cfg->pad_id = it ? -1 : dflt >= 0 ? dflt : -1;
    if (!it || cJSON_IsNull(it)) return 0;
    /* the same range as mt_cfg_int: a double beyond int64 is undefined to convert */
    if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) ||
        fabs(it->valuedouble) > 9.0e15)
        return mt_errorf(err, "%s: field \"pad_token_id\" must be an integer or null", src);
    cfg->pad_id = (int64_t)it->valuedouble;
    return 0;
}

/* null, not absent, when there is none: Phi3Config's default is 32000 and
 * Gemma's 0. */
void mt_cfg_add_pad_token(const mt_config *cfg, cJSON *r) {
    if (cfg->has_pad) cJSON_AddNumberToObject(r, "pad_token_id", (double)cfg->pad_id);
    else cJSON_AddNullToObject(r, "pad_token_id");
}

/* A float that reads back as one, as Python's repr writes it: the fewest
 * digits that give v back (as an fp32 when single: rms_norm_eps 1e-05, not
 * 9.99999974737875e-06), positional from 1e-4 to 1e16 (500000.0), else
 * with an exponent. transformers 5 checks the types of config fields, and
 * refuses 0 where it wants 0.0. */
void mt_cfg_number_text(char buf[48], double v, bool single) {
    int digits = 1;
    for (; digits < 17; digits++) {
        snprintf(buf, 48, "%.*e", digits - 1, v);
        double back = strtod(buf, NULL);
        if (single ? (float)back == (float)v : back == v) break;
    }
    snprintf(buf, 48, "%.*e", digits - 1, v);
    const char *e = strchr(buf, 'e');
    int exp10 = e ? atoi(e + 1) : 0;
    if (exp10 >= -4 && exp10 < 16) {
        snprintf(buf, 48, "%.*f", digits - 1 - exp10 > 0 ? digits - 1 - exp10 : 0, v);
        if (!strpbrk(buf, ".n")) strcat(buf, ".0");
    }
}

void mt_cfg_add_number(cJSON *r, const char *key, double v, bool single) {
    char buf[48];
    mt_cfg_number_text(buf, v, single);
    cJSON_AddRawToObject(r, key, buf);
}

void mt_cfg_add_float(cJSON *r, const char *key, double v) {
    mt_cfg_add_number(r, key, v, false);
}

void mt_cfg_add_head(const mt_config *c, cJSON *r, const char *cls) {
    cJSON *a = cJSON_AddArrayToObject(r, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(cls));
    cJSON_AddStringToObject(r, "model_type", c->model_type);
    cJSON_AddNumberToObject(r, "hidden_size", (double)c->C);
    cJSON_AddNumberToObject(r, "num_hidden_layers", (double)c->L);
    cJSON_AddNumberToObject(r, "num_attention_heads", (double)c->NH);
}
