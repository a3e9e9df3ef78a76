/* Fused causal GQA attention kernels, forward and backward (see
 * attention.h for the contract).
 *
 * bf16 path (FlashAttention-2 style): a thread block owns a tile of rows and
 * streams the other side's tiles through double-buffered shared memory with
 * cp.async; each warp owns 16 rows (32 in the forward) and does its
 * products with mma.sync.m16n8k16 (bf16 in, fp32 accumulate), fed by
 * ldmatrix. Softmax runs online in fp32 in the log2 domain (one FFMA and one
 * ex2.approx per score).
 *   forward : blocks over (query tile of 128, head, batch).
 *   backward: D = rowsum(dout * out) first; then dK,dV over (key tile of
 *             64, kv head, batch), looping over the group's query heads and
 *             the query tiles at or after the key tile; then dQ over (query
 *             tile of 128, head, batch), recomputing P. Two passes instead of
 *             fp32 atomics on dq: 7 instead of 5 tile products, but the
 *             result is bitwise reproducible and dq needs no zeroing pass.
 * f32 path: plain fp32 FMA, one warp per row, a lane per key of a 32-key
 * tile for scores, a lane per output column for the weighted sums. */
#include "backend/cuda/attention.h"

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#define MT_ATTN_LOG2E 1.4426950408889634f
#define MT_ATTN_LN2 0.6931471805599453f

/* Reports a failed launch (or an earlier sticky error) as a recoverable error. */
static int mt_attn_check_launch(mt_error *err, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return mt_errorf(err, "attention: launching %s failed: %s", what, cudaGetErrorString(e));
    return 0;
}

/* Raises a kernel's dynamic shared memory limit past the 48 KB default. */
static int mt_attn_set_smem(const void *kernel, size_t bytes, mt_error *err) {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess)
        return mt_errorf(err, "attention: cannot give a kernel %zu bytes of shared memory: %s",
                         bytes, cudaGetErrorString(e));
    return 0;
}

static int mt_attn_check_shape(size_t B, size_t T, size_t NH, size_t NKV, size_t HD, int is_bf16,
                               mt_error *err) {
    if (NH == 0 || NKV == 0 || NH % NKV != 0)
        return mt_errorf(err, "attention: NH=%zu is not a multiple of NKV=%zu; use a model "
                         "whose query heads split evenly over its kv heads", NH, NKV);
    if (is_bf16 && HD != 64 && HD != 128)
        return mt_errorf(err, "attention: bf16 kernels support head_dim 64 or 128, got %zu; "
                         "use --precision fp32 or add an instantiation", HD);
    if (!is_bf16 && (HD == 0 || HD > 256))
        return mt_errorf(err, "attention: fp32 kernels support head_dim 1..256, got %zu", HD);
    if (B > 65535 || NH > 65535 || T > (size_t)INT32_MAX / 2 || T * NH * HD > (size_t)INT32_MAX)
        return mt_errorf(err, "attention: shape B=%zu T=%zu NH=%zu HD=%zu too large for one "
                         "launch; split the micro-batch", B, T, NH, HD);
    return 0;
}

size_t mt_attn_backward_scratch_bytes(size_t B, size_t T, size_t NH) {
    return B * T * NH * sizeof(float);
}

/* ------------------------------------------------------------------------ */
/* Shared pieces                                                             */

struct mt_attn_args {
    const void *q, *k, *v, *dout, *out; // (B,T,NH|NKV,HD)
    void *o;                            // forward output, (B,T,NH,HD)
    float *o_f32;                       // optional fp32 forward output
    float *lse;                         // (B,NH,T)
    float *dsum;                        // (B,NH,T) rowsum(dout*out)
    float *dq, *dk, *dv;
    int T, NH, NKV, HD;
    float scale;
};

/* D[b,h,t] = sum_d dout*out: one warp per row; shared by both precisions. */
template <typename TIN>
__global__ void mt_attn_dsum_kernel(mt_attn_args a, int rows) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; // row = (b*T + t)*NH + h
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const TIN *dout = (const TIN *)a.dout + (int64_t)row * a.HD;
    const TIN *out = (const TIN *)a.out + (int64_t)row * a.HD;
    float s = 0.f;
    for (int d = lane; d < a.HD; d += 32) s += (float)dout[d] * (float)out[d];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
        int h = row % a.NH, bt = row / a.NH, t = bt % a.T, b = bt / a.T;
        a.dsum[((int64_t)b * a.NH + h) * a.T + t] = s;
    }
}

