/* CUDA backend of the operators of backend/cpu/ops.h, callable from C.
 *
 * Same semantics, shapes and conventions as the CPU reference: row-major
 * arrays, N token rows (B*T), backward functions ACCUMULATE (+=) into
 * parameter gradients, MT_IGNORE_INDEX targets contribute nothing.
 *
 * Precision (docs/architecture.md, "Precision"): in MT_PREC_BF16 matrix products take bf16 operands
 * and accumulate in fp32; RMSNorm, softmax, RoPE, residuals, the loss and
 * every reduction stay fp32. In MT_PREC_FP32 everything is fp32 and TF32 is
 * off. bf16 buffers are passed as their 16-bit patterns (uint16_t).
 *
 * All array pointers are DEVICE pointers; work is queued on the context's
 * stream and nothing synchronises. Nothing here allocates after
 * mt_cuda_ctx_create: scratch comes from the caller, with *_scratch_*
 * functions saying how much. Every backward is deterministic: run twice on
 * the same inputs, it gives the same bits (no float atomics).
 *
 * A CUDA failure here is a broken invariant and aborts with file:line
 * (cuda_common.h); only context creation reports a recoverable error. */
#ifndef MT_KERNELS_CUDA_OPS_H
#define MT_KERNELS_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/cuda_types.h"

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MT_PREC_FP32 = 0, MT_PREC_BF16 = 1 } mt_precision;

/* Element type of one buffer. */
typedef enum { MT_DT_F32 = 0, MT_DT_BF16 = 1 } mt_dt;

/* Matrix-product operand type of a precision. */
static inline mt_dt mt_prec_operand_dtype(mt_precision p) {
    return p == MT_PREC_BF16 ? MT_DT_BF16 : MT_DT_F32;
}

/* cuBLASLt handle, its workspace, the compute stream and a small cache of
 * matmul plans (descriptors + chosen algorithm) keyed by shape. */
typedef struct mt_cuda_ctx mt_cuda_ctx;

/* Number of usable GPUs; 0 when there is no GPU or no driver. */
int mt_cuda_device_count(void);

/* workspace_bytes: cuBLASLt workspace (0 picks 64 MiB). The stream stays
 * owned by the caller. Returns -1 with a message when there is no GPU or
 * the allocation fails. */
int mt_cuda_ctx_create(mt_cuda_ctx **out, cudaStream_t stream, size_t workspace_bytes,
                       mt_error *err);
void mt_cuda_ctx_free(mt_cuda_ctx *ctx);
cudaStream_t mt_cuda_ctx_stream(const mt_cuda_ctx *ctx);
/* How many cuBLASLt heuristic queries ran so far (a steady state adds none). */
size_t mt_cuda_ctx_heuristic_queries(const mt_cuda_ctx *ctx);

/* ---- casts (round to nearest even) ---- */
void mt_cuda_cast_f32_to_bf16(mt_cuda_ctx *ctx, uint16_t *out, const float *inp, size_t n);
void mt_cuda_cast_bf16_to_f32(mt_cuda_ctx *ctx, float *out, const uint16_t *inp, size_t n);
/* The same on a stream of the caller's (a copy stream's conversions). */
void mt_cuda_cast_f32_to_bf16_on(cudaStream_t st, uint16_t *out, const float *inp, size_t n);
void mt_cuda_cast_bf16_to_f32_on(cudaStream_t st, float *out, const uint16_t *inp, size_t n);

/* ---- the attention's positions under a sliding window ----
 * out[i] = min(pos[i], window - 1) over n = M*B*T tokens (pos NULL: the
 * position in its row, i % T): query t then sees keys from max(its
 * document's start, t - window + 1), a first key non-decreasing in t as
 * the attention kernels' packed documents need (kernels/attention). */
void mt_cuda_window_positions(cudaStream_t st, int32_t *out, const int32_t *pos, size_t n,
                              int64_t T, int64_t window);

/* ---- matrix products (cuBLASLt) ----
 * Operands inp, w, dout have the operand type of prec (float or uint16_t). */

