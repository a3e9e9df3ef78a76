/* The Gemma 2 and Gemma 3 decoder blocks on the CPU (see gemma.h). */
#include "backend/cpu/gemma.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "model/rope.h"
#include "util/error.h"
#include "util/mem.h"

struct mt_cpu_gemma {
    const mt_config *cfg;
    size_t B, T, N;
    float *cos_l, *sin_l;       /* (T, HD/2) the sliding layers' rotary tables */
    float *cos_g, *sin_g;       /* (T, HD/2) the global layers' */
    float *xn1, *rstd1;         /* (N, C), (N) norm_in */
    float *qpre, *kpre;         /* (N, Q), (N, KV) before q_norm / k_norm (gemma3_text) */
    float *qrstd, *krstd;       /* (N * NH), (N * NKV) */
    float *q, *k, *v;           /* (N, Q), (N, KV), (N, KV) as attended */
    float *att, *lse;           /* (N, Q), (B, NH, T) */
    float *ao, *rstd_pa;        /* (N, C) att Wo^T, norm_post_attn's input; (N) */
    float *xmid;                /* (N, C) */
    float *xn2, *rstd2;         /* (N, C), (N) norm_pre_ff */
    float *gate, *up, *gact, *h; /* (N, F) Wgate z, Wup z, gelu(gate), gelu(gate) * up */
    float *mo, *rstd_pf;        /* (N, C) Wdown h, norm_post_ff's input; (N) */
    float *dq, *dk, *dv, *datt; /* (N, Q), (N, KV), (N, KV), (N, Q) */
    float *dqn, *dkn;           /* (N, Q), (N, KV) before the q/k norms */
    float *dc1, *dc2;           /* (N, C) */
    float *df1, *df2, *df3;     /* (N, F) */
};

/* The buffers above from xn1 on, in floats per token row. */
static size_t row_floats(const mt_config *c) {
    size_t C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    return 7 * C + 4 + 6 * Q + 6 * KV + 2 * (size_t)c->NH + (size_t)c->NKV + 7 * F;
}

size_t mt_cpu_gemma_bytes(const mt_config *c, int64_t B, int64_t T) {
    if (!mt_arch_is_gemma(c->arch)) return 0;
    size_t n, tables;
    if (!mt_mul_size((size_t)B * (size_t)T, row_floats(c), &n) ||
        !mt_mul_size((size_t)T, 2 * (size_t)c->HD, &tables) || !mt_add_size(n, tables, &n) ||
        !mt_mul_size(n, sizeof(float), &n))
        return SIZE_MAX;
    return n;
}

/* The rotary tables of the sliding layers (Gemma 3: rope_local_base_freq,
 * no scaling; Gemma 2: the one rope_theta) and of the global ones. */
static void rope_tables(mt_cpu_gemma *m, const mt_config *c, size_t T) {
    mt_rope_tables(m->cos_g, m->sin_g, c, T);
    mt_rope_tables_local(m->cos_l, m->sin_l, c, T);
}

