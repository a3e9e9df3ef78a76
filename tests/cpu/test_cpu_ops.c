/* Tests of the CPU reference operators (src/backend/cpu/ops.c).
 *
 * Forwards are compared with naive double-precision implementations written
 * here (different loops: e.g. attention materialises the full masked score
 * matrix). Backwards are compared with central finite differences of the
 * double implementation, for the loss sum(out * R) with a random R, or, at
 * sizes too large for finite differences, with the exact gradient formula
 * in double. Outputs are poisoned with NaN first to prove every element is
 * written; gradients are pre-filled to check the += contract. */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"
#include "testlib.h"

/* Tolerances (norm-wise relative error, mt_test_rel_err):
 * FWD_TOL: an fp32 op against the double reference. A sequential fp32 sum
 *   of K terms errs by at most K * 2^-24 relative (K <= 300 here: 1.8e-5),
 *   typically sqrt(K) * 2^-24 ~ 1e-6 per element, less norm-wise; measured
 *   4e-8..3.3e-7 over all ops. 2e-6 leaves 6x margin; a wrong or missing
 *   term gives errors of order 1e-2..1.
 * GRAD_TOL: an fp32 backward against double central differences with
 *   FD_EPS = 1e-4: truncation ~ FD_EPS^2 ~ 1e-8 relative, rounding
 *   ~ 1e-16 / FD_EPS ~ 1e-12, so the error is the fp32 rounding of the
 *   backward itself: measured 4e-8..3.2e-7. Same 2e-6 bound. */
#define FWD_TOL 2e-6
#define GRAD_TOL 2e-6
#define FD_EPS 1e-4

/* ------------------------------------------------------------------------
 * Helpers */

static float *randf(size_t n, unsigned long long seed, float lo, float hi) {
    float *x = malloc(n * sizeof(float));
    cr_assert(x);
    mt_test_fill_uniform(x, n, seed, lo, hi);
    return x;
}

