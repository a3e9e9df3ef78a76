/* CPU reference operators, fp32 (see ops.h for the contracts).
 *
 * Determinism: every output element is computed by exactly one thread, as
 * one sequential sum in a fixed order, so results are bitwise identical run
 * to run and for any number of OpenMP threads. There is no parallel
 * reduction anywhere. The build uses -std=c11, which implies
 * -ffp-contract=off: no FMA contraction, so a vectorised and a scalar loop
 * doing the same sum give the same bits. */
#include "backend/cpu/ops.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/mem.h"

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Hot loops are compiled for AVX2 and for the baseline, chosen at load
 * time. Vectorisation never changes the order of a sum here (see dot_f),
 * and without FMA contraction both versions give the same bits. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_CLONES
#endif

/* ------------------------------------------------------------------------
 * Embedding */

void mt_cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte,
                              size_t N, size_t C) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        MT_ASSERT(tokens[n] >= 0);
        memcpy(out + n * C, wte + (size_t)tokens[n] * C, C * sizeof(float));
    }
}

/* Rows of dwte can repeat, so threads split the columns, not the tokens:
 * each column block is summed over n in order by one thread. */
#define EMB_CB 16

void mt_cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens,
                               size_t N, size_t C, int64_t pad) {
    size_t nblocks = (C + EMB_CB - 1) / EMB_CB;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < nblocks; blk++) {
        size_t c0 = blk * EMB_CB, c1 = min_size(c0 + EMB_CB, C);
        for (size_t n = 0; n < N; n++) {
            MT_ASSERT(tokens[n] >= 0);
            if (tokens[n] == pad) continue;
            float *row = dwte + (size_t)tokens[n] * C;
            for (size_t c = c0; c < c1; c++) row[c] += dout[n * C + c];
        }
    }
}

/* ------------------------------------------------------------------------
 * RMSNorm, as Hugging Face: out = w * (x * rstd), rstd = 1/sqrt(mean(x^2)+eps).
 * Row sums are taken in double: cheap (C per row) and a better reference. */

static float rmsnorm_rstd(const float *x, size_t C, float eps) {
    double ss = 0.0;
    for (size_t c = 0; c < C; c++) ss += (double)x[c] * x[c];
    return 1.0f / sqrtf((float)(ss / (double)C) + eps);
}

/* The weight of column c: w[c], or Gemma's 1 + w[c] (as transformers, in fp32). */
static inline float norm_weight(const float *w, size_t c, bool one_plus) {
    return one_plus ? 1.0f + w[c] : w[c];
}

static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, size_t N,
                            size_t C, float eps, bool one_plus) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C;  // (C)
        float *o = out + n * C;        // (C)
        float r = rmsnorm_rstd(x, C, eps);
        for (size_t c = 0; c < C; c++) o[c] = norm_weight(w, c, one_plus) * (x[c] * r);
        if (rstd) rstd[n] = r;
    }
}

void mt_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
                            size_t N, size_t C, float eps) {
    rmsnorm_forward(out, rstd, inp, w, N, C, eps, false);
}

void mt_cpu_rmsnorm1p_forward(float *out, float *rstd, const float *inp, const float *w,
                              size_t N, size_t C, float eps) {
    rmsnorm_forward(out, rstd, inp, w, N, C, eps, true);
}

static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, size_t N, size_t C,
                             bool one_plus) {
    MT_ASSERT(rstd != NULL);
    // dx = rstd * (w*dout - x * rstd^2 * mean(w*dout*x))
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;  // (C)
        float *dx = dinp + n * C;                          // (C)
        float r = rstd[n];
        double dot = 0.0;
        for (size_t c = 0; c < C; c++) dot += (double)norm_weight(w, c, one_plus) * dy[c] * x[c];
        float k = r * r * (float)(dot / (double)C);
        for (size_t c = 0; c < C; c++)
            dx[c] += r * (norm_weight(w, c, one_plus) * dy[c] - x[c] * k);
    }
    // dw += sum over rows of dout * x * rstd; threads split the columns.
    size_t nblocks = (C + EMB_CB - 1) / EMB_CB;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < nblocks; blk++) {
        size_t c0 = blk * EMB_CB, c1 = min_size(c0 + EMB_CB, C);
        double acc[EMB_CB] = {0};
        for (size_t n = 0; n < N; n++)
            for (size_t c = c0; c < c1; c++)
                acc[c - c0] += (double)dout[n * C + c] * inp[n * C + c] * rstd[n];
        for (size_t c = c0; c < c1; c++) dw[c] += (float)acc[c - c0];
    }
}

