/* The Hopper bf16 attention backward at head dim 256 (Gemma 2 and 3; the
 * contract: attention.h). The two passes of attention_wgmma_bwd.cu, without
 * atomics, with TMA-fed swizzled tiles (attention_wgmma.cuh) and a producer
 * warpgroup; but a 64 x 256 fp32 accumulator is 128 registers a thread, so
 * no consumer can hold both dK and dV (or dQ and its scores), and the two
 * consumers split each tile's work by role instead of by rows:
 *   dK, dV: a block owns 64 keys of one kv head (K, V once) and walks the
 *     query tiles of 64 of every head of its group (two buffers of Q, dO and
 *     their rows' lse, D and positions). Consumer 0:
 *       S^T = K Q^T (m64n64), P^T = exp(S^T - lse), dV += P^T dO (m64n256);
 *     consumer 1:
 *       dP^T = V dO^T (m64n64), dS^T = P^T (dP^T - D), dK += dS^T Q (m64n256),
 *     P^T handed over in shared memory (hand_ring).
 *   dQ: a block owns 64 query rows of one head at a time (Q, dO once) and
 *     walks their key tiles of 64 (two buffers of K and V). Consumer 0:
 *     S = Q K^T, P; consumer 1: dP = dO V^T, dS = P (dP - D), dQ += dS K.
 * Soft-capped, what is handed over is P (1 - t^2) (t = tanh(S scale / c)),
 * the factor dS takes from the scores; consumer 0 keeps P for dV. The
 * masks, the document bounds and the lse and D values are those of the
 * other kernels. Consumer 0 runs ahead of consumer 1 by up to two hand-overs,
 * so the tensor cores take one's products while the other computes. */
#include <type_traits>

#include "kernels/attention/attention_wgmma.cuh"

