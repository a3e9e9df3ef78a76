/* CPU backend: runs the layer templates of a Llama-family decoder with the
 * reference operators of ops.h; a GPT-NeoX or Falcon block is neox.c's, a
 * Gemma one gemma.c's (the embedding's scale, the final norm's 1 + w and the
 * logits' soft-cap are here).
 *
 * Memory, all allocated at creation:
 *   saved (n_layers, M, N, C)  input of every layer for every micro-batch, saved
 *                               by the forward for the backward
 *   dx    (M, N, C)            residual-stream gradient per micro-batch
 *   acts                        one layer's activations for one micro-batch,
 *                               refilled by the recompute in backward. */
#include "backend/cpu/backend_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemma.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/neox.h"
#include "backend/cpu/ops.h"
#include "model/rope.h"
#include "util/mem.h"
#include "util/sys.h"

#define HEAD_CHUNK 256 /* rows of logits held at once by the head */

typedef struct block_acts {
    float *xn1, *rstd1;     /* (N, C), (N) */
    float *q, *k, *v;       /* (N, NH*HD), (N, NKV*HD) x2, after q/k norm and RoPE */
    float *qpre, *kpre;     /* before q/k norm (qwen3); rstd of it */
    float *qrstd, *krstd;   /* (N*NH), (N*NKV) */
    float *att, *lse;       /* (N, NH*HD), (B, NH, T) */
    float *xmid;            /* (N, C) residual after attention */
    float *xn2, *rstd2;     /* (N, C), (N) */
    float *gate, *up, *mlp; /* (N, F) */
} block_acts;

typedef struct block_grads {
    float *dbig1, *dbig2, *dbig3; /* (N, F) */
    float *dq, *dk, *dv;    /* like q, k, v */
    float *dqn, *dkn;       /* q/k gradients before RoPE (qwen3 norm input) */
    float *datt;            /* (N, NH*HD) */
    float *dxn;             /* (N, C) */
} block_grads;

typedef struct cpu_backend {
    mt_backend base;
    const mt_config *cfg;
    const mt_param_table *t;
    mt_host_store *store;
    int max_M;
    int64_t B, T, N;
    float *cos, *sin;       /* (T, HD/2) */
    float *saved;           /* (n_layers, M, N, C) */
    float *dx;              /* (M, N, C) */
    block_acts a;
    block_grads d;
    float *logits;          /* (HEAD_CHUNK, V) */
    float *xf, *rstdf;      /* (N, C), (N) final norm output */
    float *meanf;           /* (N) the final LayerNorm's mean (gpt_neox, falcon) */
    mt_cpu_moe *moe;        /* MoE blocks' scratch (moe.h), NULL for a dense model */
    mt_cpu_neox *neox;      /* GPT-NeoX blocks (neox.h), NULL for another family */
    mt_cpu_gemma *gemma;    /* Gemma blocks (gemma.h), NULL for another family */
    float *tanh_logits;     /* (HEAD_CHUNK, V) tanh(logits / cap) of a final soft-cap */
    /* per step */
    const mt_batch *batch;
    float dscale;
    int train;
    double loss_sum;
    /* bound layer */
    float *w, *g;
    mt_cpu_step_hooks hooks;
    int hook_failed;        /* a hook failed this step: its error is hook_err */
    mt_error hook_err;
} cpu_backend;

static float *saved_at(cpu_backend *cb, int layer, int mb) {
    size_t per = (size_t)cb->N * cb->cfg->C;
    return cb->saved + ((size_t)layer * cb->max_M + mb) * per;
}

static float *dx_at(cpu_backend *cb, int mb) {
    return cb->dx + (size_t)mb * cb->N * cb->cfg->C;
}

static float *W(cpu_backend *cb, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    return mt_layer_tensor(cb->w + ld->offset, ld, r);
}

static float *G(cpu_backend *cb, int layer, mt_role r) {
    const mt_layer_desc *ld = &cb->t->layers[layer];
    return mt_layer_tensor(cb->g + ld->offset, ld, r);
}

