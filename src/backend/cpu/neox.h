/* The GPT-NeoX and Falcon decoder blocks on the CPU, fp32, forward and
 * backward, as transformers computes GPTNeoXLayer (Pythia, GPT-NeoX-20B)
 * and FalconDecoderLayer (Falcon-7B; Falcon-40B/180B's new decoder):
 *
 *   xn1 = LayerNorm1(x)                            weight and bias
 *   qkv = xn1 Wqkv^T + bqkv (N, NKV, NH/NKV + 2, HD)  per kv head: its query
 *         heads, k, v (gpt_neox: NKV = NH, q k v of a head side by side)
 *   q, k = RoPE on their leading R dims (R = rotary_dim), rotate-half
 *   ao  = attention(q, k, v) Wo^T + bo             grouped-query
 *   parallel:    out = mlp(LayerNorm2(x)) + ao + x
 *   sequential:  h = ao + x;  out = mlp(LayerNorm2(h)) + h
 *   mlp(z) = Wdown gelu(Wup z + bup) + bdown
 *
 * Which parts a layer has follows its tensors: Falcon has no biases, and
 * Falcon-7B no LayerNorm2 (its MLP reads LayerNorm1's output). Falcon is
 * always parallel.
 *
 * One mt_cpu_neox holds the activations of one block for one micro-batch of
 * (B, T) tokens: the forward keeps them, the backward of the same block and
 * micro-batch reads them. */
#ifndef MT_BACKEND_CPU_NEOX_H
#define MT_BACKEND_CPU_NEOX_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"
#include "model/params.h"

typedef struct mt_cpu_neox mt_cpu_neox;

/* Bytes mt_cpu_neox_create allocates; 0 for another family, SIZE_MAX when
 * they do not fit a size_t. */
size_t mt_cpu_neox_bytes(const mt_config *cfg, size_t N);

/* Scratch for micro-batches of (B, T) tokens, with the rotary tables cos,
 * sin (T, R/2) that the caller keeps; NULL for another family. */
mt_cpu_neox *mt_cpu_neox_create(const mt_config *cfg, int64_t B, int64_t T, const float *cos,
                                const float *sin);
void mt_cpu_neox_free(mt_cpu_neox *m);

/* out (N, C) = the block of layer ld (weights from w, its range) applied to
 * x (N, C); pos: the micro-batch's positions or NULL (see mt_batch). */
void mt_cpu_neox_forward(mt_cpu_neox *m, const mt_layer_desc *ld, const float *w,
                         const int32_t *pos, const float *x, float *out);

/* Backward of the last forward (same layer, same x): dx (N, C) holds dL/d
 * out on entry and dL/d x on exit; the layer's gradients accumulate into
 * its range starting at g. */
void mt_cpu_neox_backward(mt_cpu_neox *m, const mt_layer_desc *ld, const float *w, float *g,
                          const int32_t *pos, const float *x, float *dx);

#endif
