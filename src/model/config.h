/* Model configuration: the subset of a Hugging Face config.json that
 * describes a decoder-only Llama-family transformer.
 *
 * Dimension letters used across megatrain:
 *   B batch, T sequence, C hidden, L decoder layers, NH query heads,
 *   NKV key/value heads, HD head dim, F MLP inner size, V vocabulary. */
#ifndef MT_MODEL_CONFIG_H
#define MT_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef enum {
    MT_ARCH_LLAMA,
    MT_ARCH_MISTRAL,
    MT_ARCH_QWEN2,
    MT_ARCH_QWEN3,
} mt_arch;

typedef enum {
    MT_ROPE_DEFAULT,
    MT_ROPE_LLAMA3,
} mt_rope_kind;

typedef struct mt_config {
    mt_arch arch;
    char model_type[32];       /* as written in config.json */
    int64_t C;                 /* hidden_size */
    int64_t L;                 /* num_hidden_layers */
    int64_t NH;                /* num_attention_heads */
    int64_t NKV;               /* num_key_value_heads */
    int64_t HD;                /* head_dim */
    int64_t F;                 /* intermediate_size */
    int64_t V;                 /* vocab_size */
    int64_t max_pos;           /* max_position_embeddings */
    float rms_eps;             /* rms_norm_eps */
    double rope_theta;
    mt_rope_kind rope_kind;
    double rope_factor;        /* llama3 scaling */
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int64_t rope_orig_max_pos; /* original_max_position_embeddings */
    bool tie_embeddings;       /* tie_word_embeddings */
    bool qkv_bias;             /* qwen2: q/k/v projections have a bias */
    bool qk_norm;              /* qwen3: per-head RMSNorm on q and k */
    int64_t sliding_window;    /* 0 = full attention */
    int64_t bos_id;            /* -1 when absent */
    int64_t eos_id;            /* -1 when absent */
} mt_config;

/* Parses config.json text. Unsupported or missing fields are an error that
 * names the field and what megatrain accepts. `source` names the input in
 * messages (a path). */
int mt_config_parse(mt_config *cfg, const char *json_text, const char *source,
                    mt_error *err);

/* Reads and parses a config.json file. */
int mt_config_load(mt_config *cfg, const char *path, mt_error *err);

/* Writes cfg as a Hugging Face config.json (loadable by transformers).
 * Returns a malloc'd string. */
char *mt_config_to_json(const mt_config *cfg);
/* The same with torch_dtype set to the dtype the weights are saved in
 * ("float32", "bfloat16"). */
char *mt_config_to_json_dtype(const mt_config *cfg, const char *torch_dtype);

/* The built-in tiny model used by `make run` (byte-level vocabulary). */
void mt_config_default_tiny(mt_config *cfg);

/* Checks the derived invariants (NH % NKV == 0, sizes > 0, ...). */
int mt_config_validate(const mt_config *cfg, const char *source, mt_error *err);

/* Total parameter count (without padding). */
int64_t mt_config_num_params(const mt_config *cfg);

#endif
