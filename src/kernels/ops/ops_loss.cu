/* Cross-entropy on the GPU and the fused, chunked lm_head + loss.
 *
 * Cross-entropy: one block per row. Pass 1 keeps a running (max, sum of
 * exp) per thread and merges them in a fixed tree; pass 2 writes
 * (softmax - onehot) * dscale (or a scale per row: sequence objectives,
 * engine/preference.h), in place over the logits if asked. fp32
 * throughout; the loss of the whole batch is summed in double by one block
 * in a fixed order (mt_cuda_sum_to_double), so it is deterministic. Under
 * Gemma 2's final soft-cap the kernel reads each logit as
 * cap * tanh(x / cap) and multiplies its gradient by 1 - tanh^2.
 *
 * lm_head + loss: the logits of a micro-batch (N x V fp32: 8 GiB for 16k
 * tokens of a 128k vocabulary) never exist at once. R rows at a time: the
 * logits chunk comes from a matrix product into scratch, the loss kernel
 * turns it into dlogits in place, and two more products push dlogits back
 * into dhidden and dW before the next chunk reuses the scratch. */
#include <math.h>

#include <cuda_bf16.h>

#include "backend/cpu/ops.h" /* MT_IGNORE_INDEX */
#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"
#include "kernels/scratch_sizes.h"

#define CE_THREADS 512
#define CE_LOADS 4 /* loads in flight per thread in a row's passes */
#define SUM_THREADS 1024

/* Merges running softmax statistics (m, s): s = sum of exp(x - m). */
__device__ __forceinline__ void lse_merge(float *m, float *s, float m2, float s2) {
    float mm = fmaxf(*m, m2);
    if (mm == -INFINITY) return; /* both empty */
    *s = *s * expf(*m - mm) + s2 * expf(m2 - mm);
    *m = mm;
}

/* A logit as the loss reads it: softcap * tanh(x / softcap) under a
 * soft-cap (as backend_cpu.c computes it), else x itself. */
__device__ __forceinline__ float capped(float x, float softcap) {
    return softcap > 0.0f ? tanhf(x / softcap) * softcap : x;
}

/* f(i, x[i]) for the row's elements i = t, t + nt, t + 2 nt, ... of
 * thread t, in that order, with CE_LOADS loads issued before the first of
 * them is used: the memory system sees several rows' worth of requests per
 * thread, and each thread's arithmetic is the one-at-a-time loop's. f may
 * write x[i] (or a buffer it overlaps) for the i it is given. */
template <typename F>
__device__ __forceinline__ void for_each_in_row(const float *x, size_t V, F f) {
    const size_t nt = blockDim.x;
    size_t i = threadIdx.x;
    for (; i + (CE_LOADS - 1) * nt < V; i += CE_LOADS * nt) {
        float v[CE_LOADS];
#pragma unroll
        for (int u = 0; u < CE_LOADS; u++) v[u] = x[i + u * nt];
#pragma unroll
        for (int u = 0; u < CE_LOADS; u++) f(i + u * nt, v[u]);
    }
    for (; i < V; i += nt) f(i, x[i]);
}

/* Under a soft-cap the first pass stores tanh(x / softcap) in place of x
 * (the logits are the head's scratch), and the second reads it back for
 * both the capped logit and the cap's derivative: one tanh and one
 * division per logit instead of three each, the same values. */
