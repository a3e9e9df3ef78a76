/* Matrix products through cuBLASLt, and the CUDA context that owns them.
 *
 * megatrain's arrays are row-major; cuBLASLt is column-major. A row-major
 * X (r,c) read as column-major is X^T (c,r) with leading dimension c, so
 *   out (N,OC) = inp (N,IC) @ W (OC,IC)^T   is   out^T = W * inp^T:
 *     m=OC n=N k=IC, A = W "T" (lda IC), B = inp "N" (ldb IC), ldd OC
 *   dinp (N,IC) = dout (N,OC) @ W           is   dinp^T = W^T * dout^T:
 *     m=IC n=N k=OC, A = W "N" (lda IC), B = dout "N" (ldb OC), ldd IC
 *   dW (OC,IC) += dout^T @ inp              is   dW^T += inp^T * dout:
 *     m=IC n=OC k=N, A = inp "N" (lda IC), B = dout "T" (ldb OC), ldd IC
 * Compute type is CUBLAS_COMPUTE_32F for both precisions: bf16 operands
 * accumulate in fp32, and fp32 operands do NOT use TF32.
 *
 * Each distinct problem (shape, types, alignment, epilogue) gets a plan —
 * descriptors plus the heuristic's first algorithm — kept in a small cache
 * in the context, so a training step's steady state asks no heuristics. */
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"

#define MT_DEFAULT_WORKSPACE ((size_t)64 << 20)

extern "C" int mt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" int mt_cuda_ctx_create(mt_cuda_ctx **out, cudaStream_t stream,
                                  size_t workspace_bytes, mt_error *err) {
    *out = NULL;
    if (mt_cuda_device_count() <= 0)
        return mt_errorf(err, "no CUDA device found: run on a machine with an NVIDIA GPU "
                              "and its driver, or use --device cpu");
    mt_cuda_ctx *ctx = (mt_cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return mt_errorf(err, "out of host memory creating the CUDA context");
    ctx->stream = stream;
    ctx->workspace_bytes = workspace_bytes ? workspace_bytes : MT_DEFAULT_WORKSPACE;
    if (cublasLtCreate(&ctx->lt) != CUBLAS_STATUS_SUCCESS) {
        free(ctx);
        return mt_errorf(err, "cublasLtCreate failed: check the CUDA driver and libraries");
    }
    if (cudaMalloc(&ctx->workspace, ctx->workspace_bytes) != cudaSuccess) {
        cudaGetLastError();
        cublasLtDestroy(ctx->lt);
        free(ctx);
        return mt_errorf(err, "cannot allocate the %zu-byte cuBLASLt workspace on the GPU: "
                              "free GPU memory or pass a smaller workspace",
                         workspace_bytes);
    }
    *out = ctx;
    return 0;
}

static void plan_destroy(mt_gemm_plan *p) {
    if (!p->valid) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->ld);
    cublasLtMatmulDescDestroy(p->desc);
    p->valid = 0;
}

extern "C" void mt_cuda_ctx_free(mt_cuda_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < MT_GEMM_CACHE; i++) plan_destroy(&ctx->plans[i]);
    cudaFree(ctx->workspace);
    cublasLtDestroy(ctx->lt);
    free(ctx);
}

extern "C" cudaStream_t mt_cuda_ctx_stream(const mt_cuda_ctx *ctx) { return ctx->stream; }

extern "C" size_t mt_cuda_ctx_heuristic_queries(const mt_cuda_ctx *ctx) {
    return ctx->heuristic_queries;
}

static cudaDataType_t cuda_type(int dt) { return dt == MT_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/* Largest power of two (<= 256) dividing the address: what the algorithm
 * may assume about the pointer (cuBLASLt's default assumption is 256). */
static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 1;
    while (al < 256 && (a & (uintptr_t)(2 * al - 1)) == 0) al *= 2;
    return al;
}

/* Asks the heuristic for the best algorithm of p's descriptors; false if
 * cuBLASLt offers none. */
static bool plan_pick_algo(mt_cuda_ctx *ctx, mt_gemm_plan *p, const mt_gemm_key *key) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ctx->workspace_bytes,
        sizeof ctx->workspace_bytes));
    uint32_t al_a = (uint32_t)key->align_a, al_b = (uint32_t)key->align_b,
             al_d = (uint32_t)key->align_d;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    ctx->heuristic_queries++;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->desc, p->la, p->lb, p->ld,
                                                       p->ld, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    /* cuBLASLt answers an unsupported combination with NOT_SUPPORTED or
     * INVALID_VALUE (seen for a bf16 D with an fp32 bias). */
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
    p->algo = res.algo;
    return true;
}

