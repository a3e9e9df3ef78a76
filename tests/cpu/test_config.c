/* config.json parsing and the parameter table. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/file.h"
#include "testlib.h"

#include "model/config.h"
#include "model/params.h"

#define BASE                                                                     \
    "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
    "\"intermediate_size\": 48, \"vocab_size\": 96"

static int parse(const char *json, mt_config *cfg, mt_error *err) {
    return mt_config_parse(cfg, json, "config.json", err);
}

Test(config, llama_with_llama3_rope_v4_layout) {
    mt_config c;
    mt_error err;
    int rc = parse("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 2, "
                   "\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                   "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                   "\"original_max_position_embeddings\": 8192}, \"eos_token_id\": [7, 9]}",
                   &c, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(c.C, 32);
    cr_assert_eq(c.NKV, 2);
    cr_assert_eq(c.HD, 8);
    cr_assert_eq(c.rope_kind, MT_ROPE_LLAMA3);
    cr_assert_float_eq(c.rope_theta, 500000.0, 0);
    cr_assert_eq(c.rope_orig_max_pos, 8192);
    cr_assert_eq(c.eos_id, 7);
    cr_assert_not(c.qkv_bias);
}

Test(config, qwen3_v5_rope_parameters_and_head_dim) {
    mt_config c;
    mt_error err;
    int rc = parse("{\"model_type\": \"qwen3\", " BASE ", \"head_dim\": 16, "
                   "\"num_key_value_heads\": 1, \"tie_word_embeddings\": true, "
                   "\"layer_types\": [\"full_attention\", \"full_attention\"], "
                   "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}}",
                   &c, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    cr_assert_eq(c.HD, 16);
    cr_assert(c.qk_norm);
    cr_assert(c.tie_embeddings);
    cr_assert_float_eq(c.rope_theta, 1e6, 0);
}

Test(config, refusals_name_the_field) {
    struct { const char *json; const char *needle; } cases[] = {
        {"{\"model_type\": \"gpt2\", " BASE "}", "model_type"},
        {"{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"intermediate_size\": 48, \"vocab_size\": 96}", "hidden_size"},
        {"{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"gelu\"}", "hidden_act"},
        {"{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\"}}",
         "rope_type"},
        {"{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}",
         "num_key_value_heads"},
        {"{\"model_type\": \"llama\", " BASE ", \"attention_bias\": true}", "attention_bias"},
        {"{\"model_type\": \"llama\", \"hidden_size\": \"big\", \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 48, \"vocab_size\": 96}",
         "hidden_size"},
        {"{\"model_type\": \"qwen2\", " BASE ", \"use_sliding_window\": true}",
         "use_sliding_window"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 2, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 48, \"vocab_size\": 0}",
         "vocab_size"},
        {"{\"model_type\": \"llama\", " BASE ", \"pad_token_id\": 96}", "pad_token_id"},
        {"{\"model_type\": \"qwen2\", " BASE ", \"pad_token_id\": -97}", "pad_token_id"},
        {"{\"model_type\": \"mistral\", " BASE ", \"pad_token_id\": 1.5}", "pad_token_id"},
        {"{\"model_type\": \"gemma2\", " BASE ", \"pad_token_id\": \"<pad>\"}",
         "pad_token_id"},
        /* Phi3Config's 32000 when absent: outside a vocabulary of 96 */
        {"{\"model_type\": \"phi3\", " BASE "}", "pad_token_id"},
        {"[1, 2]", "JSON object"},
        {"{\"model_type\": \"llama\", " BASE, "JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mt_config c;
        mt_error err = {{0}};
        cr_assert_eq(parse(cases[i].json, &c, &err), -1, "case %zu accepted", i);
        cr_assert(strstr(err.msg, cases[i].needle), "case %zu: message '%s' lacks '%s'", i,
                  err.msg, cases[i].needle);
        cr_assert(strstr(err.msg, "config.json"), "case %zu: message names no input", i);
    }
}

