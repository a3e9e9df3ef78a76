// Fused bf16 operators of the fast bf16 path (see ops_fused.h). Memory
// bound: 8 bf16 (16 bytes) per thread and per load where shapes allow.
#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/ops/elem.cuh"
#include "kernels/ops/gelu.cuh"
#include "kernels/ops/ops_fused.h"

#define THREADS 256

static unsigned blocks_for(size_t work) {
    size_t b = MT_CEIL_DIV(work, (size_t)THREADS);
    if (b > 1048576) b = 1048576;
    return (unsigned)(b ? b : 1);
}

// One thread rotates 4 consecutive pairs (i..i+3, i+half..i+half+3) of one
// (b, t, h) row: two 8-byte loads and stores per half. half % 4 == 0. POS:
// positions of packed documents; false compiles the kernel without them.
// out_ld: elements from one token's heads to the next's in out (H * HD:
// dense, as in).
template <bool TO_BF16_FROM_F32, bool POS>
__global__ void rope_bf16_kernel(__nv_bfloat16 *out, const void *in, const float *cos,
                                 const float *sin, const int32_t *pos, size_t T, size_t H,
                                 size_t half, size_t n_quads, float sign, size_t out_ld) {
    size_t qph = half / 4;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < n_quads; q += stride) {
        size_t row = q / qph, i = (q % qph) * 4;
        size_t t = POS ? (size_t)pos[row / H] : (row / H) % T;
        float4 c = *(const float4 *)(cos + t * half + i);
        float4 s = *(const float4 *)(sin + t * half + i);
        float x1[4], x2[4];
        if (TO_BF16_FROM_F32) {
            const float *x = (const float *)in + row * 2 * half;
            float4 a = *(const float4 *)(x + i), b = *(const float4 *)(x + i + half);
            x1[0] = a.x; x1[1] = a.y; x1[2] = a.z; x1[3] = a.w;
            x2[0] = b.x; x2[1] = b.y; x2[2] = b.z; x2[3] = b.w;
        } else {
            const __nv_bfloat16 *x = (const __nv_bfloat16 *)in + row * 2 * half;
            __nv_bfloat162 a0 = *(const __nv_bfloat162 *)(x + i);
            __nv_bfloat162 a1 = *(const __nv_bfloat162 *)(x + i + 2);
            __nv_bfloat162 b0 = *(const __nv_bfloat162 *)(x + i + half);
            __nv_bfloat162 b1 = *(const __nv_bfloat162 *)(x + i + half + 2);
            float2 f;
            f = __bfloat1622float2(a0); x1[0] = f.x; x1[1] = f.y;
            f = __bfloat1622float2(a1); x1[2] = f.x; x1[3] = f.y;
            f = __bfloat1622float2(b0); x2[0] = f.x; x2[1] = f.y;
            f = __bfloat1622float2(b1); x2[2] = f.x; x2[3] = f.y;
        }
        float cc[4] = {c.x, c.y, c.z, c.w}, ss[4] = {sign * s.x, sign * s.y, sign * s.z, sign * s.w};
        float y1[4], y2[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            y1[k] = x1[k] * cc[k] - x2[k] * ss[k];
            y2[k] = x2[k] * cc[k] + x1[k] * ss[k];
        }
        __nv_bfloat16 *o = out + row / H * out_ld + row % H * 2 * half;
        *(__nv_bfloat162 *)(o + i) = __floats2bfloat162_rn(y1[0], y1[1]);
        *(__nv_bfloat162 *)(o + i + 2) = __floats2bfloat162_rn(y1[2], y1[3]);
        *(__nv_bfloat162 *)(o + i + half) = __floats2bfloat162_rn(y2[0], y2[1]);
        *(__nv_bfloat162 *)(o + i + half + 2) = __floats2bfloat162_rn(y2[2], y2[3]);
    }
}

