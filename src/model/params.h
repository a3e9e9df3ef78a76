/* The parameter table: one entry {name, shape, offset} per tensor, grouped
 * in layers, laid out layer-major in one flat fp32 array.
 *
 * Layers are: layer 0 = embedding, layers 1..L = decoder blocks, layer L+1 =
 * head (final norm and, when untied, lm_head). With tied embeddings the head
 * reads layer 0's embedding as its output matrix.
 *
 * Every tensor starts on a 64-byte boundary inside its layer, and every
 * layer starts on a 4096-byte boundary, so that one layer is one contiguous,
 * page-aligned range that moves in one copy. The same table drives the host
 * store, gradients, checkpoints, transfers and safetensors I/O.
 *
 * A mixture-of-experts block is one layer too: its attention, router and
 * shared expert first, then its E routed experts, each a page-aligned
 * sub-range of the same size (gate, up, down): expert e starts at
 * expert_offset + e * expert_stride (docs/moe.md). */
#ifndef MT_MODEL_PARAMS_H
#define MT_MODEL_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

#define MT_TENSOR_ALIGN 16   /* floats: 64 bytes */
#define MT_LAYER_ALIGN 1024  /* floats: 4096 bytes */

typedef enum {
    MT_LAYER_EMBED,
    MT_LAYER_BLOCK,
    MT_LAYER_HEAD,
} mt_layer_kind;

/* Role of a tensor inside its layer. */
typedef enum {
    MT_T_EMBED,       /* (V, C)  model.embed_tokens.weight */
    MT_T_ATTN_NORM,   /* (C)     input_layernorm.weight */
    MT_T_WQ,          /* (NH*HD, C) */
    MT_T_BQ,          /* (NH*HD)   qwen2 */
    MT_T_WK,          /* (NKV*HD, C) */
    MT_T_BK,          /* (NKV*HD)  qwen2 */
    MT_T_WV,          /* (NKV*HD, C) */
    MT_T_BV,          /* (NKV*HD)  qwen2 */
    MT_T_QNORM,       /* (HD)      qwen3 */
    MT_T_KNORM,       /* (HD)      qwen3 */
    MT_T_WO,          /* (C, NH*HD) */
    MT_T_MLP_NORM,    /* (C)     post_attention_layernorm.weight */
    MT_T_WGATE,       /* (F, C) */
    MT_T_WUP,         /* (F, C) */
    MT_T_WDOWN,       /* (C, F) */
    MT_T_FINAL_NORM,  /* (C)     model.norm.weight */
    MT_T_LM_HEAD,     /* (V, C)  lm_head.weight, untied only */
    /* mixture-of-experts blocks, in place of WGATE/WUP/WDOWN */
    MT_T_ROUTER,      /* (E, C)  mlp.gate.weight (mixtral: block_sparse_moe.gate.weight) */
    MT_T_SHARED_WGATE, /* (FS, C) mlp.shared_expert.gate_proj.weight   qwen2_moe */
    MT_T_SHARED_WUP,  /* (FS, C) mlp.shared_expert.up_proj.weight */
    MT_T_SHARED_WDOWN, /* (C, FS) mlp.shared_expert.down_proj.weight */
    MT_T_SHARED_GATE, /* (1, C)  mlp.shared_expert_gate.weight: the sigmoid gate */
    MT_T_EXP_WGATE,   /* (FE, C) mlp.experts.<e>.gate_proj.weight (mixtral: w1), per expert */
    MT_T_EXP_WUP,     /* (FE, C) mlp.experts.<e>.up_proj.weight (mixtral: w3) */
    MT_T_EXP_WDOWN,   /* (C, FE) mlp.experts.<e>.down_proj.weight (mixtral: w2) */
    /* gpt_neox and falcon: the LayerNorms' biases, the fused qkv, the linear
     * biases (gpt_neox only); the MLP is WUP (dense_h_to_4h) and WDOWN
     * (dense_4h_to_h). Falcon-7B has one LayerNorm: no MLP_NORM. */
    MT_T_ATTN_NORM_B, /* (C)     input_layernorm.bias (falcon new decoder: ln_attn) */
    MT_T_MLP_NORM_B,  /* (C)     post_attention_layernorm.bias (falcon: ln_mlp) */
    MT_T_WQKV,        /* ((NH+2*NKV)*HD, C) query_key_value.weight, rows grouped per kv
                       * head as published: [NKV][NH/NKV q heads, k, v][HD]; gpt_neox
                       * (NKV = NH): [head][q, k, v], Falcon-7B (NKV = 1): [q..., k, v] */
    MT_T_BQKV,        /* (NH*3*HD) attention.query_key_value.bias (attention_bias) */
    MT_T_BO,          /* (C)     attention.dense.bias (attention_bias) */
    MT_T_BUP,         /* (F)     mlp.dense_h_to_4h.bias */
    MT_T_BDOWN,       /* (C)     mlp.dense_4h_to_h.bias */
    MT_T_FINAL_NORM_B, /* (C)    gpt_neox.final_layer_norm.bias */
    /* gemma: norms after attention and MLP too; ATTN_NORM is input_layernorm,
     * MLP_NORM pre_feedforward_layernorm */
    MT_T_ATTN_POST_NORM, /* (C)  post_attention_layernorm.weight */
    MT_T_MLP_POST_NORM, /* (C)   post_feedforward_layernorm.weight */
    MT_T_COUNT
} mt_role;