/* pad_token_id where transformers' embedding takes it as padding_idx (not
 * gpt_neox's or falcon's): an integer, null, or the config class's default
 * when absent (None; Gemma's 0), counted from the end when negative as
 * nn.Embedding counts it; written back as read. */
Test(config, pad_token_id_is_the_padding_index_where_transformers_has_one) {
    struct { const char *type, *pad; bool has; int64_t id, row; } cases[] = {
        {"llama", NULL, false, -1, -1},
        {"llama", "null", false, -1, -1},
        {"llama", "5", true, 5, 5},
        {"llama", "-1", true, -1, 95},   /* nn.Embedding: padding_idx 96 - 1 */
        {"mistral", "0", true, 0, 0},
        {"qwen2", "95", true, 95, 95},
        {"qwen3_moe", "7", true, 7, 7},
        {"gemma2", NULL, true, 0, 0},     /* Gemma2Config's pad_token_id */
        {"gemma3_text", "null", false, -1, -1},
        {"gemma3_text", "3", true, 3, 3},
        {"gpt_neox", "5", false, -1, -1}, /* nn.Embedding without padding_idx */
        {"falcon", "5", false, -1, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[512], field[64] = "";
        if (cases[i].pad) snprintf(field, sizeof field, ", \"pad_token_id\": %s", cases[i].pad);
        snprintf(json, sizeof json, "{\"model_type\": \"%s\", " BASE "%s}", cases[i].type,
                 field);
        mt_config c, d;
        mt_error err;
        cr_assert_eq(parse(json, &c, &err), 0, "case %zu: %s", i, err.msg);
        cr_assert_eq(c.has_pad, cases[i].has, "case %zu", i);
        cr_assert_eq(c.pad_id, cases[i].id, "case %zu", i);
        cr_assert_eq(mt_config_padding_idx(&c), cases[i].row, "case %zu", i);
        char *back = mt_config_to_json(&c);
        cr_assert_eq(parse(back, &d, &err), 0, "case %zu: %s\n%s", i, err.msg, back);
        cr_assert_eq(d.has_pad, c.has_pad, "case %zu: %s", i, back);
        cr_assert_eq(d.pad_id, c.pad_id, "case %zu: %s", i, back);
        free(back);
    }
}

Test(config, missing_file_is_a_clear_error) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_load(&c, "/nonexistent/config.json", &err), -1);
    cr_assert(strstr(err.msg, "/nonexistent/config.json"));
}

Test(config, to_json_round_trips) {
    mt_config a, b;
    mt_error err;
    mt_config_default_tiny(&a);
    a.rope_kind = MT_ROPE_LLAMA3;
    a.rope_factor = 8;
    a.rope_low_freq_factor = 1;
    a.rope_high_freq_factor = 4;
    a.rope_orig_max_pos = 64;
    char *s = mt_config_to_json(&a);
    cr_assert_eq(mt_config_parse(&b, s, "generated", &err), 0, "%s", err.msg);
    free(s);
    cr_assert_eq(b.C, a.C);
    cr_assert_eq(b.L, a.L);
    cr_assert_eq(b.NKV, a.NKV);
    cr_assert_eq(b.V, a.V);
    cr_assert_eq(b.tie_embeddings, a.tie_embeddings);
    cr_assert_eq(b.rope_kind, MT_ROPE_LLAMA3);
    cr_assert_eq(b.rope_orig_max_pos, 64);
    cr_assert_eq(b.bos_id, a.bos_id);
}

/* The text of the number after "key": in json, into out; 0 when absent. */
static int number_text(const char *json, const char *key, char *out, size_t n) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    const char *p = strstr(json, quoted);
    if (!p) return 0;
    p += strlen(quoted);
    p += strspn(p, " \t\n");
    size_t len = strcspn(p, ",}\n \t");
    cr_assert_lt(len, n);
    memcpy(out, p, len);
    out[len] = 0;
    return 1;
}