namespace {

/* Head dim, query rows and keys of a tile, threads, buffers of the streamed
 * tiles (query tiles in the dK/dV pass, key tiles in the dQ pass) and of
 * the hand-over. */
constexpr int HD = 256, BR = 64, BC = 64, NT = 384, STAGES = 2, HANDS = 2;
/* A 64-row tile of q, k, v or dout (4 TMA boxes of 64 columns). */
constexpr int TILE_BYTES = 64 * HD * 2;

/* A query tile's rows as the dK/dV pass stages them: lse, D and, with
 * documents, their positions; 0 past T. The producer stores them through
 * a dkv_stats_view (mt_attn_dkv_load). */
struct dkv_stats {
    float lse[BR], dsum[BR];
    int32_t pos[BR];
};

/* The dK/dV pass's mbarriers and claim slots. */
struct alignas(256) dkv_sync {
    uint64_t kv_full, kv_empty; // K and V landed; the item's last products read them (256)
    uint64_t full[STAGES];      // Q, dO landed, the rows' statistics stored (128 producer threads)
    uint64_t empty[STAGES];     // both consumers have read the buffer (256)
    uint64_t hand[2 * HANDS];   // hand_ring's
    uint64_t claim[4];          // mt_attn_claims'
    int slot[4];
};

/* The dK/dV pass's shared memory: K and V of the item's 64 keys, two
 * buffers of a query tile (Q, dO, the rows' statistics), the hand-over
 * buffers, then the barriers. */
struct dkv_storage {
    alignas(1024) bf16 k[BC * HD];
    alignas(1024) bf16 v[BC * HD];
    alignas(1024) bf16 q[STAGES][BR * HD];
    alignas(1024) bf16 dout[STAGES][BR * HD];
    float hand[HANDS][32 * 128];
    dkv_stats stats[STAGES];
    dkv_sync sync;
};
constexpr size_t DKV_SMEM = MT_ATTN_SMEM_BYTES(dkv_storage, sync);
static_assert(sizeof(dkv_storage::k) == TILE_BYTES && sizeof(dkv_storage::q[0]) == TILE_BYTES,
              "tiles are the TMA boxes' bytes");
static_assert(DKV_SMEM <= 227 * 1024, "a block's shared memory on Hopper");

/* The dQ pass's mbarriers. */
struct alignas(256) dq_sync {
    uint64_t q_full, q_empty;   // Q, dO landed; the tile's last products read them (256)
    mt_attn_kv_bars kv[STAGES]; // the key-tile ring's
    uint64_t hand[2 * HANDS];   // hand_ring's
};

/* The dQ pass's shared memory: the tile's Q and dO, the key-tile ring, the
 * hand-over buffers, then the barriers. */
struct dq_storage {
    alignas(1024) bf16 q[BR * HD];
    alignas(1024) bf16 dout[BR * HD];
    alignas(1024) bf16 k[STAGES][BC * HD];
    alignas(1024) bf16 v[STAGES][BC * HD];
    float hand[HANDS][32 * 128];
    dq_sync sync;
};
constexpr size_t DQ_SMEM = MT_ATTN_SMEM_BYTES(dq_storage, sync);
static_assert(DQ_SMEM <= 227 * 1024, "a block's shared memory on Hopper");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* The hand-over of a 64 x 64 tile of fp32 values (the accumulator layout of
 * a m64n64 product) from consumer 0 to consumer 1: HANDS buffers, value i
 * of thread t (of its warpgroup) at [32 * 128 * buffer + 128 i + t], so a
 * warp's stores and loads take 32 consecutive words. Hand-over n uses
 * buffer n % HANDS; full: consumer 0's 128 threads have stored it, empty:
 * consumer 1's have read it. */
struct hand_ring {
    unsigned bar; // full[HANDS], then empty[HANDS]
    float *buf;
    __device__ unsigned full(int b) const { return bar + 8 * b; }
    __device__ unsigned empty(int b) const { return bar + 8 * (HANDS + b); }
    /* By one thread, before a block barrier. */
    __device__ void init() const {
        for (int b = 0; b < HANDS; b++) {
            mt_mb_init(full(b), MT_ATTN_WG_THREADS);
            mt_mb_init(empty(b), MT_ATTN_WG_THREADS);
        }
    }
    /* Consumer 0's thread t: hands x over as hand-over n, once the buffer's
     * last contents were read. */
    __device__ void put(int n, const float x[32], int t) const {
        const int b = n % HANDS;
        if (n >= HANDS) mt_mb_wait(empty(b), ((n / HANDS) & 1) ^ 1);
        float *p = buf + b * 32 * 128 + t;
#pragma unroll
        for (int i = 0; i < 32; i++) p[128 * i] = x[i];
        mt_mb_arrive(full(b));
    }
    /* Consumer 1's thread t: x (32 values) times hand-over n's, then the
     * buffer is released. */
    __device__ void take_times(int n, float x[32], int t) const {
        const int b = n % HANDS;
        mt_mb_wait(full(b), (n / HANDS) & 1);
        const float *p = buf + b * 32 * 128 + t;
#pragma unroll
        for (int i = 0; i < 32; i++) x[i] *= p[128 * i];
        mt_mb_arrive(empty(b));
    }
};

/* The query column (0..63) of value i of a m64n64 accumulator, for lane
 * quad t4; its row is the warp's g-th or (g + 8)-th ((i >> 1) & 1). */
__device__ __forceinline__ int acc_col(int i, int t4) { return (i >> 2) * 8 + 2 * t4 + (i & 1); }

/* Thread t4/g's rows key_lo (= row0 + g) and + 8, columns 2 t4 and + 1 of
 * each 8, of a 64 x 256 accumulator times scale, to the fp32 (.., T, H,
 * HD) tensor row by row at g0 (its row 0, stride ld); rows from T left
 * out. */
__device__ __forceinline__ void store_rows(float *g0, int64_t ld, int row_lo, int T, int t4,
                                           const float x[128], float scale) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_lo + r * 8;
        if (row >= T) continue;
#pragma unroll
        for (int c = 0; c < HD / 8; c++)
            *(float2 *)(g0 + row * ld + c * 8 + 2 * t4) =
                make_float2(x[4 * c + 2 * r] * scale, x[4 * c + 2 * r + 1] * scale);
    }
}

/* A buffer's dkv_stats as mt_attn_dkv_load stores them. */
struct dkv_stats_view {
    dkv_stats *s;
    __device__ float *lse() const { return s->lse; }
    __device__ float *dsum() const { return s->dsum; }
    __device__ int32_t *pos() const { return s->pos; }
};

/* ------------------------------------------------------------------------ */
/* dK, dV                                                                   */

