/* The GPT-NeoX and Falcon decoder blocks on the CPU (see neox.h). */
#include "backend/cpu/neox.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "util/error.h"
#include "util/mem.h"

struct mt_cpu_neox {
    const mt_config *cfg;
    size_t B, T, N;
    const float *cos, *sin;     /* (T, R/2), the caller's */
    float *xn1, *xn2;           /* (N, C) the two LayerNorms' outputs */
    float *mean1, *rstd1;       /* (N) */
    float *mean2, *rstd2;       /* (N) */
    float *qkv;                 /* (N, Q + 2KV) fused projection; dqkv in the backward */
    float *q, *k, *v;           /* (N, Q), (N, KV), (N, KV) after RoPE */
    float *att, *lse;           /* (N, Q), (B, NH, T) */
    float *ao;                  /* (N, C) attention output after dense */
    float *xmid;                /* (N, C) sequential: ao + x, LayerNorm2's input */
    float *h, *act;             /* (N, F) before and after the GELU */
    float *dq, *dk, *dv, *datt; /* (N, Q), (N, KV), (N, KV), (N, Q) */
    float *dxn;                 /* (N, C) */
    float *dact, *dh;           /* (N, F) */
};

/* The buffers above, in floats per token row. */
static size_t row_floats(const mt_config *c) {
    size_t C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    return 5 * C + 4 + 5 * Q + 6 * KV + (size_t)c->NH + 4 * F;
}

size_t mt_cpu_neox_bytes(const mt_config *c, size_t N) {
    if (!mt_arch_has_neox_block(c->arch)) return 0;
    size_t n;
    if (!mt_mul_size(N, row_floats(c), &n) || !mt_mul_size(n, sizeof(float), &n)) return SIZE_MAX;
    return n;
}

mt_cpu_neox *mt_cpu_neox_create(const mt_config *c, int64_t B, int64_t T, const float *cos,
                                const float *sin) {
    if (!mt_arch_has_neox_block(c->arch)) return NULL;
    MT_ASSERT(c->NKV > 0 && c->NH % c->NKV == 0 && c->NH * c->HD == c->C);
    mt_cpu_neox *m = mt_calloc_or_die(1, sizeof *m);
    size_t N = (size_t)(B * T), C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    *m = (mt_cpu_neox){.cfg = c, .B = (size_t)B, .T = (size_t)T, .N = N, .cos = cos, .sin = sin};
    struct { float **p; size_t n; } bufs[] = {
        {&m->xn1, N * C}, {&m->xn2, N * C}, {&m->mean1, N}, {&m->rstd1, N}, {&m->mean2, N},
        {&m->rstd2, N}, {&m->qkv, N * (Q + 2 * KV)}, {&m->q, N * Q}, {&m->k, N * KV},
        {&m->v, N * KV}, {&m->att, N * Q}, {&m->lse, N * c->NH}, {&m->ao, N * C},
        {&m->xmid, N * C}, {&m->h, N * F}, {&m->act, N * F}, {&m->dq, N * Q}, {&m->dk, N * KV},
        {&m->dv, N * KV},
        {&m->datt, N * Q}, {&m->dxn, N * C}, {&m->dact, N * F}, {&m->dh, N * F},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        *bufs[i].p = mt_aligned_alloc_or_die(64, bufs[i].n * sizeof(float));
        total += bufs[i].n;
    }
    MT_ASSERT(total == N * row_floats(c)); /* mt_cpu_neox_bytes must list these */
    return m;
}

void mt_cpu_neox_free(mt_cpu_neox *m) {
    if (!m) return;
    float *bufs[] = {m->xn1, m->xn2, m->mean1, m->rstd1, m->mean2, m->rstd2, m->qkv, m->q,
                     m->k, m->v, m->att, m->lse, m->ao, m->xmid, m->h, m->act, m->dq, m->dk,
                     m->dv, m->datt, m->dxn, m->dact, m->dh};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(m);
}

/* split_qkv copies each kv group's query heads, k and v out of the fused
 * (N, NKV, NH/NKV + 2, HD) layout into the attention's (N, NH, HD) and
 * (N, NKV, HD) layouts; join_qkv copies them back (the backward's dq, dk,
 * dv into dL/d qkv). */