void mt_cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, size_t N, size_t C) {
    rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, false);
}

void mt_cpu_rmsnorm1p_backward(float *dinp, float *dw, const float *dout, const float *inp,
                               const float *w, const float *rstd, size_t N, size_t C) {
    rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C, true);
}

/* ------------------------------------------------------------------------
 * LayerNorm, as torch.nn.LayerNorm: out = (x - mean) * rstd * w + b, rstd =
 * 1/sqrt(var + eps), var the biased variance. Row sums in double, as for
 * RMSNorm. */

void mt_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, size_t N, size_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C;  // (C)
        float *o = out + n * C;        // (C)
        double s = 0.0, ss = 0.0;
        for (size_t c = 0; c < C; c++) s += x[c];
        float m = (float)(s / (double)C);
        for (size_t c = 0; c < C; c++) ss += ((double)x[c] - m) * ((double)x[c] - m);
        float r = 1.0f / sqrtf((float)(ss / (double)C) + eps);
        for (size_t c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = r;
    }
}

void mt_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, size_t N, size_t C) {
    MT_ASSERT(mean != NULL && rstd != NULL);
    // xh = (x - mean) * rstd, g = w * dout:
    // dx = rstd * (g - mean(g) - xh * mean(g * xh))
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;  // (C)
        float *dx = dinp + n * C;                          // (C)
        float m = mean[n], r = rstd[n];
        double sg = 0.0, sgx = 0.0;
        for (size_t c = 0; c < C; c++) {
            double g = (double)w[c] * dy[c];
            sg += g;
            sgx += g * ((x[c] - m) * r);
        }
        float mg = (float)(sg / (double)C), mgx = (float)(sgx / (double)C);
        for (size_t c = 0; c < C; c++)
            dx[c] += r * (w[c] * dy[c] - mg - ((x[c] - m) * r) * mgx);
    }
    // dw += sum over rows of dout * xh, db += sum of dout; threads split the columns.
    size_t nblocks = (C + EMB_CB - 1) / EMB_CB;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < nblocks; blk++) {
        size_t c0 = blk * EMB_CB, c1 = min_size(c0 + EMB_CB, C);
        double aw[EMB_CB] = {0}, ab[EMB_CB] = {0};
        for (size_t n = 0; n < N; n++)
            for (size_t c = c0; c < c1; c++) {
                aw[c - c0] += (double)dout[n * C + c] * ((inp[n * C + c] - mean[n]) * rstd[n]);
                ab[c - c0] += dout[n * C + c];
            }
        for (size_t c = c0; c < c1; c++) {
            dw[c] += (float)aw[c - c0];
            db[c] += (float)ab[c - c0];
        }
    }
}

/* ------------------------------------------------------------------------
 * Matmul. All three products are computed by one tile kernel:
 *   c (nr, nc) += a (nr, nk) @ b (nk, nc)
 * over tiles of MM_NB rows and MM_OB columns, with k blocked by MM_KB so
 * that b's block stays in L1. The MM_NB x MM_OB accumulators live in
 * registers and the inner loop runs over contiguous columns of b, which the
 * compiler vectorises. Each element of c stays one sequential sum over k in
 * increasing order (k blocks are visited in order and each tile starts
 * from c's current value), whatever the tiling or the thread split. */

#define MM_NB 4    /* rows per register tile */
#define MM_OB 16   /* columns per register tile (two AVX2 vectors) */
#define MM_KB 256  /* k per block */

