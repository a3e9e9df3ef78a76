/* The Hopper bf16 attention forward (contract: attention.h); the mma.sync
 * kernel (attention_mma_fwd.cu) is that of other GPUs.
 *
 * FlashAttention-3's structure. A block works on 128 query rows of one head
 * at a time (a persistent grid claims query tiles, mt_attn_qtiles) and
 * has three warpgroups: a producer, whose one thread loads each tile's Q and
 * its key tiles of 128 (Q, K and V, two buffers each) by TMA into the 128-byte
 * swizzled tiles of attention_wgmma.cuh, each buffer with a full and an
 * empty barrier; and two consumers of 64 rows each, which take turns (two
 * named barriers) to issue their products, so that one's softmax runs under
 * the other's products:
 *   S = Q K^T  wgmma m64n128k16, A = Q and B = K from shared memory, both
 *              K-major (the head dim is the reduction);
 *   O += P V   wgmma m64nHDk16, A = P from registers (the scores' fp32
 *              accumulators, rescaled and rounded to bf16, are already laid
 *              out as the A fragments), B = V, MN-major.
 * Tile j's S and the previous tile's P V are issued together; the softmax
 * of S_j sits between their waits and O is rescaled once the second lands.
 * The online softmax is the mma.sync kernel's (log2 domain, one FFMA and
 * one EX2 a score, the same masks, packed documents included, and the same
 * lse). */
#include <type_traits>

#include "kernels/attention/attention_wgmma.cuh"

