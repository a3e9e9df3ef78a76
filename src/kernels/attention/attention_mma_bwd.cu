/* bf16 attention backward on mma.sync tensor cores, the kernels of GPUs
 * other than Hopper (contract: attention.h; design: attention.cu's opening
 * comment): dK and dV over key tiles, then dQ over query tiles, each
 * without atomics; and the bf16 backward's choice of kernels. */
#include "kernels/attention/attention_internal.cuh"

/* ------------------------------------------------------------------------ */
/* bf16 backward: dK, dV                                                     */

/* Starts the async copy (by NT threads) of the lse, D and (DOCS) positions
 * of query rows [q0, q0+BR) of head h, batch row b, into l[0..BR),
 * l[BR..2BR) and l[2BR..3BR) (the positions as int32); rows past T read 0. */
template <int BR, int NT, bool DOCS>
__device__ __forceinline__ void mt_attn_load_rowstats(float *l, const mt_attn_args &a, int b,
                                                      int h, int q0) {
    for (int r = threadIdx.x; r < BR; r += NT) {
        const bool ok = q0 + r < a.T;
        const int64_t i = ((int64_t)b * a.NH + h) * a.T + (ok ? q0 + r : 0);
        mt_tc_cp4(l + r, a.lse + i, ok);
        mt_tc_cp4(l + BR + r, a.dsum + i, ok);
        if (DOCS) mt_tc_cp4(l + 2 * BR + r, a.pos + (int64_t)b * a.T + (ok ? q0 + r : 0), ok);
    }
}

template <int HD, int NW> struct mt_attn_dkv_cfg {
    static constexpr int BC = 16 * NW, BR = 64, SR = HD + 8, NT = 32 * NW;
    static constexpr size_t SMEM =
        (size_t)(2 * BC + 4 * BR) * SR * sizeof(bf16) + 4 * BR * sizeof(float);
    static constexpr size_t SMEM_DOCS = SMEM + 2 * BR * sizeof(int32_t); // + query positions
};

/* What a dK/dV launch computes: both, or (HD 256, where a warp's 16 x 256
 * fp32 dK and dV would take 256 registers a thread) one of them, the
 * launcher running the kernel once for each. */
enum { MT_ATTN_DV = 1, MT_ATTN_DK = 2, MT_ATTN_DKV = 3 };

/* DOCS: packed documents (a.pos); false compiles the plain causal kernel.
 * SOFTCAP: soft-capped scores (a.softcap > 0): the scores become t =
 * tanh(q.k scale / c) first (masked: -inf), and P and dS come from t once
 * dP^T is there (mt_attn_cap_grad), no more registers held. PART: what it
 * computes (MT_ATTN_DV, _DK, _DKV). */
