/* RMSNorm and LayerNorm on the GPU, and the deterministic column sums that
 * their weight gradients and the bias gradient of a matrix product need.
 *
 * Norms: one warp per row, 16-byte loads (C % 4 == 0), fp32 arithmetic
 * throughout (a post-norm's input may be bf16, widened exactly), the sum
 * of squares reduced with xor shuffles (same order every run). For
 * fp32 rows with C % 512 == 0 (hidden sizes 2048..8192, 3584 too) a block
 * of C/16 threads keeps each row in registers, so the forward reads x once
 * and the backward does the update, its bf16 copy and the weight
 * gradient's partial sums in one pass.
 *
 * Column sums (dw (C) += sum over N rows): float atomics would make the
 * result depend on scheduling, so the rows are cut into fixed chunks of
 * COLSUM_ROWS; one kernel writes each chunk's partial sums to scratch
 * (G, C), a second adds the G partials in chunk order. The reduction tree
 * depends only on N and C: the same bits on every run and every GPU. */
#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"
#include "kernels/ops/elem.cuh"
#include "kernels/scratch_sizes.h"

#define NORM_WARPS 8    /* rows per block of the norm kernels */
#define COLSUM_ROWS MT_COLSUM_ROWS /* rows per partial sum (scratch_sizes.h) */
#define COLSUM_TY 8     /* row lanes per column in the partial kernel */
/* The fused backward: a block of C/16 threads (C <= 8192), 4 float4 of a
 * row each, walks FUSED_ROWS rows (N/64 blocks: 256 at 16k tokens). */
#define FUSED_V 4
#define FUSED_ROWS MT_FUSED_ROWS

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The sum of v over the block in a fixed order (xor shuffles within each
 * warp, then the warps in order), returned to every thread; red: 32 floats
 * of shared memory, free again on return. */
__device__ __forceinline__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float tot = 0.0f;
    for (unsigned i = 0; i < blockDim.x / 32; i++) tot += red[i];
    __syncthreads();
    return tot;
}

/* v * r * w, one element of a normed row (the product before any add). */
__device__ __forceinline__ float4 normed4(float4 v, float r, float4 w) {
    return make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
}

template <typename IN, typename OUT>
__global__ void rmsnorm_fwd_kernel(OUT *out, float *rstd, const IN *inp, const float *w,
                                   size_t N, size_t C, float eps) {
    size_t row = (size_t)blockIdx.x * NORM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const IN *x = inp + row * C;
    float ss = 0.0f;
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        float4 v = mt_get4(x + i);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    float r = rsqrtf(warp_sum(ss) / (float)C + eps);
    for (size_t i = (size_t)lane * 4; out && i < C; i += 128)
        mt_put4(out + row * C + i, normed4(mt_get4(x + i), r, *(const float4 *)(w + i)));
    if (rstd && lane == 0) rstd[row] = r;
}

/* The same for fp32 input and C % 512 == 0, C <= 8192, in one pass: a
 * block of C/16 threads holds a row's x in registers (4 float4 each, thread
 * t's at t + k * nt) and walks FWD_ROWS rows; the sum of squares is reduced
 * in a fixed order (xor shuffles, then the warps in order). */
#define FWD_ROWS 16

template <typename T>
__device__ __forceinline__ void load_row(float4 (&v)[FUSED_V], const T *row) {
#pragma unroll
    for (int k = 0; k < FUSED_V; k++)
        v[k] = mt_get4(row + (size_t)(threadIdx.x + k * blockDim.x) * 4);
}

/* The next row's values, loaded while the block reduces the current one,
 * become the current (the row kernels below keep two rows in flight). */
__device__ __forceinline__ void take_row(float4 (&v)[FUSED_V], const float4 (&next)[FUSED_V]) {
#pragma unroll
    for (int k = 0; k < FUSED_V; k++) v[k] = next[k];
}

