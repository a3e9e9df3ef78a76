/* The Hopper bf16 attention forward (contract: attention.h); the mma.sync
 * kernel (attention_bf16_fwd.cu) is that of other GPUs.
 *
 * A block owns 128 query rows of one head: 2 warpgroups of 64 rows. Key
 * tiles of 128 stream through three shared-memory buffers (cp.async, one
 * tile ahead; the third holds the V that the previous tile's product still
 * reads). Q, K and V sit in the swizzled tiles of attention_wgmma.cuh:
 *   S = Q K^T  wgmma m64n128k16, A = Q and B = K from shared memory, both
 *              K-major (the head dim is the reduction);
 *   O += P V   wgmma m64nHDk16, A = P from registers (the scores' fp32
 *              accumulators, rescaled and rounded to bf16, are already laid
 *              out as the A fragments), B = V, MN-major.
 * Tile j's S = Q K_j^T and the previous tile's O += P V_{j-1} are issued
 * together; the softmax of S_j runs while the second is in flight, and O is
 * rescaled once it lands. The online softmax is the mma.sync kernel's (log2
 * domain, one FFMA and one EX2 a score, the same masks, packed documents
 * included, and the same lse). */
#include "backend/cuda/attention_wgmma.cuh"

namespace {

constexpr int BR = 128, BC = 128, NT = 256; // query rows, keys per tile, threads

template <int HD> struct Cfg {
    static constexpr int Q_BYTES = BR * HD * 2, KV_BYTES = BC * HD * 2;
    // Q, three buffers of (K, V), and room to align the base to 1024 bytes
    static constexpr size_t SMEM = (size_t)Q_BYTES + 6 * KV_BYTES + 1024;
};

/* DOCS: packed documents (a.pos); false compiles the plain causal kernel. */
template <int HD, bool DOCS>
__global__ void __launch_bounds__(NT, 1) mt_attn_fwd_wgmma_kernel(mt_attn_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = Cfg<HD>;
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    unsigned char *sq = mt_attn_wg_align(mt_attn_wg_smem);
    unsigned char *skv = sq + C::Q_BYTES; // buffer b: K at skv + 2b KV_BYTES, V after it
    const int T = a.T, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int wg = threadIdx.x >> 7;
    const int qb = gridDim.x - 1 - blockIdx.x; // heaviest (last) query tiles first
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    const int q0 = qb * BR;
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const bf16 *gq = (const bf16 *)a.q + ((int64_t)b * T * a.NH + h) * HD;
    const bf16 *gk = (const bf16 *)a.k + ((int64_t)b * T * a.NKV + kvh) * HD;
    const bf16 *gv = (const bf16 *)a.v + ((int64_t)b * T * a.NKV + kvh) * HD;
    const int nkb = (min(q0 + BR, T) + BC - 1) / BC;
    // Documents: no row of the tile sees a key before its first row's document.
    const int j0 = DOCS ? mt_attn_doc_start(a, b, min(q0, T - 1)) / BC : 0;

    // Tile j in buffer (j - j0) % 3.
    auto kv_buf = [&](int j) { return skv + ((j - j0) % 3) * 2 * C::KV_BYTES; };
    auto load_kv = [&](int j) {
        mt_attn_wg_load<BC, HD, NT>(kv_buf(j), gk, ldk, j * BC, T);
        mt_attn_wg_load<BC, HD, NT>(kv_buf(j) + C::KV_BYTES, gv, ldk, j * BC, T);
        mt_tc_cp_commit();
    };
    mt_attn_wg_load<BR, HD, NT>(sq, gq, ldq, q0, T);
    load_kv(j0);

    const float sl2 = a.scale * MT_ATTN_LOG2E;
    const int g = lane >> 2, t4 = lane & 3;
    const int row_lo = q0 + wg * 64 + warp * 16 + g; // this thread's rows: row_lo, row_lo + 8
    const unsigned sq_wg = mt_tc_smem_addr(sq) + wg * 64 * 128; // the warpgroup's 64 rows
    // Documents: the first key of this thread's rows (rows past T take row
    // T-1's) and of the warpgroup's last row (the latest start).
    int dstart[2] = {0, 0}, dstart_wg = 0;
    if (DOCS) {
        for (int r = 0; r < 2; r++) dstart[r] = mt_attn_doc_start(a, b, min(row_lo + r * 8, T - 1));
        dstart_wg = mt_attn_doc_start(a, b, min(q0 + wg * 64 + 63, T - 1));
    }
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; // log2-domain max, sum
    unsigned p[BC / 4]; // the previous tile's probabilities, bf16 A fragments

    // Waits for tile j, frees tile j - 2's buffer for tile j + 1.
    auto next_tile = [&](int j) {
        mt_tc_cp_wait<0>();
        mt_wg_fence_smem();
        __syncthreads();
        if (j + 1 < nkb) load_kv(j + 1);
    };
    // Issues S = Q K_j^T (64 x 128 per warpgroup), uncommitted.
    auto scores = [&](float s[BC / 2], int j) {
#pragma unroll
        for (int i = 0; i < BC / 2; i++) s[i] = 0.f;
        mt_wg_fence();
        mt_attn_wg_abt<BC, HD, BR, BC>(s, sq_wg, mt_tc_smem_addr(kv_buf(j)));
    };
    // Masks keys after the query, past T or before its document, and turns
    // tile j's scores into probabilities (online softmax per row); alpha:
    // the rescale of this thread's two rows' earlier sums.
    auto softmax = [&](float s[BC / 2], int j, float alpha[2]) {
        const int k0 = j * BC;
        const bool need_mask =
            k0 + BC - 1 > q0 + wg * 64 || k0 + BC > T || (DOCS && k0 < dstart_wg);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (need_mask) {
                    const int key = k0 + n * 8 + 2 * t4 + (e & 1), row = row_lo + (e >> 1) * 8;
                    if (key > row || key >= T || (DOCS && key < dstart[e >> 1]))
                        s[4 * n + e] = -INFINITY;
                }
                mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * n + e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r] * sl2);
            const float mu = mn == -INFINITY ? 0.f : mn; // a row with every key masked so far
            alpha[r] = mt_attn_exp2(m[r] - mu);
            m[r] = mn;
            float ps = 0.f;
#pragma unroll
            for (int n = 0; n < BC / 8; n++) {
                s[4 * n + 2 * r] = mt_attn_exp2(fmaf(s[4 * n + 2 * r], sl2, -mu));
                s[4 * n + 2 * r + 1] = mt_attn_exp2(fmaf(s[4 * n + 2 * r + 1], sl2, -mu));
                ps += s[4 * n + 2 * r] + s[4 * n + 2 * r + 1];
            }
            l[r] = l[r] * alpha[r] + ps;
        }
    };

    float s[BC / 2], alpha[2];
    next_tile(j0);
    scores(s, j0);
    mt_wg_commit();
    mt_wg_wait<0>();
    mt_attn_wg_fence<BC / 2>(s);
    softmax(s, j0, alpha);
    mt_attn_wg_pack<BC>(p, s);
    for (int j = j0 + 1; j < nkb; j++) {
        next_tile(j);
        // S = Q K_j^T and O += P V_{j-1}; the softmax of S runs under the second.
        mt_attn_wg_fence<HD / 2>(o);
        scores(s, j);
        mt_wg_commit();
        mt_attn_wg_pb<BC, HD, BC>(o, p, mt_tc_smem_addr(kv_buf(j - 1) + C::KV_BYTES));
        mt_wg_commit();
        mt_wg_wait<1>();
        mt_attn_wg_fence<BC / 2>(s);
        softmax(s, j, alpha);
        mt_attn_wg_fence<BC / 2>(s); // (keeps the softmax before the wait)
        mt_wg_wait<0>();              // the product has read p and added into O
        mt_attn_wg_hold<BC / 4>(p);
        mt_attn_wg_fence<HD / 2>(o);
        mt_attn_wg_pack<BC>(p, s);
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[4 * n + e] *= alpha[e >> 1];
    }
    // The last tile's O += P V.
    mt_attn_wg_fence<HD / 2>(o);
    mt_wg_fence();
    mt_attn_wg_pb<BC, HD, BC>(o, p, mt_tc_smem_addr(kv_buf(nkb - 1) + C::KV_BYTES));
    mt_wg_commit();
    mt_wg_wait<0>();
    mt_attn_wg_fence<HD / 2>(o);

    bf16 *go = (bf16 *)a.o + ((int64_t)b * T * a.NH + h) * HD;
    float *gof = a.o_f32 ? a.o_f32 + ((int64_t)b * T * a.NH + h) * HD : nullptr;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lr = l[r];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int row = row_lo + r * 8;
        if (row >= T) continue;
        const float inv = 1.f / lr;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            const int d = n * 8 + 2 * t4;
            const float x0 = o[4 * n + 2 * r] * inv, x1 = o[4 * n + 2 * r + 1] * inv;
            *(__nv_bfloat162 *)(go + row * ldq + d) = __floats2bfloat162_rn(x0, x1);
            if (gof) *(float2 *)(gof + row * ldq + d) = make_float2(x0, x1);
        }
        if (t4 == 0) a.lse[((int64_t)b * a.NH + h) * T + row] = m[r] * MT_ATTN_LN2 + logf(lr);
    }
#endif
}

template <int HD, bool DOCS>
int launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    auto kern = mt_attn_fwd_wgmma_kernel<HD, DOCS>;
    if (mt_attn_set_smem((const void *)kern, Cfg<HD>::SMEM, err)) return -1;
    dim3 grid((a.T + BR - 1) / BR, a.NH, B);
    kern<<<grid, NT, Cfg<HD>::SMEM, st>>>(a);
    return mt_attn_check_launch(err, "attention forward (bf16, wgmma)");
}

} // namespace

/* The forward at HD 128 takes the most shared memory of the Hopper kernels. */
bool mt_attn_wgmma_available(void) { return mt_wg_device_fits(Cfg<128>::SMEM); }

int mt_attn_fwd_wgmma(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.pos)
        return a.HD == 64 ? launch<64, true>(a, B, st, err) : launch<128, true>(a, B, st, err);
    return a.HD == 64 ? launch<64, false>(a, B, st, err) : launch<128, false>(a, B, st, err);
}