/* a's element (r, k) is a[r * a_rs + k * a_ks], so the same kernel reads
 * a row-major matrix or a transposed one. */
typedef struct mm_tile {
    float *c;
    size_t ldc;
    const float *a;
    size_t a_rs, a_ks;
    const float *b;
    size_t ldb;
    size_t nr, nk, nc;  /* nr <= MM_NB, nc <= MM_OB */
} mm_tile;

CPU_CLONES
static void mm_tile_full(const mm_tile *t) {
    float acc[MM_NB][MM_OB];
    for (size_t r = 0; r < MM_NB; r++)
        for (size_t j = 0; j < MM_OB; j++) acc[r][j] = r < t->nr ? t->c[r * t->ldc + j] : 0.0f;
    for (size_t k = 0; k < t->nk; k++) {
        const float *bk = t->b + k * t->ldb;
        // Fully unrolled, so that acc is held in registers.
#pragma GCC unroll 8
        for (size_t r = 0; r < MM_NB; r++) {
            float x = r < t->nr ? t->a[r * t->a_rs + k * t->a_ks] : 0.0f;
#pragma omp simd
            for (size_t j = 0; j < MM_OB; j++) acc[r][j] += x * bk[j];
        }
    }
    for (size_t r = 0; r < t->nr; r++)
        for (size_t j = 0; j < MM_OB; j++) t->c[r * t->ldc + j] = acc[r][j];
}

/* Same sums, for a tile narrower than MM_OB (b may not be readable past nc). */
static void mm_tile_edge(const mm_tile *t) {
    for (size_t r = 0; r < t->nr; r++)
        for (size_t j = 0; j < t->nc; j++) {
            float s = t->c[r * t->ldc + j];
            for (size_t k = 0; k < t->nk; k++)
                s += t->a[r * t->a_rs + k * t->a_ks] * t->b[k * t->ldb + j];
            t->c[r * t->ldc + j] = s;
        }
}

static void mm_tile_run(const mm_tile *t) {
    if (t->nc == MM_OB) mm_tile_full(t);
    else mm_tile_edge(t);
}

/* This thread's share [*lo, *hi) of n items. Each matmul thread keeps the
 * same rows for all blocks, so the blocks need no barrier between them
 * (barriers cost whole scheduler ticks when the cores are shared). */
static void thread_share(size_t n, size_t *lo, size_t *hi) {
    size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
    *lo = n * id / nt;
    *hi = n * (id + 1) / nt;
}

void mt_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                           size_t N, size_t IC, size_t OC) {
    size_t ngroups = (N + MM_NB - 1) / MM_NB;
#pragma omp parallel
    {
        float wt[MM_KB * MM_OB];  // (MM_KB, MM_OB) block of w, transposed, per thread
        size_t g0, g1;
        thread_share(ngroups, &g0, &g1);
        for (size_t n = g0 * MM_NB; n < min_size(g1 * MM_NB, N); n++)
            for (size_t o = 0; o < OC; o++) out[n * OC + o] = bias ? bias[o] : 0.0f;
        for (size_t ob = 0; ob < OC; ob += MM_OB) {
            size_t nc = min_size(MM_OB, OC - ob);
            for (size_t kb = 0; kb < IC; kb += MM_KB) {
                size_t nk = min_size(MM_KB, IC - kb);
                for (size_t k = 0; k < nk; k++)
                    for (size_t j = 0; j < nc; j++) wt[k * MM_OB + j] = w[(ob + j) * IC + kb + k];
                for (size_t g = g0; g < g1; g++) {
                    size_t n0 = g * MM_NB;
                    mm_tile t = {out + n0 * OC + ob, OC, inp + n0 * IC + kb, IC, 1,
                                 wt, MM_OB, min_size(MM_NB, N - n0), nk, nc};
                    mm_tile_run(&t);
                }
            }
        }
    }
}

/* A product c (R, NC) += a (R, K) @ b (K, NC), c and b row-major; a's
 * element (r, k) is a[r * a_rs + k * a_ks]. */
