/* Internals of the fused attention kernels, shared by their files:
 *   attention.cu           the API of attention.h: checks, arguments, D = rowsum(dout*out)
 *   attention_mma_fwd.cu   bf16 tensor-core forward (mma.sync), and the choice of kernel
 *   attention_wgmma_fwd.cu bf16 forward on Hopper (wgmma)
 *   attention_wgmma_fwd256.cu  the same at head dim 256
 *   attention_mma_bwd.cu   bf16 tensor-core backward (dK/dV, then dQ)
 *   attention_wgmma_bwd.cu the same on Hopper (wgmma)
 *   attention_wgmma_bwd256.cu  the same at head dim 256
 *   attention_f32.cu       fp32 forward and backward
 * and the bf16 tensor-core building blocks (cp.async, ldmatrix, mma.sync)
 * that the bf16 kernels are made of. Not a public interface: use
 * attention.h. */
#ifndef MT_KERNELS_ATTENTION_INTERNAL_CUH
#define MT_KERNELS_ATTENTION_INTERNAL_CUH

#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/attention/attention.h"
#include "kernels/cuda_common.h"
#include "kernels/ptx/tc_ptx.cuh"

typedef __nv_bfloat16 bf16;

#define MT_ATTN_LOG2E 1.4426950408889634f
#define MT_ATTN_LN2 0.6931471805599453f

/* Everything a kernel needs; unused pointers are NULL. */
struct mt_attn_args {
    const void *q, *k, *v, *dout, *out; // (B,T,NH|NKV,HD)
    void *o;                            // forward output, (B,T,NH,HD)
    float *o_f32;                       // optional fp32 forward output
    float *lse;                         // (B,NH,T)
    float *dsum;                        // (B,NH,T) rowsum(dout*out)
    float *dq, *dk, *dv;
    int T, NH, NKV, HD;
    float scale;                        // scores q.k * scale
    float softcap;                      // then softcap * tanh(s / softcap); 0: none
    const int32_t *pos;                 // (B,T) positions of packed documents, or NULL
};

/* Work tile L of a launch run in chunks of `chunk` of its ngroups groups
 * (the last chunk partial) and, inside a chunk, tile by tile across the
 * chunk's groups: its group *grp and that group's tile *k (0 runs first).
 * The blocks working at once then share a chunk's inputs through L2, and
 * with each group's heaviest tiles first the last to start are light. */
__device__ __forceinline__ void mt_attn_chunked(int L, int ngroups, int ntiles, int chunk,
                                                int *grp, int *k) {
    const int c0 = L / (chunk * ntiles) * chunk, cn = min(chunk, ngroups - c0);
    const int r = L - c0 * ntiles;
    *grp = c0 + r % cn;
    *k = r / cn;
}

/* Host helpers (attention_common.cu). */
/* Reports a failed launch (or an earlier sticky error) as a recoverable error. */
int mt_attn_check_launch(mt_error *err, const char *what);
/* Raises a kernel's dynamic shared memory limit past the 48 KB default. */
int mt_attn_set_smem(const void *kernel, size_t bytes, mt_error *err);
/* How the Hopper kernels spread `tiles` work tiles on the current device:
 * grid, a persistent grid (a block an SM, at most mt_attn_set_grid_cap's,
 * at most one a tile); chunk, the groups (batch row and head, or kv head)
 * of a chunk in the order of mt_attn_chunked, an eighth as many as SMs
 * (16 on an H200). Measured there with the dK/dV pass (attn_bench, B 8 T
 * 2048 and B 2 T 8192, 32/8 heads): chunks of all groups ran 384 and 412
 * TFLOPS, chunks of 17 and 5 (two blocks an SM) 397 and 397; 16 is about
 * the first at 8192 (16 groups) and the second at 2048. */
struct mt_attn_layout {
    int grid, chunk;
};
int mt_attn_launch_layout(int tiles, mt_attn_layout *l, mt_error *err);
/* The query tiles of BR rows of a launch over B batch rows, in the order
 * the persistent forward and dQ pass take them: mt_attn_chunked over the
 * (batch row, head) pairs, the last (heaviest) query tile of each first, so
 * that the blocks working at once share a chunk's keys through L2 and the
 * last to start are light. mt_attn_qtiles_init fills it and the launch
 * layout (mt_attn_launch_layout over its n tiles). */
