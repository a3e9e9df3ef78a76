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

/* The forward's mbarriers and claim slots (alignas rounds the block up to
 * 256 bytes). */
struct alignas(256) fwd_sync {
    uint64_t q_full[2];         // Q buffer c has landed (TMA transactions)
    uint64_t q_empty[2];        // its tile's last S is done (the 256 consumer threads)
    uint64_t claim[4];          // mt_attn_claims' barriers
    mt_attn_kv_bars kv[STAGES]; // the key-tile ring's
    int slot[4];                // mt_attn_claims' slots
};

/* The forward's shared memory: two Q buffers (the block's n-th tile uses
 * q[n % 2]), the key-tile ring, the consumers' output staging tiles, then
 * the barriers. Every tile is 128-byte swizzled (attention_wgmma.cuh), so
 * 1024-byte aligned: 225 KB at HD 128, within the 227 KB a block may have
 * on Hopper. */
template <int HD> struct fwd_storage {
    alignas(1024) bf16 q[2][BR * HD];
    alignas(1024) bf16 k[STAGES][BC * HD];
    alignas(1024) bf16 v[STAGES][BC * HD];
    alignas(1024) bf16 o[2][64 * HD]; // consumer c's 64 rows
    fwd_sync sync;
};

/* Q_BYTES: a Q buffer (the TMA transactions of a tile's Q); SMEM: the
 * block's dynamic shared memory. */
template <int HD> struct Cfg {
    static constexpr int Q_BYTES = BR * HD * 2;
    static constexpr size_t SMEM = MT_ATTN_SMEM_BYTES(fwd_storage<HD>, sync);
    static_assert(offsetof(fwd_storage<HD>, k) % 1024 == 0 &&
                      offsetof(fwd_storage<HD>, v) % 1024 == 0 &&
                      offsetof(fwd_storage<HD>, o) % 1024 == 0 && sizeof(bf16[64 * HD]) % 1024 == 0,
                  "tiles on 1024-byte swizzle atoms");
    static_assert(sizeof(fwd_storage<HD>::q[0]) == Q_BYTES, "a Q buffer is the TMA boxes' bytes");
    static_assert(SMEM <= 227 * 1024, "a block's shared memory on Hopper");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* The forward's shared memory by shared-state-space address (as TMA,
 * wgmma and mbarriers take them), each computed once from the storage's
 * base: the Q buffers and their barriers, the staging tiles, the key-tile
 * ring, the claims. */
template <int HD> struct fwd_smem {
    using S = fwd_storage<HD>;
    static constexpr unsigned O = offsetof(S, o), K = offsetof(S, k), V = offsetof(S, v),
                              SYNC = offsetof(S, sync);
    unsigned q_s, o_s, bar; // q[0], o[0], sync
    mt_attn_kv_ring<BC, HD, STAGES> kv;
    mt_attn_claims claims;
    __device__ explicit fwd_smem(unsigned char *dyn) {
        S *s = (S *)mt_attn_wg_align(dyn);
        q_s = mt_tc_smem_addr(s);
        o_s = q_s + O;
        bar = q_s + SYNC;
        kv = {q_s + K, q_s + V, bar + (unsigned)offsetof(fwd_sync, kv)};
        claims = {bar + (unsigned)offsetof(fwd_sync, claim), (volatile int *)s->sync.slot};
    }
    /* The block's n-th tile's Q buffer, its full and empty barriers (8
     * bytes each). */
    __device__ unsigned q(int n) const { return q_s + (n & 1) * Cfg<HD>::Q_BYTES; }
    __device__ unsigned q_full(int n) const {
        return bar + (unsigned)offsetof(fwd_sync, q_full) + 8 * (n & 1);
    }
    __device__ unsigned q_empty(int n) const {
        return bar + (unsigned)offsetof(fwd_sync, q_empty) + 8 * (n & 1);
    }
    /* The parity of the n-th tile's fill of its buffer. */
    static constexpr int QBUFS = 2;
    __device__ unsigned q_parity(int n) const { return (n >> 1) & 1; }
    /* Consumer cw's staging tile. */
    __device__ unsigned o(int cw) const { return o_s + cw * (int)sizeof(S::o[0]); }
    /* Initialises every mbarrier: by one thread, before a block barrier. */
    __device__ void init() const {
        for (int c = 0; c < 2; c++) {
            mt_mb_init(q_full(c), 1);
            mt_mb_init(q_empty(c), MT_ATTN_CONSUMER_THREADS);
        }
        claims.init();
        kv.init();
        mt_mb_fence_init();
    }
};

using fwd_tile = mt_attn_qtile; // (attention_wgmma.cuh)

/* A consumer thread's part of the block's n-th query tile t: its consumer
 * cw's first row r0 (q0 + 64 cw) and 64 rows of Q (sq), this thread's rows
 * row_lo and row_lo + 8, the softmax scale sl2 (log2 domain), and with
 * documents the first key of each row (rows past T take row T-1's). */
