/* phi3 (Phi-3 / Phi-3.5 mini and medium) on the CPU reference against
 * Hugging Face transformers, for the fixtures of scripts/make_fixtures.py:
 * phi3_gqa (Phi-3-mini-4k's block with grouped kv heads and a sliding
 * window longer than the sequence) and phi3_longrope (Phi-3.5's longrope,
 * with the long factors in use, and a tied lm_head): logits, loss, every
 * parameter's gradient, a 5-step AdamW trajectory, save and reload with
 * the fused qkv_proj and gate_up_proj; the config's fields, defaults and
 * refusals; the longrope tables; and a model made by `init --model-type
 * phi3` trained on the CPU. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_check.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "megatrain.h"
#include "model/config.h"
#include "model/params.h"
#include "model/presets.h"
#include "model/rope.h"
#include "testlib.h"

/* Tolerances, relative L2 error per tensor (mt_test_rel_err). phi3 runs
 * the Llama block of backend_cpu.c; both sides are fp32 on the CPU and
 * differ only in summation order and libm: observed (printed by the tests)
 * 4.4e-7 on the logits, 1.3e-7 on the loss, 1.1e-6 on the worst gradient
 * tensor. 1e-5 keeps a 9x margin and fails a layout mistake: gate and up
 * read swapped from gate_up_proj fail every check. */
#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-6
#define TOL_GRAD 1e-5
/* 5 AdamW steps magnify the gradients' rounding through m / sqrt(v) where
 * v is small (observed 2.2e-7 on weights, 1.9e-6 on m and v); the weights
 * leave out the elements whose gradient is rounding noise
 * (docs/fixtures.md), as the other families' tests do. */
#define TOL_TRAJ 2e-5

static const mt_hf_tols tols = {.logits = TOL_LOGITS, .loss = TOL_LOSS, .grad = TOL_GRAD,
                                 .traj = TOL_TRAJ};

static const char *models[] = {"phi3_gqa", "phi3_longrope"};
static int model_index[] = {0, 1};

ParameterizedTestParameters(phi3, logits_loss_and_gradients) {
    return cr_make_param_array(int, model_index, 2);
}

ParameterizedTest(int *which, phi3, logits_loss_and_gradients) {
    mt_config c;
    mt_hf_fixture_config(models[*which], &c);
    cr_assert_eq(c.arch, MT_ARCH_PHI3);
    cr_assert_eq(c.rope_kind, *which ? MT_ROPE_LONGROPE : MT_ROPE_DEFAULT);
    cr_assert_eq(c.sliding_window, *which ? 0 : 32);
    cr_assert_eq(c.tie_embeddings, *which == 1);
    mt_hf_check_forward_backward(models[*which], &tols);
}

/* The save holds qkv_proj and gate_up_proj, not their parts (the check
 * compares the saved names with the fixture's). */
MT_HF_FAMILY_TESTS(phi3, models, model_index, tols)

#define PHI3 "\"model_type\": \"phi3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, " \
             "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 32064"

/* Absent fields take Phi3Config's defaults (transformers 5); the table
 * keeps Llama's tensors, and the published fused names find their first
 * part. */
