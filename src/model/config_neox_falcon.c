/* config.json of gpt_neox (Pythia, GPT-NeoX-20B) and falcon (Falcon-7B, and
 * the new decoder architecture of Falcon-40B/180B): the fields each adds to
 * the common ones, with the defaults of transformers' GPTNeoXConfig and
 * FalconConfig, read and written under their own names; what megatrain does
 * not compute is refused by field name. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "model/config.h"
#include "model/config_internal.h"

/* The rotary fields of gpt_neox: transformers 4 writes rotary_emb_base and
 * rotary_pct at the top level, transformers 5 rope_parameters {rope_theta,
 * partial_rotary_factor}, which win over the legacy fields as in
 * GPTNeoXConfig.convert_rope_params_to_dict. */
static int parse_neox_rope(mt_config *cfg, const cJSON *root, const char *src, mt_error *err) {
    double pct = 0.25;
    if (mt_cfg_num(root, "rotary_emb_base", 10000.0, &cfg->rope_theta, src, err) ||
        mt_cfg_num(root, "rotary_pct", 0.25, &pct, src, err))
        return -1;
    const char *field = "rope_parameters";
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!rp || cJSON_IsNull(rp)) rp = cJSON_GetObjectItemCaseSensitive(root, field = "rope_scaling");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            return mt_errorf(err, "%s: field \"%s\" must be an object", src, field);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
        if (!type) type = cJSON_GetObjectItemCaseSensitive(rp, "type");
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "default")))
            return mt_errorf(err, "%s: %s.rope_type must be \"default\" for model_type "
                             "\"gpt_neox\"; megatrain does not implement scaled rotary "
                             "embeddings for it", src, field);
        if (mt_cfg_num(rp, "rope_theta", cfg->rope_theta, &cfg->rope_theta, src, err) ||
            mt_cfg_num(rp, "partial_rotary_factor", pct, &pct, src, err))
            return -1;
    }
    double dims = (double)cfg->HD * pct; /* transformers: int(head_size * rotary_pct) */
    cfg->rotary_dim = dims >= 0 && dims <= (double)cfg->HD ? (int64_t)dims : -1;
    if (cfg->rotary_dim < 2 || cfg->rotary_dim % 2)
        return mt_errorf(err, "%s: rotary_pct %g of head size %lld gives %lld rotary dims; "
                         "megatrain needs an even number in 2..head size", src, pct,
                         (long long)cfg->HD, (long long)cfg->rotary_dim);
    return 0;
}

/* hidden_dropout and attention_dropout must be 0 (absent: 0, as in both
 * GPTNeoXConfig and FalconConfig). */
static int refuse_dropout(const cJSON *root, const char *src, mt_error *err) {
    const char *dropouts[] = {"hidden_dropout", "attention_dropout"};
    for (size_t i = 0; i < 2; i++) {
        double drop = 0;
        if (mt_cfg_num(root, dropouts[i], 0.0, &drop, src, err)) return -1;
        if (drop != 0)
            return mt_errorf(err, "%s: %s = %g is not supported (megatrain trains without "
                             "dropout); set it to 0.0", src, dropouts[i], drop);
    }
    return 0;
}

/* What gpt_neox adds to the common fields, with GPTNeoXConfig's defaults;
 * what megatrain does not compute is refused by field name. */
int mt_config_parse_gpt_neox(mt_config *cfg, const cJSON *root, const char *src, mt_error *err) {
    double eps = 0;
    if (mt_cfg_num(root, "layer_norm_eps", 1e-5, &eps, src, err) ||
        mt_cfg_bool(root, "use_parallel_residual", true, &cfg->parallel_residual, src, err) ||
        mt_cfg_bool(root, "attention_bias", true, &cfg->attn_bias, src, err))
        return -1;
    cfg->rms_eps = (float)eps;
    cfg->layernorm = true;
    cfg->qkv_bias = false; /* the fused qkv's bias is attn_bias */
    if (cfg->tie_embeddings)
        return mt_errorf(err, "%s: tie_word_embeddings = true is not supported for model_type "
                         "\"gpt_neox\" (Pythia and GPT-NeoX keep embed_out untied); set it "
                         "to false", src);
    if (mt_cfg_gelu(cfg, root, "hidden_act", src, err) || refuse_dropout(root, src, err))
        return -1;
    int64_t nkv = cfg->NH, hd = cfg->C / cfg->NH;
    if (mt_cfg_int(root, "num_key_value_heads", cfg->NH, &nkv, src, err) ||
        mt_cfg_int(root, "head_dim", hd, &hd, src, err))
        return -1;
    if (nkv != cfg->NH || hd != cfg->C / cfg->NH || cfg->C % cfg->NH)
        return mt_errorf(err, "%s: gpt_neox has num_attention_heads heads of hidden_size / "
                         "num_attention_heads dims each; remove num_key_value_heads and "
                         "head_dim, and make hidden_size a multiple of the heads", src);
    cfg->HD = hd;
    return parse_neox_rope(cfg, root, src, err);
}

