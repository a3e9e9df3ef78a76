/* config.json of phi3 (Phi-3, Phi-3.5): what it adds to the Llama fields,
 * with Phi3Config's defaults, and rope_scaling of type longrope read and
 * written back as Phi-3.5's config.json has it. */
#include "model/config_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* One of longrope's factor lists: head_dim / 2 numbers > 0. */
static int get_factors(const cJSON *rp, const char *key, double *out, int64_t n,
                       const char *field, const char *src, mt_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(rp, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return mt_errorf(err, "%s: %s.%s must be a list of head_dim / 2 = %lld numbers", src,
                         field, key, (long long)n);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || !isfinite(e->valuedouble))
            return mt_errorf(err, "%s: %s.%s[%d] must be a finite number > 0", src, field, key,
                             i);
        out[i++] = e->valuedouble;
    }
    return 0;
}

/* phi3's rope_scaling of type "longrope" ("su" in the first Phi-3
 * releases), as transformers reads it (_compute_longrope_parameters):
 * short_factor and long_factor, one per rotated pair; "factor" and
 * "attention_factor" optional. original_max_position_embeddings is the
 * top-level field of config.json (parse_phi3), which transformers prefers
 * to the one in rope_scaling. */
int mt_config_parse_longrope(mt_config *cfg, const cJSON *rp, const char *field, const char *src,
                             mt_error *err) {
    cfg->rope_kind = MT_ROPE_LONGROPE;
    int64_t half = cfg->HD / 2;
    if (half < 1 || half > MT_MAX_ROPE_FACTORS)
        return mt_errorf(err, "%s: head_dim %lld: megatrain reads longrope factors for head "
                         "dims up to %d", src, (long long)cfg->HD, 2 * MT_MAX_ROPE_FACTORS);
    if (get_factors(rp, "short_factor", cfg->rope_short_factor, half, field, src, err) ||
        get_factors(rp, "long_factor", cfg->rope_long_factor, half, field, src, err) ||
        mt_cfg_num(rp, "factor", 0.0, &cfg->rope_factor, src, err) ||
        mt_cfg_num(rp, "attention_factor", 0.0, &cfg->rope_attn_factor, src, err))
        return -1;
    cfg->n_rope_factors = (int)half;
    if (cfg->rope_factor < 0 || cfg->rope_attn_factor < 0 || !isfinite(cfg->rope_factor) ||
        !isfinite(cfg->rope_attn_factor))
        return mt_errorf(err, "%s: %s.factor and %s.attention_factor must be finite numbers "
                         "> 0 when given", src, field, field);
    return 0;
}

/* What phi3 adds to the Llama fields, with Phi3Config's defaults: its
 * dropouts must be 0, original_max_position_embeddings (4096 when absent)
 * is longrope's pretraining length; bos, eos and pad_token_id are 1, 32000
 * and 32000 when absent (pad_token_id: the embedding's padding index). */
int mt_config_parse_phi3(mt_config *cfg, const cJSON *root, const char *src, mt_error *err) {
    const char *dropouts[] = {"resid_pdrop", "embd_pdrop", "attention_dropout"};
    for (size_t i = 0; i < sizeof dropouts / sizeof *dropouts; i++) {
        double drop = 0;
        if (mt_cfg_num(root, dropouts[i], 0.0, &drop, src, err)) return -1;
        if (drop != 0)
            return mt_errorf(err, "%s: %s = %g is not supported (megatrain trains without "
                             "dropout); set it to 0.0", src, dropouts[i], drop);
    }
    if (mt_cfg_pad_token(cfg, root, 32000, src, err)) return -1;
    const char *ids[] = {"bos_token_id", "eos_token_id"};
    int64_t *id_out[] = {&cfg->bos_id, &cfg->eos_id}, dflt[] = {1, 32000};
    for (size_t i = 0; i < 2; i++)
        if (!cJSON_GetObjectItemCaseSensitive(root, ids[i])) *id_out[i] = dflt[i];
    if (mt_cfg_int(root, "original_max_position_embeddings", 4096, &cfg->rope_orig_max_pos, src,
                   err))
        return -1;
    if (cfg->rope_orig_max_pos <= 0)
        return mt_errorf(err, "%s: original_max_position_embeddings must be positive", src);
    return 0;
}

/* longrope's rope_scaling as Phi-3.5's config.json has it; "factor" and
 * "attention_factor" only when config.json gave them. */
void mt_config_longrope_to_json(const mt_config *c, cJSON *r) {
    cJSON *s = cJSON_AddObjectToObject(r, "rope_scaling");
    cJSON_AddStringToObject(s, "type", "longrope");
    const char *keys[] = {"short_factor", "long_factor"};
    const double *lists[] = {c->rope_short_factor, c->rope_long_factor};
    for (int k = 0; k < 2; k++) {
        cJSON *a = cJSON_AddArrayToObject(s, keys[k]);
        for (int i = 0; i < c->n_rope_factors; i++) {
            char buf[48];
            mt_cfg_number_text(buf, lists[k][i], false);
            cJSON_AddItemToArray(a, cJSON_CreateRaw(buf));
        }
    }
    if (c->rope_factor > 0) mt_cfg_add_float(s, "factor", c->rope_factor);
    if (c->rope_attn_factor > 0) mt_cfg_add_float(s, "attention_factor", c->rope_attn_factor);
}

void mt_config_phi3_defaults(mt_config *c) {
    c->arch = MT_ARCH_PHI3;
    snprintf(c->model_type, sizeof c->model_type, "phi3");
    c->rms_eps = 1e-5f;
    c->rope_kind = MT_ROPE_DEFAULT;
    c->rope_orig_max_pos = c->max_pos;
    c->sliding_window = 0;
    c->has_pad = false;
    c->pad_id = -1;
    c->qkv_bias = c->qk_norm = false;
    c->rotary_dim = 0;
}