template <typename OUT>
__device__ __forceinline__ void store_row(OUT *row, const float4 (&v)[FUSED_V]) {
#pragma unroll
    for (int k = 0; k < FUSED_V; k++) mt_put4(row + (size_t)(threadIdx.x + k * blockDim.x) * 4, v[k]);
}

/* 1 / rms of the block's row xv, the same in every thread. */
__device__ __forceinline__ float row_rstd(const float4 (&xv)[FUSED_V], float *red, size_t C,
                                          float eps) {
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < FUSED_V; k++)
        ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
    return rsqrtf(block_sum(ss, red) / (float)C + eps);
}

/* out NULL: rstd only. */
template <typename OUT>
__global__ void __launch_bounds__(512)
    rmsnorm_fwd_rows_kernel(OUT *out, float *rstd, const float *inp, const float *w, size_t N,
                            size_t C, float eps) {
    __shared__ float red[32];
    float4 wv[FUSED_V];
    load_row(wv, w);
    const size_t r0 = (size_t)blockIdx.x * FWD_ROWS;
    const size_t r1 = r0 + FWD_ROWS < N ? r0 + FWD_ROWS : N;
    float4 xv[FUSED_V], xn[FUSED_V];
    if (r0 < r1) load_row(xv, inp + r0 * C);
    for (size_t row = r0; row < r1; row++) {
        if (row + 1 < r1) load_row(xn, inp + (row + 1) * C);
        const float r = row_rstd(xv, red, C, eps);
        if (out) {
#pragma unroll
            for (int k = 0; k < FUSED_V; k++) xv[k] = normed4(xv[k], r, wv[k]);
            store_row(out + row * C, xv);
        }
        if (rstd && threadIdx.x == 0) rstd[row] = r;
        take_row(xv, xn);
    }
}

/* out's row = res + x * r * w, and with next that sum's norm by next_w. */
template <typename NEXT>
__device__ __forceinline__ void residual_row(float *out, NEXT *next, float *next_rstd,
                                             const float4 (&xv)[FUSED_V],
                                             const float4 (&rv)[FUSED_V],
                                             const float4 (&wv)[FUSED_V],
                                             const float4 (&nw)[FUSED_V], float r, float *red,
                                             size_t row, size_t C, float eps) {
    float4 sv[FUSED_V];
#pragma unroll
    for (int k = 0; k < FUSED_V; k++) {
        const float4 y = normed4(xv[k], r, wv[k]);
        sv[k] = make_float4(__fadd_rn(y.x, rv[k].x), __fadd_rn(y.y, rv[k].y),
                            __fadd_rn(y.z, rv[k].z), __fadd_rn(y.w, rv[k].w));
    }
    store_row(out + row * C, sv);
    if (!next) return;
    const float r2 = row_rstd(sv, red, C, eps);
#pragma unroll
    for (int k = 0; k < FUSED_V; k++) sv[k] = normed4(sv[k], r2, nw[k]);
    store_row(next + row * C, sv);
    if (next_rstd && threadIdx.x == 0) next_rstd[row] = r2;
}

/* A post-norm and its residual, out = res + inp * rstd * w (fp32; inp fp32
 * or bf16), and with next the norm of that sum, next = out * rstd' *
 * next_w: one read of each row. The values are the plain kernels' (the
 * same sums in the same order, the add kept apart from the product). out
 * NULL: rstd only. */
template <typename NEXT, typename IN>
__global__ void __launch_bounds__(512)
    rmsnorm_residual_rows_kernel(float *out, float *rstd, const IN *inp, const float *w,
                                 const float *res, NEXT *next, float *next_rstd,
                                 const float *next_w, size_t N, size_t C, float eps) {
    __shared__ float red[32];
    float4 wv[FUSED_V], nw[FUSED_V];
    load_row(wv, w);
    if (next) load_row(nw, next_w);
    const size_t r0 = (size_t)blockIdx.x * FWD_ROWS;
    const size_t r1 = r0 + FWD_ROWS < N ? r0 + FWD_ROWS : N;
    float4 xv[FUSED_V], rv[FUSED_V], xn[FUSED_V], rn[FUSED_V];
    if (r0 < r1) {
        load_row(xv, inp + r0 * C);
        if (out) load_row(rv, res + r0 * C);
    }
    for (size_t row = r0; row < r1; row++) {
        if (row + 1 < r1) {
            load_row(xn, inp + (row + 1) * C);
            if (out) load_row(rn, res + (row + 1) * C);
        }
        const float r = row_rstd(xv, red, C, eps);
        if (rstd && threadIdx.x == 0) rstd[row] = r;
        if (out) residual_row(out, next, next_rstd, xv, rv, wv, nw, r, red, row, C, eps);
        take_row(xv, xn);
        take_row(rv, rn);
    }
}