static void split_qkv(float *q, float *k, float *v, const float *qkv, size_t N, size_t NH,
                      size_t NKV, size_t HD) {
    size_t G = NH / NKV; /* query heads per kv head */
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g < NKV; g++) {
            const float *src = qkv + (n * NKV + g) * (G + 2) * HD;  // (G + 2, HD)
            memcpy(q + (n * NH + g * G) * HD, src, G * HD * sizeof(float));
            memcpy(k + (n * NKV + g) * HD, src + G * HD, HD * sizeof(float));
            memcpy(v + (n * NKV + g) * HD, src + (G + 1) * HD, HD * sizeof(float));
        }
}

static void join_qkv(float *qkv, const float *q, const float *k, const float *v, size_t N,
                     size_t NH, size_t NKV, size_t HD) {
    size_t G = NH / NKV;
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++)
        for (size_t g = 0; g < NKV; g++) {
            float *dst = qkv + (n * NKV + g) * (G + 2) * HD;  // (G + 2, HD)
            memcpy(dst, q + (n * NH + g * G) * HD, G * HD * sizeof(float));
            memcpy(dst + G * HD, k + (n * NKV + g) * HD, HD * sizeof(float));
            memcpy(dst + (G + 1) * HD, v + (n * NKV + g) * HD, HD * sizeof(float));
        }
}

#define TW(base, r) mt_layer_tensor((float *)(base), ld, (r))

void mt_cpu_neox_forward(mt_cpu_neox *m, const mt_layer_desc *ld, const float *w,
                         const int32_t *pos, const float *x, float *out) {
    const mt_config *c = m->cfg;
    size_t N = m->N, C = c->C, NH = c->NH, NKV = c->NKV, HD = c->HD, Q = NH * HD, F = c->F;
    size_t KV = NKV * HD, R = (size_t)mt_config_rotary_dim(c);
    mt_cpu_layernorm_forward(m->xn1, m->mean1, m->rstd1, x, TW(w, MT_T_ATTN_NORM),
                             TW(w, MT_T_ATTN_NORM_B), N, C, c->rms_eps);
    mt_cpu_matmul_forward(m->qkv, m->xn1, TW(w, MT_T_WQKV), TW(w, MT_T_BQKV), N, C, Q + 2 * KV);
    split_qkv(m->q, m->k, m->v, m->qkv, N, NH, NKV, HD);
    mt_cpu_rope_partial_forward(m->q, m->cos, m->sin, pos, m->B, m->T, NH, HD, R);
    mt_cpu_rope_partial_forward(m->k, m->cos, m->sin, pos, m->B, m->T, NKV, HD, R);
    mt_cpu_attention_forward(m->att, m->lse, m->q, m->k, m->v, pos, m->B, m->T, NH, NKV, HD);
    mt_cpu_matmul_forward(m->ao, m->att, TW(w, MT_T_WO), TW(w, MT_T_BO), N, Q, C);
    /* LayerNorm2 reads x (parallel) or h = ao + x (sequential); without a
     * LayerNorm2 (Falcon-7B) the MLP reads LayerNorm1's output */
    const float *mlp_in = m->xn1;
    if (TW(w, MT_T_MLP_NORM)) {
        const float *in2 = x;
        if (!c->parallel_residual) {
            for (size_t i = 0; i < N * C; i++) m->xmid[i] = m->ao[i] + x[i];
            in2 = m->xmid;
        }
        mt_cpu_layernorm_forward(m->xn2, m->mean2, m->rstd2, in2, TW(w, MT_T_MLP_NORM),
                                 TW(w, MT_T_MLP_NORM_B), N, C, c->rms_eps);
        mlp_in = m->xn2;
    }
    mt_cpu_matmul_forward(m->h, mlp_in, TW(w, MT_T_WUP), TW(w, MT_T_BUP), N, C, F);
    mt_cpu_gelu_forward(m->act, m->h, N * F, c->act == MT_ACT_GELU_TANH);
    mt_cpu_matmul_forward(out, m->act, TW(w, MT_T_WDOWN), TW(w, MT_T_BDOWN), N, F, C);
    /* in transformers' order: (mlp + ao) + x, or mlp + (ao + x) */
    if (c->parallel_residual)
        for (size_t i = 0; i < N * C; i++) out[i] = (out[i] + m->ao[i]) + x[i];
    else
        for (size_t i = 0; i < N * C; i++) out[i] += m->xmid[i];
}

