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

/* The dK/dV pass: keys a block, query rows a tile, threads, and buffers of
 * a query tile (Q, dO and the rows' lse, D and positions). */
constexpr int DKV_BC = 128, DKV_BR = 64, DKV_NT = 384, DKV_STAGES = 3;

/* A query tile's rows as the dK/dV pass stages them: lse, D (rowsum(dO O))
 * and, with documents, their positions; 0 past T. */
struct dkv_stats {
    float lse[DKV_BR], dsum[DKV_BR];
    int32_t pos[DKV_BR];
};

/* The mbarriers of one buffer of the dK/dV pass's query tiles. */
struct dkv_stage_bars {
    uint64_t full;  // Q and dO have landed (TMA transactions) and the 128
                    // producer threads have stored the rows' statistics
    uint64_t empty; // the 256 consumer threads have read the buffer
};

/* The dK/dV pass's mbarriers and claim slots (alignas rounds the block up
 * to 256 bytes). */
struct alignas(256) dkv_sync {
    uint64_t kv_full;  // K and V have landed (TMA transactions)
    uint64_t kv_empty; // the item's last products are done (256 consumer threads)
    dkv_stage_bars stage[DKV_STAGES];
    uint64_t claim[4]; // mt_attn_claims' barriers
    int slot[4];       // mt_attn_claims' slots
};

/* A query tile's Q and dO (64 rows each), one buffer of the dK/dV pass. */
template <int HD> struct alignas(1024) dkv_qtile {
    bf16 q[DKV_BR * HD], dout[DKV_BR * HD];
};

/* The dK/dV pass's shared memory: the item's 128 keys of K and V, then three
 * buffers of a query tile (Q and dO, and their rows' statistics), then the
 * barriers. The tiles are 128-byte swizzled (attention_wgmma.cuh), so
 * 1024-byte aligned. */
template <int HD> struct dkv_storage {
    alignas(1024) bf16 k[DKV_BC * HD];
    alignas(1024) bf16 v[DKV_BC * HD];
    dkv_qtile<HD> qd[DKV_STAGES];
    dkv_stats stats[DKV_STAGES];
    dkv_sync sync;
};

/* K_BYTES, Q_BYTES: the TMA transactions of the item's K (or V) and of a
 * Q (or dO) tile; SMEM: the block's dynamic shared memory. */
template <int HD> struct DkvCfg {
    static constexpr int BC = DKV_BC, BR = DKV_BR, NT = DKV_NT;
    static constexpr int K_BYTES = BC * HD * 2, Q_BYTES = BR * HD * 2;
    static constexpr size_t SMEM = MT_ATTN_SMEM_BYTES(dkv_storage<HD>, sync);
    static_assert(sizeof(dkv_storage<HD>::k) == K_BYTES && sizeof(dkv_qtile<HD>) == 2 * Q_BYTES,
                  "tiles are the TMA boxes' bytes");
    static_assert(offsetof(dkv_storage<HD>, v) % 1024 == 0 &&
                      offsetof(dkv_storage<HD>, qd) % 1024 == 0,
                  "tiles on 1024-byte swizzle atoms");
    static_assert(SMEM <= 227 * 1024, "a block's shared memory on Hopper");
};

/* The dQ pass: query rows a block, keys a tile, threads, buffers of K and
 * of V. */
constexpr int DQ_BR = 128, DQ_BC = 128, DQ_NT = 384, DQ_STAGES = 2;

/* The dQ pass's mbarriers (alignas rounds the block up to 256 bytes). */
struct alignas(256) dq_sync {
    uint64_t q_full;               // Q and dO have landed (TMA transactions)
    uint64_t q_empty;              // the tile's last products are done (256 consumer threads)
    mt_attn_kv_bars kv[DQ_STAGES]; // the key-tile ring's
};

/* The dQ pass's shared memory: the tile's Q and dO, the key-tile ring, then
 * the barriers. The tiles are 128-byte swizzled (attention_wgmma.cuh), so
 * 1024-byte aligned. */
template <int HD> struct dq_storage {
    alignas(1024) bf16 q[DQ_BR * HD];
    alignas(1024) bf16 dout[DQ_BR * HD];
    alignas(1024) bf16 k[DQ_STAGES][DQ_BC * HD];
    alignas(1024) bf16 v[DQ_STAGES][DQ_BC * HD];
    dq_sync sync;
};

