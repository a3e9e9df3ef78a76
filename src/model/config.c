/* config.json parsing and writing: the fields every model_type shares, and
 * the Llama family's (llama, mistral, qwen2, qwen3, phi3). What each other
 * part adds lives beside it: the rotary fields in config_rope.c, phi3's own
 * fields and longrope in config_phi3.c, the experts of mixtral, qwen2_moe
 * and qwen3_moe in config_moe.c, gpt_neox and falcon in
 * config_neox_falcon.c, gemma2 and gemma3_text in config_gemma.c.
 *
 * Accepts both the transformers 4 layout (rope_theta + rope_scaling) and the
 * transformers 5 layout (rope_parameters). Anything that would change the
 * math in a way megatrain does not implement is refused, naming the field.
 * A field that is absent takes the default of transformers' config class
 * for that model_type, as from_pretrained would. */
#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file.h"
#include "model/config_internal.h"
#include "util/mem.h"

/* Features that exist in these configs but that megatrain does not compute
 * must be off; each check names the field so the user knows what to change. */
static int refuse_unsupported(const mt_config *cfg, const cJSON *root, const char *src,
                              mt_error *err) {
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return mt_errorf(err, "%s: hidden_act must be \"silu\" (SwiGLU); megatrain does not "
                         "implement other activations", src);
    bool b = false;
    if (cfg->arch != MT_ARCH_QWEN2 && cfg->arch != MT_ARCH_QWEN2_MOE) {
        if (mt_cfg_bool(root, "attention_bias", false, &b, src, err)) return -1;
        if (b) return mt_errorf(err, "%s: attention_bias = true is not supported for model_type "
                                "\"%s\"", src, cfg->model_type);
    }
    if (mt_cfg_bool(root, "mlp_bias", false, &b, src, err)) return -1;
    if (b) return mt_errorf(err, "%s: mlp_bias = true is not supported", src);
    if (mt_cfg_bool(root, "use_sliding_window", false, &b, src, err)) return -1;
    if (b && cfg->arch != MT_ARCH_MISTRAL && cfg->arch != MT_ARCH_MIXTRAL)
        return mt_errorf(err, "%s: use_sliding_window = true is not supported; set it to false "
                         "(full attention)", src);
    double prf = 1.0;
    if (mt_cfg_num(root, "partial_rotary_factor", 1.0, &prf, src, err)) return -1;
    if (prf != 1.0) return mt_errorf(err, "%s: partial_rotary_factor %g is not supported "
                                     "(only 1.0)", src, prf);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (lt && cJSON_IsArray(lt)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, lt) {
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
                return mt_errorf(err, "%s: layer_types may only hold \"full_attention\"; "
                                 "sliding-window layers are not supported", src);
        }
    }
    if (mt_config_is_moe(cfg)) return 0;
    const char *moe[] = {"num_experts", "num_local_experts", "n_routed_experts"};
    for (size_t i = 0; i < sizeof moe / sizeof *moe; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, moe[i]);
        if (e && cJSON_IsNumber(e) && e->valuedouble > 0 && !mt_arch_has_experts(cfg->arch))
            return mt_errorf(err, "%s: %s is set on model_type \"%s\", which has no experts; "
                             "megatrain reads mixture-of-experts models as model_type "
                             "\"mixtral\", \"qwen2_moe\" or \"qwen3_moe\"", src, moe[i],
                             cfg->model_type);
    }
    return 0;
}

/* The first key given twice in an object of j (at any depth), as a path
 * ("rope_scaling.factor") into buf; false if none. cJSON keeps both and
 * reads the first where Python's json (transformers) keeps the last: the
 * two would build different models from one file. */
static bool duplicate_key(const cJSON *j, char *buf, size_t cap) {
    for (const cJSON *a = j ? j->child : NULL; a; a = a->next) {
        if (cJSON_IsObject(j))
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(a->string, b->string)) {
                    snprintf(buf, cap, "%s", a->string);
                    return true;
                }
        char inner[256];
        if ((cJSON_IsObject(a) || cJSON_IsArray(a)) && duplicate_key(a, inner, sizeof inner)) {
            snprintf(buf, cap, "%s.%s", cJSON_IsObject(j) ? a->string : "[]", inner);
            return true;
        }
    }
    return false;
}

