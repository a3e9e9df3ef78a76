/* megatrain init: a new model with random weights (Llama by default, or
 * another type, mixture-of-experts included), as a Hugging Face directory
 * (config.json, model.safetensors, tokenizer files), to pre-train from
 * scratch with `megatrain train --model DIR`. */
#include <stdio.h>
#include <sys/stat.h>

#include "cli/cli_options.h"
#include "cli/commands.h"
#include "train/model_init.h"

typedef struct init_args {
    const char *tokenizer, *out;
    int64_t hidden, layers, heads, kv_heads, ffn, max_pos, seed;
    int64_t experts, experts_per_tok, expert_ffn, shared_expert_ffn;
    double rope_theta, std;
    bool untied, norm_topk;
    int model_type;
    bool given[24];
} init_args;

#define OFF(field) offsetof(init_args, field)
static const mt_opt options[] = {
    {"tokenizer", MT_OPT_TEXT, OFF(tokenizer), NULL, NULL, MT_OPT_ANY, NULL, "PATH", NULL,
     "tokenizer.json; sets the vocabulary and BOS/EOS ids, and is copied into DIR with the "
     "tokenizer_config.json beside it"},
    {"out", MT_OPT_TEXT, OFF(out), NULL, NULL, MT_OPT_ANY, NULL, "DIR", NULL,
     "the new model directory (must not exist yet)"},
    MT_CLI_SHAPE(init_args, "1024", "12", "16", "4", "2816", "Shape", ""),
    {"max_pos", MT_OPT_INT, OFF(max_pos), "2048", NULL, MT_OPT_NONNEG, NULL, "N", NULL,
     "max_position_embeddings"},
    {"rope_theta", MT_OPT_FLOAT, OFF(rope_theta), "500000", NULL, MT_OPT_ABOVE(0), NULL, NULL,
     NULL, "RoPE base"},
    {"untied", MT_OPT_BOOL, OFF(untied), "false", NULL, MT_OPT_ANY, NULL, NULL, NULL,
     "a separate lm_head, not tied to the embedding"},
    {"std", MT_OPT_FLOAT, OFF(std), "0.02", NULL, MT_OPT_NONNEG, NULL, NULL, NULL,
     "standard deviation of the random matrices"},
    {"seed", MT_OPT_INT, OFF(seed), "1", NULL, MT_OPT_NONNEG, NULL, NULL, NULL,
     "seed of the random weights"},
    {"model_type", MT_OPT_ENUM, OFF(model_type), "llama", NULL, MT_OPT_ANY, mt_model_init_types,
     NULL, "Type", "the family; mixtral, qwen2_moe and qwen3_moe are mixtures of experts"},
    {"experts", MT_OPT_INT, OFF(experts), "8", NULL, MT_OPT_NONNEG, NULL, NULL, NULL,
     "mixture of experts: routed experts per layer"},
    {"experts_per_tok", MT_OPT_INT, OFF(experts_per_tok), "2", NULL, MT_OPT_NONNEG, NULL, NULL,
     NULL, "mixture of experts: experts each token is sent to"},
    {"expert_ffn", MT_OPT_INT, OFF(expert_ffn), "0", NULL, MT_OPT_NONNEG, NULL, NULL, NULL,
     "mixture of experts: an expert's inner size; 0: --ffn (mixtral: always --ffn)"},
    {"shared_expert_ffn", MT_OPT_INT, OFF(shared_expert_ffn), "0", NULL, MT_OPT_NONNEG, NULL,
     NULL, NULL, "qwen2_moe: the shared expert's inner size; 0: --ffn"},
    {"norm_topk", MT_OPT_BOOL, OFF(norm_topk), "", NULL, MT_OPT_ANY, NULL, NULL, NULL,
     "qwen mixtures of experts: renormalise the top-k weights; not given: yes for qwen3_moe, "
     "no for qwen2_moe (mixtral always does)"},
};
#undef OFF
static const mt_opt_table table = {
    .command = "init", MT_OPT_ROWS(options), MT_OPT_STRUCT(init_args),
    .about = "A new model with random weights, as a Hugging Face directory, to pre-train\n"
             "with megatrain train --model DIR."};

static int run(void *args, int argc, char **argv) {
    mt_cli_warn_launcher("init");
    init_args *a = args;
    struct stat st;
    if (stat(a->out, &st) == 0)
        return mt_cli_fail("init", 2, "%s already exists; choose a new --out directory (nothing "
                           "was written)", a->out);
    mt_model_shape sh = {.hidden = a->hidden, .layers = a->layers, .heads = a->heads,
                         .kv_heads = a->kv_heads, .ffn = a->ffn, .max_positions = a->max_pos,
                         .rope_theta = a->rope_theta, .init_std = a->std, .untied = a->untied,
                         .seed = (uint64_t)a->seed,
                         .model_type = mt_model_init_types[a->model_type],
                         .experts = a->experts, .experts_per_tok = a->experts_per_tok,
                         .expert_ffn = a->expert_ffn, .shared_expert_ffn = a->shared_expert_ffn,
                         .norm_topk = mt_opt_given(&table, a, "norm_topk") ? a->norm_topk : -1};
    mt_model_info info;
    if (mt_model_init(a->out, a->tokenizer, &sh, &info))
        return mt_cli_fail("init", 1, "%s", mt_last_error());
    char moe[96] = "";
    if (info.experts)
        snprintf(moe, sizeof moe, ", %lld experts, %lld per token, %.2fM active",
                 (long long)info.experts, (long long)info.experts_per_tok,
                 info.active_params / 1e6);
    printf("init: %s: %s, %.1fM parameters (hidden %lld, %lld layers, %lld/%lld heads, ffn "
           "%lld, vocab %lld%s%s)\n", a->out, info.model_type, info.n_params / 1e6,
           (long long)a->hidden, (long long)a->layers, (long long)a->heads, (long long)a->kv_heads,
           (long long)a->ffn, (long long)info.vocab_size, info.tied_embeddings ? ", tied" : "",
           moe);
    return 0;
}

const mt_cli_command mt_cli_init = {
    "init", "create a new model with random weights (HF directory)", &table, run};
