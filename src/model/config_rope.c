/* The rotary embedding fields of the Llama family (and falcon) in
 * config.json: rope_theta and rope_scaling (transformers 4) or
 * rope_parameters (transformers 5), the types megatrain computes (default,
 * llama3, linear, and phi3's longrope through config_phi3.c), and the same
 * written back under transformers 4's names. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/config.h"
#include "model/config_internal.h"

int mt_config_parse_rope(mt_config *cfg, const cJSON *root, const char *src, mt_error *err) {
    /* transformers 5 keeps everything in rope_parameters; 4 uses rope_theta
     * at the top level and rope_scaling for the scaling kind. */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const char *field = "rope_parameters";
    if (!rp || cJSON_IsNull(rp)) {
        rp = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
        field = "rope_scaling";
    }
    double theta = cfg->arch == MT_ARCH_MIXTRAL ? 1e6 : 10000.0; /* MixtralConfig.default_theta */
    if (mt_cfg_num(root, "rope_theta", theta, &cfg->rope_theta, src, err)) return -1;
    cfg->rope_kind = MT_ROPE_DEFAULT;
    if (!rp || cJSON_IsNull(rp)) return 0;
    if (!cJSON_IsObject(rp)) return mt_errorf(err, "%s: field \"%s\" must be an object", src, field);
    double prf = 1.0;
    if (mt_cfg_num(rp, "rope_theta", cfg->rope_theta, &cfg->rope_theta, src, err) ||
        mt_cfg_num(rp, "partial_rotary_factor", 1.0, &prf, src, err))
        return -1;
    if (prf != 1.0)
        return mt_errorf(err, "%s: %s.partial_rotary_factor %g is not supported for model_type "
                         "\"%s\" (only 1.0)", src, field, prf, cfg->model_type);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(rp, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "default";
    if (!strcmp(t, "default")) return 0;
    bool phi3 = cfg->arch == MT_ARCH_PHI3;
    if (phi3 && (!strcmp(t, "longrope") || !strcmp(t, "su")))
        return mt_config_parse_longrope(cfg, rp, field, src, err);
    if (strcmp(t, "llama3") != 0 || phi3)
        return mt_errorf(err,
                         "%s: %s.rope_type \"%s\" is not supported for model_type \"%s\"; "
                         "megatrain supports \"default\" and %s",
                         src, field, t, cfg->model_type,
                         phi3 ? "\"longrope\" (\"su\")" : "\"llama3\"");
    cfg->rope_kind = MT_ROPE_LLAMA3;
    int64_t orig = 0;
    if (mt_cfg_num(rp, "factor", 8.0, &cfg->rope_factor, src, err) ||
        mt_cfg_num(rp, "low_freq_factor", 1.0, &cfg->rope_low_freq_factor, src, err) ||
        mt_cfg_num(rp, "high_freq_factor", 4.0, &cfg->rope_high_freq_factor, src, err) ||
        mt_cfg_int(rp, "original_max_position_embeddings", 8192, &orig, src, err))
        return -1;
    cfg->rope_orig_max_pos = orig;
    if (!(cfg->rope_factor > 0) || !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
        orig <= 0)
        return mt_errorf(err,
                         "%s: %s for llama3 needs factor > 0, high_freq_factor > "
                         "low_freq_factor and original_max_position_embeddings > 0",
                         src, field);
    return 0;
}

/* rope_theta, and rope_scaling for llama3 and longrope, under transformers
 * 4's names (transformers 5 converts them on load). */
void mt_config_rope_to_json(const mt_config *c, cJSON *r) {
    mt_cfg_add_float(r, "rope_theta", c->rope_theta);
    if (c->rope_kind == MT_ROPE_LONGROPE) mt_config_longrope_to_json(c, r);
    if (c->rope_kind != MT_ROPE_LLAMA3) return;
    cJSON *s = cJSON_AddObjectToObject(r, "rope_scaling");
    cJSON_AddStringToObject(s, "rope_type", "llama3");
    mt_cfg_add_float(s, "factor", c->rope_factor);
    mt_cfg_add_float(s, "low_freq_factor", c->rope_low_freq_factor);
    mt_cfg_add_float(s, "high_freq_factor", c->rope_high_freq_factor);
    cJSON_AddNumberToObject(s, "original_max_position_embeddings", (double)c->rope_orig_max_pos);
}