static bool one_pass_rows(size_t C) { return C % (16 * 32) == 0 && C / 16 <= 512; }

static void check_rows(const void *p, size_t C) {
    MT_ASSERT(C % 4 == 0);
    MT_ASSERT(((uintptr_t)p & 15) == 0);
}

/* The warp-a-row kernel of IN rows into OUT rows. */
template <typename IN, typename OUT>
static void rmsnorm_warps(mt_cuda_ctx *ctx, void *out, float *rstd, const void *inp,
                          const float *w, size_t N, size_t C, float eps) {
    unsigned g = (unsigned)MT_CEIL_DIV(N, (size_t)NORM_WARPS);
    rmsnorm_fwd_kernel<IN, OUT><<<g, NORM_WARPS * 32, 0, ctx->stream>>>(
        (OUT *)out, rstd, (const IN *)inp, w, N, C, eps);
    CUDA_LAUNCH_CHECK();
}

/* Any C, inp of type in_dt, out of type out_dt. */
static void rmsnorm_plain(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, float *rstd,
                          const void *inp, mt_dt in_dt, const float *w, size_t N, size_t C,
                          float eps) {
    bool out16 = out_dt == MT_DT_BF16;
    if (in_dt == MT_DT_BF16 && out16)
        rmsnorm_warps<__nv_bfloat16, __nv_bfloat16>(ctx, out, rstd, inp, w, N, C, eps);
    else if (in_dt == MT_DT_BF16)
        rmsnorm_warps<__nv_bfloat16, float>(ctx, out, rstd, inp, w, N, C, eps);
    else if (out16)
        rmsnorm_warps<float, __nv_bfloat16>(ctx, out, rstd, inp, w, N, C, eps);
    else
        rmsnorm_warps<float, float>(ctx, out, rstd, inp, w, N, C, eps);
}

extern "C" void mt_cuda_rmsnorm_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt,
                                        float *rstd, const float *inp, const float *w,
                                        size_t N, size_t C, float eps) {
    if (N == 0) return;
    check_rows(inp, C);
    check_rows(w, C);
    check_rows(out, C);
    if (one_pass_rows(C)) {
        const unsigned g = (unsigned)MT_CEIL_DIV(N, (size_t)FWD_ROWS), nt = (unsigned)(C / 16);
        if (out_dt == MT_DT_BF16)
            rmsnorm_fwd_rows_kernel<__nv_bfloat16><<<g, nt, 0, ctx->stream>>>(
                (__nv_bfloat16 *)out, rstd, inp, w, N, C, eps);
        else
            rmsnorm_fwd_rows_kernel<float><<<g, nt, 0, ctx->stream>>>((float *)out, rstd, inp, w,
                                                                      N, C, eps);
        CUDA_LAUNCH_CHECK();
        return;
    }
    rmsnorm_plain(ctx, out, out_dt, rstd, inp, MT_DT_F32, w, N, C, eps);
}

extern "C" void mt_cuda_rmsnorm_forward_bf16(mt_cuda_ctx *ctx, uint16_t *out, float *rstd,
                                             const uint16_t *inp, const float *w, size_t N,
                                             size_t C, float eps) {
    if (N == 0) return;
    check_rows(inp, C);
    check_rows(w, C);
    check_rows(out, C);
    rmsnorm_plain(ctx, out, MT_DT_BF16, rstd, inp, MT_DT_BF16, w, N, C, eps);
}

