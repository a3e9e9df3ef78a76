/* gemma2's and gemma3_text's config.json: the config classes' defaults, which
 * layers slide, the two rope bases, the round trip through
 * mt_config_to_json, the refusals and the presets. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_check.h"
#include "model/config.h"
#include "model/params.h"
#include "model/presets.h"

#define SHAPE "\"hidden_size\": 64, \"num_hidden_layers\": 7, \"num_attention_heads\": 4, " \
              "\"intermediate_size\": 96, \"vocab_size\": 96"
#define GEMMA2 "\"model_type\": \"gemma2\", " SHAPE
#define GEMMA3 "\"model_type\": \"gemma3_text\", " SHAPE

/* Absent fields take Gemma2Config's defaults (transformers 5): 4 kv heads of
 * 256 dims, tanh GELU, query_pre_attn_scalar 256, soft-caps 50 and 30, a
 * window of 4096 on every other layer from the first, tied, token ids 2 and
 * 1, rope_theta 10000; a gemma block has four norms. */
Test(gemma_config, gemma2_defaults) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" GEMMA2 "}", "config.json", &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, MT_ARCH_GEMMA2);
    cr_assert_eq(c.NKV, 4);
    cr_assert_eq(c.HD, 256);
    cr_assert_eq(c.act, MT_ACT_GELU_TANH);
    cr_assert_float_eq(c.query_pre_attn_scalar, 256.0, 0);
    cr_assert_float_eq(c.attn_softcap, 50.0, 0);
    cr_assert_float_eq(c.final_softcap, 30.0, 0);
    cr_assert_eq(c.sliding_window, 4096);
    for (int i = 0; i < 7; i++) cr_assert_eq(mt_config_block_slides(&c, i), i % 2 == 0, "%d", i);
    cr_assert(c.tie_embeddings);
    cr_assert_not(c.qk_norm);
    cr_assert_eq(c.bos_id, 2);
    cr_assert_eq(c.eos_id, 1);
    cr_assert_float_eq(c.rope_theta, 10000.0, 0);
    cr_assert_float_eq(c.rms_eps, 1e-6f, 0);
    mt_param_table t;
    int layer;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    cr_assert(t.norm_offset, "the norms scale by 1 + w");
    const char *names[] = {"input_layernorm", "post_attention_layernorm",
                           "pre_feedforward_layernorm", "post_feedforward_layernorm"};
    char name[96];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "model.layers.6.%s.weight", names[i]);
        cr_assert_not_null(mt_params_by_name(&t, name, &layer), "%s", name);
    }
    cr_assert_null(mt_params_by_name(&t, "model.layers.0.self_attn.q_norm.weight", &layer));
    cr_assert_null(mt_params_by_name(&t, "lm_head.weight", &layer), "tied");
    mt_params_free(&t);
}

/* Gemma3TextConfig's: no soft-caps, sliding_window_pattern 6 (layer 5 is
 * the first global one), rope_theta 1e6 on the global layers and
 * rope_local_base_freq 10000 on the others, q/k norms; null soft-caps are
 * none, rope_scaling linear scales the global layers only. */
Test(gemma_config, gemma3_text_defaults_and_rope) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" GEMMA3 ", \"final_logit_softcapping\": null, "
                                 "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}}",
                                 "config.json", &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, MT_ARCH_GEMMA3_TEXT);
    cr_assert(c.qk_norm);
    cr_assert_float_eq(c.attn_softcap, 0.0, 0);
    cr_assert_float_eq(c.final_softcap, 0.0, 0);
    for (int i = 0; i < 7; i++) cr_assert_eq(mt_config_block_slides(&c, i), i != 5, "%d", i);
    cr_assert_float_eq(c.rope_theta, 1e6, 0);
    cr_assert_float_eq(c.rope_local_theta, 10000.0, 0);
    cr_assert_eq(c.rope_kind, MT_ROPE_LINEAR);
    cr_assert_float_eq(c.rope_factor, 8.0, 0);
    cr_assert_eq(c.max_pos, 131072);
    /* transformers 5's form: rope_parameters per layer type, and layer_types */
    cr_assert_eq(mt_config_parse(&c, "{" GEMMA3 ", \"rope_parameters\": {\"full_attention\": "
                                 "{\"rope_type\": \"default\", \"rope_theta\": 500.0}, "
                                 "\"sliding_attention\": {\"rope_type\": \"default\", "
                                 "\"rope_theta\": 50.0}}, \"layer_types\": [\"sliding_attention\", "
                                 "\"sliding_attention\", \"full_attention\", "
                                 "\"sliding_attention\", \"sliding_attention\", "
                                 "\"full_attention\", \"sliding_attention\"]}",
                                 "config.json", &err), 0, "%s", err.msg);
    cr_assert_eq(c.sliding_pattern, 3);
    cr_assert_float_eq(c.rope_theta, 500.0, 0);
    cr_assert_float_eq(c.rope_local_theta, 50.0, 0);
    cr_assert_eq(c.rope_kind, MT_ROPE_DEFAULT);
    mt_param_table t;
    int layer;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    cr_assert_not_null(mt_params_by_name(&t, "model.layers.3.self_attn.k_norm.weight", &layer));
    mt_params_free(&t);
}

