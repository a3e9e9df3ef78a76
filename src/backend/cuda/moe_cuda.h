/* The mixture-of-experts MLP of a decoder block on the GPU: the same
 * computation as backend/cpu/moe.h (router, softmax, top-k, experts over
 * the rows routed to them, combine, shared expert, load-balancing loss),
 * in the precision of cuda_ops.h, with no host round trip: the routing is
 * sorted and counted on the device and the experts run as grouped
 * products (moe_gemm.h).
 *
 * One mt_cuda_moe holds the device scratch of one micro-batch of N tokens
 * (the routing and the experts' activations of the last forward, which the
 * backward of the same layer and micro-batch reads) and the step's
 * load-balancing counts. Its memory is carved by the caller from its own
 * device allocation. Everything is queued on ctx's stream; every result is
 * deterministic (run twice, same bits). */
#ifndef MT_BACKEND_CUDA_MOE_CUDA_H
#define MT_BACKEND_CUDA_MOE_CUDA_H

#include "kernels/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "model/config.h"
#include "model/params.h"

typedef struct mt_cuda_moe mt_cuda_moe;

/* Device bytes mt_cuda_moe_create carves for cfg, N tokens and prec; 0 for
 * a dense model, SIZE_MAX when they do not fit a size_t or N * K passes
 * INT32_MAX (grouped rows are int32 on the device). */
size_t mt_cuda_moe_bytes(const mt_config *cfg, size_t N, mt_precision prec);

/* A module on dev, a device range of mt_cuda_moe_bytes(cfg, N, prec)
 * bytes (256-byte aligned), at most MT_MOE_MAX_EXPERTS (2048) experts.
 * NULL for a dense model. */
mt_cuda_moe *mt_cuda_moe_create(const mt_config *cfg, size_t N, mt_precision prec, void *dev);
void mt_cuda_moe_free(mt_cuda_moe *m);

/* A new step: clears the load-balancing counts. train = 0: no aux loss. */
void mt_cuda_moe_begin_step(mt_cuda_moe *m, mt_cuda_ctx *ctx, int train);

/* out (N, C) fp32 = the MoE MLP of xn (N, C, operand type of prec) with
 * layer ld's weights: w_op, the layer's range in the operand type, and
 * w32, the same range in fp32 (the router and the shared gate read it:
 * they are fp32 products in both precisions). Keeps the routing and
 * activations for the backward. */
void mt_cuda_moe_forward(mt_cuda_moe *m, mt_cuda_ctx *ctx, const mt_layer_desc *ld,
                         const void *w_op, const float *w32, const void *xn, float *out);

/* Adds the routing of the last forward to the step's counts: called once
 * per MoE layer and micro-batch in the forward pass, not in recompute. */
void mt_cuda_moe_count(mt_cuda_moe *m, mt_cuda_ctx *ctx);

/* *loss_sum (device double) += router_aux_loss_coef * aux * scale, from
 * the step's counts (complete: every forward of the step done); nothing
 * when the aux loss is off or the step is not training. The engine passes
 * scale = valid targets, so that loss_sum / valid = CE + coef * aux. */
void mt_cuda_moe_add_aux_loss(mt_cuda_moe *m, mt_cuda_ctx *ctx, double *loss_sum, double scale);

/* Backward of the last forward (same layer, same xn): dout (N, C) fp32 is
 * dL/d out; dxn (N, C) fp32 is OVERWRITTEN with dL/d xn; the layer's
 * weight gradients accumulate (+=) into g, its range in fp32. With the
 * aux loss on, the step's counts must be complete. */
void mt_cuda_moe_backward(mt_cuda_moe *m, mt_cuda_ctx *ctx, const mt_layer_desc *ld,
                          const void *w_op, const float *w32, float *g, const void *xn,
                          const float *dout, float *dxn);

#ifdef __cplusplus
}
#endif

#endif
