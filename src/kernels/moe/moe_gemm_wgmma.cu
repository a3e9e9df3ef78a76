/* The Hopper kernel of the grouped expert products (the problem:
 * moe_gemm_internal.cuh; the contract: moe_gemm.h): the tiles and the
 * walk of the mma.sync kernel (moe_gemm_mma.cu), with warpgroup products.
 *
 * A block of 2 warpgroups computes 128 x 256 output tiles, each warpgroup
 * 64 x 256 of it with wgmma m64n256k16 (bf16 in, fp32 accumulate, 128
 * registers a thread), both operands read from shared memory. k steps of
 * 64 go through a ring of 4 buffers of 48 KB filled by cp.async in the
 * 128-byte swizzled layout (wgmma_ptx.cuh):
 *   forward  A = x [m][k] K-major,   B = W [n][k] K-major
 *   dinp     A = dy [m][k] K-major,  B = W [k][n] N-major
 *   dw       A = dy [k][m] M-major,  B = x [k][n] N-major
 * Rows, columns and k past the tile's valid part are zero-filled (cp.async
 * source size 0) and never stored.
 *
 * A k step: wait for this thread's copies of the step, fence them to the
 * products' (async) proxy, barrier; start the copies of the step AHEAD on,
 * into the buffer whose products every warpgroup saw end before the
 * barrier; issue the step's 4 products; wait until only they are in
 * flight. So a step's products run while the block meets and copies, and
 * the loads run AHEAD steps before the products. The grid is persistent
 * and its loads cross tile boundaries, as in the mma.sync kernel; a tile's
 * products end (wait 0) before its results are stored from the registers.
 * Every output is one thread's fp32 sum in a fixed order: the same bits
 * every run. The device code exists in the sm_90a build only; elsewhere
 * mt_moe_wgmma_available() is false and nothing launches it. */
#include "kernels/moe/moe_gemm_internal.cuh"
#include "kernels/ptx/tc_ptx.cuh"
#include "kernels/ptx/wgmma_ptx.cuh"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int BM = 128, BN = 256, BK = 64; // output tile, k step
constexpr int NT = 256;                    // 2 warpgroups of 64 rows x 256 columns
constexpr int STAGES = 4;
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE = A_BYTES + B_BYTES;
constexpr size_t SMEM = (size_t)STAGES * STAGE + 1024; // + room to align the base to 1024

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int GM = 8;                // row tiles per group of the tile order
constexpr int AHEAD = STAGES - 2;    // k steps the loads run before the products
constexpr int MN_BLOCK = BK * 128;   // bytes of 64 columns x BK k rows, MN-major

/* K-major operand, ROWS rows (m or n) x BK k, from g (row pitch ld): rows
 * >= rl and k >= kl (a multiple of 8: a chunk is all in or all out) read
 * as 0. */
template <int ROWS>
__device__ __forceinline__ void load_k(unsigned char *s, const bf16 *g, int ld, int rl, int k0,
                                       int kl) {
    const int c = threadIdx.x & 7, r0 = threadIdx.x >> 3; // 16-byte chunk, first row
    const bool k_ok = k0 + c * 8 < kl;
#pragma unroll
    for (int i = 0; i < ROWS / (NT / 8); i++) {
        const int r = r0 + i * (NT / 8);
        const bool ok = k_ok && r < rl;
        mt_tc_cp16(s + mt_wg_swz(r, c), ok ? g + (int64_t)r * ld + k0 + c * 8 : g, ok);
    }
}

/* MN-major operand, COLS columns (m or n) x BK k, from g (k pitch ld): k
 * >= kl and columns >= cl (a multiple of 8) read as 0. */
template <int COLS>
__device__ __forceinline__ void load_mn(unsigned char *s, const bf16 *g, int ld, int k0, int kl,
                                        int cl) {
    constexpr int CPR = COLS / 8, RPP = NT / CPR; // chunks per k row, k rows per pass
    const int col = (threadIdx.x % CPR) * 8, kr0 = threadIdx.x / CPR;
    const bool c_ok = col < cl;
    unsigned char *sb = s + (col >> 6) * MN_BLOCK;
#pragma unroll
    for (int i = 0; i < BK / RPP; i++) {
        const int kr = kr0 + i * RPP;
        const bool ok = c_ok && k0 + kr < kl;
        mt_tc_cp16(sb + mt_wg_swz(kr, (col >> 3) & 7), ok ? g + (int64_t)(k0 + kr) * ld + col : g,
                   ok);
    }
}

/* Starts the copy of k step ks of tile t into buffer s. */
template <int OP>
__device__ __forceinline__ void load_step(unsigned char *s, const mt_moe_tile &t, int ks,
                                          const mt_moe_args &a) {
    const int k0 = ks * BK;
    unsigned char *sb = s + A_BYTES;
    if (OP == MT_MOE_FWD) {
        load_k<BM>(s, t.a, a.IC, t.m_lim, k0, t.k_lim);
        load_k<BN>(sb, t.b, a.IC, t.n_lim, k0, t.k_lim);
    } else if (OP == MT_MOE_DINP) {
        load_k<BM>(s, t.a, a.OC, t.m_lim, k0, t.k_lim);
        load_mn<BN>(sb, t.b, a.IC, k0, t.k_lim, t.n_lim);
    } else {
        load_mn<BM>(s, t.a, a.OC, k0, t.k_lim, t.m_lim);
        load_mn<BN>(sb, t.b, a.IC, k0, t.k_lim, t.n_lim);
    }
}