/* out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias (OC, fp32, may be NULL).
 * out_dt: MT_DT_F32, or MT_DT_BF16 (bf16 precision only) to feed the next
 * bf16 product directly. */
void mt_cuda_matmul_forward(mt_cuda_ctx *ctx, mt_precision prec, void *out, mt_dt out_dt,
                            const void *inp, const void *w, const float *bias, size_t N,
                            size_t IC, size_t OC);

/* out (N,OC) = add (N,OC) + inp @ w^T in fp32, in the product's epilogue:
 * a residual connection with no pass of its own (add and out the same
 * buffer or disjoint). */
void mt_cuda_matmul_forward_add(mt_cuda_ctx *ctx, mt_precision prec, float *out,
                                const void *inp, const void *w, const float *add, size_t N,
                                size_t IC, size_t OC);

/* dinp (N,IC) = or += dout (N,OC) @ w (OC,IC)   (dinp may be NULL)
 * dw (OC,IC) += dout^T @ inp (N,IC)             (dw may be NULL)
 * dinp_accumulate picks "=" (no zeroing needed) or "+=" as in ops.h.
 * dbias: see mt_cuda_bias_backward (it needs fp32 dout). */
void mt_cuda_matmul_backward(mt_cuda_ctx *ctx, mt_precision prec, float *dinp,
                             bool dinp_accumulate, float *dw, const void *dout,
                             const void *inp, const void *w, size_t N, size_t IC, size_t OC);

/* The same with dinp (not NULL) set in dinp_dt: MT_DT_BF16 (bf16
 * precision only) rounds the product's fp32 sums once, in its epilogue, for
 * a consumer that reads bf16 (no fp32 copy and cast). */
void mt_cuda_matmul_backward_dt(mt_cuda_ctx *ctx, mt_precision prec, void *dinp, mt_dt dinp_dt,
                                float *dw, const void *dout, const void *inp, const void *w,
                                size_t N, size_t IC, size_t OC);

/* Floats of scratch for the deterministic column sums below. */
size_t mt_cuda_colsum_scratch_floats(size_t N, size_t C);

/* dbias (OC) += column sums of dout (N,OC). */
void mt_cuda_bias_backward(mt_cuda_ctx *ctx, float *dbias, float *scratch, const float *dout,
                           size_t N, size_t OC);

/* ---- embedding ---- */

/* out (N,C) fp32 = wte[tokens[n]]; wte (V,C) of type wte_dt. */
void mt_cuda_embedding_forward(mt_cuda_ctx *ctx, float *out, const int32_t *tokens,
                               const void *wte, mt_dt wte_dt, size_t N, size_t C);

/* HOST function. Groups the rows of tokens (N) by token id for a
 * deterministic backward: order (N room) lists row indices sorted by
 * (token, row), leaving out the rows whose token is pad (nn.Embedding's
 * padding_idx; -1: none); bounds (N+1 room) gets the start of each group in
 * order, then the number of rows listed; *n_groups the number of distinct
 * tokens listed. -1 if a token is outside [0,V). The caller copies order
 * and bounds to the device. */
int mt_embedding_backward_plan(int32_t *order, int32_t *bounds, size_t *n_groups,
                               const int32_t *tokens, size_t N, size_t V, int64_t pad,
                               mt_error *err);

/* dwte (V,C) += scatter of dout (N,C) over the rows the plan lists (not
 * the padding index's). One thread block per distinct token sums its rows
 * in row order: deterministic, no atomics. order, bounds: device copies of
 * the plan above; tokens (N) on the device. */
void mt_cuda_embedding_backward(mt_cuda_ctx *ctx, float *dwte, const float *dout,
                                const int32_t *tokens, const int32_t *order,
                                const int32_t *bounds, size_t n_groups, size_t C);

/* ---- RMSNorm (C % 4 == 0, 16-byte aligned rows) ---- */

/* out (N,C) = inp / rms(inp) * w, of type out_dt; rstd (N) may be NULL, or
 * out (rstd only). */
