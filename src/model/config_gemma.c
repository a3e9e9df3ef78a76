/* config.json of gemma2 (Gemma 2) and gemma3_text (Gemma 3's text model),
 * read with the defaults of transformers' Gemma2Config and Gemma3TextConfig
 * and written back under their names. What megatrain does not compute is
 * refused by field name. */
#include "model/config_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A soft-cap field: absent, dflt; null, 0 (none); else a positive number. */
static int get_softcap(const cJSON *root, const char *key, double dflt, double *out,
                       const char *src, mt_error *err) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    *out = !it ? dflt : cJSON_IsNull(it) ? 0.0 : it->valuedouble;
    if (it && !cJSON_IsNull(it) && (!cJSON_IsNumber(it) || !(it->valuedouble > 0)))
        return mt_errorf(err, "%s: %s must be a positive number or null (no soft-capping)", src,
                         key);
    return 0;
}

/* Whether layer_types lt is what period p makes: layer i slides iff
 * (i + 1) % p != 0, as sliding_window_pattern builds it. */
static bool has_period(const cJSON *lt, int64_t L, int64_t p) {
    for (int64_t i = 0; i < L; i++) {
        const char *t = cJSON_GetArrayItem(lt, (int)i)->valuestring;
        if (strcmp(t, (i + 1) % p ? "sliding_attention" : "full_attention")) return false;
    }
    return true;
}

/* The period of layer_types: sliding_window_pattern `hint` when it fits (so
 * that what megatrain writes reads back the same), else the smallest; -1 if
 * the list has none. */
static int64_t layer_types_period(const cJSON *lt, int64_t L, int64_t hint) {
    if (hint > 0 && has_period(lt, L, hint)) return hint;
    for (int64_t p = 1; p <= L + 1; p++)
        if (has_period(lt, L, p)) return p;
    return -1;
}

/* Which layers slide: layer_types, else gemma3_text's sliding_window_pattern
 * (6 when absent), else gemma2's alternation (its even layers slide). */
static int parse_layer_types(mt_config *c, const cJSON *root, const char *src, mt_error *err) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    int64_t hint = 0;
    if (c->arch == MT_ARCH_GEMMA3_TEXT &&
        mt_cfg_int(root, "sliding_window_pattern", 6, &hint, src, err))
        return -1;
    if (!lt || cJSON_IsNull(lt)) {
        c->sliding_pattern = c->arch == MT_ARCH_GEMMA2 ? 2 : hint;
        if (c->sliding_pattern < 1)
            return mt_errorf(err, "%s: sliding_window_pattern must be at least 1", src);
        return 0;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->L)
        return mt_errorf(err, "%s: layer_types must list num_hidden_layers (%lld) entries", src,
                         (long long)c->L);
    const cJSON *e;
    cJSON_ArrayForEach(e, lt) {
        if (!cJSON_IsString(e) || (strcmp(e->valuestring, "sliding_attention") &&
                                   strcmp(e->valuestring, "full_attention")))
            return mt_errorf(err, "%s: layer_types may hold \"sliding_attention\" and "
                             "\"full_attention\" only", src);
    }
    c->sliding_pattern = layer_types_period(lt, c->L, hint);
    if (c->sliding_pattern < 0)
        return mt_errorf(err, "%s: layer_types is not periodic; megatrain reads a pattern of "
                         "p - 1 sliding_attention layers then one full_attention layer (as "
                         "sliding_window_pattern = p makes)", src);
    return 0;
}

/* The rope type of rope_parameters object `rp` (field `field`): "default",
 * or "linear" where allow_linear (gemma3_text's global layers). */
static int parse_rope_type(mt_config *c, const cJSON *rp, const char *field, bool allow_linear,
                           const char *src, mt_error *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(rp, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "default";
    if (!strcmp(t, "default")) return 0;
    if (strcmp(t, "linear") || !allow_linear)
        return mt_errorf(err, "%s: %s.rope_type \"%s\" is not supported for model_type \"%s\"; "
                         "megatrain reads \"default\"%s", src, field, t, c->model_type,
                         allow_linear ? " and \"linear\"" : "");
    c->rope_kind = MT_ROPE_LINEAR;
    if (mt_cfg_num(rp, "factor", 1.0, &c->rope_factor, src, err)) return -1;
    if (!(c->rope_factor > 0))
        return mt_errorf(err, "%s: %s.factor must be positive", src, field);
    return 0;
}

/* gemma2: rope_theta (10000), or transformers 5's rope_parameters. */
static int parse_rope_gemma2(mt_config *c, const cJSON *root, const char *src, mt_error *err) {
    if (mt_cfg_num(root, "rope_theta", 10000.0, &c->rope_theta, src, err)) return -1;
    const char *field = "rope_parameters";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!rp || cJSON_IsNull(rp))
        rp = cJSON_GetObjectItemCaseSensitive(root, field = "rope_scaling");
    if (!rp || cJSON_IsNull(rp)) return 0;
    if (!cJSON_IsObject(rp))
        return mt_errorf(err, "%s: field \"%s\" must be an object", src, field);
    return mt_cfg_num(rp, "rope_theta", c->rope_theta, &c->rope_theta, src, err) ||
           parse_rope_type(c, rp, field, false, src, err);
}