/* Tensors of one routed expert, in this order: gate, up, down. */
#define MT_EXPERT_TENSORS 3

typedef struct mt_tensor_desc {
    char name[96];     /* Hugging Face name, e.g. model.layers.3.mlp.up_proj.weight */
    mt_role role;
    int expert;        /* routed expert index, -1 for every other tensor */
    int ndim;          /* 1 or 2 */
    int64_t shape[2];  /* (rows, cols) as in PyTorch; shape[1] = 1 for 1-D */
    size_t numel;
    size_t offset;     /* in floats, from the start of the layer */
} mt_tensor_desc;

typedef struct mt_layer_desc {
    mt_layer_kind kind;
    int block;                        /* decoder block index, -1 otherwise */
    int n_tensors;
    mt_tensor_desc *tensors;          /* (n_tensors) in offset order */
    int by_role[MT_T_COUNT];          /* index into tensors, -1 if absent; for the
                                       * MT_T_EXP_* roles, expert 0's tensor */
    size_t numel;                     /* padded size of the layer, in floats */
    size_t offset;                    /* in floats, from the start of the model */
    /* routed experts (0 in a dense layer): expert e's tensors are
     * tensors[expert_first + MT_EXPERT_TENSORS * e + j], j = gate, up, down,
     * in the range [expert_offset + e * expert_stride, + expert_stride) of
     * the layer, page-aligned */
    int n_experts;
    int expert_first;
    size_t expert_offset;             /* floats from the start of the layer */
    size_t expert_stride;             /* floats between consecutive experts */
} mt_layer_desc;

typedef struct mt_param_table {
    bool fused_published;      /* phi3: q, k, v are published as rows of one
                                * self_attn.qkv_proj and gate, up as rows of
                                * mlp.gate_up_proj (mt_params_fused); the table
                                * keeps Llama's tensors and names */
    int n_layers;              /* L + 2 */
    mt_layer_desc *layers;     /* (n_layers) */
    size_t total;              /* padded floats in the flat layer-major array */
    int64_t n_params;          /* real parameters, no padding */
    size_t max_layer_numel;    /* largest layer, for GPU slots */
    bool norm_offset;          /* gemma: every RMSNorm scales by 1 + w, so its weights
                                * start at 0 where other models' start at 1 */
} mt_param_table;

/* Whether a tensor of this role is a bias (initialised to 0, where other
 * 1-D tensors, norm weights, start at 1). */
static inline bool mt_role_is_bias(mt_role r) {
    return r == MT_T_BQ || r == MT_T_BK || r == MT_T_BV || r == MT_T_ATTN_NORM_B ||
           r == MT_T_MLP_NORM_B || r == MT_T_BQKV || r == MT_T_BO || r == MT_T_BUP ||
           r == MT_T_BDOWN || r == MT_T_FINAL_NORM_B;
}

/* Whether the GPU reads this tensor's fp32 values even when it computes in
 * bf16 (norm weights, biases, the MoE router and shared-expert gate): a
 * layer whose fp32 weights live on disk keeps these exact in RAM beside
 * the bf16 copy of the rest. */
static inline bool mt_tensor_read_fp32(const mt_tensor_desc *td) {
    return td->ndim == 1 || td->role == MT_T_ROUTER || td->role == MT_T_SHARED_GATE;
}

/* Builds the table for cfg. Returns -1 with a message if a size overflows. */
int mt_params_init(mt_param_table *t, const mt_config *cfg, mt_error *err);
void mt_params_free(mt_param_table *t);

/* Tensor of `role` in layer `layer`, or NULL if that layer has none. */
const mt_tensor_desc *mt_params_find(const mt_param_table *t, int layer, mt_role role);

/* Looks a tensor up by its Hugging Face name; sets *layer. NULL if unknown.
 * A fused published name (mt_params_fused) gives its first part. */
const mt_tensor_desc *mt_params_by_name(const mt_param_table *t, const char *name,
                                        int *layer);

/* Where tensor td of layer `layer` is published when it is rows of a fused
 * tensor (t->fused_published: WQ, WK, WV in self_attn.qkv_proj, WGATE, WUP
 * in mlp.gate_up_proj): the published name into name (96 chars), its rows
 * into *rows (its columns are td's) and the first row of td in it into
 * *row0; true. false when td is published under its own name. */
bool mt_params_fused(const mt_param_table *t, int layer, const mt_tensor_desc *td, char *name,
                     int64_t *rows, int64_t *row0);

/* Pointer to a tensor inside a layer's range (base = start of that layer).
 * For a routed expert's role, expert 0's tensor. */
static inline float *mt_layer_tensor(float *layer_base, const mt_layer_desc *ld,
                                     mt_role role) {
    int i = ld->by_role[role];
    return i < 0 ? NULL : layer_base + ld->tensors[i].offset;
}

/* Pointer to routed expert e's tensor of `role` (MT_T_EXP_*). */
static inline float *mt_layer_expert_tensor(float *layer_base, const mt_layer_desc *ld,
                                            mt_role role, int e) {
    int i = ld->by_role[role];
    return i < 0 ? NULL : layer_base + ld->tensors[i].offset + (size_t)e * ld->expert_stride;
}

/* The layer index of the head and of decoder block b. */
static inline int mt_params_head_layer(const mt_param_table *t) { return t->n_layers - 1; }
static inline int mt_params_block_layer(int b) { return b + 1; }

#endif