__global__ void cross_entropy_kernel(float *dlogits, __nv_bfloat16 *dlogits_bf16,
                                     float *row_loss, float *logits,
                                     const int32_t *targets, const float *row_scale, size_t V,
                                     float dscale, float softcap) {
    __shared__ float sm_m[CE_THREADS / 32], sm_s[CE_THREADS / 32];
    __shared__ float sh_lse;
    size_t row = blockIdx.x;
    float *x = logits + row * V;
    int32_t tgt = targets[row];
    bool ignored = tgt == MT_IGNORE_INDEX, invalid = !ignored && (tgt < 0 || (size_t)tgt >= V);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (ignored || invalid) {
        if (threadIdx.x == 0) row_loss[row] = ignored ? 0.0f : NAN;
        for (size_t i = threadIdx.x; i < V; i += blockDim.x) {
            if (dlogits) dlogits[row * V + i] = 0.0f;
            if (dlogits_bf16) dlogits_bf16[row * V + i] = __float2bfloat16_rn(0.0f);
        }
        return;
    }
    float x_tgt = capped(x[tgt], softcap); /* read before any in-place write below */
    if (softcap > 0.0f) __syncthreads();
    float m = -INFINITY, s = 0.0f;
    for_each_in_row(x, V, [&](size_t i, float v) {
        if (softcap > 0.0f) {
            float t = tanhf(v / softcap);
            x[i] = t;
            v = __fmul_rn(t, softcap); /* rounded, as capped() gives it */
        }
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    });
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(&m, &s, m2, s2);
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_s[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mm = sm_m[0], ss = sm_s[0];
        for (int w = 1; w < CE_THREADS / 32; w++) lse_merge(&mm, &ss, sm_m[w], sm_s[w]);
        sh_lse = mm + logf(ss);
        row_loss[row] = sh_lse - x_tgt;
    }
    __syncthreads();
    float lse = sh_lse;
    if (!dlogits && !dlogits_bf16) return;
    if (row_scale) dscale = row_scale[row];
    for_each_in_row(x, V, [&](size_t i, float t) {
        /* through the cap: d capped / d x = 1 - tanh^2, tanh as stored above */
        float v = softcap > 0.0f ? __fmul_rn(t, softcap) : t; /* never fused with - lse */
        float d = (expf(v - lse) - (i == (size_t)tgt ? 1.0f : 0.0f)) * dscale;
        if (softcap > 0.0f) d *= 1.0f - t * t;
        if (dlogits) dlogits[row * V + i] = d;
        if (dlogits_bf16) dlogits_bf16[row * V + i] = __float2bfloat16_rn(d);
    });
}

static void cross_entropy(mt_cuda_ctx *ctx, float *dlogits, uint16_t *dlogits_bf16,
                          float *row_loss, float *logits, const int32_t *targets,
                          const float *row_scale, size_t N, size_t V, float dscale,
                          float softcap) {
    if (N == 0) return;
    MT_ASSERT(N <= INT32_MAX && V > 0);
    cross_entropy_kernel<<<(unsigned)N, CE_THREADS, 0, ctx->stream>>>(
        dlogits, (__nv_bfloat16 *)dlogits_bf16, row_loss, logits, targets, row_scale, V,
        dscale, softcap);
    CUDA_LAUNCH_CHECK();
}

extern "C" void mt_cuda_cross_entropy(mt_cuda_ctx *ctx, float *dlogits, uint16_t *dlogits_bf16,
                                      float *row_loss, const float *logits,
                                      const int32_t *targets, size_t N, size_t V,
                                      float dscale) {
    /* no soft-cap: the kernel only reads the logits */
    cross_entropy(ctx, dlogits, dlogits_bf16, row_loss, (float *)logits, targets, NULL, N, V,
                  dscale, 0.0f);
}

extern "C" void mt_cuda_cross_entropy_weighted(mt_cuda_ctx *ctx, float *dlogits,
                                               uint16_t *dlogits_bf16, float *row_loss,
                                               const float *logits, const int32_t *targets,
                                               const float *row_scale, size_t N, size_t V) {
    /* no soft-cap: the kernel only reads the logits */
    cross_entropy(ctx, dlogits, dlogits_bf16, row_loss, (float *)logits, targets, row_scale, N,
                  V, 0.0f, 0.0f);
}

