/* Elementwise CUDA operators: fp32<->bf16 casts, residual add, SwiGLU,
 * RoPE, and the attention's positions under a sliding window. All memory
 * bound: each thread handles 4 consecutive elements, with 16-byte loads
 * when the pointers allow it, in a grid-stride loop. */
#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"
#include "kernels/ops/elem.cuh"

#define EW_THREADS 256

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Blocks for n elements at 4 per thread; the grid-stride loop covers the rest. */
static unsigned ew_blocks(size_t n) {
    size_t b = MT_CEIL_DIV(MT_CEIL_DIV(n, (size_t)4), (size_t)EW_THREADS);
    if (b > 65536) b = 65536;
    return (unsigned)(b ? b : 1);
}

/* ---- the attention's positions under a sliding window ---- */

__global__ void window_pos_kernel(int32_t *out, const int32_t *pos, size_t n, int64_t T,
                                  int32_t last) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int32_t p = pos ? pos[i] : (int32_t)(i % (size_t)T);
        out[i] = p < last ? p : last;
    }
}

extern "C" void mt_cuda_window_positions(cudaStream_t st, int32_t *out, const int32_t *pos,
                                         size_t n, int64_t T, int64_t window) {
    if (n == 0) return;
    window_pos_kernel<<<ew_blocks(4 * n), EW_THREADS, 0, st>>>(out, pos, n, T,
                                                                (int32_t)(window - 1));
    CUDA_LAUNCH_CHECK();
}

/* ---- casts ---- */

template <bool VEC>
__global__ void cast_f32_bf16_kernel(__nv_bfloat16 *out, const float *inp, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (VEC && i + 4 <= n) {
            float4 v = *(const float4 *)(inp + i);
            __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
            __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
            *(__nv_bfloat162 *)(out + i) = lo;
            *(__nv_bfloat162 *)(out + i + 2) = hi;
        } else {
            for (size_t j = i; j < i + 4 && j < n; j++) out[j] = __float2bfloat16_rn(inp[j]);
        }
    }
}

template <bool VEC>
__global__ void cast_bf16_f32_kernel(float *out, const __nv_bfloat16 *inp, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (VEC && i + 4 <= n) {
            float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)(inp + i));
            float2 hi = __bfloat1622float2(*(const __nv_bfloat162 *)(inp + i + 2));
            *(float4 *)(out + i) = make_float4(lo.x, lo.y, hi.x, hi.y);
        } else {
            for (size_t j = i; j < i + 4 && j < n; j++) out[j] = __bfloat162float(inp[j]);
        }
    }
}

extern "C" void mt_cuda_cast_f32_to_bf16_on(cudaStream_t st, uint16_t *out, const float *inp,
                                            size_t n) {
    if (n == 0) return;
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    if (aligned16(inp) && ((uintptr_t)out & 3) == 0)
        cast_f32_bf16_kernel<true><<<ew_blocks(n), EW_THREADS, 0, st>>>(o, inp, n);
    else
        cast_f32_bf16_kernel<false><<<ew_blocks(n), EW_THREADS, 0, st>>>(o, inp, n);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_cast_bf16_to_f32_on(cudaStream_t st, float *out, const uint16_t *inp,
                                            size_t n) {
    if (n == 0) return;
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)inp;
    if (aligned16(out) && ((uintptr_t)inp & 3) == 0)
        cast_bf16_f32_kernel<true><<<ew_blocks(n), EW_THREADS, 0, st>>>(out, x, n);
    else
        cast_bf16_f32_kernel<false><<<ew_blocks(n), EW_THREADS, 0, st>>>(out, x, n);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_cast_f32_to_bf16(mt_cuda_ctx *ctx, uint16_t *out, const float *inp,
                                         size_t n) {
    mt_cuda_cast_f32_to_bf16_on(ctx->stream, out, inp, n);
}

extern "C" void mt_cuda_cast_bf16_to_f32(mt_cuda_ctx *ctx, float *out, const uint16_t *inp,
                                         size_t n) {
    mt_cuda_cast_bf16_to_f32_on(ctx->stream, out, inp, n);
}

/* ---- residual ---- */

template <bool VEC>
__global__ void residual_kernel(float *out, const float *a, const float *b, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (VEC && i + 4 <= n) {
            float4 x = *(const float4 *)(a + i), y = *(const float4 *)(b + i);
            *(float4 *)(out + i) = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        } else {
            for (size_t j = i; j < i + 4 && j < n; j++) out[j] = a[j] + b[j];
        }
    }
}

extern "C" void mt_cuda_residual_add(mt_cuda_ctx *ctx, float *out, const float *a,
                                     const float *b, size_t n) {
    if (n == 0) return;
    if (aligned16(out) && aligned16(a) && aligned16(b))
        residual_kernel<true><<<ew_blocks(n), EW_THREADS, 0, ctx->stream>>>(out, a, b, n);
    else
        residual_kernel<false><<<ew_blocks(n), EW_THREADS, 0, ctx->stream>>>(out, a, b, n);
    CUDA_LAUNCH_CHECK();
}

/* ---- SwiGLU ---- */

__device__ __forceinline__ float silu_f(float g) { return g / (1.0f + expf(-g)); }

template <typename OUT, bool VEC>
__global__ void swiglu_fwd_kernel(OUT *out, const float *gate, const float *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (VEC && i + 4 <= n) {
            float4 g = *(const float4 *)(gate + i), u = *(const float4 *)(up + i);
            mt_put(out, i, silu_f(g.x) * u.x);
            mt_put(out, i + 1, silu_f(g.y) * u.y);
            mt_put(out, i + 2, silu_f(g.z) * u.z);
            mt_put(out, i + 3, silu_f(g.w) * u.w);
        } else {
            for (size_t j = i; j < i + 4 && j < n; j++) mt_put(out, j, silu_f(gate[j]) * up[j]);
        }
    }
}

