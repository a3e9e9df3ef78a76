/* Building blocks of the Hopper attention kernels (attention_wgmma_fwd.cu,
 * attention_wgmma_bwd.cu). Q, K, V and dO tiles sit in shared memory in the
 * 128-byte swizzled layout of wgmma_ptx.cuh, as ROWS rows of 64 head-dim
 * columns (HD 128: two such blocks, ROWS * 128 bytes apart), each tile's
 * base 1024-byte aligned.
 *
 * Each kernel reads as FlashAttention-3's do: a storage struct lays out its
 * shared memory (the tiles, aligned as the swizzle needs, then the
 * mbarriers and claim slots, each by name), a second struct gives their
 * shared-state-space addresses (computed once from the base), the named
 * barriers are those of mt_attn_named_barrier, and the kernel body only
 * starts the producer warpgroup's loads (*_load) and the two consumer
 * warpgroups' work (*_consume: products, *_mma, then stores, *_store), each
 * a function of its own. Compiled only where __CUDA_ARCH_FEAT_SM90_ALL is
 * defined; the kernels' bodies are guarded the same way. */
#ifndef MT_KERNELS_ATTENTION_WGMMA_CUH
#define MT_KERNELS_ATTENTION_WGMMA_CUH

#include "kernels/attention/attention_internal.cuh"
#include "kernels/ptx/tma_ptx.cuh"
#include "kernels/ptx/wgmma_ptx.cuh"

/* Host side (attention_common.cu): whether the driver can build TMA maps,
 * and the TMA map of a (B, T, H, HD) bf16 tensor at p as (HD, H, T, B),
 * boxes of 64 head-dim columns by rows rows, 128-byte swizzle (the tiles
 * above); rows past T and columns past HD read as zeros. */
bool mt_attn_tma_available(void);
int mt_attn_tma_map(CUtensorMap *map, const void *p, int B, int T, int H, int HD, int rows,
                    mt_error *err);

/* The first 1024-byte aligned address of dynamic shared memory at p. */
__device__ __forceinline__ unsigned char *mt_attn_wg_align(unsigned char *p) {
    return p + ((1024 - (mt_tc_smem_addr(p) & 1023)) & 1023);
}

/* The dynamic shared memory a block asks for its storage struct S (a
 * kernel's tiles, then its mbarriers and claim slots in the member `last`):
 * S's bytes up to last's end (sizeof(S) would add the padding to S's
 * 1024-byte alignment) and room to align the base (mt_attn_wg_align). */
#define MT_ATTN_SMEM_BYTES(S, last) (offsetof(S, last) + sizeof(S::last) + 1024)

/* The warpgroups of a Hopper attention block: the producer (0), then the
 * two consumers, whose 256 threads arrive on every empty barrier. */
constexpr int MT_ATTN_WG_THREADS = 128, MT_ATTN_CONSUMER_THREADS = 256;

/* The named barriers of the Hopper kernels (id 0 is __syncthreads'). */
enum mt_attn_named_barrier : int {
    MT_ATTN_BAR_TURN0 = 1,   /* consumer 0's turn to issue products (256 threads) */
    MT_ATTN_BAR_TURN1 = 2,   /* consumer 1's */
    MT_ATTN_BAR_STAGED0 = 3, /* forward: consumer 0's output staging tile (its 128) */
    MT_ATTN_BAR_STAGED1 = 4, /* consumer 1's */
};