Test(gemma_config, to_json_round_trips) {
    const char *variants[] = {
        "{" GEMMA2 ", \"num_key_value_heads\": 2, \"head_dim\": 16, \"sliding_window\": 8, "
        "\"query_pre_attn_scalar\": 12, \"final_logit_softcapping\": null, "
        "\"tie_word_embeddings\": false, \"hidden_activation\": \"gelu\"}",
        "{" GEMMA3 ", \"num_key_value_heads\": 1, \"head_dim\": 16, \"sliding_window_pattern\": 4, "
        "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}, "
        "\"final_logit_softcapping\": 30.0, \"rope_local_base_freq\": 100.0}",
        /* three layers of a pattern of 6: all slide, and read back so */
        "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"num_hidden_layers\": 3, "
        "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 96}",
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        mt_config c, d;
        mt_error err;
        cr_assert_eq(mt_config_parse(&c, variants[i], "config.json", &err), 0, "%s", err.msg);
        char *json = mt_config_to_json(&c);
        cr_assert_eq(mt_config_parse(&d, json, "saved", &err), 0, "%s\n%s", err.msg, json);
        free(json);
        cr_assert_eq(memcmp(&c, &d, sizeof c), 0, "variant %zu changed through to_json", i);
    }
}

Test(gemma_config, refusals_name_the_field) {
    const mt_hf_refusal g2[] = {
        {"\"attention_bias\": true", "attention_bias"},
        {"\"use_bidirectional_attention\": true", "use_bidirectional_attention"},
        {"\"attention_dropout\": 0.1", "attention_dropout"},
        {"\"hidden_activation\": \"silu\"", "hidden_activation"},
        {"\"attn_logit_softcapping\": -1.0", "attn_logit_softcapping"},
        {"\"query_pre_attn_scalar\": 0", "query_pre_attn_scalar"},
        {"\"sliding_window\": 0", "sliding_window"},
        {"\"layer_types\": [\"full_attention\"]", "layer_types"},
        {"\"layer_types\": [\"sliding_attention\", \"full_attention\", \"full_attention\", "
         "\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"]",
         "layer_types"},
        {"\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}",
         "rope_scaling.rope_type"},
    };
    mt_hf_check_refusals(GEMMA2, g2, sizeof g2 / sizeof *g2);
    const mt_hf_refusal g3[] = {
        {"\"attn_logit_softcapping\": 50.0", "attn_logit_softcapping"},
        {"\"sliding_window_pattern\": 0", "sliding_window_pattern"},
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0}", "rope_scaling.rope_type"},
        {"\"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"linear\", "
         "\"factor\": 2.0}}", "rope_parameters.sliding_attention.rope_type"},
    };
    mt_hf_check_refusals(GEMMA3, g3, sizeof g3 / sizeof *g3);
}

/* The multimodal checkpoint's type is refused, pointing to its text model. */
Test(gemma_config, gemma3_points_to_gemma3_text) {
    mt_config c;
    mt_error err;
    cr_assert_neq(mt_config_parse(&c, "{\"model_type\": \"gemma3\", " SHAPE "}", "config.json",
                                  &err), 0);
    cr_assert_not_null(strstr(err.msg, "gemma3_text"), "%s", err.msg);
}

/* The presets have the shapes of google/gemma-2-2b, -9b, -27b's and
 * gemma-3-1b-pt's config.json (text_config of gemma-3-4b-pt, -12b-pt,
 * -27b-pt) and validate; the Gemma 2 and Gemma-3-1B counts are the
 * published ones (2.61B, 9.24B, 27.2B, 1.0B). */
Test(gemma_config, presets_validate) {
    struct {
        const char *name;
        int64_t window;
        double qpas;
        bool linear;
        double billions; /* published count, 0: none asserted (the text model of a larger one) */
    } cases[] = {
        {"gemma2-2b", 4096, 256, false, 2.61},  {"gemma2-9b", 4096, 256, false, 9.24},
        {"gemma2-27b", 4096, 144, false, 27.23}, {"gemma3-1b", 512, 256, false, 1.00},
        {"gemma3-4b", 1024, 256, true, 0},      {"gemma3-12b", 1024, 256, true, 0},
        {"gemma3-27b", 1024, 168, true, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const mt_preset *p = mt_preset_find(cases[i].name);
        cr_assert_not_null(p, "%s", cases[i].name);
        mt_config c;
        mt_preset_config(p, 2048, &c);
        mt_error err;
        cr_assert_eq(mt_config_validate(&c, cases[i].name, &err), 0, "%s", err.msg);
        cr_assert(mt_arch_is_gemma(c.arch) && c.tie_embeddings, "%s", cases[i].name);
        cr_assert_eq(c.sliding_window, cases[i].window, "%s", cases[i].name);
        cr_assert_float_eq(c.query_pre_attn_scalar, cases[i].qpas, 0, "%s", cases[i].name);
        cr_assert_eq(c.rope_kind == MT_ROPE_LINEAR, cases[i].linear, "%s", cases[i].name);
        mt_param_table t;
        cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
        cr_assert_eq(t.n_params, mt_config_num_params(&c), "%s", cases[i].name);
        if (cases[i].billions > 0)
            cr_assert_lt(fabs(t.n_params / 1e9 - cases[i].billions), 0.006, "%s: %lld",
                         cases[i].name, (long long)t.n_params);
        cr_log_info("%s: %lld parameters", cases[i].name, (long long)t.n_params);
        mt_params_free(&t);
    }
}
