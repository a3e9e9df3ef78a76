/* The tiles of the grouped expert products (moe_gemm_internal.cuh): each
 * expert's first row tile, counted on the device, and the number of tiles
 * a grid walks. Shared by the plain kernels (moe_gemm.cu) and the
 * tensor-core ones (moe_gemm_mma.cu, moe_gemm_wgmma.cu), which the API in
 * moe_gemm.cu chooses among: in a file of its own so that the files depend
 * one way. */
#include "kernels/moe/moe_gemm_internal.cuh"

/* ---- tile offsets ---- */

/* tile_off[e] = sum over experts i < e of ceil(rows_i / bm); tile_off[E]
 * = the total. One block: an inclusive scan per warp, then over warps,
 * blockDim.x experts at a time. Integers: the same bits every run. */
__global__ void mt_moe_tile_offsets_kernel(const int32_t *start, int E, int R, int bm,
                                           int32_t *tile_off) {
    __shared__ int warp_total[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int run = 0; // tiles of the experts of earlier passes (the same in every thread)
    for (int base = 0; base < E; base += blockDim.x) {
        const int i = base + threadIdx.x;
        int n = 0;
        if (i < E) {
            int b, e;
            mt_moe_segment(start, i, R, &b, &e);
            n = (e - b) / bm + ((e - b) % bm != 0);
        }
        int incl = n;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += v;
        }
        if (lane == 31) warp_total[w] = incl;
        __syncthreads();
        int before = 0, pass = 0;
        for (int j = 0; j < nw; j++) {
            const int t = warp_total[j];
            if (j < w) before += t;
            pass += t;
        }
        if (i < E) tile_off[i] = run + before + incl - n;
        run += pass;
        __syncthreads(); // warp_total is rewritten by the next pass
    }
    if (threadIdx.x == 0) tile_off[E] = run;
}

void mt_moe_tile_offsets(const mt_moe_args &a, int bm, cudaStream_t stream) {
    mt_moe_tile_offsets_kernel<<<1, 256, 0, stream>>>(a.start, a.E, a.R, bm, a.tile_off);
    CUDA_LAUNCH_CHECK();
}

int64_t mt_moe_tile_walk(int op, const mt_moe_args &a, int bm, int bn, int *ncol, int *tpe,
                         cudaStream_t stream) {
    *ncol = *tpe = 0;
    if (op == MT_MOE_DW) {
        *tpe = MT_CEIL_DIV(a.OC, bm) * MT_CEIL_DIV(a.IC, bn);
        return (int64_t)a.E * *tpe;
    }
    mt_moe_tile_offsets(a, bm, stream);
    *ncol = MT_CEIL_DIV(op == MT_MOE_FWD ? a.OC : a.IC, bn);
    return ((int64_t)MT_CEIL_DIV(a.R, bm) + a.E) * *ncol;
}
