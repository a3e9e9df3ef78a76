/* gpt_neox's config.json: the fields of transformers 4 and 5, GPTNeoXConfig's
 * defaults, the round trip through mt_config_to_json and the refusals. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_check.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/params.h"

#define NEOX "\"model_type\": \"gpt_neox\", \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
             "\"num_attention_heads\": 4, \"intermediate_size\": 256, \"vocab_size\": 96"

/* transformers 4's layout (Pythia's published config.json): the rotary
 * fields at the top level, GPTNeoXConfig's defaults for the rest. */
Test(neox_config, transformers_4_fields_and_defaults) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" NEOX ", \"rotary_pct\": 0.25, \"rotary_emb_base\": "
                                 "10000, \"use_parallel_residual\": false}", "config.json",
                                 &err), 0, "%s", err.msg);
    cr_assert_eq(c.HD, 16);
    cr_assert_eq(c.NKV, 4);
    cr_assert_eq(c.rotary_dim, 4);
    cr_assert_float_eq(c.rope_theta, 10000.0, 0);
    cr_assert_not(c.parallel_residual);
    cr_assert(c.layernorm);
    cr_assert(c.attn_bias, "attention_bias defaults to true");
    cr_assert_eq(c.act, MT_ACT_GELU, "hidden_act defaults to \"gelu\"");
    cr_assert_float_eq(c.rms_eps, 1e-5f, 0, "layer_norm_eps defaults to 1e-5");
    cr_assert_not(c.tie_embeddings);
    /* rotary_pct's default is 0.25, use_parallel_residual's true */
    cr_assert_eq(mt_config_parse(&c, "{" NEOX ", \"hidden_act\": \"gelu_fast\"}", "config.json",
                                 &err), 0, "%s", err.msg);
    cr_assert_eq(c.rotary_dim, 4);
    cr_assert(c.parallel_residual);
    cr_assert_eq(c.act, MT_ACT_GELU_TANH);
    /* the parameter count follows the table */
    mt_param_table t;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    mt_params_free(&t);
}

Test(neox_config, to_json_round_trips) {
    mt_config c, d;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" NEOX ", \"rope_parameters\": {\"rope_theta\": 500.0, "
                                 "\"partial_rotary_factor\": 0.5}, \"hidden_act\": \"gelu_new\", "
                                 "\"attention_bias\": false, \"layer_norm_eps\": 1e-6}",
                                 "config.json", &err), 0, "%s", err.msg);
    cr_assert_eq(c.rotary_dim, 8);
    char *json = mt_config_to_json(&c);
    cr_assert_eq(mt_config_parse(&d, json, "saved", &err), 0, "%s\n%s", err.msg, json);
    free(json);
    cr_assert_eq(memcmp(&c, &d, sizeof c), 0, "config changed through to_json");
}

Test(neox_config, refusals_name_the_field) {
    const mt_hf_refusal cases[] = {
        {"\"tie_word_embeddings\": true", "tie_word_embeddings"},
        {"\"hidden_act\": \"relu\"", "hidden_act"},
        {"\"hidden_dropout\": 0.1", "hidden_dropout"},
        {"\"attention_dropout\": 0.1", "attention_dropout"},
        {"\"rotary_pct\": 0.1", "rotary_pct"},
        {"\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", "rope_scaling.rope_type"},
        {"\"num_key_value_heads\": 2", "num_key_value_heads"},
    };
    mt_hf_check_refusals(NEOX, cases, sizeof cases / sizeof *cases);
}

/* The presets' parameter counts are the published ones (the "total
 * params" column of the Pythia model cards' table, the GPT-NeoX-20B
 * paper's). */
Test(neox_config, presets_have_the_published_parameter_counts) {
    struct { const char *name; int64_t n; } cases[] = {
        {"pythia-1b", 1011781632LL},
        {"pythia-6.9b", 6857302016LL},
        {"gpt-neox-20b", 20554567680LL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const mt_preset *p = mt_preset_find(cases[i].name);
        cr_assert_not_null(p, "%s", cases[i].name);
        mt_config c;
        mt_preset_config(p, 2048, &c);
        mt_error err;
        cr_assert_eq(mt_config_validate(&c, cases[i].name, &err), 0, "%s", err.msg);
        cr_assert_str_eq(c.model_type, "gpt_neox");
        cr_assert_eq(c.rotary_dim, c.HD / 4, "rotary_pct 0.25");
        cr_assert_eq(mt_config_num_params(&c), cases[i].n, "%s: %lld parameters", cases[i].name,
                     (long long)mt_config_num_params(&c));
    }
}
