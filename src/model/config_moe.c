/* config.json of the mixture-of-experts types (mixtral, qwen2_moe,
 * qwen3_moe): their expert fields with the defaults of transformers'
 * MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig, their ranges, and the
 * same fields written back under each type's published names. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>

#include "model/config.h"
#include "model/config_internal.h"

/* mlp_only_layers: a list of block indices in [0, L). */
static int parse_mlp_only(mt_moe_config *m, const cJSON *root, int64_t L, const char *src,
                          mt_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (!a || cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a))
        return mt_errorf(err, "%s: field \"mlp_only_layers\" must be a list of layer indices",
                         src);
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
            e->valuedouble < 0 || e->valuedouble >= (double)L)
            return mt_errorf(err, "%s: mlp_only_layers holds %s; every entry must be a layer "
                             "index in [0, num_hidden_layers = %lld)", src,
                             cJSON_IsNumber(e) ? "an out-of-range index" : "a non-integer",
                             (long long)L);
        if (m->n_mlp_only == MT_MAX_MLP_ONLY)
            return mt_errorf(err, "%s: mlp_only_layers lists more than %d layers, more than "
                             "megatrain reads; use decoder_sparse_step for regular patterns",
                             src, MT_MAX_MLP_ONLY);
        m->mlp_only[m->n_mlp_only++] = (int32_t)e->valuedouble;
    }
    return 0;
}

/* The MoE fields of mixtral, qwen2_moe and qwen3_moe, with the defaults of
 * transformers' MixtralConfig, Qwen2MoeConfig and Qwen3MoeConfig; ranges
 * are checked by mt_config_validate. */
int mt_config_parse_moe(mt_config *cfg, const cJSON *root, const char *src, mt_error *err) {
    mt_moe_config *m = &cfg->moe;
    bool mixtral = cfg->arch == MT_ARCH_MIXTRAL, q2 = cfg->arch == MT_ARCH_QWEN2_MOE;
    /* transformers maps num_experts and num_local_experts onto each other for
     * mixtral and qwen3_moe (and writes num_local_experts for qwen3_moe) */
    const char *ekey = !q2 && cJSON_GetObjectItemCaseSensitive(root, "num_local_experts")
                           ? "num_local_experts" : "num_experts";
    if (mt_cfg_int(root, ekey, mixtral ? 8 : q2 ? 60 : 128, &m->E, src, err)) return -1;
    if (mixtral && m->E < 1)
        return mt_errorf(err, "%s: %s must be at least 1 for model_type \"mixtral\"", src, ekey);
    if (m->E == 0) return 0; /* qwen: every block has the dense MLP */
    if (mt_cfg_int(root, "num_experts_per_tok", mixtral ? 2 : q2 ? 4 : 8, &m->K, src, err) ||
        mt_cfg_num(root, "router_aux_loss_coef", 0.001, &m->aux_coef, src, err) ||
        mt_cfg_bool(root, "output_router_logits", false, &m->output_router_logits, src, err))
        return -1;
    m->aux_loss = m->output_router_logits;
    m->sparse_step = 1;
    m->norm_topk = true;
    m->FE = cfg->F;
    if (mixtral) {
        double jitter = 0;
        if (mt_cfg_num(root, "router_jitter_noise", 0.0, &jitter, src, err)) return -1;
        if (jitter != 0)
            return mt_errorf(err, "%s: router_jitter_noise %g is not supported (training-time "
                             "noise on the router input); set it to 0", src, jitter);
        return 0;
    }
    if (mt_cfg_int(root, "moe_intermediate_size", q2 ? 1408 : 768, &m->FE, src, err) ||
        mt_cfg_bool(root, "norm_topk_prob", false, &m->norm_topk, src, err) ||
        mt_cfg_int(root, "decoder_sparse_step", 1, &m->sparse_step, src, err) ||
        parse_mlp_only(m, root, cfg->L, src, err))
        return -1;
    if (q2 && mt_cfg_int(root, "shared_expert_intermediate_size", 5632, &m->FS, src, err))
        return -1;
    if (q2 && m->FS <= 0)
        return mt_errorf(err, "%s: shared_expert_intermediate_size must be positive (every "
                         "qwen2_moe block has a shared expert)", src);
    return 0;
}

int mt_config_validate_moe(const mt_config *c, const char *src, mt_error *err) {
    const mt_moe_config *m = &c->moe;
    if (m->E == 0) return 0;
    const char *ekey = c->arch == MT_ARCH_MIXTRAL ? "num_local_experts" : "num_experts";
    if (!mt_arch_has_experts(c->arch))
        return mt_errorf(err, "%s: model_type \"%s\" has no experts", src, c->model_type);
    if (m->E < 0 || m->E > 65536)
        return mt_errorf(err, "%s: %s = %lld is out of range (0..65536)", src, ekey,
                         (long long)m->E);
    if (m->K < 1 || m->K > m->E)
        return mt_errorf(err, "%s: num_experts_per_tok = %lld must be in 1..%s (%lld)", src,
                         (long long)m->K, ekey, (long long)m->E);
    const char *fe = c->arch == MT_ARCH_MIXTRAL ? "intermediate_size" : "moe_intermediate_size";
    if (m->FE <= 0 || m->FE > (1 << 22))
        return mt_errorf(err, "%s: %s = %lld is out of range (1..%d)", src, fe,
                         (long long)m->FE, 1 << 22);
    if (m->FS < 0 || m->FS > (1 << 22))
        return mt_errorf(err, "%s: shared_expert_intermediate_size = %lld is out of range "
                         "(1..%d)", src, (long long)m->FS, 1 << 22);
    if (m->sparse_step < 1)
        return mt_errorf(err, "%s: decoder_sparse_step must be at least 1 (1: every layer is "
                         "a mixture-of-experts layer)", src);
    if (!(m->aux_coef >= 0) || !isfinite(m->aux_coef))
        return mt_errorf(err, "%s: router_aux_loss_coef must be a finite number >= 0", src);
    return 0;
}

/* The MoE fields under the names of each type's published config.json
 * (transformers reads num_experts for qwen3_moe through its attribute map). */
void mt_config_moe_to_json(const mt_config *c, cJSON *r) {
    const mt_moe_config *m = &c->moe;
    bool mixtral = c->arch == MT_ARCH_MIXTRAL;
    cJSON_AddNumberToObject(r, mixtral ? "num_local_experts" : "num_experts", (double)m->E);
    cJSON_AddNumberToObject(r, "num_experts_per_tok", (double)(m->E ? m->K : 1));
    mt_cfg_add_float(r, "router_aux_loss_coef", m->E ? m->aux_coef : 0.001);
    cJSON_AddBoolToObject(r, "output_router_logits", m->output_router_logits);
    if (mixtral) return;
    cJSON_AddNumberToObject(r, "moe_intermediate_size", (double)(m->E ? m->FE : c->F));
    cJSON_AddBoolToObject(r, "norm_topk_prob", m->norm_topk);
    cJSON_AddNumberToObject(r, "decoder_sparse_step", (double)(m->E ? m->sparse_step : 1));
    cJSON *a = cJSON_AddArrayToObject(r, "mlp_only_layers");
    for (int k = 0; k < m->n_mlp_only; k++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(m->mlp_only[k]));
    if (c->arch == MT_ARCH_QWEN2_MOE) {
        cJSON_AddNumberToObject(r, "shared_expert_intermediate_size", (double)m->FS);
        cJSON_AddBoolToObject(r, "qkv_bias", c->qkv_bias);
    } else {
        cJSON_AddBoolToObject(r, "attention_bias", false);
    }
}
