/* The CUDA runtime's handle types, for headers that only pass them on.
 *
 * A build without CUDA still compiles the GPU memory layout of the CUDA
 * backend (backend_cuda_plan.c, moe_cuda_layout.c and the kernels' scratch
 * sizes, scratch_sizes.c), so that the placement planner sizes a run on
 * any machine; the structs it fills name streams and events. Without the
 * runtime they are the same opaque pointers the runtime declares. */
#ifndef MT_KERNELS_CUDA_TYPES_H
#define MT_KERNELS_CUDA_TYPES_H

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif

#endif