static int cpu_begin_step(mt_backend *be, const mt_batch *batch, float dscale, int train,
                          mt_error *err) {
    cpu_backend *cb = (cpu_backend *)be;
    cb->hook_failed = 0;
    if (cb->hooks.before && cb->hooks.before(cb->hooks.ctx, train, err)) return -1;
    if (batch->M > cb->max_M || batch->B != cb->B || batch->T != cb->T)
        return mt_errorf(err, "batch of %d x (%lld, %lld) does not match the backend's "
                         "%d x (%lld, %lld)", batch->M, (long long)batch->B, (long long)batch->T,
                         cb->max_M, (long long)cb->B, (long long)cb->T);
    int64_t n = (int64_t)batch->M * batch->B * batch->T;
    for (int64_t i = 0; i < n; i++)
        if (batch->tokens[i] < 0 || batch->tokens[i] >= cb->cfg->V ||
            (batch->targets[i] != MT_IGNORE_INDEX &&
             (batch->targets[i] < 0 || batch->targets[i] >= cb->cfg->V)))
            return mt_errorf(err, "token id out of range [0, %lld) at position %lld of the "
                             "batch; the tokenizer does not match the model's vocab_size",
                             (long long)cb->cfg->V, (long long)i);
    cb->batch = batch;
    cb->dscale = dscale;
    cb->train = train;
    cb->loss_sum = 0;
    /* Gradients accumulate over micro-batches and, with tied embeddings,
     * over the head and the embedding: clear them all once per step. */
    if (train) memset(cb->store->g, 0, cb->t->total * sizeof(float));
    if (cb->moe) mt_cpu_moe_begin_step(cb->moe, train);
    return 0;
}

static void cpu_bind_layer(mt_backend *be, int layer, int backward) {
    cpu_backend *cb = (cpu_backend *)be;
    /* The host store is the CPU's memory: binding is pointing. */
    cb->w = cb->store->w;
    cb->g = cb->store->g;
}

/* Forward of decoder block `layer` for one micro-batch, keeping every
 * activation the backward needs in cb->a. pos: the micro-batch's token
 * positions, or NULL (see mt_batch). */
static void block_forward(cpu_backend *cb, int layer, const int32_t *pos, const float *x,
                          float *out) {
    const mt_config *c = cb->cfg;
    block_acts *a = &cb->a;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    if (cb->neox) {
        const mt_layer_desc *ld = &cb->t->layers[layer];
        mt_cpu_neox_forward(cb->neox, ld, cb->w + ld->offset, pos, x, out);
        return;
    }
    if (cb->gemma) {
        const mt_layer_desc *ld = &cb->t->layers[layer];
        mt_cpu_gemma_forward(cb->gemma, ld->block, ld, cb->w + ld->offset, pos, x, out);
        return;
    }
    mt_cpu_rmsnorm_forward(a->xn1, a->rstd1, x, W(cb, layer, MT_T_ATTN_NORM), N, C, c->rms_eps);
    float *q = c->qk_norm ? a->qpre : a->q, *k = c->qk_norm ? a->kpre : a->k;
    mt_cpu_matmul_forward(q, a->xn1, W(cb, layer, MT_T_WQ), W(cb, layer, MT_T_BQ), N, C, Q);
    mt_cpu_matmul_forward(k, a->xn1, W(cb, layer, MT_T_WK), W(cb, layer, MT_T_BK), N, C, KV);
    mt_cpu_matmul_forward(a->v, a->xn1, W(cb, layer, MT_T_WV), W(cb, layer, MT_T_BV), N, C, KV);
    if (c->qk_norm) {
        mt_cpu_rmsnorm_forward(a->q, a->qrstd, a->qpre, W(cb, layer, MT_T_QNORM), N * c->NH,
                               c->HD, c->rms_eps);
        mt_cpu_rmsnorm_forward(a->k, a->krstd, a->kpre, W(cb, layer, MT_T_KNORM), N * c->NKV,
                               c->HD, c->rms_eps);
    }
    mt_cpu_rope_forward(a->q, cb->cos, cb->sin, pos, cb->B, cb->T, c->NH, c->HD);
    mt_cpu_rope_forward(a->k, cb->cos, cb->sin, pos, cb->B, cb->T, c->NKV, c->HD);
    mt_cpu_attn_opts win = {.window = (size_t)c->sliding_window}; /* Mistral's, Phi-3's */
    mt_cpu_attention_forward_opts(a->att, a->lse, a->q, a->k, a->v, pos, cb->B, cb->T, c->NH,
                                  c->NKV, c->HD, &win);
    mt_cpu_matmul_forward(a->xmid, a->att, W(cb, layer, MT_T_WO), NULL, N, Q, C);
    for (size_t i = 0; i < N * C; i++) a->xmid[i] += x[i];
    mt_cpu_rmsnorm_forward(a->xn2, a->rstd2, a->xmid, W(cb, layer, MT_T_MLP_NORM), N, C, c->rms_eps);
    const mt_layer_desc *ld = &cb->t->layers[layer];
    if (ld->n_experts) {
        mt_cpu_moe_forward(cb->moe, ld, cb->w + ld->offset, a->xn2, out);
    } else {
        mt_cpu_matmul_forward(a->gate, a->xn2, W(cb, layer, MT_T_WGATE), NULL, N, C, F);
        mt_cpu_matmul_forward(a->up, a->xn2, W(cb, layer, MT_T_WUP), NULL, N, C, F);
        mt_cpu_swiglu_forward(a->mlp, a->gate, a->up, N, F);
        mt_cpu_matmul_forward(out, a->mlp, W(cb, layer, MT_T_WDOWN), NULL, N, F, C);
    }
    for (size_t i = 0; i < N * C; i++) out[i] += a->xmid[i];
}