struct mt_attn_qtiles {
    int nqb, NH, B, n, chunk; // n: tiles
    __device__ void decode(int L, int *qb, int *h, int *b) const {
        int bh, k;
        mt_attn_chunked(L, NH * B, nqb, chunk, &bh, &k);
        *qb = nqb - 1 - k;
        *h = bh % NH;
        *b = bh / NH;
    }
};
int mt_attn_qtiles_init(mt_attn_qtiles *tl, const mt_attn_args &a, int B, int BR,
                        mt_attn_layout *lay, mt_error *err);
/* A persistent block's next work item from the counter pair ctr (zero at
 * launch): its index below n, or -1 once all are taken. Each block draws
 * until it gets -1; the launch's last such draw zeroes the pair for the
 * next launch, so launches that share a pair must not overlap. */
__device__ __forceinline__ int mt_attn_claim(unsigned *ctr, int n) {
    const int L = (int)atomicAdd(ctr, 1u);
    if (L < n) return L;
    __threadfence();
    if (atomicAdd(ctr + 1, 1u) == gridDim.x - 1) ctr[0] = ctr[1] = 0;
    return -1;
}
/* The current device's tile counters (mt_attn_claim): two pairs, the
 * persistent forward's, then the dK/dV pass's; allocated and zeroed (on st)
 * at the first call; the kernels leave them zero. */
int mt_attn_tile_counter(unsigned **ctr, cudaStream_t st, mt_error *err);
/* D[b,h,t] = rowsum(dout * out) into a.dsum, the backward's first pass. */
int mt_attn_launch_dsum(const mt_attn_args &a, int B, int is_bf16, cudaStream_t stream,
                        mt_error *err);

/* The launchers of each precision, for B batch rows. */
int mt_attn_fwd_bf16(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err);
int mt_attn_bwd_bf16(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err);
int mt_attn_f32(const mt_attn_args &a, int B, int backward, cudaStream_t st, mt_error *err);
/* The shared memory of the mma.sync kernels at HD 256 (the largest of
 * their launches), forward and backward (attention.cu asks the device for
 * the larger). */
size_t mt_attn_fwd_mma_smem_256(void);
size_t mt_attn_bwd_mma_smem_256(void);
/* The Hopper kernels (attention_wgmma_*.cu): whether this build and the
 * current device have them, whether the bf16 launchers take them (that and
 * the choice of mt_attn_use), and their launchers. */
bool mt_attn_wgmma_available(void);
bool mt_attn_takes_wgmma(void);
int mt_attn_fwd_wgmma(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err);
int mt_attn_bwd_wgmma(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err);
size_t mt_attn_bwd_wgmma_smem(void); /* the backward's largest block, HD 128 */
/* Head dim 256 on Hopper (attention_wgmma_fwd256.cu, _bwd256.cu): whether
 * the current device runs them (this build's sm_90a code, and blocks with
 * their shared memory; the bf16 launchers take them where they take the
 * wgmma kernels, mt_attn_takes_wgmma), and their launchers. */
bool mt_attn_fwd_wgmma256_fits(void);
bool mt_attn_bwd_wgmma256_fits(void);
int mt_attn_fwd_wgmma256(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err);
int mt_attn_bwd_wgmma256(const mt_attn_args &a, int B, cudaStream_t st, mt_error *err);

/* Packed documents (a.pos, see attention.h). The first key that query t of
 * batch row b may see: its document's start, non-decreasing in t. */
__device__ __forceinline__ int mt_attn_doc_start(const mt_attn_args &a, int b, int t) {
    return t - a.pos[(int64_t)b * a.T + t];
}

/* The latest document start among query rows [q0, q0 + BR) (rows past T
 * left out), read from their positions staged in p_s: the start of the
 * last row's document. */
template <int BR>
__device__ __forceinline__ int mt_attn_tile_last_start(const int32_t *p_s, int q0, int T) {
    const int q_last = min(q0 + BR, T) - 1;
    return q_last - p_s[q_last - q0];
}

/* One past the last query of row b that may see key k: the first document
 * start after k, or T. A binary search, the starts being non-decreasing. */
