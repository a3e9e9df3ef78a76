/* The parameter table: names, shapes and layer-major offsets of every
 * tensor, derived from the config alone. */
#include "model/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

typedef struct {
    mt_layer_desc *ld;
    int cap;           /* room in ld->tensors */
    size_t cursor;     /* floats used so far in this layer */
    bool overflow;
} layer_builder;

/* Tensors other than routed experts in one layer, at most. */
#define MAX_FIXED_TENSORS 24

static void add(layer_builder *b, mt_role role, const char *name, int64_t rows, int64_t cols) {
    mt_layer_desc *ld = b->ld;
    MT_ASSERT(ld->n_tensors < b->cap);
    mt_tensor_desc *t = &ld->tensors[ld->n_tensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->role = role;
    t->expert = -1;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 1;
    size_t n = 0, next = 0;
    if (!mt_mul_size((size_t)rows, (size_t)t->shape[1], &n) ||
        !mt_add_size(b->cursor, mt_round_up(n, MT_TENSOR_ALIGN), &next))
        b->overflow = true;
    t->numel = n;
    t->offset = b->cursor;
    b->cursor = next;
    if (ld->by_role[role] < 0) ld->by_role[role] = ld->n_tensors;
    ld->n_tensors++;
}

/* Rounds the cursor up to a page, where the next expert starts. */
static void align_page(layer_builder *b) {
    if (b->cursor > SIZE_MAX - MT_LAYER_ALIGN) b->overflow = true;
    else b->cursor = mt_round_up(b->cursor, MT_LAYER_ALIGN);
}

static void begin(layer_builder *b, mt_layer_desc *ld, mt_layer_kind kind, int block,
                  int64_t n_experts) {
    memset(ld, 0, sizeof *ld);
    ld->kind = kind;
    ld->block = block;
    for (int r = 0; r < MT_T_COUNT; r++) ld->by_role[r] = -1;
    b->cap = MAX_FIXED_TENSORS + MT_EXPERT_TENSORS * (int)n_experts;
    ld->tensors = mt_calloc_or_die((size_t)b->cap, sizeof *ld->tensors);
    b->ld = ld;
    b->cursor = 0;
}

static void end(layer_builder *b) {
    b->ld->numel = mt_round_up(b->cursor, MT_LAYER_ALIGN);
}

/* The MLP of an MoE block under the names of the published checkpoints:
 * router, shared expert (qwen2_moe), then expert 0..E-1 on pages of their
 * own, each gate, up, down. */
static void build_moe(layer_builder *b, const mt_config *c, int i) {
    const mt_moe_config *m = &c->moe;
    const char *mlp = c->arch == MT_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp";
    bool mixtral = c->arch == MT_ARCH_MIXTRAL;
    char n[96];
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    add(b, MT_T_ROUTER, NAME("model.layers.%d.%s.gate.weight", i, mlp), m->E, c->C);
    if (m->FS) {
        add(b, MT_T_SHARED_WGATE, NAME("model.layers.%d.mlp.shared_expert.gate_proj.weight", i),
            m->FS, c->C);
        add(b, MT_T_SHARED_WUP, NAME("model.layers.%d.mlp.shared_expert.up_proj.weight", i),
            m->FS, c->C);
        add(b, MT_T_SHARED_WDOWN, NAME("model.layers.%d.mlp.shared_expert.down_proj.weight", i),
            c->C, m->FS);
        add(b, MT_T_SHARED_GATE, NAME("model.layers.%d.mlp.shared_expert_gate.weight", i), 1,
            c->C);
    }
    mt_layer_desc *ld = b->ld;
    align_page(b);
    ld->n_experts = (int)m->E;
    ld->expert_first = ld->n_tensors;
    ld->expert_offset = b->cursor;
    const char *names[2][MT_EXPERT_TENSORS] = {{"gate_proj", "up_proj", "down_proj"},
                                               {"w1", "w3", "w2"}};
    const mt_role roles[MT_EXPERT_TENSORS] = {MT_T_EXP_WGATE, MT_T_EXP_WUP, MT_T_EXP_WDOWN};
    for (int e = 0; e < m->E; e++) {
        for (int j = 0; j < MT_EXPERT_TENSORS; j++) {
            int down = roles[j] == MT_T_EXP_WDOWN;
            add(b, roles[j], NAME("model.layers.%d.%s.experts.%d.%s.weight", i, mlp, e,
                                  names[mixtral][j]),
                down ? c->C : m->FE, down ? m->FE : c->C);
            ld->tensors[ld->n_tensors - 1].expert = e;
        }
        align_page(b);
        if (e == 0) ld->expert_stride = b->cursor - ld->expert_offset;
    }
#undef NAME
}

static void build_block(layer_builder *b, const mt_config *c, int i) {
    char n[96];
    int64_t q = c->NH * c->HD, kv = c->NKV * c->HD;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d." suffix, i), n)
    bool gemma = mt_arch_is_gemma(c->arch);
    add(b, MT_T_ATTN_NORM, NAME("input_layernorm.weight"), c->C, 0);
    add(b, MT_T_WQ, NAME("self_attn.q_proj.weight"), q, c->C);
    if (c->qkv_bias) add(b, MT_T_BQ, NAME("self_attn.q_proj.bias"), q, 0);
    add(b, MT_T_WK, NAME("self_attn.k_proj.weight"), kv, c->C);
    if (c->qkv_bias) add(b, MT_T_BK, NAME("self_attn.k_proj.bias"), kv, 0);
    add(b, MT_T_WV, NAME("self_attn.v_proj.weight"), kv, c->C);
    if (c->qkv_bias) add(b, MT_T_BV, NAME("self_attn.v_proj.bias"), kv, 0);
    if (c->qk_norm) {
        add(b, MT_T_QNORM, NAME("self_attn.q_norm.weight"), c->HD, 0);
        add(b, MT_T_KNORM, NAME("self_attn.k_norm.weight"), c->HD, 0);
    }
    add(b, MT_T_WO, NAME("self_attn.o_proj.weight"), c->C, q);
    if (gemma) { /* its norms after attention and around the MLP */
        add(b, MT_T_ATTN_POST_NORM, NAME("post_attention_layernorm.weight"), c->C, 0);
        add(b, MT_T_MLP_NORM, NAME("pre_feedforward_layernorm.weight"), c->C, 0);
        add(b, MT_T_MLP_POST_NORM, NAME("post_feedforward_layernorm.weight"), c->C, 0);
    } else {
        add(b, MT_T_MLP_NORM, NAME("post_attention_layernorm.weight"), c->C, 0);
    }
    if (mt_config_block_is_moe(c, i)) {
        build_moe(b, c, i);
        return;
    }
    add(b, MT_T_WGATE, NAME("mlp.gate_proj.weight"), c->F, c->C);
    add(b, MT_T_WUP, NAME("mlp.up_proj.weight"), c->F, c->C);
    add(b, MT_T_WDOWN, NAME("mlp.down_proj.weight"), c->C, c->F);
#undef NAME
}

/* A gpt_neox block under the published names (GPTNeoXLayer's state dict). */
static void build_neox_block(layer_builder *b, const mt_config *c, int i) {
    char n[96];
    int64_t q = c->NH * c->HD;
#define NAME(suffix) (snprintf(n, sizeof n, "gpt_neox.layers.%d." suffix, i), n)
    add(b, MT_T_ATTN_NORM, NAME("input_layernorm.weight"), c->C, 0);
    add(b, MT_T_ATTN_NORM_B, NAME("input_layernorm.bias"), c->C, 0);
    add(b, MT_T_MLP_NORM, NAME("post_attention_layernorm.weight"), c->C, 0);
    add(b, MT_T_MLP_NORM_B, NAME("post_attention_layernorm.bias"), c->C, 0);
    add(b, MT_T_WQKV, NAME("attention.query_key_value.weight"), 3 * q, c->C);
    if (c->attn_bias) add(b, MT_T_BQKV, NAME("attention.query_key_value.bias"), 3 * q, 0);
    add(b, MT_T_WO, NAME("attention.dense.weight"), c->C, q);
    if (c->attn_bias) add(b, MT_T_BO, NAME("attention.dense.bias"), c->C, 0);
    add(b, MT_T_WUP, NAME("mlp.dense_h_to_4h.weight"), c->F, c->C);
    add(b, MT_T_BUP, NAME("mlp.dense_h_to_4h.bias"), c->F, 0);
    add(b, MT_T_WDOWN, NAME("mlp.dense_4h_to_h.weight"), c->C, c->F);
    add(b, MT_T_BDOWN, NAME("mlp.dense_4h_to_h.bias"), c->C, 0);
#undef NAME
}

/* A falcon block under the published names (FalconDecoderLayer's state
 * dict): Falcon-7B's one input_layernorm, or the new decoder's ln_attn and
 * ln_mlp; no biases. */
static void build_falcon_block(layer_builder *b, const mt_config *c, int i) {
    char n[96];
    int64_t q = c->NH * c->HD, kv = c->NKV * c->HD;
#define NAME(suffix) (snprintf(n, sizeof n, "transformer.h.%d." suffix, i), n)
    if (c->new_decoder) {
        add(b, MT_T_ATTN_NORM, NAME("ln_attn.weight"), c->C, 0);
        add(b, MT_T_ATTN_NORM_B, NAME("ln_attn.bias"), c->C, 0);
        add(b, MT_T_MLP_NORM, NAME("ln_mlp.weight"), c->C, 0);
        add(b, MT_T_MLP_NORM_B, NAME("ln_mlp.bias"), c->C, 0);
    } else {
        add(b, MT_T_ATTN_NORM, NAME("input_layernorm.weight"), c->C, 0);
        add(b, MT_T_ATTN_NORM_B, NAME("input_layernorm.bias"), c->C, 0);
    }
    add(b, MT_T_WQKV, NAME("self_attention.query_key_value.weight"), q + 2 * kv, c->C);
    add(b, MT_T_WO, NAME("self_attention.dense.weight"), c->C, q);
    add(b, MT_T_WUP, NAME("mlp.dense_h_to_4h.weight"), c->F, c->C);
    add(b, MT_T_WDOWN, NAME("mlp.dense_4h_to_h.weight"), c->C, c->F);
#undef NAME
}

int mt_params_init(mt_param_table *t, const mt_config *c, mt_error *err) {
    memset(t, 0, sizeof *t);
    t->n_layers = (int)c->L + 2;
    t->fused_published = c->arch == MT_ARCH_PHI3;
    t->layers = mt_calloc_or_die((size_t)t->n_layers, sizeof *t->layers);
    layer_builder b = {0};

    bool neox = c->arch == MT_ARCH_GPT_NEOX, falcon = c->arch == MT_ARCH_FALCON;
    begin(&b, &t->layers[0], MT_LAYER_EMBED, -1, 0);
    add(&b, MT_T_EMBED,
        neox     ? "gpt_neox.embed_in.weight"
        : falcon ? "transformer.word_embeddings.weight"
                 : "model.embed_tokens.weight",
        c->V, c->C);
    end(&b);
    for (int i = 0; i < c->L; i++) {
        begin(&b, &t->layers[i + 1], MT_LAYER_BLOCK, i,
              mt_config_block_is_moe(c, i) ? c->moe.E : 0);
        if (neox) build_neox_block(&b, c, i);
        else if (falcon) build_falcon_block(&b, c, i);
        else build_block(&b, c, i);
        end(&b);
    }
    begin(&b, &t->layers[t->n_layers - 1], MT_LAYER_HEAD, -1, 0);
    if (neox) {
        add(&b, MT_T_FINAL_NORM, "gpt_neox.final_layer_norm.weight", c->C, 0);
        add(&b, MT_T_FINAL_NORM_B, "gpt_neox.final_layer_norm.bias", c->C, 0);
        if (!c->tie_embeddings) add(&b, MT_T_LM_HEAD, "embed_out.weight", c->V, c->C);
    } else if (falcon) {
        add(&b, MT_T_FINAL_NORM, "transformer.ln_f.weight", c->C, 0);
        add(&b, MT_T_FINAL_NORM_B, "transformer.ln_f.bias", c->C, 0);
        if (!c->tie_embeddings) add(&b, MT_T_LM_HEAD, "lm_head.weight", c->V, c->C);
    } else {
        add(&b, MT_T_FINAL_NORM, "model.norm.weight", c->C, 0);
        if (!c->tie_embeddings) add(&b, MT_T_LM_HEAD, "lm_head.weight", c->V, c->C);
    }
    end(&b);

    size_t off = 0;
    for (int l = 0; l < t->n_layers; l++) {
        mt_layer_desc *ld = &t->layers[l];
        ld->offset = off;
        if (!mt_add_size(off, ld->numel, &off)) b.overflow = true;
        if (ld->numel > t->max_layer_numel) t->max_layer_numel = ld->numel;
        for (int k = 0; k < ld->n_tensors; k++) t->n_params += (int64_t)ld->tensors[k].numel;
    }
    t->total = off;
    t->norm_offset = mt_arch_is_gemma(c->arch);
    if (b.overflow) {
        mt_params_free(t);
        return mt_errorf(err, "model sizes overflow the address space; check hidden_size, "
                         "vocab_size and num_hidden_layers");
    }
    return 0;
}

void mt_params_free(mt_param_table *t) {
    for (int l = 0; t->layers && l < t->n_layers; l++) free(t->layers[l].tensors);
    free(t->layers);
    memset(t, 0, sizeof *t);
}

const mt_tensor_desc *mt_params_find(const mt_param_table *t, int layer, mt_role role) {
    MT_ASSERT(layer >= 0 && layer < t->n_layers);
    int i = t->layers[layer].by_role[role];
    return i < 0 ? NULL : &t->layers[layer].tensors[i];
}

/* The fused tensors of a block and their parts, in published row order. */
static const struct {
    const char *suffix;
    mt_role parts[3];
    int n;
} fused_tensors[] = {
    {"self_attn.qkv_proj.weight", {MT_T_WQ, MT_T_WK, MT_T_WV}, 3},
    {"mlp.gate_up_proj.weight", {MT_T_WGATE, MT_T_WUP}, 2},
};

bool mt_params_fused(const mt_param_table *t, int layer, const mt_tensor_desc *td, char *name,
                     int64_t *rows, int64_t *row0) {
    const mt_layer_desc *ld = &t->layers[layer];
    if (!t->fused_published || ld->kind != MT_LAYER_BLOCK) return false;
    for (size_t f = 0; f < sizeof fused_tensors / sizeof *fused_tensors; f++) {
        int64_t r = 0, first = -1;
        for (int j = 0; j < fused_tensors[f].n; j++) {
            int k = ld->by_role[fused_tensors[f].parts[j]];
            if (k < 0) return false; /* an MoE block: no dense MLP */
            if (&ld->tensors[k] == td) first = r;
            r += ld->tensors[k].shape[0];
        }
        if (first < 0) continue;
        snprintf(name, 96, "model.layers.%d.%s", ld->block, fused_tensors[f].suffix);
        *rows = r;
        *row0 = first;
        return true;
    }
    return false;
}

/* A fused published name of block layer l: its first part, else NULL. */
static const mt_tensor_desc *fused_by_name(const mt_param_table *t, int l, const char *rest) {
    for (size_t f = 0; f < sizeof fused_tensors / sizeof *fused_tensors; f++)
        if (!strcmp(rest, fused_tensors[f].suffix)) {
            int k = t->layers[l].by_role[fused_tensors[f].parts[0]];
            return k < 0 ? NULL : &t->layers[l].tensors[k];
        }
    return NULL;
}

const mt_tensor_desc *mt_params_by_name(const mt_param_table *t, const char *name, int *layer) {
    /* Decoder tensors name their layer, so jump straight to it. */
    int first = 0, last = t->n_layers - 1;
    int idx, pos = 0;
    if ((sscanf(name, "model.layers.%d.%n", &idx, &pos) == 1 && pos > 0) ||
        (sscanf(name, "gpt_neox.layers.%d.%n", &idx, &pos) == 1 && pos > 0) ||
        (sscanf(name, "transformer.h.%d.%n", &idx, &pos) == 1 && pos > 0)) {
        if (idx < 0 || idx + 1 >= t->n_layers - 1) return NULL;
        first = last = idx + 1;
        const mt_tensor_desc *td = t->fused_published ? fused_by_name(t, first, name + pos) : NULL;
        if (td) {
            if (layer) *layer = first;
            return td;
        }
    }
    for (int l = first; l <= last; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        int k0 = 0, k1 = ld->n_experts ? ld->expert_first : ld->n_tensors;
        /* a routed expert's name says which one: look among its tensors only */
        int e, m = 0;
        if (ld->n_experts && pos > 0 &&
            ((sscanf(name + pos, "mlp.experts.%d.%n", &e, &m) == 1 && m > 0) ||
             (sscanf(name + pos, "block_sparse_moe.experts.%d.%n", &e, &m) == 1 && m > 0))) {
            if (e < 0 || e >= ld->n_experts) return NULL;
            k0 = ld->expert_first + MT_EXPERT_TENSORS * e;
            k1 = k0 + MT_EXPERT_TENSORS;
        }
        for (int k = k0; k < k1; k++)
            if (!strcmp(ld->tensors[k].name, name)) {
                if (layer) *layer = l;
                return &ld->tensors[k];
            }
    }
    return NULL;
}