extern "C" void mt_cuda_rope_forward_bf16(cudaStream_t s, uint16_t *x, const float *cos,
                                          const float *sin, const int32_t *pos, size_t B,
                                          size_t T, size_t H, size_t HD) {
    size_t half = HD / 2;
    MT_ASSERT(HD % 8 == 0);
    size_t n = B * T * H * half / 4;
    if (!n) return;
    auto kern = pos ? rope_bf16_kernel<false, true> : rope_bf16_kernel<false, false>;
    kern<<<blocks_for(n), THREADS, 0, s>>>((__nv_bfloat16 *)x, x, cos, sin, pos, T, H, half, n,
                                           1.0f, H * HD);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_rope_backward_to_bf16(cudaStream_t s, uint16_t *out, size_t out_ld,
                                              const float *dx, const float *cos,
                                              const float *sin, const int32_t *pos, size_t B,
                                              size_t T, size_t H, size_t HD) {
    size_t half = HD / 2;
    MT_ASSERT(HD % 8 == 0 && out_ld >= H * HD && out_ld % 2 == 0);
    size_t n = B * T * H * half / 4;
    if (!n) return;
    auto kern = pos ? rope_bf16_kernel<true, true> : rope_bf16_kernel<true, false>;
    kern<<<blocks_for(n), THREADS, 0, s>>>((__nv_bfloat16 *)out, dx, cos, sin, pos, T, H, half,
                                           n, -1.0f, out_ld);
    CUDA_LAUNCH_CHECK();
}

// One thread casts 8 consecutive floats of a row (cols % 8 == 0): two
// 16-byte loads, one 16-byte store (out_ld % 8 == 0, out 16-byte aligned).
__global__ void cast_rows_bf16_kernel(__nv_bfloat16 *out, size_t out_ld, const float *in,
                                      size_t cols, size_t n_oct) {
    size_t stride = (size_t)gridDim.x * blockDim.x, per_row = cols / 8;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < n_oct; q += stride) {
        size_t row = q / per_row, j = q % per_row * 8;
        const float4 a = *(const float4 *)(in + q * 8), b = *(const float4 *)(in + q * 8 + 4);
        uint4 o;
        __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
        o2[0] = __floats2bfloat162_rn(a.x, a.y);
        o2[1] = __floats2bfloat162_rn(a.z, a.w);
        o2[2] = __floats2bfloat162_rn(b.x, b.y);
        o2[3] = __floats2bfloat162_rn(b.z, b.w);
        *(uint4 *)(out + row * out_ld + j) = o;
    }
}

extern "C" void mt_cuda_cast_rows_to_bf16(cudaStream_t s, uint16_t *out, size_t out_ld,
                                          const float *in, size_t rows, size_t cols) {
    MT_ASSERT(cols % 8 == 0 && out_ld >= cols && out_ld % 8 == 0 && (uintptr_t)out % 16 == 0 &&
              (uintptr_t)in % 16 == 0);
    size_t n = rows * cols / 8;
    if (!n) return;
    cast_rows_bf16_kernel<<<blocks_for(n), THREADS, 0, s>>>((__nv_bfloat16 *)out, out_ld, in,
                                                            cols, n);
    CUDA_LAUNCH_CHECK();
}

__device__ __forceinline__ float sigmoid_f(float g) { return 1.0f / (1.0f + __expf(-g)); }

// The gated units act(gate) * up: each activation's forward and its
// gradients (dg, du) from the unit's output gradient d, in its own order of
// operations (the CPU reference's).
struct silu_unit {
    static __device__ __forceinline__ float fwd(float g, float u) { return g * sigmoid_f(g) * u; }
    static __device__ __forceinline__ void grad(float d, float g, float u, float *dg, float *du) {
        float s = sigmoid_f(g);
        *dg = d * u * s * (1.0f + g * (1.0f - s));
        *du = d * g * s;
    }
};

template <bool TANH>
struct gelu_unit {
    static __device__ __forceinline__ float fwd(float g, float u) { return gelu_f<TANH>(g) * u; }
    static __device__ __forceinline__ void grad(float d, float g, float u, float *dg, float *du) {
        *du = d * gelu_f<TANH>(g);
        *dg = (d * u) * gelu_grad_f<TANH>(g);
    }
};

// 8 elements per thread: one 16-byte load of gate and of up.
template <class UNIT>
__global__ void glu_fwd_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *gate,
                                    const __nv_bfloat16 *up, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (; i < n; i += stride) {
        if (i + 8 <= n) {
            uint4 gv = *(const uint4 *)(gate + i), uv = *(const uint4 *)(up + i);
            const __nv_bfloat162 *g2 = (const __nv_bfloat162 *)&gv, *u2 = (const __nv_bfloat162 *)&uv;
            uint4 ov;
            __nv_bfloat162 *o2 = (__nv_bfloat162 *)&ov;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float2 g = __bfloat1622float2(g2[k]), u = __bfloat1622float2(u2[k]);
                o2[k] = __floats2bfloat162_rn(UNIT::fwd(g.x, u.x), UNIT::fwd(g.y, u.y));
            }
            *(uint4 *)(out + i) = ov;
        } else {
            for (size_t j = i; j < n; j++)
                out[j] = __float2bfloat16_rn(
                    UNIT::fwd(__bfloat162float(gate[j]), __bfloat162float(up[j])));
        }
    }
}

/* 8 consecutive elements of an fp32 or bf16 array, 16-byte aligned at
 * d + i for bf16 (32 bytes apart for fp32). */