/* The one-pass kernel of IN rows. */
template <typename IN>
static void residual_rows(mt_cuda_ctx *ctx, float *out, float *rstd, const void *inp,
                          const float *w, const float *res, void *next, mt_dt next_dt,
                          float *next_rstd, const float *next_w, size_t N, size_t C, float eps) {
    const unsigned g = (unsigned)MT_CEIL_DIV(N, (size_t)FWD_ROWS), nt = (unsigned)(C / 16);
    if (next_dt == MT_DT_BF16 && next)
        rmsnorm_residual_rows_kernel<__nv_bfloat16, IN><<<g, nt, 0, ctx->stream>>>(
            out, rstd, (const IN *)inp, w, res, (__nv_bfloat16 *)next, next_rstd, next_w, N, C,
            eps);
    else
        rmsnorm_residual_rows_kernel<float, IN><<<g, nt, 0, ctx->stream>>>(
            out, rstd, (const IN *)inp, w, res, (float *)next, next_rstd, next_w, N, C, eps);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_rmsnorm_residual_forward(mt_cuda_ctx *ctx, float *out, float *rstd,
                                                 const void *inp, mt_dt in_dt, const float *w,
                                                 const float *res, void *next, mt_dt next_dt,
                                                 float *next_rstd, const float *next_w,
                                                 size_t N, size_t C, float eps) {
    MT_ASSERT(out || !next);
    if (N == 0) return;
    check_rows(inp, C);
    check_rows(w, C);
    check_rows(out, C);
    if (!one_pass_rows(C)) { /* the plain kernels, one pass each */
        rmsnorm_plain(ctx, out, MT_DT_F32, rstd, inp, in_dt, w, N, C, eps);
        if (out) mt_cuda_residual_add(ctx, out, out, res, N * C);
        if (next) mt_cuda_rmsnorm_forward(ctx, next, next_dt, next_rstd, out, next_w, N, C, eps);
        return;
    }
    if (out) check_rows(res, C);
    if (next) check_rows(next, C), check_rows(next_w, C);
    if (in_dt == MT_DT_BF16)
        residual_rows<__nv_bfloat16>(ctx, out, rstd, inp, w, res, next, next_dt, next_rstd,
                                     next_w, N, C, eps);
    else
        residual_rows<float>(ctx, out, rstd, inp, w, res, next, next_dt, next_rstd, next_w, N, C,
                             eps);
}

/* One float4 of a row's input gradient, r w_i g_i - x_i kk with
 * kk = r^3 / C * sum_j g_j w_j x_j. */
__device__ __forceinline__ float4 rms_dx4(float r, float4 w, float4 g, float4 x, float kk) {
    return make_float4(r * w.x * g.x - x.x * kk, r * w.y * g.y - x.y * kk,
                       r * w.z * g.z - x.z * kk, r * w.w * g.w - x.w * kk);
}

/* d[at..] + t (ACC: the gradient adds to dinp's) or t. */
template <bool ACC>
__device__ __forceinline__ float4 add_or_set(const float *d, size_t at, float4 t) {
    if (!ACC) return t;
    float4 dv = *(const float4 *)(d + at);
    return make_float4(dv.x + t.x, dv.y + t.y, dv.z + t.z, dv.w + t.w);
}

/* dinp_i (+)= r w_i g_i - x_i r^3 / C * sum_j g_j w_j x_j; ACC false: set,
 * dinp (NULL: not written) and its bf16 copy dinp_op (NULL: not written). */
template <bool ACC, typename IN>
__global__ void rmsnorm_bwd_kernel(float *dinp, __nv_bfloat16 *dinp_op, const float *dout,
                                   const IN *inp, const float *w, const float *rstd, size_t N,
                                   size_t C) {
    size_t row = (size_t)blockIdx.x * NORM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const IN *x = inp + row * C;
    const float *g = dout + row * C;
    float dot = 0.0f;
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        float4 xv = mt_get4(x + i), gv = *(const float4 *)(g + i),
               wv = *(const float4 *)(w + i);
        dot += gv.x * wv.x * xv.x + gv.y * wv.y * xv.y + gv.z * wv.z * xv.z +
               gv.w * wv.w * xv.w;
    }
    float r = rstd[row];
    float k = warp_sum(dot) * r * r * r / (float)C;
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        const size_t at = row * C + i;
        float4 dv = add_or_set<ACC>(dinp, at, rms_dx4(r, *(const float4 *)(w + i),
                                                       *(const float4 *)(g + i),
                                                       mt_get4(x + i), k));
        if (dinp) *(float4 *)(dinp + at) = dv;
        if (dinp_op) mt_put4(dinp_op + at, dv);
    }
}

