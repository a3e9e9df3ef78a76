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
#include "kernels/ops/elem.cuh"
#include "kernels/ops/gelu.cuh"

#define NEOX_THREADS 256

/* Blocks for n items of `per` elements each; a grid-stride loop covers the rest. */
static unsigned neox_blocks(size_t n, size_t per) {
    size_t b = MT_CEIL_DIV(MT_CEIL_DIV(n, per), (size_t)NEOX_THREADS);
    if (b > 65536) b = 65536;
    return (unsigned)(b ? b : 1);
}

/* ---- GELU ---- */

/* 4 consecutive elements a thread; vector loads and stores when the whole
 * group is in range (the callers' buffers are aligned, checked below). */
template <typename IN, typename OUT, bool TANH>
__global__ void gelu_fwd_kernel(OUT *out, const IN *inp, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (i + 4 <= n) {
            float4 v = mt_get4(inp + i);
            mt_put4(out + i, make_float4(gelu_f<TANH>(v.x), gelu_f<TANH>(v.y), gelu_f<TANH>(v.z),
                                     gelu_f<TANH>(v.w)));
        } else {
            for (size_t j = i; j < n; j++) mt_put(out, j, gelu_f<TANH>(mt_get(inp + j, 0)));
        }
    }
}

/* dinp (fp32, or NULL) and dinp_op (bf16, or NULL) = dout * gelu'(inp). */
template <typename IN, bool TANH>
__global__ void gelu_bwd_kernel(float *dinp, __nv_bfloat16 *dinp_op, const float *dout,
                                const IN *inp, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x * 4;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (i + 4 <= n) {
            float4 x = mt_get4(inp + i), g = *(const float4 *)(dout + i);
            float4 d = make_float4(g.x * gelu_grad_f<TANH>(x.x), g.y * gelu_grad_f<TANH>(x.y),
                                   g.z * gelu_grad_f<TANH>(x.z), g.w * gelu_grad_f<TANH>(x.w));
            if (dinp) *(float4 *)(dinp + i) = d;
            if (dinp_op) mt_put4(dinp_op + i, d);
        } else {
            for (size_t j = i; j < n; j++) {
                float d = dout[j] * gelu_grad_f<TANH>(mt_get(inp + j, 0));
                if (dinp) dinp[j] = d;
                if (dinp_op) mt_put(dinp_op, j, d);
            }
        }
    }
}

static void check16(const void *p) { MT_ASSERT(((uintptr_t)p & 15) == 0); }
static void check8(const void *p) { MT_ASSERT(((uintptr_t)p & 7) == 0); }

template <typename IN>
static void gelu_fwd_launch(cudaStream_t s, void *out, mt_dt out_dt, const IN *inp, size_t n,
                            int tanh_form) {
    unsigned g = neox_blocks(n, 4);
    if (out_dt == MT_DT_BF16) {
        __nv_bfloat16 *o = (__nv_bfloat16 *)out;
        if (tanh_form) gelu_fwd_kernel<IN, __nv_bfloat16, true><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
        else gelu_fwd_kernel<IN, __nv_bfloat16, false><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
    } else {
        float *o = (float *)out;
        if (tanh_form) gelu_fwd_kernel<IN, float, true><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
        else gelu_fwd_kernel<IN, float, false><<<g, NEOX_THREADS, 0, s>>>(o, inp, n);
    }
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_gelu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, const void *inp,
                                     mt_dt inp_dt, size_t n, int tanh_form) {
    if (n == 0) return;
    check16(inp);
    check16(out); /* mt_put4: 16 bytes (fp32) or 8 (bf16) at every 4th element */
    if (inp_dt == MT_DT_BF16)
        gelu_fwd_launch(ctx->stream, out, out_dt, (const __nv_bfloat16 *)inp, n, tanh_form);
    else
        gelu_fwd_launch(ctx->stream, out, out_dt, (const float *)inp, n, tanh_form);
}