static int mt_attn_launch_dsum(const mt_attn_args &a, int B, int is_bf16, cudaStream_t stream,
                               mt_error *err) {
    int rows = B * a.T * a.NH, warps = 8;
    dim3 grid((rows + warps - 1) / warps);
    if (is_bf16) mt_attn_dsum_kernel<bf16><<<grid, warps * 32, 0, stream>>>(a, rows);
    else mt_attn_dsum_kernel<float><<<grid, warps * 32, 0, stream>>>(a, rows);
    return mt_attn_check_launch(err, "attention dsum");
}

/* ------------------------------------------------------------------------ */
/* bf16 tensor-core building blocks                                          */

__device__ __forceinline__ unsigned mt_attn_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; when !valid the destination is zero-filled. */
__device__ __forceinline__ void mt_attn_cp16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mt_attn_smem_addr(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
/* 4-byte async copy (zero-filled when !valid). */
__device__ __forceinline__ void mt_attn_cp4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mt_attn_smem_addr(dst)),
                 "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void mt_attn_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void mt_attn_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mt_attn_ldsm(unsigned r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mt_attn_smem_addr(p)));
}
__device__ __forceinline__ void mt_attn_ldsm_t(unsigned r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mt_attn_smem_addr(p)));
}

/* c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col). */
__device__ __forceinline__ void mt_attn_mma(float c[4], const unsigned a[4], unsigned b0,
                                            unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x on the special-function unit (rel. error ~2^-22, ex2(-inf) = 0);
 * the softmax needs no more, and exp2f's range fix-ups cost extra. */
__device__ __forceinline__ float mt_attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned mt_attn_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&v;
}

/* Shared-memory rows are padded by 16 bytes so that the 8 row addresses of
 * an ldmatrix fall in distinct banks. */
template <int HD> struct mt_attn_tile {
    static constexpr int SR = HD + 8;
};

/* Starts the async copy of rows [r0, r0+ROWS) of a (.., T, H, HD) tensor
 * (row stride ld elements) into smem; rows >= T become zeros. */
template <int ROWS, int HD, int NT>
__device__ __forceinline__ void mt_attn_load_tile(bf16 *s, const bf16 *g, int64_t ld, int r0,
                                                  int T) {
    constexpr int CPR = HD / 8; // 16-byte chunks per row
    for (int c = threadIdx.x; c < ROWS * CPR; c += NT) {
        int r = c / CPR, col = (c % CPR) * 8;
        bool ok = r0 + r < T;
        mt_attn_cp16(s + r * mt_attn_tile<HD>::SR + col, g + (ok ? (int64_t)(r0 + r) * ld : 0) + col,
                     ok);
    }
}

/* A fragments (16 rows x 16 cols at k0) of a row-major smem tile. */
__device__ __forceinline__ void mt_attn_frag_a(unsigned r[4], const bf16 *s, int SR, int row0,
                                               int k0, int lane) {
    mt_attn_ldsm(r, s + (row0 + (lane & 15)) * SR + k0 + (lane >> 4) * 8);
}
/* B fragments for two 8-column n-blocks (n0, n0+8) and one k-step at k0,
 * where the smem tile holds B^T row-major ([n][k]): r0,r1 for n0; r2,r3 for n0+8. */
__device__ __forceinline__ void mt_attn_frag_bt(unsigned r[4], const bf16 *s, int SR, int n0,
                                                int k0, int lane) {
    mt_attn_ldsm(r, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * SR + k0 + ((lane >> 3) & 1) * 8);
}
/* B fragments where the smem tile holds B row-major ([k][n]): k-step at k0,
 * n-blocks n0 (r0,r1) and n0+8 (r2,r3). */
__device__ __forceinline__ void mt_attn_frag_b(unsigned r[4], const bf16 *s, int SR, int k0,
                                               int n0, int lane) {
    mt_attn_ldsm_t(r, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * SR + n0 + (lane >> 4) * 8);
}

