/* The Hopper bf16 attention backward (contract: attention.h); the mma.sync
 * kernels (attention_mma_bwd.cu) are those of other GPUs. The same two
 * passes, each without atomics, in the forward's structure: a producer
 * warpgroup loads tiles by TMA into buffers with full/empty barriers, and
 * two consumer warpgroups take turns (named barriers) to issue products
 * from the swizzled tiles of attention_wgmma.cuh:
 *   dK, dV: a block owns 128 keys of one kv head (64 a consumer), loaded
 *     once, and walks the query tiles of 64 of every head of its group
 *     (Q, dO and their rows' lse, D and positions; three buffers):
 *       S^T = K Q^T, dP^T = V dO^T    m64n64, both from shared memory
 *       P^T = exp(S^T - lse), dS^T = P^T (dP^T - D)    in registers
 *       dV += P^T dO, dK += dS^T Q    m64nHD, A from registers, B MN-major
 *   dQ: a block owns 128 query rows of one head at a time (64 a consumer),
 *     Q and dO loaded once, and walks their key tiles of 128 (two buffers of
 *     K and V); the grid is persistent, a block an SM:
 *       S = Q K^T, dP = dO V^T        m64n128, from shared memory
 *       dQ += dS K                    A from registers, B MN-major
 * The masks, the document bounds and the lse and D values are those of the
 * mma.sync kernels. dP waits while P is computed from S. */
#include <type_traits>

#include "kernels/attention/attention_wgmma.cuh"