/* What falcon adds to the common fields, with FalconConfig's defaults
 * (transformers 5); what megatrain does not compute is refused by field
 * name. Two architectures: Falcon-7B's (one LayerNorm, multi_query: one
 * kv head) and new_decoder_architecture (ln_attn and ln_mlp, num_kv_heads
 * grouped kv heads); both run attention and MLP in parallel. */
int mt_config_parse_falcon(mt_config *cfg, const cJSON *root, const char *src, mt_error *err) {
    double eps = 0;
    bool mq = true, par = true, alibi = false, bias = false;
    int64_t nkv = cfg->NH, nln = 0, hd = 0;
    if (mt_cfg_int(root, "ffn_hidden_size", 4 * cfg->C, &cfg->F, src, err) ||
        mt_cfg_num(root, "layer_norm_epsilon", 1e-5, &eps, src, err) ||
        mt_cfg_bool(root, "tie_word_embeddings", true, &cfg->tie_embeddings, src, err) ||
        mt_cfg_bool(root, "new_decoder_architecture", false, &cfg->new_decoder, src, err) ||
        mt_cfg_bool(root, "multi_query", true, &mq, src, err) ||
        mt_cfg_bool(root, "parallel_attn", true, &par, src, err) ||
        mt_cfg_bool(root, "alibi", false, &alibi, src, err) ||
        mt_cfg_bool(root, "bias", false, &bias, src, err) ||
        mt_cfg_int(root, "num_kv_heads", cfg->NH, &nkv, src, err) ||
        mt_cfg_int(root, "num_ln_in_parallel_attn", cfg->new_decoder ? 2 : 1, &nln, src, err) ||
        mt_cfg_int(root, "head_dim", cfg->C / cfg->NH, &hd, src, err) ||
        mt_cfg_gelu(cfg, root, "activation", src, err) || refuse_dropout(root, src, err))
        return -1;
    /* FalconConfig's bos_token_id and eos_token_id are 11 when absent */
    const char *ids[] = {"bos_token_id", "eos_token_id"};
    int64_t *id_out[] = {&cfg->bos_id, &cfg->eos_id};
    for (size_t i = 0; i < 2; i++)
        if (!cJSON_GetObjectItemCaseSensitive(root, ids[i])) *id_out[i] = 11;
    if (alibi)
        return mt_errorf(err, "%s: alibi = true is not supported for model_type \"falcon\" "
                         "(megatrain computes rotary position embeddings, not ALiBi's "
                         "attention biases); set it to false", src);
    if (bias)
        return mt_errorf(err, "%s: bias = true is not supported for model_type \"falcon\" "
                         "(biases on query_key_value, dense and the MLP are not implemented); "
                         "set it to false", src);
    if (!par)
        return mt_errorf(err, "%s: parallel_attn = false is not supported for model_type "
                         "\"falcon\" (megatrain runs attention and MLP in parallel, as "
                         "Falcon-7B/40B/180B do); set it to true", src);
    if (!cfg->new_decoder && !mq)
        return mt_errorf(err, "%s: multi_query = false without new_decoder_architecture is not "
                         "supported for model_type \"falcon\" (megatrain reads Falcon-7B's one "
                         "kv head, or new_decoder_architecture's num_kv_heads); set one of them "
                         "to true", src);
    if (nln != (cfg->new_decoder ? 2 : 1))
        return mt_errorf(err, "%s: num_ln_in_parallel_attn = %lld is not supported for "
                         "new_decoder_architecture = %s; megatrain reads %s", src,
                         (long long)nln, cfg->new_decoder ? "true" : "false",
                         cfg->new_decoder ? "2 (ln_attn and ln_mlp)" : "1 (input_layernorm)");
    cfg->NKV = cfg->new_decoder ? nkv : 1;
    if (cfg->C % cfg->NH || hd != cfg->C / cfg->NH)
        return mt_errorf(err, "%s: falcon has num_attention_heads heads of hidden_size / "
                         "num_attention_heads dims each; remove head_dim and make hidden_size a "
                         "multiple of the heads", src);
    if (cfg->NKV < 1 || cfg->NH % cfg->NKV)
        return mt_errorf(err, "%s: num_kv_heads = %lld must divide num_attention_heads = %lld",
                         src, (long long)cfg->NKV, (long long)cfg->NH);
    cfg->HD = hd;
    cfg->rms_eps = (float)eps;
    cfg->layernorm = true;
    cfg->parallel_residual = true;
    cfg->attn_bias = false;
    cfg->qkv_bias = cfg->qk_norm = false;
    cfg->rotary_dim = 0; /* the whole head */
    return mt_config_parse_rope(cfg, root, src, err);
}

