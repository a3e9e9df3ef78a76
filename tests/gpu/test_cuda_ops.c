/* Tests of the CUDA operators (kernels/cuda_ops.h) against small
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
#include "cuda_ops_util.h"
#include "kernels/ops/ops_fused.h"

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

/* w (rows, ld) holds dense d (rows, cols) in its columns [off, off + cols)
 * and the poison (all-ones bytes) in the others. */
static void expect_in_columns(const uint16_t *w, size_t ld, const uint16_t *d, size_t rows,
                              size_t cols, size_t off) {
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < ld; j++) {
            bool mine = j >= off && j < off + cols;
            uint16_t want = mine ? d[r * cols + j - off] : 0xffff;
            cr_assert_eq(w[r * ld + j], want, "row %zu column %zu: %04x, not %04x", r, j,
                         w[r * ld + j], want);
        }
}

/* Rows of a dense fp32 (rows, cols) cast into columns [off, off + cols) of
 * a wider bf16 operand: the same bits as the dense cast, and the other
 * columns (poisoned) untouched. */
Test(cuda_ops, cast_rows_to_bf16_writes_the_columns_it_is_given) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t rows = 7, cols = 24, ld = 48, off = 16;
    float *x = hrand(rows * cols, 3, -3.0f, 3.0f);
    float *dx = dupload(&pool, x, rows * cols * 4);
    uint16_t *dd = dalloc(&pool, rows * cols * 2), *dw = dalloc(&pool, rows * ld * 2);
    dpoison(dw, rows * ld * 2);
    mt_cuda_cast_f32_to_bf16(ctx, dd, dx, rows * cols);
    mt_cuda_cast_rows_to_bf16(mt_cuda_ctx_stream(ctx), dw + off, ld, dx, rows, cols);
    uint16_t *d = malloc(rows * cols * 2), *w = malloc(rows * ld * 2);
    download(d, dd, rows * cols * 2);
    download(w, dw, rows * ld * 2);
    expect_in_columns(w, ld, d, rows, cols, off);
    free(x), free(d), free(w);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* RoPE's backward into bf16 (the inverse rotation of each pair (i, i +
 * HD/2) by the position's angle) against a double reference, written
 * dense and into the columns [off, off + H*HD) of a wider operand: the
 * same bits both ways, the other columns untouched. */
Test(cuda_ops, rope_backward_to_bf16_dense_and_into_columns) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t B = 2, T = 5, H = 3, HD = 16, half = HD / 2, n = B * T * H * HD;
    const size_t ld = H * HD + 40, off = 24, rows = B * T;
    float *x = hrand(n, 4, -2.0f, 2.0f), *cs = hrand(T * half, 5, -1.0f, 1.0f),
          *sn = hrand(T * half, 6, -1.0f, 1.0f);
    double *ref = malloc(n * 8);
    for (size_t row = 0; row < rows * H; row++) { /* row = (b, t, h) */
        size_t t = row / H % T;
        for (size_t i = 0; i < half; i++) {
            double x1 = x[row * HD + i], x2 = x[row * HD + i + half];
            double c = cs[t * half + i], s = sn[t * half + i];
            ref[row * HD + i] = x1 * c + x2 * s;
            ref[row * HD + i + half] = x2 * c - x1 * s;
        }
    }
    float *dx = dupload(&pool, x, n * 4), *dc = dupload(&pool, cs, T * half * 4),
          *ds = dupload(&pool, sn, T * half * 4);
    uint16_t *dd = dalloc(&pool, n * 2), *dw = dalloc(&pool, rows * ld * 2);
    dpoison(dd, n * 2);
    dpoison(dw, rows * ld * 2);
    cudaStream_t st = mt_cuda_ctx_stream(ctx);
    mt_cuda_rope_backward_to_bf16(st, dd, H * HD, dx, dc, ds, NULL, B, T, H, HD);
    mt_cuda_rope_backward_to_bf16(st, dw + off, ld, dx, dc, ds, NULL, B, T, H, HD);
    uint16_t *d = malloc(n * 2), *w = malloc(rows * ld * 2);
    download(d, dd, n * 2);
    download(w, dw, rows * ld * 2);
    float *df = bf16_to_f32_host(d, n);
    expect_close(df, ref, n, TOL_BF16_OUT, "rope backward to bf16");
    expect_in_columns(w, ld, d, rows, H * HD, off);
    free(x), free(cs), free(sn), free(ref), free(d), free(w), free(df);
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
    void *d_inp = dupload_op(&pool, inp, N * IC, prec);
    void *d_w = dupload_op(&pool, w, OC * IC, prec);
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

