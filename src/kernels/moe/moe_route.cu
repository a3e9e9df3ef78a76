/* The kernels of the GPU MoE MLP around its matrix products (moe_route.h).
 *
 * Routing: one warp per token (softmax, then K rounds of a warp argmax
 * under the CPU's order: larger p first, equal p lower index first).
 * Grouping: the NK choices are cut in tiles of GROUP_TILE; one warp counts
 * each tile's choices per expert, one block turns the counts into every
 * (tile, expert)'s first grouped row, and one warp per tile places its
 * choices 32 at a time (__match_any_sync ranks equal experts in lane
 * order), so rows keep token order within an expert, as a stable sort.
 * Reductions are warp shuffles and fixed trees: no float atomics. */
#include <cuda_bf16.h>
#include <math.h>

#include "kernels/cuda_common.h"
#include "kernels/ops/elem.cuh"
#include "kernels/moe/moe_route.h"
#include "kernels/scratch_sizes.h"

#define FULL 0xffffffffu
#define TOKEN_WARPS 4 /* tokens per block of the per-token warp kernels */
#define GROUP_TILE MT_GROUP_TILE /* scratch_sizes.h */
#define GROUP_WARPS 4
#define EW_THREADS 256
#define CB_THREADS 128
#define COUNT_THREADS 256

static unsigned ew_blocks(size_t n) {
    size_t b = MT_CEIL_DIV(n, (size_t)EW_THREADS);
    if (b > 1048576) b = 1048576;
    return (unsigned)(b ? b : 1);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

/* Sum of v over the block (blockDim.x a multiple of 32), the same in every
 * thread; red holds blockDim.x / 32 floats. */
__device__ float block_sum(float v, float *red) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; w++) s += red[w];
    __syncthreads(); /* red is reused by the next call */
    return s;
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* ---- routing ---- */

/* Whether choice (ka, ea) comes before (kb, eb): larger key, then lower
 * expert; e = -1 is no choice and comes last. */
__device__ __forceinline__ bool before(float ka, int ea, float kb, int eb) {
    if (eb < 0) return ea >= 0;
    if (ea < 0) return false;
    return ka > kb || (ka == kb && ea < eb);
}

__global__ void route_kernel(float *p, int32_t *sel, float *wk, float *psel, size_t N, int E,
                             int K, bool norm_topk) {
    size_t n = (size_t)blockIdx.x * TOKEN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (n >= N) return; /* the whole warp: n is the warp's */
    float *r = p + n * E;
    float mx = -INFINITY; /* NaN logits are skipped, as the CPU's comparison does */
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, r[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
    double sum = 0.0;
    for (int e = lane; e < E; e += 32) {
        float v = expf(r[e] - mx);
        r[e] = v;
        sum += (double)v;
    }
    float inv = (float)(1.0 / warp_sum_d(sum));
    for (int e = lane; e < E; e += 32) r[e] *= inv;
    __syncwarp(); /* lane 0 reads the chosen p of every lane below */
    float pk = 0.0f, s = 0.0f;
    int pe = -1; /* the previous pick */
    for (int j = 0; j < K; j++) {
        float bk = 0.0f;
        int be = -1;
        for (int e = lane; e < E; e += 32) {
            float k = isnan(r[e]) ? -INFINITY : r[e];
            if (pe >= 0 && !before(pk, pe, k, e)) continue; /* only after the previous pick */
            if (before(k, e, bk, be)) bk = k, be = e;
        }
        for (int o = 16; o > 0; o >>= 1) { /* a total order: every lane ends with the same */
            float ok = __shfl_xor_sync(FULL, bk, o);
            int oe = __shfl_xor_sync(FULL, be, o);
            if (before(ok, oe, bk, be)) bk = ok, be = oe;
        }
        pk = bk, pe = be; /* be >= 0: K <= E distinct experts */
        if (lane == 0) {
            float v = r[be];
            sel[n * K + j] = be;
            wk[n * K + j] = v;
            s += v;
        }
    }
    if (lane == 0) {
        psel[n] = s;
        if (norm_topk)
            for (int j = 0; j < K; j++) wk[n * K + j] = wk[n * K + j] / s;
    }
}

extern "C" void mt_cuda_moe_route(cudaStream_t s, float *p, int32_t *sel, float *wk,
                                  float *psel, size_t N, int E, int K, bool norm_topk) {
    MT_ASSERT(K >= 1 && K <= E);
    if (!N) return;
    route_kernel<<<(unsigned)MT_CEIL_DIV(N, (size_t)TOKEN_WARPS), TOKEN_WARPS * 32, 0, s>>>(
        p, sel, wk, psel, N, E, K, norm_topk);
    CUDA_LAUNCH_CHECK();
}

/* ---- grouping ---- */

/* hist[b][e] = choices of expert e in tile b. */
__global__ void group_count_kernel(int32_t *hist, const int32_t *sel, size_t NK, size_t tiles,
                                   int E) {
    extern __shared__ int32_t counters[]; /* (GROUP_WARPS, E) */
    int w = threadIdx.x / 32, lane = threadIdx.x & 31;
    size_t b = (size_t)blockIdx.x * GROUP_WARPS + w;
    if (b >= tiles) return;
    int32_t *c = counters + (size_t)w * E;
    for (int e = lane; e < E; e += 32) c[e] = 0;
    __syncwarp();
    size_t end = (b + 1) * GROUP_TILE < NK ? (b + 1) * GROUP_TILE : NK;
    for (size_t i = b * GROUP_TILE + lane; i < end; i += 32) atomicAdd(&c[sel[i]], 1);
    __syncwarp();
    for (int e = lane; e < E; e += 32) hist[b * E + e] = c[e];
}

/* start = exclusive scan of the experts' totals; hist[b][e] becomes the
 * first grouped row of expert e's choices in tile b. One block. */
__global__ void group_scan_kernel(int32_t *start, int32_t *hist, size_t tiles, int E) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t t = 0;
        for (size_t b = 0; b < tiles; b++) t += hist[b * E + e];
        start[e + 1] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        start[0] = 0;
        for (int e = 0; e < E; e++) start[e + 1] += start[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int32_t run = start[e];
        for (size_t b = 0; b < tiles; b++) {
            int32_t h = hist[b * E + e];
            hist[b * E + e] = run;
            run += h;
        }
    }
}

