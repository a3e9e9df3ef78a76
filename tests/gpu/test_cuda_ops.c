/* Tests of the CUDA operators (backend/cuda/cuda_ops.h) against small
 * double-precision reference loops written here, in both precisions, on
 * random non-zero inputs of odd sizes. Outputs are poisoned with NaN
 * (all-ones bytes) before each call so an unwritten element fails the
 * comparison; "+=" outputs are pre-filled with non-zero values; backwards
 * are run twice and compared bit for bit. Without a GPU every test reports
 * itself skipped.
 *
 * Tolerances (relative error in the 2-norm, mt_test_rel_err):
 *  - fp32 paths: 1e-5. fp32 has a 2^-24 = 6e-8 unit roundoff; sums of at
 *    most ~1000 terms in a different order than the double reference grow
 *    that to ~1e-6 in the worst case, so 1e-5 leaves a 10x margin.
 *  - bf16 operands: the reference is fed the SAME bf16-rounded operands, so
 *    products of two bf16 values are exact in fp32 and only fp32
 *    accumulation remains: 1e-5 again for fp32 outputs.
 *  - bf16 outputs: one rounding to 8 significant bits, relative error at
 *    most 2^-9 = 2e-3 per element: 4e-3.
 *  - against the unrounded fp32 operands (the error a bf16 run really
 *    makes): each operand carries up to 2^-9 relative error, about 2^-9 *
 *    sqrt(2) / sqrt(3) ~ 2e-3 in the product norm for uniform inputs: 1e-2. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ops.h"
#include "testlib.h"

#define TOL_F32 1e-5
#define TOL_BF16_OUT 4e-3
#define TOL_BF16_VS_F32 1e-2
#define IGNORE (-100)

/* ---- helpers ---- */

/* Device buffers of one test, freed together. */
typedef struct {
    void *p[64];
    int n;
} dev_pool;

static void *dalloc(dev_pool *pool, size_t bytes) {
    cr_assert(pool->n < 64);
    void *p;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    CUDA_CHECK(cudaMemset(p, 0xff, bytes ? bytes : 16)); /* NaN in fp32 and bf16 */
    pool->p[pool->n++] = p;
    return p;
}

static void *dupload(dev_pool *pool, const void *h, size_t bytes) {
    void *p = dalloc(pool, bytes);
    CUDA_CHECK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void dpoison(void *d, size_t bytes) { CUDA_CHECK(cudaMemset(d, 0xff, bytes)); }

static void download(void *h, const void *d, size_t bytes) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static void pool_free(dev_pool *pool) {
    for (int i = 0; i < pool->n; i++) CUDA_CHECK(cudaFree(pool->p[i]));
    pool->n = 0;
}

/* A context on the default stream, or skip the test without a GPU. */
static mt_cuda_ctx *gpu_ctx(void) {
    if (mt_cuda_device_count() <= 0) cr_skip_test("no CUDA device: GPU test skipped");
    mt_cuda_ctx *ctx;
    mt_error err;
    cr_assert_eq(mt_cuda_ctx_create(&ctx, 0, 0, &err), 0, "%s", err.msg);
    return ctx;
}

static float *hrand(size_t n, unsigned long long seed, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    mt_test_fill_uniform(x, n, seed, lo, hi);
    return x;
}

static uint16_t f2bf(float f) { /* round to nearest even; inputs here are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = f2bf(x[i]);
    return y;
}

static float *rounded(const float *x, size_t n) { /* x through bf16 and back */
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = bf2f(f2bf(x[i]));
    return y;
}

static float *bf16_to_f32_host(const uint16_t *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = bf2f(x[i]);
    return y;
}

static float *to_float(const double *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

/* Relative error of a float result against a double reference. */
static double rel_err_d(const float *a, const double *ref, size_t n) {
    float *r = to_float(ref, n);
    double e = mt_test_rel_err(a, r, n);
    free(r);
    return e;
}

static void expect_close(const float *got, const double *ref, size_t n, double tol,
                         const char *what) {
    double e = rel_err_d(got, ref, n);
    cr_expect(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

/* ---- reference loops (double) ---- */

/* out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias */
static void ref_matmul(double *out, const float *inp, const float *w, const float *bias,
                       size_t N, size_t IC, size_t OC) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (size_t i = 0; i < IC; i++) s += (double)inp[n * IC + i] * w[o * IC + i];
            out[n * OC + o] = s;
        }
}

/* dinp (N,IC) += dout @ w ; dw (OC,IC) += dout^T @ inp (both pre-filled) */
static void ref_matmul_bwd(double *dinp, double *dw, const float *dout, const float *inp,
                           const float *w, size_t N, size_t IC, size_t OC) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double d = dout[n * OC + o];
            for (size_t i = 0; i < IC; i++) {
                if (dinp) dinp[n * IC + i] += d * w[o * IC + i];
                if (dw) dw[o * IC + i] += d * inp[n * IC + i];
            }
        }
}