extern "C" void mt_cuda_swiglu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt,
                                       const float *gate, const float *up, size_t N, size_t F) {
    size_t n = N * F;
    if (n == 0) return;
    bool vec = aligned16(gate) && aligned16(up);
    unsigned g = ew_blocks(n);
    if (out_dt == MT_DT_BF16) {
        __nv_bfloat16 *o = (__nv_bfloat16 *)out;
        if (vec) swiglu_fwd_kernel<__nv_bfloat16, true><<<g, EW_THREADS, 0, ctx->stream>>>(o, gate, up, n);
        else swiglu_fwd_kernel<__nv_bfloat16, false><<<g, EW_THREADS, 0, ctx->stream>>>(o, gate, up, n);
    } else {
        float *o = (float *)out;
        if (vec) swiglu_fwd_kernel<float, true><<<g, EW_THREADS, 0, ctx->stream>>>(o, gate, up, n);
        else swiglu_fwd_kernel<float, false><<<g, EW_THREADS, 0, ctx->stream>>>(o, gate, up, n);
    }
    CUDA_LAUNCH_CHECK();
}

/* d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g). */
__device__ __forceinline__ void swiglu_grad(float d, float g, float u, float *dg, float *du) {
    float s = 1.0f / (1.0f + expf(-g));
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * g * s;
}

template <bool VEC>
__global__ void swiglu_bwd_kernel(float *dgate, float *dup, const float *dout, const float *gate,
                                  const float *up, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (VEC && i + 4 <= n) {
            float4 d = *(const float4 *)(dout + i), g = *(const float4 *)(gate + i),
                   u = *(const float4 *)(up + i);
            float4 dg, du;
            swiglu_grad(d.x, g.x, u.x, &dg.x, &du.x);
            swiglu_grad(d.y, g.y, u.y, &dg.y, &du.y);
            swiglu_grad(d.z, g.z, u.z, &dg.z, &du.z);
            swiglu_grad(d.w, g.w, u.w, &dg.w, &du.w);
            *(float4 *)(dgate + i) = dg;
            *(float4 *)(dup + i) = du;
        } else {
            for (size_t j = i; j < i + 4 && j < n; j++)
                swiglu_grad(dout[j], gate[j], up[j], &dgate[j], &dup[j]);
        }
    }
}

extern "C" void mt_cuda_swiglu_backward(mt_cuda_ctx *ctx, float *dgate, float *dup,
                                        const float *dout, const float *gate, const float *up,
                                        size_t N, size_t F) {
    size_t n = N * F;
    if (n == 0) return;
    if (aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) &&
        aligned16(up))
        swiglu_bwd_kernel<true><<<ew_blocks(n), EW_THREADS, 0, ctx->stream>>>(dgate, dup, dout,
                                                                               gate, up, n);
    else
        swiglu_bwd_kernel<false><<<ew_blocks(n), EW_THREADS, 0, ctx->stream>>>(dgate, dup, dout,
                                                                                gate, up, n);
    CUDA_LAUNCH_CHECK();
}

/* ---- RoPE ----
 * One thread per rotated pair (i, i + HD/2) of one (b, t, h) row. The
 * backward is the inverse rotation (the transpose of the forward's). POS:
 * positions of packed documents; false compiles the kernel without them. */

template <bool INVERSE, bool POS>
__global__ void rope_kernel(float *x, const float *cos, const float *sin, const int32_t *pos,
                            size_t T, size_t H, size_t half, size_t n_pairs) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < n_pairs; p += stride) {
        size_t i = p % half, row = p / half; /* row indexes (b, t, h) */
        size_t t = POS ? (size_t)pos[row / H] : (row / H) % T;
        float c = cos[t * half + i], s = sin[t * half + i];
        s = INVERSE ? -s : s;
        float *xr = x + row * 2 * half;
        float x1 = xr[i], x2 = xr[i + half];
        xr[i] = x1 * c - x2 * s;
        xr[i + half] = x2 * c + x1 * s;
    }
}

static void rope_launch(mt_cuda_ctx *ctx, float *x, const float *cos, const float *sin,
                        const int32_t *pos, size_t B, size_t T, size_t H, size_t HD,
                        bool inverse) {
    MT_ASSERT(HD % 2 == 0);
    size_t half = HD / 2, n = B * T * H * half;
    if (n == 0) return;
    size_t blocks = MT_CEIL_DIV(n, (size_t)EW_THREADS);
    unsigned g = (unsigned)(blocks > 65536 ? 65536 : blocks);
    auto kern = inverse ? (pos ? rope_kernel<true, true> : rope_kernel<true, false>)
                        : (pos ? rope_kernel<false, true> : rope_kernel<false, false>);
    kern<<<g, EW_THREADS, 0, ctx->stream>>>(x, cos, sin, pos, T, H, half, n);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_rope_forward(mt_cuda_ctx *ctx, float *x, const float *cos,
                                     const float *sin, const int32_t *pos, size_t B, size_t T,
                                     size_t H, size_t HD) {
    rope_launch(ctx, x, cos, sin, pos, B, T, H, HD, false);
}

extern "C" void mt_cuda_rope_backward(mt_cuda_ctx *ctx, float *dx, const float *cos,
                                      const float *sin, const int32_t *pos, size_t B, size_t T,
                                      size_t H, size_t HD) {
    rope_launch(ctx, dx, cos, sin, pos, B, T, H, HD, true);
}