template <typename IN>
static void gelu_bwd_launch(cudaStream_t s, float *dinp, __nv_bfloat16 *op, const float *dout,
                            const IN *inp, size_t n, int tanh_form) {
    unsigned g = neox_blocks(n, 4);
    if (tanh_form) gelu_bwd_kernel<IN, true><<<g, NEOX_THREADS, 0, s>>>(dinp, op, dout, inp, n);
    else gelu_bwd_kernel<IN, false><<<g, NEOX_THREADS, 0, s>>>(dinp, op, dout, inp, n);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_gelu_backward(mt_cuda_ctx *ctx, float *dinp, uint16_t *dinp_op,
                                      const float *dout, const void *inp, mt_dt inp_dt, size_t n,
                                      int tanh_form) {
    if (n == 0) return;
    MT_ASSERT(dinp || dinp_op);
    if (dinp) check16(dinp);
    if (dinp_op) check8(dinp_op);
    check16(dout);
    check16(inp);
    __nv_bfloat16 *op = (__nv_bfloat16 *)dinp_op;
    if (inp_dt == MT_DT_BF16)
        gelu_bwd_launch(ctx->stream, dinp, op, dout, (const __nv_bfloat16 *)inp, n, tanh_form);
    else
        gelu_bwd_launch(ctx->stream, dinp, op, dout, (const float *)inp, n, tanh_form);
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
template <typename X>
__device__ __forceinline__ X *qkv_home(X *q, X *k, X *v, const qkv_shape &s, size_t n, int g,
                                       int j, int d) {
    int G = s.NH / s.NKV;
    if (j < G) return q + (n * s.NH + (size_t)(g * G + j)) * s.HD + d;
    return (j == G ? k : v) + (n * s.NKV + (size_t)g) * s.HD + d;
}

/* The rotation of element d of a rotated head: x its value, partner the
 * value at d + R/2 (d < R/2) or d - R/2; forward (x1, x2) -> (x1 c - x2 s,
 * x2 c + x1 s), INVERSE (y1, y2) -> (y1 c + y2 s, y2 c - y1 s). */
template <bool INVERSE>
__device__ __forceinline__ float rotate(float x, float partner, int d, int half, float c,
                                        float sn) {
    if (d < half) return INVERSE ? x * c + partner * sn : x * c - partner * sn;
    return INVERSE ? x * c - partner * sn : x * c + partner * sn;
}

/* A block per token row (grid-stride over the rows), its threads over the
 * row's W elements: 32-bit index arithmetic within the row. Forward: qkv
 * (IN) -> q, k, v (OUT). */
template <typename IN, typename OUT>
__global__ void qkv_split_kernel(OUT *q, OUT *k, OUT *v, const IN *qkv, const float *cos,
                                 const float *sin, const int32_t *pos, qkv_shape s) {
    const int W = (s.NH + 2 * s.NKV) * s.HD, G = s.NH / s.NKV, half = s.R / 2;
    for (size_t n = blockIdx.x; n < s.N; n += gridDim.x) {
        const IN *row = qkv + n * (size_t)W;
        const size_t p = pos ? (size_t)pos[n] : n % s.T;
        for (int o = threadIdx.x; o < W; o += blockDim.x) {
            const int slot = o / s.HD, d = o - slot * s.HD;
            const int g = slot / (G + 2), j = slot - g * (G + 2);
            float val = mt_get(row, o);
            if (j <= G && d < s.R) { /* a query or key head's rotated dims */
                const int i = d < half ? d : d - half;
                val = rotate<false>(val, mt_get(row, d < half ? o + half : o - half), d, half,
                                    cos[p * half + i], sin[p * half + i]);
            }
            mt_put(qkv_home(q, k, v, s, n, g, j, d), 0, val);
        }
    }
}

/* Backward: dq, dk, dv (fp32) -> dqkv (fp32, or NULL) and dqkv_op (bf16,
 * or NULL). */
__global__ void qkv_join_kernel(float *dqkv, __nv_bfloat16 *dqkv_op, const float *dq,
                                const float *dk, const float *dv, const float *cos,
                                const float *sin, const int32_t *pos, qkv_shape s) {
    const int W = (s.NH + 2 * s.NKV) * s.HD, G = s.NH / s.NKV, half = s.R / 2;
    for (size_t n = blockIdx.x; n < s.N; n += gridDim.x) {
        const size_t p = pos ? (size_t)pos[n] : n % s.T;
        for (int o = threadIdx.x; o < W; o += blockDim.x) {
            const int slot = o / s.HD, d = o - slot * s.HD;
            const int g = slot / (G + 2), j = slot - g * (G + 2);
            const float *src = qkv_home(dq, dk, dv, s, n, g, j, d);
            float val = src[0];
            if (j <= G && d < s.R) {
                const int i = d < half ? d : d - half;
                val = rotate<true>(val, src[d < half ? half : -half], d, half, cos[p * half + i],
                                   sin[p * half + i]);
            }
            const size_t at = n * (size_t)W + o;
            if (dqkv) dqkv[at] = val;
            if (dqkv_op) dqkv_op[at] = __float2bfloat16_rn(val);
        }
    }
}

static qkv_shape make_shape(size_t B, size_t T, size_t NH, size_t NKV, size_t HD, size_t R) {
    MT_ASSERT(NKV > 0 && NH % NKV == 0 && R % 2 == 0 && R <= HD);
    MT_ASSERT((NH + 2 * NKV) * HD < (size_t)1 << 31); /* a row's offsets are int */
    return qkv_shape{B * T, T, (int)NH, (int)NKV, (int)HD, (int)R};
}

/* Blocks of the row kernels: one per row, at most 2^20 (grid-stride). */
static unsigned row_blocks(size_t N) { return (unsigned)(N < ((size_t)1 << 20) ? N : (size_t)1 << 20); }

template <typename IN>
static void split_launch(cudaStream_t st, void *q, void *k, void *v, mt_dt out_dt, const IN *qkv,
                         const float *cos, const float *sin, const int32_t *pos, qkv_shape s) {
    if (out_dt == MT_DT_BF16)
        qkv_split_kernel<IN, __nv_bfloat16><<<row_blocks(s.N), NEOX_THREADS, 0, st>>>(
            (__nv_bfloat16 *)q, (__nv_bfloat16 *)k, (__nv_bfloat16 *)v, qkv, cos, sin, pos, s);
    else
        qkv_split_kernel<IN, float><<<row_blocks(s.N), NEOX_THREADS, 0, st>>>(
            (float *)q, (float *)k, (float *)v, qkv, cos, sin, pos, s);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_qkv_split_rope(mt_cuda_ctx *ctx, void *q, void *k, void *v, mt_dt out_dt,
                                       const void *qkv, mt_dt qkv_dt, const float *cos,
                                       const float *sin, const int32_t *pos, size_t B, size_t T,
                                       size_t NH, size_t NKV, size_t HD, size_t R) {
    qkv_shape s = make_shape(B, T, NH, NKV, HD, R);
    if (s.N == 0) return;
    if (qkv_dt == MT_DT_BF16)
        split_launch(ctx->stream, q, k, v, out_dt, (const __nv_bfloat16 *)qkv, cos, sin, pos, s);
    else
        split_launch(ctx->stream, q, k, v, out_dt, (const float *)qkv, cos, sin, pos, s);
}

extern "C" void mt_cuda_qkv_join_rope_backward(mt_cuda_ctx *ctx, float *dqkv, uint16_t *dqkv_op,
                                               const float *dq, const float *dk,
                                               const float *dv, const float *cos,
                                               const float *sin, const int32_t *pos, size_t B,
                                               size_t T, size_t NH, size_t NKV, size_t HD,
                                               size_t R) {
    qkv_shape s = make_shape(B, T, NH, NKV, HD, R);
    MT_ASSERT(dqkv || dqkv_op);
    if (s.N == 0) return;
    qkv_join_kernel<<<row_blocks(s.N), NEOX_THREADS, 0, ctx->stream>>>(
        dqkv, (__nv_bfloat16 *)dqkv_op, dq, dk, dv, cos, sin, pos, s);
    CUDA_LAUNCH_CHECK();
}