mt_cpu_gemma *mt_cpu_gemma_create(const mt_config *c, int64_t B, int64_t T) {
    if (!mt_arch_is_gemma(c->arch)) return NULL;
    mt_cpu_gemma *m = mt_calloc_or_die(1, sizeof *m);
    size_t N = (size_t)(B * T), C = c->C, Q = c->NH * c->HD, KV = c->NKV * c->HD, F = c->F;
    size_t NH = c->NH, NKV = c->NKV, RT = (size_t)T * c->HD / 2;
    *m = (mt_cpu_gemma){.cfg = c, .B = (size_t)B, .T = (size_t)T, .N = N};
    struct { float **p; size_t n; } bufs[] = {
        {&m->cos_l, RT}, {&m->sin_l, RT}, {&m->cos_g, RT}, {&m->sin_g, RT},
        {&m->xn1, N * C}, {&m->rstd1, N}, {&m->qpre, N * Q}, {&m->kpre, N * KV},
        {&m->qrstd, N * NH}, {&m->krstd, N * NKV}, {&m->q, N * Q}, {&m->k, N * KV},
        {&m->v, N * KV}, {&m->att, N * Q}, {&m->lse, N * NH}, {&m->ao, N * C},
        {&m->rstd_pa, N}, {&m->xmid, N * C}, {&m->xn2, N * C}, {&m->rstd2, N},
        {&m->gate, N * F}, {&m->up, N * F}, {&m->gact, N * F}, {&m->h, N * F},
        {&m->mo, N * C}, {&m->rstd_pf, N}, {&m->dq, N * Q}, {&m->dk, N * KV}, {&m->dv, N * KV},
        {&m->datt, N * Q}, {&m->dqn, N * Q}, {&m->dkn, N * KV}, {&m->dc1, N * C},
        {&m->dc2, N * C}, {&m->df1, N * F}, {&m->df2, N * F}, {&m->df3, N * F},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        *bufs[i].p = mt_aligned_alloc_or_die(64, bufs[i].n * sizeof(float));
        total += bufs[i].n;
    }
    MT_ASSERT(total * sizeof(float) == mt_cpu_gemma_bytes(c, B, T)); /* must list these */
    rope_tables(m, c, (size_t)T);
    return m;
}

void mt_cpu_gemma_free(mt_cpu_gemma *m) {
    if (!m) return;
    float *bufs[] = {m->cos_l, m->sin_l, m->cos_g, m->sin_g, m->xn1, m->rstd1, m->qpre,
                     m->kpre, m->qrstd, m->krstd, m->q, m->k, m->v, m->att, m->lse, m->ao,
                     m->rstd_pa, m->xmid, m->xn2, m->rstd2, m->gate, m->up, m->gact, m->h,
                     m->mo, m->rstd_pf, m->dq, m->dk, m->dv, m->datt, m->dqn, m->dkn, m->dc1,
                     m->dc2, m->df1, m->df2, m->df3};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(m);
}

#define TW(base, r) mt_layer_tensor((float *)(base), ld, (r))

/* Block `block`'s attention: its scale, soft-cap and window. */
static mt_cpu_attn_opts attn_opts(const mt_config *c, int block) {
    return (mt_cpu_attn_opts){
        .scale = (float)pow(c->query_pre_attn_scalar, -0.5), /* as transformers */
        .softcap = (float)c->attn_softcap,
        .window = mt_config_block_slides(c, block) ? (size_t)c->sliding_window : 0};
}

/* The rotary tables block `block` uses. */
static void block_tables(const mt_cpu_gemma *m, int block, const float **cos,
                         const float **sin) {
    bool local = mt_config_block_slides(m->cfg, block);
    *cos = local ? m->cos_l : m->cos_g;
    *sin = local ? m->sin_l : m->sin_g;
}

/* xmid = x + norm_post_attn(attention(norm_in(x)) Wo^T), keeping what the
 * backward reads. */
static void attention_forward(mt_cpu_gemma *m, int block, const mt_layer_desc *ld,
                              const float *w, const int32_t *pos, const float *x) {
    const mt_config *c = m->cfg;
    size_t N = m->N, C = c->C, NH = c->NH, NKV = c->NKV, HD = c->HD, Q = NH * HD, KV = NKV * HD;
    float eps = c->rms_eps;
    const float *cos, *sin;
    block_tables(m, block, &cos, &sin);
    mt_cpu_rmsnorm1p_forward(m->xn1, m->rstd1, x, TW(w, MT_T_ATTN_NORM), N, C, eps);
    float *q = c->qk_norm ? m->qpre : m->q, *k = c->qk_norm ? m->kpre : m->k;
    mt_cpu_matmul_forward(q, m->xn1, TW(w, MT_T_WQ), NULL, N, C, Q);
    mt_cpu_matmul_forward(k, m->xn1, TW(w, MT_T_WK), NULL, N, C, KV);
    mt_cpu_matmul_forward(m->v, m->xn1, TW(w, MT_T_WV), NULL, N, C, KV);
    if (c->qk_norm) {
        mt_cpu_rmsnorm1p_forward(m->q, m->qrstd, m->qpre, TW(w, MT_T_QNORM), N * NH, HD, eps);
        mt_cpu_rmsnorm1p_forward(m->k, m->krstd, m->kpre, TW(w, MT_T_KNORM), N * NKV, HD, eps);
    }
    mt_cpu_rope_forward(m->q, cos, sin, pos, m->B, m->T, NH, HD);
    mt_cpu_rope_forward(m->k, cos, sin, pos, m->B, m->T, NKV, HD);
    mt_cpu_attn_opts o = attn_opts(c, block);
    mt_cpu_attention_forward_opts(m->att, m->lse, m->q, m->k, m->v, pos, m->B, m->T, NH, NKV,
                                  HD, &o);
    mt_cpu_matmul_forward(m->ao, m->att, TW(w, MT_T_WO), NULL, N, Q, C);
    mt_cpu_rmsnorm1p_forward(m->dc1, m->rstd_pa, m->ao, TW(w, MT_T_ATTN_POST_NORM), N, C, eps);
    for (size_t i = 0; i < N * C; i++) m->xmid[i] = x[i] + m->dc1[i];
}

