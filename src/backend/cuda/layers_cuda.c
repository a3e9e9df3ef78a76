/* The layer templates of the CUDA backend: a Llama-family decoder block's
 * forward and backward on the weights of the bound slot, for one
 * micro-batch (gpt_neox's and falcon's blocks: neox_cuda.c; Gemma's:
 * gemma_cuda.c). Stateless:
 * binding a layer is pointing at a slot. */
#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/layers_cuda.h"
#include "backend/cuda/moe_cuda.h"
#include "kernels/attention/attention.h"
#include "kernels/cuda_common.h"
#include "kernels/ops/ops_fused.h"

/* ---- positions of packed documents (mt_batch.pos) ---- */

void mt_cuda_upload_pos(cuda_backend *cb, const mt_batch *batch) {
    cb->has_pos = batch->pos != NULL;
    if (batch->pos)
        CUDA_CHECK(cudaMemcpyAsync(cb->pos, batch->pos,
                                   (size_t)batch->M * cb->N * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, cb->s_comp));
    if (cb->win_pos)
        mt_cuda_window_positions(cb->s_comp, cb->win_pos, cb->has_pos ? cb->pos : NULL,
                                 (size_t)batch->M * cb->N, cb->T, cb->cfg->sliding_window);
}

/* ---- the MLP of a mixture-of-experts block (moe_cuda.h) ---- */

static int is_moe(const cuda_backend *cb, int layer) { return cb->t->layers[layer].n_experts > 0; }

static const void *layer_op(const cuda_backend *cb, const slot *s) {
    return cb->prec == MT_PREC_BF16 ? (const void *)s->w16 : (const void *)s->w32;
}

/* out (N, C) = the MoE MLP of xn2 (operand type). */
static void moe_forward(cuda_backend *cb, int layer, const void *xn2, float *out) {
    const slot *s = bound_slot(cb);
    mt_cuda_moe_forward(cb->moe, cb->ctx, &cb->t->layers[layer], layer_op(cb, s), s->w32, xn2,
                        out);
}

/* dxn2 (N, C) = dL/d xn2 from dout = dL/d out; gradients into g_cur. */
static void moe_backward(cuda_backend *cb, int layer, const void *xn2, const float *dout,
                         float *dxn2) {
    const slot *s = bound_slot(cb);
    mt_cuda_moe_backward(cb->moe, cb->ctx, &cb->t->layers[layer], layer_op(cb, s), s->w32,
                         cb->g_cur, xn2, dout, dxn2);
}

/* From the attention's fp32 dq32, dk32, dv32 (cb->a) to the operands of
 * the q and k products' backward, *dq_op and *dk_op (a->dq_op and dk_op
 * in bf16, fp32 buffers of cb->a in fp32), and a->dv_op: RoPE's backward,
 * the q/k norms' (pre-norm q, k in fp32 and their rstd from the forward)
 * and the biases' gradients on the way. */
static void qkv_grads_to_op(cuda_backend *cb, int layer, int mb, const float *qpre32,
                            const float *kpre32, const float *qrstd, const float *krstd,
                            void **dq_op, void **dk_op) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    float *g = cb->g_cur;
    size_t N = cb->N, Q = c->NH * c->HD, KV = c->NKV * c->HD;
    const int32_t *pos = mt_cuda_block_pos(cb, mb);
    mt_cuda_rope_backward(ctx, a->dq32, cb->cos, cb->sin, pos, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_backward(ctx, a->dk32, cb->cos, cb->sin, pos, cb->B, cb->T, c->NKV, c->HD);
    float *dq = a->dq32, *dk = a->dk32;
    if (c->qk_norm) {
        CUDA_CHECK(cudaMemsetAsync(a->dqn32, 0, N * Q * sizeof(float), cb->s_comp));
        CUDA_CHECK(cudaMemsetAsync(a->dkn32, 0, N * KV * sizeof(float), cb->s_comp));
        mt_cuda_rmsnorm_backward(ctx, a->dqn32, G(cb, g, layer, MT_T_QNORM), a->colsum, a->dq32,
                                 qpre32, W32(cb, s, layer, MT_T_QNORM), qrstd, N * c->NH, c->HD);
        mt_cuda_rmsnorm_backward(ctx, a->dkn32, G(cb, g, layer, MT_T_KNORM), a->colsum, a->dk32,
                                 kpre32, W32(cb, s, layer, MT_T_KNORM), krstd, N * c->NKV, c->HD);
        dq = a->dqn32;
        dk = a->dkn32;
    }
    if (c->qkv_bias) {
        mt_cuda_bias_backward(ctx, G(cb, g, layer, MT_T_BQ), a->colsum, dq, N, Q);
        mt_cuda_bias_backward(ctx, G(cb, g, layer, MT_T_BK), a->colsum, dk, N, KV);
        mt_cuda_bias_backward(ctx, G(cb, g, layer, MT_T_BV), a->colsum, a->dv32, N, KV);
    }
    *dq_op = cb->prec == MT_PREC_BF16 ? a->dq_op : dq;
    *dk_op = cb->prec == MT_PREC_BF16 ? a->dk_op : dk;
    to_op(cb, *dq_op, dq, N * Q);
    to_op(cb, *dk_op, dk, N * KV);
    to_op(cb, a->dv_op, a->dv32, N * KV);
}

