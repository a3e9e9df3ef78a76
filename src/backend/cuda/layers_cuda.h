/* The layer templates of the CUDA streaming backend (layers_cuda.c): one
 * decoder block forward and backward for one micro-batch, on the bound
 * slot's weights. Not a public interface. */
#ifndef MT_BACKEND_CUDA_LAYERS_H
#define MT_BACKEND_CUDA_LAYERS_H

#include "backend/cuda/backend_cuda_internal.h"

/* Forward writes its activations into a (the scratch cb->a, or a kept
 * unit); backward reads them from f and takes its gradient buffers from the
 * scratch. */
acts *mt_cuda_kept_unit(cuda_backend *cb, int layer, int mb);
void mt_cuda_block_forward(cuda_backend *cb, acts *a, int layer, const float *x, float *out);
void mt_cuda_block_backward(cuda_backend *cb, const acts *f, int layer, const float *x,
                            float *dx);

#endif
