/* Hugging Face model directories in and out of the host store, driven by
 * the parameter table. */
#ifndef MT_IO_MODEL_IO_H
#define MT_IO_MODEL_IO_H

#include <stddef.h>

#include "host/store.h"
#include "io/dtype.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "util/error.h"

/* Reads dir/config.json into cfg. In a resume checkpoint (dir holds
 * COMPLETE) the file is first checked against the checksum its save
 * recorded, and so is model.safetensors by mt_model_load_weights. */
int mt_model_load_config(mt_config *cfg, const char *dir, mt_error *err);

/* Fills the store's weights from the safetensors of dir (single file or
 * sharded), converting F32/BF16/F16 to fp32. Every tensor of the table
 * must be present with its shape; a tensor the table does not know is an
 * error (it means the config does not describe this checkpoint). */
int mt_model_load_weights(mt_host_store *s, const char *dir, mt_error *err);

/* Where layer l's weights go (its numel floats, laid out as table t says),
 * and the call that says they are there. */
typedef float *(*mt_layer_dst)(void *ctx, int layer);
typedef void (*mt_layer_done)(void *ctx, int layer);

/* mt_model_load_weights one layer at a time, for a caller that keeps only
 * part of each (a rank of several): layer l's tensors are read into
 * dst_of(ctx, l), then done(ctx, l) is called (done may be NULL). The same
 * checks. */
int mt_model_read_layers(const mt_param_table *t, const char *dir, mt_layer_dst dst_of,
                         mt_layer_done done, void *ctx, mt_error *err);

/* The safetensors tensors of weights w (laid out as table t says) under
 * their published names, for a writer of mt_st_write: one per tensor of
 * the table, but one for all the parts of a fused published tensor
 * (mt_params_fused: phi3's qkv_proj and gate_up_proj), gathered as it is
 * written. The layers whose weights are on disk are read from away
 * (io/ckpt_disk.h, made with weights; NULL: none are). out has room for
 * every tensor of the table; returns how many it holds. *ctx holds what
 * the gathering reads: free() it after the write. */
struct mt_ckpt_disk;
int mt_model_write_list(const mt_param_table *t, const float *w, mt_dtype dtype,
                        struct mt_ckpt_disk *away, mt_st_write_tensor *out, void **ctx);

/* Writes config.json, generation_config.json (BOS and EOS, as
 * transformers derives it from config.json) and the weights as
 * safetensors shards of at most max_shard_bytes in dtype (MT_DTYPE_F32 or
 * MT_DTYPE_BF16) into dir (created if missing). */
int mt_model_save(const mt_host_store *s, const mt_config *cfg, const char *dir, mt_dtype dtype,
                  size_t max_shard_bytes, mt_error *err);

/* Puts the tokenizer next to a saved model, so the directory loads with
 * AutoTokenizer too: tokenizer_json becomes dir/tokenizer.json, and the
 * tokenizer_config.json, special_tokens_map.json, generation_config.json
 * and chat_template.jinja found beside it are copied when present. */
int mt_model_copy_tokenizer(const char *tokenizer_json, const char *dir, mt_error *err);

/* Makes jinja the chat template transformers reads from dir: the
 * "chat_template" of dir/tokenizer_config.json (set in place, every other
 * byte kept; the file is made when absent), and no dir/chat_template.jinja,
 * which would come first (tokenizer_config.c). */
int mt_model_set_chat_template(const char *dir, const char *jinja, mt_error *err);

#endif