/* The dK/dV pass's shared memory by shared-state-space address. */
struct dkv_smem {
    unsigned k_s, v_s, q_s, do_s, bar;
    dkv_stats *stats;
    hand_ring hand;
    mt_attn_claims claims;
    __device__ explicit dkv_smem(unsigned char *dyn) {
        dkv_storage *s = (dkv_storage *)mt_attn_wg_align(dyn);
        k_s = mt_tc_smem_addr(s);
        v_s = k_s + (unsigned)offsetof(dkv_storage, v);
        q_s = k_s + (unsigned)offsetof(dkv_storage, q);
        do_s = k_s + (unsigned)offsetof(dkv_storage, dout);
        bar = k_s + (unsigned)offsetof(dkv_storage, sync);
        stats = s->stats;
        hand = {bar + (unsigned)offsetof(dkv_sync, hand), &s->hand[0][0]};
        claims = {bar + (unsigned)offsetof(dkv_sync, claim), (volatile int *)s->sync.slot};
    }
    __device__ unsigned kv_full() const { return bar + (unsigned)offsetof(dkv_sync, kv_full); }
    __device__ unsigned kv_empty() const { return bar + (unsigned)offsetof(dkv_sync, kv_empty); }
    __device__ dkv_stats_view stats_of(int st) const { return {stats + st}; }
    __device__ unsigned q(int st) const { return q_s + st * TILE_BYTES; }
    __device__ unsigned dout(int st) const { return do_s + st * TILE_BYTES; }
    __device__ unsigned full(int st) const {
        return bar + (unsigned)offsetof(dkv_sync, full) + 8 * st;
    }
    __device__ unsigned empty(int st) const {
        return bar + (unsigned)offsetof(dkv_sync, empty) + 8 * st;
    }
    /* By one thread, before a block barrier. */
    __device__ void init() const {
        mt_mb_init(kv_full(), 1);
        mt_mb_init(kv_empty(), MT_ATTN_CONSUMER_THREADS);
        for (int st = 0; st < STAGES; st++) {
            mt_mb_init(full(st), MT_ATTN_WG_THREADS);
            mt_mb_init(empty(st), MT_ATTN_CONSUMER_THREADS);
        }
        hand.init();
        claims.init();
        mt_mb_fence_init();
    }
};

/* P^T of a query tile (rows q0 .., their lse and positions in l) from the
 * scores S^T in s, in place (value i: key key_lo + 8 ((i >> 1) & 1), query
 * q0 + acc_col(i, t4)), masked (std::true_type) to 0 for keys after the
 * query, queries past T and queries of a later document. SOFTCAP: P^T, and
 * in g the hand-over P^T (1 - t^2); otherwise g is not written. */
template <bool DOCS, bool SOFTCAP, class MASKED>
__device__ __forceinline__ void dkv_probs(float s[32], float g[32], const dkv_stats &l, int q0,
                                          int key_lo, int T, int t4, float sl2, float kcap,
                                          MASKED) {
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int qc = acc_col(i, t4), key = key_lo + ((i >> 1) & 1) * 8;
        bool masked = false;
        if constexpr (MASKED::value)
            masked = q0 + qc < key || q0 + qc >= T || (DOCS && q0 + qc - l.pos[qc] > key);
        if constexpr (SOFTCAP) {
            float p;
            const float f = mt_attn_cap_grad(masked ? -INFINITY : mt_attn_tanh(s[i] * kcap), sl2,
                                             l.lse[qc] * MT_ATTN_LOG2E, &p);
            s[i] = p;
            g[i] = p * f;
        } else {
            const float p = mt_attn_exp2(fmaf(s[i], sl2, -l.lse[qc] * MT_ATTN_LOG2E));
            s[i] = masked ? 0.f : p;
        }
    }
}

/* Consumer 0: for each item, dV of its 64 keys over the query tiles (S^T,
 * P^T handed over, dV += P^T dO), then stored. */