/* out = add + inp @ w^T in the product's epilogue (a residual connection),
 * into another buffer and in place, both precisions: the sum of the
 * product's reference and add, at the product's tolerance. */
static void check_matmul_forward_add(mt_precision prec) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 37, IC = 96, OC = 72;
    float *inp = hrand(N * IC, 5, -1, 1), *w = hrand(OC * IC, 6, -1, 1);
    float *add = hrand(N * OC, 7, -4, 4);
    bool bf = prec == MT_PREC_BF16;
    float *inp_r = bf ? rounded(inp, N * IC) : inp, *w_r = bf ? rounded(w, OC * IC) : w;
    void *d_inp = dupload_op(&pool, inp, N * IC, prec);
    void *d_w = dupload_op(&pool, w, OC * IC, prec);
    float *d_add = dupload(&pool, add, N * OC * 4), *d_out = dalloc(&pool, N * OC * 4);
    double *ref = malloc(N * OC * sizeof *ref);
    float *out = malloc(N * OC * 4), *add_after = malloc(N * OC * 4);
    ref_matmul(ref, inp_r, w_r, NULL, N, IC, OC);
    for (size_t i = 0; i < N * OC; i++) ref[i] += add[i];
    dpoison(d_out, N * OC * 4);
    mt_cuda_matmul_forward_add(ctx, prec, d_out, d_inp, d_w, d_add, N, IC, OC);
    download(out, d_out, N * OC * 4);
    download(add_after, d_add, N * OC * 4);
    expect_close(out, ref, N * OC, TOL_F32, "matmul fwd + add");
    cr_assert(!memcmp(add_after, add, N * OC * 4), "the addend is left as it was");
    mt_cuda_matmul_forward_add(ctx, prec, d_add, d_inp, d_w, d_add, N, IC, OC); /* in place */
    download(add_after, d_add, N * OC * 4);
    cr_assert(!memcmp(add_after, out, N * OC * 4), "in place gives the same bits");
    if (bf) free(inp_r), free(w_r);
    free(inp), free(w), free(add), free(ref), free(out), free(add_after);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

Test(cuda_ops, matmul_forward_add_fp32) { check_matmul_forward_add(MT_PREC_FP32); }
Test(cuda_ops, matmul_forward_add_bf16) { check_matmul_forward_add(MT_PREC_BF16); }

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
    void *d_inp = dupload_op(&pool, inp, N * IC, prec);
    void *d_w = dupload_op(&pool, w, OC * IC, prec);
    void *d_dout = dupload_op(&pool, dout, N * OC, prec);
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
    cr_assert_eq(mt_embedding_backward_plan(order, bounds, &groups, tokens, N, V, -1, &err), 0);
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
    /* the padding index's rows add nothing to its row; every other row is
     * summed by its own block, so it keeps the bits of the plain run */
    int32_t pad = tokens[5];
    size_t pad_groups;
    cr_assert_eq(mt_embedding_backward_plan(order, bounds, &pad_groups, tokens, N, V, pad, &err),
                 0);
    cr_assert_eq(pad_groups, groups - 1);
    CUDA_CHECK(cudaMemcpy(d_order, order, sizeof order, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_bounds, bounds, (pad_groups + 1) * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_dwte, dwte0, V * C * 4, cudaMemcpyHostToDevice));
    mt_cuda_embedding_backward(ctx, d_dwte, d_dout, d_tok, d_order, d_bounds, pad_groups, C);
    download(got2, d_dwte, V * C * 4);
    for (size_t v = 0; v < V; v++)
        cr_assert(memcmp(got2 + v * C, ((int32_t)v == pad ? dwte0 : got) + v * C, C * 4) == 0,
                  "row %zu (pad %d)", v, pad);

    tokens[3] = (int32_t)V; /* out of range: a clear error, not a stray write */
    cr_assert_eq(mt_embedding_backward_plan(order, bounds, &groups, tokens, N, V, -1, &err), -1);
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

