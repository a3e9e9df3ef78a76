/* An fp32 or bf16 array's elements read and written as fp32 (bf16 rounded
 * to nearest even), one at i, or 4 consecutive ones at p (16-byte aligned
 * for fp32, 8-byte for bf16): the element-wise kernels that take either
 * type call these. */
#ifndef MT_KERNELS_OPS_ELEM_CUH
#define MT_KERNELS_OPS_ELEM_CUH

#include <cuda_bf16.h>
#include <stddef.h>

__device__ __forceinline__ float mt_get(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float mt_get(const __nv_bfloat16 *p, size_t i) {
    return __bfloat162float(p[i]);
}

__device__ __forceinline__ void mt_put(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void mt_put(__nv_bfloat16 *p, size_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float4 mt_get4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 mt_get4(const __nv_bfloat16 *p) {
    const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)p);
    const float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)(p + 2));
    return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ void mt_put4(float *p, float4 v) { *(float4 *)p = v; }
__device__ __forceinline__ void mt_put4(__nv_bfloat16 *p, float4 v) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(v.x, v.y);
    *(__nv_bfloat162 *)(p + 2) = __floats2bfloat162_rn(v.z, v.w);
}

#endif