template <bool DOCS, bool SOFTCAP>
__device__ __forceinline__ void dkv_consume_v(const dkv_smem &sm, const mt_attn_args &a,
                                              int ngroups, int nkb, int chunk, int G, int warp,
                                              int t) {
    const float sl2 = mt_attn_sl2<SOFTCAP>(a), kcap = SOFTCAP ? a.scale / a.softcap : 0.f;
    const int g = (t & 31) >> 2, t4 = t & 3, T = a.T;
    for (int n = 0, gi = 0, hn = 0;; n++) {
        const int w = sm.claims.get(n);
        if (w < 0) break;
        const mt_attn_dkv_item m = mt_attn_dkv_item_of<BC, BR, DOCS>(a, ngroups, nkb, chunk, w);
        const int nit = G * m.nqb, kw = m.k0 + warp * 16, key_lo = kw + g;
        float dv[128];
#pragma unroll
        for (int i = 0; i < 128; i++) dv[i] = 0.f;
        mt_mb_wait(sm.kv_full(), n & 1);
        for (int it = 0; it < nit; it++, gi++, hn++) {
            const int st = gi % STAGES;
            mt_mb_wait(sm.full(st), (gi / STAGES) & 1);
            const dkv_stats &l = sm.stats[st];
            const int q0 = (m.qb0 + it % m.nqb) * BR;
            float s[32], gh[32];
            mt_wg_fence();
            mt_attn_wg_abt<64, HD, BC, BR>(s, sm.k_s, sm.q(st));
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<32>(s);
            if (it + 1 == nit) mt_mb_arrive(sm.kv_empty()); // its last read of K
            const int dstart_last = DOCS ? mt_attn_tile_last_start<BR>(l.pos, q0, T) : 0;
            if (q0 < kw + 15 || q0 + BR > T || (DOCS && dstart_last > kw))
                dkv_probs<DOCS, SOFTCAP>(s, gh, l, q0, key_lo, T, t4, sl2, kcap,
                                         std::true_type());
            else
                dkv_probs<DOCS, SOFTCAP>(s, gh, l, q0, key_lo, T, t4, sl2, kcap,
                                         std::false_type());
            unsigned pt[16];
            mt_attn_wg_pack<64>(pt, s);
            mt_attn_wg_fence<128>(dv);
            mt_wg_fence();
            mt_attn_wg_pb<64, HD, BR>(dv, pt, sm.dout(st));
            mt_wg_commit();
            sm.hand.put(hn, SOFTCAP ? gh : s, t); // while dV's products run
            mt_wg_wait<0>();
            mt_attn_wg_fence<128>(dv);
            mt_attn_wg_hold<16>(pt);
            mt_mb_arrive(sm.empty(st));
        }
        store_rows(a.dv + ((int64_t)m.b * T * a.NKV + m.kvh) * HD, (int64_t)a.NKV * HD, key_lo, T,
                   t4, dv, 1.f);
    }
}

/* Consumer 1: for each item, dK of its 64 keys over the query tiles (dP^T,
 * dS^T from the hand-over, dK += dS^T Q), then stored (scaled). */
template <bool DOCS>
__device__ __forceinline__ void dkv_consume_k(const dkv_smem &sm, const mt_attn_args &a,
                                              int ngroups, int nkb, int chunk, int G, int warp,
                                              int t) {
    const int g = (t & 31) >> 2, t4 = t & 3, T = a.T;
    for (int n = 0, gi = 0, hn = 0;; n++) {
        const int w = sm.claims.get(n);
        if (w < 0) break;
        const mt_attn_dkv_item m = mt_attn_dkv_item_of<BC, BR, DOCS>(a, ngroups, nkb, chunk, w);
        const int nit = G * m.nqb, key_lo = m.k0 + warp * 16 + g;
        float dk[128];
#pragma unroll
        for (int i = 0; i < 128; i++) dk[i] = 0.f;
        mt_mb_wait(sm.kv_full(), n & 1);
        for (int it = 0; it < nit; it++, gi++, hn++) {
            const int st = gi % STAGES;
            mt_mb_wait(sm.full(st), (gi / STAGES) & 1);
            const float *dsum = sm.stats[st].dsum;
            float dp[32];
            mt_wg_fence();
            mt_attn_wg_abt<64, HD, BC, BR>(dp, sm.v_s, sm.dout(st));
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<32>(dp);
            if (it + 1 == nit) mt_mb_arrive(sm.kv_empty()); // its last read of V
#pragma unroll
            for (int i = 0; i < 32; i++) dp[i] -= dsum[acc_col(i, t4)];
            sm.hand.take_times(hn, dp, t); // dS^T = P^T (dP^T - D)
            unsigned dst[16];
            mt_attn_wg_pack<64>(dst, dp);
            mt_attn_wg_fence<128>(dk);
            mt_wg_fence();
            mt_attn_wg_pb<64, HD, BR>(dk, dst, sm.q(st));
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<128>(dk);
            mt_attn_wg_hold<16>(dst);
            mt_mb_arrive(sm.empty(st));
        }
        store_rows(a.dk + ((int64_t)m.b * T * a.NKV + m.kvh) * HD, (int64_t)a.NKV * HD, key_lo, T,
                   t4, dk, a.scale);
    }
}