/* Backward of decoder block `layer`: dx holds dL/d(output) on entry and
 * dL/d(input) on exit; cb->a must hold this layer's forward activations. */
static void block_backward(cpu_backend *cb, int layer, const int32_t *pos, const float *x,
                           float *dx) {
    const mt_config *c = cb->cfg;
    block_acts *a = &cb->a;
    block_grads *d = &cb->d;
    size_t N = cb->N, C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    const mt_layer_desc *ld = &cb->t->layers[layer];
    if (cb->neox) {
        mt_cpu_neox_backward(cb->neox, ld, cb->w + ld->offset, cb->g + ld->offset, pos, x, dx);
        return;
    }
    if (cb->gemma) {
        mt_cpu_gemma_backward(cb->gemma, ld->block, ld, cb->w + ld->offset, cb->g + ld->offset,
                              pos, x, dx);
        return;
    }

    /* MLP: out = xmid + down(silu(gate) * up), or the experts' mixture */
    memset(d->dxn, 0, N * C * sizeof(float));
    if (ld->n_experts) {
        mt_cpu_moe_backward(cb->moe, ld, cb->w + ld->offset, cb->g + ld->offset, a->xn2, dx,
                            d->dxn);
    } else {
        memset(d->dbig1, 0, N * F * sizeof(float));
        mt_cpu_matmul_backward(d->dbig1, G(cb, layer, MT_T_WDOWN), NULL, dx, a->mlp,
                               W(cb, layer, MT_T_WDOWN), N, F, C);
        mt_cpu_swiglu_backward(d->dbig2, d->dbig3, d->dbig1, a->gate, a->up, N, F);
        mt_cpu_matmul_backward(d->dxn, G(cb, layer, MT_T_WGATE), NULL, d->dbig2, a->xn2,
                               W(cb, layer, MT_T_WGATE), N, C, F);
        mt_cpu_matmul_backward(d->dxn, G(cb, layer, MT_T_WUP), NULL, d->dbig3, a->xn2,
                               W(cb, layer, MT_T_WUP), N, C, F);
    }
    /* dx now becomes dL/d(xmid): the residual path plus the norm's input. */
    mt_cpu_rmsnorm_backward(dx, G(cb, layer, MT_T_MLP_NORM), d->dxn, a->xmid,
                            W(cb, layer, MT_T_MLP_NORM), a->rstd2, N, C);

    /* Attention: xmid = x + o_proj(att) */
    memset(d->datt, 0, N * Q * sizeof(float));
    mt_cpu_matmul_backward(d->datt, G(cb, layer, MT_T_WO), NULL, dx, a->att, W(cb, layer, MT_T_WO),
                           N, Q, C);
    mt_cpu_attn_opts win = {.window = (size_t)c->sliding_window};
    mt_cpu_attention_backward_opts(d->dq, d->dk, d->dv, d->datt, a->q, a->k, a->v, a->att,
                                   a->lse, pos, cb->B, cb->T, c->NH, c->NKV, c->HD, &win);
    mt_cpu_rope_backward(d->dq, cb->cos, cb->sin, pos, cb->B, cb->T, c->NH, c->HD);
    mt_cpu_rope_backward(d->dk, cb->cos, cb->sin, pos, cb->B, cb->T, c->NKV, c->HD);
    float *dq = d->dq, *dk = d->dk;
    if (c->qk_norm) {
        memset(d->dqn, 0, N * Q * sizeof(float));
        memset(d->dkn, 0, N * KV * sizeof(float));
        mt_cpu_rmsnorm_backward(d->dqn, G(cb, layer, MT_T_QNORM), d->dq, a->qpre,
                                W(cb, layer, MT_T_QNORM), a->qrstd, N * c->NH, c->HD);
        mt_cpu_rmsnorm_backward(d->dkn, G(cb, layer, MT_T_KNORM), d->dk, a->kpre,
                                W(cb, layer, MT_T_KNORM), a->krstd, N * c->NKV, c->HD);
        dq = d->dqn;
        dk = d->dkn;
    }
    memset(d->dxn, 0, N * C * sizeof(float));
    mt_cpu_matmul_backward(d->dxn, G(cb, layer, MT_T_WQ), G(cb, layer, MT_T_BQ), dq, a->xn1,
                           W(cb, layer, MT_T_WQ), N, C, Q);
    mt_cpu_matmul_backward(d->dxn, G(cb, layer, MT_T_WK), G(cb, layer, MT_T_BK), dk, a->xn1,
                           W(cb, layer, MT_T_WK), N, C, KV);
    mt_cpu_matmul_backward(d->dxn, G(cb, layer, MT_T_WV), G(cb, layer, MT_T_BV), d->dv, a->xn1,
                           W(cb, layer, MT_T_WV), N, C, KV);
    mt_cpu_rmsnorm_backward(dx, G(cb, layer, MT_T_ATTN_NORM), d->dxn, x,
                            W(cb, layer, MT_T_ATTN_NORM), a->rstd1, N, C);
}

