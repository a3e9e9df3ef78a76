/* Internals of the grouped expert products (moe_gemm.h), shared by:
 *   moe_gemm.cu        the API: checks, the choice of path, and the plain
 *                      fp32-FMA kernels (any shape)
 *   moe_gemm_tiles.cu  the tile offsets and walk all kernels share
 *   moe_gemm_mma.cu    the bf16 tensor-core kernel (mma.sync, sm_80 on)
 *   moe_gemm_wgmma.cu  the bf16 Hopper kernel (wgmma, sm_90)
 *   bench/kernels/moe_gemm_bench.cu  the benchmark
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
#ifndef MT_KERNELS_MOE_GEMM_INTERNAL_CUH
#define MT_KERNELS_MOE_GEMM_INTERNAL_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda_common.h"
#include "kernels/moe/moe_gemm.h"

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

/* One output tile of a tensor-core kernel: where its operands and results
 * are, and how much of it is real. */
struct mt_moe_tile {
    const __nv_bfloat16 *a, *b; // A(0, 0) and B(0, 0) of the tile
    int64_t out;                // C(0, 0), elements from args.out
    int m_lim, n_lim;           // valid rows and columns (may exceed the tile)
    int k_lim, k_steps;         // reduction length, and its steps of BK
};

/* Tile number *t of a persistent block's walk over BM x BN output tiles
 * (k steps of BK), or false past the last one. Forward and dinp take
 * groups of GM row tiles (which may span experts) across all ncol column
 * tiles, row tiles fastest, so that the tiles running at once share their
 * operands in L2. dw takes (expert, output tile), tpe tiles per expert,
 * and moves *t past the tiles of experts with no rows (by whole strides of
 * gridDim.x, so the walk stays this block's). */
template <int OP, int BM, int BN, int BK, int GM>
__device__ __forceinline__ bool mt_moe_get_tile(const mt_moe_args &a, int *t, int ntiles,
                                                int ncol, int tpe, mt_moe_tile &T) {
    typedef __nv_bfloat16 bf16;
    if (OP != MT_MOE_DW) {
        if (*t >= ntiles) return false;
        const int rows = ntiles / ncol, group = *t / (GM * ncol), first = group * GM;
        const int gsz = min(rows - first, GM), local = *t - group * GM * ncol;
        const int rt = first + local % gsz, ct = local / gsz;
        const int e = mt_moe_find_expert(a.tile_off, a.E, rt);
        int r0, r1;
        mt_moe_segment(a.start, e, a.R, &r0, &r1);
        const int row0 = r0 + (rt - __ldg(a.tile_off + e)) * BM, n0 = ct * BN;
        const int N = OP == MT_MOE_FWD ? a.OC : a.IC, K = OP == MT_MOE_FWD ? a.IC : a.OC;
        const bf16 *we = (const bf16 *)a.b + (size_t)e * a.w_stride;
        T.a = (const bf16 *)a.a + (int64_t)row0 * K;
        T.b = OP == MT_MOE_FWD ? we + (int64_t)n0 * a.IC : we + n0;
        T.out = (int64_t)row0 * N + n0;
        T.m_lim = r1 - row0;
        T.n_lim = N - n0;
        T.k_lim = K;
    } else {
        int e, r0, r1;
        for (;;) {
            if (*t >= ntiles) return false;
            e = *t / tpe;
            mt_moe_segment(a.start, e, a.R, &r0, &r1);
            if (r1 > r0) break;
            // the first tile of the next expert that is in this block's walk
            *t += ((e + 1) * tpe - *t + (int)gridDim.x - 1) / (int)gridDim.x * (int)gridDim.x;
        }
        const int local = *t - e * tpe, ntn = tpe / ((a.OC + BM - 1) / BM);
        const int m0 = (local / ntn) * BM, n0 = (local % ntn) * BN;
        T.a = (const bf16 *)a.a + (int64_t)r0 * a.OC + m0;
        T.b = (const bf16 *)a.b + (int64_t)r0 * a.IC + n0;
        T.out = (int64_t)e * a.out_stride + (int64_t)m0 * a.IC + n0;
        T.m_lim = a.OC - m0;
        T.n_lim = a.IC - n0;
        T.k_lim = r1 - r0;
    }
    T.k_steps = (T.k_lim + BK - 1) / BK;
    return true;
}

/* The loader of a persistent block's walk: the tile and k step it copies
 * next, and the ring buffer they go to. After each step's copy, next()
 * moves on, to the next tile of the walk (blockIdx.x, + gridDim.x, ...)
 * after a tile's last step; valid turns false past the walk's end. */
template <int OP, int BM, int BN, int BK, int GM> struct mt_moe_loader {
    mt_moe_tile t;
    int tile, k, buf;
    bool valid;
    int ntiles, ncol, tpe, stages;
    __device__ __forceinline__ mt_moe_loader(const mt_moe_args &a, int ntiles_, int ncol_,
                                             int tpe_, int stages_)
        : tile(blockIdx.x), k(0), buf(0), ntiles(ntiles_), ncol(ncol_), tpe(tpe_),
          stages(stages_) {
        valid = mt_moe_get_tile<OP, BM, BN, BK, GM>(a, &tile, ntiles, ncol, tpe, t);
    }
    __device__ __forceinline__ void next(const mt_moe_args &a) {
        buf = buf + 1 == stages ? 0 : buf + 1;
        if (valid && ++k == t.k_steps) {
            k = 0;
            tile += gridDim.x;
            valid = mt_moe_get_tile<OP, BM, BN, BK, GM>(a, &tile, ntiles, ncol, tpe, t);
        }
    }
};

/* The number of tiles a grid walks (an upper bound for forward and dinp,
 * whose row tiles are counted on the device), after computing tile_off for
 * forward and dinp; ncol and tpe as for mt_moe_get_tile. */
int64_t mt_moe_tile_walk(int op, const mt_moe_args &a, int bm, int bn, int *ncol, int *tpe,
                         cudaStream_t stream);

/* The output of one fp32 accumulator pair (columns c and c+1 of a row at
 * element offset row of a.out): bf16 or fp32, = or += as the product says. */
template <int OP>
__device__ __forceinline__ void mt_moe_store2(const mt_moe_args &a, int64_t row, int c, float v0,
                                              float v1) {
    if (OP == MT_MOE_FWD && a.out_bf16) {
        *(__nv_bfloat162 *)((__nv_bfloat16 *)a.out + row + c) = __floats2bfloat162_rn(v0, v1);
        return;
    }
    float2 *p = (float2 *)((float *)a.out + row + c);
    if (OP == MT_MOE_DW || (OP == MT_MOE_DINP && a.accumulate)) {
        const float2 o = *p;
        v0 = o.x + v0;
        v1 = o.y + v1;
    }
    *p = make_float2(v0, v1);
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

/* The Hopper kernel (moe_gemm_wgmma.cu): the same operands as
 * mt_moe_mma_run, through warpgroup products (wgmma) on sm_90. Whether
 * this build and the current device have it. */
bool mt_moe_wgmma_available(void);
void mt_moe_wgmma_run(int op, const mt_moe_args &a, cudaStream_t stream);

/* The product through the tensor cores when prec, shapes and alignment
 * allow it (kernel: which one, moe_gemm.h), else through the plain kernels
 * (moe_gemm.cu); bk and stages as for mt_moe_mma_run. What the API calls,
 * and what the benchmark times. */
void mt_moe_gemm_run(int op, mt_precision prec, const mt_moe_args &a, mt_cuda_moe_kernel kernel,
                     int bk, int stages, cudaStream_t stream);

#endif