/* ------------------------------------------------------------------------ */
/* dQ                                                                       */

/* The dQ pass's shared memory by shared-state-space address. */
struct dq_smem {
    unsigned q_s, do_s, bar;
    mt_attn_kv_ring<BC, HD, STAGES> kv;
    hand_ring hand;
    __device__ explicit dq_smem(unsigned char *dyn) {
        dq_storage *s = (dq_storage *)mt_attn_wg_align(dyn);
        q_s = mt_tc_smem_addr(s);
        do_s = q_s + (unsigned)offsetof(dq_storage, dout);
        bar = q_s + (unsigned)offsetof(dq_storage, sync);
        kv = {q_s + (unsigned)offsetof(dq_storage, k), q_s + (unsigned)offsetof(dq_storage, v),
              bar + (unsigned)offsetof(dq_sync, kv)};
        hand = {bar + (unsigned)offsetof(dq_sync, hand), &s->hand[0][0]};
    }
    __device__ unsigned q_full() const { return bar + (unsigned)offsetof(dq_sync, q_full); }
    __device__ unsigned q_empty() const { return bar + (unsigned)offsetof(dq_sync, q_empty); }
    /* By one thread, before a block barrier. */
    __device__ void init() const {
        mt_mb_init(q_full(), 1);
        mt_mb_init(q_empty(), MT_ATTN_CONSUMER_THREADS);
        kv.init();
        hand.init();
        mt_mb_fence_init();
    }
};

/* What a dQ consumer thread needs of its rows row_lo and row_lo + 8
 * (mt_attn_dq_row_stats): lse (log2 domain), D and, with documents, the
 * first key each may see. */
struct dq_rows {
    float lse2[2], D[2];
    int dstart[2];
};
template <bool DOCS>
__device__ __forceinline__ dq_rows dq_rows_of(const mt_attn_args &a, int b, int h, int row_lo) {
    dq_rows r = {};
    mt_attn_dq_row_stats<DOCS>(a, b, h, row_lo, r.lse2, r.D, r.dstart);
    return r;
}

/* P of the key tile from k0 from the scores S in s, in place (value i: key
 * k0 + acc_col(i, t4), row row_lo + 8 ((i >> 1) & 1)), masked
 * (std::true_type) to 0 for keys after the row, past T or before its
 * document. SOFTCAP: P (1 - t^2), P's only use here being dS. */
template <bool DOCS, bool SOFTCAP, class MASKED>
__device__ __forceinline__ void dq_probs(float s[32], int k0, int row_lo, int T, int t4,
                                         float sl2, float kcap, const dq_rows &rs, MASKED) {
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int r = (i >> 1) & 1, key = k0 + acc_col(i, t4);
        float x;
        if constexpr (SOFTCAP) {
            float p;
            x = mt_attn_cap_grad(mt_attn_tanh(s[i] * kcap), sl2, rs.lse2[r], &p) * p;
        } else {
            x = mt_attn_exp2(fmaf(s[i], sl2, -rs.lse2[r]));
        }
        if constexpr (MASKED::value)
            if (key > min(row_lo + r * 8, T - 1) || (DOCS && key < rs.dstart[r])) x = 0.f;
        s[i] = x;
    }
}

/* Consumer 0: for each of the block's query tiles, S = Q K^T and P of
 * every key tile, handed over. */
template <bool DOCS, bool SOFTCAP>
__device__ __forceinline__ void dq_consume_p(const dq_smem &sm, const mt_attn_args &a,
                                             const mt_attn_qtiles &tl, int warp, int t) {
    const float sl2 = mt_attn_sl2<SOFTCAP>(a), kcap = SOFTCAP ? a.scale / a.softcap : 0.f;
    const int g = (t & 31) >> 2, t4 = t & 3, T = a.T;
    for (int n = 0, w = blockIdx.x, i0 = 0; w < tl.n; n++, w += gridDim.x) {
        const mt_attn_qtile it = mt_attn_qtile_of<BR, BC, DOCS>(a, tl, w);
        const int rw = it.q0 + warp * 16, row_lo = rw + g;
        const dq_rows rs = dq_rows_of<DOCS>(a, it.b, it.h, row_lo);
        const int dstart_warp = DOCS ? mt_attn_doc_start(a, it.b, min(rw + 15, T - 1)) : 0;
        mt_mb_wait(sm.q_full(), n & 1);
        for (int j = it.j0; j < it.nkb; j++) {
            const int i = i0 + j - it.j0, st = i % STAGES;
            sm.kv.wait_k(i);
            float s[32];
            mt_wg_fence();
            mt_attn_wg_abt<64, HD, BR, BC>(s, sm.q_s, sm.kv.k(st));
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<32>(s);
            mt_mb_arrive(sm.kv.empty_k(st));
            mt_mb_arrive(sm.kv.empty_v(st)); // consumer 0 reads no V
            if (j + 1 == it.nkb) mt_mb_arrive(sm.q_empty()); // its last read of Q
            const int k0 = j * BC;
            if (k0 + BC - 1 > rw || k0 + BC > T || (DOCS && k0 < dstart_warp))
                dq_probs<DOCS, SOFTCAP>(s, k0, row_lo, T, t4, sl2, kcap, rs, std::true_type());
            else dq_probs<DOCS, SOFTCAP>(s, k0, row_lo, T, t4, sl2, kcap, rs, std::false_type());
            sm.hand.put(i, s, t);
        }
        i0 += it.nkb - it.j0;
    }
}