/* The same update in one pass over the rows, for C % 512 == 0: a row's x
 * and dout stay in registers between the dot product and the update, the
 * bf16 copy of dinp (dinp_op, or NULL) is written beside it, and the weight
 * gradient's column sums of dout * x * rstd over the block's rows go to
 * partial (gridDim.x, C), to be summed in block order. The dot product is
 * reduced in a fixed order (xor shuffles, then the warps in order). */
template <bool ACC, typename IN>
__global__ void __launch_bounds__(512)
    rmsnorm_bwd_fused_kernel(float *dinp, __nv_bfloat16 *dinp_op, float *partial,
                             const float *dout, const IN *inp, const float *w,
                             const float *rstd, size_t N, size_t C) {
    __shared__ float red[32];
    const int t = threadIdx.x, nt = blockDim.x;
    float4 wv[FUSED_V], acc[FUSED_V];
#pragma unroll
    for (int k = 0; k < FUSED_V; k++) {
        wv[k] = *(const float4 *)(w + (size_t)(t + k * nt) * 4);
        acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const size_t r0 = (size_t)blockIdx.x * FUSED_ROWS;
    const size_t r1 = r0 + FUSED_ROWS < N ? r0 + FUSED_ROWS : N;
    /* the next row's x, dout (and with ACC the dinp it adds to) load while
     * this one is reduced */
    float4 xv[FUSED_V], gv[FUSED_V], av[FUSED_V], xn[FUSED_V], gn[FUSED_V], an[FUSED_V];
    if (r0 < r1) {
        load_row(xv, inp + r0 * C);
        load_row(gv, dout + r0 * C);
        if (ACC) load_row(av, dinp + r0 * C);
    }
    for (size_t row = r0; row < r1; row++) {
        if (row + 1 < r1) {
            load_row(xn, inp + (row + 1) * C);
            load_row(gn, dout + (row + 1) * C);
            if (ACC) load_row(an, dinp + (row + 1) * C);
        }
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < FUSED_V; k++)
            dot += gv[k].x * wv[k].x * xv[k].x + gv[k].y * wv[k].y * xv[k].y +
                   gv[k].z * wv[k].z * xv[k].z + gv[k].w * wv[k].w * xv[k].w;
        const float r = rstd[row], kk = block_sum(dot, red) * r * r * r / (float)C;
#pragma unroll
        for (int k = 0; k < FUSED_V; k++) {
            const size_t i = row * C + (size_t)(t + k * nt) * 4;
            const float4 d = rms_dx4(r, wv[k], gv[k], xv[k], kk);
            const float4 dv = ACC ? make_float4(av[k].x + d.x, av[k].y + d.y, av[k].z + d.z,
                                                av[k].w + d.w)
                                  : d;
            if (dinp) *(float4 *)(dinp + i) = dv;
            if (dinp_op) mt_put4(dinp_op + i, dv);
            acc[k].x += gv[k].x * (xv[k].x * r);
            acc[k].y += gv[k].y * (xv[k].y * r);
            acc[k].z += gv[k].z * (xv[k].z * r);
            acc[k].w += gv[k].w * (xv[k].w * r);
        }
        take_row(xv, xn);
        take_row(gv, gn);
        if (ACC) take_row(av, an);
    }
#pragma unroll
    for (int k = 0; k < FUSED_V; k++)
        *(float4 *)(partial + blockIdx.x * C + (size_t)(t + k * nt) * 4) = acc[k];
}

