/* The element-wise operators of the gpt_neox and falcon blocks: GELU (erf
 * form, or transformers' tanh form) forward and backward, and the fused
 * query_key_value product's split into the attention's q, k, v with the
 * partial rotary embedding on the way (and the backward's join, inverse
 * rotation included). All memory bound and one pass each; fp32
 * arithmetic, as backend/cpu/ops.c (which computes GELU in double: the
 * difference is below fp32 rounding of the result). */
#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"

#define NEOX_THREADS 256
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* Blocks for n items of `per` elements each; a grid-stride loop covers the rest. */
static unsigned neox_blocks(size_t n, size_t per) {
    size_t b = MT_CEIL_DIV(MT_CEIL_DIV(n, per), (size_t)NEOX_THREADS);
    if (b > 65536) b = 65536;
    return (unsigned)(b ? b : 1);
}

/* ---- GELU ---- */

template <bool TANH>
__device__ __forceinline__ float gelu_f(float x) {
    if (TANH) return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

template <bool TANH>
__device__ __forceinline__ float gelu_grad_f(float x) {
    if (TANH) {
        float t = tanhf(GELU_K * (x + GELU_A * x * x * x));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    }
    /* Phi(x) + x phi(x), phi the standard normal density */
    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
           x * expf(-0.5f * x * x) * 0.39894228040143268f;
}

__device__ __forceinline__ void put(float *out, size_t i, float v) { out[i] = v; }
__device__ __forceinline__ void put(__nv_bfloat16 *out, size_t i, float v) {
    out[i] = __float2bfloat16_rn(v);
}

/* 4 consecutive elements a thread; 16-byte loads when the whole group is
 * in range (the callers' buffers are 256-byte aligned). */
template <typename OUT, bool TANH>
__global__ void gelu_fwd_kernel(OUT *out, const float *inp, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (i + 4 <= n) {
            float4 v = *(const float4 *)(inp + i);
            put(out, i, gelu_f<TANH>(v.x));
            put(out, i + 1, gelu_f<TANH>(v.y));
            put(out, i + 2, gelu_f<TANH>(v.z));
            put(out, i + 3, gelu_f<TANH>(v.w));
        } else {
            for (size_t j = i; j < n; j++) put(out, j, gelu_f<TANH>(inp[j]));
        }
    }
}

template <bool TANH>
__global__ void gelu_bwd_kernel(float *dinp, __nv_bfloat16 *dinp_op, const float *dout,
                                const float *inp, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (i + 4 <= n) {
            float4 x = *(const float4 *)(inp + i), g = *(const float4 *)(dout + i);
            float4 d = make_float4(g.x * gelu_grad_f<TANH>(x.x), g.y * gelu_grad_f<TANH>(x.y),
                                   g.z * gelu_grad_f<TANH>(x.z), g.w * gelu_grad_f<TANH>(x.w));
            *(float4 *)(dinp + i) = d;
            if (dinp_op) {
                put(dinp_op, i, d.x);
                put(dinp_op, i + 1, d.y);
                put(dinp_op, i + 2, d.z);
                put(dinp_op, i + 3, d.w);
            }
        } else {
            for (size_t j = i; j < n; j++) {
                float d = dout[j] * gelu_grad_f<TANH>(inp[j]);
                dinp[j] = d;
                if (dinp_op) put(dinp_op, j, d);
            }
        }
    }
}

static void check16(const void *p) { MT_ASSERT(((uintptr_t)p & 15) == 0); }