/* One block: strided double partial sums, then a fixed shared-memory tree. */
__global__ void sum_to_double_kernel(double *sum, const float *x, size_t n) {
    __shared__ double part[SUM_THREADS];
    double t = 0.0;
    for (size_t i = threadIdx.x; i < n; i += SUM_THREADS) t += (double)x[i];
    part[threadIdx.x] = t;
    __syncthreads();
    for (int h = SUM_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) *sum += part[0];
}

extern "C" void mt_cuda_sum_to_double(mt_cuda_ctx *ctx, double *sum, const float *x, size_t n) {
    sum_to_double_kernel<<<1, SUM_THREADS, 0, ctx->stream>>>(sum, x, n);
    CUDA_LAUNCH_CHECK();
}

/* Both lm_head losses: a gradient scale per row (row_scale) or dscale;
 * loss_sum may be NULL; softcap 0: none. */
static void lm_head_loss(mt_cuda_ctx *ctx, mt_precision prec, double *loss_sum, float *row_loss,
                         float *dhidden, bool dhidden_accumulate, float *dw, void *scratch,
                         const void *hidden, const void *w, const int32_t *targets,
                         const float *row_scale, size_t N, size_t C, size_t V, size_t R,
                         float dscale, float softcap) {
    MT_ASSERT(R > 0);
    bool bf16 = prec == MT_PREC_BF16, grad = dhidden || dw;
    size_t esize = bf16 ? 2 : 4;
    float *logits = (float *)scratch;                                       // (R, V)
    uint16_t *dl16 =
        bf16 ? (uint16_t *)((char *)scratch + mt_lm_head_logits_bytes(R, V)) : NULL; // (R, V)
    /* The products read dlogits with the operand type of prec. */
    const void *dlogits = bf16 ? (const void *)dl16 : (const void *)logits;
    for (size_t r0 = 0; r0 < N; r0 += R) {
        size_t rows = N - r0 < R ? N - r0 : R;
        const void *hid = (const char *)hidden + r0 * C * esize; // (rows, C)
        mt_cuda_matmul_forward(ctx, prec, logits, MT_DT_F32, hid, w, NULL, rows, C, V);
        cross_entropy(ctx, grad && !bf16 ? logits : NULL, grad ? dl16 : NULL, row_loss + r0,
                      logits, targets + r0, row_scale ? row_scale + r0 : NULL, rows, V, dscale,
                      softcap);
        if (grad)
            mt_cuda_matmul_backward(ctx, prec, dhidden ? dhidden + r0 * C : NULL,
                                    dhidden_accumulate, dw, dlogits, hid, w, rows, C, V);
    }
    if (loss_sum) mt_cuda_sum_to_double(ctx, loss_sum, row_loss, N);
}

extern "C" void mt_cuda_lm_head_loss(mt_cuda_ctx *ctx, mt_precision prec, double *loss_sum,
                                     float *row_loss, float *dhidden, bool dhidden_accumulate,
                                     float *dw, void *scratch, const void *hidden,
                                     const void *w, const int32_t *targets, size_t N, size_t C,
                                     size_t V, size_t R, float dscale, float softcap) {
    lm_head_loss(ctx, prec, loss_sum, row_loss, dhidden, dhidden_accumulate, dw, scratch, hidden,
                 w, targets, NULL, N, C, V, R, dscale, softcap);
}

extern "C" void mt_cuda_lm_head_loss_weighted(mt_cuda_ctx *ctx, mt_precision prec,
                                              float *row_loss, float *dhidden,
                                              bool dhidden_accumulate, float *dw, void *scratch,
                                              const void *hidden, const void *w,
                                              const int32_t *targets, const float *row_scale,
                                              size_t N, size_t C, size_t V, size_t R,
                                              float softcap) {
    lm_head_loss(ctx, prec, NULL, row_loss, dhidden, dhidden_accumulate, dw, scratch, hidden, w,
                 targets, row_scale, N, C, V, R, 0.0f, softcap);
}
