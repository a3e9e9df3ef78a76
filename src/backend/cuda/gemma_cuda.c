/* The Gemma 2 and Gemma 3 decoder blocks on the CUDA backend, forward and
 * backward for one micro-batch, as backend/cpu/gemma.c computes them (the
 * math is written out in gemma.h):
 *
 *   every norm an RMSNorm by 1 + w (mt_cuda_norm_w)
 *   q, k, v = norm_in(x) W^T; Gemma 3: q, k = q_norm(q), k_norm(k) per head
 *   RoPE with the block's tables (Gemma 3's sliding layers: cos_l, sin_l)
 *   att  = attention, scale query_pre_attn_scalar^-0.5, Gemma 2's soft-cap;
 *          a sliding layer masks by the windowed positions (win_pos)
 *   xmid = x + norm_post_attn(att Wo^T)
 *   out  = xmid + norm_post_ff(Wdown (gelu(Wgate z) * Wup z)), z = norm_pre_ff(xmid)
 *
 * Two paths. On the bf16 flash kernels (cb->attn_bf16) the products write
 * bf16 operands (q, k, v, gate, up), the q/k norms, RoPE and the GeGLU
 * work on bf16, as the Llama family's fast path and PyTorch's autocast do,
 * and a block can keep its activations for the backward (cb->keeps). In
 * bf16 mode the products before the post-norms (ao, mo) write bf16 too,
 * as autocast's linear layers do, and the post-norms read them in fp32
 * arithmetic. Otherwise (fp32 mode, or head sizes without the bf16
 * kernels) every other product writes fp32 and the operands are cast for
 * the next one; nothing is kept. A block that does not keep recomputes its
 * forward for the backward, down projection and post-norm included, unless
 * it keeps those two's outputs (a down-kept unit, mt_cuda_down_unit): then
 * the recompute stops after the GeGLU. */
#include <math.h>

#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/layers_cuda.h"
#include "kernels/attention/attention.h"
#include "kernels/cuda_common.h"
#include "kernels/ops/ops_fused.h"

/* ---- shared with the head and the embedding (layers_cuda.h) ---- */

/* Where role r's 1 + w goes in cb->a.norm_w. */
static size_t norm_w_at(const mt_config *c, mt_role r) {
    size_t C = (size_t)c->C, HD = (size_t)c->HD;
    switch (r) {
    case MT_T_ATTN_NORM: case MT_T_FINAL_NORM: return 0;
    case MT_T_ATTN_POST_NORM: return C;
    case MT_T_MLP_NORM: return 2 * C;
    case MT_T_MLP_POST_NORM: return 3 * C;
    case MT_T_QNORM: return 4 * C;
    case MT_T_KNORM: return 4 * C + HD;
    default: MT_DIE("role %d is not a Gemma RMSNorm", (int)r);
    }
}

const float *mt_cuda_norm_w(cuda_backend *cb, int layer, mt_role r) {
    const float *w = W32(cb, bound_slot(cb), layer, r);
    if (!w || !cb->t->norm_offset) return w;
    const mt_layer_desc *ld = &cb->t->layers[layer];
    float *out = cb->a.norm_w + norm_w_at(cb->cfg, r);
    mt_cuda_affine(cb->ctx, out, w, ld->tensors[ld->by_role[r]].numel, 1.0f, 1.0f);
    return out;
}

void mt_cuda_embed_scale(cuda_backend *cb, float *x) {
    if (!mt_arch_is_gemma(cb->cfg->arch)) return;
    /* an fp32 number, as transformers makes it (and backend_cpu.c) */
    float s = (float)sqrt((double)cb->cfg->C);
    mt_cuda_affine(cb->ctx, x, x, (size_t)cb->N * cb->cfg->C, s, 0.0f);
}

/* ---- the block ---- */

/* The attention scores of every Gemma block: scale and soft-cap. */
static mt_attn_scores scores(const cuda_backend *cb) {
    const mt_config *c = cb->cfg;
    return (mt_attn_scores){.scale = (float)pow(c->query_pre_attn_scalar, -0.5),
                            .softcap = (float)c->attn_softcap};
}

static int slides(const cuda_backend *cb, int layer) {
    return mt_config_block_slides(cb->cfg, cb->t->layers[layer].block);
}