static void plan_make_desc(mt_gemm_plan *p, const mt_gemm_key *key, bool bias_epilogue) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                sizeof tb));
    if (bias_epilogue) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_32F;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &epi, sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
}

static void plan_build(mt_cuda_ctx *ctx, mt_gemm_plan *p, const mt_gemm_key *key) {
    /* Stored (rows, cols) of each operand before op(). */
    int64_t ar = key->transa ? key->k : key->m, ac = key->transa ? key->m : key->k;
    int64_t br = key->transb ? key->n : key->k, bc = key->transb ? key->k : key->n;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, cuda_type(key->adt), ar, ac, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, cuda_type(key->bdt), br, bc, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, cuda_type(key->ddt), key->m, key->n,
                                            key->ldd));
    plan_make_desc(p, key, key->has_bias);
    p->bias_kernel = 0;
    bool ok = plan_pick_algo(ctx, p, key);
    if (!ok && key->has_bias) {
        /* Not every type combination takes an fp32 bias in the epilogue
         * (bf16 D does not on some versions): add it with a kernel instead. */
        cublasLtMatmulDescDestroy(p->desc);
        plan_make_desc(p, key, false);
        p->bias_kernel = 1;
        ok = plan_pick_algo(ctx, p, key);
    }
    if (!ok)
        MT_DIE("cuBLASLt has no algorithm for m=%lld n=%lld k=%lld transa=%d transb=%d "
               "types %d,%d->%d bias=%d",
               (long long)key->m, (long long)key->n, (long long)key->k, key->transa,
               key->transb, key->adt, key->bdt, key->ddt, key->has_bias);
    p->key = *key;
    p->valid = 1;
}

/* Column-major D (m, n): D[j][i] += bias[i] in fp32, stored in D's type
 * (for a bf16 D that is a second rounding, after the product's). */
template <typename T>
__global__ void add_bias_kernel(T *D, const float *bias, int64_t m, int64_t n, int64_t ldd) {
    int64_t total = m * n, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        int64_t i = t % m, j = t / m;
        D[j * ldd + i] = (T)((float)D[j * ldd + i] + bias[i]);
    }
}

/* The cached plan for key, building it (and evicting the least recently
 * used one) on a miss. */
static mt_gemm_plan *plan_get(mt_cuda_ctx *ctx, const mt_gemm_key *key) {
    mt_gemm_plan *lru = &ctx->plans[0];
    ctx->tick++;
    for (int i = 0; i < MT_GEMM_CACHE; i++) {
        mt_gemm_plan *p = &ctx->plans[i];
        if (p->valid && memcmp(&p->key, key, sizeof *key) == 0) {
            p->last_use = ctx->tick;
            return p;
        }
        if (!p->valid || (lru->valid && p->last_use < lru->last_use)) lru = p;
    }
    plan_destroy(lru);
    plan_build(ctx, lru, key);
    lru->last_use = ctx->tick;
    return lru;
}

/* mt_cuda_gemm_cm with the addend C (same layout as D; C == D to
 * accumulate, NULL for none): cuBLASLt's D = A B + C, one pass. */
static void gemm_cm_add(mt_cuda_ctx *ctx, int transa, int transb, int64_t m, int64_t n,
                        int64_t k, const void *A, int adt, int64_t lda, const void *B, int bdt,
                        int64_t ldb, const void *C, void *D, int ddt, int64_t ldd,
                        const float *bias) {
    const int accumulate = C != NULL;
    MT_ASSERT(m > 0 && n > 0 && k > 0);
    MT_ASSERT(!(accumulate && ddt == MT_DT_BF16)); /* gradients accumulate in fp32 */
    mt_gemm_key key;
    memset(&key, 0, sizeof key); /* the key is compared with memcmp: zero the padding */
    key.transa = transa;
    key.transb = transb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldd = ldd;
    key.adt = adt;
    key.bdt = bdt;
    key.ddt = ddt;
    key.has_bias = bias != NULL;
    key.accumulate = accumulate;
    key.align_a = ptr_align(A);
    key.align_b = ptr_align(B);
    key.align_d = ptr_align(D);
    mt_gemm_plan *p = plan_get(ctx, &key);
    if (bias && !p->bias_kernel)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof bias));
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(ctx->lt, p->desc, &alpha, A, p->la, B, p->lb, &beta,
                                C ? C : D, p->ld, D, p->ld, &p->algo, ctx->workspace,
                                ctx->workspace_bytes, ctx->stream));
    if (bias && p->bias_kernel) {
        int64_t blocks = MT_CEIL_DIV(m * n, (int64_t)256);
        unsigned g = (unsigned)(blocks > 65536 ? 65536 : blocks);
        if (ddt == MT_DT_BF16)
            add_bias_kernel<__nv_bfloat16><<<g, 256, 0, ctx->stream>>>((__nv_bfloat16 *)D, bias,
                                                                     m, n, ldd);
        else
            add_bias_kernel<float><<<g, 256, 0, ctx->stream>>>((float *)D, bias, m, n, ldd);
        CUDA_LAUNCH_CHECK();
    }
}

