/* Checks for CUDA runtime, cuBLAS(Lt) and kernel-launch errors.
 *
 * A failing CUDA call in megatrain is a broken invariant (bad pointer, bad
 * launch configuration, device lost): the macros print the statement, file,
 * line and the library's message, then abort through mt_die. Usable from C
 * (host code, tests) and from the .cu files. */
#ifndef MT_KERNELS_CUDA_COMMON_H
#define MT_KERNELS_CUDA_COMMON_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kernels/cuda_ops.h" /* brings util/error.h with C linkage */

#define CUDA_CHECK(stmt)                                                          \
    do {                                                                          \
        cudaError_t mt_cuda_err_ = (stmt);                                        \
        if (mt_cuda_err_ != cudaSuccess)                                          \
            mt_die(__FILE__, __LINE__, "CUDA error in '%s': %s (%s)", #stmt,      \
                   cudaGetErrorString(mt_cuda_err_), cudaGetErrorName(mt_cuda_err_)); \
    } while (0)

#define CUBLAS_CHECK(stmt)                                                        \
    do {                                                                          \
        cublasStatus_t mt_cublas_st_ = (stmt);                                    \
        if (mt_cublas_st_ != CUBLAS_STATUS_SUCCESS)                               \
            mt_die(__FILE__, __LINE__, "cuBLAS error in '%s': %s (%d)", #stmt,    \
                   cublasLtGetStatusString(mt_cublas_st_), (int)mt_cublas_st_);   \
    } while (0)

/* After a <<<...>>> launch: catches bad configurations at once (asynchronous
 * faults surface at the next synchronising call, through CUDA_CHECK). */
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* Ceiling division for grid sizes. */
#define MT_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* What identifies one cuBLASLt matmul plan: column-major problem shape,
 * operand layouts and types, epilogue, and the pointer alignments the
 * chosen algorithm may rely on. */
typedef struct mt_gemm_key {
    int transa, transb;
    int64_t m, n, k, lda, ldb, ldd;
    int adt, bdt, ddt;        /* mt_dt */
    int has_bias, accumulate; /* beta = 1 when accumulate */
    int align_a, align_b, align_d;
} mt_gemm_key;

typedef struct mt_gemm_plan {
    mt_gemm_key key;
    int valid;
    int bias_kernel; /* the epilogue cannot take the bias: a kernel adds it */
    uint64_t last_use;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} mt_gemm_plan;

#define MT_GEMM_CACHE 48

struct mt_cuda_ctx {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    mt_gemm_plan plans[MT_GEMM_CACHE]; /* least recently used is replaced */
    uint64_t tick;
    size_t heuristic_queries;
};

/* Column-major D (m,n) = op(A) op(B) (+ bias over rows of D) (+ D when
 * accumulate). Used by every matrix product of the backend. */
#ifdef __cplusplus
extern "C"
#endif
void mt_cuda_gemm_cm(struct mt_cuda_ctx *ctx, int transa, int transb, int64_t m, int64_t n,
                     int64_t k, const void *A, int adt, int64_t lda, const void *B, int bdt,
                     int64_t ldb, void *D, int ddt, int64_t ldd, const float *bias,
                     int accumulate);

#endif