/* The positions the attention masks by: a sliding layer's windowed ones
 * (when the window is shorter than T), a global layer's the documents'. */
static const int32_t *attn_pos(const cuda_backend *cb, int layer, int mb) {
    return slides(cb, layer) ? mt_cuda_attn_pos(cb, mb) : mt_cuda_block_pos(cb, mb);
}

static void tables(const cuda_backend *cb, int layer, const float **cos, const float **sin) {
    *cos = slides(cb, layer) ? cb->cos_l : cb->cos;
    *sin = slides(cb, layer) ? cb->sin_l : cb->sin;
}

/* The normed inputs and the products' operands go to the scratch cb->a
 * always (xn1, xn2, the GeGLU's output): a kept unit has no room for them
 * and its backward rebuilds them. */

/* a's q, k, v from x: the input norm, the products, Gemma 3's q/k norms
 * (their inputs, rstd kept), RoPE. bf16 path: into a->q_op, k_op, v_op;
 * else q32, k32, v32. */
static void qkv_forward(cuda_backend *cb, acts *a, int layer, int mb, const float *x) {
    const mt_config *c = cb->cfg;
    acts *sc = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD;
    mt_precision p = cb->prec;
    int bf = cb->attn_bf16;
    mt_dt dt = bf ? MT_DT_BF16 : MT_DT_F32; /* what the products write */
    const int32_t *pos = mt_cuda_block_pos(cb, mb);
    const float *cos, *sin;
    tables(cb, layer, &cos, &sin);
    mt_cuda_rmsnorm_forward(ctx, sc->xn1_op, op_dt(cb), a->rstd1, x,
                            mt_cuda_norm_w(cb, layer, MT_T_ATTN_NORM), N, C, c->rms_eps);
    void *q = bf ? a->q_op : (void *)a->q32, *k = bf ? a->k_op : (void *)a->k32;
    void *qpre = bf ? a->qpre_op : (void *)a->qpre32, *kpre = bf ? a->kpre_op : (void *)a->kpre32;
    mt_cuda_matmul_forward(ctx, p, c->qk_norm ? qpre : q, dt, sc->xn1_op,
                           W_op(cb, s, layer, MT_T_WQ), NULL, N, C, Q);
    mt_cuda_matmul_forward(ctx, p, c->qk_norm ? kpre : k, dt, sc->xn1_op,
                           W_op(cb, s, layer, MT_T_WK), NULL, N, C, KV);
    mt_cuda_matmul_forward(ctx, p, bf ? a->v_op : (void *)a->v32, dt, sc->xn1_op,
                           W_op(cb, s, layer, MT_T_WV), NULL, N, C, KV);
    const float *qw = c->qk_norm ? mt_cuda_norm_w(cb, layer, MT_T_QNORM) : NULL;
    const float *kw = c->qk_norm ? mt_cuda_norm_w(cb, layer, MT_T_KNORM) : NULL;
    if (bf) {
        if (c->qk_norm) {
            mt_cuda_rmsnorm_forward_bf16(ctx, q, a->qrstd, qpre, qw, N * c->NH, c->HD, c->rms_eps);
            mt_cuda_rmsnorm_forward_bf16(ctx, k, a->krstd, kpre, kw, N * c->NKV, c->HD,
                                         c->rms_eps);
        }
        mt_cuda_rope_forward_bf16(cb->s_comp, q, cos, sin, pos, cb->B, cb->T, c->NH, c->HD);
        mt_cuda_rope_forward_bf16(cb->s_comp, k, cos, sin, pos, cb->B, cb->T, c->NKV, c->HD);
        return;
    }
    if (c->qk_norm) {
        mt_cuda_rmsnorm_forward(ctx, q, MT_DT_F32, a->qrstd, qpre, qw, N * c->NH, c->HD,
                                c->rms_eps);
        mt_cuda_rmsnorm_forward(ctx, k, MT_DT_F32, a->krstd, kpre, kw, N * c->NKV, c->HD,
                                c->rms_eps);
    }
    mt_cuda_rope_forward(ctx, q, cos, sin, pos, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_forward(ctx, k, cos, sin, pos, cb->B, cb->T, c->NKV, c->HD);
}

/* a's att_op (and att32 on the fp32 kernel) and lse from its q, k, v. */
static void attention_forward(cuda_backend *cb, acts *a, int layer, int mb) {
    const mt_config *c = cb->cfg;
    size_t N = cb->N, Q = c->NH * c->HD;
    mt_attn_scores sc = scores(cb);
    const int32_t *apos = attn_pos(cb, layer, mb);
    mt_error err;
    if (cb->attn_bf16) {
        attn_check(mt_attn_forward_bf16(a->att_op, NULL, a->lse, a->q_op, a->k_op, a->v_op, apos,
                                        &sc, cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp,
                                        &err), &err);
    } else { /* fp32 mode, or head sizes the bf16 kernels lack */
        attn_check(mt_attn_forward_f32(a->att32, a->lse, a->q32, a->k32, a->v32, apos, &sc,
                                       cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err),
                   &err);
        to_op(cb, a->att_op, a->att32, N * Q);
    }
}

/* out = res + norm_r(in) (in of the operand type), keeping the norm's
 * rstd (NULL: not kept); out NULL: the rstd only (a recompute's last
 * post-norm, whose sum nothing reads). */
static void post_norm(cuda_backend *cb, int layer, mt_role r, float *out, float *rstd,
                      const void *in, const float *res) {
    mt_cuda_rmsnorm_residual_forward(cb->ctx, out, rstd, in, op_dt(cb),
                                     mt_cuda_norm_w(cb, layer, r), res, NULL, MT_DT_F32, NULL,
                                     NULL, cb->N, cb->cfg->C, cb->cfg->rms_eps);
}

/* xmid = x + norm_post_attn(ao) and the MLP's normed input xn2 (scratch)
 * from it, one pass; rstd_pa, rstd2 NULL: a rebuild. */
static void mid_norms(cuda_backend *cb, int layer, float *xmid, float *rstd_pa, float *rstd2,
                      const void *ao, const float *x) {
    mt_cuda_rmsnorm_residual_forward(cb->ctx, xmid, rstd_pa, ao, op_dt(cb),
                                     mt_cuda_norm_w(cb, layer, MT_T_ATTN_POST_NORM), x,
                                     cb->a.xn2_op, op_dt(cb), rstd2,
                                     mt_cuda_norm_w(cb, layer, MT_T_MLP_NORM), cb->N,
                                     cb->cfg->C, cb->cfg->rms_eps);
}

/* The GeGLU's inputs (a's gate and up, bf16 on the bf16 path) and its
 * output into the scratch's mlp_op. */
static void geglu(cuda_backend *cb, const acts *a) {
    int bf = cb->attn_bf16;
    mt_cuda_geglu_forward(cb->ctx, cb->a.mlp_op, op_dt(cb), bf ? (void *)a->gate16 : a->gate32,
                          bf ? (void *)a->up16 : a->up32, bf ? MT_DT_BF16 : MT_DT_F32, cb->N,
                          cb->cfg->F, cb->cfg->act == MT_ACT_GELU_TANH);
}

/* Where the MLP's post-norm input mo and its rstd are for activations a:
 * in a down-kept unit (the scratch's in training, for a layer that keeps
 * one: 1), else in a (0). */
static int post_ff_input(const cuda_backend *cb, const acts *a, int layer, int mb, void **mo,
                         float **rstd) {
    if (a == &cb->a && cb->train && mt_cuda_down_unit(cb, layer, mb, mo, rstd)) return 1;
    *mo = a->mo_op;
    *rstd = a->rstd_pf;
    return 0;
}

void mt_cuda_gemma_forward(cuda_backend *cb, acts *a, int layer, int mb, const float *x,
                           float *out) {
    const mt_config *c = cb->cfg;
    acts *sc = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, F = c->F;
    mt_precision p = cb->prec;
    int bf = cb->attn_bf16;
    MT_ASSERT(a == sc || bf); /* units are kept on the bf16 path only */
    float *xmid = a->xmid ? a->xmid : sc->xmid; /* a kept unit has none: it is rebuilt */
    qkv_forward(cb, a, layer, mb, x);
    attention_forward(cb, a, layer, mb);
    mt_cuda_matmul_forward(ctx, p, a->ao_op, op_dt(cb), a->att_op, W_op(cb, s, layer, MT_T_WO),
                           NULL, N, Q, C);
    mid_norms(cb, layer, xmid, a->rstd_pa, a->rstd2, a->ao_op, x);
    mt_dt dt = bf ? MT_DT_BF16 : MT_DT_F32;
    mt_cuda_matmul_forward(ctx, p, bf ? (void *)a->gate16 : a->gate32, dt, sc->xn2_op,
                           W_op(cb, s, layer, MT_T_WGATE), NULL, N, C, F);
    mt_cuda_matmul_forward(ctx, p, bf ? (void *)a->up16 : a->up32, dt, sc->xn2_op,
                           W_op(cb, s, layer, MT_T_WUP), NULL, N, C, F);
    geglu(cb, a);
    /* The post-norm's backward reads mo and rstd_pf: a recompute runs the
     * down projection and the post-norm too, unless the forward kept them
     * in a down-kept unit (training only, not in a kept unit). */
    void *mo;
    float *rstd_pf;
    if (post_ff_input(cb, a, layer, mb, &mo, &rstd_pf) && !out) return;
    mt_cuda_matmul_forward(ctx, p, mo, op_dt(cb), sc->mlp_op, W_op(cb, s, layer, MT_T_WDOWN),
                           NULL, N, F, C);
    post_norm(cb, layer, MT_T_MLP_POST_NORM, out, rstd_pf, mo, xmid);
}

/* dL/d in of the post-norm out = res + norm_r(in) (in of the operand
 * type), from dout = dL/d out, the norm's weight gradient on the way, as
 * the operand of the product before it: in bf16 mode straight into dx_op,
 * in fp32 mode into d32 (N, C). Returns the operand. */
static void *post_norm_backward(cuda_backend *cb, int layer, mt_role r, float *d32,
                                const float *dout, const void *in, const float *rstd) {
    acts *a = &cb->a;
    size_t N = cb->N, C = cb->cfg->C;
    float *dw = G(cb, cb->g_cur, layer, r);
    const float *w = mt_cuda_norm_w(cb, layer, r);
    if (cb->prec == MT_PREC_BF16) {
        mt_cuda_rmsnorm_backward_to_bf16(cb->ctx, a->dx_op, dw, a->colsum, dout, in, MT_DT_BF16,
                                         w, rstd, N, C);
        return a->dx_op;
    }
    CUDA_CHECK(cudaMemsetAsync(d32, 0, N * C * sizeof(float), cb->s_comp));
    mt_cuda_rmsnorm_backward(cb->ctx, d32, dw, a->colsum, dout, (const float *)in, w, rstd, N, C);
    return d32;
}

/* The MLP's backward from f's activations (the post-norm's input mo and
 * rstd_pf: f's, or a down-kept unit's) and the scratch's xmid, xn2 and
 * mlp_op: dx holds dL/d out on entry and dL/d xmid on exit. */
static void mlp_backward(cuda_backend *cb, const acts *f, int layer, const void *mo,
                         const float *rstd_pf, float *dx) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    float *g = cb->g_cur;
    size_t N = cb->N, C = c->C, F = c->F;
    mt_precision p = cb->prec;
    int bf = cb->attn_bf16, tanh_form = c->act == MT_ACT_GELU_TANH;
    /* dL/d mo in dxn32, free until the gate's product below */
    void *dmo = post_norm_backward(cb, layer, MT_T_MLP_POST_NORM, a->dxn32, dx, mo, rstd_pf);
    if (bf) { /* dL/d GeGLU out rounded once to bf16, as autocast's product
               * gives it; the gradients straight into the products' bf16
               * operands */
        mt_cuda_matmul_backward_dt(ctx, p, a->dmlp_op, MT_DT_BF16, G(cb, g, layer, MT_T_WDOWN),
                                   dmo, a->mlp_op, W_op(cb, s, layer, MT_T_WDOWN), N, F, C);
        mt_cuda_geglu_backward(ctx, a->dgate_op, a->dup_op, a->dmlp_op, MT_DT_BF16, f->gate16,
                               f->up16, MT_DT_BF16, N, F, tanh_form);
    } else {
        mt_cuda_matmul_backward(ctx, p, a->dmlp32, false, G(cb, g, layer, MT_T_WDOWN), dmo,
                                a->mlp_op, W_op(cb, s, layer, MT_T_WDOWN), N, F, C);
        mt_cuda_geglu_backward(ctx, a->dgate32, a->dup32, a->dmlp32, MT_DT_F32, f->gate32,
                               f->up32, MT_DT_F32, N, F, tanh_form);
        to_op(cb, a->dgate_op, a->dgate32, N * F);
        to_op(cb, a->dup_op, a->dup32, N * F);
    }
    mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WGATE), a->dgate_op,
                            a->xn2_op, W_op(cb, s, layer, MT_T_WGATE), N, C, F);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WUP), a->dup_op,
                            a->xn2_op, W_op(cb, s, layer, MT_T_WUP), N, C, F);
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_MLP_NORM), a->colsum, a->dxn32,
                             a->xmid, mt_cuda_norm_w(cb, layer, MT_T_MLP_NORM), f->rstd2, N, C);
}

