/* The other layouts of mixture-of-experts blocks a Hugging Face model
 * directory may hold, for the loader of model_io.c (docs/moe.md):
 *   - mixtral's tensors under "mlp." instead of "block_sparse_moe."
 *     (transformers 5 renames them so on load);
 *   - the fused expert tensors transformers 5 writes with
 *     save_pretrained(save_original_format=False):
 *     model.layers.<i>.mlp.experts.gate_up_proj (E, 2*FE, C), gate rows
 *     first, and model.layers.<i>.mlp.experts.down_proj (E, C, FE).
 * The parameter table always names the published per-expert layout, which
 * is also what megatrain writes. */
#ifndef MT_IO_MODEL_IO_MOE_H
#define MT_IO_MODEL_IO_MOE_H

#include <stdbool.h>

#include "io/safetensors.h"
#include "model/params.h"

/* Reads tensor td of MoE layer ld from one of the other layouts into dst
 * (td->numel floats). 0: read; 1: no other layout holds it; -1: it is there
 * but with the wrong shape or dtype (err says which). */
int mt_moe_read_other_layout(const mt_st_model *m, const mt_layer_desc *ld,
                             const mt_tensor_desc *td, float *dst, mt_error *err);

/* Whether a checkpoint tensor name that the table does not know is one of
 * the other layouts' names of a tensor it does know. */
bool mt_moe_other_layout_name(const mt_param_table *t, const char *name);

#endif
