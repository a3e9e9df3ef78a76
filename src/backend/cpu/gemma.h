/* The Gemma 2 and Gemma 3 decoder blocks on the CPU, fp32, forward and
 * backward, as transformers computes Gemma2DecoderLayer and
 * Gemma3DecoderLayer:
 *
 *   every norm is an RMSNorm by 1 + w
 *   xn1  = norm_in(x)
 *   q, k, v = xn1 Wq^T, xn1 Wk^T, xn1 Wv^T
 *   q, k = q_norm(q), k_norm(k) per head              gemma3_text only
 *   q, k = RoPE: the sliding layers' tables or the global ones' (Gemma 3:
 *          rope_local_base_freq, and rope_theta with its linear scaling)
 *   att  = softmax(softcap(q k^T * query_pre_attn_scalar^-0.5)) v
 *          causal; a sliding layer's query t sees keys j with t - j < window
 *   xmid = x + norm_post_attn(att Wo^T)
 *   out  = xmid + norm_post_ff(Wdown (gelu(Wgate z) * Wup z)),
 *          z = norm_pre_ff(xmid), gelu in its tanh form (or erf's)
 *
 * One mt_cpu_gemma holds the activations of one block for one micro-batch
 * of (B, T) tokens: the forward keeps them, the backward of the same block
 * and micro-batch reads them. The embedding's scale and the final logits'
 * soft-cap are the CPU backend's (backend_cpu.c). */
#ifndef MT_BACKEND_CPU_GEMMA_H
#define MT_BACKEND_CPU_GEMMA_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/params.h"

typedef struct mt_cpu_gemma mt_cpu_gemma;

/* Bytes mt_cpu_gemma_create allocates for micro-batches of (B, T) tokens;
 * 0 for another family, SIZE_MAX when they do not fit a size_t. */
size_t mt_cpu_gemma_bytes(const mt_config *cfg, int64_t B, int64_t T);

/* Scratch and rotary tables for micro-batches of (B, T) tokens; NULL for
 * another family. */
mt_cpu_gemma *mt_cpu_gemma_create(const mt_config *cfg, int64_t B, int64_t T);
void mt_cpu_gemma_free(mt_cpu_gemma *m);

/* out (N, C) = decoder block `block` (weights: layer ld's range at w) applied
 * to x (N, C); pos: the micro-batch's positions or NULL (see mt_batch). */
void mt_cpu_gemma_forward(mt_cpu_gemma *m, int block, const mt_layer_desc *ld, const float *w,
                          const int32_t *pos, const float *x, float *out);

/* Backward of the last forward (same block, same x): dx (N, C) holds dL/d
 * out on entry and dL/d x on exit; the layer's gradients accumulate into
 * its range starting at g. */
void mt_cpu_gemma_backward(mt_cpu_gemma *m, int block, const mt_layer_desc *ld, const float *w,
                           float *g, const int32_t *pos, const float *x, float *dx);

#endif