/* fp32 and bf16 output against a double reference; the bf16 output must be
 * the fp32 one rounded. C = 96 takes the warp-per-row kernel, C % 512 == 0
 * the one-pass kernel (N not a multiple of its 16 rows a block). */
static void check_rmsnorm_forward(size_t N, size_t C) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const float eps = 1e-5f;
    float *inp = hrand(N * C, 15, -2, 2), *w = hrand(C, 16, 0.5f, 1.5f);
    double *ref = malloc(N * C * sizeof *ref), *rref = malloc(N * sizeof *rref);
    ref_rmsnorm(ref, rref, inp, w, N, C, eps);
    float *d_inp = dupload(&pool, inp, N * C * 4), *d_w = dupload(&pool, w, C * 4);
    float *d_out = dalloc(&pool, N * C * 4), *d_rstd = dalloc(&pool, N * 4);
    float *out = malloc(N * C * 4), *rstd = malloc(N * 4);
    mt_cuda_rmsnorm_forward(ctx, d_out, MT_DT_F32, d_rstd, d_inp, d_w, N, C, eps);
    download(out, d_out, N * C * 4);
    download(rstd, d_rstd, N * 4);
    expect_close(out, ref, N * C, TOL_F32, "rmsnorm out");
    expect_close(rstd, rref, N, TOL_F32, "rmsnorm rstd");
    dpoison(d_out, N * C * 4);
    mt_cuda_rmsnorm_forward(ctx, d_out, MT_DT_BF16, NULL, d_inp, d_w, N, C, eps);
    uint16_t *o16 = malloc(N * C * 2), *want = to_bf16(out, N * C);
    download(o16, d_out, N * C * 2);
    for (size_t i = 0; i < N * C; i++)
        cr_assert_eq(o16[i], want[i], "bf16 out[%zu] is not the fp32 one rounded", i);
    free(inp), free(w), free(ref), free(rref), free(out), free(rstd), free(o16), free(want);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}
Test(cuda_ops, rmsnorm_forward_fp32_and_bf16_out) { check_rmsnorm_forward(37, 96); }
Test(cuda_ops, rmsnorm_forward_one_pass) {
    check_rmsnorm_forward(37, 3584);
    check_rmsnorm_forward(40, 8192);
}

/* bf16 rows in, bf16 out (the q/k norms of the fast path): the reference
 * normalises the same bf16 values; one bf16 rounding of the output. */
Test(cuda_ops, rmsnorm_forward_bf16_in_and_out) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
    const size_t N = 53, C = 128;
    const float eps = 1e-6f;
    float *inp = hrand(N * C, 17, -3, 3), *w = hrand(C, 18, 0.5f, 1.5f);
    float *inp_r = rounded(inp, N * C);
    double *ref = malloc(N * C * sizeof *ref), rref[53];
    ref_rmsnorm(ref, rref, inp_r, w, N, C, eps);
    uint16_t *in16 = to_bf16(inp, N * C);
    uint16_t *d_inp = dupload(&pool, in16, N * C * 2), *d_out = dalloc(&pool, N * C * 2);
    float *d_w = dupload(&pool, w, C * 4), *d_rstd = dalloc(&pool, N * 4), rstd[53];
    dpoison(d_out, N * C * 2);
    mt_cuda_rmsnorm_forward_bf16(ctx, d_out, d_rstd, d_inp, d_w, N, C, eps);
    uint16_t *o16 = malloc(N * C * 2);
    download(o16, d_out, N * C * 2);
    download(rstd, d_rstd, N * 4);
    float *of = bf16_to_f32_host(o16, N * C);
    expect_close(of, ref, N * C, TOL_BF16_OUT, "rmsnorm bf16 in, bf16 out");
    expect_close(rstd, rref, N, TOL_F32, "rmsnorm bf16 in: rstd");
    free(inp), free(w), free(inp_r), free(ref), free(in16), free(o16), free(of);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}

