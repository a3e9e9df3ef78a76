/* Grouped matrix products of the routed experts of one MoE block, on the
 * GPU, in one launch for all experts (docs/moe.md).
 *
 * Rows are grouped by expert: expert e owns rows [start[e], start[e+1]) of
 * the R grouped rows (start: device int32 (E+1), start[0] = 0, start[E] <=
 * R; rows from start[E] on are not touched). An expert with no rows costs
 * nothing. The sizes live on the device only: nothing here reads them on
 * the host, so a caller never waits for the routing.
 *
 * Expert e's weight matrix is (OC, IC) row-major at w + e * w_stride
 * elements (the experts of a layer are w_stride apart in its range), and
 * its fp32 gradient at dw + e * dw_stride floats.
 *
 * Types follow cuda_ops.h: in MT_PREC_BF16, x, w and dy are bf16 (uint16_t
 * patterns) and products accumulate in fp32; in MT_PREC_FP32 everything is
 * fp32 and no TF32 is used. Every product is deterministic (no float
 * atomics: run twice, same bits). Nothing allocates: scratch comes from the
 * caller (mt_cuda_moe_gemm_scratch_bytes). Work is queued on ctx's stream. */
#ifndef MT_KERNELS_MOE_GEMM_H
#define MT_KERNELS_MOE_GEMM_H

#include "kernels/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of device scratch the products below need for E experts. */
size_t mt_cuda_moe_gemm_scratch_bytes(int E);

/* Whether products of these sizes run on the tensor cores: bf16, IC and
 * OC multiples of 8, and (checked per call) every pointer 16-byte aligned,
 * w_stride a multiple of 8 and dw_stride of 4. Any other product takes a
 * plain fp32-FMA path: the same contract, much slower. */
bool mt_cuda_moe_gemm_tensor_cores(mt_precision prec, size_t IC, size_t OC);

/* y (R, OC) = x (R, IC) @ W_e^T on each expert's rows; y_dt MT_DT_F32, or
 * MT_DT_BF16 in bf16 precision. */
void mt_cuda_moe_gemm_forward(mt_cuda_ctx *ctx, mt_precision prec, void *y, mt_dt y_dt,
                              const void *x, const void *w, size_t w_stride,
                              const int32_t *start, int E, size_t R, size_t IC, size_t OC,
                              void *scratch);

/* dx (R, IC) = (or += when accumulate) dy (R, OC) @ W_e on each expert's
 * rows; dx is fp32. */
void mt_cuda_moe_gemm_dinp(mt_cuda_ctx *ctx, mt_precision prec, float *dx, bool accumulate,
                           const void *dy, const void *w, size_t w_stride,
                           const int32_t *start, int E, size_t R, size_t IC, size_t OC,
                           void *scratch);

/* dW_e (OC, IC) += dy_e^T @ x_e over expert e's rows, at dw + e * dw_stride;
 * an expert with no rows keeps its gradient. */
void mt_cuda_moe_gemm_dw(mt_cuda_ctx *ctx, mt_precision prec, float *dw, size_t dw_stride,
                         const void *dy, const void *x, const int32_t *start, int E,
                         size_t R, size_t IC, size_t OC, void *scratch);

/* The tensor-core kernel the products take: AUTO, the best the device has
 * (wgmma on sm_90 when the build has sm_90a code, else mma.sync); MMA, the
 * mma.sync kernel on every GPU (so that tests cover both on Hopper).
 * Process-wide; returns the previous choice. */
typedef enum { MT_CUDA_MOE_KERNEL_AUTO, MT_CUDA_MOE_KERNEL_MMA } mt_cuda_moe_kernel;
mt_cuda_moe_kernel mt_cuda_moe_gemm_use(mt_cuda_moe_kernel k);

/* The name of the tensor-core kernel that the current choice takes on the
 * current device: "wgmma" or "mma.sync". */
const char *mt_cuda_moe_gemm_kernel_name(void);

/* Benchmark (a program, never a test: `megatrain bench moe-gemm`;
 * bench/kernels/moe_gemm_bench.cu): prints
 * TFLOP/s of the three bf16 products on the expert shapes of Qwen3-30B-A3B
 * and Mixtral-8x7B, through the kernel the products take, through the
 * mma.sync kernel when that is another one, and through cuBLAS called
 * once per expert. bk (32 or 64) and stages (2..5): the mma.sync kernel's
 * k step and pipeline depth, 0 for its own choice. */
int mt_cuda_moe_gemm_bench(FILE *f, int bk, int stages, mt_error *err);

#ifdef __cplusplus
}
#endif

#endif
