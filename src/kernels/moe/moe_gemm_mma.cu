/* The bf16 tensor-core kernel of the grouped expert products (the problem:
 * moe_gemm_internal.cuh; the contract: moe_gemm.h).
 *
 * One kernel for the three products. A block of 8 warps computes 128 x 256
 * output tiles (warps 2 x 4, 64 x 64 outputs each) with mma.sync m16n8k16
 * (bf16 in, fp32 accumulate), stepping k by BK (64, or 32 on GPUs with
 * less shared memory) through a ring of `stages` shared-memory buffers
 * filled by cp.async (pick() below). The operands sit in shared
 * memory as they sit in global memory, rows padded by 16 bytes so that the
 * 8 addresses of each ldmatrix fall in distinct banks:
 *   forward  A = x [m][k],  B = W [n][k]   ldmatrix
 *   dinp     A = dy [m][k], B = W [k][n]   ldmatrix, .trans for B
 *   dw       A = dy [k][m], B = x [k][n]   ldmatrix.trans for both
 * Rows and columns past the tile's valid part and k past the reduction's
 * end are zero-filled by cp.async (source size 0) and never stored.
 *
 * The grid is persistent: one block per SM (the 128 fp32 accumulators per
 * thread allow no second one) walks tiles blockIdx.x, + gridDim.x, ... The
 * loads run stages-1 k-steps ahead of the products across tile boundaries,
 * so the next tile's first operands arrive while a tile's results are
 * stored. One barrier per k-step, placed before the step's last 16-deep
 * slice of products, as in CUTLASS's multistage main loop: the tensor
 * cores still have work queued while the warps meet. mt_moe_tile order: forward and dinp take groups of 8 row tiles (which
 * may span experts) across all column tiles, so that the tiles running at
 * once share their operands in L2; dw takes (expert, output tile), experts
 * with no rows skipped. Every output is one thread's fp32 sum in a fixed
 * order: the same bits every run. */
#include "kernels/moe/moe_gemm_internal.cuh"
#include "kernels/ptx/tc_ptx.cuh"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int BM = 128, BN = 256; // output tile
constexpr int NT = 256;           // threads: 8 warps, 2 along M x 4 along N
constexpr int GM = 8;             // row tiles per group of the tile order
constexpr int PAD = 8;            // 16 bytes of padding per shared-memory row
constexpr int MAX_STAGES = 5;

/* The buffers of product OP for k steps of BK (32 or 64). */
template <int OP, int BK> struct Cfg {
    static constexpr bool A_K = OP != MT_MOE_DW;  // A stored [m][k], else [k][m]
    static constexpr bool B_K = OP == MT_MOE_FWD; // B stored [n][k], else [k][n]
    static constexpr int SK = BK + PAD;           // pitch of an operand stored [m or n][k]
    static constexpr int A_ELEMS = A_K ? BM * SK : BK * (BM + PAD);
    static constexpr int B_ELEMS = B_K ? BN * SK : BK * (BN + PAD);
    static constexpr int STAGE = A_ELEMS + B_ELEMS; // bf16 elements per buffer
};

/* Waits until at most `pending` (0..3, uniform over the block) groups are in flight. */
__device__ __forceinline__ void cp_wait(int pending) {
    switch (pending) {
    case 0: mt_tc_cp_wait<0>(); break;
    case 1: mt_tc_cp_wait<1>(); break;
    case 2: mt_tc_cp_wait<2>(); break;
    default: mt_tc_cp_wait<3>(); break;
    }
}

/* ROWS x BK operand stored [row][k] (pitch BK + PAD) from g (row pitch
 * ld), in chunks of 8 k. Rows >= rl or k >= kl read as 0 (kl is a
 * multiple of 8 here: a chunk is all in or all out). */
template <int ROWS, int BK>
__device__ __forceinline__ void load_rows(bf16 *s, const bf16 *g, int ld, int rl, int k0,
                                          int kl) {
    constexpr int CPR = BK / 8, RPP = NT / CPR; // chunks per row, rows per pass
    const int kc = (threadIdx.x % CPR) * 8, r0 = threadIdx.x / CPR;
    const bool k_ok = k0 + kc < kl;
#pragma unroll
    for (int i = 0; i < ROWS / RPP; i++) {
        const int r = r0 + i * RPP;
        const bool ok = k_ok && r < rl;
        mt_tc_cp16(s + r * (BK + PAD) + kc, ok ? g + (int64_t)r * ld + k0 + kc : g, ok);
    }
}