/* Positions of micro-batch mb, or NULL. */
static const int32_t *pos_at(cpu_backend *cb, int mb) {
    return cb->batch->pos ? cb->batch->pos + (size_t)mb * cb->N : NULL;
}

/* Gemma scales its embeddings by sqrt(hidden), an fp32 number as
 * transformers makes it; 1 for the others. */
static float embed_scale(const mt_config *c) {
    return mt_arch_is_gemma(c->arch) ? (float)sqrt((double)c->C) : 1.0f;
}

/* x (n) *= s, unless s is 1. */
static void scale_floats(float *x, size_t n, float s) {
    if (s != 1.0f)
        for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void cpu_forward(mt_backend *be, int layer, int mb) {
    cpu_backend *cb = (cpu_backend *)be;
    const int32_t *tok = cb->batch->tokens + (size_t)mb * cb->N;
    if (layer == 0) {
        float *x = saved_at(cb, 1, mb);
        mt_cpu_embedding_forward(x, tok, W(cb, 0, MT_T_EMBED), cb->N, cb->cfg->C);
        scale_floats(x, (size_t)cb->N * cb->cfg->C, embed_scale(cb->cfg));
        return;
    }
    block_forward(cb, layer, pos_at(cb, mb), saved_at(cb, layer, mb), saved_at(cb, layer + 1, mb));
    if (cb->t->layers[layer].n_experts) mt_cpu_moe_count(cb->moe); /* not in recompute */
}

/* lm_head weights and gradient: untied models have their own, tied ones
 * use the embedding of layer 0. */
static void head_matrix(cpu_backend *cb, int head, float **w, float **g) {
    if (cb->cfg->tie_embeddings) {
        *w = W(cb, 0, MT_T_EMBED);
        *g = G(cb, 0, MT_T_EMBED);
    } else {
        *w = W(cb, head, MT_T_LM_HEAD);
        *g = G(cb, head, MT_T_LM_HEAD);
    }
}

/* The final norm of `rows` rows into cb->xf: RMSNorm (gemma's by 1 + w), or
 * gpt_neox's and falcon's LayerNorm with bias. */
static void final_norm_forward(cpu_backend *cb, int head, const float *x, size_t rows) {
    const mt_config *c = cb->cfg;
    if (c->layernorm)
        mt_cpu_layernorm_forward(cb->xf, cb->meanf, cb->rstdf, x, W(cb, head, MT_T_FINAL_NORM),
                                 W(cb, head, MT_T_FINAL_NORM_B), rows, c->C, c->rms_eps);
    else if (cb->t->norm_offset)
        mt_cpu_rmsnorm1p_forward(cb->xf, cb->rstdf, x, W(cb, head, MT_T_FINAL_NORM), rows, c->C,
                                 c->rms_eps);
    else
        mt_cpu_rmsnorm_forward(cb->xf, cb->rstdf, x, W(cb, head, MT_T_FINAL_NORM), rows, c->C,
                               c->rms_eps);
}

static void final_norm_backward(cpu_backend *cb, int head, float *dx, const float *dxf,
                                const float *x) {
    size_t N = cb->N, C = cb->cfg->C;
    if (cb->cfg->layernorm)
        mt_cpu_layernorm_backward(dx, G(cb, head, MT_T_FINAL_NORM), G(cb, head, MT_T_FINAL_NORM_B),
                                  dxf, x, W(cb, head, MT_T_FINAL_NORM), cb->meanf, cb->rstdf, N,
                                  C);
    else if (cb->t->norm_offset)
        mt_cpu_rmsnorm1p_backward(dx, G(cb, head, MT_T_FINAL_NORM), dxf, x,
                                  W(cb, head, MT_T_FINAL_NORM), cb->rstdf, N, C);
    else
        mt_cpu_rmsnorm_backward(dx, G(cb, head, MT_T_FINAL_NORM), dxf, x,
                                W(cb, head, MT_T_FINAL_NORM), cb->rstdf, N, C);
}

/* Gemma 2's final soft-cap on R rows of cb->logits, as transformers:
 * cap * tanh(logits / cap), keeping the tanh for the backward. */
static void softcap_forward(cpu_backend *cb, size_t R) {
    float cap = (float)cb->cfg->final_softcap;
    if (cap == 0.0f) return;
    size_t n = R * (size_t)cb->cfg->V;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        cb->tanh_logits[i] = tanhf(cb->logits[i] / cap);
        cb->logits[i] = cb->tanh_logits[i] * cap;
    }
}

