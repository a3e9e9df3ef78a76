/* The element-wise operators Gemma 2 and Gemma 3 add (backend/cuda/
 * gemma_cuda.c): the GeGLU of their MLP, gelu(gate) * up, forward and
 * backward, and an affine map out = inp * mul + add, which makes the
 * 1 + w of their RMSNorms and scales the embedding by sqrt(hidden). fp32
 * arithmetic, as backend/cpu/gemma.c; memory bound, one pass each. The
 * GeGLU on aligned bf16 arrays takes ops_fused.cu's 16-byte kernels (the
 * same arithmetic, so the same bits as these). */
#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"
#include "kernels/ops/elem.cuh"
#include "kernels/ops/gelu.cuh"
#include "kernels/ops/ops_fused.h"

#define GEMMA_THREADS 256

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static unsigned gemma_blocks(size_t n) {
    size_t b = MT_CEIL_DIV(n, (size_t)GEMMA_THREADS);
    if (b > 65536) b = 65536;
    return (unsigned)(b ? b : 1);
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

template <typename OUT, typename IN, bool TANH>
__global__ void geglu_fwd_kernel(OUT *out, const IN *gate, const IN *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        mt_put(out, i, gelu_f<TANH>(mt_get(gate, i)) * mt_get(up, i));
}

template <typename OUT, typename IN>
static void geglu_fwd(cudaStream_t st, OUT *out, const void *gate, const void *up, size_t n,
                      int tanh_form) {
    const IN *g = (const IN *)gate, *u = (const IN *)up;
    if (tanh_form)
        geglu_fwd_kernel<OUT, IN, true><<<gemma_blocks(n), GEMMA_THREADS, 0, st>>>(out, g, u, n);
    else
        geglu_fwd_kernel<OUT, IN, false><<<gemma_blocks(n), GEMMA_THREADS, 0, st>>>(out, g, u, n);
}

extern "C" void mt_cuda_geglu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, const void *gate,
                                      const void *up, mt_dt in_dt, size_t N, size_t F,
                                      int tanh_form) {
    size_t n = N * F;
    if (n == 0) return;
    MT_ASSERT(in_dt == MT_DT_F32 || out_dt == MT_DT_BF16); /* bf16 in: bf16 out */
    if (in_dt == MT_DT_BF16 && aligned16(out) && aligned16(gate) && aligned16(up))
        mt_cuda_geglu_forward_bf16(ctx->stream, (uint16_t *)out, (const uint16_t *)gate,
                                   (const uint16_t *)up, n, tanh_form);
    else if (in_dt == MT_DT_BF16)
        geglu_fwd<__nv_bfloat16, __nv_bfloat16>(ctx->stream, (__nv_bfloat16 *)out, gate, up, n,
                                                tanh_form);
    else if (out_dt == MT_DT_BF16)
        geglu_fwd<__nv_bfloat16, float>(ctx->stream, (__nv_bfloat16 *)out, gate, up, n,
                                        tanh_form);
    else
        geglu_fwd<float, float>(ctx->stream, (float *)out, gate, up, n, tanh_form);
    CUDA_LAUNCH_CHECK();
}

/* h = gelu(g) u: dg = dh u gelu'(g), du = dh gelu(g), as backend/cpu/gemma.c
 * (which multiplies dh by u first, then by gelu'); the gradients in the
 * inputs' type. */
template <typename T, typename D, bool TANH>
__global__ void geglu_bwd_kernel(T *dgate, T *dup, const D *dout, const T *gate, const T *up,
                                 size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float d = mt_get(dout, i), g = mt_get(gate, i), u = mt_get(up, i);
        mt_put(dup, i, d * gelu_f<TANH>(g));
        mt_put(dgate, i, (d * u) * gelu_grad_f<TANH>(g));
    }
}

template <typename T, typename D>
static void geglu_bwd(cudaStream_t st, void *dgate, void *dup, const void *dout,
                      const void *gate, const void *up, size_t n, int tanh_form) {
    T *dg = (T *)dgate, *du = (T *)dup;
    const T *g = (const T *)gate, *u = (const T *)up;
    const D *d = (const D *)dout;
    if (tanh_form)
        geglu_bwd_kernel<T, D, true><<<gemma_blocks(n), GEMMA_THREADS, 0, st>>>(dg, du, d, g, u, n);
    else
        geglu_bwd_kernel<T, D, false><<<gemma_blocks(n), GEMMA_THREADS, 0, st>>>(dg, du, d, g, u,
                                                                                n);
}

extern "C" void mt_cuda_geglu_backward(mt_cuda_ctx *ctx, void *dgate, void *dup, const void *dout,
                                       mt_dt dout_dt, const void *gate, const void *up, mt_dt dt,
                                       size_t N, size_t F, int tanh_form) {
    size_t n = N * F;
    if (n == 0) return;
    MT_ASSERT(dout_dt == MT_DT_F32 || dt == MT_DT_BF16);
    bool d16 = dout_dt == MT_DT_BF16;
    if (dt == MT_DT_BF16 && aligned16(dgate) && aligned16(dup) && aligned16(dout) &&
        aligned16(gate) && aligned16(up))
        mt_cuda_geglu_backward_bf16(ctx->stream, (uint16_t *)dgate, (uint16_t *)dup,
                                    d16 ? NULL : (const float *)dout,
                                    d16 ? (const uint16_t *)dout : NULL, (const uint16_t *)gate,
                                    (const uint16_t *)up, n, tanh_form);
    else if (dt == MT_DT_BF16 && d16)
        geglu_bwd<__nv_bfloat16, __nv_bfloat16>(ctx->stream, dgate, dup, dout, gate, up, n,
                                                tanh_form);
    else if (dt == MT_DT_BF16)
        geglu_bwd<__nv_bfloat16, float>(ctx->stream, dgate, dup, dout, gate, up, n, tanh_form);
    else
        geglu_bwd<float, float>(ctx->stream, dgate, dup, dout, gate, up, n, tanh_form);
    CUDA_LAUNCH_CHECK();
}