typedef struct mm_product {
    float *c;
    const float *a;
    size_t a_rs, a_ks;
    const float *b;
    size_t R, K, NC;
} mm_product;

/* The tile of p at rows r0.., k block kb.., columns ib... */
static void mm_product_tile(const mm_product *p, size_t r0, size_t kb, size_t ib) {
    mm_tile t = {p->c + r0 * p->NC + ib, p->NC, p->a + r0 * p->a_rs + kb * p->a_ks,
                 p->a_rs, p->a_ks, p->b + kb * p->NC + ib, p->NC,
                 min_size(MM_NB, p->R - r0), min_size(MM_KB, p->K - kb),
                 min_size(MM_OB, p->NC - ib)};
    mm_tile_run(&t);
}

/* p, threads splitting the rows of c by groups of MM_NB. The loop order
 * keeps in cache what is reused: with a row-major a (a_ks == 1), b's
 * (MM_KB, MM_OB) block across the row groups; with a transposed a (dout^T,
 * strided along k), a's tile across the column blocks. */
static void mm_product_run(const mm_product *p) {
    size_t ngroups = (p->R + MM_NB - 1) / MM_NB;
#pragma omp parallel
    {
        size_t g0, g1;
        thread_share(ngroups, &g0, &g1);
        if (p->a_ks == 1) {
            for (size_t ib = 0; ib < p->NC; ib += MM_OB)
                for (size_t kb = 0; kb < p->K; kb += MM_KB)
                    for (size_t g = g0; g < g1; g++) mm_product_tile(p, g * MM_NB, kb, ib);
        } else {
            for (size_t kb = 0; kb < p->K; kb += MM_KB)
                for (size_t g = g0; g < g1; g++)
                    for (size_t ib = 0; ib < p->NC; ib += MM_OB)
                        mm_product_tile(p, g * MM_NB, kb, ib);
        }
    }
}

void mt_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, size_t N, size_t IC, size_t OC) {
    /* dinp (N,IC) += dout (N,OC) @ w (OC,IC) */
    if (dinp) mm_product_run(&(mm_product){dinp, dout, OC, 1, w, N, OC, IC});
    /* dw (OC,IC) += dout^T (OC,N) @ inp (N,IC) */
    mm_product_run(&(mm_product){dw, dout, 1, OC, inp, OC, N, IC});
    if (dbias) {
        size_t nblocks = (OC + MM_OB - 1) / MM_OB;
#pragma omp parallel for schedule(static)
        for (size_t blk = 0; blk < nblocks; blk++) {
            size_t o0 = blk * MM_OB, o1 = min_size(o0 + MM_OB, OC);
            float acc[MM_OB];
            for (size_t o = o0; o < o1; o++) acc[o - o0] = dbias[o];
            for (size_t n = 0; n < N; n++)
                for (size_t o = o0; o < o1; o++) acc[o - o0] += dout[n * OC + o];
            for (size_t o = o0; o < o1; o++) dbias[o] = acc[o - o0];
        }
    }
}

/* ------------------------------------------------------------------------
 * RoPE, rotate-half: the pair (x[i], x[i + HD/2]) is rotated by the angle
 * whose cos/sin are cos[p][i], sin[p][i], p the token's position. The
 * backward rotates by -angle. */

static void rope_rotate(float *x, const float *cos, const float *sin, const int32_t *pos,
                        size_t B, size_t T, size_t H, size_t HD, size_t R, float sign) {
    size_t half = R / 2; /* R = HD, or the rotated leading dims (partial rotary) */
    MT_ASSERT(R % 2 == 0 && R <= HD);
#pragma omp parallel for collapse(2) schedule(static)
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++) {
            size_t p = pos ? (size_t)pos[b * T + t] : t;
            MT_ASSERT(p < T);
            const float *ct = cos + p * half, *st = sin + p * half;  // (HD/2)
            for (size_t h = 0; h < H; h++) {
                float *xh = x + ((b * T + t) * H + h) * HD;  // (HD)
                for (size_t i = 0; i < half; i++) {
                    float x1 = xh[i], x2 = xh[i + half], s = sign * st[i];
                    xh[i] = x1 * ct[i] - x2 * s;
                    xh[i + half] = x2 * ct[i] + x1 * s;
                }
            }
        }
}