/* Q_BYTES, KV_BYTES: the TMA transactions of a Q (or dO) tile and of a K
 * (or V) tile; SMEM: the block's dynamic shared memory. */
template <int HD> struct DqCfg {
    static constexpr int BR = DQ_BR, BC = DQ_BC, NT = DQ_NT;
    static constexpr int Q_BYTES = BR * HD * 2, KV_BYTES = BC * HD * 2;
    static constexpr size_t SMEM = MT_ATTN_SMEM_BYTES(dq_storage<HD>, sync);
    static_assert(sizeof(dq_storage<HD>::q) == Q_BYTES && sizeof(dq_storage<HD>::k[0]) == KV_BYTES,
                  "tiles are the TMA boxes' bytes");
    static_assert(offsetof(dq_storage<HD>, dout) % 1024 == 0 &&
                      offsetof(dq_storage<HD>, k) % 1024 == 0 &&
                      offsetof(dq_storage<HD>, v) % 1024 == 0,
                  "tiles on 1024-byte swizzle atoms");
    static_assert(SMEM <= 227 * 1024, "a block's shared memory on Hopper");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* A buffer's dkv_stats reached as floats from its start l (the indexing
 * the compiled code was measured with). */
struct dkv_stats_ref {
    float *l;
    __device__ float *lse() const { return l; }
    __device__ float *dsum() const { return l + DKV_BR; }
    __device__ int32_t *pos() const { return (int32_t *)(dsum() + DKV_BR); }
};
static_assert(offsetof(dkv_stats, dsum) == DKV_BR * sizeof(float) &&
                  offsetof(dkv_stats, pos) == 2 * DKV_BR * sizeof(float),
              "dkv_stats_ref's indexing");

/* The dK/dV pass's shared memory by shared-state-space address (as TMA,
 * wgmma and mbarriers take them), each computed once from the storage's
 * base, and the rows' statistics by pointer. */
template <int HD> struct dkv_smem {
    using C = DkvCfg<HD>;
    using S = dkv_storage<HD>;
    unsigned k_s, v_s, q_s, bar; // k, v, qd[0], sync
    float *stats;                // stats[0]
    mt_attn_claims claims;
    __device__ explicit dkv_smem(unsigned char *dyn) {
        S *s = (S *)mt_attn_wg_align(dyn);
        k_s = mt_tc_smem_addr(s);
        v_s = k_s + (unsigned)offsetof(S, v);
        q_s = k_s + (unsigned)offsetof(S, qd);
        stats = (float *)s->stats;
        bar = k_s + (unsigned)offsetof(S, sync);
        claims = {bar + (unsigned)offsetof(dkv_sync, claim), (volatile int *)s->sync.slot};
    }
    /* Buffer st's rows' statistics. */
    __device__ dkv_stats_ref stats_of(int st) const {
        return {stats + st * (int)(sizeof(dkv_stats) / sizeof(float))};
    }
    __device__ unsigned kv_full() const { return bar + (unsigned)offsetof(dkv_sync, kv_full); }
    __device__ unsigned kv_empty() const { return bar + (unsigned)offsetof(dkv_sync, kv_empty); }
    /* Buffer st: its Q and dO tiles, its full and empty barriers. */
    __device__ unsigned q(int st) const { return q_s + st * 2 * C::Q_BYTES; }
    __device__ unsigned dout(int st) const { return q(st) + C::Q_BYTES; }
    __device__ unsigned full(int st) const {
        return bar + (unsigned)(offsetof(dkv_sync, stage) + offsetof(dkv_stage_bars, full)) +
               (int)sizeof(dkv_stage_bars) * st;
    }
    __device__ unsigned empty(int st) const {
        return bar + (unsigned)(offsetof(dkv_sync, stage) + offsetof(dkv_stage_bars, empty)) +
               (int)sizeof(dkv_stage_bars) * st;
    }
    /* Initialises every mbarrier: by one thread, before a block barrier. */
    __device__ void init() const {
        mt_mb_init(kv_full(), 1);
        mt_mb_init(kv_empty(), MT_ATTN_CONSUMER_THREADS);
        for (int st = 0; st < DKV_STAGES; st++) {
            mt_mb_init(full(st), MT_ATTN_WG_THREADS); // every producer thread (row statistics)
            mt_mb_init(empty(st), MT_ATTN_CONSUMER_THREADS);
        }
        claims.init();
        mt_mb_fence_init();
    }
};

