// Kernels of the streaming engine itself: the per-layer gradient norm used
// for exact global clipping, and the AdamW step of the layers whose
// optimizer state lives on the GPU.
#include "kernels/optim/optim_kernels.h"

#include "kernels/cuda_common.h"

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

// The CPU reference's operations (optim/kernels_scalar.c) one by one, each
// rounded to nearest: the _rn intrinsics are never contracted, so only the
// two FMAs of the formula are FMAs, and division and square root are the
// IEEE ones, as on the CPU.
__global__ static void adamw_step(float *p, float *m, float *v, const float *g, size_t n,
                                  mt_adamw_coefs c) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float gi = __fmul_rn(g[i], c.gscale);
        float pi = __fmul_rn(p[i], c.decay);
        float mi = m[i];
        mi = __fmaf_rn(c.m_weight, __fsub_rn(gi, mi), c.m_base_is_g ? gi : mi);
        float vi = __fmaf_rn(__fmul_rn(c.one_minus_beta2, gi), gi, __fmul_rn(v[i], c.beta2));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(c.neg_step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" void mt_cuda_adamw(cudaStream_t stream, float *p, float *m, float *v, const float *g,
                              size_t n, const mt_adamw_coefs *c) {
    if (!n) return;
    size_t blocks = (n + 255) / 256;
    adamw_step<<<blocks < 4096 ? (unsigned)blocks : 4096u, 256, 0, stream>>>(p, m, v, g, n, *c);
    CUDA_LAUNCH_CHECK();
}