static float *nanf_buf(size_t n) {
    float *x = malloc(n * sizeof(float));
    cr_assert(x);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static double *to_d(const float *x, size_t n) {
    double *d = malloc(n * sizeof(double));
    cr_assert(d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float *to_f(const double *x, size_t n) {
    float *f = malloc(n * sizeof(float));
    cr_assert(f);
    for (size_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}

static float *copyf(const float *x, size_t n) {
    float *c = malloc(n * sizeof(float));
    cr_assert(c);
    memcpy(c, x, n * sizeof(float));
    return c;
}

static double dot_d(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void expect_close(const float *got, const double *want, size_t n, double tol,
                         const char *what) {
    float *w = to_f(want, n);
    double err = mt_test_rel_err(got, w, n);
    cr_expect(err <= tol, "%s: relative error %.3g > %.3g", what, err, tol);
    free(w);
}

/* got - base must equal want (the += contract), checked as a relative error
 * of the increment. */
static void expect_increment(const float *got, const float *base, const double *want,
                             size_t n, double tol, const char *what) {
    float *inc = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) inc[i] = got[i] - base[i];
    expect_close(inc, want, n, tol, what);
    free(inc);
}

/* Central differences of loss(ctx) with respect to x (n), in double. */
typedef double (*loss_fn)(void *ctx);

static void fd_grad(double *grad, double *x, size_t n, loss_fn loss, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + FD_EPS;
        double lp = loss(ctx);
        x[i] = saved - FD_EPS;
        double lm = loss(ctx);
        x[i] = saved;
        grad[i] = (lp - lm) / (2 * FD_EPS);
    }
}

static bool all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* ------------------------------------------------------------------------
 * Embedding */

Test(cpu_ops, embedding_forward_and_backward) {
    size_t V = 9, C = 37, N = 7;
    int32_t tokens[] = {3, 0, 8, 3, 5, 3, 0};  // repeats must accumulate
    float *wte = randf(V * C, 1, -1, 1), *out = nanf_buf(N * C);
    mt_cpu_embedding_forward(out, tokens, wte, N, C);
    for (size_t n = 0; n < N; n++)
        cr_assert(memcmp(out + n * C, wte + tokens[n] * C, C * sizeof(float)) == 0);

    float *dout = randf(N * C, 2, -1, 1), *dwte = randf(V * C, 3, -1, 1);
    float *base = copyf(dwte, V * C);
    double *want = calloc(V * C, sizeof(double));
    for (size_t n = 0; n < N; n++)
        for (size_t c = 0; c < C; c++) want[tokens[n] * C + c] += dout[n * C + c];
    mt_cpu_embedding_backward(dwte, dout, tokens, N, C, -1);
    expect_increment(dwte, base, want, V * C, 1e-6, "dwte");  // sums of <= 3 terms
    free(wte); free(out); free(dout); free(dwte); free(base); free(want);
}

/* nn.Embedding's padding_idx: the pad token's rows add nothing to its row,
 * not even rounding (the row keeps its bits); the other rows as without. */
Test(cpu_ops, embedding_backward_skips_the_padding_index) {
    size_t V = 9, C = 37, N = 7;
    int32_t tokens[] = {3, 0, 8, 3, 5, 3, 0};
    float *dout = randf(N * C, 2, -1, 1), *dwte = randf(V * C, 3, -1, 1);
    float *plain = copyf(dwte, V * C), *base = copyf(dwte, V * C);
    mt_cpu_embedding_backward(plain, dout, tokens, N, C, -1);
    mt_cpu_embedding_backward(dwte, dout, tokens, N, C, 3);
    for (size_t v = 0; v < V; v++) {
        const float *want = (v == 3 ? base : plain) + v * C;
        cr_assert(memcmp(dwte + v * C, want, C * sizeof(float)) == 0, "row %zu", v);
    }
    free(dout); free(dwte); free(plain); free(base);
}

/* ------------------------------------------------------------------------
 * RMSNorm */

typedef struct {
    double *x, *w, *R;
    size_t N, C;
    double eps;
} rms_ctx;

static void rmsnorm_ref(double *out, const double *x, const double *w, size_t N, size_t C,
                        double eps) {
    for (size_t n = 0; n < N; n++) {
        double ms = dot_d(x + n * C, x + n * C, C) / C;
        for (size_t c = 0; c < C; c++) out[n * C + c] = w[c] * x[n * C + c] / sqrt(ms + eps);
    }
}

static double rms_loss(void *p) {
    rms_ctx *c = p;
    double *out = malloc(c->N * c->C * sizeof(double));
    rmsnorm_ref(out, c->x, c->w, c->N, c->C, c->eps);
    double l = dot_d(out, c->R, c->N * c->C);
    free(out);
    return l;
}

Test(cpu_ops, rmsnorm_forward_backward) {
    size_t N = 7, C = 13;
    float eps = 1e-5f;
    float *x = randf(N * C, 10, -2, 2), *w = randf(C, 11, 0.5f, 1.5f);
    float *out = nanf_buf(N * C), *rstd = nanf_buf(N);
    mt_cpu_rmsnorm_forward(out, rstd, x, w, N, C, eps);
    rms_ctx ctx = {to_d(x, N * C), to_d(w, C), NULL, N, C, eps};
    double *want = malloc(N * C * sizeof(double));
    rmsnorm_ref(want, ctx.x, ctx.w, N, C, eps);
    expect_close(out, want, N * C, FWD_TOL, "rmsnorm out");
    float *out2 = nanf_buf(N * C);
    mt_cpu_rmsnorm_forward(out2, NULL, x, w, N, C, eps);  // rstd is optional
    cr_expect(memcmp(out, out2, N * C * sizeof(float)) == 0);

    float *R = randf(N * C, 12, -1, 1);
    ctx.R = to_d(R, N * C);
    double *gx = malloc(N * C * sizeof(double)), *gw = malloc(C * sizeof(double));
    fd_grad(gx, ctx.x, N * C, rms_loss, &ctx);
    fd_grad(gw, ctx.w, C, rms_loss, &ctx);
    float *dx = randf(N * C, 13, -1, 1), *dw = randf(C, 14, -1, 1);
    float *dx0 = copyf(dx, N * C), *dw0 = copyf(dw, C);
    mt_cpu_rmsnorm_backward(dx, dw, R, x, w, rstd, N, C);
    expect_increment(dx, dx0, gx, N * C, GRAD_TOL, "rmsnorm dx");
    expect_increment(dw, dw0, gw, C, GRAD_TOL, "rmsnorm dw");
    free(x); free(w); free(out); free(out2); free(rstd); free(want); free(R);
    free(gx); free(gw); free(dx); free(dw); free(dx0); free(dw0);
    free(ctx.x); free(ctx.w); free(ctx.R);
}

/* Gemma's norm by 1 + w is the RMSNorm by the weight 1 + w, bit for bit,
 * with the same gradients (d/dw of 1 + w is 1). */
Test(cpu_ops, rmsnorm1p_is_rmsnorm_by_one_plus_w) {
    size_t N = 5, C = 11;
    float *x = randf(N * C, 15, -2, 2), *w = randf(C, 16, -0.5f, 0.5f), *w1 = copyf(w, C);
    for (size_t c = 0; c < C; c++) w1[c] = 1.0f + w[c];
    float *a = nanf_buf(N * C), *b = nanf_buf(N * C), *ra = nanf_buf(N), *rb = nanf_buf(N);
    mt_cpu_rmsnorm1p_forward(a, ra, x, w, N, C, 1e-6f);
    mt_cpu_rmsnorm_forward(b, rb, x, w1, N, C, 1e-6f);
    cr_expect(memcmp(a, b, N * C * sizeof(float)) == 0 && memcmp(ra, rb, N * sizeof(float)) == 0);
    float *R = randf(N * C, 17, -1, 1);
    float *dxa = randf(N * C, 18, -1, 1), *dxb = copyf(dxa, N * C);
    float *dwa = randf(C, 19, -1, 1), *dwb = copyf(dwa, C);
    mt_cpu_rmsnorm1p_backward(dxa, dwa, R, x, w, ra, N, C);
    mt_cpu_rmsnorm_backward(dxb, dwb, R, x, w1, rb, N, C);
    cr_expect(memcmp(dxa, dxb, N * C * sizeof(float)) == 0);
    cr_expect(memcmp(dwa, dwb, C * sizeof(float)) == 0);
    free(x); free(w); free(w1); free(a); free(b); free(ra); free(rb); free(R);
    free(dxa); free(dxb); free(dwa); free(dwb);
}

/* ------------------------------------------------------------------------
 * Matmul */

typedef struct {
    double *x, *w, *bias, *R;
    size_t N, IC, OC;
} mm_ctx;

static void matmul_ref(double *out, const double *x, const double *w, const double *bias,
                       size_t N, size_t IC, size_t OC) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (size_t i = 0; i < IC; i++) s += x[n * IC + i] * w[o * IC + i];
            out[n * OC + o] = s;
        }
}

static double mm_loss(void *p) {
    mm_ctx *c = p;
    double *out = malloc(c->N * c->OC * sizeof(double));
    matmul_ref(out, c->x, c->w, c->bias, c->N, c->IC, c->OC);
    double l = dot_d(out, c->R, c->N * c->OC);
    free(out);
    return l;
}

/* Forward against the double reference, with and without bias. */
static void check_matmul_forward(size_t N, size_t IC, size_t OC) {
    float *x = randf(N * IC, 20, -1, 1), *w = randf(OC * IC, 21, -1, 1);
    float *bias = randf(OC, 22, -1, 1), *out = nanf_buf(N * OC);
    double *xd = to_d(x, N * IC), *wd = to_d(w, OC * IC), *bd = to_d(bias, OC);
    double *want = malloc(N * OC * sizeof(double));
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        for (size_t i = 0; i < N * OC; i++) out[i] = NAN;
        mt_cpu_matmul_forward(out, x, w, with_bias ? bias : NULL, N, IC, OC);
        matmul_ref(want, xd, wd, with_bias ? bd : NULL, N, IC, OC);
        expect_close(out, want, N * OC, FWD_TOL, "matmul out");
    }
    free(x); free(w); free(bias); free(out); free(xd); free(wd); free(bd); free(want);
}

