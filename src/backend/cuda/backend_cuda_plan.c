/* The GPU memory plan of the streaming backend: every buffer, carved from
 * one allocation at creation (nothing is allocated per step). The same
 * function sizes the allocation (bump with no base) and carves it. */
#include <stdlib.h>

#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/saved_disk.h"
#include "kernels/attention/attention.h"
#include "kernels/optim/optim_kernels.h"
#include "util/mem.h"


static void *take(bump *b, size_t bytes) {
    size_t at = mt_round_up(b->used, 256);
    b->used = at + bytes;
    return b->base ? b->base + at : NULL;
}
#define TAKE_F(b, n) ((float *)take((b), (size_t)(n) * sizeof(float)))

static size_t op_size(const cuda_backend *cb) { return cb->prec == MT_PREC_BF16 ? 2 : 4; }

/* An operand buffer: in fp32 mode it is the fp32 buffer itself. */
static void *take_op(bump *b, const cuda_backend *cb, size_t n, float *f32_alias) {
    if (cb->prec != MT_PREC_BF16 && f32_alias) return f32_alias;
    return take(b, n * op_size(cb));
}

/* fp32 buffers shaped as q (nq floats), k and v (nkv each; v NULL: none). */
static void take_qkv32(bump *b, size_t nq, size_t nkv, float **q, float **k, float **v) {
    *q = TAKE_F(b, nq);
    *k = TAKE_F(b, nkv);
    if (v) *v = TAKE_F(b, nkv);
}

/* The weights on the GPU: the streaming slots, the resident layers' weights
 * and Adam state, the tied embedding's own slot. */
static void plan_weights(cuda_backend *cb, bump *b) {
    const mt_config *c = cb->cfg;
    const mt_param_table *t = cb->t;
    int bf = cb->prec == MT_PREC_BF16;
    size_t lw = 0; /* the largest layer that streams through the slots */
    for (int l = 0; l < t->n_layers; l++)
        if (!bound_in_place(cb, l) && layer_extent(cb, l) > lw && !(c->tie_embeddings && l == 0))
            lw = layer_extent(cb, l);
    for (int k = 0; k < cb->o.slots; k++) {
        cb->slots[k].w32 = TAKE_F(b, lw);
        cb->slots[k].w16 = bf ? take(b, lw * 2) : NULL;
    }
    if (cb->n_dev) {
        size_t n = cb->dev_numel;
        cb->dev_w = TAKE_F(b, n);
        cb->dev_m = TAKE_F(b, n);
        cb->dev_v = TAKE_F(b, n);
        cb->dev_w16 = bf && cb->ranks <= 1 ? take(b, n * 2) : NULL;
        for (int l = 0; l < cb->n_dev && cb->ranks <= 1; l++) {
            cb->dev_slot[l].layer = l;
            cb->dev_slot[l].w32 = cb->dev_w ? cb->dev_w + cb->dev_off[l] : NULL;
            cb->dev_slot[l].w16 = cb->dev_w16 ? cb->dev_w16 + cb->dev_off[l] : NULL;
        }
    }
    if (c->tie_embeddings && !bound_in_place(cb, 0)) {
        size_t ne = layer_extent(cb, 0);
        cb->embed_slot.w32 = TAKE_F(b, ne);
        cb->embed_slot.w16 = bf ? take(b, ne * 2) : NULL;
    }
}

/* Gradient accumulators and staging, the boundary activations and the
 * step's small buffers (batch, positions, loss, norms). */