Test(phi3_config, defaults_and_the_fused_names) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" PHI3 "}", "config.json", &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, MT_ARCH_PHI3);
    cr_assert_eq(c.NKV, 4);
    cr_assert_eq(c.HD, 16);
    cr_assert_eq(c.max_pos, 4096);
    cr_assert_eq(c.rope_orig_max_pos, 4096);
    cr_assert_float_eq(c.rms_eps, 1e-5f, 0);
    cr_assert_float_eq(c.rope_theta, 10000.0, 0);
    cr_assert_eq(c.rope_kind, MT_ROPE_DEFAULT);
    cr_assert_eq(c.sliding_window, 0);
    cr_assert_not(c.tie_embeddings);
    cr_assert_eq(c.bos_id, 1);
    cr_assert_eq(c.eos_id, 32000);
    cr_assert_eq(c.pad_id, 32000);
    mt_param_table t;
    int layer;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert(t.fused_published);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    const mt_tensor_desc *q = mt_params_by_name(&t, "model.layers.1.self_attn.qkv_proj.weight",
                                                &layer);
    cr_assert_not_null(q);
    cr_assert_eq(layer, 2);
    cr_assert_eq(q->role, MT_T_WQ);
    const mt_tensor_desc *g = mt_params_by_name(&t, "model.layers.0.mlp.gate_up_proj.weight",
                                                &layer);
    cr_assert_not_null(g);
    cr_assert_eq(g->role, MT_T_WGATE);
    /* where each part lies in its published tensor */
    const mt_layer_desc *ld = &t.layers[1];
    struct { mt_role role; const char *name; int64_t rows, row0; } parts[] = {
        {MT_T_WQ, "model.layers.0.self_attn.qkv_proj.weight", 192, 0},
        {MT_T_WK, "model.layers.0.self_attn.qkv_proj.weight", 192, 64},
        {MT_T_WV, "model.layers.0.self_attn.qkv_proj.weight", 192, 128},
        {MT_T_WGATE, "model.layers.0.mlp.gate_up_proj.weight", 192, 0},
        {MT_T_WUP, "model.layers.0.mlp.gate_up_proj.weight", 192, 96},
    };
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        char name[96];
        int64_t rows, row0;
        const mt_tensor_desc *td = &ld->tensors[ld->by_role[parts[i].role]];
        cr_assert(mt_params_fused(&t, 1, td, name, &rows, &row0));
        cr_assert_str_eq(name, parts[i].name);
        cr_assert_eq(rows, parts[i].rows);
        cr_assert_eq(row0, parts[i].row0);
    }
    char name[96];
    int64_t rows, row0;
    cr_assert_not(mt_params_fused(&t, 1, &ld->tensors[ld->by_role[MT_T_WO]], name, &rows, &row0));
    mt_params_free(&t);
    /* a llama of the same shape publishes every part under its own name */
    cr_assert_eq(mt_config_parse(&c, "{" PHI3 "}", "config.json", &err), 0, "%s", err.msg);
    c.arch = MT_ARCH_LLAMA;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_null(mt_params_by_name(&t, "model.layers.1.self_attn.qkv_proj.weight", &layer));
    mt_params_free(&t);
}

/* Phi-3.5-mini's rope_scaling as its config.json writes it (transformers 4
 * layout, "type" and the top-level original_max_position_embeddings), and
 * the "su" of the first Phi-3-128k releases. */
Test(phi3_config, longrope_fields_and_round_trip) {
    const char *variants[] = {
        "{" PHI3 ", \"max_position_embeddings\": 131072, \"original_max_position_embeddings\": "
        "4096, \"rope_theta\": 10000.0, \"sliding_window\": 262144, \"pad_token_id\": 32000, "
        "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0, 1.05, 1.1, 1.25, "
        "1.5, 2.0, 2.5, 3.0], \"long_factor\": [1.08, 1.5, 2.3, 4.6, 9.9, 20.5, 40.1, 64.0]}}",
        "{" PHI3 ", \"max_position_embeddings\": 8192, \"rope_scaling\": {\"type\": \"su\", "
        "\"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], \"long_factor\": [2, 2, 2, 2, 2, 2, 2, 2], "
        "\"factor\": 4.0, \"attention_factor\": 1.25}, \"pad_token_id\": null, "
        "\"tie_word_embeddings\": true}",
        "{" PHI3 ", \"num_key_value_heads\": 2, \"sliding_window\": 2047, "
        "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500.0, "
        "\"partial_rotary_factor\": 1.0}}",
    };
    for (size_t i = 0; i < 3; i++) {
        mt_config c, d;
        mt_error err;
        cr_assert_eq(mt_config_parse(&c, variants[i], "config.json", &err), 0, "%s", err.msg);
        char *json = mt_config_to_json(&c);
        cr_assert_eq(mt_config_parse(&d, json, "saved", &err), 0, "%s\n%s", err.msg, json);
        cr_assert(strstr(json, "Phi3ForCausalLM"), "%s", json);
        free(json);
        cr_assert_eq(memcmp(&c, &d, sizeof c), 0, "variant %zu changed through to_json", i);
        if (i == 0) {
            cr_assert_eq(c.rope_kind, MT_ROPE_LONGROPE);
            cr_assert_eq(c.n_rope_factors, 8);
            cr_assert_float_eq(c.rope_long_factor[7], 64.0, 0);
            cr_assert_eq(c.rope_orig_max_pos, 4096);
            cr_assert_eq(c.sliding_window, 262144);
            /* transformers: sqrt(1 + ln(131072 / 4096) / ln(4096)) */
            double want = sqrt(1.0 + log(32.0) / log(4096.0));
            cr_assert_float_eq(mt_rope_attention_factor(&c), want, 1e-15);
        }
        if (i == 1) {
            cr_assert_eq(c.rope_kind, MT_ROPE_LONGROPE, "\"su\" is longrope");
            cr_assert_eq(c.pad_id, -1);
            cr_assert_float_eq(mt_rope_attention_factor(&c), 1.25, 0, "given, not derived");
        }
        if (i == 2) cr_assert_float_eq(c.rope_theta, 500.0, 0);
    }
}

