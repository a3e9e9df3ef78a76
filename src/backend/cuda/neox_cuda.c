/* The gpt_neox and falcon decoder blocks on the CUDA backend, forward and
 * backward for one micro-batch, as backend/cpu/neox.c computes them (the
 * math is written out in neox.h):
 *
 *   xn1 = LayerNorm1(x); qkv = xn1 Wqkv^T + bqkv, split into q, k, v with
 *   the partial rotary on q and k; att = attention(q, k, v)
 *   xmid = x + att Wo^T + bo
 *   parallel:   out = xmid + mlp(LayerNorm2(x))   (Falcon-7B: mlp(xn1))
 *   sequential: out = xmid + mlp(LayerNorm2(xmid))
 *   mlp(z) = gelu(z Wup^T + bup) Wdown^T + bdown
 *
 * In bf16 mode the qkv and up products write bf16, which the split (with
 * the rotary) and the GELU read, as autocast does; the split writes the
 * bf16 flash kernels' operands directly (fp32 ones for the fp32 attention
 * of other head sizes). fp32 mode keeps everything fp32. Activations live
 * in the scratch cb->a and are recomputed for the backward, or, on the
 * bf16 flash kernels, kept (cb->keeps). Biases are NULL where a layer has
 * none (falcon). */
#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/layers_cuda.h"
#include "kernels/attention/attention.h"
#include "kernels/cuda_common.h"

/* out (N, OC) = add + inp @ w^T + bias (bias may be NULL), add fp32, out
 * and add the same buffer or disjoint. With a bias the product accumulates
 * into out (cuBLASLt's bias epilogue), after a copy of add. */
static void linear_add(cuda_backend *cb, float *out, const void *inp, const void *w,
                       const float *bias, const float *add, size_t N, size_t IC, size_t OC) {
    if (!bias) {
        mt_cuda_matmul_forward_add(cb->ctx, cb->prec, out, inp, w, add, N, IC, OC);
        return;
    }
    if (out != add)
        CUDA_CHECK(cudaMemcpyAsync(out, add, N * OC * sizeof(float), cudaMemcpyDeviceToDevice,
                                   cb->s_comp));
    int dt = op_dt(cb);
    mt_cuda_gemm_cm(cb->ctx, 1, 0, (int64_t)OC, (int64_t)N, (int64_t)IC, w, dt, (int64_t)IC,
                    inp, dt, (int64_t)IC, out, MT_DT_F32, (int64_t)OC, bias, 1);
}

/* dbias (OC) += column sums of dout (N, OC); nothing when the layer has no
 * such bias. */
static void bias_grad(cuda_backend *cb, float *dbias, const float *dout, size_t N, size_t OC) {
    if (dbias) mt_cuda_bias_backward(cb->ctx, dbias, cb->a.colsum, dout, N, OC);
}

/* LayerNorm `which` (MT_T_ATTN_NORM or MT_T_MLP_NORM, each with its bias)
 * of in into xn and its statistics (mean, rstd NULL: not written, as when
 * rebuilding it). */
static void layer_norm(cuda_backend *cb, int layer, mt_role which, void *xn, float *mean,
                       float *rstd, const float *in) {
    const slot *s = bound_slot(cb);
    mt_role bias = which == MT_T_ATTN_NORM ? MT_T_ATTN_NORM_B : MT_T_MLP_NORM_B;
    mt_cuda_layernorm_forward(cb->ctx, xn, op_dt(cb), mean, rstd, in, W32(cb, s, layer, which),
                              W32(cb, s, layer, bias), cb->N, cb->cfg->C, cb->cfg->rms_eps);
}

/* The forward writes what the backward reads into a: the scratch cb->a,
 * or a kept unit (bf16 flash kernels only), which holds the LayerNorms'
 * statistics, q, k, v, the attention's output and lse, h and a sequential
 * block's xmid; xn1, xn2, qkv and the GELU's output always go to the
 * scratch (the backward rebuilds them for a kept unit). */
