/* Small kernels the streaming engine needs besides the operators. */
#ifndef MT_KERNELS_OPTIM_KERNELS_H
#define MT_KERNELS_OPTIM_KERNELS_H

#include <stddef.h>

#include "kernels/cuda_types.h"

#include "optim/adamw.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Doubles of scratch mt_cuda_sumsq needs. */
#define MT_SUMSQ_PARTIALS 1024

/* *out = sum of x[i]^2 (n), in double, in an order that depends only on n
 * (deterministic). scratch: MT_SUMSQ_PARTIALS doubles. */
void mt_cuda_sumsq(cudaStream_t stream, double *out, double *scratch, const float *x, size_t n);

/* One AdamW step over n parameters, in place (p, m, v read and written, g
 * read), with the scalars of optim/adamw.h: bitwise the CPU kernels'
 * result. */
void mt_cuda_adamw(cudaStream_t stream, float *p, float *m, float *v, const float *g, size_t n,
                   const mt_adamw_coefs *c);

#ifdef __cplusplus
}
#endif

#endif
