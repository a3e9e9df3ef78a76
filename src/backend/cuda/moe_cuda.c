/* The mixture-of-experts MLP on the GPU (moe_cuda.h): the order of work of
 * backend/cpu/moe.c, with its routing, grouping, gather, combine and
 * load-balancing kernels in moe_route.cu, the experts as grouped products
 * (moe_gemm.h) over the grouped rows, and the dense products (router,
 * shared expert, shared gate) through cuBLASLt (cuda_ops.h).
 *
 * Precision: the experts and the shared expert take operands of the
 * precision's type (bf16: their gate, up and SwiGLU outputs stay bf16 for
 * the next product, as the dense bf16 path does); the router and the
 * shared gate are fp32 products of xn (bf16 xn is exact in fp32) and the
 * fp32 weights, so the routing never sees bf16-rounded router weights; the
 * softmax, top-k, routing weights, combine and every reduction are fp32
 * (the load-balancing sums double). */
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/moe_cuda_internal.h"

#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda_common.h"
#include "kernels/moe/moe_gemm.h"
#include "kernels/moe/moe_route.h"
#include "kernels/ops/ops_fused.h"
#include "util/mem.h"

mt_cuda_moe *mt_cuda_moe_create(const mt_config *c, size_t N, mt_precision prec, void *dev) {
    size_t bytes = mt_cuda_moe_bytes(c, N, prec);
    if (!bytes) return NULL;
    MT_ASSERT(bytes != SIZE_MAX); /* the caller checked mt_cuda_moe_bytes */
    MT_ASSERT(dev && (uintptr_t)dev % MOE_ALIGN == 0);
    MT_ASSERT(N >= 1 && c->moe.K >= 1 && c->moe.K <= c->moe.E && c->moe.E <= MT_MOE_MAX_EXPERTS);
    mt_cuda_moe *m = mt_calloc_or_die(1, sizeof *m);
    mt_arena a = {.base = dev};
    mt_cuda_moe_layout(m, c, N, prec, &a);
    MT_ASSERT(a.used == bytes);
    return m;
}

void mt_cuda_moe_free(mt_cuda_moe *m) { free(m); }

void mt_cuda_moe_begin_step(mt_cuda_moe *m, mt_cuda_ctx *ctx, int train) {
    cudaStream_t s = mt_cuda_ctx_stream(ctx);
    m->train = train;
    m->rows = 0;
    CUDA_CHECK(cudaMemsetAsync(m->cnt, 0, m->E * sizeof *m->cnt, s)); /* 0.0 is all zero bytes */
    CUDA_CHECK(cudaMemsetAsync(m->psum, 0, m->E * sizeof *m->psum, s));
}

/* Tensor of role r in a layer range of fp32 (w32, g) or operand type (w_op). */
static float *t32(const float *base, const mt_layer_desc *ld, mt_role r) {
    return mt_layer_tensor((float *)base, ld, r);
}

static void *top(const mt_cuda_moe *m, const void *base, const mt_layer_desc *ld, mt_role r) {
    MT_ASSERT(ld->by_role[r] >= 0);
    return (char *)base + ld->tensors[ld->by_role[r]].offset * m->es;
}

static mt_dt op_dt(const mt_cuda_moe *m) { return mt_prec_operand_dtype(m->prec); }

static void swiglu_fwd(const mt_cuda_moe *m, mt_cuda_ctx *ctx, void *out, const void *gate,
                       const void *up, size_t n) {
    if (m->prec == MT_PREC_BF16)
        mt_cuda_swiglu_forward_bf16(mt_cuda_ctx_stream(ctx), out, gate, up, n);
    else
        mt_cuda_swiglu_forward(ctx, out, MT_DT_F32, gate, up, n, 1);
}

/* dgate, dup (op) from dout (fp32) and the forward's gate, up (op). */
static void swiglu_bwd(const mt_cuda_moe *m, mt_cuda_ctx *ctx, void *dgate, void *dup,
                       const float *dout, const void *gate, const void *up, size_t n) {
    if (m->prec == MT_PREC_BF16)
        mt_cuda_swiglu_backward_bf16(mt_cuda_ctx_stream(ctx), dgate, dup, dout, gate, up, n);
    else
        mt_cuda_swiglu_backward(ctx, dgate, dup, dout, gate, up, n, 1);
}

/* xn in fp32: the router's and the shared gate's input. */
static const float *xn_f32(const mt_cuda_moe *m, const void *xn) {
    return m->xn32 ? m->xn32 : (const float *)xn;
}