/* dinp +=, dw += against a double reference, twice for determinism; with
 * op, the bf16 copy of dinp must be the fp32 result rounded. C = 96 takes
 * the warp-per-row kernel and 3 chunks of the dw reduction; C % 512 == 0
 * the fused one-pass kernel (N not a multiple of its 64 rows a block). */
static void check_rmsnorm_backward(size_t N, size_t C, int op) {
    mt_cuda_ctx *ctx = gpu_ctx();
    dev_pool pool = {0};
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
    uint16_t *d_op = op ? dalloc(&pool, N * C * 2) : NULL;
    float *scratch = dalloc(&pool, mt_cuda_colsum_scratch_floats(N, C) * 4);
    mt_cuda_rmsnorm_forward(ctx, d_out, MT_DT_F32, d_rstd, d_inp, d_w, N, C, eps);
    float *gdinp[2], *gdw[2];
    for (int run = 0; run < 2; run++) {
        CUDA_CHECK(cudaMemcpy(d_dinp, dinp0, N * C * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(d_dw, dw0, C * 4, cudaMemcpyHostToDevice));
        if (op) CUDA_CHECK(cudaMemset(d_op, 0xFF, N * C * 2));
        mt_cuda_rmsnorm_backward_op(ctx, d_dinp, d_op, d_dw, scratch, d_dout, d_inp, d_w, d_rstd,
                                    N, C);
        gdinp[run] = malloc(N * C * 4);
        gdw[run] = malloc(C * 4);
        download(gdinp[run], d_dinp, N * C * 4);
        download(gdw[run], d_dw, C * 4);
    }
    expect_close(gdinp[0], rdinp, N * C, TOL_F32, "rmsnorm dinp +=");
    expect_close(gdw[0], rdw, C, TOL_F32, "rmsnorm dw +=");
    cr_assert(memcmp(gdinp[0], gdinp[1], N * C * 4) == 0, "rmsnorm dinp not deterministic");
    cr_assert(memcmp(gdw[0], gdw[1], C * 4) == 0, "rmsnorm dw not deterministic");
    if (op) {
        uint16_t *gop = malloc(N * C * 2), *want = to_bf16(gdinp[1], N * C);
        download(gop, d_op, N * C * 2);
        for (size_t i = 0; i < N * C; i++)
            cr_assert_eq(gop[i], want[i], "bf16 dinp[%zu] is not the fp32 one rounded", i);
        free(gop), free(want);
    }
    free(inp), free(w), free(dout), free(dinp0), free(dw0), free(y), free(rstd);
    free(rdinp), free(rdw);
    for (int run = 0; run < 2; run++) free(gdinp[run]), free(gdw[run]);
    pool_free(&pool);
    mt_cuda_ctx_free(ctx);
}
Test(cuda_ops, rmsnorm_backward_accumulates_deterministically) {
    check_rmsnorm_backward(601, 96, 0);
    check_rmsnorm_backward(601, 96, 1);
}
Test(cuda_ops, rmsnorm_backward_fused_one_pass) {
    check_rmsnorm_backward(601, 3584, 1); /* 224 threads a row, Qwen2.5-7B's width */
    check_rmsnorm_backward(130, 4096, 0);
}