static double *dcopy(const float *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

/* ---- casts ---- */

Test(cuda_ops, casts_round_to_nearest_even) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t n = 1001; /* not a multiple of 4: the scalar tail runs */
    float *x = hrand(n, 1, -3.0f, 3.0f);
    x[0] = 1.0f + 1.0f / 256.0f;       /* exact tie: rounds down to even 1.0 */
    x[1] = 1.0f + 3.0f / 256.0f;       /* exact tie: rounds up to even */
    x[2] = -0.0f;
    float *dx = dupload(&pool, x, n * 4);
    uint16_t *db = dalloc(&pool, n * 2);
    float *dy = dalloc(&pool, n * 4);
    uint16_t *b = malloc(n * 2);
    float *y = malloc(n * 4);
    for (int off = 0; off < 2; off++) { /* off = 1: unaligned pointers, scalar path */
        mt_cuda_cast_f32_to_bf16(ctx, db + off, dx + off, n - off);
        download(b, db, n * 2);
        for (size_t i = off; i < n; i++)
            cr_assert_eq(b[i], f2bf(x[i]), "f32->bf16 at %zu: %04x vs %04x", i, b[i], f2bf(x[i]));
        mt_cuda_cast_bf16_to_f32(ctx, dy + off, db + off, n - off);
        download(y, dy, n * 4);
        for (size_t i = off; i < n; i++) cr_assert_eq(y[i], bf2f(b[i]));
    }
    cr_assert_eq(b[0], 0x3f80);
    cr_assert_eq(b[1], 0x3f82);
    free(x), free(b), free(y);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- matmul ---- */

/* Forward in the given precision, with and without bias, fp32 and (bf16
 * precision) bf16 outputs. */
static void check_matmul_forward(mt_precision prec) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, IC = 96, OC = 72;
    float *inp = hrand(N * IC, 2, -1, 1), *w = hrand(OC * IC, 3, -1, 1);
    float *bias = hrand(OC, 4, -1, 1);
    bool bf = prec == MT_PREC_BF16;
    /* The reference sees exactly the operands the GPU sees. */
    float *inp_r = bf ? rounded(inp, N * IC) : inp, *w_r = bf ? rounded(w, OC * IC) : w;
    void *d_inp, *d_w;
    if (bf) {
        uint16_t *a = to_bf16(inp, N * IC), *b = to_bf16(w, OC * IC);
        d_inp = dupload(&pool, a, N * IC * 2);
        d_w = dupload(&pool, b, OC * IC * 2);
        free(a), free(b);
    } else {
        d_inp = dupload(&pool, inp, N * IC * 4);
        d_w = dupload(&pool, w, OC * IC * 4);
    }
    float *d_bias = dupload(&pool, bias, OC * 4);
    float *d_out = dalloc(&pool, N * OC * 4);
    double *ref = malloc(N * OC * sizeof *ref), *ref32 = malloc(N * OC * sizeof *ref32);
    float *out = malloc(N * OC * 4);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const float *bb = with_bias ? bias : NULL;
        ref_matmul(ref, inp_r, w_r, bb, N, IC, OC);
        ref_matmul(ref32, inp, w, bb, N, IC, OC);
        dpoison(d_out, N * OC * 4);
        mt_cuda_matmul_forward(ctx, prec, d_out, MT_DT_F32, d_inp, d_w, with_bias ? d_bias : NULL,
                               N, IC, OC);
        download(out, d_out, N * OC * 4);
        expect_close(out, ref, N * OC, TOL_F32, "matmul fwd fp32 out");
        if (bf) {
            expect_close(out, ref32, N * OC, TOL_BF16_VS_F32, "matmul fwd vs fp32 operands");
            uint16_t *o16 = malloc(N * OC * 2);
            dpoison(d_out, N * OC * 4);
            mt_cuda_matmul_forward(ctx, prec, d_out, MT_DT_BF16, d_inp, d_w,
                                   with_bias ? d_bias : NULL, N, IC, OC);
            download(o16, d_out, N * OC * 2);
            float *of = bf16_to_f32_host(o16, N * OC);
            expect_close(of, ref, N * OC, TOL_BF16_OUT, "matmul fwd bf16 out");
            free(o16), free(of);
        }
    }
    if (bf) free(inp_r), free(w_r);
    free(inp), free(w), free(bias), free(ref), free(ref32), free(out);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, matmul_forward_fp32) { check_matmul_forward(MT_PREC_FP32); }
Test(cuda_ops, matmul_forward_bf16) { check_matmul_forward(MT_PREC_BF16); }