static void shared_forward(mt_cuda_moe *m, mt_cuda_ctx *ctx, const mt_layer_desc *ld,
                           const void *w_op, const float *w32, const void *xn) {
    size_t N = m->N, C = m->C, FS = m->FS;
    mt_precision p = m->prec;
    mt_cuda_matmul_forward(ctx, p, m->sg, op_dt(m), xn, top(m, w_op, ld, MT_T_SHARED_WGATE), NULL,
                           N, C, FS);
    mt_cuda_matmul_forward(ctx, p, m->su, op_dt(m), xn, top(m, w_op, ld, MT_T_SHARED_WUP), NULL,
                           N, C, FS);
    swiglu_fwd(m, ctx, m->sh, m->sg, m->su, N * FS);
    mt_cuda_matmul_forward(ctx, p, m->sy, MT_DT_F32, m->sh, top(m, w_op, ld, MT_T_SHARED_WDOWN),
                           NULL, N, FS, C);
    mt_cuda_matmul_forward(ctx, MT_PREC_FP32, m->sz, MT_DT_F32, xn_f32(m, xn),
                           t32(w32, ld, MT_T_SHARED_GATE), NULL, N, C, 1);
}

void mt_cuda_moe_forward(mt_cuda_moe *m, mt_cuda_ctx *ctx, const mt_layer_desc *ld,
                         const void *w_op, const float *w32, const void *xn, float *out) {
    size_t N = m->N, C = m->C, E = m->E, K = m->K, FE = m->FE, NK = m->NK;
    mt_precision p = m->prec;
    cudaStream_t s = mt_cuda_ctx_stream(ctx);
    MT_ASSERT((size_t)ld->n_experts == E);
    if (m->xn32) mt_cuda_cast_bf16_to_f32(ctx, m->xn32, xn, N * C);
    mt_cuda_matmul_forward(ctx, MT_PREC_FP32, m->p, MT_DT_F32, xn_f32(m, xn),
                           t32(w32, ld, MT_T_ROUTER), NULL, N, C, E);
    mt_cuda_moe_route(s, m->p, m->sel, m->wk, m->psel, N, (int)E, (int)K, m->norm_topk);
    mt_cuda_moe_group(s, m->start, m->row, m->tok, m->hist, m->sel, NK, (int)K, (int)E);
    mt_cuda_moe_gather(s, m->xg, xn, m->tok, NK, C, m->es);
    size_t ws = ld->expert_stride;
    mt_cuda_moe_gemm_forward(ctx, p, m->hg, op_dt(m), m->xg, top(m, w_op, ld, MT_T_EXP_WGATE), ws,
                             m->start, (int)E, NK, C, FE, m->gemm_scratch);
    mt_cuda_moe_gemm_forward(ctx, p, m->hu, op_dt(m), m->xg, top(m, w_op, ld, MT_T_EXP_WUP), ws,
                             m->start, (int)E, NK, C, FE, m->gemm_scratch);
    swiglu_fwd(m, ctx, m->hh, m->hg, m->hu, NK * FE);
    mt_cuda_moe_gemm_forward(ctx, p, m->y, MT_DT_F32, m->hh, top(m, w_op, ld, MT_T_EXP_WDOWN), ws,
                             m->start, (int)E, NK, FE, C, m->gemm_scratch);
    if (m->FS) shared_forward(m, ctx, ld, w_op, w32, xn);
    mt_cuda_moe_combine(s, out, m->y, m->wk, m->row, m->FS ? m->sz : NULL, m->FS ? m->sy : NULL,
                        N, C, (int)K);
}

void mt_cuda_moe_count(mt_cuda_moe *m, mt_cuda_ctx *ctx) {
    mt_cuda_moe_count_add(mt_cuda_ctx_stream(ctx), m->cnt, m->psum, m->start, m->p, m->N,
                          (int)m->E);
    m->rows += (double)m->N;
}

void mt_cuda_moe_add_aux_loss(mt_cuda_moe *m, mt_cuda_ctx *ctx, double *loss_sum, double scale) {
    if (!m->aux_on || !m->train || m->rows == 0) return;
    /* coef * aux * scale, aux = E * sum_e cnt_e psum_e / rows^2 (moe.h) */
    double factor = m->aux_coef * (double)m->E / (m->rows * m->rows) * scale;
    mt_cuda_moe_aux_add(mt_cuda_ctx_stream(ctx), loss_sum, m->cnt, m->psum, (int)m->E, factor);
}

