/* The mixture-of-experts MLP on the CPU (moe.h): router, top-k, experts
 * over the rows routed to them (gathered expert by expert, so each expert
 * is one matrix product), combine, shared expert, load-balancing loss. */
#include "backend/cpu/moe.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "util/mem.h"

struct mt_cpu_moe {
    size_t N, C, E, K, FE, FS;
    bool norm_topk, aux_on;
    double aux_coef;
    int train;
    /* routing of the last forward */
    float *p;              /* (N, E) softmax of the router logits */
    int32_t *sel;          /* (N, K) chosen experts, largest p first */
    float *wk;             /* (N, K) their routing weights */
    float *psel;           /* (N) sum of the chosen p (the renormalisation) */
    int64_t *start;        /* (E + 1) first grouped row of each expert */
    int64_t *fill;         /* (E) rows placed so far, while grouping */
    int64_t *row;          /* (N, K) grouped row of token n's j-th choice */
    int64_t *tok;          /* (N*K) token of each grouped row */
    /* grouped rows, expert after expert */
    float *xg;             /* (N*K, C) the tokens' inputs */
    float *hg, *hu, *hh;   /* (N*K, FE) gate, up, silu(gate) * up */
    float *y;              /* (N*K, C) expert outputs, before the weights */
    /* shared expert (FS > 0) */
    float *sg, *su, *sh;   /* (N, FS) */
    float *sy;             /* (N, C) */
    float *ss;             /* (N) sigmoid of the shared gate */
    /* backward */
    float *dy, *dxg;       /* (N*K, C) */
    float *dhh, *dhg, *dhu; /* (N*K, FE) */
    float *dwk;            /* (N, K) dL/d(routing weights) */
    float *dp;             /* (N, E) dL/dp, then dL/dz */
    float *dsy;            /* (N, C) */
    float *dsh, *dsg, *dsu; /* (N, FS) */
    float *dsz;            /* (N) */
    /* the step's load-balancing counts */
    double *cnt, *psum;    /* (E) top-K selections and summed p of each expert */
    double rows;           /* MoE blocks x tokens counted */
    void *block;           /* every buffer above, carved from one allocation */
};

/* The buffers of m, carved from one block (mt_arena). */
static void *take(mt_arena *a, size_t n, size_t elem) { return mt_arena_take(a, n, elem, 64); }

static void carve(mt_cpu_moe *m, mt_arena *a) {
    size_t N = m->N, C = m->C, E = m->E, K = m->K, FE = m->FE, FS = m->FS, NK = 0;
    if (!mt_mul_size(N, K, &NK)) a->overflow = true;
    m->p = take(a, N * E, 4);
    m->sel = take(a, NK, 4);
    m->wk = take(a, NK, 4);
    m->psel = take(a, N, 4);
    m->start = take(a, E + 1, 8);
    m->fill = take(a, E, 8);
    m->row = take(a, NK, 8);
    m->tok = take(a, NK, 8);
    float **nkc[] = {&m->xg, &m->y, &m->dy, &m->dxg};
    for (size_t i = 0; i < 4; i++) *nkc[i] = take(a, NK * C, 4);
    float **nkf[] = {&m->hg, &m->hu, &m->hh, &m->dhh, &m->dhg, &m->dhu};
    for (size_t i = 0; i < 6; i++) *nkf[i] = take(a, NK * FE, 4);
    m->dwk = take(a, NK, 4);
    m->dp = take(a, N * E, 4);
    if (FS) {
        float **nfs[] = {&m->sg, &m->su, &m->sh, &m->dsh, &m->dsg, &m->dsu};
        for (size_t i = 0; i < 6; i++) *nfs[i] = take(a, N * FS, 4);
        m->sy = take(a, N * C, 4);
        m->dsy = take(a, N * C, 4);
        m->ss = take(a, N, 4);
        m->dsz = take(a, N, 4);
    }
    m->cnt = take(a, E, 8);
    m->psum = take(a, E, 8);
    /* N * E and the like: N * C is bounded by the caller, E * N and FE * NK here */
    size_t x;
    if (!mt_mul_size(N, E, &x) || !mt_mul_size(NK, FE, &x) || !mt_mul_size(NK, C, &x) ||
        !mt_mul_size(N, FS, &x))
        a->overflow = true;
}

static void shape(mt_cpu_moe *m, const mt_config *c, size_t N) {
    *m = (mt_cpu_moe){.N = N, .C = (size_t)c->C, .E = (size_t)c->moe.E, .K = (size_t)c->moe.K,
                      .FE = (size_t)c->moe.FE, .FS = (size_t)c->moe.FS,
                      .norm_topk = c->moe.norm_topk, .aux_on = c->moe.aux_loss,
                      .aux_coef = c->moe.aux_coef};
}