/* gemma3_text: rope_theta (1e6, global layers, with rope_scaling) and
 * rope_local_base_freq (10000, sliding layers), or transformers 5's
 * rope_parameters {full_attention, sliding_attention}. */
static int parse_rope_gemma3(mt_config *c, const cJSON *root, const char *src, mt_error *err) {
    if (mt_cfg_num(root, "rope_theta", 1e6, &c->rope_theta, src, err) ||
        mt_cfg_num(root, "rope_local_base_freq", 10000.0, &c->rope_local_theta, src, err))
        return -1;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        const cJSON *slide = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        if (!cJSON_IsObject(rp) || (full && !cJSON_IsObject(full)) ||
            (slide && !cJSON_IsObject(slide)))
            return mt_errorf(err, "%s: rope_parameters must hold the objects full_attention and "
                             "sliding_attention", src);
        if ((full && (mt_cfg_num(full, "rope_theta", c->rope_theta, &c->rope_theta, src, err) ||
                      parse_rope_type(c, full, "rope_parameters.full_attention", true, src,
                                      err))) ||
            (slide &&
             (mt_cfg_num(slide, "rope_theta", c->rope_local_theta, &c->rope_local_theta, src,
                         err) ||
              parse_rope_type(c, slide, "rope_parameters.sliding_attention", false, src, err))))
            return -1;
        return 0;
    }
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return 0;
    if (!cJSON_IsObject(rs))
        return mt_errorf(err, "%s: field \"rope_scaling\" must be an object", src);
    return parse_rope_type(c, rs, "rope_scaling", true, src, err);
}

/* Fields that change the math in a way megatrain does not compute. */
static int refuse_gemma(const mt_config *c, const cJSON *root, const char *src, mt_error *err) {
    bool bias = false, bidir = false;
    double drop = 0, acap = 0;
    if (mt_cfg_bool(root, "attention_bias", false, &bias, src, err) ||
        mt_cfg_bool(root, "use_bidirectional_attention", false, &bidir, src, err) ||
        mt_cfg_num(root, "attention_dropout", 0.0, &drop, src, err))
        return -1;
    if (bias)
        return mt_errorf(err, "%s: attention_bias = true is not supported for model_type \"%s\" "
                         "(the published Gemma models have no biases); set it to false", src,
                         c->model_type);
    if (bidir)
        return mt_errorf(err, "%s: use_bidirectional_attention = true is not supported "
                         "(megatrain trains causal decoders); set it to false", src);
    if (drop != 0)
        return mt_errorf(err, "%s: attention_dropout = %g is not supported (megatrain trains "
                         "without dropout); set it to 0.0", src, drop);
    if (c->arch == MT_ARCH_GEMMA3_TEXT &&
        (get_softcap(root, "attn_logit_softcapping", 0.0, &acap, src, err) || acap != 0))
        return mt_errorf(err, "%s: attn_logit_softcapping is set on model_type \"gemma3_text\", "
                         "whose attention transformers computes without it; set it to null",
                         src);
    return 0;
}

/* What Gemma 2 and Gemma 3 add to the fields mt_config_parse read, and the
 * defaults of their config classes where those differ from the common ones. */
int mt_config_parse_gemma(mt_config *c, const cJSON *root, const char *src, mt_error *err) {
    bool g3 = c->arch == MT_ARCH_GEMMA3_TEXT;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_activation");
    c->act = MT_ACT_GELU_TANH; /* gelu_pytorch_tanh when absent */
    if (act && mt_cfg_gelu(c, root, "hidden_activation", src, err)) return -1;
    if (mt_cfg_int(root, "num_key_value_heads", 4, &c->NKV, src, err) ||
        mt_cfg_int(root, "head_dim", 256, &c->HD, src, err) ||
        mt_cfg_int(root, "max_position_embeddings", g3 ? 131072 : 8192, &c->max_pos, src, err) ||
        mt_cfg_bool(root, "tie_word_embeddings", true, &c->tie_embeddings, src, err) ||
        mt_cfg_num(root, "query_pre_attn_scalar", 256, &c->query_pre_attn_scalar, src, err) ||
        mt_cfg_int(root, "sliding_window", 4096, &c->sliding_window, src, err) ||
        get_softcap(root, "final_logit_softcapping", g3 ? 0.0 : 30.0, &c->final_softcap, src,
                    err) ||
        (!g3 && get_softcap(root, "attn_logit_softcapping", 50.0, &c->attn_softcap, src, err)) ||
        refuse_gemma(c, root, src, err) || parse_layer_types(c, root, src, err))
        return -1;
    /* Gemma2Config and Gemma3TextConfig: bos 2, eos 1, pad 0 when absent */
    if (mt_cfg_pad_token(c, root, 0, src, err)) return -1;
    if (!cJSON_GetObjectItemCaseSensitive(root, "bos_token_id")) c->bos_id = 2;
    if (!cJSON_GetObjectItemCaseSensitive(root, "eos_token_id")) c->eos_id = 1;
    if (!(c->query_pre_attn_scalar > 0))
        return mt_errorf(err, "%s: query_pre_attn_scalar must be positive", src);
    if (c->sliding_window < 1)
        return mt_errorf(err, "%s: sliding_window must be a positive number of keys", src);
    c->qk_norm = g3;
    c->qkv_bias = false;
    return g3 ? parse_rope_gemma3(c, root, src, err) : parse_rope_gemma2(c, root, src, err);
}

