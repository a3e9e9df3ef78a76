/* Grouped expert products (moe_gemm.h), in their plainest form: one thread
 * per output element, summing in a fixed order in fp32. Correct for every
 * shape and deterministic, but far from the speed of a tiled tensor-core
 * kernel; it lets the MoE module (moe_cuda.h) run and be tested. */
#include <cuda_bf16.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/moe_gemm.h"

#define GEMM_THREADS 256

__device__ __forceinline__ float ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, size_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__nv_bfloat16 *p, size_t i, float v) {
    p[i] = __float2bfloat16_rn(v);
}

/* The expert owning grouped row r (start[e] <= r < start[e+1]), or -1 for
 * a row past start[E]. */
__device__ int expert_of(const int32_t *start, int E, size_t r) {
    if ((int64_t)r >= start[E]) return -1;
    int lo = 0, hi = E - 1; /* the last e with start[e] <= r */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (start[mid] <= (int64_t)r) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static unsigned grid_for(size_t n) {
    size_t b = MT_CEIL_DIV(n, (size_t)GEMM_THREADS);
    if (b > 65535 * 16) b = 65535 * 16;
    return (unsigned)(b ? b : 1);
}

/* y[r][o] = sum_i x[r][i] W_e[o][i] */
template <typename T, typename Y>
__global__ void fwd_kernel(Y *y, const T *x, const T *w, size_t w_stride, const int32_t *start,
                           int E, size_t R, size_t IC, size_t OC) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < R * OC; t += stride) {
        size_t r = t / OC, o = t % OC;
        int e = expert_of(start, E, r);
        if (e < 0) continue;
        const T *we = w + (size_t)e * w_stride + o * IC;
        float s = 0.0f;
        for (size_t i = 0; i < IC; i++) s += ld(x, r * IC + i) * ld(we, i);
        st(y, t, s);
    }
}

/* dx[r][i] (=|+=) sum_o dy[r][o] W_e[o][i] */
template <typename T>
__global__ void dinp_kernel(float *dx, bool acc, const T *dy, const T *w, size_t w_stride,
                            const int32_t *start, int E, size_t R, size_t IC, size_t OC) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < R * IC; t += stride) {
        size_t r = t / IC, i = t % IC;
        int e = expert_of(start, E, r);
        if (e < 0) continue;
        const T *we = w + (size_t)e * w_stride + i;
        float s = 0.0f;
        for (size_t o = 0; o < OC; o++) s += ld(dy, r * OC + o) * ld(we, o * IC);
        dx[t] = acc ? dx[t] + s : s;
    }
}

/* dW_e[o][i] += sum over e's rows r of dy[r][o] x[r][i], rows in order */
template <typename T>
__global__ void dw_kernel(float *dw, size_t dw_stride, const T *dy, const T *x,
                          const int32_t *start, int E, size_t IC, size_t OC) {
    size_t stride = (size_t)gridDim.x * blockDim.x, n = (size_t)E * OC * IC;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        size_t e = t / (OC * IC), o = (t / IC) % OC, i = t % IC;
        int r0 = start[e], r1 = start[e + 1];
        if (r0 == r1) continue;
        float s = 0.0f;
        for (int r = r0; r < r1; r++) s += ld(dy, (size_t)r * OC + o) * ld(x, (size_t)r * IC + i);
        dw[e * dw_stride + o * IC + i] += s;
    }
}

extern "C" size_t mt_cuda_moe_gemm_scratch_bytes(int E) { return 0; }

extern "C" void mt_cuda_moe_gemm_forward(mt_cuda_ctx *ctx, mt_precision prec, void *y, mt_dt y_dt,
                                         const void *x, const void *w, size_t w_stride,
                                         const int32_t *start, int E, size_t R, size_t IC,
                                         size_t OC, void *scratch) {
    if (!R || !OC) return;
    cudaStream_t s = ctx->stream;
    unsigned g = grid_for(R * OC);
    if (prec == MT_PREC_BF16) {
        const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x, *wb = (const __nv_bfloat16 *)w;
        if (y_dt == MT_DT_BF16)
            fwd_kernel<<<g, GEMM_THREADS, 0, s>>>((__nv_bfloat16 *)y, xb, wb, w_stride, start, E,
                                                  R, IC, OC);
        else
            fwd_kernel<<<g, GEMM_THREADS, 0, s>>>((float *)y, xb, wb, w_stride, start, E, R, IC,
                                                  OC);
    } else {
        MT_ASSERT(y_dt == MT_DT_F32);
        fwd_kernel<<<g, GEMM_THREADS, 0, s>>>((float *)y, (const float *)x, (const float *)w,
                                              w_stride, start, E, R, IC, OC);
    }
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_moe_gemm_dinp(mt_cuda_ctx *ctx, mt_precision prec, float *dx,
                                      bool accumulate, const void *dy, const void *w,
                                      size_t w_stride, const int32_t *start, int E, size_t R,
                                      size_t IC, size_t OC, void *scratch) {
    if (!R || !IC) return;
    unsigned g = grid_for(R * IC);
    if (prec == MT_PREC_BF16)
        dinp_kernel<<<g, GEMM_THREADS, 0, ctx->stream>>>(
            dx, accumulate, (const __nv_bfloat16 *)dy, (const __nv_bfloat16 *)w, w_stride, start,
            E, R, IC, OC);
    else
        dinp_kernel<<<g, GEMM_THREADS, 0, ctx->stream>>>(dx, accumulate, (const float *)dy,
                                                         (const float *)w, w_stride, start, E, R,
                                                         IC, OC);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_moe_gemm_dw(mt_cuda_ctx *ctx, mt_precision prec, float *dw,
                                    size_t dw_stride, const void *dy, const void *x,
                                    const int32_t *start, int E, size_t R, size_t IC, size_t OC,
                                    void *scratch) {
    size_t n = (size_t)E * OC * IC;
    if (!n) return;
    unsigned g = grid_for(n);
    if (prec == MT_PREC_BF16)
        dw_kernel<<<g, GEMM_THREADS, 0, ctx->stream>>>(dw, dw_stride, (const __nv_bfloat16 *)dy,
                                                       (const __nv_bfloat16 *)x, start, E, IC, OC);
    else
        dw_kernel<<<g, GEMM_THREADS, 0, ctx->stream>>>(dw, dw_stride, (const float *)dy,
                                                       (const float *)x, start, E, IC, OC);
    CUDA_LAUNCH_CHECK();
}