/* dq32, dk32, dv32 from dL/d att (datt_op on the bf16 kernels, else
 * datt32) through the attention of f's q, k, v. */
static void attention_backward(cuda_backend *cb, const acts *f, int layer, int mb) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    mt_attn_scores sc = scores(cb);
    const int32_t *apos = attn_pos(cb, layer, mb);
    mt_error err;
    if (cb->attn_bf16) {
        attn_check(mt_attn_backward_bf16(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt_op,
                                         f->q_op, f->k_op, f->v_op, f->att_op, f->lse, apos, &sc,
                                         cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err),
                   &err);
    } else {
        attn_check(mt_attn_backward_f32(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt32,
                                        f->q32, f->k32, f->v32, f->att32, f->lse, apos, &sc,
                                        cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err),
                   &err);
    }
}

/* From dq32, dk32, dv32 to the products' operands: RoPE's backward, the
 * q/k norms' (Gemma 3: their fp32 inputs, from f's bf16 ones on the bf16
 * path); *dq_op, *dk_op, *dv_op as in layers_cuda.c. */
static void qkv_grads_to_op(cuda_backend *cb, const acts *f, int layer, int mb, void **dq_op,
                            void **dk_op, void **dv_op) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    mt_cuda_ctx *ctx = cb->ctx;
    float *g = cb->g_cur;
    size_t N = cb->N, Q = c->NH * c->HD, KV = c->NKV * c->HD;
    const int32_t *pos = mt_cuda_block_pos(cb, mb);
    const float *cos, *sin;
    tables(cb, layer, &cos, &sin);
    int bf = cb->prec == MT_PREC_BF16;
    *dv_op = a->dv_op;
    to_op(cb, *dv_op, a->dv32, N * KV);
    if (bf && !c->qk_norm) { /* RoPE's backward writes the products' operands */
        *dq_op = a->dq_op;
        *dk_op = a->dk_op;
        mt_cuda_rope_backward_to_bf16(cb->s_comp, a->dq_op, Q, a->dq32, cos, sin, pos, cb->B,
                                      cb->T, c->NH, c->HD);
        mt_cuda_rope_backward_to_bf16(cb->s_comp, a->dk_op, KV, a->dk32, cos, sin, pos, cb->B,
                                      cb->T, c->NKV, c->HD);
        return;
    }
    mt_cuda_rope_backward(ctx, a->dq32, cos, sin, pos, cb->B, cb->T, c->NH, c->HD);
    mt_cuda_rope_backward(ctx, a->dk32, cos, sin, pos, cb->B, cb->T, c->NKV, c->HD);
    float *dq = a->dq32, *dk = a->dk32;
    if (c->qk_norm) {
        if (cb->attn_bf16) { /* the norms' backward reads the pre-norm q, k in fp32 */
            mt_cuda_cast_bf16_to_f32(ctx, a->qpre32, f->qpre_op, N * Q);
            mt_cuda_cast_bf16_to_f32(ctx, a->kpre32, f->kpre_op, N * KV);
        }
        CUDA_CHECK(cudaMemsetAsync(a->dqn32, 0, N * Q * sizeof(float), cb->s_comp));
        CUDA_CHECK(cudaMemsetAsync(a->dkn32, 0, N * KV * sizeof(float), cb->s_comp));
        mt_cuda_rmsnorm_backward(ctx, a->dqn32, G(cb, g, layer, MT_T_QNORM), a->colsum, a->dq32,
                                 a->qpre32, mt_cuda_norm_w(cb, layer, MT_T_QNORM), f->qrstd,
                                 N * c->NH, c->HD);
        mt_cuda_rmsnorm_backward(ctx, a->dkn32, G(cb, g, layer, MT_T_KNORM), a->colsum, a->dk32,
                                 a->kpre32, mt_cuda_norm_w(cb, layer, MT_T_KNORM), f->krstd,
                                 N * c->NKV, c->HD);
        dq = a->dqn32;
        dk = a->dkn32;
    }
    *dq_op = bf ? a->dq_op : dq;
    *dk_op = bf ? a->dk_op : dk;
    to_op(cb, *dq_op, dq, N * Q);
    to_op(cb, *dk_op, dk, N * KV);
}