/* dL/d logits before the cap from dL/d capped logits, in place. */
static void softcap_backward(cpu_backend *cb, size_t R) {
    if (cb->cfg->final_softcap == 0.0) return;
    size_t n = R * (size_t)cb->cfg->V;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        cb->logits[i] *= 1.0f - cb->tanh_logits[i] * cb->tanh_logits[i];
}

/* The head of mb: the loss (cross-entropy, or with w, per-token weighted
 * gradients), and with logp, each token's log-probability instead of any
 * gradient. */
static void head_pass(cpu_backend *cb, int mb, const float *w, float *logp) {
    const mt_config *c = cb->cfg;
    int head = cb->t->n_layers - 1, grad = cb->train && !logp;
    size_t N = cb->N, C = c->C, V = c->V;
    const float *x = saved_at(cb, head, mb);
    const int32_t *tgt = cb->batch->targets + (size_t)mb * N;
    float *wl, *gl;
    head_matrix(cb, head, &wl, &gl);
    final_norm_forward(cb, head, x, N);
    float *dxf = cb->d.dxn;
    if (grad) memset(dxf, 0, N * C * sizeof(float));
    /* Chunks of rows keep at most HEAD_CHUNK x V logits alive. */
    for (size_t r0 = 0; r0 < N; r0 += HEAD_CHUNK) {
        size_t R = N - r0 < HEAD_CHUNK ? N - r0 : HEAD_CHUNK;
        const float *xr = cb->xf + r0 * C;
        float *dl = grad ? cb->logits : NULL;
        mt_cpu_matmul_forward(cb->logits, xr, wl, NULL, R, C, V);
        softcap_forward(cb, R);
        if (logp) {
            mt_cpu_cross_entropy_weighted(NULL, logp + r0, cb->logits, tgt + r0, NULL, R, V);
            for (size_t r = 0; r < R; r++) logp[r0 + r] = -logp[r0 + r];
        } else if (w) {
            mt_cpu_cross_entropy_weighted(dl, NULL, cb->logits, tgt + r0, w + r0, R, V);
        } else {
            cb->loss_sum += mt_cpu_cross_entropy(dl, cb->logits, tgt + r0, R, V, cb->dscale);
        }
        if (!grad) continue;
        softcap_backward(cb, R);
        mt_cpu_matmul_backward(dxf + r0 * C, gl, NULL, cb->logits, xr, wl, R, C, V);
    }
    if (!grad) return;
    float *dx = dx_at(cb, mb);
    memset(dx, 0, N * C * sizeof(float));
    final_norm_backward(cb, head, dx, dxf, x);
}

static void cpu_head(mt_backend *be, int mb) { head_pass((cpu_backend *)be, mb, NULL, NULL); }