static void plan_grads_and_step(cuda_backend *cb, bump *b) {
    const mt_config *c = cb->cfg;
    const mt_param_table *t = cb->t;
    size_t N = cb->N, C = c->C;
    cb->gacc_all = cb->gpu_grad_numel ? TAKE_F(b, cb->gpu_grad_numel) : NULL;
    if (c->tie_embeddings)
        cb->gacc_embed = cb->home[0].grad_host ? TAKE_F(b, layer_extent(cb, 0))
                                               : cb->gacc_all ? cb->gacc_all + cb->goff[0] : NULL;
    if (cb->max_host_grad_numel) {
        cb->gacc[0] = TAKE_F(b, cb->max_host_grad_numel);
        cb->gacc[1] = TAKE_F(b, cb->max_host_grad_numel);
    }
    if (cb->max_stage_numel) {
        cb->g16_stage[0] = take(b, cb->max_stage_numel * 2);
        cb->g16_stage[1] = take(b, cb->max_stage_numel * 2);
    }
    if (mt_cuda_saved_moving(cb)) {
        cb->visit[0] = TAKE_F(b, (size_t)cb->max_M * N * C);
        cb->visit[1] = TAKE_F(b, (size_t)cb->max_M * N * C);
    }
    if ((cb->n_host_saved || cb->n_disk_saved) && cb->o.host_saved_bf16)
        for (int i = 0; i < 2; i++) cb->saved16[i] = take(b, mt_cuda_saved_chunk(cb) * 2);
    cb->xin = cb->n_rebuilt_saved ? TAKE_F(b, N * C) : NULL;
    cb->saved = TAKE_F(b, (size_t)cb->n_gpu_saved * cb->max_M * N * C);
    cb->dx = TAKE_F(b, (size_t)cb->max_M * N * C);
    cb->cos = TAKE_F(b, cb->T * c->HD / 2);
    cb->sin = TAKE_F(b, cb->T * c->HD / 2);
    int local = c->arch == MT_ARCH_GEMMA3_TEXT; /* tables of its own for the sliding layers */
    cb->cos_l = local ? TAKE_F(b, cb->T * c->HD / 2) : cb->cos;
    cb->sin_l = local ? TAKE_F(b, cb->T * c->HD / 2) : cb->sin;
    cb->tokens = take(b, (size_t)cb->max_M * N * 4);
    cb->targets = take(b, (size_t)cb->max_M * N * 4);
    cb->pos = take(b, (size_t)cb->max_M * N * 4);
    cb->win_pos = c->sliding_window > 0 && cb->T > c->sliding_window
                      ? take(b, (size_t)cb->max_M * N * 4) : NULL;
    cb->emb_order = take(b, (size_t)cb->max_M * N * 4);
    cb->emb_bounds = take(b, (size_t)cb->max_M * (N + 1) * 4);
    cb->loss_dev = take(b, sizeof(double));
    cb->sumsq_dev = take(b, (size_t)t->n_layers * sizeof(double));
    cb->sumsq_scratch = take(b, MT_SUMSQ_PARTIALS * sizeof(double));
}

/* Whether the decoder blocks have tensors of role r (those of the first;
 * every block of a model has the same roles). */
static int blocks_have(const cuda_backend *cb, mt_role r) {
    return cb->t->n_layers > 2 && cb->t->layers[1].by_role[r] >= 0;
}

/* The working buffers of a layer's forward (reused by every layer). */
static void plan_forward_acts(cuda_backend *cb, acts *a, bump *b) {
    const mt_config *c = cb->cfg;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    int bf = cb->prec == MT_PREC_BF16, neox = mt_arch_has_neox_block(c->arch);
    int gemma = mt_arch_is_gemma(c->arch);
    cb->attn_bf16 = bf && mt_attn_bf16_supports((size_t)c->HD);
    a->rstd1 = TAKE_F(b, N);
    a->xn1_op = take(b, N * C * op_size(cb));
    if (neox) { /* LayerNorms' means; the fused qkv in fp32: in fp32 mode, and
                 * in bf16 mode for its bias's gradient (the backward's) */
        a->mean1 = TAKE_F(b, N);
        a->mean2 = TAKE_F(b, N);
        a->qkv32 = !bf || blocks_have(cb, MT_T_BQKV) ? TAKE_F(b, N * (Q + 2 * KV)) : NULL;
    }
    /* gpt_neox's and falcon's blocks take paths of their own (neox_cuda.c),
     * Gemma's too (gemma_cuda.c): on the bf16 flash kernels, a bf16 one
     * like the fast path's, which keeps activations */
    cb->fast = cb->attn_bf16 && c->HD % 8 == 0 && !neox && !gemma;
    int gemma_bf16 = gemma && cb->attn_bf16;
    cb->keeps = cb->fast || (neox && cb->attn_bf16) || gemma_bf16;
    /* fp32 q, k, v: the general path's; the fast paths' products write the
     * bf16 operands, and gpt_neox's split writes the flash kernels' */
    if (!cb->fast && !(neox && cb->attn_bf16) && !gemma_bf16)
        take_qkv32(b, N * Q, N * KV, &a->q32, &a->k32, &a->v32);
    if (c->qk_norm) {
        take_qkv32(b, N * Q, N * KV, &a->qpre32, &a->kpre32, NULL);
        a->qrstd = TAKE_F(b, N * c->NH);
        a->krstd = TAKE_F(b, N * c->NKV);
    }
    a->q_op = take_op(b, cb, N * Q, a->q32);
    a->k_op = take_op(b, cb, N * KV, a->k32);
    a->v_op = take_op(b, cb, N * KV, a->v32);
    if ((cb->fast || gemma_bf16) && c->qk_norm) {
        a->qpre_op = take(b, N * Q * 2);
        a->kpre_op = take(b, N * KV * 2);
    }
    a->att32 = cb->attn_bf16 ? NULL : TAKE_F(b, N * Q);
    a->att_op = bf ? take(b, N * Q * 2) : a->att32;
    a->lse = TAKE_F(b, N * c->NH);
    a->xmid = TAKE_F(b, N * C);
    a->xn2_op = take(b, N * C * op_size(cb));
    a->rstd2 = TAKE_F(b, N);
    if (cb->fast || gemma_bf16) {
        a->gate16 = take(b, N * F * 2);
        a->up16 = take(b, N * F * 2);
    } else if (neox) { /* the GELU's input: bf16 in bf16 mode; no up */
        a->gate32 = bf ? NULL : TAKE_F(b, N * F);
        a->gate16 = bf ? take(b, N * F * 2) : NULL;
    } else {
        a->gate32 = TAKE_F(b, N * F);
        a->up32 = TAKE_F(b, N * F);
    }
    a->mlp_op = take(b, N * F * op_size(cb));
    a->xtmp = mt_config_is_moe(c) ? TAKE_F(b, N * C) : NULL;
    if (gemma) { /* the post-norms' inputs and rstd */
        a->ao_op = take(b, N * C * op_size(cb));
        a->mo_op = take(b, N * C * op_size(cb));
        a->rstd_pa = TAKE_F(b, N);
        a->rstd_pf = TAKE_F(b, N);
    }
}