/* What a kept unit f leaves out, rebuilt into the scratch from x and f
 * (the same kernels on the same inputs: the forward's bits): xn1, xmid,
 * xn2 and the GeGLU's output. */
static void rebuild(cuda_backend *cb, const acts *f, int layer, const float *x) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    mt_cuda_rmsnorm_forward(cb->ctx, a->xn1_op, MT_DT_BF16, NULL, x,
                            mt_cuda_norm_w(cb, layer, MT_T_ATTN_NORM), cb->N, c->C, c->rms_eps);
    mid_norms(cb, layer, a->xmid, NULL, NULL, f->ao_op, x);
    geglu(cb, f);
}

/* The forward's activations are in f: the scratch after a recompute, or a
 * kept unit (the bf16 path), whose missing parts are rebuilt first; dx
 * holds dL/d out on entry, dL/d x on exit. */
void mt_cuda_gemma_backward(cuda_backend *cb, const acts *f, int layer, int mb, const float *x,
                            float *dx) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    float *g = cb->g_cur;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD;
    mt_precision p = cb->prec;
    MT_ASSERT(f == a || cb->attn_bf16);
    if (f != a) rebuild(cb, f, layer, x);
    void *mo;
    float *rstd_pf;
    post_ff_input(cb, f, layer, mb, &mo, &rstd_pf);
    mlp_backward(cb, f, layer, mo, rstd_pf, dx);
    /* xmid = x + norm_post_attn(ao): dL/d ao in dxn32, free until the
     * q product below */
    void *dao = post_norm_backward(cb, layer, MT_T_ATTN_POST_NORM, a->dxn32, dx, f->ao_op,
                                   f->rstd_pa);
    if (cb->attn_bf16) /* the bf16 kernels read the product's sums rounded once */
        mt_cuda_matmul_backward_dt(ctx, p, a->datt_op, MT_DT_BF16, G(cb, g, layer, MT_T_WO), dao,
                                   f->att_op, W_op(cb, s, layer, MT_T_WO), N, Q, C);
    else
        mt_cuda_matmul_backward(ctx, p, a->datt32, false, G(cb, g, layer, MT_T_WO), dao,
                                f->att_op, W_op(cb, s, layer, MT_T_WO), N, Q, C);
    attention_backward(cb, f, layer, mb);
    if (mt_cuda_qkv_fusable(cb, layer)) {
        const float *cos, *sin;
        tables(cb, layer, &cos, &sin);
        mt_cuda_qkv_backward_fused(cb, layer, mb, cos, sin, a->xn1_op);
    } else {
        void *dq_op, *dk_op, *dv_op;
        qkv_grads_to_op(cb, f, layer, mb, &dq_op, &dk_op, &dv_op);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WQ), dq_op,
                                a->xn1_op, W_op(cb, s, layer, MT_T_WQ), N, C, Q);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WK), dk_op,
                                a->xn1_op, W_op(cb, s, layer, MT_T_WK), N, C, KV);
        mt_cuda_matmul_backward(ctx, p, a->dxn32, true, G(cb, g, layer, MT_T_WV), dv_op,
                                a->xn1_op, W_op(cb, s, layer, MT_T_WV), N, C, KV);
    }
    mt_cuda_rmsnorm_backward(ctx, dx, G(cb, g, layer, MT_T_ATTN_NORM), a->colsum, a->dxn32, x,
                             mt_cuda_norm_w(cb, layer, MT_T_ATTN_NORM), f->rstd1, N, C);
}