/* The mbarriers of one buffer of the key-tile ring (mt_attn_kv_ring). */
struct mt_attn_kv_bars {
    uint64_t full_k, full_v;   /* the producer's TMA transactions have landed */
    uint64_t empty_k, empty_v; /* the 256 consumer threads have read the tile */
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* Keeps the compiler from moving accesses of x[0..N) across the products. */
template <int N> __device__ __forceinline__ void mt_attn_wg_fence(float x[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) mt_wg_fence_reg(x[i]);
}

/* acc (64 x N, the warpgroup's) = A B^T over the head dim: A the 64 rows
 * at shared address sa of a tile of RA rows, B the N rows at sb of a tile of
 * RB rows (both K-major: a k16 slice kk sits in column block kk / 4, 32
 * bytes a slice within it). The first slice's product overwrites acc, so
 * nothing zeroes it first. Issued, not committed. */
template <int N, int HD, int RA, int RB>
__device__ __forceinline__ void mt_attn_wg_abt(float acc[N / 2], unsigned sa, unsigned sb) {
    const uint64_t da0 = mt_wg_desc(sa, 16), db0 = mt_wg_desc(sb, 16);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const unsigned off = (kk & 3) * 32;
        const uint64_t da = mt_wg_desc_add(da0, (kk >> 2) * (RA * 128) + off);
        const uint64_t db = mt_wg_desc_add(db0, (kk >> 2) * (RB * 128) + off);
        if constexpr (N == 128) mt_wg_mma_64x128_ss<0, 0>(acc, da, db, kk > 0);
        else mt_wg_mma_64x64_ss<0, 0>(acc, da, db, kk > 0);
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
    const uint64_t db0 = mt_wg_desc(sb, RB * 128);
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        const uint64_t db = mt_wg_desc_add(db0, kk * 2048);
        if constexpr (HD == 256) mt_wg_mma_64x256_rs<1>(acc, p + 4 * kk, db);
        else if constexpr (HD == 128) mt_wg_mma_64x128_rs<1>(acc, p + 4 * kk, db);
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

/* The two consumer warpgroups' turns at issuing products: consumer c waits
 * for its turn (MT_ATTN_BAR_TURN0 + c), issues, then passes it (the other
 * consumer's), so that the tensor cores run one's products while the other
 * computes. Consumer 0 goes first; consumer 1 passes all but its last turn,
 * so that every arrival has its wait. */
__device__ __forceinline__ void mt_attn_turns_begin(int c) {
    if (c == 1) mt_bar_arrive(MT_ATTN_BAR_TURN0, MT_ATTN_CONSUMER_THREADS);
}
__device__ __forceinline__ void mt_attn_turn_take(int c) {
    mt_bar_sync(MT_ATTN_BAR_TURN0 + c, MT_ATTN_CONSUMER_THREADS);
}
__device__ __forceinline__ void mt_attn_turn_pass(int c, bool last) {
    if (c == 0 || !last) mt_bar_arrive(MT_ATTN_BAR_TURN1 - c, MT_ATTN_CONSUMER_THREADS);
}

/* Consumer c's turn at x = A1 B1^T and y = A2 B2^T (64 x N each, operands
 * as for mt_attn_wg_abt), two groups of products; returns once x has
 * landed, y still in flight (mt_wg_wait<0>, then mt_attn_wg_fence on y, to
 * read it). last: the consumer's last turn. */
template <int N, int HD, int RA, int RB>
__device__ __forceinline__ void mt_attn_wg_abt2(float x[N / 2], unsigned a1, unsigned b1,
                                                float y[N / 2], unsigned a2, unsigned b2, int c,
                                                bool last) {
    mt_attn_turn_take(c);
    mt_wg_fence();
    mt_attn_wg_abt<N, HD, RA, RB>(x, a1, b1);
    mt_wg_commit();
    mt_attn_wg_abt<N, HD, RA, RB>(y, a2, b2);
    mt_wg_commit();
    mt_attn_turn_pass(c, last);
    mt_wg_wait<1>();
    mt_attn_wg_fence<N / 2>(x);
}

/* A persistent block's claimed work items (mt_attn_claim), passed from the
 * thread that claims them to the block's other threads: item n sits in
 * slot n % 4 once barrier n % 4 (one arrival) has completed. Four, so that
 * the claiming thread may run up to three items ahead of the slowest
 * reader; each kernel says why its own does not run further. bar: the
 * shared address of four barriers (uint64_t[4]); slot: four ints. */
struct mt_attn_claims {
    unsigned bar;
    volatile int *slot;
    /* By one thread, before a block barrier (with mt_mb_fence_init). */
    __device__ void init() const {
        for (int c = 0; c < 4; c++) mt_mb_init(bar + 8 * c, 1);
    }
    /* The claiming thread: item n is L (-1 past the block's last). */
    __device__ void post(int n, int L) const {
        slot[n & 3] = L;
        mt_mb_arrive(bar + 8 * (n & 3));
    }
    /* Item n, once posted. */
    __device__ int get(int n) const {
        mt_mb_wait(bar + 8 * (n & 3), (n >> 2) & 1);
        return slot[n & 3];
    }
};

/* The key-tile ring of the forward and of the dQ pass: S buffers, each a K
 * and a V tile of ROWS rows (k(st), v(st)), with the barriers of
 * mt_attn_kv_bars. Tile i (from the first) sits in buffer i % S. k_s, v_s,
 * bar: the shared addresses of the S K tiles, the S V tiles and
 * mt_attn_kv_bars[S]. */
template <int ROWS, int HD, int S> struct mt_attn_kv_ring {
    static constexpr int BYTES = ROWS * HD * 2;
    static constexpr int BARS = sizeof(mt_attn_kv_bars);
    static constexpr int FULL_K = offsetof(mt_attn_kv_bars, full_k),
                         FULL_V = offsetof(mt_attn_kv_bars, full_v),
                         EMPTY_K = offsetof(mt_attn_kv_bars, empty_k),
                         EMPTY_V = offsetof(mt_attn_kv_bars, empty_v);
    unsigned k_s, v_s, bar;
    __device__ unsigned k(int st) const { return k_s + st * BYTES; }
    __device__ unsigned v(int st) const { return v_s + st * BYTES; }
    __device__ unsigned full_k(int st) const { return bar + BARS * st + FULL_K; }
    __device__ unsigned full_v(int st) const { return bar + BARS * st + FULL_V; }
    __device__ unsigned empty_k(int st) const { return bar + BARS * st + EMPTY_K; }
    __device__ unsigned empty_v(int st) const { return bar + BARS * st + EMPTY_V; }
    /* By one thread, before a block barrier (with mt_mb_fence_init). */
    __device__ void init() const {
        for (int st = 0; st < S; st++) {
            mt_mb_init(full_k(st), 1);
            mt_mb_init(full_v(st), 1);
            mt_mb_init(empty_k(st), MT_ATTN_CONSUMER_THREADS);
            mt_mb_init(empty_v(st), MT_ATTN_CONSUMER_THREADS);
        }
    }
    /* The producer's thread: key tiles j0 .. nkb-1 (rows j ROWS ..) of kv
     * head kvh, batch row b, as the ring's tiles i0, i0 + 1, ... (a
     * persistent kernel's ring runs on across its query tiles); a buffer is
     * refilled once it is emptied. */
    __device__ void produce(const CUtensorMap *tk, const CUtensorMap *tv, int kvh, int b, int j0,
                            int nkb, int i0 = 0) const {
        for (int j = j0; j < nkb; j++) {
            const int i = i0 + j - j0, st = i % S;
            const unsigned ph = (i / S) & 1;
            if (i >= S) mt_mb_wait(empty_k(st), ph ^ 1);
            mt_mb_expect_tx(full_k(st), BYTES);
            for (int c = 0; c < HD / 64; c++)
                mt_tma_load4(k(st) + c * ROWS * 128, tk, c * 64, kvh, j * ROWS, b, full_k(st));
            if (i >= S) mt_mb_wait(empty_v(st), ph ^ 1);
            mt_mb_expect_tx(full_v(st), BYTES);
            for (int c = 0; c < HD / 64; c++)
                mt_tma_load4(v(st) + c * ROWS * 128, tv, c * 64, kvh, j * ROWS, b, full_v(st));
        }
    }
    /* Consumers: wait until tile i's K (V) has landed. */
    __device__ void wait_k(int i) const { mt_mb_wait(full_k(i % S), (i / S) & 1); }
    __device__ void wait_v(int i) const { mt_mb_wait(full_v(i % S), (i / S) & 1); }
};

/* The online softmax of a forward consumer thread's two rows in the log2
 * domain: m the running maximum of the scaled scores, l the running sum of
 * the thread's quarter of each row. step turns key tile j's scores s into
 * probabilities, masking keys after the query, past T or before its
 * document when masked (std::true_type); the other tiles, most of them,
 * take code with no mask at all: its compares and selects were two fifths
 * of the loop's instructions, which the products could not hide. alpha:
 * the rescale of the rows' earlier sums (and outputs). SOFTCAP: the scores
 * become t = tanh(q.k scale / c) first (kcap = scale / c; rw.sl2 is then
 * c log2e, mt_attn_sl2), before the masks' -inf. BC: keys a tile; rw (ROWS):
 * the rows' sl2, row_lo (this thread's rows row_lo and row_lo + 8), T and,
 * with documents, dstart[2] (each row's first key). */
template <int BC, bool DOCS, bool SOFTCAP> struct mt_attn_wg_softmax {
    float l[2] = {0.f, 0.f}, m[2] = {-INFINITY, -INFINITY};
    float kcap;
    template <class ROWS, class MASKED>
    __device__ __forceinline__ void step(float s[BC / 2], int j, float alpha[2], const ROWS &rw,
                                         int t4, MASKED) {
        const float sl2 = rw.sl2;
        if constexpr (SOFTCAP) {
#pragma unroll
            for (int i = 0; i < BC / 2; i++) s[i] = mt_attn_tanh(s[i] * kcap);
        }
        // Score 4c + e is key j BC + 2 t4 + x, x = 8c + (e & 1) (a constant),
        // of row row_lo + 8 (e >> 1): masked where x > hi or x < lo of its row.
        [[maybe_unused]] int hi[2], lo[2];
        if constexpr (MASKED::value) {
            const int kb = j * BC + 2 * t4;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                hi[r] = min(rw.row_lo + r * 8, rw.T - 1) - kb;
                lo[r] = DOCS ? rw.dstart[r] - kb : 0;
            }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int c = 0; c < BC / 8; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if constexpr (MASKED::value) {
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
    }
};

/* A query tile of the forward or the dQ pass: tile L of tl (BR rows), rows
 * q0 .. q0 + BR - 1 of head h, batch row b, and its key tiles of BC keys
 * j0 .. nkb - 1 (with documents, none before its first row's document). */
struct mt_attn_qtile {
    int q0, h, b, nkb, j0;
};
template <int BR, int BC, bool DOCS>
__device__ __forceinline__ mt_attn_qtile mt_attn_qtile_of(const mt_attn_args &a,
                                                          const mt_attn_qtiles &tl, int L) {
    mt_attn_qtile t;
    int qb;
    tl.decode(L, &qb, &t.h, &t.b);
    t.q0 = qb * BR;
    t.nkb = (min(t.q0 + BR, a.T) + BC - 1) / BC;
    t.j0 = DOCS ? mt_attn_doc_start(a, t.b, min(t.q0, a.T - 1)) / BC : 0;
    return t;
}

/* The producer thread of a dQ pass: block x's query tiles x, x + grid, ...
 * of tl (BR rows, key tiles of BC), each one's Q and dO once the last
 * tile's products are done (barriers q_empty, q_full of SM, tiles at q_s
 * and do_s), and its key tiles into the ring SM::kv, which runs on across
 * tiles. */
template <int BR, int BC, int HD, bool DOCS, class SM>
__device__ __forceinline__ void mt_attn_dq_load(const SM &sm, const CUtensorMap *tq,
                                                const CUtensorMap *tdo, const CUtensorMap *tk,
                                                const CUtensorMap *tv, const mt_attn_args &a,
                                                const mt_attn_qtiles &tl) {
    for (int n = 0, w = blockIdx.x, i0 = 0; w < tl.n; n++, w += gridDim.x) {
        const mt_attn_qtile it = mt_attn_qtile_of<BR, BC, DOCS>(a, tl, w);
        if (n > 0) mt_mb_wait(sm.q_empty(), (n - 1) & 1);
        mt_mb_expect_tx(sm.q_full(), 2 * BR * HD * 2);
        for (int c = 0; c < HD / 64; c++) {
            mt_tma_load4(sm.q_s + c * BR * 128, tq, c * 64, it.h, it.q0, it.b, sm.q_full());
            mt_tma_load4(sm.do_s + c * BR * 128, tdo, c * 64, it.h, it.q0, it.b, sm.q_full());
        }
        sm.kv.produce(tk, tv, it.h / (a.NH / a.NKV), it.b, it.j0, it.nkb, i0);
        i0 += it.nkb - it.j0;
    }
}

/* The lse (log2 domain), D and, with documents, first key of a dQ consumer
 * thread's rows row_lo and row_lo + 8 of head h, batch row b. Rows past T
 * are never stored; any finite values keep them harmless. */
template <bool DOCS>
__device__ __forceinline__ void mt_attn_dq_row_stats(const mt_attn_args &a, int b, int h,
                                                     int row_lo, float lse2[2], float D[2],
                                                     int dstart[2]) {
    const int T = a.T;
    const int64_t lrow = ((int64_t)b * a.NH + h) * T;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_lo + r * 8;
        lse2[r] = row < T ? a.lse[lrow + row] * MT_ATTN_LOG2E : 0.f;
        D[r] = row < T ? a.dsum[lrow + row] : 0.f;
        if (DOCS) dstart[r] = mt_attn_doc_start(a, b, min(row, T - 1));
    }
}

/* The forward's producer thread: claims the block's tiles (mt_attn_claim,
 * posted in sm.claims for the consumers) and loads each one's Q into buffer
 * n % SM::QBUFS (q(n), q_full(n), q_empty(n); q_parity(n): the parity of
 * that buffer's n-th fill) and its key tiles into the ring, which runs on
 * across tiles. The next tile is claimed as soon as this one's loads are
 * issued, so that the consumers know it before they end this one; the
 * producer runs at most SM::QBUFS tiles (its Q buffers) ahead of the
 * consumers' reading of a slot (at the end of the tile before). (The loop's
 * variables are declared L first: their order steers ptxas's register
 * assignment, and this one gives the code that was measured.) */
template <int BR, int BC, int HD, bool DOCS, class SM>
__device__ __forceinline__ void mt_attn_fwd_load(const SM &sm, const CUtensorMap *tq,
                                                 const CUtensorMap *tk, const CUtensorMap *tv,
                                                 const mt_attn_args &a, const mt_attn_qtiles &tl,
                                                 unsigned *ctr) {
    auto claim = [&](int n) {
        const int L = mt_attn_claim(ctr, tl.n);
        sm.claims.post(n, L);
        return L;
    };
    for (int L = claim(0), i0 = 0, n = 0; L >= 0; n++) {
        const mt_attn_qtile t = mt_attn_qtile_of<BR, BC, DOCS>(a, tl, L);
        // Q's buffer is free once tile n - QBUFS has done its last S.
        if (n >= SM::QBUFS) mt_mb_wait(sm.q_empty(n), sm.q_parity(n) ^ 1);
        mt_mb_expect_tx(sm.q_full(n), BR * HD * 2);
        for (int c = 0; c < HD / 64; c++)
            mt_tma_load4(sm.q(n) + c * BR * 128, tq, c * 64, t.h, t.q0, t.b, sm.q_full(n));
        const int next = claim(n + 1);
        sm.kv.produce(tk, tv, t.h / (a.NH / a.NKV), t.b, t.j0, t.nkb, i0);
        i0 += t.nkb - t.j0;
        L = next;
    }
}

/* Work item w of a dK/dV pass (the order of mt_attn_chunked over ngroups
 * groups, nkb key tiles of BC each; query tiles of BR): kv head, batch row,
 * first key, first query tile and query tiles a head (from the key tile
 * on, up to the end of its last key's document). */
struct mt_attn_dkv_item {
    int kvh, b, k0, qb0, nqb;
};
template <int BC, int BR, bool DOCS>
__device__ __forceinline__ mt_attn_dkv_item mt_attn_dkv_item_of(const mt_attn_args &a, int ngroups,
                                                                int nkb, int chunk, int w) {
    mt_attn_dkv_item it;
    int grp, kb;
    mt_attn_chunked(w, ngroups, nkb, chunk, &grp, &kb);
    it.kvh = grp % a.NKV;
    it.b = grp / a.NKV;
    it.k0 = kb * BC;
    const int q_end = DOCS ? mt_attn_doc_end(a, it.b, min(it.k0 + BC, a.T) - 1) : a.T;
    it.qb0 = it.k0 / BR;
    it.nqb = (q_end + BR - 1) / BR - it.qb0;
    return it;
}

/* A dK/dV pass's producer warpgroup: thread 0 claims the block's items
 * (mt_attn_claim over the ngroups * nkb items, posted in sm.claims; the
 * other threads read them) and loads each item's K and V once the last
 * item's products are done, then, item after item, the query tiles of
 * every head of the group into the S buffers (an item's iteration it
 * covers query head kvh G + it / nqb and query tile qb0 + it % nqb; gi
 * counts the block's, the buffers' tiles): thread 0 Q and dO by TMA, the
 * first BR threads the rows' lse, D and positions, every thread then
 * arriving on the buffer's full barrier. The producer's threads run at most
 * S query tiles, so S items, ahead of the consumers (S <= 3: the four claim
 * slots). SM: the pass's shared memory (claims; k_s, v_s and the barriers
 * kv_full(), kv_empty(); buffer st's q(st), dout(st), full(st), empty(st)
 * and stats_of(st), whose lse(), dsum() and pos() take the rows'
 * statistics). */
template <int BC, int BR, int HD, int S, bool DOCS, class SM>
__device__ __forceinline__ void mt_attn_dkv_load(const SM &sm, const CUtensorMap *tq,
                                                 const CUtensorMap *tdo, const CUtensorMap *tk,
                                                 const CUtensorMap *tv, const mt_attn_args &a,
                                                 int ngroups, int nkb, int chunk, int G,
                                                 int nitems, unsigned *ctr) {
    static_assert(S <= 3, "the claiming thread runs at most three items ahead");
    const int T = a.T;
    for (int n = 0, gi = 0;; n++) {
        // Thread 0 claims the item and posts it, the others read it.
        int w;
        if (threadIdx.x == 0) {
            w = mt_attn_claim(ctr, nitems);
            sm.claims.post(n, w);
        } else {
            w = sm.claims.get(n);
        }
        if (w < 0) break;
        const mt_attn_dkv_item m = mt_attn_dkv_item_of<BC, BR, DOCS>(a, ngroups, nkb, chunk, w);
        if (threadIdx.x == 0) {
            if (n > 0) mt_mb_wait(sm.kv_empty(), (n - 1) & 1);
            mt_mb_expect_tx(sm.kv_full(), 2 * BC * HD * 2);
            for (int c = 0; c < HD / 64; c++) {
                mt_tma_load4(sm.k_s + c * BC * 128, tk, c * 64, m.kvh, m.k0, m.b, sm.kv_full());
                mt_tma_load4(sm.v_s + c * BC * 128, tv, c * 64, m.kvh, m.k0, m.b, sm.kv_full());
            }
        }
        for (int it = 0; it < G * m.nqb; it++, gi++) {
            const int st = gi % S, h = m.kvh * G + it / m.nqb;
            const int q0 = (m.qb0 + it % m.nqb) * BR;
            if (gi >= S) mt_mb_wait(sm.empty(st), ((gi / S) & 1) ^ 1);
            if (threadIdx.x < BR) { // lse, D, positions; rows past T read 0
                const int r = threadIdx.x, q = q0 + r;
                const int64_t i = ((int64_t)m.b * a.NH + h) * T + q;
                const auto l = sm.stats_of(st);
                l.lse()[r] = q < T ? a.lse[i] : 0.f;
                l.dsum()[r] = q < T ? a.dsum[i] : 0.f;
                if (DOCS) l.pos()[r] = q < T ? a.pos[(int64_t)m.b * T + q] : 0;
            }
            if (threadIdx.x == 0) {
                mt_mb_expect_tx(sm.full(st), 2 * BR * HD * 2);
                for (int c = 0; c < HD / 64; c++) {
                    mt_tma_load4(sm.q(st) + c * BR * 128, tq, c * 64, h, q0, m.b, sm.full(st));
                    mt_tma_load4(sm.dout(st) + c * BR * 128, tdo, c * 64, h, q0, m.b,
                                 sm.full(st));
                }
            } else {
                mt_mb_arrive(sm.full(st));
            }
        }
    }
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

#endif