using dkv_item = mt_attn_dkv_item; // (attention_wgmma.cuh)

/* What dkv_probs needs of a dK/dV consumer thread: its first key key_lo
 * (its keys: key_lo, key_lo + 8), T, and sl2, the softmax scale in the
 * log2 domain; soft-capped, kcap = scale / c (mt_attn_sl2). */
struct dkv_keys {
    int key_lo, T;
    float sl2, kcap;
};

/* P^T of the query tile of rows q0 .. (their lse and positions) from the
 * scores S^T in st, in place (this thread's 32: keys key_lo + 8 ((i >> 1)
 * & 1), queries q0 + 8 (i >> 2) + 2 t4 + (i & 1)): exp(S^T - lse), with the
 * causal mask, queries past T (their lse reads 0) and queries of a later
 * document than the key giving 0 when masked (std::true_type); the tiles
 * that need no mask (most of them) take code with none. (q0 and T by
 * reference: passed by value, the compiler orders the masked tiles'
 * compares otherwise than in the code that was measured.) SOFTCAP: not
 * P^T but t = tanh(S^T scale / c), masked -inf, while dP^T lands; P^T comes
 * from t with dS^T (dkv_cap_ds), no more registers held. */
template <bool DOCS, bool SOFTCAP, class MASKED>
__device__ __forceinline__ void dkv_probs(float st[32], const float *lse, const int32_t *pos,
                                          const int &q0, const dkv_keys &ky, int t4, MASKED) {
    const int T = ky.T;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int qc = (i >> 2) * 8 + 2 * t4 + (i & 1), key = ky.key_lo + ((i >> 1) & 1) * 8;
        float x = SOFTCAP ? mt_attn_tanh(st[i] * ky.kcap)
                          : mt_attn_exp2(fmaf(st[i], ky.sl2, -lse[qc] * MT_ATTN_LOG2E));
        if constexpr (MASKED::value)
            if (q0 + qc < key || q0 + qc >= T || (DOCS && q0 + qc - pos[qc] > key))
                x = SOFTCAP ? -INFINITY : 0.f;
        st[i] = x;
    }
}

/* Soft-capped: P^T from t (dkv_probs) in place, and dS^T = P^T (dP^T - D)
 * (1 - t^2) in dpt. */
__device__ __forceinline__ void dkv_cap_ds(float st[32], float dpt[32], const float *lse,
                                           const float *dsum, const dkv_keys &ky, int t4) {
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int qc = (i >> 2) * 8 + 2 * t4 + (i & 1);
        float p;
        const float f = mt_attn_cap_grad(st[i], ky.sl2, lse[qc] * MT_ATTN_LOG2E, &p);
        dpt[i] = p * (dpt[i] - dsum[qc]) * f;
        st[i] = p;
    }
}

/* dV += P^T dO and dK += dS^T Q (the query tile's rows are the reduction):
 * P^T and dS^T (p32, ds32: this thread's 32 of each, fp32) rounded to bf16
 * A fragments in pt and dst, dO and Q at shared addresses dot and qt;
 * returns once the products have landed in dv and dk. */
template <int HD>
__device__ __forceinline__ void dkv_update(float dk[HD / 2], float dv[HD / 2], const float p32[32],
                                           const float ds32[32], unsigned pt[16],
                                           unsigned dst[16], unsigned qt, unsigned dot) {
    mt_attn_wg_pack<64>(pt, p32);
    mt_attn_wg_pack<64>(dst, ds32);
    mt_attn_wg_fence<HD / 2>(dv);
    mt_attn_wg_fence<HD / 2>(dk);
    mt_wg_fence();
    mt_attn_wg_pb<64, HD, DKV_BR>(dv, pt, dot);
    mt_attn_wg_pb<64, HD, DKV_BR>(dk, dst, qt);
    mt_wg_commit();
    mt_wg_wait<0>();
    mt_attn_wg_fence<HD / 2>(dv);
    mt_attn_wg_fence<HD / 2>(dk);
}

