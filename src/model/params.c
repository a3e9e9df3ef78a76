/* The parameter table: names, shapes and layer-major offsets of every
 * tensor, derived from the config alone. */
#include "model/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/mem.h"

typedef struct {
    mt_layer_desc *ld;
    size_t cursor;     /* floats used so far in this layer */
    bool overflow;
} layer_builder;

static void add(layer_builder *b, mt_role role, const char *name, int64_t rows, int64_t cols) {
    mt_layer_desc *ld = b->ld;
    MT_ASSERT(ld->n_tensors < MT_MAX_LAYER_TENSORS);
    mt_tensor_desc *t = &ld->tensors[ld->n_tensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->role = role;
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
    ld->by_role[role] = ld->n_tensors++;
}

static void begin(layer_builder *b, mt_layer_desc *ld, mt_layer_kind kind, int block) {
    memset(ld, 0, sizeof *ld);
    ld->kind = kind;
    ld->block = block;
    for (int r = 0; r < MT_T_COUNT; r++) ld->by_role[r] = -1;
    b->ld = ld;
    b->cursor = 0;
}

static void end(layer_builder *b) {
    b->ld->numel = mt_round_up(b->cursor, MT_LAYER_ALIGN);
}

static void build_block(layer_builder *b, const mt_config *c, int i) {
    char n[96];
    int64_t q = c->NH * c->HD, kv = c->NKV * c->HD;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d." suffix, i), n)
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
    add(b, MT_T_MLP_NORM, NAME("post_attention_layernorm.weight"), c->C, 0);
    add(b, MT_T_WGATE, NAME("mlp.gate_proj.weight"), c->F, c->C);
    add(b, MT_T_WUP, NAME("mlp.up_proj.weight"), c->F, c->C);
    add(b, MT_T_WDOWN, NAME("mlp.down_proj.weight"), c->C, c->F);
#undef NAME
}

int mt_params_init(mt_param_table *t, const mt_config *c, mt_error *err) {
    memset(t, 0, sizeof *t);
    t->n_layers = (int)c->L + 2;
    t->layers = mt_calloc_or_die((size_t)t->n_layers, sizeof *t->layers);
    layer_builder b = {0};

    begin(&b, &t->layers[0], MT_LAYER_EMBED, -1);
    add(&b, MT_T_EMBED, "model.embed_tokens.weight", c->V, c->C);
    end(&b);
    for (int i = 0; i < c->L; i++) {
        begin(&b, &t->layers[i + 1], MT_LAYER_BLOCK, i);
        build_block(&b, c, i);
        end(&b);
    }
    begin(&b, &t->layers[t->n_layers - 1], MT_LAYER_HEAD, -1);
    add(&b, MT_T_FINAL_NORM, "model.norm.weight", c->C, 0);
    if (!c->tie_embeddings) add(&b, MT_T_LM_HEAD, "lm_head.weight", c->V, c->C);
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
    if (b.overflow) {
        mt_params_free(t);
        return mt_errorf(err, "model sizes overflow the address space; check hidden_size, "
                         "vocab_size and num_hidden_layers");
    }
    return 0;
}

void mt_params_free(mt_param_table *t) {
    free(t->layers);
    memset(t, 0, sizeof *t);
}

const mt_tensor_desc *mt_params_find(const mt_param_table *t, int layer, mt_role role) {
    MT_ASSERT(layer >= 0 && layer < t->n_layers);
    int i = t->layers[layer].by_role[role];
    return i < 0 ? NULL : &t->layers[layer].tensors[i];
}

const mt_tensor_desc *mt_params_by_name(const mt_param_table *t, const char *name, int *layer) {
    /* Decoder tensors name their layer, so jump straight to it. */
    int first = 0, last = t->n_layers - 1;
    int idx;
    if (sscanf(name, "model.layers.%d.", &idx) == 1) {
        if (idx < 0 || idx + 1 >= t->n_layers - 1) return NULL;
        first = last = idx + 1;
    }
    for (int l = first; l <= last; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        for (int k = 0; k < ld->n_tensors; k++)
            if (!strcmp(ld->tensors[k].name, name)) {
                if (layer) *layer = l;
                return &ld->tensors[k];
            }
    }
    return NULL;
}