void mt_cuda_rmsnorm_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, float *rstd,
                             const float *inp, const float *w, size_t N, size_t C, float eps);

/* A post-norm with its residual, out (N,C) = res + inp / rms(inp) * w, inp
 * of type in_dt (fp32 arithmetic), and with next the norm of that sum
 * beside it, next (N,C) of type next_dt = out / rms(out) * next_w, rstd and
 * next_rstd NULL or kept: each row read once for C % 512 == 0, the values
 * of the plain kernels one after another. out NULL (and next NULL): rstd
 * only. */
void mt_cuda_rmsnorm_residual_forward(mt_cuda_ctx *ctx, float *out, float *rstd,
                                      const void *inp, mt_dt in_dt, const float *w,
                                      const float *res,
                                      void *next, mt_dt next_dt, float *next_rstd,
                                      const float *next_w, size_t N, size_t C, float eps);

/* The same of bf16 rows into bf16 (q/k norms of the bf16 fast path). */
void mt_cuda_rmsnorm_forward_bf16(mt_cuda_ctx *ctx, uint16_t *out, float *rstd,
                                  const uint16_t *inp, const float *w, size_t N, size_t C,
                                  float eps);

/* dinp (N,C) +=, dw (C) += ; rstd from the forward; scratch of
 * mt_cuda_colsum_scratch_floats(N, C) floats. */
void mt_cuda_rmsnorm_backward(mt_cuda_ctx *ctx, float *dinp, float *dw, float *scratch,
                              const float *dout, const float *inp, const float *w,
                              const float *rstd, size_t N, size_t C);
/* The same, and dinp_op (N,C) bf16 = the updated dinp rounded (NULL: not
 * written). For C % 512 == 0 one pass over the rows does it all. */
void mt_cuda_rmsnorm_backward_op(mt_cuda_ctx *ctx, float *dinp, void *dinp_op, float *dw,
                                 float *scratch, const float *dout, const float *inp,
                                 const float *w, const float *rstd, size_t N, size_t C);
/* dinp_op (N,C) bf16 = the input gradient rounded, added to nothing (a
 * post-norm's, feeding a product), no fp32 copy; dw (C) +=; inp of type
 * in_dt. The values are mt_cuda_rmsnorm_backward_op's into zeros (of inp
 * widened to fp32). */
void mt_cuda_rmsnorm_backward_to_bf16(mt_cuda_ctx *ctx, uint16_t *dinp_op, float *dw,
                                      float *scratch, const float *dout, const void *inp,
                                      mt_dt in_dt, const float *w, const float *rstd, size_t N,
                                      size_t C);

/* ---- LayerNorm with bias (gpt_neox, falcon; C % 4 == 0, 16-byte aligned
 * rows) ---- */

/* out (N,C) = (inp - mean) * rstd * w + b, of type out_dt, as
 * mt_cpu_layernorm_forward (b may be NULL: none); mean, rstd (N) may be
 * NULL. */
void mt_cuda_layernorm_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, float *mean,
                               float *rstd, const float *inp, const float *w, const float *b,
                               size_t N, size_t C, float eps);

/* dinp (N,C) +=, dw (C) +=, db (C) += (db may be NULL); mean, rstd from the
 * forward; scratch of mt_cuda_colsum_scratch_floats(N, C) floats. */
void mt_cuda_layernorm_backward(mt_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                                float *scratch, const float *dout, const float *inp,
                                const float *w, const float *mean, const float *rstd, size_t N,
                                size_t C);

/* ---- GELU (gpt_neox, falcon): the erf form, or with tanh_form
 * transformers' tanh approximation ("gelu_new") ---- */

/* out (n) = gelu(inp), of type out_dt; inp (of type inp_dt) 16-byte
 * aligned. */
void mt_cuda_gelu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, const void *inp,
                          mt_dt inp_dt, size_t n, int tanh_form);
/* dinp (n) = dout * gelu'(inp), OVERWRITTEN, and dinp_op (n) bf16 the same
 * rounded; either may be NULL (not written), not both. inp of type inp_dt;
 * 16-byte aligned arrays. */