static void cpu_head_logp(mt_backend *be, int mb, float *logp) {
    head_pass((cpu_backend *)be, mb, NULL, logp);
}

static void cpu_head_weighted(mt_backend *be, int mb, const float *w) {
    head_pass((cpu_backend *)be, mb, w, NULL);
}

static void cpu_backward(mt_backend *be, int layer, int mb) {
    cpu_backend *cb = (cpu_backend *)be;
    if (layer == 0) {
        const int32_t *tok = cb->batch->tokens + (size_t)mb * cb->N;
        /* the scaled embedding's gradient; dx is spent after this */
        scale_floats(dx_at(cb, mb), (size_t)cb->N * cb->cfg->C, embed_scale(cb->cfg));
        mt_cpu_embedding_backward(G(cb, 0, MT_T_EMBED), dx_at(cb, mb), tok, cb->N, cb->cfg->C,
                                  mt_config_padding_idx(cb->cfg));
        return;
    }
    /* Recompute: the forward's activations were not kept. */
    block_forward(cb, layer, pos_at(cb, mb), saved_at(cb, layer, mb), cb->d.dxn);
    block_backward(cb, layer, pos_at(cb, mb), saved_at(cb, layer, mb), dx_at(cb, mb));
}

static void cpu_layer_grads_done(mt_backend *be, int layer) {
    /* The gradient already lives in the host store. */
}

static double cpu_end_step(mt_backend *be) {
    cpu_backend *cb = (cpu_backend *)be;
    /* the router's auxiliary loss is a mean already: scaled like the sum */
    double aux = cb->moe ? mt_cpu_moe_aux_loss(cb->moe) : 0.0;
    if (cb->hooks.after && cb->hooks.after(cb->hooks.ctx, cb->train, &cb->hook_err))
        cb->hook_failed = 1;
    return cb->loss_sum + (aux != 0.0 ? aux / cb->dscale : 0.0);
}

static int cpu_step_error(mt_backend *be, mt_error *err) {
    cpu_backend *cb = (cpu_backend *)be;
    if (!cb->hook_failed) return 0;
    *err = cb->hook_err;
    return -1;
}

/* Nothing to undo: the next begin_step clears the gradients, and nothing
 * else of a step outlives it. */
static void cpu_abandon_step(mt_backend *be) { (void)be; }

static const mt_backend_ops cpu_ops = {
    .begin_step = cpu_begin_step,
    .bind_layer = cpu_bind_layer,
    .forward = cpu_forward,
    .head = cpu_head,
    .backward = cpu_backward,
    .layer_grads_done = cpu_layer_grads_done,
    .end_step = cpu_end_step,
    .step_error = cpu_step_error,
    .logits = mt_cpu_backend_logits,
    .destroy = mt_cpu_backend_free,
    .abandon_step = cpu_abandon_step,
    .head_logp = cpu_head_logp,
    .head_weighted = cpu_head_weighted,
};

static float *alloc_floats(size_t n, size_t *total) {
    *total += n * sizeof(float);
    return mt_aligned_alloc_or_die(64, n * sizeof(float));
}

/* a*b + c, false on overflow */
static bool muladd(size_t a, size_t b, size_t c, size_t *out) {
    size_t ab;
    return mt_mul_size(a, b, &ab) && mt_add_size(ab, c, out);
}

int mt_cpu_backend_bytes(const mt_config *c, const mt_param_table *t, int max_M, int64_t B,
                         int64_t T, size_t *bytes) {
    if (max_M <= 0 || B <= 0 || T <= 0) return -1;
    size_t C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F, N, NC, LM, f = 0;
    /* floats per token row of the activations and their gradients (see
     * create): the head's, and the Llama block's unless neox.c runs them */
    size_t lb = mt_arch_has_llama_block(c->arch) ? 1 : 0;
    size_t row = 2 * C + 2 +
                 lb * (3 * C + 2 + 6 * Q + 6 * KV + 2 * (size_t)c->NH + (size_t)c->NKV + 6 * F);
    bool ok = mt_mul_size((size_t)B, (size_t)T, &N) && mt_mul_size(N, C, &NC) &&
              muladd(2, (size_t)T * c->HD / 2, 0, &f) &&                    /* cos, sin */
              muladd((size_t)t->n_layers + 1, (size_t)max_M, 0, &LM) &&      /* saved, dx */
              muladd(LM, NC, f, &f) && muladd(N, row, f, &f) &&
              muladd(HEAD_CHUNK, (size_t)c->V, f, &f) &&                     /* logits */
              muladd(c->final_softcap > 0 ? HEAD_CHUNK : 0, (size_t)c->V, f, &f) && /* tanh */
              mt_mul_size(f, sizeof(float), bytes);
    size_t moe = ok ? mt_cpu_moe_bytes(c, N) : 0, neox = ok ? mt_cpu_neox_bytes(c, N) : 0;
    size_t gemma = ok ? mt_cpu_gemma_bytes(c, B, T) : 0;
    return ok && moe != SIZE_MAX && neox != SIZE_MAX && gemma != SIZE_MAX &&
                   mt_add_size(*bytes, moe, bytes) && mt_add_size(*bytes, neox, bytes) &&
                   mt_add_size(*bytes, gemma, bytes)
               ? 0
               : -1;
}