/* The working buffers of a layer's backward, and of the head. */
static void plan_backward_acts(cuda_backend *cb, acts *a, bump *b) {
    const mt_config *c = cb->cfg;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    int bf = cb->prec == MT_PREC_BF16, neox = mt_arch_has_neox_block(c->arch);
    int gemma_bf16 = mt_arch_is_gemma(c->arch) && cb->attn_bf16; /* GeGLU's gradients bf16 */
    a->dx_op = bf ? take(b, N * C * 2) : NULL; /* fp32: the dx of the micro-batch */
    a->dmlp32 = gemma_bf16 ? NULL : TAKE_F(b, N * F);
    a->dmlp_op = gemma_bf16 ? take(b, N * F * 2) : NULL;
    if (!cb->fast && !gemma_bf16) { /* gpt_neox, falcon: dgate32 holds the GELU's input gradient (in
                      * bf16 mode for its bias's gradient only), no up */
        a->dgate32 = !neox || !bf || blocks_have(cb, MT_T_BUP) ? TAKE_F(b, N * F) : NULL;
        a->dup32 = neox ? NULL : TAKE_F(b, N * F);
    }
    a->dgate_op = take_op(b, cb, N * F, a->dgate32);
    a->dup_op = neox ? NULL : take_op(b, cb, N * F, a->dup32);
    if (neox) a->dqkv_op = take_op(b, cb, N * (Q + 2 * KV), a->qkv32);
    a->dxn32 = TAKE_F(b, N * C);
    a->datt32 = TAKE_F(b, N * Q);
    a->datt_op = take_op(b, cb, N * Q, a->datt32);
    take_qkv32(b, N * Q, N * KV, &a->dq32, &a->dk32, &a->dv32);
    if (c->qk_norm) take_qkv32(b, N * Q, N * KV, &a->dqn32, &a->dkn32, NULL);
    if (bf && !neox) { /* dense dq, dk, dv, or as one interleaved (N, Q + 2KV) operand
                        * (mt_cuda_qkv_backward_fused) */
        a->dqkv_op = take(b, N * (Q + 2 * KV) * 2);
        a->dq_op = a->dqkv_op;
        a->dk_op = (char *)a->dq_op + N * Q * 2;
        a->dv_op = (char *)a->dk_op + N * KV * 2;
    } else {
        a->dq_op = bf ? take(b, N * Q * 2) : NULL;
        a->dk_op = bf ? take(b, N * KV * 2) : NULL;
        a->dv_op = take_op(b, cb, N * KV, a->dv32);
    }
    a->attn_scratch = take(b, mt_attn_backward_scratch_bytes(cb->B, cb->T, c->NH));
}