Test(cpu_ops, matmul_forward_small_odd) { check_matmul_forward(7, 13, 11); }

/* Crosses the kernel's tiles: N % 4 != 0, IC > 256 (two k blocks), OC with
 * full 16-column tiles and an edge. */
Test(cpu_ops, matmul_forward_tiled) { check_matmul_forward(67, 300, 37); }

Test(cpu_ops, matmul_backward_finite_differences) {
    size_t N = 7, IC = 13, OC = 11;
    float *x = randf(N * IC, 30, -1, 1), *w = randf(OC * IC, 31, -1, 1);
    float *bias = randf(OC, 32, -1, 1), *R = randf(N * OC, 33, -1, 1);
    mm_ctx ctx = {to_d(x, N * IC), to_d(w, OC * IC), to_d(bias, OC), to_d(R, N * OC), N, IC, OC};
    double *gx = malloc(N * IC * sizeof(double)), *gw = malloc(OC * IC * sizeof(double));
    double *gb = malloc(OC * sizeof(double));
    fd_grad(gx, ctx.x, N * IC, mm_loss, &ctx);
    fd_grad(gw, ctx.w, OC * IC, mm_loss, &ctx);
    fd_grad(gb, ctx.bias, OC, mm_loss, &ctx);
    float *dx = randf(N * IC, 34, -1, 1), *dw = randf(OC * IC, 35, -1, 1);
    float *db = randf(OC, 36, -1, 1);
    float *dx0 = copyf(dx, N * IC), *dw0 = copyf(dw, OC * IC), *db0 = copyf(db, OC);
    mt_cpu_matmul_backward(dx, dw, db, R, x, w, N, IC, OC);
    expect_increment(dx, dx0, gx, N * IC, GRAD_TOL, "matmul dinp");
    expect_increment(dw, dw0, gw, OC * IC, GRAD_TOL, "matmul dw");
    expect_increment(db, db0, gb, OC, GRAD_TOL, "matmul dbias");

    // dinp and dbias are optional: dw must not change when they are NULL.
    float *dw2 = copyf(dw0, OC * IC);
    mt_cpu_matmul_backward(NULL, dw2, NULL, R, x, w, N, IC, OC);
    cr_expect(memcmp(dw2, dw, OC * IC * sizeof(float)) == 0);
    free(x); free(w); free(bias); free(R); free(gx); free(gw); free(gb);
    free(dx); free(dw); free(db); free(dx0); free(dw0); free(db0); free(dw2);
    free(ctx.x); free(ctx.w); free(ctx.bias); free(ctx.R);
}

/* At tiled sizes finite differences are too slow; the gradient formulas
 * (validated above) are evaluated in double instead. */
Test(cpu_ops, matmul_backward_tiled) {
    size_t N = 267, IC = 37, OC = 300;  // N > 256: two k blocks for dw
    float *x = randf(N * IC, 40, -1, 1), *w = randf(OC * IC, 41, -1, 1);
    float *dout = randf(N * OC, 42, -1, 1);
    double *gx = calloc(N * IC, sizeof(double)), *gw = calloc(OC * IC, sizeof(double));
    double *gb = calloc(OC, sizeof(double));
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double d = dout[n * OC + o];
            gb[o] += d;
            for (size_t i = 0; i < IC; i++) {
                gx[n * IC + i] += d * w[o * IC + i];
                gw[o * IC + i] += d * x[n * IC + i];
            }
        }
    float *dx = randf(N * IC, 43, -1, 1), *dw = randf(OC * IC, 44, -1, 1);
    float *db = randf(OC, 45, -1, 1);
    float *dx0 = copyf(dx, N * IC), *dw0 = copyf(dw, OC * IC), *db0 = copyf(db, OC);
    mt_cpu_matmul_backward(dx, dw, db, dout, x, w, N, IC, OC);
    expect_increment(dx, dx0, gx, N * IC, FWD_TOL, "matmul dinp");
    expect_increment(dw, dw0, gw, OC * IC, FWD_TOL, "matmul dw");
    expect_increment(db, db0, gb, OC, FWD_TOL, "matmul dbias");
    free(x); free(w); free(dout); free(gx); free(gw); free(gb);
    free(dx); free(dw); free(db); free(dx0); free(dw0); free(db0);
}

Test(cpu_ops, matmul_bitwise_independent_of_thread_count) {
    size_t N = 67, IC = 300, OC = 37;
    float *x = randf(N * IC, 50, -1, 1), *w = randf(OC * IC, 51, -1, 1);
    float *bias = randf(OC, 52, -1, 1), *dout = randf(N * OC, 53, -1, 1);
    float *res[2][4];
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r + 1);
        res[r][0] = nanf_buf(N * OC);
        mt_cpu_matmul_forward(res[r][0], x, w, bias, N, IC, OC);
        res[r][1] = randf(N * IC, 54, -1, 1);
        res[r][2] = randf(OC * IC, 55, -1, 1);
        res[r][3] = randf(OC, 56, -1, 1);
        mt_cpu_matmul_backward(res[r][1], res[r][2], res[r][3], dout, x, w, N, IC, OC);
    }
    size_t sizes[4] = {N * OC, N * IC, OC * IC, OC};
    for (int i = 0; i < 4; i++) {
        cr_expect(memcmp(res[0][i], res[1][i], sizes[i] * sizeof(float)) == 0,
                  "output %d differs between 1 and 2 threads", i);
        free(res[0][i]); free(res[1][i]);
    }
    free(x); free(w); free(bias); free(dout);
}

/* ------------------------------------------------------------------------
 * RoPE */

typedef struct {
    double *x, *R;
    const float *cos, *sin;
    const int32_t *pos;
    size_t B, T, H, HD;
} rope_ctx;

/* Rotates pairs (i, i+HD/2) written as a 2x2 matrix product, by the angle
 * of position pos[b*T+t] (t when pos is NULL). */