void mt_cpu_rope_forward(float *x, const float *cos, const float *sin, const int32_t *pos,
                         size_t B, size_t T, size_t H, size_t HD) {
    rope_rotate(x, cos, sin, pos, B, T, H, HD, HD, 1.0f);
}

void mt_cpu_rope_backward(float *dx, const float *cos, const float *sin, const int32_t *pos,
                          size_t B, size_t T, size_t H, size_t HD) {
    rope_rotate(dx, cos, sin, pos, B, T, H, HD, HD, -1.0f);
}

void mt_cpu_rope_partial_forward(float *x, const float *cos, const float *sin,
                                 const int32_t *pos, size_t B, size_t T, size_t H, size_t HD,
                                 size_t R) {
    rope_rotate(x, cos, sin, pos, B, T, H, HD, R, 1.0f);
}

void mt_cpu_rope_partial_backward(float *dx, const float *cos, const float *sin,
                                  const int32_t *pos, size_t B, size_t T, size_t H, size_t HD,
                                  size_t R) {
    rope_rotate(dx, cos, sin, pos, B, T, H, HD, R, -1.0f);
}

/* ------------------------------------------------------------------------
 * Causal GQA attention. Layouts: q, out (B,T,NH,HD); k, v (B,T,NKV,HD);
 * lse (B,NH,T). Softmax in fp32 with the row max subtracted. Query t sees
 * keys j0 .. t, j0 the start of its document (0 without positions), or of
 * its window (mt_cpu_attn_opts) where that starts later.
 *
 * A thread works on one head at a time and first copies that head's keys
 * (and values, in the backward) transposed to (HD, T), so that a row of
 * scores is HD vectorised passes over the keys j. Each score is still the
 * plain sum over d in order, so the bits do not depend on the vector
 * width. */

/* opts with the defaults filled in: the scale 1/sqrt(HD). */
static mt_cpu_attn_opts attention_opts(const mt_cpu_attn_opts *o, size_t HD) {
    mt_cpu_attn_opts r = o ? *o : (mt_cpu_attn_opts){0};
    if (r.scale == 0.0f) r.scale = (float)(1.0 / sqrt((double)HD));
    return r;
}

/* First key query t of row b sees: its document's start, or its window's
 * (keys j with t - j < window, as transformers' sliding_window_overlay). */
static inline size_t first_key(const int32_t *pos, size_t b, size_t t, size_t T,
                               size_t window) {
    size_t j0 = pos ? t - (size_t)pos[b * T + t] : 0;
    return window && t + 1 > window + j0 ? t + 1 - window : j0;
}

/* A scaled score, soft-capped as transformers does: cap * tanh(s / cap). */
static inline float capped_score(float s, float cap) {
    return cap != 0.0f ? tanhf(s / cap) * cap : s;
}

/* xt (HD, T) = one head of x, whose rows t are at x + t * stride. */
static void transpose_head(float *xt, const float *x, size_t T, size_t stride, size_t HD) {
    for (size_t j = 0; j < T; j++)
        for (size_t d = 0; d < HD; d++) xt[d * T + j] = x[j * stride + d];
}

/* s[j] = sum over d of a[d] * bt[d][j], for j0 <= j <= t; bt is (HD, T). */
static inline void score_row(float *s, const float *a, const float *bt, size_t j0, size_t t,
                             size_t T, size_t HD) {
    for (size_t j = j0; j <= t; j++) s[j] = 0.0f;
    for (size_t d = 0; d < HD; d++) {
        float ad = a[d];
        const float *btd = bt + d * T;
#pragma omp simd
        for (size_t j = j0; j <= t; j++) s[j] += ad * btd[j];
    }
}