/* A dK/dV consumer thread's rows of dK (scaled) and dV for item m: keys
 * key_lo and key_lo + 8, columns 2 t4, 2 t4 + 1 of each 8, straight to
 * global memory (fp32); keys past T and padded head-dim columns left out. */
template <int HD>
__device__ __forceinline__ void dkv_store(const mt_attn_args &a, const dkv_item &m, int key_lo,
                                          int t4, const float dk[HD / 2], const float dv[HD / 2]) {
    const int T = a.T;
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
}

/* dK/dV consumer cw (keys 64 cw .. of each item; warp, lane: this thread's
 * in its warpgroup): the block's items as the producer posts them, each
 * one's mainloop over its query tiles (S^T = K Q^T and dP^T = V dO^T in one
 * turn, P^T by dkv_probs while dP^T lands, dS^T = P^T (dP^T - D), then
 * dkv_update), then its rows of dK and dV out (dkv_store). The mainloop
 * stays in this function, and the register arrays are declared here, in
 * this order: so the compiler keeps the accumulators' registers as in the
 * code that was measured. */
template <int HD, bool DOCS, bool SOFTCAP>
__device__ __forceinline__ void dkv_consume(const dkv_smem<HD> &sm, const mt_attn_args &a,
                                            int ngroups, int nkb, int chunk, int G, int cw,
                                            int warp, int lane) {
    using C = DkvCfg<HD>;
    constexpr int S = DKV_STAGES;
    const float sl2 = mt_attn_sl2<SOFTCAP>(a);
    const float kcap = SOFTCAP ? a.scale / a.softcap : 0.f;
    const int g = lane >> 2, t4 = lane & 3;
    const unsigned sk_wg = sm.k_s + cw * 64 * 128, sv_wg = sm.v_s + cw * 64 * 128; // the 64 keys
    const int T = a.T;
    int w = sm.claims.get(0);
    if (w >= 0) mt_attn_turns_begin(cw);
    for (int n = 0, gi = 0; w >= 0; n++) {
        const dkv_item m = mt_attn_dkv_item_of<DKV_BC, DKV_BR, DOCS>(a, ngroups, nkb, chunk, w);
        const int nit = G * m.nqb, k0 = m.k0;
        int next = -1; // the next item, known by the item's last turn
        const int kw = k0 + cw * 64 + warp * 16;
        const int key_lo = kw + g;
        const dkv_keys ky = {key_lo, T, sl2, kcap}; // keys key_lo, key_lo + 8
        float dk[HD / 2], dv[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;

        mt_mb_wait(sm.kv_full(), n & 1);
        for (int it = 0; it < nit; it++, gi++) {
            const int st = gi % S;
            mt_mb_wait(sm.full(st), (gi / S) & 1);
            const unsigned qt = sm.q(st), dot = sm.dout(st);
            const dkv_stats_ref l = sm.stats_of(st); // the rows' lse, D, positions
            const float *lse = l.lse(), *dsum = l.dsum();
            const int32_t *pos = l.pos();
            const int q0 = (m.qb0 + it % m.nqb) * C::BR;
            const int dstart_last = DOCS ? mt_attn_tile_last_start<C::BR>(pos, q0, T) : 0;

            // S^T = K Q^T and dP^T = V dO^T (64 keys x 64 queries a consumer).
            float st_[32], dpt[32];
            if (it + 1 == nit) next = sm.claims.get(n + 1);
            mt_attn_wg_abt2<64, HD, C::BC, C::BR>(st_, sk_wg, qt, dpt, sv_wg, dot, cw,
                                                  it + 1 == nit && next < 0);
            if (q0 < kw + 15 || q0 + C::BR > T || (DOCS && dstart_last > kw))
                dkv_probs<DOCS, SOFTCAP>(st_, lse, pos, q0, ky, t4, std::true_type());
            else dkv_probs<DOCS, SOFTCAP>(st_, lse, pos, q0, ky, t4, std::false_type());
            mt_wg_wait<0>();
            mt_attn_wg_fence<32>(dpt);
            if (it + 1 == nit) mt_mb_arrive(sm.kv_empty()); // the item's last read of K and V
            if constexpr (SOFTCAP) {
                dkv_cap_ds(st_, dpt, lse, dsum, ky, t4);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++)
                    dpt[i] = st_[i] * (dpt[i] - dsum[(i >> 2) * 8 + 2 * t4 + (i & 1)]);
            }

            unsigned pt[16], dst[16];
            dkv_update<HD>(dk, dv, st_, dpt, pt, dst, qt, dot);
            mt_mb_arrive(sm.empty(st));
        }
        dkv_store<HD>(a, m, ky.key_lo, t4, dk, dv);
        w = next;
    }
}