template <int HD, int NW, bool DOCS, bool SOFTCAP, int PART>
__global__ void __launch_bounds__(NW * 32) mt_attn_dkv_mma_kernel(mt_attn_args a) {
    constexpr bool DO_DV = PART & MT_ATTN_DV, DO_DK = PART & MT_ATTN_DK;
    using C = mt_attn_dkv_cfg<HD, NW>;
    extern __shared__ __align__(16) unsigned char mt_attn_smem[];
    bf16 *sK = (bf16 *)mt_attn_smem;       // (BC, SR)
    bf16 *sV = sK + C::BC * C::SR;         // (BC, SR)
    bf16 *sQ = sV + C::BC * C::SR;         // 2 x (BR, SR)
    bf16 *sO = sQ + 2 * C::BR * C::SR;     // 2 x (BR, SR) dout
    // 2 buffers of BR lse, BR dsum and (DOCS) BR positions, 0 past T
    float *sL = (float *)(sO + 2 * C::BR * C::SR);
    constexpr int LS = (DOCS ? 3 : 2) * C::BR;
    const int T = a.T, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int kb = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int k0 = kb * C::BC, G = a.NH / a.NKV;
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const bf16 *gk = (const bf16 *)a.k + ((int64_t)b * T * a.NKV + kvh) * HD;
    const bf16 *gv = (const bf16 *)a.v + ((int64_t)b * T * a.NKV + kvh) * HD;
    // Queries from the key tile on, up to the end of its last key's document.
    const int q_end = DOCS ? mt_attn_doc_end(a, b, min(k0 + C::BC, T) - 1) : T;
    const int qb0 = k0 / C::BR, nqb = (q_end + C::BR - 1) / C::BR - qb0; // query tiles per head
    const int nit = G * nqb;

    // Iteration it covers query head kvh*G + it / nqb and query tile qb0 + it % nqb.
    auto load_q = [&](int it, int buf) {
        const int h = kvh * G + it / nqb, q0 = (qb0 + it % nqb) * C::BR;
        const bf16 *gq = (const bf16 *)a.q + ((int64_t)b * T * a.NH + h) * HD;
        const bf16 *gdo = (const bf16 *)a.dout + ((int64_t)b * T * a.NH + h) * HD;
        mt_attn_load_tile<C::BR, HD, C::NT>(sQ + buf * C::BR * C::SR, gq, ldq, q0, T);
        mt_attn_load_tile<C::BR, HD, C::NT>(sO + buf * C::BR * C::SR, gdo, ldq, q0, T);
        // Asynchronous too: a plain load here would stall its warps a memory latency.
        mt_attn_load_rowstats<C::BR, C::NT, DOCS>(sL + buf * LS, a, b, h, q0);
    };
    mt_attn_load_tile<C::BC, HD, C::NT>(sK, gk, ldk, k0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sV, gv, ldk, k0, T);
    load_q(0, 0);
    mt_tc_cp_commit();

    const float sl2 = mt_attn_sl2<SOFTCAP>(a);
    [[maybe_unused]] const float kcap = SOFTCAP ? a.scale / a.softcap : 0.f;
    const int g = lane >> 2, t4 = lane & 3;
    const int key_lo = k0 + w * 16 + g, key_hi = key_lo + 8;
    float dk[HD / 8][4], dv[HD / 8][4];
    mt_attn_zero<HD / 8, 4>(dk);
    mt_attn_zero<HD / 8, 4>(dv);

    for (int it = 0; it < nit; it++) {
        const int buf = it & 1;
        if (it + 1 < nit) {
            load_q(it + 1, buf ^ 1);
            mt_tc_cp_commit();
            mt_tc_cp_wait<1>();
        } else {
            mt_tc_cp_wait<0>();
        }
        __syncthreads();
        const bf16 *q_s = sQ + buf * C::BR * C::SR, *do_s = sO + buf * C::BR * C::SR;
        const float *l_s = sL + buf * LS, *d_s = l_s + C::BR;
        const int32_t *p_s = (const int32_t *)(d_s + C::BR);
        const int q0 = (qb0 + it % nqb) * C::BR;
        const int dstart_last = DOCS ? mt_attn_tile_last_start<C::BR>(p_s, q0, T) : 0;
        // S^T = K Q^T (16 keys x BR queries per warp), then P^T.
        float p[C::BR / 8][4];
        mt_attn_zero<C::BR / 8, 4>(p);
        mt_attn_mm_smem_bt<HD, C::BR>(p, sK, C::SR, w * 16, q_s, C::SR, lane);
        // Causal mask, queries past T (their lse reads 0), and queries of a
        // later document than the key give P = 0.
        const bool need_mask = q0 < k0 + w * 16 + 15 || q0 + C::BR > T ||
                               (DOCS && dstart_last > k0 + w * 16);
#pragma unroll
        for (int n = 0; n < C::BR / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = n * 8 + 2 * t4 + (e & 1), key = e < 2 ? key_lo : key_hi;
                float x = SOFTCAP ? mt_attn_tanh(p[n][e] * kcap)
                                  : mt_attn_exp2(fmaf(p[n][e], sl2, -l_s[qc] * MT_ATTN_LOG2E));
                if (need_mask && (q0 + qc < key || q0 + qc >= T ||
                                  (DOCS && q0 + qc - p_s[qc] > key)))
                    x = SOFTCAP ? -INFINITY : 0.f;
                p[n][e] = x;
            }
        // dP^T = V dO^T, then dS^T = P^T * (dP^T - D) (soft-capped: and P^T
        // from t, and dS^T times 1 - t^2).
        float ds[C::BR / 8][4];
        if (DO_DK) {
            mt_attn_zero<C::BR / 8, 4>(ds);
            mt_attn_mm_smem_bt<HD, C::BR>(ds, sV, C::SR, w * 16, do_s, C::SR, lane);
        }
#pragma unroll
        for (int n = 0; n < C::BR / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = n * 8 + 2 * t4 + (e & 1);
                if constexpr (SOFTCAP) {
                    float x;
                    const float f =
                        mt_attn_cap_grad(p[n][e], sl2, l_s[qc] * MT_ATTN_LOG2E, &x);
                    if (DO_DK) ds[n][e] = x * (ds[n][e] - d_s[qc]) * f;
                    p[n][e] = x;
                } else if (DO_DK) {
                    ds[n][e] = p[n][e] * (ds[n][e] - d_s[qc]);
                }
            }
        if (DO_DV) mt_attn_mm_regs_b<C::BR, HD>(dv, p, do_s, C::SR, lane);
        if (DO_DK) mt_attn_mm_regs_b<C::BR, HD>(dk, ds, q_s, C::SR, lane);
        __syncthreads();
    }

    float *gdk = a.dk + ((int64_t)b * T * a.NKV + kvh) * HD;
    float *gdv = a.dv + ((int64_t)b * T * a.NKV + kvh) * HD;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int key = half ? key_hi : key_lo;
        if (key >= T) continue;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            const int d = n * 8 + 2 * t4;
            if (DO_DK)
                *(float2 *)(gdk + key * ldk + d) =
                    make_float2(dk[n][2 * half] * a.scale, dk[n][2 * half + 1] * a.scale);
            if (DO_DV)
                *(float2 *)(gdv + key * ldk + d) =
                    make_float2(dv[n][2 * half], dv[n][2 * half + 1]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* bf16 backward: dQ                                                         */

template <int HD, int NW> struct mt_attn_dq_cfg {
    static constexpr int BR = 16 * NW, BC = 64, SR = HD + 8, NT = 32 * NW;
    static constexpr size_t SMEM = (size_t)(2 * BR + 4 * BC) * SR * sizeof(bf16);
};

/* SOFTCAP: P becomes P (1 - t^2) in place (t = tanh(q.k scale / c)), the
 * only use of P here being dS. */
template <int HD, int NW, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(NW * 32) mt_attn_dq_mma_kernel(mt_attn_args a) {
    using C = mt_attn_dq_cfg<HD, NW>;
    extern __shared__ __align__(16) unsigned char mt_attn_smem[];
    bf16 *sQ = (bf16 *)mt_attn_smem;   // (BR, SR)
    bf16 *sO = sQ + C::BR * C::SR;     // (BR, SR) dout
    bf16 *sK = sO + C::BR * C::SR;     // 2 x (BC, SR)
    bf16 *sV = sK + 2 * C::BC * C::SR; // 2 x (BC, SR)
    const int T = a.T, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    const int q0 = qb * C::BR;
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const int64_t qoff = ((int64_t)b * T * a.NH + h) * HD;
    const bf16 *gk = (const bf16 *)a.k + ((int64_t)b * T * a.NKV + kvh) * HD;
    const bf16 *gv = (const bf16 *)a.v + ((int64_t)b * T * a.NKV + kvh) * HD;
    const int nkb = (min(q0 + C::BR, T) + C::BC - 1) / C::BC;
    // Documents: no row of the tile sees a key before its first row's document.
    const int j0 = DOCS ? mt_attn_doc_start(a, b, q0) / C::BC : 0;

    mt_attn_load_tile<C::BR, HD, C::NT>(sQ, (const bf16 *)a.q + qoff, ldq, q0, T);
    mt_attn_load_tile<C::BR, HD, C::NT>(sO, (const bf16 *)a.dout + qoff, ldq, q0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sK, gk, ldk, j0 * C::BC, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sV, gv, ldk, j0 * C::BC, T);
    mt_tc_cp_commit();

    const float sl2 = mt_attn_sl2<SOFTCAP>(a);
    [[maybe_unused]] const float kcap = SOFTCAP ? a.scale / a.softcap : 0.f;
    const int g = lane >> 2, t4 = lane & 3;
    const int row_lo = q0 + w * 16 + g, row_hi = row_lo + 8;
    const int64_t lrow = ((int64_t)b * a.NH + h) * T;
    // Rows past T are never stored; any finite values keep them harmless.
    const float lse_lo = row_lo < T ? a.lse[lrow + row_lo] * MT_ATTN_LOG2E : 0.f;
    const float lse_hi = row_hi < T ? a.lse[lrow + row_hi] * MT_ATTN_LOG2E : 0.f;
    const float D_lo = row_lo < T ? a.dsum[lrow + row_lo] : 0.f;
    const float D_hi = row_hi < T ? a.dsum[lrow + row_hi] : 0.f;
    // Documents: the first key of rows row_lo, row_hi and of the warp's last row.
    const int dstart_lo = DOCS ? mt_attn_doc_start(a, b, min(row_lo, T - 1)) : 0;
    const int dstart_hi = DOCS ? mt_attn_doc_start(a, b, min(row_hi, T - 1)) : 0;
    const int dstart_warp = DOCS ? mt_attn_doc_start(a, b, min(q0 + w * 16 + 15, T - 1)) : 0;
    float dq[HD / 8][4];
    mt_attn_zero<HD / 8, 4>(dq);

    for (int j = j0; j < nkb; j++) {
        const int buf = (j - j0) & 1;
        if (j + 1 < nkb) {
            mt_attn_load_tile<C::BC, HD, C::NT>(sK + (buf ^ 1) * C::BC * C::SR, gk, ldk,
                                                (j + 1) * C::BC, T);
            mt_attn_load_tile<C::BC, HD, C::NT>(sV + (buf ^ 1) * C::BC * C::SR, gv, ldk,
                                                (j + 1) * C::BC, T);
            mt_tc_cp_commit();
            mt_tc_cp_wait<1>();
        } else {
            mt_tc_cp_wait<0>();
        }
        __syncthreads();
        const bf16 *k_s = sK + buf * C::BC * C::SR, *v_s = sV + buf * C::BC * C::SR;
        const int k0 = j * C::BC;
        float p[C::BC / 8][4];
        mt_attn_zero<C::BC / 8, 4>(p);
        mt_attn_mm_smem_bt<HD, C::BC>(p, sQ, C::SR, w * 16, k_s, C::SR, lane);
        const bool need_mask =
            k0 + C::BC - 1 > q0 + w * 16 || k0 + C::BC > T || (DOCS && k0 < dstart_warp);
#pragma unroll
        for (int n = 0; n < C::BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * t4 + (e & 1), row = e < 2 ? row_lo : row_hi;
                float x;
                if constexpr (SOFTCAP) {
                    float pr;
                    x = mt_attn_cap_grad(mt_attn_tanh(p[n][e] * kcap), sl2,
                                         e < 2 ? lse_lo : lse_hi, &pr);
                    x *= pr;
                } else {
                    x = mt_attn_exp2(fmaf(p[n][e], sl2, -(e < 2 ? lse_lo : lse_hi)));
                }
                if (need_mask &&
                    (key > row || key >= T || (DOCS && key < (e < 2 ? dstart_lo : dstart_hi))))
                    x = 0.f;
                p[n][e] = x;
            }
        float ds[C::BC / 8][4];
        mt_attn_zero<C::BC / 8, 4>(ds);
        mt_attn_mm_smem_bt<HD, C::BC>(ds, sO, C::SR, w * 16, v_s, C::SR, lane);
#pragma unroll
        for (int n = 0; n < C::BC / 8; n++) {
            ds[n][0] = p[n][0] * (ds[n][0] - D_lo);
            ds[n][1] = p[n][1] * (ds[n][1] - D_lo);
            ds[n][2] = p[n][2] * (ds[n][2] - D_hi);
            ds[n][3] = p[n][3] * (ds[n][3] - D_hi);
        }
        mt_attn_mm_regs_b<C::BC, HD>(dq, ds, k_s, C::SR, lane);
        __syncthreads();
    }

    float *gdq = a.dq + qoff;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int row = half ? row_hi : row_lo;
        if (row >= T) continue;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2 *)(gdq + row * ldq + n * 8 + 2 * t4) =
                make_float2(dq[n][2 * half] * a.scale, dq[n][2 * half + 1] * a.scale);
    }
}