static void shared_backward(mt_cuda_moe *m, mt_cuda_ctx *ctx, const mt_layer_desc *ld,
                            const void *w_op, const float *w32, float *g, const void *xn,
                            float *dxn) {
    size_t N = m->N, C = m->C, FS = m->FS;
    mt_precision p = m->prec;
    mt_cuda_matmul_backward(ctx, MT_PREC_FP32, dxn, true, t32(g, ld, MT_T_SHARED_GATE), m->dsz,
                            xn_f32(m, xn), t32(w32, ld, MT_T_SHARED_GATE), N, C, 1);
    mt_cuda_matmul_backward(ctx, p, m->dsh, false, t32(g, ld, MT_T_SHARED_WDOWN), m->dsy, m->sh,
                            top(m, w_op, ld, MT_T_SHARED_WDOWN), N, FS, C);
    swiglu_bwd(m, ctx, m->dsg, m->dsu, m->dsh, m->sg, m->su, N * FS);
    mt_cuda_matmul_backward(ctx, p, dxn, true, t32(g, ld, MT_T_SHARED_WGATE), m->dsg, xn,
                            top(m, w_op, ld, MT_T_SHARED_WGATE), N, C, FS);
    mt_cuda_matmul_backward(ctx, p, dxn, true, t32(g, ld, MT_T_SHARED_WUP), m->dsu, xn,
                            top(m, w_op, ld, MT_T_SHARED_WUP), N, C, FS);
}

void mt_cuda_moe_backward(mt_cuda_moe *m, mt_cuda_ctx *ctx, const mt_layer_desc *ld,
                          const void *w_op, const float *w32, float *g, const void *xn,
                          const float *dout, float *dxn) {
    size_t N = m->N, C = m->C, E = m->E, K = m->K, FE = m->FE, NK = m->NK;
    size_t ws = ld->expert_stride;
    mt_precision p = m->prec;
    cudaStream_t s = mt_cuda_ctx_stream(ctx);
    MT_ASSERT((size_t)ld->n_experts == E);
    /* combine: dL/dw_j = dout . y_j; each grouped row's dL/dy = w_j dout */
    mt_cuda_moe_combine_backward(s, m->dy, p == MT_PREC_BF16, m->dwk, m->dsy, m->dsz, dout, m->y,
                                 m->wk, m->row, m->FS ? m->sz : NULL, m->FS ? m->sy : NULL, N, C,
                                 (int)K);
    mt_cuda_moe_gemm_dinp(ctx, p, m->dhh, false, m->dy, top(m, w_op, ld, MT_T_EXP_WDOWN), ws,
                          m->start, (int)E, NK, FE, C, m->gemm_scratch);
    mt_cuda_moe_gemm_dw(ctx, p, t32(g, ld, MT_T_EXP_WDOWN), ws, m->dy, m->hh, m->start, (int)E,
                        NK, FE, C, m->gemm_scratch);
    swiglu_bwd(m, ctx, m->dhg, m->dhu, m->dhh, m->hg, m->hu, NK * FE);
    mt_cuda_moe_gemm_dinp(ctx, p, m->dxg, false, m->dhg, top(m, w_op, ld, MT_T_EXP_WGATE), ws,
                          m->start, (int)E, NK, C, FE, m->gemm_scratch);
    mt_cuda_moe_gemm_dinp(ctx, p, m->dxg, true, m->dhu, top(m, w_op, ld, MT_T_EXP_WUP), ws,
                          m->start, (int)E, NK, C, FE, m->gemm_scratch);
    mt_cuda_moe_gemm_dw(ctx, p, t32(g, ld, MT_T_EXP_WGATE), ws, m->dhg, m->xg, m->start, (int)E,
                        NK, C, FE, m->gemm_scratch);
    mt_cuda_moe_gemm_dw(ctx, p, t32(g, ld, MT_T_EXP_WUP), ws, m->dhu, m->xg, m->start, (int)E, NK,
                        C, FE, m->gemm_scratch);
    /* the rows' input gradients back to their tokens: a gather per token */
    mt_cuda_moe_scatter(s, dxn, m->dxg, m->row, N, C, (int)K);
    bool aux = m->aux_on && m->train && m->rows > 0;
    double aux_scale = aux ? m->aux_coef * (double)E / (m->rows * m->rows) : 0.0;
    mt_cuda_moe_router_backward(s, m->dz, m->p, m->sel, m->wk, m->dwk, m->psel, m->cnt, aux,
                                aux_scale, N, (int)E, (int)K, m->norm_topk);
    mt_cuda_matmul_backward(ctx, MT_PREC_FP32, dxn, true, t32(g, ld, MT_T_ROUTER), m->dz,
                            xn_f32(m, xn), t32(w32, ld, MT_T_ROUTER), N, C, E);
    if (m->FS) shared_backward(m, ctx, ld, w_op, w32, g, xn, dxn);
}
