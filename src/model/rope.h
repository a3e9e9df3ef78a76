/* Rotary position embedding tables, computed the way Hugging Face
 * transformers computes them in fp32 (LlamaRotaryEmbedding, including the
 * llama3 `rope_scaling` frequency adjustment). */
#ifndef MT_MODEL_ROPE_H
#define MT_MODEL_ROPE_H

#include <stddef.h>

#include "model/config.h"

/* inv_freq (R/2): the inverse frequency of each rotated pair; R =
 * mt_config_rotary_dim(cfg), HD unless the model rotates only part of a
 * head (gpt_neox's rotary_pct). */
void mt_rope_inv_freq(float *inv_freq, const mt_config *cfg);

/* cos, sin (T, R/2) for positions 0..T-1: cos[t][i] = cos(t * inv_freq[i])
 * with the angle rounded to fp32 as in transformers. Hugging Face's full
 * table is cat(cos, cos) along the last dim; the rotate-half ops use the
 * half. */
void mt_rope_tables(float *cos, float *sin, const mt_config *cfg, size_t T);

#endif