/* partial (G, C): partial[chunk][c] = sum over the chunk's rows of
 * a[r][c] (* (b[r][c] - m[r]) * s[r] when b is non-NULL; m NULL: 0, which
 * leaves b's value unchanged). Block (32, COLSUM_TY):
 * 32 consecutive columns (coalesced), COLSUM_TY interleaved row lanes
 * combined in a fixed order through shared memory. */
template <typename B>
__global__ void colsum_partial_kernel(float *partial, const float *a, const B *b,
                                      const float *m, const float *s, size_t N, size_t C) {
    __shared__ float acc[COLSUM_TY][33];
    size_t c = (size_t)blockIdx.x * 32 + threadIdx.x;
    size_t r0 = (size_t)blockIdx.y * COLSUM_ROWS;
    size_t r1 = r0 + COLSUM_ROWS < N ? r0 + COLSUM_ROWS : N;
    float sum = 0.0f;
    if (c < C) {
        for (size_t r = r0 + threadIdx.y; r < r1; r += COLSUM_TY) {
            float v = a[r * C + c];
            if (b) v *= (mt_get(b, r * C + c) - (m ? m[r] : 0.0f)) * s[r];
            sum += v;
        }
    }
    acc[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int y = 0; y < COLSUM_TY; y++) t += acc[y][threadIdx.x];
        partial[(size_t)blockIdx.y * C + c] = t;
    }
}

__global__ void colsum_final_kernel(float *out, const float *partial, size_t G, size_t C) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t = 0.0f;
    for (size_t g = 0; g < G; g++) t += partial[g * C + c];
    out[c] += t;
}

/* out (C) += column sums of a (N,C), or of a * (b - m[row]) * s[row] when
 * b != NULL (m NULL: a * b * s[row]). */
template <typename B>
static void colsum(mt_cuda_ctx *ctx, float *out, float *scratch, const float *a,
                   const B *b, const float *m, const float *s, size_t N, size_t C) {
    if (N == 0 || C == 0) return;
    size_t G = MT_CEIL_DIV(N, (size_t)COLSUM_ROWS);
    MT_ASSERT(G <= 65535);
    dim3 grid((unsigned)MT_CEIL_DIV(C, (size_t)32), (unsigned)G), block(32, COLSUM_TY);
    colsum_partial_kernel<B><<<grid, block, 0, ctx->stream>>>(scratch, a, b, m, s, N, C);
    CUDA_LAUNCH_CHECK();
    colsum_final_kernel<<<(unsigned)MT_CEIL_DIV(C, (size_t)256), 256, 0, ctx->stream>>>(
        out, scratch, G, C);
    CUDA_LAUNCH_CHECK();
}

/* The backward of either kind (ACC: dinp +=, else dinp, dinp_op set), of
 * IN rows. */
template <bool ACC, typename IN>
static void rmsnorm_backward(mt_cuda_ctx *ctx, float *dinp, void *dinp_op, float *dw,
                             float *scratch, const float *dout, const IN *inp, const float *w,
                             const float *rstd, size_t N, size_t C) {
    if (N == 0) return;
    if (dinp) check_rows(dinp, C);
    check_rows(dout, C);
    check_rows(inp, C);
    check_rows(w, C);
    if (dinp_op) check_rows(dinp_op, C);
    if (one_pass_rows(C)) {
        const size_t G = MT_CEIL_DIV(N, (size_t)FUSED_ROWS);
        rmsnorm_bwd_fused_kernel<ACC, IN><<<(unsigned)G, (unsigned)(C / 16), 0, ctx->stream>>>(
            dinp, (__nv_bfloat16 *)dinp_op, scratch, dout, inp, w, rstd, N, C);
        CUDA_LAUNCH_CHECK();
        colsum<float>(ctx, dw, scratch + G * C, scratch, NULL, NULL, NULL, G, C);
        return;
    }
    unsigned g = (unsigned)MT_CEIL_DIV(N, (size_t)NORM_WARPS);
    rmsnorm_bwd_kernel<ACC, IN><<<g, NORM_WARPS * 32, 0, ctx->stream>>>(
        dinp, (__nv_bfloat16 *)dinp_op, dout, inp, w, rstd, N, C);
    CUDA_LAUNCH_CHECK();
    colsum(ctx, dw, scratch, dout, inp, NULL, rstd, N, C);
}

