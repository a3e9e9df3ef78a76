/* bf16 attention forward on mma.sync tensor cores, the kernel of GPUs other
 * than Hopper (contract: attention.h; design: attention.cu's opening
 * comment), and the bf16 forward's choice between it and the Hopper one. */
#include "kernels/attention/attention_internal.cuh"

/* Each warp owns MT row tiles of 16, so every K and V fragment it loads
 * from shared memory feeds MT tensor-core products. */
template <int HD, int NW, int MT> struct mt_attn_fwd_cfg {
    static constexpr int BR = 16 * NW * MT, BC = 64, SR = HD + 8, NT = 32 * NW;
    static constexpr size_t SMEM = (size_t)(BR + 4 * BC) * SR * sizeof(bf16);
};

/* DOCS: packed documents (a.pos); false compiles the plain causal kernel.
 * SOFTCAP: soft-capped scores (a.softcap > 0; mt_attn_tanh's comment). */
template <int HD, int NW, int MT, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(NW * 32) mt_attn_fwd_mma_kernel(mt_attn_args a) {
    using C = mt_attn_fwd_cfg<HD, NW, MT>;
    extern __shared__ __align__(16) unsigned char mt_attn_smem[];
    bf16 *sQ = (bf16 *)mt_attn_smem;    // (BR, SR)
    bf16 *sK = sQ + C::BR * C::SR;      // 2 x (BC, SR)
    bf16 *sV = sK + 2 * C::BC * C::SR;  // 2 x (BC, SR)
    const int T = a.T, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int qb = gridDim.x - 1 - blockIdx.x; // heaviest (last) query tiles first
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    const int q0 = qb * C::BR, wr0 = w * MT * 16; // warp's first row in the tile
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const bf16 *gq = (const bf16 *)a.q + ((int64_t)b * T * a.NH + h) * HD;
    const bf16 *gk = (const bf16 *)a.k + ((int64_t)b * T * a.NKV + kvh) * HD;
    const bf16 *gv = (const bf16 *)a.v + ((int64_t)b * T * a.NKV + kvh) * HD;
    const int nkb = (min(q0 + C::BR, T) + C::BC - 1) / C::BC;
    // Documents: no row of the tile sees a key before its first row's document.
    const int j0 = DOCS ? mt_attn_doc_start(a, b, q0) / C::BC : 0;

    mt_attn_load_tile<C::BR, HD, C::NT>(sQ, gq, ldq, q0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sK, gk, ldk, j0 * C::BC, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sV, gv, ldk, j0 * C::BC, T);
    mt_tc_cp_commit();

    const float sl2 = mt_attn_sl2<SOFTCAP>(a);
    [[maybe_unused]] const float kcap = SOFTCAP ? a.scale / a.softcap : 0.f;
    const int g = lane >> 2, t4 = lane & 3;
    // Documents: the first key of this thread's rows (rows g and g+8 of each
    // row tile; rows past T take row T-1's) and of the warp's last row.
    int dstart[MT][2], dstart_warp = 0;
    if (DOCS) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++)
                dstart[mt][r] = mt_attn_doc_start(a, b, min(q0 + wr0 + mt * 16 + g + r * 8, T - 1));
        dstart_warp = mt_attn_doc_start(a, b, min(q0 + wr0 + MT * 16 - 1, T - 1));
    }
    float o[MT][HD / 8][4];
    float m[MT][2], l[MT][2]; // running max (log2 domain) and sum, rows g and g+8
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        mt_attn_zero<HD / 8, 4>(o[mt]);
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }

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
        float s[MT][C::BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) mt_attn_zero<C::BC / 8, 4>(s[mt]);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            unsigned qf[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                mt_attn_frag_a(qf[mt], sQ, C::SR, wr0 + mt * 16, kk * 16, lane);
#pragma unroll
            for (int nn = 0; nn < C::BC / 16; nn++) {
                unsigned bfr[4];
                mt_attn_frag_bt(bfr, k_s, C::SR, nn * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mt_tc_mma_n16(s[mt] + 2 * nn, qf[mt], bfr);
                }
            }
        }
        if constexpr (SOFTCAP) { // t = tanh(q.k scale / c), before the masks' -inf
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < C::BC / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][n][e] = mt_attn_tanh(s[mt][n][e] * kcap);
        }
        const int k0 = j * C::BC;
        const bool need_mask =
            k0 + C::BC - 1 > q0 + wr0 || k0 + C::BC > T || (DOCS && k0 < dstart_warp);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int row_lo = q0 + wr0 + mt * 16 + g;
            // Mask keys after the query (causal), past T, or before its document;
            // max on raw scores (or t: sl2 > 0 either way), then p = 2^(s*sl2 - m)
            // in one FFMA + EX2.
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < C::BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (need_mask) {
                        const int key = k0 + n * 8 + 2 * t4 + (e & 1), row = row_lo + (e >> 1) * 8;
                        if (key > row || key >= T || (DOCS && key < dstart[mt][e >> 1]))
                            s[mt][n][e] = -INFINITY;
                    }
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][n][e]);
                }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float mn = fmaxf(m[mt][r], mx[r] * sl2);
                // A row with every key masked so far keeps m = -inf; use 0 to avoid inf - inf.
                const float mu = mn == -INFINITY ? 0.f : mn;
                const float alpha = mt_attn_exp2(m[mt][r] - mu);
                m[mt][r] = mn;
                float ps = 0.f;