template <bool DOCS> struct fwd_rows {
    int cw, r0, row_lo, T;
    float sl2;
    unsigned sq;
    int dstart[2] = {0, 0};
    template <int HD>
    __device__ fwd_rows(const mt_attn_args &a, const fwd_smem<HD> &sm, const fwd_tile &t, int n,
                        int cw, int warp, int g, float sl2)
        : cw(cw), r0(t.q0 + cw * 64), row_lo(t.q0 + cw * 64 + warp * 16 + g), T(a.T),
          sl2(sl2), sq(sm.q(n) + cw * 64 * 128) {
        if (DOCS) {
            for (int e = 0; e < 2; e++)
                dstart[e] = mt_attn_doc_start(a, t.b, min(row_lo + e * 8, T - 1));
        }
    }
    /* Whether key tile j has keys after a query of the consumer's, past T
     * or before a row's document: the diagonal tile, the last one of a
     * ragged T, the first ones of packed documents (dstart_wg: the first
     * key of the consumer's last row, the latest start). The last test
     * joins by |, which orders the compares as in the code that was
     * measured. */
    __device__ bool need_mask(int j, int dstart_wg) const {
        const int k0 = j * BC;
        return (k0 + BC - 1 > r0 || k0 + BC > T) | (DOCS && k0 < dstart_wg);
    }
};

/* The online softmax of a consumer thread's two rows (mt_attn_wg_softmax). */
template <bool DOCS, bool SOFTCAP> using fwd_softmax = mt_attn_wg_softmax<BC, DOCS, SOFTCAP>;

/* The mainloop of a consumer (rw.cw) over the block's n-th query tile t,
 * whose key tiles are the ring's tiles i0 .. : S = Q K_j^T and, in the
 * same turn, O += P V_{j-1}, the softmax of S_j (sf) between their waits
 * and O rescaled once the second lands; then the last tile's P V. Empties
 * each K and V buffer and the Q buffer once read; leaves O in o, the rows'
 * max and sum in sf. Returns the block's next tile (mt_attn_claims), read
 * while the last product runs, so that consumer 1 skips its last turn's
 * pass. The caller owns the register arrays (o zeroed; p, s, alpha
 * scratch: the products read s, as operands they overwrite) and computes
 * dstart_wg (need_mask's): declared there, these keep the instructions
 * where the code that was measured has them. */
template <int HD, bool DOCS, bool SOFTCAP>
__device__ __forceinline__ int fwd_mma(const fwd_smem<HD> &sm, const fwd_tile &t, int n, int i0,
                                       const fwd_rows<DOCS> &rw, fwd_softmax<DOCS, SOFTCAP> &sf,
                                       float o[HD / 2], unsigned p[BC / 4], float s[BC / 2],
                                       float alpha[2], int t4, int dstart_wg) {
    const auto &kv = sm.kv;
    const int cw = rw.cw;
    // (j0 is 0 without documents: said here, where the loops are compiled)
    const int nkb = t.nkb, j0 = DOCS ? t.j0 : 0;
    const unsigned sq_wg = rw.sq;
    // Issues S = Q K^T (64 x 128 per consumer) over K buffer st, uncommitted.
    auto scores = [&](float s[BC / 2], int st) {
        mt_wg_fence();
        mt_attn_wg_abt<BC, HD, BR, BC>(s, sq_wg, kv.k(st));
    };
    mt_mb_wait(sm.q_full(n), (n >> 1) & 1);
    kv.wait_k(i0);
    mt_attn_turn_take(cw);
    scores(s, i0 % STAGES);
    mt_wg_commit();
    mt_attn_turn_pass(cw, false);
    mt_wg_wait<0>();
    mt_attn_wg_fence<BC / 2>(s);
    mt_mb_arrive(kv.empty_k(i0 % STAGES));
    if (nkb - j0 == 1) mt_mb_arrive(sm.q_empty(n)); // the tile's last read of Q
    sf.step(s, j0, alpha, rw, t4, std::true_type());
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
        if (j == nkb - 1) mt_mb_arrive(sm.q_empty(n));
        if (rw.need_mask(j, dstart_wg)) sf.step(s, j, alpha, rw, t4, std::true_type());
        else sf.step(s, j, alpha, rw, t4, std::false_type());
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
    const int next = sm.claims.get(n + 1);
    mt_attn_turn_pass(cw, next < 0);
    mt_wg_wait<0>();
    mt_attn_wg_fence<HD / 2>(o);
    mt_mb_arrive(kv.empty_v(il % STAGES));
    return next;
}

/* A consumer's output of the query tile of head h, batch row b at q0: its
 * rows of O (this thread's row_lo and row_lo + 8, their log2-domain max m
 * and sum l) normalised into its staging tile (64 rows, swizzled as the TMA
 * boxes; conflict-free, the 8 rows of a store falling in 8 distinct 16-byte
 * chunks), then one thread's TMA store, which leaves out rows past T and
 * columns past a.HD; the fp32 copy (a.o_f32) and the rows' lse straight to
 * global memory. The tile is written again once the last store has read
 * it. */