extern "C" void mt_cuda_rmsnorm_backward_op(mt_cuda_ctx *ctx, float *dinp, void *dinp_op,
                                            float *dw, float *scratch, const float *dout,
                                            const float *inp, const float *w, const float *rstd,
                                            size_t N, size_t C) {
    MT_ASSERT(dinp);
    rmsnorm_backward<true, float>(ctx, dinp, dinp_op, dw, scratch, dout, inp, w, rstd, N, C);
}

extern "C" void mt_cuda_rmsnorm_backward_to_bf16(mt_cuda_ctx *ctx, uint16_t *dinp_op, float *dw,
                                                 float *scratch, const float *dout,
                                                 const void *inp, mt_dt in_dt, const float *w,
                                                 const float *rstd, size_t N, size_t C) {
    MT_ASSERT(dinp_op);
    if (in_dt == MT_DT_BF16)
        rmsnorm_backward<false, __nv_bfloat16>(ctx, NULL, dinp_op, dw, scratch, dout,
                                               (const __nv_bfloat16 *)inp, w, rstd, N, C);
    else
        rmsnorm_backward<false, float>(ctx, NULL, dinp_op, dw, scratch, dout,
                                       (const float *)inp, w, rstd, N, C);
}

extern "C" void mt_cuda_rmsnorm_backward(mt_cuda_ctx *ctx, float *dinp, float *dw,
                                         float *scratch, const float *dout, const float *inp,
                                         const float *w, const float *rstd, size_t N,
                                         size_t C) {
    mt_cuda_rmsnorm_backward_op(ctx, dinp, NULL, dw, scratch, dout, inp, w, rstd, N, C);
}

extern "C" void mt_cuda_bias_backward(mt_cuda_ctx *ctx, float *dbias, float *scratch,
                                      const float *dout, size_t N, size_t OC) {
    colsum<float>(ctx, dbias, scratch, dout, NULL, NULL, NULL, N, OC);
}

/* ---- LayerNorm (gpt_neox, falcon) ----
 * One warp per row, as the plain RMSNorm kernels: the mean, then the
 * centred sum of squares in a second pass over the row (as the CPU
 * reference and torch do, never E[x^2] - mean^2), fp32 throughout. */

template <typename OUT>
__global__ void layernorm_fwd_kernel(OUT *out, float *mean, float *rstd, const float *inp,
                                     const float *w, const float *b, size_t N, size_t C,
                                     float eps) {
    size_t row = (size_t)blockIdx.x * NORM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return; /* the whole warp: a row is one warp's */
    const float *x = inp + row * C;
    float s = 0.0f;
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        float4 v = mt_get4(x + i);
        s += v.x + v.y + v.z + v.w;
    }
    const float m = warp_sum(s) / (float)C;
    float ss = 0.0f;
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        float4 v = mt_get4(x + i);
        float a0 = v.x - m, a1 = v.y - m, a2 = v.z - m, a3 = v.w - m;
        ss += a0 * a0 + a1 * a1 + a2 * a2 + a3 * a3;
    }
    const float r = rsqrtf(warp_sum(ss) / (float)C + eps);
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        float4 v = mt_get4(x + i), g = *(const float4 *)(w + i);
        float4 bb = b ? *(const float4 *)(b + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        mt_put4(out + row * C + i,
               make_float4((v.x - m) * r * g.x + bb.x, (v.y - m) * r * g.y + bb.y,
                           (v.z - m) * r * g.z + bb.z, (v.w - m) * r * g.w + bb.w));
    }
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

