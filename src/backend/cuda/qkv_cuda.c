/* The backward of the q, k and v products of a bf16 block with RoPE and
 * no q/k norms or biases (layers_cuda.h), shared by the Llama-family and
 * Gemma blocks: one product over an interleaved operand. */
#include "backend/cuda/backend_cuda_internal.h"
#include "backend/cuda/layers_cuda.h"
#include "kernels/ops/ops_fused.h"

bool mt_cuda_qkv_fusable(const cuda_backend *cb, int layer) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    int q = ld->by_role[MT_T_WQ], k = ld->by_role[MT_T_WK], v = ld->by_role[MT_T_WV];
    if (cb->prec != MT_PREC_BF16 || cb->cfg->qk_norm || cb->cfg->qkv_bias || !cb->a.dqkv_op ||
        cb->cfg->HD % 8 || q < 0 || k < 0 || v < 0)
        return false;
    return ld->tensors[k].offset == ld->tensors[q].offset + ld->tensors[q].numel &&
           ld->tensors[v].offset == ld->tensors[k].offset + ld->tensors[k].numel;
}

void mt_cuda_qkv_backward_fused(cuda_backend *cb, int layer, int mb, const float *cos,
                                const float *sin, const void *xn1) {
    const mt_config *c = cb->cfg;
    acts *a = &cb->a;
    size_t N = cb->N, Q = c->NH * c->HD, KV = c->NKV * c->HD, O = Q + 2 * KV;
    const int32_t *pos = mt_cuda_block_pos(cb, mb);
    uint16_t *d = a->dqkv_op; /* columns: q, k, v */
    MT_ASSERT(mt_cuda_qkv_fusable(cb, layer));
    mt_cuda_rope_backward_to_bf16(cb->s_comp, d, O, a->dq32, cos, sin, pos, cb->B, cb->T, c->NH,
                                  c->HD);
    mt_cuda_rope_backward_to_bf16(cb->s_comp, d + Q, O, a->dk32, cos, sin, pos, cb->B, cb->T,
                                  c->NKV, c->HD);
    mt_cuda_cast_rows_to_bf16(cb->s_comp, d + Q + KV, O, a->dv32, N, KV);
    mt_cuda_matmul_backward(cb->ctx, MT_PREC_BF16, a->dxn32, false,
                            G(cb, cb->g_cur, layer, MT_T_WQ), d, xn1,
                            W_op(cb, bound_slot(cb), layer, MT_T_WQ), N, c->C, O);
}