__device__ __forceinline__ void load8(float (&v)[8], const float *d) {
    const float4 a = *(const float4 *)d, b = *(const float4 *)(d + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(float (&v)[8], const __nv_bfloat16 *d) {
    const uint4 q = *(const uint4 *)d;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&q;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __bfloat1622float2(h[k]);
        v[2 * k] = f.x, v[2 * k + 1] = f.y;
    }
}

/* dout D: fp32 or bf16. */
template <class UNIT, typename D>
__global__ void glu_bwd_bf16_kernel(__nv_bfloat16 *dgate, __nv_bfloat16 *dup, const D *dout,
                                    const __nv_bfloat16 *gate, const __nv_bfloat16 *up,
                                    size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    size_t stride = (size_t)gridDim.x * blockDim.x * 8;
    for (; i < n; i += stride) {
        if (i + 8 <= n) {
            uint4 gv = *(const uint4 *)(gate + i), uv = *(const uint4 *)(up + i);
            float d[8];
            load8(d, dout + i);
            const __nv_bfloat162 *g2 = (const __nv_bfloat162 *)&gv, *u2 = (const __nv_bfloat162 *)&uv;
            uint4 dgv, duv;
            __nv_bfloat162 *dg2 = (__nv_bfloat162 *)&dgv, *du2 = (__nv_bfloat162 *)&duv;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float2 g = __bfloat1622float2(g2[k]), u = __bfloat1622float2(u2[k]);
                float a, b, c, e;
                UNIT::grad(d[2 * k], g.x, u.x, &a, &b);
                UNIT::grad(d[2 * k + 1], g.y, u.y, &c, &e);
                dg2[k] = __floats2bfloat162_rn(a, c);
                du2[k] = __floats2bfloat162_rn(b, e);
            }
            *(uint4 *)(dgate + i) = dgv;
            *(uint4 *)(dup + i) = duv;
        } else {
            for (size_t j = i; j < n; j++) {
                float a, b;
                UNIT::grad(mt_get(dout, j), __bfloat162float(gate[j]), __bfloat162float(up[j]),
                           &a, &b);
                dgate[j] = __float2bfloat16_rn(a);
                dup[j] = __float2bfloat16_rn(b);
            }
        }
    }
}

template <class UNIT>
static void glu_forward_bf16(cudaStream_t s, uint16_t *out, const uint16_t *gate,
                             const uint16_t *up, size_t n) {
    if (!n) return;
    MT_ASSERT(((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up) % 16 == 0);
    glu_fwd_bf16_kernel<UNIT><<<blocks_for(MT_CEIL_DIV(n, (size_t)8)), THREADS, 0, s>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)gate, (const __nv_bfloat16 *)up, n);
    CUDA_LAUNCH_CHECK();
}

/* dout fp32, or bf16 dout16 when dout is NULL. */
template <class UNIT>
static void glu_backward_bf16(cudaStream_t s, uint16_t *dgate, uint16_t *dup, const float *dout,
                              const uint16_t *dout16, const uint16_t *gate, const uint16_t *up,
                              size_t n) {
    if (!n) return;
    MT_ASSERT(((uintptr_t)dgate | (uintptr_t)dup | (uintptr_t)dout | (uintptr_t)dout16 |
               (uintptr_t)gate | (uintptr_t)up) % 16 == 0);
    MT_ASSERT(!dout != !dout16);
    __nv_bfloat16 *dg = (__nv_bfloat16 *)dgate, *du = (__nv_bfloat16 *)dup;
    const __nv_bfloat16 *g = (const __nv_bfloat16 *)gate, *u = (const __nv_bfloat16 *)up;
    const unsigned grid = blocks_for(MT_CEIL_DIV(n, (size_t)8));
    if (dout)
        glu_bwd_bf16_kernel<UNIT, float><<<grid, THREADS, 0, s>>>(dg, du, dout, g, u, n);
    else
        glu_bwd_bf16_kernel<UNIT, __nv_bfloat16><<<grid, THREADS, 0, s>>>(
            dg, du, (const __nv_bfloat16 *)dout16, g, u, n);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_swiglu_forward_bf16(cudaStream_t s, uint16_t *out, const uint16_t *gate,
                                            const uint16_t *up, size_t n) {
    glu_forward_bf16<silu_unit>(s, out, gate, up, n);
}

extern "C" void mt_cuda_swiglu_backward_bf16(cudaStream_t s, uint16_t *dgate, uint16_t *dup,
                                             const float *dout, const uint16_t *gate,
                                             const uint16_t *up, size_t n) {
    glu_backward_bf16<silu_unit>(s, dgate, dup, dout, NULL, gate, up, n);
}

extern "C" void mt_cuda_geglu_forward_bf16(cudaStream_t s, uint16_t *out, const uint16_t *gate,
                                           const uint16_t *up, size_t n, int tanh_form) {
    if (tanh_form) glu_forward_bf16<gelu_unit<true>>(s, out, gate, up, n);
    else glu_forward_bf16<gelu_unit<false>>(s, out, gate, up, n);
}

extern "C" void mt_cuda_geglu_backward_bf16(cudaStream_t s, uint16_t *dgate, uint16_t *dup,
                                            const float *dout, const uint16_t *dout16,
                                            const uint16_t *gate, const uint16_t *up, size_t n,
                                            int tanh_form) {
    if (tanh_form) glu_backward_bf16<gelu_unit<true>>(s, dgate, dup, dout, dout16, gate, up, n);
    else glu_backward_bf16<gelu_unit<false>>(s, dgate, dup, dout, dout16, gate, up, n);
}