/* The bf16 fast path of block_forward (see cuda_backend.fast), into the
 * scratch cb->a or a kept unit a. A kept unit has no room for the normed
 * inputs xn1, xn2 nor the SwiGLU output: they go to the scratch, and the
 * backward rebuilds them (cheap element-wise passes; the same kernels on
 * the same inputs give the same bits). */
static void block_forward_fast(cuda_backend *cb, acts *a, int layer, int mb, const float *x, float *out) {
    const mt_config *c = cb->cfg;
    slot *s = bound_slot(cb);
    void *xn1 = a->xn1_op ? a->xn1_op : cb->a.xn1_op, *xn2 = a->xn2_op ? a->xn2_op : cb->a.xn2_op;
    void *mlp = a->mlp_op ? a->mlp_op : cb->a.mlp_op;
    float *xmid = a->xmid ? a->xmid : cb->a.xmid; /* a lean kept unit has none */
    mt_cuda_ctx *ctx = cb->ctx;
    cudaStream_t st = cb->s_comp;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = MT_PREC_BF16;
    mt_error err;
    const int32_t *pos = mt_cuda_block_pos(cb, mb), *apos = mt_cuda_attn_pos(cb, mb);
    mt_cuda_rmsnorm_forward(ctx, xn1, MT_DT_BF16, a->rstd1, x,
                            W32(cb, s, layer, MT_T_ATTN_NORM), N, C, c->rms_eps);
    /* q, k, v with their biases (Qwen2); Qwen3's q/k norms (over each
     * head) read the bf16 products and write the attention's operands */
    void *q = c->qk_norm ? a->qpre_op : a->q_op, *k = c->qk_norm ? a->kpre_op : a->k_op;
    mt_cuda_matmul_forward(ctx, p, q, MT_DT_BF16, xn1, W_op(cb, s, layer, MT_T_WQ),
                           W32(cb, s, layer, MT_T_BQ), N, C, Q);
    mt_cuda_matmul_forward(ctx, p, k, MT_DT_BF16, xn1, W_op(cb, s, layer, MT_T_WK),
                           W32(cb, s, layer, MT_T_BK), N, C, KV);
    mt_cuda_matmul_forward(ctx, p, a->v_op, MT_DT_BF16, xn1, W_op(cb, s, layer, MT_T_WV),
                           W32(cb, s, layer, MT_T_BV), N, C, KV);
    if (c->qk_norm) {
        mt_cuda_rmsnorm_forward_bf16(ctx, a->q_op, a->qrstd, q, W32(cb, s, layer, MT_T_QNORM),
                                     N * c->NH, c->HD, c->rms_eps);
        mt_cuda_rmsnorm_forward_bf16(ctx, a->k_op, a->krstd, k, W32(cb, s, layer, MT_T_KNORM),
                                     N * c->NKV, c->HD, c->rms_eps);
    }
    mt_cuda_rope_forward_bf16(st, a->q_op, cb->cos, cb->sin, pos, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_forward_bf16(st, a->k_op, cb->cos, cb->sin, pos, cb->B, cb->T, c->NKV, c->HD);
    attn_check(mt_attn_forward_bf16(a->att_op, NULL, a->lse, a->q_op, a->k_op, a->v_op, apos, NULL,
                                    cb->B, cb->T, c->NH, c->NKV, c->HD, st, &err), &err);
    mt_cuda_matmul_forward_add(ctx, p, xmid, a->att_op, W_op(cb, s, layer, MT_T_WO), x, N, Q,
                               C);
    mt_cuda_rmsnorm_forward(ctx, xn2, MT_DT_BF16, a->rstd2, xmid,
                            W32(cb, s, layer, MT_T_MLP_NORM), N, C, c->rms_eps);
    if (is_moe(cb, layer)) {
        moe_forward(cb, layer, xn2, out ? out : cb->a.xtmp);
        if (out) mt_cuda_residual_add(ctx, out, out, xmid, N * C);
        return;
    }
    mt_cuda_matmul_forward(ctx, p, a->gate16, MT_DT_BF16, xn2, W_op(cb, s, layer, MT_T_WGATE),
                           NULL, N, C, F);
    mt_cuda_matmul_forward(ctx, p, a->up16, MT_DT_BF16, xn2, W_op(cb, s, layer, MT_T_WUP), NULL,
                           N, C, F);
    mt_cuda_swiglu_forward_bf16(st, mlp, a->gate16, a->up16, N * F);
    if (out) /* out = xmid + down(mlp); a recompute for the backward stops before it */
        mt_cuda_matmul_forward_add(ctx, p, out, mlp, W_op(cb, s, layer, MT_T_WDOWN), xmid, N,
                                   F, C);
}

/* Forward activations are read from f (the scratch after a recompute, or a
 * kept unit, whose xn1, xn2 and SwiGLU output are rebuilt into the
 * scratch); gradient buffers come from the scratch. */
static void block_backward_fast(cuda_backend *cb, const acts *f, int layer, int mb, const float *x,
                                float *dx) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    cudaStream_t st = cb->s_comp;
    float *g = cb->g_cur;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = MT_PREC_BF16;
    mt_error err;
    const int32_t *pos = mt_cuda_block_pos(cb, mb), *apos = mt_cuda_attn_pos(cb, mb);
    const void *xn1 = f->xn1_op, *xn2 = f->xn2_op, *mlp = f->mlp_op;
    const float *xmid = f->xmid;
    if (!xmid) { /* a lean kept unit: x + o_proj(att), as the forward made it */
        mt_cuda_matmul_forward_add(ctx, p, a->xmid, f->att_op, W_op(cb, s, layer, MT_T_WO), x, N,
                                   Q, C);
        xmid = a->xmid;
    }
    if (!xn2) {
        mt_cuda_rmsnorm_forward(ctx, a->xn2_op, MT_DT_BF16, NULL, xmid,
                                W32(cb, s, layer, MT_T_MLP_NORM), N, C, c->rms_eps);
        xn2 = a->xn2_op;
    }
    if (is_moe(cb, layer)) {
        moe_backward(cb, layer, xn2, dx, a->dxn32);
    } else {
        if (!mlp) {
            mt_cuda_swiglu_forward_bf16(st, a->mlp_op, f->gate16, f->up16, N * F);
            mlp = a->mlp_op;
        }
        to_op(cb, a->dx_op, dx, N * C);
        mt_cuda_matmul_backward(ctx, p, a->dmlp32, false, G(cb, g, layer, MT_T_WDOWN),
                                a->dx_op, mlp, W_op(cb, s, layer, MT_T_WDOWN), N, F, C);
        mt_cuda_swiglu_backward_bf16(st, a->dgate_op, a->dup_op, a->dmlp32, f->gate16, f->up16,
                                     N * F);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WGATE),
                                a->dgate_op, xn2, W_op(cb, s, layer, MT_T_WGATE), N, C, F);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WUP), a->dup_op,
                                xn2, W_op(cb, s, layer, MT_T_WUP), N, C, F);
    }
    mt_cuda_rmsnorm_backward_op(ctx, dx, a->dx_op, G(cb, g, layer, MT_T_MLP_NORM), a->colsum,
                                a->dxn32, xmid, W32(cb, s, layer, MT_T_MLP_NORM), f->rstd2, N,
                                C);
    mt_cuda_matmul_backward_dt(ctx, p, a->datt_op, MT_DT_BF16, G(cb, g, layer, MT_T_WO),
                               a->dx_op, f->att_op, W_op(cb, s, layer, MT_T_WO), N, Q, C);
    attn_check(mt_attn_backward_bf16(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt_op,
                                     f->q_op, f->k_op, f->v_op, f->att_op, f->lse, apos, NULL,
                                     cb->B, cb->T, c->NH, c->NKV, c->HD, st, &err), &err);
    bool fused = mt_cuda_qkv_fusable(cb, layer);
    if (c->qk_norm || c->qkv_bias) {
        if (c->qk_norm) { /* the norms' backward reads the pre-norm q, k in fp32 */
            mt_cuda_cast_bf16_to_f32(ctx, a->qpre32, f->qpre_op, N * Q);
            mt_cuda_cast_bf16_to_f32(ctx, a->kpre32, f->kpre_op, N * KV);
        }
        void *dq_op, *dk_op; /* a->dq_op, a->dk_op in bf16 */
        qkv_grads_to_op(cb, layer, mb, a->qpre32, a->kpre32, f->qrstd, f->krstd, &dq_op,
                        &dk_op);
    } else if (!fused) {
        mt_cuda_rope_backward_to_bf16(st, a->dq_op, Q, a->dq32, cb->cos, cb->sin, pos, cb->B,
                                      cb->T, c->NH, c->HD);
        mt_cuda_rope_backward_to_bf16(st, a->dk_op, KV, a->dk32, cb->cos, cb->sin, pos, cb->B,
                                      cb->T, c->NKV, c->HD);
        to_op(cb, a->dv_op, a->dv32, N * KV);
    }
    if (!xn1) {
        mt_cuda_rmsnorm_forward(ctx, a->xn1_op, MT_DT_BF16, NULL, x,
                                W32(cb, s, layer, MT_T_ATTN_NORM), N, C, c->rms_eps);
        xn1 = a->xn1_op;
    }
    if (fused) {
        mt_cuda_qkv_backward_fused(cb, layer, mb, cb->cos, cb->sin, xn1);
    } else {
        mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WQ), a->dq_op,
                                xn1, W_op(cb, s, layer, MT_T_WQ), N, C, Q);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WK), a->dk_op,
                                xn1, W_op(cb, s, layer, MT_T_WK), N, C, KV);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WV), a->dv_op,
                                xn1, W_op(cb, s, layer, MT_T_WV), N, C, KV);
    }
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_ATTN_NORM), a->colsum, a->dxn32, x,
                             W32(cb, s, layer, MT_T_ATTN_NORM), f->rstd1, N, C);
}

