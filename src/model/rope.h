/* Rotary position embedding tables, computed the way Hugging Face
 * transformers computes them in fp32 (LlamaRotaryEmbedding, including the
 * llama3 `rope_scaling` frequency adjustment, and Phi3RotaryEmbedding's
 * longrope). */
#ifndef MT_MODEL_ROPE_H
#define MT_MODEL_ROPE_H

#include <stddef.h>

#include "model/config.h"

/* inv_freq (R/2): the inverse frequency of each rotated pair; R =
 * mt_config_rotary_dim(cfg), HD unless the model rotates only part of a
 * head (gpt_neox's rotary_pct). T is the run's sequence length: phi3's
 * longrope divides by its long factors when T > original_max_position_
 * embeddings, by its short factors otherwise. transformers decides by the
 * length of each forward (max(position_ids) + 1, less than the row's when
 * packed documents restart their positions); a megatrain run has one fixed
 * row length, and the decision is made once for the run, by it. */
void mt_rope_inv_freq(float *inv_freq, const mt_config *cfg, size_t T);

/* The factor cos and sin are multiplied by: longrope's attention_factor
 * (given, or sqrt(1 + ln(s) / ln(original_max_position_embeddings)) with s
 * = factor, or max_position_embeddings / original when factor is absent,
 * and 1 when s <= 1); 1 for every other kind. */
double mt_rope_attention_factor(const mt_config *cfg);

/* cos, sin (T, R/2) for positions 0..T-1: cos[t][i] = cos(t * inv_freq[i])
 * with the angle rounded to fp32 as in transformers, times
 * mt_rope_attention_factor. Hugging Face's full table is cat(cos, cos)
 * along the last dim; the rotate-half ops use the half. */
void mt_rope_tables(float *cos, float *sin, const mt_config *cfg, size_t T);

/* The tables of a model's sliding-window layers: gemma3_text's rotate by
 * rope_local_theta without scaling (transformers' rotary_emb_local); every
 * other model's are mt_rope_tables'. */
void mt_rope_tables_local(float *cos, float *sin, const mt_config *cfg, size_t T);

#endif
