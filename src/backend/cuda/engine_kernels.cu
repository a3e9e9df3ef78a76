// Kernels of the streaming engine itself: the per-layer gradient norm used
// for exact global clipping.
#include "backend/cuda/engine_kernels.h"

#include "backend/cuda/cuda_common.h"

// One partial per block over a grid-stride range, then one block sums the
// partials: the order depends on n alone, so the norm is reproducible.
__global__ static void sumsq_partial(double *partials, const float *x, size_t n) {
    __shared__ double sh[256];
    double acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double v = x[i];
        acc += v * v;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

__global__ static void sum_partials(double *out, const double *partials, int n) {
    __shared__ double sh[256];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}

extern "C" void mt_cuda_sumsq(cudaStream_t stream, double *out, double *scratch, const float *x,
                              size_t n) {
    sumsq_partial<<<MT_SUMSQ_PARTIALS, 256, 0, stream>>>(scratch, x, n);
    CUDA_LAUNCH_CHECK();
    sum_partials<<<1, 256, 0, stream>>>(out, scratch, MT_SUMSQ_PARTIALS);
    CUDA_LAUNCH_CHECK();
}