static void check_matmul_backward(mt_precision prec) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, IC = 96, OC = 72;
    bool bf = prec == MT_PREC_BF16;
    float *inp = hrand(N * IC, 5, -1, 1), *w = hrand(OC * IC, 6, -1, 1);
    float *dout = hrand(N * OC, 7, -1, 1);
    float *dinp0 = hrand(N * IC, 8, -1, 1), *dw0 = hrand(OC * IC, 9, -1, 1);
    float *inp_r = bf ? rounded(inp, N * IC) : inp, *w_r = bf ? rounded(w, OC * IC) : w;
    float *dout_r = bf ? rounded(dout, N * OC) : dout;
    void *d_inp, *d_w, *d_dout;
    if (bf) {
        uint16_t *a = to_bf16(inp, N * IC), *b = to_bf16(w, OC * IC), *c = to_bf16(dout, N * OC);
        d_inp = dupload(&pool, a, N * IC * 2);
        d_w = dupload(&pool, b, OC * IC * 2);
        d_dout = dupload(&pool, c, N * OC * 2);
        free(a), free(b), free(c);
    } else {
        d_inp = dupload(&pool, inp, N * IC * 4);
        d_w = dupload(&pool, w, OC * IC * 4);
        d_dout = dupload(&pool, dout, N * OC * 4);
    }
    float *d_dinp = dupload(&pool, dinp0, N * IC * 4), *d_dw = dupload(&pool, dw0, OC * IC * 4);
    double *rdinp = dcopy(dinp0, N * IC), *rdw = dcopy(dw0, OC * IC);
    ref_matmul_bwd(rdinp, rdw, dout_r, inp_r, w_r, N, IC, OC);
    mt_cuda_matmul_backward(ctx, prec, d_dinp, true, d_dw, d_dout, d_inp, d_w, N, IC, OC);
    float *got_dinp = malloc(N * IC * 4), *got_dw = malloc(OC * IC * 4);
    download(got_dinp, d_dinp, N * IC * 4);
    download(got_dw, d_dw, OC * IC * 4);
    expect_close(got_dinp, rdinp, N * IC, TOL_F32, "dinp +=");
    expect_close(got_dw, rdw, OC * IC, TOL_F32, "dw +=");

    /* "=" mode overwrites a poisoned dinp completely; dw NULL is skipped. */
    double *rdinp2 = calloc(N * IC, sizeof *rdinp2);
    ref_matmul_bwd(rdinp2, NULL, dout_r, inp_r, w_r, N, IC, OC);
    dpoison(d_dinp, N * IC * 4);
    mt_cuda_matmul_backward(ctx, prec, d_dinp, false, NULL, d_dout, d_inp, d_w, N, IC, OC);
    download(got_dinp, d_dinp, N * IC * 4);
    expect_close(got_dinp, rdinp2, N * IC, TOL_F32, "dinp =");
    if (bf) free(inp_r), free(w_r), free(dout_r);
    free(inp), free(w), free(dout), free(dinp0), free(dw0), free(rdinp), free(rdw), free(rdinp2);
    free(got_dinp), free(got_dw);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, matmul_backward_fp32) { check_matmul_backward(MT_PREC_FP32); }
Test(cuda_ops, matmul_backward_bf16) { check_matmul_backward(MT_PREC_BF16); }

Test(cuda_ops, matmul_plans_are_cached) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, IC = 96, OC = 72;
    float *d_inp = dalloc(&pool, N * IC * 4), *d_w = dalloc(&pool, OC * IC * 4);
    float *d_out = dalloc(&pool, N * OC * 4);
    CUDA_CHECK(cudaMemset(d_inp, 0, N * IC * 4));
    CUDA_CHECK(cudaMemset(d_w, 0, OC * IC * 4));
    mt_cuda_matmul_forward(ctx, MT_PREC_FP32, d_out, MT_DT_F32, d_inp, d_w, NULL, N, IC, OC);
    size_t q = mt_cuda_ctx_heuristic_queries(ctx);
    cr_assert_eq(q, 1);
    for (int i = 0; i < 5; i++)
        mt_cuda_matmul_forward(ctx, MT_PREC_FP32, d_out, MT_DT_F32, d_inp, d_w, NULL, N, IC, OC);
    cr_assert_eq(mt_cuda_ctx_heuristic_queries(ctx), q, "steady state queried heuristics");
    CUDA_CHECK(cudaDeviceSynchronize());
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, bias_backward_accumulates_deterministically) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 601, OC = 70; /* 3 row chunks of 256; columns not a multiple of 32 */
    float *dout = hrand(N * OC, 10, -1, 1), *db0 = hrand(OC, 11, -1, 1);
    double *ref = dcopy(db0, OC);
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) ref[o] += dout[n * OC + o];
    float *d_dout = dupload(&pool, dout, N * OC * 4), *d_db = dupload(&pool, db0, OC * 4);
    float *scratch = dalloc(&pool, mt_cuda_colsum_scratch_floats(N, OC) * 4);
    float got[70], got2[70];
    mt_cuda_bias_backward(ctx, d_db, scratch, d_dout, N, OC);
    download(got, d_db, OC * 4);
    expect_close(got, ref, OC, TOL_F32, "dbias");
    CUDA_CHECK(cudaMemcpy(d_db, db0, OC * 4, cudaMemcpyHostToDevice));
    mt_cuda_bias_backward(ctx, d_db, scratch, d_dout, N, OC);
    download(got2, d_db, OC * 4);
    cr_assert(memcmp(got, got2, sizeof got) == 0, "bias backward is not deterministic");
    free(dout), free(db0), free(ref);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- embedding ---- */