/* What the head reads and writes besides its logits, and what it shares
 * with the layers: the column sums of a norm's weight gradient, Gemma's
 * norms' 1 + w. */
static void plan_head_acts(cuda_backend *cb, acts *a, bump *b) {
    const mt_config *c = cb->cfg;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    a->xf_op = take(b, N * C * op_size(cb));
    a->rstdf = TAKE_F(b, N);
    a->meanf = c->layernorm ? TAKE_F(b, N) : NULL;
    a->dxf32 = TAKE_F(b, N * C);
    a->row_loss = TAKE_F(b, N);
    a->row_w = TAKE_F(b, N);
    size_t cs = mt_cuda_colsum_scratch_floats(N, C);
    /* the biases of gpt_neox's fused qkv and MLP too */
    size_t shapes[][2] = {{N, Q}, {N, KV}, {N * c->NH, c->HD}, {N * c->NKV, c->HD},
                          {N, Q + 2 * KV}, {N, F}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        size_t s = mt_cuda_colsum_scratch_floats(shapes[i][0], shapes[i][1]);
        if (s > cs) cs = s;
    }
    a->colsum = TAKE_F(b, cs);
    a->norm_w = mt_arch_is_gemma(c->arch) ? TAKE_F(b, 4 * C + 2 * (size_t)c->HD) : NULL;
}

/* The rows of logits the head holds at once: the option's, else 4096,
 * halved while they pass HEAD_LOGITS elements (a vocabulary of 256k: 2048
 * rows, 3.1 GB, which the layers' buffers under them cover (plan_scratch)
 * where 4096 rows would pass them; the products stay large), at most the
 * micro-batch's. */
#define HEAD_LOGITS ((size_t)640 << 20)
size_t mt_cuda_head_rows(const cuda_backend *cb) {
    size_t R = (size_t)cb->o.head_chunk;
    if (cb->o.head_chunk <= 0)
        for (R = 4096; R > 256 && R * (size_t)cb->cfg->V > HEAD_LOGITS; R /= 2) {}
    return R < (size_t)cb->N ? R : (size_t)cb->N;
}

/* One kept unit of a Llama-family block: xn1, xn2 and the SwiGLU output
 * are rebuilt (layers_cuda.c). Gemma's (bf16) is the same but for its
 * mid-block residual, rebuilt from the post-norms' inputs (bf16) and rstds,
 * which it keeps as their backward reads them (gemma_cuda.c). */
static void plan_kept_unit(const cuda_backend *cb, acts *k, bump *b) {
    const mt_config *c = cb->cfg;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    int gemma = mt_arch_is_gemma(c->arch);
    k->rstd1 = TAKE_F(b, N);
    k->q_op = take(b, N * Q * 2);
    k->k_op = take(b, N * KV * 2);
    k->v_op = take(b, N * KV * 2);
    k->att_op = take(b, N * Q * 2);
    k->lse = TAKE_F(b, N * c->NH);
    if (gemma) {
        k->ao_op = take(b, N * C * 2);
        k->rstd_pa = TAKE_F(b, N);
    } else {
        k->xmid = cb->o.lean_keep ? NULL : TAKE_F(b, N * C);
    }
    k->rstd2 = TAKE_F(b, N);
    k->gate16 = take(b, N * F * 2);
    k->up16 = take(b, N * F * 2);
    if (gemma) {
        k->mo_op = take(b, N * C * 2);
        k->rstd_pf = TAKE_F(b, N);
    }
    if (c->qk_norm) {
        k->qpre_op = take(b, N * Q * 2);
        k->kpre_op = take(b, N * KV * 2);
        k->qrstd = TAKE_F(b, N * c->NH);
        k->krstd = TAKE_F(b, N * c->NKV);
    }
}

/* One kept unit of a gpt_neox or falcon block: xn1, xn2 and the GELU's
 * output are rebuilt (neox_cuda.c); a parallel block's backward reads no
 * xmid. */
