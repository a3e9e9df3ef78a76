/* The element-wise operators Gemma 2 and Gemma 3 add (backend/cuda/
 * gemma_cuda.c): the GeGLU of their MLP, gelu(gate) * up, forward and
 * backward, and an affine map out = inp * mul + add, which makes the
 * 1 + w of their RMSNorms and scales the embedding by sqrt(hidden). fp32
 * arithmetic, as backend/cpu/gemma.c; memory bound, one pass each. */
#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"
#include "kernels/ops/gelu.cuh"

#define GEMMA_THREADS 256

static unsigned gemma_blocks(size_t n) {
    size_t b = MT_CEIL_DIV(n, (size_t)GEMMA_THREADS);
    if (b > 65536) b = 65536;
    return (unsigned)(b ? b : 1);
}

__device__ __forceinline__ void store(float *out, size_t i, float v) { out[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16 *out, size_t i, float v) {
    out[i] = __float2bfloat16_rn(v);
}

__global__ void affine_kernel(float *out, const float *inp, size_t n, float mul, float add) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = inp[i] * mul + add;
}

extern "C" void mt_cuda_affine(mt_cuda_ctx *ctx, float *out, const float *inp, size_t n,
                               float mul, float add) {
    if (n == 0) return;
    affine_kernel<<<gemma_blocks(n), GEMMA_THREADS, 0, ctx->stream>>>(out, inp, n, mul, add);
    CUDA_LAUNCH_CHECK();
}

template <typename OUT, bool TANH>
__global__ void geglu_fwd_kernel(OUT *out, const float *gate, const float *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        store(out, i, gelu_f<TANH>(gate[i]) * up[i]);
}

template <typename OUT>
static void geglu_fwd(cudaStream_t st, OUT *out, const float *gate, const float *up, size_t n,
                      int tanh_form) {
    if (tanh_form)
        geglu_fwd_kernel<OUT, true><<<gemma_blocks(n), GEMMA_THREADS, 0, st>>>(out, gate, up, n);
    else
        geglu_fwd_kernel<OUT, false><<<gemma_blocks(n), GEMMA_THREADS, 0, st>>>(out, gate, up, n);
}

extern "C" void mt_cuda_geglu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt,
                                      const float *gate, const float *up, size_t N, size_t F,
                                      int tanh_form) {
    size_t n = N * F;
    if (n == 0) return;
    if (out_dt == MT_DT_BF16)
        geglu_fwd(ctx->stream, (__nv_bfloat16 *)out, gate, up, n, tanh_form);
    else
        geglu_fwd(ctx->stream, (float *)out, gate, up, n, tanh_form);
    CUDA_LAUNCH_CHECK();
}

/* h = gelu(g) u: dg = dh u gelu'(g), du = dh gelu(g), as backend/cpu/gemma.c
 * (which multiplies dh by u first, then by gelu'). */
template <bool TANH>
__global__ void geglu_bwd_kernel(float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float d = dout[i], g = gate[i], u = up[i];
        dup[i] = d * gelu_f<TANH>(g);
        dgate[i] = (d * u) * gelu_grad_f<TANH>(g);
    }
}

extern "C" void mt_cuda_geglu_backward(mt_cuda_ctx *ctx, float *dgate, float *dup,
                                       const float *dout, const float *gate, const float *up,
                                       size_t N, size_t F, int tanh_form) {
    size_t n = N * F;
    if (n == 0) return;
    unsigned g = gemma_blocks(n);
    if (tanh_form)
        geglu_bwd_kernel<true><<<g, GEMMA_THREADS, 0, ctx->stream>>>(dgate, dup, dout, gate, up, n);
    else
        geglu_bwd_kernel<false><<<g, GEMMA_THREADS, 0, ctx->stream>>>(dgate, dup, dout, gate, up,
                                                                      n);
    CUDA_LAUNCH_CHECK();
}