void mt_cuda_gelu_backward(mt_cuda_ctx *ctx, float *dinp, uint16_t *dinp_op, const float *dout,
                           const void *inp, mt_dt inp_dt, size_t n, int tanh_form);

/* ---- the fused query_key_value of gpt_neox and falcon ----
 * qkv (B*T, NKV, NH/NKV + 2, HD): per kv head its query heads, its k and
 * its v (backend/cpu/neox.c). RoPE (rotate-half) on the leading R dims of
 * each q and k head, pairs (i, i + R/2), cos, sin (T, R/2); token (b, t) at
 * position pos[b*T+t] or t when pos is NULL, as mt_cuda_rope_forward. */

/* q (B,T,NH,HD), k, v (B,T,NKV,HD) of type out_dt = the split of qkv (of
 * type qkv_dt), q and k rotated (fp32 arithmetic). */
void mt_cuda_qkv_split_rope(mt_cuda_ctx *ctx, void *q, void *k, void *v, mt_dt out_dt,
                            const void *qkv, mt_dt qkv_dt, const float *cos, const float *sin,
                            const int32_t *pos, size_t B, size_t T, size_t NH, size_t NKV,
                            size_t HD, size_t R);
/* Its backward: dqkv = the join of dq, dk, dv with dq, dk rotated back
 * (OVERWRITTEN), and dqkv_op the same in bf16; either may be NULL (not
 * written), not both. */
void mt_cuda_qkv_join_rope_backward(mt_cuda_ctx *ctx, float *dqkv, uint16_t *dqkv_op,
                                    const float *dq, const float *dk, const float *dv,
                                    const float *cos, const float *sin, const int32_t *pos,
                                    size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                                    size_t R);

/* ---- RoPE, in place on x (B,T,H,HD); cos, sin (T, HD/2); token (b, t)
 * at position pos[b*T+t] (pos (B,T) on the device, each < T: packed
 * documents), or t when pos is NULL ---- */
void mt_cuda_rope_forward(mt_cuda_ctx *ctx, float *x, const float *cos, const float *sin,
                          const int32_t *pos, size_t B, size_t T, size_t H, size_t HD);
void mt_cuda_rope_backward(mt_cuda_ctx *ctx, float *dx, const float *cos, const float *sin,
                           const int32_t *pos, size_t B, size_t T, size_t H, size_t HD);

/* ---- SwiGLU ---- */

/* out (N,F) = silu(gate) * up, of type out_dt. */
void mt_cuda_swiglu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, const float *gate,
                            const float *up, size_t N, size_t F);
/* dgate, dup (N,F) OVERWRITTEN. */
void mt_cuda_swiglu_backward(mt_cuda_ctx *ctx, float *dgate, float *dup, const float *dout,
                             const float *gate, const float *up, size_t N, size_t F);

/* ---- Gemma (ops_gemma.cu) ---- */

/* out (n) = inp * mul + add; out may alias inp. (The 1 + w of Gemma's
 * RMSNorms, the sqrt(hidden) scale of its embedding.) */
void mt_cuda_affine(mt_cuda_ctx *ctx, float *out, const float *inp, size_t n, float mul,
                    float add);

/* out (N,F) = gelu(gate) * up, of type out_dt, from gate and up of type
 * in_dt (bf16 ones give a bf16 out); gelu the tanh form with tanh_form,
 * else erf's; fp32 arithmetic. */
void mt_cuda_geglu_forward(mt_cuda_ctx *ctx, void *out, mt_dt out_dt, const void *gate,
                           const void *up, mt_dt in_dt, size_t N, size_t F, int tanh_form);
/* dgate, dup (N,F) OVERWRITTEN, of type dt as gate and up are; dout of
 * type dout_dt (bf16 only with bf16 gate and up). */
void mt_cuda_geglu_backward(mt_cuda_ctx *ctx, void *dgate, void *dup, const void *dout,
                            mt_dt dout_dt, const void *gate, const void *up, mt_dt dt, size_t N,
                            size_t F, int tanh_form);