/* All rows of query head h in batch row b. Scratch: kt (HD, T), att (T). */
CPU_CLONES
static void attention_forward_head(float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *pos, float *kt, float *att,
                                   size_t b, size_t h, size_t T, size_t NH, size_t NKV,
                                   size_t HD, const mt_cpu_attn_opts *opt) {
    size_t q_stride = NH * HD, kv_stride = NKV * HD;
    size_t kv_off = b * T * kv_stride + h / (NH / NKV) * HD;
    const float *vh = v + kv_off;
    float scale = opt->scale;
    transpose_head(kt, k + kv_off, T, kv_stride, HD);
    for (size_t t = 0; t < T; t++) {
        size_t off = (b * T + t) * q_stride + h * HD, j0 = first_key(pos, b, t, T, opt->window);
        float *o = out + off;  // (HD)
        score_row(att, q + off, kt, j0, t, T, HD);
        float m = -INFINITY;
        for (size_t j = j0; j <= t; j++) {
            att[j] = capped_score(att[j] * scale, opt->softcap);
            m = att[j] > m ? att[j] : m;
        }
        double sum = 0.0;
        for (size_t d = 0; d < HD; d++) o[d] = 0.0f;
        for (size_t j = j0; j <= t; j++) {
            float p = expf(att[j] - m);
            sum += p;
            const float *vj = vh + j * kv_stride;
#pragma omp simd
            for (size_t d = 0; d < HD; d++) o[d] += p * vj[d];
        }
        float inv = (float)(1.0 / sum);
        for (size_t d = 0; d < HD; d++) o[d] *= inv;
        lse[(b * NH + h) * T + t] = m + (float)log(sum);
    }
}

void mt_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *pos, size_t B, size_t T,
                              size_t NH, size_t NKV, size_t HD) {
    mt_cpu_attention_forward_opts(out, lse, q, k, v, pos, B, T, NH, NKV, HD, NULL);
}

void mt_cpu_attention_forward_opts(float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *pos, size_t B, size_t T,
                                   size_t NH, size_t NKV, size_t HD,
                                   const mt_cpu_attn_opts *opts) {
    MT_ASSERT(NKV > 0 && NH % NKV == 0);
    mt_cpu_attn_opts o = attention_opts(opts, HD);
#pragma omp parallel
    {
        float *kt = mt_malloc_or_die(HD * T * sizeof(float));  // (HD, T)
        float *att = mt_malloc_or_die(T * sizeof(float));      // (T) one score row
        // Every (b, h) costs about the same, so a static split balances the threads.
#pragma omp for collapse(2) schedule(static)
        for (size_t b = 0; b < B; b++)
            for (size_t h = 0; h < NH; h++)
                attention_forward_head(out, lse, q, k, v, pos, kt, att, b, h, T, NH, NKV, HD,
                                       &o);
        free(kt);
        free(att);
    }
}

/* Scratch of one thread in the backward. */
typedef struct attn_scratch {
    float *kt, *vt;  // (HD, T) this kv head's keys and values, transposed
    float *p, *ds;   // (T) one row of probabilities and of score gradients
} attn_scratch;

/* Backward for the query heads sharing kv head `kvh` of batch row b. One
 * thread owns (b, kvh): it alone writes dk, dv of that head and dq of its
 * query heads, in a fixed order. */