/* cfg->arch and cfg->model_type from config.json's model_type. */
static int set_model_type(mt_config *cfg, const char *type, const char *src, mt_error *err) {
    const char *types[] = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe",
                           "qwen3_moe", "gpt_neox", "falcon", "phi3", "gemma2", "gemma3_text"};
    const mt_arch archs[] = {MT_ARCH_LLAMA, MT_ARCH_MISTRAL, MT_ARCH_QWEN2, MT_ARCH_QWEN3,
                             MT_ARCH_MIXTRAL, MT_ARCH_QWEN2_MOE, MT_ARCH_QWEN3_MOE,
                             MT_ARCH_GPT_NEOX, MT_ARCH_FALCON, MT_ARCH_PHI3, MT_ARCH_GEMMA2,
                             MT_ARCH_GEMMA3_TEXT};
    int found = -1;
    for (int i = 0; i < (int)(sizeof types / sizeof *types); i++)
        if (!strcmp(type, types[i])) found = i;
    if (found < 0 && !strcmp(type, "gemma3"))
        return mt_errorf(err, "%s: model_type \"gemma3\" (Gemma 3 with its vision tower) is not "
                         "supported; megatrain trains its text model, model_type "
                         "\"gemma3_text\" (the config.json of gemma-3-1b, or text_config of the "
                         "larger ones)", src);
    if (found < 0)
        return mt_errorf(err, "%s: model_type \"%s\" is not supported; megatrain trains llama, "
                         "mistral, qwen2, qwen3, phi3, mixtral, qwen2_moe, qwen3_moe, gpt_neox, "
                         "falcon, gemma2 and gemma3_text", src, type);
    cfg->arch = archs[found];
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", types[found]);
    return 0;
}