template <int HD>
__device__ __forceinline__ void fwd_store(const fwd_smem<HD> &sm, const CUtensorMap *to,
                                          const mt_attn_args &a, int h, int b, int q0, int cw,
                                          int warp, int g, int t4, int row_lo, const float m[2],
                                          const float l[2], const float o[HD / 2]) {
    const int T = a.T;
    const unsigned o_wg = sm.o(cw);
    const bool lead = (threadIdx.x & 127) == 0;
    if (lead) mt_tma_store_wait<true>();
    mt_bar_sync(MT_ATTN_BAR_STAGED0 + cw, MT_ATTN_WG_THREADS);
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
    mt_bar_sync(MT_ATTN_BAR_STAGED0 + cw, MT_ATTN_WG_THREADS);
    if (lead) {
        for (int c = 0; c < HD / 64; c++)
            mt_tma_store4(to, o_wg + c * 64 * 128, c * 64, h, q0 + cw * 64, b);
        mt_tma_store_commit();
    }
}

/* Consumer cw (rows 64 cw .. of each tile; warp, lane: this thread's in
 * its warpgroup): the block's query tiles as the producer posts them, each
 * one's mainloop (fwd_mma), then its rows out (fwd_store); before the
 * block's shared memory goes, its last stores. */
template <int HD, bool DOCS, bool SOFTCAP>
__device__ __forceinline__ void fwd_consume(const fwd_smem<HD> &sm, const CUtensorMap *to,
                                            const mt_attn_args &a, const mt_attn_qtiles &tl,
                                            int cw, int warp, int lane) {
    const float sl2 = mt_attn_sl2<SOFTCAP>(a);
    const int g = lane >> 2, t4 = lane & 3;
    const int first = sm.claims.get(0);
    if (first >= 0) mt_attn_turns_begin(cw);
    // n, i0: the query tiles and the key tiles this block has done; L: tile n
    for (int n = 0, i0 = 0, L = first; L >= 0; n++) {
        const fwd_tile t = mt_attn_qtile_of<BR, BC, DOCS>(a, tl, L);
        const fwd_rows<DOCS> rw(a, sm, t, n, cw, warp, g, sl2);
        const int dstart_wg =
            DOCS ? mt_attn_doc_start(a, t.b, min(t.q0 + cw * 64 + 63, a.T - 1)) : 0;
        float o[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
        fwd_softmax<DOCS, SOFTCAP> sf;
        if (SOFTCAP) sf.kcap = a.scale / a.softcap;
        unsigned p[BC / 4]; // the previous tile's probabilities, bf16 A fragments
        float s[BC / 2], alpha[2]; // a key tile's scores; the rescale of the rows
        const int next =
            fwd_mma<HD, DOCS, SOFTCAP>(sm, t, n, i0, rw, sf, o, p, s, alpha, t4, dstart_wg);
        fwd_store<HD>(sm, to, a, t.h, t.b, t.q0, cw, warp, g, t4, rw.row_lo, sf.m, sf.l, o);
        i0 += t.nkb - t.j0;
        L = next;
    }
    if ((threadIdx.x & 127) == 0) mt_tma_store_wait<false>();
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

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
 * left zero. SOFTCAP: soft-capped scores (a.softcap > 0, fwd_softmax). */
template <int HD, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(NT, 1)
    mt_attn_fwd_wgmma_kernel(const __grid_constant__ CUtensorMap tq,
                             const __grid_constant__ CUtensorMap tk,
                             const __grid_constant__ CUtensorMap tv,
                             const __grid_constant__ CUtensorMap to, mt_attn_args a,
                             mt_attn_qtiles tl, unsigned *ctr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    const fwd_smem<HD> sm(mt_attn_wg_smem);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) sm.init();
    __syncthreads();
    if (wg == 0) { // the producer
        mt_wg_regs_dec<24>();
        if (threadIdx.x != 0) return;
        mt_attn_fwd_load<BR, BC, HD, DOCS>(sm, &tq, &tk, &tv, a, tl, ctr);
        return;
    }
    mt_wg_regs_inc<240>();
    fwd_consume<HD, DOCS, SOFTCAP>(sm, &to, a, tl, wg - 1, warp, lane);
#endif
}

template <int HD, bool DOCS, bool SOFTCAP>
int launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    auto kern = mt_attn_fwd_wgmma_kernel<HD, DOCS, SOFTCAP>;
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

template <bool DOCS, bool SOFTCAP>
static int launch_hd(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    // HD 80 and 96 run as 128 (the kernels' comment)
    return a.HD == 64 ? launch<64, DOCS, SOFTCAP>(a, B, st, err)
                      : launch<128, DOCS, SOFTCAP>(a, B, st, err);
}

int mt_attn_fwd_wgmma(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.softcap > 0)
        return a.pos ? launch_hd<true, true>(a, B, st, err) : launch_hd<false, true>(a, B, st, err);
    return a.pos ? launch_hd<true, false>(a, B, st, err) : launch_hd<false, false>(a, B, st, err);
}
