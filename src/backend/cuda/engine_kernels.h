/* Small kernels the streaming engine needs besides the operators. */
#ifndef MT_BACKEND_CUDA_ENGINE_KERNELS_H
#define MT_BACKEND_CUDA_ENGINE_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Doubles of scratch mt_cuda_sumsq needs. */
#define MT_SUMSQ_PARTIALS 1024

/* *out = sum of x[i]^2 (n), in double, in an order that depends only on n
 * (deterministic). scratch: MT_SUMSQ_PARTIALS doubles. */
void mt_cuda_sumsq(cudaStream_t stream, double *out, double *scratch, const float *x, size_t n);

#ifdef __cplusplus
}
#endif

#endif