Test(phi3_config, refusals_name_the_field) {
    const mt_hf_refusal cases[] = {
        {"\"partial_rotary_factor\": 0.75", "partial_rotary_factor"},
        {"\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.75}",
         "rope_parameters.partial_rotary_factor"},
        {"\"resid_pdrop\": 0.1", "resid_pdrop"},
        {"\"embd_pdrop\": 0.1", "embd_pdrop"},
        {"\"attention_dropout\": 0.1", "attention_dropout"},
        {"\"hidden_act\": \"gelu\"", "hidden_act"},
        {"\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2.0}", "rope_scaling.rope_type"},
        {"\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 8.0}", "rope_scaling.rope_type"},
        {"\"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1, 1, 1, 1, 1, 1, 1, 1]}",
         "rope_scaling.short_factor"},
        {"\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1, 1, 1, 1, 1, 1, "
         "1], \"long_factor\": [1, 1, 1]}",
         "rope_scaling.long_factor"},
        {"\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1, 1, 1, 1, 1, 1, "
         "0], \"long_factor\": [1, 1, 1, 1, 1, 1, 1, 1]}",
         "rope_scaling.short_factor[7]"},
        {"\"original_max_position_embeddings\": 0", "original_max_position_embeddings"},
        {"\"pad_token_id\": 32064", "pad_token_id"},
    };
    mt_hf_check_refusals(PHI3, cases, sizeof cases / sizeof *cases);
}

/* longrope divides inv_freq by the short factors for runs of at most
 * original_max_position_embeddings tokens and by the long ones beyond, as
 * transformers does for a forward of that length; cos and sin carry the
 * attention factor either way. */
Test(phi3_config, longrope_picks_its_factors_by_the_run_length) {
    mt_config c;
    mt_error err;
    cr_assert_eq(mt_config_parse(&c, "{" PHI3 ", \"max_position_embeddings\": 64, "
                                 "\"original_max_position_embeddings\": 16, \"rope_scaling\": "
                                 "{\"type\": \"longrope\", \"short_factor\": [1, 1, 1, 1, 1, 1, "
                                 "1, 1], \"long_factor\": [2, 2, 2, 2, 4, 4, 4, 4]}}",
                                 "config.json", &err),
                 0, "%s", err.msg);
    float s16[8], l17[8], plain[8];
    mt_rope_inv_freq(s16, &c, 16);
    mt_rope_inv_freq(l17, &c, 17);
    mt_config d = c;
    d.rope_kind = MT_ROPE_DEFAULT;
    mt_rope_inv_freq(plain, &d, 17);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(s16[i], plain[i], "short factors of 1 at T = 16 (pair %d)", i);
        float pw = powf(10000.0f, (float)(2 * i) / 16.0f);
        cr_assert_eq(l17[i], 1.0f / ((i < 4 ? 2.0f : 4.0f) * pw),
                     "long factors at T = 17 (pair %d)", i);
    }
    float cs[17 * 8], sn[17 * 8];
    mt_rope_tables(cs, sn, &c, 17);
    float a = (float)sqrt(1.0 + log(4.0) / log(16.0));
    cr_assert_eq(cs[0], a, "cos(0) is the attention factor");
    cr_assert_eq(cs[16 * 8 + 3], cosf(16.0f * l17[3]) * a);
    cr_assert_eq(sn[16 * 8 + 3], sinf(16.0f * l17[3]) * a);
}