void mt_cuda_neox_forward(cuda_backend *cb, acts *a, int layer, int mb, const float *x,
                          float *out) {
    const mt_config *c = cb->cfg;
    acts *sc = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    size_t W = Q + 2 * KV, R = (size_t)mt_config_rotary_dim(c);
    mt_precision p = cb->prec;
    mt_dt dt = op_dt(cb); /* the products' outputs the split and the GELU read */
    mt_error err;
    const int32_t *pos = mt_cuda_block_pos(cb, mb);
    const float *ln2 = W32(cb, s, layer, MT_T_MLP_NORM); /* NULL: Falcon-7B's one LayerNorm */
    MT_ASSERT(ln2 || c->parallel_residual);
    MT_ASSERT(a == sc || cb->attn_bf16); /* units are kept on the flash path only */
    /* qkv (N, W) and the GELU's input h (N, F): bf16 in bf16 mode (qkv in
     * the backward's dqkv_op, free until then) */
    void *qkv = dt == MT_DT_BF16 ? sc->dqkv_op : (void *)sc->qkv32;
    void *h = dt == MT_DT_BF16 ? (void *)a->gate16 : (void *)a->gate32;
    float *xmid = a->xmid ? a->xmid : sc->xmid; /* a parallel block's kept unit has none */
    layer_norm(cb, layer, MT_T_ATTN_NORM, sc->xn1_op, a->mean1, a->rstd1, x);
    mt_cuda_matmul_forward(ctx, p, qkv, dt, sc->xn1_op, W_op(cb, s, layer, MT_T_WQKV),
                           W32(cb, s, layer, MT_T_BQKV), N, C, W);
    if (cb->attn_bf16) {
        mt_cuda_qkv_split_rope(ctx, a->q_op, a->k_op, a->v_op, MT_DT_BF16, qkv, dt, cb->cos,
                               cb->sin, pos, (size_t)cb->B, (size_t)cb->T, c->NH, c->NKV, c->HD,
                               R);
        attn_check(mt_attn_forward_bf16(a->att_op, NULL, a->lse, a->q_op, a->k_op, a->v_op, pos,
                                        NULL, cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp,
                                        &err), &err);
    } else { /* fp32 mode, or head sizes the bf16 kernel lacks */
        mt_cuda_qkv_split_rope(ctx, a->q32, a->k32, a->v32, MT_DT_F32, qkv, dt, cb->cos, cb->sin,
                               pos, (size_t)cb->B, (size_t)cb->T, c->NH, c->NKV, c->HD, R);
        attn_check(mt_attn_forward_f32(a->att32, a->lse, a->q32, a->k32, a->v32, pos, NULL, cb->B,
                                       cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
        to_op(cb, a->att_op, a->att32, N * Q);
    }
    /* A recompute of a parallel block for its backward needs neither xmid
     * nor the attention's output product: it skips them. */
    if (out || !c->parallel_residual)
        linear_add(cb, xmid, a->att_op, W_op(cb, s, layer, MT_T_WO), W32(cb, s, layer, MT_T_BO),
                   x, N, Q, C);
    const void *mlp_in = sc->xn1_op;
    if (ln2) {
        layer_norm(cb, layer, MT_T_MLP_NORM, sc->xn2_op, a->mean2, a->rstd2,
                   c->parallel_residual ? x : xmid);
        mlp_in = sc->xn2_op;
    }
    /* h: the GELU's input; mlp_op: its output */
    mt_cuda_matmul_forward(ctx, p, h, dt, mlp_in, W_op(cb, s, layer, MT_T_WUP),
                           W32(cb, s, layer, MT_T_BUP), N, C, F);
    mt_cuda_gelu_forward(ctx, sc->mlp_op, dt, h, dt, N * F, c->act == MT_ACT_GELU_TANH);
    if (out) /* out = xmid + mlp; a recompute for the backward stops before it */
        linear_add(cb, out, sc->mlp_op, W_op(cb, s, layer, MT_T_WDOWN),
                   W32(cb, s, layer, MT_T_BDOWN), xmid, N, F, C);
}

/* The forward's activations are read from f (the scratch after a
 * recompute, or a kept unit, whose xn1, xn2 and GELU output are rebuilt
 * into the scratch: the same kernels on the same inputs give the same
 * bits); gradient buffers come from the scratch. */
void mt_cuda_neox_backward(cuda_backend *cb, const acts *f, int layer, int mb, const float *x,
                           float *dx) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    slot *s = bound_slot(cb);
    mt_cuda_ctx *ctx = cb->ctx;
    float *g = cb->g_cur;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    size_t W = Q + 2 * KV, R = (size_t)mt_config_rotary_dim(c);
    mt_precision p = cb->prec;
    int bf = p == MT_PREC_BF16, tanh_form = c->act == MT_ACT_GELU_TANH;
    mt_error err;
    const int32_t *pos = mt_cuda_block_pos(cb, mb);
    const float *ln2 = W32(cb, s, layer, MT_T_MLP_NORM);
    void *dx_op = bf ? a->dx_op : dx;
    const void *h = bf ? (const void *)f->gate16 : (const void *)f->gate32;
    float *dbup = G(cb, g, layer, MT_T_BUP), *dbqkv = G(cb, g, layer, MT_T_BQKV);
    MT_ASSERT((!dbup || a->dgate32) && (!dbqkv || a->qkv32)); /* the plan's blocks_have */
    const void *xn1 = f->xn1_op, *xn2 = f->xn2_op, *mlp = f->mlp_op;
    if (f != a) { /* a kept unit: rebuild what it does not hold */
        layer_norm(cb, layer, MT_T_ATTN_NORM, a->xn1_op, NULL, NULL, x);
        xn1 = a->xn1_op;
        if (ln2) {
            layer_norm(cb, layer, MT_T_MLP_NORM, a->xn2_op, NULL, NULL,
                       c->parallel_residual ? x : f->xmid);
            xn2 = a->xn2_op;
        }
        mt_cuda_gelu_forward(ctx, a->mlp_op, op_dt(cb), h, op_dt(cb), N * F, tanh_form);
        mlp = a->mlp_op;
    }
    const void *mlp_in = ln2 ? xn2 : xn1;

    /* MLP: dx is dL/d of its output in both residual forms */
    to_op(cb, dx_op, dx, N * C);
    mt_cuda_matmul_backward(ctx, p, a->dmlp32, false, G(cb, g, layer, MT_T_WDOWN), dx_op, mlp,
                            W_op(cb, s, layer, MT_T_WDOWN), N, F, C);
    bias_grad(cb, G(cb, g, layer, MT_T_BDOWN), dx, N, C);
    /* dL/d the GELU's input: dgate_op, the product's operand (in fp32 mode
     * the memory of dgate32), and in bf16 mode dgate32 in fp32 too where
     * the bias's gradient sums it */
    mt_cuda_gelu_backward(ctx, !bf || dbup ? a->dgate32 : NULL, bf ? a->dgate_op : NULL,
                          a->dmlp32, h, op_dt(cb), N * F, tanh_form);
    bias_grad(cb, dbup, a->dgate32, N, F);
    mt_cuda_matmul_backward(ctx, p, a->dxn32, false, G(cb, g, layer, MT_T_WUP), a->dgate_op,
                            mlp_in, W_op(cb, s, layer, MT_T_WUP), N, C, F);
    /* Sequential: LayerNorm2 read xmid, so dx becomes dL/d xmid before the
     * attention's backward. */
    if (!c->parallel_residual) {
        mt_cuda_layernorm_backward(ctx, dx, G(cb, g, layer, MT_T_MLP_NORM),
                                   G(cb, g, layer, MT_T_MLP_NORM_B), a->colsum, a->dxn32,
                                   f->xmid, ln2, f->mean2, f->rstd2, N, C);
        to_op(cb, dx_op, dx, N * C);
    }

    /* Attention: xmid = x + att Wo^T + bo */
    mt_cuda_matmul_backward(ctx, p, a->datt32, false, G(cb, g, layer, MT_T_WO), dx_op,
                            f->att_op, W_op(cb, s, layer, MT_T_WO), N, Q, C);
    bias_grad(cb, G(cb, g, layer, MT_T_BO), dx, N, C);
    /* Parallel: LayerNorm2 read x, its input gradient joins dx (after the
     * reads of dx above: in fp32 mode dx_op is dx). */
    if (c->parallel_residual && ln2)
        mt_cuda_layernorm_backward(ctx, dx, G(cb, g, layer, MT_T_MLP_NORM),
                                   G(cb, g, layer, MT_T_MLP_NORM_B), a->colsum, a->dxn32, x, ln2,
                                   f->mean2, f->rstd2, N, C);
    if (cb->attn_bf16) {
        to_op(cb, a->datt_op, a->datt32, N * Q);
        attn_check(mt_attn_backward_bf16(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt_op,
                                         f->q_op, f->k_op, f->v_op, f->att_op, f->lse, pos, NULL,
                                         cb->B, cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err),
                   &err);
    } else {
        MT_ASSERT(f == a);
        attn_check(mt_attn_backward_f32(a->dq32, a->dk32, a->dv32, a->attn_scratch, a->datt32,
                                        a->q32, a->k32, a->v32, a->att32, a->lse, pos, NULL, cb->B,
                                        cb->T, c->NH, c->NKV, c->HD, cb->s_comp, &err), &err);
    }
    /* dL/d qkv: dqkv_op, the product's operand (in fp32 mode the memory of
     * qkv32), and in bf16 mode qkv32 in fp32 too where the bias's gradient
     * sums it */
    mt_cuda_qkv_join_rope_backward(ctx, !bf || dbqkv ? a->qkv32 : NULL, bf ? a->dqkv_op : NULL,
                                   a->dq32, a->dk32, a->dv32, cb->cos, cb->sin, pos,
                                   (size_t)cb->B, (size_t)cb->T, c->NH, c->NKV, c->HD, R);
    bias_grad(cb, dbqkv, a->qkv32, N, W);
    /* Without a LayerNorm2 the MLP's share of dL/d xn1 is in dxn32
     * already: the qkv's adds to it. */
    mt_cuda_matmul_backward(ctx, p, a->dxn32, !ln2, G(cb, g, layer, MT_T_WQKV), a->dqkv_op, xn1,
                            W_op(cb, s, layer, MT_T_WQKV), N, C, W);
    mt_cuda_layernorm_backward(ctx, dx, G(cb, g, layer, MT_T_ATTN_NORM),
                               G(cb, g, layer, MT_T_ATTN_NORM_B), a->colsum, a->dxn32, x,
                               W32(cb, s, layer, MT_T_ATTN_NORM), f->mean1, f->rstd1, N, C);
}