Test(cuda_ops, embedding_forward_fp32_and_bf16) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, C = 96, V = 1000;
    float *wte = hrand(V * C, 12, -1, 1);
    int32_t tokens[37];
    for (size_t i = 0; i < N; i++) tokens[i] = (int32_t)((i * 389 + 7) % V);
    tokens[5] = tokens[9]; /* a repeat */
    uint16_t *wte16 = to_bf16(wte, V * C);
    float *d_wte = dupload(&pool, wte, V * C * 4);
    uint16_t *d_wte16 = dupload(&pool, wte16, V * C * 2);
    int32_t *d_tok = dupload(&pool, tokens, sizeof tokens);
    float *d_out = dalloc(&pool, N * C * 4);
    float *out = malloc(N * C * 4);
    for (int bf = 0; bf < 2; bf++) {
        dpoison(d_out, N * C * 4);
        mt_cuda_embedding_forward(ctx, d_out, d_tok, bf ? (void *)d_wte16 : (void *)d_wte,
                                  bf ? MT_DT_BF16 : MT_DT_F32, N, C);
        download(out, d_out, N * C * 4);
        for (size_t n = 0; n < N; n++)
            for (size_t c = 0; c < C; c++) {
                size_t src = (size_t)tokens[n] * C + c;
                float want = bf ? bf2f(wte16[src]) : wte[src];
                cr_assert_eq(out[n * C + c], want, "row %zu col %zu (bf16 %d)", n, c, bf);
            }
    }
    free(wte), free(wte16), free(out);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, embedding_backward_deterministic_scatter) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 301, C = 96, V = 50; /* many repeated tokens */
    int32_t tokens[301], order[301], bounds[302];
    for (size_t i = 0; i < N; i++) tokens[i] = (int32_t)((i * i * 7 + 3) % (V - 3)); /* 47.. unused */
    float *dout = hrand(N * C, 13, -1, 1), *dwte0 = hrand(V * C, 14, -1, 1);
    double *ref = dcopy(dwte0, V * C);
    for (size_t n = 0; n < N; n++)
        for (size_t c = 0; c < C; c++) ref[(size_t)tokens[n] * C + c] += dout[n * C + c];
    size_t groups;
    mt_error err;
    cr_assert_eq(mt_embedding_backward_plan(order, bounds, &groups, tokens, N, V, &err), 0);
    cr_assert(groups < N && groups > 1);
    float *d_dout = dupload(&pool, dout, N * C * 4), *d_dwte = dupload(&pool, dwte0, V * C * 4);
    int32_t *d_tok = dupload(&pool, tokens, sizeof tokens);
    int32_t *d_order = dupload(&pool, order, sizeof order);
    int32_t *d_bounds = dupload(&pool, bounds, (groups + 1) * 4);
    float *got = malloc(V * C * 4), *got2 = malloc(V * C * 4);
    mt_cuda_embedding_backward(ctx, d_dwte, d_dout, d_tok, d_order, d_bounds, groups, C);
    download(got, d_dwte, V * C * 4);
    expect_close(got, ref, V * C, TOL_F32, "dwte");
    /* rows of unused tokens keep their pre-filled values exactly */
    for (size_t v = V - 3; v < V; v++)
        cr_assert(memcmp(got + v * C, dwte0 + v * C, C * 4) == 0);
    CUDA_CHECK(cudaMemcpy(d_dwte, dwte0, V * C * 4, cudaMemcpyHostToDevice));
    mt_cuda_embedding_backward(ctx, d_dwte, d_dout, d_tok, d_order, d_bounds, groups, C);
    download(got2, d_dwte, V * C * 4);
    cr_assert(memcmp(got, got2, V * C * 4) == 0, "embedding backward is not deterministic");

    tokens[3] = (int32_t)V; /* out of range: a clear error, not a stray write */
    cr_assert_eq(mt_embedding_backward_plan(order, bounds, &groups, tokens, N, V, &err), -1);
    cr_assert(strstr(err.msg, "outside the vocabulary") != NULL, "%s", err.msg);
    free(dout), free(dwte0), free(ref), free(got), free(got2);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- RMSNorm ---- */