size_t mt_cpu_moe_bytes(const mt_config *c, size_t N) {
    if (!mt_config_is_moe(c)) return 0;
    mt_cpu_moe m;
    shape(&m, c, N);
    mt_arena a = {0};
    carve(&m, &a);
    return a.overflow ? SIZE_MAX : a.used;
}

mt_cpu_moe *mt_cpu_moe_create(const mt_config *c, size_t N) {
    size_t bytes = mt_cpu_moe_bytes(c, N);
    if (!bytes) return NULL;
    MT_ASSERT(bytes != SIZE_MAX); /* the caller checked mt_cpu_moe_bytes */
    mt_cpu_moe *m = mt_calloc_or_die(1, sizeof *m);
    shape(m, c, N);
    m->block = mt_aligned_alloc_or_die(64, bytes);
    mt_arena a = {.base = m->block};
    carve(m, &a);
    MT_ASSERT(a.used == bytes);
    return m;
}

void mt_cpu_moe_free(mt_cpu_moe *m) {
    if (!m) return;
    free(m->block);
    free(m);
}

void mt_cpu_moe_begin_step(mt_cpu_moe *m, int train) {
    m->train = train;
    memset(m->cnt, 0, m->E * sizeof *m->cnt);
    memset(m->psum, 0, m->E * sizeof *m->psum);
    m->rows = 0;
}

static void softmax_rows(float *x, size_t N, size_t E) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        float *r = x + n * E, mx = -INFINITY;
        for (size_t e = 0; e < E; e++) mx = r[e] > mx ? r[e] : mx;
        double s = 0;
        for (size_t e = 0; e < E; e++) s += (double)(r[e] = expf(r[e] - mx));
        float inv = (float)(1.0 / s);
        for (size_t e = 0; e < E; e++) r[e] *= inv;
    }
}

/* The K largest p of each row, largest first; equal p: lower index first.
 * Each pick is the largest (p, -e) below the previous pick. */
static void top_k(mt_cpu_moe *m) {
    size_t E = m->E, K = m->K;
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < m->N; n++) {
        const float *p = m->p + n * E;
        int32_t *sel = m->sel + n * K;
        float s = 0;
        for (size_t j = 0; j < K; j++) {
            int32_t best = -1;
            for (size_t e = 0; e < E; e++) {
                if (j > 0) { /* only below the previous pick */
                    float pp = p[sel[j - 1]];
                    if (p[e] > pp || (p[e] == pp && (int32_t)e <= sel[j - 1])) continue;
                }
                if (best < 0 || p[e] > p[best]) best = (int32_t)e;
            }
            sel[j] = best;
            s += p[best];
        }
        m->psel[n] = s;
        for (size_t j = 0; j < K; j++)
            m->wk[n * K + j] = m->norm_topk ? p[sel[j]] / s : p[sel[j]];
    }
}

/* Rows grouped by expert, in token order within an expert. */
static void group_rows(mt_cpu_moe *m, const float *xn) {
    size_t N = m->N, K = m->K, E = m->E, C = m->C;
    memset(m->fill, 0, E * sizeof *m->fill);
    for (size_t i = 0; i < N * K; i++) m->fill[m->sel[i]]++;
    m->start[0] = 0;
    for (size_t e = 0; e < E; e++) m->start[e + 1] = m->start[e] + m->fill[e];
    memset(m->fill, 0, E * sizeof *m->fill);
    for (size_t i = 0; i < N * K; i++) {
        int32_t e = m->sel[i];
        int64_t r = m->start[e] + m->fill[e]++;
        m->row[i] = r;
        m->tok[r] = (int64_t)(i / K);
    }
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < N * K; r++)
        memcpy(m->xg + r * C, xn + (size_t)m->tok[r] * C, C * sizeof(float));
}

static float *tensor(const float *base, const mt_layer_desc *ld, mt_role r) {
    return mt_layer_tensor((float *)base, ld, r);
}