#pragma unroll
                for (int n = 0; n < C::BC / 8; n++) {
                    s[mt][n][2 * r] = mt_attn_exp2(fmaf(s[mt][n][2 * r], sl2, -mu));
                    s[mt][n][2 * r + 1] = mt_attn_exp2(fmaf(s[mt][n][2 * r + 1], sl2, -mu));
                    ps += s[mt][n][2 * r] + s[mt][n][2 * r + 1];
                }
                l[mt][r] = l[mt][r] * alpha + ps;
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    o[mt][n][2 * r] *= alpha;
                    o[mt][n][2 * r + 1] *= alpha;
                }
            }
        }
        // O += P V, each V fragment shared by the warp's MT row tiles.
#pragma unroll
        for (int kk = 0; kk < C::BC / 16; kk++) {
            unsigned pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pa[mt][0] = mt_attn_pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = mt_attn_pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = mt_attn_pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = mt_attn_pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int nn = 0; nn < HD / 16; nn++) {
                unsigned bfr[4];
                mt_attn_frag_b(bfr, v_s, C::SR, kk * 16, nn * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mt_tc_mma_n16(o[mt] + 2 * nn, pa[mt], bfr);
                }
            }
        }
        __syncthreads(); // this buffer is refilled two iterations on
    }

    bf16 *go = (bf16 *)a.o + ((int64_t)b * T * a.NH + h) * HD;
    float *gof = a.o_f32 ? a.o_f32 + ((int64_t)b * T * a.NH + h) * HD : nullptr;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[mt][r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = q0 + wr0 + mt * 16 + g + r * 8;
            if (row >= T) continue;
            const float inv = 1.f / lr;
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                const int d = n * 8 + 2 * t4;
                const float x0 = o[mt][n][2 * r] * inv, x1 = o[mt][n][2 * r + 1] * inv;
                *(__nv_bfloat162 *)(go + row * ldq + d) = __floats2bfloat162_rn(x0, x1);
                if (gof) *(float2 *)(gof + row * ldq + d) = make_float2(x0, x1);
            }
            if (t4 == 0) a.lse[((int64_t)b * a.NH + h) * T + row] = m[mt][r] * MT_ATTN_LN2 + logf(lr);
        }
}

/* Warps per block and row tiles per warp; measured choices in
 * docs/notes/attention.md. Overridable to compare variants. */
#ifndef MT_ATTN_FWD_NW
#define MT_ATTN_FWD_NW 4
#endif
#ifndef MT_ATTN_FWD_MT
#define MT_ATTN_FWD_MT 2
#endif
/* HD 256: a warp's 16 x 256 fp32 output alone is 128 registers a thread,
 * so one row tile a warp (MT 1) and 8 warps: 128 rows, (128 + 4 * 64) rows
 * of 528 bytes = 198 KB of shared memory (Hopper's 227 KB; not an A100's
 * 163 KB, mt_attn_mma_fits_256). */
template <int HD> struct mt_attn_fwd_pick {
    static constexpr int NW = HD == 256 ? 8 : MT_ATTN_FWD_NW, MT = HD == 256 ? 1 : MT_ATTN_FWD_MT;
    using C = mt_attn_fwd_cfg<HD, NW, MT>;
};

size_t mt_attn_fwd_mma_smem_256(void) { return mt_attn_fwd_pick<256>::C::SMEM; }

template <int HD, bool DOCS, bool SOFTCAP>
static int mt_attn_fwd_mma_launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    using P = mt_attn_fwd_pick<HD>;
    using C = typename P::C;
    auto kern = mt_attn_fwd_mma_kernel<HD, P::NW, P::MT, DOCS, SOFTCAP>;
    if (mt_attn_set_smem((const void *)kern, C::SMEM, err)) return -1;
    dim3 grid((a.T + C::BR - 1) / C::BR, a.NH, B);
    kern<<<grid, C::NT, C::SMEM, st>>>(a);
    return mt_attn_check_launch(err, "attention forward (bf16)");
}

static mt_attn_kernel mt_attn_kernel_choice = MT_ATTN_KERNEL_AUTO;

extern "C" mt_attn_kernel mt_attn_use(mt_attn_kernel k) {
    const mt_attn_kernel was = mt_attn_kernel_choice;
    mt_attn_kernel_choice = k;
    return was;
}

bool mt_attn_takes_wgmma(void) {
    return mt_attn_kernel_choice == MT_ATTN_KERNEL_AUTO && mt_attn_wgmma_available();
}

extern "C" const char *mt_attn_kernel_name(void) {
    return mt_attn_takes_wgmma() ? "wgmma" : "mma.sync";
}

template <int HD>
static int mt_attn_fwd_mma_hd(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.softcap > 0)
        return a.pos ? mt_attn_fwd_mma_launch<HD, true, true>(a, B, st, err)
                     : mt_attn_fwd_mma_launch<HD, false, true>(a, B, st, err);
    return a.pos ? mt_attn_fwd_mma_launch<HD, true, false>(a, B, st, err)
                 : mt_attn_fwd_mma_launch<HD, false, false>(a, B, st, err);
}

/* HD 256 has a Hopper kernel of its own (attention_wgmma_fwd256.cu). */
int mt_attn_fwd_bf16(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    if (a.HD == 256)
        return mt_attn_takes_wgmma() && mt_attn_fwd_wgmma256_fits()
                   ? mt_attn_fwd_wgmma256(a, B, st, err)
                   : mt_attn_fwd_mma_hd<256>(a, B, st, err);
    if (mt_attn_takes_wgmma()) return mt_attn_fwd_wgmma(a, B, st, err);
    return a.HD == 64 ? mt_attn_fwd_mma_hd<64>(a, B, st, err)
                      : mt_attn_fwd_mma_hd<128>(a, B, st, err);
}