static void rope_ref(double *out, const double *x, const float *cos, const float *sin,
                     const int32_t *pos, size_t B, size_t T, size_t H, size_t HD) {
    size_t half = HD / 2;
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t h = 0; h < H; h++)
                for (size_t i = 0; i < half; i++) {
                    size_t base = ((b * T + t) * H + h) * HD, p = pos ? (size_t)pos[b * T + t] : t;
                    double c = cos[p * half + i], s = sin[p * half + i];
                    double rot[2][2] = {{c, -s}, {s, c}};
                    double v[2] = {x[base + i], x[base + i + half]};
                    out[base + i] = rot[0][0] * v[0] + rot[0][1] * v[1];
                    out[base + i + half] = rot[1][0] * v[0] + rot[1][1] * v[1];
                }
}

static double rope_loss(void *p) {
    rope_ctx *c = p;
    size_t n = c->B * c->T * c->H * c->HD;
    double *out = malloc(n * sizeof(double));
    rope_ref(out, c->x, c->cos, c->sin, c->pos, c->B, c->T, c->H, c->HD);
    double l = dot_d(out, c->R, n);
    free(out);
    return l;
}

/* pos: NULL, or the positions of packed documents (B, T). */
static void check_rope(const int32_t *pos) {
    size_t B = 2, T = 5, H = 3, HD = 6, half = HD / 2, n = B * T * H * HD;
    float *cos = malloc(T * half * sizeof(float)), *sin = malloc(T * half * sizeof(float));
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            float a = (float)t * (0.7f + 0.3f * (float)i);
            cos[t * half + i] = cosf(a);
            sin[t * half + i] = sinf(a);
        }
    float *x = randf(n, 60, -1, 1), *y = copyf(x, n);
    mt_cpu_rope_forward(y, cos, sin, pos, B, T, H, HD);
    rope_ctx ctx = {to_d(x, n), NULL, cos, sin, pos, B, T, H, HD};
    double *want = malloc(n * sizeof(double));
    rope_ref(want, ctx.x, cos, sin, pos, B, T, H, HD);
    expect_close(y, want, n, FWD_TOL, "rope out");

    float *R = randf(n, 61, -1, 1), *dx = copyf(R, n);
    ctx.R = to_d(R, n);
    double *g = malloc(n * sizeof(double));
    fd_grad(g, ctx.x, n, rope_loss, &ctx);
    mt_cpu_rope_backward(dx, cos, sin, pos, B, T, H, HD);
    expect_close(dx, g, n, GRAD_TOL, "rope dx");
    free(cos); free(sin); free(x); free(y); free(want); free(R); free(dx); free(g);
    free(ctx.x); free(ctx.R);
}

Test(cpu_ops, rope_forward_backward) { check_rope(NULL); }

/* Positions that restart: documents of 2, 3 | 1, 4 tokens in two rows. */
Test(cpu_ops, rope_packed_positions) {
    static const int32_t pos[10] = {0, 1, 0, 1, 2, 0, 0, 1, 2, 3};
    check_rope(pos);
}

/* ------------------------------------------------------------------------
 * Attention */

typedef struct {
    double *q, *k, *v, *R;
    const int32_t *pos;
    size_t B, T, NH, NKV, HD;
    const mt_cpu_attn_opts *opts; /* NULL: the plain attention */
} attn_ctx;

/* A score as opts make it: scaled (1/sqrt(HD) by default), soft-capped. */
static double score_ref(double dot, const attn_ctx *c) {
    double scale = c->opts && c->opts->scale ? c->opts->scale : 1.0 / sqrt((double)c->HD);
    double s = dot * scale, cap = c->opts ? c->opts->softcap : 0;
    return cap ? cap * tanh(s / cap) : s;
}

/* Materialises the full (T,T) score matrix of each (b, h) with the causal
 * mask as -inf (and, with positions, every key before the query's
 * document start i - pos[i]; with a window w, every key j with i - j >= w),
 * then softmax and P @ V. lse may be NULL. */
static void attention_ref(double *out, double *lse, const attn_ctx *c) {
    size_t T = c->T, HD = c->HD, NH = c->NH, NKV = c->NKV;
    double *S = malloc(T * T * sizeof(double));
    for (size_t b = 0; b < c->B; b++)
        for (size_t h = 0; h < NH; h++) {
            size_t kvh = h / (NH / NKV);
            for (size_t i = 0; i < T; i++)
                for (size_t j = 0; j < T; j++) {
                    const double *qi = c->q + ((b * T + i) * NH + h) * HD;
                    const double *kj = c->k + ((b * T + j) * NKV + kvh) * HD;
                    size_t first = c->pos ? i - (size_t)c->pos[b * T + i] : 0;
                    size_t w = c->opts ? c->opts->window : 0;
                    bool out_of_window = w && i - j >= w;
                    S[i * T + j] = j > i || j < first || out_of_window
                                       ? -INFINITY
                                       : score_ref(dot_d(qi, kj, HD), c);
                }
            for (size_t i = 0; i < T; i++) {
                double m = -INFINITY, sum = 0;
                for (size_t j = 0; j < T; j++) m = fmax(m, S[i * T + j]);
                for (size_t j = 0; j < T; j++) sum += exp(S[i * T + j] - m);
                if (lse) lse[(b * NH + h) * T + i] = m + log(sum);
                double *oi = out + ((b * T + i) * NH + h) * HD;
                for (size_t d = 0; d < HD; d++) {
                    double s = 0;
                    for (size_t j = 0; j < T; j++)
                        s += exp(S[i * T + j] - m) / sum * c->v[((b * T + j) * NKV + kvh) * HD + d];
                    oi[d] = s;
                }
            }
        }
    free(S);
}

static double attn_loss(void *p) {
    attn_ctx *c = p;
    size_t n = c->B * c->T * c->NH * c->HD;
    double *out = malloc(n * sizeof(double));
    attention_ref(out, NULL, c);
    double l = dot_d(out, c->R, n);
    free(out);
    return l;
}