namespace {

template <int HD> struct DkvCfg {
    static constexpr int BC = 128, BR = 64, NT = 384; // keys per block, queries per tile, threads
    static constexpr int STAGES = 3;                  // buffers of (Q, dO, lse, D, positions)
    static constexpr int K_BYTES = BC * HD * 2, Q_BYTES = BR * HD * 2, ST_BYTES = 3 * BR * 4;
    // K, V, the buffers, room to align, the barriers
    static constexpr size_t SMEM =
        2 * (size_t)K_BYTES + STAGES * (2 * Q_BYTES + ST_BYTES) + 1024 + 256;
};

template <int HD> struct DqCfg {
    static constexpr int BR = 128, BC = 128, NT = 384; // rows per block, keys per tile, threads
    static constexpr int STAGES = 2;                   // buffers of K and of V
    static constexpr int Q_BYTES = BR * HD * 2, KV_BYTES = BC * HD * 2;
    // Q, dO, the K and V buffers, room to align, the barriers
    static constexpr size_t SMEM = 2 * (size_t)Q_BYTES + 2 * STAGES * KV_BYTES + 1024 + 256;
};

/* DOCS: packed documents (a.pos); false compiles the plain causal kernel.
 * tq, tdo: TMA maps of q and dout with boxes of 64 rows, tk, tv of k and v
 * with boxes of 128 (attention_wgmma.cuh). Persistent: the items are the
 * (key tile, group) pairs in the order of mt_attn_chunked over ngroups
 * groups (batch row, kv head), the first (heaviest) key tile of each first,
 * which the blocks claim from the counter pair ctr (mt_attn_claim) one at a
 * time: the items differ in work up to G * T / 64-fold, so static shares
 * would be uneven. K and V have a full and an empty barrier, and the ring of
 * query tiles runs on across items, so that the producer loads the next
 * item's keys and first queries while the consumers end an item and store
 * its rows. */
template <int HD, bool DOCS>
__global__ void __launch_bounds__(DkvCfg<HD>::NT, 1)
    mt_attn_dkv_wgmma_kernel(const __grid_constant__ CUtensorMap tq,
                             const __grid_constant__ CUtensorMap tdo,
                             const __grid_constant__ CUtensorMap tk,
                             const __grid_constant__ CUtensorMap tv, mt_attn_args a,
                             int ngroups, int nkb, int chunk, unsigned *ctr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = DkvCfg<HD>;
    constexpr int S = C::STAGES;
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    unsigned char *base = mt_attn_wg_align(mt_attn_wg_smem);
    const unsigned k_s = mt_tc_smem_addr(base), v_s = k_s + C::K_BYTES;
    const unsigned q_s = v_s + C::K_BYTES; // stage st: Q at q_s + 2 st Q_BYTES, dO after it
    float *sl = (float *)(base + 2 * C::K_BYTES + 2 * S * C::Q_BYTES); // stage st: + 3 st BR
    // Barriers (8 bytes each): K and V full and empty, per stage full and
    // empty, the four claim slots'; then the slots.
    const unsigned bar = q_s + 2 * S * C::Q_BYTES + S * C::ST_BYTES;
    const unsigned kv_full = bar, kv_empty = bar + 8;
    auto full = [&](int st) { return bar + 16 + 16 * st; };
    auto empty = [&](int st) { return bar + 24 + 16 * st; };
    // The block's n-th item, or -1 past its last: the producer's threads run
    // at most S = 3 query tiles, so 3 items, ahead of the consumers.
    const mt_attn_claims claims = {bar + 16 + 16 * S,
                                   (volatile int *)(base + (bar - k_s) + 16 + 16 * S + 32)};
    const int T = a.T, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int wg = threadIdx.x >> 7, G = a.NH / a.NKV, nitems = ngroups * nkb;
    // Item w: kv head, batch row, first key, first query tile and query
    // tiles a head (from the key tile on, up to the end of its last key's
    // document).
    struct item {
        int kvh, b, k0, qb0, nqb;
    };
    auto item_of = [&](int w) {
        item it;
        int grp, kb;
        mt_attn_chunked(w, ngroups, nkb, chunk, &grp, &kb);
        it.kvh = grp % a.NKV;
        it.b = grp / a.NKV;
        it.k0 = kb * C::BC;
        const int q_end = DOCS ? mt_attn_doc_end(a, it.b, min(it.k0 + C::BC, T) - 1) : T;
        it.qb0 = it.k0 / C::BR;
        it.nqb = (q_end + C::BR - 1) / C::BR - it.qb0;
        return it;
    };

    if (threadIdx.x == 0) {
        mt_mb_init(kv_full, 1);
        mt_mb_init(kv_empty, 256);
        for (int st = 0; st < S; st++) {
            mt_mb_init(full(st), 128); // every producer thread (their row statistics)
            mt_mb_init(empty(st), 256); // every consumer thread
        }
        claims.init();
        mt_mb_fence_init();
    }
    __syncthreads();

    // An item's iteration it covers query head kvh*G + it / nqb and query tile
    // qb0 + it % nqb; gi counts the block's iterations (the ring's tiles).
    if (wg == 0) { // the producer: thread 0 the tiles, every thread the row statistics
        mt_wg_regs_dec<40>();
        for (int n = 0, gi = 0;; n++) {
            // Thread 0 claims the item and posts it, the others read it.
            int w;
            if (threadIdx.x == 0) {
                w = mt_attn_claim(ctr, nitems);
                claims.post(n, w);
            } else {
                w = claims.get(n);
            }
            if (w < 0) break;
            const item m = item_of(w);
            if (threadIdx.x == 0) {
                if (n > 0) mt_mb_wait(kv_empty, (n - 1) & 1);
                mt_mb_expect_tx(kv_full, 2 * C::K_BYTES);
                for (int c = 0; c < HD / 64; c++) {
                    mt_tma_load4(k_s + c * C::BC * 128, &tk, c * 64, m.kvh, m.k0, m.b, kv_full);
                    mt_tma_load4(v_s + c * C::BC * 128, &tv, c * 64, m.kvh, m.k0, m.b, kv_full);
                }
            }
            for (int it = 0; it < G * m.nqb; it++, gi++) {
                const int st = gi % S, h = m.kvh * G + it / m.nqb;
                const int q0 = (m.qb0 + it % m.nqb) * C::BR;
                if (gi >= S) mt_mb_wait(empty(st), ((gi / S) & 1) ^ 1);
                if (threadIdx.x < C::BR) { // lse, D, positions; rows past T read 0
                    const int r = threadIdx.x, q = q0 + r;
                    const int64_t i = ((int64_t)m.b * a.NH + h) * T + q;
                    float *l = sl + st * 3 * C::BR;
                    l[r] = q < T ? a.lse[i] : 0.f;
                    l[C::BR + r] = q < T ? a.dsum[i] : 0.f;
                    if (DOCS) ((int32_t *)l)[2 * C::BR + r] = q < T ? a.pos[(int64_t)m.b * T + q] : 0;
                }
                if (threadIdx.x == 0) {
                    mt_mb_expect_tx(full(st), 2 * C::Q_BYTES);
                    const unsigned d = q_s + st * 2 * C::Q_BYTES;
                    for (int c = 0; c < HD / 64; c++) {
                        mt_tma_load4(d + c * C::BR * 128, &tq, c * 64, h, q0, m.b, full(st));
                        mt_tma_load4(d + C::Q_BYTES + c * C::BR * 128, &tdo, c * 64, h, q0, m.b,
                                     full(st));
                    }
                } else {
                    mt_mb_arrive(full(st));
                }
            }
        }
        return;
    }
    mt_wg_regs_inc<232>();
    const int cw = wg - 1; // this consumer: keys k0 + 64 cw ..
    const float sl2 = a.scale * MT_ATTN_LOG2E;
    const int g = lane >> 2, t4 = lane & 3;
    const unsigned sk_wg = k_s + cw * 64 * 128, sv_wg = v_s + cw * 64 * 128; // the 64 keys
    int w = claims.get(0);
    if (w >= 0) mt_attn_turns_begin(cw);
    for (int n = 0, gi = 0; w >= 0; n++) {
        const item m = item_of(w);
        const int nit = G * m.nqb, k0 = m.k0;
        int next = -1; // the next item, known by the item's last turn
        const int kw = k0 + cw * 64 + warp * 16, key_lo = kw + g; // keys key_lo, key_lo + 8
        float dk[HD / 2], dv[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;

        mt_mb_wait(kv_full, n & 1);
        for (int it = 0; it < nit; it++, gi++) {
            const int st = gi % S;
            mt_mb_wait(full(st), (gi / S) & 1);
            const unsigned qt = q_s + st * 2 * C::Q_BYTES, dot = qt + C::Q_BYTES;
            const float *l_s = sl + st * 3 * C::BR, *d_s = l_s + C::BR;
            const int32_t *p_s = (const int32_t *)(d_s + C::BR);
            const int q0 = (m.qb0 + it % m.nqb) * C::BR;
            const int dstart_last = DOCS ? mt_attn_tile_last_start<C::BR>(p_s, q0, T) : 0;

            // S^T = K Q^T and dP^T = V dO^T (64 keys x 64 queries a consumer).
            float st_[32], dpt[32];
            if (it + 1 == nit) next = claims.get(n + 1);
            mt_attn_wg_abt2<64, HD, C::BC, C::BR>(st_, sk_wg, qt, dpt, sv_wg, dot, cw,
                                                  it + 1 == nit && next < 0);
            // P^T: the causal mask, queries past T (their lse reads 0) and
            // queries of a later document than the key give 0.
            // The tiles that need no mask (most of them) take code with none.
            auto probs = [&](auto masked) {
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    const int qc = (i >> 2) * 8 + 2 * t4 + (i & 1), key = key_lo + ((i >> 1) & 1) * 8;
                    float x = mt_attn_exp2(fmaf(st_[i], sl2, -l_s[qc] * MT_ATTN_LOG2E));
                    if constexpr (decltype(masked)::value)
                        if (q0 + qc < key || q0 + qc >= T || (DOCS && q0 + qc - p_s[qc] > key))
                            x = 0.f;
                    st_[i] = x;
                }
            };
            if (q0 < kw + 15 || q0 + C::BR > T || (DOCS && dstart_last > kw))
                probs(std::true_type());
            else probs(std::false_type());
            mt_wg_wait<0>();
            mt_attn_wg_fence<32>(dpt);
            if (it + 1 == nit) mt_mb_arrive(kv_empty); // the item's last read of K and V
#pragma unroll
            for (int i = 0; i < 32; i++)
                dpt[i] = st_[i] * (dpt[i] - d_s[(i >> 2) * 8 + 2 * t4 + (i & 1)]);

            // dV += P^T dO, dK += dS^T Q (the queries are the reduction).
            unsigned pt[16], dst[16];
            mt_attn_wg_pack<64>(pt, st_);
            mt_attn_wg_pack<64>(dst, dpt);
            mt_attn_wg_fence<HD / 2>(dv);
            mt_attn_wg_fence<HD / 2>(dk);
            mt_wg_fence();
            mt_attn_wg_pb<64, HD, C::BR>(dv, pt, dot);
            mt_attn_wg_pb<64, HD, C::BR>(dk, dst, qt);
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<HD / 2>(dv);
            mt_attn_wg_fence<HD / 2>(dk);
            mt_mb_arrive(empty(st));
        }

        const int64_t ldk = (int64_t)a.NKV * a.HD;
        float *gdk = a.dk + ((int64_t)m.b * T * a.NKV + m.kvh) * a.HD;
        float *gdv = a.dv + ((int64_t)m.b * T * a.NKV + m.kvh) * a.HD;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int key = key_lo + r * 8;
            if (key >= T) continue;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                const int d = c * 8 + 2 * t4;
                if (d >= a.HD) break; // padded columns
                *(float2 *)(gdk + key * ldk + d) =
                    make_float2(dk[4 * c + 2 * r] * a.scale, dk[4 * c + 2 * r + 1] * a.scale);
                *(float2 *)(gdv + key * ldk + d) =
                    make_float2(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]);
            }
        }
        w = next;
    }