/* acc (16 x N) += A (16 x K, smem rows row0..) * B where smem tile sb holds B^T ([n][k]). */
template <int K, int N>
__device__ __forceinline__ void mt_attn_mm_smem_bt(float acc[N / 8][4], const bf16 *sa, int SRA,
                                                   int row0, const bf16 *sb, int SRB, int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        unsigned a[4];
        mt_attn_frag_a(a, sa, SRA, row0, kk * 16, lane);
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            unsigned b[4];
            mt_attn_frag_bt(b, sb, SRB, nn * 16, kk * 16, lane);
            mt_attn_mma(acc[2 * nn], a, b[0], b[1]);
            mt_attn_mma(acc[2 * nn + 1], a, b[2], b[3]);
        }
    }
}

/* acc (16 x N) += P (16 x K, fp32 C fragments, rounded to bf16) * B where
 * smem tile sb holds B row-major ([k][n]). */
template <int K, int N>
__device__ __forceinline__ void mt_attn_mm_regs_b(float acc[N / 8][4], const float p[K / 8][4],
                                                  const bf16 *sb, int SRB, int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        unsigned a[4] = {mt_attn_pack(p[2 * kk][0], p[2 * kk][1]),
                         mt_attn_pack(p[2 * kk][2], p[2 * kk][3]),
                         mt_attn_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         mt_attn_pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int nn = 0; nn < N / 16; nn++) {
            unsigned b[4];
            mt_attn_frag_b(b, sb, SRB, kk * 16, nn * 16, lane);
            mt_attn_mma(acc[2 * nn], a, b[0], b[1]);
            mt_attn_mma(acc[2 * nn + 1], a, b[2], b[3]);
        }
    }
}

template <int R, int C> __device__ __forceinline__ void mt_attn_zero(float x[R][C]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < C; j++) x[i][j] = 0.f;
}

/* ------------------------------------------------------------------------ */
/* bf16 forward                                                              */

/* Each warp owns MT row tiles of 16, so every K and V fragment it loads
 * from shared memory feeds MT tensor-core products. */
template <int HD, int NW, int MT> struct mt_attn_fwd_cfg {
    static constexpr int BR = 16 * NW * MT, BC = 64, SR = HD + 8, NT = 32 * NW;
    static constexpr size_t SMEM = (size_t)(BR + 4 * BC) * SR * sizeof(bf16);
};