/* Consumer 1: for each of the block's query tiles, dQ over its key tiles
 * (dP = dO V^T, dS = P (dP - D) from the hand-over, dQ += dS K), then
 * stored (scaled). */
template <bool DOCS>
__device__ __forceinline__ void dq_consume_ds(const dq_smem &sm, const mt_attn_args &a,
                                              const mt_attn_qtiles &tl, int warp, int t) {
    const int g = (t & 31) >> 2, t4 = t & 3, T = a.T;
    for (int n = 0, w = blockIdx.x, i0 = 0; w < tl.n; n++, w += gridDim.x) {
        const mt_attn_qtile it = mt_attn_qtile_of<BR, BC, DOCS>(a, tl, w);
        const int row_lo = it.q0 + warp * 16 + g;
        const dq_rows rs = dq_rows_of<false>(a, it.b, it.h, row_lo);
        float dq[128];
#pragma unroll
        for (int i = 0; i < 128; i++) dq[i] = 0.f;
        mt_mb_wait(sm.q_full(), n & 1);
        for (int j = it.j0; j < it.nkb; j++) {
            const int i = i0 + j - it.j0, st = i % STAGES;
            sm.kv.wait_v(i);
            float dp[32];
            mt_wg_fence();
            mt_attn_wg_abt<64, HD, BR, BC>(dp, sm.do_s, sm.kv.v(st));
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<32>(dp);
            mt_mb_arrive(sm.kv.empty_v(st));
            if (j + 1 == it.nkb) mt_mb_arrive(sm.q_empty()); // its last read of dO
#pragma unroll
            for (int x = 0; x < 32; x++) dp[x] -= rs.D[(x >> 1) & 1];
            sm.hand.take_times(i, dp, t); // dS = P (dP - D)
            sm.kv.wait_k(i);
            unsigned ds[16];
            mt_attn_wg_pack<64>(ds, dp);
            mt_attn_wg_fence<128>(dq);
            mt_wg_fence();
            mt_attn_wg_pb<64, HD, BC>(dq, ds, sm.kv.k(st));
            mt_wg_commit();
            mt_wg_wait<0>();
            mt_attn_wg_fence<128>(dq);
            mt_attn_wg_hold<16>(ds);
            mt_mb_arrive(sm.kv.empty_k(st));
        }
        store_rows(a.dq + ((int64_t)it.b * T * a.NH + it.h) * HD, (int64_t)a.NH * HD, row_lo, T,
                   t4, dq, a.scale);
        i0 += it.nkb - it.j0;
    }
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

/* Persistent: the items are the (key tile, group) pairs in the order of
 * mt_attn_chunked, claimed from the counter pair ctr one at a time (their
 * work differs up to G T / 64-fold). tq, tdo, tk, tv: TMA maps with boxes
 * of 64 rows. */
template <bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(NT, 1)
    mt_attn_dkv256_kernel(const __grid_constant__ CUtensorMap tq,
                          const __grid_constant__ CUtensorMap tdo,
                          const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv, mt_attn_args a, int ngroups,
                          int nkb, int chunk, unsigned *ctr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    const dkv_smem sm(mt_attn_wg_smem);
    const int t = threadIdx.x & 127, warp = t >> 5, wg = threadIdx.x >> 7;
    const int G = a.NH / a.NKV;
    if (threadIdx.x == 0) sm.init();
    __syncthreads();
    if (wg == 0) {
        mt_wg_regs_dec<40>();
        mt_attn_dkv_load<BC, BR, HD, STAGES, DOCS>(sm, &tq, &tdo, &tk, &tv, a, ngroups, nkb,
                                                     chunk, G, ngroups * nkb, ctr);
        return;
    }
    mt_wg_regs_inc<232>();
    if (wg == 1) dkv_consume_v<DOCS, SOFTCAP>(sm, a, ngroups, nkb, chunk, G, warp, t);
    else dkv_consume_k<DOCS>(sm, a, ngroups, nkb, chunk, G, warp, t);
#endif
}

/* Persistent (mt_attn_launch_layout's grid): block x takes the query tiles
 * x, x + grid, ... of tl, one ring of key tiles running on across them.
 * tq, tdo, tk, tv: TMA maps with boxes of 64 rows. */
template <bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(NT, 1)
    mt_attn_dq256_kernel(const __grid_constant__ CUtensorMap tq,
                         const __grid_constant__ CUtensorMap tdo,
                         const __grid_constant__ CUtensorMap tk,
                         const __grid_constant__ CUtensorMap tv, mt_attn_args a,
                         mt_attn_qtiles tl) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    const dq_smem sm(mt_attn_wg_smem);
    const int t = threadIdx.x & 127, warp = t >> 5, wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) sm.init();
    __syncthreads();
    if (wg == 0) {
        mt_wg_regs_dec<24>();
        if (threadIdx.x == 0) mt_attn_dq_load<BR, BC, HD, DOCS>(sm, &tq, &tdo, &tk, &tv, a, tl);
        return;
    }
    mt_wg_regs_inc<240>();
    if (wg == 1) dq_consume_p<DOCS, SOFTCAP>(sm, a, tl, warp, t);
    else dq_consume_ds<DOCS>(sm, a, tl, warp, t);