void mt_cpu_gemma_forward(mt_cpu_gemma *m, int block, const mt_layer_desc *ld, const float *w,
                          const int32_t *pos, const float *x, float *out) {
    const mt_config *c = m->cfg;
    size_t N = m->N, C = c->C, F = c->F;
    float eps = c->rms_eps;
    attention_forward(m, block, ld, w, pos, x);
    mt_cpu_rmsnorm1p_forward(m->xn2, m->rstd2, m->xmid, TW(w, MT_T_MLP_NORM), N, C, eps);
    mt_cpu_matmul_forward(m->gate, m->xn2, TW(w, MT_T_WGATE), NULL, N, C, F);
    mt_cpu_matmul_forward(m->up, m->xn2, TW(w, MT_T_WUP), NULL, N, C, F);
    mt_cpu_gelu_forward(m->gact, m->gate, N * F, c->act == MT_ACT_GELU_TANH);
    for (size_t i = 0; i < N * F; i++) m->h[i] = m->gact[i] * m->up[i];
    mt_cpu_matmul_forward(m->mo, m->h, TW(w, MT_T_WDOWN), NULL, N, F, C);
    mt_cpu_rmsnorm1p_forward(out, m->rstd_pf, m->mo, TW(w, MT_T_MLP_POST_NORM), N, C, eps);
    for (size_t i = 0; i < N * C; i++) out[i] = m->xmid[i] + out[i];
}

/* The MLP's backward: dx holds dL/d out on entry and dL/d xmid on exit. */
static void mlp_backward(mt_cpu_gemma *m, const mt_layer_desc *ld, const float *w, float *g,
                         float *dx) {
    const mt_config *c = m->cfg;
    size_t N = m->N, C = c->C, F = c->F;
    float *dmo = m->dc1, *dxn = m->dc2, *dh = m->df1, *dgate = m->df2, *dup = m->df3;
    memset(dmo, 0, N * C * sizeof(float));
    mt_cpu_rmsnorm1p_backward(dmo, TW(g, MT_T_MLP_POST_NORM), dx, m->mo,
                              TW(w, MT_T_MLP_POST_NORM), m->rstd_pf, N, C);
    memset(dh, 0, N * F * sizeof(float));
    mt_cpu_matmul_backward(dh, TW(g, MT_T_WDOWN), NULL, dmo, m->h, TW(w, MT_T_WDOWN), N, F, C);
    /* h = gelu(gate) * up: dup = dh gelu(gate), dgate = gelu'(gate) dh up */
    for (size_t i = 0; i < N * F; i++) {
        dup[i] = dh[i] * m->gact[i];
        dh[i] = dh[i] * m->up[i];
    }
    mt_cpu_gelu_backward(dgate, dh, m->gate, N * F, c->act == MT_ACT_GELU_TANH);
    memset(dxn, 0, N * C * sizeof(float));
    mt_cpu_matmul_backward(dxn, TW(g, MT_T_WGATE), NULL, dgate, m->xn2, TW(w, MT_T_WGATE), N, C,
                           F);
    mt_cpu_matmul_backward(dxn, TW(g, MT_T_WUP), NULL, dup, m->xn2, TW(w, MT_T_WUP), N, C, F);
    mt_cpu_rmsnorm1p_backward(dx, TW(g, MT_T_MLP_NORM), dxn, m->xmid, TW(w, MT_T_MLP_NORM),
                              m->rstd2, N, C);
}