/* xh = (x - mean) * rstd, g = w * dout:
 * dinp += rstd * (g - mean(g) - xh * mean(g * xh)) */
__global__ void layernorm_bwd_kernel(float *dinp, const float *dout, const float *inp,
                                     const float *w, const float *mean, const float *rstd,
                                     size_t N, size_t C) {
    size_t row = (size_t)blockIdx.x * NORM_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const float *x = inp + row * C, *dy = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        float4 xv = *(const float4 *)(x + i), gv = *(const float4 *)(dy + i),
               wv = *(const float4 *)(w + i);
        float g0 = wv.x * gv.x, g1 = wv.y * gv.y, g2 = wv.z * gv.z, g3 = wv.w * gv.w;
        sg += g0 + g1 + g2 + g3;
        sgx += g0 * ((xv.x - m) * r) + g1 * ((xv.y - m) * r) + g2 * ((xv.z - m) * r) +
               g3 * ((xv.w - m) * r);
    }
    const float mg = warp_sum(sg) / (float)C, mgx = warp_sum(sgx) / (float)C;
    float *d = dinp + row * C;
    for (size_t i = (size_t)lane * 4; i < C; i += 128) {
        float4 xv = *(const float4 *)(x + i), gv = *(const float4 *)(dy + i),
               wv = *(const float4 *)(w + i), dv = *(float4 *)(d + i);
        dv.x += r * (wv.x * gv.x - mg - ((xv.x - m) * r) * mgx);
        dv.y += r * (wv.y * gv.y - mg - ((xv.y - m) * r) * mgx);
        dv.z += r * (wv.z * gv.z - mg - ((xv.z - m) * r) * mgx);
        dv.w += r * (wv.w * gv.w - mg - ((xv.w - m) * r) * mgx);
        *(float4 *)(d + i) = dv;
    }
}

extern "C" void mt_cuda_layernorm_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt,
                                          float *mean, float *rstd, const float *inp,
                                          const float *w, const float *b, size_t N, size_t C,
                                          float eps) {
    if (N == 0) return;
    check_rows(inp, C);
    check_rows(w, C);
    if (b) check_rows(b, C);
    check_rows(out, C);
    unsigned g = (unsigned)MT_CEIL_DIV(N, (size_t)NORM_WARPS);
    if (out_dt == MT_DT_BF16)
        layernorm_fwd_kernel<__nv_bfloat16><<<g, NORM_WARPS * 32, 0, ctx->stream>>>(
            (__nv_bfloat16 *)out, mean, rstd, inp, w, b, N, C, eps);
    else
        layernorm_fwd_kernel<float><<<g, NORM_WARPS * 32, 0, ctx->stream>>>(
            (float *)out, mean, rstd, inp, w, b, N, C, eps);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_layernorm_backward(mt_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                                           float *scratch, const float *dout, const float *inp,
                                           const float *w, const float *mean,
                                           const float *rstd, size_t N, size_t C) {
    if (N == 0) return;
    MT_ASSERT(mean != NULL && rstd != NULL);
    check_rows(dinp, C);
    check_rows(dout, C);
    check_rows(inp, C);
    check_rows(w, C);
    unsigned g = (unsigned)MT_CEIL_DIV(N, (size_t)NORM_WARPS);
    layernorm_bwd_kernel<<<g, NORM_WARPS * 32, 0, ctx->stream>>>(dinp, dout, inp, w, mean, rstd,
                                                                N, C);
    CUDA_LAUNCH_CHECK();
    /* dw += sum over rows of dout * xh, db += sum of dout (the scratch is
     * free again once the first sum's final kernel has run: same stream) */
    colsum(ctx, dw, scratch, dout, inp, mean, rstd, N, C);
    if (db) colsum<float>(ctx, db, scratch, dout, NULL, NULL, NULL, N, C);
}