static void plan_kept_unit_neox(const cuda_backend *cb, acts *k, bump *b) {
    const mt_config *c = cb->cfg;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    k->mean1 = TAKE_F(b, N);
    k->rstd1 = TAKE_F(b, N);
    k->q_op = take(b, N * Q * 2);
    k->k_op = take(b, N * KV * 2);
    k->v_op = take(b, N * KV * 2);
    k->att_op = take(b, N * Q * 2);
    k->lse = TAKE_F(b, N * c->NH);
    k->xmid = c->parallel_residual ? NULL : TAKE_F(b, N * C);
    k->mean2 = TAKE_F(b, N);
    k->rstd2 = TAKE_F(b, N);
    k->gate16 = take(b, N * F * 2);
}

/* One kept unit of the model's kind of block. */
static void plan_kept_unit_of(const cuda_backend *cb, acts *k, bump *b) {
    if (mt_arch_has_neox_block(cb->cfg->arch)) plan_kept_unit_neox(cb, k, b);
    else plan_kept_unit(cb, k, b);
}

/* The layers before the kept ones that keep their down projection's
 * output: Gemma's on the bf16 kernels, as many as asked and left. */
static int down_kept_layers(const cuda_backend *cb) {
    if (!cb->keeps || !mt_arch_is_gemma(cb->cfg->arch) || cb->o.keep_down_layers <= 0) return 0;
    int left = (int)cb->cfg->L - cb->n_keep;
    return cb->o.keep_down_layers < left ? cb->o.keep_down_layers : left;
}

/* The forward activations kept on the GPU for the backward: one set per
 * kept (layer, micro-batch) unit, each mt_cuda_keep_unit_bytes after the
 * last; then the down-kept units (mt_cuda_down_unit_bytes each). */
static void plan_kept(cuda_backend *cb, bump *b) {
    for (int u = 0; u < cb->n_keep * cb->max_M; u++) plan_kept_unit_of(cb, &cb->kept[u], b);
    cb->n_keep_down = down_kept_layers(cb);
    size_t units = (size_t)cb->n_keep_down * cb->max_M;
    cb->down_kept = units ? take(b, units * mt_cuda_down_unit_bytes(cb)) : NULL;
}

/* The head's logits (R x V: 3 GB for a vocabulary of 256k) lie over the
 * layers' working buffers, which hold nothing while the head runs: a kept
 * layer's activations are in its unit, a recomputed layer rebuilds them,
 * and the head's own buffers are apart (plan_head_acts). */
static void plan_scratch(cuda_backend *cb, bump *b) {
    acts *a = &cb->a;
    plan_head_acts(cb, a, b);
    size_t at = b->used = mt_round_up(b->used, 256);
    plan_forward_acts(cb, a, b);
    plan_backward_acts(cb, a, b);
    size_t logits = mt_cuda_lm_head_scratch_bytes(cb->prec, mt_cuda_head_rows(cb), cb->cfg->V);
    a->head_scratch = b->base ? b->base + at : NULL;
    if (at + logits > b->used) b->used = at + logits;
}

void mt_cuda_plan(cuda_backend *cb, bump *b) {
    plan_weights(cb, b);
    plan_grads_and_step(cb, b);
    plan_scratch(cb, b);
    size_t moe = mt_cuda_moe_bytes(cb->cfg, cb->N, cb->prec);
    cb->moe_dev = moe ? take(b, moe) : NULL;
    plan_kept(cb, b);
}

/* Bytes of one kept (layer, micro-batch) unit of forward activations, as
 * the backend's creation fits them: its buffers as plan_kept lays them out,
 * counted (a bump without a base), up to the next unit's start, and 256
 * more, as the first unit may start up to 255 bytes after the plan before
 * it (take's alignment). */
size_t mt_cuda_keep_unit_bytes(const cuda_backend *cb) {
    bump b = {0};
    acts k;
    plan_kept_unit_of(cb, &k, &b);
    return mt_round_up(b.used, 256) + 256;
}

/* The bytes of the down projection's output in a down-kept unit, up to
 * its rstd. */
static size_t down_output_bytes(const cuda_backend *cb) {
    return mt_round_up(cb->N * (size_t)cb->cfg->C * op_size(cb), 256);
}

/* One down-kept unit: the down projection's output (N, C, the operand
 * type) and its post-norm's rstd (N), rounded up to 256 bytes so that the
 * next starts aligned. */
size_t mt_cuda_down_unit_bytes(const cuda_backend *cb) {
    return mt_round_up(down_output_bytes(cb) + cb->N * sizeof(float), 256);
}