extern "C" void mt_cuda_gelu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt,
                                     const float *inp, size_t n, int tanh_form) {
    if (n == 0) return;
    check16(inp);
    unsigned g = neox_blocks(n, 4);
    cudaStream_t s = ctx->stream;
    if (out_dt == MT_DT_BF16) {
        __nv_bfloat16 *o = (__nv_bfloat16 *)out;
        if (tanh_form) gelu_fwd_kernel<__nv_bfloat16, true><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
        else gelu_fwd_kernel<__nv_bfloat16, false><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
    } else {
        float *o = (float *)out;
        if (tanh_form) gelu_fwd_kernel<float, true><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
        else gelu_fwd_kernel<float, false><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
    }
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_gelu_backward(mt_cuda_ctx *ctx, float *dinp, uint16_t *dinp_op,
                                      const float *dout, const float *inp, size_t n,
                                      int tanh_form) {
    if (n == 0) return;
    check16(dinp);
    check16(dout);
    check16(inp);
    unsigned g = neox_blocks(n, 4);
    __nv_bfloat16 *op = (__nv_bfloat16 *)dinp_op;
    if (tanh_form)
        gelu_bwd_kernel<true><<<g, NEOX_THREADS, 0, ctx->stream>>>(dinp, op, dout, inp, n);
    else
        gelu_bwd_kernel<false><<<g, NEOX_THREADS, 0, ctx->stream>>>(dinp, op, dout, inp, n);
    CUDA_LAUNCH_CHECK();
}

/* ---- the fused qkv ----
 * A row of qkv (N, W), W = (NH + 2 NKV) HD, is NKV groups of (G + 2) head
 * vectors: the group's G = NH/NKV query heads, then its k, then its v.
 * Element (n, o) of it: slot = o / HD (group slot / (G+2), place j = slot
 * % (G+2) in it), d = o % HD. The rotation pairs d and d + R/2 for d < R/2
 * with the angle of position p = pos[n] (or n % T) and frequency d. */

struct qkv_shape {
    size_t N, T;
    int NH, NKV, HD, R;
};

/* The element's home in q (N, NH, HD), k or v (N, NKV, HD). */
__device__ __forceinline__ float *qkv_home(float *q, float *k, float *v, const qkv_shape &s,
                                           size_t n, int g, int j, int d) {
    int G = s.NH / s.NKV;
    if (j < G) return q + (n * s.NH + (size_t)(g * G + j)) * s.HD + d;
    return (j == G ? k : v) + (n * s.NKV + (size_t)g) * s.HD + d;
}

/* One thread per element of qkv. INVERSE: the backward, reading q, k, v
 * (their gradients) and writing qkv (its gradient, and a bf16 copy when
 * qkv_op is not NULL). */
template <bool INVERSE>
__global__ void qkv_rope_kernel(float *qkv, __nv_bfloat16 *qkv_op, float *q, float *k, float *v,
                                const float *cos, const float *sin, const int32_t *pos,
                                qkv_shape s) {
    const size_t W = (size_t)(s.NH + 2 * s.NKV) * s.HD, total = s.N * W;
    const int G = s.NH / s.NKV, half = s.R / 2;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const size_t n = idx / W;
        const int o = (int)(idx - n * W), slot = o / s.HD, d = o - slot * s.HD;
        const int g = slot / (G + 2), j = slot - g * (G + 2);
        const float *src = INVERSE ? qkv_home(q, k, v, s, n, g, j, d) : qkv + idx;
        float val = src[0];
        if (j <= G && d < s.R) { /* a query or key head's rotated dims */
            const size_t p = pos ? (size_t)pos[n] : n % s.T;
            const int i = d < half ? d : d - half;
            const float c = cos[p * half + i], sn = sin[p * half + i];
            /* forward: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s); inverse:
             * (y1, y2) -> (y1 c + y2 s, y2 c - y1 s) */
            if (d < half) val = INVERSE ? val * c + src[half] * sn : val * c - src[half] * sn;
            else val = INVERSE ? val * c - src[-half] * sn : val * c + src[-half] * sn;
        }
        if (INVERSE) {
            qkv[idx] = val;
            if (qkv_op) qkv_op[idx] = __float2bfloat16_rn(val);
        } else {
            *qkv_home(q, k, v, s, n, g, j, d) = val;
        }
    }
}

static qkv_shape make_shape(size_t B, size_t T, size_t NH, size_t NKV, size_t HD, size_t R) {
    MT_ASSERT(NKV > 0 && NH % NKV == 0 && R % 2 == 0 && R <= HD);
    MT_ASSERT((NH + 2 * NKV) * HD < (size_t)1 << 31); /* a row's offsets are int */
    return qkv_shape{B * T, T, (int)NH, (int)NKV, (int)HD, (int)R};
}

extern "C" void mt_cuda_qkv_split_rope(mt_cuda_ctx *ctx, float *q, float *k, float *v,
                                       const float *qkv, const float *cos, const float *sin,
                                       const int32_t *pos, size_t B, size_t T, size_t NH,
                                       size_t NKV, size_t HD, size_t R) {
    qkv_shape s = make_shape(B, T, NH, NKV, HD, R);
    size_t total = s.N * (NH + 2 * NKV) * HD;
    if (total == 0) return;
    qkv_rope_kernel<false><<<neox_blocks(total, 1), NEOX_THREADS, 0, ctx->stream>>>(
        (float *)qkv, NULL, q, k, v, cos, sin, pos, s);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_qkv_join_rope_backward(mt_cuda_ctx *ctx, float *dqkv, uint16_t *dqkv_op,
                                               const float *dq, const float *dk,
                                               const float *dv, const float *cos,
                                               const float *sin, const int32_t *pos, size_t B,
                                               size_t T, size_t NH, size_t NKV, size_t HD,
                                               size_t R) {
    qkv_shape s = make_shape(B, T, NH, NKV, HD, R);
    size_t total = s.N * (NH + 2 * NKV) * HD;
    if (total == 0) return;
    qkv_rope_kernel<true><<<neox_blocks(total, 1), NEOX_THREADS, 0, ctx->stream>>>(
        dqkv, (__nv_bfloat16 *)dqkv_op, (float *)dq, (float *)dk, (float *)dv, cos, sin, pos, s);
    CUDA_LAUNCH_CHECK();
}