static void ref_rmsnorm(double *out, double *rstd, const float *inp, const float *w, size_t N,
                        size_t C, float eps) {
    for (size_t n = 0; n < N; n++) {
        double ss = 0;
        for (size_t c = 0; c < C; c++) ss += (double)inp[n * C + c] * inp[n * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[n] = r;
        for (size_t c = 0; c < C; c++) out[n * C + c] = inp[n * C + c] * r * w[c];
    }
}

Test(cuda_ops, rmsnorm_forward_fp32_and_bf16_out) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, C = 96;
    const float eps = 1e-5f;
    float *inp = hrand(N * C, 15, -2, 2), *w = hrand(C, 16, 0.5f, 1.5f);
    double *ref = malloc(N * C * sizeof *ref), rref[37];
    ref_rmsnorm(ref, rref, inp, w, N, C, eps);
    float *d_inp = dupload(&pool, inp, N * C * 4), *d_w = dupload(&pool, w, C * 4);
    float *d_out = dalloc(&pool, N * C * 4), *d_rstd = dalloc(&pool, N * 4);
    float *out = malloc(N * C * 4), rstd[37];
    mt_cuda_rmsnorm_forward(ctx, d_out, MT_DT_F32, d_rstd, d_inp, d_w, N, C, eps);
    download(out, d_out, N * C * 4);
    download(rstd, d_rstd, N * 4);
    expect_close(out, ref, N * C, TOL_F32, "rmsnorm out");
    expect_close(rstd, rref, N, TOL_F32, "rmsnorm rstd");
    dpoison(d_out, N * C * 4);
    mt_cuda_rmsnorm_forward(ctx, d_out, MT_DT_BF16, NULL, d_inp, d_w, N, C, eps);
    uint16_t *o16 = malloc(N * C * 2);
    download(o16, d_out, N * C * 2);
    float *of = bf16_to_f32_host(o16, N * C);
    expect_close(of, ref, N * C, TOL_BF16_OUT, "rmsnorm bf16 out");
    free(inp), free(w), free(ref), free(out), free(o16), free(of);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, rmsnorm_backward_accumulates_deterministically) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 601, C = 96; /* 3 chunks of the dw reduction */
    const float eps = 1e-6f;
    float *inp = hrand(N * C, 17, -2, 2), *w = hrand(C, 18, 0.5f, 1.5f);
    float *dout = hrand(N * C, 19, -1, 1);
    float *dinp0 = hrand(N * C, 20, -1, 1), *dw0 = hrand(C, 21, -1, 1);
    double *y = malloc(N * C * sizeof *y), *rstd = malloc(N * sizeof *rstd);
    ref_rmsnorm(y, rstd, inp, w, N, C, eps);
    double *rdinp = dcopy(dinp0, N * C), *rdw = dcopy(dw0, C);
    for (size_t n = 0; n < N; n++) {
        double r = rstd[n], dot = 0;
        for (size_t c = 0; c < C; c++) dot += (double)dout[n * C + c] * w[c] * inp[n * C + c];
        for (size_t c = 0; c < C; c++) {
            rdinp[n * C + c] += r * w[c] * dout[n * C + c] - inp[n * C + c] * r * r * r * dot / C;
            rdw[c] += (double)dout[n * C + c] * inp[n * C + c] * r;
        }
    }
    float *d_inp = dupload(&pool, inp, N * C * 4), *d_w = dupload(&pool, w, C * 4);
    float *d_dout = dupload(&pool, dout, N * C * 4), *d_rstd = dalloc(&pool, N * 4);
    float *d_out = dalloc(&pool, N * C * 4);
    float *d_dinp = dupload(&pool, dinp0, N * C * 4), *d_dw = dupload(&pool, dw0, C * 4);
    float *scratch = dalloc(&pool, mt_cuda_colsum_scratch_floats(N, C) * 4);
    mt_cuda_rmsnorm_forward(ctx, d_out, MT_DT_F32, d_rstd, d_inp, d_w, N, C, eps);
    mt_cuda_rmsnorm_backward(ctx, d_dinp, d_dw, scratch, d_dout, d_inp, d_w, d_rstd, N, C);
    float *gdinp = malloc(N * C * 4), gdw[96], gdinp2_dw[96];
    download(gdinp, d_dinp, N * C * 4);
    download(gdw, d_dw, C * 4);
    expect_close(gdinp, rdinp, N * C, TOL_F32, "rmsnorm dinp +=");
    expect_close(gdw, rdw, C, TOL_F32, "rmsnorm dw +=");
    float *gdinp2 = malloc(N * C * 4);
    CUDA_CHECK(cudaMemcpy(d_dinp, dinp0, N * C * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dw, dw0, C * 4, cudaMemcpyHostToDevice));
    mt_cuda_rmsnorm_backward(ctx, d_dinp, d_dw, scratch, d_dout, d_inp, d_w, d_rstd, N, C);
    download(gdinp2, d_dinp, N * C * 4);
    download(gdinp2_dw, d_dw, C * 4);
    cr_assert(memcmp(gdinp, gdinp2, N * C * 4) == 0, "rmsnorm dinp not deterministic");
    cr_assert(memcmp(gdw, gdinp2_dw, C * 4) == 0, "rmsnorm dw not deterministic");
    free(inp), free(w), free(dout), free(dinp0), free(dw0), free(y), free(rstd);
    free(rdinp), free(rdw), free(gdinp), free(gdinp2);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- RoPE ---- */

