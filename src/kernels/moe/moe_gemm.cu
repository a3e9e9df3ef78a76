/* Grouped expert products (contract: moe_gemm.h; the problem in one
 * shape: moe_gemm_internal.cuh): the API, the choice of path and the
 * plain kernels (the tile offsets: moe_gemm_tiles.cu).
 *
 * The plain kernels take what the tensor-core kernel (moe_gemm_mma.cu)
 * cannot: fp32 precision (fp32 FMA, no TF32), and bf16 operands of sizes
 * that are not multiples of 8 or pointers that are not 16-byte aligned
 * (bf16 read, fp32 FMA). A block computes a 64 x 64 output tile, each
 * thread 4 x 4 of it, stepping k by 16 through shared memory; every output
 * is one thread's fp32 sum in k order, so a run repeats to the bit. */
#include <limits.h>

#include "kernels/moe/moe_gemm_internal.cuh"

#define MT_MOE_SBM 64 /* plain kernel tile: rows (M), columns (N), k step */
#define MT_MOE_SBN 64
#define MT_MOE_SBK 16

/* ---- plain kernels ---- */

__device__ __forceinline__ float mt_moe_ld(const float *p) { return *p; }
__device__ __forceinline__ float mt_moe_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

/* T: the operand type (float or bf16). forward and dinp: blockIdx.x is a
 * row tile (those past tile_off[E] exit), blockIdx.y a column tile. dw:
 * blockIdx.x an output tile, blockIdx.y the expert. */
template <typename T, int OP>
__global__ void __launch_bounds__(256) mt_moe_plain_kernel(const mt_moe_args a) {
    __shared__ float sA[MT_MOE_SBK][MT_MOE_SBM + 1]; // A(m, k) at sA[k][m]
    __shared__ float sB[MT_MOE_SBK][MT_MOE_SBN + 1]; // B(k, n) at sB[k][n]
    const T *ga, *gb; // A(0, 0) and B(0, 0) of the tile
    int64_t out0;     // C(0, 0) of the tile, elements from a.out
    int m_lim, n_lim, K, ldo;
    if (OP != MT_MOE_DW) {
        const int t = blockIdx.x;
        if (t >= __ldg(a.tile_off + a.E)) return;
        const int e = mt_moe_find_expert(a.tile_off, a.E, t);
        int r0, r1;
        mt_moe_segment(a.start, e, a.R, &r0, &r1);
        const int row0 = r0 + (t - __ldg(a.tile_off + e)) * MT_MOE_SBM;
        const int n0 = blockIdx.y * MT_MOE_SBN;
        const int N = OP == MT_MOE_FWD ? a.OC : a.IC;
        K = OP == MT_MOE_FWD ? a.IC : a.OC;
        ga = (const T *)a.a + (int64_t)row0 * K;
        const T *we = (const T *)a.b + (size_t)e * a.w_stride;
        gb = OP == MT_MOE_FWD ? we + (int64_t)n0 * a.IC : we + n0;
        out0 = (int64_t)row0 * N + n0;
        m_lim = r1 - row0;
        n_lim = N - n0;
        ldo = N;
    } else {
        const int e = blockIdx.y;
        int r0, r1;
        mt_moe_segment(a.start, e, a.R, &r0, &r1);
        if (r1 == r0) return; // an expert with no rows keeps its gradient
        const int ntn = (a.IC + MT_MOE_SBN - 1) / MT_MOE_SBN;
        const int m0 = (blockIdx.x / ntn) * MT_MOE_SBM, n0 = (blockIdx.x % ntn) * MT_MOE_SBN;
        K = r1 - r0;
        ga = (const T *)a.a + (int64_t)r0 * a.OC + m0;
        gb = (const T *)a.b + (int64_t)r0 * a.IC + n0;
        out0 = (int64_t)e * a.out_stride + (int64_t)m0 * a.IC + n0;
        m_lim = a.OC - m0;
        n_lim = a.IC - n0;
        ldo = a.IC;
    }
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += MT_MOE_SBK) {
        // Consecutive threads read consecutive addresses of the operand's
        // contiguous dimension; outside the problem reads as 0.
        for (int i = threadIdx.x; i < MT_MOE_SBM * MT_MOE_SBK; i += 256) {
            int m, k;
            float v = 0.f;
            if (OP != MT_MOE_DW) { // A(m, k) = ga[m * K + k]
                m = i / MT_MOE_SBK, k = i % MT_MOE_SBK;
                if (m < m_lim && k0 + k < K) v = mt_moe_ld(ga + (int64_t)m * K + k0 + k);
            } else { // A(m, k) = ga[k * OC + m]
                m = i % MT_MOE_SBM, k = i / MT_MOE_SBM;
                if (m < m_lim && k0 + k < K) v = mt_moe_ld(ga + (int64_t)(k0 + k) * a.OC + m);
            }
            sA[k][m] = v;
        }
        for (int i = threadIdx.x; i < MT_MOE_SBN * MT_MOE_SBK; i += 256) {
            int n, k;
            float v = 0.f;
            if (OP == MT_MOE_FWD) { // B(k, n) = gb[n * IC + k]
                n = i / MT_MOE_SBK, k = i % MT_MOE_SBK;
                if (n < n_lim && k0 + k < K) v = mt_moe_ld(gb + (int64_t)n * a.IC + k0 + k);
            } else { // B(k, n) = gb[k * IC + n]
                n = i % MT_MOE_SBN, k = i / MT_MOE_SBN;
                if (n < n_lim && k0 + k < K) v = mt_moe_ld(gb + (int64_t)(k0 + k) * a.IC + n);
            }
            sB[k][n] = v;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < MT_MOE_SBK; k++) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) av[i] = sA[k][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) bv[j] = sB[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    const bool add = OP == MT_MOE_DW || (OP == MT_MOE_DINP && a.accumulate);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int m = ty + 16 * i;
        if (m >= m_lim) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int n = tx + 16 * j;
            if (n >= n_lim) continue;
            const int64_t o = out0 + (int64_t)m * ldo + n;
            if (OP == MT_MOE_FWD && a.out_bf16) {
                ((__nv_bfloat16 *)a.out)[o] = __float2bfloat16_rn(acc[i][j]);
            } else {
                float *p = (float *)a.out + o;
                *p = add ? *p + acc[i][j] : acc[i][j];
            }
        }
    }
}