#endif
}

template <bool DOCS, bool SOFTCAP>
int launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    auto kdkv = mt_attn_dkv256_kernel<DOCS, SOFTCAP>;
    auto kdq = mt_attn_dq256_kernel<DOCS, SOFTCAP>;
    CUtensorMap tq, tdo, tk, tv;
    if (mt_attn_tma_map(&tq, a.q, B, a.T, a.NH, HD, BR, err) ||
        mt_attn_tma_map(&tdo, a.dout, B, a.T, a.NH, HD, BR, err) ||
        mt_attn_tma_map(&tk, a.k, B, a.T, a.NKV, HD, BC, err) ||
        mt_attn_tma_map(&tv, a.v, B, a.T, a.NKV, HD, BC, err))
        return -1;
    if (mt_attn_set_smem((const void *)kdkv, DKV_SMEM, err) ||
        mt_attn_set_smem((const void *)kdq, DQ_SMEM, err) ||
        mt_attn_launch_dsum(a, B, 1, st, err))
        return -1;
    const int nkb = (a.T + BC - 1) / BC, ngroups = a.NKV * B;
    mt_attn_layout lay;
    unsigned *ctr;
    if (mt_attn_launch_layout(nkb * ngroups, &lay, err) || mt_attn_tile_counter(&ctr, st, err))
        return -1;
    kdkv<<<lay.grid, NT, DKV_SMEM, st>>>(tq, tdo, tk, tv, a, ngroups, nkb, lay.chunk, ctr + 2);
    if (mt_attn_check_launch(err, "attention backward dK/dV (bf16, wgmma, head dim 256)"))
        return -1;
    mt_attn_qtiles tl;
    mt_attn_layout qlay;
    if (mt_attn_qtiles_init(&tl, a, B, BR, &qlay, err)) return -1;
    kdq<<<qlay.grid, NT, DQ_SMEM, st>>>(tq, tdo, tk, tv, a, tl);
    return mt_attn_check_launch(err, "attention backward dQ (bf16, wgmma, head dim 256)");
}

} // namespace

bool mt_attn_bwd_wgmma256_fits(void) {
    return mt_wg_device_fits(DKV_SMEM > DQ_SMEM ? DKV_SMEM : DQ_SMEM);
}

int mt_attn_bwd_wgmma256(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.softcap > 0)
        return a.pos ? launch<true, true>(a, B, st, err) : launch<false, true>(a, B, st, err);
    return a.pos ? launch<true, false>(a, B, st, err) : launch<false, false>(a, B, st, err);
}