/* ---- residual ---- */

/* out (n) = a + b; out may alias a or b. */
void mt_cuda_residual_add(mt_cuda_ctx *ctx, float *out, const float *a, const float *b,
                          size_t n);

/* ---- loss ---- */

/* Cross-entropy over logits (N,V) fp32: row_loss (N) gets each row's loss
 * (0 for ignored rows, NaN for a target outside [0,V)). If dlogits is
 * non-NULL it receives (softmax - onehot) * dscale (0 for ignored rows) and
 * may alias logits; dlogits_bf16 (N,V), may be NULL, receives the same
 * values rounded to bf16. */
void mt_cuda_cross_entropy(mt_cuda_ctx *ctx, float *dlogits, uint16_t *dlogits_bf16,
                           float *row_loss, const float *logits, const int32_t *targets,
                           size_t N, size_t V, float dscale);

/* The same with row n's gradient scaled by row_scale[n] (device, N)
 * instead of dscale (sequence objectives, engine/preference.h). */
void mt_cuda_cross_entropy_weighted(mt_cuda_ctx *ctx, float *dlogits, uint16_t *dlogits_bf16,
                                    float *row_loss, const float *logits,
                                    const int32_t *targets, const float *row_scale, size_t N,
                                    size_t V);

/* *sum (one device double) += sum of x (n), in a fixed order. */
void mt_cuda_sum_to_double(mt_cuda_ctx *ctx, double *sum, const float *x, size_t n);

/* Bytes of scratch for mt_cuda_lm_head_loss with chunks of R rows. */
size_t mt_cuda_lm_head_scratch_bytes(mt_precision prec, size_t R, size_t V);

/* Fused lm_head + cross-entropy, R rows at a time, so that the logits of
 * all N rows never exist at once. hidden (N,C) and w (V,C) have the
 * operand type of prec; targets (N). For each chunk: logits (R,V) = hidden
 * @ w^T in fp32 scratch, loss and dlogits in place, then
 *   dhidden (N,C) = or += dlogits @ w   (dhidden_accumulate; may be NULL)
 *   dw (V,C)      += dlogits^T @ hidden (may be NULL)
 * row_loss (N) receives the per-row losses and *loss_sum (device double)
 * += their sum. dscale as in mt_cpu_cross_entropy. softcap > 0: the loss
 * reads the logits as softcap * tanh(logits / softcap) (Gemma 2's
 * final_logit_softcapping) and dlogits is taken through it; 0: none. */
void mt_cuda_lm_head_loss(mt_cuda_ctx *ctx, mt_precision prec, double *loss_sum,
                          float *row_loss, float *dhidden, bool dhidden_accumulate, float *dw,
                          void *scratch, const void *hidden, const void *w,
                          const int32_t *targets, size_t N, size_t C, size_t V, size_t R,
                          float dscale, float softcap);

/* mt_cuda_lm_head_loss with row n's gradient scaled by row_scale[n]
 * (device, N) instead of dscale, and no loss sum: row_loss (N) receives
 * each row's -log p(target) (0 where ignored). With dhidden and dw NULL it
 * is a forward pass only: the targets' log-probabilities of a sequence
 * objective. softcap as in mt_cuda_lm_head_loss. */
void mt_cuda_lm_head_loss_weighted(mt_cuda_ctx *ctx, mt_precision prec, float *row_loss,
                                   float *dhidden, bool dhidden_accumulate, float *dw,
                                   void *scratch, const void *hidden, const void *w,
                                   const int32_t *targets, const float *row_scale, size_t N,
                                   size_t C, size_t V, size_t R, float softcap);

/* ---- benchmark (not a test; bench/kernels/gemm_bench.cu) ---- */

/* Times the bf16 (and one fp32) matrix products of Llama-7B-like shapes at
 * N = 16384 tokens: forward, dinp and dw; prints a TFLOP/s table to f. */
int mt_cuda_gemm_bench(FILE *f, mt_error *err);

#ifdef __cplusplus
}
#endif

#endif