extern "C" void mt_cuda_gemm_cm(mt_cuda_ctx *ctx, int transa, int transb, int64_t m,
                                int64_t n, int64_t k, const void *A, int adt, int64_t lda,
                                const void *B, int bdt, int64_t ldb, void *D, int ddt,
                                int64_t ldd, const float *bias, int accumulate) {
    gemm_cm_add(ctx, transa, transb, m, n, k, A, adt, lda, B, bdt, ldb, accumulate ? D : NULL, D,
                ddt, ldd, bias);
}

extern "C" void mt_cuda_matmul_forward_add(mt_cuda_ctx *ctx, mt_precision prec, float *out,
                                           const void *inp, const void *w, const float *add,
                                           size_t N, size_t IC, size_t OC) {
    int dt = mt_prec_operand_dtype(prec);
    MT_ASSERT(add != NULL && (add == out || add + N * OC <= out || out + N * OC <= add));
    gemm_cm_add(ctx, 1, 0, (int64_t)OC, (int64_t)N, (int64_t)IC, w, dt, (int64_t)IC, inp, dt,
                (int64_t)IC, add, out, MT_DT_F32, (int64_t)OC, NULL);
}

extern "C" void mt_cuda_matmul_forward(mt_cuda_ctx *ctx, mt_precision prec, void *out,
                                       mt_dt out_dt, const void *inp, const void *w,
                                       const float *bias, size_t N, size_t IC, size_t OC) {
    int dt = mt_prec_operand_dtype(prec);
    MT_ASSERT(prec == MT_PREC_BF16 || out_dt == MT_DT_F32);
    mt_cuda_gemm_cm(ctx, 1, 0, (int64_t)OC, (int64_t)N, (int64_t)IC, w, dt, (int64_t)IC, inp,
                    dt, (int64_t)IC, out, out_dt, (int64_t)OC, bias, 0);
}

/* Both backward products: dinp (NULL: none) of type dinp_dt, = or += as
 * dinp_accumulate says; dw (NULL: none) +=. */
static void matmul_backward(mt_cuda_ctx *ctx, mt_precision prec, void *dinp, mt_dt dinp_dt,
                            bool dinp_accumulate, float *dw, const void *dout, const void *inp,
                            const void *w, size_t N, size_t IC, size_t OC) {
    int dt = mt_prec_operand_dtype(prec);
    if (dinp)
        mt_cuda_gemm_cm(ctx, 0, 0, (int64_t)IC, (int64_t)N, (int64_t)OC, w, dt, (int64_t)IC,
                        dout, dt, (int64_t)OC, dinp, dinp_dt, (int64_t)IC, NULL,
                        dinp_accumulate);
    if (dw)
        mt_cuda_gemm_cm(ctx, 0, 1, (int64_t)IC, (int64_t)OC, (int64_t)N, inp, dt, (int64_t)IC,
                        dout, dt, (int64_t)OC, dw, MT_DT_F32, (int64_t)IC, NULL, 1);
}

extern "C" void mt_cuda_matmul_backward_dt(mt_cuda_ctx *ctx, mt_precision prec, void *dinp,
                                           mt_dt dinp_dt, float *dw, const void *dout,
                                           const void *inp, const void *w, size_t N, size_t IC,
                                           size_t OC) {
    MT_ASSERT(dinp && (prec == MT_PREC_BF16 || dinp_dt == MT_DT_F32));
    matmul_backward(ctx, prec, dinp, dinp_dt, false, dw, dout, inp, w, N, IC, OC);
}

extern "C" void mt_cuda_matmul_backward(mt_cuda_ctx *ctx, mt_precision prec, float *dinp,
                                        bool dinp_accumulate, float *dw, const void *dout,
                                        const void *inp, const void *w, size_t N, size_t IC,
                                        size_t OC) {
    matmul_backward(ctx, prec, dinp, MT_DT_F32, dinp_accumulate, dw, dout, inp, w, N, IC, OC);
}