/* The kept activation unit of (layer, mb), or NULL. */
acts *mt_cuda_kept_unit(cuda_backend *cb, int layer, int mb) {
    int first = (int)cb->cfg->L - cb->n_keep + 1; /* layer index of the first kept block */
    if (!cb->n_keep || layer < first || layer > (int)cb->cfg->L) return NULL;
    return &cb->kept[(layer - first) * cb->max_M + mb];
}

/* The general path: fp32 intermediates (fp32 mode, q/k norm, biases, or
 * head sizes without the bf16 flash kernel); activations in cb->a. */
static void block_forward_general(cuda_backend *cb, int layer, int mb, const float *x, float *out) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = cb->prec;
    mt_error err;
    const int32_t *pos = mt_cuda_block_pos(cb, mb), *apos = mt_cuda_attn_pos(cb, mb);
    mt_cuda_rmsnorm_forward(ctx, a->xn1_op, op_dt(cb), a->rstd1, x,
                            W32(cb, s, layer, MT_T_ATTN_NORM), N, C, c->rms_eps);
    float *q = c->qk_norm ? a->qpre32 : a->q32, *k = c->qk_norm ? a->kpre32 : a->k32;
    mt_cuda_matmul_forward(ctx, p, q, MT_DT_F32, a->xn1_op, W_op(cb, s, layer, MT_T_WQ),
                           W32(cb, s, layer, MT_T_BQ), N, C, Q);
    mt_cuda_matmul_forward(ctx, p, k, MT_DT_F32, a->xn1_op, W_op(cb, s, layer, MT_T_WK),
                           W32(cb, s, layer, MT_T_BK), N, C, KV);
    mt_cuda_matmul_forward(ctx, p, a->v32, MT_DT_F32, a->xn1_op, W_op(cb, s, layer, MT_T_WV),
                           W32(cb, s, layer, MT_T_BV), N, C, KV);
    if (c->qk_norm) {
        mt_cuda_rmsnorm_forward(ctx, a->q32, MT_DT_F32, a->qrstd, a->qpre32,
                                W32(cb, s, layer, MT_T_QNORM), N * c->NH, c->HD, c->rms_eps);
        mt_cuda_rmsnorm_forward(ctx, a->k32, MT_DT_F32, a->krstd, a->kpre32,
                                W32(cb, s, layer, MT_T_KNORM), N * c->NKV, c->HD, c->rms_eps);
    }
    mt_cuda_rope_forward(ctx, a->q32, cb->cos, cb->sin, pos, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_forward(ctx, a->k32, cb->cos, cb->sin, pos, cb->B, cb->T, c->NKV, c->HD);
    if (cb->attn_bf16) {
        to_op(cb, a->q_op, a->q32, N * Q);
        to_op(cb, a->k_op, a->k32, N * KV);
        to_op(cb, a->v_op, a->v32, N * KV);
        attn_check(mt_attn_forward_bf16(a->att_op, NULL, a->lse, a->q_op, a->k_op, a->v_op, apos,
                                        NULL, cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp,
                                        &err), &err);
    } else {
        /* fp32 mode, or head sizes the bf16 kernel lacks: fp32 attention,
         * its output rounded for the bf16 o_proj product. */
        attn_check(mt_attn_forward_f32(a->att32, a->lse, a->q32, a->k32, a->v32, apos, NULL, cb->B,
                                       cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
        to_op(cb, a->att_op, a->att32, N * Q);
    }
    mt_cuda_matmul_forward_add(ctx, p, a->xmid, a->att_op, W_op(cb, s, layer, MT_T_WO), x, N, Q,
                               C);
    mt_cuda_rmsnorm_forward(ctx, a->xn2_op, op_dt(cb), a->rstd2, a->xmid,
                            W32(cb, s, layer, MT_T_MLP_NORM), N, C, c->rms_eps);
    if (is_moe(cb, layer)) {
        moe_forward(cb, layer, a->xn2_op, out ? out : a->xtmp);
        if (out) mt_cuda_residual_add(ctx, out, out, a->xmid, N * C);
        return;
    }
    mt_cuda_matmul_forward(ctx, p, a->gate32, MT_DT_F32, a->xn2_op,
                           W_op(cb, s, layer, MT_T_WGATE), NULL, N, C, F);
    mt_cuda_matmul_forward(ctx, p, a->up32, MT_DT_F32, a->xn2_op, W_op(cb, s, layer, MT_T_WUP),
                           NULL, N, C, F);
    mt_cuda_swiglu_forward(ctx, a->mlp_op, op_dt(cb), a->gate32, a->up32, N, F);
    if (out) /* out = xmid + down(mlp); a recompute for the backward stops before it */
        mt_cuda_matmul_forward_add(ctx, p, out, a->mlp_op, W_op(cb, s, layer, MT_T_WDOWN),
                                   a->xmid, N, F, C);
}

static void block_backward_general(cuda_backend *cb, int layer, int mb, const float *x, float *dx) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    float *g = cb->g_cur;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    mt_precision p = cb->prec;
    mt_error err;
    const int32_t *apos = mt_cuda_attn_pos(cb, mb);
    void *dx_op = p == MT_PREC_BF16 ? a->dx_op : dx;

    /* MLP: out = xmid + down(silu(gate) * up), or + the MoE MLP */
    if (is_moe(cb, layer)) {
        moe_backward(cb, layer, a->xn2_op, dx, a->dxn32);
    } else {
        to_op(cb, dx_op, dx, N * C);
        mt_cuda_matmul_backward(ctx, p, a->dmlp32, false, G(cb, g, layer, MT_T_WDOWN), dx_op,
                                a->mlp_op, W_op(cb, s, layer, MT_T_WDOWN), N, F, C);
        mt_cuda_swiglu_backward(ctx, a->dgate32, a->dup32, a->dmlp32, a->gate32, a->up32, N, F);
        to_op(cb, a->dgate_op, a->dgate32, N * F);
        to_op(cb, a->dup_op, a->dup32, N * F);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WGATE),
                                a->dgate_op, a->xn2_op, W_op(cb, s, layer, MT_T_WGATE), N, C, F);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WUP), a->dup_op,
                                a->xn2_op, W_op(cb, s, layer, MT_T_WUP), N, C, F);
    }
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_MLP_NORM), a->colsum, a->dxn32,
                             a->xmid, W32(cb, s, layer, MT_T_MLP_NORM), a->rstd2, N, C);

    /* Attention: xmid = x + o_proj(att) */
    to_op(cb, dx_op, dx, N * C);
    mt_cuda_matmul_backward(ctx, p, a->datt32, false, G(cb, g, layer, MT_T_WO), dx_op,
                            a->att_op, W_op(cb, s, layer, MT_T_WO), N, Q, C);
    if (cb->attn_bf16) {
        to_op(cb, a->datt_op, a->datt32, N * Q);
        attn_check(mt_attn_backward_bf16(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt_op,
                                         a->q_op, a->k_op, a->v_op, a->att_op, a->lse, apos, NULL,
                                         cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err),
                   &err);
    } else {
        attn_check(mt_attn_backward_f32(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt32,
                                        a->q32, a->k32, a->v32, a->att32, a->lse, apos, NULL, cb->B,
                                        cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
    }
    void *dq_op, *dk_op;
    qkv_grads_to_op(cb, layer, mb, a->qpre32, a->kpre32, a->qrstd, a->krstd, &dq_op, &dk_op);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WQ), dq_op, a->xn1_op,
                            W_op(cb, s, layer, MT_T_WQ), N, C, Q);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WK), dk_op, a->xn1_op,
                            W_op(cb, s, layer, MT_T_WK), N, C, KV);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WV), a->dv_op,
                            a->xn1_op, W_op(cb, s, layer, MT_T_WV), N, C, KV);
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_ATTN_NORM), a->colsum, a->dxn32, x,
                             W32(cb, s, layer, MT_T_ATTN_NORM), a->rstd1, N, C);
}

