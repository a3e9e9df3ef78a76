/* Fused bf16 operators of the fast bf16 path: the products write bf16 and
 * these kernels read and write bf16 (computing in fp32), as PyTorch's
 * autocast does, instead of fp32 intermediates and separate casts. */
#ifndef MT_KERNELS_OPS_FUSED_H
#define MT_KERNELS_OPS_FUSED_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* RoPE in place on bf16 x (B,T,H,HD), fp32 arithmetic; cos, sin (T,HD/2);
 * positions pos (B,T) or NULL, as mt_cuda_rope_forward. */
void mt_cuda_rope_forward_bf16(cudaStream_t s, uint16_t *x, const float *cos, const float *sin,
                               const int32_t *pos, size_t B, size_t T, size_t H, size_t HD);

/* out (B,T,H,HD) bf16 = inverse RoPE of dx (fp32): the backward of RoPE
 * fused with the cast that feeds the next bf16 product. out_ld: elements
 * from one token's row of out to the next (H * HD: dense; more: the
 * columns of an interleaved operand). */
void mt_cuda_rope_backward_to_bf16(cudaStream_t s, uint16_t *out, size_t out_ld,
                                   const float *dx, const float *cos, const float *sin,
                                   const int32_t *pos, size_t B, size_t T, size_t H, size_t HD);

/* out (rows, cols) bf16, rows out_ld elements apart, = in (rows, cols)
 * fp32 dense, rounded to nearest even. cols, out_ld multiples of 8. */
void mt_cuda_cast_rows_to_bf16(cudaStream_t s, uint16_t *out, size_t out_ld, const float *in,
                               size_t rows, size_t cols);

/* out (n) bf16 = silu(gate) * up, gate and up bf16. */
void mt_cuda_swiglu_forward_bf16(cudaStream_t s, uint16_t *out, const uint16_t *gate,
                                 const uint16_t *up, size_t n);

/* dgate, dup (n) bf16 from dout (n) fp32 and bf16 gate, up. */
void mt_cuda_swiglu_backward_bf16(cudaStream_t s, uint16_t *dgate, uint16_t *dup,
                                  const float *dout, const uint16_t *gate, const uint16_t *up,
                                  size_t n);

/* The same for Gemma's GeGLU, gelu(gate) * up: the tanh form of GELU when
 * tanh_form, else the erf form (kernels/ops/gelu.cuh); the backward's dout
 * fp32, or bf16 dout16 when dout is NULL. */
void mt_cuda_geglu_forward_bf16(cudaStream_t s, uint16_t *out, const uint16_t *gate,
                                const uint16_t *up, size_t n, int tanh_form);
void mt_cuda_geglu_backward_bf16(cudaStream_t s, uint16_t *dgate, uint16_t *dup,
                                 const float *dout, const uint16_t *dout16, const uint16_t *gate,
                                 const uint16_t *up, size_t n, int tanh_form);

#ifdef __cplusplus
}
#endif

#endif
