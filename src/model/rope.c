/* RoPE tables (see rope.h). Every step mirrors one fp32 tensor operation of
 * transformers (modeling_rope_utils.py, modeling_llama.py) in the same
 * order, so that the tables match PyTorch's to the last bit or nearly:
 * Python scalars become fp32 operands, as PyTorch does for a float tensor. */
#include "model/rope.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "util/error.h"
#include "util/mem.h"

/* transformers' llama3 adjustment (_compute_llama3_parameters): long
 * wavelengths are divided by `factor`, short ones kept, and the band in
 * between interpolated. `scalar / tensor` is computed by PyTorch as
 * reciprocal(tensor) * scalar, hence the two roundings below. */
static float llama3_adjust(float inv, const mt_config *cfg) {
    float factor = (float)cfg->rope_factor;
    float low = (float)cfg->rope_low_freq_factor;
    float old_ctx = (float)cfg->rope_orig_max_pos;
    float low_wavelen = (float)((double)cfg->rope_orig_max_pos / cfg->rope_low_freq_factor);
    float high_wavelen = (float)((double)cfg->rope_orig_max_pos / cfg->rope_high_freq_factor);
    float wavelen = (1.0f / inv) * (float)(2.0 * M_PI);
    if (wavelen > low_wavelen) return inv / factor;
    if (wavelen < high_wavelen) return inv;
    float smooth = ((1.0f / wavelen) * old_ctx - low) /
                   (float)(cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
    return (1.0f - smooth) * inv / factor + smooth * inv;
}

/* transformers' longrope (_compute_longrope_parameters): 1 / (ext * base **
 * (2i / R)), ext the long factor in runs longer than the pretraining
 * length, the short one otherwise (the factors are fp32 tensors there). */
static float longrope_ext(const mt_config *cfg, size_t i, size_t T) {
    bool long_run = T > (size_t)cfg->rope_orig_max_pos;
    return (float)(long_run ? cfg->rope_long_factor[i] : cfg->rope_short_factor[i]);
}

void mt_rope_inv_freq(float *inv_freq, const mt_config *cfg, size_t T) {
    int64_t R = mt_config_rotary_dim(cfg); /* HD, or gpt_neox's rotary dims */
    MT_ASSERT(R > 0 && R % 2 == 0);
    size_t half = (size_t)R / 2;
    MT_ASSERT(cfg->rope_kind != MT_ROPE_LONGROPE || (size_t)cfg->n_rope_factors == half);
    float base = (float)cfg->rope_theta;
    for (size_t i = 0; i < half; i++) {
        // base ** (arange(0, R, 2).float() / R)
        float expo = (float)(2 * i) / (float)R;
        float pw = powf(base, expo);
        if (cfg->rope_kind == MT_ROPE_LONGROPE) {
            inv_freq[i] = 1.0f / (longrope_ext(cfg, i, T) * pw);
            continue;
        }
        float inv = 1.0f / pw;
        /* linear (gemma3_text's global layers): inv_freq /= factor */
        inv_freq[i] = cfg->rope_kind == MT_ROPE_LLAMA3   ? llama3_adjust(inv, cfg)
                      : cfg->rope_kind == MT_ROPE_LINEAR ? inv / (float)cfg->rope_factor
                                                         : inv;
    }
}

double mt_rope_attention_factor(const mt_config *cfg) {
    if (cfg->rope_kind != MT_ROPE_LONGROPE) return 1.0;
    if (cfg->rope_attn_factor > 0) return cfg->rope_attn_factor;
    double orig = (double)cfg->rope_orig_max_pos;
    double s = cfg->rope_factor > 0 ? cfg->rope_factor : (double)cfg->max_pos / orig;
    return s <= 1.0 ? 1.0 : sqrt(1.0 + log(s) / log(orig));
}

void mt_rope_tables(float *cos, float *sin, const mt_config *cfg, size_t T) {
    size_t half = (size_t)mt_config_rotary_dim(cfg) / 2;
    float *inv_freq = mt_malloc_or_die(half * sizeof(float));  // (HD/2)
    mt_rope_inv_freq(inv_freq, cfg, T);
    // emb.cos() * attention_scaling: an fp32 product (1 leaves the table as it is)
    float scale = (float)mt_rope_attention_factor(cfg);
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cos[t * half + i] = cosf(angle) * scale;
            sin[t * half + i] = sinf(angle) * scale;
        }
    free(inv_freq);
}

void mt_rope_tables_local(float *cos, float *sin, const mt_config *c, size_t T) {
    mt_config local = *c;
    if (c->arch == MT_ARCH_GEMMA3_TEXT) {
        local.rope_theta = c->rope_local_theta;
        local.rope_kind = MT_ROPE_DEFAULT;
    }
    mt_rope_tables(cos, sin, &local, T);
}