template <int HD, int NW, int MT>
__global__ void __launch_bounds__(NW * 32) mt_attn_fwd_bf16_kernel(mt_attn_args a) {
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

    mt_attn_load_tile<C::BR, HD, C::NT>(sQ, gq, ldq, q0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sK, gk, ldk, 0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sV, gv, ldk, 0, T);
    mt_attn_cp_commit();

    const float sl2 = a.scale * MT_ATTN_LOG2E;
    const int g = lane >> 2, t4 = lane & 3;
    float o[MT][HD / 8][4];
    float m[MT][2], l[MT][2]; // running max (log2 domain) and sum, rows g and g+8
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        mt_attn_zero<HD / 8, 4>(o[mt]);
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }

    for (int j = 0; j < nkb; j++) {
        const int buf = j & 1;
        if (j + 1 < nkb) {
            mt_attn_load_tile<C::BC, HD, C::NT>(sK + (buf ^ 1) * C::BC * C::SR, gk, ldk,
                                                (j + 1) * C::BC, T);
            mt_attn_load_tile<C::BC, HD, C::NT>(sV + (buf ^ 1) * C::BC * C::SR, gv, ldk,
                                                (j + 1) * C::BC, T);
            mt_attn_cp_commit();
            mt_attn_cp_wait<1>();
        } else {
            mt_attn_cp_wait<0>();
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
                    mt_attn_mma(s[mt][2 * nn], qf[mt], bfr[0], bfr[1]);
                    mt_attn_mma(s[mt][2 * nn + 1], qf[mt], bfr[2], bfr[3]);
                }
            }
        }
        const int k0 = j * C::BC;
        const bool need_mask = k0 + C::BC - 1 > q0 + wr0 || k0 + C::BC > T;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int row_lo = q0 + wr0 + mt * 16 + g;
            // Mask keys after the query (causal) or past T; max on raw scores
            // (scale > 0), then p = 2^(s*scale*log2e - m) in one FFMA + EX2.
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < C::BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    if (need_mask) {
                        const int key = k0 + n * 8 + 2 * t4 + (e & 1), row = row_lo + (e >> 1) * 8;
                        if (key > row || key >= T) s[mt][n][e] = -INFINITY;
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
                    mt_attn_mma(o[mt][2 * nn], pa[mt], bfr[0], bfr[1]);
                    mt_attn_mma(o[mt][2 * nn + 1], pa[mt], bfr[2], bfr[3]);
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

/* ------------------------------------------------------------------------ */
/* bf16 backward: dK, dV                                                     */

template <int HD, int NW> struct mt_attn_dkv_cfg {
    static constexpr int BC = 16 * NW, BR = 64, SR = HD + 8, NT = 32 * NW;
    static constexpr size_t SMEM =
        (size_t)(2 * BC + 4 * BR) * SR * sizeof(bf16) + 4 * BR * sizeof(float);
};

template <int HD, int NW>
__global__ void __launch_bounds__(NW * 32) mt_attn_dkv_bf16_kernel(mt_attn_args a) {
    using C = mt_attn_dkv_cfg<HD, NW>;
    extern __shared__ __align__(16) unsigned char mt_attn_smem[];
    bf16 *sK = (bf16 *)mt_attn_smem;       // (BC, SR)
    bf16 *sV = sK + C::BC * C::SR;         // (BC, SR)
    bf16 *sQ = sV + C::BC * C::SR;         // 2 x (BR, SR)
    bf16 *sO = sQ + 2 * C::BR * C::SR;     // 2 x (BR, SR) dout
    float *sL = (float *)(sO + 2 * C::BR * C::SR); // 2 x BR lse (0 past T)
    float *sD = sL + 2 * C::BR;                    // 2 x BR dsum
    const int T = a.T, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int kb = gridDim.x - 1 - blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int k0 = kb * C::BC, G = a.NH / a.NKV;
    const int64_t ldq = (int64_t)a.NH * HD, ldk = (int64_t)a.NKV * HD;
    const bf16 *gk = (const bf16 *)a.k + ((int64_t)b * T * a.NKV + kvh) * HD;
    const bf16 *gv = (const bf16 *)a.v + ((int64_t)b * T * a.NKV + kvh) * HD;
    const int qb0 = k0 / C::BR, nqb = (T + C::BR - 1) / C::BR - qb0; // query tiles per head
    const int nit = G * nqb;

    // Iteration it covers query head kvh*G + it / nqb and query tile qb0 + it % nqb.
    auto load_q = [&](int it, int buf) {
        const int h = kvh * G + it / nqb, q0 = (qb0 + it % nqb) * C::BR;
        const bf16 *gq = (const bf16 *)a.q + ((int64_t)b * T * a.NH + h) * HD;
        const bf16 *gdo = (const bf16 *)a.dout + ((int64_t)b * T * a.NH + h) * HD;
        mt_attn_load_tile<C::BR, HD, C::NT>(sQ + buf * C::BR * C::SR, gq, ldq, q0, T);
        mt_attn_load_tile<C::BR, HD, C::NT>(sO + buf * C::BR * C::SR, gdo, ldq, q0, T);
        // Asynchronous too: a plain load here would stall its warps a memory latency.
        for (int r = threadIdx.x; r < C::BR; r += C::NT) {
            const bool ok = q0 + r < T;
            const int64_t i = ((int64_t)b * a.NH + h) * T + (ok ? q0 + r : 0);
            mt_attn_cp4(sL + buf * C::BR + r, a.lse + i, ok);
            mt_attn_cp4(sD + buf * C::BR + r, a.dsum + i, ok);
        }
    };
    mt_attn_load_tile<C::BC, HD, C::NT>(sK, gk, ldk, k0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sV, gv, ldk, k0, T);
    load_q(0, 0);
    mt_attn_cp_commit();

    const float sl2 = a.scale * MT_ATTN_LOG2E;
    const int g = lane >> 2, t4 = lane & 3;
    const int key_lo = k0 + w * 16 + g, key_hi = key_lo + 8;
    float dk[HD / 8][4], dv[HD / 8][4];
    mt_attn_zero<HD / 8, 4>(dk);
    mt_attn_zero<HD / 8, 4>(dv);

    for (int it = 0; it < nit; it++) {
        const int buf = it & 1;
        if (it + 1 < nit) {
            load_q(it + 1, buf ^ 1);
            mt_attn_cp_commit();
            mt_attn_cp_wait<1>();
        } else {
            mt_attn_cp_wait<0>();
        }
        __syncthreads();
        const bf16 *q_s = sQ + buf * C::BR * C::SR, *do_s = sO + buf * C::BR * C::SR;
        const float *l_s = sL + buf * C::BR, *d_s = sD + buf * C::BR;
        const int q0 = (qb0 + it % nqb) * C::BR;
        // S^T = K Q^T (16 keys x BR queries per warp), then P^T.
        float p[C::BR / 8][4];
        mt_attn_zero<C::BR / 8, 4>(p);
        mt_attn_mm_smem_bt<HD, C::BR>(p, sK, C::SR, w * 16, q_s, C::SR, lane);
        // Causal mask, and queries past T (their lse reads 0) give P = 0.
        const bool need_mask = q0 < k0 + w * 16 + 15 || q0 + C::BR > T;
#pragma unroll
        for (int n = 0; n < C::BR / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = n * 8 + 2 * t4 + (e & 1);
                float x = mt_attn_exp2(fmaf(p[n][e], sl2, -l_s[qc] * MT_ATTN_LOG2E));
                if (need_mask && (q0 + qc < (e < 2 ? key_lo : key_hi) || q0 + qc >= T)) x = 0.f;
                p[n][e] = x;
            }
        // dP^T = V dO^T, then dS^T = P^T * (dP^T - D).
        float ds[C::BR / 8][4];
        mt_attn_zero<C::BR / 8, 4>(ds);
        mt_attn_mm_smem_bt<HD, C::BR>(ds, sV, C::SR, w * 16, do_s, C::SR, lane);
#pragma unroll
        for (int n = 0; n < C::BR / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = n * 8 + 2 * t4 + (e & 1);
                ds[n][e] = p[n][e] * (ds[n][e] - d_s[qc]);
            }
        mt_attn_mm_regs_b<C::BR, HD>(dv, p, do_s, C::SR, lane);
        mt_attn_mm_regs_b<C::BR, HD>(dk, ds, q_s, C::SR, lane);
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
            *(float2 *)(gdk + key * ldk + d) =
                make_float2(dk[n][2 * half] * a.scale, dk[n][2 * half + 1] * a.scale);
            *(float2 *)(gdv + key * ldk + d) = make_float2(dv[n][2 * half], dv[n][2 * half + 1]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* bf16 backward: dQ                                                         */

template <int HD, int NW> struct mt_attn_dq_cfg {
    static constexpr int BR = 16 * NW, BC = 64, SR = HD + 8, NT = 32 * NW;
    static constexpr size_t SMEM = (size_t)(2 * BR + 4 * BC) * SR * sizeof(bf16);
};

template <int HD, int NW>
__global__ void __launch_bounds__(NW * 32) mt_attn_dq_bf16_kernel(mt_attn_args a) {
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

    mt_attn_load_tile<C::BR, HD, C::NT>(sQ, (const bf16 *)a.q + qoff, ldq, q0, T);
    mt_attn_load_tile<C::BR, HD, C::NT>(sO, (const bf16 *)a.dout + qoff, ldq, q0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sK, gk, ldk, 0, T);
    mt_attn_load_tile<C::BC, HD, C::NT>(sV, gv, ldk, 0, T);
    mt_attn_cp_commit();

    const float sl2 = a.scale * MT_ATTN_LOG2E;
    const int g = lane >> 2, t4 = lane & 3;
    const int row_lo = q0 + w * 16 + g, row_hi = row_lo + 8;
    const int64_t lrow = ((int64_t)b * a.NH + h) * T;
    // Rows past T are never stored; any finite values keep them harmless.
    const float lse_lo = row_lo < T ? a.lse[lrow + row_lo] * MT_ATTN_LOG2E : 0.f;
    const float lse_hi = row_hi < T ? a.lse[lrow + row_hi] * MT_ATTN_LOG2E : 0.f;
    const float D_lo = row_lo < T ? a.dsum[lrow + row_lo] : 0.f;
    const float D_hi = row_hi < T ? a.dsum[lrow + row_hi] : 0.f;
    float dq[HD / 8][4];
    mt_attn_zero<HD / 8, 4>(dq);

    for (int j = 0; j < nkb; j++) {
        const int buf = j & 1;
        if (j + 1 < nkb) {
            mt_attn_load_tile<C::BC, HD, C::NT>(sK + (buf ^ 1) * C::BC * C::SR, gk, ldk,
                                                (j + 1) * C::BC, T);
            mt_attn_load_tile<C::BC, HD, C::NT>(sV + (buf ^ 1) * C::BC * C::SR, gv, ldk,
                                                (j + 1) * C::BC, T);
            mt_attn_cp_commit();
            mt_attn_cp_wait<1>();
        } else {
            mt_attn_cp_wait<0>();
        }
        __syncthreads();
        const bf16 *k_s = sK + buf * C::BC * C::SR, *v_s = sV + buf * C::BC * C::SR;
        const int k0 = j * C::BC;
        float p[C::BC / 8][4];
        mt_attn_zero<C::BC / 8, 4>(p);
        mt_attn_mm_smem_bt<HD, C::BC>(p, sQ, C::SR, w * 16, k_s, C::SR, lane);
        const bool need_mask = k0 + C::BC - 1 > q0 + w * 16 || k0 + C::BC > T;
#pragma unroll
        for (int n = 0; n < C::BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * t4 + (e & 1), row = e < 2 ? row_lo : row_hi;
                float x = mt_attn_exp2(fmaf(p[n][e], sl2, -(e < 2 ? lse_lo : lse_hi)));
                if (need_mask && (key > row || key >= T)) x = 0.f;
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

/* ------------------------------------------------------------------------ */
/* bf16 launchers                                                            */

/* Warps per block (and row tiles per warp in the forward); measured
 * choices in docs/notes/attention.md. Overridable to compare variants. */
#ifndef MT_ATTN_FWD_NW
#define MT_ATTN_FWD_NW 4
#endif
#ifndef MT_ATTN_FWD_MT
#define MT_ATTN_FWD_MT 2
#endif
#ifndef MT_ATTN_DKV_NW
#define MT_ATTN_DKV_NW 4
#endif
#ifndef MT_ATTN_DQ_NW
#define MT_ATTN_DQ_NW 8
#endif

template <int HD>
static int mt_attn_fwd_bf16_launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    using C = mt_attn_fwd_cfg<HD, MT_ATTN_FWD_NW, MT_ATTN_FWD_MT>;
    auto kern = mt_attn_fwd_bf16_kernel<HD, MT_ATTN_FWD_NW, MT_ATTN_FWD_MT>;
    if (mt_attn_set_smem((const void *)kern, C::SMEM, err)) return -1;
    dim3 grid((a.T + C::BR - 1) / C::BR, a.NH, B);
    kern<<<grid, C::NT, C::SMEM, st>>>(a);
    return mt_attn_check_launch(err, "attention forward (bf16)");
}

template <int HD>
static int mt_attn_bwd_bf16_launch(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err) {
    using CK = mt_attn_dkv_cfg<HD, MT_ATTN_DKV_NW>;
    using CQ = mt_attn_dq_cfg<HD, MT_ATTN_DQ_NW>;
    auto kdkv = mt_attn_dkv_bf16_kernel<HD, MT_ATTN_DKV_NW>;
    auto kdq = mt_attn_dq_bf16_kernel<HD, MT_ATTN_DQ_NW>;
    if (mt_attn_set_smem((const void *)kdkv, CK::SMEM, err)) return -1;
    if (mt_attn_set_smem((const void *)kdq, CQ::SMEM, err)) return -1;
    if (mt_attn_launch_dsum(a, B, 1, st, err)) return -1;
    kdkv<<<dim3((a.T + CK::BC - 1) / CK::BC, a.NKV, B), CK::NT, CK::SMEM, st>>>(a);
    if (mt_attn_check_launch(err, "attention backward dK/dV (bf16)")) return -1;
    kdq<<<dim3((a.T + CQ::BR - 1) / CQ::BR, a.NH, B), CQ::NT, CQ::SMEM, st>>>(a);
    return mt_attn_check_launch(err, "attention backward dQ (bf16)");
}

static mt_attn_args mt_attn_make_args(size_t T, size_t NH, size_t NKV, size_t HD) {
    mt_attn_args a = {};
    a.T = (int)T;
    a.NH = (int)NH;
    a.NKV = (int)NKV;
    a.HD = (int)HD;
    a.scale = (float)(1.0 / sqrt((double)HD));
    return a;
}

extern "C" int mt_attn_forward_bf16(uint16_t *out, float *out_f32, float *lse, const uint16_t *q,
                                    const uint16_t *k, const uint16_t *v, size_t B, size_t T,
                                    size_t NH, size_t NKV, size_t HD, cudaStream_t stream,
                                    mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 1, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.o = out; a.o_f32 = out_f32; a.lse = lse;
    return HD == 64 ? mt_attn_fwd_bf16_launch<64>(a, (int)B, stream, err)
                    : mt_attn_fwd_bf16_launch<128>(a, (int)B, stream, err);
}

extern "C" int mt_attn_backward_bf16(float *dq, float *dk, float *dv, void *scratch,
                                     const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                                     const uint16_t *v, const uint16_t *out, const float *lse,
                                     size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                                     cudaStream_t stream, mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 1, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.dout = dout; a.out = out; a.lse = (float *)lse;
    a.dsum = (float *)scratch; a.dq = dq; a.dk = dk; a.dv = dv;
    return HD == 64 ? mt_attn_bwd_bf16_launch<64>(a, (int)B, stream, err)
                    : mt_attn_bwd_bf16_launch<128>(a, (int)B, stream, err);
}

/* ------------------------------------------------------------------------ */
/* fp32 path                                                                 */

#define MT_ATTN_F32_WARPS 8
#define MT_ATTN_F32_TILE 32

/* Forward: block = 8 consecutive query rows of one head, a warp per row;
 * 32-key tiles of K (padded rows: lane i reads row i without bank conflicts)
 * and V in shared memory. DMAX = HD rounded up to a multiple of 32. */
template <int DMAX>
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
    const int last = min(r0 + MT_ATTN_F32_WARPS, T); // keys [0, last)
    for (int k0 = 0; k0 < last; k0 += TL) {
        __syncthreads();
        for (int i = threadIdx.x; i < TL * HD; i += blockDim.x) {
            int r = i / HD, d = i % HD;
            bool ok = k0 + r < T;
            sK[r * KS + d] = ok ? gk[(int64_t)(k0 + r) * ldk + d] : 0.f;
            sV[r * HD + d] = ok ? gv[(int64_t)(k0 + r) * ldk + d] : 0.f;
        }
        __syncthreads();
        if (t >= T || k0 > t) continue;
        const int key = k0 + lane;
        float s = -INFINITY;
        if (key <= t) {
            float dot = 0.f;
            for (int d = 0; d < HD; d++) dot += sQ[w * HD + d] * sK[lane * KS + d];
            s = dot * a.scale;
        }
        float mx = s;
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float mn = fmaxf(m, mx); // finite: key k0 <= t is always valid
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
template <int DMAX>
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
    for (int k0 = 0; k0 < last; k0 += TL) {
        __syncthreads();
        for (int i = threadIdx.x; i < TL * HD; i += blockDim.x) {
            int r = i / HD, d = i % HD;
            bool ok = k0 + r < T;
            sK[r * KS + d] = ok ? gk[(int64_t)(k0 + r) * ldk + d] : 0.f;
            sV[r * KS + d] = ok ? gv[(int64_t)(k0 + r) * ldk + d] : 0.f;
        }
        __syncthreads();
        if (t >= T || k0 > t) continue;
        const int key = k0 + lane;
        float ds = 0.f;
        if (key <= t) {
            float s = 0.f, dp = 0.f;
            for (int d = 0; d < HD; d++) {
                s += sQ[w * HD + d] * sK[lane * KS + d];
                dp += sO[w * HD + d] * sV[lane * KS + d];
            }
            ds = expf(s * a.scale - lse) * (dp - D);
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
template <int DMAX>
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
    for (int h = kvh * G; h < kvh * G + G; h++) {
        const int64_t qoff = ((int64_t)b * T * a.NH + h) * HD, lrow = ((int64_t)b * a.NH + h) * T;
        for (int q0 = j0; q0 < T; q0 += TL) {
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
            if (qi >= j && qi < T) {
                float s = 0.f, dp = 0.f;
                for (int d = 0; d < HD; d++) {
                    s += sK[w * HD + d] * sQ[lane * KS + d];
                    dp += sV[w * HD + d] * sO[lane * KS + d];
                }
                p = expf(s * a.scale - a.lse[lrow + qi]);
                ds = p * (dp - a.dsum[lrow + qi]);
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

template <int DMAX>
static int mt_attn_f32_launch(const mt_attn_args &a, int B, int backward, cudaStream_t st,
                              mt_error *err) {
    const int HD = a.HD, TL = MT_ATTN_F32_TILE, W = MT_ATTN_F32_WARPS;
    const size_t fsm = sizeof(float) * ((size_t)W * HD + (size_t)TL * (HD + 1) + (size_t)TL * HD);
    const size_t bsm = sizeof(float) * (2 * (size_t)W * HD + 2 * (size_t)TL * (HD + 1));
    const dim3 gq((a.T + W - 1) / W, a.NH, B), gk((a.T + W - 1) / W, a.NKV, B);
    if (!backward) {
        auto k = mt_attn_fwd_f32_kernel<DMAX>;
        if (mt_attn_set_smem((const void *)k, fsm, err)) return -1;
        k<<<gq, W * 32, fsm, st>>>(a);
        return mt_attn_check_launch(err, "attention forward (fp32)");
    }
    auto kdkv = mt_attn_dkv_f32_kernel<DMAX>;
    auto kdq = mt_attn_dq_f32_kernel<DMAX>;
    if (mt_attn_set_smem((const void *)kdkv, bsm, err)) return -1;
    if (mt_attn_set_smem((const void *)kdq, bsm, err)) return -1;
    if (mt_attn_launch_dsum(a, B, 0, st, err)) return -1;
    kdkv<<<gk, W * 32, bsm, st>>>(a);
    if (mt_attn_check_launch(err, "attention backward dK/dV (fp32)")) return -1;
    kdq<<<gq, W * 32, bsm, st>>>(a);
    return mt_attn_check_launch(err, "attention backward dQ (fp32)");
}

static int mt_attn_f32_dispatch(const mt_attn_args &a, int B, int backward, cudaStream_t st,
                                mt_error *err) {
    if (a.HD <= 64) return mt_attn_f32_launch<64>(a, B, backward, st, err);
    if (a.HD <= 128) return mt_attn_f32_launch<128>(a, B, backward, st, err);
    return mt_attn_f32_launch<256>(a, B, backward, st, err);
}

extern "C" int mt_attn_forward_f32(float *out, float *lse, const float *q, const float *k,
                                   const float *v, size_t B, size_t T, size_t NH, size_t NKV,
                                   size_t HD, cudaStream_t stream, mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 0, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.o = out; a.lse = lse;
    return mt_attn_f32_dispatch(a, (int)B, 0, stream, err);
}

extern "C" int mt_attn_backward_f32(float *dq, float *dk, float *dv, void *scratch,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse, size_t B,
                                    size_t T, size_t NH, size_t NKV, size_t HD,
                                    cudaStream_t stream, mt_error *err) {
    if (mt_attn_check_shape(B, T, NH, NKV, HD, 0, err)) return -1;
    if (B == 0 || T == 0) return 0;
    mt_attn_args a = mt_attn_make_args(T, NH, NKV, HD);
    a.q = q; a.k = k; a.v = v; a.dout = dout; a.out = out; a.lse = (float *)lse;
    a.dsum = (float *)scratch; a.dq = dq; a.dk = dk; a.dv = dv;
    return mt_attn_f32_dispatch(a, (int)B, 1, stream, err);
}