namespace {

constexpr int BR = 128, BC = 128, NT = 384; // query rows, keys per tile, threads
constexpr int STAGES = 2;                      // buffers of K and of V

template <int HD> struct Cfg {
    static constexpr int Q_BYTES = BR * HD * 2, KV_BYTES = BC * HD * 2;
    // two Q buffers, the K and V buffers, the output's staging tile (as large
    // as Q), room to align the base to 1024 bytes, the barriers: 225 KB at
    // HD 128, within the 227 KB a block may have on Hopper
    static constexpr size_t SMEM = (size_t)3 * Q_BYTES + 2 * STAGES * KV_BYTES + 1024 + 256;
};

/* DOCS: packed documents (a.pos); false compiles the plain causal kernel.
 * tq, tk, tv: TMA maps of q, k, v as (a.HD, heads, T, B), boxes of 64
 * head-dim columns by 128 rows, 128-byte swizzle; to: of the output, boxes
 * of 64 rows (a consumer's), which the consumers stage in shared memory in
 * the same layout and store by TMA. HD is the width computed:
 * a.HD itself, or 128 for a.HD 80 and 96, whose columns past a.HD the TMA
 * fills with zeros (no score changes, the output's extra columns are 0
 * and not stored).
 *
 * Persistent: a block walks the query tiles it claims (those of tl, in
 * their order): its producer claims the next from the device's counter as
 * soon as it has issued the current one's loads, so that blocks that drew
 * light tiles claim more. One ring of key tiles runs on across them, and Q
 * has two buffers, each with a full and an empty barrier, so that the
 * producer loads the next tile's Q (as soon as it has issued this one's last
 * keys) and first keys while the consumers finish this one.
 * ctr: the device's tile counter (mt_attn_tile_counter), zero at launch and
 * left zero. */
template <int HD, bool DOCS>
__global__ void __launch_bounds__(NT, 1)
    mt_attn_fwd_wgmma_kernel(const __grid_constant__ CUtensorMap tq,
                             const __grid_constant__ CUtensorMap tk,
                             const __grid_constant__ CUtensorMap tv,
                             const __grid_constant__ CUtensorMap to, mt_attn_args a,
                             mt_attn_qtiles tl, unsigned *ctr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = Cfg<HD>;
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    unsigned char *sq = mt_attn_wg_align(mt_attn_wg_smem);
    const unsigned q_s = mt_tc_smem_addr(sq);
    // Two Q buffers (the block's n-th tile uses buffer n % 2), the key-tile
    // ring, the output's staging tile, then the barriers (8 bytes each): the
    // Q buffers' full and empty, the four claim slots' (below), the ring's;
    // then the slots.
    const unsigned o_s = q_s + 2 * C::Q_BYTES + 2 * STAGES * C::KV_BYTES;
    const unsigned bar = o_s + C::Q_BYTES;
    auto q_buf = [&](int n) { return q_s + (n & 1) * C::Q_BYTES; };
    auto q_full = [&](int n) { return bar + 8 * (n & 1); };
    auto q_empty = [&](int n) { return bar + 16 + 8 * (n & 1); };
    const mt_attn_kv_ring<BC, HD, STAGES> kv = {
        q_s + 2 * C::Q_BYTES, q_s + 2 * C::Q_BYTES + STAGES * C::KV_BYTES, bar + 64};
    // The block's n-th tile (mt_attn_qtiles::decode), or -1 past its last.
    // The producer runs at most two tiles (its Q buffers) ahead of the
    // consumers' reading of a slot (at the end of the tile before).
    const mt_attn_claims claims = {bar + 32,
                                   (volatile int *)(sq + (bar - q_s) + 64 + 32 * STAGES)};
    const int T = a.T, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int wg = threadIdx.x >> 7;

    if (threadIdx.x == 0) {
        for (int c = 0; c < 2; c++) {
            mt_mb_init(q_full(c), 1);
            mt_mb_init(q_empty(c), 256);
        }
        claims.init();
        kv.init();
        mt_mb_fence_init();
    }
    __syncthreads();

    if (wg == 0) { // the producer
        mt_wg_regs_dec<24>();
        if (threadIdx.x != 0) return;
        // Claims the block's n-th tile (mt_attn_claim) and posts it.
        auto claim = [&](int n) {
            const int L = mt_attn_claim(ctr, tl.n);
            claims.post(n, L);
            return L;
        };
        // The next tile is claimed as soon as this one's loads are issued,
        // so that the consumers know it before they end this one.
        for (int n = 0, i0 = 0, L = claim(0); L >= 0; n++) {
            int qb, h, b;
            tl.decode(L, &qb, &h, &b);
            const int q0 = qb * BR, nkb = (min(q0 + BR, T) + BC - 1) / BC;
            const int j0 = DOCS ? mt_attn_doc_start(a, b, min(q0, T - 1)) / BC : 0;
            // Q buffer n % 2 is free once tile n - 2 has done its last S.
            if (n >= 2) mt_mb_wait(q_empty(n), ((n >> 1) & 1) ^ 1);
            mt_mb_expect_tx(q_full(n), C::Q_BYTES);
            for (int c = 0; c < HD / 64; c++)
                mt_tma_load4(q_buf(n) + c * BR * 128, &tq, c * 64, h, q0, b, q_full(n));
            const int next = claim(n + 1);
            kv.produce(&tk, &tv, h / (a.NH / a.NKV), b, j0, nkb, i0);
            i0 += nkb - j0;
            L = next;
        }
        return;
    }
    mt_wg_regs_inc<240>();
    const int cw = wg - 1; // this consumer: rows q0 + 64 cw ..
    const float sl2 = a.scale * MT_ATTN_LOG2E;
    const int g = lane >> 2, t4 = lane & 3;
    int L = claims.get(0);
    if (L >= 0) mt_attn_turns_begin(cw);
    // n, i0: the query tiles and the key tiles this block has done
    for (int n = 0, i0 = 0; L >= 0; n++) {
        int qb, h, b;
        tl.decode(L, &qb, &h, &b);
        const int q0 = qb * BR;
        const int nkb = (min(q0 + BR, T) + BC - 1) / BC;
        // Documents: no row of the tile sees a key before its first row's document.
        const int j0 = DOCS ? mt_attn_doc_start(a, b, min(q0, T - 1)) / BC : 0;
        const int row_lo = q0 + cw * 64 + warp * 16 + g; // this thread's rows: row_lo, row_lo + 8
        const unsigned sq_wg = q_buf(n) + cw * 64 * 128; // the consumer's 64 rows
        // Documents: the first key of this thread's rows (rows past T take row
        // T-1's) and of the consumer's last row (the latest start).
        int dstart[2] = {0, 0}, dstart_wg = 0;
        if (DOCS) {
            for (int e = 0; e < 2; e++)
                dstart[e] = mt_attn_doc_start(a, b, min(row_lo + e * 8, T - 1));
            dstart_wg = mt_attn_doc_start(a, b, min(q0 + cw * 64 + 63, T - 1));
        }
        float o[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; // log2-domain max, sum
        unsigned p[BC / 4]; // the previous tile's probabilities, bf16 A fragments

        // Issues S = Q K^T (64 x 128 per consumer) over K buffer st, uncommitted.
        auto scores = [&](float s[BC / 2], int st) {
            mt_wg_fence();
            mt_attn_wg_abt<BC, HD, BR, BC>(s, sq_wg, kv.k(st));
        };
        // Whether tile j has keys after a query of this consumer, past T or
        // before a row's document: the diagonal tile, the last one of a ragged
        // T, the first ones of packed documents.
        auto need_mask = [&](int j) {
            const int k0 = j * BC;
            return k0 + BC - 1 > q0 + cw * 64 || k0 + BC > T || (DOCS && k0 < dstart_wg);
        };
        // Turns tile j's scores into probabilities (online softmax per row),
        // masking keys after the query, past T or before its document when
        // masked (std::true_type). The other tiles, most of them, take code
        // with no mask at all: its compares and selects were two fifths of
        // the loop's instructions, which the products could not hide.
        // alpha: the rescale of this thread's two rows' earlier sums.
        auto softmax = [&](float s[BC / 2], int j, float alpha[2], auto masked) {
            // Score 4c + e is key j BC + 2 t4 + x, x = 8c + (e & 1) (a constant),
            // of row row_lo + 8 (e >> 1): masked where x > hi or x < lo of its row.
            [[maybe_unused]] int hi[2], lo[2];
            if constexpr (decltype(masked)::value) {
                const int kb = j * BC + 2 * t4;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    hi[r] = min(row_lo + r * 8, T - 1) - kb;
                    lo[r] = DOCS ? dstart[r] - kb : 0;
                }
            }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int c = 0; c < BC / 8; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if constexpr (decltype(masked)::value) {
                        const int x = c * 8 + (e & 1);
                        if (x > hi[e >> 1] || (DOCS && x < lo[e >> 1])) s[4 * c + e] = -INFINITY;
                    }
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * c + e]);
                }
#pragma unroll
            for (int e = 0; e < 2; e++) {
                mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
                mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
                const float mn = fmaxf(m[e], mx[e] * sl2);
                const float mu = mn == -INFINITY ? 0.f : mn; // a row with every key masked so far
                alpha[e] = mt_attn_exp2(m[e] - mu);
                m[e] = mn;
                float ps = 0.f;
#pragma unroll
                for (int c = 0; c < BC / 8; c++) {
                    s[4 * c + 2 * e] = mt_attn_exp2(fmaf(s[4 * c + 2 * e], sl2, -mu));
                    s[4 * c + 2 * e + 1] = mt_attn_exp2(fmaf(s[4 * c + 2 * e + 1], sl2, -mu));
                    ps += s[4 * c + 2 * e] + s[4 * c + 2 * e + 1];
                }
                l[e] = l[e] * alpha[e] + ps;
            }
        };

        float s[BC / 2], alpha[2];
        mt_mb_wait(q_full(n), (n >> 1) & 1);
        kv.wait_k(i0);
        mt_attn_turn_take(cw);
        scores(s, i0 % STAGES);
        mt_wg_commit();
        mt_attn_turn_pass(cw, false);
        mt_wg_wait<0>();
        mt_attn_wg_fence<BC / 2>(s);
        mt_mb_arrive(kv.empty_k(i0 % STAGES));
        if (nkb - j0 == 1) mt_mb_arrive(q_empty(n)); // the tile's last read of Q
        softmax(s, j0, alpha, std::true_type());
        mt_attn_wg_pack<BC>(p, s);
        for (int j = j0 + 1; j < nkb; j++) {
            const int i = i0 + j - j0, st = i % STAGES, pst = (i - 1) % STAGES;
            kv.wait_k(i);
            kv.wait_v(i - 1);
            // S = Q K_j^T and O += P V_{j-1}; the softmax of S runs under the other
            // consumer's products.
            mt_attn_turn_take(cw);
            mt_attn_wg_fence<HD / 2>(o);
            scores(s, st);
            mt_wg_commit();
            mt_attn_wg_pb<BC, HD, BC>(o, p, kv.v(pst));
            mt_wg_commit();
            mt_attn_turn_pass(cw, false);
            mt_wg_wait<1>();
            mt_attn_wg_fence<BC / 2>(s);
            mt_mb_arrive(kv.empty_k(st));
            if (j == nkb - 1) mt_mb_arrive(q_empty(n));
            if (need_mask(j)) softmax(s, j, alpha, std::true_type());
            else softmax(s, j, alpha, std::false_type());
            mt_attn_wg_fence<BC / 2>(s); // (keeps the softmax before the wait)
            mt_wg_wait<0>();              // the product has read p and added into O
            mt_attn_wg_hold<BC / 4>(p);
            mt_attn_wg_fence<HD / 2>(o);
            mt_mb_arrive(kv.empty_v(pst));
            mt_attn_wg_pack<BC>(p, s);
#pragma unroll
            for (int c = 0; c < HD / 8; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[4 * c + e] *= alpha[e >> 1];
        }
        // The last tile's O += P V.
        const int il = i0 + nkb - 1 - j0;
        kv.wait_v(il);
        mt_attn_turn_take(cw);
        mt_attn_wg_fence<HD / 2>(o);
        mt_wg_fence();
        mt_attn_wg_pb<BC, HD, BC>(o, p, kv.v(il % STAGES));
        mt_wg_commit();
        const int next = claims.get(n + 1);
        mt_attn_turn_pass(cw, next < 0);
        mt_wg_wait<0>();
        mt_attn_wg_fence<HD / 2>(o);
        mt_mb_arrive(kv.empty_v(il % STAGES));

        // The output: normalised rows into the consumer's staging tile (64 rows,
        // swizzled as the TMA boxes; conflict-free, the 8 rows of a store
        // falling in 8 distinct 16-byte chunks), then one thread's TMA store,
        // which leaves out rows past T and columns past a.HD. The tile is
        // written again once the last store has read it.
        const unsigned o_wg = o_s + cw * 64 * HD * 2;
        const bool lead = (threadIdx.x & 127) == 0;
        if (lead) mt_tma_store_wait<true>();
        mt_bar_sync(3 + cw, 128);
        const int64_t ldq = (int64_t)a.NH * a.HD;
        float *gof = a.o_f32 ? a.o_f32 + ((int64_t)b * T * a.NH + h) * a.HD : nullptr;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float lr = l[e];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = row_lo + e * 8, r = warp * 16 + g + e * 8; // r: in the tile
            const float inv = 1.f / lr;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                const float x0 = o[4 * c + 2 * e] * inv, x1 = o[4 * c + 2 * e + 1] * inv;
                const unsigned at = o_wg + (c >> 3) * (64 * 128) + mt_wg_swz(r, c & 7) + 4 * t4;
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(mt_attn_pack(x0, x1)));
                const int d = c * 8 + 2 * t4;
                if (gof && row < T && d < a.HD)
                    *(float2 *)(gof + row * ldq + d) = make_float2(x0, x1);
            }
            if (t4 == 0 && row < T)
                a.lse[((int64_t)b * a.NH + h) * T + row] = m[e] * MT_ATTN_LN2 + logf(lr);
        }
        mt_wg_fence_smem();
        mt_bar_sync(3 + cw, 128);
        if (lead) {
            for (int c = 0; c < HD / 64; c++)
                mt_tma_store4(&to, o_wg + c * 64 * 128, c * 64, h, q0 + cw * 64, b);
            mt_tma_store_commit();
        }
        i0 += nkb - j0;
        L = next;
    }
    if ((threadIdx.x & 127) == 0) mt_tma_store_wait<false>(); // before the block's memory goes
