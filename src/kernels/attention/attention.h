/* Fused causal grouped-query attention on the GPU (flash-attention style).
 *
 * Same function as mt_cpu_attention_forward/backward (backend/cpu/ops.h):
 * q (B,T,NH,HD), k and v (B,T,NKV,HD), out (B,T,NH,HD), lse (B,NH,T) the
 * natural-log sum-exp of each row of scores (mt_attn_scores: q.k * scale,
 * scale 1/sqrt(HD) by default, optionally soft-capped), causal, query head
 * h reads kv head h / (NH/NKV). No function here ever holds more
 * than one tile of scores per thread block: memory is O(B*T*NH*HD).
 *
 * Packed documents: pos (B,T), a device array, holds each token's position
 * within its document (the contract of mt_batch.pos, which engine/step.c
 * checks: every row starts at 0, each next is 0 or the previous + 1).
 * Query t of row b then sees keys t - pos[b*T+t] .. t only; tiles wholly
 * outside every row's document are skipped, partial ones masked. What the
 * kernels need is only that this first key t - pos[b*T+t] never decreases
 * in t: positions clamped to window - 1 (mt_cuda_window_positions) keep
 * that, and give a sliding window of `window` keys. pos NULL: one causal
 * sequence per row, by kernels compiled without any document test (the
 * code of the unpacked path does not change).
 *
 * Two precisions:
 *  - bf16: q, k, v, dout, out are bf16 (passed as their 16-bit patterns);
 *    tensor cores (wgmma on Hopper, mma.sync m16n8k16 elsewhere; fp32
 *    accumulation), online softmax in fp32. lse and the gradients dq, dk,
 *    dv are fp32. HD = 64 or 128 everywhere; 80 and 96 on the wgmma
 *    kernels, which run them as 128 with the columns past HD read as zeros
 *    (TMA fills them) and never written; 256 on the mma.sync kernels, on
 *    Hopper too, where a block may have their ~200 KB of shared memory
 *    (not an A100's 163 KB) (mt_attn_bf16_supports). Soft-capped scores
 *    use a fast tanh (ex2 and rcp, absolute error < 4e-7, times the cap).
 *  - f32: everything fp32, plain FMA (no tensor cores, no TF32); HD <= 256;
 *    soft-capping with tanhf.
 *
 * Backward (both precisions) is deterministic: dk, dv come from a kernel
 * parallel over key blocks (one block owns its keys for every query head of
 * its kv group, so no atomics), dq from a second kernel parallel over query
 * blocks that recomputes the probabilities. dq, dk, dv are OVERWRITTEN.
 * The backward needs scratch of mt_attn_backward_scratch_bytes() bytes.
 *
 * All pointers are device pointers; work is queued on `stream` and nothing
 * is synchronised. Errors (bad shapes, launch failures) return -1 with a
 * message in err. */
#ifndef MT_KERNELS_ATTENTION_H
#define MT_KERNELS_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_types.h"

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The bf16 kernels, forward and backward: AUTO, the best the device has
 * (on sm_90 with sm_90a code in the build and a driver with TMA tensor
 * maps, the wgmma kernels; else mma.sync);
 * MMA, the mma.sync kernels everywhere (so that tests cover both on
 * Hopper). Process-wide; returns the previous choice. */
typedef enum { MT_ATTN_KERNEL_AUTO, MT_ATTN_KERNEL_MMA } mt_attn_kernel;
mt_attn_kernel mt_attn_use(mt_attn_kernel k);
/* "wgmma" or "mma.sync": the bf16 kernels of the current choice and device. */
const char *mt_attn_kernel_name(void);
/* Whether the bf16 kernels of the current choice and device take head dim HD. */
bool mt_attn_bf16_supports(size_t HD);

/* The Hopper kernels run persistent grids, a block an SM. The forward's
 * blocks claim query tiles from a counter of the current device, and the
 * backward's dK/dV blocks their (key tile, kv head) items from another, so
 * forward calls on one device must not overlap one another, nor backward
 * calls one another (issue them on one stream, as the engine does on its
 * compute stream, or order them). n > 0 caps the grids at n blocks (the
 * tests give each block many items that way), 0 lifts the cap.
 * Process-wide; returns the previous cap. */
int mt_attn_set_grid_cap(int n);

/* How the scores are formed before the softmax: s = q.k * scale (0: the
 * default 1/sqrt(HD)), then, softcap > 0, softcap * tanh(s / softcap)
 * (Gemma 2's attention logit soft-capping; 0: none); every kernel, both
 * precisions, packed or not, takes both. The backward's gradients go
 * through the cap (its derivative 1 - tanh^2). A negative, NaN or infinite
 * value of either is an error. NULL everywhere below means both defaults. */
typedef struct mt_attn_scores {
    float scale, softcap;
} mt_attn_scores;

/* Bytes of device scratch the backward needs: one fp32 per (b, h, t). */
size_t mt_attn_backward_scratch_bytes(size_t B, size_t T, size_t NH);

/* out (B,T,NH,HD) bf16; out_f32 (B,T,NH,HD) fp32 copy of the same values
 * before rounding, or NULL; lse (B,NH,T). */
int mt_attn_forward_bf16(uint16_t *out, float *out_f32, float *lse, const uint16_t *q,
                         const uint16_t *k, const uint16_t *v, const int32_t *pos,
                         const mt_attn_scores *sc, size_t B, size_t T, size_t NH, size_t NKV,
                         size_t HD, cudaStream_t stream, mt_error *err);

/* dq (B,T,NH,HD), dk dv (B,T,NKV,HD) fp32, overwritten. out is the bf16
 * output of the forward, lse its lse. scratch: see above. */
int mt_attn_backward_bf16(float *dq, float *dk, float *dv, void *scratch, const uint16_t *dout,
                          const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          const uint16_t *out, const float *lse, const int32_t *pos,
                          const mt_attn_scores *sc, size_t B, size_t T, size_t NH, size_t NKV,
                          size_t HD, cudaStream_t stream, mt_error *err);

int mt_attn_forward_f32(float *out, float *lse, const float *q, const float *k, const float *v,
                        const int32_t *pos, const mt_attn_scores *sc, size_t B, size_t T,
                        size_t NH, size_t NKV, size_t HD, cudaStream_t stream, mt_error *err);

int mt_attn_backward_f32(float *dq, float *dk, float *dv, void *scratch, const float *dout,
                         const float *q, const float *k, const float *v, const float *out,
                         const float *lse, const int32_t *pos, const mt_attn_scores *sc,
                         size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                         cudaStream_t stream, mt_error *err);

#ifdef __cplusplus
}
#endif

#endif