int mt_cuda_down_unit(const cuda_backend *cb, int layer, int mb, void **mo, float **rstd) {
    int first_kept = (int)cb->cfg->L - cb->n_keep + 1, first = first_kept - cb->n_keep_down;
    *mo = NULL;
    *rstd = NULL;
    if (!cb->n_keep_down || layer < first || layer >= first_kept) return 0;
    char *unit = cb->down_kept +
                 ((size_t)(layer - first) * cb->max_M + mb) * mt_cuda_down_unit_bytes(cb);
    *mo = unit;
    *rstd = (float *)(unit + down_output_bytes(cb));
    return 1;
}

void mt_cuda_default_opts(mt_cuda_backend_opts *o, const mt_cuda_backend_opts *in) {
    *o = in ? *in : (mt_cuda_backend_opts){.precision = MT_GPU_BF16};
    if (o->ranks < 1) o->ranks = 1;
    if (o->slots < 2) o->slots = 3;
    if (o->slots > MAX_SLOTS) o->slots = MAX_SLOTS;
}

/* Layers 1..n_layers-1 have checkpoints (their inputs); layer 0 reads
 * tokens. A layer's gradient accumulator sits in gacc_all (GPU) or takes
 * its turn in gacc[2] (host); the tied embedding's has its own buffer. */
void mt_cuda_resolve_homes(cuda_backend *cb) {
    const mt_param_table *t = cb->t;
    int nl = t->n_layers;
    cb->home = mt_calloc_or_die((size_t)nl, sizeof *cb->home);
    cb->goff = mt_calloc_or_die((size_t)nl, sizeof *cb->goff);
    cb->h_goff = mt_calloc_or_die((size_t)nl, sizeof *cb->h_goff);
    cb->saved_idx = mt_calloc_or_die((size_t)nl, sizeof *cb->saved_idx);
    cb->disk_block = mt_calloc_or_die((size_t)nl, sizeof *cb->disk_block);
    cb->n_dev = cb->o.device_optim_layers < 0 ? 0
                : cb->o.device_optim_layers > nl ? nl : cb->o.device_optim_layers;
    cb->dev_slot = mt_calloc_or_die((size_t)(cb->n_dev ? cb->n_dev : 1), sizeof *cb->dev_slot);
    cb->dev_off = mt_calloc_or_die((size_t)(cb->n_dev ? cb->n_dev : 1), sizeof *cb->dev_off);
    /* one GPU: the store's range of the layers; several: a chunk each,
     * which a layer's all-gather reads whole */
    cb->dev_numel = 0;
    for (int l = 0; l < cb->n_dev; l++) {
        cb->dev_off[l] = cb->ranks <= 1 ? t->layers[l].offset - t->layers[0].offset
                                        : cb->dev_numel;
        cb->dev_numel = cb->ranks <= 1 ? cb->dev_off[l] + t->layers[l].numel
                                       : cb->dev_numel + part_of(cb, l).chunk;
    }
    cb->gpu_grad_numel = cb->max_gpu_grad_numel = 0;
    cb->host_grad_numel = cb->max_host_grad_numel = cb->max_stage_numel = 0;
    cb->n_gpu_saved = cb->n_host_saved = cb->n_rebuilt_saved = cb->n_disk_saved = 0;
    for (int l = 0; l < nl; l++) {
        mt_layer_home h = cb->o.homes ? cb->o.homes[l]
                                      : (mt_layer_home){.grad_host = !cb->o.gpu_grads,
                                                        .saved_host = (uint8_t)cb->o.host_saved_inputs};
        if (l == 0) h.saved_host = h.saved_recompute = h.saved_disk = 0; /* no checkpoint */
        if (h.saved_disk) h.saved_host = 0;
        /* updated where it is; on a rank of several, every other layer's
         * reduced part leaves for the host */
        if (l < cb->n_dev) h.grad_host = 0;
        else if (cb->ranks > 1) h.grad_host = 1;
        if (h.saved_recompute) {
            h.saved_host = h.saved_disk = 0;
            /* rebuilt from layer l-1's, unless still on the GPU (the last two) */
            MT_ASSERT(l >= nl - 2 || !cb->home[l - 1].saved_recompute);
            cb->n_rebuilt_saved++;
        }
        cb->home[l] = h;
        /* the GPU accumulates the whole layer (and its collectives' padding);
         * the host receives this rank's part */
        size_t n = layer_extent(cb, l), part = part_of(cb, l).len;
        if (h.grad_host) {
            cb->h_goff[l] = cb->host_grad_numel;
            cb->host_grad_numel += mt_round_up(part, 64);
            int own = cb->cfg->tie_embeddings && l == 0; /* gacc_embed, not gacc[2] */
            if (!own && n > cb->max_host_grad_numel) cb->max_host_grad_numel = n;
            if (cb->o.host_grad_bf16 && part > cb->max_stage_numel) cb->max_stage_numel = part;
        } else {
            cb->goff[l] = cb->gpu_grad_numel;
            cb->gpu_grad_numel += mt_round_up(n, 64);
            /* the optimizer's fetch stages it, unless it updates it here */
            if (l >= cb->n_dev && n > cb->max_gpu_grad_numel) cb->max_gpu_grad_numel = n;
        }
        cb->disk_block[l] = h.saved_disk ? cb->n_disk_saved++ : -1;
        if (l >= 1 && !h.saved_recompute && !h.saved_disk)
            cb->saved_idx[l] = h.saved_host ? cb->n_host_saved++ : cb->n_gpu_saved++;
    }
}