#endif
}

template <int HD, bool DOCS>
int launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    auto kern = mt_attn_fwd_wgmma_kernel<HD, DOCS>;
    CUtensorMap tq, tk, tv, to;
    if (mt_attn_tma_map(&tq, a.q, B, a.T, a.NH, a.HD, BR, err) ||
        mt_attn_tma_map(&tk, a.k, B, a.T, a.NKV, a.HD, BC, err) ||
        mt_attn_tma_map(&tv, a.v, B, a.T, a.NKV, a.HD, BC, err) ||
        mt_attn_tma_map(&to, a.o, B, a.T, a.NH, a.HD, 64, err))
        return -1;
    if (mt_attn_set_smem((const void *)kern, Cfg<HD>::SMEM, err)) return -1;
    mt_attn_qtiles tl;
    mt_attn_layout lay;
    unsigned *ctr;
    if (mt_attn_qtiles_init(&tl, a, B, BR, &lay, err) || mt_attn_tile_counter(&ctr, st, err))
        return -1;
    kern<<<lay.grid, NT, Cfg<HD>::SMEM, st>>>(tq, tk, tv, to, a, tl, ctr);
    return mt_attn_check_launch(err, "attention forward (bf16, wgmma)");
}

} // namespace

/* The kernels at HD 128 take the most shared memory; the forward needs the
 * driver's tensor maps too. */
bool mt_attn_wgmma_available(void) {
    return mt_wg_device_fits(Cfg<128>::SMEM) && mt_wg_device_fits(mt_attn_bwd_wgmma_smem()) &&
           mt_attn_tma_available();
}

int mt_attn_fwd_wgmma(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    // HD 80 and 96 run as 128 (the kernels' comment)
    if (a.pos)
        return a.HD == 64 ? launch<64, true>(a, B, st, err) : launch<128, true>(a, B, st, err);
    return a.HD == 64 ? launch<64, false>(a, B, st, err) : launch<128, false>(a, B, st, err);
}