/* BK x COLS operand stored [k][col] (pitch COLS + PAD) from g (k pitch
 * ld). k >= kl or columns >= cl (a multiple of 8) read as 0. */
template <int COLS, int BK>
__device__ __forceinline__ void load_kmajor(bf16 *s, const bf16 *g, int ld, int k0, int kl,
                                            int cl) {
    constexpr int CPR = COLS / 8, RPP = NT / CPR; // chunks per k row, k rows per pass
    const int c = (threadIdx.x % CPR) * 8, kr0 = threadIdx.x / CPR;
    const bool c_ok = c < cl;
#pragma unroll
    for (int i = 0; i < BK / RPP; i++) {
        const int kr = kr0 + i * RPP;
        const bool ok = c_ok && k0 + kr < kl;
        mt_tc_cp16(s + kr * (COLS + PAD) + c, ok ? g + (int64_t)(k0 + kr) * ld + c : g, ok);
    }
}

/* Starts the copy of k-step ks of tile t into buffer s. */
template <int OP, int BK>
__device__ __forceinline__ void load_step(bf16 *s, const mt_moe_tile &t, int ks, const mt_moe_args &a) {
    const int k0 = ks * BK;
    bf16 *sb = s + Cfg<OP, BK>::A_ELEMS;
    if (OP == MT_MOE_FWD) {
        load_rows<BM, BK>(s, t.a, a.IC, t.m_lim, k0, t.k_lim);
        load_rows<BN, BK>(sb, t.b, a.IC, t.n_lim, k0, t.k_lim);
    } else if (OP == MT_MOE_DINP) {
        load_rows<BM, BK>(s, t.a, a.OC, t.m_lim, k0, t.k_lim);
        load_kmajor<BN, BK>(sb, t.b, a.IC, k0, t.k_lim, t.n_lim);
    } else {
        load_kmajor<BM, BK>(s, t.a, a.OC, k0, t.k_lim, t.m_lim);
        load_kmajor<BN, BK>(sb, t.b, a.IC, k0, t.k_lim, t.n_lim);
    }
}

/* The warp's fragments of one 16-deep slice kk of buffer s: A for its 4
 * row blocks of 16, B for its 4 column blocks of 16 (each 2 n8 blocks).
 * ldmatrix.x4 matrices, for A: (m0-7, k0-7), (m8-15, k0-7), (m0-7, k8-15),
 * (m8-15, k8-15); for B: (k0-7, n0-7), (k8-15, n0-7), (k0-7, n8-15),
 * (k8-15, n8-15); .trans reads the same ones from [k][m or n] rows. */
template <int OP, int BK>
__device__ __forceinline__ void load_frags(unsigned af[4][4], unsigned bf[4][4], const bf16 *s,
                                           int kk, int wm, int wn, int lane) {
    using CF = Cfg<OP, BK>;
    const bf16 *sa = s, *sb = s + CF::A_ELEMS;
#pragma unroll
    for (int mi = 0; mi < 4; mi++) {
        const int m0 = wm * 64 + mi * 16;
        if (CF::A_K)
            mt_tc_ldsm(af[mi], sa + (m0 + (lane & 15)) * CF::SK + kk + (lane >> 4) * 8);
        else
            mt_tc_ldsm_t(af[mi], sa + (kk + (lane & 7) + (lane >> 4) * 8) * (BM + PAD) + m0 +
                               ((lane >> 3) & 1) * 8);
    }
#pragma unroll
    for (int nj = 0; nj < 4; nj++) {
        const int n0 = wn * 64 + nj * 16;
        if (CF::B_K)
            mt_tc_ldsm(bf[nj], sb + (n0 + (lane & 7) + ((lane >> 4) << 3)) * CF::SK + kk +
                             ((lane >> 3) & 1) * 8);
        else
            mt_tc_ldsm_t(bf[nj], sb + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * (BN + PAD) + n0 +
                               (lane >> 4) * 8);
    }
}