template <typename T> static void mt_moe_plain_run(int op, const mt_moe_args &a, cudaStream_t st) {
    if (op == MT_MOE_DW) {
        MT_ASSERT(a.E <= 65535); /* the grid's y extent */
        dim3 grid(MT_CEIL_DIV(a.OC, MT_MOE_SBM) * MT_CEIL_DIV(a.IC, MT_MOE_SBN), a.E);
        mt_moe_plain_kernel<T, MT_MOE_DW><<<grid, 256, 0, st>>>(a);
    } else {
        mt_moe_tile_offsets(a, MT_MOE_SBM, st);
        const int N = op == MT_MOE_FWD ? a.OC : a.IC;
        dim3 grid(MT_CEIL_DIV(a.R, MT_MOE_SBM) + a.E, MT_CEIL_DIV(N, MT_MOE_SBN));
        if (op == MT_MOE_FWD) mt_moe_plain_kernel<T, MT_MOE_FWD><<<grid, 256, 0, st>>>(a);
        else mt_moe_plain_kernel<T, MT_MOE_DINP><<<grid, 256, 0, st>>>(a);
    }
    CUDA_LAUNCH_CHECK();
}

/* ---- the API ---- */

static bool mt_moe_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

void mt_moe_gemm_run(int op, mt_precision prec, const mt_moe_args &a, mt_cuda_moe_kernel kernel,
                     int bk, int stages, cudaStream_t stream) {
    /* Nothing to write. An empty reduction (forward with IC = 0, dinp with
     * OC = 0) still writes its zeros, through the plain kernel. */
    const int N = op == MT_MOE_FWD ? a.OC : a.IC;
    if (a.E == 0 || a.R == 0 || N == 0 || (op == MT_MOE_DW && a.OC == 0)) return;
    const bool fast = prec == MT_PREC_BF16 && mt_moe_mma_shape_ok(a.IC, a.OC) &&
                      mt_moe_aligned16(a.a) && mt_moe_aligned16(a.b) &&
                      mt_moe_aligned16(a.out) &&
                      (op == MT_MOE_DW ? a.out_stride % 4 == 0 : a.w_stride % 8 == 0);
    if (fast && kernel == MT_CUDA_MOE_KERNEL_AUTO && mt_moe_wgmma_available())
        mt_moe_wgmma_run(op, a, stream);
    else if (fast) mt_moe_mma_run(op, a, bk, stages, stream);
    else if (prec == MT_PREC_BF16) mt_moe_plain_run<__nv_bfloat16>(op, a, stream);
    else mt_moe_plain_run<float>(op, a, stream);
}