static void check_attention_opts(size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                                 const int32_t *pos, const mt_cpu_attn_opts *opts) {
    size_t nq = B * T * NH * HD, nkv = B * T * NKV * HD, nl = B * NH * T;
    float *q = randf(nq, 70, -1.5f, 1.5f), *k = randf(nkv, 71, -1.5f, 1.5f);
    float *v = randf(nkv, 72, -1, 1), *R = randf(nq, 73, -1, 1);
    float *out = nanf_buf(nq), *lse = nanf_buf(nl);
    if (opts) mt_cpu_attention_forward_opts(out, lse, q, k, v, pos, B, T, NH, NKV, HD, opts);
    else mt_cpu_attention_forward(out, lse, q, k, v, pos, B, T, NH, NKV, HD);
    attn_ctx ctx = {to_d(q, nq), to_d(k, nkv), to_d(v, nkv), to_d(R, nq), pos, B, T, NH, NKV, HD,
                    opts};
    double *want = malloc(nq * sizeof(double)), *want_lse = malloc(nl * sizeof(double));
    attention_ref(want, want_lse, &ctx);
    expect_close(out, want, nq, FWD_TOL, "attention out");
    expect_close(lse, want_lse, nl, FWD_TOL, "attention lse");

    double *gq = malloc(nq * sizeof(double)), *gk = malloc(nkv * sizeof(double));
    double *gv = malloc(nkv * sizeof(double));
    fd_grad(gq, ctx.q, nq, attn_loss, &ctx);
    fd_grad(gk, ctx.k, nkv, attn_loss, &ctx);
    fd_grad(gv, ctx.v, nkv, attn_loss, &ctx);
    float *dq = nanf_buf(nq), *dk = nanf_buf(nkv), *dv = nanf_buf(nkv);  // overwritten
    if (opts)
        mt_cpu_attention_backward_opts(dq, dk, dv, R, q, k, v, out, lse, pos, B, T, NH, NKV, HD,
                                       opts);
    else
        mt_cpu_attention_backward(dq, dk, dv, R, q, k, v, out, lse, pos, B, T, NH, NKV, HD);
    expect_close(dq, gq, nq, GRAD_TOL, "attention dq");
    expect_close(dk, gk, nkv, GRAD_TOL, "attention dk");
    expect_close(dv, gv, nkv, GRAD_TOL, "attention dv");
    free(q); free(k); free(v); free(R); free(out); free(lse); free(want); free(want_lse);
    free(gq); free(gk); free(gv); free(dq); free(dk); free(dv);
    free(ctx.q); free(ctx.k); free(ctx.v); free(ctx.R);
}

static void check_attention(size_t B, size_t T, size_t NH, size_t NKV, size_t HD,
                            const int32_t *pos) {
    check_attention_opts(B, T, NH, NKV, HD, pos, NULL);
}

Test(cpu_ops, attention_gqa) { check_attention(2, 5, 4, 2, 6, NULL); }
Test(cpu_ops, attention_mqa) { check_attention(1, 7, 3, 1, 4, NULL); }
Test(cpu_ops, attention_mha) { check_attention(2, 6, 2, 2, 8, NULL); }
/* Packed documents of 3, 1, 2 | 4, 2 tokens: a key of another document
 * must get no weight and no gradient. */
Test(cpu_ops, attention_packed_documents) {
    static const int32_t pos[12] = {0, 1, 2, 0, 0, 1, 0, 1, 2, 3, 0, 1};
    check_attention(2, 6, 4, 2, 6, pos);
}

/* Gemma's attention: a scale of its own, scores soft-capped (a cap of 0.8
 * bends every score of these inputs), keys j with t - j < 3 only; alone and
 * within packed documents longer than the window. */
Test(cpu_ops, attention_scale_softcap_and_window) {
    const mt_cpu_attn_opts opts = {.scale = 0.3f, .softcap = 0.8f, .window = 3};
    check_attention_opts(2, 7, 4, 2, 6, NULL, &opts);
    static const int32_t pos[14] = {0, 1, 2, 3, 4, 0, 1, 0, 0, 1, 2, 3, 4, 5};
    check_attention_opts(2, 7, 4, 2, 6, pos, &opts);
    const mt_cpu_attn_opts cap_only = {.softcap = 0.8f};
    check_attention_opts(1, 6, 3, 1, 4, NULL, &cap_only);
}

Test(cpu_ops, attention_backward_bitwise_independent_of_thread_count) {
    size_t B = 3, T = 65, NH = 6, NKV = 3, HD = 16;
    size_t nq = B * T * NH * HD, nkv = B * T * NKV * HD;
    float *q = randf(nq, 80, -1, 1), *k = randf(nkv, 81, -1, 1), *v = randf(nkv, 82, -1, 1);
    float *dout = randf(nq, 83, -1, 1);
    float *res[2][5];
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(r + 1);
        res[r][0] = nanf_buf(nq);
        res[r][1] = nanf_buf(B * NH * T);
        mt_cpu_attention_forward(res[r][0], res[r][1], q, k, v, NULL, B, T, NH, NKV, HD);
        res[r][2] = nanf_buf(nq);
        res[r][3] = nanf_buf(nkv);
        res[r][4] = nanf_buf(nkv);
        mt_cpu_attention_backward(res[r][2], res[r][3], res[r][4], dout, q, k, v, res[r][0],
                                  res[r][1], NULL, B, T, NH, NKV, HD);
    }
    size_t sizes[5] = {nq, B * NH * T, nq, nkv, nkv};
    for (int i = 0; i < 5; i++) {
        cr_expect(memcmp(res[0][i], res[1][i], sizes[i] * sizeof(float)) == 0,
                  "output %d differs between 1 and 2 threads", i);
        cr_expect(all_finite(res[0][i], sizes[i]));
        free(res[0][i]); free(res[1][i]);
    }
    free(q); free(k); free(v); free(dout);
}

/* ------------------------------------------------------------------------
 * SwiGLU */

typedef struct {
    double *g, *u, *R;
    size_t n;
} swiglu_ctx;

