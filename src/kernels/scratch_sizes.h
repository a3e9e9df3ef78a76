/* The tiles that decide the kernels' scratch sizes, shared by the kernels
 * (.cu) and scratch_sizes.c, which computes those sizes in plain C: the
 * GPU memory plan is counted in every build, also without CUDA, for the
 * placement planner (src/plan/). */
#ifndef MT_KERNELS_SCRATCH_SIZES_H
#define MT_KERNELS_SCRATCH_SIZES_H

#include <stddef.h>

#define MT_COLSUM_ROWS 256  /* ops_norm.cu: rows per partial column sum */
#define MT_FUSED_ROWS 64    /* ops_norm.cu: rows a fused-backward block walks */
#define MT_GROUP_TILE 1024  /* moe_route.cu: expert choices per grouping tile */

/* ops_loss.cu: the head's fp32 logits (R, V) at the start of its scratch,
 * rounded up to 256 bytes. */
static inline size_t mt_lm_head_logits_bytes(size_t R, size_t V) {
    return (R * V * sizeof(float) + 255) / 256 * 256;
}

#endif
