/* Model configuration: the subset of a Hugging Face config.json that
 * describes a decoder-only Llama-family transformer (phi3 among them: its
 * fused qkv_proj and gate_up_proj are a matter of the files, io/model_io.c),
 * dense or
 * mixture-of-experts (docs/moe.md), a GPT-NeoX one (LayerNorm, fused
 * qkv, partial rotary, GELU MLP, biases, parallel residual), a Falcon one
 * (the same block without biases, one or two LayerNorms, multi-query or
 * grouped kv heads) or a Gemma 2 / Gemma 3 one (RMSNorm by 1 + w before and
 * after attention and MLP, GeGLU, soft-capping, sliding-window layers).
 *
 * Dimension letters used across megatrain:
 *   B batch, T sequence, C hidden, L decoder layers, NH query heads,
 *   NKV key/value heads, HD head dim, F MLP inner size, V vocabulary;
 *   for mixture-of-experts layers: E routed experts, K experts per token,
 *   FE an expert's inner size, FS the shared expert's inner size. */
#ifndef MT_MODEL_CONFIG_H
#define MT_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef enum {
    MT_ARCH_LLAMA,
    MT_ARCH_MISTRAL,
    MT_ARCH_QWEN2,
    MT_ARCH_QWEN3,
    MT_ARCH_MIXTRAL,
    MT_ARCH_QWEN2_MOE,
    MT_ARCH_QWEN3_MOE,
    MT_ARCH_GPT_NEOX,
    MT_ARCH_FALCON,
    MT_ARCH_PHI3,
    MT_ARCH_GEMMA2,
    MT_ARCH_GEMMA3_TEXT,
} mt_arch;

/* Whether arch is one of the mixture-of-experts families. */
static inline bool mt_arch_has_experts(mt_arch a) {
    return a == MT_ARCH_MIXTRAL || a == MT_ARCH_QWEN2_MOE || a == MT_ARCH_QWEN3_MOE;
}

/* Whether arch's blocks are backend/cpu/neox.c's (LayerNorm, fused qkv,
 * GELU MLP): gpt_neox and falcon. */
static inline bool mt_arch_has_neox_block(mt_arch a) {
    return a == MT_ARCH_GPT_NEOX || a == MT_ARCH_FALCON;
}

/* Whether arch's blocks are backend/cpu/gemma.c's: gemma2 and gemma3_text. */
static inline bool mt_arch_is_gemma(mt_arch a) {
    return a == MT_ARCH_GEMMA2 || a == MT_ARCH_GEMMA3_TEXT;
}

/* Whether arch's blocks are the Llama block (backend_cpu.c's on the CPU):
 * not neox.c's or gemma.c's. */
static inline bool mt_arch_has_llama_block(mt_arch a) {
    return !mt_arch_has_neox_block(a) && !mt_arch_is_gemma(a);
}

/* Whether transformers builds arch's embedding with padding_idx =
 * pad_token_id, so that the row of the pad token gets no gradient from the
 * lookup: every family but gpt_neox and falcon. */
static inline bool mt_arch_has_padding_idx(mt_arch a) { return !mt_arch_has_neox_block(a); }

/* Whether arch has CPU references only: no GPU kernels run its blocks yet.
 * None today (gpt_neox and falcon run on the GPU by neox_cuda.c, gemma2 and
 * gemma3_text by gemma_cuda.c); a family added with its CPU reference
 * first says so here, and `train` runs it on the CPU, `plan` notes it and
 * the CUDA backend refuses it. */
static inline bool mt_arch_cpu_only(mt_arch a) {
    (void)a;
    return false;
}

/* The MLP: SwiGLU, down(silu(gate x) * up x), or a plain two-layer MLP,
 * down(gelu(up x + b) + b), with the erf GELU or its tanh form. */
typedef enum {
    MT_ACT_SWIGLU,
    MT_ACT_GELU,       /* hidden_act "gelu" */
    MT_ACT_GELU_TANH,  /* "gelu_new", "gelu_fast", "gelu_pytorch_tanh" */
} mt_act;

typedef enum {
    MT_ROPE_DEFAULT,
    MT_ROPE_LLAMA3,
    MT_ROPE_LINEAR,   /* frequencies divided by rope_factor (gemma3's global layers) */
    MT_ROPE_LONGROPE, /* phi3's rope_scaling type "longrope" (or "su") */
} mt_rope_kind;

/* Most short and long factors of a longrope config megatrain reads: one per
 * rotated pair, head_dim / 2. */
#define MT_MAX_ROPE_FACTORS 256

/* Most entries of mlp_only_layers megatrain reads. */
#define MT_MAX_MLP_ONLY 256