/* The dQ pass's shared memory by shared-state-space address (as TMA, wgmma
 * and mbarriers take them), each computed once from the storage's base. */
template <int HD> struct dq_smem {
    using S = dq_storage<HD>;
    unsigned q_s, do_s, bar; // q, dout, sync
    mt_attn_kv_ring<DQ_BC, HD, DQ_STAGES> kv;
    __device__ explicit dq_smem(unsigned char *dyn) {
        q_s = mt_tc_smem_addr(mt_attn_wg_align(dyn));
        do_s = q_s + (unsigned)offsetof(S, dout);
        bar = q_s + (unsigned)offsetof(S, sync);
        kv = {q_s + (unsigned)offsetof(S, k), q_s + (unsigned)offsetof(S, v),
              bar + (unsigned)offsetof(dq_sync, kv)};
    }
    __device__ unsigned q_full() const { return bar + (unsigned)offsetof(dq_sync, q_full); }
    __device__ unsigned q_empty() const { return bar + (unsigned)offsetof(dq_sync, q_empty); }
    /* Initialises every mbarrier: by one thread, before a block barrier. */
    __device__ void init() const {
        mt_mb_init(q_full(), 1);
        mt_mb_init(q_empty(), MT_ATTN_CONSUMER_THREADS);
        kv.init();
        mt_mb_fence_init();
    }
};

/* P of key tile j (its first key k0) from the scores S in s, in place
 * (this thread's 64: key k0 + 2 t4 + y, y = 8 (i >> 2) + (i & 1) a
 * constant, of row row_lo + 8 r, r = (i >> 1) & 1): exp(S - lse) (lse2:
 * the rows' lse in the log2 domain, sl2 the scale), masked where y > hi[r]
 * or y < lo[r] when masked (std::true_type): keys after the row, past T or
 * before its document (dstart: the rows' first keys); the tiles that need
 * no mask (most of them) take code with none. (k0 by reference: passed by
 * value, the compiler orders the caller's compares otherwise than in the
 * code that was measured.) SOFTCAP: P (1 - t^2) (t = tanh(S scale / c),
 * kcap = scale / c), P's only use here being dS. */
template <bool DOCS, bool SOFTCAP, class MASKED>
__device__ __forceinline__ void dq_probs(float s[64], const int &k0, int row_lo, int T, int t4,
                                         float sl2, float kcap, const float lse2[2],
                                         const int dstart[2], MASKED) {
    [[maybe_unused]] int hi[2], lo[2];
    if constexpr (MASKED::value) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            hi[r] = min(row_lo + r * 8, T - 1) - k0 - 2 * t4;
            lo[r] = DOCS ? dstart[r] - k0 - 2 * t4 : 0;
        }
    }
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int r = (i >> 1) & 1, y = (i >> 2) * 8 + (i & 1);
        float x;
        if constexpr (SOFTCAP) {
            float p;
            x = mt_attn_cap_grad(mt_attn_tanh(s[i] * kcap), sl2, lse2[r], &p) * p;
        } else {
            x = mt_attn_exp2(fmaf(s[i], sl2, -lse2[r]));
        }
        if constexpr (MASKED::value)
            if (y > hi[r] || (DOCS && y < lo[r])) x = 0.f;
        s[i] = x;
    }
}

/* dQ += dS K (the key tile's keys are the reduction): dS (ds64: this
 * thread's 64, fp32) rounded to bf16 A fragments in ds, K at shared address
 * kt; returns once the products have landed in dq. */