void mt_cuda_block_forward(cuda_backend *cb, acts *a, int layer, int mb, const float *x,
                           float *out) {
    if (mt_arch_has_neox_block(cb->cfg->arch)) {
        mt_cuda_neox_forward(cb, a, layer, mb, x, out);
        return;
    }
    if (mt_arch_is_gemma(cb->cfg->arch)) {
        mt_cuda_gemma_forward(cb, a, layer, mb, x, out);
        return;
    }
    if (cb->fast) {
        block_forward_fast(cb, a, layer, mb, x, out);
        return;
    }
    MT_ASSERT(a == &cb->a); /* activations are kept on the fast path only */
    block_forward_general(cb, layer, mb, x, out);
}

void mt_cuda_block_backward(cuda_backend *cb, const acts *f, int layer, int mb, const float *x,
                            float *dx) {
    if (mt_arch_has_neox_block(cb->cfg->arch)) {
        mt_cuda_neox_backward(cb, f, layer, mb, x, dx);
        return;
    }
    if (mt_arch_is_gemma(cb->cfg->arch)) {
        mt_cuda_gemma_backward(cb, f, layer, mb, x, dx);
        return;
    }
    if (cb->fast) {
        block_backward_fast(cb, f, layer, mb, x, dx);
        return;
    }
    MT_ASSERT(f == &cb->a);
    block_backward_general(cb, layer, mb, x, dx);
}