/* The mixture-of-experts part of a config (all zero for a dense model).
 * A decoder block is an MoE block when E > 0, its index i is not in
 * mlp_only and (i + 1) % sparse_step == 0; other blocks have the dense MLP
 * of size F. */
typedef struct mt_moe_config {
    int64_t E;                 /* num_local_experts (mixtral) / num_experts (qwen) */
    int64_t K;                 /* num_experts_per_tok */
    int64_t FE;                /* moe_intermediate_size (mixtral: intermediate_size) */
    int64_t FS;                /* shared_expert_intermediate_size (qwen2_moe), else 0 */
    bool norm_topk;            /* top-k weights renormalised to sum 1 (mixtral: always) */
    int64_t sparse_step;       /* decoder_sparse_step */
    int n_mlp_only;
    int32_t mlp_only[MT_MAX_MLP_ONLY]; /* mlp_only_layers */
    double aux_coef;           /* router_aux_loss_coef */
    bool output_router_logits; /* as config.json says (written back unchanged) */
    bool aux_loss;             /* the backends add coef * load-balancing loss: set from
                                * output_router_logits, or by the run's router_aux_loss */
} mt_moe_config;

typedef struct mt_config {
    mt_arch arch;
    char model_type[32];       /* as written in config.json */
    int64_t C;                 /* hidden_size */
    int64_t L;                 /* num_hidden_layers */
    int64_t NH;                /* num_attention_heads */
    int64_t NKV;               /* num_key_value_heads */
    int64_t HD;                /* head_dim */
    int64_t F;                 /* intermediate_size */
    int64_t V;                 /* vocab_size */
    int64_t max_pos;           /* max_position_embeddings */
    float rms_eps;             /* rms_norm_eps; gpt_neox: layer_norm_eps; falcon:
                                * layer_norm_epsilon */
    double rope_theta;
    mt_rope_kind rope_kind;
    double rope_factor;        /* llama3 scaling; longrope: "factor" as given, 0 when
                                * absent (then max_pos / rope_orig_max_pos) */
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int64_t rope_orig_max_pos; /* original_max_position_embeddings */
    /* longrope: inv_freq[i] is divided by short_factor[i] in runs of at most
     * rope_orig_max_pos tokens, by long_factor[i] in longer ones; cos and
     * sin are scaled by attention_factor (rope_attn_factor as given, 0 when
     * absent: then derived, mt_rope_attention_factor) */
    int n_rope_factors;        /* head_dim / 2 */
    double rope_short_factor[MT_MAX_ROPE_FACTORS];
    double rope_long_factor[MT_MAX_ROPE_FACTORS];
    double rope_attn_factor;
    bool tie_embeddings;       /* tie_word_embeddings */
    bool qkv_bias;             /* qwen2: q/k/v projections have a bias */
    bool qk_norm;              /* qwen3: per-head RMSNorm on q and k */
    int64_t sliding_window;    /* 0 = full attention */
    /* gpt_neox and falcon (all zero for the Llama family) */
    bool layernorm;            /* LayerNorm with bias in place of RMSNorm */
    bool parallel_residual;    /* use_parallel_residual: x + attn(ln1 x) + mlp(ln2 x) */
    bool attn_bias;            /* attention_bias: biases on the fused qkv and on dense */
    mt_act act;                /* hidden_act; the GELU MLPs have biases */
    int64_t rotary_dim;        /* leading dims of a head that RoPE rotates, int(HD *
                                * rotary_pct); 0 = all HD */
    bool new_decoder;          /* falcon's new_decoder_architecture (Falcon-40B/180B):
                                * ln_attn and ln_mlp, grouped kv heads; false:
                                * Falcon-7B's one LayerNorm and one kv head */
    /* gemma2 and gemma3_text (zero for the others); the MLP is gated,
     * down(gelu(gate x) * up x), with act's GELU */
    double query_pre_attn_scalar; /* attention scale query_pre_attn_scalar ** -0.5 */
    double attn_softcap;       /* attn_logit_softcapping: scores cap * tanh(s / cap); 0: none */
    double final_softcap;      /* final_logit_softcapping, on the logits; 0: none */
    int64_t sliding_pattern;   /* block i is a sliding-window one (sliding_window keys)
                                * iff (i + 1) % sliding_pattern != 0; 1: none */
    double rope_local_theta;   /* gemma3_text: the sliding layers' base (rope_local_base_freq);
                                * rope_theta and rope_kind are the global layers' */
    /* pad_token_id, read where transformers' embedding takes it as padding_idx
     * (mt_arch_has_padding_idx), with the config class's default when absent
     * (phi3: 32000, gemma: 0, the others: none); written back as read */
    bool has_pad;              /* an integer; false: null (none), or gpt_neox / falcon */
    int64_t pad_id;            /* as given, in [-V, V) (negative: from the end, as
                                * nn.Embedding takes it); -1 when !has_pad */
    int64_t bos_id;            /* -1 when absent */
    int64_t eos_id;            /* -1 when absent */
    mt_moe_config moe;
} mt_config;