#endif
}

/* tq, tdo, tk, tv: TMA maps (attention_wgmma.cuh) of q, dout, k, v.
 * Persistent (mt_attn_launch_layout's grid): block x takes the query tiles
 * x, x + grid, ... of tl (those of the forward, in its order), with
 * one ring of key tiles running on across them, and Q and dO behind a full
 * and an empty barrier, so that the producer loads the next tile's Q, dO
 * and first keys while the consumers end a tile and store its rows. */
template <int HD, bool DOCS>
__global__ void __launch_bounds__(DqCfg<HD>::NT, 1)
    mt_attn_dq_wgmma_kernel(const __grid_constant__ CUtensorMap tq,
                            const __grid_constant__ CUtensorMap tdo,
                            const __grid_constant__ CUtensorMap tk,
                            const __grid_constant__ CUtensorMap tv, mt_attn_args a,
                            mt_attn_qtiles tl) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = DqCfg<HD>;
    constexpr int S = C::STAGES;
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    const unsigned q_s = mt_tc_smem_addr(mt_attn_wg_align(mt_attn_wg_smem)), do_s = q_s + C::Q_BYTES;
    // Q, dO, the key-tile ring, then the barriers: Q and dO full and empty
    // (8 bytes each), the ring's.
    const unsigned bar = do_s + C::Q_BYTES + 2 * S * C::KV_BYTES;
    const unsigned q_full = bar, q_empty = bar + 8;
    const mt_attn_kv_ring<C::BC, HD, S> kv = {do_s + C::Q_BYTES,
                                              do_s + C::Q_BYTES + S * C::KV_BYTES, bar + 16};
    const int T = a.T, lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    const int wg = threadIdx.x >> 7;
    // The block's n-th item: its query tile, head, batch row, key tiles.
    struct item {
        int q0, h, b, nkb, j0;
    };
    auto item_of = [&](int w) {
        item it;
        int qb;
        tl.decode(w, &qb, &it.h, &it.b);
        it.q0 = qb * C::BR;
        it.nkb = (min(it.q0 + C::BR, T) + C::BC - 1) / C::BC;
        // Documents: no row of the tile sees a key before its first row's document.
        it.j0 = DOCS ? mt_attn_doc_start(a, it.b, min(it.q0, T - 1)) / C::BC : 0;
        return it;
    };

    if (threadIdx.x == 0) {
        mt_mb_init(q_full, 1);
        mt_mb_init(q_empty, 256);
        kv.init();
        mt_mb_fence_init();
    }
    __syncthreads();

    if (wg == 0) { // the producer
        mt_wg_regs_dec<24>();
        if (threadIdx.x != 0) return;
        for (int n = 0, w = blockIdx.x, i0 = 0; w < tl.n; n++, w += gridDim.x) {
            const item it = item_of(w);
            if (n > 0) mt_mb_wait(q_empty, (n - 1) & 1);
            mt_mb_expect_tx(q_full, 2 * C::Q_BYTES);
            for (int c = 0; c < HD / 64; c++) {
                mt_tma_load4(q_s + c * C::BR * 128, &tq, c * 64, it.h, it.q0, it.b, q_full);
                mt_tma_load4(do_s + c * C::BR * 128, &tdo, c * 64, it.h, it.q0, it.b, q_full);
            }
            kv.produce(&tk, &tv, it.h / (a.NH / a.NKV), it.b, it.j0, it.nkb, i0);
            i0 += it.nkb - it.j0;
        }
        return;
    }
    mt_wg_regs_inc<240>();
    const int cw = wg - 1; // this consumer: rows q0 + 64 cw ..
    const float sl2 = a.scale * MT_ATTN_LOG2E;
    const int g = lane >> 2, t4 = lane & 3;
    const unsigned sq_wg = q_s + cw * 64 * 128, sdo_wg = do_s + cw * 64 * 128; // 64 rows
    if (blockIdx.x < tl.n) mt_attn_turns_begin(cw);
    // n, i0: the items and the key tiles this block has done
    for (int n = 0, w = blockIdx.x, i0 = 0; w < tl.n; n++, w += gridDim.x) {
        const item it = item_of(w);
        const int q0 = it.q0, h = it.h, b = it.b, nkb = it.nkb, j0 = it.j0;
        const bool last_item = w + (int)gridDim.x >= tl.n;
        const int rw = q0 + cw * 64 + warp * 16, row_lo = rw + g; // rows row_lo, row_lo + 8
        const int64_t lrow = ((int64_t)b * a.NH + h) * T;
        // Rows past T are never stored; any finite values keep them harmless.
        float lse2[2], D[2];
        int dstart[2] = {0, 0};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_lo + r * 8;
            lse2[r] = row < T ? a.lse[lrow + row] * MT_ATTN_LOG2E : 0.f;
            D[r] = row < T ? a.dsum[lrow + row] : 0.f;
            if (DOCS) dstart[r] = mt_attn_doc_start(a, b, min(row, T - 1));
        }
        const int dstart_warp = DOCS ? mt_attn_doc_start(a, b, min(rw + 15, T - 1)) : 0;
        float dq[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;

        mt_mb_wait(q_full, n & 1);
        for (int j = j0; j < nkb; j++) {
            const int i = i0 + j - j0, st = i % S;
            kv.wait_k(i);
            kv.wait_v(i);
            const unsigned kt = kv.k(st), vt = kv.v(st);

            // S = Q K^T and dP = dO V^T (64 rows x 128 keys a consumer).
            float s[64], dp[64];
            mt_attn_wg_abt2<128, HD, C::BR, C::BC>(s, sq_wg, kt, dp, sdo_wg, vt, cw,
                                                   last_item && j + 1 == nkb);
            const int k0 = j * C::BC;
            // The tiles that need no mask (most of them) take code with none.
            // Score i is key k0 + 2 t4 + y, y = 8 (i >> 2) + (i & 1) (a constant), of
            // row row_lo + 8 r: masked where y > hi[r] or y < lo[r].
            auto probs = [&](auto masked) {
                [[maybe_unused]] int hi[2], lo[2];
                if constexpr (decltype(masked)::value) {
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        hi[r] = min(row_lo + r * 8, T - 1) - k0 - 2 * t4;
                        lo[r] = DOCS ? dstart[r] - k0 - 2 * t4 : 0;
                    }
                }
#pragma unroll
                for (int i = 0; i < 64; i++) {
                    const int r = (i >> 1) & 1, y = (i >> 2) * 8 + (i & 1);
                    float x = mt_attn_exp2(fmaf(s[i], sl2, -lse2[r]));
                    if constexpr (decltype(masked)::value)
                        if (y > hi[r] || (DOCS && y < lo[r])) x = 0.f;
                    s[i] = x;
                }
            };
            if (k0 + C::BC - 1 > rw || k0 + C::BC > T || (DOCS && k0 < dstart_warp))
                probs(std::true_type());
            else probs(std::false_type());
            mt_wg_wait<0>();
            mt_attn_wg_fence<64>(dp);
            mt_mb_arrive(kv.empty_v(st));
            if (j + 1 == nkb) mt_mb_arrive(q_empty); // the item's last read of Q and dO
#pragma unroll
            for (int i = 0; i < 64; i++) dp[i] = s[i] * (dp[i] - D[(i >> 1) & 1]);

            // dQ += dS K (the keys are the reduction).
            unsigned ds[32];
            mt_attn_wg_pack<128>(ds, dp);
            mt_attn_wg_fence<HD / 2>(dq);
            mt_wg_fence();
            mt_attn_wg_pb<128, HD, C::BC>(dq, ds, kt);
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<HD / 2>(dq);
            mt_mb_arrive(kv.empty_k(st));
        }

        const int64_t ldq = (int64_t)a.NH * a.HD;
        float *gdq = a.dq + ((int64_t)b * T * a.NH + h) * a.HD;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row_lo + r * 8;
            if (row >= T) continue;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                const int d = c * 8 + 2 * t4;
                if (d >= a.HD) break; // padded columns
                *(float2 *)(gdq + row * ldq + d) =
                    make_float2(dq[4 * c + 2 * r] * a.scale, dq[4 * c + 2 * r + 1] * a.scale);
            }
        }
        i0 += nkb - j0;
    }