int mt_config_parse(mt_config *cfg, const char *json_text, const char *src, mt_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_Parse(json_text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return mt_errorf(err, "%s: not a JSON object (is this a Hugging Face config.json?)", src);
    }
    char dup[300];
    if (duplicate_key(root, dup, sizeof dup)) {
        cJSON_Delete(root);
        return mt_errorf(err, "%s: the key \"%s\" is given twice; transformers would take the "
                         "last value, megatrain the first: keep one", src, dup);
    }
    int rc = -1;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) {
        mt_errorf(err, "%s: required field \"model_type\" is missing or not a string", src);
        goto out;
    }
    if (set_model_type(cfg, mt->valuestring, src, err)) goto out;

    double eps = 0;
    /* falcon names its MLP size ffn_hidden_size (parse_falcon) */
    bool falcon = cfg->arch == MT_ARCH_FALCON, phi3 = cfg->arch == MT_ARCH_PHI3;
    cfg->has_pad = false;
    cfg->pad_id = -1;
    /* Phi3Config's defaults: 4096 positions, eps 1e-5 */
    if (mt_cfg_int(root, "hidden_size", -1, &cfg->C, src, err) ||
        mt_cfg_int(root, "num_hidden_layers", -1, &cfg->L, src, err) ||
        mt_cfg_int(root, "num_attention_heads", -1, &cfg->NH, src, err) ||
        (!falcon && mt_cfg_int(root, "intermediate_size", -1, &cfg->F, src, err)) ||
        mt_cfg_int(root, "vocab_size", -1, &cfg->V, src, err) ||
        mt_cfg_int(root, "num_key_value_heads", cfg->NH, &cfg->NKV, src, err) ||
        mt_cfg_int(root, "max_position_embeddings", phi3 ? 4096 : 2048, &cfg->max_pos, src, err) ||
        mt_cfg_num(root, "rms_norm_eps", phi3 ? 1e-5 : 1e-6, &eps, src, err) ||
        mt_cfg_bool(root, "tie_word_embeddings", false, &cfg->tie_embeddings, src, err) ||
        mt_cfg_token_id(root, "bos_token_id", &cfg->bos_id, src, err) ||
        mt_cfg_token_id(root, "eos_token_id", &cfg->eos_id, src, err))
        goto out;
    cfg->rms_eps = (float)eps;
    if (cfg->NH <= 0) {
        mt_errorf(err, "%s: num_attention_heads must be positive", src);
        goto out;
    }
    if (mt_cfg_int(root, "head_dim", cfg->C / cfg->NH, &cfg->HD, src, err)) goto out;
    mt_arch a = cfg->arch;
    if (a == MT_ARCH_MISTRAL || a == MT_ARCH_QWEN2 || a == MT_ARCH_MIXTRAL || a == MT_ARCH_PHI3) {
        if (mt_cfg_int(root, "sliding_window", 0, &cfg->sliding_window, src, err)) goto out;
    }
    if (a == MT_ARCH_QWEN2) {
        bool sw = false;
        if (mt_cfg_bool(root, "use_sliding_window", false, &sw, src, err)) goto out;
        if (!sw) cfg->sliding_window = 0;
    }
    cfg->qkv_bias = a == MT_ARCH_QWEN2;
    /* Qwen2MoeConfig.qkv_bias, true by default (Qwen1.5-MoE has the biases) */
    if (a == MT_ARCH_QWEN2_MOE && mt_cfg_bool(root, "qkv_bias", true, &cfg->qkv_bias, src, err))
        goto out;
    cfg->qk_norm = a == MT_ARCH_QWEN3 || a == MT_ARCH_QWEN3_MOE;
    if (mt_arch_has_experts(a) && mt_config_parse_moe(cfg, root, src, err)) goto out;
    if (a == MT_ARCH_GPT_NEOX) {
        if (mt_config_parse_gpt_neox(cfg, root, src, err)) goto out;
    } else if (a == MT_ARCH_FALCON) {
        if (mt_config_parse_falcon(cfg, root, src, err)) goto out;
    } else if (mt_arch_is_gemma(a)) {
        if (mt_config_parse_gemma(cfg, root, src, err)) goto out;
    } else if ((a == MT_ARCH_PHI3 ? mt_config_parse_phi3(cfg, root, src, err)
                                  : mt_cfg_pad_token(cfg, root, -1, src, err)) ||
               mt_config_parse_rope(cfg, root, src, err) || refuse_unsupported(cfg, root, src, err)) {
        goto out;
    }
    rc = mt_config_validate(cfg, src, err);
out:
    cJSON_Delete(root);
    return rc;
}

int mt_config_validate(const mt_config *c, const char *src, mt_error *err) {
    struct { const char *name; int64_t v; int64_t max; } dims[] = {
        {"hidden_size", c->C, 1 << 20},          {"num_hidden_layers", c->L, 100000},
        {"num_attention_heads", c->NH, 4096},    {"num_key_value_heads", c->NKV, 4096},
        {"head_dim", c->HD, 4096},               {"intermediate_size", c->F, 1 << 22},
        {"vocab_size", c->V, 1 << 24},
    };
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        if (dims[i].v <= 0 || dims[i].v > dims[i].max)
            return mt_errorf(err, "%s: %s = %lld is out of range (1..%lld)", src, dims[i].name,
                             (long long)dims[i].v, (long long)dims[i].max);
    if (c->NH % c->NKV)
        return mt_errorf(err, "%s: num_attention_heads (%lld) must be a multiple of "
                         "num_key_value_heads (%lld)", src, (long long)c->NH, (long long)c->NKV);
    if (c->HD % 2)
        return mt_errorf(err, "%s: head_dim (%lld) must be even for rotary embeddings", src,
                         (long long)c->HD);
    if (c->has_pad && (c->pad_id < -c->V || c->pad_id >= c->V))
        return mt_errorf(err, "%s: pad_token_id = %lld%s is outside the vocabulary (vocab_size "
                         "%lld), and transformers' embedding takes it as padding_idx, which "
                         "must lie in [-vocab_size, vocab_size); set pad_token_id to a token "
                         "id, or null for none", src, (long long)c->pad_id,
                         c->arch == MT_ARCH_PHI3 && c->pad_id == 32000
                             ? " (Phi3Config's default when absent)" : "",
                         (long long)c->V);
    if (!(c->rms_eps > 0)) return mt_errorf(err, "%s: rms_norm_eps must be positive", src);
    if (!(c->rope_theta > 0)) return mt_errorf(err, "%s: rope_theta must be positive", src);
    int64_t rot = mt_config_rotary_dim(c);
    if (rot < 2 || rot > c->HD || rot % 2)
        return mt_errorf(err, "%s: %lld rotary dims of a %lld-dim head; megatrain needs an even "
                         "number in 2..head_dim (check rotary_pct)", src, (long long)rot,
                         (long long)c->HD);
    return mt_config_validate_moe(c, src, err);
}