static double swiglu_loss(void *p) {
    swiglu_ctx *c = p;
    double l = 0;
    for (size_t i = 0; i < c->n; i++) l += c->g[i] / (1 + exp(-c->g[i])) * c->u[i] * c->R[i];
    return l;
}

Test(cpu_ops, swiglu_forward_backward) {
    size_t N = 7, F = 13, n = N * F;
    float *g = randf(n, 90, -4, 4), *u = randf(n, 91, -2, 2), *out = nanf_buf(n);
    mt_cpu_swiglu_forward(out, g, u, N, F);
    double *want = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) want[i] = (double)g[i] / (1 + exp(-(double)g[i])) * u[i];
    expect_close(out, want, n, FWD_TOL, "swiglu out");

    float *R = randf(n, 92, -1, 1);
    swiglu_ctx ctx = {to_d(g, n), to_d(u, n), to_d(R, n), n};
    double *gg = malloc(n * sizeof(double)), *gu = malloc(n * sizeof(double));
    fd_grad(gg, ctx.g, n, swiglu_loss, &ctx);
    fd_grad(gu, ctx.u, n, swiglu_loss, &ctx);
    float *dg = nanf_buf(n), *du = nanf_buf(n);  // overwritten
    mt_cpu_swiglu_backward(dg, du, R, g, u, N, F);
    expect_close(dg, gg, n, GRAD_TOL, "swiglu dgate");
    expect_close(du, gu, n, GRAD_TOL, "swiglu dup");
    free(g); free(u); free(out); free(want); free(R); free(gg); free(gu); free(dg); free(du);
    free(ctx.g); free(ctx.u); free(ctx.R);
}

/* ------------------------------------------------------------------------
 * LayerNorm with bias (gpt_neox) */

typedef struct {
    double *x, *w, *b, *R;
    size_t N, C;
    float eps;
} ln_ctx;

static void layernorm_ref(double *out, const ln_ctx *c) {
    for (size_t n = 0; n < c->N; n++) {
        const double *x = c->x + n * c->C;
        double m = 0, v = 0;
        for (size_t i = 0; i < c->C; i++) m += x[i] / (double)c->C;
        for (size_t i = 0; i < c->C; i++) v += (x[i] - m) * (x[i] - m) / (double)c->C;
        for (size_t i = 0; i < c->C; i++)
            out[n * c->C + i] = (x[i] - m) / sqrt(v + c->eps) * c->w[i] + c->b[i];
    }
}

static double ln_loss(void *p) {
    ln_ctx *c = p;
    double *out = malloc(c->N * c->C * sizeof(double));
    layernorm_ref(out, c);
    double l = dot_d(out, c->R, c->N * c->C);
    free(out);
    return l;
}

Test(cpu_ops, layernorm_forward_backward) {
    size_t N = 7, C = 13, n = N * C;
    float eps = 1e-5f;
    float *x = randf(n, 100, -2, 3), *w = randf(C, 101, 0.5f, 1.5f), *b = randf(C, 102, -1, 1);
    float *out = nanf_buf(n), *mean = nanf_buf(N), *rstd = nanf_buf(N);
    mt_cpu_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
    ln_ctx ctx = {to_d(x, n), to_d(w, C), to_d(b, C), NULL, N, C, eps};
    double *want = malloc(n * sizeof(double));
    layernorm_ref(want, &ctx);
    expect_close(out, want, n, FWD_TOL, "layernorm out");

    float *R = randf(n, 103, -1, 1);
    ctx.R = to_d(R, n);
    double *gx = malloc(n * sizeof(double)), *gw = malloc(C * sizeof(double));
    double *gb = malloc(C * sizeof(double));
    fd_grad(gx, ctx.x, n, ln_loss, &ctx);
    fd_grad(gw, ctx.w, C, ln_loss, &ctx);
    fd_grad(gb, ctx.b, C, ln_loss, &ctx);
    float *dx = randf(n, 104, -1, 1), *dw = randf(C, 105, -1, 1), *db = randf(C, 106, -1, 1);
    float *dx0 = copyf(dx, n), *dw0 = copyf(dw, C), *db0 = copyf(db, C);
    mt_cpu_layernorm_backward(dx, dw, db, R, x, w, mean, rstd, N, C);
    expect_increment(dx, dx0, gx, n, GRAD_TOL, "layernorm dx");
    expect_increment(dw, dw0, gw, C, GRAD_TOL, "layernorm dw");
    expect_increment(db, db0, gb, C, GRAD_TOL, "layernorm db");
    free(x); free(w); free(b); free(out); free(mean); free(rstd); free(want); free(R);
    free(gx); free(gw); free(gb); free(dx); free(dw); free(db); free(dx0); free(dw0); free(db0);
    free(ctx.x); free(ctx.w); free(ctx.b); free(ctx.R);
}

/* ------------------------------------------------------------------------
 * GELU, erf and tanh forms (gpt_neox's "gelu" and "gelu_new") */

typedef struct {
    double *x, *R;
    size_t n;
    int tanh_form;
} gelu_ctx;

static double gelu_ref(double x, int tanh_form) {
    if (tanh_form)
        return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    return x * 0.5 * erfc(-x / sqrt(2.0));
}

static double gelu_loss(void *p) {
    gelu_ctx *c = p;
    double l = 0;
    for (size_t i = 0; i < c->n; i++) l += gelu_ref(c->x[i], c->tanh_form) * c->R[i];
    return l;
}

Test(cpu_ops, gelu_forward_backward) {
    size_t n = 91;
    for (int tf = 0; tf < 2; tf++) {
        float *x = randf(n, 110 + tf, -5, 5), *out = nanf_buf(n), *R = randf(n, 112, -1, 1);
        mt_cpu_gelu_forward(out, x, n, tf);
        double *want = malloc(n * sizeof(double));
        for (size_t i = 0; i < n; i++) want[i] = gelu_ref(x[i], tf);
        expect_close(out, want, n, FWD_TOL, tf ? "gelu tanh out" : "gelu out");
        gelu_ctx ctx = {to_d(x, n), to_d(R, n), n, tf};
        double *g = malloc(n * sizeof(double));
        fd_grad(g, ctx.x, n, gelu_loss, &ctx);
        float *dx = nanf_buf(n);  // overwritten
        mt_cpu_gelu_backward(dx, R, x, n, tf);
        expect_close(dx, g, n, GRAD_TOL, tf ? "gelu tanh dx" : "gelu dx");
        free(x); free(out); free(R); free(want); free(g); free(dx); free(ctx.x); free(ctx.R);
    }
}