/* Warps per block; measured choices in docs/notes/attention.md.
 * Overridable to compare variants. */
#ifndef MT_ATTN_DKV_NW
#define MT_ATTN_DKV_NW 4
#endif
#ifndef MT_ATTN_DQ_NW
#define MT_ATTN_DQ_NW 8
#endif
/* HD 256: dK and dV in two launches (MT_ATTN_DV, then _DK: 128 registers
 * of accumulators a thread each), 4 warps of 16 keys, 64-row query tiles:
 * (2 * 64 + 4 * 64) rows of 528 bytes = 199 KB; dQ 4 warps (64 rows):
 * (2 * 64 + 4 * 64) rows, 198 KB. Hopper's 227 KB, not an A100's 163 KB
 * (mt_attn_mma_fits_256). */
template <int HD> struct mt_attn_bwd_pick {
    static constexpr int DKV_NW = HD == 256 ? 4 : MT_ATTN_DKV_NW;
    static constexpr int DQ_NW = HD == 256 ? 4 : MT_ATTN_DQ_NW;
    static constexpr int PARTS = HD == 256 ? 2 : 1;
    using CK = mt_attn_dkv_cfg<HD, DKV_NW>;
    using CQ = mt_attn_dq_cfg<HD, DQ_NW>;
};

size_t mt_attn_bwd_mma_smem_256(void) {
    using P = mt_attn_bwd_pick<256>;
    return P::CK::SMEM_DOCS > P::CQ::SMEM ? P::CK::SMEM_DOCS : P::CQ::SMEM;
}