mt_backend *mt_cpu_backend_create(const mt_config *c, const mt_param_table *t,
                                  mt_host_store *store, int max_M, int64_t B, int64_t T,
                                  mt_error *err) {
    return mt_cpu_backend_create_hooked(c, t, store, max_M, B, T, NULL, err);
}

/* Whether the CPU backend takes max_M micro-batches of B x T tokens of c
 * (within max_position_embeddings and the RAM available for their
 * activations, *need bytes): 0, or -1 with the fix. */
static int check_shape(const mt_config *c, const mt_param_table *t, int max_M, int64_t B,
                       int64_t T, size_t *need, mt_error *err) {
    if (max_M <= 0 || B <= 0 || T <= 0)
        return mt_errorf(err, "micro-batch shape must be positive");
    if (c->max_pos > 0 && T > c->max_pos)
        return mt_errorf(err, "sequence length %lld exceeds the model's "
                         "max_position_embeddings %lld; use a shorter --seq-len",
                         (long long)T, (long long)c->max_pos);
    if (mt_cpu_backend_bytes(c, t, max_M, B, T, need))
        return mt_errorf(err, "CPU backend: %d micro-batches of %lld x %lld tokens need more "
                         "bytes than this machine can address; lower --batch-size, "
                         "--micro-batches or --seq-len", max_M, (long long)B, (long long)T);
    size_t avail = mt_host_ram_available_bytes();
    if (avail && *need > avail)
        return mt_errorf(err, "CPU backend: %d micro-batches of %lld x %lld tokens need %.2f GB "
                         "of activations, %.2f GB of RAM are available; lower --batch-size, "
                         "--micro-batches or --seq-len", max_M, (long long)B, (long long)T,
                         *need / 1e9, avail / 1e9);
    return 0;
}

