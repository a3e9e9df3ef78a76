/* fp32 attention, forward and backward (contract: attention.h): plain
 * FMA, no tensor cores, any head_dim up to 256, soft-capped scores too. */
#include "kernels/attention/attention_internal.cuh"

/* The score of a dot product q.k: q.k * scale, or (SOFTCAP) soft-capped,
 * c tanh(q.k * scale / c) with tanhf; *t: the tanh (the backward's factor
 * 1 - t^2), untouched without SOFTCAP. */
template <bool SOFTCAP>
__device__ __forceinline__ float mt_attn_f32_score(float dot, const mt_attn_args &a, float *t) {
    if (!SOFTCAP) return dot * a.scale;
    *t = tanhf(dot * a.scale / a.softcap);
    return a.softcap * *t;
}

#define MT_ATTN_F32_WARPS 8
#define MT_ATTN_F32_TILE 32

/* Forward: block = 8 consecutive query rows of one head, a warp per row;
 * 32-key tiles of K (padded rows: lane i reads row i without bank conflicts)
 * and V in shared memory. DMAX = HD rounded up to a multiple of 32. DOCS:
 * packed documents (a.pos); false compiles the plain causal kernel.
 * SOFTCAP: soft-capped scores (a.softcap > 0). */
template <int DMAX, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(MT_ATTN_F32_WARPS * 32) mt_attn_fwd_f32_kernel(mt_attn_args a) {
    extern __shared__ float mt_attn_fsmem[];
    const int HD = a.HD, T = a.T, KS = HD + 1, TL = MT_ATTN_F32_TILE;
    float *sQ = mt_attn_fsmem;                   // (WARPS, HD)
    float *sK = sQ + MT_ATTN_F32_WARPS * HD;     // (TL, HD+1)
    float *sV = sK + TL * KS;                    // (TL, HD)
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * MT_ATTN_F32_WARPS;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    const int t = r0 + w;
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const float *gq = (const float *)a.q + ((int64_t)b * T * a.NH + h) * HD;
    const float *gk = (const float *)a.k + ((int64_t)b * T * a.NKV + kvh) * HD;
    const float *gv = (const float *)a.v + ((int64_t)b * T * a.NKV + kvh) * HD;
    for (int i = threadIdx.x; i < MT_ATTN_F32_WARPS * HD; i += blockDim.x) {
        int r = i / HD;
        sQ[i] = r0 + r < T ? gq[(int64_t)(r0 + r) * ldq + i % HD] : 0.f;
    }
    float acc[DMAX / 32];
#pragma unroll
    for (int i = 0; i < DMAX / 32; i++) acc[i] = 0.f;
    float m = -INFINITY, l = 0.f;
    const int last = min(r0 + MT_ATTN_F32_WARPS, T); // keys [first, last)
    // Documents: the block's rows see no key before its first row's document;
    // this warp's row none before its own (dstart; rows past T take T-1's).
    const int first = DOCS ? mt_attn_doc_start(a, b, r0) / TL * TL : 0;
    const int dstart = DOCS ? mt_attn_doc_start(a, b, min(t, T - 1)) : 0;
    for (int k0 = first; k0 < last; k0 += TL) {
        __syncthreads();
        for (int i = threadIdx.x; i < TL * HD; i += blockDim.x) {
            int r = i / HD, d = i % HD;
            bool ok = k0 + r < T;
            sK[r * KS + d] = ok ? gk[(int64_t)(k0 + r) * ldk + d] : 0.f;
            sV[r * HD + d] = ok ? gv[(int64_t)(k0 + r) * ldk + d] : 0.f;
        }
        __syncthreads();
        if (t >= T || k0 > t || (DOCS && k0 + TL <= dstart)) continue;
        const int key = k0 + lane;
        float s = -INFINITY;
        if (key <= t && (!DOCS || key >= dstart)) {
            float dot = 0.f;
            for (int d = 0; d < HD; d++) dot += sQ[w * HD + d] * sK[lane * KS + d];
            float t;
            s = mt_attn_f32_score<SOFTCAP>(dot, a, &t);
        }
        float mx = s;
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        // Finite: the tile holds a key the row sees (k0 <= t, and with
        // documents k0 + TL > dstart, while dstart <= t).
        const float mn = fmaxf(m, mx);
        const float p = expf(s - mn), alpha = expf(m - mn);
        float ps = p;
        for (int o = 16; o; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * alpha + ps;
        m = mn;
#pragma unroll
        for (int i = 0; i < DMAX / 32; i++) acc[i] *= alpha;
        for (int kk = 0; kk < TL; kk++) {
            const float pk = __shfl_sync(0xffffffffu, p, kk);
#pragma unroll
            for (int i = 0; i < DMAX / 32; i++) {
                const int d = lane + 32 * i;
                if (d < HD) acc[i] += pk * sV[kk * HD + d];
            }
        }
    }
    if (t >= T) return;
    float *go = (float *)a.o + ((int64_t)b * T * a.NH + h) * HD + (int64_t)t * ldq;
#pragma unroll
    for (int i = 0; i < DMAX / 32; i++) {
        const int d = lane + 32 * i;
        if (d < HD) go[d] = acc[i] / l;
    }
    if (lane == 0) a.lse[((int64_t)b * a.NH + h) * T + t] = m + logf(l);
}

/* dQ: a warp per query row, like the forward, with K and V tiles. */
template <int DMAX, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(MT_ATTN_F32_WARPS * 32) mt_attn_dq_f32_kernel(mt_attn_args a) {
    extern __shared__ float mt_attn_fsmem[];
    const int HD = a.HD, T = a.T, KS = HD + 1, TL = MT_ATTN_F32_TILE;
    float *sQ = mt_attn_fsmem;                // (WARPS, HD)
    float *sO = sQ + MT_ATTN_F32_WARPS * HD;  // (WARPS, HD) dout
    float *sK = sO + MT_ATTN_F32_WARPS * HD;  // (TL, HD+1)
    float *sV = sK + TL * KS;                 // (TL, HD+1)
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * MT_ATTN_F32_WARPS;
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / (a.NH / a.NKV);
    const int t = r0 + w;
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const int64_t qoff = ((int64_t)b * T * a.NH + h) * HD;
    const float *gk = (const float *)a.k + ((int64_t)b * T * a.NKV + kvh) * HD;
    const float *gv = (const float *)a.v + ((int64_t)b * T * a.NKV + kvh) * HD;
    for (int i = threadIdx.x; i < MT_ATTN_F32_WARPS * HD; i += blockDim.x) {
        int r = i / HD;
        bool ok = r0 + r < T;
        sQ[i] = ok ? ((const float *)a.q)[qoff + (int64_t)(r0 + r) * ldq + i % HD] : 0.f;
        sO[i] = ok ? ((const float *)a.dout)[qoff + (int64_t)(r0 + r) * ldq + i % HD] : 0.f;
    }
    const int64_t lrow = ((int64_t)b * a.NH + h) * T;
    const float lse = t < T ? a.lse[lrow + t] : 0.f, D = t < T ? a.dsum[lrow + t] : 0.f;
    float acc[DMAX / 32];
#pragma unroll
    for (int i = 0; i < DMAX / 32; i++) acc[i] = 0.f;
    const int last = min(r0 + MT_ATTN_F32_WARPS, T);
    // Documents: as in the forward.
    const int first = DOCS ? mt_attn_doc_start(a, b, r0) / TL * TL : 0;
    const int dstart = DOCS ? mt_attn_doc_start(a, b, min(t, T - 1)) : 0;
    for (int k0 = first; k0 < last; k0 += TL) {
        __syncthreads();
        for (int i = threadIdx.x; i < TL * HD; i += blockDim.x) {
            int r = i / HD, d = i % HD;
            bool ok = k0 + r < T;
            sK[r * KS + d] = ok ? gk[(int64_t)(k0 + r) * ldk + d] : 0.f;
            sV[r * KS + d] = ok ? gv[(int64_t)(k0 + r) * ldk + d] : 0.f;
        }
        __syncthreads();
        if (t >= T || k0 > t || (DOCS && k0 + TL <= dstart)) continue;
        const int key = k0 + lane;
        float ds = 0.f;
        if (key <= t && (!DOCS || key >= dstart)) {
            float s = 0.f, dp = 0.f;
            for (int d = 0; d < HD; d++) {
                s += sQ[w * HD + d] * sK[lane * KS + d];
                dp += sO[w * HD + d] * sV[lane * KS + d];
            }
            float t = 0.f;
            ds = expf(mt_attn_f32_score<SOFTCAP>(s, a, &t) - lse) * (dp - D);
            if (SOFTCAP) ds *= 1.f - t * t; // d score / d(q.k scale)
        }
        for (int kk = 0; kk < TL; kk++) {
            const float x = __shfl_sync(0xffffffffu, ds, kk);
#pragma unroll
            for (int i = 0; i < DMAX / 32; i++) {
                const int d = lane + 32 * i;
                if (d < HD) acc[i] += x * sK[kk * KS + d];
            }
        }
    }
    if (t >= T) return;
    float *gdq = a.dq + qoff + (int64_t)t * ldq;
#pragma unroll
    for (int i = 0; i < DMAX / 32; i++) {
        const int d = lane + 32 * i;
        if (d < HD) gdq[d] = acc[i] * a.scale;
    }
}

/* dK, dV: a warp per key row of one kv head; the block's 8 keys share
 * 32-query tiles of Q and dout for every query head of the group. */
template <int DMAX, bool DOCS, bool SOFTCAP>
__global__ void __launch_bounds__(MT_ATTN_F32_WARPS * 32) mt_attn_dkv_f32_kernel(mt_attn_args a) {
    extern __shared__ float mt_attn_fsmem[];
    const int HD = a.HD, T = a.T, KS = HD + 1, TL = MT_ATTN_F32_TILE;
    float *sK = mt_attn_fsmem;                // (WARPS, HD)
    float *sV = sK + MT_ATTN_F32_WARPS * HD;  // (WARPS, HD)
    float *sQ = sV + MT_ATTN_F32_WARPS * HD;  // (TL, HD+1)
    float *sO = sQ + TL * KS;                 // (TL, HD+1) dout
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int j0 = (gridDim.x - 1 - blockIdx.x) * MT_ATTN_F32_WARPS;
    const int kvh = blockIdx.y, b = blockIdx.z, G = a.NH / a.NKV;
    const int j = j0 + w;
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const int64_t koff = ((int64_t)b * T * a.NKV + kvh) * HD;
    for (int i = threadIdx.x; i < MT_ATTN_F32_WARPS * HD; i += blockDim.x) {
        int r = i / HD;
        bool ok = j0 + r < T;
        sK[i] = ok ? ((const float *)a.k)[koff + (int64_t)(j0 + r) * ldk + i % HD] : 0.f;
        sV[i] = ok ? ((const float *)a.v)[koff + (int64_t)(j0 + r) * ldk + i % HD] : 0.f;
    }
    float dk[DMAX / 32], dv[DMAX / 32];
#pragma unroll
    for (int i = 0; i < DMAX / 32; i++) dk[i] = dv[i] = 0.f;
    // Queries from the block's first key on, up to the end of its last key's document.
    const int q_end = DOCS ? mt_attn_doc_end(a, b, min(j0 + MT_ATTN_F32_WARPS, T) - 1) : T;
    for (int h = kvh * G; h < kvh * G + G; h++) {
        const int64_t qoff = ((int64_t)b * T * a.NH + h) * HD, lrow = ((int64_t)b * a.NH + h) * T;
        for (int q0 = j0; q0 < q_end; q0 += TL) {
            __syncthreads();
            for (int i = threadIdx.x; i < TL * HD; i += blockDim.x) {
                int r = i / HD, d = i % HD;
                bool ok = q0 + r < T;
                sQ[r * KS + d] = ok ? ((const float *)a.q)[qoff + (int64_t)(q0 + r) * ldq + d] : 0.f;
                sO[r * KS + d] =
                    ok ? ((const float *)a.dout)[qoff + (int64_t)(q0 + r) * ldq + d] : 0.f;
            }
            __syncthreads();
            if (j >= T) continue;
            const int qi = q0 + lane;
            float p = 0.f, ds = 0.f;
            if (qi >= j && qi < T && (!DOCS || mt_attn_doc_start(a, b, qi) <= j)) {
                float s = 0.f, dp = 0.f;
                for (int d = 0; d < HD; d++) {
                    s += sK[w * HD + d] * sQ[lane * KS + d];
                    dp += sV[w * HD + d] * sO[lane * KS + d];
                }
                float t = 0.f;
                p = expf(mt_attn_f32_score<SOFTCAP>(s, a, &t) - a.lse[lrow + qi]);
                ds = p * (dp - a.dsum[lrow + qi]);
                if (SOFTCAP) ds *= 1.f - t * t;
            }
            for (int kk = 0; kk < TL; kk++) {
                const float pk = __shfl_sync(0xffffffffu, p, kk);
                const float dsk = __shfl_sync(0xffffffffu, ds, kk);
#pragma unroll
                for (int i = 0; i < DMAX / 32; i++) {
                    const int d = lane + 32 * i;
                    if (d < HD) {
                        dv[i] += pk * sO[kk * KS + d];
                        dk[i] += dsk * sQ[kk * KS + d];
                    }
                }
            }
        }
    }
    if (j >= T) return;
#pragma unroll
    for (int i = 0; i < DMAX / 32; i++) {
        const int d = lane + 32 * i;
        if (d < HD) {
            a.dk[koff + (int64_t)j * ldk + d] = dk[i] * a.scale;
            a.dv[koff + (int64_t)j * ldk + d] = dv[i];
        }
    }
}

template <int DMAX, bool DOCS, bool SOFTCAP>
static int mt_attn_f32_launch(const mt_attn_args &a, int B, int backward, cudaStream_t st,
                              mt_error *err) {
    const int HD = a.HD, TL = MT_ATTN_F32_TILE, W = MT_ATTN_F32_WARPS;
    const size_t fsm = sizeof(float) * ((size_t)W * HD + (size_t)TL * (HD + 1) + (size_t)TL * HD);
    const size_t bsm = sizeof(float) * (2 * (size_t)W * HD + 2 * (size_t)TL * (HD + 1));
    const dim3 gq((a.T + W - 1) / W, a.NH, B), gk((a.T + W - 1) / W, a.NKV, B);
    if (!backward) {
        auto k = mt_attn_fwd_f32_kernel<DMAX, DOCS, SOFTCAP>;
        if (mt_attn_set_smem((const void *)k, fsm, err)) return -1;
        k<<<gq, W * 32, fsm, st>>>(a);
        return mt_attn_check_launch(err, "attention forward (fp32)");
    }
    auto kdkv = mt_attn_dkv_f32_kernel<DMAX, DOCS, SOFTCAP>;
    auto kdq = mt_attn_dq_f32_kernel<DMAX, DOCS, SOFTCAP>;
    if (mt_attn_set_smem((const void *)kdkv, bsm, err)) return -1;
    if (mt_attn_set_smem((const void *)kdq, bsm, err)) return -1;
    if (mt_attn_launch_dsum(a, B, 0, st, err)) return -1;
    kdkv<<<gk, W * 32, bsm, st>>>(a);
    if (mt_attn_check_launch(err, "attention backward dK/dV (fp32)")) return -1;
    kdq<<<gq, W * 32, bsm, st>>>(a);
    return mt_attn_check_launch(err, "attention backward dQ (fp32)");
}

template <bool DOCS, bool SOFTCAP>
static int mt_attn_f32_dispatch(const mt_attn_args &a, int B, int backward, cudaStream_t st,
                                mt_error *err) {
    if (a.HD <= 64) return mt_attn_f32_launch<64, DOCS, SOFTCAP>(a, B, backward, st, err);
    if (a.HD <= 128) return mt_attn_f32_launch<128, DOCS, SOFTCAP>(a, B, backward, st, err);
    return mt_attn_f32_launch<256, DOCS, SOFTCAP>(a, B, backward, st, err);
}

int mt_attn_f32(const mt_attn_args &a, int B, int backward, cudaStream_t st, mt_error *err) {
    if (a.softcap > 0)
        return a.pos ? mt_attn_f32_dispatch<true, true>(a, B, backward, st, err)
                     : mt_attn_f32_dispatch<false, true>(a, B, backward, st, err);
    return a.pos ? mt_attn_f32_dispatch<true, false>(a, B, backward, st, err)
                 : mt_attn_f32_dispatch<false, false>(a, B, backward, st, err);
}
