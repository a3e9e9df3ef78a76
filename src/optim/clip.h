/* Global gradient-norm clipping as torch.nn.utils.clip_grad_norm_(params,
 * max_norm, norm_type=2):
 *   total_norm = || (||g_1||, ..., ||g_k||) ||_2,
 *   coef = min(max_norm / (total_norm + 1e-6), 1),   every g *= coef.
 * The caller sums mt_sumsq over all gradient tensors (in double), turns the
 * total into the coefficient with mt_clip_coef, and hands the coefficient
 * to mt_adamw_update as gscale, which applies it in its fused pass.
 *
 * Difference from torch, on purpose: torch computes each tensor's norm in
 * fp32 and then the norm of the stacked norms; we accumulate squares in
 * double and take one sqrt, rounded to float. Our norm is the correctly
 * rounded one up to double rounding; torch's fp32 reductions are off by a
 * few float ulps (relative error of order 1e-7 * log2(n)), so the two norms,
 * and hence the coefficients, agree to about 1e-6 relative. */
#ifndef MT_OPTIM_CLIP_H
#define MT_OPTIM_CLIP_H

#include <stddef.h>

#include "optim/adamw.h"

/* Sum of x[i]^2 in double. Multi-threaded and vectorised; the result is
 * bitwise the same for every ISA and thread count (fixed summation order
 * that depends only on n). */
double mt_sumsq(const mt_optim_cpu *cpu, const float *x, size_t n);

/* The clip coefficient from the total sum of squares of all gradients,
 * computed as torch does in float32: norm = (float)sqrt(total_sumsq),
 * coef = (1 / (norm + 1e-6f)) * max_norm (Tensor.__rtruediv__ is a
 * reciprocal then a multiply), clamped to at most 1 (NaN stays NaN, as with
 * torch.clamp). *norm_out (may be NULL) receives the norm, for logging. */
float mt_clip_coef(double total_sumsq, float max_norm, float *norm_out);

#endif