CPU_CLONES
static void attention_backward_group(float *dq, float *dk, float *dv, const float *dout,
                                     const float *q, const float *k, const float *v,
                                     const float *out, const float *lse, const int32_t *pos,
                                     const attn_scratch *sc, size_t b, size_t kvh, size_t T,
                                     size_t NH, size_t NKV, size_t HD,
                                     const mt_cpu_attn_opts *o) {
    size_t group = NH / NKV, kv_stride = NKV * HD, q_stride = NH * HD;
    float scale = o->scale, cap = o->softcap;
    size_t kv_off = b * T * kv_stride + kvh * HD;
    const float *kh = k + kv_off;
    float *dkh = dk + kv_off, *dvh = dv + kv_off;
    transpose_head(sc->kt, kh, T, kv_stride, HD);
    transpose_head(sc->vt, v + kv_off, T, kv_stride, HD);
    for (size_t j = 0; j < T; j++)
        for (size_t d = 0; d < HD; d++) dkh[j * kv_stride + d] = dvh[j * kv_stride + d] = 0.0f;
    for (size_t h = kvh * group; h < (kvh + 1) * group; h++) {
        for (size_t t = 0; t < T; t++) {
            size_t off = (b * T + t) * q_stride + h * HD, j0 = first_key(pos, b, t, T, o->window);
            const float *qt = q + off, *dyt = dout + off, *ot = out + off;  // (HD)
            float *dqt = dq + off;                                          // (HD)
            float l = lse[(b * NH + h) * T + t];
            float D = 0.0f;  // rowsum(dO * O)
            for (size_t d = 0; d < HD; d++) D += dyt[d] * ot[d];
            // P recomputed from q, k and lse; dP = dO V^T; dS = P * (dP - D),
            // times the soft-cap's derivative 1 - tanh^2 where there is one.
            score_row(sc->p, qt, sc->kt, j0, t, T, HD);
            score_row(sc->ds, dyt, sc->vt, j0, t, T, HD);
            for (size_t j = j0; j <= t; j++) {
                float th = cap != 0.0f ? tanhf(sc->p[j] * scale / cap) : 0.0f;
                float s = cap != 0.0f ? th * cap : sc->p[j] * scale;
                sc->p[j] = expf(s - l);
                sc->ds[j] = sc->p[j] * (sc->ds[j] - D) * (1.0f - th * th);
            }
            for (size_t d = 0; d < HD; d++) dqt[d] = 0.0f;
            for (size_t j = j0; j <= t; j++) {
                const float *kj = kh + j * kv_stride;
                float *dkj = dkh + j * kv_stride, *dvj = dvh + j * kv_stride;
                float ds = sc->ds[j], ds_scaled = ds * scale, p = sc->p[j];
#pragma omp simd
                for (size_t d = 0; d < HD; d++) {
                    dqt[d] += ds * kj[d];
                    dkj[d] += ds_scaled * qt[d];
                    dvj[d] += p * dyt[d];
                }
            }
            for (size_t d = 0; d < HD; d++) dqt[d] *= scale;
        }
    }
}

void mt_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const int32_t *pos,
                               size_t B, size_t T, size_t NH, size_t NKV, size_t HD) {
    mt_cpu_attention_backward_opts(dq, dk, dv, dout, q, k, v, out, lse, pos, B, T, NH, NKV, HD,
                                   NULL);
}

void mt_cpu_attention_backward_opts(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *out, const float *lse, const int32_t *pos,
                                    size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                                    const mt_cpu_attn_opts *opts) {
    MT_ASSERT(NKV > 0 && NH % NKV == 0);
    mt_cpu_attn_opts o = attention_opts(opts, HD);
#pragma omp parallel
    {
        attn_scratch sc = {mt_malloc_or_die(HD * T * sizeof(float)),
                           mt_malloc_or_die(HD * T * sizeof(float)),
                           mt_malloc_or_die(T * sizeof(float)),
                           mt_malloc_or_die(T * sizeof(float))};
        // Every (b, kvh) costs about the same, so a static split balances the threads.
#pragma omp for collapse(2) schedule(static)
        for (size_t b = 0; b < B; b++)
            for (size_t kvh = 0; kvh < NKV; kvh++)
                attention_backward_group(dq, dk, dv, dout, q, k, v, out, lse, pos, &sc, b, kvh,
                                         T, NH, NKV, HD, &o);
        free(sc.kt);
        free(sc.vt);
        free(sc.p);
        free(sc.ds);
    }
}

/* ------------------------------------------------------------------------
 * SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g). */

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* GELU in double: the erf form 0.5 x (1 + erf(x / sqrt 2)), or the tanh
 * form 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2 / pi). */
