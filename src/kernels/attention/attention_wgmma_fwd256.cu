/* The Hopper bf16 attention forward at head dim 256 (Gemma 2 and 3; the
 * contract: attention.h): attention_wgmma_fwd.cu's structure (a persistent
 * block of a producer warpgroup and two consumers of 64 query rows that
 * take turns at their products; S_j = Q K_j^T and O += P_{j-1} V_{j-1}
 * issued together, the softmax of S_j between their waits), sized for
 * 64 x 256 fp32 outputs (128 registers a thread): key tiles of 64
 * (m64n64 scores), one Q buffer, and the output stored from registers
 * (a staging tile would not fit beside Q and the key ring). */
#include <type_traits>

#include "kernels/attention/attention_wgmma.cuh"

namespace {

/* Head dim, query rows a block, keys a tile, threads, buffers of K and V. */
constexpr int HD = 256, BR = 128, BC = 64, NT = 384, STAGES = 2;
constexpr int Q_BYTES = BR * HD * 2;

/* The forward's mbarriers and claim slots. */
struct alignas(256) fwd_sync {
    uint64_t q_full, q_empty;   // Q landed; the tile's last S read it (256 consumer threads)
    uint64_t claim[4];          // mt_attn_claims'
    mt_attn_kv_bars kv[STAGES]; // the key-tile ring's
    int slot[4];
};

/* Q of the block's tile, the key-tile ring, then the barriers. */
struct fwd_storage {
    alignas(1024) bf16 q[BR * HD];
    alignas(1024) bf16 k[STAGES][BC * HD];
    alignas(1024) bf16 v[STAGES][BC * HD];
    fwd_sync sync;
};
constexpr size_t SMEM = MT_ATTN_SMEM_BYTES(fwd_storage, sync);
static_assert(sizeof(fwd_storage::q) == Q_BYTES, "Q is the TMA boxes' bytes");
static_assert(SMEM <= 227 * 1024, "a block's shared memory on Hopper");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

struct fwd_smem {
    unsigned q_s, bar;
    mt_attn_kv_ring<BC, HD, STAGES> kv;
    mt_attn_claims claims;
    __device__ explicit fwd_smem(unsigned char *dyn) {
        fwd_storage *s = (fwd_storage *)mt_attn_wg_align(dyn);
        q_s = mt_tc_smem_addr(s);
        bar = q_s + (unsigned)offsetof(fwd_storage, sync);
        kv = {q_s + (unsigned)offsetof(fwd_storage, k), q_s + (unsigned)offsetof(fwd_storage, v),
              bar + (unsigned)offsetof(fwd_sync, kv)};
        claims = {bar + (unsigned)offsetof(fwd_sync, claim), (volatile int *)s->sync.slot};
    }
    /* The n-th tile's Q (one buffer), its barriers and the parity of its
     * fill (mt_attn_fwd_load's). */
    static constexpr int QBUFS = 1;
    __device__ unsigned q(int) const { return q_s; }
    __device__ unsigned q_full(int = 0) const {
        return bar + (unsigned)offsetof(fwd_sync, q_full);
    }
    __device__ unsigned q_empty(int = 0) const {
        return bar + (unsigned)offsetof(fwd_sync, q_empty);
    }
    __device__ unsigned q_parity(int n) const { return n & 1; }
    /* By one thread, before a block barrier. */
    __device__ void init() const {
        mt_mb_init(q_full(), 1);
        mt_mb_init(q_empty(), MT_ATTN_CONSUMER_THREADS);
        claims.init();
        kv.init();
        mt_mb_fence_init();
    }
};

using fwd_tile = mt_attn_qtile; // (attention_wgmma.cuh)

/* A consumer thread's rows of its tile (mt_attn_wg_softmax's ROWS): row_lo
 * and row_lo + 8, the softmax scale sl2, with documents each row's first
 * key (rows past T take row T-1's). */
template <bool DOCS> struct fwd_rows {
    int row_lo, T;
    float sl2;
    int dstart[2] = {0, 0};
};

/* Consumer cw's mainloop over the block's n-th tile t (the ring's tiles i0
 * ..): as attention_wgmma_fwd.cu's fwd_mma, in turns with the other
 * consumer. Leaves O in o, the rows' max and sum in sf; returns the
 * block's next tile. */
template <bool DOCS, bool SOFTCAP>
__device__ __forceinline__ int fwd_mma(const fwd_smem &sm, const fwd_tile &t, int n, int i0,
                                       int cw, const fwd_rows<DOCS> &rw,
                                       mt_attn_wg_softmax<BC, DOCS, SOFTCAP> &sf, float o[128],
                                       int t4, int dstart_wg) {
    const auto &kv = sm.kv;
    const int nkb = t.nkb, j0 = DOCS ? t.j0 : 0, r0 = t.q0 + cw * 64;
    const unsigned sq_wg = sm.q_s + cw * 64 * 128;
    unsigned p[BC / 4]; // the previous tile's probabilities, bf16 A fragments
    float s[BC / 2], alpha[2];
    auto need_mask = [&](int j) {
        const int k0 = j * BC;
        return k0 + BC - 1 > r0 || k0 + BC > rw.T || (DOCS && k0 < dstart_wg);
    };
    mt_mb_wait(sm.q_full(), n & 1);
    kv.wait_k(i0);
    mt_attn_turn_take(cw);
    mt_wg_fence();
    mt_attn_wg_abt<BC, HD, BR, BC>(s, sq_wg, kv.k(i0 % STAGES));
    mt_wg_commit();
    mt_attn_turn_pass(cw, false);
    mt_wg_wait<0>();
    mt_attn_wg_fence<BC / 2>(s);
    mt_mb_arrive(kv.empty_k(i0 % STAGES));
    if (nkb - j0 == 1) mt_mb_arrive(sm.q_empty()); // the tile's last read of Q
    sf.step(s, j0, alpha, rw, t4, std::true_type());
    mt_attn_wg_pack<BC>(p, s);
    for (int j = j0 + 1; j < nkb; j++) {
        const int i = i0 + j - j0, st = i % STAGES, pst = (i - 1) % STAGES;
        kv.wait_k(i);
        kv.wait_v(i - 1);
        mt_attn_turn_take(cw);
        mt_attn_wg_fence<HD / 2>(o);
        mt_wg_fence();
        mt_attn_wg_abt<BC, HD, BR, BC>(s, sq_wg, kv.k(st));
        mt_wg_commit();
        mt_attn_wg_pb<BC, HD, BC>(o, p, kv.v(pst));
        mt_wg_commit();
        mt_attn_turn_pass(cw, false);
        mt_wg_wait<1>();
        mt_attn_wg_fence<BC / 2>(s);
        mt_mb_arrive(kv.empty_k(st));
        if (j == nkb - 1) mt_mb_arrive(sm.q_empty());
        if (need_mask(j)) sf.step(s, j, alpha, rw, t4, std::true_type());
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
    mt_attn_wg_hold<BC / 4>(p);
    mt_mb_arrive(kv.empty_v(il % STAGES));
    return next;
}

/* A consumer thread's rows of the output (row_lo and row_lo + 8 of head
 * h, batch row b; columns 2 t4, 2 t4 + 1 of each 8) normalised, from
 * registers: bf16 pairs, the fp32 copy (a.o_f32) and the rows' lse. Rows
 * past T left out. */
__device__ __forceinline__ void fwd_store(const mt_attn_args &a, int h, int b, int row_lo, int t4,
                                          const float m[2], const float l[2], const float o[128]) {
    const int T = a.T;
    const int64_t ld = (int64_t)a.NH * HD, base = ((int64_t)b * T * a.NH + h) * HD;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        float lr = l[e];
        lr += __shfl_xor_sync(0xffffffffu, lr, 1);
        lr += __shfl_xor_sync(0xffffffffu, lr, 2);
        const int row = row_lo + e * 8;
        if (row >= T) continue;
        const float inv = 1.f / lr;
        unsigned *go = (unsigned *)((bf16 *)a.o + base + row * ld);
        float *gof = a.o_f32 ? a.o_f32 + base + row * ld : nullptr;
#pragma unroll
        for (int c = 0; c < HD / 8; c++) {
            const float x0 = o[4 * c + 2 * e] * inv, x1 = o[4 * c + 2 * e + 1] * inv;
            go[c * 4 + t4] = mt_attn_pack(x0, x1);
            if (gof) *(float2 *)(gof + c * 8 + 2 * t4) = make_float2(x0, x1);
        }
        if (t4 == 0) a.lse[((int64_t)b * a.NH + h) * T + row] = m[e] * MT_ATTN_LN2 + logf(lr);
    }
}

/* Consumer cw (rows 64 cw .. of each tile): the block's tiles as the
 * producer posts them, each one's mainloop, then its rows out. */
template <bool DOCS, bool SOFTCAP>
__device__ __forceinline__ void fwd_consume(const fwd_smem &sm, const mt_attn_args &a,
                                            const mt_attn_qtiles &tl, int cw, int warp,
                                            int lane) {
    const int g = lane >> 2, t4 = lane & 3;
    const int first = sm.claims.get(0);
    if (first >= 0) mt_attn_turns_begin(cw);
    for (int n = 0, i0 = 0, L = first; L >= 0; n++) {
        const fwd_tile t = mt_attn_qtile_of<BR, BC, DOCS>(a, tl, L);
        fwd_rows<DOCS> rw;
        rw.row_lo = t.q0 + cw * 64 + warp * 16 + g;
        rw.T = a.T;
        rw.sl2 = mt_attn_sl2<SOFTCAP>(a);
        if (DOCS)
            for (int e = 0; e < 2; e++)
                rw.dstart[e] = mt_attn_doc_start(a, t.b, min(rw.row_lo + e * 8, a.T - 1));
        const int dstart_wg =
            DOCS ? mt_attn_doc_start(a, t.b, min(t.q0 + cw * 64 + 63, a.T - 1)) : 0;
        float o[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
        mt_attn_wg_softmax<BC, DOCS, SOFTCAP> sf;
        if (SOFTCAP) sf.kcap = a.scale / a.softcap;
        const int next = fwd_mma<DOCS, SOFTCAP>(sm, t, n, i0, cw, rw, sf, o, t4, dstart_wg);
        fwd_store(a, t.h, t.b, rw.row_lo, t4, sf.m, sf.l, o);
        i0 += t.nkb - t.j0;
        L = next;
    }
}

#endif // __CUDA_ARCH_FEAT_SM90_ALL

/* Persistent: blocks claim query tiles of tl from the device's counter
 * (ctr, zero at launch and left zero). tq: TMA map of q with boxes of 128
 * rows; tk, tv: of k and v with boxes of 64. */
template <bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(NT, 1)
    mt_attn_fwd256_kernel(const __grid_constant__ CUtensorMap tq,
                          const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv, mt_attn_args a,
                          mt_attn_qtiles tl, unsigned *ctr) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char mt_attn_wg_smem[];
    const fwd_smem sm(mt_attn_wg_smem);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3, wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) sm.init();
    __syncthreads();
    if (wg == 0) {
        mt_wg_regs_dec<24>();
        if (threadIdx.x == 0) mt_attn_fwd_load<BR, BC, HD, DOCS>(sm, &tq, &tk, &tv, a, tl, ctr);
        return;
    }
    mt_wg_regs_inc<240>();
    fwd_consume<DOCS, SOFTCAP>(sm, a, tl, wg - 1, warp, lane);
#endif
}