void mt_cpu_neox_backward(mt_cpu_neox *m, const mt_layer_desc *ld, const float *w, float *g,
                          const int32_t *pos, const float *x, float *dx) {
    const mt_config *c = m->cfg;
    size_t N = m->N, C = c->C, NH = c->NH, NKV = c->NKV, HD = c->HD, Q = NH * HD, F = c->F;
    size_t KV = NKV * HD, R = (size_t)mt_config_rotary_dim(c);
    bool norm2 = TW(w, MT_T_MLP_NORM) != NULL;
    MT_ASSERT(norm2 || c->parallel_residual);
    /* MLP: dx is dL/d mlp output in both forms */
    memset(m->dact, 0, N * F * sizeof(float));
    mt_cpu_matmul_backward(m->dact, TW(g, MT_T_WDOWN), TW(g, MT_T_BDOWN), dx, m->act,
                           TW(w, MT_T_WDOWN), N, F, C);
    mt_cpu_gelu_backward(m->dh, m->dact, m->h, N * F, c->act == MT_ACT_GELU_TANH);
    memset(m->dxn, 0, N * C * sizeof(float));
    mt_cpu_matmul_backward(m->dxn, TW(g, MT_T_WUP), TW(g, MT_T_BUP), m->dh,
                           norm2 ? m->xn2 : m->xn1, TW(w, MT_T_WUP), N, C, F);
    /* Sequential: LayerNorm2's input is h, so dx becomes dL/d h before the
     * attention's backward; parallel: the attention output's gradient is
     * dL/d out itself, and LayerNorm2's input gradient joins dL/d x later. */
    if (!c->parallel_residual)
        mt_cpu_layernorm_backward(dx, TW(g, MT_T_MLP_NORM), TW(g, MT_T_MLP_NORM_B), m->dxn,
                                  m->xmid, TW(w, MT_T_MLP_NORM), m->mean2, m->rstd2, N, C);
    memset(m->datt, 0, N * Q * sizeof(float));
    mt_cpu_matmul_backward(m->datt, TW(g, MT_T_WO), TW(g, MT_T_BO), dx, m->att, TW(w, MT_T_WO),
                           N, Q, C);
    if (c->parallel_residual && norm2)
        mt_cpu_layernorm_backward(dx, TW(g, MT_T_MLP_NORM), TW(g, MT_T_MLP_NORM_B), m->dxn, x,
                                  TW(w, MT_T_MLP_NORM), m->mean2, m->rstd2, N, C);
    mt_cpu_attention_backward(m->dq, m->dk, m->dv, m->datt, m->q, m->k, m->v, m->att, m->lse,
                              pos, m->B, m->T, NH, NKV, HD);
    mt_cpu_rope_partial_backward(m->dq, m->cos, m->sin, pos, m->B, m->T, NH, HD, R);
    mt_cpu_rope_partial_backward(m->dk, m->cos, m->sin, pos, m->B, m->T, NKV, HD, R);
    join_qkv(m->qkv, m->dq, m->dk, m->dv, N, NH, NKV, HD); /* qkv holds dL/d qkv now */
    /* Without a LayerNorm2, dxn keeps the MLP's share of dL/d xn1 and the
     * qkv's share adds to it. */
    if (norm2) memset(m->dxn, 0, N * C * sizeof(float));
    mt_cpu_matmul_backward(m->dxn, TW(g, MT_T_WQKV), TW(g, MT_T_BQKV), m->qkv, m->xn1,
                           TW(w, MT_T_WQKV), N, C, Q + 2 * KV);
    mt_cpu_layernorm_backward(dx, TW(g, MT_T_ATTN_NORM), TW(g, MT_T_ATTN_NORM_B), m->dxn, x,
                              TW(w, MT_T_ATTN_NORM), m->mean1, m->rstd1, N, C);
}
