/* Mixture-of-experts models outside the numerics (those are test_moe_hf.c):
 * config.json parsing and refusals, the parameter table's layout of MoE
 * blocks, sharded saving and loading, `megatrain init` of each type, a
 * qwen3_moe made by init that trains on the CPU, and the refusals of the
 * paths that do not run MoE models yet. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/store.h"
#include "io/model_io.h"
#include "megatrain.h"
#include "model/config.h"
#include "model/params.h"
#include "testlib.h"

#define ATTN                                                                          \
    "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "     \
    "\"num_key_value_heads\": 2, \"intermediate_size\": 48, \"vocab_size\": 96"

static int parse(const char *json, mt_config *c, mt_error *err) {
    return mt_config_parse(c, json, "config.json", err);
}

/* Mixtral-8x7B's config.json (transformers 4 layout), shrunk. */
Test(moe_config, mixtral_as_published) {
    mt_config c;
    mt_error err;
    cr_assert_eq(parse("{\"model_type\": \"mixtral\", " ATTN ", \"num_local_experts\": 8, "
                       "\"num_experts_per_tok\": 2, \"router_aux_loss_coef\": 0.02, "
                       "\"output_router_logits\": false, \"router_jitter_noise\": 0.0, "
                       "\"sliding_window\": null, \"rope_theta\": 1e6}", &c, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(c.arch, MT_ARCH_MIXTRAL);
    cr_assert_eq(c.moe.E, 8);
    cr_assert_eq(c.moe.K, 2);
    cr_assert_eq(c.moe.FE, 48, "mixtral's experts have intermediate_size");
    cr_assert(c.moe.norm_topk, "mixtral always renormalises");
    cr_assert_eq(c.moe.FS, 0);
    cr_assert_float_eq(c.moe.aux_coef, 0.02, 1e-15);
    cr_assert_not(c.moe.aux_loss);
    cr_assert_not(c.qkv_bias);
    cr_assert(mt_config_block_is_moe(&c, 0) && mt_config_block_is_moe(&c, 1));
    /* absent fields take MixtralConfig's defaults */
    cr_assert_eq(parse("{\"model_type\": \"mixtral\", " ATTN "}", &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.moe.E, 8);
    cr_assert_float_eq(c.rope_theta, 1e6, 0, "MixtralConfig.default_theta");
    cr_assert_float_eq(c.moe.aux_coef, 0.001, 1e-15);
}

Test(moe_config, qwen2_moe_shared_expert_and_dense_blocks) {
    mt_config c;
    mt_error err;
    cr_assert_eq(parse("{\"model_type\": \"qwen2_moe\", \"hidden_size\": 32, "
                       "\"num_hidden_layers\": 6, \"num_attention_heads\": 4, "
                       "\"intermediate_size\": 48, \"vocab_size\": 96, \"num_experts\": 60, "
                       "\"num_experts_per_tok\": 4, \"moe_intermediate_size\": 16, "
                       "\"shared_expert_intermediate_size\": 64, \"decoder_sparse_step\": 2, "
                       "\"mlp_only_layers\": [3], \"output_router_logits\": true, "
                       "\"use_sliding_window\": false}", &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, MT_ARCH_QWEN2_MOE);
    cr_assert(c.qkv_bias, "Qwen2MoeConfig.qkv_bias defaults to true");
    cr_assert_not(c.moe.norm_topk, "norm_topk_prob defaults to false");
    cr_assert_eq(c.moe.FS, 64);
    cr_assert(c.moe.aux_loss, "output_router_logits turns the aux loss on");
    /* (i + 1) % 2 == 0 and i not in [3]: blocks 1 and 5 */
    bool want[] = {false, true, false, false, false, true};
    for (int i = 0; i < 6; i++) cr_assert_eq(mt_config_block_is_moe(&c, i), want[i], "block %d", i);
    cr_assert_eq(parse("{\"model_type\": \"qwen2_moe\", " ATTN ", \"num_experts\": 0}", &c, &err),
                 0, "%s", err.msg);
    cr_assert_not(mt_config_is_moe(&c), "num_experts 0: every block is dense");
}

Test(moe_config, qwen3_moe_under_both_names_of_the_expert_count) {
    const char *keys[] = {"num_experts", "num_local_experts"};
    for (int k = 0; k < 2; k++) {
        char json[512];
        snprintf(json, sizeof json, "{\"model_type\": \"qwen3_moe\", " ATTN ", \"head_dim\": 16, "
                 "\"%s\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 24, "
                 "\"norm_topk_prob\": true}", keys[k]);
        mt_config c;
        mt_error err;
        cr_assert_eq(parse(json, &c, &err), 0, "%s", err.msg);
        cr_assert_eq(c.moe.E, 16, "%s", keys[k]);
        cr_assert(c.qk_norm);
        cr_assert(c.moe.norm_topk);
        cr_assert_eq(c.moe.FE, 24);
    }
}

Test(moe_config, refusals_name_the_field_and_the_fix) {
    struct { const char *json, *needle; } cases[] = {
        {"{\"model_type\": \"mixtral\", " ATTN ", \"router_jitter_noise\": 0.01}",
         "router_jitter_noise"},
        {"{\"model_type\": \"mixtral\", " ATTN ", \"num_local_experts\": 0}", "num_local_experts"},
        {"{\"model_type\": \"qwen3_moe\", " ATTN ", \"num_experts\": 4, \"num_experts_per_tok\": 5}",
         "num_experts_per_tok"},
        {"{\"model_type\": \"qwen3_moe\", " ATTN ", \"decoder_sparse_step\": 0}",
         "decoder_sparse_step"},
        {"{\"model_type\": \"qwen3_moe\", " ATTN ", \"mlp_only_layers\": [2]}", "mlp_only_layers"},
        {"{\"model_type\": \"qwen3_moe\", " ATTN ", \"mlp_only_layers\": 1}", "mlp_only_layers"},
        {"{\"model_type\": \"qwen2_moe\", " ATTN ", \"shared_expert_intermediate_size\": 0}",
         "shared_expert_intermediate_size"},
        {"{\"model_type\": \"qwen3_moe\", " ATTN ", \"router_aux_loss_coef\": -1}",
         "router_aux_loss_coef"},
        {"{\"model_type\": \"qwen3_moe\", " ATTN ", \"use_sliding_window\": true}",
         "use_sliding_window"},
        {"{\"model_type\": \"qwen3_moe\", " ATTN ", \"attention_bias\": true}", "attention_bias"},
        {"{\"model_type\": \"llama\", " ATTN ", \"num_experts\": 8}", "qwen3_moe"},
        {"{\"model_type\": \"deepseek_v3\", " ATTN "}", "mixtral"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mt_config c;
        mt_error err = {{0}};
        cr_assert_eq(parse(cases[i].json, &c, &err), -1, "case %zu accepted", i);
        cr_assert(strstr(err.msg, cases[i].needle), "case %zu: '%s' lacks '%s'", i, err.msg,
                  cases[i].needle);
        cr_assert(strstr(err.msg, "config.json"), "case %zu: names no input", i);
    }
}

Test(moe_config, to_json_round_trips_every_type) {
    const char *in[] = {
        "{\"model_type\": \"mixtral\", " ATTN ", \"num_local_experts\": 4, "
        "\"router_aux_loss_coef\": 0.02, \"output_router_logits\": true}",
        "{\"model_type\": \"qwen2_moe\", \"hidden_size\": 32, \"num_hidden_layers\": 3, "
        "\"num_attention_heads\": 4, \"intermediate_size\": 48, \"vocab_size\": 96, "
        "\"num_experts\": 6, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 8, "
        "\"shared_expert_intermediate_size\": 40, \"mlp_only_layers\": [0, 2], "
        "\"norm_topk_prob\": true, \"qkv_bias\": false, \"router_aux_loss_coef\": 0}",
        "{\"model_type\": \"qwen3_moe\", " ATTN ", \"num_experts\": 8, \"num_experts_per_tok\": 2, "
        "\"moe_intermediate_size\": 16, \"decoder_sparse_step\": 2}",
    };
    for (size_t i = 0; i < 3; i++) {
        mt_config a, b;
        mt_error err;
        cr_assert_eq(parse(in[i], &a, &err), 0, "%s", err.msg);
        char *s = mt_config_to_json(&a);
        cr_assert_eq(mt_config_parse(&b, s, "written", &err), 0, "%s\n%s", err.msg, s);
        cr_assert(strstr(s, "\"router_aux_loss_coef\":\t0.") || strstr(s, "e-"),
                  "a float stays a float: %s", s);
        free(s);
        cr_assert_eq(b.arch, a.arch);
        cr_assert_eq(b.qkv_bias, a.qkv_bias);
        cr_assert_eq(b.moe.E, a.moe.E);
        cr_assert_eq(b.moe.K, a.moe.K);
        cr_assert_eq(b.moe.FE, a.moe.FE);
        cr_assert_eq(b.moe.FS, a.moe.FS);
        cr_assert_eq(b.moe.norm_topk, a.moe.norm_topk);
        cr_assert_eq(b.moe.sparse_step, a.moe.sparse_step);
        cr_assert_eq(b.moe.n_mlp_only, a.moe.n_mlp_only);
        for (int k = 0; k < a.moe.n_mlp_only; k++) cr_assert_eq(b.moe.mlp_only[k], a.moe.mlp_only[k]);
        cr_assert_eq(b.moe.aux_coef, a.moe.aux_coef);
        cr_assert_eq(b.moe.output_router_logits, a.moe.output_router_logits);
        cr_assert_eq(mt_config_num_params(&b), mt_config_num_params(&a));
    }
}

/* qwen2_moe, blocks 0 and 2 MoE with a shared expert, block 1 dense. */
static void qwen2_moe_config(mt_config *c) {
    mt_error err;
    cr_assert_eq(parse("{\"model_type\": \"qwen2_moe\", \"hidden_size\": 32, "
                       "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
                       "\"intermediate_size\": 48, \"vocab_size\": 96, \"num_experts\": 5, "
                       "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 24, "
                       "\"shared_expert_intermediate_size\": 40, \"mlp_only_layers\": [1]}", c,
                       &err), 0, "%s", err.msg);
}

Test(moe_params, an_moe_block_is_one_layer_with_page_aligned_experts) {
    mt_config c;
    qwen2_moe_config(&c);
    mt_param_table t;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n_params, mt_config_num_params(&c));
    size_t off = 0;
    for (int l = 0; l < t.n_layers; l++) {
        const mt_layer_desc *ld = &t.layers[l];
        cr_assert_eq(ld->offset, off, "layer %d not contiguous", l);
        size_t end = 0;
        for (int k = 0; k < ld->n_tensors; k++) {
            cr_assert_geq(ld->tensors[k].offset, end, "layer %d: tensors overlap", l);
            end = ld->tensors[k].offset + ld->tensors[k].numel;
        }
        cr_assert_leq(end, ld->numel);
        off += ld->numel;
    }
    cr_assert_eq(t.layers[2].n_experts, 0, "block 1 is in mlp_only_layers");
    cr_assert_not_null(mt_params_find(&t, 2, MT_T_WGATE));
    int64_t C = c.C, FE = c.moe.FE;
    for (int l = 1; l <= 3; l += 2) {
        const mt_layer_desc *ld = &t.layers[l];
        cr_assert_eq(ld->n_experts, 5);
        cr_assert_null(mt_params_find(&t, l, MT_T_WGATE), "no dense MLP in an MoE block");
        cr_assert_not_null(mt_params_find(&t, l, MT_T_SHARED_GATE));
        cr_assert_eq(mt_params_find(&t, l, MT_T_ROUTER)->shape[0], 5);
        cr_assert_eq(ld->expert_offset % MT_LAYER_ALIGN, 0);
        cr_assert_eq(ld->expert_stride % MT_LAYER_ALIGN, 0);
        cr_assert_geq(ld->expert_stride, (size_t)(3 * FE * C));
        /* every fixed tensor before the experts; expert e at offset + e * stride */
        for (int k = 0; k < ld->expert_first; k++)
            cr_assert_leq(ld->tensors[k].offset + ld->tensors[k].numel, ld->expert_offset);
        cr_assert_eq(ld->n_tensors, ld->expert_first + 3 * 5);
        for (int e = 0; e < 5; e++) {
            const mt_tensor_desc *g = &ld->tensors[ld->expert_first + 3 * e];
            cr_assert_eq(g->expert, e);
            cr_assert_eq(g->role, MT_T_EXP_WGATE);
            cr_assert_eq(g->offset, ld->expert_offset + (size_t)e * ld->expert_stride);
            cr_assert_eq(g[2].role, MT_T_EXP_WDOWN);
            cr_assert_eq(g[2].shape[0], C);
            cr_assert_eq(g[2].shape[1], FE);
            cr_assert_leq(g[2].offset + g[2].numel, g->offset + ld->expert_stride);
            float base = 0;
            cr_assert_eq(mt_layer_expert_tensor(&base, ld, MT_T_EXP_WUP, e), &base + g[1].offset);
            char name[96];
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.weight", l - 1, e);
            int layer = -1;
            cr_assert_eq(mt_params_by_name(&t, name, &layer), &g[1], "%s", name);
            cr_assert_eq(layer, l);
        }
    }
    cr_assert_null(mt_params_by_name(&t, "model.layers.0.mlp.experts.5.up_proj.weight", NULL));
    cr_assert_null(mt_params_by_name(&t, "model.layers.1.mlp.experts.0.up_proj.weight", NULL));
    cr_assert_not_null(mt_params_by_name(&t, "model.layers.2.mlp.shared_expert_gate.weight", NULL));
    /* 2 MoE blocks route each token to 2 of 5 experts */
    cr_assert_eq(mt_config_active_params(&c), t.n_params - 2 * (5 - 2) * 3 * FE * C);
    mt_params_free(&t);
}

Test(moe_params, mixtral_names) {
    mt_config c;
    mt_error err;
    cr_assert_eq(parse("{\"model_type\": \"mixtral\", " ATTN ", \"num_local_experts\": 3}", &c,
                       &err), 0, "%s", err.msg);
    mt_param_table t;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    const char *names[] = {"model.layers.1.block_sparse_moe.gate.weight",
                           "model.layers.1.block_sparse_moe.experts.2.w1.weight",
                           "model.layers.1.block_sparse_moe.experts.2.w3.weight",
                           "model.layers.0.block_sparse_moe.experts.0.w2.weight"};
    const mt_role roles[] = {MT_T_ROUTER, MT_T_EXP_WGATE, MT_T_EXP_WUP, MT_T_EXP_WDOWN};
    for (int i = 0; i < 4; i++) {
        const mt_tensor_desc *d = mt_params_by_name(&t, names[i], NULL);
        cr_assert_not_null(d, "%s", names[i]);
        cr_assert_eq(d->role, roles[i], "%s", names[i]);
    }
    mt_params_free(&t);
}

/* A random MoE model saved in shards of 16 kB loads back to the same
 * weights; a tensor of an unknown expert is refused by name. */
Test(moe_io, sharded_save_and_load) {
    mt_config c;
    qwen2_moe_config(&c);
    mt_param_table t;
    mt_host_store a, b;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&a, &t, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&b, &t, 0, &err), 0, "%s", err.msg);
    mt_host_store_init_random(&a, 7, 0.1f);
    char *dir = mt_test_tmpdir(), m[512], idx[640];
    snprintf(m, sizeof m, "%s/model", dir);
    cr_assert_eq(mt_model_save(&a, &c, m, MT_DTYPE_F32, 16 << 10, &err), 0, "%s", err.msg);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", m);
    FILE *f = fopen(idx, "r");
    cr_assert_not_null(f, "more than one shard, with an index");
    fclose(f);
    mt_config back;
    cr_assert_eq(mt_model_load_config(&back, m, &err), 0, "%s", err.msg);
    cr_assert_eq(back.moe.E, c.moe.E);
    cr_assert_eq(mt_model_load_weights(&b, m, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(a.w, b.w, t.total * sizeof(float)), 0);

    /* the same files against a config with fewer experts: expert 4 is unknown */
    mt_config fewer = c;
    fewer.moe.E = 4;
    mt_param_table t4;
    mt_host_store s4;
    cr_assert_eq(mt_params_init(&t4, &fewer, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&s4, &t4, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_model_load_weights(&s4, m, &err), -1);
    cr_assert(strstr(err.msg, "experts.4.") || strstr(err.msg, "mlp.gate.weight"), "%s", err.msg);
    mt_host_store_free(&s4);
    mt_params_free(&t4);
    mt_host_store_free(&a);
    mt_host_store_free(&b);
    mt_params_free(&t);
    mt_test_rmtree(dir);
    free(dir);
}

static void init_shape(mt_model_shape *s, const char *type) {
    mt_model_shape_defaults(s);
    s->model_type = type;
    s->hidden = 32, s->layers = 2, s->heads = 4, s->kv_heads = 2, s->ffn = 32;
    s->max_positions = 64, s->experts = 4, s->experts_per_tok = 2, s->expert_ffn = 16;
    s->init_std = 0.1;
}

Test(moe_init, init_makes_each_type) {
    char *dir = mt_test_tmpdir(), tok[512], out[512];
    snprintf(tok, sizeof tok, "%s/tokenizer/tiny_bytelevel.json", mt_test_fixtures_dir());
    const char *types[] = {"mixtral", "qwen2_moe", "qwen3_moe", "qwen3"};
    for (int i = 0; i < 4; i++) {
        mt_model_shape s;
        init_shape(&s, types[i]);
        snprintf(out, sizeof out, "%s/%s", dir, types[i]);
        mt_model_info info;
        cr_assert_eq(mt_model_init(out, tok, &s, &info), 0, "%s", mt_last_error());
        cr_assert_str_eq(info.model_type, types[i]);
        mt_config c;
        mt_error err;
        cr_assert_eq(mt_model_load_config(&c, out, &err), 0, "%s", err.msg);
        cr_assert_str_eq(c.model_type, types[i]);
        if (i == 3) {
            cr_assert_eq(info.experts, 0);
            cr_assert_eq(info.active_params, info.n_params);
            continue;
        }
        cr_assert_eq(info.experts, 4);
        cr_assert_eq(c.moe.FE, i == 0 ? 32 : 16, "mixtral's experts have --ffn");
        cr_assert_eq(c.moe.FS, i == 1 ? 32 : 0);
        cr_assert_eq(c.moe.norm_topk, i != 1, "defaults: mixtral always, qwen3_moe yes, qwen2_moe no");
        cr_assert_eq(info.active_params, info.n_params - 2 * 2 * 3 * c.moe.FE * 32);
        mt_model *m = mt_model_open(out, NULL);
        cr_assert(m, "%s", mt_last_error());
        mt_model_close(m);
    }
    mt_model_shape s;
    init_shape(&s, "qwen3_moe");
    s.experts_per_tok = 5;
    snprintf(out, sizeof out, "%s/bad", dir);
    cr_assert_eq(mt_model_init(out, tok, &s, NULL), -1);
    cr_assert(strstr(mt_last_error(), "experts-per-tok"), "%s", mt_last_error());
    init_shape(&s, "gpt2");
    cr_assert_eq(mt_model_init(out, tok, &s, NULL), -1);
    cr_assert(strstr(mt_last_error(), "gpt2"), "%s", mt_last_error());
    mt_test_rmtree(dir);
    free(dir);
}

/* A qwen3_moe made by init learns a repetitive text on the CPU with the aux
 * loss on: the loss of the last steps is well below that of the first. */
Test(moe_init, a_qwen3_moe_made_by_init_trains_on_the_cpu, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), tok[512], model[512], data[512], out[512];
    snprintf(tok, sizeof tok, "%s/tokenizer/tiny_bytelevel.json", mt_test_fixtures_dir());
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    snprintf(out, sizeof out, "%s/run", dir);
    mt_model_shape s;
    init_shape(&s, "qwen3_moe");
    cr_assert_eq(mt_model_init(model, tok, &s, NULL), 0, "%s", mt_last_error());
    FILE *f = fopen(data, "w");
    for (int i = 0; i < 200; i++) /* 13k tokens: more than 16 steps of 256 take */
        fprintf(f, "{\"text\": \"the old man saw the river boat near the city by night %d\"}\n",
                i % 7);
    fclose(f);
    mt_options *o = mt_options_new();
    const char *kv[][2] = {{"model", model},       {"data", data},         {"out", out},
                           {"device", "cpu"},      {"steps", "16"},        {"seq_len", "32"},
                           {"batch_size", "4"},    {"micro_batches", "2"}, {"lr", "3e-3"},
                           {"warmup_steps", "2"},  {"save_every", "0"},    {"sample_tokens", "0"},
                           {"router_aux_loss", "true"}, {"save_dtype", "fp32"}};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        cr_assert_eq(mt_options_set(o, kv[i][0], kv[i][1]), 0, "%s", mt_last_error());
    mt_run *r = mt_run_open(o, NULL, NULL);
    cr_assert(r, "%s", mt_last_error());
    mt_step_metrics m[16];
    int n = 0;
    while (n < 16 && mt_run_step(r, &m[n]) == 0) {
        cr_assert(isfinite(m[n].loss) && m[n].tflops > 0, "step %d", n);
        n++;
    }
    cr_assert_eq(n, 16);
    double first = (m[0].loss + m[1].loss) / 2, last = (m[14].loss + m[15].loss) / 2;
    /* from ln(660) = 6.5 at random init: a drop of 1 nat takes a few steps */
    cr_assert_lt(last, first - 1.0, "loss %.4f -> %.4f", first, last);
    cr_log_info("qwen3_moe made by init: loss %.4f -> %.4f in 16 steps", first, last);
    cr_assert_eq(mt_run_finish(r), 0, "%s", mt_last_error());
    mt_run_close(r);
    mt_options_free(o);
    char saved[640];
    snprintf(saved, sizeof saved, "%s/model", out);
    mt_model *mm = mt_model_open(saved, NULL);
    cr_assert(mm, "the saved model loads: %s", mt_last_error());
    mt_model_info info;
    mt_model_describe(mm, &info);
    cr_assert_str_eq(info.model_type, "qwen3_moe");
    mt_model_close(mm);
    mt_test_rmtree(dir);
    free(dir);
}

Test(moe_init, router_aux_loss_is_refused_for_a_dense_model) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_options *o = mt_options_new();
    cr_assert_eq(mt_options_set(o, "out", out), 0);
    cr_assert_eq(mt_options_set(o, "device", "cpu"), 0);
    cr_assert_eq(mt_options_set(o, "router_aux_loss", "true"), 0);
    cr_assert_null(mt_run_open(o, NULL, NULL));
    cr_assert(strstr(mt_last_error(), "router_aux_loss"), "%s", mt_last_error());
    mt_options_free(o);
    mt_test_rmtree(dir);
    free(dir);
}

/* `megatrain plan` sizes the CUDA backend, which runs MoE blocks, in every
 * build (the GPU memory layout is plain C). */
Test(moe_init, plan_sizes_an_moe_model) {
    char model[512];
    snprintf(model, sizeof model, "%s/models/qwen3_moe_qknorm", mt_test_fixtures_dir());
    char *argv[] = {"plan", "--model", model, "--seq-len", "16", "--batch-size", "2", NULL};
    cr_assert_eq(mt_test_cli(argv), 0);
}