int mt_config_load(mt_config *cfg, const char *path, mt_error *err) {
    char *buf = NULL;
    size_t len = 0;
    if (mt_read_file(path, &buf, &len, err))
        return mt_error_prefix(err, "cannot read the model config (does the directory hold a "
                               "config.json?): ");
    int rc = mt_config_parse(cfg, buf, path, err);
    free(buf);
    return rc;
}

bool mt_config_is_moe(const mt_config *c) { return c->moe.E > 0; }

bool mt_config_block_is_moe(const mt_config *c, int64_t i) {
    const mt_moe_config *m = &c->moe;
    if (m->E <= 0 || (i + 1) % m->sparse_step != 0) return false;
    for (int k = 0; k < m->n_mlp_only; k++)
        if (m->mlp_only[k] == i) return false;
    return true;
}

/* Parameters of decoder block i; with active, only K of its E experts. */
static int64_t block_params(const mt_config *c, int64_t i, bool active) {
    int64_t q = c->NH * c->HD, kv = c->NKV * c->HD;
    if (c->arch == MT_ARCH_GPT_NEOX) /* two LayerNorms, fused qkv, dense, GELU MLP */
        return 4 * c->C + (q + 2 * kv) * c->C + c->C * q +
               (c->attn_bias ? q + 2 * kv + c->C : 0) + 2 * c->F * c->C + c->F + c->C;
    if (c->arch == MT_ARCH_FALCON) /* one or two LayerNorms, fused qkv, dense, GELU MLP */
        return (c->new_decoder ? 4 : 2) * c->C + (q + 2 * kv) * c->C + c->C * q +
               2 * c->F * c->C;
    /* gemma: four norms, around attention and MLP */
    int64_t block = (mt_arch_is_gemma(c->arch) ? 4 : 2) * c->C + q * c->C + 2 * kv * c->C +
                    c->C * q;
    if (c->qkv_bias) block += q + 2 * kv;
    if (c->qk_norm) block += 2 * c->HD;
    if (!mt_config_block_is_moe(c, i)) return block + 3 * c->F * c->C;
    const mt_moe_config *m = &c->moe;
    block += m->E * c->C + (active ? m->K : m->E) * 3 * m->FE * c->C;
    if (m->FS) block += 3 * m->FS * c->C + c->C; /* shared expert and its sigmoid gate */
    return block;
}

static int64_t model_params(const mt_config *c, bool active) {
    int64_t n = c->V * c->C * (c->tie_embeddings ? 1 : 2) + c->C * (c->layernorm ? 2 : 1);
    for (int64_t i = 0; i < c->L; i++) n += block_params(c, i, active);
    return n;
}

int64_t mt_config_num_params(const mt_config *c) { return model_params(c, false); }
int64_t mt_config_active_params(const mt_config *c) { return model_params(c, true); }

double mt_config_train_flops_per_token(const mt_config *c, int64_t T) {
    return 6.0 * (double)mt_config_active_params(c) + 12.0 * (double)c->L * (double)c->C * (double)T;
}

char *mt_config_to_json(const mt_config *c) { return mt_config_to_json_dtype(c, "float32"); }