bool mt_config_block_slides(const mt_config *c, int64_t i) {
    return mt_arch_is_gemma(c->arch) && c->sliding_pattern > 0 && (i + 1) % c->sliding_pattern;
}

/* A number transformers types as an int when it is one (query_pre_attn_scalar). */
static void add_int_or_float(cJSON *r, const char *key, double v) {
    if (v == floor(v) && fabs(v) < 9e15) cJSON_AddNumberToObject(r, key, v);
    else mt_cfg_add_float(r, key, v);
}

static void add_softcap(cJSON *r, const char *key, double cap) {
    if (cap > 0) mt_cfg_add_float(r, key, cap);
    else cJSON_AddNullToObject(r, key);
}

/* The rotary fields under transformers 4's names, which transformers 5
 * converts on load (Gemma 3: rope_theta and rope_scaling are the global
 * layers', rope_local_base_freq the sliding ones'). */
static void gemma_rope_to_json(const mt_config *c, cJSON *r) {
    mt_cfg_add_float(r, "rope_theta", c->rope_theta);
    if (c->arch != MT_ARCH_GEMMA3_TEXT) return;
    mt_cfg_add_float(r, "rope_local_base_freq", c->rope_local_theta);
    if (c->rope_kind != MT_ROPE_LINEAR) {
        cJSON_AddNullToObject(r, "rope_scaling");
        return;
    }
    cJSON *s = cJSON_AddObjectToObject(r, "rope_scaling");
    cJSON_AddStringToObject(s, "rope_type", "linear");
    mt_cfg_add_float(s, "factor", c->rope_factor);
}

void mt_config_gemma_to_json(const mt_config *c, cJSON *r) {
    bool g3 = c->arch == MT_ARCH_GEMMA3_TEXT;
    mt_cfg_add_head(c, r, g3 ? "Gemma3ForCausalLM" : "Gemma2ForCausalLM");
    const char *ints[] = {"num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                          "max_position_embeddings", "sliding_window"};
    const int64_t vals[] = {c->NKV, c->HD, c->F, c->V, c->max_pos, c->sliding_window};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        cJSON_AddNumberToObject(r, ints[i], (double)vals[i]);
    mt_cfg_add_number(r, "rms_norm_eps", c->rms_eps, true);
    cJSON_AddStringToObject(r, "hidden_activation",
                            c->act == MT_ACT_GELU ? "gelu" : "gelu_pytorch_tanh");
    add_int_or_float(r, "query_pre_attn_scalar", c->query_pre_attn_scalar);
    add_softcap(r, "attn_logit_softcapping", c->attn_softcap);
    add_softcap(r, "final_logit_softcapping", c->final_softcap);
    if (g3) cJSON_AddNumberToObject(r, "sliding_window_pattern", (double)c->sliding_pattern);
    cJSON *lt = cJSON_AddArrayToObject(r, "layer_types");
    for (int64_t i = 0; i < c->L; i++)
        cJSON_AddItemToArray(lt, cJSON_CreateString(mt_config_block_slides(c, i)
                                                        ? "sliding_attention"
                                                        : "full_attention"));
    cJSON_AddBoolToObject(r, "attention_bias", false);
    mt_cfg_add_float(r, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_embeddings);
    mt_cfg_add_pad_token(c, r);
    gemma_rope_to_json(c, r);
}

void mt_config_gemma_defaults(mt_config *c, bool gemma3) {
    c->arch = gemma3 ? MT_ARCH_GEMMA3_TEXT : MT_ARCH_GEMMA2;
    snprintf(c->model_type, sizeof c->model_type, "%s", gemma3 ? "gemma3_text" : "gemma2");
    c->act = MT_ACT_GELU_TANH;
    c->rms_eps = 1e-6f;
    c->query_pre_attn_scalar = (double)c->HD;
    c->qkv_bias = false;
    c->qk_norm = gemma3;
    c->layernorm = c->parallel_residual = c->attn_bias = false;
    c->rotary_dim = 0;
    c->attn_softcap = gemma3 ? 0.0 : 50.0;
    c->final_softcap = gemma3 ? 0.0 : 30.0;
    c->sliding_window = gemma3 ? 512 : 4096;
    c->sliding_pattern = gemma3 ? 6 : 2;
    c->rope_local_theta = gemma3 ? 10000.0 : 0.0;
    c->has_pad = false; /* written as null: the config classes' 0 would be a pad token */
    c->pad_id = -1;
}