#endif
}

template <int HD, bool DOCS>
int launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    using CK = DkvCfg<HD>;
    using CQ = DqCfg<HD>;
    auto kdkv = mt_attn_dkv_wgmma_kernel<HD, DOCS>;
    auto kdq = mt_attn_dq_wgmma_kernel<HD, DOCS>;
    // Boxes of 128 rows for the dQ pass and the keys, of 64 for dK/dV's query tiles.
    CUtensorMap tq, tdo, tk, tv, tq64, tdo64;
    if (mt_attn_tma_map(&tq, a.q, B, a.T, a.NH, a.HD, CQ::BR, err) ||
        mt_attn_tma_map(&tdo, a.dout, B, a.T, a.NH, a.HD, CQ::BR, err) ||
        mt_attn_tma_map(&tk, a.k, B, a.T, a.NKV, a.HD, CQ::BC, err) ||
        mt_attn_tma_map(&tv, a.v, B, a.T, a.NKV, a.HD, CQ::BC, err) ||
        mt_attn_tma_map(&tq64, a.q, B, a.T, a.NH, a.HD, CK::BR, err) ||
        mt_attn_tma_map(&tdo64, a.dout, B, a.T, a.NH, a.HD, CK::BR, err))
        return -1;
    if (mt_attn_set_smem((const void *)kdkv, CK::SMEM, err)) return -1;
    if (mt_attn_set_smem((const void *)kdq, CQ::SMEM, err)) return -1;
    if (mt_attn_launch_dsum(a, B, 1, st, err)) return -1;
    // Items (key tile, group) in the chunks of mt_attn_launch_layout, claimed
    // from the second counter pair.
    const int nkb = (a.T + CK::BC - 1) / CK::BC, ngroups = a.NKV * B;
    mt_attn_layout lay;
    unsigned *ctr;
    if (mt_attn_launch_layout(nkb * ngroups, &lay, err) || mt_attn_tile_counter(&ctr, st, err))
        return -1;
    kdkv<<<lay.grid, CK::NT, CK::SMEM, st>>>(tq64, tdo64, tk, tv, a, ngroups, nkb, lay.chunk,
                                             ctr + 2);
    if (mt_attn_check_launch(err, "attention backward dK/dV (bf16, wgmma)")) return -1;
    mt_attn_qtiles tl;
    mt_attn_layout qlay;
    if (mt_attn_qtiles_init(&tl, a, B, CQ::BR, &qlay, err)) return -1;
    kdq<<<qlay.grid, CQ::NT, CQ::SMEM, st>>>(tq, tdo, tk, tv, a, tl);
    return mt_attn_check_launch(err, "attention backward dQ (bf16, wgmma)");
}

} // namespace

size_t mt_attn_bwd_wgmma_smem(void) {
    return DqCfg<128>::SMEM > DkvCfg<128>::SMEM ? DqCfg<128>::SMEM : DkvCfg<128>::SMEM;
}

int mt_attn_bwd_wgmma(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    // HD 80 and 96 run as 128 (the kernels' comment)
    if (a.pos)
        return a.HD == 64 ? launch<64, true>(a, B, st, err) : launch<128, true>(a, B, st, err);
    return a.HD == 64 ? launch<64, false>(a, B, st, err) : launch<128, false>(a, B, st, err);
}