/* pos: NULL, or positions of packed documents (B, T) on the host. */
static void check_rope(const int32_t *pos) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t B = 2, T = 5, H = 3, HD = 16, half = HD / 2, n = B * T * H * HD;
    float cosv[5 * 8], sinv[5 * 8];
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < half; i++) {
            double f = t * pow(10000.0, -2.0 * i / HD);
            cosv[t * half + i] = (float)cos(f);
            sinv[t * half + i] = (float)sin(f);
        }
    float *x = hrand(n, 22, -1, 1);
    double *ref = malloc(n * sizeof *ref), *refb = malloc(n * sizeof *refb);
    for (size_t row = 0; row < B * T * H; row++) {
        size_t t = pos ? (size_t)pos[row / H] : (row / H) % T;
        for (size_t i = 0; i < half; i++) {
            double c = cosv[t * half + i], s = sinv[t * half + i];
            double x1 = x[row * HD + i], x2 = x[row * HD + i + half];
            ref[row * HD + i] = x1 * c - x2 * s;
            ref[row * HD + i + half] = x2 * c + x1 * s;
            refb[row * HD + i] = x1 * c + x2 * s; /* transpose of the rotation */
            refb[row * HD + i + half] = x2 * c - x1 * s;
        }
    }
    float *d_x = dupload(&pool, x, n * 4);
    float *d_cos = dupload(&pool, cosv, sizeof cosv), *d_sin = dupload(&pool, sinv, sizeof sinv);
    int32_t *d_pos = pos ? dupload(&pool, pos, B * T * 4) : NULL;
    float *got = malloc(n * 4);
    mt_cuda_rope_forward(ctx, d_x, d_cos, d_sin, d_pos, B, T, H, HD);
    download(got, d_x, n * 4);
    expect_close(got, ref, n, TOL_F32, "rope forward");
    mt_cuda_rope_backward(ctx, d_x, d_cos, d_sin, d_pos, B, T, H, HD);
    download(got, d_x, n * 4);
    double *xd = dcopy(x, n);
    expect_close(got, xd, n, TOL_F32, "rope backward(forward(x)) == x");
    CUDA_CHECK(cudaMemcpy(d_x, x, n * 4, cudaMemcpyHostToDevice));
    mt_cuda_rope_backward(ctx, d_x, d_cos, d_sin, d_pos, B, T, H, HD);
    download(got, d_x, n * 4);
    expect_close(got, refb, n, TOL_F32, "rope backward");
    free(x), free(ref), free(refb), free(got), free(xd);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, rope_forward_and_inverse) { check_rope(NULL); }

/* Positions restarting at each packed document: 2, 3 | 1, 4 tokens. */
Test(cuda_ops, rope_packed_positions) {
    static const int32_t pos[10] = {0, 1, 0, 1, 2, 0, 0, 1, 2, 3};
    check_rope(pos);
}

/* ---- SwiGLU and residual ---- */

static void check_swiglu(size_t N, size_t F) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    size_t n = N * F;
    float *g = hrand(n, 23, -4, 4), *u = hrand(n, 24, -2, 2), *d = hrand(n, 25, -1, 1);
    double *ro = malloc(n * 8), *rdg = malloc(n * 8), *rdu = malloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        double s = 1.0 / (1.0 + exp(-(double)g[i]));
        ro[i] = g[i] * s * u[i];
        rdg[i] = d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        rdu[i] = d[i] * g[i] * s;
    }
    float *d_g = dupload(&pool, g, n * 4), *d_u = dupload(&pool, u, n * 4);
    float *d_d = dupload(&pool, d, n * 4), *d_out = dalloc(&pool, n * 4);
    float *d_dg = dalloc(&pool, n * 4), *d_du = dalloc(&pool, n * 4);
    float *out = malloc(n * 4), *dg = malloc(n * 4), *du = malloc(n * 4);
    mt_cuda_swiglu_forward(ctx, d_out, MT_DT_F32, d_g, d_u, N, F);
    download(out, d_out, n * 4);
    expect_close(out, ro, n, TOL_F32, "swiglu out");
    dpoison(d_out, n * 4);
    mt_cuda_swiglu_forward(ctx, d_out, MT_DT_BF16, d_g, d_u, N, F);
    uint16_t *o16 = malloc(n * 2);
    download(o16, d_out, n * 2);
    float *of = bf16_to_f32_host(o16, n);
    expect_close(of, ro, n, TOL_BF16_OUT, "swiglu bf16 out");
    mt_cuda_swiglu_backward(ctx, d_dg, d_du, d_d, d_g, d_u, N, F);
    download(dg, d_dg, n * 4);
    download(du, d_du, n * 4);
    expect_close(dg, rdg, n, TOL_F32, "swiglu dgate");
    expect_close(du, rdu, n, TOL_F32, "swiglu dup");
    free(g), free(u), free(d), free(ro), free(rdg), free(rdu), free(out), free(dg), free(du);
    free(o16), free(of);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, swiglu_vectorised) { check_swiglu(37, 100); }