template <bool DOCS, bool SOFTCAP>
int launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    auto kern = mt_attn_fwd256_kernel<DOCS, SOFTCAP>;
    CUtensorMap tq, tk, tv;
    if (mt_attn_tma_map(&tq, a.q, B, a.T, a.NH, HD, BR, err) ||
        mt_attn_tma_map(&tk, a.k, B, a.T, a.NKV, HD, BC, err) ||
        mt_attn_tma_map(&tv, a.v, B, a.T, a.NKV, HD, BC, err))
        return -1;
    if (mt_attn_set_smem((const void *)kern, SMEM, err)) return -1;
    mt_attn_qtiles tl;
    mt_attn_layout lay;
    unsigned *ctr;
    if (mt_attn_qtiles_init(&tl, a, B, BR, &lay, err) || mt_attn_tile_counter(&ctr, st, err))
        return -1;
    kern<<<lay.grid, NT, SMEM, st>>>(tq, tk, tv, a, tl, ctr);
    return mt_attn_check_launch(err, "attention forward (bf16, wgmma, head dim 256)");
}

} // namespace

bool mt_attn_fwd_wgmma256_fits(void) { return mt_wg_device_fits(SMEM); }

int mt_attn_fwd_wgmma256(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.softcap > 0)
        return a.pos ? launch<true, true>(a, B, st, err) : launch<false, true>(a, B, st, err);
    return a.pos ? launch<true, false>(a, B, st, err) : launch<false, false>(a, B, st, err);
}
