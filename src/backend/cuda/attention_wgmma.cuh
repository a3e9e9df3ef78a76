/* Building blocks of the Hopper attention kernels (attention_wgmma_fwd.cu,
 * attention_wgmma_bwd.cu). Q, K, V and dO tiles sit in shared memory in the
 * 128-byte swizzled layout of wgmma_ptx.cuh, as ROWS rows of 64 head-dim
 * columns (HD 128: two such blocks, ROWS * 128 bytes apart), each tile's
 * base 1024-byte aligned. Compiled only where __CUDA_ARCH_FEAT_SM90_ALL is
 * defined; the kernels' bodies are guarded the same way. */
#ifndef MT_BACKEND_CUDA_ATTENTION_WGMMA_CUH
#define MT_BACKEND_CUDA_ATTENTION_WGMMA_CUH

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/tma_ptx.cuh"
#include "backend/cuda/wgmma_ptx.cuh"

/* The TMA map (host side; attention_wgmma_fwd.cu) of a (B, T, H, HD) bf16
 * tensor at p as (HD, H, T, B), boxes of 64 head-dim columns by rows rows,
 * 128-byte swizzle (the tiles above); rows past T read as zeros. */
int mt_attn_tma_map(CUtensorMap *map, const void *p, int B, int T, int H, int HD, int rows,
                    mt_error *err);

/* The first 1024-byte aligned address of dynamic shared memory at p. */
__device__ __forceinline__ unsigned char *mt_attn_wg_align(unsigned char *p) {
    return p + ((1024 - (mt_tc_smem_addr(p) & 1023)) & 1023);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Starts the copy (by NT threads) of rows [r0, r0+ROWS) of a (.., T, H, HD)
 * tensor (row pitch ld elements) into the swizzled tile s; rows >= T
 * become zeros. */
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void mt_attn_wg_load(unsigned char *s, const bf16 *g, int64_t ld,
                                                int r0, int T) {
    constexpr int CPR = HD / 8; // 16-byte chunks per row
    for (int i = threadIdx.x; i < ROWS * CPR; i += NT) {
        const int r = i / CPR, ch = i % CPR;
        const bool ok = r0 + r < T;
        mt_tc_cp16(s + (ch >> 3) * (ROWS * 128) + mt_wg_swz(r, ch & 7),
                   g + (ok ? (int64_t)(r0 + r) * ld : 0) + ch * 8, ok);
    }
}

/* Keeps the compiler from moving accesses of x[0..N) across the products. */
template <int N> __device__ __forceinline__ void mt_attn_wg_fence(float x[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) mt_wg_fence_reg(x[i]);
}

/* acc (64 x N, the warpgroup's) += A B^T over the head dim: A the 64 rows
 * at shared address sa of a tile of RA rows, B the N rows at sb of a tile of
 * RB rows (both K-major: a k16 slice kk sits in column block kk / 4, 32
 * bytes a slice within it). Issued, not committed. */
template <int N, int HD, int RA, int RB>
__device__ __forceinline__ void mt_attn_wg_abt(float acc[N / 2], unsigned sa, unsigned sb) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const unsigned off = (kk & 3) * 32;
        const uint64_t da = mt_wg_desc(sa + (kk >> 2) * (RA * 128) + off, 16);
        const uint64_t db = mt_wg_desc(sb + (kk >> 2) * (RB * 128) + off, 16);
        if constexpr (N == 128) mt_wg_mma_64x128_ss<0, 0>(acc, da, db);
        else mt_wg_mma_64x64_ss<0, 0>(acc, da, db);
    }
}

/* acc (64 x HD) += P B: P (64 x K) in bf16 pairs laid out as A fragments
 * (k16 slice kk at p[4kk..4kk+3], as mt_attn_wg_pack leaves them), B the K
 * rows at sb of a tile of RB rows, read along the head dim (MN-major: 2048
 * bytes a k16 slice, column blocks RB * 128 apart). Issued, not committed;
 * p must not change until the products are waited for. */
template <int K, int HD, int RB>
__device__ __forceinline__ void mt_attn_wg_pb(float acc[HD / 2], const unsigned p[K / 4],
                                              unsigned sb) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        const uint64_t db = mt_wg_desc(sb + kk * 2048, RB * 128);
        if constexpr (HD == 128) mt_wg_mma_64x128_rs<1>(acc, p + 4 * kk, db);
        else mt_wg_mma_64x64_rs<1>(acc, p + 4 * kk, db);
    }
}

/* The fp32 accumulators x of a 64 x K product rounded to bf16 pairs: they
 * are laid out as the A fragments of a product that reduces over K (slice
 * kk is accumulator blocks 2kk and 2kk+1). */
template <int K> __device__ __forceinline__ void mt_attn_wg_pack(unsigned p[K / 4], const float x[K / 2]) {
#pragma unroll
    for (int i = 0; i < K / 4; i++) p[i] = mt_attn_pack(x[2 * i], x[2 * i + 1]);
}

/* Keeps the registers of p (the A operand of products in flight) live up
 * to here, so that no other value takes them before the products are
 * waited for. */
template <int N> __device__ __forceinline__ void mt_attn_wg_hold(unsigned p[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(p[i])::"memory");
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

#endif