#define GELU_K 0.7978845608028654
#define GELU_A 0.044715

static inline float gelu(float xf, int tanh_form) {
    double x = xf;
    if (tanh_form) return (float)(0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_A * x * x * x))));
    return (float)(0.5 * x * (1.0 + erf(x * M_SQRT1_2)));
}

static inline float gelu_grad(float xf, int tanh_form) {
    double x = xf;
    if (tanh_form) {
        double t = tanh(GELU_K * (x + GELU_A * x * x * x));
        return (float)(0.5 * (1.0 + t) +
                       0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_A * x * x));
    }
    return (float)(0.5 * (1.0 + erf(x * M_SQRT1_2)) + x * exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2));
}

void mt_cpu_gelu_forward(float *out, const float *inp, size_t n, int tanh_form) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = gelu(inp[i], tanh_form);
}

void mt_cpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n,
                          int tanh_form) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * gelu_grad(inp[i], tanh_form);
}

void mt_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t N, size_t F) {
    size_t n_el = N * F;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n_el; i++) out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

void mt_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t N, size_t F) {
    size_t n_el = N * F;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n_el; i++) {
        float g = gate[i], s = sigmoidf(g);
        // d silu(g)/dg = s * (1 + g * (1 - s))
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dout[i] * g * s;
    }
}

/* ------------------------------------------------------------------------
 * Cross-entropy. Row losses are summed in row order, a chunk at a time, so
 * the total does not depend on the thread count. */

#define CE_CHUNK 4096

/* Loss of one valid row; writes its gradient row when drow != NULL (drow
 * may alias x, so x[target] is read first). */
static double cross_entropy_row(float *drow, const float *x, int32_t target, size_t V,
                                float dscale) {
    float m = -INFINITY;
    for (size_t i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
    double sum = 0.0;
    for (size_t i = 0; i < V; i++) sum += exp((double)(x[i] - m));
    float lse = m + (float)log(sum);
    double loss = (double)lse - (double)x[target];
    if (drow) {
        for (size_t i = 0; i < V; i++) {
            float p = expf(x[i] - lse);
            drow[i] = (p - (i == (size_t)target ? 1.0f : 0.0f)) * dscale;
        }
    }
    return loss;
}

/* Both cross-entropies: row n's gradient scale is w[n], or dscale when w
 * is NULL; nll (may be NULL) receives each row's loss. */
static double cross_entropy_any(float *dlogits, float *nll, const float *logits,
                                const int32_t *targets, const float *w, size_t N, size_t V,
                                float dscale) {
    double total = 0.0;
    for (size_t n0 = 0; n0 < N; n0 += CE_CHUNK) {
        size_t cnt = min_size(CE_CHUNK, N - n0);
        double loss[CE_CHUNK];
#pragma omp parallel for schedule(static)
        for (size_t r = 0; r < cnt; r++) {
            size_t n = n0 + r;
            int32_t tgt = targets[n];
            float *drow = dlogits ? dlogits + n * V : NULL;
            loss[r] = 0.0;
            if (tgt == MT_IGNORE_INDEX) {
                if (drow) memset(drow, 0, V * sizeof(float));
                continue;
            }
            MT_ASSERT(tgt >= 0 && (size_t)tgt < V);
            loss[r] = cross_entropy_row(drow, logits + n * V, tgt, V, w ? w[n] : dscale);
        }
        for (size_t r = 0; r < cnt; r++) {
            total += loss[r];
            if (nll) nll[n0 + r] = (float)loss[r];
        }
    }
    return total;
}

double mt_cpu_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                            size_t N, size_t V, float dscale) {
    return cross_entropy_any(dlogits, NULL, logits, targets, NULL, N, V, dscale);
}

double mt_cpu_cross_entropy_weighted(float *dlogits, float *nll, const float *logits,
                                     const int32_t *targets, const float *w, size_t N,
                                     size_t V) {
    return cross_entropy_any(dlogits, nll, logits, targets, w, N, V, 0.0f);
}