/* acc += the warp's 64 x 64 part of A (BM x 16) times B (16 x BN), from
 * the fragments of one 16-deep slice. */
__device__ __forceinline__ void mma_slice(float acc[4][8][4], const unsigned af[4][4],
                                          const unsigned bf[4][4]) {
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int nj = 0; nj < 4; nj++) {
            mt_tc_mma_n16(acc[mi] + 2 * nj, af[mi], bf[nj]);
        }
}

/* Stores the warp's accumulators: c[0..1] are row g, columns 2*t4 and
 * 2*t4+1 of each 16 x 8 block, c[2..3] row g+8. */
template <int OP>
__device__ __forceinline__ void store_tile(const mt_moe_args &a, const mt_moe_tile &T,
                                           const float acc[4][8][4], int wm, int wn, int lane) {
    const int g = lane >> 2, t4 = lane & 3, ldo = OP == MT_MOE_FWD ? a.OC : a.IC;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = wm * 64 + mi * 16 + g + h * 8;
            if (r >= T.m_lim) continue;
            const int64_t row = T.out + (int64_t)r * ldo;
#pragma unroll
            for (int ni = 0; ni < 8; ni++) {
                const int c = wn * 64 + ni * 8 + 2 * t4;
                if (c >= T.n_lim) continue; // n_lim is even: c + 1 is in when c is
                mt_moe_store2<OP>(a, row, c, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        }
}

template <int OP, int BK>
__global__ void __launch_bounds__(NT, 1)
    mt_moe_mma_kernel(const mt_moe_args a, int stages, int ncol, int tpe) {
    using CF = Cfg<OP, BK>;
    extern __shared__ __align__(16) unsigned char mt_moe_smem[];
    bf16 *smem = (bf16 *)mt_moe_smem;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
    const int ntiles = OP == MT_MOE_DW ? a.E * tpe : __ldg(a.tile_off + a.E) * ncol;

    mt_moe_loader<OP, BM, BN, BK, GM> L(a, ntiles, ncol, tpe, stages);
    const int first = L.tile;
    auto load_next = [&]() {
        if (L.valid) load_step<OP, BK>(smem + L.buf * CF::STAGE, L.t, L.k, a);
        mt_tc_cp_commit(); // an empty group past the end keeps the count in step
        L.next(a);
    };
    for (int s = 0; s < stages - 1; s++) load_next();

    // The products walk the same tiles, stages-1 k-steps behind the loader.
    // Fragments are double-buffered in registers: slice kk+1 loads while
    // slice kk multiplies, and the last slice of a step multiplies after
    // the barrier that makes the next step's buffer readable, with the next
    // step's first slice loading meanwhile (the barrier's wait overlaps the
    // products already issued). Step ks's loads (at its first slice) refill
    // the buffer of step ks-1, whose last reads came before that barrier of
    // step ks-1; so every buffer read and write is fenced by a barrier.
    constexpr int KK = BK / 16; // slices per step, even: slice 0 is always in fragment set 0
    cp_wait(stages - 2);
    __syncthreads();
    unsigned af[2][4][4], bf[2][4][4];
    load_frags<OP, BK>(af[0], bf[0], smem, 0, wm, wn, lane);
    int cbuf = 0;
    mt_moe_tile C;
    for (int ct = first; mt_moe_get_tile<OP, BM, BN, BK, GM>(a, &ct, ntiles, ncol, tpe, C);
         ct += gridDim.x) {
        float acc[4][8][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
        for (int ks = 0; ks < C.k_steps; ks++) {
            const int nbuf = cbuf + 1 == stages ? 0 : cbuf + 1;
            const bf16 *cur = smem + cbuf * CF::STAGE, *nxt = smem + nbuf * CF::STAGE;
#pragma unroll
            for (int kk = 0; kk < KK; kk++) {
                const int r = kk & 1;
                if (kk + 1 < KK)
                    load_frags<OP, BK>(af[r ^ 1], bf[r ^ 1], cur, (kk + 1) * 16, wm, wn, lane);
                else
                    load_frags<OP, BK>(af[r ^ 1], bf[r ^ 1], nxt, 0, wm, wn, lane);
                if (kk == 0) load_next();
                mma_slice(acc, af[r], bf[r]);
                if (kk == KK - 2) {
                    cp_wait(stages - 2); // this thread's copies of step ks+1 are done,
                    __syncthreads();     // everyone's too, and step ks's buffer is read out
                }
            }
            cbuf = nbuf;
        }
        store_tile<OP>(a, C, acc, wm, wn, lane);
    }
    cp_wait(0);
}

template <int OP, int BK>
void launch(const mt_moe_args &a, int stages, int sms, cudaStream_t st) {
    const size_t smem = (size_t)stages * Cfg<OP, BK>::STAGE * sizeof(bf16);
    auto kern = mt_moe_mma_kernel<OP, BK>;
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int ncol, tpe;
    const int64_t tiles = mt_moe_tile_walk(OP, a, BM, BN, &ncol, &tpe, st);
    MT_ASSERT(tiles + sms < INT32_MAX); /* tile numbers, one stride past the last, are int */
    const int grid = (int)(tiles < sms ? tiles : sms); /* more blocks than SMs: useless */
    if (grid == 0) return;
    kern<<<grid, NT, smem, st>>>(a, stages, ncol, tpe);
    CUDA_LAUNCH_CHECK();
}

template <int OP> size_t stage_bytes(int bk) {
    return (size_t)(bk == 64 ? Cfg<OP, 64>::STAGE : Cfg<OP, 32>::STAGE) * sizeof(bf16);
}

/* The k step and pipeline depth of product OP: the asked ones (0: choose)
 * within what the device's shared memory holds. The choice: k steps of 64
 * when 3 buffers of them fit (A100: 3, H100: 4 of ~54 KB), else of 32
 * (GPUs of ~100 KB: 3 of ~30 KB); at most 4 buffers. */
template <int OP> void pick(int *bk, int *stages, int smem_optin) {
    const size_t optin = (size_t)smem_optin;
    if (*bk != 32 && *bk != 64) *bk = 3 * stage_bytes<OP>(64) <= optin ? 64 : 32;
    if (*bk == 64 && 2 * stage_bytes<OP>(64) > optin) *bk = 32;
    const int fit = (int)(optin / stage_bytes<OP>(*bk));
    *stages = min(min(*stages > 0 ? *stages : 4, MAX_STAGES), fit);
    MT_ASSERT(*stages >= 2); /* every GPU with bf16 mma.sync holds 2 x 30 KB */
}

void device_limits(int *sms, int *smem_optin) {
    int dev;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
}

} // namespace

bool mt_moe_mma_shape_ok(size_t IC, size_t OC) {
    return IC > 0 && OC > 0 && IC % 8 == 0 && OC % 8 == 0;
}

void mt_moe_mma_pick(int op, int *bk, int *stages) {
    int sms, optin;
    device_limits(&sms, &optin);
    if (op == MT_MOE_FWD) pick<MT_MOE_FWD>(bk, stages, optin);
    else if (op == MT_MOE_DINP) pick<MT_MOE_DINP>(bk, stages, optin);
    else pick<MT_MOE_DW>(bk, stages, optin);
}

void mt_moe_mma_run(int op, const mt_moe_args &a, int bk, int stages, cudaStream_t stream) {
    int sms, optin;
    device_limits(&sms, &optin);
    mt_moe_mma_pick(op, &bk, &stages);
    if (op == MT_MOE_FWD) {
        if (bk == 64) launch<MT_MOE_FWD, 64>(a, stages, sms, stream);
        else launch<MT_MOE_FWD, 32>(a, stages, sms, stream);
    } else if (op == MT_MOE_DINP) {
        if (bk == 64) launch<MT_MOE_DINP, 64>(a, stages, sms, stream);
        else launch<MT_MOE_DINP, 32>(a, stages, sms, stream);
    } else {
        if (bk == 64) launch<MT_MOE_DW, 64>(a, stages, sms, stream);
        else launch<MT_MOE_DW, 32>(a, stages, sms, stream);
    }
}