static float *expert(const float *base, const mt_layer_desc *ld, mt_role r, size_t e) {
    return mt_layer_expert_tensor((float *)base, ld, r, (int)e);
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

void mt_cpu_moe_forward(mt_cpu_moe *m, const mt_layer_desc *ld, const float *w,
                        const float *xn, float *out) {
    size_t N = m->N, C = m->C, E = m->E, K = m->K, FE = m->FE, FS = m->FS;
    MT_ASSERT((size_t)ld->n_experts == E);
    mt_cpu_matmul_forward(m->p, xn, tensor(w, ld, MT_T_ROUTER), NULL, N, C, E);
    softmax_rows(m->p, N, E);
    top_k(m);
    group_rows(m, xn);
    for (size_t e = 0; e < E; e++) {
        size_t r0 = (size_t)m->start[e], n = (size_t)m->start[e + 1] - r0;
        if (!n) continue;
        const float *x = m->xg + r0 * C;
        float *hg = m->hg + r0 * FE, *hu = m->hu + r0 * FE, *hh = m->hh + r0 * FE;
        mt_cpu_matmul_forward(hg, x, expert(w, ld, MT_T_EXP_WGATE, e), NULL, n, C, FE);
        mt_cpu_matmul_forward(hu, x, expert(w, ld, MT_T_EXP_WUP, e), NULL, n, C, FE);
        mt_cpu_swiglu_forward(hh, hg, hu, n, FE);
        mt_cpu_matmul_forward(m->y + r0 * C, hh, expert(w, ld, MT_T_EXP_WDOWN, e), NULL, n, FE, C);
    }
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float *o = out + t * C;
        memset(o, 0, C * sizeof(float));
        for (size_t j = 0; j < K; j++) {
            const float *y = m->y + (size_t)m->row[t * K + j] * C;
            float wt = m->wk[t * K + j];
            for (size_t i = 0; i < C; i++) o[i] += wt * y[i];
        }
    }
    if (!FS) return;
    mt_cpu_matmul_forward(m->sg, xn, tensor(w, ld, MT_T_SHARED_WGATE), NULL, N, C, FS);
    mt_cpu_matmul_forward(m->su, xn, tensor(w, ld, MT_T_SHARED_WUP), NULL, N, C, FS);
    mt_cpu_swiglu_forward(m->sh, m->sg, m->su, N, FS);
    mt_cpu_matmul_forward(m->sy, m->sh, tensor(w, ld, MT_T_SHARED_WDOWN), NULL, N, FS, C);
    mt_cpu_matmul_forward(m->ss, xn, tensor(w, ld, MT_T_SHARED_GATE), NULL, N, C, 1);
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float s = m->ss[t] = sigmoid(m->ss[t]);
        for (size_t i = 0; i < C; i++) out[t * C + i] += s * m->sy[t * C + i];
    }
}

void mt_cpu_moe_count(mt_cpu_moe *m) {
    size_t N = m->N, E = m->E, K = m->K;
    for (size_t i = 0; i < N * K; i++) m->cnt[m->sel[i]] += 1.0;
    for (size_t n = 0; n < N; n++)
        for (size_t e = 0; e < E; e++) m->psum[e] += (double)m->p[n * E + e];
    m->rows += (double)N;
}

double mt_cpu_moe_aux_loss(const mt_cpu_moe *m) {
    if (!m->aux_on || !m->train || m->rows == 0) return 0.0;
    double s = 0;
    for (size_t e = 0; e < m->E; e++) s += m->cnt[e] * m->psum[e];
    return m->aux_coef * (double)m->E * s / (m->rows * m->rows);
}

/* dL/dz of the router logits into m->dp, from the routing weights'
 * gradient dwk (N, K) and, with the aux loss on, its gradient on p. */
static void router_backward(mt_cpu_moe *m, const float *dwk) {
    size_t N = m->N, E = m->E, K = m->K;
    bool aux = m->aux_on && m->train && m->rows > 0;
    double scale = aux ? m->aux_coef * (double)E / (m->rows * m->rows) : 0;
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *p = m->p + n * E, *w = m->wk + n * K, *dw = dwk + n * K;
        const int32_t *sel = m->sel + n * K;
        float *dp = m->dp + n * E;
        for (size_t e = 0; e < E; e++) dp[e] = aux ? (float)(scale * m->cnt[e]) : 0.0f;
        /* w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S */
        float dot = 0;
        if (m->norm_topk)
            for (size_t j = 0; j < K; j++) dot += dw[j] * w[j];
        for (size_t j = 0; j < K; j++)
            dp[sel[j]] += m->norm_topk ? (dw[j] - dot) / m->psel[n] : dw[j];
        /* softmax: dz_e = p_e (dp_e - sum_i p_i dp_i) */
        double s = 0;
        for (size_t e = 0; e < E; e++) s += (double)p[e] * dp[e];
        for (size_t e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - (float)s);
    }
}

