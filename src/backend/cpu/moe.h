/* The mixture-of-experts MLP of a decoder block on the CPU, fp32, forward
 * and backward, as transformers computes Mixtral, Qwen2-MoE and Qwen3-MoE
 * (docs/moe.md):
 *
 *   z = xn Wr^T (N, E)          router logits
 *   p = softmax(z)              per token, over the E experts
 *   S = the K largest p         selection, not differentiated
 *   w_j = p_j / sum_S p  (mixtral, or norm_topk_prob)  else  w_j = p_j
 *   out = sum_j w_j * down_j(silu(gate_j(xn)) * up_j(xn))
 *       + sigmoid(xn . wsg) * down_s(silu(gate_s(xn)) * up_s(xn))  (shared, qwen2_moe)
 *
 * The load-balancing loss of transformers' load_balancing_loss_func over
 * every MoE block and token of the step: with R rows (MoE blocks x tokens),
 * cnt_e the top-K selections of expert e and P_e the sum of p_e over those
 * rows, aux = E * sum_e (cnt_e / R) * (P_e / R); the step's loss adds
 * router_aux_loss_coef * aux, and p_e of each row receives the gradient
 * coef * E * cnt_e / R^2 (cnt is not differentiated).
 *
 * One mt_cpu_moe holds the scratch of one micro-batch of N tokens (the
 * routing and the experts' activations of the last forward, which the
 * backward of the same layer and micro-batch reads) and the step's
 * load-balancing counts. */
#ifndef MT_BACKEND_CPU_MOE_H
#define MT_BACKEND_CPU_MOE_H

#include <stddef.h>

#include "model/config.h"
#include "model/params.h"

typedef struct mt_cpu_moe mt_cpu_moe;

/* Bytes mt_cpu_moe_create allocates for cfg and N tokens; 0 for a dense
 * model, -1 (SIZE_MAX) when they do not fit a size_t. */
size_t mt_cpu_moe_bytes(const mt_config *cfg, size_t N);

/* Scratch for micro-batches of N tokens; NULL for a dense model. */
mt_cpu_moe *mt_cpu_moe_create(const mt_config *cfg, size_t N);
void mt_cpu_moe_free(mt_cpu_moe *m);

/* A new step: clears the load-balancing counts. train = 0: no aux loss. */
void mt_cpu_moe_begin_step(mt_cpu_moe *m, int train);

/* out (N, C) = the MoE MLP of xn (N, C) with the weights of layer ld,
 * whose range starts at w. Keeps the routing and activations. */
void mt_cpu_moe_forward(mt_cpu_moe *m, const mt_layer_desc *ld, const float *w,
                        const float *xn, float *out);

/* Adds the routing of the last forward to the step's counts: called once
 * per MoE layer and micro-batch in the forward pass, not in recompute. */
void mt_cpu_moe_count(mt_cpu_moe *m);

/* router_aux_loss_coef * aux of the step's counts; 0 when the aux loss is
 * off or the step is not training. */
double mt_cpu_moe_aux_loss(const mt_cpu_moe *m);

/* Backward of the last forward (same layer, same xn): dout (N, C) is
 * dL/d out; dxn (N, C) += dL/d xn; the layer's weight gradients
 * accumulate into its range starting at g. With the aux loss on, the
 * step's counts must be complete (every forward of the step done). */
void mt_cpu_moe_backward(mt_cpu_moe *m, const mt_layer_desc *ld, const float *w, float *g,
                         const float *xn, const float *dout, float *dxn);

#endif
