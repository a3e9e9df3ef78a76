/* The layer templates of the CUDA streaming backend (layers_cuda.c): one
 * decoder block forward and backward for one micro-batch, on the bound
 * slot's weights. Not a public interface. */
#ifndef MT_BACKEND_CUDA_LAYERS_H
#define MT_BACKEND_CUDA_LAYERS_H

#include "backend/cuda/backend_cuda_internal.h"

/* Forward writes its activations into a (the scratch cb->a, or a kept
 * unit) and the block's output into out; out NULL: a recompute for the
 * backward, which needs the activations only, so that a dense block stops
 * before its down projection (an MoE block's backward reads its experts'
 * outputs: it runs whole). Backward reads the activations from f and takes
 * its gradient buffers from the scratch. mb selects the micro-batch's
 * positions (packed documents). */
acts *mt_cuda_kept_unit(cuda_backend *cb, int layer, int mb);
void mt_cuda_block_forward(cuda_backend *cb, acts *a, int layer, int mb, const float *x,
                           float *out);
void mt_cuda_block_backward(cuda_backend *cb, const acts *f, int layer, int mb, const float *x,
                            float *dx);

/* The gpt_neox and falcon blocks (neox_cuda.c), with the same contract;
 * kept units on the bf16 flash kernels only (cb->keeps). */
void mt_cuda_neox_forward(cuda_backend *cb, acts *a, int layer, int mb, const float *x,
                          float *out);
void mt_cuda_neox_backward(cuda_backend *cb, const acts *f, int layer, int mb, const float *x,
                           float *dx);

/* The Gemma 2 and Gemma 3 blocks (gemma_cuda.c), with the same contract;
 * kept units on the bf16 flash kernels only, and there down-kept units
 * (mt_cuda_down_unit) too. */
void mt_cuda_gemma_forward(cuda_backend *cb, acts *a, int layer, int mb, const float *x,
                           float *out);
void mt_cuda_gemma_backward(cuda_backend *cb, const acts *f, int layer, int mb, const float *x,
                            float *dx);

/* The backward of the q, k and v products of a bf16 block with RoPE, when
 * mt_cuda_qkv_fusable (no q/k norms or biases, WQ, WK, WV adjacent, the
 * head dim a multiple of 8): RoPE's backward of the attention's dq32 and
 * dk32 and the cast of dv32 write one interleaved operand a->dqkv_op
 * (N, Q + 2KV), and as WQ, WK, WV lie back to back in the slot (and their
 * gradients in g_cur), one product of Q + 2KV rows
 * takes it into dxn32 = dL/d xn1 (set) and into the three gradients:
 * dxn32 written once instead of three times, and larger products. cos,
 * sin: the layer's RoPE tables. (qkv_cuda.c) */
bool mt_cuda_qkv_fusable(const cuda_backend *cb, int layer);
void mt_cuda_qkv_backward_fused(cuda_backend *cb, int layer, int mb, const float *cos,
                                const float *sin, const void *xn1);
/* The weight an RMSNorm of role r of the bound layer scales by: its
 * tensor, or for Gemma (mt_param_table.norm_offset) 1 + it, made into
 * cb->a.norm_w on the compute stream (the slot's weights stay as the
 * optimizer reads them). The gradient of w is that of 1 + w, so the
 * backward kernels take it as any other norm's. NULL: no such tensor. */
const float *mt_cuda_norm_w(cuda_backend *cb, int layer, mt_role r);

/* Gemma scales its embeddings by sqrt(hidden): x (N, C) *= that on the
 * compute stream (the lookup's output, and the gradient into it); nothing
 * for another family. */
void mt_cuda_embed_scale(cuda_backend *cb, float *x);

/* Positions of micro-batch mb (packed documents), or NULL: one sequence
 * per row. */
static inline const int32_t *mt_cuda_block_pos(const cuda_backend *cb, int mb) {
    return cb->has_pos ? cb->pos + (size_t)mb * cb->N : NULL;
}

/* The positions micro-batch mb's attention masks by: the documents'
 * (as RoPE's), or under a sliding window shorter than T those clamped to
 * window - 1 (keys t - window + 1 .. t at most). */
static inline const int32_t *mt_cuda_attn_pos(const cuda_backend *cb, int mb) {
    return cb->win_pos ? cb->win_pos + (size_t)mb * cb->N : mt_cuda_block_pos(cb, mb);
}

/* Uploads the batch's positions of packed documents (mt_batch.pos), if
 * any, on the compute stream (and makes the windowed ones); the blocks then
 * apply them to micro-batch mb's RoPE and attention. */
void mt_cuda_upload_pos(cuda_backend *cb, const mt_batch *batch);

#endif