/* The Llama family's config.json (and its MoE relatives' and phi3's). */
static void llama_to_json(const mt_config *c, cJSON *r) {
    const char *arch[] = {"LlamaForCausalLM",    "MistralForCausalLM",  "Qwen2ForCausalLM",
                          "Qwen3ForCausalLM",    "MixtralForCausalLM",  "Qwen2MoeForCausalLM",
                          "Qwen3MoeForCausalLM", "GPTNeoXForCausalLM",  "FalconForCausalLM",
                          "Phi3ForCausalLM"};
    _Static_assert(sizeof arch / sizeof *arch == MT_ARCH_PHI3 + 1, "a class for every arch");
    mt_cfg_add_head(c, r, arch[c->arch]);
    cJSON_AddNumberToObject(r, "num_key_value_heads", (double)c->NKV);
    cJSON_AddNumberToObject(r, "head_dim", (double)c->HD);
    cJSON_AddNumberToObject(r, "intermediate_size", (double)c->F);
    cJSON_AddNumberToObject(r, "vocab_size", (double)c->V);
    cJSON_AddNumberToObject(r, "max_position_embeddings", (double)c->max_pos);
    mt_cfg_add_number(r, "rms_norm_eps", c->rms_eps, true);
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_embeddings);
    mt_config_rope_to_json(c, r);
    if (c->arch == MT_ARCH_QWEN2 || c->arch == MT_ARCH_QWEN3 || c->arch == MT_ARCH_QWEN2_MOE ||
        c->arch == MT_ARCH_QWEN3_MOE)
        cJSON_AddBoolToObject(r, "use_sliding_window", false);
    if (mt_arch_has_experts(c->arch)) mt_config_moe_to_json(c, r);
    mt_cfg_add_pad_token(c, r);
    if (c->arch == MT_ARCH_MISTRAL || c->arch == MT_ARCH_MIXTRAL || c->arch == MT_ARCH_PHI3) {
        if (c->sliding_window > 0) cJSON_AddNumberToObject(r, "sliding_window", (double)c->sliding_window);
        else cJSON_AddNullToObject(r, "sliding_window");
    }
    if (c->arch == MT_ARCH_PHI3) {
        cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                (double)c->rope_orig_max_pos);
        mt_cfg_add_float(r, "resid_pdrop", 0.0);
        mt_cfg_add_float(r, "embd_pdrop", 0.0);
        mt_cfg_add_float(r, "attention_dropout", 0.0);
    }
}

char *mt_config_to_json_dtype(const mt_config *c, const char *torch_dtype) {
    cJSON *r = cJSON_CreateObject();
    if (c->arch == MT_ARCH_GPT_NEOX) mt_config_neox_to_json(c, r);
    else if (c->arch == MT_ARCH_FALCON) mt_config_falcon_to_json(c, r);
    else if (mt_arch_is_gemma(c->arch)) mt_config_gemma_to_json(c, r);
    else llama_to_json(c, r);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(r, "bos_token_id", (double)c->bos_id);
    if (c->eos_id >= 0) cJSON_AddNumberToObject(r, "eos_token_id", (double)c->eos_id);
    /* Phi3Config has ids 1 and 32000 when absent: none must be said */
    if (c->arch == MT_ARCH_PHI3 && c->bos_id < 0) cJSON_AddNullToObject(r, "bos_token_id");
    if (c->arch == MT_ARCH_PHI3 && c->eos_id < 0) cJSON_AddNullToObject(r, "eos_token_id");
    cJSON_AddStringToObject(r, "torch_dtype", torch_dtype);
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    MT_ASSERT(s);
    return s;
}

void mt_config_default_tiny(mt_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = MT_ARCH_LLAMA;
    snprintf(c->model_type, sizeof c->model_type, "llama");
    c->C = 64;
    c->L = 2;
    c->NH = 4;
    c->NKV = 2;
    c->HD = 16;
    c->F = 192;
    c->V = 258; /* 256 bytes + BOS + EOS */
    c->max_pos = 256;
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0;
    c->rope_kind = MT_ROPE_DEFAULT;
    c->tie_embeddings = true;
    c->pad_id = -1;
    c->bos_id = 256;
    c->eos_id = 257;
}