template <int HD>
__device__ __forceinline__ void dq_update(float dq[HD / 2], const float ds64[64], unsigned ds[32],
                                          unsigned kt) {
    mt_attn_wg_pack<128>(ds, ds64);
    mt_attn_wg_fence<HD / 2>(dq);
    mt_wg_fence();
    mt_attn_wg_pb<128, HD, DQ_BC>(dq, ds, kt);
    mt_wg_commit();
    mt_wg_wait<0>();
    mt_attn_wg_fence<HD / 2>(dq);
}

/* A dQ consumer thread's rows of dQ (scaled) for query tile it: rows row_lo
 * and row_lo + 8, columns 2 t4, 2 t4 + 1 of each 8, straight to global
 * memory (fp32); rows past T and padded head-dim columns left out. */
template <int HD>
__device__ __forceinline__ void dq_store(const mt_attn_args &a, const mt_attn_qtile &it, int row_lo,
                                         int t4, const float dq[HD / 2]) {
    const int T = a.T;
    const int64_t ldq = (int64_t)a.NH * a.HD;
    float *gdq = a.dq + ((int64_t)it.b * T * a.NH + it.h) * a.HD;
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
}

/* dQ consumer cw (rows 64 cw .. of each query tile; warp, lane: this
 * thread's in its warpgroup): block x's query tiles x, x + grid, ..., each
 * one's mainloop over its key tiles (S = Q K^T and dP = dO V^T in one turn,
 * P by dq_probs while dP lands, dS = P (dP - D), then dq_update), then its
 * rows of dQ out (dq_store). The mainloop stays in this function, and the
 * register arrays are declared here, in this order: so the compiler keeps
 * the accumulators' registers as in the code that was measured. */
