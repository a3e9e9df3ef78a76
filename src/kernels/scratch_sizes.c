/* The kernels' scratch sizes, in plain C and in every build: the GPU
 * memory plan (backend_cuda_plan.c, moe_cuda_layout.c) counts with them,
 * and the placement planner sizes runs with that plan also on a machine
 * without CUDA. The tiles they follow are in scratch_sizes.h, shared with
 * the kernels. */
#include "kernels/scratch_sizes.h"

#include <stdint.h>

#include "kernels/attention/attention.h"
#include "kernels/cuda_ops.h"
#include "kernels/moe/moe_gemm.h"
#include "kernels/moe/moe_route.h"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

size_t mt_attn_backward_scratch_bytes(size_t B, size_t T, size_t NH) {
    return B * T * NH * sizeof(float);
}

#ifndef MT_HAVE_CUDA
/* Without CUDA there is no GPU to ask whether the Hopper kernels run (which
 * also take head dims 80 and 96): the plan is that of a CUDA build on a
 * machine without a GPU, the mma.sync kernels' head dims, 256 with the
 * shared memory of the Hopper GPUs. */
bool mt_attn_bf16_supports(size_t HD) { return HD == 64 || HD == 128 || HD == 256; }
#endif

/* The fused backward's partials, then those of its column sums. */
static size_t fused_scratch_floats(size_t N, size_t C) {
    const size_t G = CEIL_DIV(N, (size_t)MT_FUSED_ROWS);
    return G * C + CEIL_DIV(G, (size_t)MT_COLSUM_ROWS) * C;
}

size_t mt_cuda_colsum_scratch_floats(size_t N, size_t C) {
    const size_t plain = CEIL_DIV(N, (size_t)MT_COLSUM_ROWS) * C, fused = fused_scratch_floats(N, C);
    return plain > fused ? plain : fused;
}

size_t mt_cuda_lm_head_scratch_bytes(mt_precision prec, size_t R, size_t V) {
    return mt_lm_head_logits_bytes(R, V) + (prec == MT_PREC_BF16 ? R * V * 2 : 0);
}

size_t mt_cuda_moe_group_scratch(size_t NK, int E) {
    return CEIL_DIV(NK, (size_t)MT_GROUP_TILE) * (size_t)E;
}

size_t mt_cuda_moe_gemm_scratch_bytes(int E) {
    MT_ASSERT(E >= 0);
    return (((size_t)E + 1) * sizeof(int32_t) + 255) & ~(size_t)255;
}