mt_backend *mt_cpu_backend_create_hooked(const mt_config *c, const mt_param_table *t,
                                         mt_host_store *store, int max_M, int64_t B, int64_t T,
                                         const mt_cpu_step_hooks *hooks, mt_error *err) {
    size_t need;
    if (check_shape(c, t, max_M, B, T, &need, err)) return NULL;
    cpu_backend *cb = mt_calloc_or_die(1, sizeof *cb);
    cb->base.ops = &cpu_ops;
    cb->base.name = "cpu";
    if (hooks) cb->hooks = *hooks;
    cb->cfg = c;
    cb->t = t;
    cb->store = store;
    cb->max_M = max_M;
    cb->B = B;
    cb->T = T;
    cb->N = B * T;
    size_t N = cb->N, C = c->C, tot = 0;
    /* the Llama block's buffers: empty when neox.c or gemma.c runs the blocks */
    size_t lb = mt_arch_has_llama_block(c->arch) ? 1 : 0, Cb = lb * C, Nb = lb * N;
    size_t Q = lb * c->NH * c->HD, KV = lb * c->NKV * c->HD, F = lb * c->F;
    size_t NH = lb * c->NH, NKV = lb * c->NKV;
    cb->cos = alloc_floats(T * c->HD / 2, &tot);
    cb->sin = alloc_floats(T * c->HD / 2, &tot);
    mt_rope_tables(cb->cos, cb->sin, c, T);
    cb->saved = alloc_floats((size_t)t->n_layers * max_M * N * C, &tot);
    cb->dx = alloc_floats((size_t)max_M * N * C, &tot);
    block_acts *a = &cb->a;
    a->xn1 = alloc_floats(N * Cb, &tot);
    a->rstd1 = alloc_floats(Nb, &tot);
    a->q = alloc_floats(N * Q, &tot);
    a->k = alloc_floats(N * KV, &tot);
    a->v = alloc_floats(N * KV, &tot);
    a->qpre = alloc_floats(N * Q, &tot);
    a->kpre = alloc_floats(N * KV, &tot);
    a->qrstd = alloc_floats(N * NH, &tot);
    a->krstd = alloc_floats(N * NKV, &tot);
    a->att = alloc_floats(N * Q, &tot);
    a->lse = alloc_floats(N * NH, &tot);
    a->xmid = alloc_floats(N * Cb, &tot);
    a->xn2 = alloc_floats(N * Cb, &tot);
    a->rstd2 = alloc_floats(Nb, &tot);
    a->gate = alloc_floats(N * F, &tot);
    a->up = alloc_floats(N * F, &tot);
    a->mlp = alloc_floats(N * F, &tot);
    block_grads *d = &cb->d;
    d->dbig1 = alloc_floats(N * F, &tot);
    d->dbig2 = alloc_floats(N * F, &tot);
    d->dbig3 = alloc_floats(N * F, &tot);
    d->dq = alloc_floats(N * Q, &tot);
    d->dk = alloc_floats(N * KV, &tot);
    d->dv = alloc_floats(N * KV, &tot);
    d->dqn = alloc_floats(N * Q, &tot);
    d->dkn = alloc_floats(N * KV, &tot);
    d->datt = alloc_floats(N * Q, &tot);
    d->dxn = alloc_floats(N * C, &tot);
    cb->logits = alloc_floats((size_t)HEAD_CHUNK * c->V, &tot);
    cb->tanh_logits = alloc_floats(c->final_softcap > 0 ? (size_t)HEAD_CHUNK * c->V : 0, &tot);
    cb->xf = alloc_floats(N * C, &tot);
    cb->rstdf = alloc_floats(N, &tot);
    cb->meanf = alloc_floats(N, &tot);
    cb->moe = mt_cpu_moe_create(c, N);
    tot += mt_cpu_moe_bytes(c, N);
    cb->neox = mt_cpu_neox_create(c, B, T, cb->cos, cb->sin);
    tot += mt_cpu_neox_bytes(c, N);
    cb->gemma = mt_cpu_gemma_create(c, B, T);
    tot += mt_cpu_gemma_bytes(c, B, T);
    MT_ASSERT(tot == need);  /* mt_cpu_backend_bytes must list what create allocates */
    return &cb->base;
}

void mt_cpu_backend_free(mt_backend *be) {
    if (!be) return;
    cpu_backend *cb = (cpu_backend *)be;
    block_acts *a = &cb->a;
    block_grads *d = &cb->d;
    float *bufs[] = {cb->cos, cb->sin, cb->saved, cb->dx, a->xn1, a->rstd1, a->q, a->k, a->v,
                     a->qpre, a->kpre, a->qrstd, a->krstd, a->att, a->lse, a->xmid, a->xn2,
                     a->rstd2, a->gate, a->up, a->mlp, d->dbig1, d->dbig2, d->dbig3, d->dq, d->dk, d->dv,
                     d->dqn, d->dkn, d->datt, d->dxn, cb->logits, cb->tanh_logits, cb->xf,
                     cb->rstdf, cb->meanf};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    mt_cpu_moe_free(cb->moe);
    mt_cpu_neox_free(cb->neox);
    mt_cpu_gemma_free(cb->gemma);
    if (cb->hooks.done) cb->hooks.done(cb->hooks.ctx);
    free(cb);
}

void mt_cpu_backend_logits(mt_backend *be, int mb, int64_t row, float *logits) {
    cpu_backend *cb = (cpu_backend *)be;
    const mt_config *c = cb->cfg;
    int head = cb->t->n_layers - 1;
    MT_ASSERT(row >= 0 && row < cb->N && mb >= 0 && mb < cb->max_M);
    float *wl, *gl;
    head_matrix(cb, head, &wl, &gl);
    const float *x = saved_at(cb, head, mb) + (size_t)row * c->C;
    final_norm_forward(cb, head, x, 1);
    mt_cpu_matmul_forward(logits, cb->xf, wl, NULL, 1, c->C, c->V);
    float cap = (float)c->final_softcap;
    if (cap != 0.0f)
        for (int64_t i = 0; i < c->V; i++) logits[i] = tanhf(logits[i] / cap) * cap;
}