/* Partial rotary: the leading R of HD dims rotate as pairs (i, i + R/2),
 * the rest pass through; checked against the full-width op on a head of
 * R dims, the backward against finite differences of that reference. */
typedef struct {
    double *x, *R;
    const float *cos, *sin;
    size_t B, T, H, HD, Rd;
} prope_ctx;

static void prope_ref(double *out, const prope_ctx *c) {
    size_t half = c->Rd / 2;
    memcpy(out, c->x, c->B * c->T * c->H * c->HD * sizeof(double));
    for (size_t bt = 0; bt < c->B * c->T; bt++)
        for (size_t h = 0; h < c->H; h++)
            for (size_t i = 0; i < half; i++) {
                size_t base = (bt * c->H + h) * c->HD, t = bt % c->T;
                double co = c->cos[t * half + i], si = c->sin[t * half + i];
                double x1 = c->x[base + i], x2 = c->x[base + i + half];
                out[base + i] = x1 * co - x2 * si;
                out[base + i + half] = x2 * co + x1 * si;
            }
}

static double prope_loss(void *p) {
    prope_ctx *c = p;
    size_t n = c->B * c->T * c->H * c->HD;
    double *out = malloc(n * sizeof(double));
    prope_ref(out, c);
    double l = dot_d(out, c->R, n);
    free(out);
    return l;
}

Test(cpu_ops, rope_partial_forward_backward) {
    size_t B = 2, T = 5, H = 3, HD = 12, Rd = 4, half = Rd / 2, n = B * T * H * HD;
    float *cos = malloc(T * half * sizeof(float)), *sin = malloc(T * half * sizeof(float));
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            float a = (float)t * (0.7f + 0.3f * (float)i);
            cos[t * half + i] = cosf(a);
            sin[t * half + i] = sinf(a);
        }
    float *x = randf(n, 120, -1, 1), *y = copyf(x, n);
    mt_cpu_rope_partial_forward(y, cos, sin, NULL, B, T, H, HD, Rd);
    prope_ctx ctx = {to_d(x, n), NULL, cos, sin, B, T, H, HD, Rd};
    double *want = malloc(n * sizeof(double));
    prope_ref(want, &ctx);
    expect_close(y, want, n, FWD_TOL, "partial rope out");
    for (size_t r = 0; r < n / HD; r++)  // the pass-through dims keep their bits
        cr_expect(memcmp(y + r * HD + Rd, x + r * HD + Rd, (HD - Rd) * sizeof(float)) == 0);
    float *R = randf(n, 121, -1, 1), *dx = copyf(R, n);
    ctx.R = to_d(R, n);
    double *g = malloc(n * sizeof(double));
    fd_grad(g, ctx.x, n, prope_loss, &ctx);
    mt_cpu_rope_partial_backward(dx, cos, sin, NULL, B, T, H, HD, Rd);
    expect_close(dx, g, n, GRAD_TOL, "partial rope dx");
    free(cos); free(sin); free(x); free(y); free(want); free(R); free(dx); free(g);
    free(ctx.x); free(ctx.R);
}

/* ------------------------------------------------------------------------
 * Cross-entropy */

typedef struct {
    double *x;
    const int32_t *tg;
    size_t N, V;
} ce_ctx;

static double ce_ref(void *p) {
    ce_ctx *c = p;
    double total = 0;
    for (size_t n = 0; n < c->N; n++) {
        if (c->tg[n] == MT_IGNORE_INDEX) continue;
        double sum = 0;
        for (size_t i = 0; i < c->V; i++) sum += exp(c->x[n * c->V + i]);
        total += log(sum) - c->x[n * c->V + c->tg[n]];
    }
    return total;
}

Test(cpu_ops, cross_entropy_loss_grad_and_ignore_index) {
    size_t N = 7, V = 11;
    int32_t tg[] = {3, MT_IGNORE_INDEX, 0, 10, MT_IGNORE_INDEX, 7, 3};
    float dscale = 0.2f;  // 1 / 5 valid rows
    float *x = randf(N * V, 100, -3, 3), *dl = nanf_buf(N * V);
    ce_ctx ctx = {to_d(x, N * V), tg, N, V};
    double loss = mt_cpu_cross_entropy(dl, x, tg, N, V, dscale);
    double want = ce_ref(&ctx);
    // Each row's lse is rounded to fp32 once (2^-24 relative of |lse| ~ 3);
    // measured 5e-9 relative on the sum. 1e-6 still catches any wrong row.
    cr_expect(fabs(loss - want) <= 1e-6 * fabs(want), "loss %.9g vs %.9g", loss, want);
    cr_expect_eq(mt_cpu_cross_entropy(NULL, x, tg, N, V, dscale), loss);

    double *g = malloc(N * V * sizeof(double));
    fd_grad(g, ctx.x, N * V, ce_ref, &ctx);
    for (size_t i = 0; i < N * V; i++) g[i] *= dscale;
    expect_close(dl, g, N * V, GRAD_TOL, "dlogits");
    for (size_t n = 0; n < N; n++)
        if (tg[n] == MT_IGNORE_INDEX)
            for (size_t i = 0; i < V; i++) cr_expect_eq(dl[n * V + i], 0.0f);

    // dlogits may alias logits.
    float *alias = copyf(x, N * V);
    cr_expect_eq(mt_cpu_cross_entropy(alias, alias, tg, N, V, dscale), loss);
    cr_expect(memcmp(alias, dl, N * V * sizeof(float)) == 0);
    free(x); free(dl); free(g); free(alias); free(ctx.x);
}

