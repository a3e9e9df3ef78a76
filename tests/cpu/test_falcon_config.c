/* falcon's config.json: the two architectures, FalconConfig's defaults, the
 * round trip through mt_config_to_json, the refusals and the presets. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_check.h"
#include "model/config.h"
#include "model/params.h"
#include "model/presets.h"

#define FALCON "\"model_type\": \"falcon\", \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
               "\"num_attention_heads\": 4, \"vocab_size\": 96"

/* Absent fields take FalconConfig's defaults (transformers 5): Falcon-7B's
 * architecture (multi_query: one kv head, one LayerNorm), ffn_hidden_size
 * 4 * hidden, layer_norm_epsilon 1e-5, erf GELU, tied lm_head, token ids 11. */
Test(falcon_config, falcon_7b_defaults) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" FALCON ", \"num_kv_heads\": 4}", "config.json", &err),
                 0, "%s", err.msg);
    cr_assert_eq(c.arch, MT_ARCH_FALCON);
    cr_assert_not(c.new_decoder);
    cr_assert_eq(c.NKV, 1, "multi_query ignores num_kv_heads: one kv head");
    cr_assert_eq(c.HD, 16);
    cr_assert_eq(c.F, 256);
    cr_assert_float_eq(c.rms_eps, 1e-5f, 0);
    cr_assert_eq(c.act, MT_ACT_GELU);
    cr_assert(c.tie_embeddings);
    cr_assert(c.layernorm && c.parallel_residual);
    cr_assert_not(c.attn_bias);
    cr_assert_eq(mt_config_rotary_dim(&c), 16, "the whole head rotates");
    cr_assert_float_eq(c.rope_theta, 10000.0, 0);
    cr_assert_eq(c.bos_id, 11);
    cr_assert_eq(c.eos_id, 11);
    mt_param_table t;
    int layer;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    cr_assert_not_null(mt_params_by_name(&t, "transformer.h.1.input_layernorm.bias", &layer));
    cr_assert_null(mt_params_by_name(&t, "transformer.h.1.ln_mlp.weight", &layer));
    const mt_tensor_desc *qkv =
        mt_params_by_name(&t, "transformer.h.0.self_attention.query_key_value.weight", &layer);
    cr_assert_not_null(qkv);
    cr_assert_eq(qkv->shape[0], 64 + 2 * 16, "4 query heads, one k, one v");
    cr_assert_null(mt_params_by_name(&t, "lm_head.weight", &layer), "tied");
    mt_params_free(&t);
}

Test(falcon_config, new_decoder_architecture) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" FALCON ", \"new_decoder_architecture\": true, "
                                 "\"num_kv_heads\": 2, \"ffn_hidden_size\": 96, "
                                 "\"tie_word_embeddings\": false, \"rope_theta\": 500.0, "
                                 "\"activation\": \"gelu_pytorch_tanh\"}", "config.json", &err),
                 0, "%s", err.msg);
    cr_assert(c.new_decoder);
    cr_assert_eq(c.NKV, 2);
    cr_assert_eq(c.F, 96);
    cr_assert_not(c.tie_embeddings);
    cr_assert_float_eq(c.rope_theta, 500.0, 0, "transformers 4's top-level rope_theta");
    cr_assert_eq(c.act, MT_ACT_GELU_TANH);
    mt_param_table t;
    int layer;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    cr_assert_not_null(mt_params_by_name(&t, "transformer.h.1.ln_attn.weight", &layer));
    cr_assert_not_null(mt_params_by_name(&t, "transformer.h.1.ln_mlp.bias", &layer));
    cr_assert_null(mt_params_by_name(&t, "transformer.h.1.input_layernorm.weight", &layer));
    cr_assert_eq(mt_params_by_name(&t, "transformer.h.0.self_attention.query_key_value.weight", &layer)
                     ->shape[0],
                 64 + 2 * 2 * 16, "4 query heads, 2 k, 2 v");
    cr_assert_not_null(mt_params_by_name(&t, "lm_head.weight", &layer), "untied");
    mt_params_free(&t);
}

Test(falcon_config, to_json_round_trips) {
    const char *variants[] = {
        "{" FALCON ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500.0}, "
        "\"layer_norm_epsilon\": 1e-6, \"bos_token_id\": 1, \"eos_token_id\": 2}",
        "{" FALCON ", \"new_decoder_architecture\": true, \"num_kv_heads\": 2, "
        "\"tie_word_embeddings\": false, \"activation\": \"gelu_new\"}",
    };
    for (size_t i = 0; i < 2; i++) {
        mt_config c, d;
        mt_error err;
        cr_assert_eq(mt_config_parse(&c, variants[i], "config.json", &err), 0, "%s", err.msg);
        char *json = mt_config_to_json(&c);
        cr_assert_eq(mt_config_parse(&d, json, "saved", &err), 0, "%s\n%s", err.msg, json);
        free(json);
        cr_assert_eq(memcmp(&c, &d, sizeof c), 0, "variant %zu changed through to_json", i);
    }
}

Test(falcon_config, refusals_name_the_field) {
    const mt_hf_refusal cases[] = {
        {"\"alibi\": true", "alibi"},
        {"\"bias\": true", "bias"},
        {"\"parallel_attn\": false", "parallel_attn"},
        {"\"multi_query\": false", "multi_query"},
        {"\"new_decoder_architecture\": true, \"num_ln_in_parallel_attn\": 1",
         "num_ln_in_parallel_attn"},
        {"\"num_ln_in_parallel_attn\": 2", "num_ln_in_parallel_attn"},
        {"\"new_decoder_architecture\": true, \"num_kv_heads\": 3", "num_kv_heads"},
        {"\"activation\": \"relu\"", "activation"},
        {"\"hidden_dropout\": 0.1", "hidden_dropout"},
        {"\"attention_dropout\": 0.1", "attention_dropout"},
        {"\"head_dim\": 8", "head_dim"},
        {"\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling.rope_type"},
    };
    mt_hf_check_refusals(FALCON, cases, sizeof cases / sizeof *cases);
}

/* The presets have the shapes of tiiuae/falcon-7b's and falcon-40b's
 * config.json and validate; their parameter counts follow the table.
 * (No published exact count was at hand to cite, so none is asserted.) */
Test(falcon_config, presets_validate) {
    struct { const char *name; bool new_decoder; int64_t NKV; } cases[] = {
        {"falcon-7b", false, 1},
        {"falcon-40b", true, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const mt_preset *p = mt_preset_find(cases[i].name);
        cr_assert_not_null(p, "%s", cases[i].name);
        mt_config c;
        mt_preset_config(p, 2048, &c);
        mt_error err;
        cr_assert_eq(mt_config_validate(&c, cases[i].name, &err), 0, "%s", err.msg);
        cr_assert_str_eq(c.model_type, "falcon");
        cr_assert_eq(c.new_decoder, cases[i].new_decoder, "%s", cases[i].name);
        cr_assert_eq(c.NKV, cases[i].NKV, "%s", cases[i].name);
        cr_assert(c.tie_embeddings);
        mt_param_table t;
        cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
        cr_assert_eq(t.n_params, mt_config_num_params(&c), "%s", cases[i].name);
        cr_log_info("%s: %lld parameters", cases[i].name, (long long)t.n_params);
        mt_params_free(&t);
    }
}