Test(cuda_ops, swiglu_scalar_tail) { check_swiglu(37, 101); }

Test(cuda_ops, residual_add_in_place) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t n = 1003;
    float *a = hrand(n, 26, -1, 1), *b = hrand(n, 27, -1, 1), *got = malloc(n * 4);
    float *d_a = dupload(&pool, a, n * 4), *d_b = dupload(&pool, b, n * 4);
    mt_cuda_residual_add(ctx, d_a, d_a, d_b, n);
    download(got, d_a, n * 4);
    for (size_t i = 0; i < n; i++) cr_assert_eq(got[i], a[i] + b[i], "at %zu", i);
    free(a), free(b), free(got);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* ---- loss ---- */

/* Reference cross-entropy: row losses, dlogits; returns the loss sum. */
static double ref_ce(double *row_loss, double *dlogits, const double *logits,
                     const int32_t *targets, size_t N, size_t V, double dscale) {
    double total = 0;
    for (size_t n = 0; n < N; n++) {
        const double *x = logits + n * V;
        if (targets[n] == IGNORE) {
            row_loss[n] = 0;
            for (size_t v = 0; v < V; v++) dlogits[n * V + v] = 0;
            continue;
        }
        double m = -INFINITY, s = 0;
        for (size_t v = 0; v < V; v++) m = fmax(m, x[v]);
        for (size_t v = 0; v < V; v++) s += exp(x[v] - m);
        double lse = m + log(s);
        row_loss[n] = lse - x[targets[n]];
        total += row_loss[n];
        for (size_t v = 0; v < V; v++)
            dlogits[n * V + v] = (exp(x[v] - lse) - (v == (size_t)targets[n])) * dscale;
    }
    return total;
}

static void make_targets(int32_t *t, size_t N, size_t V) {
    for (size_t i = 0; i < N; i++) t[i] = (int32_t)((i * 577 + 11) % V);
    t[2] = IGNORE;
    t[N - 1] = IGNORE;
}

Test(cuda_ops, cross_entropy_rows_and_sum) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, V = 1000;
    float *logits = hrand(N * V, 28, -6, 6);
    int32_t targets[37];
    make_targets(targets, N, V);
    const float dscale = 1.0f / 35.0f;
    double *lg = dcopy(logits, N * V), *rdl = malloc(N * V * 8), rloss[37];
    double rsum = ref_ce(rloss, rdl, lg, targets, N, V, dscale);
    float *d_logits = dupload(&pool, logits, N * V * 4), *d_dl = dalloc(&pool, N * V * 4);
    uint16_t *d_dl16 = dalloc(&pool, N * V * 2);
    float *d_loss = dalloc(&pool, N * 4);
    int32_t *d_t = dupload(&pool, targets, sizeof targets);
    double *d_sum = dalloc(&pool, sizeof(double)), start = 2.5, sum;
    CUDA_CHECK(cudaMemcpy(d_sum, &start, sizeof start, cudaMemcpyHostToDevice));
    mt_cuda_cross_entropy(ctx, d_dl, d_dl16, d_loss, d_logits, d_t, N, V, dscale);
    mt_cuda_sum_to_double(ctx, d_sum, d_loss, N);
    float *dl = malloc(N * V * 4), loss[37];
    uint16_t *dl16 = malloc(N * V * 2);
    download(dl, d_dl, N * V * 4);
    download(dl16, d_dl16, N * V * 2);
    download(loss, d_loss, N * 4);
    download(&sum, d_sum, sizeof sum);
    expect_close(loss, rloss, N, TOL_F32, "row losses");
    expect_close(dl, rdl, N * V, TOL_F32, "dlogits");
    float *dlf = bf16_to_f32_host(dl16, N * V);
    expect_close(dlf, rdl, N * V, TOL_BF16_OUT, "dlogits bf16");
    cr_expect(fabs(sum - (start + rsum)) <= TOL_F32 * rsum, "loss sum %.9g vs %.9g", sum,
              start + rsum);
    cr_assert_eq(loss[2], 0.0f);
    for (size_t v = 0; v < V; v++) cr_assert_eq(dl[2 * V + v], 0.0f); /* ignored row */

    /* in place: dlogits over the logits */
    mt_cuda_cross_entropy(ctx, d_logits, NULL, d_loss, d_logits, d_t, N, V, dscale);
    download(dl, d_logits, N * V * 4);
    expect_close(dl, rdl, N * V, TOL_F32, "dlogits in place");
    free(logits), free(lg), free(rdl), free(dl), free(dl16), free(dlf);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