/* The floats of the config.json megatrain writes read as those transformers
 * writes (Python's repr: 1e-05, 1000000.0, 0.1): for each fixture config of
 * tests/fixtures/models written by transformers (all but qwen3_moe_trained,
 * which megatrain wrote), the same text. */
Test(config, floats_are_written_as_transformers_writes_them) {
    static const char *const models[] = {"llama_gqa",        "mistral",         "mixtral_moe",
                                         "qwen2_bias_tied",  "qwen2_moe_shared", "qwen3_moe_qknorm",
                                         "qwen3_qknorm_mqa", "neox_parallel",   "neox_sequential",
                                         "falcon_mq",        "falcon_new_decoder",
                                         "gemma2_softcap",   "gemma3_text_sliding"};
    static const char *const keys[] = {"rms_norm_eps",    "layer_norm_eps",      "rope_theta",
                                       "layer_norm_epsilon",
                                       "factor",          "low_freq_factor",     "high_freq_factor",
                                       "router_aux_loss_coef"};
    int compared = 0;
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char path[1024], *theirs;
        size_t len;
        mt_error err;
        snprintf(path, sizeof path, "%s/models/%s/config.json", mt_test_fixtures_dir(), models[i]);
        cr_assert_eq(mt_read_file(path, &theirs, &len, &err), 0, "%s", err.msg);
        mt_config c;
        cr_assert_eq(mt_config_parse(&c, theirs, path, &err), 0, "%s", err.msg);
        char *ours = mt_config_to_json(&c);
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
            char a[64], b[64];
            if (!number_text(theirs, keys[k], a, sizeof a)) continue;
            /* gpt_neox is written as transformers 4 names it (Pythia's config.json) */
            cr_assert(number_text(ours, keys[k], b, sizeof b) ||
                          (!strcmp(keys[k], "rope_theta") &&
                           number_text(ours, "rotary_emb_base", b, sizeof b)),
                      "%s: no %s in\n%s", models[i], keys[k], ours);
            cr_expect_str_eq(b, a, "%s: %s", models[i], keys[k]);
            compared++;
        }
        free(ours);
        free(theirs);
    }
    cr_assert_geq(compared, 20);
}

Test(params, layout_is_layer_major_aligned_and_counts_match) {
    mt_config c;
    mt_error err;
    cr_assert_eq(parse("{\"model_type\": \"qwen2\", " BASE ", \"num_key_value_heads\": 2, "
                       "\"tie_word_embeddings\": true}", &c,
                       &err), 0, "%s", err.msg);
    mt_param_table t;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0);
    cr_assert_eq(t.n_layers, 4);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    size_t off = 0;
    for (int l = 0; l < t.n_layers; l++) {
        const mt_layer_desc *ld = &t.layers[l];
        cr_assert_eq(ld->offset, off, "layer %d not contiguous", l);
        cr_assert_eq(ld->offset % MT_LAYER_ALIGN, 0);
        size_t end = 0;
        for (int k = 0; k < ld->n_tensors; k++) {
            cr_assert_eq(ld->tensors[k].offset % MT_TENSOR_ALIGN, 0);
            cr_assert_geq(ld->tensors[k].offset, end, "tensors overlap");
            end = ld->tensors[k].offset + ld->tensors[k].numel;
        }
        cr_assert_leq(end, ld->numel);
        off += ld->numel;
    }
    cr_assert_eq(t.total, off);
    int layer = -1;
    const mt_tensor_desc *d = mt_params_by_name(&t, "model.layers.1.self_attn.k_proj.bias", &layer);
    cr_assert_not_null(d);
    cr_assert_eq(layer, 2);
    cr_assert_eq(d->shape[0], 2 * 8);
    cr_assert_null(mt_params_by_name(&t, "model.layers.7.mlp.up_proj.weight", NULL));
    cr_assert_null(mt_params_find(&t, 3, MT_T_LM_HEAD), "tied model has no lm_head tensor");
    mt_params_free(&t);
}