/* row[i] and tok[row[i]] for the choices of each tile, in choice order. */
__global__ void group_place_kernel(int32_t *row, int32_t *tok, const int32_t *hist,
                                   const int32_t *sel, size_t NK, size_t tiles, int K, int E) {
    extern __shared__ int32_t counters[]; /* (GROUP_WARPS, E): next row of each expert */
    int w = threadIdx.x / 32, lane = threadIdx.x & 31;
    size_t b = (size_t)blockIdx.x * GROUP_WARPS + w;
    if (b >= tiles) return;
    int32_t *c = counters + (size_t)w * E;
    for (int e = lane; e < E; e += 32) c[e] = hist[b * E + e];
    __syncwarp();
    unsigned below = (1u << lane) - 1u; /* the lanes before this one */
    for (size_t i0 = b * GROUP_TILE; i0 < (b + 1) * GROUP_TILE && i0 < NK; i0 += 32) {
        size_t i = i0 + lane;
        bool valid = i < NK;
        int k = valid ? sel[i] : -1;
        unsigned peers = __match_any_sync(FULL, k); /* lanes choosing the same expert */
        int32_t base = valid ? c[k] : 0;
        __syncwarp(); /* every lane has read c before the last peer moves it on */
        if (valid) {
            int32_t r = base + __popc(peers & below);
            row[i] = r;
            tok[r] = (int32_t)(i / (size_t)K);
            if (lane == 31 - __clz(peers)) c[k] = base + __popc(peers);
        }
        __syncwarp();
    }
}

extern "C" void mt_cuda_moe_group(cudaStream_t s, int32_t *start, int32_t *row, int32_t *tok,
                                  int32_t *hist, const int32_t *sel, size_t NK, int K, int E) {
    MT_ASSERT(E >= 1 && E <= MT_MOE_MAX_EXPERTS && NK <= (size_t)INT32_MAX);
    size_t tiles = MT_CEIL_DIV(NK, (size_t)GROUP_TILE);
    size_t shmem = (size_t)GROUP_WARPS * E * sizeof(int32_t);
    unsigned blocks = (unsigned)MT_CEIL_DIV(tiles, (size_t)GROUP_WARPS);
    if (tiles) {
        group_count_kernel<<<blocks, GROUP_WARPS * 32, shmem, s>>>(hist, sel, NK, tiles, E);
        CUDA_LAUNCH_CHECK();
    }
    group_scan_kernel<<<1, 256, 0, s>>>(start, hist, tiles, E);
    CUDA_LAUNCH_CHECK();
    if (tiles) {
        group_place_kernel<<<blocks, GROUP_WARPS * 32, shmem, s>>>(row, tok, hist, sel, NK, tiles,
                                                                   K, E);
        CUDA_LAUNCH_CHECK();
    }
}