/* The q/k norms' backward (gemma3_text): *dq, *dk become the gradients of
 * their inputs. */
static void qk_norm_backward(mt_cpu_gemma *m, const mt_layer_desc *ld, const float *w, float *g,
                             float **dq, float **dk) {
    const mt_config *c = m->cfg;
    size_t N = m->N, NH = c->NH, NKV = c->NKV, HD = c->HD;
    memset(m->dqn, 0, N * NH * HD * sizeof(float));
    memset(m->dkn, 0, N * NKV * HD * sizeof(float));
    mt_cpu_rmsnorm1p_backward(m->dqn, TW(g, MT_T_QNORM), m->dq, m->qpre, TW(w, MT_T_QNORM),
                              m->qrstd, N * NH, HD);
    mt_cpu_rmsnorm1p_backward(m->dkn, TW(g, MT_T_KNORM), m->dk, m->kpre, TW(w, MT_T_KNORM),
                              m->krstd, N * NKV, HD);
    *dq = m->dqn;
    *dk = m->dkn;
}

void mt_cpu_gemma_backward(mt_cpu_gemma *m, int block, const mt_layer_desc *ld, const float *w,
                           float *g, const int32_t *pos, const float *x, float *dx) {
    const mt_config *c = m->cfg;
    size_t N = m->N, C = c->C, NH = c->NH, NKV = c->NKV, HD = c->HD, Q = NH * HD, KV = NKV * HD;
    mlp_backward(m, ld, w, g, dx);
    /* xmid = x + norm_post_attn(ao): dx is dL/d xmid, the residual's share */
    float *dao = m->dc1, *dxn = m->dc2;
    memset(dao, 0, N * C * sizeof(float));
    mt_cpu_rmsnorm1p_backward(dao, TW(g, MT_T_ATTN_POST_NORM), dx, m->ao,
                              TW(w, MT_T_ATTN_POST_NORM), m->rstd_pa, N, C);
    memset(m->datt, 0, N * Q * sizeof(float));
    mt_cpu_matmul_backward(m->datt, TW(g, MT_T_WO), NULL, dao, m->att, TW(w, MT_T_WO), N, Q, C);
    mt_cpu_attn_opts o = attn_opts(c, block);
    mt_cpu_attention_backward_opts(m->dq, m->dk, m->dv, m->datt, m->q, m->k, m->v, m->att,
                                   m->lse, pos, m->B, m->T, NH, NKV, HD, &o);
    const float *cos, *sin;
    block_tables(m, block, &cos, &sin);
    mt_cpu_rope_backward(m->dq, cos, sin, pos, m->B, m->T, NH, HD);
    mt_cpu_rope_backward(m->dk, cos, sin, pos, m->B, m->T, NKV, HD);
    float *dq = m->dq, *dk = m->dk;
    if (c->qk_norm) qk_norm_backward(m, ld, w, g, &dq, &dk);
    memset(dxn, 0, N * C * sizeof(float));
    mt_cpu_matmul_backward(dxn, TW(g, MT_T_WQ), NULL, dq, m->xn1, TW(w, MT_T_WQ), N, C, Q);
    mt_cpu_matmul_backward(dxn, TW(g, MT_T_WK), NULL, dk, m->xn1, TW(w, MT_T_WK), N, C, KV);
    mt_cpu_matmul_backward(dxn, TW(g, MT_T_WV), NULL, m->dv, m->xn1, TW(w, MT_T_WV), N, C, KV);
    mt_cpu_rmsnorm1p_backward(dx, TW(g, MT_T_ATTN_NORM), dxn, x, TW(w, MT_T_ATTN_NORM), m->rstd1,
                              N, C);
}