Test(cpu_ops, cross_entropy_is_stable_for_large_logits) {
    size_t N = 3, V = 5;
    int32_t tg[] = {1, 4, 0};
    float *x = randf(N * V, 110, -3, 3), *big = copyf(x, N * V);
    for (size_t i = 0; i < N * V; i++) big[i] += 1000.0f;  // exp would overflow
    double l0 = mt_cpu_cross_entropy(NULL, x, tg, N, V, 1.0f);
    float *dl = nanf_buf(N * V);
    double l1 = mt_cpu_cross_entropy(dl, big, tg, N, V, 1.0f);
    // Adding 1000 rounds each logit to a multiple of 2^-14 (ulp of 1000 is
    // 6e-5): the loss moves by at most ~2 * 6e-5 per row.
    cr_expect(fabs(l0 - l1) <= N * 2e-4, "%.9g vs %.9g", l0, l1);
    cr_expect(all_finite(dl, N * V));
    free(x); free(big); free(dl);
}

Test(cpu_ops, cross_entropy_all_ignored_is_zero) {
    int32_t tg[] = {MT_IGNORE_INDEX, MT_IGNORE_INDEX};
    float x[6] = {1, 2, 3, 4, 5, 6}, dl[6];
    for (int i = 0; i < 6; i++) dl[i] = NAN;
    cr_expect_eq(mt_cpu_cross_entropy(dl, x, tg, 2, 3, 1.0f), 0.0);
    for (int i = 0; i < 6; i++) cr_expect_eq(dl[i], 0.0f);
}

/* The CPU backend refuses the shapes it cannot run, naming the limit and
 * the option: a sequence past max_position_embeddings, an empty batch; a
 * sequence past a Llama family's sliding_window runs (windowed). */
Test(cpu_ops, the_backend_refuses_what_it_cannot_run) {
    mt_config c;
    mt_config_default_tiny(&c); /* max_pos 256 */
    mt_param_table t;
    mt_host_store s;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_init(&s, &t, &err), 0, "%s", err.msg);
    cr_assert_null(mt_cpu_backend_create(&c, &t, &s, 1, 1, 512, &err));
    cr_assert(strstr(err.msg, "max_position_embeddings 256") && strstr(err.msg, "--seq-len"),
              "%s", err.msg);
    cr_assert_null(mt_cpu_backend_create(&c, &t, &s, 0, 1, 16, &err));
    cr_assert(strstr(err.msg, "must be positive"), "%s", err.msg);
    c.sliding_window = 32;
    mt_backend *be = mt_cpu_backend_create(&c, &t, &s, 1, 1, 64, &err);
    cr_assert_not_null(be, "a sequence past the window runs: %s", err.msg);
    mt_cpu_backend_free(be);
    mt_host_store_free(&s);
    mt_params_free(&t);
}

/* A sliding window as positions: with pos' = min(pos, window - 1) (the
 * CUDA backend's mt_cuda_window_positions) the plain attention, which lets
 * query t see keys t - pos'[t] .. t, is the windowed one (keys t - j <
 * window, within the document; the CPU's, checked against transformers
 * through Gemma's fixtures): forward and backward, one sequence a row and
 * packed documents. Both sum the same terms in the same order: bitwise. */
Test(cpu_ops, a_window_is_positions_clamped_below_it) {
    const size_t B = 2, T = 40, NH = 4, NKV = 2, HD = 8, W = 7;
    const size_t nq = B * T * NH * HD, nk = B * T * NKV * HD;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    for (size_t i = 0; i < nq; i++) q[i] = sinf(0.37f * i), dout[i] = cosf(0.11f * i);
    for (size_t i = 0; i < nk; i++) k[i] = cosf(0.23f * i), v[i] = sinf(0.53f * i + 1);
    int32_t pos[2 * 40], clamped[2 * 40];
    float *o[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int r = 0; r < 2; r++) {
        o[r] = malloc(nq * 4), lse[r] = malloc(B * NH * T * 4), dq[r] = malloc(nq * 4);
        dk[r] = malloc(nk * 4), dv[r] = malloc(nk * 4);
    }
    for (int packed = 0; packed < 2; packed++) {
        for (size_t i = 0; i < B * T; i++) { /* documents of 13 tokens, or whole rows */
            pos[i] = packed ? (int32_t)((i % T) % 13) : (int32_t)(i % T);
            clamped[i] = pos[i] < (int32_t)W - 1 ? pos[i] : (int32_t)W - 1;
        }
        mt_cpu_attn_opts win = {.window = W};
        mt_cpu_attention_forward_opts(o[0], lse[0], q, k, v, pos, B, T, NH, NKV, HD, &win);
        mt_cpu_attention_backward_opts(dq[0], dk[0], dv[0], dout, q, k, v, o[0], lse[0], pos, B,
                                       T, NH, NKV, HD, &win);
        mt_cpu_attention_forward(o[1], lse[1], q, k, v, clamped, B, T, NH, NKV, HD);
        mt_cpu_attention_backward(dq[1], dk[1], dv[1], dout, q, k, v, o[1], lse[1], clamped, B,
                                  T, NH, NKV, HD);
        cr_assert(!memcmp(o[0], o[1], nq * 4) && !memcmp(lse[0], lse[1], B * NH * T * 4),
                  "forward (packed %d)", packed);
        cr_assert(!memcmp(dq[0], dq[1], nq * 4) && !memcmp(dk[0], dk[1], nk * 4) &&
                  !memcmp(dv[0], dv[1], nk * 4), "backward (packed %d)", packed);
        /* and the window matters here: without it the outputs differ */
        mt_cpu_attention_forward(o[1], lse[1], q, k, v, pos, B, T, NH, NKV, HD);
        cr_assert(memcmp(o[0], o[1], nq * 4), "a window shorter than the documents");
    }
    for (int r = 0; r < 2; r++) free(o[r]), free(lse[r]), free(dq[r]), free(dk[r]), free(dv[r]);
    free(q), free(k), free(v), free(dout);
}