/* ---- gather, combine, scatter ---- */

/* Rows of upr units U: xg[r] = xn[tok[r]]. */
template <typename U>
__global__ void gather_kernel(U *xg, const U *xn, const int32_t *tok, size_t R, size_t upr) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < R * upr; t += stride)
        xg[t] = xn[(size_t)tok[t / upr] * upr + t % upr];
}

extern "C" void mt_cuda_moe_gather(cudaStream_t s, void *xg, const void *xn, const int32_t *tok,
                                   size_t R, size_t C, size_t es) {
    size_t row = C * es, n;
    uintptr_t al = (uintptr_t)xg | (uintptr_t)xn;
    if (!R || !C) return;
    if (row % 16 == 0 && al % 16 == 0) {
        n = R * (row / 16);
        gather_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>((uint4 *)xg, (const uint4 *)xn, tok, R,
                                                          row / 16);
    } else if (row % 4 == 0 && al % 4 == 0) {
        n = R * (row / 4);
        gather_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>((uint32_t *)xg, (const uint32_t *)xn,
                                                          tok, R, row / 4);
    } else {
        MT_ASSERT(es == 2 && al % 2 == 0);
        n = R * C;
        gather_kernel<<<ew_blocks(n), EW_THREADS, 0, s>>>((uint16_t *)xg, (const uint16_t *)xn,
                                                          tok, R, C);
    }
    CUDA_LAUNCH_CHECK();
}

__global__ void combine_kernel(float *out, const float *y, const float *wk, const int32_t *row,
                               const float *sz, const float *sy, size_t N, size_t C, int K) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < N * C; t += stride) {
        size_t n = t / C, i = t % C;
        float o = 0.0f;
        for (int j = 0; j < K; j++) o += wk[n * K + j] * y[(size_t)row[n * K + j] * C + i];
        if (sy) o += sigmoid_f(sz[n]) * sy[t];
        out[t] = o;
    }
}

extern "C" void mt_cuda_moe_combine(cudaStream_t s, float *out, const float *y, const float *wk,
                                    const int32_t *row, const float *sz, const float *sy,
                                    size_t N, size_t C, int K) {
    if (!N || !C) return;
    combine_kernel<<<ew_blocks(N * C), EW_THREADS, 0, s>>>(out, y, wk, row, sz, sy, N, C, K);
    CUDA_LAUNCH_CHECK();
}

/* One block per token. */
template <typename T>
__global__ void combine_bwd_kernel(T *dy, float *dwk, T *dsy, float *dsz, const float *dout,
                                   const float *y, const float *wk, const int32_t *row,
                                   const float *sz, const float *sy, size_t C, int K) {
    __shared__ float red[CB_THREADS / 32];
    size_t n = blockIdx.x;
    const float *d = dout + n * C;
    for (int j = 0; j < K; j++) {
        size_t r = (size_t)row[n * K + j];
        const float *yr = y + r * C;
        float w = wk[n * K + j], dot = 0.0f;
        for (size_t i = threadIdx.x; i < C; i += CB_THREADS) {
            dot += d[i] * yr[i];
            mt_put(dy, r * C + i, w * d[i]);
        }
        dot = block_sum(dot, red);
        if (threadIdx.x == 0) dwk[n * K + j] = dot;
    }
    if (!sy) return; /* uniform over the block */
    float sg = sigmoid_f(sz[n]), dot = 0.0f;
    for (size_t i = threadIdx.x; i < C; i += CB_THREADS) {
        dot += d[i] * sy[n * C + i];
        mt_put(dsy, n * C + i, sg * d[i]);
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) dsz[n] = dot * sg * (1.0f - sg);
}

extern "C" void mt_cuda_moe_combine_backward(cudaStream_t s, void *dy, bool dy_bf16, float *dwk,
                                             void *dsy, float *dsz, const float *dout,
                                             const float *y, const float *wk, const int32_t *row,
                                             const float *sz, const float *sy, size_t N, size_t C,
                                             int K) {
    if (!N) return;
    MT_ASSERT(N <= (size_t)INT32_MAX);
    if (dy_bf16)
        combine_bwd_kernel<<<(unsigned)N, CB_THREADS, 0, s>>>(
            (__nv_bfloat16 *)dy, dwk, (__nv_bfloat16 *)dsy, dsz, dout, y, wk, row, sz, sy, C, K);
    else
        combine_bwd_kernel<<<(unsigned)N, CB_THREADS, 0, s>>>((float *)dy, dwk, (float *)dsy, dsz,
                                                              dout, y, wk, row, sz, sy, C, K);
    CUDA_LAUNCH_CHECK();
}