/* The arguments, checked: sizes fit the kernels' int arithmetic (start is
 * int32, so R does too). */
static mt_moe_args mt_moe_args_make(const void *a, const void *b, void *out, size_t w_stride,
                                    size_t out_stride, const int32_t *start, int E, size_t R,
                                    size_t IC, size_t OC, void *scratch) {
    MT_ASSERT(E >= 0 && R <= INT32_MAX && IC <= INT32_MAX && OC <= INT32_MAX);
    /* row tiles of 64 plus one partial per expert, and output tiles */
    MT_ASSERT(R / 64 + (size_t)E + 1 < INT32_MAX / 2);
    MT_ASSERT(E == 0 || start != NULL);
    mt_moe_args m;
    m.a = a;
    m.b = b;
    m.out = out;
    m.w_stride = w_stride;
    m.out_stride = out_stride;
    m.start = start;
    m.tile_off = (int32_t *)scratch;
    m.E = E;
    m.R = (int)R;
    m.IC = (int)IC;
    m.OC = (int)OC;
    m.accumulate = 0;
    m.out_bf16 = 0;
    return m;
}

static mt_cuda_moe_kernel mt_moe_kernel_choice = MT_CUDA_MOE_KERNEL_AUTO;

extern "C" mt_cuda_moe_kernel mt_cuda_moe_gemm_use(mt_cuda_moe_kernel k) {
    const mt_cuda_moe_kernel was = mt_moe_kernel_choice;
    mt_moe_kernel_choice = k;
    return was;
}

extern "C" const char *mt_cuda_moe_gemm_kernel_name(void) {
    return mt_moe_kernel_choice == MT_CUDA_MOE_KERNEL_AUTO && mt_moe_wgmma_available()
               ? "wgmma"
               : "mma.sync";
}

extern "C" bool mt_cuda_moe_gemm_tensor_cores(mt_precision prec, size_t IC, size_t OC) {
    return prec == MT_PREC_BF16 && mt_moe_mma_shape_ok(IC, OC);
}

extern "C" void mt_cuda_moe_gemm_forward(mt_cuda_ctx *ctx, mt_precision prec, void *y,
                                         mt_dt y_dt, const void *x, const void *w,
                                         size_t w_stride, const int32_t *start, int E, size_t R,
                                         size_t IC, size_t OC, void *scratch) {
    MT_ASSERT(prec == MT_PREC_BF16 || y_dt == MT_DT_F32);
    mt_moe_args a = mt_moe_args_make(x, w, y, w_stride, 0, start, E, R, IC, OC, scratch);
    a.out_bf16 = y_dt == MT_DT_BF16;
    mt_moe_gemm_run(MT_MOE_FWD, prec, a, mt_moe_kernel_choice, 0, 0, ctx->stream);
}

extern "C" void mt_cuda_moe_gemm_dinp(mt_cuda_ctx *ctx, mt_precision prec, float *dx,
                                      bool accumulate, const void *dy, const void *w,
                                      size_t w_stride, const int32_t *start, int E, size_t R,
                                      size_t IC, size_t OC, void *scratch) {
    mt_moe_args a = mt_moe_args_make(dy, w, dx, w_stride, 0, start, E, R, IC, OC, scratch);
    a.accumulate = accumulate;
    mt_moe_gemm_run(MT_MOE_DINP, prec, a, mt_moe_kernel_choice, 0, 0, ctx->stream);
}

extern "C" void mt_cuda_moe_gemm_dw(mt_cuda_ctx *ctx, mt_precision prec, float *dw,
                                    size_t dw_stride, const void *dy, const void *x,
                                    const int32_t *start, int E, size_t R, size_t IC, size_t OC,
                                    void *scratch) {
    mt_moe_args a = mt_moe_args_make(dy, x, dw, 0, dw_stride, start, E, R, IC, OC, scratch);
    mt_moe_gemm_run(MT_MOE_DW, prec, a, mt_moe_kernel_choice, 0, 0, ctx->stream);
}