/* Issues warpgroup wg's products of one k step from the buffer at shared
 * address s: its 64 rows of A are the buffer's 8192 bytes number wg (64
 * K-major rows, or the M-major block of 64 columns); B is all 256 columns. */
template <int OP>
__device__ __forceinline__ void mma_step(float acc[128], unsigned s, int wg) {
    constexpr int TA = OP == MT_MOE_DW, TB = OP != MT_MOE_FWD; // MN-major operands
    const unsigned sa = s + wg * 8192, sb = s + A_BYTES;
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
        const uint64_t da = mt_wg_desc(sa + (TA ? kk * 2048 : kk * 32), TA ? MN_BLOCK : 16);
        const uint64_t db = mt_wg_desc(sb + (TB ? kk * 2048 : kk * 32), TB ? MN_BLOCK : 16);
        mt_wg_mma_64x256<TA, TB>(acc, da, db);
    }
}

/* Stores warpgroup wg's accumulators (layout: mt_wg_mma_64x256). */
template <int OP>
__device__ __forceinline__ void store_tile(const mt_moe_args &a, const mt_moe_tile &T,
                                           const float acc[128], int wg, int warp, int lane) {
    const int ldo = OP == MT_MOE_FWD ? a.OC : a.IC;
    const int r0 = wg * 64 + warp * 16 + (lane >> 2), c0 = 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + h * 8;
        if (r >= T.m_lim) continue;
        const int64_t row = T.out + (int64_t)r * ldo;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const int c = j * 8 + c0;
            if (c >= T.n_lim) continue; // n_lim is even: c + 1 is in when c is
            mt_moe_store2<OP>(a, row, c, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    }
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

template <int OP>
__global__ void __launch_bounds__(NT, 1) mt_moe_wgmma_kernel(const mt_moe_args a, int ncol,
                                                             int tpe) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char mt_wg_smem[];
    unsigned char *smem = mt_wg_smem + ((1024 - (mt_tc_smem_addr(mt_wg_smem) & 1023)) & 1023);
    const unsigned sbase = mt_tc_smem_addr(smem);
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int ntiles = OP == MT_MOE_DW ? a.E * tpe : __ldg(a.tile_off + a.E) * ncol;

    mt_moe_loader<OP, BM, BN, BK, GM> L(a, ntiles, ncol, tpe, STAGES);
    const int first = L.tile;
    auto load_next = [&]() {
        if (L.valid) load_step<OP>(smem + L.buf * STAGE, L.t, L.k, a);
        mt_tc_cp_commit(); // an empty group past the end keeps the count in step
        L.next(a);
    };
    for (int s = 0; s < AHEAD; s++) load_next();

    int cbuf = 0;
    mt_moe_tile C;
    for (int ct = first; mt_moe_get_tile<OP, BM, BN, BK, GM>(a, &ct, ntiles, ncol, tpe, C);
         ct += gridDim.x) {
        float acc[128];
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.f;
        for (int ks = 0; ks < C.k_steps; ks++) {
            mt_tc_cp_wait<AHEAD - 1>(); // this thread's copies of this step are done
            mt_wg_fence_smem();
            __syncthreads(); // everyone's are; the products of step ks-2 have ended
            load_next();     // step ks+AHEAD, into the buffer of step ks-2
#pragma unroll
            for (int i = 0; i < 128; i++) mt_wg_fence_reg(acc[i]);
            mt_wg_fence();
            mma_step<OP>(acc, sbase + cbuf * STAGE, wg);
            mt_wg_commit();
            mt_wg_wait<1>(); // step ks-1's products have ended
            cbuf = cbuf + 1 == STAGES ? 0 : cbuf + 1;
        }
        mt_wg_wait<0>();
#pragma unroll
        for (int i = 0; i < 128; i++) mt_wg_fence_reg(acc[i]);
        store_tile<OP>(a, C, acc, wg, warp, lane);
    }
    mt_tc_cp_wait<0>();
#endif
}

template <int OP> void launch(const mt_moe_args &a, int sms, cudaStream_t st) {
    auto kern = mt_moe_wgmma_kernel<OP>;
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
    int ncol, tpe;
    const int64_t tiles = mt_moe_tile_walk(OP, a, BM, BN, &ncol, &tpe, st);
    MT_ASSERT(tiles + sms < INT32_MAX); /* tile numbers, one stride past the last, are int */
    const int grid = (int)(tiles < sms ? tiles : sms); /* more blocks than SMs: useless */
    if (grid == 0) return;
    kern<<<grid, NT, SMEM, st>>>(a, ncol, tpe);
    CUDA_LAUNCH_CHECK();
}

} // namespace

bool mt_moe_wgmma_available(void) { return mt_wg_device_fits(SMEM); }

void mt_moe_wgmma_run(int op, const mt_moe_args &a, cudaStream_t stream) {
    MT_ASSERT(mt_moe_wgmma_available());
    int dev, sms;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (op == MT_MOE_FWD) launch<MT_MOE_FWD>(a, sms, stream);
    else if (op == MT_MOE_DINP) launch<MT_MOE_DINP>(a, sms, stream);
    else launch<MT_MOE_DW>(a, sms, stream);
}