/* gpt_neox under the names of a transformers 4 config.json (Pythia's);
 * transformers 5 converts rotary_pct and rotary_emb_base on load. */
void mt_config_neox_to_json(const mt_config *c, cJSON *r) {
    mt_cfg_add_head(c, r, "GPTNeoXForCausalLM");
    cJSON_AddNumberToObject(r, "intermediate_size", (double)c->F);
    cJSON_AddNumberToObject(r, "vocab_size", (double)c->V);
    cJSON_AddNumberToObject(r, "max_position_embeddings", (double)c->max_pos);
    mt_cfg_add_number(r, "layer_norm_eps", c->rms_eps, true);
    cJSON_AddStringToObject(r, "hidden_act", c->act == MT_ACT_GELU ? "gelu" : "gelu_new");
    cJSON_AddBoolToObject(r, "use_parallel_residual", c->parallel_residual);
    cJSON_AddBoolToObject(r, "attention_bias", c->attn_bias);
    mt_cfg_add_float(r, "rotary_pct", (double)c->rotary_dim / (double)c->HD);
    mt_cfg_add_float(r, "rotary_emb_base", c->rope_theta);
    mt_cfg_add_float(r, "hidden_dropout", 0.0);
    mt_cfg_add_float(r, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", false);
}

/* falcon under FalconConfig's names. */
void mt_config_falcon_to_json(const mt_config *c, cJSON *r) {
    mt_cfg_add_head(c, r, "FalconForCausalLM");
    cJSON_AddBoolToObject(r, "new_decoder_architecture", c->new_decoder);
    cJSON_AddBoolToObject(r, "multi_query", true);
    if (c->new_decoder) {
        cJSON_AddNumberToObject(r, "num_kv_heads", (double)c->NKV);
        cJSON_AddNumberToObject(r, "num_ln_in_parallel_attn", 2);
    }
    cJSON_AddBoolToObject(r, "parallel_attn", true);
    cJSON_AddBoolToObject(r, "bias", false);
    cJSON_AddBoolToObject(r, "alibi", false);
    cJSON_AddNumberToObject(r, "ffn_hidden_size", (double)c->F);
    cJSON_AddNumberToObject(r, "vocab_size", (double)c->V);
    cJSON_AddNumberToObject(r, "max_position_embeddings", (double)c->max_pos);
    mt_cfg_add_number(r, "layer_norm_epsilon", c->rms_eps, true);
    cJSON_AddStringToObject(r, "activation", c->act == MT_ACT_GELU ? "gelu" : "gelu_new");
    mt_cfg_add_float(r, "hidden_dropout", 0.0);
    mt_cfg_add_float(r, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_embeddings);
    mt_config_rope_to_json(c, r);
}

void mt_config_neox_defaults(mt_config *c) {
    c->arch = MT_ARCH_GPT_NEOX;
    snprintf(c->model_type, sizeof c->model_type, "gpt_neox");
    c->NKV = c->NH;
    c->rms_eps = 1e-5f;
    c->layernorm = true;
    c->parallel_residual = true;
    c->attn_bias = true;
    c->act = MT_ACT_GELU;
    c->tie_embeddings = false;
    c->qkv_bias = c->qk_norm = false;
    int64_t r = c->HD / 4;
    c->rotary_dim = r < 2 ? 2 : r - r % 2;
}

void mt_config_falcon_defaults(mt_config *c, bool new_decoder) {
    c->arch = MT_ARCH_FALCON;
    snprintf(c->model_type, sizeof c->model_type, "falcon");
    c->new_decoder = new_decoder;
    if (!new_decoder) c->NKV = 1;
    c->rms_eps = 1e-5f;
    c->layernorm = true;
    c->parallel_residual = true;
    c->attn_bias = false;
    c->act = MT_ACT_GELU;
    c->qkv_bias = c->qk_norm = false;
    c->rotary_dim = 0;
}
