/* The kernels of the GPU MoE MLP around its matrix products (moe_route.cu),
 * for moe_cuda.c: routing, stable grouping of the rows by expert, gather,
 * combine, the load-balancing counts and loss, and their backwards. Not a
 * public interface. Every sum runs in a fixed order (no float atomics), so
 * every result is deterministic. Shapes as in moe_cuda.c: N tokens, C
 * features, E experts, K experts per token, NK = N * K grouped rows. All
 * pointers are device pointers; work is queued on stream s. */
#ifndef MT_KERNELS_MOE_ROUTE_H
#define MT_KERNELS_MOE_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest E the kernels take (the grouping keeps E counters per warp in
 * shared memory). */
#define MT_MOE_MAX_EXPERTS 2048

/* p (N, E): the router logits, replaced by their softmax (fp32, the sum in
 * double). sel (N, K): the K largest p of each token, largest first, equal
 * p: lower index first (a NaN p counts as -inf, so sel always holds K
 * distinct experts). psel (N): the sum of the chosen p, in pick order.
 * wk (N, K): p_j / psel (norm_topk) or p_j. As backend/cpu/moe.c. */
void mt_cuda_moe_route(cudaStream_t s, float *p, int32_t *sel, float *wk, float *psel,
                       size_t N, int E, int K, bool norm_topk);

/* int32 scratch of mt_cuda_moe_group: per tile of grouped rows, E counts. */
size_t mt_cuda_moe_group_scratch(size_t NK, int E);

/* Groups the NK = N * K choices sel by expert, stably (token order within
 * an expert): start (E + 1) first grouped row of each expert (start[E] =
 * NK), row (NK) grouped row of choice i = n * K + j, tok (NK) token of each
 * grouped row. hist: mt_cuda_moe_group_scratch ints. NK <= INT32_MAX. */
void mt_cuda_moe_group(cudaStream_t s, int32_t *start, int32_t *row, int32_t *tok,
                       int32_t *hist, const int32_t *sel, size_t NK, int K, int E);

/* xg (R, C) = xn[tok[r]] for each grouped row r; elements of es bytes. */
void mt_cuda_moe_gather(cudaStream_t s, void *xg, const void *xn, const int32_t *tok,
                        size_t R, size_t C, size_t es);

/* out (N, C) = sum_j wk[t,j] y[row[t,j]], j in order, + sigmoid(sz[t])
 * sy[t] when sy is not NULL (the shared expert). */
void mt_cuda_moe_combine(cudaStream_t s, float *out, const float *y, const float *wk,
                         const int32_t *row, const float *sz, const float *sy, size_t N,
                         size_t C, int K);

/* Backward of the combine, from dout (N, C):
 *   dy[row[t,j]] = wk[t,j] dout[t]       (type of dy_bf16: bf16 or fp32)
 *   dwk[t,j]     = dout[t] . y[row[t,j]]
 * and with sy (shared expert): dsy[t] = sigmoid(sz[t]) dout[t] (same type
 * as dy), dsz[t] = (dout[t] . sy[t]) s (1 - s), s = sigmoid(sz[t]). */
void mt_cuda_moe_combine_backward(cudaStream_t s, void *dy, bool dy_bf16, float *dwk,
                                  void *dsy, float *dsz, const float *dout, const float *y,
                                  const float *wk, const int32_t *row, const float *sz,
                                  const float *sy, size_t N, size_t C, int K);

/* dxn (N, C) = sum_j dxg[row[t,j]], j in order (overwritten). */
void mt_cuda_moe_scatter(cudaStream_t s, float *dxn, const float *dxg, const int32_t *row,
                         size_t N, size_t C, int K);

/* cnt[e] += start[e+1] - start[e]; psum[e] += sum_n p[n,e] (double). */
void mt_cuda_moe_count_add(cudaStream_t s, double *cnt, double *psum, const int32_t *start,
                           const float *p, size_t N, int E);

/* *loss_sum += factor * sum_e cnt[e] psum[e]. */
void mt_cuda_moe_aux_add(cudaStream_t s, double *loss_sum, const double *cnt,
                         const double *psum, int E, double factor);

/* dz (N, E) = dL/d router logits from dwk (N, K), the routing of the
 * forward and, when aux, the load-balancing gradient aux_scale * cnt[e] on
 * each p_e: the renormalisation's and the softmax's backward. */
void mt_cuda_moe_router_backward(cudaStream_t s, float *dz, const float *p, const int32_t *sel,
                                 const float *wk, const float *dwk, const float *psel,
                                 const double *cnt, bool aux, double aux_scale, size_t N, int E,
                                 int K, bool norm_topk);

#ifdef __cplusplus
}
#endif

#endif