static void check_lm_head(mt_precision prec) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, C = 96, V = 1000, R = 16; /* chunks of 16, 16, 5 rows */
    bool bf = prec == MT_PREC_BF16;
    float *hid = hrand(N * C, 29, -1, 1), *w = hrand(V * C, 30, -1, 1);
    /* Pre-fills smaller than the gradients (|dlogits| <= dscale), so that
     * an error in the increment cannot hide under them. */
    float *dh0 = hrand(N * C, 31, -0.05f, 0.05f), *dw0 = hrand(V * C, 32, -0.05f, 0.05f);
    int32_t targets[37];
    make_targets(targets, N, V);
    const float dscale = 0.5f;
    float *hid_r = bf ? rounded(hid, N * C) : hid, *w_r = bf ? rounded(w, V * C) : w;
    double *logits = malloc(N * V * 8), *dl = malloc(N * V * 8), rloss[37];
    ref_matmul(logits, hid_r, w_r, NULL, N, C, V);
    double rsum = ref_ce(rloss, dl, logits, targets, N, V, dscale);
    float *dlf = to_float(dl, N * V);
    double *rdh = dcopy(dh0, N * C), *rdw = dcopy(dw0, V * C);
    ref_matmul_bwd(rdh, rdw, dlf, hid_r, w_r, N, C, V);
    void *d_hid, *d_w;
    if (bf) {
        uint16_t *a = to_bf16(hid, N * C), *b = to_bf16(w, V * C);
        d_hid = dupload(&pool, a, N * C * 2);
        d_w = dupload(&pool, b, V * C * 2);
        free(a), free(b);
    } else {
        d_hid = dupload(&pool, hid, N * C * 4);
        d_w = dupload(&pool, w, V * C * 4);
    }
    float *d_dh = dupload(&pool, dh0, N * C * 4), *d_dw = dupload(&pool, dw0, V * C * 4);
    float *d_loss = dalloc(&pool, N * 4);
    int32_t *d_t = dupload(&pool, targets, sizeof targets);
    void *scratch = dalloc(&pool, mt_cuda_lm_head_scratch_bytes(prec, R, V));
    double *d_sum = dalloc(&pool, 8), start = 1.5, sum;
    CUDA_CHECK(cudaMemcpy(d_sum, &start, 8, cudaMemcpyHostToDevice));
    mt_cuda_lm_head_loss(ctx, prec, d_sum, d_loss, d_dh, true, d_dw, scratch, d_hid, d_w,
                         d_t, N, C, V, R, dscale);
    float *gdh = malloc(N * C * 4), *gdw = malloc(V * C * 4), loss[37];
    download(gdh, d_dh, N * C * 4);
    download(gdw, d_dw, V * C * 4);
    download(loss, d_loss, N * 4);
    download(&sum, d_sum, 8);
    /* Logits come from exact products of the same operands (fp32 sums):
     * the loss is fp32-accurate in both precisions. In bf16 the gradient
     * products read dlogits rounded to bf16: TOL_BF16_OUT. */
    double gtol = bf ? TOL_BF16_OUT : TOL_F32;
    expect_close(loss, rloss, N, TOL_F32, "lm_head row losses");
    cr_expect(fabs(sum - (start + rsum)) <= TOL_F32 * rsum, "loss sum %.9g vs %.9g", sum,
              start + rsum);
    expect_close(gdh, rdh, N * C, gtol, "lm_head dhidden +=");
    expect_close(gdw, rdw, V * C, gtol, "lm_head dw +=");

    /* Deterministic: the same call again from the same state, same bits. */
    float *gdh2 = malloc(N * C * 4), *gdw2 = malloc(V * C * 4);
    CUDA_CHECK(cudaMemcpy(d_dh, dh0, N * C * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dw, dw0, V * C * 4, cudaMemcpyHostToDevice));
    mt_cuda_lm_head_loss(ctx, prec, d_sum, d_loss, d_dh, true, d_dw, scratch, d_hid, d_w, d_t,
                         N, C, V, R, dscale);
    download(gdh2, d_dh, N * C * 4);
    download(gdw2, d_dw, V * C * 4);
    cr_assert(memcmp(gdh, gdh2, N * C * 4) == 0, "lm_head dhidden not deterministic");
    cr_assert(memcmp(gdw, gdw2, V * C * 4) == 0, "lm_head dw not deterministic");

    /* "=" mode overwrites a poisoned dhidden; no dw */
    double *rdh2 = calloc(N * C, 8);
    ref_matmul_bwd(rdh2, NULL, dlf, hid_r, w_r, N, C, V);
    dpoison(d_dh, N * C * 4);
    mt_cuda_lm_head_loss(ctx, prec, d_sum, d_loss, d_dh, false, NULL, scratch, d_hid, d_w, d_t,
                         N, C, V, R, dscale);
    download(gdh, d_dh, N * C * 4);
    expect_close(gdh, rdh2, N * C, gtol, "lm_head dhidden =");
    if (bf) free(hid_r), free(w_r);
    free(hid), free(w), free(dh0), free(dw0), free(logits), free(dl), free(dlf), free(rdh);
    free(rdw), free(rdh2), free(gdh), free(gdw), free(gdh2), free(gdw2);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, lm_head_loss_fp32) { check_lm_head(MT_PREC_FP32); }
Test(cuda_ops, lm_head_loss_bf16) { check_lm_head(MT_PREC_BF16); }