/* The embedding row that receives no gradient from the lookup (nn.Embedding's
 * padding_idx: pad_token_id, counted from the end when negative), or -1 for
 * none. With tied embeddings the head's gradient still reaches that row. */
static inline int64_t mt_config_padding_idx(const mt_config *c) {
    if (!c->has_pad || !mt_arch_has_padding_idx(c->arch)) return -1;
    return c->pad_id < 0 ? c->V + c->pad_id : c->pad_id;
}

/* The dims of a head that RoPE rotates (HD unless partial rotary). */
static inline int64_t mt_config_rotary_dim(const mt_config *c) {
    return c->rotary_dim > 0 ? c->rotary_dim : c->HD;
}

/* Parses config.json text. Unsupported or missing fields are an error that
 * names the field and what megatrain accepts. `source` names the input in
 * messages (a path). */
int mt_config_parse(mt_config *cfg, const char *json_text, const char *source,
                    mt_error *err);

/* Reads and parses a config.json file. */
int mt_config_load(mt_config *cfg, const char *path, mt_error *err);

/* Writes cfg as a Hugging Face config.json (loadable by transformers).
 * Returns a malloc'd string. */
char *mt_config_to_json(const mt_config *cfg);
/* The same with torch_dtype set to the dtype the weights are saved in
 * ("float32", "bfloat16"). */
char *mt_config_to_json_dtype(const mt_config *cfg, const char *torch_dtype);

/* Sets what a gpt_neox model of shape C, NH, HD has as Pythia has it:
 * NKV = NH, LayerNorm eps 1e-5, parallel residual, attention biases, erf
 * GELU, untied embed_out, rotary_pct 0.25 (rotary_dim HD / 4, even, at
 * least 2). Leaves rope_theta. For `init` and the presets. */
void mt_config_neox_defaults(mt_config *cfg);

/* Sets what a falcon model of shape C, NH, NKV has: with new_decoder the
 * architecture of Falcon-40B/180B (ln_attn and ln_mlp, NKV grouped kv
 * heads), else Falcon-7B's (one LayerNorm, NKV = 1); parallel attention
 * and MLP, no biases, erf GELU, LayerNorm eps 1e-5, full rotary. Leaves
 * rope_theta and the tying. For `init` and the presets. */
void mt_config_falcon_defaults(mt_config *cfg, bool new_decoder);

/* Sets what a gemma2 (gemma3 false) or gemma3_text model of shape C, NH,
 * NKV, HD has, as the published Gemma 2 / Gemma 3 configs: tanh GELU, RMSNorm
 * eps 1e-6, query_pre_attn_scalar HD; Gemma 2's soft-caps (50, 30) and every
 * other layer sliding over 4096 keys; Gemma 3's q/k norms, five sliding
 * layers (512 keys) to one global, and rope base 10000 on the sliding ones.
 * Leaves rope_theta (Gemma 3: the global layers') and the tying. For
 * `init` and the presets. */
void mt_config_gemma_defaults(mt_config *cfg, bool gemma3);

/* Whether decoder block i attends over a sliding window (gemma). */
bool mt_config_block_slides(const mt_config *cfg, int64_t i);

/* Makes cfg a phi3 model of its shape as Phi3Config has one: RMSNorm eps
 * 1e-5, no rope scaling (original_max_position_embeddings = max_pos), no
 * sliding window, no pad token. Leaves rope_theta, the tying and the
 * shape. For `init` and the presets. */
void mt_config_phi3_defaults(mt_config *cfg);

/* The built-in tiny model used by `make run` (byte-level vocabulary). */
void mt_config_default_tiny(mt_config *cfg);

/* Checks the derived invariants (NH % NKV == 0, sizes > 0, ...). */
int mt_config_validate(const mt_config *cfg, const char *source, mt_error *err);

/* Total parameter count (without padding). */
int64_t mt_config_num_params(const mt_config *cfg);

/* Whether the model has mixture-of-experts blocks at all, and whether
 * decoder block i (0-based) is one. */
bool mt_config_is_moe(const mt_config *cfg);
bool mt_config_block_is_moe(const mt_config *cfg, int64_t i);

/* Parameters one token works with: every parameter except, in each MoE
 * block, the E - K routed experts it is not sent to. Equals
 * mt_config_num_params for a dense model. */
int64_t mt_config_active_params(const mt_config *cfg);

/* Model FLOPs of one training token at sequence length T (docs/metrics.md,
 * "Model FLOPs"): 6 * active parameters + 12 * L * C * T (attention). */
double mt_config_train_flops_per_token(const mt_config *cfg, int64_t T);

#endif
