/* Internals of the grouped expert products (moe_gemm.h), shared by:
 *   moe_gemm.cu        the API: checks, the choice of path, the tile
 *                      offsets, and the plain fp32-FMA kernels (any shape)
 *   moe_gemm_mma.cu    the bf16 tensor-core kernel (mma.sync)
 *   moe_gemm_bench.cu  the benchmark
 *
 * All three products are one shape of problem, C (M, N) = sum_k A(m, k)
 * B(k, n), per expert:
 *   forward  M = rows, N = OC, K = IC   A(m,k) = x[row][k]   B(k,n) = W[n][k]
 *   dinp     M = rows, N = IC, K = OC   A(m,k) = dy[row][k]  B(k,n) = W[k][n]
 *   dw       M = OC,   N = IC, K = rows A(m,k) = dy[row][m]  B(k,n) = x[row][n]
 * For forward and dinp the rows of every expert are cut in tiles of BM
 * rows (its last tile partial); tile_off[e] counts the row tiles of the
 * experts before e, tile_off[E] all of them (each expert adds at most one
 * partial tile: tile_off[E] <= ceil(R / BM) + E). A kernel finds its
 * expert by a binary search on tile_off. For dw the tiles are (expert,
 * output tile) and the reduction runs over the expert's rows. */
#ifndef MT_BACKEND_CUDA_MOE_GEMM_INTERNAL_CUH
#define MT_BACKEND_CUDA_MOE_GEMM_INTERNAL_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/moe_gemm.h"

enum { MT_MOE_FWD = 0, MT_MOE_DINP = 1, MT_MOE_DW = 2 };

/* One grouped product: the arguments of the API, by role. */
struct mt_moe_args {
    const void *a;          // forward: x (R, IC); dinp and dw: dy (R, OC)
    const void *b;          // forward and dinp: w (experts w_stride apart); dw: x (R, IC)
    void *out;              // y (R, OC), dx (R, IC) or dw (experts out_stride apart)
    size_t w_stride;        // elements between two experts' weights
    size_t out_stride;      // dw: floats between two experts' gradients
    const int32_t *start;   // (E+1) device
    int32_t *tile_off;      // (E+1) device scratch, forward and dinp
    int E, R, IC, OC;
    int accumulate;         // dinp: += instead of =
    int out_bf16;           // forward: y is bf16
};

/* Rows [*b, *e) of expert i, clamped to [0, R] and to a non-negative
 * count, so that a broken routing can never address outside the arrays. */
__device__ __forceinline__ void mt_moe_segment(const int32_t *start, int i, int R, int *b,
                                               int *e) {
    int s0 = __ldg(start + i), s1 = __ldg(start + i + 1);
    s0 = min(max(s0, 0), R);
    s1 = min(max(s1, s0), R);
    *b = s0;
    *e = s1;
}

/* The expert owning row tile t (0 <= t < tile_off[E]): the last e with
 * tile_off[e] <= t. Experts with no rows have tile_off[e] == tile_off[e+1]
 * and are passed over. tile_off is read-only while a product runs, so the
 * loads may go through the non-coherent cache. */
__device__ __forceinline__ int mt_moe_find_expert(const int32_t *tile_off, int E, int t) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (__ldg(tile_off + mid) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* tile_off (E+1) from start for tiles of bm rows, on stream. */
void mt_moe_tile_offsets(const mt_moe_args &a, int bm, cudaStream_t stream);

/* The tensor-core kernel (moe_gemm_mma.cu): bf16 operands, every pointer
 * 16-byte aligned, IC, OC and w_stride multiples of 8, out_stride of 4.
 * bk: its k step, 32 or 64; stages: its cp.async pipeline depth, 2..5;
 * 0 for either lets it choose (mt_moe_mma_pick), and what the device's
 * shared memory cannot hold is lowered. */
bool mt_moe_mma_shape_ok(size_t IC, size_t OC);
void mt_moe_mma_run(int op, const mt_moe_args &a, int bk, int stages, cudaStream_t stream);
/* The k step and depth mt_moe_mma_run takes for op on the current device. */
void mt_moe_mma_pick(int op, int *bk, int *stages);

/* The product through the tensor cores when prec, shapes and alignment
 * allow it, else through the plain kernels (moe_gemm.cu); bk and stages as
 * for mt_moe_mma_run. What the API calls, and what the benchmark times. */
void mt_moe_gemm_run(int op, mt_precision prec, const mt_moe_args &a, int bk, int stages,
                     cudaStream_t stream);

#endif
