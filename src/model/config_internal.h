/* config.json reading and writing helpers shared by the config parsers
 * (config.c, config_rope.c, config_moe.c, config_neox_falcon.c, config_gemma.c,
 * config_phi3.c): typed fields with the config class's default,
 * and floats written as Python writes them. Internal to src/model. */
#ifndef MT_MODEL_CONFIG_INTERNAL_H
#define MT_MODEL_CONFIG_INTERNAL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/config.h"
#include "util/error.h"

/* An integer field; missing: *out = dflt, or an error naming it when dflt
 * is -1 (required). */
int mt_cfg_int(const cJSON *root, const char *key, int64_t dflt, int64_t *out, const char *src,
               mt_error *err);
/* A number field; missing or null: *out = dflt. */
int mt_cfg_num(const cJSON *root, const char *key, double dflt, double *out, const char *src,
               mt_error *err);
/* A token id (bos/eos may be an integer or a list of integers, Llama-3.1
 * lists several end tokens: the first one is the one emitted); missing or
 * null: -1. */
int mt_cfg_token_id(const cJSON *root, const char *key, int64_t *out, const char *src,
                    mt_error *err);
/* pad_token_id into cfg->has_pad and cfg->pad_id: an integer, or null
 * (none); absent: dflt, the config class's default (< 0: none). Its range
 * is mt_config_validate's. */
int mt_cfg_pad_token(mt_config *cfg, const cJSON *root, int64_t dflt, const char *src,
                     mt_error *err);
/* Adds pad_token_id as read (null when none), for the families whose
 * embedding takes it. */
void mt_cfg_add_pad_token(const mt_config *cfg, cJSON *r);
/* A true/false field; missing or null: *out = dflt. */
int mt_cfg_bool(const cJSON *root, const char *key, bool dflt, bool *out, const char *src,
                mt_error *err);
/* cfg->act from the GELU named by field `key` ("gelu" when absent). */
int mt_cfg_gelu(mt_config *cfg, const cJSON *root, const char *key, const char *src,
                mt_error *err);
/* v as Python's repr writes it (as an fp32 when single), into buf. */
void mt_cfg_number_text(char buf[48], double v, bool single);
/* Adds v under key as Python's repr writes it (as an fp32 when single). */
void mt_cfg_add_number(cJSON *r, const char *key, double v, bool single);
void mt_cfg_add_float(cJSON *r, const char *key, double v);
/* What every config.json megatrain writes starts with: architectures (the
 * one class cls), model_type, hidden_size, num_hidden_layers and
 * num_attention_heads. */
void mt_cfg_add_head(const mt_config *c, cJSON *r, const char *cls);

/* rope_theta and rope_scaling/rope_parameters of the Llama family (and
 * falcon): the transformers 4 and 5 layouts, unsupported types refused by
 * name (config_rope.c); written back under transformers 4's names. */
int mt_config_parse_rope(mt_config *cfg, const cJSON *root, const char *src, mt_error *err);
void mt_config_rope_to_json(const mt_config *c, cJSON *r);

/* mixtral, qwen2_moe and qwen3_moe (config_moe.c): their expert fields
 * (cfg->arch set), their ranges (for mt_config_validate), and their
 * config.json fields. */
int mt_config_parse_moe(mt_config *cfg, const cJSON *root, const char *src, mt_error *err);
int mt_config_validate_moe(const mt_config *c, const char *src, mt_error *err);
void mt_config_moe_to_json(const mt_config *c, cJSON *r);

/* gpt_neox and falcon (config_neox_falcon.c): their fields besides the
 * common ones (cfg->arch set), and their whole config.json but the token
 * ids and torch_dtype. */
int mt_config_parse_gpt_neox(mt_config *cfg, const cJSON *root, const char *src, mt_error *err);
int mt_config_parse_falcon(mt_config *cfg, const cJSON *root, const char *src, mt_error *err);
void mt_config_neox_to_json(const mt_config *c, cJSON *r);
void mt_config_falcon_to_json(const mt_config *c, cJSON *r);

/* gemma2 and gemma3_text (config_gemma.c): their fields besides the common
 * ones mt_config_parse read (cfg->arch set), and their config.json. */
int mt_config_parse_gemma(mt_config *cfg, const cJSON *root, const char *src, mt_error *err);
void mt_config_gemma_to_json(const mt_config *cfg, cJSON *r);

/* phi3 (config_phi3.c): its fields besides the Llama ones; rope_scaling of
 * type longrope from object rp (named field), and back into r. */
int mt_config_parse_phi3(mt_config *cfg, const cJSON *root, const char *src, mt_error *err);
int mt_config_parse_longrope(mt_config *cfg, const cJSON *rp, const char *field, const char *src,
                             mt_error *err);
void mt_config_longrope_to_json(const mt_config *cfg, cJSON *r);

#endif