void mt_cuda_homes_free(cuda_backend *cb) {
    free(cb->home);
    free(cb->goff);
    free(cb->h_goff);
    free(cb->saved_idx);
    free(cb->disk_block);
    free(cb->dev_slot);
    free(cb->dev_off);
    cb->dev_slot = NULL;
    cb->dev_off = NULL;
    cb->home = NULL;
    cb->goff = cb->h_goff = NULL;
    cb->saved_idx = NULL;
    cb->disk_block = NULL;
}

/* A backend that only counts: options resolved, nothing allocated. */
static void counting_backend(cuda_backend *cb, const mt_config *cfg, const mt_param_table *t,
                             int max_M, int64_t B, int64_t T, const mt_cuda_backend_opts *in) {
    *cb = (cuda_backend){.cfg = cfg, .t = t, .max_M = max_M, .B = B, .T = T, .N = B * T};
    mt_cuda_default_opts(&cb->o, in);
    cb->rank = cb->o.rank;
    cb->ranks = cb->o.ranks;
    cb->prec = cb->o.precision == MT_GPU_BF16 ? MT_PREC_BF16 : MT_PREC_FP32;
    mt_cuda_resolve_homes(cb);
}

size_t mt_cuda_backend_bytes(const mt_config *cfg, const mt_param_table *t, int max_M,
                             int64_t B, int64_t T, const mt_cuda_backend_opts *in) {
    cuda_backend cb;
    counting_backend(&cb, cfg, t, max_M, B, T, in);
    bump b = {0};
    mt_cuda_plan(&cb, &b); /* learns whether the blocks can keep activations */
    if (cb.keeps && cb.o.keep_layers > 0 && !mt_config_is_moe(cfg)) { /* as many kept layers as asked, not capped here */
        cb.n_keep = cb.o.keep_layers;
        cb.kept = mt_calloc_or_die((size_t)cb.n_keep * max_M, sizeof *cb.kept);
        b = (bump){0};
        mt_cuda_plan(&cb, &b);
        free(cb.kept);
    }
    mt_cuda_homes_free(&cb);
    return b.used;
}

/* Host gradients (when the backend owns them), host checkpoints, the
 * optimizer's staging and the disk-saved inputs' staging: what
 * mt_cuda_backend_create pins beside the store. */
size_t mt_cuda_host_bytes_of(const cuda_backend *cb) {
    size_t bytes = cb->host_grad_numel * (cb->o.host_grad_bf16 ? 2 : 4);
    size_t one_saved = (size_t)cb->max_M * cb->N * cb->cfg->C * (cb->o.host_saved_bf16 ? 2 : 4);
    bytes += (size_t)cb->n_host_saved * one_saved;
    bytes += mt_saved_disk_staging_bytes(cb->n_disk_saved, one_saved);
    if (cb->max_gpu_grad_numel) bytes += 2 * cb->max_gpu_grad_numel * sizeof(float);
    return bytes;
}

size_t mt_cuda_backend_host_bytes(const mt_config *cfg, const mt_param_table *t, int max_M,
                                  int64_t B, int64_t T, const mt_cuda_backend_opts *in) {
    cuda_backend cb;
    counting_backend(&cb, cfg, t, max_M, B, T, in);
    size_t bytes = mt_cuda_host_bytes_of(&cb);
    mt_cuda_homes_free(&cb);
    return bytes;
}