static void shared_backward(mt_cpu_moe *m, const mt_layer_desc *ld, const float *w, float *g,
                            const float *xn, const float *dout, float *dxn) {
    size_t N = m->N, C = m->C, FS = m->FS;
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        float s = m->ss[t], d = 0;
        for (size_t i = 0; i < C; i++) {
            m->dsy[t * C + i] = s * dout[t * C + i];
            d += dout[t * C + i] * m->sy[t * C + i];
        }
        m->dsz[t] = d * s * (1.0f - s);
    }
    mt_cpu_matmul_backward(dxn, tensor(g, ld, MT_T_SHARED_GATE), NULL, m->dsz, xn,
                           tensor(w, ld, MT_T_SHARED_GATE), N, C, 1);
    memset(m->dsh, 0, N * FS * sizeof(float));
    mt_cpu_matmul_backward(m->dsh, tensor(g, ld, MT_T_SHARED_WDOWN), NULL, m->dsy, m->sh,
                           tensor(w, ld, MT_T_SHARED_WDOWN), N, FS, C);
    mt_cpu_swiglu_backward(m->dsg, m->dsu, m->dsh, m->sg, m->su, N, FS);
    mt_cpu_matmul_backward(dxn, tensor(g, ld, MT_T_SHARED_WGATE), NULL, m->dsg, xn,
                           tensor(w, ld, MT_T_SHARED_WGATE), N, C, FS);
    mt_cpu_matmul_backward(dxn, tensor(g, ld, MT_T_SHARED_WUP), NULL, m->dsu, xn,
                           tensor(w, ld, MT_T_SHARED_WUP), N, C, FS);
}

void mt_cpu_moe_backward(mt_cpu_moe *m, const mt_layer_desc *ld, const float *w, float *g,
                         const float *xn, const float *dout, float *dxn) {
    size_t N = m->N, C = m->C, E = m->E, K = m->K, FE = m->FE;
    /* combine: dL/dw_j = dout . y_j; each grouped row's dL/dy = w_j dout */
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++) {
        const float *d = dout + t * C;
        for (size_t j = 0; j < K; j++) {
            size_t r = (size_t)m->row[t * K + j];
            const float *y = m->y + r * C;
            float *dy = m->dy + r * C, wt = m->wk[t * K + j], dot = 0;
            for (size_t i = 0; i < C; i++) {
                dot += d[i] * y[i];
                dy[i] = wt * d[i];
            }
            m->dwk[t * K + j] = dot;
        }
    }
    memset(m->dhh, 0, N * K * FE * sizeof(float));
    memset(m->dxg, 0, N * K * C * sizeof(float));
    for (size_t e = 0; e < E; e++) {
        size_t r0 = (size_t)m->start[e], n = (size_t)m->start[e + 1] - r0;
        if (!n) continue;
        const float *x = m->xg + r0 * C;
        float *dhh = m->dhh + r0 * FE, *dhg = m->dhg + r0 * FE, *dhu = m->dhu + r0 * FE;
        float *dx = m->dxg + r0 * C;
        mt_cpu_matmul_backward(dhh, expert(g, ld, MT_T_EXP_WDOWN, e), NULL, m->dy + r0 * C,
                               m->hh + r0 * FE, expert(w, ld, MT_T_EXP_WDOWN, e), n, FE, C);
        mt_cpu_swiglu_backward(dhg, dhu, dhh, m->hg + r0 * FE, m->hu + r0 * FE, n, FE);
        mt_cpu_matmul_backward(dx, expert(g, ld, MT_T_EXP_WGATE, e), NULL, dhg, x,
                               expert(w, ld, MT_T_EXP_WGATE, e), n, C, FE);
        mt_cpu_matmul_backward(dx, expert(g, ld, MT_T_EXP_WUP, e), NULL, dhu, x,
                               expert(w, ld, MT_T_EXP_WUP, e), n, C, FE);
    }
    /* scatter the rows' input gradients back to their tokens */
#pragma omp parallel for schedule(static)
    for (size_t t = 0; t < N; t++)
        for (size_t j = 0; j < K; j++) {
            const float *dx = m->dxg + (size_t)m->row[t * K + j] * C;
            for (size_t i = 0; i < C; i++) dxn[t * C + i] += dx[i];
        }
    router_backward(m, m->dwk);
    mt_cpu_matmul_backward(dxn, tensor(g, ld, MT_T_ROUTER), NULL, m->dp, xn,
                           tensor(w, ld, MT_T_ROUTER), N, C, E);
    if (m->FS) shared_backward(m, ld, w, g, xn, dout, dxn);
}