__global__ void scatter_kernel(float *dxn, const float *dxg, const int32_t *row, size_t N,
                               size_t C, int K) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < N * C; t += stride) {
        size_t n = t / C, i = t % C;
        float o = 0.0f;
        for (int j = 0; j < K; j++) o += dxg[(size_t)row[n * K + j] * C + i];
        dxn[t] = o;
    }
}

extern "C" void mt_cuda_moe_scatter(cudaStream_t s, float *dxn, const float *dxg,
                                    const int32_t *row, size_t N, size_t C, int K) {
    if (!N || !C) return;
    scatter_kernel<<<ew_blocks(N * C), EW_THREADS, 0, s>>>(dxn, dxg, row, N, C, K);
    CUDA_LAUNCH_CHECK();
}

/* ---- load-balancing loss ---- */

/* One block per expert. */
__global__ void count_kernel(double *cnt, double *psum, const int32_t *start, const float *p,
                             size_t N, int E) {
    __shared__ double red[COUNT_THREADS];
    int e = blockIdx.x;
    double s = 0.0;
    for (size_t n = threadIdx.x; n < N; n += COUNT_THREADS) s += (double)p[n * E + e];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int h = COUNT_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        cnt[e] += (double)(start[e + 1] - start[e]);
        psum[e] += red[0];
    }
}

extern "C" void mt_cuda_moe_count_add(cudaStream_t s, double *cnt, double *psum,
                                      const int32_t *start, const float *p, size_t N, int E) {
    count_kernel<<<(unsigned)E, COUNT_THREADS, 0, s>>>(cnt, psum, start, p, N, E);
    CUDA_LAUNCH_CHECK();
}

__global__ void aux_kernel(double *loss_sum, const double *cnt, const double *psum, int E,
                           double factor) {
    double s = 0.0;
    for (int e = 0; e < E; e++) s += cnt[e] * psum[e];
    *loss_sum += factor * s;
}

extern "C" void mt_cuda_moe_aux_add(cudaStream_t s, double *loss_sum, const double *cnt,
                                    const double *psum, int E, double factor) {
    aux_kernel<<<1, 1, 0, s>>>(loss_sum, cnt, psum, E, factor);
    CUDA_LAUNCH_CHECK();
}

/* ---- router backward: one warp per token ---- */

__global__ void router_bwd_kernel(float *dz, const float *p, const int32_t *sel, const float *wk,
                                  const float *dwk, const float *psel, const double *cnt,
                                  bool aux, double aux_scale, size_t N, int E, int K,
                                  bool norm_topk) {
    size_t n = (size_t)blockIdx.x * TOKEN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (n >= N) return;
    const float *pr = p + n * E, *w = wk + n * K, *dw = dwk + n * K;
    const int32_t *sl = sel + n * K;
    float *dr = dz + n * E;
    /* w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S */
    float dot = 0.0f;
    if (norm_topk)
        for (int j = 0; j < K; j++) dot += dw[j] * w[j];
    double s = 0.0;
    for (int e = lane; e < E; e += 32) {
        float d = aux ? (float)(aux_scale * cnt[e]) : 0.0f;
        for (int j = 0; j < K; j++)
            if (sl[j] == e) d += norm_topk ? (dw[j] - dot) / psel[n] : dw[j];
        s += (double)pr[e] * d;
        dr[e] = d;
    }
    float sf = (float)warp_sum_d(s);
    /* softmax: dz_e = p_e (dp_e - sum_i p_i dp_i) */
    for (int e = lane; e < E; e += 32) dr[e] = pr[e] * (dr[e] - sf);
}

extern "C" void mt_cuda_moe_router_backward(cudaStream_t s, float *dz, const float *p,
                                            const int32_t *sel, const float *wk,
                                            const float *dwk, const float *psel,
                                            const double *cnt, bool aux, double aux_scale,
                                            size_t N, int E, int K, bool norm_topk) {
    if (!N) return;
    router_bwd_kernel<<<(unsigned)MT_CEIL_DIV(N, (size_t)TOKEN_WARPS), TOKEN_WARPS * 32, 0, s>>>(
        dz, p, sel, wk, dwk, psel, cnt, aux, aux_scale, N, E, K, norm_topk);
    CUDA_LAUNCH_CHECK();
}