template <int HD, bool DOCS, bool SOFTCAP>
__device__ __forceinline__ void dq_consume(const dq_smem<HD> &sm, const mt_attn_args &a,
                                           const mt_attn_qtiles &tl, int cw, int warp, int lane) {
    using C = DqCfg<HD>;
    constexpr int S = DQ_STAGES;
    const int T = a.T;
    const auto &kv = sm.kv;
    const float sl2 = mt_attn_sl2<SOFTCAP>(a);
    const float kcap = SOFTCAP ? a.scale / a.softcap : 0.f;
    const int g = lane >> 2, t4 = lane & 3;
    const unsigned sq_wg = sm.q_s + cw * 64 * 128, sdo_wg = sm.do_s + cw * 64 * 128; // 64 rows
    if (blockIdx.x < tl.n) mt_attn_turns_begin(cw);
    // n, i0: the query tiles and the key tiles this block has done; w: tile n
    for (int n = 0, w = blockIdx.x, i0 = 0; w < tl.n; n++, w += gridDim.x) {
        const mt_attn_qtile it = mt_attn_qtile_of<DQ_BR, DQ_BC, DOCS>(a, tl, w);
        const int q0 = it.q0, h = it.h, b = it.b, nkb = it.nkb, j0 = it.j0;
        const bool last_item = w + (int)gridDim.x >= tl.n;
        const int rw = q0 + cw * 64 + warp * 16, row_lo = rw + g; // rows row_lo, row_lo + 8
        float lse2[2], D[2];
        int dstart[2] = {0, 0};
        mt_attn_dq_row_stats<DOCS>(a, b, h, row_lo, lse2, D, dstart);
        const int dstart_warp = DOCS ? mt_attn_doc_start(a, b, min(rw + 15, T - 1)) : 0;
        float dq[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;

        mt_mb_wait(sm.q_full(), n & 1);
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
            if (k0 + C::BC - 1 > rw || k0 + C::BC > T || (DOCS && k0 < dstart_warp))
                dq_probs<DOCS, SOFTCAP>(s, k0, row_lo, T, t4, sl2, kcap, lse2, dstart,
                                        std::true_type());
            else dq_probs<DOCS, SOFTCAP>(s, k0, row_lo, T, t4, sl2, kcap, lse2, dstart,
                                         std::false_type());
            mt_wg_wait<0>();
            mt_attn_wg_fence<64>(dp);
            mt_mb_arrive(kv.empty_v(st));
            if (j + 1 == nkb) mt_mb_arrive(sm.q_empty()); // the item's last read of Q and dO
#pragma unroll
            for (int i = 0; i < 64; i++) dp[i] = s[i] * (dp[i] - D[(i >> 1) & 1]);

            unsigned ds[32];
            dq_update<HD>(dq, dp, ds, kt);
            mt_mb_arrive(kv.empty_k(st));
        }

        dq_store<HD>(a, it, row_lo, t4, dq);
        i0 += nkb - j0;
    }
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

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
 * its rows. SOFTCAP: soft-capped scores (a.softcap > 0). */
template <int HD, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(DkvCfg<HD>::NT, 1)
    mt_attn_dkv_wgmma_kernel(const __grid_constant__ CUtensorMap tq,
                             const __grid_constant__ CUtensorMap tdo,
                             const __grid_constant__ CUtensorMap tk,
                             const __grid_constant__ CUtensorMap tv, mt_attn_args a,
                             int ngroups, int nkb, int chunk, unsigned *ctr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    const dkv_smem<HD> sm(mt_attn_wg_smem);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    const int G = a.NH / a.NKV, nitems = ngroups * nkb; // query heads a kv head, items
    if (threadIdx.x == 0) sm.init();
    __syncthreads();
    if (wg == 0) { // the producer: thread 0 the tiles, every thread the rows' statistics
        mt_wg_regs_dec<40>();
        mt_attn_dkv_load<DKV_BC, DKV_BR, HD, DKV_STAGES, DOCS>(sm, &tq, &tdo, &tk, &tv, a, ngroups,
                                                              nkb, chunk, G, nitems, ctr);
        return;
    }
    mt_wg_regs_inc<232>();
    dkv_consume<HD, DOCS, SOFTCAP>(sm, a, ngroups, nkb, chunk, G, wg - 1, warp, lane);
#endif
}

/* tq, tdo, tk, tv: TMA maps (attention_wgmma.cuh) of q, dout, k, v.
 * Persistent (mt_attn_launch_layout's grid): block x takes the query tiles
 * x, x + grid, ... of tl (those of the forward, in its order), with
 * one ring of key tiles running on across them, and Q and dO behind a full
 * and an empty barrier, so that the producer loads the next tile's Q, dO
 * and first keys while the consumers end a tile and store its rows.
 * SOFTCAP: soft-capped scores (a.softcap > 0). */
template <int HD, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(DqCfg<HD>::NT, 1)
    mt_attn_dq_wgmma_kernel(const __grid_constant__ CUtensorMap tq,
                            const __grid_constant__ CUtensorMap tdo,
                            const __grid_constant__ CUtensorMap tk,
                            const __grid_constant__ CUtensorMap tv, mt_attn_args a,
                            mt_attn_qtiles tl) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    const dq_smem<HD> sm(mt_attn_wg_smem);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) sm.init();
    __syncthreads();
    if (wg == 0) { // the producer
        mt_wg_regs_dec<24>();
        if (threadIdx.x != 0) return;
        mt_attn_dq_load<DQ_BR, DQ_BC, HD, DOCS>(sm, &tq, &tdo, &tk, &tv, a, tl);
        return;
    }
    mt_wg_regs_inc<240>();
    dq_consume<HD, DOCS, SOFTCAP>(sm, a, tl, wg - 1, warp, lane);
#endif
}

template <int HD, bool DOCS, bool SOFTCAP>
int launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    using CK = DkvCfg<HD>;
    using CQ = DqCfg<HD>;
    auto kdkv = mt_attn_dkv_wgmma_kernel<HD, DOCS, SOFTCAP>;
    auto kdq = mt_attn_dq_wgmma_kernel<HD, DOCS, SOFTCAP>;
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

template <bool DOCS, bool SOFTCAP>
static int launch_hd(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    // HD 80 and 96 run as 128 (the kernels' comment)
    return a.HD == 64 ? launch<64, DOCS, SOFTCAP>(a, B, st, err)
                      : launch<128, DOCS, SOFTCAP>(a, B, st, err);
}

int mt_attn_bwd_wgmma(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.softcap > 0)
        return a.pos ? launch_hd<true, true>(a, B, st, err) : launch_hd<false, true>(a, B, st, err);
    return a.pos ? launch_hd<true, false>(a, B, st, err) : launch_hd<false, false>(a, B, st, err);
}