/* The presets have the shapes of microsoft/Phi-3-mini-4k-instruct's and
 * Phi-3-medium-4k-instruct's config.json and validate. The parameter
 * counts are the model cards' 3.8B and 14B: 3,821,079,552 and
 * 13,960,238,080 from the table. */
Test(phi3_config, presets_validate) {
    const char *names[] = {"phi3-mini", "phi3-medium"};
    const int64_t params[] = {3821079552LL, 13960238080LL};
    for (int i = 0; i < 2; i++) {
        const mt_preset *p = mt_preset_find(names[i]);
        cr_assert_not_null(p, "%s", names[i]);
        mt_config c;
        mt_error err;
        mt_preset_config(p, 4096, &c);
        cr_assert_eq(mt_config_validate(&c, names[i], &err), 0, "%s", err.msg);
        cr_assert_eq(c.arch, MT_ARCH_PHI3);
        cr_assert_str_eq(c.model_type, "phi3");
        cr_assert_eq(mt_config_num_params(&c), params[i], "%s: %lld", names[i],
                     (long long)mt_config_num_params(&c));
        char *json = mt_config_to_json(&c);
        mt_config d;
        cr_assert_eq(mt_config_parse(&d, json, "preset", &err), 0, "%s\n%s", err.msg, json);
        free(json);
    }
}

/* `init --model-type phi3` writes the fused tensors, and the model trains
 * on the CPU. */
Test(phi3, a_phi3_made_by_init_trains_on_the_cpu, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), model[512];
    snprintf(model, sizeof model, "%s/model", dir);
    mt_model_shape s;
    mt_hf_tiny_shape(&s, "phi3");
    s.untied = true;
    mt_model_info info;
    mt_config c;
    mt_hf_init_model(model, &s, &info, &c);
    mt_st_model m;
    mt_error err;
    cr_assert_eq(mt_st_model_open(&m, model, &err), 0, "%s", err.msg);
    const mt_st_tensor_info *qkv = mt_st_model_find(&m, "model.layers.1.self_attn.qkv_proj.weight");
    cr_assert_not_null(qkv);
    cr_assert_eq(qkv->shape[0], 64 + 2 * 32);
    const mt_st_tensor_info *gu = mt_st_model_find(&m, "model.layers.0.mlp.gate_up_proj.weight");
    cr_assert_not_null(gu);
    cr_assert_eq(gu->shape[0], 2 * 128);
    cr_assert_null(mt_st_model_find(&m, "model.layers.0.self_attn.q_proj.weight"));
    cr_assert_null(mt_st_model_find(&m, "model.layers.0.mlp.up_proj.weight"));
    mt_st_model_close(&m);
    cr_assert_eq(c.arch, MT_ARCH_PHI3);
    cr_assert_eq(c.pad_id, -1, "no pad token: pad_token_id null");
    cr_assert_eq(c.eos_id, -1, "the byte tokenizer has no EOS: eos_token_id null, not "
                 "Phi3Config's 32000");
    mt_hf_check_trains_on_cpu(model, dir, "phi3", &c);
    cr_assert_str_eq(c.model_type, "phi3");
    mt_test_rmtree(dir);
    free(dir);
}