/* The dK/dV pass as one launch of PART. */
template <int HD, bool DOCS, bool SOFTCAP, int PART>
static int mt_attn_dkv_mma_launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    using CK = typename mt_attn_bwd_pick<HD>::CK;
    auto kdkv = mt_attn_dkv_mma_kernel<HD, mt_attn_bwd_pick<HD>::DKV_NW, DOCS, SOFTCAP, PART>;
    const size_t smem_dkv = DOCS ? CK::SMEM_DOCS : CK::SMEM;
    if (mt_attn_set_smem((const void *)kdkv, smem_dkv, err)) return -1;
    kdkv<<<dim3((a.T + CK::BC - 1) / CK::BC, a.NKV, B), CK::NT, smem_dkv, st>>>(a);
    return mt_attn_check_launch(err, "attention backward dK/dV (bf16)");
}

template <int HD, bool DOCS, bool SOFTCAP>
static int mt_attn_bwd_mma_launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    using P = mt_attn_bwd_pick<HD>;
    using CQ = typename P::CQ;
    auto kdq = mt_attn_dq_mma_kernel<HD, P::DQ_NW, DOCS, SOFTCAP>;
    if (mt_attn_set_smem((const void *)kdq, CQ::SMEM, err)) return -1;
    if (mt_attn_launch_dsum(a, B, 1, st, err)) return -1;
    if constexpr (P::PARTS == 1) {
        if (mt_attn_dkv_mma_launch<HD, DOCS, SOFTCAP, MT_ATTN_DKV>(a, B, st, err)) return -1;
    } else if (mt_attn_dkv_mma_launch<HD, DOCS, SOFTCAP, MT_ATTN_DV>(a, B, st, err) ||
               mt_attn_dkv_mma_launch<HD, DOCS, SOFTCAP, MT_ATTN_DK>(a, B, st, err)) {
        return -1;
    }
    kdq<<<dim3((a.T + CQ::BR - 1) / CQ::BR, a.NH, B), CQ::NT, CQ::SMEM, st>>>(a);
    return mt_attn_check_launch(err, "attention backward dQ (bf16)");
}

template <int HD>
static int mt_attn_bwd_mma_hd(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.softcap > 0)
        return a.pos ? mt_attn_bwd_mma_launch<HD, true, true>(a, B, st, err)
                     : mt_attn_bwd_mma_launch<HD, false, true>(a, B, st, err);
    return a.pos ? mt_attn_bwd_mma_launch<HD, true, false>(a, B, st, err)
                 : mt_attn_bwd_mma_launch<HD, false, false>(a, B, st, err);
}

/* HD 256 has Hopper kernels of its own (attention_wgmma_bwd256.cu). */
int mt_attn_bwd_bf16(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.HD == 256)
        return mt_attn_takes_wgmma() && mt_attn_bwd_wgmma256_fits()
                   ? mt_attn_bwd_wgmma256(a, B, st, err)
                   : mt_attn_bwd_mma_hd<256>(a, B, st, err);
    if (mt_attn_takes_wgmma()) return mt_attn_bwd_wgmma(a, B, st, err);
    return a.HD == 64 ? mt_attn_bwd_mma_hd<64>(a, B, st, err)
                      : mt_attn_bwd_mma_hd<128>(a, B, st, err);
}
