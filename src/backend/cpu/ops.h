/* CPU reference operators, fp32, forward and backward.
 *
 * These are the reference every other backend is tested against: plain
 * loops, OpenMP over the outer (row) loop, no cleverness that could hide a
 * bug. All arrays are row-major fp32. N is the number of token rows (B*T).
 * Backward functions ACCUMULATE (+=) into parameter gradients and into
 * input gradients marked "+=", so that a layer's gradient can be summed
 * over micro-batches in place. */
#ifndef MT_BACKEND_CPU_OPS_H
#define MT_BACKEND_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#define MT_IGNORE_INDEX (-100)

/* out (N,C) = wte[tokens[n]] */
void mt_cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                              size_t N, size_t C);
/* dwte (V,C) += scatter of dout (N,C), leaving out the rows whose token is
 * pad (nn.Embedding's padding_idx: its row gets no gradient from the lookup);
 * pad -1: none. */
void mt_cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens,
                               size_t N, size_t C, int64_t pad);

/* out (N,C) = inp / rms(inp) * w; rstd (N) may be NULL. */
void mt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
                            size_t N, size_t C, float eps);
/* dinp (N,C) +=, dw (C) += ; rstd from the forward. */
void mt_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, size_t N, size_t C);

/* The same with the weight 1 + w (Gemma's norms, whose w starts at 0):
 * out = inp / rms(inp) * (1 + w); dw is still dL/dw. */
void mt_cpu_rmsnorm1p_forward(float *out, float *rstd, const float *inp, const float *w,
                              size_t N, size_t C, float eps);
void mt_cpu_rmsnorm1p_backward(float *dinp, float *dw, const float *dout, const float *inp,
                               const float *w, const float *rstd, size_t N, size_t C);

/* LayerNorm with bias: out (N,C) = (inp - mean) * rstd * w + b; mean,
 * rstd (N) may be NULL. */
void mt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, size_t N, size_t C, float eps);
/* dinp (N,C) +=, dw (C) +=, db (C) += ; mean, rstd from the forward. */
void mt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, size_t N, size_t C);

/* out (n) = gelu(inp): the erf form, or with tanh_form the tanh
 * approximation (transformers' "gelu_new"). */
void mt_cpu_gelu_forward(float *out, const float *inp, size_t n, int tanh_form);
/* dinp (n) = dout * gelu'(inp), OVERWRITTEN. */
void mt_cpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n,
                          int tanh_form);

/* out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias (OC, may be NULL) */
void mt_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                           size_t N, size_t IC, size_t OC);
/* dinp (N,IC) += (may be NULL), dw (OC,IC) +=, dbias (OC) += (may be NULL) */
void mt_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, size_t N, size_t IC, size_t OC);

/* Rotary embedding in place on x (B,T,H,HD), rotate-half convention of
 * Hugging Face: pairs (i, i + HD/2). cos, sin: (T, HD/2), from
 * mt_rope_tables. Token (b, t) is rotated for position pos[b*T + t] (each
 * < T), or t when pos is NULL. backward applies the inverse rotation to dx
 * in place. */
void mt_cpu_rope_forward(float *x, const float *cos, const float *sin, const int32_t *pos,
                         size_t B, size_t T, size_t H, size_t HD);
void mt_cpu_rope_backward(float *dx, const float *cos, const float *sin, const int32_t *pos,
                          size_t B, size_t T, size_t H, size_t HD);
/* The same on the leading R (even, <= HD) dims of each head only, pairs
 * (i, i + R/2), the rest passed through (GPT-NeoX's rotary_pct); cos, sin
 * (T, R/2). */
void mt_cpu_rope_partial_forward(float *x, const float *cos, const float *sin,
                                 const int32_t *pos, size_t B, size_t T, size_t H, size_t HD,
                                 size_t R);
void mt_cpu_rope_partial_backward(float *dx, const float *cos, const float *sin,
                                  const int32_t *pos, size_t B, size_t T, size_t H, size_t HD,
                                  size_t R);

/* Causal grouped-query attention. q (B,T,NH,HD), k and v (B,T,NKV,HD),
 * out (B,T,NH,HD), lse (B,NH,T) the log-sum-exp of each scaled score row,
 * saved for the backward. Scale 1/sqrt(HD). Query head h uses kv head
 * h / (NH/NKV). pos (B,T), the positions of packed documents (see
 * mt_batch), or NULL: query t of row b sees keys t - pos[b*T + t] .. t,
 * its own document's (keys 0..t without pos). Per thread it holds one row
 * of scores and one head's keys (HD*T floats; and values, in the
 * backward), allocated per call. */
void mt_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *pos, size_t B, size_t T,
                              size_t NH, size_t NKV, size_t HD);
/* dq, dk, dv are OVERWRITTEN (same shapes as q, k, v). */
void mt_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const int32_t *pos,
                               size_t B, size_t T, size_t NH, size_t NKV, size_t HD);

/* What an attention differs in from the plain one above (Gemma): NULL or
 * zeros are the plain one. */
typedef struct mt_cpu_attn_opts {
    float scale;    /* scores q.k * scale; 0: 1/sqrt(HD) */
    float softcap;  /* scores become softcap * tanh(s / softcap) before the softmax; 0: none */
    size_t window;  /* query t sees keys j with t - j < window (and its document's); 0: all */
} mt_cpu_attn_opts;

/* mt_cpu_attention_forward and _backward with opts (may be NULL). */
void mt_cpu_attention_forward_opts(float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *pos, size_t B, size_t T,
                                   size_t NH, size_t NKV, size_t HD,
                                   const mt_cpu_attn_opts *opts);
void mt_cpu_attention_backward_opts(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *out, const float *lse, const int32_t *pos,
                                    size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                                    const mt_cpu_attn_opts *opts);

/* out (N,F) = silu(gate) * up */
void mt_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t N, size_t F);
/* dgate, dup (N,F) OVERWRITTEN */
void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t N, size_t F);

/* Cross-entropy over logits (N,V) with integer targets (N); rows whose
 * target is MT_IGNORE_INDEX contribute nothing. Returns the SUM of the
 * per-row losses (double). If dlogits is non-NULL it receives
 * (softmax - onehot) * dscale for valid rows and 0 for ignored rows;
 * dlogits may alias logits. Callers pass dscale = 1 / (valid tokens in the
 * whole optimizer step) to get the mean loss's gradient. */
double mt_cpu_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                            size_t N, size_t V, float dscale);

/* The same with a scale per row (sequence objectives, engine/preference.h):
 * dlogits (may be NULL) row n is (softmax - onehot) * w[n] (w may be NULL
 * when dlogits is); nll (may be NULL) receives each row's loss, -log p of
 * its target, 0 for ignored rows. Returns the sum of nll. */
double mt_cpu_cross_entropy_weighted(float *dlogits, float *nll, const float *logits,
                                     const int32_t *targets, const float *w, size_t N,
                                     size_t V);

#endif