__device__ __forceinline__ int mt_attn_doc_end(const mt_attn_args &a, int b, int k) {
    int lo = k + 1, hi = a.T;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (mt_attn_doc_start(a, b, mid) > k) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* ------------------------------------------------------------------------ */
/* bf16 tensor-core building blocks (the PTX wrappers are in tc_ptx.cuh)    */

/* 2^x on the special-function unit (rel. error ~2^-22, ex2(-inf) = 0);
 * the softmax needs no more, and exp2f's range fix-ups cost extra. */
__device__ __forceinline__ float mt_attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Soft-capping (attention.h: score c tanh(x / c) of x = q.k * scale). The
 * bf16 kernels of SOFTCAP = true hold t = tanh(q.k * scale / c) in place of
 * the raw q.k and run the same log2-domain softmax with c * log2e in place
 * of scale * log2e (mt_attn_sl2): one FFMA still gives the score, and t is
 * monotone in q.k, so the running max taken on t is still the max. The
 * backward's dScore -> d(q.k) factor is (1 - t^2) * scale. */
template <bool SOFTCAP> __device__ __forceinline__ float mt_attn_sl2(const mt_attn_args &a) {
    return (SOFTCAP ? a.softcap : a.scale) * MT_ATTN_LOG2E;
}

/* tanh(y) = sign(y) (1 - 2 / (2^(2|y| log2e) + 1)) on the special-function
 * unit. Absolute error below 4e-7 = 3 * 2^-23: with e = 2^(2|y| log2e) >= 1,
 * ex2's relative error 2^-22 moves 2/(e+1) by at most 2^-22 * 2e/(e+1)^2
 * <= 2^-23; rounding e + 1 by <= 2^-24; rcp.approx's 1 ulp (2^-23
 * relative) by <= 2^-23; the argument's and the last FMA's roundings by
 * <= 2^-25 each. So c * t is within c * 4e-7 of the capped score (2e-5 at
 * Gemma 2's c = 50), far below the bf16 rounding of P (2^-9 relative, i.e.
 * 2e-3 on the score). tanh.approx.f32 (relative error 2^-11: 0.02 on the
 * score at c = 50) would not do. Saturates to +-1 (ex2 gives inf). */
__device__ __forceinline__ float mt_attn_tanh(float y) {
    const float e = mt_attn_exp2(fabsf(y) * (2.f * MT_ATTN_LOG2E));
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(e + 1.f));
    return copysignf(fmaf(-2.f, r, 1.f), y);
}

/* The backward's soft-capped probability and dS factor from t (above):
 * *p = 2^(t sl2 - lse2) and returns max(1 - t^2, 0); a masked score's
 * t = -inf gives p = 0 and 0 (not a NaN). */
__device__ __forceinline__ float mt_attn_cap_grad(float t, float sl2, float lse2, float *p) {
    *p = mt_attn_exp2(fmaf(t, sl2, -lse2));
    return fmaxf(fmaf(-t, t, 1.f), 0.f);
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
        mt_tc_cp16(s + r * mt_attn_tile<HD>::SR + col, g + (ok ? (int64_t)(r0 + r) * ld : 0) + col,
                     ok);
    }
}

/* A fragments (16 rows x 16 cols at k0) of a row-major smem tile. */
__device__ __forceinline__ void mt_attn_frag_a(unsigned r[4], const bf16 *s, int SR, int row0,
                                               int k0, int lane) {
    mt_tc_ldsm(r, s + (row0 + (lane & 15)) * SR + k0 + (lane >> 4) * 8);
}
/* B fragments for two 8-column n-blocks (n0, n0+8) and one k-step at k0,
 * where the smem tile holds B^T row-major ([n][k]): r0,r1 for n0; r2,r3 for n0+8. */
__device__ __forceinline__ void mt_attn_frag_bt(unsigned r[4], const bf16 *s, int SR, int n0,
                                                int k0, int lane) {
    mt_tc_ldsm(r, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * SR + k0 + ((lane >> 3) & 1) * 8);
}
/* B fragments where the smem tile holds B row-major ([k][n]): k-step at k0,
 * n-blocks n0 (r0,r1) and n0+8 (r2,r3). */
__device__ __forceinline__ void mt_attn_frag_b(unsigned r[4], const bf16 *s, int SR, int k0,
                                               int n0, int lane) {
    mt_tc_ldsm_t(r, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * SR + n0 + (lane >> 4) * 8);
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
            mt_tc_mma_n16(acc + 2 * nn, a, b);
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
            mt_tc_mma_n16(acc + 2 * nn, a, b);
        }
    }
}

template <int R, int C> __device__ __forceinline__ void mt_attn_zero(float x[R][C]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < C; j++) x[i][j] = 0.f;
}

#endif
